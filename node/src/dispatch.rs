//! `kace dispatch`'s logic, on the controller (a watching loop, `EpilogSlurmctld=` and a
//! backstop timer; one pass at a time). One pass, in this order:
//! 1. jobs held longer than `max_hold` are placed where their group fits: a free GPU (they run
//!    alone), or an open GPU whose memory and job limit allow them; otherwise they stay held
//!    for the next free GPU, oldest first. Never onto a full GPU.
//! 2. held jobs are offered to OPEN GPUs (kace jobs below `selection.max_jobs_per_gpu`,
//!    nothing starting, ending or on its way there): the one decision chooses among them.
//! 3. the oldest held jobs are released as leads onto FREE GPUs (no kace job), one each.
//!
//! A GPU counts as taken by any kace job running, starting or completing on it (its
//! allocation says which GPU), and by a released kace job that has not started yet (pinned to
//! its node; to its GPU type when typed). A GPU whose kace job is starting or completing is
//! left to that job's prolog or epilog, which fills it under the GPU's lock. While such a hook
//! may be choosing (for [`crate::slurm::hook_window_s`] from its job's start or end) the pass
//! releases nothing; a job Slurm shows starting for longer is reported, not waited for. Every
//! release re-reads the job as held just before moving it.
//!
//! Every release is recorded in the decision spool ([`kace_sql::spool`], kinds
//! [`ReleaseKind::LateArrival`], [`ReleaseKind::MaxHold`] and [`ReleaseKind::LeadRelease`]):
//! which job went where, over which candidates, and how long it had been held.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use kace_config::Config;
use kace_log::Logger;
use kace_selector::decision::Policy;
use kace_sql::decide::{decide, JobSpec};
use kace_sql::spool::{release_key, write_decision, ReleaseKind, SpooledDecision};
use kace_sql::{DecisionCandidate, NewDecision};

use crate::error::{io, Result};
use crate::fill::{candidate_record, in_flight_to, GpuAt};
use crate::slurm::{Commands, QueuedJob, Slurm, Target};

/// How long one configured dispatch may take in all, so that a hanging Slurm command cannot
/// pile up timer runs.
pub const BUDGET: Duration = Duration::from_secs(60);

/// What a dispatch pass needs besides Slurm.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings<'a> {
    /// `dispatch.max_hold_s`.
    pub max_hold_s: u64,
    /// The decision's rules (`selection.*`, `mps.multi_user`).
    pub policy: Policy,
    /// The database (read-only), for decisions on open GPUs.
    pub database: &'a Path,
    /// GPU memory in GiB (`node.gpu_memory_gib`): the controller has no NVML of the nodes'
    /// GPUs, so without it no job is added to an open GPU by dispatch.
    pub gpu_memory_gib: Option<f64>,
    /// `selection.refill`: offer held jobs to open GPUs.
    pub fill_open: bool,
    /// `spool.dir`: where each release's record goes.
    pub spool: &'a Path,
    /// The cluster's name in the records' keys (`SLURM_CLUSTER_NAME` where Slurm sets it, as
    /// for the hooks; `cluster` otherwise).
    pub cluster: String,
    /// How long after its job's start or end a kace hook may still be choosing
    /// ([`crate::slurm::hook_window_s`]); dispatch waits for no hook longer.
    pub hook_window_s: f64,
}

impl<'a> Settings<'a> {
    /// The settings of `config`.
    pub fn of(config: &'a Config) -> Settings<'a> {
        Settings {
            max_hold_s: config.dispatch.max_hold_s,
            policy: config.policy(),
            database: &config.database.path,
            gpu_memory_gib: config.node.gpu_memory_gib,
            fill_open: config.selection.refill,
            spool: &config.spool.dir,
            cluster: std::env::var("SLURM_CLUSTER_NAME")
                .ok()
                .filter(|c| !c.is_empty())
                .unwrap_or_else(|| "cluster".into()),
            hook_window_s: crate::slurm::hook_window_s(&config.node),
        }
    }
}

/// One dispatch pass as configured (real Slurm commands), under the dispatch lock. `Ok(None)`
/// when another dispatch holds the lock: it does the work.
pub fn run_configured(config: &Config, now: f64, logger: &Logger) -> Result<Option<Report>> {
    let lock_path = &config.dispatch.lock;
    if let Some(dir) = lock_path.parent() {
        std::fs::create_dir_all(dir).map_err(io("create the directory of", lock_path))?;
    }
    let Some(_lock) = crate::state::try_lock_file(lock_path)? else { return Ok(None) };
    let slurm = Commands::configured(&config.node, Some(Instant::now() + BUDGET), logger.clone());
    run(&slurm, &Settings::of(config), now).map(Some)
}

/// What one dispatch pass did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Report {
    /// Jobs released as leads onto free GPUs: (job, node, GPU index).
    pub leads: Vec<(u32, String, u32)>,
    /// Jobs released to join open GPUs: (job, node, GPU index).
    pub joiners: Vec<(u32, String, u32)>,
    /// Jobs released because they were held longer than `max_hold`: (job, node, GPU index).
    pub expired: Vec<(u32, String, u32)>,
    /// Jobs held longer than `max_hold` that fit nowhere yet: they wait for a free GPU.
    pub waiting_expired: Vec<u32>,
    /// Whether kace jobs are still held after the pass (the watch loop then passes again
    /// within a second).
    pub still_held: bool,
    /// Why the pass released nothing, when it waited for a prolog or epilog that is choosing.
    pub deferred: Option<String>,
    /// Kace jobs Slurm shows starting or completing for longer than any kace hook runs:
    /// (job, seconds, "starting" or "completing"). Dispatch does not wait for them; a batch job
    /// whose slurmd restarted during its prolog stays so until an admin requeues it.
    pub stuck: Vec<(u32, f64, &'static str)>,
    /// Problems met (each already a full message); the pass went on past them.
    pub problems: Vec<String>,
    /// The release records spooled, in the order of the releases.
    pub records: Vec<SpooledDecision>,
}

impl Report {
    /// What the pass did, one line each (the same words in the CLI and `kace-dispatch`).
    pub fn lines(&self, max_hold_s: u64) -> Vec<String> {
        let mut out = Vec::new();
        for (job, n, g) in &self.expired {
            out.push(format!(
                "released job {job} onto {n} GPU {g}: held longer than {max_hold_s} s"
            ));
        }
        for (job, n, g) in &self.joiners {
            out.push(format!("released job {job} to join the kace jobs on {n} GPU {g}"));
        }
        for (job, n, g) in &self.leads {
            out.push(format!("released job {job} as a lead onto {n} GPU {g}"));
        }
        for job in &self.waiting_expired {
            out.push(format!(
                "job {job} is held longer than {max_hold_s} s but fits on no GPU now; it waits for a free one"
            ));
        }
        out
    }
}

impl Report {
    /// One line per job Slurm shows starting or completing for longer than a kace hook runs
    /// (in [`report_lines`]; the watching loop says each job once).
    pub fn stuck_lines(&self) -> Vec<String> {
        self.stuck
            .iter()
            .map(|(job, secs, what)| {
                format!(
                    "job {job} has been {what} for {secs:.0} s, longer than any kace prolog or \
                     epilog runs: not waiting for its hook; Slurm leaves a batch job whose slurmd \
                     restarted during its prolog so until it is requeued (scontrol requeue {job})"
                )
            })
            .collect()
    }
}

/// The log lines of one dispatch pass, one per event and problem, as `kace-dispatch` and
/// `kace dispatch` send them to the log.
pub fn report_lines(r: &Report, max_hold_s: u64) -> Vec<String> {
    r.lines(max_hold_s)
        .into_iter()
        .chain(r.stuck_lines())
        .chain(r.problems.iter().cloned())
        .map(|l| format!("kace: dispatch: {l}"))
        .collect()
}

/// A GPU as dispatch sees it.
#[derive(Debug, Clone)]
struct Slot {
    at: GpuAt,
    /// Kace jobs on it: (job, workload, user).
    jobs: Vec<(u32, String, String)>,
    /// A kace job on it is starting or completing: its prolog or epilog fills it.
    busy: bool,
    /// Released jobs on their way to it.
    coming: usize,
}

impl Slot {
    fn free(&self) -> bool {
        self.jobs.is_empty() && !self.busy && self.coming == 0
    }
    fn open(&self, limit: usize) -> bool {
        !self.jobs.is_empty() && self.jobs.len() < limit && !self.busy && self.coming == 0
    }
}

/// What the one decision said for one open GPU.
#[derive(Debug, Clone, Default)]
struct Chosen {
    /// Indices into the held jobs, best first.
    ranked: Vec<usize>,
    /// Every candidate with its prediction or reason (and hold).
    records: Vec<DecisionCandidate>,
    /// The model that predicted.
    model_version: Option<i64>,
}

/// One dispatch pass at time `now` (Unix seconds).
pub fn run(slurm: &dyn Slurm, s: &Settings<'_>, now: f64) -> Result<Report> {
    let mut report = Report::default();
    let queue = slurm.kace_queue()?;
    let window = s.hook_window_s;
    report.stuck = queue
        .iter()
        .filter(|j| j.stuck(now, window))
        .map(|j| {
            let what = if j.completing() { "completing" } else { "starting" };
            (j.id, j.in_hook_for(now).unwrap_or(0.0), what)
        })
        .collect();
    // A job Slurm would not start yet (unmet dependency, --begin ahead) is neither offered nor
    // released for max_hold: its hold counts from when it may start.
    let held: Vec<&QueuedJob> = queue
        .iter()
        .filter(|j| j.held() && j.shards().is_some() && j.blocked(now).is_none())
        .collect();
    if held.is_empty() {
        return Ok(report);
    }
    // A prolog or epilog choosing now sees the same held jobs; Slurm cannot claim one. Node-side
    // deciders split the queue among themselves, so dispatch waits for them (the watch loop
    // passes again within a second), but only as long as a hook can run: a job Slurm left
    // starting (its slurmd restarted during its prolog) must not hold every kace job.
    if let Some(j) = queue.iter().find(|j| j.deciding(now, window)) {
        report.deferred = Some(format!("kace job {} is starting or ending", j.id));
        report.still_held = true;
        return Ok(report);
    }
    let user_of: BTreeMap<u32, &str> = queue.iter().map(|j| (j.id, j.user.as_str())).collect();
    let starting: Vec<u32> = queue.iter().filter(|j| j.starting()).map(|j| j.id).collect();

    // Every GPU of every usable node, with its kace jobs.
    let nodes = slurm.nodes()?;
    let mut slots: Vec<Slot> = Vec::new();
    for n in nodes.iter().filter(|n| n.usable) {
        for (i, kind) in n.gpus.iter().enumerate() {
            slots.push(Slot {
                at: GpuAt {
                    node: n.name.clone(),
                    index: kace_layout::GpuIndex(i as u32),
                    kind: kind.clone(),
                },
                jobs: Vec::new(),
                busy: false,
                coming: 0,
            });
        }
    }
    let slot_of = |slots: &[Slot], node: &str, index: u32| {
        slots.iter().position(|x| x.at.node == node && x.at.index.0 == index)
    };
    // What each node ran at the listing: an open GPU is filled only if its node still runs the
    // same kace jobs in the same states just before the release (see `unchanged`).
    let mut seen: BTreeMap<String, Vec<(u32, String)>> = BTreeMap::new();
    let running = slurm.running_kace_jobs()?;
    for r in &running {
        seen.entry(r.node.clone()).or_default().push((r.id, r.state.clone()));
    }
    let workload_of: BTreeMap<u32, &str> =
        queue.iter().map(|j| (j.id, j.workload.as_str())).collect();
    for r in running {
        let settled = r.state == "R" && !starting.contains(&r.id);
        if !settled && r.gpus.is_empty() {
            // A starting or completing job's hook may be filling its GPU, and Slurm does not
            // say which GPU that is: its whole node is left alone this pass.
            for slot in slots.iter_mut().filter(|x| x.at.node == r.node) {
                slot.busy = true;
            }
            continue;
        }
        let workload = match r.workload.as_str() {
            "" => workload_of.get(&r.id).copied().unwrap_or("").to_string(),
            w => w.to_string(),
        };
        for &i in &r.gpus {
            let Some(k) = slot_of(&slots, &r.node, i) else { continue };
            let slot = &mut slots[k];
            if settled && !workload.is_empty() {
                let user = match r.user.as_str() {
                    "" => user_of.get(&r.id).copied().unwrap_or("").to_string(),
                    u => u.to_string(),
                };
                slot.jobs.push((r.id, workload.clone(), user));
            } else {
                // Starting or completing (its hook fills it), or not in the queue listing yet
                // (its workload unknown): left alone this pass.
                slot.busy = true;
            }
        }
    }
    for j in queue.iter().filter(|j| j.pending() && !j.held() && !j.req_nodes.is_empty()) {
        // An untyped pin may land on any GPU of its node: it counts against each.
        for slot in slots.iter_mut().filter(|x| in_flight_to(j, &x.at)) {
            slot.coming += 1;
        }
    }

    let limit = s.policy.max_jobs_per_gpu;
    // The database and the GPUs' memory matter only for GPUs that already run kace jobs.
    let any_open = slots.iter().any(|x| x.open(limit));
    let db = if any_open {
        match kace_sql::Db::open_read_only(s.database) {
            Ok(db) => Some(db),
            Err(e) => {
                report.problems.push(format!(
                    "couldn't open the database ({e}); no job is offered to an open GPU"
                ));
                None
            }
        }
    } else {
        None
    };
    if any_open && s.gpu_memory_gib.is_none() {
        report.problems.push(
            "couldn't check memory on the nodes' GPUs (node.gpu_memory_gib is not set); no job is offered to an open GPU"
                .into(),
        );
    }
    // The decision for one open GPU among `cands` (indices into `held`).
    let choose =
        |slot: &Slot, cands: &[usize], policy: &Policy| -> std::result::Result<Chosen, String> {
            let (Some(db), Some(mem)) = (db.as_ref(), s.gpu_memory_gib) else {
                return Ok(Chosen::default());
            };
            let running: Vec<JobSpec> = slot
                .jobs
                .iter()
                .map(|(_, w, u)| JobSpec {
                    workload: w.clone(),
                    user: Some(u.clone()).filter(|u| !u.is_empty()),
                })
                .collect();
            let specs: Vec<JobSpec> = cands
                .iter()
                .map(|&i| JobSpec {
                    workload: held[i].workload.clone(),
                    user: Some(held[i].user.clone()).filter(|u| !u.is_empty()),
                })
                .collect();
            let d =
                decide(db, &running, &specs, policy, Some(mem), None).map_err(|e| e.to_string())?;
            let records = cands
                .iter()
                .enumerate()
                .map(|(k, &i)| DecisionCandidate {
                    prediction: d.selection.verdicts.get(k).and_then(|v| v.prediction),
                    rejected: d.reason(k),
                    ..candidate_record(held[i], now)
                })
                .collect();
            Ok(Chosen {
                ranked: d.ranked.iter().map(|&k| cands[k]).collect(),
                records,
                model_version: Some(d.model_version),
            })
        };
    // The record of one release into `slot`; `chosen` is what the decision saw (an open GPU).
    let record = |report: &mut Report,
                  kind: ReleaseKind,
                  j: &QueuedJob,
                  slot: &Slot,
                  chosen: Option<&Chosen>| {
        let (lead_job, lead_workload) = match slot.jobs.first() {
            Some((id, w, _)) => (id.to_string(), w.clone()),
            None => (j.id.to_string(), j.workload.clone()),
        };
        let joined = !slot.jobs.is_empty();
        let d = SpooledDecision {
            key: release_key(kind, &s.cluster, &j.id.to_string(), &slot.at.node, now),
            created_at: now,
            decision: NewDecision {
                lead_job: Some(lead_job),
                lead_workload,
                chosen_workload: joined.then(|| j.workload.clone()),
                chosen_job: joined.then(|| j.id.to_string()),
                model_version: chosen.and_then(|c| c.model_version),
                candidates: match chosen {
                    Some(c) if !c.records.is_empty() => c.records.clone(),
                    _ => vec![candidate_record(j, now)],
                },
            },
        };
        match write_decision(s.spool, &d) {
            Ok(_) => report.records.push(d),
            Err(e) => {
                report.problems.push(format!("couldn't spool the release of job {}: {e}", j.id))
            }
        }
    };
    let mut taken: Vec<usize> = Vec::new(); // indices into `held` released this pass
                                            // Whether releasing into `slot` is still safe: no prolog or epilog is choosing anywhere
                                            // (they could pick the same job), and for an open GPU, its node runs the kace jobs it ran at
                                            // the listing and nothing is on its way to it (a hook there may have filled it since).
    let unchanged = |slot: &Slot| -> std::result::Result<bool, String> {
        let queue = slurm.kace_queue().map_err(|e| e.to_string())?;
        if queue.iter().any(|j| j.deciding(now, window)) {
            return Ok(false);
        }
        if slot.jobs.is_empty() {
            return Ok(true);
        }
        if queue.iter().any(|j| in_flight_to(j, &slot.at)) {
            return Ok(false);
        }
        let now_running = slurm.running_kace_jobs().map_err(|e| e.to_string())?;
        let mut here: Vec<(u32, String)> = now_running
            .into_iter()
            .filter(|r| r.node == slot.at.node)
            .map(|r| (r.id, r.state))
            .collect();
        here.sort();
        let mut before = seen.get(&slot.at.node).cloned().unwrap_or_default();
        before.sort();
        Ok(here == before)
    };
    let release = |report: &mut Report, j: &QueuedJob, slot: &Slot| -> bool {
        match unchanged(slot) {
            Ok(true) => {}
            Ok(false) => return false,
            Err(e) => {
                report.problems.push(format!(
                    "couldn't check {} GPU {} again: {e}",
                    slot.at.node, slot.at.index.0
                ));
                return false;
            }
        }
        // Another decider (a prolog or epilog) may have moved it since the listing.
        match slurm.job(j.id) {
            Ok(d) if d.held() => {}
            Ok(_) => return false,
            Err(e) => {
                report.problems.push(format!("couldn't check job {}: {e}", j.id));
                return false;
            }
        }
        let target = Target { node: slot.at.node.clone(), kind: slot.at.kind.clone() };
        let shards = j.shards().unwrap_or(1);
        match slurm.pin(j.id, &target, shards).and_then(|()| slurm.release(j.id)) {
            Ok(()) => true,
            Err(e) => {
                report.problems.push(format!("couldn't release job {}: {e}", j.id));
                false
            }
        }
    };

    // 1. Nothing waits forever, and nothing expired is crowded onto a full GPU.
    let expired: Vec<usize> = (0..held.len())
        .filter(|&i| held[i].hold_started().is_some_and(|t| now - t >= s.max_hold_s as f64))
        .collect();
    // Fitting is all that counts for a job that waited this long: no gain threshold.
    let fit_only = Policy {
        rules: kace_selector::SelectionRules {
            min_gain: f64::NEG_INFINITY,
            ..s.policy.rules.clone()
        },
        ..s.policy.clone()
    };
    for &i in &expired {
        let j = held[i];
        let place = match slots.iter().position(Slot::free) {
            Some(k) => Some((k, None)),
            None => slots
                .iter()
                .enumerate()
                .filter(|(_, x)| x.open(limit))
                .find_map(|(k, x)| match choose(x, &[i], &fit_only) {
                    Ok(c) if c.ranked == [i] => Some((k, c)),
                    _ => None,
                })
                .map(|(k, c)| (k, Some(c))),
        };
        let Some((k, chosen)) = place else {
            report.waiting_expired.push(j.id);
            continue;
        };
        if release(&mut report, j, &slots[k]) {
            record(&mut report, ReleaseKind::MaxHold, j, &slots[k], chosen.as_ref());
            report.expired.push((j.id, slots[k].at.node.clone(), slots[k].at.index.0));
            slots[k].coming += 1;
        }
        taken.push(i);
    }

    // 2. Open GPUs first: a GPU already running kace jobs gains most from a joiner.
    for slot in slots.iter_mut() {
        if !s.fill_open || !slot.open(limit) {
            continue;
        }
        let cands: Vec<usize> = (0..held.len()).filter(|i| !taken.contains(i)).collect();
        if cands.is_empty() {
            break;
        }
        let chosen = match choose(slot, &cands, &s.policy) {
            Ok(c) => c,
            Err(e) => {
                let at = &slot.at;
                report.problems.push(format!(
                    "couldn't choose a joiner for {} GPU {}: {e}",
                    at.node, at.index.0
                ));
                continue;
            }
        };
        for &i in chosen.ranked.iter().take(3) {
            taken.push(i);
            if release(&mut report, held[i], slot) {
                record(&mut report, ReleaseKind::LateArrival, held[i], slot, Some(&chosen));
                report.joiners.push((held[i].id, slot.at.node.clone(), slot.at.index.0));
                slot.coming += 1;
                break;
            }
        }
    }

    // 3. Leads onto free GPUs, oldest first (expired ones that still wait come first).
    let lead_order: Vec<usize> = (0..held.len()).filter(|i| !taken.contains(i)).collect();
    let mut leads = lead_order.into_iter();
    for slot in slots.iter_mut() {
        if !slot.free() {
            continue;
        }
        let Some(i) = leads.next() else { break };
        taken.push(i);
        if release(&mut report, held[i], slot) {
            record(&mut report, ReleaseKind::LeadRelease, held[i], slot, None);
            report.leads.push((held[i].id, slot.at.node.clone(), slot.at.index.0));
            slot.coming += 1;
            report.waiting_expired.retain(|j| *j != held[i].id);
        }
    }
    report.still_held =
        held.len() > report.leads.len() + report.joiners.len() + report.expired.len();
    Ok(report)
}
