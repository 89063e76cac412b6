//! What kace asks of Slurm, behind the [`Slurm`] trait: list pending kace jobs (one `squeue`),
//! read one job's allocation, pin a held job to a node and GPU, and release it. [`Commands`]
//! runs the real programs by absolute path with a timeout each; the parsers are pure and tested
//! on what Slurm 22.05, 25.11 and 26.05 print (`node/tests/fixtures/`).
//!
//! Nothing kace reads can be written by a job's user. The pending-queue listing asks `squeue -O`
//! only for fields users cannot set (ids, the admin-only AdminComment, Slurm's own state, reason,
//! GRES, dependency and time fields) and reads each line strictly: the field count and a
//! numeric id, or the line is skipped and logged (a newline in one job's AdminComment must not
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

/// The `squeue -O` format kace reads its jobs with: only fields no user can write.
pub const QUEUE_FORMAT: &str = "JobID:|,admin_comment:|,UserName:|,Reason:|,tres-per-node:|,\
                                SubmitTime:|,ReqNodes:|,StateCompact:|,Dependency:|,EligibleTime:|,\
                                StartTime:|,EndTime:|";

/// The number of fields in [`QUEUE_FORMAT`].
const QUEUE_FIELDS: usize = 12;

/// How long after its job's start (or end) a kace prolog (or epilog) may still be choosing a
/// joiner, beyond its own budget (`node.prolog_budget_ms`): slurmd launches the hook a moment
/// after slurmctld allocates, and the controller's and the node's clocks may differ a little.
pub const HOOK_LAUNCH_SLACK_S: f64 = 30.0;

/// How long after its job started (or ended) a kace hook can still be choosing: its budget
/// plus [`HOOK_LAUNCH_SLACK_S`]. A job starting or completing for longer has no kace hook
/// choosing any more; nobody waits for it.
pub fn hook_window_s(node: &kace_config::Node) -> f64 {
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

    /// Whether it is completing: its epilog may be refilling its GPU.
    pub fn completing(&self) -> bool {
        self.state == "CG"
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

    /// Whether its prolog or epilog may be choosing a joiner at `now`: it is starting or
    /// completing, and for no longer than `window_s` ([`hook_window_s`]; always, when Slurm
    /// gave no time). A job Slurm shows starting for longer has no kace hook left choosing: a
    /// batch job whose slurmd restarted during its prolog stays "running, reason Prolog" until
    /// an admin requeues it, and waiting for it would hold every kace job.
    pub fn deciding(&self, now: f64, window_s: f64) -> bool {
        (self.starting() || self.completing())
            && self.in_hook_for(now).is_none_or(|t| t <= window_s)
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
        self.admin_comment.strip_prefix(MARK).filter(|w| !w.is_empty())
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeGpus {
    /// Node name.
    pub name: String,
    /// GPU types in index order (`None` entries when untyped).
    pub gpus: Vec<Option<String>>,
    /// Whether Slurm may start jobs there (not down, drained or draining).
    pub usable: bool,
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

/// What kace needs from Slurm.
pub trait Slurm {
    /// Every pending or starting job the gate marked as a kace job, oldest first (one
    /// `squeue`).
    fn kace_queue(&self) -> Result<Vec<QueuedJob>>;
    /// One job's details and allocation.
    fn job(&self, id: u32) -> Result<JobDetail>;
    /// Ids of the jobs Slurm has on `node` (any state but pending).
    fn jobs_on_node(&self, node: &str) -> Result<Vec<u32>>;
    /// Pins a pending job to `target`, asking for `shards` shards of its GPU when typed.
    fn pin(&self, id: u32, target: &Target, shards: u32) -> Result<()>;
    /// Releases a held job.
    fn release(&self, id: u32) -> Result<()>;
    /// Running, configuring or completing kace jobs and the GPUs they hold (for dispatch; one
    /// `squeue`).
    fn running_kace_jobs(&self) -> Result<Vec<RunningJob>>;
    /// The cluster's nodes and their GPUs (for dispatch).
    fn nodes(&self) -> Result<Vec<NodeGpus>>;
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
        }
    }

    fn call(&self, program: &std::path::Path, args: &[&str]) -> Result<String> {
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
        Ok(exec::run_ok(&inv, timeout)?)
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

    fn scontrol(&self, args: &[&str]) -> Result<String> {
        self.call(&self.scontrol, args)
    }

    /// `squeue --json` with `args`, every readable record. Slurm 22.05 ignores `-j` and `-t`
    /// with `--json`, so callers filter what comes back themselves.
    fn json_jobs(&self, args: &[&str]) -> Result<Vec<slurm_json::JsonJob>> {
        let mut full = vec!["--json"];
        full.extend_from_slice(args);
        let out = self.call(&self.squeue, &full)?;
        self.read_json_jobs(&out, "squeue")
    }
}

impl Slurm for Commands {
    fn kace_queue(&self) -> Result<Vec<QueuedJob>> {
        let out = self.call(&self.squeue, &["-h", "-t", QUEUE_STATES, "-O", QUEUE_FORMAT])?;
        let (jobs, unreadable) = parse_queue(&out);
        for line in unreadable {
            self.logger.line(&format!(
                "kace: slurm: couldn't read a line of squeue's queue listing, skipped it: {line:?}"
            ));
        }
        Ok(jobs)
    }

    fn job(&self, id: u32) -> Result<JobDetail> {
        let id_text = id.to_string();
        // `scontrol --json show job ID` (23.02 on) loads that one job; `squeue --json -j ID`
        // loads the whole queue (22.05 even prints it all), which costs more the longer the
        // queue. Which one this scontrol supports is learnt once per process.
        let jobs = if SCONTROL_JSON.get() == Some(&false) {
            self.json_jobs(&["-j", &id_text])?
        } else {
            match self.scontrol(&["--json", "show", "job", &id_text]) {
                Ok(out) => {
                    let _ = SCONTROL_JSON.set(true);
                    self.read_json_jobs(&out, "scontrol")?
                }
                Err(Error::Exec(ExecError::Failed { stderr, .. }))
                    if SCONTROL_JSON.get().is_none() && stderr.contains("unrecognized option") =>
                {
                    let _ = SCONTROL_JSON.set(false);
                    self.json_jobs(&["-j", &id_text])?
                }
                Err(e) => return Err(e),
            }
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

    fn jobs_on_node(&self, node: &str) -> Result<Vec<u32>> {
        let out = self.call(&self.squeue, &["-h", "-w", node, "-O", "JobID:|"])?;
        Ok(parse_ids(&out))
    }

    fn pin(&self, id: u32, target: &Target, shards: u32) -> Result<()> {
        let id_text = id.to_string();
        let job = format!("jobid={id}");
        let nodes = format!("NodeList={}", target.node);
        // Another decider (dispatch, another node's hook) may have moved this job since the
        // caller's listing, and Slurm has no compare-and-set: the job is read again just before
        // the first change and left alone unless it is still held and nobody pinned it. Changing
        // a request another decider had already typed (cleared, then set) left the job pending
        // for ever on Slurm 22.05, and crashed its scheduler (a divide error) when the job had
        // been released meanwhile: found by tests/tests/load.rs, kept by tests/tests/retarget.rs.
        let out = self
            .call(&self.squeue, &["-h", "-j", &id_text, "-t", QUEUE_STATES, "-O", QUEUE_FORMAT])?;
        let (listed, _) = parse_queue(&out);
        let taken = |why: String| Error::Taken { job: id, why };
        let Some(now) = listed.into_iter().find(|j| j.id == id) else {
            return Err(taken("Slurm lists it no longer".into()));
        };
        if !now.held() {
            return Err(taken(format!("it is no longer held ({} {})", now.state, now.reason)));
        }
        if !now.req_nodes.is_empty() && now.req_nodes != target.node {
            return Err(taken(format!("it is pinned to {} already", now.req_nodes)));
        }
        let asked = gres::request_kind(&now.tres_per_node, "shard");
        match (&target.kind, asked) {
            (Some(kind), Some(asked)) if *kind != asked => {
                return Err(taken(format!("it asks for GPU type {asked} already")));
            }
            // Typed already (by its user): only the node changes.
            (Some(_), Some(_)) | (None, _) => {
                self.scontrol(&["update", &job, &nodes])?;
            }
            // Slurm up to 25.05 refuses a direct untyped→typed GRES change; clearing
            // TresPerNode first works on every release (shared/reference/slurm-lab-2.md §2).
            // The direct change is tried first: where Slurm takes it, the request is never
            // empty, which is when a release by a decider racing this one (between the read
            // above and the clear) crashes 22.05's scheduler.
            (Some(kind), None) => {
                let gres = format!("Gres=shard:{kind}:{shards}");
                if self.scontrol(&["update", &job, &gres, &nodes]).is_err() {
                    self.scontrol(&["update", &job, "TresPerNode="])?;
                    self.scontrol(&["update", &job, &gres, &nodes])?;
                }
            }
        }
        Ok(())
    }

    fn release(&self, id: u32) -> Result<()> {
        self.scontrol(&["release", &id.to_string()]).map(drop)
    }

    fn running_kace_jobs(&self) -> Result<Vec<RunningJob>> {
        let jobs = self.json_jobs(&["-t", "R,CF,CG"])?;
        Ok(running_kace_jobs(jobs))
    }

    fn nodes(&self) -> Result<Vec<NodeGpus>> {
        let out = self.call(&self.sinfo, &["-h", "-N", "-O", "NodeList:|,Gres:|,StateLong:|"])?;
        Ok(parse_nodes(&out))
    }
}

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
    let mut jobs = Vec::new();
    let mut unreadable = Vec::new();
    for line in out.lines().filter(|l| !l.trim().is_empty()) {
        let Some(f) = strict_fields(line, QUEUE_FIELDS) else {
            unreadable.push(short(line));
            continue;
        };
        let Ok(id) = f[0].parse::<u32>() else {
            unreadable.push(short(line));
            continue;
        };
        let Some(workload) = f[1].strip_prefix(MARK) else { continue };
        let none =
            |v: &str| if matches!(v, "N/A" | "(null)") { String::new() } else { v.to_string() };
        jobs.push(QueuedJob {
            id,
            workload: workload.to_string(),
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
        });
    }
    jobs.sort_by_key(|j| j.id);
    (jobs, unreadable)
}

/// The running, configuring or completing kace jobs among JSON records, with the GPUs each
/// holds.
pub fn running_kace_jobs(jobs: Vec<slurm_json::JsonJob>) -> Vec<RunningJob> {
    jobs.into_iter()
        .filter(|j| matches!(j.state.as_str(), "RUNNING" | "CONFIGURING" | "COMPLETING"))
        .filter(|j| j.admin_comment.starts_with(MARK))
        .map(|j| {
            let mut gpus: Vec<u32> = j
                .gres
                .iter()
                .filter(|g| g.count > 0)
                .flat_map(|g| g.indices.iter().copied())
                .collect();
            gpus.sort_unstable();
            gpus.dedup();
            let state = match j.state.as_str() {
                "CONFIGURING" => "CF",
                "COMPLETING" => "CG",
                _ => "R",
            };
            let workload = j.admin_comment.strip_prefix(MARK).unwrap_or("").to_string();
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

/// Parses `sinfo -h -N -O NodeList:|,Gres:|,StateLong:|`.
pub fn parse_nodes(out: &str) -> Vec<NodeGpus> {
    let mut nodes: BTreeMap<String, NodeGpus> = BTreeMap::new();
    for line in out.lines() {
        let Some(f) = strict_fields(line, 3) else { continue };
        if f[0].is_empty() {
            continue;
        }
        let state = f[2].to_ascii_lowercase();
        let usable = !["down", "drain", "fail", "maint", "reserved", "not_responding"]
            .iter()
            .any(|s| state.contains(s))
            && !state.ends_with('*');
        let gpus = gres::node_gpus(f[1]);
        nodes.insert(f[0].to_string(), NodeGpus { name: f[0].to_string(), gpus, usable });
    }
    nodes.into_values().collect()
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
    fn pending_kace_jobs_are_read_and_others_skipped() {
        let out = "12|kace:bert|alice|JobHeldUser|gres:shard:1|2026-11-29T06:58:46|(null)|PD|(null)|N/A|N/A|N/A|\n\
                   11|(null)|bob|Resources|N/A|2026-11-29T06:58:40||PD|(null)|N/A|N/A|N/A|\n\
                   10|kace:lstm|alice|None|gres/shard:g1:2|2026-11-29T06:58:00|n1|PD|(null)|2026-11-29T06:58:00|2026-11-29T07:00:00|NONE|\n\
                   14|kace:wav|alice|Prolog|gres/shard:1|2026-11-29T06:58:00|n2|R|(null)|N/A|2026-11-29T06:58:40|2026-11-29T07:58:40|\n";
        let (jobs, bad) = parse_queue(out);
        assert!(bad.is_empty(), "{bad:?}");
        assert_eq!(jobs.len(), 3);
        assert!(jobs[2].starting() && !jobs[2].pending());
        assert_eq!(jobs[2].started, Some(1_795_935_520.0));
        // Starting 40 s ago: its prolog may choose within a 35 s window no longer.
        let start = 1_795_935_520.0;
        assert!(jobs[2].deciding(start + 30.0, 35.0) && !jobs[2].stuck(start + 30.0, 35.0));
        assert!(!jobs[2].deciding(start + 40.0, 35.0) && jobs[2].stuck(start + 40.0, 35.0));
        assert!(!jobs[0].deciding(start, 35.0) && !jobs[0].stuck(start + 1e6, 35.0));
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
    }

    #[test]
    fn a_newline_in_one_admin_comment_skips_only_its_pieces() {
        // 26.05.3, root: scontrol update jobid=8 AdminComment=$'line1\nline2|x'.
        let out = "8|line1\n\
                   line2|x|root|None|gres/shard:1|2026-12-01T01:12:57||PD|(null)|2026-12-01T01:12:57|N/A|N/A|\n\
                   5|kace:bert|root|JobHeldUser|gres/shard:1|2026-12-01T01:12:56||PD|(null)|N/A|N/A|N/A|\n\
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
    fn nodes_and_their_gpus() {
        let out = "n1|gpu:g0:1,gpu:g1:1,shard:g0:2,shard:g1:2|idle|\n\
                   n2|gpu:1,shard:4|mixed|\nn3|gpu:2(S:0),shard:8|drained|\nn4|(null)|idle|\n";
        let n = parse_nodes(out);
        assert_eq!(n[0].gpus, vec![Some("g0".to_string()), Some("g1".to_string())]);
        assert_eq!((n[1].gpus.len(), n[1].usable), (1, true));
        assert_eq!((n[2].gpus.len(), n[2].usable), (2, false));
        assert!(n[3].gpus.is_empty());
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
