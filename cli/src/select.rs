//! `kace select --dry-run`: show the decision the prolog, the epilog and dispatch would make for
//! a GPU running the given kace jobs, among candidates, with every candidate's prediction or
//! reason. It is the same decision under the same configuration (objective, gain threshold,
//! memory margin, `max_jobs_per_gpu`); a dry run has no users, so none is refused for its user.

use anyhow::{bail, Result};
use clap::Args;
use kace_node::read_path::{decide_from_store, JobSpec};
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
    /// The workload of the kace job on the GPU (the lead); several, comma-separated, for a GPU
    /// already shared (up to `selection.max_jobs_per_gpu` − 1).
    #[arg(long, value_delimiter = ',', required = true)]
    lead: Vec<String>,
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

/// Runs `kace select`.
pub fn run(args: SelectArgs, ctx: &Ctx) -> Result<()> {
    debug_assert!(args.dry_run);
    if let Some(g) = args.gpu_memory {
        if !(g.is_finite() && g > 0.0) {
            bail!("--gpu-memory {g}: must be a positive number of GiB");
        }
    }
    // The re-audit's L10: `--candidates ","` gave two empty candidates and exit 0.
    for (flag, list) in [("--lead", &args.lead), ("--candidates", &args.candidates)] {
        if list.iter().any(|w| w.trim().is_empty()) {
            bail!("{flag} {:?}: an empty workload name", list.join(","));
        }
    }
    let running: Vec<JobSpec> = args.lead.iter().map(|w| JobSpec::anyone(w.trim())).collect();
    let specs: Vec<JobSpec> = args.candidates.iter().map(|w| JobSpec::anyone(w.trim())).collect();
    let db = ctx.open_read_only()?;
    let policy = ctx.config.policy();
    let d = decide_from_store(
        &db,
        &running,
        &specs,
        &policy,
        args.gpu_memory,
        args.gpu_model.as_deref(),
        &[],
    )?;
    let lead = args.lead.join("+");
    let chosen = d.selection.chosen.map(|i| specs[i].workload.clone());
    if ctx.json() {
        let items: Vec<_> = specs
            .iter()
            .zip(&d.selection.verdicts)
            .enumerate()
            .map(|(i, (c, v))| {
                json!({
                    "workload": c.workload,
                    "prediction": v.prediction,
                    "rejected": d.reason(i),
                    "chosen": d.selection.chosen == Some(i),
                })
            })
            .collect();
        return print_json(&json!({
            "lead": lead,
            "objective": policy.rules.objective.key(),
            "model_version": d.model_version,
            "baseline": d.selection.baseline,
            "chosen": chosen,
            "candidates": items,
        }));
    }
    println!(
        "lead {lead} (now: {} {}), model version {}",
        num(d.selection.baseline),
        policy.rules.objective.key(),
        d.model_version
    );
    let rows: Vec<Vec<String>> = specs
        .iter()
        .zip(&d.selection.verdicts)
        .enumerate()
        .map(|(i, (c, v))| {
            vec![
                if d.selection.chosen == Some(i) { "*".into() } else { String::new() },
                c.workload.clone(),
                v.prediction.map(num).unwrap_or_else(|| "-".into()),
                d.reason(i).unwrap_or_else(|| "ok".into()),
            ]
        })
        .collect();
    print!("{}", table(&["", "candidate", "predicted", "verdict"], &rows));
    match chosen {
        Some(w) => println!("choice: {w}"),
        None => println!("choice: none (the lead runs alone)"),
    }
    Ok(())
}
