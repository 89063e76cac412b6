//! The SM split figures docs/models.md (*The SM split*) states, measured on the artifact's raw
//! MPS sweeps with the nested protocol `kace eval splits` runs: held-out pairs over seeds 1–10
//! and leave-one-workload-out. Each figure is asserted to its last stated digit, and so is the
//! worst case against 100/100 the fallback rule is for.

use std::fs::File;

use kace_selector::dataset::{read_exclusive_sweeps, read_mps_sweeps, read_system_profiles};
use kace_selector::eval::splits::{
    evaluate, SplitProtocol, SplitReport, CHOOSER, DEFAULT, NO_FALLBACK, ORACLE,
};
use kace_selector::splits::{artifact_candidates, examples, Dropped, SplitExample, DOUBT_WEIGHTS};

const SWEEPS: &str = "raw_mps_sweeps/merged0505_0617_0520_0520_share_steps_stage2.csv";

fn load(with_exclusive: bool) -> (Vec<SplitExample>, Dropped) {
    let dir = kace_test_support::artifact();
    let open = |p: &str| File::open(dir.join(p)).expect("artifact file readable");
    let rows = read_mps_sweeps(SWEEPS, open(SWEEPS)).expect("sweeps parse");
    let profiles =
        read_system_profiles("baseline_labels", open("workload_profiles/baseline_labels.csv"))
            .expect("profiles parse");
    let exclusive = with_exclusive.then(|| {
        read_exclusive_sweeps("baseline_steps", open("raw_mps_sweeps/baseline_steps_stage2.csv"))
            .expect("exclusive sweeps parse")
    });
    examples(&rows, &profiles, exclusive.as_ref(), &artifact_candidates())
}

/// `got` equals the stated figure `want` to its fourth decimal.
fn stated(what: &str, got: f64, want: f64) {
    assert!((got - want).abs() <= 0.5e-4 + 1e-12, "{what}: measured {got:.6}, stated {want}");
}

/// Chosen/best, chosen/100-100 and worst/100-100 of a policy.
fn figures(r: &SplitReport, policy: &str, want: [f64; 3]) {
    let s = r.score(policy).expect("policy scored");
    stated(&format!("{policy} chosen/best"), s.chosen_vs_best, want[0]);
    stated(&format!("{policy} chosen/default"), s.chosen_vs_default, want[1]);
    stated(&format!("{policy} worst/default"), s.worst_vs_default, want[2]);
}

/// Pairs for which the chooser gave less than 0.99 of 100/100.
fn losses(r: &SplitReport) -> usize {
    r.runs.iter().flat_map(|run| &run.pairs).filter(|p| p.ratios[CHOOSER].1 < 0.99).count()
}

#[test]
#[ignore = "needs ../shared/data/kace-artifact"]
fn split_chooser_nested_on_the_artifacts_sweeps() {
    let (ex, dropped) = load(true);
    assert_eq!(ex.len(), 184);
    assert_eq!(dropped, Dropped { unmeasured: 351, unprofiled: 0, implausible: 1 });
    assert!(ex.iter().all(|e| e.input.alone.is_some()));
    let c = artifact_candidates();
    let seeds: Vec<u32> = (1..=10).collect();

    let r = evaluate(
        &ex,
        &c,
        SplitProtocol::HeldOutPairs { test_fraction: 0.2 },
        &seeds,
        &DOUBT_WEIGHTS,
    )
    .unwrap();
    assert_eq!(r.scored_pairs(), 365);
    figures(&r, CHOOSER, [0.9705, 1.0317, 0.9612]);
    figures(&r, NO_FALLBACK, [0.9793, 1.0441, 0.7703]);
    figures(&r, DEFAULT, [0.9466, 1.0, 1.0]);
    figures(&r, ORACLE, [1.0, 1.0657, 1.0]);
    let s = r.score(CHOOSER).unwrap();
    let spread = s.chosen_vs_best_runs;
    for (what, got, want) in [
        ("min", spread.min, 0.9578),
        ("median", spread.median, 0.9727),
        ("max", spread.max, 0.9834),
    ] {
        stated(&format!("chosen/best over seeds, {what}"), got, want);
    }
    // The worst-case bound: the fallback keeps every pair but two of 365 within 1 % of
    // 100/100 and the worst at 0.961 (without it: 0.770). The goal (≥ 0.99 for every pair) is
    // not met, and this says by how much.
    assert_eq!(losses(&r), 2);
    assert!(s.worst_vs_default >= 0.96);
    assert!(s.worst_vs_default > r.score(NO_FALLBACK).unwrap().worst_vs_default + 0.15);
    // κ = 1.5 won the inner search in 9 of the 10 seeds (docs/models.md says so).
    assert_eq!(r.chosen_doubt_weights().get("1.5"), Some(&9));
    // Nor is the mean goal (≥ 0.98 of the best split).
    assert!(s.chosen_vs_best < 0.98);

    let w = evaluate(&ex, &c, SplitProtocol::LeaveOneWorkloadOut, &[], &DOUBT_WEIGHTS).unwrap();
    assert_eq!((w.runs.len(), w.scored_pairs()), (33, 359));
    figures(&w, CHOOSER, [0.9635, 1.0206, 0.9696]);
    figures(&w, NO_FALLBACK, [0.9800, 1.0423, 0.7787]);
    figures(&w, DEFAULT, [0.9480, 1.0, 1.0]);
    assert_eq!(losses(&w), 2);
}

#[test]
#[ignore = "needs ../shared/data/kace-artifact"]
fn split_chooser_from_system_profiles_only() {
    let (ex, _) = load(false);
    assert!(ex.iter().all(|e| e.input.alone.is_none()));
    let c = artifact_candidates();
    let seeds: Vec<u32> = (1..=10).collect();
    let r = evaluate(
        &ex,
        &c,
        SplitProtocol::HeldOutPairs { test_fraction: 0.2 },
        &seeds,
        &DOUBT_WEIGHTS,
    )
    .unwrap();
    figures(&r, CHOOSER, [0.9693, 1.0302, 0.9696]);
    assert_eq!(losses(&r), 1);
    let w = evaluate(&ex, &c, SplitProtocol::LeaveOneWorkloadOut, &[], &DOUBT_WEIGHTS).unwrap();
    figures(&w, CHOOSER, [0.9649, 1.0220, 0.9696]);
}

/// The first fallback rule, a margin alone (κ = 0), on system profiles: what `kace eval splits
/// --system-only --no-doubt` prints. It meets the worst-case bound here and leaves 100/100
/// for few pairs, so its mean stays near 100/100's.
#[test]
#[ignore = "needs ../shared/data/kace-artifact"]
fn margin_alone_on_system_profiles() {
    let (ex, _) = load(false);
    let c = artifact_candidates();
    let seeds: Vec<u32> = (1..=10).collect();
    let r = evaluate(&ex, &c, SplitProtocol::HeldOutPairs { test_fraction: 0.2 }, &seeds, &[0.0])
        .unwrap();
    figures(&r, CHOOSER, [0.9590, 1.0170, 1.0]);
    assert_eq!(losses(&r), 0);
    stated("moved share", r.moved_share(), 0.0548);
    let w = evaluate(&ex, &c, SplitProtocol::LeaveOneWorkloadOut, &[], &[0.0]).unwrap();
    figures(&w, CHOOSER, [0.9583, 1.0140, 1.0]);
    assert_eq!(losses(&w), 0);
}
