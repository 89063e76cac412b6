//! The figures README.md and docs/models.md state, measured the leakage-free way: kace's
//! settings chosen by cross-validation inside each training set only (`--nested`), the
//! production protocol, seeds 1–100 (the split of a seed the artifact did not run is re-derived
//! the way its script does). Each test asserts the stated figure to its last digit; the
//! commands that print them are in docs/models.md.

mod common;

use common::Artifact;
use kace_selector::dataset::read_unseen_splits;
use kace_selector::eval::colocations::evaluate_split;
use kace_selector::eval::paper::{derived_split, evaluate_paper, evaluate_unseen, paper_split};
use kace_selector::eval::{EvalOptions, EvalReport, Protocol, Spread, KACE, KACE_GATED, KACE_LR};
use kace_selector::Objective;

fn artifact() -> Artifact {
    common::load()
}

fn nested() -> EvalOptions {
    EvalOptions { protocol: Protocol::Production, nested: true, ..EvalOptions::default() }
}

fn seeds() -> Vec<u32> {
    (1..=100).collect()
}

/// `got` equals the stated figure `want` to its last digit (`digits` decimals).
fn stated(what: &str, got: f64, want: f64, digits: i32) {
    let tolerance = 0.5 * 10f64.powi(-digits) + 1e-12;
    assert!((got - want).abs() <= tolerance, "{what}: measured {got:.6}, stated {want}");
}

fn spread(what: &str, s: Spread, want: [f64; 4]) {
    stated(&format!("{what} mean"), s.mean, want[0], 4);
    stated(&format!("{what} min"), s.min, want[1], 4);
    stated(&format!("{what} median"), s.median, want[2], 4);
    stated(&format!("{what} max"), s.max, want[3], 4);
}

fn summary(r: &EvalReport) -> String {
    format!(
        "means {:?}; kace spread {:?}; harmful {:?}/{:?}; gain share {:?}; MAPE {:.2}; paired {:?}",
        r.means(),
        r.seed_spread(KACE),
        r.harmful_share(KACE),
        r.harmful_share(KACE_GATED),
        r.gain_share(true),
        r.mape(),
        r.paired(KACE, KACE_LR)
    )
}

#[test]
#[ignore = "needs ../shared/data/kace-artifact"]
fn derived_splits_equal_the_artifacts_on_its_seeds() {
    let a = artifact();
    for n in [2, 3, 5, 10] {
        for seed in [10, 20, 30, 40, 50] {
            let file = paper_split(&a.pairs, &a.splits, n, seed).unwrap();
            let derived = derived_split(&a.pairs, n, seed);
            assert_eq!(file, derived, "n_occur={n}, seed={seed}");
        }
    }
}

#[test]
#[ignore = "needs ../shared/data/kace-artifact"]
fn pairs_at_n_occur_3_nested_over_100_seeds() {
    let a = artifact();
    let r = evaluate_paper(&a.pairs, &a.splits, 3, &seeds(), &nested()).unwrap();
    eprintln!("n_occur=3 nested: {}", summary(&r));
    let m = r.means();
    stated("kace", m[KACE], 0.9686, 4);
    stated("kace-lr", m[KACE_LR], 0.9304, 4);
    stated("max Σ SM throughput", m["sm_throughput"], 0.8762, 4);
    spread("kace", r.seed_spread(KACE).unwrap(), [0.9686, 0.9009, 0.9733, 0.9967]);
    let d = r.paired(KACE, KACE_LR).unwrap();
    stated("kace − kace-lr", d.mean, 0.0382, 4);
    assert_eq!((d.better, d.worse), (89, 11));
    stated("harmful picks, kace", r.harmful_share(KACE).unwrap(), 0.106, 3);
    stated("harmful picks, gain rule", r.harmful_share(KACE_GATED).unwrap(), 0.029, 3);
    stated("MAPE seen", r.mape(), 14.8, 1);
}

#[test]
#[ignore = "needs ../shared/data/kace-artifact"]
fn gain_rule_on_normalised_progress_nested_over_100_seeds() {
    let a = artifact();
    let opts = EvalOptions { objective: Objective::NormalisedProgress, ..nested() };
    let r = evaluate_paper(&a.pairs, &a.splits, 3, &seeds(), &opts).unwrap();
    eprintln!("n_occur=3 nested, normalised progress: {}", summary(&r));
    stated("kace", r.means()[KACE], 0.9702, 4);
    stated("harmful picks, gain rule", r.harmful_share(KACE_GATED).unwrap(), 0.024, 3);
    stated("share of the oracle's gain", r.gain_share(true).unwrap(), 0.946, 3);
    stated("no partner", r.none_share().unwrap(), 0.090, 3);
}

#[test]
#[ignore = "needs ../shared/data/kace-artifact"]
fn unseen_workloads_leave_one_workload_out_nested() {
    let a = artifact();
    let path = a.dir.join("splits/unseen_workload_splits.csv");
    let rows =
        read_unseen_splits("unseen", std::fs::File::open(&path).expect("unseen splits")).unwrap();
    let r = evaluate_unseen(&a.pairs, &rows, &nested()).unwrap();
    eprintln!("unseen nested: {}", summary(&r));
    assert_eq!(r.targets.len(), 21);
    let m = r.means();
    stated("kace", m[KACE], 0.9621, 4);
    stated("kace-lr", m[KACE_LR], 0.7954, 4);
    stated("max Σ SM throughput", m["sm_throughput"], 0.8831, 4);
    stated("MAPE unseen", r.mape(), 50.0, 1);
}

/// The same 21 held-out workloads with only their system profile (what NVML samples: no
/// Nsight Compute kernel metrics), in the inner cross-validation as in the test: what the
/// missing kernel profile costs a new workload (`kace eval paper --unseen --system-only`).
#[test]
#[ignore = "needs ../shared/data/kace-artifact"]
fn unseen_workloads_with_system_profiles_only_nested() {
    let a = artifact();
    let path = a.dir.join("splits/unseen_workload_splits.csv");
    let rows =
        read_unseen_splits("unseen", std::fs::File::open(&path).expect("unseen splits")).unwrap();
    let opts = EvalOptions {
        system_only: true,
        models: vec![kace_selector::eval::ModelChoice::Kace],
        ..nested()
    };
    let r = evaluate_unseen(&a.pairs, &rows, &opts).unwrap();
    eprintln!("unseen, system profiles only, nested: {}", summary(&r));
    assert_eq!(r.targets.len(), 21);
    stated("kace", r.means()[KACE], 0.9482, 4);
    stated("MAPE unseen", r.mape(), 47.5, 1);
    // Un-nested (the default setting): the kernel metrics are worth more there.
    let fixed = EvalOptions { nested: false, ..opts };
    let r = evaluate_unseen(&a.pairs, &rows, &fixed).unwrap();
    stated("kace, default setting", r.means()[KACE], 0.9282, 4);
    let full = EvalOptions { system_only: false, ..fixed };
    stated(
        "kace, default setting, full profile",
        evaluate_unseen(&a.pairs, &rows, &full).unwrap().means()[KACE],
        0.9656,
        4,
    );
}

#[test]
#[ignore = "needs ../shared/data/kace-artifact"]
fn three_way_groups_nested_over_100_seeds() {
    let a = artifact();
    let d = a.table("multiinstance/total_labels_batch2-8_targetMPS100.csv");
    let r = evaluate_split(&d, 3, &seeds(), &nested()).unwrap();
    eprintln!("3-way nested: {}", summary(&r));
    let m = r.means();
    stated("kace", m[KACE], 0.9648, 4);
    stated("kace-lr", m[KACE_LR], 0.9568, 4);
    let p = r.paired(KACE, KACE_LR).unwrap();
    stated("kace − kace-lr", p.mean, 0.0080, 4);
    assert_eq!((p.better, p.worse, p.equal), (37, 26, 37));
    spread("kace", r.seed_spread(KACE).unwrap(), [0.9648, 0.8319, 0.9784, 0.9992]);
}

fn mean(v: impl IntoIterator<Item = f64>) -> f64 {
    let (sum, n) = v.into_iter().fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    sum / n as f64
}

/// Exclusive throughput at MPS 100 % per workload, from one of the artifact's baseline sweeps
/// (`workload,10,…,100`; empty cells are runs it did not make).
fn exclusive_sweep(a: &Artifact, file: &str) -> std::collections::BTreeMap<String, f64> {
    let f = std::fs::File::open(a.dir.join("raw_mps_sweeps").join(file)).expect("baseline sweep");
    let mut r = csv::ReaderBuilder::new().flexible(true).from_reader(f);
    let col = r.headers().unwrap().iter().position(|h| h == "100").expect("column 100");
    r.records()
        .map(|rec| rec.unwrap())
        .filter_map(|rec| Some((rec[0].to_string(), rec.get(col)?.parse::<f64>().ok()?)))
        .collect()
}

/// What bounds the seen-workload MAPE goal (6 %) from below, and what does not. kace's model
/// fitted on every pair of the table and scored on those same pairs — the error it keeps when
/// nothing is held out — is the floor its out-of-sample error can approach; almost without
/// shrinkage it is no lower. Measurement noise is far below it: two copies of one workload in
/// a self pair (same GPU, same run) differ little, and the exclusive throughputs the ratios
/// divide by were measured on two days within a few per cent.
#[test]
#[ignore = "needs ../shared/data/kace-artifact"]
fn seen_mape_floor_is_the_models_not_the_measurements() {
    use kace_selector::dataset::Group;
    use kace_selector::eval::run::job_errors;
    use kace_selector::slowdown::{SlowdownModel, SlowdownParams};
    use kace_selector::tuning::{fit_tuned, grid, Folds};

    let a = artifact();
    let all: Vec<&Group> = a.pairs.groups.iter().collect();
    let in_sample = |m: &SlowdownModel| 100.0 * mean(all.iter().flat_map(|g| job_errors(m, g, g)));
    let (tuned, t) = fit_tuned(&all, &grid(), Folds::default()).unwrap();
    eprintln!("tuned on every pair: {:?}", t.params);
    stated("in-sample MAPE, tuned", in_sample(&tuned), 9.1, 1);
    let loose = SlowdownParams { alpha: 0.01, workload_scale: 10.0, robust: false, neighbours: 0 };
    stated("in-sample MAPE, α 0.01", in_sample(&SlowdownModel::fit(&all, loose).unwrap()), 9.2, 1);

    let self_pairs: Vec<&Group> = all.iter().copied().filter(|g| g.is_self_group()).collect();
    assert_eq!(self_pairs.len(), 16);
    let twin = mean(self_pairs.iter().flat_map(|g| {
        let m = g.total_throughput() / g.k() as f64;
        g.throughputs.iter().map(move |t| (m - t).abs() / t)
    }));
    stated("self pairs: each copy against their mean, %", 100.0 * twin, 1.7, 1);

    let first = exclusive_sweep(&a, "baseline_steps_stage2.csv");
    let second = exclusive_sweep(&a, "0522baseline_steps_stage2.csv");
    let mut days: Vec<f64> =
        a.pairs.workloads().iter().map(|w| (first[w] - second[w]).abs() / first[w]).collect();
    days.sort_by(f64::total_cmp);
    assert_eq!(days.len(), 21);
    stated("exclusive on two days, median %", 100.0 * days[10], 1.2, 1);
    stated("exclusive on two days, mean %", 100.0 * mean(days.iter().copied()), 2.9, 1);
    stated("exclusive on two days, max %", 100.0 * days[20], 8.9, 1);
}
