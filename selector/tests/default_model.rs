//! What kace's default model must show on the KACE artifact's data (docs/models.md): its choices
//! against the oracle's in kace's production protocol, the unseen-workload experiment, the whole
//! n_occur curve against the paper's model, and the 3-way data against the paper's model. Each
//! test prints its figures (run with `--nocapture` to see them); without the artifact the tests
//! say so and check nothing.

mod common;

use std::fs::File;

use common::{load, Artifact};
use kace_selector::dataset::read_unseen_splits;
use kace_selector::eval::colocations::evaluate_split;
use kace_selector::eval::paper::{evaluate_paper, evaluate_unseen, PAPER_SEEDS};
use kace_selector::eval::{EvalOptions, EvalReport, Protocol, KACE, KACE_LR};
use kace_selector::Objective;

fn options(protocol: Protocol) -> EvalOptions {
    EvalOptions { protocol, ..EvalOptions::default() }
}

fn n_occur(a: &Artifact, n: u32, protocol: Protocol) -> EvalReport {
    evaluate_paper(&a.pairs, &a.splits, n, &PAPER_SEEDS, &options(protocol)).unwrap()
}

#[test]
#[ignore = "needs ../shared/data/kace-artifact"]
fn picks_within_five_percent_of_the_oracle_at_n_occur_3() {
    let a = load();
    let prod = n_occur(&a, 3, Protocol::Production).means();
    let paper = n_occur(&a, 3, Protocol::Paper).means();
    eprintln!(
        "n_occur=3: kace {:.4} production / {:.4} paper protocol; kace-lr {:.4} / {:.4}",
        prod[KACE], paper[KACE], prod[KACE_LR], paper[KACE_LR]
    );
    assert!(prod[KACE] >= 0.95, "{prod:?}");
    // The paper's best model at n_occur = 3 (its neural network) reached 0.934.
    assert!(paper[KACE] > 0.934, "{paper:?}");
}

#[test]
#[ignore = "needs ../shared/data/kace-artifact"]
fn normalised_progress_objective_beats_the_papers_model() {
    let a = load();
    for protocol in [Protocol::Production, Protocol::Paper] {
        let opts = EvalOptions { objective: Objective::NormalisedProgress, ..options(protocol) };
        let m = evaluate_paper(&a.pairs, &a.splits, 3, &PAPER_SEEDS, &opts).unwrap().means();
        eprintln!(
            "n_occur=3, normalised progress, {} protocol: kace {:.4}, kace-lr {:.4}",
            protocol.key(),
            m[KACE],
            m[KACE_LR]
        );
        assert!(m[KACE] > m[KACE_LR] && m[KACE] >= 0.95, "{protocol:?}: {m:?}");
    }
}

#[test]
#[ignore = "needs ../shared/data/kace-artifact"]
fn unseen_workloads_at_least_0_93() {
    let a = load();
    let path = a.dir.join("splits/unseen_workload_splits.csv");
    let rows = read_unseen_splits("unseen", File::open(path).unwrap()).unwrap();
    let prod = evaluate_unseen(&a.pairs, &rows, &options(Protocol::Production)).unwrap().means();
    let paper = evaluate_unseen(&a.pairs, &rows, &options(Protocol::Paper)).unwrap().means();
    eprintln!("unseen: kace {:.4} production / {:.4} paper protocol", prod[KACE], paper[KACE]);
    assert!(prod[KACE] >= 0.93, "{prod:?}");
    assert!(paper[KACE] > paper[KACE_LR], "{paper:?}");
}

#[test]
#[ignore = "needs ../shared/data/kace-artifact"]
fn whole_n_occur_curve_at_or_above_the_papers_model() {
    let a = load();
    for n in 2..=10 {
        let ours = n_occur(&a, n, Protocol::Production).means()[KACE];
        let paper = n_occur(&a, n, Protocol::Paper).means();
        eprintln!(
            "n_occur={n}: kace {ours:.4} production / {:.4} paper; the paper's LR {:.4}",
            paper[KACE], paper[KACE_LR]
        );
        assert!(ours >= paper[KACE_LR], "n_occur={n}: {ours} vs {}", paper[KACE_LR]);
        assert!(paper[KACE] >= paper[KACE_LR], "n_occur={n}, paper protocol: {paper:?}");
    }
}

/// The 3-way comparison is made seed by seed over 100 seeds: with ~20 training triples one split
/// decides a five-seed mean (at the paper's seeds, seed 40 alone puts the paper's model ahead),
/// so five seeds cannot tell the two models apart; a hundred can.
#[test]
#[ignore = "needs ../shared/data/kace-artifact"]
fn three_way_choices_no_worse_than_the_papers_model() {
    let a = load();
    for file in ["total_labels_batch2-8_targetMPS100.csv", "total_labels_batch2_targetMPS100.csv"] {
        let d = a.table(&format!("multiinstance/{file}"));
        assert_eq!(d.k, 3);
        let seeds: Vec<u32> = (1..=100).collect();
        for protocol in [Protocol::Production, Protocol::Paper] {
            let five = evaluate_split(&d, 3, &PAPER_SEEDS, &options(protocol)).unwrap().means();
            let report = evaluate_split(&d, 3, &seeds, &options(protocol)).unwrap();
            let m = report.means();
            let p = report.paired(KACE, KACE_LR).unwrap();
            eprintln!(
                "3-way {file}, {} protocol: seeds 10–50: kace {:.4}, kace-lr {:.4}; seeds \
                 1–100: kace {:.4}, kace-lr {:.4}, difference {:+.4} ± {:.4} (better in {}, \
                 worse in {}, equal in {})",
                protocol.key(),
                five[KACE],
                five[KACE_LR],
                m[KACE],
                m[KACE_LR],
                p.mean,
                p.standard_error,
                p.better,
                p.worse,
                p.equal
            );
            assert_eq!(p.seeds, 100);
            assert!(p.mean > 0.0 && m[KACE] > m[KACE_LR], "{file}, {protocol:?}: {m:?}");
        }
    }
}
