//! `kace-prolog`'s logic. For a job the gate marked as a kace job (AdminComment `kace:<workload>`,
//! from the decider's release ticket ([`kace_layout::release_ticket`]) when it released the job
//! here, else read from Slurm: the job's environment is the user's and proves nothing): hand the job's
//! memory limit to the SPANK plugin (the memory guard, [`kace_layout::memory_limit`]), create its
//! progress file, record it on its GPU and make sure that GPU's MPS control daemon runs, under
//! the GPU's lock. It lists no queue and moves no job: the decider ([`crate::dispatch`]) chooses
//! the lead's partner when slurmctld's PrologSlurmctld nudges it. A plain job returns at once.
//! Its Slurm reads are of this job only (and of the GPU's other kace jobs, to drop records of
//! jobs whose epilog never ran), so its time does not grow with the queue.

use std::time::{Duration, Instant};

use kace_layout::memory_limit::MemoryLimit;
use kace_layout::release_ticket;
use kace_layout::{mps_dirs, progress_file, GpuIndex};
use kace_profiling::progress::CreateError as ProgressCreateError;

use crate::env::JobEnv;
use crate::error::Result;
use crate::state;
use crate::Node;

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
    /// The job is the GPU's first kace job.
    Led,
    /// Something stopped it early; the message says what (already logged).
    Stopped(String),
}

/// Pause between reads of the job while slurmctld does not answer.
const SLURM_RETRY_PAUSE: Duration = Duration::from_millis(250);

/// Runs the prolog for `env`. Never fails: every problem is logged and ends in
/// [`Outcome::Stopped`] or a lead without a partner, and the job runs.
pub fn run(n: &Node, env: &JobEnv) -> Outcome {
    let started = Instant::now();
    if !env.kace {
        return Outcome::NotKace;
    }
    let log = |m: &str| (n.log)(&format!("kace: prolog: job {}: {m}", env.job));
    // The decider's ticket says what the gate's mark says, for a job it released onto this
    // node: no Slurm read then (kace_layout::release_ticket). Used once.
    let ticketed = match release_ticket::read(&n.config.spool.dir, env.job) {
        Ok(Some(t)) => {
            if let Err(e) = release_ticket::remove(&n.config.spool.dir, env.job) {
                log(&format!("couldn't remove its release ticket: {e}"));
            }
            let now = n.clock.now();
            if t.fits(&env.node, now) {
                Some((t.workload, t.thread_pct))
            } else {
                log(&format!(
                    "couldn't use its release ticket: it names node {} at {:.0} s from now; asking Slurm",
                    t.node,
                    t.at - now
                ));
                None
            }
        }
        Ok(None) => None,
        Err(e) => {
            log(&format!("couldn't use its release ticket: {e}; asking Slurm"));
            None
        }
    };
    // Without a ticket the job gets no SM share: only the decider's choice sets one.
    let (workload, thread_pct) = match ticketed {
        Some(t) => t,
        None => match workload_from_slurm(n, env, started, &log) {
            Some(w) => (w, None),
            None => return Outcome::NotKace,
        },
    };
    set_up(n, env, started, &log, workload, thread_pct)
}

/// The job's workload from the gate's mark, as Slurm lists the job (`None`: it runs as a plain
/// job, and why is logged).
fn workload_from_slurm(
    n: &Node,
    env: &JobEnv,
    started: Instant,
    log: &dyn Fn(&str),
) -> Option<String> {
    // slurmctld may be restarting (seconds) while a job it launched starts: a kace job whose mark
    // cannot be read runs as a plain one, and its partner's interval would then be stored as
    // alone. So the read is retried for up to half the budget, leaving the rest for recording the
    // job and starting MPS.
    let patience = Duration::from_millis(n.config.node.prolog_budget_ms / 2);
    let mut tries = 0u32;
    let listed = loop {
        let d = n.slurm.queued(env.job);
        tries += 1;
        match d {
            Err(e) if started.elapsed() + SLURM_RETRY_PAUSE < patience => {
                if tries == 1 {
                    log(&format!("couldn't read the job from Slurm ({e}); trying again"));
                }
                std::thread::sleep(SLURM_RETRY_PAUSE);
            }
            d => break d,
        }
    };
    // Only the gate's mark makes a kace job: a user can put any SPANK_* entry in the job's
    // environment, so without the mark the job runs as a plain one (no MPS, no decision).
    let listed = match listed {
        Ok(d) => d,
        Err(e) => {
            log(&format!("couldn't read the job from Slurm to check the gate's mark: {e}; it runs without kace"));
            return None;
        }
    };
    let Some(workload) = listed.map(|j| j.workload).filter(|w| !w.is_empty()) else {
        log("has SPANK_KACE_COLOCATE but not the gate's AdminComment mark; it runs as a plain job");
        return None;
    };
    if kace_sql::validate_workload_name(&workload).is_err() {
        log("couldn't use its workload name (AdminComment); it runs without kace");
        return None;
    }
    Some(workload)
}

/// The prolog once the job is known to be a kace job of `workload`.
fn set_up(
    n: &Node,
    env: &JobEnv,
    started: Instant,
    log: &dyn Fn(&str),
    workload: String,
    thread_pct: Option<u8>,
) -> Outcome {
    // A job slurmctld starts after its restart and before the nodes registered again (3–4 s)
    // has no GPU in its prolog's environment: slurmctld loads its GRES plugins (which build
    // that environment) only when a node registers (seen on 25.11 and 26.05). Its allocation,
    // and so Slurm's record of it, does name the GPU (tests/tests/restart_prolog.rs): read
    // then, and only then.
    let from_slurm = || match n.slurm.job_gpus(env.job, &env.node) {
        Ok(g) if g.len() == 1 => Some(GpuIndex(g[0])),
        _ => None,
    };
    let Some(gpu) = env.gpu.or_else(from_slurm) else {
        log("couldn't find the job's GPU: neither SLURM_JOB_GPUS, CUDA_VISIBLE_DEVICES nor Slurm's record of its allocation holds one GPU index; it runs without kace");
        return Outcome::NoGpu;
    };
    if env.gpu.is_none() {
        log(&format!(
            "has no GPU in its environment (SLURM_JOB_GPUS, CUDA_VISIBLE_DEVICES); Slurm's record puts it on GPU {}",
            gpu.0
        ));
    }

    if let Err(e) = prepare_progress(n, env) {
        log(&format!("couldn't prepare the progress file: {e}"));
    }
    if n.config.mps.memory_limit {
        match write_memory_limit(n, env, gpu, &workload) {
            Ok(Some((limit, memcap))) => log(&format!(
                "memory limit {}={} for its tasks (memcap {memcap:.2} GiB + {:.0} %)",
                kace_layout::memory_limit::VAR,
                limit.env_value(),
                n.config.mps.memory_limit_margin * 100.0
            )),
            Ok(None) => log(&format!(
                "no memory limit: workload {workload} has no memcap yet (its first alone run measures one)"
            )),
            Err(e) => log(&format!("couldn't set a memory limit: {e}; its tasks run without one")),
        }
    }

    let thread_pct = match write_thread_share(n, env, thread_pct) {
        Ok(Some(p)) => {
            log(&format!(
                "SM share {}={p} for its tasks (the decider's split beside the GPU's running job)",
                kace_layout::thread_share::VAR
            ));
            Some(p)
        }
        Ok(None) => None,
        Err(e) => {
            log(&format!("couldn't hand over its SM share: {e}; its tasks run without one"));
            None
        }
    };

    // The decider learns the job's start from PrologSlurmctld and chooses its partner there.
    match register(n, env, gpu, &workload, thread_pct) {
        Ok(others) if others.is_empty() => {
            log(&format!("lead {workload} on GPU {} ({:.1} ms)", gpu.0, ms(started)));
            Outcome::Led
        }
        Ok(others) => {
            let t = ms(started);
            log(&format!("{workload} joined kace job(s) {others:?} on GPU {} ({t:.1} ms)", gpu.0));
            Outcome::Joined { with: others }
        }
        Err(e) => {
            let m = format!("couldn't record the job on GPU {}: {e}; it runs alone", gpu.0);
            log(&m);
            Outcome::Stopped(m)
        }
    }
}

/// Milliseconds since `t`.
fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}

/// Creates the job's progress file, owned by the job's user, so that the job can append to it
/// and nobody else can replace it (the directory belongs to root).
fn prepare_progress(n: &Node, env: &JobEnv) -> std::result::Result<(), ProgressCreateError> {
    let root = &n.config.node.progress_root;
    kace_profiling::progress::create_for_job(root, &progress_file(root, env.job), env.uid)
}

/// The memory guard: the job's limit (its workload's memcap × (1 + `mps.memory_limit_margin`))
/// written where the SPANK plugin reads it ([`kace_layout::memory_limit`]); `None` when the
/// workload has no memcap. Any earlier file of the same job id is replaced or removed first, so
/// a stale limit never reaches a later job.
fn write_memory_limit(
    n: &Node,
    env: &JobEnv,
    gpu: GpuIndex,
    workload: &str,
) -> std::result::Result<Option<(MemoryLimit, f64)>, String> {
    let root = &n.config.node.progress_root;
    let shown = || kace_layout::memory_limit::file(root, env.job).display().to_string();
    kace_layout::trusted_dir::ensure_trusted_dir(root)
        .map_err(|e| format!("couldn't use {}: {e}", root.display()))?;
    // Whatever follows, no earlier job's limit may reach this one.
    kace_layout::memory_limit::write(root, env.job, None)
        .map_err(|e| format!("couldn't remove the old {}: {e}", shown()))?;
    n.check_budget("reading the job's memcap").map_err(|e| e.to_string())?;
    // Half of what is left at most: a writer holding the database's lock (a long retrain) must
    // not leave the prolog without the time to record the job and start its MPS daemon.
    let left = n.deadline.saturating_duration_since(std::time::Instant::now()) / 2;
    let mut db = kace_sql::Db::open_read_only_within(&n.config.database.path, left)
        .map_err(|e| e.to_string())?;
    db.set_now(n.clock.now());
    let profiles = db.profiles(&[workload], None).map_err(|e| e.to_string())?;
    let Some(memcap) = profiles.get(workload).and_then(|p| p.values[kace_sql::MEMCAP]) else {
        return Ok(None);
    };
    let Some(mut limit) = MemoryLimit::of(memcap, n.config.mps.memory_limit_margin) else {
        return Ok(None);
    };
    // A limit above the GPU's memory guards nothing (the re-audit's M1: 39 583 MiB on a 32 GiB
    // GPU): never more than the GPU has.
    let (gib, _) = crate::gpu::memory_gib(n.gpus, gpu, n.config.node.gpu_memory_gib);
    if let Some(whole) = gib.and_then(|g| MemoryLimit::of(g, 0.0)) {
        limit.mib = limit.mib.min(whole.mib);
    }
    kace_layout::memory_limit::write(root, env.job, Some(limit))
        .map_err(|e| format!("couldn't write {}: {e}", shown()))?;
    Ok(Some((limit, memcap)))
}

/// The decider's SM share for the job written where the SPANK plugin reads it
/// ([`kace_layout::thread_share`]); any earlier file of the same job id is removed first, so a
/// stale share never reaches a later job. Returns the share written.
fn write_thread_share(
    n: &Node,
    env: &JobEnv,
    thread_pct: Option<u8>,
) -> std::result::Result<Option<u8>, String> {
    let root = &n.config.node.progress_root;
    let shown = || kace_layout::thread_share::file(root, env.job).display().to_string();
    if thread_pct.is_none() && !kace_layout::thread_share::file(root, env.job).exists() {
        return Ok(None);
    }
    kace_layout::trusted_dir::ensure_trusted_dir(root)
        .map_err(|e| format!("couldn't use {}: {e}", root.display()))?;
    kace_layout::thread_share::write(root, env.job, thread_pct)
        .map_err(|e| format!("couldn't write {}: {e}", shown()))?;
    Ok(thread_pct)
}

/// Records the job on its GPU, starts the GPU's MPS daemon when none runs, and returns the
/// other kace jobs already there.
fn register(
    n: &Node,
    env: &JobEnv,
    gpu: GpuIndex,
    workload: &str,
    thread_pct: Option<u8>,
) -> Result<Vec<u32>> {
    let log = |m: &str| (n.log)(&format!("kace: prolog: job {}: {m}", env.job));
    let lock = state::lock_gpu(&n.config.node.state_dir, &env.node, gpu, n.deadline)?;
    let mut others: Vec<u32> =
        lock.running().into_iter().map(|r| r.job).filter(|j| *j != env.job).collect();
    if !others.is_empty() {
        // A record left by a job whose epilog never ran (slurmd crashed) must not keep the GPU
        // "busy" forever: keep only jobs Slurm still has on this node.
        match state::alive_on(n.slurm, &env.node, &others) {
            Ok(alive) => {
                // Ended, not deleted: a partner's epilog must still see that it shared the GPU.
                for j in others.iter().filter(|j| !alive.contains(j)) {
                    log(&format!(
                        "ending job {j}'s record on GPU {}: Slurm no longer has it",
                        gpu.0
                    ));
                    lock.end(*j, n.clock.now())?;
                }
                others.retain(|j| alive.contains(j));
            }
            Err(e) => {
                log(&format!("couldn't read the GPU's other jobs ({e}); trusting the record"))
            }
        }
    }
    let user = Some(env.user.clone()).filter(|u| !u.is_empty());
    lock.add_record(&state::JobRecord {
        job: env.job,
        workload: workload.to_string(),
        start: n.clock.now(),
        end: None,
        user,
        thread_pct,
    })?;
    let dirs = mps_dirs(&n.config.node.mps_root, gpu);
    if !n.mps.running(&dirs) {
        n.check_budget("starting the MPS daemon")?;
        let mps = &n.config.mps;
        let started =
            crate::mps::server_uid(mps.multi_user, &mps.server_user, env.uid).and_then(|uid| {
                n.mps.start(&dirs, gpu, uid, mps.multi_user).map_err(|e| e.to_string())
            });
        match started {
            Ok(()) => log(&format!("started the MPS control daemon for GPU {}", gpu.0)),
            Err(e) => log(&format!(
                "couldn't start the MPS control daemon for GPU {}: {e}; the job runs without MPS",
                gpu.0
            )),
        }
    }
    drop(lock);
    Ok(others)
}
