//! `kace dispatch`: the controller side of co-scheduling, run by `EpilogSlurmctld=` and a timer.
//! It releases the oldest held kace job as a lead onto every GPU without a kace job, and every
//! kace job held longer than `dispatch.max_hold_s`. One instance runs at a time (a lock file);
//! a second one returns at once.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;
use kace_node::slurm::Commands;
use kace_node::{Clock, SystemClock};
use serde_json::json;

use crate::context::{print_json, Ctx};

/// How long dispatch may take in all, so that a hanging Slurm command cannot pile up timer runs.
const BUDGET: Duration = Duration::from_secs(60);

/// `kace dispatch`
#[derive(Debug, Args)]
pub struct DispatchArgs {}

/// Runs `kace dispatch`.
pub fn run(_args: DispatchArgs, ctx: &Ctx) -> Result<()> {
    let lock_path = &ctx.config.dispatch.lock;
    if let Some(dir) = lock_path.parent() {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("couldn't create {}", dir.display()))?;
    }
    let Some(_lock) = kace_node::state::try_lock_file(lock_path)? else {
        eprintln!("kace: dispatch: another dispatch holds {}; nothing done", lock_path.display());
        return Ok(());
    };
    let node = &ctx.config.node;
    let slurm = Commands {
        scontrol: node.scontrol.clone(),
        squeue: node.squeue.clone(),
        sinfo: node.sinfo.clone(),
        timeout: Duration::from_millis(node.command_timeout_ms),
        deadline: Some(Instant::now() + BUDGET),
    };
    let max_hold = ctx.config.dispatch.max_hold_s;
    let r = kace_node::dispatch::run(&slurm, SystemClock.now(), max_hold)?;
    for p in &r.problems {
        eprintln!("kace: dispatch: {p}");
    }
    if ctx.json() {
        let leads: Vec<_> =
            r.leads.iter().map(|(j, n, g)| json!({"job": j, "node": n, "gpu": g})).collect();
        return print_json(&json!({
            "leads": leads,
            "expired": r.expired,
            "problems": r.problems,
        }));
    }
    for (job, n, g) in &r.leads {
        println!("released job {job} as a lead onto {n} GPU {g}");
    }
    for job in &r.expired {
        println!("released job {job}: held longer than {max_hold} s");
    }
    if r.leads.is_empty() && r.expired.is_empty() {
        ctx.info("dispatch: nothing to release");
    }
    Ok(())
}
