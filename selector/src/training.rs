//! kace's training policy, in one place: split the observed groups into a fit set and a
//! held-out set, choose the slowdown model's settings by cross-validation on the fit set only
//! ([`crate::tuning`], the same search the nested evaluation measures), fit, validate on the
//! held-out groups against the active model, and decide whether the new model may be activated.
//!
//! Pure: the caller reads the groups and the active model from its store, and stores what this
//! returns. `kace train` and `kace retrain` are that caller.

use std::collections::BTreeMap;
use std::fmt;

use crate::dataset::Group;
use crate::error::SelectorError;
use crate::eval::FitQuality;
use crate::model::{Model, ModelKind};
use crate::numpy_rng::permutation;
use crate::policy::Objective;
use crate::selection::Predictor;
use crate::tuning::{self, Folds, Tuned};

/// Fewest fit groups accepted: the linear model has ten coefficients plus an intercept.
pub const MIN_FIT_GROUPS: usize = 12;

/// Fraction of observed groups held out to validate a new model, unless configured otherwise
/// (`training.holdout_fraction` in kace.conf defaults to it).
pub const DEFAULT_HOLDOUT_FRACTION: f64 = 0.2;
/// Seed of the held-out split, unless configured otherwise (`training.seed`).
pub const DEFAULT_SEED: u64 = 30;

/// How a model is trained and validated.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrainingPolicy {
    /// Kind of model.
    pub kind: ModelKind,
    /// What the model must predict well (the held-out error is measured in it).
    pub objective: Objective,
    /// Fraction of groups held out for validation, in (0, 1).
    pub holdout_fraction: f64,
    /// Seed of the held-out split.
    pub seed: u64,
    /// Activate the new model whatever its held-out error.
    pub force_activation: bool,
}

impl TrainingPolicy {
    /// `kind` for `objective`, with the default held-out split and no forced activation: what
    /// `kace train` does with an unconfigured `[training]` (the simulator trains this way).
    pub fn new(kind: ModelKind, objective: Objective) -> TrainingPolicy {
        TrainingPolicy {
            kind,
            objective,
            holdout_fraction: DEFAULT_HOLDOUT_FRACTION,
            seed: DEFAULT_SEED,
            force_activation: false,
        }
    }
}

/// Why no model was trained.
#[derive(Debug, Clone, PartialEq)]
pub enum TrainingError {
    /// `holdout_fraction` is not in (0, 1).
    BadHoldoutFraction(f64),
    /// Too few usable groups to fit a model and hold some out (a young installation).
    NotEnoughGroups {
        /// Groups the model kind can learn from.
        usable: usize,
        /// Usable groups needed: [`MIN_FIT_GROUPS`] to fit plus one to hold out.
        needed: usize,
    },
    /// The fit itself failed.
    Fit(SelectorError),
}

impl fmt::Display for TrainingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TrainingError::BadHoldoutFraction(v) => {
                write!(f, "holdout fraction {v}: must be in (0, 1)")
            }
            TrainingError::NotEnoughGroups { usable, needed } => write!(
                f,
                "couldn't fit a model: {usable} usable observed group(s); need at least {needed} \
                 to fit and one to hold out"
            ),
            TrainingError::Fit(e) => write!(f, "couldn't fit a model: {e}"),
        }
    }
}

impl std::error::Error for TrainingError {}

impl From<SelectorError> for TrainingError {
    fn from(e: SelectorError) -> Self {
        TrainingError::Fit(e)
    }
}

/// What one training did, for the caller to store.
#[derive(Debug, Clone, PartialEq)]
pub struct Trained {
    /// The new model.
    pub model: Model,
    /// Groups it was fitted on.
    pub fit_groups: usize,
    /// Their indices in the groups given to [`train`], ascending.
    pub fit_indices: Vec<usize>,
    /// Groups held out to validate it.
    pub holdout_groups: usize,
    /// Groups the kind does not learn from (another size; for the linear model, a member
    /// without kernel metrics), not used.
    pub unused_groups: usize,
    /// Group size → usable groups of that size.
    pub group_sizes: BTreeMap<usize, usize>,
    /// Its error on the held-out groups, in the objective's units.
    pub quality: FitQuality,
    /// The active model's error on the same held-out groups (`None`: there is none, or it
    /// cannot predict the objective).
    pub active_quality: Option<FitQuality>,
    /// The settings cross-validation chose (slowdown models only).
    pub tuned: Option<Tuned>,
    /// Whether the new model may be activated.
    pub activate: bool,
}

/// Splits `n` examples into (fit, held-out) index lists: a seeded permutation, the first
/// `ceil(fraction · n)` held out (at least one when n ≥ 2, never all).
pub fn holdout_split(n: usize, fraction: f64, seed: u64) -> (Vec<usize>, Vec<usize>) {
    let perm = permutation((seed & 0xffff_ffff) as u32, n);
    let mut k = (fraction * n as f64).ceil() as usize;
    if n >= 2 {
        k = k.clamp(1, n - 1);
    } else {
        k = 0;
    }
    let (held, fit) = perm.split_at(k);
    let (mut held, mut fit) = (held.to_vec(), fit.to_vec());
    held.sort_unstable();
    fit.sort_unstable();
    (fit, held)
}

/// Whether a new model with held-out error `new_mse` may replace the active one (`None`: there
/// is none). Ties go to the new model: it was trained on the newer data. A non-finite error on
/// the new model never activates it; on the active one, it counts as beaten.
pub fn not_worse(new_mse: f64, active_mse: Option<f64>) -> bool {
    new_mse.is_finite() && active_mse.is_none_or(|a| !a.is_finite() || new_mse <= a)
}

/// Predictions of `model` for measured groups, in the objective's units.
pub fn predictions(model: &dyn Predictor, groups: &[&Group], objective: Objective) -> Vec<f64> {
    groups
        .iter()
        .map(|g| {
            let members = g.members();
            model.predict(&members, objective)
        })
        .collect()
}

/// Trains a model on `groups` under `policy`, and validates it against `active` (the model in
/// service, if any).
pub fn train(
    groups: &[Group],
    active: Option<&Model>,
    policy: &TrainingPolicy,
) -> Result<Trained, TrainingError> {
    let fraction = policy.holdout_fraction;
    if !(fraction > 0.0 && fraction < 1.0) {
        return Err(TrainingError::BadHoldoutFraction(fraction));
    }
    let usable_at: Vec<usize> =
        (0..groups.len()).filter(|&i| policy.kind.learns_from_group(&groups[i])).collect();
    let usable: Vec<&Group> = usable_at.iter().map(|&i| &groups[i]).collect();
    let (fit_idx, held_idx) = holdout_split(usable.len(), fraction, policy.seed);
    if fit_idx.len() < MIN_FIT_GROUPS || held_idx.is_empty() {
        return Err(TrainingError::NotEnoughGroups {
            usable: usable.len(),
            needed: MIN_FIT_GROUPS + 1,
        });
    }
    let fit: Vec<&Group> = fit_idx.iter().map(|&i| usable[i]).collect();
    let held: Vec<&Group> = held_idx.iter().map(|&i| usable[i]).collect();
    let mut group_sizes = BTreeMap::new();
    for g in &usable {
        *group_sizes.entry(g.k()).or_insert(0usize) += 1;
    }
    let (model, tuned) = match policy.kind {
        ModelKind::Slowdown => {
            let (m, t) = tuning::fit_tuned(&fit, &tuning::grid(), Folds::default())?;
            (Model::Slowdown(m), Some(t))
        }
        kind => (Model::train(kind, &fit, policy.objective, Default::default())?, None),
    };
    let held_y: Vec<f64> = held.iter().map(|g| policy.objective.value(g)).collect();
    let quality =
        |m: &dyn Predictor| FitQuality::of(&held_y, &predictions(m, &held, policy.objective));
    let new_q = quality(&model);
    // An active model that cannot predict this objective is no competitor.
    let active_quality = active.filter(|m| m.serves(policy.objective)).map(|m| quality(m));
    // Not even a forced activation makes a model with a non-finite held-out error the one every
    // prolog uses.
    let activate = new_q.mse.is_finite()
        && (policy.force_activation || not_worse(new_q.mse, active_quality.map(|q| q.mse)));
    Ok(Trained {
        model,
        fit_groups: fit.len(),
        fit_indices: fit_idx.iter().map(|&i| usable_at[i]).collect(),
        holdout_groups: held.len(),
        unused_groups: groups.len() - usable.len(),
        group_sizes,
        quality: new_q,
        active_quality,
        tuned,
        activate,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::features::{Feature, Profile, FEATURE_COUNT};

    fn groups(n: usize) -> Vec<Group> {
        let prof = |i: usize| {
            let mut f = [1.0 + i as f64; FEATURE_COUNT];
            f[Feature::ExclusiveThroughput.index()] = 10.0 + i as f64;
            f[Feature::SmUtil.index()] = 5.0 + 9.0 * i as f64;
            Profile::new(f)
        };
        let mut out = Vec::new();
        'outer: for i in 0..10 {
            for j in (i + 1)..10 {
                if out.len() == n {
                    break 'outer;
                }
                let (a, b) = (prof(i), prof(j));
                let slow = |p: &Profile| 1.0 / (1.0 + p.get(Feature::SmUtil) / 100.0);
                out.push(Group {
                    workloads: vec![format!("w{i}"), format!("w{j}")],
                    throughputs: vec![
                        a.exclusive_throughput() * slow(&b),
                        b.exclusive_throughput() * slow(&a),
                    ],
                    profiles: vec![a, b],
                });
            }
        }
        out
    }

    fn policy(kind: ModelKind) -> TrainingPolicy {
        TrainingPolicy::new(kind, Objective::ThroughputSum)
    }

    #[test]
    fn split_is_deterministic_and_disjoint() {
        let (fit, held) = holdout_split(10, 0.2, 30);
        assert_eq!(held.len(), 2);
        assert_eq!(fit.len(), 8);
        assert_eq!(holdout_split(10, 0.2, 30), (fit.clone(), held.clone()));
        let mut all: Vec<usize> = fit.iter().chain(&held).copied().collect();
        all.sort_unstable();
        assert_eq!(all, (0..10).collect::<Vec<_>>());
        assert_eq!(holdout_split(1, 0.5, 1), (vec![0], vec![]));
        assert_eq!(holdout_split(2, 0.01, 1).1.len(), 1);
    }

    #[test]
    fn activation_rule() {
        assert!(not_worse(1.0, None));
        assert!(not_worse(1.0, Some(1.0)));
        assert!(not_worse(0.5, Some(1.0)));
        assert!(!not_worse(1.5, Some(1.0)));
        assert!(!not_worse(f64::NAN, None));
        assert!(!not_worse(f64::INFINITY, None));
        assert!(not_worse(1.0, Some(f64::NAN)));
        assert!(not_worse(1.0, Some(f64::INFINITY)));
        // The audit's poisoned retrain: inf <= inf activated a model with held-out MSE inf.
        assert!(!not_worse(f64::INFINITY, Some(f64::INFINITY)));
        assert!(not_worse(1e300, Some(f64::INFINITY)));
    }

    #[test]
    fn trains_tunes_validates_and_decides() {
        let g = groups(40);
        let t = train(&g, None, &policy(ModelKind::Slowdown)).unwrap();
        assert_eq!((t.fit_groups, t.holdout_groups), (32, 8));
        let (fit, _) = holdout_split(40, DEFAULT_HOLDOUT_FRACTION, DEFAULT_SEED);
        assert_eq!(t.fit_indices, fit);
        assert!(t.activate && t.active_quality.is_none());
        assert!(t.quality.mse.is_finite());
        let tuned = t.tuned.as_ref().unwrap();
        let Model::Slowdown(m) = &t.model else { panic!("a slowdown model") };
        assert_eq!(m.params, tuned.params);
        assert_eq!(m.doubt_weight, tuned.doubt_weight);
        // Against itself it ties, and ties activate.
        let again = train(&g, Some(&t.model), &policy(ModelKind::Slowdown)).unwrap();
        assert!(again.activate);
        assert_eq!(again.active_quality.unwrap().mse, again.quality.mse);
        // A far-off active model is beaten.
        let mut off = t.model.clone();
        if let Model::Slowdown(m) = &mut off {
            m.intercept += 5.0;
        }
        let beaten = train(&g, Some(&off), &policy(ModelKind::Slowdown)).unwrap();
        assert!(beaten.activate && beaten.active_quality.unwrap().mse > beaten.quality.mse);
        let l = train(&g, Some(&t.model), &policy(ModelKind::Linear)).unwrap();
        assert!(l.tuned.is_none());
        let forced = TrainingPolicy { force_activation: true, ..policy(ModelKind::Linear) };
        assert!(train(&g, Some(&t.model), &forced).unwrap().activate);
    }

    #[test]
    fn system_only_groups_train_the_slowdown_model_not_the_linear_one() {
        let mut g = groups(40);
        // w9 was only ever sampled by NVML: no kernel metrics.
        for grp in &mut g {
            for (w, p) in grp.workloads.iter().zip(grp.profiles.iter_mut()) {
                if w == "w9" {
                    *p = p.system_only();
                }
            }
        }
        let with_w9 = g.iter().filter(|x| x.contains("w9")).count();
        assert!(with_w9 > 0);
        let s = train(&g, None, &policy(ModelKind::Slowdown)).unwrap();
        assert_eq!((s.unused_groups, s.fit_groups + s.holdout_groups), (0, 40));
        assert!(s.quality.mse.is_finite());
        let l = train(&g, None, &policy(ModelKind::Linear)).unwrap();
        assert_eq!(l.unused_groups, with_w9);
        // It names the groups it fitted on in the caller's numbering, none of them w9's.
        assert_eq!(l.fit_indices.len(), l.fit_groups);
        assert!(l.fit_indices.iter().all(|&i| !g[i].contains("w9")));
        assert!(l.fit_indices.windows(2).all(|w| w[0] < w[1]));
        assert!(l.quality.mse.is_finite());
    }

    #[test]
    fn too_little_data_and_bad_fractions_are_errors() {
        let g = groups(12);
        assert_eq!(
            train(&g, None, &policy(ModelKind::Slowdown)),
            Err(TrainingError::NotEnoughGroups { usable: 12, needed: 13 })
        );
        let bad = TrainingPolicy { holdout_fraction: 1.0, ..policy(ModelKind::Slowdown) };
        assert_eq!(train(&g, None, &bad), Err(TrainingError::BadHoldoutFraction(1.0)));
    }
}
