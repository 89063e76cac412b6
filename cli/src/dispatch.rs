//! `kace dispatch`: the controller side of co-scheduling, run by `EpilogSlurmctld=` and a timer.
//! It releases the oldest held kace job as a lead onto every GPU without a kace job, and every
//! kace job held longer than `dispatch.max_hold_s`. One instance runs at a time (a lock file);
//! a second one returns at once. What it released and the problems it met also go to syslog
//! ([`kace_log`]): run by the timer, its output is otherwise only in the unit's journal.

use anyhow::Result;
use clap::Args;
use kace_log::Logger;
use kace_node::{Clock, SystemClock};
use serde_json::json;

use crate::context::{print_json, Ctx};

/// `kace dispatch`
#[derive(Debug, Args)]
pub struct DispatchArgs {}

/// Runs `kace dispatch`.
pub fn run(_args: DispatchArgs, ctx: &Ctx) -> Result<()> {
    let max_hold = ctx.config.dispatch.max_hold_s;
    // stdout and stderr are for the person or unit running it; syslog gets every event once.
    let syslog = Logger::new(ctx.config.log.socket()).without_stderr();
    let r = match kace_node::dispatch::run_configured(&ctx.config, SystemClock.now()) {
        Ok(r) => r,
        Err(e) => {
            syslog.line(&format!("kace: dispatch: couldn't dispatch: {e}"));
            return Err(e.into());
        }
    };
    for line in r.iter().flat_map(|r| kace_node::dispatch::report_lines(r, max_hold)) {
        syslog.line(&line);
    }
    let Some(r) = r else {
        eprintln!(
            "kace: dispatch: another dispatch holds {}; nothing done",
            ctx.config.dispatch.lock.display()
        );
        return Ok(());
    };
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
