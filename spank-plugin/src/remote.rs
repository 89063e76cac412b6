//! slurmstepd (remote context): the environment a kace job's tasks get — the MPS directories of
//! the job's GPU and the job's progress file, laid out by [`crate::layout`].

use std::ffi::{c_int, CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::config;
use crate::layout;
use crate::slurm::{log, Handle, Level};

/// Sets the task environment of a kace job. Never fails the job: without these variables it
/// still runs, only unshared and unmeasured, and every problem is logged.
pub fn set_task_env(sp: Handle, args: &[&[u8]]) -> c_int {
    if crate::option::request().is_none() {
        return 0;
    }
    let config = match config::parse(args.iter().copied()) {
        Ok(c) => c,
        Err(e) => {
            log(Level::Error, &format!("kace: user_init: couldn't parse plugin arguments: {e}"));
            return 0;
        }
    };
    let job_id = match sp.job_id() {
        Ok(id) => id,
        Err(e) => {
            log(Level::Error, &format!("kace: user_init: couldn't get the job id: {e}"));
            return 0;
        }
    };
    let progress = layout::progress_file(&config.progress_root, job_id);
    set(sp, c"KACE_PROGRESS_FILE", &progress);

    let read = |name: &CStr| match sp.getenv(name) {
        Ok(v) => v,
        Err(e) => {
            let name = name.to_string_lossy();
            log(Level::Error, &format!("kace: user_init: couldn't read {name}: {e}"));
            None
        }
    };
    let gpus = read(c"SLURM_JOB_GPUS");
    let visible = read(c"CUDA_VISIBLE_DEVICES");
    match layout::job_gpu(gpus.as_deref(), visible.as_deref()) {
        Some(gpu) => {
            let dirs = layout::mps_dirs(&config.mps_root, gpu);
            set(sp, c"CUDA_MPS_PIPE_DIRECTORY", &dirs.pipe);
            set(sp, c"CUDA_MPS_LOG_DIRECTORY", &dirs.log);
        }
        None => log(
            Level::Verbose,
            &format!("kace: user_init: job {job_id} has no GPU index; MPS variables not set"),
        ),
    }
    0
}

fn set(sp: Handle, name: &CStr, path: &Path) {
    // Paths are built from validated config (no NUL) and numbers.
    let value = CString::new(path.as_os_str().as_bytes()).unwrap_or_default();
    if let Err(e) = sp.setenv(name, &value) {
        let name = name.to_string_lossy();
        log(Level::Error, &format!("kace: user_init: couldn't set {name}: {e}"));
    }
}
