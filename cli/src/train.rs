//! `kace train`: fit the model on observed groups (pairs, and for the slowdown model groups of
//! any size), compare it with the active model on held-out groups, store it as a new version
//! and activate it when it is not worse (or when asked).

use anyhow::{bail, Result};
use clap::Args;
use kace_selector::dataset::Group;
use kace_selector::eval::FitQuality;
use kace_selector::{Member, Model, ModelKind, Predictor, SlowdownParams};
use kace_sql::decide::{active_model, holdout_split, model_to_new_model, training_set};
use kace_sql::Db;
use kace_sql::Error as SqlError;
use serde_json::json;

use crate::context::{num, print_json, Ctx};

/// Fewest fit groups accepted: the linear model has ten coefficients plus an intercept.
const MIN_FIT_GROUPS: usize = 12;

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
    /// Activate the new version whatever its held-out error.
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

/// Predictions of `model` for measured groups, in the objective's units.
fn predictions(model: &Model, groups: &[&Group], objective: kace_selector::Objective) -> Vec<f64> {
    groups
        .iter()
        .map(|g| {
            let members: Vec<Member<'_>> = g
                .profiles
                .iter()
                .zip(&g.workloads)
                .map(|(p, w)| Member { profile: p, workload: Some(w) })
                .collect();
            model.predict(&members, objective)
        })
        .collect()
}

/// Whether a new model with held-out error `new_mse` may replace the active one (`None`: there
/// is none). Ties go to the new model: it was trained on the newer data. A non-finite error
/// (NaN or inf) on the new model counts as worse, whatever the active one's (`inf <= inf` must
/// not pass); on the active one, as beaten by any finite error.
fn not_worse(new_mse: f64, active_mse: Option<f64>) -> bool {
    new_mse.is_finite() && active_mse.is_none_or(|a| !a.is_finite() || new_mse <= a)
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
    /// Usable groups needed: [`MIN_FIT_GROUPS`] to fit plus one to hold out.
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

/// What one training run did.
#[derive(Debug, Clone)]
pub struct Trained {
    /// The stored model version.
    pub version: i64,
    /// Whether it is now the active version.
    pub activated: bool,
    /// Its kind.
    pub kind: ModelKind,
    /// Groups it was fitted on.
    pub fit_groups: usize,
    /// Groups held out to validate it.
    pub holdout_groups: usize,
    /// Its error on the held-out groups.
    pub quality: FitQuality,
    /// The version that was active before, with its error on the same held-out groups (`None`:
    /// there was none, or it could not compete).
    pub previous: Option<(i64, FitQuality)>,
    /// The metrics stored with the model.
    pub metrics: serde_json::Value,
}

/// Fits, validates on held-out groups, stores and (when not worse, or with `--activate`)
/// activates a new model version. Too little data is a [`NotEnoughGroups`] error. The
/// slowdown model learns from groups of every size; the linear model, whose summed features
/// describe a pair, from pairs only.
pub fn train(args: &TrainArgs, ctx: &Ctx, db: &mut Db) -> Result<Trained> {
    let fraction = args.holdout_fraction.unwrap_or(ctx.config.training.holdout_fraction);
    if !(fraction > 0.0 && fraction < 1.0) {
        bail!("--holdout-fraction {fraction}: must be in (0, 1)");
    }
    let seed = args.seed.unwrap_or(ctx.config.training.seed);
    let set = training_set(db)?;
    let kind = match args.kind {
        Some(KindArg::Slowdown) => ModelKind::Slowdown,
        Some(KindArg::Linear) => ModelKind::Linear,
        None => ctx.config.training.model,
    };
    let objective = ctx.config.selection.objective;
    let digest = set.digest();
    let same = db.models()?.into_iter().rev().find(|m| {
        let metric = |k: &str| m.model.metrics.get(k);
        m.model.training_digest == digest
            && metric("kind").and_then(|v| v.as_str()) == Some(kind.key())
            && metric("objective").and_then(|v| v.as_str()) == Some(objective.key())
            && metric("seed").and_then(|v| v.as_u64()) == Some(seed)
            && metric("holdout_fraction").and_then(|v| v.as_f64()) == Some(fraction)
    });
    if let Some(m) = same {
        if !args.activate {
            return Err(UnchangedData { version: m.version }.into());
        }
    }
    let usable: Vec<&Group> = set.groups.iter().filter(|g| kind.learns_from(g.k())).collect();
    let (fit_idx, held_idx) = holdout_split(usable.len(), fraction, seed);
    if fit_idx.len() < MIN_FIT_GROUPS || held_idx.is_empty() {
        return Err(NotEnoughGroups {
            usable: usable.len(),
            skipped: set.skipped,
            needed: MIN_FIT_GROUPS + 1,
        }
        .into());
    }
    let fit: Vec<&Group> = fit_idx.iter().map(|&i| usable[i]).collect();
    let held: Vec<&Group> = held_idx.iter().map(|&i| usable[i]).collect();
    let mut sizes = std::collections::BTreeMap::new();
    for g in &usable {
        *sizes.entry(g.k().to_string()).or_insert(0usize) += 1;
    }
    let held_y: Vec<f64> = held.iter().map(|g| objective.value(g)).collect();
    let model = Model::train(kind, &fit, objective, SlowdownParams::default())?;
    let quality = |m: &Model| FitQuality::of(&held_y, &predictions(m, &held, objective));
    let new_q = quality(&model);
    let active = match active_model(db) {
        // An active model that cannot predict this objective is no competitor.
        Ok((v, m)) if m.serves(objective) => Some((v, quality(&m))),
        Ok((v, _)) => {
            ctx.info(&format!("train: active model {v} does not serve {}", objective.key()));
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
    let not_worse = not_worse(new_q.mse, active.map(|a| a.1.mse));
    let metrics = json!({
        "fit_groups": fit_idx.len(),
        "holdout_groups": held_idx.len(),
        "skipped_groups": set.skipped,
        "unused_groups": set.groups.len() - usable.len(),
        "group_sizes": sizes,
        "holdout_fraction": fraction,
        "seed": seed,
        "holdout_mse": new_q.mse,
        "holdout_r2": new_q.r2,
        "active_version_at_training": active.map(|a| a.0),
        "active_holdout_mse": active.map(|a| a.1.mse),
        "kind": kind.key(),
        "objective": objective.key(),
    });
    let version =
        db.insert_model(&model_to_new_model(&model, metrics.clone(), digest, fit_idx.len())?)?;
    // Not even --activate makes a model with a non-finite held-out error the one every prolog
    // uses.
    let activated = new_q.mse.is_finite() && (args.activate || not_worse);
    if activated {
        db.activate_model(version)?;
    }
    Ok(Trained {
        version,
        activated,
        kind,
        fit_groups: fit_idx.len(),
        holdout_groups: held_idx.len(),
        quality: new_q,
        previous: active,
        metrics,
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
            "model version {} ({}): fitted on {} groups, held-out MSE {} (R² {}) on {} groups",
            t.version,
            t.kind.key(),
            t.fit_groups,
            num(t.quality.mse),
            num(t.quality.r2),
            t.holdout_groups
        );
        if let Some((v, q)) = t.previous {
            println!("active version {v} on the same held-out groups: MSE {}", num(q.mse));
        }
        match (t.activated, args.activate) {
            (true, true) => println!("activated (--activate)"),
            (true, false) => println!("activated (not worse than the active model)"),
            (false, _) => {
                println!("not activated: worse than the active model (use --activate to force)")
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::not_worse;

    #[test]
    fn activation_rule() {
        assert!(not_worse(1.0, None));
        assert!(not_worse(1.0, Some(1.0)));
        assert!(not_worse(0.5, Some(1.0)));
        assert!(!not_worse(1.5, Some(1.0)));
        assert!(!not_worse(f64::NAN, None));
        assert!(not_worse(1.0, Some(f64::NAN)));
        // The audit's poisoned retrain: inf ≤ inf activated a model with held-out MSE inf.
        assert!(!not_worse(f64::INFINITY, Some(f64::INFINITY)));
        assert!(!not_worse(f64::INFINITY, None));
        assert!(not_worse(1e300, Some(f64::INFINITY)));
    }
}
