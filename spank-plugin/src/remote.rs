//! slurmstepd (remote context): the environment a kace job's tasks get — the MPS directories of
//! the job's GPU, the job's progress file, laid out by [`crate::layout`], the memory guard's
//! `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` that the prolog computed for the job, and the SM share
//! (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`) the decider chose for it, when it chose one.

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
    prepend_python_hook(sp, &config.python_hook);

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
            set_memory_limit(sp, &config.progress_root, job_id);
            set_thread_share(sp, &config.progress_root, job_id);
        }
        None => log(
            Level::Verbose,
            &format!("kace: user_init: job {job_id} has no GPU index; MPS variables not set"),
        ),
    }
    0
}

/// Sets the job's `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` from the prolog's limit file, replacing
/// any value the job brought (the limit protects the job's GPU partners). No file: no limit.
/// The file holds the job's limit; a step of N tasks on the node gives each task 1/N of it
/// (the variable bounds each process, see [`crate::layout::memory_limit`]).
fn set_memory_limit(sp: Handle, progress_root: &Path, job_id: u32) {
    match crate::layout::memory_limit::read(progress_root, job_id, 0) {
        Ok(Some(job_limit)) => {
            let tasks = sp.local_task_count().unwrap_or_else(|e| {
                // The whole limit to each task errs towards the partner's risk, not the job's:
                // one task is by far the common case, and it gets exactly its limit.
                log(Level::Error, &format!("kace: user_init: couldn't get the task count: {e}"));
                1
            });
            let limit = job_limit.per_process(tasks);
            // Digits only: no NUL can be inside.
            let value = CString::new(limit.env_value()).unwrap_or_default();
            // The second copy tells the Python hook which value is kace's (it divides it among
            // torchrun's workers).
            use crate::layout::memory_limit::{TASK_VAR, VAR};
            for name in [VAR, TASK_VAR] {
                // Constant names without NUL.
                let c_name = CString::new(name).unwrap_or_default();
                if let Err(e) = sp.setenv(&c_name, &value) {
                    log(Level::Error, &format!("kace: user_init: couldn't set {name}: {e}"));
                }
            }
            if tasks > 1 {
                log(
                    Level::Verbose,
                    &format!(
                        "kace: user_init: job {job_id}'s limit of {} MiB shared by {tasks} tasks: \
                         {} MiB each",
                        job_limit.mib, limit.mib
                    ),
                );
            }
        }
        Ok(None) => log(
            Level::Verbose,
            &format!("kace: user_init: job {job_id} has no memory limit (no memcap known)"),
        ),
        Err(e) => {
            log(Level::Error, &format!("kace: user_init: couldn't read the memory limit: {e}"))
        }
    }
}

/// Sets the job's `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` from the prolog's share file (the
/// decider's SM split for a job it added beside a running one), the same for every task: the
/// variable is a fraction of the SMs per client ([`crate::layout::thread_share`]). No file:
/// nothing set, the job's own value (if any) stays.
fn set_thread_share(sp: Handle, progress_root: &Path, job_id: u32) {
    use crate::layout::thread_share::{read, VAR};
    match read(progress_root, job_id, 0) {
        Ok(Some(pct)) => {
            // Digits only: no NUL can be inside.
            let value = CString::new(pct.to_string()).unwrap_or_default();
            let c_name = CString::new(VAR).unwrap_or_default();
            if let Err(e) = sp.setenv(&c_name, &value) {
                log(Level::Error, &format!("kace: user_init: couldn't set {VAR}: {e}"));
            }
        }
        Ok(None) => {}
        Err(e) => log(Level::Error, &format!("kace: user_init: couldn't read the SM share: {e}")),
    }
}

/// Puts the PyTorch progress hook first on the job's `PYTHONPATH`; its `sitecustomize` runs any
/// one it shadows, and `KACE_PROGRESS_AUTO=0` in the job turns it off.
fn prepend_python_hook(sp: Handle, hook: &Path) {
    if !kace_layout::is_python_hook(hook) {
        log(
            Level::Verbose,
            &format!(
                "kace: user_init: no progress hook in {}; PYTHONPATH left as it is",
                hook.display()
            ),
        );
        return;
    }
    let old = match sp.getenv(c"PYTHONPATH") {
        Ok(v) => v,
        Err(e) => {
            log(Level::Error, &format!("kace: user_init: couldn't read PYTHONPATH: {e}"));
            return;
        }
    };
    // A value that was not UTF-8 came back lossy: leave it alone rather than corrupt it.
    if old.as_deref().is_some_and(|o| o.contains('\u{FFFD}')) {
        log(Level::Error, "kace: user_init: couldn't extend PYTHONPATH: it is not UTF-8");
        return;
    }
    let value = kace_layout::python_path_with_hook(hook, old.as_deref().map(str::as_bytes));
    match CString::new(value) {
        Ok(v) => {
            if let Err(e) = sp.setenv(c"PYTHONPATH", &v) {
                log(Level::Error, &format!("kace: user_init: couldn't set PYTHONPATH: {e}"));
            }
        }
        Err(_) => {
            log(Level::Error, "kace: user_init: couldn't set PYTHONPATH: it holds a NUL byte")
        }
    }
}

fn set(sp: Handle, name: &CStr, path: &Path) {
    // Paths are built from validated config (no NUL) and numbers.
    let value = CString::new(path.as_os_str().as_bytes()).unwrap_or_default();
    if let Err(e) = sp.setenv(name, &value) {
        let name = name.to_string_lossy();
        log(Level::Error, &format!("kace: user_init: couldn't set {name}: {e}"));
    }
}
