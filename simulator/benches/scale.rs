//! Benchmark (prints a table): simulated jobs per second of wall time at 100, 1 000 and
//! 10 000 GPUs, 100 jobs per GPU (so the last rows are the 1 000 000-job run), at load 2 so the
//! queue grows throughout, then kace at load 0.8, where most GPUs wait open for a partner.
//! Run with `cargo bench -p kace-simulator --bench scale`; pass
//! `--quick` (after `--`) to skip the 10 000-GPU row.

use std::fs::File;
use std::hint::black_box;
use std::time::Instant;

use kace_selector::dataset::read_colocations;
use kace_selector::{Feature, Profile, SelectionRules, FEATURE_COUNT};
use kace_simulator::world::MeasuredPair;
use kace_simulator::{
    generate, simulate, train_kace, PairingPolicy, PolicyKind, TraceSpec, World, DEFAULT_WINDOW,
};

/// The artifact's world and a kace model trained on seed 10's split, or a synthetic world of
/// the same shape (21 workloads, every pair measured) when the artifact is absent.
fn world() -> (World, Option<kace_selector::Model>, &'static str) {
    let path =
        kace_test_support::artifact_dir().join("pairs/MPS100_kernel_labels_targetMPS100.csv");
    if let Ok(f) = File::open(&path) {
        if let Ok(d) = read_colocations("pairs", f) {
            if let (Ok(w), Ok(k)) = (
                World::from_colocations(&d, 32.0),
                train_kace(
                    &d,
                    10,
                    kace_selector::ModelKind::default(),
                    kace_selector::Objective::default(),
                ),
            ) {
                return (w, Some(k.model), "artifact, 21 workloads");
            }
        }
    }
    eprintln!("artifact not found at {}: using a synthetic world", path.display());
    let workloads: Vec<(String, Profile)> = (0..21)
        .map(|i| {
            let mut f: [f64; FEATURE_COUNT] =
                std::array::from_fn(|j| 1.0 + ((i * 7 + j) % 11) as f64);
            f[Feature::ExclusiveThroughput.index()] = 5.0 + (i * 13 % 40) as f64;
            f[Feature::Memcap.index()] = 1.0 + (i % 7) as f64 * 2.0;
            (format!("w{i}"), Profile::new(f))
        })
        .collect();
    let mut pairs = Vec::new();
    for a in 0..21 {
        for b in a..21 {
            let (xa, xb) =
                (workloads[a].1.exclusive_throughput(), workloads[b].1.exclusive_throughput());
            pairs.push(MeasuredPair {
                workloads: [workloads[a].0.clone(), workloads[b].0.clone()],
                throughputs: [xa * (0.5 + ((a + b) % 5) as f64 * 0.1), xb * 0.6],
            });
        }
    }
    (World::new(workloads, &pairs, 32.0).expect("synthetic world"), None, "synthetic, 21 workloads")
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (world, model, source) = world();
    let rules = SelectionRules { gpu_memory_gib: Some(32.0), ..SelectionRules::default() };
    println!("kace-simulator scale benchmark ({source}; window {DEFAULT_WINDOW})\n");
    println!(
        "{:>6}  {:>9}  {:>4}  {:<11}  {:>8}  {:>10}  {:>12}  {:>12}",
        "GPUs", "jobs", "load", "policy", "wall s", "events", "jobs/s", "events/s"
    );
    let sizes: &[usize] = if quick { &[100, 1_000] } else { &[100, 1_000, 10_000] };
    let runs = sizes
        .iter()
        .map(|&g| (g, 2.0, &PolicyKind::ALL[..]))
        .chain(sizes.iter().map(|&g| (g, 0.8, &[PolicyKind::Kace][..])));
    for (gpus, load, kinds) in runs {
        let jobs = generate(&world, &TraceSpec::new(100 * gpus, load, gpus, 1)).expect("trace");
        for &kind in kinds {
            let policy = match (kind, &model) {
                (PolicyKind::Exclusive, _) => PairingPolicy::exclusive(&world),
                (PolicyKind::QueueOrder, _) => PairingPolicy::queue_order(&world),
                (PolicyKind::Memcap, _) => PairingPolicy::memcap(&world, &rules),
                (PolicyKind::Oracle, _) => PairingPolicy::oracle(&world, &rules),
                (PolicyKind::Kace, Some(m)) => PairingPolicy::kace(&world, m, &rules),
                (PolicyKind::KaceAtStart, Some(m)) => {
                    PairingPolicy::kace_at_start(&world, m, &rules)
                }
                (PolicyKind::Kace | PolicyKind::KaceAtStart, None) => continue,
            };
            let t = Instant::now();
            let o = simulate(&world, &policy, black_box(&jobs), gpus, DEFAULT_WINDOW)
                .expect("simulation");
            let wall = t.elapsed().as_secs_f64();
            println!(
                "{:>6}  {:>9}  {:>4}  {:<11}  {:>8.3}  {:>10}  {:>12.0}  {:>12.0}",
                gpus,
                jobs.len(),
                load,
                kind.key(),
                wall,
                o.events,
                jobs.len() as f64 / wall,
                o.events as f64 / wall
            );
            black_box(o);
        }
    }
}
