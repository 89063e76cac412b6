//! The newcomer's demo (`./demo`, `kace-demo`): its shipped data agree with its ground truth,
//! its timeline renders from a recorded run, and (ignored by default: 45 s on a real cluster)
//! the whole demo runs and kace pairs as the README shows.

use std::collections::BTreeMap;

use kace_e2e::demo::{self, Recorded, TRUTH};

fn read(name: &str) -> String {
    std::fs::read_to_string(demo::data_dir().join(name)).unwrap()
}

/// `profiles.csv` rows as column → value maps, by workload.
fn profiles() -> BTreeMap<String, BTreeMap<String, f64>> {
    let text = read("profiles.csv");
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    lines
        .map(|l| {
            let cells: Vec<&str> = l.split(',').collect();
            let values = header[1..]
                .iter()
                .zip(&cells[1..])
                .map(|(h, c)| (h.to_string(), c.parse::<f64>().unwrap()))
                .collect();
            (cells[0].to_string(), values)
        })
        .collect()
}

#[test]
fn the_demo_profiles_carry_the_truths_speed_and_memory() {
    let p = profiles();
    assert_eq!(p.len(), TRUTH.len());
    for t in &TRUTH {
        let row = &p[t.workload];
        assert_eq!(row["exclusive_throughput"], t.exclusive, "{}", t.workload);
        assert_eq!(row["memcap_gib"], t.memcap, "{}", t.workload);
    }
}

#[test]
fn the_demo_training_pairs_are_the_truth_with_small_noise() {
    let text = read("pairs.csv");
    let mut rdr = text.lines();
    let header: Vec<String> = rdr.next().unwrap().split(',').map(str::to_string).collect();
    let col = |n: &str| header.iter().position(|h| h == n).unwrap();
    let (w1, w2, t1, t2) =
        (col("workload1"), col("workload2"), col("w1throughput"), col("w2throughput"));
    let mut seen = 0;
    for line in rdr {
        // The feature columns are plain numbers; only the header quotes names with spaces.
        let cells: Vec<&str> = line.split(',').collect();
        assert_eq!(cells.len(), header.len(), "{line}");
        let (a, b) = (cells[w1], cells[w2]);
        for (w, p, thr) in [(a, b, cells[t1]), (b, a, cells[t2])] {
            let truth = demo::true_rate(w, Some(p)).unwrap();
            let measured: f64 = thr.parse().unwrap();
            let off = (measured / truth - 1.0).abs();
            assert!(off <= 0.03, "{w} beside {p}: {measured} vs truth {truth}");
        }
        seen += 1;
    }
    // Every unordered pair of the seven workloads, self pairs included.
    assert_eq!(seen, TRUTH.len() * (TRUTH.len() + 1) / 2);
}

#[test]
fn the_timeline_renders_a_recorded_run() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/demo-recording.json");
    let rec: Recorded = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let out = demo::render(&rec);
    eprintln!("{out}");
    let line = |needle: &str| {
        out.lines().find(|l| l.contains(needle)).unwrap_or_else(|| panic!("no {needle:?}:\n{out}"))
    };
    // One gantt row per job, sharing marked where the epilogs observed a partner.
    for j in &rec.jobs {
        let name = j.workload.as_deref().unwrap_or("(plain job)");
        let row = line(&format!("{:>4} {name:<15} |", j.id));
        assert_eq!(row.matches('|').count(), 2, "{row}");
    }
    assert!(line(" 1 resnet50-train  |").contains('#'));
    assert!(line(" 4 (plain job)     |").contains('-'));
    assert!(!line(" 3 unet-infer      |").contains('#'), "unet-infer ran alone");
    // The pairs, predicted against observed and the truth.
    let pair = line("1 resnet50-train  7 bert-infer");
    let observed: f64 = rec
        .observations
        .iter()
        .filter(|o| match o.partners.as_slice() {
            [p] => matches!((o.job.as_str(), p.job.as_str()), ("1", "7") | ("7", "1")),
            _ => false,
        })
        .map(|o| o.throughput)
        .sum();
    // The model's prediction and the truth are fixed by the shipped data; observed is the run's.
    for v in ["29.02".to_string(), format!("{observed:.2}"), "29.34".into()] {
        assert!(pair.contains(&v), "{v} in {pair}");
    }
    // The refill: bert-infer's epilog-time survivor takes whisper-infer, whisper-infer's vit-train.
    assert!(line("7 bert-infer      6 whisper-infer").contains("35.53"));
    assert!(line("6 whisper-infer   2 vit-train").contains("15.46"));
    assert!(line("3 unet-infer      (none: ran alone)").contains("20.00"));
    // The verdicts, and the rules compared.
    assert!(line("5 gpt2-finetune   predicted      -").contains("memory does not fit"));
    assert!(line("7 bert-infer      predicted  29.02").ends_with("chosen"));
    assert!(line("first in queue:").contains("vit-train"));
    assert!(line("smallest memcap:").contains("unet-infer"));
    assert!(line("kace:").contains("bert-infer"));
}

#[test]
fn the_readme_shows_the_recorded_runs_timeline() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/demo-recording.json");
    let rec: Recorded = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    // The fixture is the recording of the run the README shows (KACE_DEMO_RECORD=… ./demo).
    // The README shortens it by the per-lead decisions (`kace explain`'s part, which the real
    // run's test checks); every other section is there line for line.
    let rendered = demo::render(&rec);
    let sections: Vec<&str> = rendered.split("\n\n").collect();
    let shown: Vec<&str> =
        sections.iter().copied().filter(|s| !s.starts_with("What each lead")).collect();
    assert_eq!(shown.len() + 1, sections.len(), "the decisions section is the one left out");
    for l in shown.iter().flat_map(|s| s.lines()) {
        assert!(readme.contains(l), "README.md lacks this line of the demo's timeline:\n{l}");
    }
    assert!(readme.contains("\n./demo "), "the README's first command");
    assert!(readme.contains("\n.ci/install-deps && cargo test --workspace"), "the test command");
}

/// The whole demo on a real cluster: what the README shows must still happen.
#[test]
#[ignore = "45 s on a real Slurm cluster; run with --ignored, or ./demo"]
fn the_demo_runs_and_kace_pairs_the_best_candidate() {
    kace_e2e::require_e2e("the_demo_runs");
    let (rec, explain) = demo::run(&mut |l| eprintln!("{l}")).unwrap();
    let out = demo::render(&rec);
    eprintln!("{out}\n{explain}");
    assert!(rec.jobs.iter().all(|j| j.state == "COMPLETED"), "{:?}", rec.jobs);
    let first = &rec.decisions[0];
    assert_eq!(first.lead_workload, "resnet50-train");
    assert_eq!(first.chosen_workload.as_deref(), Some("bert-infer"));
    // Each formed pair was observed, and the prediction is within 10 % of what was observed.
    for d in rec.decisions.iter().filter(|d| d.chosen_job.is_some()) {
        let (lead, partner) = (d.lead_job.clone().unwrap(), d.chosen_job.clone().unwrap());
        let thr = |a: &str, b: &str| {
            rec.observations
                .iter()
                .find(|o| o.job == a && o.partners.len() == 1 && o.partners[0].job == b)
                .map(|o| o.throughput)
                .unwrap_or_else(|| panic!("no observation of {a} beside {b}: {out}"))
        };
        let observed = thr(&lead, &partner) + thr(&partner, &lead);
        let predicted =
            d.candidates.iter().find(|c| c.job == d.chosen_job).and_then(|c| c.prediction).unwrap();
        assert!((predicted / observed - 1.0).abs() < 0.1, "{predicted} vs {observed}\n{out}");
    }
    assert!(explain.contains("chosen (predicted"), "{explain}");
    // The real kace-sampler's readings of the fake GPU gave the observations their energy, and
    // the report accounts for it.
    assert!(explain.contains("\nenergy: "), "{explain}");
    assert!(!explain.contains("no observation has one"), "{explain}");
    assert!(explain.contains("energy saved by sharing: "), "{explain}");
}
