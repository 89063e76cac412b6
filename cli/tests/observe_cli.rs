//! `kace metrics` and `kace report` through the built binary on a database holding the demo's
//! profiles, a model trained on its pairs, and a colocated pair observed the way a cluster
//! records one (the prolog's spooled decision, the epilogs' spooled observations, `kace
//! ingest`). The metrics file is read back with Prometheus's own Python parser
//! (`prometheus_client`, Debian's python3-prometheus-client); the SVG is checked to be
//! well-formed and to hold the point.

use std::fs;
use std::path::Path;

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
        user: None,
        account: None,
        gpu_sm_pct: None,
        gpu_energy_j: None,
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
                    held_s: Some(12.0),
                    priority: None,
                    time_limits: Vec::new(),
                    explores: Vec::new(),
                    thread_pct: None,
                }],
            },
        },
    )
    .unwrap();
    // Dispatch's records: job 1 released as a lead after 3 s, job 9 joining job 1's GPU as a
    // late arrival after 45 s, job 8 released by max_hold onto a free GPU after 700 s.
    let release = |key: &str, lead: &str, chosen: Option<&str>, held: f64| {
        let job = chosen.unwrap_or(lead);
        let d = SpooledDecision {
            key: key.into(),
            created_at: t + 5.0,
            decision: NewDecision {
                lead_job: Some(lead.into()),
                lead_workload: "resnet50-train".into(),
                chosen_workload: chosen.map(|_| "bert-infer".into()),
                chosen_job: chosen.map(str::to_string),
                model_version: chosen.map(|_| 1),
                candidates: vec![DecisionCandidate {
                    job: Some(job.into()),
                    workload: "bert-infer".into(),
                    prediction: chosen.map(|_| 27.0),
                    rejected: None,
                    held_s: Some(held),
                    priority: None,
                    time_limits: Vec::new(),
                    explores: Vec::new(),
                    thread_pct: None,
                }],
            },
        };
        write_decision(&spool, &d).unwrap();
    };
    release("c/1/1000/n1/lead_release", "1", None, 3.0);
    release("c/9/1000/n1/join", "1", Some("9"), 45.0);
    release("c/8/1000/n1/max_hold", "8", None, 700.0);
    let of = |o: Observation, user: &str, account: &str| Observation {
        user: Some(user.into()),
        account: Some(account.into()),
        ..o
    };
    let records = [
        of(obs("c/1/0", "1", "resnet50-train", None, t, t + 10.0, 12.0), "alice", "acct-a"),
        of(
            obs("c/1/1", "1", "resnet50-train", Some(("7", "bert-infer")), t + 10.0, t + 40.0, 8.5),
            "alice",
            "acct-a",
        ),
        of(
            obs(
                "c/7/0",
                "7",
                "bert-infer",
                Some(("1", "resnet50-train")),
                t + 10.0,
                t + 40.0,
                21.0,
            ),
            "bob",
            "acct-b",
        ),
    ];
    for r in &records {
        write_record(&spool, r).unwrap();
    }
    e.ok(&["ingest"]);
    e
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
    assert!(text.contains("kace_groups_formed_total{kind=\"late_arrival\"} 1\n"), "{text}");
    assert!(text.contains("kace_groups_formed_total{kind=\"max_hold\"} 0\n"), "{text}");
    for (by, place, n) in [
        ("lead", "free_gpu", 1),
        ("partner", "open_gpu", 1),
        ("late_arrival", "open_gpu", 1),
        ("max_hold", "free_gpu", 1),
        ("max_hold", "open_gpu", 0),
        ("refill", "open_gpu", 0),
    ] {
        let line = format!("kace_jobs_released_total{{by=\"{by}\",place=\"{place}\"}} {n}\n");
        assert!(text.contains(&line), "{line}{text}");
    }
    // The prolog's decision only: dispatch's records are releases, not partner decisions.
    assert!(text.contains("kace_decisions_total{outcome=\"paired\"} 1\n"), "{text}");
    assert!(text.contains("kace_decisions_total{outcome=\"alone\"} 0\n"), "{text}");
    // Holds of 3, 12, 45 and 700 s.
    for (le, n) in [("2", 0), ("5", 1), ("10", 1), ("30", 2), ("60", 3), ("600", 3), ("1800", 4)] {
        let line = format!("kace_hold_seconds_bucket{{le=\"{le}\"}} {n}\n");
        assert!(text.contains(&line), "{line}{text}");
    }
    assert!(text.contains("kace_hold_seconds_bucket{le=\"+Inf\"} 4\n"), "{text}");
    assert!(text.contains("kace_hold_seconds_sum 760\n"), "{text}");
    assert!(text.contains("kace_hold_seconds_count 4\n"), "{text}");
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

    let Some(parsed) = kace_test_support::parse_with_prometheus_client(&prom) else { return };
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
    let hold = find("kace_hold_seconds");
    assert!(hold.contains(" histogram "), "{parsed}");
    assert!(hold.contains("kace_hold_seconds_count[]=4.0"), "{parsed}");
    assert!(hold.contains("kace_hold_seconds_bucket[('le', '30')]=2.0"), "{parsed}");
    assert!(
        find("kace_jobs_released").contains("[('by', 'max_hold'), ('place', 'free_gpu')]=1.0"),
        "{parsed}"
    );
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
    // The decision records counted by kind (the prolog's, and dispatch's three).
    assert!(out.contains("groups formed: late_arrival 1, lead 1, max_hold 0, refill 0;"), "{out}");
    assert!(
        out.contains(
            "late_arrival/open_gpu 1, lead/free_gpu 1, max_hold/free_gpu 1, partner/open_gpu 1"
        ),
        "{out}"
    );
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
    assert_eq!(v["totals"]["released"]["max_hold/free_gpu"], 1, "{v}");
    // Holds of 3, 12, 45 and 700 s.
    assert_eq!(v["totals"]["median_hold_s"], 28.5, "{v}");
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

    // GPU time by user and by account (issue 29 item 6): job 1 alone 10 s, then 30 s beside
    // job 7; each pays half of the shared 30 s.
    let by: serde_json::Value =
        serde_json::from_str(&e.ok(&["--format", "json", "report", "--by", "account"])).unwrap();
    let rows = by.as_array().unwrap();
    assert_eq!(rows.len(), 2, "{by}");
    assert_eq!((rows[0]["key"].as_str(), rows[0]["jobs"].as_u64()), (Some("acct-a"), Some(1)));
    let hours = |r: &serde_json::Value, k: &str| r[k].as_f64().unwrap() * 3600.0;
    for (k, want) in [("alone_gpu_h", 10.0), ("shared_gpu_h", 30.0), ("shared_share_h", 15.0)] {
        assert!((hours(&rows[0], k) - want).abs() < 1e-6, "{k}: {by}");
    }
    assert!((hours(&rows[1], "shared_share_h") - 15.0).abs() < 1e-6, "{by}");
    let text = e.ok(&["report", "--by", "user"]);
    assert!(
        text.contains("kace GPU-hours by user") && text.contains("alice") && text.contains("bob"),
        "{text}"
    );
    assert_eq!(e.run(&["report", "--by", "group"]).status.code(), Some(2), "bad usage");
}
