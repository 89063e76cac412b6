//! The training record: what one training saw and decided, as the typed form of a stored
//! model's metrics. Built here from the library's [`Trained`] and the store's facts about the
//! data, stored and loaded by kace-sql, printed by the CLI; the rules that read it ("fitted on
//! the same data?", "what had the active model seen?") are its methods, so no caller looks keys
//! up in JSON.
//!
//! Its serialized form is the metrics object of `kace model show` and `kace train --format json`
//! (key for key what the CLI wrote before the record existed), so stored models need no
//! migration; a key missing from an older model's metrics reads as its default.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};

use super::{CorrectionSummary, Trained, TrainingPolicy, ACTIVATION_MARGIN};
use crate::model::ModelKind;
use crate::policy::Objective;
use crate::tuning::Tuned;

/// What the store knows of the data a training saw, beside the groups themselves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DataFacts {
    /// Observed groups skipped for a missing profile.
    pub skipped_groups: usize,
    /// Untrusted groups left out by the per-user cap.
    pub capped_groups: usize,
    /// Groups of the trusted reference.
    pub trusted_groups: usize,
    /// The newest observation's row id the training saw.
    pub observations_upto: i64,
    /// The version active when it trained.
    pub active_version: Option<i64>,
}

/// The settings a cross-validation chose.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct TunedRecord {
    /// Ridge strength.
    #[serde(deserialize_with = "f64_or_nan")]
    pub alpha: f64,
    /// Workload indicator scale.
    #[serde(deserialize_with = "f64_or_nan")]
    pub workload_scale: f64,
    /// Huber loss.
    pub robust: bool,
    /// The doubt weight chosen.
    #[serde(deserialize_with = "f64_or_nan")]
    pub doubt_weight: f64,
    /// The new-workload weight chosen.
    #[serde(deserialize_with = "f64_or_nan")]
    pub new_workload_weight: f64,
    /// Its cross-validated log-slowdown MSE.
    #[serde(deserialize_with = "f64_or_nan")]
    pub cv_log_mse: f64,
}

impl From<&Tuned> for TunedRecord {
    fn from(t: &Tuned) -> Self {
        TunedRecord {
            alpha: t.params.alpha,
            workload_scale: t.params.workload_scale,
            robust: t.params.robust,
            doubt_weight: t.doubt_weight,
            new_workload_weight: t.new_workload_weight,
            cv_log_mse: t.log_mse,
        }
    }
}

/// What the per-group corrections of a training found ([`super::repeats`]).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct CorrectionsRecord {
    /// Groups given a correction.
    pub corrected: usize,
    /// Merged groups not corroborated (weight zero).
    pub uncorroborated: usize,
    /// Repeat noise used (σ, log units).
    #[serde(deserialize_with = "f64_or_nan")]
    pub repeat_noise: f64,
    /// Spread of true group effects around the global model (τ, log units).
    #[serde(deserialize_with = "f64_or_nan")]
    pub between: f64,
}

impl From<&CorrectionSummary> for CorrectionsRecord {
    fn from(c: &CorrectionSummary) -> Self {
        CorrectionsRecord {
            corrected: c.corrected,
            uncorroborated: c.uncorroborated,
            repeat_noise: c.repeat_noise,
            between: c.between,
        }
    }
}

/// One training: its data, its settings, its held-out and reference errors, and why its model
/// was not activated (if it was not). Errors that are not finite are stored as null and read
/// back as NaN.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct TrainingRecord {
    /// Kind of model.
    pub kind: ModelKind,
    /// The objective it predicts.
    pub objective: Objective,
    /// Held-out fraction of the validation split.
    #[serde(deserialize_with = "f64_or_nan")]
    pub holdout_fraction: f64,
    /// Seed of the validation split.
    pub seed: u64,
    /// Groups the stored model was fitted on (all usable ones).
    pub fit_groups: usize,
    /// Groups the validation fit was fitted on.
    pub validation_fit_groups: usize,
    /// Groups held out.
    pub holdout_groups: usize,
    /// Observed groups skipped for a missing profile.
    pub skipped_groups: usize,
    /// Untrusted groups left out by the per-user cap.
    pub capped_groups: usize,
    /// Groups the model kind cannot learn from.
    pub unused_groups: usize,
    /// Usable groups by size (2 = pairs, …).
    pub group_sizes: BTreeMap<String, usize>,
    /// The validation fit's held-out MSE (NaN: not finite, or not recorded).
    #[serde(deserialize_with = "f64_or_nan", default = "nan")]
    pub holdout_mse: f64,
    /// Its R² (NaN likewise).
    #[serde(deserialize_with = "f64_or_nan", default = "nan")]
    pub holdout_r2: f64,
    /// The version active when it trained.
    pub active_version_at_training: Option<i64>,
    /// Held-out groups the active model had not seen.
    pub compared_groups: usize,
    /// The new validation fit's MSE on them.
    pub compared_mse: Option<f64>,
    /// The active model's MSE on them.
    pub active_compared_mse: Option<f64>,
    /// Groups of the trusted reference.
    pub trusted_groups: usize,
    /// The new model's MSE on the trusted reference.
    pub reference_mse: Option<f64>,
    /// The active model's MSE on it.
    pub active_reference_mse: Option<f64>,
    /// Held-out groups both models had seen.
    pub seen_compared_groups: Option<usize>,
    /// The new model's MSE on them.
    pub seen_compared_mse: Option<f64>,
    /// The active model's MSE on them.
    pub active_seen_compared_mse: Option<f64>,
    /// The activation rule's margin.
    #[serde(deserialize_with = "f64_or_nan")]
    pub activation_margin: f64,
    /// Why it was not activated (`None`: it was, or it was forced).
    pub refusal: Option<String>,
    /// The newest observation's row id it saw (`None` in models from before kace kept it).
    pub observations_upto: Option<i64>,
    /// The settings the search chose for the stored model.
    pub tuned: Option<TunedRecord>,
    /// The settings the search chose for the validation fit.
    pub validation_tuned: Option<TunedRecord>,
    /// Observations (rows) given to training (`None` in models from before kace kept it).
    pub observations: Option<usize>,
    /// Distinct groups they were merged into.
    pub distinct_groups: Option<usize>,
    /// Observations left out by the age window.
    pub aged_observations: Option<usize>,
    /// What the per-group corrections found (`None`: trained without them).
    pub corrections: Option<CorrectionsRecord>,
    /// Wall time of the training in seconds, as the caller measured it (the library has no
    /// clock); `None` when it was not measured.
    pub train_wall_s: Option<f64>,
}

impl TrainingRecord {
    /// The record of `t`, trained under `policy` on data the store describes as `facts`.
    pub fn new(t: &Trained, policy: &TrainingPolicy, facts: DataFacts) -> TrainingRecord {
        TrainingRecord {
            kind: policy.kind,
            objective: policy.objective,
            holdout_fraction: policy.holdout_fraction,
            seed: policy.seed,
            fit_groups: t.fit_groups,
            validation_fit_groups: t.validation_fit_groups,
            holdout_groups: t.holdout_groups,
            skipped_groups: facts.skipped_groups,
            capped_groups: facts.capped_groups,
            unused_groups: t.unused_groups,
            group_sizes: t.group_sizes.iter().map(|(k, n)| (k.to_string(), *n)).collect(),
            holdout_mse: t.quality.mse,
            holdout_r2: t.quality.r2,
            active_version_at_training: facts.active_version,
            compared_groups: t.compared_groups,
            compared_mse: t.compared_quality.map(|q| q.mse),
            active_compared_mse: t.active_quality.map(|q| q.mse),
            trusted_groups: facts.trusted_groups,
            reference_mse: t.reference.map(|c| c.new.mse),
            active_reference_mse: t.reference.map(|c| c.active.mse),
            seen_compared_groups: t.seen_comparison.map(|c| c.groups),
            seen_compared_mse: t.seen_comparison.map(|c| c.new.mse),
            active_seen_compared_mse: t.seen_comparison.map(|c| c.active.mse),
            activation_margin: ACTIVATION_MARGIN,
            refusal: t.refusal.map(|r| r.to_string()),
            observations_upto: Some(facts.observations_upto),
            tuned: t.tuned.as_ref().map(TunedRecord::from),
            validation_tuned: t.validation_tuned.as_ref().map(TunedRecord::from),
            observations: Some(t.observations),
            distinct_groups: Some(t.distinct_groups),
            aged_observations: Some(t.aged_observations),
            corrections: t.corrections.as_ref().map(CorrectionsRecord::from),
            train_wall_s: None,
        }
    }

    /// Whether a training under `policy` would repeat this one: the same kind, objective and
    /// validation split. (The data are compared by the store's digest beside it.)
    pub fn same_training(&self, policy: &TrainingPolicy) -> bool {
        self.kind == policy.kind
            && self.objective == policy.objective
            && self.seed == policy.seed
            && self.holdout_fraction == policy.holdout_fraction
    }
}

fn nan() -> f64 {
    f64::NAN
}

/// A number that may have been stored as null (serde_json writes NaN and ±∞ so).
fn f64_or_nan<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_with_a_nan_error_and_reads_an_older_models_metrics() {
        let r = TrainingRecord {
            kind: ModelKind::Linear,
            objective: Objective::NormalisedProgress,
            holdout_fraction: 0.2,
            seed: 7,
            holdout_r2: f64::NAN,
            observations_upto: Some(41),
            tuned: Some(TunedRecord { alpha: 0.1, ..TunedRecord::default() }),
            observations: Some(1_000_000),
            distinct_groups: Some(181),
            corrections: Some(CorrectionsRecord {
                corrected: 90,
                between: 0.09,
                ..Default::default()
            }),
            train_wall_s: Some(1.5),
            ..TrainingRecord::default()
        };
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["kind"], "linear");
        assert_eq!(v["objective"], "normalised-progress");
        assert!(v["holdout_r2"].is_null(), "{v}");
        let back: TrainingRecord = serde_json::from_value(v).unwrap();
        assert!(back.holdout_r2.is_nan());
        assert_eq!(
            (back.kind, back.seed, back.observations_upto),
            (ModelKind::Linear, 7, Some(41))
        );
        assert_eq!(back.tuned.map(|t| t.alpha), Some(0.1));
        assert_eq!(
            (back.observations, back.distinct_groups, back.train_wall_s),
            (Some(1_000_000), Some(181), Some(1.5))
        );
        assert_eq!(back.corrections.map(|c| (c.corrected, c.between)), Some((90, 0.09)));
        // A model stored before the objective and the upto mark were kept.
        let old: TrainingRecord = serde_json::from_value(serde_json::json!({
            "kind": "slowdown", "seed": 3, "holdout_fraction": 0.15, "holdout_mse": 0.5
        }))
        .unwrap();
        assert_eq!(old.observations_upto, None);
        assert_eq!((old.observations, old.corrections, old.train_wall_s), (None, None, None));
        assert_eq!(old.objective, Objective::default());
        assert_eq!(old.holdout_mse, 0.5);
        assert!(old.holdout_r2.is_nan(), "not recorded is NaN, not 0");
    }

    #[test]
    fn the_same_training_is_the_same_kind_objective_and_split() {
        let policy = TrainingPolicy::new(ModelKind::Slowdown, Objective::ThroughputSum);
        let r = TrainingRecord {
            kind: policy.kind,
            objective: policy.objective,
            holdout_fraction: policy.holdout_fraction,
            seed: policy.seed,
            ..TrainingRecord::default()
        };
        assert!(r.same_training(&policy));
        assert!(!TrainingRecord { seed: policy.seed + 1, ..r.clone() }.same_training(&policy));
        assert!(!TrainingRecord { kind: ModelKind::Linear, ..r.clone() }.same_training(&policy));
        let other = TrainingRecord { objective: Objective::NormalisedProgress, ..r };
        assert!(!other.same_training(&policy));
    }
}
