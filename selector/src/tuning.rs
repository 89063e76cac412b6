//! Choosing the slowdown model's settings and its gain rule's doubt weight by cross-validation
//! inside the training data only: the evaluation's nested protocol and `kace train` both call
//! [`tune`], so the figures in `docs/models.md` measure exactly what production does.
//!
//! The grid is small on purpose (18 settings): each fit is a closed-form ridge solve (four for
//! the robust fit), and the nested evaluation repeats the whole search for every outer split of
//! 100 seeds.
//!
//! The robust (Huber) fit is not in the grid: it is always on. Offered the plain least-squares
//! fit as well, the squared-error criterion chose it in 66 of 100 nested splits (squared error
//! is the loss the plain fit minimises and the robust one declines to), and every decision
//! figure came out lower (docs/measurements/2026-12-02-model-evaluation.md, *What was tried*);
//! and the robust fit is what keeps an outlier that passes the plausibility bounds from
//! steering the model.

use crate::dataset::Group;
use crate::error::SelectorError;
use crate::features::Profile;
use crate::numpy_rng::permutation;
use crate::slowdown::{Member, SlowdownModel, SlowdownParams};

/// Ridge strengths tried.
pub const ALPHAS: [f64; 3] = [0.3, 1.0, 3.0];
/// Workload-indicator scales tried.
pub const WORKLOAD_SCALES: [f64; 3] = [0.5, 1.0, 2.0];
/// Neighbours a new workload borrows its terms from, tried (0 first: ties keep the simpler).
pub const NEIGHBOURS: [usize; 2] = [0, 3];
/// Doubt weights `κ` tried for the gain rule, smallest first.
pub const DOUBT_WEIGHTS: [f64; 8] = [0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0];
/// The gain rule's target: at most this share of the groups it forms may be harmful
/// (measured Σ colocated / exclusive < 1) in cross-validation.
pub const MAX_HARMFUL_SHARE: f64 = 0.02;
/// Folds of the group-wise cross-validation.
pub const GROUP_FOLDS: usize = 5;
/// Seed of the group-wise folds (fixed, so that training is reproducible).
pub const FOLD_SEED: u32 = 30;

/// How the training groups are split for cross-validation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Folds {
    /// `folds` seeded folds of groups: the case of workloads seen in training.
    Groups {
        /// Number of folds.
        folds: usize,
        /// Seed of the permutation that deals groups into folds.
        seed: u32,
    },
    /// One fold per workload, holding out every group it is in: the case of a new workload.
    Workloads,
    /// As [`Folds::Workloads`], with the held-out workload's kernel metrics hidden: the case of
    /// a new workload that has only the system profile NVML sampled.
    WorkloadsSystemOnly,
}

impl Default for Folds {
    fn default() -> Self {
        Folds::Groups { folds: GROUP_FOLDS, seed: FOLD_SEED }
    }
}

impl Folds {
    /// The held-out group indices of each fold (a fold with nothing left to train on, or nothing
    /// held out, is dropped).
    pub fn held_out(self, groups: &[&Group]) -> Vec<Vec<usize>> {
        let n = groups.len();
        let folds: Vec<Vec<usize>> = match self {
            Folds::Groups { folds, seed } => {
                let k = folds.clamp(2, n.max(2));
                let mut out = vec![Vec::new(); k];
                for (pos, i) in permutation(seed, n).into_iter().enumerate() {
                    out[pos % k].push(i);
                }
                for f in &mut out {
                    f.sort_unstable();
                }
                out
            }
            Folds::Workloads | Folds::WorkloadsSystemOnly => {
                let mut names: Vec<&str> =
                    groups.iter().flat_map(|g| g.workloads.iter().map(String::as_str)).collect();
                names.sort_unstable();
                names.dedup();
                names
                    .into_iter()
                    .map(|w| (0..n).filter(|&i| groups[i].contains(w)).collect())
                    .collect()
            }
        };
        folds.into_iter().filter(|f: &Vec<usize>| !f.is_empty() && f.len() < n).collect()
    }

    /// Whether a held-out workload the fold's model never trained on is shown system-only.
    pub fn hides_kernel_metrics(self) -> bool {
        self == Folds::WorkloadsSystemOnly
    }
}

/// One held-out group's out-of-fold prediction.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OutOfFold {
    /// Predicted normalised progress (Σ predicted slowdowns).
    pub predicted: f64,
    /// The fold model's doubt about the group.
    pub doubt: f64,
    /// Measured normalised progress.
    pub measured: f64,
}

/// Cross-validation of one setting: the mean squared error of held-out jobs' log slowdowns, and
/// every held-out group's prediction.
#[derive(Debug, Clone, PartialEq)]
pub struct CrossValidation {
    /// The setting.
    pub params: SlowdownParams,
    /// Mean squared error of `ln(predicted / measured slowdown)` over held-out jobs.
    pub log_mse: f64,
    /// Held-out groups' predictions.
    pub out_of_fold: Vec<OutOfFold>,
    /// Per held-out group (index into the cross-validated groups): predicted and measured
    /// throughput sum.
    pub sums: Vec<(usize, f64, f64)>,
}

impl CrossValidation {
    /// How good the choices the out-of-fold predictions make are: for each workload with two
    /// or more held-out groups, the measured throughput sum of the group predicted best over
    /// the best measured, averaged over workloads (the evaluation's question, asked inside the
    /// training data). NaN when no workload has two.
    pub fn choice_score(&self, groups: &[&Group]) -> f64 {
        let mut names: Vec<&str> =
            groups.iter().flat_map(|g| g.workloads.iter().map(String::as_str)).collect();
        names.sort_unstable();
        names.dedup();
        let (mut total, mut n) = (0.0, 0usize);
        for w in names {
            let cands: Vec<&(usize, f64, f64)> =
                self.sums.iter().filter(|(i, _, _)| groups[*i].contains(w)).collect();
            if cands.len() < 2 {
                continue;
            }
            let pick =
                cands.iter().copied().fold(None::<&(usize, f64, f64)>, |best, c| match best {
                    Some(b) if b.1 >= c.1 => Some(b),
                    _ => Some(c),
                });
            let best = cands.iter().map(|c| c.2).fold(f64::NEG_INFINITY, f64::max);
            if let Some(p) = pick {
                if best > 0.0 {
                    total += p.2 / best;
                    n += 1;
                }
            }
        }
        if n == 0 {
            f64::NAN
        } else {
            total / n as f64
        }
    }
}

/// Cross-validates one setting over the given folds. With `hide_new_kernel`, a held-out job
/// whose workload the fold's model never trained on is predicted from its system profile only.
pub fn cross_validate(
    groups: &[&Group],
    params: SlowdownParams,
    folds: &[Vec<usize>],
    hide_new_kernel: bool,
) -> Result<CrossValidation, SelectorError> {
    let (mut sq, mut n) = (0.0, 0usize);
    let mut out_of_fold = Vec::new();
    let mut sums = Vec::new();
    for held in folds {
        let fit: Vec<&Group> = (0..groups.len())
            .filter(|i| held.binary_search(i).is_err())
            .map(|i| groups[i])
            .collect();
        let model = SlowdownModel::fit(&fit, params)?;
        for &i in held {
            let g = groups[i];
            let shown: Vec<Profile> =
                g.profiles
                    .iter()
                    .zip(&g.workloads)
                    .map(|(p, w)| {
                        if hide_new_kernel && !model.knows(Some(w)) {
                            p.system_only()
                        } else {
                            *p
                        }
                    })
                    .collect();
            let m: Vec<Member<'_>> = shown
                .iter()
                .zip(&g.workloads)
                .map(|(p, w)| Member { profile: p, workload: Some(w) })
                .collect();
            let s = model.slowdowns(&m);
            for (j, pred) in s.iter().enumerate() {
                let measured = g.throughputs[j] / g.profiles[j].exclusive_throughput();
                sq += (pred.ln() - measured.ln()).powi(2);
                n += 1;
            }
            let predicted_sum: f64 =
                s.iter().zip(&g.profiles).map(|(r, p)| r * p.exclusive_throughput()).sum();
            sums.push((i, predicted_sum, g.total_throughput()));
            out_of_fold.push(OutOfFold {
                predicted: s.iter().sum(),
                doubt: model.doubt(&m),
                measured: g.normalised_progress(),
            });
        }
    }
    if n == 0 {
        return Err(SelectorError::EmptyTrainingSet);
    }
    Ok(CrossValidation { params, log_mse: sq / n as f64, out_of_fold, sums })
}

/// The gain rule's result on out-of-fold predictions with doubt weight `kappa`: (groups formed,
/// of which harmful).
pub fn gate_outcome(oof: &[OutOfFold], kappa: f64) -> (usize, usize) {
    let formed: Vec<&OutOfFold> =
        oof.iter().filter(|o| o.predicted > 1.0 + kappa * o.doubt).collect();
    (formed.len(), formed.iter().filter(|o| o.measured < 1.0).count())
}

/// The smallest doubt weight whose out-of-fold harmful share is at most [`MAX_HARMFUL_SHARE`]
/// (the largest tried when none is).
pub fn choose_doubt_weight(oof: &[OutOfFold]) -> f64 {
    DOUBT_WEIGHTS
        .into_iter()
        .find(|&k| {
            let (formed, harmful) = gate_outcome(oof, k);
            formed == 0 || (harmful as f64) <= MAX_HARMFUL_SHARE * formed as f64
        })
        .unwrap_or(DOUBT_WEIGHTS[DOUBT_WEIGHTS.len() - 1])
}

/// What [`tune`] chose.
#[derive(Debug, Clone, PartialEq)]
pub struct Tuned {
    /// The setting with the lowest cross-validated error (ties: the earlier in the grid).
    pub params: SlowdownParams,
    /// Its cross-validated log-slowdown MSE.
    pub log_mse: f64,
    /// The doubt weight chosen on its out-of-fold predictions.
    pub doubt_weight: f64,
    /// The weight for groups with a new workload, chosen the same way on its predictions for
    /// each workload held out in turn, system profile only ([`Folds::WorkloadsSystemOnly`]).
    pub new_workload_weight: f64,
    /// Every setting tried, with its cross-validated error.
    pub tried: Vec<(SlowdownParams, f64)>,
}

/// The settings grid: every [`NEIGHBOURS`] × [`ALPHAS`] × [`WORKLOAD_SCALES`], in that order
/// (no neighbours first, so that a tie keeps the simpler), each with the robust fit.
pub fn grid() -> Vec<SlowdownParams> {
    let mut out = Vec::new();
    for neighbours in NEIGHBOURS {
        for alpha in ALPHAS {
            for workload_scale in WORKLOAD_SCALES {
                out.push(SlowdownParams { alpha, workload_scale, robust: true, neighbours });
            }
        }
    }
    out
}

/// Chooses among `candidates` by cross-validation on `groups`, then the doubt weight on the
/// winner's out-of-fold predictions. Groups of one job are ignored.
///
/// With [`Folds::Groups`] (workloads seen in training) the setting with the lowest
/// log-slowdown error wins; with a workload held out per fold, the one whose out-of-fold
/// predictions choose best ([`CrossValidation::choice_score`]): for a new workload the two
/// criteria disagree, and the choice is what counts (docs/models.md). Ties keep the earlier.
pub fn tune(
    groups: &[&Group],
    candidates: &[SlowdownParams],
    folds: Folds,
) -> Result<Tuned, SelectorError> {
    let groups: Vec<&Group> = groups.iter().copied().filter(|g| g.k() >= 2).collect();
    let held = folds.held_out(&groups);
    if held.is_empty() || candidates.is_empty() {
        return Err(SelectorError::Invalid(format!(
            "cross-validation needs at least two groups and one setting ({} groups, {} settings)",
            groups.len(),
            candidates.len()
        )));
    }
    let mut best: Option<CrossValidation> = None;
    let mut tried = Vec::new();
    // Seen workloads: the lowest error. New workloads: the best choices (see
    // [`CrossValidation::choice_score`]); their error and their choices disagree (docs/models.md).
    let by_choice = !matches!(folds, Folds::Groups { .. });
    let mut best_score = f64::NEG_INFINITY;
    for &p in candidates {
        let cv = cross_validate(&groups, p, &held, folds.hides_kernel_metrics())?;
        tried.push((p, cv.log_mse));
        if by_choice {
            let sc = cv.choice_score(&groups);
            if best.is_none() || sc > best_score {
                best_score = sc;
                best = Some(cv);
            }
            continue;
        }
        if best.as_ref().is_none_or(|b| cv.log_mse < b.log_mse) {
            best = Some(cv);
        }
    }
    let best = best.ok_or(SelectorError::EmptyTrainingSet)?;
    // A new workload arrives with a system profile; how doubtful that is, is measured by
    // holding out each workload in turn with its kernel metrics hidden.
    let new_workload_weight = if folds == Folds::WorkloadsSystemOnly {
        choose_doubt_weight(&best.out_of_fold)
    } else {
        let by_workload = Folds::WorkloadsSystemOnly.held_out(&groups);
        if by_workload.is_empty() {
            // One workload: nothing says how a new one fares, so the most cautious weight.
            DOUBT_WEIGHTS[DOUBT_WEIGHTS.len() - 1]
        } else {
            let cv = cross_validate(&groups, best.params, &by_workload, true)?;
            choose_doubt_weight(&cv.out_of_fold)
        }
    };
    Ok(Tuned {
        params: best.params,
        log_mse: best.log_mse,
        doubt_weight: choose_doubt_weight(&best.out_of_fold),
        new_workload_weight,
        tried,
    })
}

/// Tunes on `groups` and fits the chosen setting on all of them, doubt weight included.
pub fn fit_tuned(
    groups: &[&Group],
    candidates: &[SlowdownParams],
    folds: Folds,
) -> Result<(SlowdownModel, Tuned), SelectorError> {
    let tuned = tune(groups, candidates, folds)?;
    let mut model = SlowdownModel::fit(groups, tuned.params)?;
    model.doubt_weight = tuned.doubt_weight;
    model.new_workload_weight = tuned.new_workload_weight;
    Ok((model, tuned))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::features::{Feature, Profile};

    fn prof(excl: f64, sm: f64) -> Profile {
        crate::features::test_profile(excl, sm)
    }

    /// Pairs of 8 workloads whose slowdown grows with the partner's SM utilisation; the two
    /// heaviest together are slower than one after the other.
    fn pairs() -> Vec<Group> {
        let ws: Vec<(String, Profile)> = (0..8)
            .map(|i| (format!("w{i}"), prof(10.0 + i as f64, 10.0 + 12.0 * i as f64)))
            .collect();
        let mut out = Vec::new();
        for i in 0..8 {
            for j in (i + 1)..8 {
                let slow = |p: &Profile| 1.0 / (1.0 + (p.get(Feature::SmUtil) / 60.0).powi(2));
                let (a, b) = (&ws[i], &ws[j]);
                out.push(Group {
                    workloads: vec![a.0.clone(), b.0.clone()],
                    profiles: vec![a.1, b.1],
                    throughputs: vec![
                        a.1.exclusive_throughput() * slow(&b.1),
                        b.1.exclusive_throughput() * slow(&a.1),
                    ],
                });
            }
        }
        out
    }

    #[test]
    fn folds_partition_groups_or_hold_out_each_workload() {
        let g = pairs();
        let refs: Vec<&Group> = g.iter().collect();
        let f = Folds::default().held_out(&refs);
        assert_eq!(f.len(), GROUP_FOLDS);
        let mut all: Vec<usize> = f.concat();
        all.sort_unstable();
        assert_eq!(all, (0..g.len()).collect::<Vec<_>>());
        let w = Folds::Workloads.held_out(&refs);
        assert_eq!(w.len(), 8);
        assert!(w.iter().all(|f| f.len() == 7), "each workload is in 7 pairs");
    }

    #[test]
    fn tuning_picks_from_the_grid_and_a_doubt_weight_that_meets_the_harm_target() {
        let g = pairs();
        let refs: Vec<&Group> = g.iter().collect();
        let (model, t) = fit_tuned(&refs, &grid(), Folds::default()).unwrap();
        assert!(grid().contains(&t.params));
        assert_eq!(t.tried.len(), grid().len());
        assert!(t.tried.iter().all(|(_, e)| e.is_finite() && *e >= t.log_mse));
        assert_eq!(model.doubt_weight, t.doubt_weight);
        assert!(DOUBT_WEIGHTS.contains(&t.doubt_weight));
        // The new-workload weight is chosen on each workload held out in turn, its kernel
        // metrics hidden: the smallest that meets the target there, or the largest tried when
        // none does (this noise-free fixture's plain fit has almost no residual spread, so its
        // doubt is too small for any weight to refuse the one harmful pair it predicts at 1.03).
        assert_eq!(model.new_workload_weight, t.new_workload_weight);
        let by_workload = Folds::WorkloadsSystemOnly.held_out(&refs);
        let cv = cross_validate(&refs, t.params, &by_workload, true).unwrap();
        let meets = |k: f64| {
            let (formed, harmful) = gate_outcome(&cv.out_of_fold, k);
            formed == 0 || harmful as f64 <= MAX_HARMFUL_SHARE * formed as f64
        };
        let want = DOUBT_WEIGHTS.into_iter().find(|&k| meets(k)).unwrap_or(DOUBT_WEIGHTS[7]);
        assert_eq!(t.new_workload_weight, want);
        assert_eq!(t.new_workload_weight, choose_doubt_weight(&cv.out_of_fold));
        // The chosen weight is the smallest that meets the target on the out-of-fold groups.
        let cv = cross_validate(&refs, t.params, &Folds::default().held_out(&refs), false).unwrap();
        let (formed, harmful) = gate_outcome(&cv.out_of_fold, t.doubt_weight);
        assert!(formed == 0 || harmful as f64 <= MAX_HARMFUL_SHARE * formed as f64);
        assert!(tune(&refs[..1], &grid(), Folds::default()).is_err());
    }

    /// Hardening (issue 18): an outlier must not dominate training, whatever settings
    /// cross-validation picks. One job "ran" at `to_ratio` times its exclusive throughput: at
    /// the plausibility bound (4, the most `kace_sql` lets into training) and far beyond it
    /// (what a caller without the bound could pass).
    #[test]
    fn an_absurd_observation_cannot_steer_the_tuned_model() {
        let clean = pairs();
        let refs: Vec<&Group> = clean.iter().collect();
        let (clean_model, _) = fit_tuned(&refs, &grid(), Folds::default()).unwrap();
        let progress = |m: &SlowdownModel, g: &Group| {
            let members = g.members();
            m.normalised_progress(&members)
        };
        for to_ratio in [4.0, 1e6] {
            let mut dirty = pairs();
            let bad = dirty.iter().position(|g| g.workloads == ["w3", "w5"]).unwrap();
            dirty[bad].throughputs[0] = to_ratio * dirty[bad].profiles[0].exclusive_throughput();
            let refs: Vec<&Group> = dirty.iter().collect();
            let (m, t) = fit_tuned(&refs, &grid(), Folds::default()).unwrap();
            assert!(t.params.robust);
            let shift = clean
                .iter()
                .map(|g| {
                    (progress(&m, g) - progress(&clean_model, g)).abs() / progress(&clean_model, g)
                })
                .fold(0.0, f64::max);
            assert!(shift < 0.1, "ratio {to_ratio}: a prediction moved by {shift}");
            // The plain fit, offered the same data, is pulled further.
            let plain = SlowdownParams { robust: false, ..t.params };
            let p = SlowdownModel::fit(&refs, plain).unwrap();
            let plain_shift = clean
                .iter()
                .map(|g| {
                    (progress(&p, g) - progress(&clean_model, g)).abs() / progress(&clean_model, g)
                })
                .fold(0.0, f64::max);
            assert!(plain_shift > shift, "ratio {to_ratio}: plain {plain_shift}, robust {shift}");
        }
    }

    #[test]
    fn doubt_weight_rises_until_harmful_groups_are_refused() {
        let o = |predicted, doubt, measured| OutOfFold { predicted, doubt, measured };
        // A harmful group predicted at 1.2 with doubt 0.4 needs κ ≥ 0.5 to be refused.
        let oof = [o(1.2, 0.4, 0.9), o(1.5, 0.1, 1.4), o(1.3, 0.1, 1.2)];
        assert_eq!(gate_outcome(&oof, 0.0), (3, 1));
        assert_eq!(choose_doubt_weight(&oof), 0.5);
        assert_eq!(gate_outcome(&oof, 0.5), (2, 0));
    }
}
