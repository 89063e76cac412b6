//! `kace dispatch`: the controller side of co-scheduling (see `kace_node::dispatch` for what a
//! pass does). `kace dispatch` runs one pass; `kace dispatch --watch` is the service
//! (`packaging/kace-dispatch-watch.service`): it passes once a second while held kace jobs fit
//! nowhere, and every `--idle` milliseconds otherwise (one `squeue` when nothing waits), so a
//! kace job on an idle cluster starts about as soon as a plain one would. EpilogSlurmctld and the timer stay as backstops; one pass runs at a time
//! (the dispatch lock), a second one returns at once. What it released and the problems it met
//! also go to syslog ([`kace_log`]): run by the timer or the service, its output is otherwise
//! only in the unit's journal.

use std::collections::BTreeSet;
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
    /// Keep passing: every `--idle` milliseconds while no kace job waits (such a pass is one
    /// `squeue`), and once a second while held jobs fit nowhere.
    #[arg(long)]
    watch: bool,
    /// With `--watch`: milliseconds between passes while no kace job waits, so that a job
    /// submitted to an idle cluster is released within this much of its submission.
    #[arg(long, default_value_t = 250, value_name = "MS")]
    idle: u64,
}

/// Runs `kace dispatch`.
pub fn run(args: DispatchArgs, ctx: &Ctx) -> Result<()> {
    // Jobs already said to be stuck in their prolog or epilog: the watching loop says each once.
    let mut said_stuck = BTreeSet::new();
    if !args.watch {
        pass(ctx, &mut said_stuck)?;
        return Ok(());
    }
    if !(10..=60_000).contains(&args.idle) {
        bail!("--idle {}: must be between 10 and 60000 milliseconds", args.idle);
    }
    loop {
        // A failing pass (Slurm down, a command timing out) is logged; the loop goes on.
        let held = match pass(ctx, &mut said_stuck) {
            Ok(h) => h,
            Err(e) => {
                eprintln!("kace: dispatch: couldn't dispatch: {e:#}");
                false
            }
        };
        std::thread::sleep(if held {
            Duration::from_secs(1)
        } else {
            Duration::from_millis(args.idle)
        });
    }
}

/// One pass; returns whether kace jobs are still held. Stuck jobs in `said_stuck` are not
/// said again.
fn pass(ctx: &Ctx, said_stuck: &mut BTreeSet<u32>) -> Result<bool> {
    let max_hold = ctx.config.dispatch.max_hold_s;
    // stdout and stderr are for the person or unit running it; syslog gets every event once.
    let syslog = Logger::new(ctx.config.log.socket()).without_stderr();
    let r = match kace_node::dispatch::run_configured(&ctx.config, SystemClock.now(), &syslog) {
        Ok(r) => r,
        Err(e) => {
            syslog.line(&format!("kace: dispatch: couldn't dispatch: {e}"));
            return Err(e.into());
        }
    };
    let r = r.map(|mut r| {
        said_stuck.retain(|j| r.stuck.iter().any(|s| s.0 == *j));
        r.stuck.retain(|s| said_stuck.insert(s.0));
        r
    });
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
            "stuck": r.stuck.iter().map(|(j, t, w)| json!({"job": j, "seconds": t, "state": w})).collect::<Vec<_>>(),
            "still_held": r.still_held,
            "problems": r.problems,
        }))?;
        return Ok(r.still_held && r.deferred.is_none());
    }
    for l in r.stuck_lines() {
        eprintln!("kace: dispatch: {l}");
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
    // A pass that waited for a hook tries again soon; one whose jobs fit nowhere in a second.
    Ok(r.still_held && r.deferred.is_none())
}
