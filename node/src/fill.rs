//! Filling one GPU on its node, under the GPU's lock: a lead's prolog, a joiner's prolog (while
//! the GPU has room) and the epilog of a job that leaves kace jobs behind all come here. It
//! lists the kace queue once, makes the one decision ([`kace_sql::decide::decide`]) for the
//! kace jobs on the GPU, releases the best candidate pinned to this node and GPU (trying the
//! next ones in the decision's order when one can no longer be released) and spools the
//! decision with every candidate's prediction or reason.

use std::time::{Duration, Instant};

use kace_layout::GpuIndex;
use kace_sql::decide::{decide, JobSpec};
use kace_sql::spool::{release_key, write_or_park, ReleaseKind, SpooledDecision, Written};
use kace_sql::{DecisionCandidate, NewDecision};

use crate::slurm::{QueuedJob, Target};
use crate::state::{self, Expectation, GpuLock, JobRecord};
use crate::Node;

/// At most this many candidates are tried when the chosen one cannot be released (it was
/// cancelled or taken by another decider meanwhile).
const RELEASE_TRIES: usize = 3;

/// Where a decision's time went.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Timings {
    /// Slurm commands (squeue, scontrol show/update/release).
    pub slurm: Duration,
    /// Opening the database, reading the model and the profiles.
    pub db: Duration,
    /// Filtering and predicting.
    pub predict: Duration,
    /// The whole hook up to the release (or to giving up).
    pub total: Duration,
}

/// The GPU being filled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuAt {
    /// Its node.
    pub node: String,
    /// Its index on the node.
    pub index: GpuIndex,
    /// Its type, when the node's GPUs are typed (joiners are pinned to it).
    pub kind: Option<String>,
}

/// Who asks for the GPU to be filled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// A kace job started (a lead, or a joiner that left room); it splits the held jobs with
    /// other kace jobs starting at the same moment.
    Start,
    /// A kace job left the GPU (its epilog).
    End,
}

impl Trigger {
    fn phase(self) -> &'static str {
        match self {
            Trigger::Start => "prolog",
            Trigger::End => "epilog",
        }
    }

    fn kind(self) -> ReleaseKind {
        match self {
            Trigger::Start => ReleaseKind::Lead,
            Trigger::End => ReleaseKind::Refill,
        }
    }
}

/// The hook that asks: why, for which job, in which cluster (the decision's spool key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Asker<'a> {
    /// A start or an end.
    pub trigger: Trigger,
    /// The job whose prolog or epilog runs.
    pub job: u32,
    /// `SLURM_CLUSTER_NAME`.
    pub cluster: &'a str,
}

/// What filling did.
#[derive(Debug, Clone, PartialEq)]
pub struct Filled {
    /// The released joiner, if any.
    pub partner: Option<u32>,
    /// The decision as spooled (`None` when none was made or it could not be spooled).
    pub decision: Option<Box<SpooledDecision>>,
    /// Where the time went.
    pub timings: Timings,
    /// Why nothing was decided, when nothing was (already logged).
    pub skipped: Option<String>,
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

/// A held job as a decision record lists it, before the decision's verdict: its id, workload
/// and how long it has been held at `now` (the released one's is its hold time).
pub fn candidate_record(j: &QueuedJob, now: f64) -> DecisionCandidate {
    DecisionCandidate {
        job: Some(j.id.to_string()),
        workload: j.workload.clone(),
        prediction: None,
        rejected: None,
        held_s: j.hold_started().map(|t| (now - t).max(0.0)),
    }
}

/// Fills `gpu` (whose lock the caller holds) by one joiner when it has room.
pub fn fill(
    n: &Node,
    lock: &GpuLock,
    gpu: &GpuAt,
    asker: Asker<'_>,
    mut timings: Timings,
    started: Instant,
) -> Filled {
    let Asker { trigger, job: trigger_job, cluster } = asker;
    let phase = trigger.phase();
    let log = |m: &str| (n.log)(&format!("kace: {phase}: job {trigger_job}: {m}"));
    let skip = |timings: Timings, why: String| {
        log(&why);
        Filled { partner: None, decision: None, timings, skipped: Some(why) }
    };
    // A joiner pinned to a node of typed GPUs without its GPU's type goes to whichever GPU
    // Slurm picks: the type is read from the node's configuration when the caller lacks it.
    let resolved;
    let gpu = match &gpu.kind {
        Some(_) => gpu,
        None => {
            let t = Instant::now();
            let nodes = n.slurm.nodes();
            timings.slurm += t.elapsed();
            match nodes {
                Ok(nodes) => {
                    let kind = nodes
                        .iter()
                        .find(|x| x.name == gpu.node)
                        .and_then(|x| x.gpus.get(gpu.index.0 as usize).cloned().flatten());
                    resolved = GpuAt { kind, ..gpu.clone() };
                    &resolved
                }
                Err(e) => {
                    return skip(
                        timings,
                        format!("couldn't read the node's GPU types: {e}; no joiner"),
                    )
                }
            }
        }
    };
    let running: Vec<JobRecord> = lock.running();
    let limit = n.config.selection.max_jobs_per_gpu;
    if running.is_empty() {
        return skip(timings, format!("GPU {} has no kace job to fill for", gpu.index.0));
    }
    if running.len() >= limit {
        return skip(
            timings,
            format!(
                "GPU {} holds {} kace jobs (at most {limit}): no joiner",
                gpu.index.0,
                running.len()
            ),
        );
    }
    let t = Instant::now();
    let queue = n.slurm.kace_queue();
    timings.slurm += t.elapsed();
    let queue = match queue {
        Ok(q) => q,
        Err(e) => {
            return skip(timings, format!("couldn't list the held kace jobs: {e}; no joiner"))
        }
    };
    let coming: Vec<u32> = queue.iter().filter(|j| in_flight_to(j, gpu)).map(|j| j.id).collect();
    if !coming.is_empty() {
        // A joiner released by another decider is on its way; its own prolog fills what room
        // is left once it runs, so the GPU is never promised to more jobs than it may hold.
        return skip(
            timings,
            format!(
                "job(s) {coming:?} already released to {} GPU {}: no other joiner now",
                gpu.node, gpu.index.0
            ),
        );
    }

    // Kace jobs starting or ending at the same moment on other GPUs see the same held jobs, and
    // Slurm has no compare-and-set to claim one: they split the queue, each taking every k-th
    // held job by its rank among the deciding jobs (ids in order), so two hooks never pick the
    // same job.
    // A job Slurm shows starting for longer than any hook runs has nobody choosing for it.
    let now = n.clock.now();
    let window = crate::slurm::hook_window_s(&n.config.node);
    let mut deciding: Vec<u32> =
        queue.iter().filter(|j| j.deciding(now, window)).map(|j| j.id).collect();
    if !deciding.contains(&trigger_job) {
        deciding.push(trigger_job);
    }
    deciding.sort_unstable();
    let k = deciding.len();
    let rank = deciding.iter().position(|j| *j == trigger_job).unwrap_or(0);
    if k > 1 {
        log(&format!(
            "{k} kace jobs are starting or ending at once ({deciding:?}); considering held jobs {rank}, {rank}+{k}, ... of the queue"
        ));
    }
    let on_gpu: Vec<u32> = running.iter().map(|r| r.job).collect();
    let held: Vec<&QueuedJob> = queue
        .iter()
        .filter(|j| j.held() && !on_gpu.contains(&j.id))
        .enumerate()
        .filter(|(i, _)| i % k == rank)
        .map(|(_, j)| j)
        .collect();

    let mut records: Vec<DecisionCandidate> =
        held.iter().map(|j| candidate_record(j, now)).collect();
    let mut specs = Vec::new();
    let mut spec_of = Vec::new(); // index into `held` of each spec
    for (i, j) in held.iter().enumerate() {
        if let Some(why) = j.blocked(now) {
            records[i].rejected = Some(format!("{why}, so it would not start beside them"));
        } else if j.shards().is_none() {
            records[i].rejected = Some("asks for no shard, so it cannot share a GPU".into());
        } else if kace_sql::validate_workload_name(&j.workload).is_err() {
            records[i].rejected = Some("its workload name is not valid".into());
        } else {
            specs.push(JobSpec {
                workload: j.workload.clone(),
                user: Some(j.user.clone()).filter(|u| !u.is_empty()),
            });
            spec_of.push(i);
        }
    }
    let running_specs: Vec<JobSpec> = running
        .iter()
        .map(|r| JobSpec { workload: r.workload.clone(), user: r.user.clone() })
        .collect();

    let (memory, note) = crate::gpu::memory_gib(n.gpus, gpu.index, n.config.node.gpu_memory_gib);
    if let Some(why) = note {
        match memory {
            Some(g) => log(&format!(
                "couldn't read GPU {} memory ({why}); using the configured {g} GiB",
                gpu.index.0
            )),
            None => log(&format!(
                "couldn't read GPU {} memory ({why}) and none is configured; memory is not checked",
                gpu.index.0
            )),
        }
    }
    let policy = n.config.policy();

    let mut model_version = None;
    let mut order: Vec<usize> = Vec::new(); // indices into `held`, best first
    if !specs.is_empty() {
        let t = Instant::now();
        let decided = n
            .check_budget("reading the database")
            .and_then(|()| {
                // Wait for a writer's lock only as long as the budget allows.
                let left = n.deadline.saturating_duration_since(Instant::now());
                Ok(kace_sql::Db::open_read_only_within(&n.config.database.path, left)?)
            })
            .and_then(|db| Ok(decide(&db, &running_specs, &specs, &policy, memory, None)?));
        match decided {
            Ok(d) => {
                timings.db = t.elapsed().saturating_sub(d.predict_time);
                timings.predict = d.predict_time;
                model_version = Some(d.model_version);
                for (s, v) in d.selection.verdicts.iter().enumerate() {
                    let r = &mut records[spec_of[s]];
                    r.prediction = v.prediction;
                    r.rejected = d.reason(s);
                }
                order = d.ranked.iter().map(|&s| spec_of[s]).collect();
            }
            Err(e) => {
                timings.db = t.elapsed();
                log(&format!("couldn't choose a partner: {e}; none is released"));
                for &i in &spec_of {
                    records[i].rejected = Some(format!("not evaluated: {e}"));
                }
            }
        }
    }

    let target = Target { node: gpu.node.clone(), kind: gpu.kind.clone() };
    let lead = &running[0];
    let mut partner = None;
    for &i in order.iter().take(RELEASE_TRIES) {
        let job = held[i];
        if let Err(e) = n.check_budget("releasing a joiner") {
            records[i].rejected = Some(format!("chosen, but {e}"));
            log(&format!("couldn't release job {}: {e}", job.id));
            break;
        }
        // Another decider may have taken it since the listing, or its user cancelled it: only
        // a job still held is moved.
        let t = Instant::now();
        let still = n.slurm.job(job.id);
        timings.slurm += t.elapsed();
        match still {
            Ok(d) if d.held() => {}
            Ok(d) => {
                let why = format!("chosen, but no longer held ({} {})", d.state, d.reason);
                log(&format!("couldn't release chosen job {}: {why}", job.id));
                records[i].rejected = Some(why);
                continue;
            }
            Err(e) => {
                log(&format!("couldn't check chosen job {}: {e}", job.id));
                records[i].rejected = Some(format!("chosen, but couldn't be checked: {e}"));
                continue;
            }
        }
        // Dispatch (on the controller) may have sent a joiner here since the listing.
        let t = Instant::now();
        let again = n.slurm.kace_queue();
        timings.slurm += t.elapsed();
        if let Ok(q) = again {
            if let Some(other) = q.iter().find(|j| in_flight_to(j, gpu)) {
                let why = format!("chosen, but job {} was sent to this GPU meanwhile", other.id);
                log(&format!("couldn't release chosen job {}: {why}", job.id));
                records[i].rejected = Some(why);
                break;
            }
        }
        // A prolog whose slurmd died meanwhile belongs to a job Slurm will not start until it
        // is requeued: a joiner sent here would wait beside a job that runs nothing.
        if trigger == Trigger::Start && !n.host.slurmd_alive() {
            let pid = n.host.slurmd_pid().map_or_else(String::new, |p| format!(" (pid {p})"));
            let why = format!(
                "chosen, but the slurmd{pid} that runs this prolog ended while it ran: Slurm starts \
                 job {trigger_job} only once it is requeued"
            );
            log(&format!("couldn't release chosen job {}: {why}", job.id));
            records[i].rejected = Some(why);
            break;
        }
        let exp = Expectation { lead: lead.job, node: gpu.node.clone(), gpu: gpu.index.0 };
        if let Err(e) = state::expect(&n.config.node.state_dir, job.id, &exp) {
            log(&format!("couldn't note joiner {}: {e}", job.id));
        }
        let t = Instant::now();
        let shards = job.shards().unwrap_or(1);
        let released = n.slurm.pin(job.id, &target, shards).and_then(|()| n.slurm.release(job.id));
        timings.slurm += t.elapsed();
        match released {
            Ok(()) => {
                partner = Some(job.id);
                break;
            }
            Err(e) => {
                let _ = state::take_expectation(&n.config.node.state_dir, job.id);
                log(&format!("couldn't release chosen job {} ({}): {e}", job.id, job.workload));
                records[i].rejected = Some(format!("chosen, but couldn't be released: {e}"));
            }
        }
    }
    timings.total = started.elapsed();

    let chosen = partner.and_then(|p| held.iter().find(|j| j.id == p));
    let decision = SpooledDecision {
        key: release_key(trigger.kind(), cluster, &trigger_job.to_string(), &gpu.node, now),
        created_at: now,
        decision: NewDecision {
            lead_job: Some(lead.job.to_string()),
            lead_workload: lead.workload.clone(),
            chosen_workload: chosen.map(|j| j.workload.clone()),
            chosen_job: chosen.map(|j| j.id.to_string()),
            model_version,
            candidates: records,
        },
    };
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let what = match chosen {
        Some(j) => {
            format!("released job {} ({}) onto {} GPU {}", j.id, j.workload, gpu.node, gpu.index.0)
        }
        None => "no joiner".to_string(),
    };
    let group: Vec<String> =
        running.iter().map(|r| format!("{} ({})", r.job, r.workload)).collect();
    let whose = match (trigger, running.as_slice()) {
        (Trigger::Start, [only]) if only.job == trigger_job => {
            format!("lead {} on GPU {}", only.workload, gpu.index.0)
        }
        _ => format!("GPU {} with {}", gpu.index.0, group.join(", ")),
    };
    log(&format!(
        "{whose}: {what}, of {} held kace job(s); timing: slurm={:.2}ms db={:.2}ms predict={:.2}ms total={:.2}ms",
        held.len(),
        ms(timings.slurm),
        ms(timings.db),
        ms(timings.predict),
        ms(timings.total)
    ));
    let spooled = match write_or_park(&n.config.spool.dir, &n.config.node.progress_root, &decision)
    {
        Ok(Written::Spooled(_)) => Some(Box::new(decision)),
        Ok(Written::Parked { path, cause }) => {
            log(&format!(
                "couldn't spool the decision {} ({cause}); parked it as {} for a later epilog",
                decision.key,
                path.display()
            ));
            Some(Box::new(decision))
        }
        Err(e) => {
            log(&format!("couldn't spool the decision: {e}"));
            None
        }
    };
    Filled { partner, decision: spooled, timings, skipped: None }
}
