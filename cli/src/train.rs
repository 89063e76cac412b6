//! `kace train`: parses the options into the library's training policy, runs the store's
//! training ([`kace_sql::training::train`]) and prints what it came to.

use anyhow::{anyhow, Result};
use clap::Args;
use kace_selector::training::TrainingPolicy;
use kace_selector::ModelKind;
use kace_sql::training::{self, Outcome, VersusActive};
use serde_json::json;

use crate::context::{num, print_json, Ctx};
use crate::keyed;

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
    /// Kind of model: `slowdown` (kace's per-job slowdown model) or `linear` (the paper's
    /// linear regression); default: the config's `training.model`.
    #[arg(long, value_parser = keyed::parser(&["slowdown", "linear"], ModelKind::from_key))]
    kind: Option<ModelKind>,
}

impl TrainArgs {
    /// The training policy these options and the config ask for.
    pub fn policy(&self, ctx: &Ctx) -> TrainingPolicy {
        TrainingPolicy {
            kind: self.kind.unwrap_or(ctx.config.training.model),
            objective: ctx.config.selection.objective.trained_as(),
            holdout_fraction: self.holdout_fraction.unwrap_or(ctx.config.training.holdout_fraction),
            seed: self.seed.unwrap_or(ctx.config.training.seed),
            force_activation: self.activate,
        }
    }
}

/// How the new model compared with the one active before it, in words (for `kace train` and
/// `kace retrain`).
pub fn describe(c: &VersusActive) -> String {
    let reference = match c.reference {
        Some(r) => format!(
            "on the {} trusted group(s): MSE {} (new) vs {} (active)",
            r.groups,
            num(r.new.mse),
            num(r.active.mse)
        ),
        None => "no trusted reference (kace observations import, or trust)".to_string(),
    };
    let seen = c.seen.map(|s| {
        format!(
            "; on the {} held-out group(s) both have seen: MSE {} (new) vs {} (active)",
            s.groups,
            num(s.new.mse),
            num(s.active.mse)
        )
    });
    let unseen = match (c.new, c.active) {
        (Some(n), Some(a)) => format!(
            "on the {} held-out group(s) active version {} had not seen: MSE {} (new) vs {} \
             (active)",
            c.groups,
            c.version,
            num(n.mse),
            num(a.mse)
        ),
        _ => format!(
            "active version {} had seen every held-out group: nothing to compare",
            c.version
        ),
    };
    format!("{reference}{}; {unseen}", seen.unwrap_or_default())
}

/// Runs the store's training with these options, logging (with `-v`) why the active model
/// could not compete.
pub fn train(args: &TrainArgs, ctx: &Ctx, db: &mut kace_sql::Db) -> Result<Outcome> {
    let outcome = training::train(db, &args.policy(ctx))?;
    if let Outcome::Stored(s) = &outcome {
        for note in &s.notes {
            ctx.info(&format!("train: {note}"));
        }
    }
    Ok(outcome)
}

/// Runs `kace train`.
pub fn run(args: TrainArgs, ctx: &Ctx) -> Result<()> {
    let mut db = ctx.open()?;
    let t = match train(&args, ctx, &mut db)? {
        Outcome::Stored(t) => t,
        Outcome::Unchanged { version } if ctx.json() => {
            return print_json(&json!({ "version": null, "unchanged_since": version }))
        }
        Outcome::Unchanged { version } => {
            println!(
                "model unchanged: the training data are unchanged since model version {version} \
                 (nothing stored)"
            );
            return Ok(());
        }
        Outcome::NotEnoughGroups { usable, skipped, needed } => {
            return Err(anyhow!(
                "couldn't fit a model: {usable} usable observed group(s) ({skipped} skipped for \
                 missing profiles); need at least {needed} to fit and one to hold out"
            ))
        }
    };
    if ctx.json() {
        print_json(&json!({ "version": t.version, "activated": t.activated, "metrics": t.record }))
    } else {
        let r = &t.record;
        println!(
            "model version {} ({}): fitted on all {} groups; held-out MSE {} (R² {}) on {} \
             groups for the same search fitted on the other {}",
            t.version,
            t.kind.key(),
            r.fit_groups,
            num(t.quality.mse),
            num(t.quality.r2),
            r.holdout_groups,
            r.validation_fit_groups
        );
        if let Some(c) = &t.previous {
            println!("{}", describe(c));
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
