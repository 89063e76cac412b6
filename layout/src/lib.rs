//! Where kace's per-GPU MPS directories and per-job progress files live. Dependency-free and pure
//! except for [`trusted_dir`] (whether such a directory is root's), [`memory_limit`] and
//! [`release_ticket`] (the files handed from one hook to the next); its paths are
//! shared so that the prolog (which starts the MPS control daemon) and the epilog (which reads
//! progress) compute exactly the paths the SPANK plugin gives the job's tasks.
//!
//! Layout, for `mps_root=/run/kace/mps`, `progress_root=/var/spool/kace/progress`:
//! ```text
//! /run/kace/mps/<gpu>/pipe            CUDA_MPS_PIPE_DIRECTORY of the daemon for GPU <gpu>
//! /run/kace/mps/<gpu>/log             CUDA_MPS_LOG_DIRECTORY of that daemon
//! /var/spool/kace/progress/<job>.progress   KACE_PROGRESS_FILE of job <job>
//! /var/spool/kace/progress/<job>.memlimit   its memory limit, from the prolog ([`memory_limit`])
//! <spool.dir>/released/<job>               the decider's word to its prolog ([`release_ticket`])
//! ```
//! It also holds the workload-name rule ([`workload_name`]), which every part of kace shares.
//!
//! `<gpu>` is the node-global GPU index (the first entry of `SLURM_JOB_GPUS`, which Slurm gives
//! in host numbering both to the prolog and to the job, falling back to `CUDA_VISIBLE_DEVICES`).

#![warn(missing_docs)]

use std::path::{Path, PathBuf};

pub mod handover;
pub mod memory_limit;
pub mod release_ticket;
pub mod thread_share;
pub mod trusted_dir;
pub mod workload_name;

/// Default MPS root: a tmpfs, since MPS pipes must not outlive a reboot.
pub const DEFAULT_MPS_ROOT: &str = "/run/kace/mps";
/// Default progress root: survives a slurmd restart, so the epilog can still read it.
pub const DEFAULT_PROGRESS_ROOT: &str = "/var/spool/kace/progress";
/// Where the packages install the automatic PyTorch progress hook (`python/autohook/` of the
/// source tree): the directory the plugin puts first on a kace job's `PYTHONPATH`, and `kace
/// profile run` on its workload's.
pub const DEFAULT_PYTHON_HOOK: &str = "/usr/share/kace/python/autohook";

/// Whether `dir` holds the automatic progress hook (its `sitecustomize.py`).
pub fn is_python_hook(dir: &Path) -> bool {
    dir.join("sitecustomize.py").is_file()
}

/// `PYTHONPATH` with the hook directory first, before `old` (unset or empty: the hook alone).
/// Bytes, since an environment value need not be UTF-8.
pub fn python_path_with_hook(hook: &Path, old: Option<&[u8]>) -> Vec<u8> {
    use std::os::unix::ffi::OsStrExt;
    let mut value = hook.as_os_str().as_bytes().to_vec();
    if let Some(old) = old.filter(|o| !o.is_empty()) {
        value.push(b':');
        value.extend_from_slice(old);
    }
    value
}
/// Longest MPS root accepted, in bytes. MPS listens on a Unix socket
/// `<mps_root>/<gpu>/pipe/control`, and `sun_path` holds 107 bytes; 64 leaves room for the
/// GPU index and the suffixes.
pub const MAX_MPS_ROOT_LEN: usize = 64;

/// A node-global GPU index, as Slurm numbers the node's `gpu` gres.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct GpuIndex(pub u32);

/// One GPU's MPS directories.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpsDirs {
    /// `CUDA_MPS_PIPE_DIRECTORY`: where the control daemon's socket lives.
    pub pipe: PathBuf,
    /// `CUDA_MPS_LOG_DIRECTORY`: where the control daemon writes its logs.
    pub log: PathBuf,
}

/// The MPS directories of GPU `gpu` under `mps_root`.
pub fn mps_dirs(mps_root: &Path, gpu: GpuIndex) -> MpsDirs {
    let base = mps_root.join(gpu.0.to_string());
    MpsDirs { pipe: base.join("pipe"), log: base.join("log") }
}

/// The progress file of job `job_id` under `progress_root`.
pub fn progress_file(progress_root: &Path, job_id: u32) -> PathBuf {
    progress_root.join(format!("{job_id}.progress"))
}

/// The GPU whose MPS daemon a job uses, from the job's `SLURM_JOB_GPUS` and
/// `CUDA_VISIBLE_DEVICES`. A kace job holds one GPU (a shard of it); if it holds several, the
/// first listed is used, since one process talks to one MPS daemon. `None` when neither
/// variable starts with a plain index (unset, empty, `NoDevFiles`, a `GPU-<uuid>`).
pub fn job_gpu(
    slurm_job_gpus: Option<&str>,
    cuda_visible_devices: Option<&str>,
) -> Option<GpuIndex> {
    [slurm_job_gpus, cuda_visible_devices].into_iter().flatten().find_map(first_index)
}

fn first_index(list: &str) -> Option<GpuIndex> {
    let first = list.split(',').next()?.trim();
    if first.is_empty() || first.len() > 9 || !first.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    first.parse().ok().map(GpuIndex)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hook_goes_first_on_pythonpath() {
        let hook = Path::new("/usr/share/kace/python/autohook");
        assert_eq!(python_path_with_hook(hook, None), hook.to_str().unwrap().as_bytes());
        assert_eq!(python_path_with_hook(hook, Some(b"")), hook.to_str().unwrap().as_bytes());
        assert_eq!(
            python_path_with_hook(hook, Some(b"/home/u/lib:\xff")),
            b"/usr/share/kace/python/autohook:/home/u/lib:\xff"
        );
    }

    #[test]
    fn mps_dirs_follow_the_documented_layout() {
        let d = mps_dirs(Path::new("/run/kace/mps"), GpuIndex(3));
        assert_eq!(d.pipe, Path::new("/run/kace/mps/3/pipe"));
        assert_eq!(d.log, Path::new("/run/kace/mps/3/log"));
    }

    #[test]
    fn progress_file_is_per_job() {
        let p = progress_file(Path::new("/var/spool/kace/progress"), 4711);
        assert_eq!(p, Path::new("/var/spool/kace/progress/4711.progress"));
    }

    #[test]
    fn slurm_job_gpus_wins_over_cuda_visible_devices() {
        // Under ConstrainDevices the job sees CUDA_VISIBLE_DEVICES=0 for host GPU 1.
        assert_eq!(job_gpu(Some("1"), Some("0")), Some(GpuIndex(1)));
        assert_eq!(job_gpu(None, Some("2")), Some(GpuIndex(2)));
        assert_eq!(job_gpu(Some(""), Some("2")), Some(GpuIndex(2)));
    }

    #[test]
    fn first_gpu_of_a_list_is_used() {
        assert_eq!(job_gpu(Some("4,5"), None), Some(GpuIndex(4)));
        assert_eq!(job_gpu(Some(" 7 ,1"), None), Some(GpuIndex(7)));
    }

    #[test]
    fn no_plain_index_means_no_gpu() {
        assert_eq!(job_gpu(None, None), None);
        assert_eq!(job_gpu(Some("NoDevFiles"), Some("GPU-8f2a")), None);
        assert_eq!(job_gpu(Some("-1"), None), None);
        assert_eq!(job_gpu(Some("99999999999"), None), None);
    }
}
