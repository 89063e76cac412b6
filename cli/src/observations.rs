//! `kace observations import|list|trust|remove|quarantine`: bring measured colocations in without the
//! spool (the artifact's pair table, or kace observation JSON files), look at what is stored,
//! and take bad ones out of training (a poisoned progress file, a broken node).

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context, Result};
use clap::{Args, Subcommand};
use kace_selector::dataset::read_colocations;
use kace_sql::{Observation, ObservationFilter, Partner};
use serde_json::json;

use crate::context::{num, print_json, Ctx};
use crate::output::table;

/// `kace observations …`
#[derive(Debug, Args)]
pub struct ObservationsArgs {
    #[command(subcommand)]
    command: ObsCommand,
}

#[derive(Debug, Subcommand)]
enum ObsCommand {
    /// Import observations: a colocation table in the artifact's `wN_` scheme (CSV, e.g.
    /// `pairs/MPS100_kernel_labels_targetMPS100.csv`) or a JSON file holding one kace
    /// observation or an array of them. Importing the same file again changes nothing.
    Import {
        /// The file.
        #[arg(value_name = "FILE")]
        file: PathBuf,
    },
    /// List stored observations (quarantined ones are counted, not listed).
    List {
        /// Show at most this many.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// Mark the matching observations trusted: the groups they form join the reference a new
    /// model may not get worse on (imported ones are trusted already).
    Trust(Which),
    /// Delete the stored observations that match every option given.
    Remove(Which),
    /// Keep the matching observations for inspection, but out of training and listings.
    Quarantine {
        #[command(flatten)]
        which: Which,
        /// Why (shown by `kace db check` and kept with the rows).
        #[arg(long, default_value = "quarantined by an admin")]
        reason: String,
    },
}

/// Which observations: at least one of these.
#[derive(Debug, Args)]
#[group(required = true, multiple = true)]
struct Which {
    /// The observation's key.
    #[arg(long)]
    key: Option<String>,
    /// The Slurm job id.
    #[arg(long)]
    job: Option<String>,
    /// The node it came from (`imported` for `observations import`).
    #[arg(long)]
    node: Option<String>,
}

impl Which {
    fn filter(self) -> ObservationFilter {
        ObservationFilter { key: self.key, job: self.job, node: self.node }
    }
}

/// Runs `kace observations …`.
pub fn run(args: ObservationsArgs, ctx: &Ctx) -> Result<()> {
    match args.command {
        ObsCommand::Import { file } => import(ctx, &file),
        ObsCommand::List { limit } => list(ctx, limit),
        ObsCommand::Trust(which) => {
            let n = ctx.open()?.trust_observations(&which.filter())?;
            report(ctx, "trusted", n)
        }
        ObsCommand::Remove(which) => {
            let n = ctx.open()?.remove_observations(&which.filter())?;
            report(ctx, "removed", n)
        }
        ObsCommand::Quarantine { which, reason } => {
            let n = ctx.open()?.quarantine_observations(&which.filter(), &reason)?;
            report(ctx, "quarantined", n)
        }
    }
}

fn report(ctx: &Ctx, verb: &str, n: usize) -> Result<()> {
    if ctx.json() {
        print_json(&json!({ verb: n }))
    } else {
        println!("{verb} {n} observation(s)");
        Ok(())
    }
}

/// Turns a colocation table into one observation per member. Keys and job ids derive from
/// the file name and row, so a re-import finds the same keys and stores nothing new.
fn from_table(path: &Path, text: &str) -> Result<Vec<Observation>> {
    // A file cut off inside a quoted field would otherwise import its last row with a wrong
    // value (the csv reader takes the end of the file as the field's end).
    if let Some((line, col)) = kace_sql::profile_table::unterminated_quote(text) {
        return Err(anyhow!(
            "line {line}, column {col}: a quoted field is never closed (is the file cut off?)"
        ));
    }
    let stem = path.file_stem().unwrap_or_default().to_string_lossy().into_owned();
    let data = read_colocations(&stem, text.as_bytes())?;
    let mut out = Vec::new();
    for (row, g) in data.groups.iter().enumerate() {
        let job = |i: usize| format!("{stem}:r{row}:w{}", i + 1);
        for (i, (w, thr)) in g.workloads.iter().zip(&g.throughputs).enumerate() {
            let partners = (0..g.k())
                .filter(|&j| j != i)
                .map(|j| Partner { job: job(j), workload: g.workloads[j].clone() })
                .collect();
            out.push(Observation {
                key: format!("import/{}", job(i)),
                job: job(i),
                workload: w.clone(),
                partners,
                node: "imported".into(),
                gpu: "0".into(),
                // The artifact's pairs ran with both jobs at 100 % active threads.
                mps_share: Some(100.0),
                start: 0.0,
                end: 0.0,
                steps: None,
                throughput: *thr,
                user: None,
                account: None,
                gpu_sm_pct: None,
                gpu_energy_j: None,
            });
        }
    }
    Ok(out)
}

fn import(ctx: &Ctx, file: &Path) -> Result<()> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("couldn't read {}", file.display()))?;
    let is_json = file.extension().is_some_and(|e| e.eq_ignore_ascii_case("json"));
    let obs = if is_json {
        let v: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("couldn't parse {}", file.display()))?;
        let items = if v.is_array() { v } else { serde_json::Value::Array(vec![v]) };
        serde_json::from_value::<Vec<Observation>>(items)
            .with_context(|| format!("couldn't read observations from {}", file.display()))?
    } else {
        from_table(file, &text).with_context(|| format!("couldn't import {}", file.display()))?
    };
    if obs.is_empty() {
        return Err(anyhow!("couldn't import {}: no observations", file.display()));
    }
    let mut db = ctx.open()?;
    // An admin's import is trusted: the reference a new model is checked on.
    let n = db.insert_admin_observations(&obs)?;
    if ctx.json() {
        print_json(&json!({ "inserted": n.inserted, "duplicates": n.duplicates }))
    } else {
        println!("stored {} new observation(s), {} already stored", n.inserted, n.duplicates);
        Ok(())
    }
}

fn list(ctx: &Ctx, limit: usize) -> Result<()> {
    let db = ctx.open_read_only()?;
    let all = db.observations()?;
    let quarantined = db.quarantined_observations()?.len();
    let shown = &all[..all.len().min(limit)];
    if ctx.json() {
        return print_json(
            &json!({ "total": all.len(), "quarantined": quarantined, "observations": shown }),
        );
    }
    let rows: Vec<Vec<String>> = shown
        .iter()
        .map(|o| {
            let partners: Vec<&str> = o.partners.iter().map(|p| p.workload.as_str()).collect();
            vec![
                o.key.clone(),
                o.workload.clone(),
                if partners.is_empty() { "(alone)".into() } else { partners.join(",") },
                num(o.throughput),
            ]
        })
        .collect();
    print!("{}", table(&["key", "workload", "partners", "throughput"], &rows));
    println!("{} of {} observation(s); {quarantined} quarantined", shown.len(), all.len());
    Ok(())
}
