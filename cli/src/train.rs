//! `kace train`: fit the model on observed pairs, compare it with the active model on held-out
//! pairs, store it as a new version and activate it when it is not worse (or when asked).

use anyhow::{bail, Result};
use clap::Args;
use kace_selector::eval::FitQuality;
use kace_selector::LinearModel;
use kace_sql::decide::{active_linear, holdout_split, linear_to_new_model, training_set};
use kace_sql::Error as SqlError;
use serde_json::json;

use crate::context::{num, print_json, Ctx};

/// Fewest fit pairs accepted: the model has ten coefficients plus an intercept.
const MIN_FIT_PAIRS: usize = 12;

/// `kace train`
#[derive(Debug, Args)]
pub struct TrainArgs {
    /// Activate the new version whatever its held-out error.
    #[arg(long)]
    activate: bool,
    /// Fraction of pairs held out (default: the config's `training.holdout_fraction`).
    #[arg(long)]
    holdout_fraction: Option<f64>,
    /// Seed of the held-out split (default: the config's `training.seed`).
    #[arg(long)]
    seed: Option<u64>,
}

/// Whether a new model with held-out error `new_mse` may replace the active one (`None`: there
/// is none). Ties go to the new model: it was trained on the newer data. A NaN error on the
/// new model counts as worse; on the active one, as beaten.
fn not_worse(new_mse: f64, active_mse: Option<f64>) -> bool {
    !new_mse.is_nan() && active_mse.is_none_or(|a| a.is_nan() || new_mse <= a)
}

/// Runs `kace train`.
pub fn run(args: TrainArgs, ctx: &Ctx) -> Result<()> {
    let fraction = args.holdout_fraction.unwrap_or(ctx.config.training.holdout_fraction);
    if !(fraction > 0.0 && fraction < 1.0) {
        bail!("--holdout-fraction {fraction}: must be in (0, 1)");
    }
    let seed = args.seed.unwrap_or(ctx.config.training.seed);
    let mut db = ctx.open()?;
    let set = training_set(&db)?;
    let (fit_idx, held_idx) = holdout_split(set.rows.len(), fraction, seed);
    if fit_idx.len() < MIN_FIT_PAIRS || held_idx.is_empty() {
        bail!(
            "couldn't fit a model: {} usable observed pair(s) ({} skipped for missing profiles); \
             need at least {} to fit and one to hold out",
            set.rows.len(),
            set.skipped,
            MIN_FIT_PAIRS + 1
        );
    }
    let pick = |idx: &[usize]| -> (Vec<[f64; 10]>, Vec<f64>) {
        (idx.iter().map(|&i| set.rows[i]).collect(), idx.iter().map(|&i| set.targets[i]).collect())
    };
    let (fit_x, fit_y) = pick(&fit_idx);
    let (held_x, held_y) = pick(&held_idx);
    let model = LinearModel::fit(&fit_x, &fit_y)?;
    let quality = |m: &LinearModel| {
        let pred: Vec<f64> = held_x.iter().map(|r| m.predict(r)).collect();
        FitQuality::of(&held_y, &pred)
    };
    let new_q = quality(&model);
    let active = match active_linear(&db) {
        Ok((v, m)) => Some((v, quality(&m))),
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
        "fit_pairs": fit_idx.len(),
        "holdout_pairs": held_idx.len(),
        "skipped_pairs": set.skipped,
        "holdout_fraction": fraction,
        "seed": seed,
        "holdout_mse": new_q.mse,
        "holdout_r2": new_q.r2,
        "active_version_at_training": active.map(|a| a.0),
        "active_holdout_mse": active.map(|a| a.1.mse),
        "unit": "throughput sum, steps/s",
    });
    let version = db.insert_model(&linear_to_new_model(
        &model,
        metrics.clone(),
        set.digest(),
        fit_idx.len(),
    )?)?;
    let activated = args.activate || not_worse;
    if activated {
        db.activate_model(version)?;
    }
    if ctx.json() {
        print_json(&json!({ "version": version, "activated": activated, "metrics": metrics }))
    } else {
        println!(
            "model version {version}: fitted on {} pairs, held-out MSE {} (R² {}) on {} pairs",
            fit_idx.len(),
            num(new_q.mse),
            num(new_q.r2),
            held_idx.len()
        );
        if let Some((v, q)) = active {
            println!("active version {v} on the same held-out pairs: MSE {}", num(q.mse));
        }
        match (activated, args.activate) {
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
    }
}
