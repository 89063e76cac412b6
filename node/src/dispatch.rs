//! `kace dispatch`'s logic, on the controller (from `EpilogSlurmctld=` and a timer): release
//! the oldest held kace job as a lead onto each GPU that has no kace job, and release every
//! kace job held longer than `max_hold`, wherever Slurm then puts it, so nothing waits forever.
//!
//! A GPU counts as taken by a running or configuring kace job (its allocation says which GPU)
//! and by a released kace job that has not started yet (pinned to its node; to its GPU type
//! when typed). Leads are released oldest first, one per free GPU.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use kace_config::Config;

use crate::error::{io, Result};
use crate::slurm::{Commands, QueuedJob, Slurm, Target};

/// How long one configured dispatch may take in all, so that a hanging Slurm command cannot
/// pile up timer runs.
pub const BUDGET: Duration = Duration::from_secs(60);

/// One dispatch pass as configured (real Slurm commands, `dispatch.max_hold_s`), under the
/// dispatch lock. `Ok(None)` when another dispatch holds the lock: it does the work.
pub fn run_configured(config: &Config, now: f64) -> Result<Option<Report>> {
    let lock_path = &config.dispatch.lock;
    if let Some(dir) = lock_path.parent() {
        std::fs::create_dir_all(dir).map_err(io("create the directory of", lock_path))?;
    }
    let Some(_lock) = crate::state::try_lock_file(lock_path)? else { return Ok(None) };
    let node = &config.node;
    let slurm = Commands {
        scontrol: node.scontrol.clone(),
        squeue: node.squeue.clone(),
        sinfo: node.sinfo.clone(),
        timeout: Duration::from_millis(node.command_timeout_ms),
        deadline: Some(Instant::now() + BUDGET),
    };
    run(&slurm, now, config.dispatch.max_hold_s).map(Some)
}

/// What one dispatch run did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Report {
    /// Jobs released as leads, with where they were pinned (node, GPU index).
    pub leads: Vec<(u32, String, u32)>,
    /// Jobs released because they were held longer than `max_hold`.
    pub expired: Vec<u32>,
    /// Problems met (each already a full message); the run went on past them.
    pub problems: Vec<String>,
}

/// The log lines of one dispatch run, one per event: what `kace-dispatch` and `kace dispatch`
/// send to the log.
pub fn report_lines(r: &Report, max_hold_s: u64) -> Vec<String> {
    let leads = r.leads.iter().map(|(job, node, gpu)| {
        format!("kace: dispatch: released job {job} as a lead onto {node} GPU {gpu}")
    });
    let expired = r
        .expired
        .iter()
        .map(|job| format!("kace: dispatch: released job {job}: held longer than {max_hold_s} s"));
    let problems = r.problems.iter().map(|p| format!("kace: dispatch: {p}"));
    leads.chain(expired).chain(problems).collect()
}

/// One dispatch pass at time `now` (Unix seconds).
pub fn run(slurm: &dyn Slurm, now: f64, max_hold_s: u64) -> Result<Report> {
    let mut report = Report::default();
    let queue = slurm.kace_queue()?;
    let (held, in_flight): (Vec<&QueuedJob>, Vec<&QueuedJob>) =
        queue.iter().filter(|j| j.pending()).partition(|j| j.held());

    // Nothing waits forever: release what has waited too long, wherever it fits.
    let mut waiting = Vec::new();
    for j in held {
        // A job Slurm would not start yet (unmet dependency, --begin ahead) is neither a lead
        // nor released for max_hold: its hold counts from when it may start.
        if j.blocked(now).is_some() {
            continue;
        }
        let expired = j.hold_started().is_some_and(|s| now - s >= max_hold_s as f64);
        if !expired {
            waiting.push(j);
            continue;
        }
        match slurm.release(j.id) {
            Ok(()) => report.expired.push(j.id),
            Err(e) => {
                report.problems.push(format!("couldn't release job {} (held too long): {e}", j.id))
            }
        }
    }
    if waiting.is_empty() {
        return Ok(report);
    }

    // GPUs taken by kace jobs: (node, index).
    let mut taken: BTreeSet<(String, u32)> = BTreeSet::new();
    for r in slurm.running_kace_jobs()? {
        taken.extend(r.gpus.iter().map(|i| (r.node.clone(), *i)));
    }
    let nodes = slurm.nodes()?;
    // Released but not started yet: they will take a GPU of the node they were pinned to.
    let mut untyped_in_flight: Vec<String> = Vec::new();
    for j in in_flight.iter().filter(|j| !j.req_nodes.is_empty()) {
        let kind = crate::gres::request_kind(&j.tres_per_node, "shard");
        let node = nodes.iter().find(|n| n.name == j.req_nodes);
        match (kind, node) {
            (Some(k), Some(n)) => {
                if let Some(i) = n.gpus.iter().position(|g| g.as_deref() == Some(k.as_str())) {
                    taken.insert((n.name.clone(), i as u32));
                }
            }
            _ => untyped_in_flight.push(j.req_nodes.clone()),
        }
    }

    let mut free: Vec<(String, u32, Option<String>)> = Vec::new();
    for n in nodes.iter().filter(|n| n.usable) {
        let mut pending_here = untyped_in_flight.iter().filter(|x| **x == n.name).count();
        for (i, kind) in n.gpus.iter().enumerate() {
            if taken.contains(&(n.name.clone(), i as u32)) {
                continue;
            }
            if pending_here > 0 {
                pending_here -= 1;
                continue;
            }
            free.push((n.name.clone(), i as u32, kind.clone()));
        }
    }

    let mut leads = waiting.into_iter().filter(|j| j.shards().is_some());
    for (node, index, kind) in free {
        let Some(j) = leads.next() else { break };
        let target = Target { node: node.clone(), kind };
        let shards = j.shards().unwrap_or(1);
        match slurm.pin(j.id, &target, shards).and_then(|()| slurm.release(j.id)) {
            Ok(()) => report.leads.push((j.id, node, index)),
            Err(e) => report.problems.push(format!("couldn't release job {} as a lead: {e}", j.id)),
        }
    }
    Ok(report)
}
