//! Benchmark (prints a table): training the paper's model, and predicting + choosing among
//! 10…10 000 candidates. Run with `cargo bench -p kace-selector --bench selection`.

use std::fs::File;
use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use kace_selector::dataset::{read_colocations, ColocationData};
use kace_selector::{combine, select, Candidate, LinearModel, Profile, SelectionRules};

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

/// The artifact's pair table, or a synthetic table of the same size when it is absent.
fn pairs() -> (ColocationData, &'static str) {
    let dir = std::env::var_os("KACE_ARTIFACT_DIR").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/kace-artifact")
    });
    let path = dir.join("pairs/MPS100_kernel_labels_targetMPS100.csv");
    if let Ok(f) = File::open(&path) {
        if let Ok(d) = read_colocations("pairs", f) {
            return (d, "artifact, 181 pairs");
        }
    }
    eprintln!("artifact not found at {}: using synthetic pairs", path.display());
    let mut groups = Vec::new();
    for i in 0..181 {
        let p = |s: f64| Profile::new(std::array::from_fn(|j| 1.0 + s * (j as f64 + 1.0)));
        let (a, b) = (p((i % 21) as f64), p((i % 13) as f64 * 0.7));
        groups.push(kace_selector::dataset::Group {
            workloads: vec![format!("w{}", i % 21), format!("w{}", i % 13)],
            profiles: vec![a, b],
            throughputs: vec![10.0 + (i % 7) as f64, 5.0 + (i % 5) as f64],
        });
    }
    (ColocationData { k: 2, groups }, "synthetic, 181 pairs")
}

fn main() {
    let (data, source) = pairs();
    let x: Vec<[f64; 10]> = data.groups.iter().map(|g| g.features()).collect();
    let y: Vec<f64> = data.groups.iter().map(|g| g.total_throughput()).collect();
    let fit_all = median(201, || {
        black_box(LinearModel::fit(black_box(&x), black_box(&y)).ok());
    });
    let fit_small = median(201, || {
        black_box(LinearModel::fit(black_box(&x[..32]), black_box(&y[..32])).ok());
    });
    let model = LinearModel::fit(&x, &y).expect("fit");

    println!("kace-selector benchmark ({source}; median of repeated runs)");
    println!();
    println!("{:<44} {:>12}", "training (OLS on z-scored features)", "time");
    println!("{:<44} {:>9.1} µs", "fit on all 181 pairs", fit_all.as_secs_f64() * 1e6);
    println!(
        "{:<44} {:>9.1} µs",
        "fit on 32 pairs (n_occur=3 fit subset size)",
        fit_small.as_secs_f64() * 1e6
    );
    println!();
    println!("{:<12} {:>14} {:>16}", "candidates", "select() time", "per candidate");

    let lead = data.groups[0].profiles[0];
    let pool: Vec<Profile> = data.groups.iter().map(|g| g.profiles[1]).collect();
    for n in [10usize, 100, 1_000, 10_000] {
        let profiles: Vec<Profile> = (0..n).map(|i| pool[i % pool.len()]).collect();
        let cands: Vec<Candidate<'_>> =
            profiles.iter().map(|p| Candidate { profile: Some(p), same_user: true }).collect();
        let rules = SelectionRules { gpu_memory_gib: Some(32.0), ..SelectionRules::default() };
        let runs = if n >= 10_000 { 101 } else { 1001 };
        let t = median(runs, || {
            black_box(select(black_box(&[lead]), black_box(&cands), &model, &rules).chosen);
        });
        println!(
            "{:<12} {:>11.2} µs {:>13.1} ns",
            n,
            t.as_secs_f64() * 1e6,
            t.as_secs_f64() * 1e9 / n as f64
        );
    }
    // The raw predict path alone, for reference.
    let feats: Vec<[f64; 10]> = pool.iter().map(|p| combine([&lead, p])).collect();
    let t = median(1001, || {
        let s: f64 = feats.iter().map(|f| model.predict(black_box(f))).sum();
        black_box(s);
    });
    println!();
    println!(
        "model.predict alone: {:.1} ns per candidate",
        t.as_secs_f64() * 1e9 / feats.len() as f64
    );
}
