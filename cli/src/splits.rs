//! `kace splits train|list|off`: the SM split chooser the decider uses for joiners
//! (`mps.sm_split`): trained by `kace_selector::splits::train_joiner_chooser` on sweeps with the
//! lead at 100 %, stored and activated in the database; `kace eval splits` evaluates the form on
//! the artifact's complementary sweeps.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use kace_selector::dataset::{read_mps_sweeps, read_system_profiles};
use kace_selector::splits::train_joiner_chooser;
use kace_selector::Profile;
use serde_json::json;

use crate::context::{num, print_json, Ctx};
use crate::output::table;

/// `kace splits …`
#[derive(Debug, Args)]
pub struct SplitsArgs {
    #[command(subcommand)]
    command: Option<SplitsCommand>,
}

#[derive(Debug, Subcommand)]
enum SplitsCommand {
    /// The stored choosers, the active one marked (the default).
    List,
    /// Train a chooser on sweeps with the lead at 100 % (`bench/gpu/run`'s share-sweeps.csv)
    /// and make it the active one.
    Train {
        /// A 2-way sweep: columns workload1 (the lead), workload2 (the joiner) and one
        /// "(LS100, BEn)" column per joiner share n %, cells "(lead steps/s, joiner steps/s)".
        #[arg(long, value_name = "FILE.csv")]
        sweeps: PathBuf,
        /// The workloads' system profiles as a CSV (the artifact's baseline_labels.csv form);
        /// by default the database's profiles.
        #[arg(long, value_name = "FILE.csv")]
        profiles: Option<PathBuf>,
    },
    /// Make no chooser active: joiners get no share, whatever `mps.sm_split` says.
    Off,
}

fn open(path: &Path) -> Result<File> {
    File::open(path).with_context(|| format!("couldn't open {}", path.display()))
}

/// Runs `kace splits …`.
pub fn run(args: SplitsArgs, ctx: &Ctx) -> Result<()> {
    match args.command.unwrap_or(SplitsCommand::List) {
        SplitsCommand::List => list(ctx),
        SplitsCommand::Train { sweeps, profiles } => train(ctx, &sweeps, profiles.as_deref()),
        SplitsCommand::Off => {
            let was = ctx.open()?.deactivate_split_models()?;
            if ctx.json() {
                return print_json(&json!({ "was_active": was }));
            }
            println!(
                "{}",
                if was {
                    "no split chooser is active: joiners get no SM share"
                } else {
                    "no split chooser was active"
                }
            );
            Ok(())
        }
    }
}

fn train(ctx: &Ctx, sweeps: &Path, profiles: Option<&Path>) -> Result<()> {
    let rows = read_mps_sweeps(&sweeps.display().to_string(), open(sweeps)?)?;
    let profiles: HashMap<String, Profile> = match profiles {
        Some(p) => read_system_profiles(&p.display().to_string(), open(p)?)?,
        None => {
            let mut names: Vec<&str> =
                rows.iter().flat_map(|r| r.workloads.iter().map(String::as_str)).collect();
            names.sort_unstable();
            names.dedup();
            let stored = ctx.open_read_only()?.profiles(&names, None)?;
            stored
                .iter()
                .filter_map(|(w, p)| Some((w.clone(), kace_sql::convert::selector_profile(p)?)))
                .collect()
        }
    };
    let t = train_joiner_chooser(&rows, &profiles).context("couldn't train a split chooser")?;
    let shares: Vec<u8> =
        t.model.candidates.iter().filter(|c| !c.is_default()).map(|c| c.second).collect();
    let metrics = json!({
        "sweeps": sweeps.display().to_string(),
        "pairs": t.examples,
        "rows": rows.len(),
        "dropped": {
            "unmeasured": t.dropped.unmeasured,
            "unprofiled": t.dropped.unprofiled,
            "implausible": t.dropped.implausible,
        },
        "joiner_shares": shares,
        "settings": t.tuned.settings,
        "cv_chosen_vs_best": t.tuned.cv_chosen_vs_best,
        "cv_worst_vs_default": t.tuned.cv_worst_vs_default,
        "ever_leaves_default": t.model.margin.is_some(),
    });
    let version = ctx.open()?.insert_split_model(&t.model, &metrics)?;
    if ctx.json() {
        return print_json(&json!({ "version": version, "active": true, "metrics": metrics }));
    }
    println!(
        "split chooser {version} active: {} pair(s) of {} row(s), joiner shares {shares:?}; out of \
         fold {} of the best split on average, worst {} of 100/100{}",
        t.examples,
        rows.len(),
        num(t.tuned.cv_chosen_vs_best),
        num(t.tuned.cv_worst_vs_default),
        if t.model.margin.is_none() {
            " (no setting was safe enough: it never sets a share)"
        } else {
            ""
        }
    );
    if !ctx.config.mps.sm_split {
        println!("mps.sm_split is off: the decider sets no share until it is on");
    }
    Ok(())
}

fn list(ctx: &Ctx) -> Result<()> {
    let models = ctx.open_read_only()?.split_models(false)?;
    if ctx.json() {
        let v: Vec<_> = models
            .iter()
            .map(|m| {
                json!({
                    "version": m.version,
                    "active": m.active,
                    "created_at": m.created_at,
                    "metrics": m.metrics,
                })
            })
            .collect();
        return print_json(&json!({ "sm_split": ctx.config.mps.sm_split, "choosers": v }));
    }
    if models.is_empty() {
        println!("no split chooser: `kace splits train --sweeps FILE.csv` makes one");
        return Ok(());
    }
    let rows: Vec<Vec<String>> = models
        .iter()
        .map(|m| {
            let get = |k: &str| m.metrics.get(k).map(|v| v.to_string()).unwrap_or_default();
            vec![
                m.version.to_string(),
                if m.active { "yes".into() } else { String::new() },
                format!("{:.0}", m.created_at),
                get("pairs"),
                get("joiner_shares"),
                get("cv_chosen_vs_best"),
                get("cv_worst_vs_default"),
            ]
        })
        .collect();
    print!(
        "{}",
        table(
            &["version", "active", "created", "pairs", "shares", "vs best (cv)", "worst (cv)"],
            &rows
        )
    );
    println!(
        "mps.sm_split = {}: {}",
        ctx.config.mps.sm_split,
        if ctx.config.mps.sm_split {
            "the decider gives joiners the active chooser's share"
        } else {
            "the decider sets no share"
        }
    );
    Ok(())
}
