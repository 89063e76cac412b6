//! `kace metrics` and `kace report` through the built binary on a database holding the demo's
//! profiles, a model trained on its pairs, and a colocated pair observed the way a cluster
//! records one (the prolog's spooled decision, the epilogs' spooled observations, `kace
//! ingest`). The metrics file is read back with Prometheus's own Python parser
//! (`prometheus_client`, Debian's python3-prometheus-client); the SVG is checked to be
//! well-formed and to hold the point.

use std::fs;
use std::path::Path;
use std::process::Command;

use kace_sql::spool::{write_decision, write_record, SpooledDecision};
use kace_sql::{DecisionCandidate, NewDecision, Observation, Partner};

mod common;
use common::Env;

fn env(tag: &str) -> Env {
    Env::new(&format!("observe-{tag}"), true)
}

fn demo(f: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/demo").join(f).display().to_string()
}

fn now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64()
}

fn obs(
    key: &str,
    job: &str,
    w: &str,
    partner: Option<(&str, &str)>,
    s: f64,
    e: f64,
    thr: f64,
) -> Observation {
    Observation {
        key: key.into(),
        job: job.into(),
        workload: w.into(),
        partners: partner
            .map(|(j, w)| vec![Partner { job: j.into(), workload: w.into() }])
            .unwrap_or_default(),
        node: "n1".into(),
        gpu: "0".into(),
        mps_share: None,
        start: s,
        end: e,
        steps: Some(thr * (e - s)),
        throughput: thr,
    }
}

/// A database with the demo's model and one observed pair (jobs 1 and 7, decided by job 1's
/// prolog predicting 28.8) plus job 1 alone for 10 s before its partner came.
fn prepared(tag: &str) -> Env {
    let e = env(tag);
    e.ok(&["db", "init"]);
    e.ok(&["profile", "import", &demo("profiles.csv")]);
    e.ok(&["observations", "import", &demo("pairs.csv")]);
    e.ok(&["train"]);
    let t = now() - 3600.0;
    let spool = e.dir.join("spool");
    write_decision(
        &spool,
        &SpooledDecision {
            key: "c/1/decision".into(),
            created_at: t + 10.0,
            decision: NewDecision {
                lead_job: Some("1".into()),
                lead_workload: "resnet50-train".into(),
                chosen_workload: Some("bert-infer".into()),
                chosen_job: Some("7".into()),
                model_version: Some(1),
                candidates: vec![DecisionCandidate {
                    job: Some("7".into()),
                    workload: "bert-infer".into(),
                    prediction: Some(28.8),
                    rejected: None,
held_s: None,
                }],
            },
        },
    )
    .unwrap();
    let records = [
        obs("c/1/0", "1", "resnet50-train", None, t, t + 10.0, 12.0),
        obs("c/1/1", "1", "resnet50-train", Some(("7", "bert-infer")), t + 10.0, t + 40.0, 8.5),
        obs("c/7/0", "7", "bert-infer", Some(("1", "resnet50-train")), t + 10.0, t + 40.0, 21.0),
    ];
    for r in &records {
        write_record(&spool, r).unwrap();
    }
    e.ok(&["ingest"]);
    e
}

/// Parses the file with prometheus_client and prints `name type sample=value…` per family;
/// `None` (with the reason) when python3 or the module is missing outside CI.
fn parse_with_prometheus_client(path: &Path) -> Option<String> {
    const SCRIPT: &str = r#"
import sys
from prometheus_client.parser import text_string_to_metric_families
text = open(sys.argv[1]).read()
for fam in text_string_to_metric_families(text):
    samples = " ".join("%s%s=%r" % (s.name, sorted(s.labels.items()), s.value) for s in fam.samples)
    print(fam.name, fam.type, samples)
"#;
    let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
    let mut why = Vec::new();
    // Debian's python3-prometheus-client is in the system Python, which a pyenv or venv on
    // PATH may shadow.
    for python in ["python3", "/usr/bin/python3"] {
        match Command::new(python).arg("-c").arg(SCRIPT).arg(path).output() {
            Ok(o) if o.status.success() => {
                return Some(String::from_utf8_lossy(&o.stdout).into_owned())
            }
            Ok(o) => {
                let err = String::from_utf8_lossy(&o.stderr).into_owned();
                assert!(
                    err.contains("No module named 'prometheus_client'"),
                    "prometheus_client refused {}: {err}",
                    path.display()
                );
                why.push(format!("{python}: no prometheus_client"));
            }
            Err(e) => why.push(format!("{python}: {e}")),
        }
    }
    assert!(!ci, "CI=true but no Python with prometheus_client: {why:?}");
    eprintln!("SKIPPED the parser check ({why:?}): install python3-prometheus-client");
    None
}

#[test]
fn metrics_textfile_is_valid_prometheus_text() {
    let e = prepared("metrics");
    let out_dir = e.dir.join("textfile");
    fs::create_dir_all(&out_dir).unwrap();
    e.ok(&["metrics", "--no-slurm", "--textfile", out_dir.to_str().unwrap()]);
    let prom = out_dir.join("kace.prom");
    let text = fs::read_to_string(&prom).unwrap();
    // Conventions kace keeps: prefix, _total counters, one HELP and TYPE per family.
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        assert!(line.starts_with("kace_"), "{line}");
    }
    for line in text.lines().filter(|l| l.starts_with("# TYPE ")) {
        let f: Vec<&str> = line.split(' ').collect();
        assert_eq!(f[3] == "counter", f[2].ends_with("_total"), "{line}");
    }
    assert!(text.contains("kace_groups_formed_total{kind=\"lead\"} 1\n"), "{text}");
    assert!(text.contains("kace_groups_formed_total{kind=\"refill\"} 0\n"), "{text}");
    assert!(text.contains("kace_observations_total{origin=\"epilog\"} 3\n"), "{text}");
    assert!(text.contains("kace_model_version 1\n"), "{text}");
    // 30 s shared (counted once for the GPU), 10 s alone.
    assert!(text.contains("kace_gpu_seconds_total{sharing=\"shared\"} 30\n"), "{text}");
    assert!(text.contains("kace_gpu_time_shared_ratio 0.75\n"), "{text}");
    // The only group: predicted 28.8, observed 8.5 + 21.0.
    let ratio = 28.8 / 29.5;
    assert!(
        text.contains(&format!(
            "kace_group_predicted_observed_ratio{{quantile=\"0.5\"}} {ratio}\n"
        )),
        "{text}"
    );
    assert!(!text.contains("kace_held_jobs"), "--no-slurm asked Slurm: {text}");
    // Every metric the Grafana dashboard queries is one kace writes (the two that need Slurm
    // are left out with --no-slurm).
    let dash = fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/grafana/kace-dashboard.json"),
    )
    .unwrap();
    let dash: serde_json::Value = serde_json::from_str(&dash).unwrap();
    let mut queried = 0;
    for panel in dash["panels"].as_array().unwrap() {
        for t in panel["targets"].as_array().unwrap() {
            let expr = t["expr"].as_str().unwrap();
            for (i, _) in expr.match_indices("kace_") {
                let name: String = expr[i..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                queried += 1;
                if ["kace_held_jobs", "kace_oldest_hold_seconds"].contains(&name.as_str()) {
                    continue;
                }
                assert!(
                    text.contains(&format!("\n{name}")),
                    "the dashboard queries {name}: {text}"
                );
            }
        }
    }
    assert!(queried >= 15, "{queried}");

    let Some(parsed) = parse_with_prometheus_client(&prom) else { return };
    let families: Vec<&str> = parsed.lines().collect();
    let find = |name: &str| {
        families
            .iter()
            .find(|l| l.split(' ').next() == Some(name))
            .unwrap_or_else(|| panic!("the parser found no family {name}:\n{parsed}"))
    };
    // The parser strips _total from counter family names.
    assert!(find("kace_groups_formed").contains(" counter "), "{parsed}");
    assert!(find("kace_group_predicted_observed_ratio").contains(" summary "), "{parsed}");
    assert!(find("kace_model_version").contains(" gauge "), "{parsed}");
    assert!(find("kace_gpu_seconds").contains("('sharing', 'alone')]=10.0"), "{parsed}");
    let declared = text.lines().filter(|l| l.starts_with("# TYPE ")).count();
    assert_eq!(families.len(), declared, "{parsed}");
}

#[test]
fn report_reads_the_database_and_draws_the_pair() {
    let e = prepared("report");
    let svg_path = e.dir.join("report.svg");
    let out = e.ok(&["report", "--since", "2d", "--svg", svg_path.to_str().unwrap()]);
    assert!(out.contains("1 observed group(s), 1 with a prediction"), "{out}");
    assert!(out.contains("GPU time shared: 75.0 %"), "{out}");
    let v: serde_json::Value =
        serde_json::from_str(&e.ok(&["--format", "json", "report", "--since", "7d"])).unwrap();
    let g = &v["groups"][0];
    assert_eq!(g["predicted"], 28.8);
    assert_eq!(g["observed"], 29.5);
    assert_eq!(g["model_version"], 1);
    // bert-infer alone does 40, resnet50-train 12: 21/40 + 8.5/12.
    let np = g["normalised_progress"].as_f64().unwrap();
    assert!((np - (21.0 / 40.0 + 8.5 / 12.0)).abs() < 1e-9, "{np}");
    assert_eq!(v["totals"]["groups"], 1, "imported training pairs are not runs: {v}");
    let svg = fs::read_to_string(&svg_path).unwrap();
    assert!(svg.starts_with("<svg ") && svg.trim_end().ends_with("</svg>"));
    assert_eq!(svg.matches("<circle").count(), 2, "one point and one legend mark: {svg}");
    assert!(svg.contains("model v1"));
    // A period with nothing in it is still a report, and bad spans are refused.
    let early = e.ok(&["--format", "json", "report", "--since", "1m"]);
    assert!(early.contains("\"groups\": []"), "{early}");
    let bad = e.run(&["report", "--since", "soon"]);
    assert_eq!(bad.status.code(), Some(2), "bad usage");
    assert!(String::from_utf8_lossy(&bad.stderr).contains("want a span"));
}
