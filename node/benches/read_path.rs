//! Benchmark (prints a table) of the prolog's read path: open the database read-only, load the
//! active model and the profiles of the lead and 10 / 100 / 1 000 candidates, predict, choose.
//! Run with `cargo bench -p kace-node --bench read_path`. Target: under 5 ms for 1 000
//! candidates, on databases with 100 and 100 000 observations.
//!
//! The databases are synthetic (deterministic pseudo-random profiles and observations) and
//! built in the system temp directory; they are removed at the end.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kace_node::read_path::{decide_from_store, JobSpec};
use kace_selector::dataset::Group;
use kace_selector::{Model, ModelKind, Objective, Profile, SlowdownParams};
use kace_sql::convert::model_to_new_model;
use kace_sql::{Db, NewProfile, Observation, Partner, FEATURE_COUNT};

const WORKLOADS: usize = 1_001;
const RUNS: usize = 101;

/// A small deterministic generator (SplitMix64), so every run builds the same databases.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn name(i: usize) -> String {
    format!("synthetic-w{i:04}")
}

/// Realistic ranges per feature (threads, %, registers, smem, steps/s, %, %, GiB).
fn profile_values(r: &mut Rng) -> [f64; FEATURE_COUNT] {
    let scale = [4e6, 100.0, 100.0, 100.0, 1e8, 3e4, 50.0, 100.0, 100.0, 16.0];
    scale.map(|s| s * (0.05 + 0.95 * r.next()))
}

fn build(path: &Path, observations: usize) -> Db {
    let _ = std::fs::remove_file(path);
    let (mut db, _) = Db::create(path).expect("create db");
    let mut r = Rng(7);
    // Two measurements per workload (ncu, then nvml), so the per-feature merge is exercised.
    let mut profiles = Vec::with_capacity(WORKLOADS * 2);
    for i in 0..WORKLOADS {
        let v = profile_values(&mut r);
        let mut kernel = [None; FEATURE_COUNT];
        let mut system = [None; FEATURE_COUNT];
        for f in 0..FEATURE_COUNT {
            if f < 6 {
                kernel[f] = Some(v[f]);
            } else {
                system[f] = Some(v[f]);
            }
        }
        for (values, source) in [(kernel, "ncu"), (system, "nvml")] {
            profiles.push(NewProfile {
                workload: name(i),
                gpu_model: "H200".into(),
                source: source.into(),
                values,
            });
        }
    }
    db.insert_profiles(&profiles).expect("profiles");
    let mut batch = Vec::new();
    for k in 0..observations {
        let (a, b) =
            ((r.next() * WORKLOADS as f64) as usize, (r.next() * WORKLOADS as f64) as usize);
        batch.push(Observation {
            key: format!("bench/{k}"),
            job: k.to_string(),
            workload: name(a),
            partners: vec![Partner { job: format!("p{k}"), workload: name(b) }],
            node: "n1".into(),
            gpu: "0".into(),
            mps_share: None,
            start: k as f64,
            end: k as f64 + 60.0,
            steps: Some(600.0),
            throughput: 10.0 * r.next(),
            user: None,
            account: None,
            gpu_sm_pct: None,
            gpu_energy_j: None,
        });
        if batch.len() == 10_000 {
            db.insert_observations(&batch).expect("observations");
            batch.clear();
        }
    }
    db.insert_observations(&batch).expect("observations");
    // kace's default model, fitted on 200 synthetic pairs of 200 workloads (so it carries
    // per-workload terms, as a production model does).
    let groups: Vec<Group> = (0..200)
        .map(|i| {
            let (a, b) =
                (Profile::new(profile_values(&mut r)), Profile::new(profile_values(&mut r)));
            let t =
                [a.exclusive_throughput() * (0.3 + 0.6 * r.next()), b.exclusive_throughput() * 0.5];
            Group {
                workloads: vec![name(i), name(i + 200)],
                profiles: vec![a, b],
                throughputs: t.to_vec(),
            }
        })
        .collect();
    let refs: Vec<&Group> = groups.iter().collect();
    let model = Model::train(
        ModelKind::Slowdown,
        &refs,
        Objective::ThroughputSum,
        SlowdownParams::default(),
    )
    .expect("fit");
    let v = db
        .insert_model(
            &model_to_new_model(&model, serde_json::json!({}), "bench".into(), 200).unwrap(),
        )
        .expect("model");
    db.activate_model(v).expect("activate");
    db
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1e3)
}

fn main() {
    let dir = std::env::temp_dir().join(format!("kace-bench-read-path-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let policy = kace_selector::decision::Policy::default();
    println!("prolog read path: open read-only + active model + profiles + predict + choose");
    println!(
        "median and p95 of {RUNS} runs; {WORKLOADS} profiled workloads, 2 measurements each\n"
    );
    println!(
        "{:>12}  {:>10}  {:>10}  {:>10}  {:>8}  {:>6}",
        "observations", "candidates", "median_ms", "p95_ms", "db_MiB", "chosen"
    );
    for observations in [100usize, 100_000] {
        let path: PathBuf = dir.join(format!("obs{observations}.db"));
        let t = Instant::now();
        drop(build(&path, observations));
        let size =
            std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0) as f64 / (1024.0 * 1024.0);
        eprintln!("built {} in {:.1} s", path.display(), t.elapsed().as_secs_f64());
        for n in [10usize, 100, 1_000] {
            let cands: Vec<JobSpec> =
                (1..=n).map(|i| JobSpec { workload: name(i), user: None }).collect();
            let lead = name(0);
            let mut times = Vec::with_capacity(RUNS);
            let mut chosen = None;
            for _ in 0..RUNS {
                let start = Instant::now();
                let db = Db::open_read_only(&path).expect("open");
                let running = [JobSpec { workload: lead.clone(), user: None }];
                let d = decide_from_store(&db, &running, &cands, &policy, Some(141.0), None, &[])
                    .expect("decide");
                times.push(start.elapsed());
                chosen = d.selection.chosen;
                std::hint::black_box(&d);
            }
            times.sort_unstable();
            println!(
                "{:>12}  {:>10}  {:>10}  {:>10}  {:>8.1}  {:>6}",
                observations,
                n,
                ms(percentile(&times, 0.5)),
                ms(percentile(&times, 0.95)),
                size,
                chosen.map(|c| c.to_string()).unwrap_or_else(|| "none".into())
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
