//! Benchmark (prints a table): training each model on the paper's 181 pairs, and predicting +
//! choosing among 10…10 000 candidates; then one cross-validated settings search, and what
//! `kace train` runs (two of them). Run with `cargo bench -p kace-selector --bench selection`.

mod common;
use common::pairs;

use std::hint::black_box;
use std::time::{Duration, Instant};

use kace_selector::dataset::Group;
use kace_selector::{
    select, Candidate, Member, Model, ModelKind, Objective, Profile, SelectionRules, SlowdownParams,
};

/// Median wall time of `f` over `runs` runs (after one warm-up).
fn median<F: FnMut()>(runs: usize, mut f: F) -> Duration {
    f();
    let mut t: Vec<Duration> = (0..runs)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed()
        })
        .collect();
    t.sort_unstable();
    t[runs / 2]
}

fn main() {
    let (data, source) = pairs();
    let groups: Vec<&Group> = data.groups.iter().collect();
    let train = |kind| {
        Model::train(kind, &groups, Objective::ThroughputSum, SlowdownParams::default())
            .expect("fit")
    };
    println!("kace-selector benchmark ({source}; median of repeated runs)");
    println!();
    println!(
        "{:<10} {:>18} {:>14} {:>14} {:>14} {:>14}",
        "model", "train 181 pairs", "10 cand.", "100 cand.", "1 000 cand.", "10 000 cand."
    );
    for (key, kind) in [("kace", ModelKind::Slowdown), ("kace-lr", ModelKind::Linear)] {
        let t_fit = median(101, || {
            black_box(train(kind));
        });
        let model = train(kind);
        let lead = &data.groups[0];
        let running = [Member { profile: &lead.profiles[0], workload: Some(&lead.workloads[0]) }];
        let pool: Vec<(&Profile, &str)> =
            data.groups.iter().map(|g| (&g.profiles[1], g.workloads[1].as_str())).collect();
        let rules = SelectionRules { gpu_memory_gib: Some(32.0), ..SelectionRules::default() };
        let mut cells = Vec::new();
        for n in [10usize, 100, 1_000, 10_000] {
            let cands: Vec<Candidate<'_>> = (0..n)
                .map(|i| {
                    let (p, w) = pool[i % pool.len()];
                    Candidate {
                        profile: Some(p),
                        workload: Some(w),
                        same_user: true,
                        may_explore: true,
                    }
                })
                .collect();
            let runs = if n >= 10_000 { 101 } else { 1001 };
            let t = median(runs, || {
                black_box(select(black_box(&running), black_box(&cands), &model, &rules).chosen);
            });
            cells.push(format!("{:.0} ns/cand", t.as_secs_f64() * 1e9 / n as f64));
        }
        println!(
            "{:<10} {:>15.1} µs {:>14} {:>14} {:>14} {:>14}",
            key,
            t_fit.as_secs_f64() * 1e6,
            cells[0],
            cells[1],
            cells[2],
            cells[3]
        );
    }
    // One settings search: 18 settings × 5 folds, each a robust fit, then the gain rule's
    // doubt weights (κ, and κ_new by leave-one-workload-out).
    let t_tune = median(11, || {
        black_box(
            kace_selector::tuning::fit_tuned(
                &groups,
                &kace_selector::tuning::grid(),
                kace_selector::tuning::Folds::default(),
            )
            .expect("tune"),
        );
    });
    // What `kace train` runs: the search on the 80 % it validates on, then again on all.
    let policy =
        kace_selector::training::TrainingPolicy::new(ModelKind::Slowdown, Objective::ThroughputSum);
    let t_train = median(11, || {
        black_box(kace_selector::training::train(&data.groups, None, &policy).expect("train"));
    });
    println!();
    println!("kace, one settings search by cross-validation: {:.1} ms", t_tune.as_secs_f64() * 1e3);
    println!(
        "kace train (validate on 80 %, then search and fit on all): {:.1} ms",
        t_train.as_secs_f64() * 1e3
    );
}
