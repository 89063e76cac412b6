//! `kace dispatch`: the decider on the controller (see `kace_node::dispatch` for what a pass
//! does). `kace dispatch --watch` is the service (`packaging/systemd/kace-dispatch-watch.service`):
//! it holds the dispatch lock for its life and passes when slurmctld's PrologSlurmctld or
//! EpilogSlurmctld (`kace-dispatch`) nudges it, when the gate marks a submission, when a held
//! job's max_hold expires, and every `dispatch.backstop_s`. `kace dispatch` alone nudges the
//! service when one runs, and otherwise runs one pass itself. What a pass released and the
//! problems it met also go to syslog ([`kace_log`]).

use std::collections::BTreeSet;

use anyhow::Result;
use clap::Args;
use kace_log::Logger;
use kace_node::dispatch::PassReport;
use kace_node::{Clock, SystemClock};
use serde_json::json;

use crate::context::{print_json, Ctx};

/// `kace dispatch`
#[derive(Debug, Args)]
pub struct DispatchArgs {
    /// Run as the decider service: hold the dispatch lock, pass on every nudge, submission,
    /// max_hold expiry and backstop.
    #[arg(long)]
    watch: bool,
}

/// Runs `kace dispatch`.
pub fn run(args: DispatchArgs, ctx: &Ctx) -> Result<()> {
    // stdout and stderr are for the person or unit running it; syslog gets every event once.
    let syslog = Logger::new(ctx.config.log.socket()).without_stderr();
    let max_hold = ctx.config.dispatch.max_hold_s;
    if args.watch {
        // Jobs already said to be stuck: each is said once.
        let mut said_stuck = BTreeSet::new();
        let mut each = |r: kace_node::Result<PassReport>| match r {
            Ok(mut r) => {
                said_stuck.retain(|j| r.stuck.iter().any(|s| s.0 == *j));
                r.stuck.retain(|s| said_stuck.insert(s.0));
                for line in kace_node::dispatch::report_lines(&r, max_hold) {
                    syslog.line(&line);
                    println!("{line}");
                }
            }
            Err(e) => {
                let line = format!("kace: dispatch: couldn't dispatch: {e}");
                syslog.line(&line);
                eprintln!("{line}");
            }
        };
        kace_node::dispatch::serve(&ctx.config, &syslog, &mut each)?;
        return Ok(());
    }
    if kace_node::nudge::nudge(&ctx.config.dispatch.socket).is_ok() {
        ctx.info("dispatch: nudged the decider service; it passes now");
        if ctx.json() {
            print_json(&json!({"nudged": true}))?;
        }
        return Ok(());
    }
    let r = match kace_node::dispatch::run_configured(&ctx.config, SystemClock.now(), &syslog) {
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
            "kace: dispatch: another decider holds {}; nothing done",
            ctx.config.dispatch.lock.display()
        );
        return Ok(());
    };
    for p in &r.problems {
        eprintln!("kace: dispatch: {p}");
    }
    if ctx.json() {
        let at = |v: &[(u32, String, u32)]| -> Vec<serde_json::Value> {
            v.iter().map(|(j, n, g)| json!({"job": j, "node": n, "gpu": g})).collect()
        };
        print_json(&json!({
            "nudged": false,
            "leads": at(&r.leads),
            "joiners": at(&r.joiners),
            "expired": at(&r.expired),
            "handed_back": r.handed_back.iter().map(|(j, w)| json!({"job": j, "why": w})).collect::<Vec<_>>(),
            "held_again": r.held_again.iter().map(|(j, w)| json!({"job": j, "why": w})).collect::<Vec<_>>(),
            "time_refused": r.time_refused.iter().map(|(j, w)| json!({"job": j, "why": w})).collect::<Vec<_>>(),
            "resumed": r.resumed,
            "stuck": r.stuck.iter().map(|(j, t, w)| json!({"job": j, "seconds": t, "state": w})).collect::<Vec<_>>(),
            "still_held": r.still_held,
            "problems": r.problems,
            "notes": r.notes,
        }))?;
        return Ok(());
    }
    for l in r.stuck_lines() {
        eprintln!("kace: dispatch: {l}");
    }
    let lines = r.lines(max_hold);
    for l in &lines {
        println!("{l}");
    }
    if lines.is_empty() {
        ctx.info("dispatch: nothing to release");
    }
    Ok(())
}
