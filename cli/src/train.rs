//! `kace train`: glue between the store and the library's training policy
//! ([`kace_selector::training`]): read the observed groups and the active model, train and
//! validate, store the new version and activate it when the policy says so (or when asked).

use anyhow::Result;
use clap::Args;
use kace_selector::eval::FitQuality;
use kace_selector::training::{self, TrainingError, TrainingPolicy};
use kace_selector::ModelKind;
use kace_sql::decide::{active_model, model_to_new_model, training_set};
use kace_sql::Db;
use kace_sql::Error as SqlError;
use serde_json::json;

use crate::context::{num, print_json, Ctx};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum KindArg {
    /// kace's per-job slowdown model.
    Slowdown,
    /// The paper's linear regression.
    Linear,
}

/// `kace train`
#[derive(Debug, Args)]
pub struct TrainArgs {
    /// Activate the new version even if it is worse than the active one (never one whose error
    /// is not finite or whose predictions are out of range).
    #[arg(long)]
    activate: bool,
    /// Fraction of groups held out (default: the config's `training.holdout_fraction`).
    #[arg(long)]
    holdout_fraction: Option<f64>,
    /// Seed of the held-out split (default: the config's `training.seed`).
    #[arg(long)]
    seed: Option<u64>,
    /// Kind of model (default: the config's `training.model`).
    #[arg(long, value_enum)]
    kind: Option<KindArg>,
}

/// The training data have not changed since model `version` of the same kind was fitted on
/// them: no new version is stored (the nightly retrain would otherwise add one a night).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnchangedData {
    /// The stored version fitted on the same data.
    pub version: i64,
}

impl std::fmt::Display for UnchangedData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the training data are unchanged since model version {}", self.version)
    }
}

impl std::error::Error for UnchangedData {}

/// Too few usable observed groups to fit a model and hold some out. `kace train` reports it as
/// an error; the nightly `kace retrain` reports it as "model unchanged" and succeeds, because a
/// young installation simply has not observed enough colocations yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotEnoughGroups {
    /// Observed groups the model kind can learn from whose workloads all have profiles.
    pub usable: usize,
    /// Observed groups skipped for a missing profile.
    pub skipped: usize,
    /// Usable groups needed: [`training::MIN_FIT_GROUPS`] to fit plus one to hold out.
    pub needed: usize,
}

impl std::fmt::Display for NotEnoughGroups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "couldn't fit a model: {} usable observed group(s) ({} skipped for missing \
             profiles); need at least {} to fit and one to hold out",
            self.usable, self.skipped, self.needed
        )
    }
}

impl std::error::Error for NotEnoughGroups {}

/// What one `kace train` did: the library's training result, and where it was stored.
#[derive(Debug, Clone)]
pub struct Trained {
    /// The stored model version.
    pub version: i64,
    /// Whether it is now the active version.
    pub activated: bool,
    /// Its kind.
    pub kind: ModelKind,
    /// Groups it was fitted on: every usable group (the refit).
    pub fit_groups: usize,
    /// Groups the validation fit was fitted on.
    pub validation_fit_groups: usize,
    /// Groups held out to validate the procedure.
    pub holdout_groups: usize,
    /// The validation fit's error on the held-out groups.
    pub quality: FitQuality,
    /// The version that was active before and how the two compared (`None`: there was none,
    /// or it could not compete).
    pub previous: Option<Comparison>,
    /// The metrics stored with the model.
    pub metrics: serde_json::Value,
    /// Why it was not activated (`None`: it was).
    pub refusal: Option<training::Refusal>,
}

/// How a new model compared with the one active before it, on the held-out groups that one
/// had not been fitted on (the only ones that say anything about it: it was refitted on every
/// group it saw).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Comparison {
    /// The version active before.
    pub version: i64,
    /// Held-out groups it had not seen (0: nothing to compare; the new one is activated).
    pub groups: usize,
    /// The new model's validation fit on them.
    pub new: Option<FitQuality>,
    /// The active model on them.
    pub active: Option<FitQuality>,
    /// The new (stored) model against it on the trusted reference (`None`: no trusted group).
    pub reference: Option<training::Comparison>,
    /// The new (stored) model against it on the held-out groups both have seen.
    pub seen: Option<training::Comparison>,
}

impl Comparison {
    /// In words, for `kace train` and `kace retrain`.
    pub fn describe(&self) -> String {
        let reference = match self.reference {
            Some(c) => format!(
                "on the {} trusted group(s): MSE {} (new) vs {} (active)",
                c.groups,
                num(c.new.mse),
                num(c.active.mse)
            ),
            None => "no trusted reference (kace observations import, or trust)".to_string(),
        };
        let seen = self.seen.map(|c| {
            format!(
                "; on the {} held-out group(s) both have seen: MSE {} (new) vs {} (active)",
                c.groups,
                num(c.new.mse),
                num(c.active.mse)
            )
        });
        format!("{reference}{}; {}", seen.unwrap_or_default(), self.describe_unseen())
    }

    fn describe_unseen(&self) -> String {
        match (self.new, self.active) {
            (Some(n), Some(a)) => format!(
                "on the {} held-out group(s) active version {} had not seen: MSE {} (new) vs {} \
                 (active)",
                self.groups,
                self.version,
                num(n.mse),
                num(a.mse)
            ),
            _ => format!(
                "active version {} had seen every held-out group: nothing to compare",
                self.version
            ),
        }
    }
}

/// Reads the observed groups and the active model, runs the library's training policy
/// ([`kace_selector::training::train`]), stores the new version and activates it when the policy
/// says so. Too little data is a [`TrainingError::NotEnoughGroups`] error.
pub fn train(args: &TrainArgs, ctx: &Ctx, db: &mut Db) -> Result<Trained> {
    let policy = TrainingPolicy {
        kind: match args.kind {
            Some(KindArg::Slowdown) => ModelKind::Slowdown,
            Some(KindArg::Linear) => ModelKind::Linear,
            None => ctx.config.training.model,
        },
        objective: ctx.config.selection.objective,
        holdout_fraction: args.holdout_fraction.unwrap_or(ctx.config.training.holdout_fraction),
        seed: args.seed.unwrap_or(ctx.config.training.seed),
        force_activation: args.activate,
    };
    let set = training_set(db)?;
    let digest = set.digest();
    let same = db.models()?.into_iter().rev().find(|m| {
        let metric = |k: &str| m.model.metrics.get(k);
        m.model.training_digest == digest
            && metric("kind").and_then(|v| v.as_str()) == Some(policy.kind.key())
            && metric("objective").and_then(|v| v.as_str()) == Some(policy.objective.key())
            && metric("seed").and_then(|v| v.as_u64()) == Some(policy.seed)
            && metric("holdout_fraction").and_then(|v| v.as_f64()) == Some(policy.holdout_fraction)
    });
    if let Some(m) = same {
        if !args.activate {
            return Err(UnchangedData { version: m.version }.into());
        }
    }
    let active = match active_model(db) {
        Ok((v, m)) if m.serves(policy.objective) => Some((v, m)),
        Ok((v, _)) => {
            ctx.info(&format!("train: active model {v} does not serve {}", policy.objective.key()));
            None
        }
        Err(SqlError::NoActiveModel) => None,
        // An active model this build cannot read is "worse than anything".
        Err(SqlError::BadModel { version, reason }) => {
            ctx.info(&format!("train: active model {version} unusable ({reason})"));
            None
        }
        Err(e) => return Err(e.into()),
    };
    // What the active model was fitted on: its groups' observations, up to the row id it
    // stored (models from before kace recorded it: not known).
    let upto = match &active {
        Some((v, _)) => {
            db.model(*v)?.model.metrics.get("observations_upto").and_then(|u| u.as_i64())
        }
        None => None,
    };
    let seen = upto.map(|u| set.seen_upto(u));
    // The admin's imports and what the admin marked: the reference a new model may not get
    // worse on (the library's activation rule).
    let trusted = set.trusted();
    let reference = trusted.iter().any(|&t| t).then_some(trusted.as_slice());
    let competitor = active.as_ref().map(|(_, m)| training::Active {
        model: m,
        seen: seen.as_deref(),
        trusted: reference,
    });
    let t = match training::train(&set.groups, competitor, &policy) {
        Err(TrainingError::NotEnoughGroups { usable, needed }) => {
            return Err(NotEnoughGroups { usable, skipped: set.skipped, needed }.into())
        }
        other => other?,
    };
    let previous = active.as_ref().map(|a| Comparison {
        version: a.0,
        groups: t.compared_groups,
        new: t.compared_quality,
        active: t.active_quality,
        reference: t.reference,
        seen: t.seen_comparison,
    });
    let sizes: std::collections::BTreeMap<String, usize> =
        t.group_sizes.iter().map(|(k, n)| (k.to_string(), *n)).collect();
    let metrics = json!({
        "fit_groups": t.fit_groups,
        "validation_fit_groups": t.validation_fit_groups,
        "holdout_groups": t.holdout_groups,
        "skipped_groups": set.skipped,
        "capped_groups": set.capped,
        "unused_groups": t.unused_groups,
        "group_sizes": sizes,
        "holdout_fraction": policy.holdout_fraction,
        "seed": policy.seed,
        "holdout_mse": t.quality.mse,
        "holdout_r2": t.quality.r2,
        "active_version_at_training": previous.map(|p| p.version),
        "compared_groups": t.compared_groups,
        "compared_mse": t.compared_quality.map(|q| q.mse),
        "active_compared_mse": t.active_quality.map(|q| q.mse),
        "trusted_groups": trusted.iter().filter(|&&t| t).count(),
        "reference_mse": t.reference.map(|c| c.new.mse),
        "active_reference_mse": t.reference.map(|c| c.active.mse),
        "seen_compared_groups": t.seen_comparison.map(|c| c.groups),
        "seen_compared_mse": t.seen_comparison.map(|c| c.new.mse),
        "active_seen_compared_mse": t.seen_comparison.map(|c| c.active.mse),
        "activation_margin": training::ACTIVATION_MARGIN,
        "refusal": t.refusal.map(|r| r.to_string()),
        "observations_upto": set.newest_observation(),
        "kind": policy.kind.key(),
        "objective": policy.objective.key(),
        "tuned": t.tuned.as_ref().map(tuned_json),
        "validation_tuned": t.validation_tuned.as_ref().map(tuned_json),
    });
    let version =
        db.insert_model(&model_to_new_model(&t.model, metrics.clone(), digest, t.fit_groups)?)?;
    if t.activate {
        db.activate_model(version)?;
    }
    Ok(Trained {
        version,
        activated: t.activate,
        kind: policy.kind,
        fit_groups: t.fit_groups,
        validation_fit_groups: t.validation_fit_groups,
        holdout_groups: t.holdout_groups,
        quality: t.quality,
        previous,
        metrics,
        refusal: t.refusal,
    })
}

/// The settings a cross-validation chose, as stored in a model's metrics.
fn tuned_json(tu: &kace_selector::tuning::Tuned) -> serde_json::Value {
    json!({
        "alpha": tu.params.alpha,
        "workload_scale": tu.params.workload_scale,
        "robust": tu.params.robust,
        "doubt_weight": tu.doubt_weight,
        "new_workload_weight": tu.new_workload_weight,
        "cv_log_mse": tu.log_mse,
    })
}

/// Runs `kace train`.
pub fn run(args: TrainArgs, ctx: &Ctx) -> Result<()> {
    let mut db = ctx.open()?;
    let t = match train(&args, ctx, &mut db) {
        Ok(t) => t,
        Err(e) => match e.downcast_ref::<UnchangedData>() {
            Some(u) if ctx.json() => {
                return print_json(&json!({ "version": null, "unchanged_since": u.version }))
            }
            Some(u) => {
                println!("model unchanged: {u} (nothing stored)");
                return Ok(());
            }
            None => return Err(e),
        },
    };
    if ctx.json() {
        print_json(&json!({ "version": t.version, "activated": t.activated, "metrics": t.metrics }))
    } else {
        println!(
            "model version {} ({}): fitted on all {} groups; held-out MSE {} (R² {}) on {} \
             groups for the same search fitted on the other {}",
            t.version,
            t.kind.key(),
            t.fit_groups,
            num(t.quality.mse),
            num(t.quality.r2),
            t.holdout_groups,
            t.validation_fit_groups
        );
        if let Some(c) = t.previous {
            println!("{}", c.describe());
        }
        match (t.refusal, args.activate) {
            (None, true) => println!("activated (--activate)"),
            (None, false) => println!("activated (not worse than the active model)"),
            (Some(r), _) if !r.overridable() => {
                println!("not activated: {r} (--activate cannot override this)")
            }
            (Some(r), _) => println!("not activated: {r} (use --activate to force)"),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use kace_selector::training::{DEFAULT_HOLDOUT_FRACTION, DEFAULT_SEED};

    /// The simulator trains with the library's defaults (`TrainingPolicy::new`) to measure
    /// what `kace train` deploys; that holds only while an unconfigured `[training]` is them.
    #[test]
    fn unconfigured_training_is_the_librarys_default() {
        let t = kace_config::Training::default();
        assert_eq!((t.holdout_fraction, t.seed), (DEFAULT_HOLDOUT_FRACTION, DEFAULT_SEED));
    }
}
