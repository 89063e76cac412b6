//! What kace asks of Slurm, behind the [`Slurm`] trait: list pending kace jobs (one `squeue`),
//! read one job's allocation, pin a held job to a node and GPU, and release it. [`Commands`]
//! runs the real programs by absolute path with a timeout each; the parsers are pure and tested
//! on what Slurm 22.05, 25.11 and 26.05 print (`node/tests/fixtures/`).
//!
//! No free text a job's user writes is read. The pending-queue listing asks `squeue -O` only
//! for fields Slurm fills or checks (ids, the admin-only AdminComment, Slurm's own state,
//! reason, GRES, dependency, partition, reservation and time fields, and last the constraint,
//! which Slurm accepts only as the admin's feature names and operators) and reads each line
//! strictly: the field count, a numeric restart count and id, or the line is skipped and logged (a newline in one job's AdminComment must not
//! make the whole queue unreadable). Job details (state, allocation) come from JSON
//! ([`crate::slurm_json`]), never from `scontrol show job`, whose one-line text mixes user text
//! (`JobName=`, `Comment=`, and from 25.11 `SubmitLine=`) with the admin fields.

use kace_log::Logger;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::error::{short, Error, ExecError, Result};
use crate::exec::{self, Invocation};
use crate::gres;
pub use crate::gres::GresAlloc;
use crate::slurm_json;

/// `admin_comment` prefix the gate (job_submit.lua) gives kace jobs; only root can set it.
pub const MARK: &str = "kace:";

/// What follows the workload in a kace job's `AdminComment` once the decider paired it: the
/// jobs it shared its GPU with, for sacct and billing (issue 29 item 6).
const PARTNERS_TAG: &str = " shared=";

/// The most partners a job's `AdminComment` names: a long job refilled beside many short ones
/// names its first ones (the decision records keep every pairing).
pub const MAX_RECORDED_PARTNERS: usize = 32;

/// Reads the gate's mark, `kace:<workload>` and, once the decider paired the job,
/// ` shared=<job>,<job>…`: the workload (`None` without the mark or with an empty workload;
/// the gate's workload names hold no space) and the partners (ids that do not read as job ids
/// are left out; only root writes the field).
pub fn read_mark(admin_comment: &str) -> Option<(&str, Vec<u32>)> {
    let marked = admin_comment.strip_prefix(MARK)?;
    let (workload, partners) = match marked.split_once(PARTNERS_TAG) {
        Some((w, p)) => (w, p.split(',').filter_map(|id| id.trim().parse().ok()).collect()),
        None => (marked, Vec::new()),
    };
    (!workload.is_empty() && !workload.contains(' ')).then_some((workload, partners))
}

/// The `AdminComment` of a kace job of `workload` that shared its GPU with `partners` (in
/// order, each once, at most [`MAX_RECORDED_PARTNERS`]); [`read_mark`] reads it back.
pub fn write_mark(workload: &str, partners: &[u32]) -> String {
    let mut ids: Vec<u32> = Vec::new();
    for &p in partners {
        if !ids.contains(&p) && ids.len() < MAX_RECORDED_PARTNERS {
            ids.push(p);
        }
    }
    if ids.is_empty() {
        return format!("{MARK}{workload}");
    }
    let ids: Vec<String> = ids.iter().map(u32::to_string).collect();
    format!("{MARK}{workload}{PARTNERS_TAG}{}", ids.join(","))
}

/// The `squeue -O` format kace reads its jobs with: no field a user writes as free text. The
/// constraint (`Feature`) is the user's, but Slurm accepts only the admin's feature names and
/// the operators `&|,[]*()!` and digits; it comes last because `|` is one of them (see
/// [`parse_queue`]).
pub const QUEUE_FORMAT: &str = "JobID:|,admin_comment:|,UserName:|,Reason:|,tres-per-node:|,\
                                SubmitTime:|,ReqNodes:|,StateCompact:|,Dependency:|,EligibleTime:|,\
                                StartTime:|,EndTime:|,NodeList:|,Partition:|,Reservation:|,\
                                RestartCnt:|,TimeLimit:|,Account:|,QOS:|,Nice:|,Feature:|";

/// The number of fields in [`QUEUE_FORMAT`].
const QUEUE_FIELDS: usize = 21;

/// The `sinfo -N -O` format kace reads the nodes with: one line per node and partition.
pub const NODES_FORMAT: &str =
    "NodeList:|,PartitionName:|,Gres:|,StateLong:|,Features:|,Time:|,GresUsed:|";

/// The number of fields in [`NODES_FORMAT`].
const NODES_FIELDS: usize = 7;

/// How long past its budget (`node.prolog_budget_ms`) a kace prolog or epilog may still run:
/// slurmd launches the hook a moment after slurmctld allocates, and clocks differ a little.
pub const HOOK_LAUNCH_SLACK_S: f64 = 30.0;

/// A job Slurm shows starting (its prolog running) or completing for longer than this has no
/// hook making progress: a batch job whose slurmd restarted during its prolog stays so until
/// an admin requeues it. The decider says so and leaves its GPU alone; it waits for nothing.
pub fn stuck_after_s(node: &kace_config::Node) -> f64 {
    node.prolog_budget_ms as f64 / 1000.0 + HOOK_LAUNCH_SLACK_S
}

/// The reason Slurm gives a job held with priority 0 by its submitter's side: here always the
/// gate, which refuses a user's own `--hold` and `scontrol hold` on kace jobs. An admin's hold
/// is `JobHeldAdmin`, which kace never releases.
pub const GATE_HOLD_REASON: &str = "JobHeldUser";

/// The states kace lists: pending (candidates, released partners), starting (other leads
/// whose prolog runs now; Slurm shows them configuring, or running with reason `Prolog`) and
/// completing (their epilog may be refilling their GPU now).
pub const QUEUE_STATES: &str = "PD,CF,R,CG";

/// One kace job in the queue (pending or starting), as `squeue` shows it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QueuedJob {
    /// Job id.
    pub id: u32,
    /// The workload the gate recorded (`admin_comment=kace:<workload>`).
    pub workload: String,
    /// The jobs it shared its GPU with, as the decider recorded them in its `AdminComment`
    /// ([`read_mark`]).
    pub partners: Vec<u32>,
    /// The submitting user's name.
    pub user: String,
    /// Slurm's pending reason (`JobHeldUser`, `Resources`, …).
    pub reason: String,
    /// Its GRES request (`gres/shard:1`, `gres:shard:g1:1`, or empty).
    pub tres_per_node: String,
    /// Submission time, Unix seconds (`None` when unreadable).
    pub submitted: Option<f64>,
    /// Nodes it was pinned to (empty when none).
    pub req_nodes: String,
    /// Compact state: `PD`, `CF`, `R`.
    pub state: String,
    /// Its dependencies as Slurm prints them (`afterok:12(unfulfilled)`), empty when none.
    pub dependency: String,
    /// When it may start at the earliest (`--begin`), Unix seconds; `None` when Slurm gives
    /// none (a held job without `--begin`).
    pub eligible: Option<f64>,
    /// When it started (allocated; its prolog runs from then), Unix seconds; a pending job's
    /// is Slurm's forecast or `None`.
    pub started: Option<f64>,
    /// When it ended (its epilog runs from then), Unix seconds; before that Slurm prints its
    /// time limit or nothing.
    pub ended: Option<f64>,
    /// The node it runs on (starting, running or completing; empty while pending).
    pub node: String,
    /// The partitions it may run in, as Slurm lists them (`pa,pb`).
    pub partition: String,
    /// The reservation it asked for (empty when none).
    pub reservation: String,
    /// Its constraint (`--constraint`, Slurm's `Features`; empty when none).
    pub features: String,
    /// How often Slurm requeued it (preemption, node failure, `scontrol requeue`).
    pub restarts: u32,
    /// Its time limit, seconds; `None` when unlimited or unreadable.
    pub time_limit_s: Option<f64>,
    /// The account it is charged to (its association with `user`; empty when unknown).
    pub account: String,
    /// Its QOS (empty when none or unknown).
    pub qos: String,
    /// Its nice value (`--nice`; an admin's may be negative).
    pub nice: i64,
}

impl QueuedJob {
    /// Whether it is pending.
    pub fn pending(&self) -> bool {
        self.state == "PD"
    }

    /// Whether it is held by the gate, i.e. waiting for kace. An admin's hold (`JobHeldAdmin`)
    /// is not: kace never releases that.
    pub fn held(&self) -> bool {
        self.pending() && self.reason == GATE_HOLD_REASON
    }

    /// Why Slurm would not start it at `now` even once released: an unmet dependency or a
    /// `--begin` time still ahead. kace releases such a job neither as a lead nor as a partner
    /// (it would not start where it was put), nor for `max_hold` until it is free.
    pub fn blocked(&self, now: f64) -> Option<String> {
        if !dependency_met(&self.dependency) {
            return Some(format!("waits for its dependency ({})", self.dependency));
        }
        match self.eligible {
            Some(t) if t > now => {
                Some(format!("may not start for another {:.0} s (--begin)", t - now))
            }
            _ => None,
        }
    }

    /// When its time in kace's hold started counting: submission, or its `--begin` time.
    pub fn hold_started(&self) -> Option<f64> {
        match (self.submitted, self.eligible) {
            (Some(s), Some(e)) => Some(s.max(e)),
            (s, _) => s,
        }
    }

    /// Whether it is starting: allocated, its prolog not finished.
    pub fn starting(&self) -> bool {
        self.state == "CF" || (self.state == "R" && self.reason == "Prolog")
    }

    /// Whether it is completing: it is leaving its GPU.
    pub fn completing(&self) -> bool {
        self.state == "CG"
    }

    /// Whether it holds (or is about to hold) its GPU: starting or running.
    pub fn on_gpu(&self) -> bool {
        self.state == "CF" || self.state == "R"
    }

    /// How long it has been starting or completing at `now`, in seconds; `None` when it is
    /// neither, or Slurm gave no time.
    pub fn in_hook_for(&self, now: f64) -> Option<f64> {
        let since = if self.starting() {
            self.started
        } else if self.completing() {
            self.ended
        } else {
            None
        }?;
        Some((now - since).max(0.0))
    }

    /// Whether it has been starting or completing for longer than `window_s` at `now`.
    pub fn stuck(&self, now: f64, window_s: f64) -> bool {
        self.in_hook_for(now).is_some_and(|t| t > window_s)
    }

    /// The number of shards it asks for, when it asks for at least one. `shard:0` asks for no
    /// GPU at all: not a kace job to place (the re-audit's L3: dispatch "released" one onto a
    /// GPU, and counted that GPU taken for the pass).
    pub fn shards(&self) -> Option<u32> {
        gres::request_count(&self.tres_per_node, "shard").filter(|&n| n >= 1)
    }
}

/// Whether a dependency list as Slurm prints it is met: empty, or every `,` part (any `?` part)
/// `(fulfilled)`. Anything else (`unfulfilled`, `failed`, unreadable) is not.
pub fn dependency_met(dep: &str) -> bool {
    let dep = dep.trim();
    if dep.is_empty() || dep == "(null)" || dep == "N/A" {
        return true;
    }
    let done = |p: &str| p.trim().ends_with("(fulfilled)");
    if dep.contains('?') {
        dep.split('?').any(done)
    } else {
        dep.split(',').all(done)
    }
}

/// What Slurm says about one job (from its JSON record).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct JobDetail {
    /// Job id.
    pub id: u32,
    /// The base state (`PENDING`, `RUNNING`, …).
    pub state: String,
    /// The reason (`JobHeldUser` while held by the gate).
    pub reason: String,
    /// `AdminComment` (empty when unset).
    pub admin_comment: String,
    /// `NodeList`.
    pub nodes: String,
    /// The allocated GRES (running jobs only).
    pub gres: Vec<GresAlloc>,
    /// The owner's user name.
    pub user: String,
    /// Submitted, Unix seconds.
    pub submitted: Option<f64>,
    /// Started, Unix seconds (`None` until it has).
    pub started: Option<f64>,
    /// Ended, Unix seconds (`None` until it has).
    pub ended: Option<f64>,
}

impl JobDetail {
    /// Whether it is pending and held by the gate (waiting for kace).
    pub fn held(&self) -> bool {
        self.state == "PENDING" && self.reason == GATE_HOLD_REASON
    }

    /// The kace workload, when the gate marked this job.
    pub fn workload(&self) -> Option<&str> {
        read_mark(&self.admin_comment).map(|(w, _)| w)
    }

    /// The allocation on `gpu`: the shard (or gpu) entry whose indices include that GPU.
    pub fn on_gpu(&self, gpu: u32) -> Option<&GresAlloc> {
        self.gres.iter().find(|g| g.count > 0 && g.indices.contains(&gpu))
    }

    /// The one GPU its allocation is on (single-node jobs, as kace jobs are), `None` when it
    /// names none or several.
    pub fn single_gpu(&self) -> Option<u32> {
        let mut on = self.gres.iter().filter(|g| g.count > 0).flat_map(|g| g.indices.iter());
        let first = *on.next()?;
        on.all(|i| *i == first).then_some(first)
    }
}

/// A node and its GPUs, for `kace dispatch`.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeGpus {
    /// Node name.
    pub name: String,
    /// GPU types in index order (`None` entries when untyped).
    pub gpus: Vec<Option<String>>,
    /// The shards each of its GPUs has (the fewest, when they differ); 0 when it has none.
    pub shards_per_gpu: u32,
    /// Whether Slurm may start jobs there ([`state_takes_jobs`]).
    pub usable: bool,
    /// The partitions it is in.
    pub partitions: Vec<String>,
    /// Each partition's MaxTime, seconds (parallel to `partitions`; `None`: unlimited).
    pub max_time_s: Vec<Option<f64>>,
    /// Its available features (for `--constraint`).
    pub features: Vec<String>,
    /// The node-local indices of the GPUs some job holds GRES of (`GresUsed`), whoever's job:
    /// the decider leaves a GPU that no kace job accounts for to the job Slurm put there.
    pub busy_gpus: Vec<u32>,
}

/// A running, configuring or completing kace job.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RunningJob {
    /// Job id.
    pub id: u32,
    /// Its node.
    pub node: String,
    /// The node-local indices of the GPUs it holds shards (or GPUs) of.
    pub gpus: Vec<u32>,
    /// Compact state: `R`, `CF`, or `CG` (its epilog runs: it may be refilling its GPU).
    pub state: String,
    /// The owner's user name (for `kace status`).
    pub user: String,
    /// Its workload, from the gate's mark (for `kace status`).
    pub workload: String,
    /// When it started, Unix seconds (for `kace status`).
    pub started: Option<f64>,
}

/// Where to pin a job: a node and, on a node with typed GPUs, the type of the GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Node name.
    pub node: String,
    /// The GPU type, for `Gres=shard:<type>:<n>` (only typed GPUs can be chosen by Slurm).
    pub kind: Option<String>,
}

/// A held job's move onto the GPU a pass chose for it: pinned there and released, then the
/// time limits of the jobs already on the GPU lengthened for sharing, in that order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Move {
    /// The held job.
    pub job: u32,
    /// Where it goes.
    pub target: Target,
    /// The shards it asks for there.
    pub shards: u32,
    /// Its `AdminComment` in the pin's update ([`Slurm::pin`]).
    pub comment: Option<String>,
    /// Once it is released: (job, minutes, `AdminComment`) for [`Slurm::set_time_limit`],
    /// in order, stopping at the first that fails.
    pub then: Vec<(u32, u64, Option<String>)>,
}

/// How a [`Move`] went.
#[derive(Debug)]
pub struct Moved {
    /// The pin and the release.
    pub released: Result<()>,
    /// How many of [`Move::then`] were made.
    pub then_done: usize,
    /// Why the next of them failed, if one did.
    pub then_failed: Option<Error>,
}

/// Makes one move with `slurm`'s single commands: the pin, the release, then each of `then`.
pub fn move_one(slurm: &(impl Slurm + ?Sized), m: &Move) -> Moved {
    let released = slurm
        .pin(m.job, &m.target, m.shards, None, m.comment.as_deref())
        .and_then(|()| slurm.release(m.job));
    let mut moved = Moved { released, then_done: 0, then_failed: None };
    if moved.released.is_ok() {
        for (id, minutes, comment) in &m.then {
            if let Err(e) = slurm.set_time_limit(*id, *minutes, comment.as_deref()) {
                moved.then_failed = Some(e);
                break;
            }
            moved.then_done += 1;
        }
    }
    moved
}

/// How many moves [`Commands`] makes at once: each is a few short-lived `scontrol` processes
/// that mostly wait (for their start, for slurmctld); a pass releasing many jobs no longer
/// waits for each in turn, and slurmctld sees at most this many of kace's requests at a time.
pub const MOVES_AT_ONCE: usize = 4;

/// `f` of each item, up to `workers` at a time, in the items' order: `None` for an item whose
/// worker stopped (panicked) before saying. Without a thread to start, this thread does all.
fn at_once<T: Sync, R: Send>(
    items: &[T],
    workers: usize,
    f: impl Fn(&T) -> R + Sync,
) -> Vec<Option<R>> {
    // Workers take the next item in turn; each result goes to its item's place.
    let next = std::sync::atomic::AtomicUsize::new(0);
    let work = || {
        let mut done = Vec::new();
        loop {
            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let Some(item) = items.get(i) else { break done };
            done.push((i, f(item)));
        }
    };
    let mut results: Vec<Option<R>> = items.iter().map(|_| None).collect();
    std::thread::scope(|scope| {
        let started: Vec<_> = (0..workers.min(items.len()))
            .filter_map(|_| std::thread::Builder::new().spawn_scoped(scope, work).ok())
            .collect();
        let mine = if started.is_empty() { work() } else { Vec::new() };
        for (i, r) in started.into_iter().filter_map(|w| w.join().ok()).flatten().chain(mine) {
            if let Some(slot) = results.get_mut(i) {
                *slot = Some(r);
            }
        }
    });
    results
}

/// What kace needs from Slurm. Every method is one Slurm command, except [`Slurm::pin`] (a
/// read and one or two updates) and [`Slurm::moves`]; [`Commands`] counts them by [`CommandKind`], whose
/// [`CommandKind::rpcs`] says what each costs slurmctld.
pub trait Slurm {
    /// The pass's one listing (one `squeue -O` of every job pending, starting, running or
    /// completing): the kace jobs, oldest first, and what counts against the site's limits.
    fn listing(&self) -> Result<Listing>;
    /// Every kace job pending, starting, running or completing, oldest first (the listing's).
    fn kace_queue(&self) -> Result<Vec<QueuedJob>> {
        self.listing().map(|l| l.kace)
    }
    /// One kace job as the listing shows it, in any state (`squeue -j ID`, which loads that
    /// job only); `None` when Slurm lists it no longer or it bears no gate's mark.
    fn queued(&self, id: u32) -> Result<Option<QueuedJob>>;
    /// One job's details and allocation (JSON; on Slurm 22.05 `squeue --json`, which loads and
    /// prints the whole queue: only for rare paths, never per job of a pass).
    fn job(&self, id: u32) -> Result<JobDetail>;
    /// The node-local indices of the GPUs a starting or running job's allocation holds on
    /// `node`, read for that job only (`scontrol --json show job ID`; on 22.05 the strict
    /// [`detail_gpus`] reading of `scontrol -o -d show job ID`).
    fn job_gpus(&self, id: u32, node: &str) -> Result<Vec<u32>>;
    /// Pins a held job to `target`, asking for `shards` shards of its GPU when typed.
    /// `ours` is the node kace itself pinned the job to before (a pass that ended between
    /// the pin and the release); any other pin is someone else's and is left alone.
    /// `comment`, when given, becomes its `AdminComment` in the same update ([`write_mark`]:
    /// the jobs it joins on that GPU, for sacct and billing).
    fn pin(
        &self,
        id: u32,
        target: &Target,
        shards: u32,
        ours: Option<&str>,
        comment: Option<&str>,
    ) -> Result<()>;
    /// Releases a held job.
    fn release(&self, id: u32) -> Result<()>;
    /// Makes `moves` (different jobs'; each one's steps in order, [`move_one`]), their
    /// outcomes in the same order. Made one after another unless the backend says otherwise
    /// ([`Commands`] makes up to [`MOVES_AT_ONCE`] at once).
    fn moves(&self, moves: &[Move]) -> Vec<Moved> {
        moves.iter().map(|m| move_one(self, m)).collect()
    }
    /// Hands a held job back to Slurm: asks for `shards` shards of one GPU (of the type it
    /// asks for, if any; a whole GPU's, so that wherever Slurm starts it no kace job is crowded
    /// beside it; a job asking for no shard keeps its request) and releases it, unpinned. Like [`Slurm::pin`], it re-reads the job first and
    /// leaves it alone unless it is still held.
    fn hand_back(&self, id: u32, shards: u32) -> Result<()>;
    /// Holds a released kace job again with the gate's kind of hold (`scontrol uhold`, which
    /// kace releases; an admin's `hold` it never does) and clears kace's pin.
    fn hold_again(&self, id: u32) -> Result<()>;
    /// Sets a job's time limit (whole minutes; root may lengthen a running job's), and with
    /// `comment` its `AdminComment` in the same update. slurmctld sends the comment to
    /// slurmdbd at the job's end, so `sacct -o AdminComment` shows it; only root (and
    /// SlurmUser) can set the field.
    fn set_time_limit(&self, id: u32, minutes: u64, comment: Option<&str>) -> Result<()>;
    /// Whether `node`'s slurmd (on this host) runs a step of job `id` now: `scontrol listpids
    /// ID NODE`, which asks that node's slurmstepd over its local socket, not slurmctld (no RPC).
    /// `false` also when the job has no step yet (its prolog runs) or no process left.
    fn steps_here(&self, id: u32, node: &str) -> Result<bool>;
    /// The cluster's nodes and their GPUs (one `sinfo`).
    fn nodes(&self) -> Result<Vec<NodeGpus>>;
    /// What [`crate::priority::estimate`] needs: the multifactor weights (`scontrol show
    /// config`), and when they count, the associations' fair-share factors (`sshare`), the
    /// QOS priorities (`sacctmgr`, which asks slurmdbd) and the partitions' priority factors
    /// (`scontrol show partition`).
    fn priority_inputs(&self) -> Result<crate::priority::PriorityInputs>;
    /// The QOS and association limits slurmctld enforces ([`crate::limits`]): whether it
    /// does (`scontrol show config`), and then the limits (`sacctmgr show qos` and `show
    /// assoc` of this cluster, which ask slurmdbd).
    fn site_limits(&self) -> Result<crate::limits::Limits>;
}

/// The kinds of Slurm commands kace runs, as [`Commands`] counts them (`kace metrics`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum CommandKind {
    /// `squeue -O` of every kace job (a pass's listing).
    List,
    /// `squeue -j ID` or `scontrol show job ID`: one job.
    Job,
    /// `squeue --json` without `-j` support (22.05): the whole queue.
    WholeQueue,
    /// `sinfo`.
    Nodes,
    /// `scontrol update` of a job's request, not its nodes.
    Update,
    /// `scontrol update` naming the job's nodes (`NodeList=`): scontrol reads the job first.
    UpdateNodes,
    /// `scontrol release`.
    Release,
    /// `scontrol uhold`.
    Hold,
    /// `scontrol listpids`: asks a node's slurmstepd, not slurmctld.
    Steps,
    /// `scontrol show config`: the priority weights.
    Config,
    /// `sshare`: the associations' fair-share factors.
    Shares,
    /// `scontrol show partition`: the partitions' priority factors.
    Partitions,
    /// `sacctmgr show qos`: asks slurmdbd, not slurmctld.
    Qos,
    /// `sacctmgr show assoc`: asks slurmdbd, not slurmctld.
    Assocs,
}

impl CommandKind {
    /// Every kind, in the order metrics list them.
    pub const ALL: [CommandKind; 14] = [
        CommandKind::List,
        CommandKind::Job,
        CommandKind::WholeQueue,
        CommandKind::Nodes,
        CommandKind::Update,
        CommandKind::UpdateNodes,
        CommandKind::Release,
        CommandKind::Hold,
        CommandKind::Steps,
        CommandKind::Config,
        CommandKind::Shares,
        CommandKind::Partitions,
        CommandKind::Qos,
        CommandKind::Assocs,
    ];

    /// Its name in metrics and state files.
    pub fn name(self) -> &'static str {
        match self {
            CommandKind::List => "list",
            CommandKind::Job => "job",
            CommandKind::WholeQueue => "whole_queue",
            CommandKind::Nodes => "nodes",
            CommandKind::Update => "update",
            CommandKind::UpdateNodes => "update_nodes",
            CommandKind::Release => "release",
            CommandKind::Hold => "hold",
            CommandKind::Steps => "steps",
            CommandKind::Config => "config",
            CommandKind::Shares => "shares",
            CommandKind::Partitions => "partitions",
            CommandKind::Qos => "qos",
            CommandKind::Assocs => "assocs",
        }
    }

    /// slurmctld RPCs one such command makes, at most (with `--local`, none asks for the
    /// federation): `squeue` loads the partitions beside the jobs (src/squeue/print.c,
    /// `_part_state_load`), `scontrol -d show job` the nodes, `sinfo` nodes and partitions,
    /// an update naming nodes the job, with the federation whatever `--local` says
    /// (src/scontrol/update_job.c: `NodeList` sets `update_size`, and `_is_single_job` loads
    /// the job with SHOW_ALL);
    /// `scontrol listpids` asks slurmstepd only, `sacctmgr` slurmdbd only; `scontrol show
    /// config` pings the controller besides (to print its state). Checked against sdiag by
    /// tests/tests/slurm_output.rs on each supported Slurm.
    pub fn rpcs(self) -> u64 {
        match self {
            CommandKind::List | CommandKind::Job | CommandKind::WholeQueue | CommandKind::Nodes => {
                2
            }
            CommandKind::UpdateNodes => 3,
            CommandKind::Update
            | CommandKind::Release
            | CommandKind::Hold
            | CommandKind::Shares
            | CommandKind::Partitions => 1,
            CommandKind::Config => 2,
            CommandKind::Steps | CommandKind::Qos | CommandKind::Assocs => 0,
        }
    }
}

/// How many commands of each kind ran (shared by clones of one [`Commands`]).
#[derive(Debug, Clone, Default)]
pub struct CommandCounts(std::sync::Arc<std::sync::Mutex<BTreeMap<CommandKind, u64>>>);

impl CommandCounts {
    fn add(&self, kind: CommandKind) {
        if let Ok(mut m) = self.0.lock() {
            *m.entry(kind).or_default() += 1;
        }
    }

    /// The counts so far, by kind (kinds never run are absent).
    pub fn snapshot(&self) -> BTreeMap<CommandKind, u64> {
        self.0.lock().map(|m| m.clone()).unwrap_or_default()
    }
}

/// The real Slurm commands, each with its own timeout and all within an optional deadline.
#[derive(Debug, Clone)]
pub struct Commands {
    /// `scontrol`.
    pub scontrol: PathBuf,
    /// `squeue`.
    pub squeue: PathBuf,
    /// `sinfo`.
    pub sinfo: PathBuf,
    /// Per-command timeout.
    pub timeout: Duration,
    /// No command starts after this, and none runs past it.
    pub deadline: Option<Instant>,
    /// Where skipped queue lines and unreadable job records are said.
    pub logger: Logger,
    /// The commands run, by kind.
    pub counts: CommandCounts,
}

impl Commands {
    /// The commands `[node]` names, each call within its `command_timeout_ms`, all of them
    /// before `deadline`; what they skip is logged to `logger`.
    pub fn configured(
        node: &kace_config::Node,
        deadline: Option<Instant>,
        logger: Logger,
    ) -> Commands {
        Commands {
            scontrol: node.scontrol.clone(),
            squeue: node.squeue.clone(),
            sinfo: node.sinfo.clone(),
            timeout: Duration::from_millis(node.command_timeout_ms),
            deadline,
            logger,
            counts: CommandCounts::default(),
        }
    }

    fn call(&self, kind: CommandKind, program: &std::path::Path, args: &[&str]) -> Result<String> {
        let (inv, timeout) = self.invocation(kind, program, args)?;
        Ok(exec::run_ok(&inv, timeout)?)
    }

    /// The invocation of `program` with `args`, counted as `kind`, and its timeout.
    fn invocation(
        &self,
        kind: CommandKind,
        program: &std::path::Path,
        args: &[&str],
    ) -> Result<(Invocation, Duration)> {
        self.counts.add(kind);
        let mut timeout = self.timeout;
        if let Some(d) = self.deadline {
            let left = d.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Budget {
                    step: format!("{} {}", program.display(), args.join(" ")),
                });
            }
            timeout = timeout.min(left);
        }
        // UTC and Slurm's standard time format, whatever the caller's environment says, so
        // that times parse without a time-zone database.
        let inv = Invocation::new(program, args.iter().copied())
            .env("TZ", "UTC")
            .env("SLURM_TIME_FORMAT", "standard");
        Ok((inv, timeout))
    }

    /// The readable job records of a JSON document `program` printed; unreadable ones are
    /// logged.
    fn read_json_jobs(&self, out: &str, program: &str) -> Result<Vec<slurm_json::JsonJob>> {
        let (jobs, skipped) = slurm_json::jobs(out)?;
        if skipped > 0 {
            self.logger.line(&format!(
                "kace: slurm: couldn't read {skipped} job record(s) of {program} --json; skipped them"
            ));
        }
        Ok(jobs)
    }

    /// `scontrol --local ARGS`: without `--local`, scontrol asks slurmctld for the federation
    /// first where it reads a job (REQUEST_FED_INFO; 22.05's `update` of a job's GRES does).
    fn scontrol(&self, kind: CommandKind, args: &[&str]) -> Result<String> {
        let mut full = vec!["--local"];
        full.extend_from_slice(args);
        self.call(kind, &self.scontrol, &full)
    }

    /// `squeue --json` with `args`, every readable record. Slurm 22.05 ignores `-j` and `-t`
    /// with `--json` and prints the whole queue, so callers filter what comes back themselves.
    fn json_jobs(&self, args: &[&str]) -> Result<Vec<slurm_json::JsonJob>> {
        let mut full = vec!["--local", "--json"];
        full.extend_from_slice(args);
        let out = self.call(CommandKind::WholeQueue, &self.squeue, &full)?;
        self.read_json_jobs(&out, "squeue")
    }

    /// `scontrol --json show job ID` (23.02 on): that one job's records (none once slurmctld
    /// has forgotten it); `None` when this scontrol has no `--json` (22.05), learnt once per
    /// process.
    fn scontrol_json_job(&self, id: u32) -> Result<Option<Vec<slurm_json::JsonJob>>> {
        if SCONTROL_JSON.get() == Some(&false) {
            return Ok(None);
        }
        let id_text = id.to_string();
        let args = ["--local", "--json", "show", "job", &id_text];
        let (inv, timeout) = self.invocation(CommandKind::Job, &self.scontrol, &args)?;
        let out = match exec::run(&inv, timeout) {
            // An scontrol that cannot be started says nothing of its options: squeue reads
            // the job instead (the prolog's mark must not depend on scontrol).
            Err(ExecError::Spawn { .. }) => return Ok(None),
            r => r?,
        };
        if out.success() {
            let _ = SCONTROL_JSON.set(true);
            return Ok(Some(self.read_json_jobs(&out.stdout, "scontrol")?));
        }
        // Moves made at once may each meet the refusal before one of them has noted it.
        if SCONTROL_JSON.get() != Some(&true) && out.stderr.contains("unrecognized option") {
            let _ = SCONTROL_JSON.set(false);
            return Ok(None);
        }
        // A job slurmctld no longer has: scontrol prints the document, with the error in its
        // `errors`, and exits 1 (src/scontrol/info_job.c, scontrol_print_job).
        if out.stdout.contains("Invalid job id specified") {
            return Ok(Some(Vec::new()));
        }
        Err(Error::Exec(ExecError::Failed {
            command: inv.shown(),
            code: out.code,
            stderr: out.stderr.trim().chars().take(500).collect(),
        }))
    }
}

impl Slurm for Commands {
    fn listing(&self) -> Result<Listing> {
        // `--local` everywhere: without it each squeue and scontrol first asks slurmctld for
        // the federation (an RPC per command, REQUEST_FED_INFO in sdiag); kace places only
        // this cluster's jobs.
        let args = ["--local", "-h", "-t", QUEUE_STATES, "-O", QUEUE_FORMAT];
        let out = self.call(CommandKind::List, &self.squeue, &args)?;
        let listing = parse_listing(&out);
        for line in &listing.unreadable {
            self.logger.line(&format!(
                "kace: slurm: couldn't read a line of squeue's queue listing, skipped it: {line:?}"
            ));
        }
        Ok(listing)
    }

    fn queued(&self, id: u32) -> Result<Option<QueuedJob>> {
        // `scontrol --json show job ID` (23.02 on) is one RPC; `squeue -j` loads the
        // partitions too.
        if let Some(jobs) = self.scontrol_json_job(id)? {
            return Ok(jobs.into_iter().find(|j| j.id == id).and_then(queued_from_json));
        }
        let id_text = id.to_string();
        let args = ["--local", "-h", "-j", &id_text, "-t", "all", "-O", QUEUE_FORMAT];
        let out = self.call(CommandKind::Job, &self.squeue, &args)?;
        let (jobs, _) = parse_queue(&out);
        Ok(jobs.into_iter().find(|j| j.id == id))
    }

    fn job_gpus(&self, id: u32, node: &str) -> Result<Vec<u32>> {
        if let Some(jobs) = self.scontrol_json_job(id)? {
            let j = jobs.into_iter().find(|j| j.id == id).ok_or_else(|| Error::Parse {
                what: format!("job {id} from scontrol's JSON"),
                text: "it is not listed".into(),
            })?;
            if j.nodes != node {
                return Err(Error::Parse {
                    what: format!("job {id}'s allocation"),
                    text: format!("it runs on {:?}, not {node}", j.nodes),
                });
            }
            return Ok(j.gpus());
        }
        let out = self.scontrol(CommandKind::Job, &["-o", "-d", "show", "job", &id.to_string()])?;
        detail_gpus(&out, node)
    }

    fn job(&self, id: u32) -> Result<JobDetail> {
        // `scontrol --json show job ID` (23.02 on) loads that one job; `squeue --json -j ID`
        // loads the whole queue (22.05 even prints it all).
        let jobs = match self.scontrol_json_job(id)? {
            Some(jobs) => jobs,
            None => self.json_jobs(&["-j", &id.to_string()])?,
        };
        let j = jobs.into_iter().find(|j| j.id == id).ok_or_else(|| Error::Parse {
            what: format!("job {id} from Slurm's JSON"),
            text: "it is not listed".into(),
        })?;
        Ok(JobDetail {
            id: j.id,
            state: j.state,
            reason: j.reason,
            admin_comment: j.admin_comment,
            nodes: j.nodes,
            gres: j.gres,
            user: j.user,
            submitted: j.submitted,
            started: j.started,
            ended: j.ended,
        })
    }

    fn pin(
        &self,
        id: u32,
        target: &Target,
        shards: u32,
        ours: Option<&str>,
        comment: Option<&str>,
    ) -> Result<()> {
        let job = format!("jobid={id}");
        let nodes = format!("NodeList={}", target.node);
        let comment = comment.map(|c| format!("AdminComment={c}"));
        // The update naming the node carries the comment: no RPC of its own.
        let naming = |gres: Option<&str>| -> Vec<String> {
            let mut v = vec!["update".to_string(), job.clone()];
            v.extend(gres.map(str::to_string));
            v.push(nodes.clone());
            v.extend(comment.clone());
            v
        };
        // Only the decider moves jobs, but an admin (or the job's user, cancelling it) may have
        // changed it since the pass's listing, and Slurm has no compare-and-set: the job is read
        // again (that job only) just before the first change and left alone unless it is still
        // held and pinned by nobody but kace. Changing a request someone had already typed
        // (cleared, then set) left the job pending for ever on Slurm 22.05, and crashed its
        // scheduler (a divide error) when the job had been released meanwhile: found by
        // tests/tests/load.rs when several deciders raced, kept by tests/tests/retarget.rs.
        let taken = |why: String| Error::Taken { job: id, why };
        let Some(now) = self.queued(id)? else {
            return Err(taken("Slurm lists it no longer".into()));
        };
        if !now.held() {
            return Err(taken(format!("it is no longer held ({} {})", now.state, now.reason)));
        }
        if !now.req_nodes.is_empty()
            && now.req_nodes != target.node
            && Some(now.req_nodes.as_str()) != ours
        {
            return Err(taken(format!("it is pinned to {} already", now.req_nodes)));
        }
        let asked = gres::request_kind(&now.tres_per_node, "shard");
        match (&target.kind, asked) {
            (Some(kind), Some(asked)) if *kind != asked => {
                return Err(taken(format!("it asks for GPU type {asked} already")));
            }
            // Typed already (by its user): only the node changes.
            (Some(_), Some(_)) | (None, _) => {
                let args = naming(None);
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                self.scontrol(CommandKind::UpdateNodes, &args)?;
            }
            // Slurm up to 25.05 refuses a direct untyped→typed GRES change; clearing
            // TresPerNode first works on every release (shared/reference/slurm-lab-2.md §2).
            // The direct change is tried first: where Slurm takes it, the request is never
            // empty, which is when a release by a decider racing this one (between the read
            // above and the clear) crashes 22.05's scheduler.
            // Whether this Slurm takes it is learnt once per process (the decider is one
            // long-lived process): where it does not, trying each time cost an RPC per job.
            (Some(kind), None) => {
                let gres = format!("Gres=shard:{kind}:{shards}");
                let args = naming(Some(&gres));
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                let direct = DIRECT_TYPED_CHANGE.get() != Some(&false)
                    && self.scontrol(CommandKind::UpdateNodes, &args).is_ok();
                if direct {
                    let _ = DIRECT_TYPED_CHANGE.set(true);
                } else {
                    self.scontrol(CommandKind::Update, &["update", &job, "TresPerNode="])?;
                    self.scontrol(CommandKind::UpdateNodes, &args)?;
                    if DIRECT_TYPED_CHANGE.get().is_none() {
                        let _ = DIRECT_TYPED_CHANGE.set(false);
                    }
                }
            }
        }
        Ok(())
    }

    fn release(&self, id: u32) -> Result<()> {
        self.scontrol(CommandKind::Release, &["release", &id.to_string()]).map(drop)
    }

    fn moves(&self, moves: &[Move]) -> Vec<Moved> {
        if moves.len() < 2 {
            return moves.iter().map(|m| move_one(self, m)).collect();
        }
        let outcomes = at_once(moves, MOVES_AT_ONCE, |m| move_one(self, m));
        outcomes
            .into_iter()
            .zip(moves)
            .map(|(o, m)| {
                o.unwrap_or_else(|| Moved {
                    released: Err(Error::NoOutcome { job: m.job }),
                    then_done: 0,
                    then_failed: None,
                })
            })
            .collect()
    }

    fn hand_back(&self, id: u32, shards: u32) -> Result<()> {
        let taken = |why: String| Error::Taken { job: id, why };
        let Some(now) = self.queued(id)? else {
            return Err(taken("Slurm lists it no longer".into()));
        };
        if !now.held() {
            return Err(taken(format!("it is no longer held ({} {})", now.state, now.reason)));
        }
        let job = format!("jobid={id}");
        // The same typed-ness as before: Slurm up to 25.05 refuses a change between an untyped
        // and a typed request (shared/reference/slurm-lab-2.md §2).
        let gres = match gres::request_kind(&now.tres_per_node, "shard") {
            Some(kind) => format!("Gres=shard:{kind}:{shards}"),
            None => format!("Gres=shard:{shards}"),
        };
        // A job that asks for no shard (its user removed it) cannot be crowded onto a GPU.
        if now.shards().is_some_and(|n| n != shards) {
            self.scontrol(CommandKind::Update, &["update", &job, &gres])?;
        }
        self.release(id)
    }

    fn set_time_limit(&self, id: u32, minutes: u64, comment: Option<&str>) -> Result<()> {
        let job = format!("jobid={id}");
        let limit = format!("TimeLimit={minutes}");
        let comment = comment.map(|c| format!("AdminComment={c}"));
        let mut args = vec!["update", &job, &limit];
        args.extend(comment.as_deref());
        self.scontrol(CommandKind::Update, &args).map(drop)
    }

    fn hold_again(&self, id: u32) -> Result<()> {
        let id_text = id.to_string();
        self.scontrol(CommandKind::Hold, &["uhold", &id_text])?;
        let job = format!("jobid={id}");
        self.scontrol(CommandKind::UpdateNodes, &["update", &job, "NodeList="]).map(drop)
    }

    fn steps_here(&self, id: u32, node: &str) -> Result<bool> {
        // scontrol's listpids (src/scontrol/info_job.c, scontrol_list_pids) lists the steps in
        // the node's SlurmdSpoolDir (stepd_available) and prints "PID JOBID STEPID LOCALID
        // GLOBALID" for each live process of each step it can connect to; it exits 1 when the
        // job has no step there.
        let id_text = id.to_string();
        let (inv, timeout) =
            self.invocation(CommandKind::Steps, &self.scontrol, &["listpids", &id_text, node])?;
        let out = exec::run(&inv, timeout)?;
        Ok(out.success()
            && out.stdout.lines().any(|l| l.split_whitespace().nth(1) == Some(id_text.as_str())))
    }

    fn nodes(&self) -> Result<Vec<NodeGpus>> {
        let args = ["-h", "-N", "-O", NODES_FORMAT];
        let out = self.call(CommandKind::Nodes, &self.sinfo, &args)?;
        Ok(parse_nodes(&out))
    }

    fn priority_inputs(&self) -> Result<crate::priority::PriorityInputs> {
        use crate::priority;
        let config = self.scontrol(CommandKind::Config, &["show", "config"])?;
        let mut inputs = priority::PriorityInputs {
            weights: priority::parse_config(&config),
            ..Default::default()
        };
        let Some(w) = inputs.weights.clone() else { return Ok(inputs) };
        // sshare and sacctmgr sit beside scontrol (one Slurm install).
        let beside = |name: &str| self.scontrol.with_file_name(name);
        if w.fairshare > 0.0 {
            let args = ["-n", "-P", "-a", "-o", "Account,User,FairShare"];
            let out = self.call(CommandKind::Shares, &beside("sshare"), &args)?;
            inputs.fairshare = priority::parse_shares(&out);
        }
        if w.qos > 0.0 {
            let args = ["-n", "-P", "show", "qos", "format=Name,Priority"];
            let out = self.call(CommandKind::Qos, &beside("sacctmgr"), &args)?;
            inputs.qos = priority::parse_named_values(&out);
        }
        if w.partition > 0.0 {
            let out = self.scontrol(CommandKind::Partitions, &["-o", "show", "partition"])?;
            inputs.partitions = priority::parse_partitions(&out);
        }
        Ok(inputs)
    }

    fn site_limits(&self) -> Result<crate::limits::Limits> {
        use crate::limits;
        let config = self.scontrol(CommandKind::Config, &["show", "config"])?;
        let config = crate::doctor::parse_show_config(&config);
        let mut out = limits::Limits { enforced: limits::enforced(&config), ..Default::default() };
        if !out.enforced {
            return Ok(out);
        }
        let cluster = config.get("ClusterName").cloned().unwrap_or_default();
        let sacctmgr = self.scontrol.with_file_name("sacctmgr");
        let args = ["-n", "-P", "show", "qos", "format=Name,MaxJobsPU,GrpJobs,MaxTRESPU,GrpTRES"];
        out.qos = limits::parse_qos(&self.call(CommandKind::Qos, &sacctmgr, &args)?);
        let where_cluster = format!("cluster={cluster}");
        let args = [
            "-n",
            "-P",
            "show",
            "assoc",
            "where",
            &where_cluster,
            "format=Account,User,Partition,MaxJobs,GrpJobs,GrpTRES",
        ];
        out.assocs = limits::parse_assocs(&self.call(CommandKind::Assocs, &sacctmgr, &args)?);
        Ok(out)
    }
}

/// Whether this process's slurmctld takes a direct untyped→typed GRES change of a held job (Slurm
/// 25.11 on; 22.05 refuses it), once a change was tried and the two-step one then worked.
static DIRECT_TYPED_CHANGE: OnceLock<bool> = OnceLock::new();

/// Whether this process's `scontrol` takes `--json` (Slurm 23.02 on; 22.05 says "unrecognized
/// option"), once known.
static SCONTROL_JSON: OnceLock<bool> = OnceLock::new();

/// The fields of one `-O` line whose every field ends in `|`: exactly `n` of them, or `None`.
fn strict_fields(line: &str, n: usize) -> Option<Vec<&str>> {
    let body = line.strip_suffix('|')?;
    let f: Vec<&str> = body.split('|').map(str::trim).collect();
    (f.len() == n).then_some(f)
}

/// Parses `squeue -h -O` [`QUEUE_FORMAT`] output: kace jobs, oldest first, and the lines that
/// could not be read (wrong field count or id; e.g. the pieces of a job whose AdminComment
/// holds a newline). Jobs that are not kace's are left out silently.
pub fn parse_queue(out: &str) -> (Vec<QueuedJob>, Vec<String>) {
    let listing = parse_listing(out);
    (listing.kace, listing.unreadable)
}

/// A pass's listing: the kace jobs, and every job that counts against the site's limits.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Listing {
    /// The kace jobs, oldest first.
    pub kace: Vec<QueuedJob>,
    /// Every job, kace's or not, that counts against QOS and association limits: running or
    /// starting, and kace jobs released and not started yet ([`crate::limits`]).
    pub counted: Vec<crate::limits::Counted>,
    /// Lines that could not be read.
    pub unreadable: Vec<String>,
}

/// What a job holds against limits, from its listing fields.
pub fn counted(
    user: &str,
    account: &str,
    qos: &str,
    tres_per_node: &str,
) -> crate::limits::Counted {
    crate::limits::Counted {
        user: user.to_string(),
        account: account.to_string(),
        qos: qos.to_string(),
        gres: crate::limits::Gres {
            gpu: gres::request_count(tres_per_node, "gpu").map(u64::from),
            shard: gres::request_count(tres_per_node, "shard").map(u64::from),
        },
    }
}

/// Parses `squeue -h -O` [`QUEUE_FORMAT`] output into a [`Listing`].
pub fn parse_listing(out: &str) -> Listing {
    let mut jobs = Vec::new();
    let mut counts = Vec::new();
    let mut unreadable = Vec::new();
    for line in out.lines().filter(|l| !l.trim().is_empty()) {
        // The last field, the constraint, may hold `|` (an OR): every `|` past the others is
        // its own. A line shifted by a `|` elsewhere has no number as its restart count.
        let f: Option<Vec<&str>> = line.strip_suffix('|').and_then(|body| {
            let f: Vec<&str> = body.splitn(QUEUE_FIELDS, '|').map(str::trim).collect();
            (f.len() == QUEUE_FIELDS && f[15].parse::<u32>().is_ok()).then_some(f)
        });
        let Some(f) = f else {
            unreadable.push(short(line));
            continue;
        };
        let Ok(id) = f[0].parse::<u32>() else {
            unreadable.push(short(line));
            continue;
        };
        let Some((workload, partners)) = read_mark(f[1]) else {
            if matches!(f[7], "R" | "CF") {
                counts.push(counted(f[2], f[17], f[18], f[4]));
            }
            continue;
        };
        let none =
            |v: &str| if matches!(v, "N/A" | "(null)") { String::new() } else { v.to_string() };
        jobs.push(QueuedJob {
            id,
            workload: workload.to_string(),
            partners,
            user: f[2].to_string(),
            reason: f[3].to_string(),
            tres_per_node: none(f[4]),
            submitted: parse_utc(f[5]),
            req_nodes: none(f[6]),
            state: f[7].to_string(),
            dependency: none(f[8]),
            eligible: parse_utc(f[9]),
            started: parse_utc(f[10]),
            ended: parse_utc(f[11]),
            node: none(f[12]),
            partition: none(f[13]),
            reservation: none(f[14]),
            restarts: f[15].parse().unwrap_or(0),
            time_limit_s: parse_duration(f[16]),
            account: none(f[17]),
            qos: none(f[18]),
            nice: f[19].parse().unwrap_or(0),
            features: none(f[20]),
        });
    }
    let mut listing = Listing::of_kace(jobs, counts);
    listing.unreadable = unreadable;
    listing
}

impl Listing {
    /// The listing of kace jobs `jobs` beside `others`, the jobs not kace's that count
    /// against limits (running or starting): `counted` gains the kace jobs that count.
    pub fn of_kace(mut jobs: Vec<QueuedJob>, others: Vec<crate::limits::Counted>) -> Listing {
        jobs.sort_by_key(|j| j.id);
        let mut counts = others;
        for j in &jobs {
            // A kace job released and not started counts as soon as it starts: a second
            // release beside it must not pass the limit meanwhile.
            if j.on_gpu() || (j.pending() && !j.held() && !j.req_nodes.is_empty()) {
                counts.push(counted(&j.user, &j.account, &j.qos, &j.tres_per_node));
            }
        }
        Listing { kace: jobs, counted: counts, unreadable: Vec::new() }
    }
}

/// A JSON job record as the queue listing gives it (`squeue -O` [`QUEUE_FORMAT`]): `None` when
/// the gate did not mark it. The compact state is squeue's (src/common/slurm_protocol_defs.c,
/// job_state_string_compact: a `COMPLETING` flag first, then `CONFIGURING`, then the base).
pub fn queued_from_json(j: slurm_json::JsonJob) -> Option<QueuedJob> {
    let (workload, partners) = read_mark(&j.admin_comment)?;
    let workload = workload.to_string();
    let flag = |f: &str| j.flags.iter().any(|x| x == f);
    let state = if flag("COMPLETING") {
        "CG".to_string()
    } else if flag("CONFIGURING") {
        "CF".to_string()
    } else {
        match j.state.as_str() {
            "PENDING" => "PD".to_string(),
            "RUNNING" => "R".to_string(),
            "SUSPENDED" => "S".to_string(),
            other => other.to_string(),
        }
    };
    Some(QueuedJob {
        id: j.id,
        workload,
        partners,
        user: j.user,
        reason: j.reason,
        tres_per_node: j.tres_per_node,
        submitted: j.submitted,
        req_nodes: j.req_nodes,
        state,
        dependency: j.dependency,
        eligible: j.eligible,
        started: j.started,
        ended: j.ended,
        node: j.nodes,
        partition: j.partition,
        reservation: j.reservation,
        features: j.features,
        restarts: j.restarts,
        time_limit_s: j.time_limit_s,
        account: j.account,
        qos: j.qos,
        nice: j.nice,
    })
}

/// The running, configuring or completing kace jobs among JSON records, with the GPUs each
/// holds.
pub fn running_kace_jobs(jobs: Vec<slurm_json::JsonJob>) -> Vec<RunningJob> {
    jobs.into_iter()
        .filter(|j| matches!(j.state.as_str(), "RUNNING" | "CONFIGURING" | "COMPLETING"))
        .filter(|j| j.admin_comment.starts_with(MARK))
        .map(|j| {
            let gpus = j.gpus();
            let state = match j.state.as_str() {
                "CONFIGURING" => "CF",
                "COMPLETING" => "CG",
                _ => "R",
            };
            let workload = read_mark(&j.admin_comment).map_or("", |(w, _)| w).to_string();
            RunningJob {
                id: j.id,
                node: j.nodes,
                gpus,
                state: state.to_string(),
                user: j.user,
                workload,
                started: j.started,
            }
        })
        .collect()
}

/// Numeric job ids, one per line (`squeue -O JobID:|`); anything else is left out.
pub fn parse_ids(out: &str) -> Vec<u32> {
    out.lines().filter_map(|l| l.trim().trim_end_matches('|').trim().parse().ok()).collect()
}

/// The GPU indices `scontrol -o -d show job` (Slurm 22.05, which has no `--json` there) gives a
/// job on `node`: the `GRES=` word of its `Nodes=<node> CPU_IDs=… Mem=… GRES=…(IDX:…)` detail.
/// That line also holds the job's name, comment and command, which its user writes and which
/// may imitate the detail (`node/tests/fixtures/*/scontrol-partner.txt`): every such sequence
/// for `node` must give the same indices, or the reading is refused. One that names no GPU
/// gives none.
pub fn detail_gpus(text: &str, node: &str) -> Result<Vec<u32>> {
    let words: Vec<&str> = text.split_whitespace().collect();
    let want = format!("Nodes={node}");
    let mut seen: Vec<Vec<u32>> = Vec::new();
    for w in words.windows(4) {
        let [n, cpus, mem, gres] = w else { continue };
        if *n != want || !cpus.starts_with("CPU_IDs=") || !mem.starts_with("Mem=") {
            continue;
        }
        let Some(g) = gres.strip_prefix("GRES=") else { continue };
        let mut idx: Vec<u32> = gres::parse_alloc(g)
            .into_iter()
            .filter(|a| a.count > 0)
            .flat_map(|a| a.indices)
            .collect();
        idx.sort_unstable();
        idx.dedup();
        if !seen.contains(&idx) {
            seen.push(idx);
        }
    }
    match seen.as_slice() {
        [] => Ok(Vec::new()),
        [one] => Ok(one.clone()),
        _ => Err(Error::Parse {
            what: format!("the GPUs of the job's allocation on {node}"),
            text: format!(
                "{} different GRES details for that node (the job's own text imitates one)",
                seen.len()
            ),
        }),
    }
}

/// Whether Slurm starts new jobs on a node in this `StateLong` (`mixed`, `idle~`, `mixed$`,
/// `allocated+drain`, …). The base states that take jobs are idle, mixed, allocated and
/// completing (and `planned`, backfill's); any suffix (`*` not responding, `~` powered off,
/// `#`/`%`/`!` powering, `$` in a maintenance reservation, `@`/`^` rebooting; `-` planned is
/// harmless) or other flag (`+drain`, `+maint`, `+reserved`, …) keeps kace off it
/// (src/common/slurm_protocol_defs.c, node_state_string and its suffixes in sinfo's print.c).
pub fn state_takes_jobs(state: &str) -> bool {
    let state = state.trim().to_ascii_lowercase();
    let base = state.trim_end_matches(['-']);
    if base.ends_with(['*', '~', '#', '%', '!', '$', '@', '^']) {
        return false;
    }
    let mut parts = base.split('+');
    let first = parts.next().unwrap_or("");
    matches!(first, "idle" | "mixed" | "allocated" | "alloc" | "completing" | "planned")
        && parts.all(|f| matches!(f, "completing" | "planned"))
}

/// slurm.conf's path: `SLURM_CONF` (`env`, empty when unset) as every Slurm program takes it,
/// else `/etc/slurm/slurm.conf` (Debian's and SchedMD's packages).
pub fn slurm_conf_path(env: &str) -> std::path::PathBuf {
    if env.is_empty() { "/etc/slurm/slurm.conf" } else { env }.into()
}

/// The cluster's name in the decision records' keys: `SLURM_CLUSTER_NAME` (`env`, which
/// slurmctld and slurmd set for the programs they run), else `ClusterName` from slurm.conf's
/// text (`conf`: the decider service runs with no Slurm environment), lowercased as slurmctld
/// stores it (src/common/read_config.c), so that the service and a pass run by slurmctld key
/// their records alike and two clusters sharing a database do not collide; `cluster` when
/// neither says.
pub fn cluster_name(env: Option<&str>, conf: Option<&str>) -> String {
    let from_conf = || {
        conf?.lines().find_map(|line| {
            let line = line.split('#').next().unwrap_or("").trim();
            let (key, value) = line.split_once('=')?;
            let value = value.split_whitespace().next()?;
            key.trim().eq_ignore_ascii_case("ClusterName").then(|| value.to_string())
        })
    };
    env.map(str::trim)
        .filter(|c| !c.is_empty())
        .map(str::to_string)
        .or_else(from_conf)
        .map(|c| c.to_ascii_lowercase())
        .unwrap_or_else(|| "cluster".into())
}

/// Parses `sinfo -h -N -O` [`NODES_FORMAT`]: one entry per node, its partitions gathered from
/// its lines (a node in two partitions has two).
pub fn parse_nodes(out: &str) -> Vec<NodeGpus> {
    let mut nodes: BTreeMap<String, NodeGpus> = BTreeMap::new();
    for line in out.lines() {
        let Some(f) = strict_fields(line, NODES_FIELDS) else { continue };
        if f[0].is_empty() {
            continue;
        }
        let node = nodes.entry(f[0].to_string()).or_insert_with(|| {
            let gpus = gres::node_gpus(f[2]);
            NodeGpus {
                name: f[0].to_string(),
                busy_gpus: gres::busy_gpus(f[6], &gpus),
                gpus,
                shards_per_gpu: gres::shards_per_gpu(f[2]),
                usable: state_takes_jobs(f[3]),
                partitions: Vec::new(),
                max_time_s: Vec::new(),
                features: split_words(f[4]),
            }
        });
        if !f[1].is_empty() && !node.partitions.iter().any(|p| p == f[1]) {
            node.partitions.push(f[1].to_string());
            node.max_time_s.push(parse_duration(f[5]));
        }
    }
    nodes.into_values().collect()
}

/// The comma-separated words of a Slurm list field, `(null)` and `N/A` being none.
pub fn split_words(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|w| !w.is_empty() && !matches!(*w, "(null)" | "N/A"))
        .map(str::to_string)
        .collect()
}

/// Parses a Slurm duration as squeue prints a time limit (`UNLIMITED`, `5:00` minutes and
/// seconds, `1:00:00`, `2-00:00:00`), in seconds; `None` when unlimited or unreadable.
pub fn parse_duration(s: &str) -> Option<f64> {
    let s = s.trim();
    let (days, rest) = match s.split_once('-') {
        Some((d, r)) => (d.parse::<u64>().ok()?, r),
        None => (0, s),
    };
    let parts: Vec<u64> = rest.split(':').map(|x| x.parse().ok()).collect::<Option<_>>()?;
    let (h, m, sec) = match parts.as_slice() {
        [m] if days == 0 => (0, *m, 0),
        [h] => (*h, 0, 0),
        [m, sec] if days == 0 => (0, *m, *sec),
        [h, m] => (*h, *m, 0),
        [h, m, sec] => (*h, *m, *sec),
        _ => return None,
    };
    Some((days * 86_400 + h * 3600 + m * 60 + sec) as f64)
}

/// Parses Slurm's `YYYY-MM-DDTHH:MM:SS` (printed in UTC: kace runs Slurm commands with TZ=UTC).
pub fn parse_utc(s: &str) -> Option<f64> {
    let (date, time) = s.split_once('T')?;
    let d: Vec<i64> = date.split('-').map(|x| x.parse().ok()).collect::<Option<_>>()?;
    let t: Vec<i64> = time.split(':').map(|x| x.parse().ok()).collect::<Option<_>>()?;
    let ([y, m, day], [hh, mm, ss]) = (d.as_slice(), t.as_slice()) else { return None };
    if !(1..=12).contains(m) || !(1..=31).contains(day) {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm), valid for the Gregorian calendar.
    let y = if *m <= 2 { y - 1 } else { *y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some((days * 86_400 + hh * 3600 + mm * 60 + ss) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_at_once_runs_together_and_keeps_the_items_order() {
        use std::sync::{Condvar, Mutex};
        // Each call waits (up to 10 s, only if they do not run together) until all four have
        // begun: that they all return `true` proves four ran at once.
        let begun = (Mutex::new(0usize), Condvar::new());
        let results = at_once(&[40u64, 30, 20, 10], 4, |&ms| {
            let (count, cv) = &begun;
            let mut n = count.lock().unwrap();
            *n += 1;
            cv.notify_all();
            let (n, timeout) =
                cv.wait_timeout_while(n, Duration::from_secs(10), |n| *n < 4).unwrap();
            drop(n);
            // The first item finishes last: the results are still in the items' order.
            std::thread::sleep(Duration::from_millis(ms));
            (ms, !timeout.timed_out())
        });
        assert_eq!(
            results,
            [Some((40, true)), Some((30, true)), Some((20, true)), Some((10, true))]
        );
        // Fewer workers than items: every item is still done, once.
        let calls = std::sync::atomic::AtomicUsize::new(0);
        let results = at_once(&(0..9).collect::<Vec<u32>>(), 2, |&i| {
            calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            i * 2
        });
        assert_eq!(results, (0..9).map(|i| Some(i * 2)).collect::<Vec<_>>());
        assert_eq!(calls.into_inner(), 9);
        assert!(at_once(&[] as &[u32], 4, |&i| i).is_empty());
    }

    #[test]
    fn the_mark_names_the_workload_and_the_partners() {
        assert_eq!(read_mark("kace:bert"), Some(("bert", vec![])));
        assert_eq!(write_mark("bert", &[]), "kace:bert");
        let marked = write_mark("bert", &[12, 15, 12]);
        assert_eq!(marked, "kace:bert shared=12,15");
        assert_eq!(read_mark(&marked), Some(("bert", vec![12, 15])));
        // What does not read as a job id is left out; no mark, no workload.
        assert_eq!(read_mark("kace:bert shared=12,x,,7"), Some(("bert", vec![12, 7])));
        for bad in ["", "bert", "kace:", "kace: shared=1", "site note", "kace:a b"] {
            assert_eq!(read_mark(bad), None, "{bad:?}");
        }
        let many: Vec<u32> = (1..=100).collect();
        let (_, kept) = read_mark(&write_mark("w", &many)).unwrap().clone();
        assert_eq!(kept, (1..=MAX_RECORDED_PARTNERS as u32).collect::<Vec<_>>());
        // A listing line with partners reads like one without.
        let line = "12|kace:bert shared=9,10|alice|None|gres/shard:1|2026-11-29T06:58:00|n2|R|(null)|N/A|2026-11-29T06:58:40|2026-11-29T07:58:40|n2|debug|(null)|0|UNLIMITED|acct|normal|0|(null)|\n";
        let (jobs, bad) = parse_queue(line);
        assert!(bad.is_empty(), "{bad:?}");
        assert_eq!((jobs[0].workload.as_str(), jobs[0].partners.clone()), ("bert", vec![9, 10]));
    }

    #[test]
    fn pending_kace_jobs_are_read_and_others_skipped() {
        let out = "12|kace:bert|alice|JobHeldUser|gres:shard:1|2026-11-29T06:58:46|(null)|PD|(null)|N/A|N/A|N/A||pa,pb|(null)|0|1:30:00|acct|normal|0|fa&fb|fc|\n\
                   11|(null)|bob|Resources|N/A|2026-11-29T06:58:40||PD|(null)|N/A|N/A|N/A||debug|(null)|0|UNLIMITED|acct|normal|0|(null)|\n\
                   10|kace:lstm|alice|None|gres/shard:g1:2|2026-11-29T06:58:00|n1|PD|(null)|2026-11-29T06:58:00|2026-11-29T07:00:00|NONE||debug|maint|2|5:00|acct|normal|0|(null)|\n\
                   14|kace:wav|alice|Prolog|gres/shard:1|2026-11-29T06:58:00|n2|R|(null)|N/A|2026-11-29T06:58:40|2026-11-29T07:58:40|n2|debug|(null)|0|UNLIMITED|acct|normal|0|(null)|\n";
        let (jobs, bad) = parse_queue(out);
        assert!(bad.is_empty(), "{bad:?}");
        assert_eq!(jobs.len(), 3);
        assert!(jobs[2].starting() && !jobs[2].pending());
        assert_eq!(jobs[2].started, Some(1_795_935_520.0));
        // Starting 40 s ago: its prolog may choose within a 35 s window no longer.
        let start = 1_795_935_520.0;
        assert!(!jobs[2].stuck(start + 30.0, 35.0) && jobs[2].stuck(start + 40.0, 35.0));
        assert!(!jobs[0].stuck(start + 1e6, 35.0));
        assert_eq!((jobs[2].node.as_str(), jobs[2].on_gpu()), ("n2", true));
        assert_eq!(jobs[0].node, "");
        assert_eq!((jobs[0].id, jobs[0].workload.as_str(), jobs[0].held()), (10, "lstm", false));
        assert_eq!((jobs[0].req_nodes.as_str(), jobs[0].shards()), ("n1", Some(2)));
        assert_eq!((jobs[1].id, jobs[1].held(), jobs[1].shards()), (12, true, Some(1)));
        for (tres, want) in
            [("gres:shard:0", None), ("gres/shard:g1:0", None), ("gres/shard", Some(1))]
        {
            let j = QueuedJob { tres_per_node: tres.into(), ..QueuedJob::default() };
            assert_eq!(j.shards(), want, "{tres}");
        }
        assert_eq!(jobs[1].submitted, Some(1_795_935_526.0));
        assert_eq!(jobs[1].req_nodes, "");
        // The facts of the site's policies.
        let bert = &jobs[1];
        assert_eq!((bert.partition.as_str(), bert.features.as_str()), ("pa,pb", "fa&fb|fc"));
        assert_eq!((bert.reservation.as_str(), bert.time_limit_s), ("", Some(5400.0)));
        assert_eq!((jobs[0].reservation.as_str(), jobs[0].restarts), ("maint", 2));
        assert_eq!((jobs[0].time_limit_s, jobs[2].time_limit_s), (Some(300.0), None));
    }

    #[test]
    fn durations_as_squeue_prints_them() {
        assert_eq!(parse_duration("5:00"), Some(300.0));
        assert_eq!(parse_duration("1:00:00"), Some(3600.0));
        assert_eq!(parse_duration("2-00:00:00"), Some(172_800.0));
        assert_eq!(parse_duration("1-02:03"), Some(93_780.0));
        assert_eq!(parse_duration("1-02"), Some(93_600.0));
        assert_eq!(parse_duration("UNLIMITED"), None);
        assert_eq!(parse_duration("N/A"), None);
        assert_eq!(parse_duration("1:x"), None);
    }

    #[test]
    fn node_states_that_take_jobs() {
        for s in ["idle", "mixed", "allocated", "completing", "mixed-", "idle+planned"] {
            assert!(state_takes_jobs(s), "{s}");
        }
        for s in [
            "mixed$",
            "idle~",
            "idle*",
            "drained",
            "draining",
            "down*",
            "mixed+drain",
            "idle#",
            "mixed@",
            "reserved",
            "maint",
            "idle+maint",
            "allocated+drain",
            "fail",
            "unknown",
        ] {
            assert!(!state_takes_jobs(s), "{s}");
        }
    }

    #[test]
    fn a_newline_in_one_admin_comment_skips_only_its_pieces() {
        // 26.05.3, root: scontrol update jobid=8 AdminComment=$'line1\nline2|x'.
        let out = "8|line1\n\
                   line2|x|root|None|gres/shard:1|2026-12-01T01:12:57||PD|(null)|2026-12-01T01:12:57|N/A|N/A||debug|(null)|0|UNLIMITED|acct|normal|0|(null)|\n\
                   5|kace:bert|root|JobHeldUser|gres/shard:1|2026-12-01T01:12:56||PD|(null)|N/A|N/A|N/A||debug|(null)|0|UNLIMITED|acct|normal|0|(null)|\n\
                   garbage\n";
        let (jobs, bad) = parse_queue(out);
        assert_eq!(jobs.iter().map(|j| j.id).collect::<Vec<_>>(), vec![5]);
        assert_eq!(bad.len(), 3, "{bad:?}");
    }

    #[test]
    fn admin_holds_dependencies_and_begin_times_are_not_the_gates_hold() {
        let job = |reason: &str, dep: &str, eligible: Option<f64>| QueuedJob {
            id: 1,
            workload: "w".into(),
            reason: reason.into(),
            state: "PD".into(),
            dependency: dep.into(),
            submitted: Some(100.0),
            eligible,
            ..QueuedJob::default()
        };
        assert!(job("JobHeldUser", "", None).held());
        assert!(!job("JobHeldAdmin", "", None).held());
        assert_eq!(job("JobHeldUser", "", None).blocked(1000.0), None);
        assert!(job("JobHeldUser", "afterok:2(unfulfilled)", None).blocked(1000.0).is_some());
        assert!(job("JobHeldUser", "afterok:2(fulfilled)", None).blocked(1000.0).is_none());
        assert!(job("JobHeldUser", "", Some(2000.0)).blocked(1000.0).is_some());
        assert!(job("JobHeldUser", "", Some(2000.0)).blocked(2001.0).is_none());
        assert_eq!(job("JobHeldUser", "", Some(2000.0)).hold_started(), Some(2000.0));
        assert_eq!(job("JobHeldUser", "", None).hold_started(), Some(100.0));
        assert!(dependency_met("afterok:2(failed)?afterany:3(fulfilled)"));
        assert!(!dependency_met("afterok:2(fulfilled),afterany:3(unfulfilled)"));
        assert!(!dependency_met("singleton(unfulfilled)"));
        assert!(dependency_met("(null)"));
    }

    #[test]
    fn the_cluster_name_comes_from_slurms_environment_else_slurm_conf() {
        let conf = "# ClusterName=commented\nSlurmctldHost=h\n  clustername = Alpha  # site\n";
        assert_eq!(cluster_name(Some("beta"), Some(conf)), "beta");
        assert_eq!(cluster_name(None, Some(conf)), "alpha");
        assert_eq!(cluster_name(Some(" "), Some(conf)), "alpha");
        assert_eq!(cluster_name(None, Some("SlurmctldHost=h\n")), "cluster");
        assert_eq!(cluster_name(None, None), "cluster");
    }

    #[test]
    fn nodes_and_their_gpus() {
        let out = "n1|pa|gpu:g0:1,gpu:g1:1,shard:g0:2,shard:g1:2|idle|fa,fb|1:00:00|\
                   gpu:g0:0(IDX:N/A),gpu:g1:0(IDX:N/A),shard:g0:0(IDX:N/A),shard:g1:2(IDX:1)|\n\
                   n1|debug|gpu:g0:1,gpu:g1:1,shard:g0:2,shard:g1:2|idle|fa,fb|infinite|\
                   gpu:g0:0(IDX:N/A),gpu:g1:0(IDX:N/A),shard:g0:0(IDX:N/A),shard:g1:2(IDX:1)|\n\
                   n2|debug|gpu:1,shard:4|mixed|(null)|infinite|gpu:1(IDX:0),shard:0(IDX:N/A)|\n\
                   n3|debug|gpu:2(S:0),shard:8|drained|(null)|infinite|gpu:0,shard:0|\n\
                   n4|debug|(null)|idle|(null)|infinite|(null)|\n";
        let n = parse_nodes(out);
        assert_eq!(n[0].gpus, vec![Some("g0".to_string()), Some("g1".to_string())]);
        assert_eq!(
            (n[0].partitions.clone(), n[0].features.clone()),
            (vec!["pa".to_string(), "debug".to_string()], vec!["fa".to_string(), "fb".to_string()])
        );
        assert_eq!((n[0].shards_per_gpu, n[1].shards_per_gpu, n[2].shards_per_gpu), (2, 4, 4));
        assert_eq!(n[0].max_time_s, vec![Some(3600.0), None]);
        assert_eq!((n[1].gpus.len(), n[1].usable), (1, true));
        assert_eq!((n[2].gpus.len(), n[2].usable), (2, false));
        assert!(n[3].gpus.is_empty());
        assert_eq!((n[0].busy_gpus.clone(), n[1].busy_gpus.clone()), (vec![1], vec![0]));
        assert!(n[2].busy_gpus.is_empty() && n[3].busy_gpus.is_empty());
    }

    #[test]
    fn the_gpus_of_a_22_05_detail_are_read_only_when_no_imitation_disagrees() {
        let real = "JobId=7 JobName=x NodeList=n1 JOB_GRES=shard:g1:1 \
                    Nodes=n1 CPU_IDs=1 Mem=0 GRES=shard:g1:1(IDX:1) MinCPUsNode=1";
        assert_eq!(detail_gpus(real, "n1").unwrap(), vec![1]);
        // A comment imitating the same detail changes nothing; a different one is refused.
        let same = format!("{real} Comment=x Nodes=n1 CPU_IDs=1 Mem=0 GRES=shard:g1:1(IDX:1)");
        assert_eq!(detail_gpus(&same, "n1").unwrap(), vec![1]);
        let forged = format!("{real} Comment=x Nodes=n1 CPU_IDs=0 Mem=0 GRES=shard:g0:1(IDX:0)");
        assert!(detail_gpus(&forged, "n1").is_err());
        // Another node's imitation is not this node's detail; a bare GRES= word is no detail.
        let other = format!("{real} Comment=x Nodes=n9 CPU_IDs=0 Mem=0 GRES=shard:g0:1(IDX:0)");
        assert_eq!(detail_gpus(&other, "n1").unwrap(), vec![1]);
        assert_eq!(detail_gpus("JobId=7 GRES=shard:1(IDX:3)", "n1").unwrap(), Vec::<u32>::new());
    }

    #[test]
    fn job_ids_skip_array_and_het_forms() {
        assert_eq!(parse_ids("7|\n12_3|\n9|\n4+1|\n"), vec![7, 9]);
    }

    #[test]
    fn utc_times() {
        assert_eq!(parse_utc("1970-01-01T00:00:00"), Some(0.0));
        assert_eq!(parse_utc("2000-03-01T12:30:05"), Some(951_913_805.0));
        assert_eq!(parse_utc("2024-02-29T12:34:56"), Some(1_709_210_096.0));
        assert_eq!(parse_utc("Unknown"), None);
        assert_eq!(parse_utc("N/A"), None);
        assert_eq!(parse_utc("2026-13-01T00:00:00"), None);
    }
}
