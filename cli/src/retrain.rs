//! `kace retrain`: the nightly job, one command for a systemd timer or cron — ingest the spool,
//! train and validate a new model version on held-out groups, activate it only when it is not
//! worse than the active one, prune old spool leftovers, and log one summary line.
//!
//! It fails (non-zero exit) only on a real failure: no usable database, an unreadable spool, a
//! failed fit or store. Too few observed groups to train (a young installation), a new model that
//! is worse, quarantined records and files it could not prune are normal nightly outcomes: they
//! are in the summary (and on stderr), and the exit is 0, so the timer does not cry wolf.

use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use clap::Args;
use kace_sql::spool;
use serde_json::json;

use kace_sql::training::Outcome;

use crate::context::{num, Ctx};
use crate::{ingest, train};

/// `kace retrain`
#[derive(Debug, Args)]
pub struct RetrainArgs {
    #[command(flatten)]
    ingest: ingest::IngestArgs,
    #[command(flatten)]
    train: train::TrainArgs,
    /// Remove quarantined files and abandoned spool writes older than this many days
    /// (0: prune nothing).
    #[arg(long, value_name = "DAYS", default_value_t = 30)]
    keep_days: u64,
}

/// Runs `kace retrain`.
pub fn run(args: RetrainArgs, ctx: &Ctx) -> Result<()> {
    let (spool_dir, qdir) = args.ingest.dirs(ctx);
    let mut db = ctx.open()?;
    let all = spool::ingest_all(&mut db, &spool_dir, &qdir).context("ingest")?;
    for report in [&all.profiles, &all.observations, &all.decisions, &all.failures] {
        ingest::warn(report);
    }
    let ingested = all.observations;
    // Too few groups (a young installation) and unchanged data are nightly outcomes, not
    // failures: they are in the summary.
    let model = train::train(&args.train, ctx, &mut db).context("train")?;
    let pruned = if args.keep_days == 0 {
        spool::PruneReport::default()
    } else {
        let keep = Duration::from_secs(args.keep_days.saturating_mul(86_400));
        spool::prune(&spool_dir, &qdir, keep, SystemTime::now())
    };
    for p in &pruned.removed {
        ctx.info(&format!("retrain: pruned {}", p.display()));
    }
    for (p, why) in &pruned.failed {
        eprintln!("kace: retrain: couldn't prune {}: {why}", p.display());
    }
    if ctx.json() {
        // One line, like the text summary, so that a log line is one record.
        println!("{}", serde_json::to_string(&summary_json(&ingested, &model, &pruned))?);
    } else {
        println!("{}", summary_line(&ingested, &model, &pruned, args.keep_days));
    }
    Ok(())
}

fn summary_line(
    i: &spool::IngestReport,
    model: &Outcome,
    p: &spool::PruneReport,
    keep_days: u64,
) -> String {
    let ingest = format!(
        "ingested {} new observation(s) ({} already stored, {} quarantined)",
        i.inserted,
        i.duplicates,
        i.quarantined.len()
    );
    let model = match model {
        Outcome::Stored(t) => {
            let previous = match &t.previous {
                Some(c) => format!("; {}", train::describe(c)),
                None => " (no active model to compare)".to_string(),
            };
            let verdict = match t.refusal {
                None => "activated".to_string(),
                Some(r) => format!("not activated: {r}"),
            };
            format!(
                "model version {} ({}) fitted on all {} groups, held-out MSE {}{previous}: {verdict}",
                t.version,
                t.kind.key(),
                t.record.fit_groups,
                num(t.quality.mse),
            )
        }
        Outcome::NotEnoughGroups { usable, needed, .. } => {
            format!("model unchanged: {usable} usable observed group(s), {needed} needed")
        }
        Outcome::Unchanged { version } => format!(
            "model unchanged: the training data are unchanged since model version {version}"
        ),
    };
    let prune = match (keep_days, p.failed.len()) {
        (0, _) => "pruning off".to_string(),
        (_, 0) => format!("pruned {} file(s) older than {keep_days} days", p.removed.len()),
        (_, f) => format!(
            "pruned {} file(s) older than {keep_days} days, {f} could not be removed",
            p.removed.len()
        ),
    };
    format!("retrain: {ingest}; {model}; {prune}")
}

fn summary_json(
    i: &spool::IngestReport,
    model: &Outcome,
    p: &spool::PruneReport,
) -> serde_json::Value {
    let model = match model {
        Outcome::Stored(t) => json!({
            "version": t.version,
            "activated": t.activated,
            "metrics": t.record,
        }),
        Outcome::NotEnoughGroups { usable, needed, .. } => json!({
            "version": null,
            "activated": false,
            "usable_pairs": usable,
            "needed_pairs": needed,
        }),
        Outcome::Unchanged { version } => json!({
            "version": null,
            "activated": false,
            "unchanged_since": version,
        }),
    };
    json!({
        "ingest": {
            "inserted": i.inserted,
            "duplicates": i.duplicates,
            "quarantined": i.quarantined.len(),
            "stale_temp_files": i.stale_temp_files.len(),
            "hidden_files": i.hidden.len(),
        },
        "model": model,
        "pruned": p.removed.len(),
        "prune_failures": p.failed.len(),
    })
}
