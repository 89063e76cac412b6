//! `kace-prolog`'s logic. For a kace job: record it on its GPU and make sure that GPU's MPS
//! control daemon runs (under the GPU's lock, so two prologs racing start one daemon); if no
//! other kace job uses the GPU, the job is a lead: list the kace jobs (one `squeue`), read
//! the active model and the profiles (read-only DB), choose, pin the best candidate to this node
//! and GPU, release it, and spool the decision with every candidate's prediction or rejection.
//! A plain job returns at once.

use std::time::{Duration, Instant};

use kace_layout::{mps_dirs, progress_file, GpuIndex};
use kace_profiling::progress::CreateError as ProgressCreateError;
use kace_selector::{Rejection, SelectionRules};
use kace_sql::decide::{decide, CandidateSpec};
use kace_sql::spool::{write_decision, SpooledDecision};
use kace_sql::{DecisionCandidate, NewDecision};

use crate::env::JobEnv;
use crate::error::Result;
use crate::slurm::{QueuedJob, Target};
use crate::state::{self, Expectation};
use crate::Node;

/// At most this many candidates are tried when the chosen one cannot be released (it was
/// cancelled or started meanwhile).
const RELEASE_TRIES: usize = 3;

/// Where the prolog's time went.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Timings {
    /// Slurm commands (squeue, scontrol show/update/release).
    pub slurm: Duration,
    /// Opening the database, reading the model and the profiles.
    pub db: Duration,
    /// Filtering and predicting.
    pub predict: Duration,
    /// The whole prolog up to the release (or to giving up).
    pub total: Duration,
}

/// What the prolog did.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Not a kace job: nothing to do.
    NotKace,
    /// A kace job without a GPU index in its environment.
    NoGpu,
    /// The GPU already had kace jobs: this one joined them.
    Joined {
        /// The kace jobs already there.
        with: Vec<u32>,
    },
    /// The job leads its GPU; this is what it chose.
    Led {
        /// The released partner, if any.
        partner: Option<u32>,
        /// The decision as spooled (`None` when it could not be made at all).
        decision: Option<Box<SpooledDecision>>,
        /// Where the time went.
        timings: Timings,
    },
    /// Something stopped it early; the message says what (already logged).
    Stopped(String),
}

/// Runs the prolog for `env`. Never fails: every problem is logged and ends in
/// [`Outcome::Stopped`] or a lead without a partner, and the job runs.
pub fn run(n: &Node, env: &JobEnv) -> Outcome {
    let started = Instant::now();
    if !env.kace {
        return Outcome::NotKace;
    }
    let log = |m: &str| (n.log)(&format!("kace: prolog: job {}: {m}", env.job));
    let Some(gpu) = env.gpu else {
        log("couldn't find the job's GPU: neither SLURM_JOB_GPUS nor CUDA_VISIBLE_DEVICES holds a GPU index; it runs without kace");
        return Outcome::NoGpu;
    };
    let mut timings = Timings::default();

    let t = Instant::now();
    let detail = n.slurm.job(env.job);
    timings.slurm += t.elapsed();
    let (workload, kind) = match &detail {
        Ok(d) => (d.workload().map(str::to_string), d.on_gpu(gpu.0).and_then(|g| g.kind.clone())),
        Err(e) => {
            log(&format!("couldn't read the job from Slurm: {e}"));
            (None, None)
        }
    };
    // The gate's AdminComment is the authority; the plugin's variable is a fallback so that the
    // epilog can still name the workload when Slurm could not be asked.
    let workload = workload.or_else(|| {
        let v = env.kace_value.as_str();
        kace_sql::validate_workload_name(v).is_ok().then(|| v.to_string())
    });

    if let Err(e) = prepare_progress(n, env) {
        log(&format!("couldn't prepare the progress file: {e}"));
    }

    let others = match register(n, env, gpu, workload.as_deref().unwrap_or("?")) {
        Ok(o) => o,
        Err(e) => {
            let m = format!("couldn't record the job on GPU {}: {e}; it runs alone", gpu.0);
            log(&m);
            return Outcome::Stopped(m);
        }
    };

    let expected = state::take_expectation(&n.config.node.state_dir, env.job);
    if let Some(x) = &expected {
        if x.node != env.node || x.gpu != gpu.0 || others.is_empty() {
            log(&format!(
                "released to join lead {} on {} GPU {}, it landed on {} GPU {}{}",
                x.lead,
                x.node,
                x.gpu,
                env.node,
                gpu.0,
                if others.is_empty() { " with no kace job there" } else { "" }
            ));
        }
    }
    if !others.is_empty() {
        return Outcome::Joined { with: others };
    }
    if expected.is_some() {
        // A partner that found its GPU empty (its lead already ended) does not lead: the
        // candidates are for the next free GPU's lead, chosen by dispatch.
        return Outcome::Joined { with: Vec::new() };
    }

    let Some(workload) = workload else {
        let m = "couldn't find its workload (AdminComment is not kace:<workload>); no partner is chosen".to_string();
        log(&m);
        return Outcome::Stopped(m);
    };
    lead(n, env, gpu, &workload, kind, timings, started)
}

/// Creates the job's progress file, owned by the job's user, so that the job can append to it
/// and nobody else can replace it (the directory belongs to root).
fn prepare_progress(n: &Node, env: &JobEnv) -> std::result::Result<(), ProgressCreateError> {
    let root = &n.config.node.progress_root;
    kace_profiling::progress::create_for_job(root, &progress_file(root, env.job), env.uid)
}

/// Records the job on its GPU, starts the GPU's MPS daemon when none runs, and returns the
/// other kace jobs already there. All under the GPU's lock.
fn register(n: &Node, env: &JobEnv, gpu: GpuIndex, workload: &str) -> Result<Vec<u32>> {
    let log = |m: &str| (n.log)(&format!("kace: prolog: job {}: {m}", env.job));
    let lock = state::lock_gpu(&n.config.node.state_dir, &env.node, gpu, n.deadline)?;
    let mut others: Vec<u32> =
        lock.running().into_iter().map(|r| r.job).filter(|j| *j != env.job).collect();
    if !others.is_empty() {
        // A record left by a job whose epilog never ran (slurmd crashed) must not keep the GPU
        // "busy" forever: keep only jobs Slurm still has on this node.
        match n.slurm.jobs_on_node(&env.node) {
            Ok(alive) => {
                for j in others.iter().filter(|j| !alive.contains(j)) {
                    log(&format!("forgetting job {j} on GPU {}: Slurm no longer has it", gpu.0));
                    lock.forget(*j)?;
                }
                others.retain(|j| alive.contains(j));
            }
            Err(e) => log(&format!("couldn't list the node's jobs ({e}); trusting the record")),
        }
    }
    lock.add(env.job, workload, n.clock.now())?;
    let dirs = mps_dirs(&n.config.node.mps_root, gpu);
    if !n.mps.running(&dirs) {
        n.check_budget("starting the MPS daemon")?;
        match n.mps.start(&dirs, gpu, env.uid) {
            Ok(()) => log(&format!("started the MPS control daemon for GPU {}", gpu.0)),
            Err(e) => log(&format!(
                "couldn't start the MPS control daemon for GPU {}: {e}; the job runs without MPS",
                gpu.0
            )),
        }
    }
    Ok(others)
}

fn rejection_text(r: &Rejection, missing: &[&str]) -> String {
    match r {
        Rejection::UnknownProfile if !missing.is_empty() => {
            format!("incomplete profile (missing {})", missing.join(", "))
        }
        other => other.to_string(),
    }
}

fn lead(
    n: &Node,
    env: &JobEnv,
    gpu: GpuIndex,
    workload: &str,
    kind: Option<String>,
    mut timings: Timings,
    started: Instant,
) -> Outcome {
    let log = |m: &str| (n.log)(&format!("kace: prolog: job {}: {m}", env.job));
    let t = Instant::now();
    let queue = n.slurm.kace_queue();
    timings.slurm += t.elapsed();
    let queue = match queue {
        Ok(p) => p,
        Err(e) => {
            let m = format!("couldn't list the held kace jobs: {e}; it runs alone");
            log(&m);
            return Outcome::Stopped(m);
        }
    };
    // Leads starting at the same moment on other GPUs see the same held jobs, and Slurm has
    // no compare-and-set to claim one: they split the queue instead, each taking every k-th
    // held job by its rank among the starting kace jobs (ids in order), so two leads never
    // move the same job. A partner whose prolog happens to run now only narrows the choice.
    let mut starting: Vec<u32> = queue.iter().filter(|j| j.starting()).map(|j| j.id).collect();
    if !starting.contains(&env.job) {
        starting.push(env.job);
    }
    starting.sort_unstable();
    let k = starting.len();
    let rank = starting.iter().position(|j| *j == env.job).unwrap_or(0);
    if k > 1 {
        log(&format!(
            "{k} kace jobs are starting at once ({starting:?}); considering held jobs {rank}, {rank}+{k}, ... of the queue"
        ));
    }
    let held: Vec<&QueuedJob> = queue
        .iter()
        .filter(|j| j.held() && j.id != env.job)
        .enumerate()
        .filter(|(i, _)| i % k == rank)
        .map(|(_, j)| j)
        .collect();

    // Verdicts in queue order: (job, candidate record), filled below.
    let mut records: Vec<DecisionCandidate> = held
        .iter()
        .map(|j| DecisionCandidate {
            job: Some(j.id.to_string()),
            workload: j.workload.clone(),
            prediction: None,
            rejected: None,
        })
        .collect();
    let mut specs = Vec::new();
    let mut spec_of = Vec::new(); // index into `held` of each spec
    let now = n.clock.now();
    for (i, j) in held.iter().enumerate() {
        if let Some(why) = j.blocked(now) {
            records[i].rejected = Some(format!("{why}, so it would not start beside the lead"));
        } else if j.shards().is_none() {
            records[i].rejected = Some("asks for no shard, so it cannot share a GPU".into());
        } else if kace_sql::validate_workload_name(&j.workload).is_err() {
            records[i].rejected = Some("its workload name is not valid".into());
        } else {
            specs.push(CandidateSpec {
                workload: j.workload.clone(),
                same_user: !env.user.is_empty() && j.user == env.user,
            });
            spec_of.push(i);
        }
    }

    let (memory, note) = crate::gpu::memory_gib(n.gpus, gpu, n.config.node.gpu_memory_gib);
    if let Some(why) = note {
        match memory {
            Some(g) => log(&format!(
                "couldn't read GPU {} memory ({why}); using the configured {g} GiB",
                gpu.0
            )),
            None => log(&format!(
                "couldn't read GPU {} memory ({why}) and none is configured; memory is not checked",
                gpu.0
            )),
        }
    }
    let sel = &n.config.selection;
    let rules = SelectionRules {
        gpu_memory_gib: memory,
        memory_margin: sel.memory_margin,
        require_same_user: true,
        min_gain: sel.min_gain,
        objective: sel.objective,
        ..SelectionRules::default()
    };

    let mut model_version = None;
    let mut order: Vec<usize> = Vec::new(); // indices into `held`, best first
    if !specs.is_empty() {
        let t = Instant::now();
        let decided = n
            .check_budget("reading the database")
            .and_then(|()| Ok(kace_sql::Db::open_read_only(&n.config.database.path)?))
            .and_then(|db| Ok(decide(&db, workload, &specs, &rules, None)?));
        match decided {
            Ok(d) => {
                timings.db = t.elapsed().saturating_sub(d.predict_time);
                timings.predict = d.predict_time;
                model_version = Some(d.model_version);
                for (k, v) in d.selection.verdicts.iter().enumerate() {
                    let r = &mut records[spec_of[k]];
                    r.prediction = v.prediction;
                    r.rejected = v.rejection.as_ref().map(|x| rejection_text(x, &d.incomplete[k]));
                }
                let mut passing: Vec<usize> = (0..specs.len())
                    .filter(|&k| d.selection.verdicts[k].rejection.is_none())
                    .collect();
                // The selector's choice first; then the others by prediction (stable: queue
                // order breaks ties), as fallbacks when the choice cannot be released.
                passing.sort_by(|&a, &b| {
                    let pa = d.selection.verdicts[a].prediction.unwrap_or(f64::NEG_INFINITY);
                    let pb = d.selection.verdicts[b].prediction.unwrap_or(f64::NEG_INFINITY);
                    pb.total_cmp(&pa)
                });
                if let Some(c) = d.selection.chosen {
                    passing.retain(|&k| k != c);
                    passing.insert(0, c);
                }
                order = passing.into_iter().map(|k| spec_of[k]).collect();
            }
            Err(e) => {
                timings.db = t.elapsed();
                log(&format!("couldn't choose a partner: {e}; it runs alone"));
                for &i in &spec_of {
                    records[i].rejected = Some(format!("not evaluated: {e}"));
                }
            }
        }
    }

    let target = Target { node: env.node.clone(), kind };
    let mut partner = None;
    for &i in order.iter().take(RELEASE_TRIES) {
        let job = held[i];
        if let Err(e) = n.check_budget("releasing a partner") {
            records[i].rejected = Some(format!("chosen, but {e}"));
            log(&format!("couldn't release job {}: {e}", job.id));
            break;
        }
        // Another lead may have taken it since the listing (two GPUs starting at once), or
        // its user cancelled it: only a job still held is moved.
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
        let exp = Expectation { lead: env.job, node: env.node.clone(), gpu: gpu.0 };
        if let Err(e) = state::expect(&n.config.node.state_dir, job.id, &exp) {
            log(&format!("couldn't note partner {}: {e}", job.id));
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
        key: kace_sql::spool::decision_key(
            &env.cluster,
            &env.job.to_string(),
            &env.node,
            n.clock.now(),
        ),
        created_at: n.clock.now(),
        decision: NewDecision {
            lead_job: Some(env.job.to_string()),
            lead_workload: workload.to_string(),
            chosen_workload: chosen.map(|j| j.workload.clone()),
            chosen_job: chosen.map(|j| j.id.to_string()),
            model_version,
            candidates: records,
        },
    };
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let what = match chosen {
        Some(j) => {
            format!("released job {} ({}) onto {} GPU {}", j.id, j.workload, env.node, gpu.0)
        }
        None => "no partner".to_string(),
    };
    log(&format!(
        "lead {workload} on GPU {}: {what}, of {} held kace job(s); timing: slurm={:.2}ms db={:.2}ms predict={:.2}ms total={:.2}ms",
        gpu.0,
        held.len(),
        ms(timings.slurm),
        ms(timings.db),
        ms(timings.predict),
        ms(timings.total)
    ));
    let spooled = match write_decision(&n.config.spool.dir, &decision) {
        Ok(_) => Some(Box::new(decision)),
        Err(e) => {
            log(&format!("couldn't spool the decision: {e}"));
            None
        }
    };
    Outcome::Led { partner, decision: spooled, timings }
}
