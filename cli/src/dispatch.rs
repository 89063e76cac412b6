//! `kace dispatch`: the controller side of co-scheduling (see `kace_node::dispatch` for what a
//! pass does). `kace dispatch` runs one pass; `kace dispatch --watch` is the service
//! (`packaging/kace-dispatch.service`): it passes once a second while kace jobs are held, and
//! every `--idle` seconds otherwise, so a kace job on an idle cluster starts about as soon as a
//! plain one would. EpilogSlurmctld and the timer stay as backstops; one pass runs at a time
//! (the dispatch lock), a second one returns at once. What it released and the problems it met
//! also go to syslog ([`kace_log`]): run by the timer or the service, its output is otherwise
//! only in the unit's journal.

use std::time::Duration;

use anyhow::{bail, Result};
use clap::Args;
use kace_log::Logger;
use kace_node::{Clock, SystemClock};
use serde_json::json;

use crate::context::{print_json, Ctx};

/// `kace dispatch`
#[derive(Debug, Args)]
pub struct DispatchArgs {
    /// Keep passing: once a second while kace jobs are held, else every `--idle` seconds.
    #[arg(long)]
    watch: bool,
    /// With `--watch`: seconds between passes while no kace job is held.
    #[arg(long, default_value_t = 5, value_name = "SECONDS")]
    idle: u64,
}

/// Runs `kace dispatch`.
pub fn run(args: DispatchArgs, ctx: &Ctx) -> Result<()> {
    if !args.watch {
        pass(ctx)?;
        return Ok(());
    }
    if args.idle == 0 {
        bail!("--idle 0: must be at least 1 second");
    }
    loop {
        // A failing pass (Slurm down, a command timing out) is logged; the loop goes on.
        let held = match pass(ctx) {
            Ok(h) => h,
            Err(e) => {
                eprintln!("kace: dispatch: couldn't dispatch: {e:#}");
                false
            }
        };
        std::thread::sleep(Duration::from_secs(if held { 1 } else { args.idle }));
    }
}

/// One pass; returns whether kace jobs are still held.
fn pass(ctx: &Ctx) -> Result<bool> {
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
        return Ok(true);
    };
    for p in &r.problems {
        eprintln!("kace: dispatch: {p}");
    }
    if ctx.json() {
        let at = |v: &[(u32, String, u32)]| -> Vec<serde_json::Value> {
            v.iter().map(|(j, n, g)| json!({"job": j, "node": n, "gpu": g})).collect()
        };
        print_json(&json!({
            "leads": at(&r.leads),
            "joiners": at(&r.joiners),
            "expired": at(&r.expired),
            "waiting_expired": r.waiting_expired,
            "deferred": r.deferred,
            "still_held": r.still_held,
            "problems": r.problems,
        }))?;
        return Ok(r.still_held);
    }
    if let Some(why) = &r.deferred {
        ctx.info(&format!("dispatch: released nothing: {why}; a prolog or epilog is choosing"));
    }
    let lines = r.lines(max_hold);
    for l in &lines {
        println!("{l}");
    }
    if lines.is_empty() {
        ctx.info("dispatch: nothing to release");
    }
    Ok(r.still_held)
}
