//! `kace-epilog`'s logic: end the job's record on its GPU (under the GPU's lock); stop the
//! GPU's MPS daemon when no kace job is left; turn the job's progress file into
//! observations: one per interval in which the set of kace jobs sharing the GPU stayed the same
//! (alone, or with partners); and turn kace-sampler's readings of the job's alone intervals
//! into a profile measurement of source `observed` ([`crate::measure`]), spooled for ingest.
//! It moves no job: the GPU's refill is the decider's ([`crate::dispatch`], nudged by
//! EpilogSlurmctld).
//!
//! A job is a kace job here when kace's own record holds it (the prolog wrote it after checking
//! the gate's mark). That record also names the GPU when Slurm passes no GPU variable (after a
//! slurmctld restart).
//!
//! The progress file is the user's: it is read by [`kace_profiling::progress::read`], which
//! follows no symlink, never blocks on a FIFO, reads only a regular file and at most
//! [`kace_profiling::progress::MAX_BYTES`] of it.

use std::path::Path;

use kace_layout::{mps_dirs, progress_file, GpuIndex};
use kace_profiling::progress::{self, Point, Progress};
use kace_sql::failures::{GpuFailure, FAILED_TOGETHER_WINDOW_S};
use kace_sql::spool::{unpark, write_or_park, Written};
use kace_sql::{Observation, ObservedProfile, Partner};

use crate::env::JobEnv;
use crate::error::Result;
use crate::state::{self, JobRecord};
use crate::Node;

/// What the epilog did.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Not a kace job.
    NotKace,
    /// A kace job without a GPU index.
    NoGpu,
    /// Done: the observations spooled and whether the MPS daemon was stopped.
    Done {
        /// Observations written to the spool.
        observations: Vec<Observation>,
        /// The profile measurement of the job's alone intervals written to the spool, if any.
        profile: Option<Box<ObservedProfile>>,
        /// Whether this was the GPU's last kace job (and its daemon was told to quit).
        stopped_mps: bool,
    },
}

/// One interval of a job's run with the same partners throughout.
#[derive(Debug, Clone, PartialEq)]
pub struct Segment {
    /// Start, Unix seconds.
    pub start: f64,
    /// End, Unix seconds.
    pub end: f64,
    /// The kace jobs that shared the GPU throughout.
    pub partners: Vec<JobRecord>,
}

/// Splits `[start, end]` at every partner's start and end, merging neighbours with the same
/// partners. Partners still running count as running until `end`.
pub fn segments(start: f64, end: f64, others: &[JobRecord]) -> Vec<Segment> {
    let overlapping: Vec<&JobRecord> =
        others.iter().filter(|o| o.start < end && o.end.unwrap_or(f64::INFINITY) > start).collect();
    let mut cuts = vec![start, end];
    for o in &overlapping {
        for t in [Some(o.start), o.end].into_iter().flatten() {
            if t > start && t < end {
                cuts.push(t);
            }
        }
    }
    cuts.sort_by(f64::total_cmp);
    cuts.dedup();
    let mut out: Vec<Segment> = Vec::new();
    for w in cuts.windows(2) {
        let (a, b) = (w[0], w[1]);
        if b <= a {
            continue;
        }
        let mut partners: Vec<JobRecord> = overlapping
            .iter()
            .filter(|o| o.start < b && o.end.unwrap_or(f64::INFINITY) > a)
            .map(|o| (*o).clone())
            .collect();
        partners.sort_by_key(|p| p.job);
        match out.last_mut() {
            Some(last) if same_jobs(&last.partners, &partners) => last.end = b,
            _ => out.push(Segment { start: a, end: b, partners }),
        }
    }
    out
}

fn same_jobs(a: &[JobRecord], b: &[JobRecord]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.job == y.job)
}

/// Steps per second within `[a, b]` from the points inside it (after the warm-up), with the
/// steps done: `None` when fewer than two points fall inside or no time passes between them.
pub fn throughput_within(points: &[Point], a: f64, b: f64, warmup: u64) -> Option<(f64, f64)> {
    let inside: Vec<&Point> =
        points.iter().filter(|p| p.time >= a && p.time <= b && p.steps >= warmup as f64).collect();
    let (first, last) = (inside.first()?, inside.last()?);
    let dt = last.time - first.time;
    if inside.len() < 2 || dt <= 0.0 {
        return None;
    }
    let steps = last.steps - first.steps;
    Some((steps / dt, steps))
}

/// Runs the epilog for `env`. Never fails: problems are logged.
pub fn run(n: &Node, env: &JobEnv) -> Outcome {
    if !env.kace {
        return Outcome::NotKace;
    }
    let log = |m: &str| (n.log)(&format!("kace: epilog: job {}: {m}", env.job));
    let state_dir = &n.config.node.state_dir;
    let gpu = match (env.gpu, state::gpu_of(state_dir, &env.node, env.job)) {
        (Some(g), _) => g,
        (None, Some(g)) => {
            log(&format!(
                "neither SLURM_JOB_GPUS nor CUDA_VISIBLE_DEVICES holds a GPU index; kace's record puts it on GPU {}",
                g.0
            ));
            g
        }
        (None, None) => {
            log("couldn't find the job's GPU: no GPU variable and no kace record on this node; nothing done");
            return Outcome::NoGpu;
        }
    };
    let now = n.clock.now();
    let (me, history, stopped_mps, clock_ahead) = match finish_on_gpu(n, env, gpu, now) {
        Ok(x) => x,
        Err(e) => {
            log(&format!("couldn't update GPU {}'s record: {e}", gpu.0));
            (None, Vec::new(), false, false)
        }
    };
    // One clock: an interval this node's clock cannot place is not observed, and the reason
    // says it is the clock (not "too few progress lines", as the re-audit's M2 found).
    let clock_problem = match &me {
        Some(m) if m.start > now + CLOCK_SLACK_S => {
            log(&format!(
                "ends by this node's clock ({now:.0}) {:.0} s before it started by its prolog's ({:.0}): the clock stepped back; no observation",
                m.start - now,
                m.start
            ));
            true
        }
        Some(_) if clock_ahead => {
            log("another job's record on its GPU lay in this node's clock's future; its intervals cannot be told shared or alone; no observation");
            true
        }
        // Slurm's own start time (25.11, 26.05) is slurmctld's clock: a prolog whose clock put the
        // start far from it ran on a node whose clock is off the controller's.
        Some(m) if env.slurm_start.is_some_and(|s| (m.start - s).abs() > CLOCK_SLACK_S) => {
            let s = env.slurm_start.unwrap_or(m.start);
            log(&format!(
                "started at {:.0} by its prolog's clock but at {s:.0} by slurmctld's: this node's clock is {:.0} s off the controller's; no observation",
                m.start,
                m.start - s
            ));
            true
        }
        _ => false,
    };
    let path = progress_file(&n.config.node.progress_root, env.job);
    // Records an earlier epilog parked while the spool was full go in first.
    match unpark(&n.config.node.progress_root, &n.config.spool.dir) {
        Ok(0) => {}
        Ok(moved) => log(&format!("moved {moved} parked record(s) into the spool")),
        Err(e) => log(&format!("couldn't move parked records into the spool: {e}")),
    }
    if let Some(m) = me.as_ref().filter(|m| !clock_problem && m.end.is_some()) {
        record_failure(n, env, gpu, m, &history);
    }
    let (observations, profile) = match me {
        None => {
            log("has no kace record on its GPU (not marked by the gate, or its prolog did not run); no observation");
            (Vec::new(), None)
        }
        Some(_) if clock_problem => (Vec::new(), None),
        Some(me) => {
            // Only lines inside the job's run by this node's clock count (the re-audit's L7:
            // one forged `1e308` line made every later one go backwards).
            let window = (me.start - CLOCK_SLACK_S)..=(now + CLOCK_SLACK_S);
            let progress = match progress::read_within(&path, window) {
                Ok(p) => Some(p),
                Err(e) => {
                    log(&format!("couldn't use the progress file: {e}; no observation"));
                    None
                }
            };
            // kace-sampler's readings of the GPU while the job ran, read once for the
            // intervals' SM utilization, an out-of-memory line's backing and the alone profile.
            let samples = readings_while_it_ran(n, gpu, &me);
            let ran = Ran { gpu, me: &me, history: &history, samples: &samples };
            let observations =
                progress.as_ref().map(|p| observe(n, env, &ran, &path, p)).unwrap_or_default();
            let points = progress.as_ref().map(|p| p.points.as_slice()).unwrap_or(&[]);
            let oom_at = progress.as_ref().and_then(|p| p.oom_at);
            let profile = match out_of_memory(n, env, &ran, oom_at) {
                Some(record) => Some(record),
                None => measure_profile(n, env, &ran, points),
            };
            (observations, profile)
        }
    };
    if let Err(e) = kace_layout::memory_limit::write(&n.config.node.progress_root, env.job, None) {
        log(&format!("couldn't remove the job's memory limit file: {e}"));
    }
    if let Err(e) = kace_layout::thread_share::write(&n.config.node.progress_root, env.job, None) {
        log(&format!("couldn't remove the job's SM share file: {e}"));
    }
    if let Err(e) = progress::remove_for_job(&path) {
        log(&format!("couldn't remove the job's progress file: {e}"));
    }
    Outcome::Done { observations, profile, stopped_mps }
}

/// The job's record, the GPU's other records (running and ended), whether the daemon was
/// stopped, and whether a record lay in this clock's future (see [`CLOCK_SLACK_S`]).
type Finished = (Option<JobRecord>, Vec<JobRecord>, bool, bool);

/// How far a time may lie beyond this node's clock before kace takes it as a clock step (the
/// re-audit's M2: an epilog whose clock was a day ahead ended its job a day in the future, and
/// 13 later observations on that GPU named it as their partner). Larger than any NTP slew.
pub const CLOCK_SLACK_S: f64 = 300.0;

/// Moves the job to "ended" on its GPU and, under the same lock, stops its MPS daemon when no
/// kace job remains.
fn finish_on_gpu(n: &Node, env: &JobEnv, gpu: GpuIndex, now: f64) -> Result<Finished> {
    let log = |m: &str| (n.log)(&format!("kace: epilog: job {}: {m}", env.job));
    let lock = state::lock_gpu(&n.config.node.state_dir, &env.node, gpu, n.deadline)?;
    let me = lock.end(env.job, now)?;
    let mut running = lock.running();
    if !running.is_empty() {
        let ids: Vec<u32> = running.iter().map(|r| r.job).collect();
        if let Ok(alive) = state::alive_on(n.slurm, &env.node, &ids) {
            // Ended, not deleted: this job's intervals with it were shared, not alone.
            for r in running.iter().filter(|r| !alive.contains(&r.job)) {
                log(&format!(
                    "ending job {}'s record on GPU {}: Slurm no longer has it",
                    r.job, gpu.0
                ));
                lock.end(r.job, now)?;
            }
            running.retain(|r| alive.contains(&r.job));
        }
    }
    let dirs = mps_dirs(&n.config.node.mps_root, gpu);
    if n.mps.running(&dirs) {
        // Slurm has killed the job's tasks by now; a client that outlived that (blocked in the
        // driver) still holds work on the server its partners share: end it in NVIDIA's order.
        let procs = crate::mps::ProcFs { root: "/proc".into() };
        let (ended, problems) =
            crate::mps::end_job_clients(n.mps, &procs, &dirs, env.job, env.uid, n.deadline);
        if !ended.is_empty() {
            log(&format!("terminated its {} remaining MPS client(s) {ended:?}", ended.len()));
        }
        for p in problems {
            log(&p);
        }
    }
    let mut stopped = false;
    if running.is_empty() && n.mps.running(&dirs) {
        match n.mps.quit(&dirs) {
            Ok(()) => {
                stopped = true;
                log(&format!("stopped the MPS control daemon of GPU {}: no kace job left", gpu.0));
            }
            Err(e) => log(&format!("couldn't stop the MPS control daemon of GPU {}: {e}", gpu.0)),
        }
    }
    // A record that ends in this clock's future was ended by an epilog whose clock was ahead:
    // its true end is unknown. Its end becomes now, so that later jobs do not count it as a
    // partner; this job's own intervals with it cannot be told shared or alone.
    let mut clock_ahead = false;
    for r in lock.ended().into_iter().filter(|r| r.job != env.job) {
        if let Some(e) = r.end.filter(|e| *e > now + CLOCK_SLACK_S) {
            log(&format!(
                "job {}'s record on GPU {} ends {:.0} s after this node's clock ({now:.0}): the clock of the epilog that ended it was ahead; its end is now this clock's",
                r.job,
                gpu.0,
                e - now
            ));
            lock.reend(&r, now)?;
            clock_ahead = true;
        }
    }
    let mut history = running;
    history.extend(lock.ended().into_iter().filter(|r| r.job != env.job));
    Ok((me, history, stopped, clock_ahead))
}

/// The profile measurement of the job's alone intervals ([`crate::measure`]), spooled; `None`
/// (logged) when there was nothing to measure or it could not be spooled.
fn measure_profile(
    n: &Node,
    env: &JobEnv,
    ran: &Ran<'_>,
    points: &[Point],
) -> Option<Box<ObservedProfile>> {
    let Ran { gpu, me, history, samples } = *ran;
    let log = |m: &str| (n.log)(&format!("kace: epilog: job {}: {m}", env.job));
    if kace_sql::validate_workload_name(&me.workload).is_err() {
        return None;
    }
    if let Some(t) = me.thread_pct {
        log(&format!("ran with an SM share of {t} %; no profile measurement"));
        return None;
    }
    let end = me.end.unwrap_or(me.start);
    let segs = segments(me.start, end, history);
    if !segs.iter().any(|s| s.partners.is_empty()) {
        log("never ran alone on its GPU; no profile measurement");
        return None;
    }
    let readings: &[kace_sampler::Reading] = match samples {
        Ok(r) => r,
        Err(e) => {
            // Then fewer than profile.min_samples readings: the log below says nothing is stored.
            log(&format!("couldn't read the GPU's samples (is kace-sampler running?): {e}"));
            &[]
        }
    };
    let warmup = n.config.profiling.warmup_steps;
    let min_samples = n.config.profile.min_samples as usize;
    let run = crate::measure::alone_run(&segs, readings, points, warmup, min_samples);
    if run.system.is_none() {
        // Too short or unsampled: a workload's first alone run makes it a candidate, so it must
        // be a measurement, not a second of progress lines.
        let rate = run.throughput.map_or(String::new(), |t| {
            format!(
                " (its progress lines alone gave {} steps/s, not stored)",
                progress::format_rate(t)
            )
        });
        log(&format!(
            "{} sampler reading(s) in {:.0} s alone, fewer than profile.min_samples = {min_samples} with both utilizations; no profile measurement{rate}",
            run.readings, run.seconds
        ));
        return None;
    }
    let model = n.gpus.model(gpu).unwrap_or_else(|_| UNKNOWN_GPU_MODEL.to_string());
    let Some(profile) = run.profile(&me.workload, &model) else {
        log("no sampler readings and no progress lines while it ran alone; no profile measurement");
        return None;
    };
    let record = ObservedProfile {
        key: kace_sql::spool::profile_key(&env.cluster, &env.job.to_string(), &env.node, me.start),
        job: env.job.to_string(),
        created_at: end,
        profile,
        samples: run.system.map_or(0, |s| s.samples as u64),
        alone_seconds: run.seconds,
        oom_limit_mib: None,
        user: (!env.user.is_empty()).then(|| env.user.clone()),
    };
    let what = format!(
        "measured its profile alone over {:.0} s ({} readings)",
        run.seconds, record.samples
    );
    spool_profile(n, &log, record, &what, "profile measurement")
}

/// The jobs on the job's server in the last [`FAILED_TOGETHER_WINDOW_S`] before it ended:
/// those it may have failed with.
pub fn failure_partners(me: &JobRecord, history: &[JobRecord]) -> Vec<Partner> {
    let end = me.end.unwrap_or(me.start);
    let mut out: Vec<Partner> = history
        .iter()
        .filter(|r| r.job != me.job && r.start <= end)
        .filter(|r| r.end.is_none_or(|e| e >= end - FAILED_TOGETHER_WINDOW_S))
        .map(|r| Partner { job: r.job.to_string(), workload: r.workload.clone() })
        .collect();
    out.truncate(kace_sql::failures::MAX_FAILURE_PARTNERS);
    out
}

/// Seconds after a failed job's end in which its MPS server's fault line still counts: the line
/// precedes the job's exit, but the node's clock and the log's stamps are read apart.
pub const MPS_LOG_SLACK_S: f64 = 5.0;

/// A job that failed (Slurm's exit status: a non-zero exit or a signal other than a cancel's)
/// while other jobs were on its MPS server is spooled as a failure record: two such records
/// naming each other block their pair of workloads (kace_sql::failures). What the job wrote
/// plays no part; Slurm's exit status of each job is not its user's to forge for another's.
fn record_failure(n: &Node, env: &JobEnv, gpu: GpuIndex, me: &JobRecord, history: &[JobRecord]) {
    let log = |m: &str| (n.log)(&format!("kace: epilog: job {}: {m}", env.job));
    let Some(exit) = env.exit.filter(|x| x.failed() && !x.cancelled()) else { return };
    let partners = failure_partners(me, history);
    if partners.is_empty() {
        return;
    }
    let record = GpuFailure {
        key: kace_sql::spool::failure_key(&env.cluster, &env.job.to_string(), &env.node, me.start),
        job: env.job.to_string(),
        workload: me.workload.clone(),
        user: (!env.user.is_empty()).then(|| env.user.clone()),
        node: env.node.clone(),
        gpu: gpu.0.to_string(),
        end: me.end.unwrap_or(me.start),
        exit: format!("{}:{}", exit.code, exit.signal),
        partners,
        mps_fatal_at: None,
    };
    // The server's own word on a fault, from the job's start to a few seconds after its end
    // (the job's exit follows the fault; the epilog runs after that).
    let dirs = mps_dirs(&n.config.node.mps_root, gpu);
    let end = record.end;
    let record = match crate::mps_log::faults_in(&dirs.log, me.start, end + MPS_LOG_SLACK_S) {
        Ok(faults) => GpuFailure { mps_fatal_at: faults.first().copied(), ..record },
        Err(e) => {
            log(&format!("couldn't read the MPS server log in {}: {e}", dirs.log.display()));
            record
        }
    };
    let shown: Vec<&str> = record.partners.iter().map(|p| p.job.as_str()).collect();
    let what = format!(
        "failed ({}) while sharing its GPU's MPS server with job(s) {}{}",
        record.exit,
        shown.join(", "),
        if record.mps_fatal_at.is_some() { "; the server logged a fatal GPU error" } else { "" }
    );
    match write_or_park(&n.config.spool.dir, &n.config.node.progress_root, &record) {
        Ok(Written::Spooled(_)) => log(&format!("{what}: spooled as {}", record.key)),
        Ok(Written::Parked { path, cause }) => log(&format!(
            "{what}: couldn't spool the failure record ({cause}); parked it as {}",
            path.display()
        )),
        Err(e) => log(&format!("{what}: couldn't spool the failure record {}: {e}", record.key)),
    }
}

/// Spools a profile record, or parks it beside the progress files while the spool is full (a
/// later epilog moves it in); `None` (logged) when neither worked.
fn spool_profile(
    n: &Node,
    log: &dyn Fn(&str),
    record: ObservedProfile,
    what: &str,
    kind: &str,
) -> Option<Box<ObservedProfile>> {
    match write_or_park(&n.config.spool.dir, &n.config.node.progress_root, &record) {
        Ok(Written::Spooled(_)) => log(&format!("{what}: spooled as {}", record.key)),
        Ok(Written::Parked { path, cause }) => log(&format!(
            "{what}: couldn't spool the {kind} {} ({cause}); parked it as {} for a later epilog",
            record.key,
            path.display()
        )),
        Err(e) => {
            log(&format!("{what}: couldn't spool the {kind} {}: {e}", record.key));
            return None;
        }
    }
    Some(Box::new(record))
}

/// The memory guard's record of a job that ran out of GPU memory at its limit, spooled: its
/// workload's memcap is at least that limit, so the next limit is higher. kace knows it only
/// when the job says so (an `<unix-seconds> oom` progress line, which its PyTorch hook writes
/// for an uncaught CUDA out-of-memory error) and failed (Slurm's exit status, when given): an
/// allocation failure under MPS is an ordinary error exit, with no signal of its own. The
/// claim is kept only when root's measurements back it: the sampler saw the GPU's memory in use
/// reach [`OOM_BACKING_FRACTION`] of the limit, and the limit is below the GPU's memory (the
/// store then allows one raise per workload a day). `None` when that did not happen, or the job
/// had no limit (then its alone run still measures it).
fn out_of_memory(
    n: &Node,
    env: &JobEnv,
    ran: &Ran<'_>,
    oom_at: Option<f64>,
) -> Option<Box<ObservedProfile>> {
    let Ran { gpu, me, samples, .. } = *ran;
    let log = |m: &str| (n.log)(&format!("kace: epilog: job {}: {m}", env.job));
    let at = oom_at?;
    if env.exit.is_some_and(|x| !x.failed()) {
        log("reported running out of GPU memory but ended successfully (it recovered); not recorded");
        return None;
    }
    // SAFETY: geteuid cannot fail and touches no memory.
    let me_uid = unsafe { libc::geteuid() };
    let limit = match kace_layout::memory_limit::read(&n.config.node.progress_root, env.job, me_uid)
    {
        Ok(Some(l)) => l,
        Ok(None) => {
            log("ran out of GPU memory with no kace memory limit (no memcap was known)");
            return None;
        }
        Err(e) => {
            log(&format!("ran out of GPU memory; couldn't read its memory limit: {e}"));
            return None;
        }
    };
    // Only what root measured may raise a memcap that every user's jobs of the workload get
    // (the re-audit's M1: five forged `oom` lines took one from 24 to 38.7 GiB, above the
    // 32 GiB GPU, with no sampler reading at all).
    let (gpu_gib, _) = crate::gpu::memory_gib(n.gpus, gpu, n.config.node.gpu_memory_gib);
    if let Some(g) = gpu_gib.filter(|g| limit.mib as f64 >= g * 1024.0) {
        log(&format!(
            "ran out of GPU memory under a limit of {} MiB, the whole GPU's {:.0} MiB already; not recorded (a memcap never exceeds the GPU)",
            limit.mib,
            g * 1024.0
        ));
        return None;
    }
    let end = me.end.unwrap_or(me.start);
    let readings = match samples {
        Ok(r) => r,
        Err(e) => {
            log(&format!(
                "ran out of GPU memory (its progress file says); couldn't read the GPU's samples to back it: {e}; not recorded"
            ));
            return None;
        }
    };
    let used: Vec<u64> = readings.iter().filter_map(|r| r.used_bytes).collect();
    let peak_mib = used.iter().max().map(|b| b / (1024 * 1024));
    let needed_mib = (limit.mib as f64 * OOM_BACKING_FRACTION).ceil() as u64;
    match peak_mib {
        Some(p) if p >= needed_mib => {}
        Some(p) => {
            log(&format!(
                "ran out of GPU memory (its progress file says), but the sampler saw at most {p} MiB in use on the GPU, under {:.0} % of its limit of {} MiB; not recorded",
                OOM_BACKING_FRACTION * 100.0,
                limit.mib
            ));
            return None;
        }
        None => {
            log("ran out of GPU memory (its progress file says), but no sampler reading of the GPU's memory backs it (is kace-sampler running?); not recorded");
            return None;
        }
    }
    let mut values = [None; kace_sql::FEATURE_COUNT];
    values[kace_sql::MEMCAP] = Some(limit.mib as f64 / 1024.0);
    let record = ObservedProfile {
        key: format!(
            "{}-oom",
            kace_sql::spool::profile_key(&env.cluster, &env.job.to_string(), &env.node, me.start)
        ),
        job: env.job.to_string(),
        created_at: end,
        profile: kace_sql::NewProfile {
            workload: me.workload.clone(),
            gpu_model: n.gpus.model(gpu).unwrap_or_else(|_| UNKNOWN_GPU_MODEL.into()),
            source: kace_sql::OOM_SOURCE.to_string(),
            values,
        },
        samples: used.len() as u64,
        alone_seconds: 0.0,
        oom_limit_mib: Some(limit.mib),
        user: (!env.user.is_empty()).then(|| env.user.clone()),
    };
    let what = format!(
        "ran out of GPU memory at {at:.0} under its limit of {} MiB ({}); recorded, so its memcap rises to at least that",
        limit.mib,
        env.exit.map_or("exit status unknown".to_string(), |x| format!("exit {}:{}", x.code, x.signal))
    );
    spool_profile(n, &log, record, &what, "out-of-memory record")
}

/// Fewest sampler readings inside an interval for its mean SM utilization to be used.
pub const MIN_SM_READINGS: usize = 3;

/// The mean SM utilization (%) of `readings` in `[from, to]`, when at least
/// [`MIN_SM_READINGS`] of them have one.
fn mean_sm_within(readings: &[kace_sampler::Reading], from: f64, to: f64) -> Option<f64> {
    let sm: Vec<f64> = readings
        .iter()
        .filter(|r| r.time >= from && r.time <= to)
        .filter_map(|r| r.sm_pct)
        .filter(|v| v.is_finite())
        .collect();
    (sm.len() >= MIN_SM_READINGS).then(|| sm.iter().sum::<f64>() / sm.len() as f64)
}

/// kace-sampler's readings of the job's GPU while the job ran, or why there are none.
type Samples = std::result::Result<Vec<kace_sampler::Reading>, kace_sampler::RingError>;

/// The job's run on its GPU, as the epilog measures it: its record, the GPU's other records
/// and the sampler's readings (read once for every measurement below).
#[derive(Clone, Copy)]
struct Ran<'a> {
    gpu: GpuIndex,
    me: &'a JobRecord,
    history: &'a [JobRecord],
    samples: &'a Samples,
}

/// kace-sampler's readings of the job's GPU from the job's start to its end.
fn readings_while_it_ran(n: &Node, gpu: GpuIndex, me: &JobRecord) -> Samples {
    let ring = kace_sampler::ring::ring_path(&n.config.sampler.dir, gpu.0);
    kace_sampler::Ring::open(&ring).and_then(|r| r.readings(me.start, me.end.unwrap_or(me.start)))
}

/// Share of its memory limit the GPU's memory in use must have reached, in the sampler's
/// readings while the job ran, for its out-of-memory line to raise the workload's memcap. The
/// readings are the whole GPU's (NVML's used memory), so on a shared GPU this is necessary, not
/// sufficient; it stops a job that claims an out-of-memory error it never came near.
pub const OOM_BACKING_FRACTION: f64 = 0.9;

/// GPU model recorded when NVML cannot tell it (as `kace profile import` records "unspecified").
pub const UNKNOWN_GPU_MODEL: &str = "unspecified";

fn observe(
    n: &Node,
    env: &JobEnv,
    ran: &Ran<'_>,
    path: &Path,
    prog: &Progress,
) -> Vec<Observation> {
    let Ran { gpu, me, history, samples } = *ran;
    let log = |m: &str| (n.log)(&format!("kace: epilog: job {}: {m}", env.job));
    if kace_sql::validate_workload_name(&me.workload).is_err() {
        log("couldn't name the job's workload; no observation");
        return Vec::new();
    }
    let truncated = prog.truncated;
    if truncated {
        log(&format!("read only the first {} bytes of the progress file", progress::MAX_BYTES));
    }
    if prog.skipped > 0 {
        log(&format!("skipped {} malformed or backwards progress line(s)", prog.skipped));
    }
    let end = me.end.unwrap_or(me.start);
    let warmup = n.config.profiling.warmup_steps;
    if let Ok(t) = prog.throughput(warmup) {
        log(&format!("whole run: {} steps/s", progress::format_rate(t.steps_per_second)));
    }
    let mut out = Vec::new();
    let mut unspooled = 0;
    // What root measured of the GPU while the job ran (none without kace-sampler): each
    // interval carries its mean SM utilization, which ingest holds the claimed rate against,
    // and the GPU's energy over it.
    let readings: &[kace_sampler::Reading] = samples.as_deref().unwrap_or(&[]);
    let mut split = 0;
    for (i, seg) in segments(me.start, end, history).iter().enumerate() {
        let Some((thr, steps)) = throughput_within(&prog.points, seg.start, seg.end, warmup) else {
            continue;
        };
        // The interference model learns what groups do as MPS runs them unasked (100/100): an
        // interval in which kace capped a member's SMs says something else.
        if me.thread_pct.is_some() || seg.partners.iter().any(|p| p.thread_pct.is_some()) {
            split += 1;
            continue;
        }
        if seg.partners.iter().any(|p| kace_sql::validate_workload_name(&p.workload).is_err()) {
            log("a partner's workload is unknown; that interval is not observed");
            continue;
        }
        let obs = Observation {
            key: kace_sql::spool::observation_key(&env.cluster, &env.job.to_string(), me.start, i),
            job: env.job.to_string(),
            workload: me.workload.clone(),
            partners: seg
                .partners
                .iter()
                .map(|p| Partner { job: p.job.to_string(), workload: p.workload.clone() })
                .collect(),
            node: env.node.clone(),
            gpu: gpu.0.to_string(),
            mps_share: env.mps_share,
            start: seg.start,
            end: seg.end,
            steps: Some(steps),
            throughput: thr,
            user: (!env.user.is_empty()).then(|| env.user.clone()),
            account: (!env.account.is_empty()).then(|| env.account.clone()),
            gpu_sm_pct: mean_sm_within(readings, seg.start, seg.end),
            gpu_energy_j: kace_sampler::energy_within(readings, seg.start, seg.end),
        };
        match write_or_park(&n.config.spool.dir, &n.config.node.progress_root, &obs) {
            Ok(Written::Spooled(_)) => out.push(obs),
            Ok(Written::Parked { path, cause }) => {
                log(&format!(
                    "couldn't spool observation {} ({cause}); parked it as {} for a later epilog",
                    obs.key,
                    path.display()
                ));
                out.push(obs);
            }
            Err(e) => {
                log(&format!("couldn't spool observation {}: {e}", obs.key));
                unspooled += 1;
            }
        }
    }
    if split > 0 {
        log(&format!(
            "{split} interval(s) ran with an SM share kace set; not observed (the interference \
             model learns groups as MPS runs them unasked)"
        ));
    }
    if unspooled > 0 {
        // A full spool must not also cost the raw data: keep the progress file, renamed so that
        // the caller's clean-up passes it by (a rename needs no free space).
        let kept = path.with_extension("progress.unspooled");
        match std::fs::rename(path, &kept) {
            Ok(()) => log(&format!(
                "kept the progress file as {}: {unspooled} observation(s) could not be spooled",
                kept.display()
            )),
            Err(e) => log(&format!("couldn't keep the progress file {}: {e}", path.display())),
        }
    } else if out.is_empty() && prog.points.is_empty() && prog.outside > 0 {
        log(&format!(
            "its {} progress line(s) lie outside its run by this node's clock (more than {CLOCK_SLACK_S:.0} s before its start or after {end:.0}): the job's clock and the epilog's disagree, or the times are not real; no observation",
            prog.outside
        ));
    } else if out.is_empty() && !prog.points.is_empty() {
        log("too few progress lines inside any interval; no observation");
    }
    if prog.outside > 0 && !out.is_empty() {
        log(&format!(
            "skipped {} progress line(s) timed outside its run by this node's clock",
            prog.outside
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(job: u32, start: f64, end: Option<f64>) -> JobRecord {
        JobRecord { job, workload: format!("w{job}"), start, end, user: None, thread_pct: None }
    }

    #[test]
    fn segments_split_at_partner_starts_and_ends() {
        // Alone 0–10, with 2 from 10–20, with 2 and 3 from 20–25, with 3 until 30.
        let others = [rec(2, 10.0, Some(25.0)), rec(3, 20.0, None), rec(4, 40.0, Some(50.0))];
        let s = segments(0.0, 30.0, &others);
        let shape: Vec<(f64, f64, Vec<u32>)> = s
            .iter()
            .map(|g| (g.start, g.end, g.partners.iter().map(|p| p.job).collect()))
            .collect();
        assert_eq!(
            shape,
            vec![
                (0.0, 10.0, vec![]),
                (10.0, 20.0, vec![2]),
                (20.0, 25.0, vec![2, 3]),
                (25.0, 30.0, vec![3]),
            ]
        );
        assert_eq!(segments(0.0, 10.0, &[]).len(), 1);
        assert!(segments(5.0, 5.0, &[]).is_empty());
    }

    #[test]
    fn throughput_uses_points_inside_the_interval_after_warmup() {
        let p = progress::parse("0 0\n1 10\n2 20\n3 30\n4 50\n5 70\n");
        assert_eq!(throughput_within(&p.points, 0.0, 3.0, 0), Some((10.0, 30.0)));
        assert_eq!(throughput_within(&p.points, 3.0, 5.0, 0), Some((20.0, 40.0)));
        assert_eq!(throughput_within(&p.points, 0.0, 2.0, 15), None);
        assert_eq!(throughput_within(&p.points, 10.0, 20.0, 0), None);
    }
}
