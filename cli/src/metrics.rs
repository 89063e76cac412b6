//! `kace metrics`: kace's figures for Prometheus (see `kace_observe::metrics`), printed or, with
//! `--textfile DIR`, written atomically to `DIR/kace.prom` for node_exporter's textfile
//! collector (run it from a timer or after each dispatch).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::Args;
use kace_node::slurm::Slurm;
use kace_node::{Clock, SystemClock};
use kace_observe::metrics::{count_records, render, write_textfile, Live};

use crate::context::Ctx;

/// How long the one Slurm query may take.
const BUDGET: Duration = Duration::from_secs(15);

/// `kace metrics`
#[derive(Debug, Args)]
pub struct MetricsArgs {
    /// Write DIR/kace.prom (atomically) instead of printing.
    #[arg(long, value_name = "DIR")]
    textfile: Option<PathBuf>,
    /// Do not ask Slurm for the held jobs (database and spool figures only).
    #[arg(long)]
    no_slurm: bool,
}

/// Runs `kace metrics`.
pub fn run(args: MetricsArgs, ctx: &Ctx) -> Result<()> {
    let now = SystemClock.now();
    let mut live = Live {
        spool_files: count_records(&ctx.config.spool.dir),
        quarantined_files: count_records(&ctx.config.spool.quarantine),
        ..Live::default()
    };
    // The decider's own counts, where it runs (the controller).
    match kace_node::decider_state::DeciderState::peek(&ctx.config.dispatch.state_dir) {
        Ok(Some(state)) => {
            live.decider_rpcs_last_minute = state.rpcs_last_minute(now).or(Some(0));
            live.priority_inversions =
                Some((state.inversions_total, state.inversion_seconds_total));
            live.decider_passes = Some((
                state.passes_total,
                state.pass_seconds_total,
                state.slowest_pass_last_minute(now),
            ));
            live.decider_commands = Some(state.commands_total);
        }
        Ok(None) => {}
        Err(e) => eprintln!("kace: metrics: couldn't read the decider's state: {e}; left out"),
    }
    if !args.no_slurm {
        match ctx.slurm(BUDGET).kace_queue() {
            Ok(q) => {
                let held: Vec<_> = q.iter().filter(|j| j.held()).collect();
                live.held_jobs = Some(held.len());
                // Counted as dispatch counts toward max_hold: not while blocked.
                live.oldest_hold_s = Some(
                    held.iter()
                        .filter(|j| j.blocked(now).is_none())
                        .filter_map(|j| j.hold_started())
                        .map(|s| now - s)
                        .fold(0.0, f64::max),
                );
            }
            Err(e) => eprintln!("kace: metrics: couldn't ask Slurm for held jobs: {e}; left out"),
        }
    }
    let db = ctx.open_read_only()?;
    let text = render(&db, ctx.config.selection.objective, &live, now)?;
    match args.textfile {
        Some(dir) => {
            let path = write_textfile(&dir, &text)?;
            ctx.info(&format!("metrics: wrote {}", path.display()));
        }
        None => print!("{text}"),
    }
    Ok(())
}
