//! `kace select --dry-run`: show what the prolog would choose for a lead among candidates, with
//! every candidate's prediction or the reason it was filtered out.

use anyhow::{bail, Result};
use clap::Args;
use kace_selector::{Rejection, SelectionRules};
use kace_sql::decide::{decide, CandidateSpec};
use serde_json::json;

use crate::context::{num, print_json, Ctx};
use crate::output::table;

/// `kace select`
#[derive(Debug, Args)]
pub struct SelectArgs {
    /// Only show the choice (required: real choices are made by the prolog, which also
    /// releases the partner and records the decision).
    #[arg(long, required = true)]
    dry_run: bool,
    /// The lead's workload.
    #[arg(long)]
    lead: String,
    /// Candidate workloads, in queue order (ties go to the earlier one).
    #[arg(long, value_delimiter = ',', required = true)]
    candidates: Vec<String>,
    /// GPU memory in GiB; without it the memory filter is skipped.
    #[arg(long, value_name = "GiB")]
    gpu_memory: Option<f64>,
    /// Only use profiles measured on this GPU model.
    #[arg(long)]
    gpu_model: Option<String>,
}

fn reason(r: &Rejection, missing: &[&str]) -> String {
    match r {
        Rejection::UnknownProfile if !missing.is_empty() => {
            format!("incomplete profile (missing {})", missing.join(", "))
        }
        other => other.to_string(),
    }
}

/// Runs `kace select`.
pub fn run(args: SelectArgs, ctx: &Ctx) -> Result<()> {
    debug_assert!(args.dry_run);
    if let Some(g) = args.gpu_memory {
        if !(g.is_finite() && g > 0.0) {
            bail!("--gpu-memory {g}: must be a positive number of GiB");
        }
    }
    let rules = SelectionRules {
        gpu_memory_gib: args.gpu_memory,
        memory_margin: ctx.config.selection.memory_margin,
        // A dry run has no users: every candidate is taken as the lead's user's.
        require_same_user: true,
        min_gain: ctx.config.selection.min_gain,
        ..SelectionRules::default()
    };
    let specs: Vec<CandidateSpec> = args
        .candidates
        .iter()
        .map(|w| CandidateSpec { workload: w.trim().to_string(), same_user: true })
        .collect();
    let db = ctx.open_read_only()?;
    let d = decide(&db, &args.lead, &specs, &rules, args.gpu_model.as_deref())?;
    let chosen = d.selection.chosen.map(|i| specs[i].workload.clone());
    if ctx.json() {
        let items: Vec<_> = specs
            .iter()
            .zip(&d.selection.verdicts)
            .zip(&d.incomplete)
            .enumerate()
            .map(|(i, ((c, v), missing))| {
                json!({
                    "workload": c.workload,
                    "prediction": v.prediction,
                    "rejected": v.rejection.as_ref().map(|r| reason(r, missing)),
                    "chosen": d.selection.chosen == Some(i),
                })
            })
            .collect();
        return print_json(&json!({
            "lead": args.lead,
            "model_version": d.model_version,
            "baseline": d.selection.baseline,
            "chosen": chosen,
            "candidates": items,
        }));
    }
    println!(
        "lead {} (alone: {} steps/s), model version {}",
        args.lead,
        num(d.selection.baseline),
        d.model_version
    );
    let rows: Vec<Vec<String>> = specs
        .iter()
        .zip(&d.selection.verdicts)
        .zip(&d.incomplete)
        .enumerate()
        .map(|(i, ((c, v), missing))| {
            vec![
                if d.selection.chosen == Some(i) { "*".into() } else { String::new() },
                c.workload.clone(),
                v.prediction.map(num).unwrap_or_else(|| "-".into()),
                v.rejection.as_ref().map(|r| reason(r, missing)).unwrap_or_else(|| "ok".into()),
            ]
        })
        .collect();
    print!("{}", table(&["", "candidate", "predicted_sum", "verdict"], &rows));
    match chosen {
        Some(w) => println!("choice: {w}"),
        None => println!("choice: none (the lead runs alone)"),
    }
    Ok(())
}
