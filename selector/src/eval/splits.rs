//! Evaluating the split chooser ([`crate::splits`]) on measured sweeps, nested: in every outer
//! split the ridge strength and the fallback margin are chosen by cross-validation inside the
//! training pairs only, and the test pairs are scored once.
//!
//! Two outer protocols: **held-out pairs** (per seed, a seeded fifth of the unordered pairs is
//! held out, both orders of a pair together) and **leave-one-workload-out** (every pair with
//! the workload is held out, in turn for each workload: a workload never measured in a sweep).
//!
//! Each test pair is scored by the measured normalised throughput of the split chosen, against
//! the best split measured for it and against 100/100. Besides kace's chooser, the report scores
//! the same model without the fallback rule, the single split that was best on average in the
//! training pairs, 100/100 itself and the oracle.

use std::collections::BTreeMap;

use super::Spread;
use crate::dataset::ThreadSplit;
use crate::error::SelectorError;
use crate::numpy_rng::permutation;
use crate::splits::{check_widths, fit_tuned, SplitExample, SplitTuned};

/// Report key of kace's chooser (model and fallback rule).
pub const CHOOSER: &str = "kace-split";
/// Report key of the model's best predicted split, without the fallback rule.
pub const NO_FALLBACK: &str = "model-no-fallback";
/// Report key of the one split best on average in the training pairs.
pub const BEST_FIXED: &str = "best-fixed-split";
/// Report key of 100/100.
pub const DEFAULT: &str = "default-100-100";
/// Report key of the best measured split.
pub const ORACLE: &str = "oracle";
/// Every policy, in report order.
pub const POLICIES: [&str; 5] = [CHOOSER, NO_FALLBACK, BEST_FIXED, DEFAULT, ORACLE];

/// The outer protocol.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SplitProtocol {
    /// Per seed, `ceil(test_fraction · pairs)` unordered pairs held out.
    HeldOutPairs {
        /// Share of the unordered pairs held out.
        test_fraction: f64,
    },
    /// Each workload held out in turn, with every pair it is in.
    LeaveOneWorkloadOut,
}

impl SplitProtocol {
    /// A short stable name for reports.
    pub fn key(&self) -> &'static str {
        match self {
            SplitProtocol::HeldOutPairs { .. } => "held-out-pairs",
            SplitProtocol::LeaveOneWorkloadOut => "leave-one-workload-out",
        }
    }
}

/// One test pair's outcome under every policy.
#[derive(Debug, Clone, PartialEq)]
pub struct PairOutcome {
    /// The pair, in slot order.
    pub workloads: [String; 2],
    /// The split kace's chooser picked.
    pub chosen: ThreadSplit,
    /// The best measured split.
    pub best: ThreadSplit,
    /// Policy → (its split's normalised throughput / the best's, / 100/100's).
    pub ratios: BTreeMap<&'static str, (f64, f64)>,
}

/// One outer run: a seed (held-out pairs) or a held-out workload.
#[derive(Debug, Clone, PartialEq)]
pub struct SplitRun {
    /// The seed (0 under leave-one-workload-out).
    pub seed: u32,
    /// The workload held out, under leave-one-workload-out.
    pub heldout: Option<String>,
    /// Training examples (ordered pairs).
    pub train: usize,
    /// What cross-validation on them chose.
    pub tuned: SplitTuned,
    /// The test pairs.
    pub pairs: Vec<PairOutcome>,
}

impl SplitRun {
    /// A policy's mean ratios over this run's pairs: (to best, to 100/100), and its worst ratio
    /// to 100/100.
    pub fn score(&self, policy: &str) -> Option<(f64, f64, f64)> {
        let r: Vec<(f64, f64)> =
            self.pairs.iter().filter_map(|p| p.ratios.get(policy).copied()).collect();
        if r.is_empty() {
            return None;
        }
        let n = r.len() as f64;
        Some((
            r.iter().map(|v| v.0).sum::<f64>() / n,
            r.iter().map(|v| v.1).sum::<f64>() / n,
            r.iter().map(|v| v.1).fold(f64::INFINITY, f64::min),
        ))
    }
}

/// A whole evaluation.
#[derive(Debug, Clone, PartialEq)]
pub struct SplitReport {
    /// The outer protocol.
    pub protocol: SplitProtocol,
    /// The candidates, in order.
    pub candidates: Vec<ThreadSplit>,
    /// Examples evaluated (ordered pairs).
    pub examples: usize,
    /// Of them, those with the alone-at-share features.
    pub alone_examples: usize,
    /// One entry per seed or held-out workload.
    pub runs: Vec<SplitRun>,
}

/// A policy's figures over a report.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PolicyScore {
    /// Mean over every (run, pair) of chosen / best.
    pub chosen_vs_best: f64,
    /// Mean over every (run, pair) of chosen / 100/100.
    pub chosen_vs_default: f64,
    /// The smallest chosen / 100/100 of any pair in any run.
    pub worst_vs_default: f64,
    /// Spread over runs of the per-run mean chosen / best.
    pub chosen_vs_best_runs: Spread,
    /// Spread over runs of the per-run mean chosen / 100/100.
    pub chosen_vs_default_runs: Spread,
    /// Spread over runs of the per-run worst chosen / 100/100.
    pub worst_vs_default_runs: Spread,
}

impl SplitReport {
    /// A policy's figures (`None` when it scored no pair).
    pub fn score(&self, policy: &str) -> Option<PolicyScore> {
        let all: Vec<(f64, f64)> = self
            .runs
            .iter()
            .flat_map(|r| r.pairs.iter().filter_map(|p| p.ratios.get(policy).copied()))
            .collect();
        if all.is_empty() {
            return None;
        }
        let per_run: Vec<(f64, f64, f64)> =
            self.runs.iter().filter_map(|r| r.score(policy)).collect();
        let col = |f: fn(&(f64, f64, f64)) -> f64| per_run.iter().map(f).collect::<Vec<f64>>();
        let n = all.len() as f64;
        Some(PolicyScore {
            chosen_vs_best: all.iter().map(|v| v.0).sum::<f64>() / n,
            chosen_vs_default: all.iter().map(|v| v.1).sum::<f64>() / n,
            worst_vs_default: all.iter().map(|v| v.1).fold(f64::INFINITY, f64::min),
            chosen_vs_best_runs: Spread::of(&col(|v| v.0))?,
            chosen_vs_default_runs: Spread::of(&col(|v| v.1))?,
            worst_vs_default_runs: Spread::of(&col(|v| v.2))?,
        })
    }

    /// Test pairs scored, over all runs.
    pub fn scored_pairs(&self) -> usize {
        self.runs.iter().map(|r| r.pairs.len()).sum()
    }

    /// Share of scored pairs for which the chooser left 100/100.
    pub fn moved_share(&self) -> f64 {
        let moved = self.runs.iter().flat_map(|r| &r.pairs).filter(|p| !p.chosen.is_default());
        moved.count() as f64 / self.scored_pairs().max(1) as f64
    }

    /// Doubt weight κ → runs that chose it (`never`: no setting was safe, 100/100 always).
    pub fn chosen_doubt_weights(&self) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for r in &self.runs {
            let t = r.tuned.settings;
            let k = if t.margin.is_some() { t.doubt_weight.to_string() } else { "never".into() };
            *out.entry(k).or_insert(0) += 1;
        }
        out
    }

    /// (ridge strength, margin) → runs that chose it.
    pub fn chosen_settings(&self) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for r in &self.runs {
            let t = r.tuned.settings;
            let margin = t.margin.map_or("never".to_string(), |m| m.to_string());
            let key = format!(
                "features={} alpha={} doubt_weight={} margin={margin}",
                t.features.key(),
                t.alpha,
                t.doubt_weight
            );
            *out.entry(key).or_insert(0) += 1;
        }
        out
    }
}

/// Evaluates under `protocol`; `seeds` matter only for held-out pairs. The inner search tries
/// the doubt weights `doubt_weights` ([`crate::splits::DOUBT_WEIGHTS`]; `[0.0]`: the margin
/// alone).
pub fn evaluate(
    examples: &[SplitExample],
    candidates: &[ThreadSplit],
    protocol: SplitProtocol,
    seeds: &[u32],
    doubt_weights: &[f64],
) -> Result<SplitReport, SelectorError> {
    let all: Vec<&SplitExample> = examples.iter().collect();
    check_widths(&all, candidates)?;
    let mut runs = Vec::new();
    match protocol {
        SplitProtocol::HeldOutPairs { test_fraction } => {
            if !(test_fraction > 0.0 && test_fraction < 1.0) {
                return Err(SelectorError::Invalid(format!(
                    "test fraction {test_fraction}: must be in (0, 1)"
                )));
            }
            let mut keys: Vec<(&str, &str)> = examples.iter().map(|e| e.unordered()).collect();
            keys.sort_unstable();
            keys.dedup();
            let n_test = ((test_fraction * keys.len() as f64).ceil() as usize).min(keys.len());
            for &seed in seeds {
                let perm = permutation(seed, keys.len());
                let held: Vec<(&str, &str)> = perm[..n_test].iter().map(|&i| keys[i]).collect();
                let (test, train): (Vec<&SplitExample>, Vec<&SplitExample>) =
                    examples.iter().partition(|e| held.contains(&e.unordered()));
                runs.push(one_run(&train, &test, candidates, seed, None, doubt_weights)?);
            }
        }
        SplitProtocol::LeaveOneWorkloadOut => {
            let mut names: Vec<&str> =
                examples.iter().flat_map(|e| e.workloads.iter().map(String::as_str)).collect();
            names.sort_unstable();
            names.dedup();
            for w in names {
                let (test, train): (Vec<&SplitExample>, Vec<&SplitExample>) =
                    examples.iter().partition(|e| e.workloads.iter().any(|x| x == w));
                runs.push(one_run(
                    &train,
                    &test,
                    candidates,
                    0,
                    Some(w.to_string()),
                    doubt_weights,
                )?);
            }
        }
    }
    Ok(SplitReport {
        protocol,
        candidates: candidates.to_vec(),
        examples: examples.len(),
        alone_examples: examples.iter().filter(|e| e.input.alone.is_some()).count(),
        runs,
    })
}

fn one_run(
    train: &[&SplitExample],
    test: &[&SplitExample],
    candidates: &[ThreadSplit],
    seed: u32,
    heldout: Option<String>,
    doubt_weights: &[f64],
) -> Result<SplitRun, SelectorError> {
    let (model, tuned) = fit_tuned(train, candidates, doubt_weights)?;
    let d = candidates.iter().position(|s| s.is_default()).ok_or_else(|| {
        SelectorError::Invalid("the candidate splits must include 100/100".into())
    })?;
    // The fixed rule: the split with the highest mean ratio to the best in training.
    let fixed = (0..candidates.len())
        .map(|s| (s, train.iter().map(|e| e.normalised[s] / e.best()).sum::<f64>()))
        .fold((d, f64::NEG_INFINITY), |b, c| if c.1 > b.1 { c } else { b })
        .0;
    let pairs = test
        .iter()
        .map(|e| {
            let chosen = model.choose(&e.input);
            let best = (0..candidates.len()).fold(d, |b, s| {
                if e.normalised[s] > e.normalised[b] {
                    s
                } else {
                    b
                }
            });
            let ratio = |s: usize| (e.normalised[s] / e.best(), e.normalised[s] / e.normalised[d]);
            let ratios = BTreeMap::from([
                (CHOOSER, ratio(chosen)),
                (NO_FALLBACK, ratio(model.best_predicted(&e.input))),
                (BEST_FIXED, ratio(fixed)),
                (DEFAULT, ratio(d)),
                (ORACLE, ratio(best)),
            ]);
            PairOutcome {
                workloads: e.workloads.clone(),
                chosen: candidates[chosen],
                best: candidates[best],
                ratios,
            }
        })
        .collect();
    Ok(SplitRun { seed, heldout, train: train.len(), tuned, pairs })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::splits::tests::synthetic;
    use crate::splits::DOUBT_WEIGHTS;

    #[test]
    fn held_out_pairs_are_scored_against_best_and_default() {
        let (ex, c) = synthetic(0.1, 0.0);
        let r = evaluate(
            &ex,
            &c,
            SplitProtocol::HeldOutPairs { test_fraction: 0.2 },
            &[1, 2, 3],
            &DOUBT_WEIGHTS,
        )
        .unwrap();
        assert_eq!(r.runs.len(), 3);
        // 66 unordered pairs: 14 held out, both orders each.
        assert!(r.runs.iter().all(|run| run.pairs.len() == 28 && run.train == 132 - 28));
        let oracle = r.score(ORACLE).unwrap();
        assert_eq!(oracle.chosen_vs_best, 1.0);
        let default = r.score(DEFAULT).unwrap();
        assert_eq!((default.chosen_vs_default, default.worst_vs_default), (1.0, 1.0));
        let k = r.score(CHOOSER).unwrap();
        assert!(k.chosen_vs_best > 0.99 && k.chosen_vs_best > default.chosen_vs_best, "{k:?}");
        assert!(k.worst_vs_default >= 0.99, "{k:?}");
        assert!(k.chosen_vs_best_runs.min <= k.chosen_vs_best_runs.max);
        assert!(r.moved_share() > 0.9);
        assert_eq!(r.chosen_settings().values().sum::<usize>(), 3);
        assert_eq!(r.chosen_doubt_weights().values().sum::<usize>(), 3);

        let w = evaluate(&ex, &c, SplitProtocol::LeaveOneWorkloadOut, &[], &DOUBT_WEIGHTS).unwrap();
        assert_eq!(w.runs.len(), 12);
        assert!(
            w.runs.iter().all(|run| run.pairs.len() == 22),
            "each workload in 22 ordered pairs"
        );
        assert!(w.score(CHOOSER).unwrap().worst_vs_default > 0.0);
        assert!(evaluate(
            &ex,
            &c,
            SplitProtocol::HeldOutPairs { test_fraction: 1.0 },
            &[1],
            &DOUBT_WEIGHTS
        )
        .is_err());
    }
}
