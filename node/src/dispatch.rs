//! The decider: the one process that moves kace jobs (ARCHITECTURE.md, "one decider"). It runs
//! on the controller, as the `kace dispatch --watch` service (which holds the dispatch lock for
//! its life and passes when nudged, [`crate::nudge`]) or, while no service runs, as one pass of
//! `kace dispatch` / `kace-dispatch` under the same lock. One pass, in this order:
//! 0. releases a pass began and did not finish (pinned, not released) are finished;
//! 1. jobs held longer than `max_hold` are placed where their group fits: a free GPU (they run
//!    alone), or an open GPU whose memory and job limit allow them; otherwise they wait for the
//!    next free GPU, oldest first. Without the nodes' list they go to Slurm unpinned;
//! 2. held jobs are offered to OPEN GPUs (kace jobs starting or running, fewer than
//!    `selection.max_jobs_per_gpu`, nothing on its way there): the one decision
//!    ([`crate::read_path::decide_from_store`] → `kace_selector::decision::decide`) chooses among them;
//!    a lead that starts (PrologSlurmctld's nudge) gets its partner here, a GPU left by an
//!    ending job (EpilogSlurmctld's) its refill;
//! 3. the oldest held jobs are released as leads onto FREE GPUs (no kace job), one each.
//!
//! What it reads from Slurm: one `squeue -O` listing of kace jobs per pass (nothing more when
//! none is held), one `sinfo` when some are, and the GPUs of each kace job that started since
//! (one job each, remembered in [`DeciderState`]). Never the whole queue as JSON.
//!
//! Every release is recorded in the decision spool before it is made, and noted as begun in the
//! decider's state; a failed release withdraws its record. So a decider that dies mid-pass
//! neither moves a job twice (a released job is not held any more) nor loses what it did (the
//! next pass finishes a begun one).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::read_path::{decide_from_store, JobSpec};
use kace_config::Config;
use kace_layout::release_ticket::{self, Ticket};
use kace_layout::GpuIndex;
use kace_log::Logger;
use kace_selector::decision::Policy;
use kace_sql::spool::{
    release_key, unpark, withdraw_decision, write_or_park, ReleaseKind, SpooledDecision, Written,
};
use kace_sql::{DecisionCandidate, NewDecision, TimeLimitChange};

use crate::decider_state::{Begun, DeciderState};
use crate::error::{io, Result};
use crate::limits::{Counted, Limits, Usage};
use crate::placement::{self, HandBack, Wants};
use crate::priority::{self, PriorityInputs};
use crate::slurm::{Commands, Move, Moved, NodeGpus, QueuedJob, Slurm, Target};

/// How long one pass may take in all, so that a hanging Slurm command cannot pile up passes.
pub const BUDGET: Duration = Duration::from_secs(60);

/// At most this many rounds of releases a pass makes (a round's failed moves, of jobs cancelled
/// meanwhile, give their GPUs to the next), and candidates it tries for one open GPU whose
/// own limit cannot be lengthened.
const RELEASE_TRIES: usize = 3;

/// How long a job held again for a policy reason (a QOS or association limit, a node Slurm
/// will not give it) is left alone before it is offered again, seconds: long against a pass,
/// short against a limit's life.
pub const REST_S: f64 = 60.0;

/// How long a released job must stay pending for a policy reason before it is held again,
/// seconds: Slurm gives some reasons for a moment (a node it plans for another job, one still
/// completing), and holding a job again for one of those costs it [`REST_S`].
pub const POLICY_GRACE_S: f64 = 5.0;

/// A GPU: its node, its index there and its type when typed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuAt {
    /// Its node.
    pub node: String,
    /// Its index on the node.
    pub index: GpuIndex,
    /// Its type, when the node's GPUs are typed (jobs are pinned to it).
    pub kind: Option<String>,
}

/// Whether a released (pending, not held) job is on its way to `gpu`: pinned to its node, and
/// to its type when typed (an untyped pin counts against every GPU of the node).
pub fn in_flight_to(j: &QueuedJob, gpu: &GpuAt) -> bool {
    if !j.pending() || j.held() || j.req_nodes != gpu.node {
        return false;
    }
    let pinned_kind = j.tres_per_node.split(',').find_map(|e| {
        let e = e.trim();
        let e = e.strip_prefix("gres:").or_else(|| e.strip_prefix("gres/")).unwrap_or(e);
        match e.split(':').collect::<Vec<_>>().as_slice() {
            ["shard", kind, _] => Some(kind.to_string()),
            _ => None,
        }
    });
    match (pinned_kind, &gpu.kind) {
        (Some(theirs), Some(ours)) => theirs == *ours,
        _ => true,
    }
}

/// A held job as a decision record lists it, before the decision's verdict: its id, workload,
/// how long it has been held at `now` and the priority Slurm would give it (`None` without
/// priority/multifactor).
pub fn candidate_record(j: &QueuedJob, now: f64, priority: Option<f64>) -> DecisionCandidate {
    DecisionCandidate {
        job: Some(j.id.to_string()),
        workload: j.workload.clone(),
        prediction: None,
        rejected: None,
        held_s: j.hold_started().map(|t| (now - t).max(0.0)),
        priority,
        time_limits: Vec::new(),
        explores: Vec::new(),
        thread_pct: None,
    }
}

/// What a pass needs besides Slurm.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings<'a> {
    /// `dispatch.max_hold_s`.
    pub max_hold_s: u64,
    /// The decision's rules (`selection.*`, `mps.multi_user`).
    pub policy: Policy,
    /// The database (read-only), for decisions on open GPUs.
    pub database: &'a Path,
    /// GPU memory in GiB (`node.gpu_memory_gib`): the controller has no NVML of the nodes'
    /// GPUs, so without it no job is added to an open GPU.
    pub gpu_memory_gib: Option<f64>,
    /// `selection.refill`: offer held jobs to open GPUs beyond a starting lead's first partner.
    pub fill_open: bool,
    /// `spool.dir`: where each release's record goes.
    pub spool: &'a Path,
    /// The cluster's name in the records' keys ([`crate::slurm::cluster_name`]).
    pub cluster: String,
    /// `dispatch.state_dir`: where begun releases are noted before each one.
    pub state_dir: &'a Path,
    /// After how long starting or completing a kace job counts as stuck
    /// ([`crate::slurm::stuck_after_s`]).
    pub stuck_after_s: f64,
    /// `selection.time_limit`.
    pub time_limit: kace_config::TimeLimit,
    /// `selection.time_limit_cap`.
    pub time_limit_cap: f64,
    /// `selection.priority_window`.
    pub priority_window: usize,
    /// `mps.sm_split`: a joiner beside one running kace job gets the share the active split
    /// chooser picks.
    pub sm_split: bool,
}

/// This host's cluster name ([`crate::slurm::cluster_name`]), found once per process: slurm.conf
/// is read at most once (its first 1 MiB, and only a regular file: a FIFO would block).
fn this_cluster() -> String {
    static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    NAME.get_or_init(|| {
        use std::io::Read;
        let conf = || {
            let path =
                crate::slurm::slurm_conf_path(&std::env::var("SLURM_CONF").unwrap_or_default());
            if !std::fs::metadata(&path).ok()?.is_file() {
                return None;
            }
            let mut text = String::new();
            std::fs::File::open(path).ok()?.take(1 << 20).read_to_string(&mut text).ok()?;
            Some(text)
        };
        let env = std::env::var("SLURM_CLUSTER_NAME").ok();
        // slurm.conf only when Slurm's environment does not say.
        let text = env.as_deref().is_none_or(|e| e.trim().is_empty()).then(conf).flatten();
        crate::slurm::cluster_name(env.as_deref(), text.as_deref())
    })
    .clone()
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
            cluster: this_cluster(),
            state_dir: &config.dispatch.state_dir,
            stuck_after_s: crate::slurm::stuck_after_s(&config.node),
            time_limit: config.selection.time_limit,
            time_limit_cap: config.selection.time_limit_cap,
            priority_window: config.selection.priority_window,
            sm_split: config.mps.sm_split,
        }
    }
}

/// How long the decider uses the nodes it read (`sinfo`, two RPCs) before reading them again:
/// a pass runs on every job's start and end, and a node's GPUs and partitions rarely change. A
/// node drained meanwhile gets at most this long of releases, which Slurm then keeps pending.
const NODES_FRESH_S: f64 = 5.0;

/// The decider while it holds the dispatch lock: its state and its Slurm commands' counter.
pub struct Decider {
    _lock: std::fs::File,
    /// What it remembers.
    pub state: DeciderState,
    counts: crate::slurm::CommandCounts,
}

impl Decider {
    /// Takes the dispatch lock and loads the state; `Ok(None)` when another decider holds the
    /// lock. A note about an unreadable state file goes to `logger`.
    pub fn try_start(config: &Config, logger: &Logger) -> Result<Option<Decider>> {
        let lock_path = &config.dispatch.lock;
        if let Some(dir) = lock_path.parent() {
            std::fs::create_dir_all(dir).map_err(io("create the directory of", lock_path))?;
        }
        let Some(lock) = crate::state::try_lock_file(lock_path)? else { return Ok(None) };
        let (state, note) = DeciderState::load(&config.dispatch.state_dir);
        if let Some(n) = note {
            logger.line(&format!("kace: dispatch: {n}"));
        }
        Ok(Some(Decider { _lock: lock, state, counts: Default::default() }))
    }

    /// One pass at `now` with the real Slurm commands; the state is saved after it.
    pub fn pass(&mut self, config: &Config, now: f64, logger: &Logger) -> Result<PassReport> {
        let mut slurm =
            Commands::configured(&config.node, Some(Instant::now() + BUDGET), logger.clone());
        slurm.counts = self.counts.clone();
        let before = self.counts.snapshot();
        let settings = Settings::of(config);
        let began = Instant::now();
        let r = run(&slurm, &settings, &mut self.state, now);
        self.state.count_pass(now, began.elapsed().as_secs_f64());
        self.state.count(now, &before, &self.counts.snapshot());
        if let Err(e) = self.state.save(settings.state_dir) {
            logger.line(&format!("kace: dispatch: couldn't save the decider's state: {e}"));
        }
        r
    }
}

/// One pass as configured, under the dispatch lock. `Ok(None)` when another decider holds the
/// lock (the service, or another pass): it does the work.
pub fn run_configured(config: &Config, now: f64, logger: &Logger) -> Result<Option<PassReport>> {
    let Some(mut d) = Decider::try_start(config, logger)? else { return Ok(None) };
    d.pass(config, now, logger).map(Some)
}

/// The kace jobs on GPUs (starting, running, completing) in `queue` with their GPUs, for
/// `kace status`: from the decider's memory where it knows them, read singly for at most
/// `max_reads` others, and without GPUs beyond that (so that a view costs Slurm a bounded
/// number of RPCs however many jobs run).
pub fn running_jobs(
    slurm: &dyn Slurm,
    queue: &[QueuedJob],
    state: &DeciderState,
    max_reads: usize,
) -> Vec<crate::slurm::RunningJob> {
    let mut reads = 0;
    queue
        .iter()
        .filter(|j| (j.on_gpu() || j.completing()) && !j.node.is_empty())
        .map(|j| {
            let gpus = match state.gpus.get(&j.id) {
                Some((node, g)) if *node == j.node => g.clone(),
                _ if reads < max_reads => {
                    reads += 1;
                    slurm.job_gpus(j.id, &j.node).unwrap_or_default()
                }
                _ => Vec::new(),
            };
            let state = match j.state.as_str() {
                "CF" => "CF",
                "CG" => "CG",
                _ => "R",
            };
            crate::slurm::RunningJob {
                id: j.id,
                node: j.node.clone(),
                gpus,
                state: state.into(),
                user: j.user.clone(),
                workload: j.workload.clone(),
                started: j.started,
            }
        })
        .collect()
}

/// What `kace-dispatch` did for slurmctld's event.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Not a kace job's start or end: nothing to do.
    NotKace,
    /// The service was nudged.
    Nudged,
    /// No service listens: this process passed once (`None`: another pass was already
    /// waiting to run after the current one, and sees this event's state).
    Passed(Option<Box<PassReport>>),
}

/// What `kace-dispatch` does when slurmctld runs it as `PrologSlurmctld=` or
/// `EpilogSlurmctld=` (or an admin or timer runs it): `kace_job` says whether the event is a
/// kace job's (`SPANK_KACE_COLOCATE` in the script's environment; a forged one only makes the
/// decider pass sooner). It nudges the service and returns; without a service it runs one pass
/// itself, after the one running now if any (at most one waits: the next lock), so that no
/// event is lost.
pub fn on_event(config: &Config, kace_job: bool, now: f64, logger: &Logger) -> Result<Event> {
    if !kace_job {
        return Ok(Event::NotKace);
    }
    if crate::nudge::nudge(&config.dispatch.socket).is_ok() {
        return Ok(Event::Nudged);
    }
    if let Some(mut d) = Decider::try_start(config, logger)? {
        return Ok(Event::Passed(Some(Box::new(d.pass(config, now, logger)?))));
    }
    let mut next = config.dispatch.lock.clone().into_os_string();
    next.push(".next");
    let Some(_next) = crate::state::try_lock_file(Path::new(&next))? else {
        return Ok(Event::Passed(None));
    };
    let lock = crate::state::lock_file(&config.dispatch.lock, Instant::now() + BUDGET)?;
    drop(_next);
    let (state, note) = DeciderState::load(&config.dispatch.state_dir);
    if let Some(n) = note {
        logger.line(&format!("kace: dispatch: {n}"));
    }
    let mut d = Decider { _lock: lock, state, counts: Default::default() };
    let now = crate::Clock::now(&crate::SystemClock).max(now);
    Ok(Event::Passed(Some(Box::new(d.pass(config, now, logger)?))))
}

/// The `kace dispatch --watch` service: holds the dispatch lock for its life (waiting while a
/// one-off pass holds it), listens for nudges, and passes when nudged, when the gate marks a
/// submission, when a held job's `max_hold` expires and at least every
/// `dispatch.backstop_s`. `each` gets every pass's report (or error); it never returns but on
/// a failure to start.
pub fn serve(
    config: &Config,
    logger: &Logger,
    each: &mut dyn FnMut(Result<PassReport>),
) -> Result<()> {
    let mut d = loop {
        if let Some(d) = Decider::try_start(config, logger)? {
            break d;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let mut listener =
        crate::nudge::Listener::bind(&config.dispatch.socket, &config.dispatch.submitted)?;
    let backstop = Duration::from_secs(config.dispatch.backstop_s);
    // The gate marks a submission before slurmctld has the job: a pass soon after looks again.
    let mut again: Option<Instant> = None;
    loop {
        let now = crate::Clock::now(&crate::SystemClock);
        let r = d.pass(config, now, logger);
        let mut until = Instant::now() + backstop;
        if let Some(t) = again.take() {
            until = until.min(t);
        }
        if let Ok(r) = &r {
            if let Some(t) = r.next_expiry {
                let wait =
                    Duration::from_secs_f64((t - now + 0.05).clamp(0.0, backstop.as_secs_f64()));
                until = until.min(Instant::now() + wait);
            }
        }
        each(r);
        if listener.wait(until) == crate::nudge::Wake::Submitted {
            std::thread::sleep(SUBMIT_SETTLE);
            again = Some(Instant::now() + SUBMIT_RECHECK);
        }
    }
}

/// How long after the gate's mark the service passes: slurmctld records the job just after its
/// job_submit plugin returns.
const SUBMIT_SETTLE: Duration = Duration::from_millis(30);

/// When the service looks again after a submission's pass, for a job slurmctld recorded late.
const SUBMIT_RECHECK: Duration = Duration::from_millis(500);

/// Marks the slots another job holds: GRES in use in the nodes' reading (`NodeGpus::busy_gpus`)
/// where no kace job was seen since that reading. A kace job seen there since (running, leaving,
/// on its way) may be what the reading shows, so its GPU is judged by the kace jobs alone; a
/// GPU a plain job left is taken up again at the next reading of the nodes (at most
/// `NODES_FRESH_S` later), as no event wakes the decider for a plain job's end.
fn mark_others(slots: &mut [Slot], nodes: &[NodeGpus], state: &mut DeciderState, now: f64) {
    let read_at = state.nodes.as_ref().map_or(now, |n| n.0);
    for slot in slots.iter_mut() {
        let key = (slot.at.node.clone(), slot.at.index.0);
        if !slot.jobs.is_empty() || !slot.leaving.is_empty() || slot.coming > 0 {
            state.kace_seen.insert(key, now);
            continue;
        }
        let busy = nodes[slot.node_at].busy_gpus.contains(&slot.at.index.0);
        slot.others = busy && state.kace_seen.get(&key).is_none_or(|&seen| seen < read_at);
    }
}

/// What one pass did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PassReport {
    /// Jobs released as leads onto free GPUs: (job, node, GPU index).
    pub leads: Vec<(u32, String, u32)>,
    /// Jobs released to join open GPUs: (job, node, GPU index).
    pub joiners: Vec<(u32, String, u32)>,
    /// Jobs released because they were held longer than `max_hold`: (job, node, GPU index).
    /// Those no GPU takes are in `handed_back`.
    pub expired: Vec<(u32, String, u32)>,
    /// Jobs handed back to Slurm, unpinned and asking for a whole GPU: (job, why).
    pub handed_back: Vec<(u32, String)>,
    /// Released jobs held again: Slurm kept them pending for a policy reason, or requeued
    /// them: (job, why).
    pub held_again: Vec<(u32, String)>,
    /// Time limits lengthened because a job shares its GPU: (job, old, new), seconds.
    pub lengthened: Vec<(u32, f64, f64)>,
    /// Candidates not paired because of a time limit (`selection.time_limit`): (job, why).
    pub time_refused: Vec<(u32, String)>,
    /// Releases an earlier pass began (pinned, not released) and this one finished.
    pub resumed: Vec<u32>,
    /// Whether kace jobs are still held after the pass.
    pub still_held: bool,
    /// When the next held job's `max_hold` expires (Unix seconds): the service passes then.
    pub next_expiry: Option<f64>,
    /// Kace jobs Slurm shows starting or completing for longer than
    /// [`Settings::stuck_after_s`]: (job, seconds, "starting" or "completing"). Nothing waits
    /// for them; their GPUs are left alone.
    pub stuck: Vec<(u32, f64, &'static str)>,
    /// Problems met (each already a full message); the pass went on past them.
    pub problems: Vec<String>,
    /// What the pass found worth saying once that is not a problem (a GPU that takes no
    /// joiner while its job's workload cannot be paired yet).
    pub notes: Vec<String>,
    /// The release records spooled, in the order of the releases.
    pub records: Vec<SpooledDecision>,
    /// Joiners released ahead of held jobs of higher priority that could have taken the same
    /// GPU (within `selection.priority_window`): (joiner, the jobs it passed over).
    pub passed_over: Vec<(u32, Vec<u32>)>,
}

impl PassReport {
    /// What the pass did, one line each (the same words in the CLI and `kace-dispatch`).
    pub fn lines(&self, max_hold_s: u64) -> Vec<String> {
        let mut out = Vec::new();
        for job in &self.resumed {
            out.push(format!("finished the release of job {job} an earlier pass began"));
        }
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
        for (job, why) in &self.handed_back {
            out.push(format!(
                "handed job {job} back to Slurm, unpinned and asking for a whole GPU: {why}"
            ));
        }
        for (job, why) in &self.held_again {
            out.push(format!("held job {job} again and unpinned it: {why}"));
        }
        for (job, over) in &self.passed_over {
            out.push(format!(
                "job {job} joined ahead of higher-priority job(s) {over:?} (selection.priority_window)"
            ));
        }
        for (job, old, new) in &self.lengthened {
            out.push(format!(
                "lengthened job {job}'s time limit from {:.0} to {:.0} min: it shares its GPU",
                old / 60.0,
                new / 60.0
            ));
        }
        out.extend(self.notes.iter().cloned());
        out
    }

    /// One line per job Slurm shows starting or completing for too long.
    pub fn stuck_lines(&self) -> Vec<String> {
        self.stuck
            .iter()
            .map(|(job, secs, what)| {
                format!(
                    "job {job} has been {what} for {secs:.0} s: Slurm leaves a batch job whose \
                     slurmd restarted during its prolog so until it is requeued (scontrol requeue {job})"
                )
            })
            .collect()
    }
}

/// The log lines of one pass, one per event and problem.
pub fn report_lines(r: &PassReport, max_hold_s: u64) -> Vec<String> {
    r.lines(max_hold_s)
        .into_iter()
        .chain(r.stuck_lines())
        .chain(r.problems.iter().cloned())
        .map(|l| format!("kace: dispatch: {l}"))
        .collect()
}

/// Why an open GPU got no joiner chosen.
enum NoChoice {
    /// A workload on it cannot be paired yet (no profile, too few alone runs): not a failure.
    Unpaired(String),
    /// The decision failed (the database, the model).
    Failed(String),
}
use NoChoice::{Failed, Unpaired};

/// A kace job on a GPU, as a slot lists it.
#[derive(Debug, Clone)]
struct Member {
    id: u32,
    workload: String,
    user: String,
    starting: bool,
    /// Its time limit, seconds (`None`: unlimited).
    limit_s: Option<f64>,
    /// When it started, Unix seconds.
    started: Option<f64>,
    /// Its partitions.
    partitions: Vec<String>,
    /// It holds every shard of the GPU (a job handed back to Slurm): nothing can join it.
    whole: bool,
    /// The jobs it shared its GPU with so far (its `AdminComment`, [`crate::slurm::read_mark`]).
    partners: Vec<u32>,
}

/// A GPU as the pass sees it.
#[derive(Debug, Clone)]
struct Slot {
    at: GpuAt,
    /// Its node, as an index into the pass's nodes.
    node_at: usize,
    /// Its type names no other GPU of its node: a job pinned to the type lands on this GPU.
    sole_of_kind: bool,
    /// Kace jobs starting or running on it.
    jobs: Vec<Member>,
    /// Left alone this pass: a kace job on its node holds GPUs the pass could not learn, or a
    /// kace job on it is stuck starting.
    unknown: bool,
    /// Kace jobs completing on it (leaving).
    leaving: Vec<u32>,
    /// Released jobs on their way to it.
    coming: usize,
    /// Slurm shows GRES of it in use that no kace job accounts for: a job kace does not manage
    /// (a plain `--gres=gpu` or shard job) holds it, so no kace job is placed there or beside it.
    others: bool,
}

impl Slot {
    fn free(&self) -> bool {
        self.jobs.is_empty() && !self.unknown && self.coming == 0 && !self.others
    }
    fn open(&self, limit: usize) -> bool {
        !self.jobs.is_empty()
            && self.jobs.len() < limit
            && !self.jobs.iter().any(|m| m.whole)
            && !self.unknown
            && self.coming == 0
            && !self.others
    }
    /// The kind of a joiner's record: the decision of a job that starts there (a lead's
    /// partner, or the next place a joiner leaves room for), a refill, or a late arrival.
    fn join_kind(&self) -> ReleaseKind {
        if !self.leaving.is_empty() {
            ReleaseKind::Refill
        } else if self.jobs.iter().any(|m| m.starting) {
            ReleaseKind::Lead
        } else {
            ReleaseKind::LateArrival
        }
    }

    /// The job a joiner's record is keyed by: the starting job whose decision it is, the job
    /// whose end made room, or the joiner itself (as their hooks keyed them when hooks decided).
    fn key_job(&self, kind: ReleaseKind, joiner: u32) -> u32 {
        let starting = self.jobs.iter().rev().find(|m| m.starting).map(|m| m.id);
        match kind {
            ReleaseKind::Lead => starting.unwrap_or(joiner),
            ReleaseKind::Refill => self.leaving.first().copied().unwrap_or(joiner),
            _ => joiner,
        }
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
    /// Each ranked candidate's group's predicted normalised progress, when the model tells it.
    progress: std::collections::BTreeMap<usize, f64>,
}

/// Undoes [`count_explored`] for a release whose move failed.
fn uncount_explored(state: &mut DeciderState, decision: &NewDecision, released: &str) {
    let mine = decision.candidates.iter().find(|c| c.job.as_deref() == Some(released));
    for w in mine.into_iter().flat_map(|c| &c.explores) {
        if let Some(n) = state.explored.get_mut(w) {
            *n = n.saturating_sub(1);
        }
    }
    state.explored.retain(|_, n| *n > 0);
}

/// Counts a release in each new workload's exploratory groups (`selection.explore_pairs`
/// bounds them): the ones the released job's record says its group was formed to explore.
fn count_explored(state: &mut DeciderState, decision: &NewDecision, released: &str) {
    let mine = decision.candidates.iter().find(|c| c.job.as_deref() == Some(released));
    for w in mine.into_iter().flat_map(|c| &c.explores) {
        let n = state.explored.entry(w.clone()).or_default();
        *n = n.saturating_add(1);
    }
}

/// One pass at time `now` (Unix seconds), with `state` the decider's memory.
pub fn run(
    slurm: &dyn Slurm,
    s: &Settings<'_>,
    state: &mut DeciderState,
    now: f64,
) -> Result<PassReport> {
    let mut report = PassReport::default();
    let (queue, counted) = match slurm.listing() {
        Ok(l) => (l.kace, l.counted),
        Err(e) => {
            // slurmctld may be restarting: until its nodes register again it shows them
            // `unknown`, or a busy one with `shard:0` (measured on 22.05: about 5 s), and a
            // job pinned by a node list read before would be BadConstraints (the re-audit's
            // L8: released in slurmctld's first second, it waited 59 s). The nodes are read
            // afresh at the next pass.
            state.nodes = None;
            return Err(e);
        }
    };
    report.stuck = queue
        .iter()
        .filter(|j| j.stuck(now, s.stuck_after_s))
        .map(|j| {
            let what = if j.completing() { "completing" } else { "starting" };
            (j.id, j.in_hook_for(now).unwrap_or(0.0), what)
        })
        .collect();
    // An allocation does not change while its job is on a GPU; once off, its GPUs are forgotten.
    // A job this decider released onto a GPU it alone can land on is known from then (pending
    // until Slurm starts it).
    let on_a_gpu: BTreeSet<u32> = queue
        .iter()
        .filter(|j| j.on_gpu() || j.completing() || (j.pending() && !j.held()))
        .map(|j| j.id)
        .collect();
    state.gpus.retain(|id, _| on_a_gpu.contains(id));
    state.thread_pcts.retain(|id, _| on_a_gpu.contains(id));
    let listed: BTreeSet<u32> = queue.iter().map(|j| j.id).collect();
    state.handed_back.retain(|id| listed.contains(id));
    state.requeues.retain(|id, _| listed.contains(id));
    state.resting.retain(|id, until| listed.contains(id) && *until > now);
    state.own_limits.retain(|id, _| listed.contains(id));
    state.policy_seen.retain(|id, _| listed.contains(id));
    state.unpaired_said.retain(|id| on_a_gpu.contains(id));
    state.overtaken.retain(|id, _| listed.contains(id));
    // A job passed over and no longer held (released by its user's update, handed back,
    // cancelled) stopped waiting by this pass at the latest.
    let still_held: BTreeSet<u32> = queue.iter().filter(|j| j.held()).map(|j| j.id).collect();
    let stopped: Vec<u32> =
        state.passed_over_since.keys().filter(|id| !still_held.contains(id)).copied().collect();
    for id in stopped {
        stop_inversion(state, id, now);
    }

    // 0. What an earlier pass began, and the records it parked while the spool was full.
    finish_begun(slurm, s, state, &queue, &mut report);
    if park_dir(s).is_dir() {
        if let Err(e) = unpark(&park_dir(s), s.spool) {
            report.problems.push(format!("couldn't move parked decisions into the spool: {e}"));
        }
    }

    let held_again = hold_again(slurm, s, state, &queue, now, &mut report);

    // A job Slurm would not start yet (unmet dependency, --begin ahead) is neither offered nor
    // released for max_hold: its hold counts from when it may start. One asking for no shard
    // (its user changed its request) is handed back below (`placement::wants`).
    let held: Vec<&QueuedJob> = queue
        .iter()
        .filter(|j| j.held() && j.blocked(now).is_none())
        .filter(|j| !report.resumed.contains(&j.id) && !state.resting.contains_key(&j.id))
        .collect();
    state.limit_said.retain(|id, _| held.iter().any(|j| j.id == *id));
    if held.is_empty() {
        return Ok(report);
    }
    // The site's limits, against what runs now and what this pass releases: a job Slurm
    // would keep pending for a limit is neither offered nor released for max_hold (its hold
    // counts as Slurm's would not start it either), and the decider says why once.
    let limits = site_limits(slurm, state, now, &mut report);
    let usage = std::cell::RefCell::new(Usage::of(counted));
    let checked = limits.any();
    let limited = |j: &QueuedJob| {
        if !checked {
            return None;
        }
        limits.blocks(&usage.borrow(), &counted_of(j))
    };
    let held: Vec<&QueuedJob> = held
        .into_iter()
        .filter(|j| match limited(j) {
            None => {
                // What `kace status` shows is what the decider last found: no limit now.
                state.limit_said.remove(&j.id);
                true
            }
            Some(why) => {
                if state.limit_said.get(&j.id) != Some(&why) {
                    report.notes.push(format!("job {} waits for a limit: {why}", j.id));
                    state.limit_said.insert(j.id, why);
                }
                false
            }
        })
        .collect();
    if held.is_empty() {
        return Ok(report);
    }
    // Slurm's order: every step below serves `held` front to back.
    let inputs = priority_inputs(slurm, state, held.len(), now, &mut report);
    let held: Vec<&QueuedJob> =
        priority::order(&inputs, &held, now).into_iter().map(|i| held[i]).collect();
    let prio: Vec<Option<f64>> = held.iter().map(|j| priority::estimate(&inputs, j, now)).collect();
    let max_hold = s.max_hold_s as f64;
    let expired: Vec<usize> = (0..held.len())
        .filter(|&i| held[i].hold_started().is_some_and(|t| now - t >= max_hold))
        .collect();

    let read = match state.fresh_nodes(now, NODES_FRESH_S) {
        Some(n) => Ok(n),
        None => slurm.nodes().inspect(|n| state.nodes = Some((now, n.clone()))),
    };
    let nodes = match read {
        Ok(n) => n,
        Err(e) => {
            // max_hold is the gate's promise to the user: it does not depend on this read.
            report.problems.push(format!(
                "couldn't list the nodes ({e}); jobs held longer than max_hold go to Slurm unpinned"
            ));
            // Asking for a whole GPU of the nodes last read, if any were.
            let last: Vec<NodeGpus> = state.nodes.as_ref().map(|n| n.1.clone()).unwrap_or_default();
            for &i in &expired {
                hand_back(slurm, s, state, held[i], &last, &HandBack::MaxHold, now, &mut report);
            }
            report.still_held = held.len() > report.handed_back.len();
            return Ok(report);
        }
    };
    // Where each held job may go under the site's policies; what kace cannot place is handed
    // back to Slurm now.
    let wants: Vec<std::result::Result<Wants, HandBack>> = held
        .iter()
        .map(|j| {
            let w = placement::wants(j)?;
            let somewhere =
                nodes.iter().any(|n| n.gpus.iter().any(|k| placement::allows(&w, n, k.as_deref())));
            if somewhere {
                Ok(w)
            } else {
                Err(HandBack::NoGpuNode)
            }
        })
        .collect();
    let mut taken: Vec<usize> = Vec::new(); // indices into `held` this pass dealt with
    for (i, w) in wants.iter().enumerate() {
        if let Err(why) = w {
            taken.push(i);
            hand_back(slurm, s, state, held[i], &nodes, why, now, &mut report);
        }
    }
    let mut slots: Vec<Slot> = Vec::new();
    for (node_at, n) in nodes.iter().enumerate().filter(|(_, n)| n.usable) {
        for (i, kind) in n.gpus.iter().enumerate() {
            let sole_of_kind = kind.is_some() && n.gpus.iter().filter(|k| *k == kind).count() == 1;
            slots.push(Slot {
                at: GpuAt { node: n.name.clone(), index: GpuIndex(i as u32), kind: kind.clone() },
                node_at,
                sole_of_kind,
                jobs: Vec::new(),
                unknown: false,
                leaving: Vec::new(),
                coming: 0,
                others: false,
            });
        }
    }
    let slot_of = |slots: &[Slot], node: &str, index: u32| {
        slots.iter().position(|x| x.at.node == node && x.at.index.0 == index)
    };
    for j in queue.iter().filter(|j| (j.on_gpu() || j.completing()) && !j.node.is_empty()) {
        let known = match state.gpus.get(&j.id) {
            Some((node, gpus)) if *node == j.node => Some(gpus.clone()),
            _ => None,
        };
        let gpus = match known {
            Some(g) => g,
            // A completing job not seen running leaves anyway: not worth a read.
            None if j.completing() => continue,
            None => match slurm.job_gpus(j.id, &j.node) {
                Ok(g) if !g.is_empty() => {
                    state.gpus.insert(j.id, (j.node.clone(), g.clone()));
                    g
                }
                Ok(_) => {
                    report.problems.push(format!(
                        "couldn't learn the GPU of kace job {} on {}: its allocation names none; \
                         its node's GPUs are left alone this pass",
                        j.id, j.node
                    ));
                    Vec::new()
                }
                Err(e) => {
                    report.problems.push(format!(
                        "couldn't learn the GPU of kace job {} on {}: {e}; its node's GPUs are \
                         left alone this pass",
                        j.id, j.node
                    ));
                    Vec::new()
                }
            },
        };
        if gpus.is_empty() {
            for slot in slots.iter_mut().filter(|x| x.at.node == j.node) {
                slot.unknown = true;
            }
            continue;
        }
        for &i in &gpus {
            let Some(k) = slot_of(&slots, &j.node, i) else { continue };
            if j.completing() {
                slots[k].leaving.push(j.id);
            } else if j.stuck(now, s.stuck_after_s) {
                // A lead Slurm will not start until it is requeued: no partner beside it.
                slots[k].unknown = true;
            } else {
                let shards = nodes[slots[k].node_at].shards_per_gpu;
                slots[k].jobs.push(Member {
                    id: j.id,
                    workload: j.workload.clone(),
                    user: j.user.clone(),
                    starting: j.starting(),
                    limit_s: j.time_limit_s,
                    started: j.started,
                    partitions: crate::slurm::split_words(&j.partition),
                    whole: shards > 0 && j.shards().is_some_and(|n| n >= shards),
                    partners: j.partners.clone(),
                });
            }
        }
    }
    for j in queue
        .iter()
        .filter(|j| j.pending() && !j.held() && !j.req_nodes.is_empty())
        .filter(|j| !held_again.contains(&j.id))
    {
        // An untyped pin may land on any GPU of its node: it counts against each.
        for slot in slots.iter_mut().filter(|x| in_flight_to(j, &x.at)) {
            slot.coming += 1;
        }
    }
    mark_others(&mut slots, &nodes, state, now);

    let limit = s.policy.max_jobs_per_gpu;
    // The database and the GPUs' memory matter only for GPUs that already run kace jobs.
    let any_open = slots.iter().any(|x| x.open(limit));
    let db = if any_open {
        match kace_sql::Db::open_read_only(s.database) {
            Ok(mut db) => {
                db.set_now(now);
                Some(db)
            }
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
    // The joiner's SM split (`mps.sm_split`): the active chooser, read once per pass.
    let split_model = match (db.as_ref(), s.sm_split) {
        (Some(db), true) => match db.active_split_model() {
            Ok(m) => m.map(|r| r.model),
            Err(e) => {
                report.problems.push(format!(
                    "couldn't read the SM split chooser ({e}); joiners get no share this pass"
                ));
                None
            }
        },
        _ => None,
    };
    // The share job `j` gets joining `slot`: only beside one running job that has none (the
    // chooser learnt splits with the lead at 100 %), from both workloads' system profiles.
    let share_for = |slot: &Slot, j: &QueuedJob, state: &DeciderState| -> Option<u8> {
        let (model, db) = (split_model.as_ref()?, db.as_ref()?);
        let [lead] = slot.jobs.as_slice() else { return None };
        if state.thread_pcts.contains_key(&lead.id) {
            return None;
        }
        let names = [lead.workload.as_str(), j.workload.as_str()];
        let profiles = db.profiles(&names, None).ok()?;
        let profile = |w: &str| profiles.get(w).and_then(kace_sql::convert::selector_profile);
        model.joiner_share(&profile(&lead.workload)?, &profile(&j.workload)?)
    };
    // The decision for one open GPU among `cands` (indices into `held`).
    let choose = |slot: &Slot,
                  cands: &[usize],
                  policy: &Policy,
                  explored: &std::collections::BTreeMap<String, u32>|
     -> std::result::Result<Chosen, NoChoice> {
        let (Some(db), Some(mem)) = (db.as_ref(), s.gpu_memory_gib) else {
            return Ok(Chosen::default());
        };
        let spec = |w: &str, u: &str| JobSpec {
            workload: w.to_string(),
            user: Some(u.to_string()).filter(|u| !u.is_empty()),
        };
        let running: Vec<JobSpec> = slot.jobs.iter().map(|m| spec(&m.workload, &m.user)).collect();
        let specs: Vec<JobSpec> =
            cands.iter().map(|&i| spec(&held[i].workload, &held[i].user)).collect();
        let explored: Vec<(&str, u32)> = explored.iter().map(|(w, &n)| (w.as_str(), n)).collect();
        let d = decide_from_store(db, &running, &specs, policy, Some(mem), None, &explored)
            .map_err(|e| {
                // A workload on the GPU that cannot be paired yet is no failure: no joiner.
                if e.is_unpaired() {
                    Unpaired(e.to_string())
                } else {
                    Failed(e.to_string())
                }
            })?;
        let records = cands
            .iter()
            .enumerate()
            .map(|(k, &i)| DecisionCandidate {
                prediction: d.selection.verdicts.get(k).and_then(|v| v.prediction),
                rejected: d.reason(k),
                explores: d
                    .selection
                    .verdicts
                    .get(k)
                    .map(|v| v.explores.clone())
                    .unwrap_or_default(),
                ..candidate_record(held[i], now, prio[i])
            })
            .collect();
        Ok(Chosen {
            ranked: d.ranked.iter().map(|&k| cands[k]).collect(),
            records,
            model_version: Some(d.model_version),
            progress: cands
                .iter()
                .enumerate()
                .filter_map(|(k, &i)| Some((i, d.selection.verdicts.get(k)?.progress?)))
                .collect(),
        })
    };
    // Whether held job `i` may go to slot `k` under the site's policies.
    let fits = |i: usize, slot: &Slot| {
        wants[i]
            .as_ref()
            .is_ok_and(|w| placement::allows(w, &nodes[slot.node_at], slot.at.kind.as_deref()))
            && limited(held[i]).is_none()
    };
    let mut expired_left: Vec<usize> = Vec::new();
    let expired: Vec<usize> = expired.into_iter().filter(|i| !taken.contains(i)).collect();
    // Fitting is all that counts for a job that waited this long: no gain threshold.
    let fit_only = Policy {
        rules: kace_selector::SelectionRules {
            min_gain: f64::NEG_INFINITY,
            ..s.policy.rules.clone()
        },
        ..s.policy.clone()
    };

    // Each step decides every place first and stages each release (its record, its begun
    // note, its ticket); the moves are then made together (`Slurm::moves`). A move that fails
    // gives its GPU back to the next round, which decides again without that job. Joiners
    // (steps 1 and 2) are moved before leads are chosen (step 3), so that a joiner that cannot
    // be released is replaced by the GPU's next best candidate, not by what was left.
    for joining in [true, false] {
        for _round in 0..RELEASE_TRIES {
            let mut staged: Vec<Staged> = Vec::new();
            let mut moves: Vec<Move> = Vec::new();

            // 1. Nothing waits forever, and nothing expired is crowded onto a full GPU.
            for &i in expired.iter().filter(|_| joining) {
                if taken.contains(&i) {
                    continue;
                }
                let j = held[i];
                let place = match slots.iter().position(|x| x.free() && fits(i, x)) {
                    Some(k) => Some((k, None)),
                    None => slots
                        .iter()
                        .enumerate()
                        .filter(|(_, x)| x.open(limit) && fits(i, x))
                        .find_map(|(k, x)| match choose(x, &[i], &fit_only, &state.explored) {
                            Ok(c) if c.ranked == [i] => {
                                let progress = c.progress.get(&i).copied();
                                let plan = time_plan(
                                    s,
                                    state,
                                    &nodes[x.node_at],
                                    x,
                                    j,
                                    progress,
                                    None,
                                    now,
                                );
                                plan.ok().map(|plan| (k, c, plan))
                            }
                            _ => None,
                        })
                        .map(|(k, c, plan)| (k, Some((c, plan)))),
                };
                let Some((k, chosen)) = place else {
                    if !expired_left.contains(&i) {
                        expired_left.push(i);
                    }
                    continue;
                };
                expired_left.retain(|x| *x != i);
                taken.push(i);
                let plan = chosen.as_ref().map(|c| c.1.clone()).unwrap_or_default();
                if let Err(e) = lengthen_own(slurm, state, &plan, j.id, &mut report) {
                    report.problems.push(e);
                    continue;
                }
                let chosen = chosen.map(|c| c.0);
                let joined = Joined { chosen: chosen.as_ref(), plan: &plan, thread_pct: None };
                let how = (ReleaseKind::MaxHold, Placed::Expired);
                let (st, mv) = stage(s, state, (i, j), (k, &slots[k]), how, joined, now);
                usage.borrow_mut().add(counted_of(j));
                slots[k].coming += 1;
                staged.push(st);
                moves.push(mv);
            }

            // 2. Open GPUs first: a GPU already running kace jobs gains most from a joiner.
            for (k, slot) in slots.iter_mut().enumerate().filter(|_| joining) {
                // `selection.refill = false` keeps a starting lead's first partner, nothing more.
                if !slot.open(limit) || (!s.fill_open && slot.join_kind() != ReleaseKind::Lead) {
                    continue;
                }
                if (0..held.len()).all(|i| taken.contains(&i)) {
                    break;
                }
                let cands: Vec<usize> =
                    (0..held.len()).filter(|i| !taken.contains(i) && fits(*i, slot)).collect();
                if cands.is_empty() {
                    continue;
                }
                let cands = within_window(&cands, &held, state, s.priority_window);
                let chosen = match choose(slot, &cands, &s.policy, &state.explored) {
                    Ok(c) => c,
                    Err(Unpaired(why)) => {
                        let at = &slot.at;
                        let new: Vec<u32> = slot
                            .jobs
                            .iter()
                            .map(|m| m.id)
                            .filter(|j| state.unpaired_said.insert(*j))
                            .collect();
                        if !new.is_empty() {
                            report.notes.push(format!(
                                "{} GPU {} takes no joiner while it runs job(s) {new:?}: {why}",
                                at.node, at.index.0
                            ));
                        }
                        continue;
                    }
                    Err(Failed(e)) => {
                        let at = &slot.at;
                        report.problems.push(format!(
                            "couldn't choose a joiner for {} GPU {}: {e}",
                            at.node, at.index.0
                        ));
                        continue;
                    }
                };
                let kind = slot.join_kind();
                let mut tries = 0;
                for &i in &chosen.ranked {
                    if tries == RELEASE_TRIES {
                        break;
                    }
                    let node = &nodes[slot.node_at];
                    let progress = chosen.progress.get(&i).copied();
                    // A share whose slower joiner would need a limit the cap refuses is dropped:
                    // the pair is formed unasked, as without `mps.sm_split`.
                    let mut share = share_for(slot, held[i], state);
                    let planned =
                        match time_plan(s, state, node, slot, held[i], progress, share, now) {
                            Err(_) if share.is_some() => {
                                share = None;
                                time_plan(s, state, node, slot, held[i], progress, None, now)
                            }
                            p => p,
                        };
                    let plan = match planned {
                        Ok(p) => p,
                        Err(why) => {
                            report.time_refused.push((held[i].id, why));
                            continue;
                        }
                    };
                    tries += 1;
                    taken.push(i);
                    // The joiner's own limit first, while it is held: it never runs short.
                    if let Err(e) = lengthen_own(slurm, state, &plan, held[i].id, &mut report) {
                        report.problems.push(e);
                        continue;
                    }
                    let joined = Joined { chosen: Some(&chosen), plan: &plan, thread_pct: share };
                    let how = (kind, Placed::Joiner);
                    let (mut st, mv) = stage(s, state, (i, held[i]), (k, slot), how, joined, now);
                    // Jobs ahead of it in Slurm's order that this GPU could have taken.
                    st.ahead = cands
                        .iter()
                        .take_while(|&&c| c != i)
                        .filter(|&&c| !taken.contains(&c))
                        .map(|&c| held[c].id)
                        .collect();
                    for id in &st.ahead {
                        *state.overtaken.entry(*id).or_default() += 1;
                        if !state.passed_over_since.contains_key(id) {
                            state.passed_over_since.insert(*id, now);
                            st.first_passed.push(*id);
                        }
                    }
                    usage.borrow_mut().add(counted_of(held[i]));
                    slot.coming += 1;
                    staged.push(st);
                    moves.push(mv);
                    break;
                }
            }

            // 3. Leads onto free GPUs in Slurm's priority order, each onto the first free GPU it
            //    may use.
            for (k, slot) in slots.iter_mut().enumerate().filter(|_| !joining) {
                if !slot.free() {
                    continue;
                }
                let Some(i) = (0..held.len()).find(|i| !taken.contains(i) && fits(*i, slot)) else {
                    continue;
                };
                taken.push(i);
                let how = (ReleaseKind::LeadRelease, Placed::Lead);
                let (st, mv) =
                    stage(s, state, (i, held[i]), (k, slot), how, Joined::default(), now);
                usage.borrow_mut().add(counted_of(held[i]));
                slot.coming += 1;
                expired_left.retain(|x| *x != i);
                staged.push(st);
                moves.push(mv);
            }

            if staged.is_empty() {
                break;
            }
            // Every release of the round noted as begun, durably, before any move.
            if let Err(e) = state.save(s.state_dir) {
                let jobs: Vec<u32> = staged.iter().map(|st| held[st.i].id).collect();
                report
                    .problems
                    .push(format!("couldn't note the releases of jobs {jobs:?} as begun: {e}"));
            }
            let outcomes = slurm.moves(&moves);
            let mut failed = false;
            for (st, moved) in staged.into_iter().zip(outcomes) {
                failed |= !settle(s, state, held[st.i], st, moved, &mut slots, &mut report, now);
            }
            if !failed {
                break;
            }
        }
    }
    // 4. max_hold is a bound: an expired job no GPU takes now goes to Slurm (one that a
    //    release of this pass put over a limit waits for it, as in Slurm).
    for i in expired_left {
        if limited(held[i]).is_some() {
            continue;
        }
        taken.push(i);
        hand_back(slurm, s, state, held[i], &nodes, &HandBack::MaxHold, now, &mut report);
    }
    let released =
        report.leads.len() + report.joiners.len() + report.expired.len() + report.handed_back.len();
    report.still_held = held.len() > released;
    let released_ids: BTreeSet<u32> = report
        .leads
        .iter()
        .chain(&report.joiners)
        .chain(&report.expired)
        .map(|(j, _, _)| *j)
        .chain(report.handed_back.iter().map(|(j, _)| *j))
        .collect();
    report.next_expiry = held
        .iter()
        .filter(|j| !released_ids.contains(&j.id))
        .filter_map(|j| j.hold_started().map(|t| t + max_hold))
        .filter(|t| *t > now)
        .min_by(f64::total_cmp);
    Ok(report)
}

/// What `j` holds against the site's limits once released.
fn counted_of(j: &QueuedJob) -> Counted {
    crate::slurm::counted(&j.user, &j.account, &j.qos, &j.tres_per_node)
}

/// How long the site's limits are kept before they are read again, seconds: an admin's
/// change to a QOS or an association reaches kace within this.
pub const LIMITS_FRESH_S: f64 = 300.0;

/// The site's QOS and association limits, read at most once per [`LIMITS_FRESH_S`].
/// Unreadable: none are checked before a release (Slurm still enforces them, and a released
/// job it keeps pending for one is held again), said once per read.
fn site_limits(
    slurm: &dyn Slurm,
    state: &mut DeciderState,
    now: f64,
    report: &mut PassReport,
) -> Limits {
    if let Some((at, limits)) = &state.limits {
        if (0.0..LIMITS_FRESH_S).contains(&(now - at)) {
            return limits.clone();
        }
    }
    let limits = slurm.site_limits().unwrap_or_else(|e| {
        report.problems.push(format!(
            "couldn't read the site's QOS and association limits ({e}); none is checked before \
             a release until the next read"
        ));
        Limits::default()
    });
    state.limits = Some((now, limits.clone()));
    limits
}

/// The priority factors, read from Slurm at most once per `PriorityCalcPeriod` and only when
/// an order is to be chosen (two held jobs or more). Unreadable: submission order, said once
/// per read.
fn priority_inputs(
    slurm: &dyn Slurm,
    state: &mut DeciderState,
    held: usize,
    now: f64,
    report: &mut PassReport,
) -> PriorityInputs {
    if let Some((at, inputs)) = &state.priority {
        if (0.0..inputs.fresh_for_s()).contains(&(now - at)) {
            return inputs.clone();
        }
    }
    if held < 2 {
        return state.priority.as_ref().map(|p| p.1.clone()).unwrap_or_default();
    }
    match slurm.priority_inputs() {
        Ok(inputs) => {
            let first = state.priority.is_none();
            if first && !inputs.unmodelled().is_empty() {
                report.notes.push(format!(
                    "Slurm's priority weights {:?} are not in kace's estimate of a held job's \
                     priority (age, fair-share, partition, QOS and nice are)",
                    inputs.unmodelled()
                ));
            }
            state.priority = Some((now, inputs.clone()));
            inputs
        }
        Err(e) => {
            report.problems.push(format!(
                "couldn't read Slurm's priority factors ({e}); held jobs go in submission order"
            ));
            // Not asked again before the period is over.
            state.priority = Some((now, PriorityInputs::default()));
            PriorityInputs::default()
        }
    }
}

/// `j`'s estimated priority from the factors this decider last read, if any.
fn known_priority(state: &DeciderState, j: &QueuedJob, now: f64) -> Option<f64> {
    state.priority.as_ref().and_then(|(_, inputs)| priority::estimate(inputs, j, now))
}

/// The candidates a joiner is chosen from: the first `window` of `cands` (indices into
/// `held`, in Slurm's order), or only the first job passed over `window` times already.
fn within_window(
    cands: &[usize],
    held: &[&QueuedJob],
    state: &DeciderState,
    window: usize,
) -> Vec<usize> {
    let window = window.max(1);
    let due = cands
        .iter()
        .find(|&&i| state.overtaken.get(&held[i].id).is_some_and(|&n| n as usize >= window));
    match due {
        Some(&i) => vec![i],
        None => cands.iter().take(window).copied().collect(),
    }
}

/// Where the decider parks decision records while the spool is full or read-only.
fn park_dir(s: &Settings<'_>) -> std::path::PathBuf {
    s.state_dir.join("parked")
}

/// Writes a decision record into the spool, or parks it in [`park_dir`] when the spool cannot
/// take it. `Ok(Some(path))` of a parked record, with the reason said in `problems`.
fn spool_decision(
    s: &Settings<'_>,
    d: &SpooledDecision,
    problems: &mut Vec<String>,
) -> std::result::Result<Option<std::path::PathBuf>, String> {
    let park = park_dir(s);
    use std::os::unix::fs::DirBuilderExt;
    let _ = std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&park);
    match write_or_park(s.spool, &park, d) {
        Ok(Written::Spooled(_)) => Ok(None),
        Ok(Written::Parked { path, cause }) => {
            problems.push(format!(
                "couldn't spool the decision {} ({cause}); parked it as {} for a later pass",
                d.key,
                path.display()
            ));
            Ok(Some(path))
        }
        Err(e) => Err(format!("couldn't spool the decision {}: {e}", d.key)),
    }
}

/// Finishes the releases an earlier pass began (noted in `state.begun`): a job still held is
/// pinned where that pass sent it (its pin is kace's own) and released; one no longer held, or
/// gone, is forgotten.
fn finish_begun(
    slurm: &dyn Slurm,
    s: &Settings<'_>,
    state: &mut DeciderState,
    queue: &[QueuedJob],
    report: &mut PassReport,
) {
    let begun: Vec<(u32, Begun)> = state.begun.iter().map(|(j, b)| (*j, b.clone())).collect();
    for (id, b) in begun {
        match queue.iter().find(|j| j.id == id) {
            Some(j) if j.held() => {
                let target = Target { node: b.node.clone(), kind: b.kind.clone() };
                let moved = slurm
                    .pin(id, &target, b.shards, Some(&b.node), None)
                    .and_then(|()| slurm.release(id));
                match moved {
                    Ok(()) => report.resumed.push(id),
                    Err(e) => report.problems.push(format!(
                        "couldn't finish the release of job {id} an earlier pass began: {e}"
                    )),
                }
            }
            _ => {}
        }
        state.begun.remove(&id);
    }
    if !report.resumed.is_empty() || !state.begun.is_empty() {
        let _ = state.save(s.state_dir);
    }
}

/// How a job joins a slot: the decision that chose it (none for a lead or a hand-back), the
/// time limits its group needs, and the SM share it gets.
#[derive(Clone, Copy, Default)]
struct Joined<'a> {
    chosen: Option<&'a Chosen>,
    plan: &'a [(u32, f64, f64)],
    thread_pct: Option<u8>,
}

/// Which of the report's lists a staged release joins once its move is made.
#[derive(Debug, Clone, Copy)]
enum Placed {
    /// `PassReport::expired`.
    Expired,
    /// `PassReport::joiners`.
    Joiner,
    /// `PassReport::leads`.
    Lead,
}

/// A release a pass staged: its record spooled (or parked), its begun note and ticket written;
/// its move ([`Move`]) not made yet.
struct Staged {
    /// The job, as an index into the pass's held jobs.
    i: usize,
    /// Its slot, as an index into the pass's slots.
    k: usize,
    /// Which list it joins.
    placed: Placed,
    /// Its decision record.
    record: SpooledDecision,
    /// Where the record went: `Ok(None)` the spool, `Ok(Some(path))` parked, `Err` nowhere.
    spooled: std::result::Result<Option<PathBuf>, ()>,
    /// Whether its release ticket was written.
    ticketed: bool,
    /// Problems met on the way (a full spool), said with the release.
    problems: Vec<String>,
    /// Its SM share.
    thread_pct: Option<u8>,
    /// The time limits its move lengthens after the release: (job, from, to) seconds.
    others: Vec<(u32, f64, f64)>,
    /// Held jobs of higher priority it passes over (a joiner), and which of them it is the
    /// first to pass over: counted when staged (the rest of the round sees them), undone if
    /// the move fails.
    ahead: Vec<u32>,
    first_passed: Vec<u32>,
}

/// Stages the release of `j` into slot `k`: records the decision, notes the release as begun
/// (saved with the round's others before any move), writes the ticket; returns the move.
fn stage(
    s: &Settings<'_>,
    state: &mut DeciderState,
    (i, j): (usize, &QueuedJob),
    (k, slot): (usize, &Slot),
    (kind, placed): (ReleaseKind, Placed),
    joined: Joined<'_>,
    now: f64,
) -> (Staged, Move) {
    let Joined { chosen, plan, thread_pct } = joined;
    let (lead_job, lead_workload) = match slot.jobs.first() {
        Some(m) => (m.id.to_string(), m.workload.clone()),
        None => (j.id.to_string(), j.workload.clone()),
    };
    let joined = !slot.jobs.is_empty();
    let key_job = slot.key_job(kind, j.id).to_string();
    let mut d = SpooledDecision {
        key: release_key(kind, &s.cluster, &key_job, &slot.at.node, now),
        created_at: now,
        decision: NewDecision {
            lead_job: Some(lead_job),
            lead_workload,
            chosen_workload: joined.then(|| j.workload.clone()),
            chosen_job: joined.then(|| j.id.to_string()),
            model_version: chosen.and_then(|c| c.model_version),
            candidates: match chosen {
                Some(c) if !c.records.is_empty() => c.records.clone(),
                _ => vec![candidate_record(j, now, known_priority(state, j, now))],
            },
        },
    };
    let released = j.id.to_string();
    if let Some(c) = d.decision.candidates.iter_mut().find(|c| c.job.as_deref() == Some(&released))
    {
        c.time_limits = plan
            .iter()
            .map(|&(job, from_s, to_s)| TimeLimitChange { job: job.to_string(), from_s, to_s })
            .collect();
        c.thread_pct = thread_pct;
    }
    let mut problems = Vec::new();
    // The job is released even when the record could be neither spooled nor parked: a broken
    // spool must not hold kace jobs.
    let spooled = spool_decision(s, &d, &mut problems).map_err(|e| problems.push(e));
    // Counted now, so that the round's later choices see it (`selection.explore_pairs`).
    count_explored(state, &d.decision, &released);
    let shards = j.shards().unwrap_or(1);
    state
        .begun
        .insert(j.id, Begun { node: slot.at.node.clone(), kind: slot.at.kind.clone(), shards });
    // The prolog's word that this is a kace job of this workload, so that it need not ask
    // slurmctld (two RPCs on 22.05); without it the prolog asks, so a failure only costs that.
    // It also carries the job's SM share, which only the decider chooses: a job without its
    // ticket runs with none.
    let ticket =
        Ticket { node: slot.at.node.clone(), at: now, workload: j.workload.clone(), thread_pct };
    let ticketed = release_ticket::write(s.spool, j.id, &ticket)
        .map_err(|e| {
            problems.push(format!("couldn't write the release ticket of job {}: {e}", j.id))
        })
        .is_ok();
    let others: Vec<(u32, f64, f64)> = plan.iter().filter(|p| p.0 != j.id).copied().collect();
    let mv = Move {
        job: j.id,
        target: Target { node: slot.at.node.clone(), kind: slot.at.kind.clone() },
        shards,
        comment: partners_comment(j.id, j, slot),
        then: others
            .iter()
            .map(|&(id, _, to)| (id, (to / 60.0).ceil() as u64, partners_comment(id, j, slot)))
            .collect(),
    };
    let st = Staged {
        i,
        k,
        placed,
        record: d,
        spooled,
        ticketed,
        problems,
        thread_pct,
        others,
        ahead: Vec::new(),
        first_passed: Vec::new(),
    };
    (st, mv)
}

/// Settles a staged release once its move was made: forgets the begun note; on success keeps
/// what the release taught the decider and reports it; otherwise withdraws the record and the
/// ticket, undoes the round's counts and gives the slot back. Whether the job was released.
#[allow(clippy::too_many_arguments)]
fn settle(
    s: &Settings<'_>,
    state: &mut DeciderState,
    j: &QueuedJob,
    st: Staged,
    moved: Moved,
    slots: &mut [Slot],
    report: &mut PassReport,
    now: f64,
) -> bool {
    state.begun.remove(&j.id);
    let slot = &mut slots[st.k];
    let released = j.id.to_string();
    let mut problems = st.problems;
    if let Err(e) = moved.released {
        if st.ticketed {
            if let Err(e) = release_ticket::remove(s.spool, j.id) {
                problems.push(format!("couldn't remove the release ticket of job {}: {e}", j.id));
            }
        }
        let withdrawn = match st.spooled {
            Ok(None) => withdraw_decision(s.spool, &st.record.key).map_err(|w| w.to_string()),
            Ok(Some(parked)) => std::fs::remove_file(&parked).map_err(|w| w.to_string()),
            Err(()) => Ok(()),
        };
        if let Err(w) = withdrawn {
            problems.push(format!("couldn't withdraw its record: {w}"));
        }
        problems.insert(0, format!("couldn't release job {}: {e}", j.id));
        report.problems.push(problems.join("; "));
        uncount_explored(state, &st.record.decision, &released);
        for id in &st.ahead {
            if let Some(n) = state.overtaken.get_mut(id) {
                *n = n.saturating_sub(1);
            }
        }
        state.overtaken.retain(|_, n| *n > 0);
        for id in &st.first_passed {
            state.passed_over_since.remove(id);
        }
        slot.coming = slot.coming.saturating_sub(1);
        return false;
    }
    stop_inversion(state, j.id, now);
    if let Some(t) = st.thread_pct {
        state.thread_pcts.insert(j.id, t);
    }
    // Its GPU is known without asking Slurm when it runs.
    if slot.sole_of_kind {
        state.gpus.insert(j.id, (slot.at.node.clone(), vec![slot.at.index.0]));
    }
    if !problems.is_empty() {
        report.problems.push(problems.join("; "));
    }
    report.records.push(st.record);
    let at = (j.id, slot.at.node.clone(), slot.at.index.0);
    match st.placed {
        Placed::Expired => report.expired.push(at),
        Placed::Joiner => report.joiners.push(at),
        Placed::Lead => report.leads.push(at),
    }
    if !st.ahead.is_empty() {
        state.inversions_total += 1;
        report.passed_over.push((j.id, st.ahead));
    }
    for &(id, old, new) in st.others.iter().take(moved.then_done) {
        state.own_limits.entry(id).or_insert(old);
        report.lengthened.push((id, old, new));
    }
    if let (Some(e), Some((id, _, _))) = (moved.then_failed, st.others.get(moved.then_done)) {
        report.problems.push(format!("couldn't lengthen job {id}'s time limit for sharing: {e}"));
    }
    true
}

/// The `AdminComment` ([`crate::slurm::write_mark`]) of `id` once `joiner` joins `slot`'s
/// GPU: the joiner names the jobs on it; a job on it adds the joiner (and the others) to the
/// partners it had. Written only within an update the release makes anyway (the joiner's pin,
/// a job's lengthened limit), so recording costs no RPC; a job on the GPU whose limit is not
/// lengthened is named in the joiner's comment only (issue 29 item 6; ARCHITECTURE.md).
fn partners_comment(id: u32, joiner: &QueuedJob, slot: &Slot) -> Option<String> {
    let on_gpu: Vec<u32> = slot.jobs.iter().map(|m| m.id).collect();
    if id == joiner.id {
        return (!on_gpu.is_empty()).then(|| crate::slurm::write_mark(&joiner.workload, &on_gpu));
    }
    let m = slot.jobs.iter().find(|m| m.id == id)?;
    let mut partners = m.partners.clone();
    partners.extend(on_gpu.iter().filter(|&&other| other != id));
    partners.push(joiner.id);
    Some(crate::slurm::write_mark(&m.workload, &partners))
}

/// Job `id` waits no longer: the time since a lower-priority job was first released ahead of
/// it counts as priority inversion.
fn stop_inversion(state: &mut DeciderState, id: u32, now: f64) {
    if let Some(since) = state.passed_over_since.remove(&id) {
        state.inversion_seconds_total += (now - since).max(0.0);
    }
}

/// The shards of one whole GPU where `j` may run: the most any GPU node of its partitions has
/// per GPU (its own request when none is known), so that wherever Slurm starts it no kace job
/// can be crowded beside it on a GPU kace shares.
fn whole_gpu(j: &QueuedJob, nodes: &[NodeGpus]) -> u32 {
    let partitions = crate::slurm::split_words(&j.partition);
    nodes
        .iter()
        .filter(|n| partitions.is_empty() || n.partitions.iter().any(|p| partitions.contains(p)))
        .map(|n| n.shards_per_gpu)
        .max()
        .filter(|n| *n > 0)
        .unwrap_or_else(|| j.shards().unwrap_or(1))
}

/// Hands held job `j` back to Slurm (see [`Slurm::hand_back`]) and records why (a
/// [`ReleaseKind::HandBack`] record; the job is never held by kace again).
#[allow(clippy::too_many_arguments)]
fn hand_back(
    slurm: &dyn Slurm,
    s: &Settings<'_>,
    state: &mut DeciderState,
    j: &QueuedJob,
    nodes: &[NodeGpus],
    why: &HandBack,
    now: f64,
    report: &mut PassReport,
) {
    let d = SpooledDecision {
        key: release_key(ReleaseKind::HandBack, &s.cluster, &j.id.to_string(), "any", now),
        created_at: now,
        decision: NewDecision {
            lead_job: Some(j.id.to_string()),
            lead_workload: j.workload.clone(),
            chosen_workload: None,
            chosen_job: None,
            model_version: None,
            candidates: vec![DecisionCandidate {
                rejected: Some(why.to_string()),
                ..candidate_record(j, now, known_priority(state, j, now))
            }],
        },
    };
    let spooled = spool_decision(s, &d, &mut report.problems).map_err(|e| report.problems.push(e));
    match slurm.hand_back(j.id, whole_gpu(j, nodes)) {
        Ok(()) => {
            state.handed_back.insert(j.id);
            report.handed_back.push((j.id, why.to_string()));
            report.records.push(d);
        }
        Err(e) => {
            match spooled {
                Ok(None) => drop(withdraw_decision(s.spool, &d.key)),
                Ok(Some(parked)) => drop(std::fs::remove_file(parked)),
                Err(()) => {}
            }
            report.problems.push(format!("couldn't hand job {} back to Slurm: {e}", j.id));
        }
    }
}

/// Holds again the jobs kace released that Slurm will not start where or when kace put them:
/// pending for a policy reason ([`placement::policy_reason`]: a node Slurm will not give it, a
/// QOS or association limit), so that their GPU is not kept for them; and requeued ones
/// (preemption, a node's failure), which come back pinned to their old GPU. Each rests
/// [`REST_S`] (policy) or is offered at once (requeue). The ids held again.
fn hold_again(
    slurm: &dyn Slurm,
    s: &Settings<'_>,
    state: &mut DeciderState,
    queue: &[QueuedJob],
    now: f64,
    report: &mut PassReport,
) -> BTreeSet<u32> {
    let mut done = BTreeSet::new();
    let mut first_seen = false;
    for j in queue.iter().filter(|j| j.pending() && !j.held() && !j.req_nodes.is_empty()) {
        if state.handed_back.contains(&j.id) || state.begun.contains_key(&j.id) {
            continue;
        }
        let requeued = j.restarts > 0 && state.requeues.get(&j.id) != Some(&j.restarts);
        let why = if requeued {
            format!("Slurm requeued it (restart {}); it was pinned to {}", j.restarts, j.req_nodes)
        } else if placement::policy_reason(&j.reason) {
            let since = *state.policy_seen.entry(j.id).or_insert_with(|| {
                first_seen = true;
                now
            });
            if now - since < POLICY_GRACE_S {
                continue;
            }
            format!("Slurm keeps it pending on {}: {}", j.req_nodes, j.reason)
        } else {
            state.policy_seen.remove(&j.id);
            continue;
        };
        match slurm.hold_again(j.id) {
            Ok(()) => {
                if requeued {
                    state.requeues.insert(j.id, j.restarts);
                } else {
                    state.resting.insert(j.id, now + REST_S);
                }
                state.policy_seen.remove(&j.id);
                done.insert(j.id);
                report.held_again.push((j.id, why));
            }
            Err(e) => {
                report.problems.push(format!("couldn't hold job {} again ({why}): {e}", j.id))
            }
        }
    }
    if !done.is_empty() || first_seen {
        if let Err(e) = state.save(s.state_dir) {
            report.problems.push(format!("couldn't save the decider's state: {e}"));
        }
    }
    done
}

/// The time limits a group needs when `j` joins `slot`'s jobs (`selection.time_limit`):
/// (job, its limit now, the limit it needs), seconds, for each member whose limit is too short
/// at the group's predicted speed ([`placement::shared_limit`]). Each member runs at the
/// group's predicted normalised progress shared out evenly (the model predicts the group, not
/// each member); without that prediction, at 1 / members (time-slicing's share). `Err` says
/// why the pair is not formed. A joiner capped to `thread_pct` % of the SMs is planned no faster
/// than that share.
#[allow(clippy::too_many_arguments)]
fn time_plan(
    s: &Settings<'_>,
    state: &DeciderState,
    node: &NodeGpus,
    slot: &Slot,
    j: &QueuedJob,
    progress: Option<f64>,
    thread_pct: Option<u8>,
    now: f64,
) -> std::result::Result<Vec<(u32, f64, f64)>, String> {
    use kace_config::TimeLimit;
    if s.time_limit == TimeLimit::Ignore {
        return Ok(Vec::new());
    }
    let joiner = (j.id, j.time_limit_s, 0.0, crate::slurm::split_words(&j.partition));
    let members: Vec<(u32, Option<f64>, f64, Vec<String>)> = slot
        .jobs
        .iter()
        .map(|m| (m.id, m.limit_s, m.started.map_or(0.0, |t| now - t), m.partitions.clone()))
        .chain(std::iter::once(joiner))
        .collect();
    if s.time_limit == TimeLimit::Refuse {
        if let Some((id, _, _, _)) = members.iter().find(|m| m.1.is_some()) {
            return Err(format!("job {id} has a time limit (selection.time_limit = refuse)"));
        }
        return Ok(Vec::new());
    }
    let n = members.len() as f64;
    let speed = progress.map_or(1.0 / n, |p| p / n);
    let mut plan = Vec::new();
    for (id, limit, elapsed, partitions) in members {
        let Some(limit) = limit else { continue };
        // A joiner kace caps to `thread_pct` % of the SMs is assumed no faster than that share of
        // its alone speed (a compute-bound job's worst case); the lead only gains SMs by it.
        let speed = match thread_pct {
            Some(t) if id == j.id => speed.min(f64::from(t) / 100.0),
            _ => speed,
        };
        let own = state.own_limits.get(&id).copied().unwrap_or(limit);
        let max = placement::max_time(&partitions, node);
        match placement::shared_limit(limit, own, elapsed, speed, s.time_limit_cap, max) {
            Ok(Some(needed)) => plan.push((id, limit, needed)),
            Ok(None) => {}
            Err(why) => return Err(format!("job {id}: {why}")),
        }
    }
    Ok(plan)
}

/// Sets the time limit `plan` gives `job` itself, while it is held (before its release is
/// staged), remembering its own limit the first time (the cap counts from it). The GPU's other
/// jobs are lengthened by the move, after the release ([`Move::then`]).
fn lengthen_own(
    slurm: &dyn Slurm,
    state: &mut DeciderState,
    plan: &[(u32, f64, f64)],
    job: u32,
    report: &mut PassReport,
) -> std::result::Result<(), String> {
    for &(id, old, new) in plan.iter().filter(|p| p.0 == job) {
        slurm
            .set_time_limit(id, (new / 60.0).ceil() as u64, None)
            .map_err(|e| format!("couldn't lengthen job {id}'s time limit for sharing: {e}"))?;
        state.own_limits.entry(id).or_insert(old);
        report.lengthened.push((id, old, new));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: u32, w: &str, partners: &[u32]) -> Member {
        Member {
            id,
            workload: w.into(),
            user: "alice".into(),
            starting: false,
            limit_s: Some(3600.0),
            started: Some(0.0),
            partitions: Vec::new(),
            whole: false,
            partners: partners.to_vec(),
        }
    }

    #[test]
    fn a_joiner_names_the_gpus_jobs_and_each_adds_it_to_its_partners() {
        let slot = Slot {
            at: GpuAt { node: "n1".into(), index: GpuIndex(0), kind: None },
            node_at: 0,
            sole_of_kind: false,
            jobs: vec![member(10, "alpha", &[7]), member(12, "gamma", &[])],
            unknown: false,
            leaving: Vec::new(),
            coming: 0,
            others: false,
        };
        let joiner = QueuedJob { id: 11, workload: "beta".into(), ..QueuedJob::default() };
        let c = |id| partners_comment(id, &joiner, &slot);
        assert_eq!(c(11).as_deref(), Some("kace:beta shared=10,12"));
        assert_eq!(c(10).as_deref(), Some("kace:alpha shared=7,12,11"));
        assert_eq!(c(12).as_deref(), Some("kace:gamma shared=10,11"));
        assert_eq!(c(99), None, "not on the GPU");
        let alone = Slot { jobs: Vec::new(), ..slot.clone() };
        assert_eq!(partners_comment(11, &joiner, &alone), None, "a lead names no one");
    }

    #[test]
    fn an_exploratory_release_counts_its_new_workloads_and_survives_a_restart() {
        let mut state = DeciderState::default();
        let cand = |job: &str, explores: &[&str]| DecisionCandidate {
            explores: explores.iter().map(|w| w.to_string()).collect(),
            ..candidate_record(
                &QueuedJob { id: job.parse().unwrap(), ..QueuedJob::default() },
                0.0,
                None,
            )
        };
        let decision = NewDecision {
            lead_job: Some("1".into()),
            lead_workload: "bert".into(),
            chosen_workload: Some("fresh".into()),
            chosen_job: Some("3".into()),
            model_version: Some(1),
            candidates: vec![cand("3", &["fresh"]), cand("4", &[])],
        };
        // Job 3's release explored; job 4's would be any pair's and counts nothing.
        count_explored(&mut state, &decision, "3");
        count_explored(&mut state, &decision, "4");
        count_explored(&mut state, &decision, "9");
        count_explored(&mut state, &decision, "3");
        assert_eq!(state.explored, [("fresh".to_string(), 2)].into_iter().collect());
        let text = serde_json::to_string(&state).unwrap();
        let back: DeciderState = serde_json::from_str(&text).unwrap();
        assert_eq!(back.explored, state.explored);
        // A state written before the counts existed reads as none.
        let empty = serde_json::to_string(&DeciderState::default()).unwrap();
        assert!(!empty.contains("explored"));
    }
}
