//! The `--kace-colocate[=WORKLOAD]` option: its table entry, the callback Slurm calls with the raw
//! value, and what sbatch/srun (allocator, local) and the prolog (job_script) do with it.

use std::ffi::{c_char, c_int, CStr, CString};
use std::sync::{Mutex, PoisonError};

use crate::ffi::SpankOption;
use crate::slurm::{log, Handle, Level, OptionCell};
use crate::workload::{self, Request};

/// The job-control variable; the prolog and epilog see it as `SPANK_KACE_COLOCATE`.
pub const CONTROL_VAR: &CStr = c"KACE_COLOCATE";

pub static OPTION: OptionCell = OptionCell::new(SpankOption {
    name: c"kace-colocate".as_ptr(),
    arginfo: c"[WORKLOAD]".as_ptr(),
    usage: c"[kace] share a GPU (under MPS) with the pending job kace predicts pairs best; \
             WORKLOAD defaults to the job name and is 1 to 128 of A-Z a-z 0-9 . _ + -"
        .as_ptr(),
    has_arg: 2,
    val: 0,
    cb: Some(on_option),
});

/// What this process's option callback accepted; `None` when the option was not used (or, in
/// slurmstepd, carried an invalid value, which makes the job an ordinary one there).
static REQUEST: Mutex<Option<Request>> = Mutex::new(None);

/// The accepted request, if any. Tolerates a poisoned lock: the value is a plain enum that a
/// panic cannot leave half-written.
pub fn request() -> Option<Request> {
    REQUEST.lock().unwrap_or_else(PoisonError::into_inner).clone()
}

extern "C" fn on_option(_val: c_int, optarg: *const c_char, remote: c_int) -> c_int {
    crate::boundary("option", -1, || {
        let raw = if optarg.is_null() {
            None
        } else {
            // SAFETY: Slurm passes a NUL-terminated string it owns for the duration of the call.
            Some(unsafe { CStr::from_ptr(optarg) }.to_bytes())
        };
        match workload::parse_option(raw) {
            Ok(req) => {
                *REQUEST.lock().unwrap_or_else(PoisonError::into_inner) = Some(req);
                0
            }
            Err(e) => {
                let shown = workload::quote(raw.unwrap_or_default());
                log(Level::Error, &format!("kace: option: couldn't accept workload {shown}: {e}"));
                // In sbatch/srun the error stops the submission. In slurmstepd the value cannot
                // have come through a plugin-checked sbatch, so the job just runs as a plain job.
                if remote != 0 {
                    0
                } else {
                    -1
                }
            }
        }
    })
}

/// sbatch, srun and slurmstepd: make the option known (in slurmstepd, so its value is passed on).
pub fn register(sp: Handle) -> c_int {
    match sp.register_option(&OPTION) {
        Ok(()) => 0,
        Err(e) => {
            log(Level::Error, &format!("kace: init: couldn't register --kace-colocate: {e}"));
            -1
        }
    }
}

/// sbatch/srun, after option processing: hand the request to slurmctld (the gate) and to the
/// prolog/epilog through the job-control environment.
pub fn publish(sp: Handle) -> c_int {
    let Some(req) = request() else { return 0 };
    // The value is validated ASCII or empty, so it has no NUL.
    let value = CString::new(req.env_value()).unwrap_or_default();
    match sp.job_control_setenv(CONTROL_VAR, &value) {
        Ok(()) => 0,
        Err(e) => {
            log(Level::Error, &format!("kace: init_post_opt: couldn't set KACE_COLOCATE: {e}"));
            -1
        }
    }
}

/// The prolog runner (job_script context): note which workload a kace job asked for. Never
/// fails: a non-zero return from a job_prolog hook of a `required` plugin drains the node.
pub fn note_in_prolog(sp: Handle) -> c_int {
    let raw = match sp.getopt(&OPTION) {
        Ok(Some(raw)) => raw,
        Ok(None) => return 0,
        Err(e) => {
            log(Level::Error, &format!("kace: job_prolog: couldn't read --kace-colocate: {e}"));
            return 0;
        }
    };
    let job = sp.job_id().map(|id| id.to_string()).unwrap_or_else(|_| "?".into());
    match workload::parse_option(Some(&raw)) {
        Ok(Request::FromJobName) => {
            log(Level::Verbose, &format!("kace: job_prolog: job {job} colocates as its job name"))
        }
        Ok(Request::Named(w)) => log(
            Level::Verbose,
            &format!("kace: job_prolog: job {job} colocates as workload {}", w.as_str()),
        ),
        Err(e) => log(
            Level::Error,
            &format!(
                "kace: job_prolog: couldn't accept workload {} of job {job}: {e}",
                workload::quote(&raw)
            ),
        ),
    }
    0
}
