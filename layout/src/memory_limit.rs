//! The memory guard's hand-over from the prolog to the SPANK plugin: the prolog writes a kace
//! job's limit (memcap × (1 + `mps.memory_limit_margin`)) into a root-owned file beside the job's
//! progress file, and the plugin turns it into the job's `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`, so
//! that a job outgrowing its profile fails alone instead of ending its partner.
//!
//! The limit is the job's, not each process's: NVIDIA's MPS client reads the variable in every
//! process that initialises CUDA, and each such process may allocate up to it (the MPS guide,
//! "Memory Limits": the pinned device memory limit applies per client; the control daemon's
//! `set_device_pinned_mem_limit` sets the same per-client value for a server's future clients,
//! so no MPS setting bounds a group of processes). A step with N tasks on the node therefore
//! gives each task [`MemoryLimit::per_process`]`(N)`, so that together they stay within it.
//!
//! The device in the value is `0`: kace starts each GPU's MPS control daemon with
//! `CUDA_VISIBLE_DEVICES=<that GPU>`, and the MPS server remaps the devices it sees, so a client
//! of that daemon sees its GPU as device 0 whatever its node-global index (NVIDIA's MPS guide,
//! "Environment Variables": devices are remapped by the server).

use std::path::{Path, PathBuf};

/// The variable NVIDIA's MPS client reads.
pub const VAR: &str = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT";

/// The same value, set beside [`VAR`] so that kace's Python hook knows it is kace's: in the
/// workers torchrun starts from one task (`$LOCAL_WORLD_SIZE` of them) it divides the task's
/// share among them before CUDA starts (python/autohook/sitecustomize.py).
pub const TASK_VAR: &str = "KACE_TASK_MEMORY_LIMIT";

/// Longest limit file accepted (`0=<20 digits>M` and a newline).
pub const MAX_FILE_BYTES: u64 = 64;

/// The limit file of job `job_id` under `progress_root`.
pub fn file(progress_root: &Path, job_id: u32) -> PathBuf {
    progress_root.join(format!("{job_id}.memlimit"))
}

/// A job's device-memory limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryLimit {
    /// The limit, MiB.
    pub mib: u64,
}

impl MemoryLimit {
    /// The limit for a workload of `memcap_gib` with `margin` (0.1 = 10 %) on top, rounded up to
    /// whole MiB; `None` for a memcap or margin that is not a positive finite number.
    pub fn of(memcap_gib: f64, margin: f64) -> Option<MemoryLimit> {
        let mib = (memcap_gib * 1024.0 * (1.0 + margin)).ceil();
        (memcap_gib.is_finite() && margin.is_finite() && margin >= 0.0 && mib >= 1.0)
            .then_some(MemoryLimit { mib: mib.min(u64::MAX as f64) as u64 })
    }

    /// Each of `processes` processes' share of this limit, whole MiB rounded down (so the
    /// shares never add up to more), at least 1 MiB; 0 processes counts as 1.
    pub fn per_process(self, processes: u32) -> MemoryLimit {
        MemoryLimit { mib: (self.mib / u64::from(processes.max(1))).max(1) }
    }

    /// The value of [`VAR`]: `0=<mib>M`.
    pub fn env_value(&self) -> String {
        format!("0={}M", self.mib)
    }

    /// Reads what [`MemoryLimit::env_value`] wrote (one line, `0=<digits>M`), nothing else.
    pub fn parse(text: &str) -> Option<MemoryLimit> {
        let digits =
            text.strip_suffix('\n').unwrap_or(text).strip_prefix("0=")?.strip_suffix('M')?;
        if digits.is_empty() || digits.len() > 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let mib: u64 = digits.parse().ok()?;
        (mib > 0).then_some(MemoryLimit { mib })
    }
}

/// The limit the prolog wrote for `job_id` (see the module docs): only a regular
/// file owned by `owner` (root), not a link, at most a few bytes, in the one form the prolog
/// writes. `None` when there is none.
pub fn read(progress_root: &Path, job_id: u32, owner: u32) -> Result<Option<MemoryLimit>, String> {
    let path = file(progress_root, job_id);
    let form = "a limit of the form 0=<MiB>M";
    crate::handover::read_parsed(&path, MAX_FILE_BYTES, owner, MemoryLimit::parse, form)
}

/// Writes `limit` as job `job_id`'s limit file (mode 0644: the plugin reads it in the job's
/// own context), replacing any earlier one atomically; with `None`, removes it. The caller has
/// checked that `progress_root` is root's.
pub fn write(progress_root: &Path, job_id: u32, limit: Option<MemoryLimit>) -> std::io::Result<()> {
    let text = limit.map(|l| format!("{}\n", l.env_value()));
    crate::handover::write(&file(progress_root, job_id), text.as_deref(), 0o644)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_is_memcap_plus_margin_in_whole_mib() {
        let l = MemoryLimit::of(3.0, 0.1).unwrap();
        assert_eq!(l.mib, 3380); // 3072 × 1.1 = 3379.2, rounded up
        assert_eq!(l.env_value(), "0=3380M");
        assert_eq!(MemoryLimit::parse("0=3380M\n"), Some(l));
        assert_eq!(MemoryLimit::of(0.0, 0.1), None);
        assert_eq!(MemoryLimit::of(f64::NAN, 0.1), None);
        assert_eq!(MemoryLimit::of(2.0, -0.5), None);
        assert_eq!(file(Path::new("/p"), 7), PathBuf::from("/p/7.memlimit"));
    }

    #[test]
    fn a_step_of_n_tasks_shares_the_job_limit() {
        let job = MemoryLimit { mib: 3381 };
        assert_eq!(job.per_process(1), job);
        assert_eq!(job.per_process(0), job);
        assert_eq!(job.per_process(2).mib, 1690);
        assert!(job.per_process(3).mib * 3 <= job.mib);
        assert_eq!(MemoryLimit { mib: 3 }.per_process(8).mib, 1);
    }

    #[test]
    fn only_the_written_form_parses() {
        for bad in ["", "0=M", "1=5M", "0=5G", "0=5M\n\n", "0=-5M", "0=5M;rm", "0=0M", " 0=5M"] {
            assert_eq!(MemoryLimit::parse(bad), None, "{bad:?}");
        }
        assert_eq!(MemoryLimit::parse(&format!("0={}M", "9".repeat(21))), None);
    }
}

#[cfg(test)]
mod read_tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn the_limit_file_is_read_only_in_the_form_and_from_the_owner_the_prolog_gives_it() {
        let dir = std::env::temp_dir().join(format!("kace-spank-limit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let me = std::fs::metadata(&dir).unwrap().uid();
        assert_eq!(read(&dir, 7, me), Ok(None));
        write(&dir, 7, MemoryLimit::of(3.0, 0.1)).unwrap();
        let got = read(&dir, 7, me).unwrap().unwrap();
        assert_eq!(got.env_value(), "0=3380M");
        // Someone else's file, a link, or another form is refused.
        assert!(read(&dir, 7, me + 1).is_err());
        std::os::unix::fs::symlink(dir.join("7.memlimit"), dir.join("8.memlimit")).unwrap();
        assert!(read(&dir, 8, me).is_err());
        std::fs::write(dir.join("9.memlimit"), "0=1G\n").unwrap();
        assert!(read(&dir, 9, me).is_err());
        write(&dir, 7, None).unwrap();
        assert_eq!(read(&dir, 7, me), Ok(None));
        write(&dir, 7, None).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
