//! Node-local state under `node.state_dir`: one lock per GPU and the record of the kace jobs
//! that use it (running, and recently ended, with their times), so that the prolog knows
//! whether a GPU already has a kace job and the epilog knows who shared it and when.
//!
//! ```text
//! <state_dir>/<node>/gpu<N>/lock        flock(2) taken around every change below
//! <state_dir>/<node>/gpu<N>/jobs/<job>  "<workload> <start> - <user>[ <share>]"     a kace job on GPU N
//! <state_dir>/<node>/gpu<N>/ended/<job> "<workload> <start> <end> <user>[ <share>]" kept a day, for overlaps
//! ```
//! `<share>` is the SM percentage the decider gave the job (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`,
//! 1–99), absent when none was set; readers before it ignore the fifth word.
//! The node name is part of the path because several slurmd may share a host (Slurm's
//! `MULTIPLE_SLURMD`, as in kace's own tests) and the same state directory.
//! Files hold only what root wrote; they are still read with a size bound and parsed strictly.

use std::fs::{self, File, OpenOptions};
use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Creates `state_dir` as usual (it may hold the MPS directories, which job users traverse),
/// then `dir` below it and its missing parents `0750`: job records name users' jobs and
/// workloads, which other users need not read.
fn private_dir(state_dir: &Path, dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    fs::create_dir_all(state_dir)?;
    fs::DirBuilder::new().recursive(true).mode(0o750).create(dir)
}

use kace_layout::GpuIndex;

use crate::error::{io, Error, Result};

/// How long an ended job's record is kept for its partners' epilogs.
pub const KEEP_ENDED_S: f64 = 86_400.0;

/// A kace job's record on a GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct JobRecord {
    /// Job id.
    pub job: u32,
    /// Its workload.
    pub workload: String,
    /// When its prolog ran, Unix seconds.
    pub start: f64,
    /// When its epilog ran (ended jobs only).
    pub end: Option<f64>,
    /// Its user (`None` in records written before kace kept users, or not a plain name).
    pub user: Option<String>,
    /// The SM share it ran with (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`, 1–99), when kace set one.
    pub thread_pct: Option<u8>,
}

impl JobRecord {
    /// The record's text with `end` (`None`: running).
    fn text(&self, end: Option<f64>) -> String {
        let end = end.map_or("-".to_string(), |e| e.to_string());
        let user = user_field(self.user.as_deref());
        match self.thread_pct {
            Some(t) => format!("{} {} {end} {user} {t}\n", self.workload, self.start),
            None => format!("{} {} {end} {user}\n", self.workload, self.start),
        }
    }
}

/// A user name as stored: Slurm's name when it is one plain word, else `-` (unknown).
fn user_field(user: Option<&str>) -> &str {
    user.filter(|u| !u.is_empty() && u.len() <= 64 && !u.contains(char::is_whitespace) && *u != "-")
        .unwrap_or("-")
}

/// An exclusive lock on one GPU's state, released when dropped.
#[derive(Debug)]
pub struct GpuLock {
    _file: File,
    dir: PathBuf,
}

/// Takes the lock of GPU `gpu` of `node`, waiting until `deadline` at most.
pub fn lock_gpu(state_dir: &Path, node: &str, gpu: GpuIndex, deadline: Instant) -> Result<GpuLock> {
    // Node names come from Slurm's configuration; refuse anything that could leave the dir.
    if node.is_empty() || node.starts_with('.') || node.contains('/') {
        return Err(Error::Env {
            var: "SLURMD_NODENAME",
            why: format!("{node:?} is not a node name"),
        });
    }
    let dir = state_dir.join(node).join(format!("gpu{}", gpu.0));
    for sub in ["jobs", "ended"] {
        private_dir(state_dir, &dir.join(sub)).map_err(io("create state directory", &dir))?;
    }
    // Root writes and renames records here: a directory a user could change is refused.
    kace_layout::trusted_dir::ensure_trusted_dir(&dir)
        .map_err(|e| io("use state directory", &dir)(std::io::Error::other(e)))?;
    let file = lock_file(&dir.join("lock"), deadline)?;
    Ok(GpuLock { _file: file, dir })
}

/// Takes an exclusive lock on `path` (created if missing), waiting until `deadline` at most;
/// `Ok(None)`-like failures are reported as a budget error naming the lock.
pub fn lock_file(path: &Path, deadline: Instant) -> Result<File> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(io("open lock file", path))?;
    loop {
        // SAFETY: flock on a descriptor we own; no memory is passed.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc == 0 {
            return Ok(file);
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(io("lock", path)(err));
        }
        if Instant::now() >= deadline {
            return Err(Error::Budget { step: format!("taking the lock {}", path.display()) });
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Tries the lock once: `None` when someone else holds it.
pub fn try_lock_file(path: &Path) -> Result<Option<File>> {
    match lock_file(path, Instant::now()) {
        Ok(f) => Ok(Some(f)),
        Err(Error::Budget { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

fn read_small(path: &Path) -> Option<String> {
    let mut s = String::new();
    File::open(path).ok()?.take(4096).read_to_string(&mut s).ok()?;
    Some(s)
}

fn parse_record(job: u32, text: &str) -> Option<JobRecord> {
    let mut it = text.split_whitespace();
    let workload = it.next()?.to_string();
    let start = it.next()?.parse().ok()?;
    let end = match it.next() {
        Some("-") | None => None,
        Some(e) => Some(e.parse().ok()?),
    };
    let user = it.next().filter(|u| *u != "-").map(str::to_string);
    let thread_pct = it.next().and_then(kace_layout::thread_share::parse_percent);
    Some(JobRecord { job, workload, start, end, user, thread_pct })
}

fn records(dir: &Path) -> Vec<JobRecord> {
    let Ok(entries) = fs::read_dir(dir) else { return Vec::new() };
    let mut out: Vec<JobRecord> = entries
        .flatten()
        .filter_map(|e| {
            let job = e.file_name().to_str()?.parse().ok()?;
            parse_record(job, &read_small(&e.path())?)
        })
        .collect();
    out.sort_by_key(|r| r.job);
    out
}

impl GpuLock {
    /// The kace jobs recorded as running on this GPU.
    pub fn running(&self) -> Vec<JobRecord> {
        records(&self.dir.join("jobs"))
    }

    /// The kace jobs that ended on this GPU within [`KEEP_ENDED_S`].
    pub fn ended(&self) -> Vec<JobRecord> {
        records(&self.dir.join("ended"))
    }

    /// Records `job` of `user` as running since `start`, with no SM share.
    pub fn add(&self, job: u32, workload: &str, start: f64, user: Option<&str>) -> Result<()> {
        let user = user.map(str::to_string);
        let workload = workload.to_string();
        self.add_record(&JobRecord { job, workload, start, end: None, user, thread_pct: None })
    }

    /// Records `job` as running (its `end` is ignored).
    pub fn add_record(&self, job: &JobRecord) -> Result<()> {
        let p = self.dir.join("jobs").join(job.job.to_string());
        fs::write(&p, job.text(None)).map_err(io("record job", &p))
    }

    /// Forgets a running job without recording an end (it is not there any more).
    pub fn forget(&self, job: u32) -> Result<()> {
        let p = self.dir.join("jobs").join(job.to_string());
        match fs::remove_file(&p) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io("remove job record", &p)(e)),
        }
    }

    /// Rewrites the end of an ended record `r` to `end`: the epilog that wrote it had a clock
    /// ahead of this one's (see `epilog`'s clock check), and a future end would make the job
    /// every later job's partner on the GPU.
    pub fn reend(&self, r: &JobRecord, end: f64) -> Result<()> {
        let p = self.dir.join("ended").join(r.job.to_string());
        let r = JobRecord { start: r.start.min(end), ..r.clone() };
        fs::write(&p, r.text(Some(end))).map_err(io("record job end", &p))
    }

    /// Moves `job` from running to ended at `end`; returns its record, when it had one.
    /// Ended records older than [`KEEP_ENDED_S`] are dropped on the way.
    pub fn end(&self, job: u32, end: f64) -> Result<Option<JobRecord>> {
        let running = self.dir.join("jobs").join(job.to_string());
        let rec = read_small(&running).and_then(|t| parse_record(job, &t));
        if let Some(r) = &rec {
            let p = self.dir.join("ended").join(job.to_string());
            fs::write(&p, r.text(Some(end))).map_err(io("record job end", &p))?;
        }
        self.forget(job)?;
        for old in self.ended() {
            if old.end.is_some_and(|e| end - e > KEEP_ENDED_S) {
                let _ = fs::remove_file(self.dir.join("ended").join(old.job.to_string()));
            }
        }
        Ok(rec.map(|r| JobRecord { end: Some(end), ..r }))
    }
}

/// The GPU on which `node`'s record holds `job` as running: the epilog's fallback when Slurm
/// gives it neither `SLURM_JOB_GPUS` nor `CUDA_VISIBLE_DEVICES` (after a slurmctld restart).
pub fn gpu_of(state_dir: &Path, node: &str, job: u32) -> Option<GpuIndex> {
    if node.is_empty() || node.starts_with('.') || node.contains('/') {
        return None;
    }
    let entries = fs::read_dir(state_dir.join(node)).ok()?;
    let mut found: Vec<u32> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name();
            let index: u32 = name.to_str()?.strip_prefix("gpu")?.parse().ok()?;
            e.path().join("jobs").join(job.to_string()).is_file().then_some(index)
        })
        .collect();
    found.sort_unstable();
    // A job on several GPUs is not one kace places; only an unambiguous record is used.
    (found.len() == 1).then(|| GpuIndex(found[0]))
}

/// Which of `jobs` (kace jobs recorded on a GPU of `node`) Slurm still has on that node,
/// starting, running or completing: a job with a step on this node is (asked of the node's
/// slurmstepd, no RPC); any other is read singly from slurmctld (`squeue -j`, that job only:
/// one in its prolog has no step yet), never a listing of the node's or the queue's jobs.
pub fn alive_on(slurm: &dyn crate::slurm::Slurm, node: &str, jobs: &[u32]) -> Result<Vec<u32>> {
    let mut alive = Vec::new();
    for &j in jobs {
        if slurm.steps_here(j, node).unwrap_or(false) {
            alive.push(j);
            continue;
        }
        if let Some(q) = slurm.queued(j)? {
            if q.node == node && (q.on_gpu() || q.completing()) {
                alive.push(j);
            }
        }
    }
    Ok(alive)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(tag: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("kace-node-state-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&p);
        p
    }

    #[test]
    fn jobs_are_recorded_ended_and_forgotten() {
        let d = tmp("rec");
        let deadline = Instant::now() + Duration::from_secs(5);
        let l = lock_gpu(&d, "n1", GpuIndex(1), deadline).unwrap();
        let rec =
            |job: u32, workload: &str, start: f64, user: &str, thread_pct: Option<u8>| JobRecord {
                job,
                workload: workload.into(),
                start,
                end: None,
                user: Some(user.into()),
                thread_pct,
            };
        l.add(5, "bert", 100.0, Some("ann")).unwrap();
        l.add(6, "lstm", 101.5, Some("two words")).unwrap();
        l.add_record(&rec(7, "vit", 102.0, "bob", Some(40))).unwrap();
        assert_eq!(l.running().iter().find(|r| r.job == 7).unwrap().thread_pct, Some(40));
        assert_eq!(l.end(7, 109.0).unwrap().unwrap().thread_pct, Some(40));
        assert_eq!(l.ended().iter().find(|r| r.job == 7).unwrap().thread_pct, Some(40));
        fs::remove_file(d.join("n1/gpu1/ended/7")).unwrap();
        assert_eq!(l.running().iter().map(|r| r.job).collect::<Vec<_>>(), vec![5, 6]);
        assert_eq!(l.running()[1].user, None);
        assert_eq!(gpu_of(&d, "n1", 6), Some(GpuIndex(1)));
        assert_eq!(gpu_of(&d, "n1", 7), None);
        let ended = l.end(5, 110.0).unwrap().unwrap();
        assert_eq!((ended.workload.as_str(), ended.start, ended.end), ("bert", 100.0, Some(110.0)));
        assert_eq!(l.ended()[0].user.as_deref(), Some("ann"));
        // Records of an older kace (no user) still read.
        fs::write(d.join("n1/gpu1/jobs/8"), "vit 5\n").unwrap();
        assert!(l.running().iter().any(|r| r.job == 8 && r.user.is_none() && r.end.is_none()));
        l.forget(8).unwrap();
        assert_eq!(l.ended().len(), 1);
        assert_eq!(l.end(99, 1.0).unwrap(), None);
        l.forget(6).unwrap();
        assert!(l.running().is_empty());
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn a_held_lock_times_out_and_try_lock_says_busy() {
        let d = tmp("lock");
        let l = lock_gpu(&d, "n1", GpuIndex(0), Instant::now()).unwrap();
        let again = lock_gpu(&d, "n1", GpuIndex(0), Instant::now() + Duration::from_millis(30));
        assert!(matches!(again, Err(Error::Budget { .. })), "{again:?}");
        assert!(try_lock_file(&d.join("n1/gpu0/lock")).unwrap().is_none());
        drop(l);
        assert!(try_lock_file(&d.join("n1/gpu0/lock")).unwrap().is_some());
        let _ = fs::remove_dir_all(&d);
    }
}
