//! Benchmark (prints a table): `kace retrain`'s training ([`train_observed`]) on a site's
//! history of 10³ … 10⁶ observations, synthetic repeats of the paper's 181 measured pairs
//! (±1.5 % noise, four users, spread over 120 days so the age window drops some), against the
//! training that counts every observation as its own group ([`train`]) where that is still
//! affordable. Wall time, peak resident memory (Linux `VmHWM`) and the row counts the
//! [`TrainingRecord`] stores. Run with `cargo bench -p kace-selector --bench training_scale`;
//! `-- 100000` stops at that size.

mod common;
use common::pairs;

use std::time::Instant;

use kace_selector::dataset::{ColocationData, Group};
use kace_selector::training::{
    train, train_observed, DataFacts, Evidence, TrainingPolicy, TrainingRecord,
};
use kace_selector::{ModelKind, Objective};

/// Peak resident memory of this process so far, MiB (Linux; 0 elsewhere).
fn peak_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse::<f64>().ok()))
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

/// `n` observations: the pairs in turn, each member's throughput × exp(±1.5 % noise), a user
/// of four and a day of 120 (a fixed LCG, so every run sees the same rows).
fn history(data: &ColocationData, n: usize) -> (Vec<Group>, Vec<Evidence>) {
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move || {
        state =
            state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (state >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut groups = Vec::with_capacity(n);
    let mut evidence = Vec::with_capacity(n);
    for i in 0..n {
        let mut g = data.groups[i % data.groups.len()].clone();
        for t in &mut g.throughputs {
            // The sum of three uniforms: near-normal, sd 0.015.
            let z = (next() + next() + next() - 1.5) * 2.0;
            *t *= (0.015 * z).exp();
        }
        let user = format!("u{}", (next() * 4.0) as usize);
        let day = (next() * 120.0) as i64;
        groups.push(g);
        evidence.push(Evidence { users: vec![user], trusted: false, day: Some(day) });
    }
    (groups, evidence)
}

fn main() {
    let (data, source) = pairs();
    let stop: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(1_000_000);
    let policy = TrainingPolicy::new(ModelKind::Slowdown, Objective::ThroughputSum);
    println!("kace-selector training-scale benchmark ({source}, synthetic repeats)");
    println!();
    println!(
        "{:>10}  {:>9}  {:>7}  {:>11}  {:>13}  {:>13}  {:>12}",
        "rows", "distinct", "aged", "corrected", "retrain s", "peak MiB", "independent s"
    );
    for n in [1_000usize, 10_000, 100_000, 1_000_000] {
        if n > stop {
            break;
        }
        let (groups, evidence) = history(&data, n);
        let start = Instant::now();
        let t = train_observed(&groups, Some(&evidence), None, &policy).expect("train");
        let secs = start.elapsed().as_secs_f64();
        let mut record = TrainingRecord::new(&t, &policy, DataFacts::default());
        record.train_wall_s = Some(secs);
        // Counting every row as its own group grows with the rows (53.6 s at 36 200 before
        // issue 34): measured up to 10⁴ only.
        let independent = (n <= 10_000).then(|| {
            let s = Instant::now();
            train(&groups, None, &policy).expect("train");
            s.elapsed().as_secs_f64()
        });
        println!(
            "{:>10}  {:>9}  {:>7}  {:>11}  {:>13.3}  {:>13.0}  {:>12}",
            record.observations.unwrap_or(0),
            record.distinct_groups.unwrap_or(0),
            record.aged_observations.unwrap_or(0),
            record.corrections.map_or(0, |c| c.corrected),
            record.train_wall_s.unwrap_or(f64::NAN),
            peak_mib(),
            independent.map_or("–".to_string(), |s| format!("{s:.3}")),
        );
    }
}
