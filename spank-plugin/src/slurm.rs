//! Safe wrappers over the SPANK calls in [`crate::ffi`]: the handle, the environment calls and
//! Slurm's logger. Nothing here interprets values; that is the pure modules' job.

use std::ffi::{c_char, c_int, CStr, CString};
use std::fmt;

use crate::ffi;

/// A SPANK call that returned an error code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpankError {
    /// The SPANK function that failed.
    pub call: &'static str,
    /// Its `spank_err_t`.
    pub code: c_int,
}

impl fmt::Display for SpankError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // SAFETY: spank_strerror returns a pointer to a static string (or NULL).
        let text = unsafe { ffi::spank_strerror(self.code) };
        let text = if text.is_null() {
            "unknown error".into()
        } else {
            // SAFETY: non-NULL spank_strerror results are NUL-terminated static strings.
            unsafe { CStr::from_ptr(text) }.to_string_lossy()
        };
        write!(f, "{} returned {} ({})", self.call, self.code, text)
    }
}

fn check(call: &'static str, code: c_int) -> Result<(), SpankError> {
    if code == ffi::ESPANK_SUCCESS {
        Ok(())
    } else {
        Err(SpankError { call, code })
    }
}

/// Which program Slurm loaded the plugin into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Context {
    /// srun.
    Local,
    /// slurmstepd: the job's steps and tasks.
    Remote,
    /// sbatch, salloc.
    Allocator,
    /// slurmd itself.
    Slurmd,
    /// The prolog/epilog runner.
    JobScript,
    /// `spank_context()` failed or returned something this plugin does not know.
    Unknown,
}

impl Context {
    pub fn current() -> Context {
        // SAFETY: spank_context takes no arguments and only reads Slurm's global state.
        match unsafe { ffi::spank_context() } {
            ffi::ctx::LOCAL => Context::Local,
            ffi::ctx::REMOTE => Context::Remote,
            ffi::ctx::ALLOCATOR => Context::Allocator,
            ffi::ctx::SLURMD => Context::Slurmd,
            ffi::ctx::JOB_SCRIPT => Context::JobScript,
            _ => Context::Unknown,
        }
    }
}

/// The `spank_t` of the current hook call; valid only during that call.
#[derive(Clone, Copy)]
pub struct Handle(ffi::Spank);

impl Handle {
    /// # Safety
    /// `sp` must be the handle Slurm passed to the hook being run.
    pub unsafe fn new(sp: ffi::Spank) -> Handle {
        Handle(sp)
    }

    /// Registers `opt`, which must live for the rest of the process (Slurm keeps the pointer).
    pub fn register_option(self, opt: &'static OptionCell) -> Result<(), SpankError> {
        // SAFETY: the handle is live; the option is 'static and never moved.
        check("spank_option_register", unsafe { ffi::spank_option_register(self.0, opt.ptr()) })
    }

    /// The option's value in job_script context: `Ok(None)` when the job did not use it,
    /// `Ok(Some(bytes))` (possibly `"(null)"`) when it did.
    pub fn getopt(self, opt: &'static OptionCell) -> Result<Option<Vec<u8>>, SpankError> {
        let mut arg: *mut c_char = std::ptr::null_mut();
        // SAFETY: the handle is live, the option is 'static, and `arg` is a valid out-pointer.
        let rc = unsafe { ffi::spank_option_getopt(self.0, opt.ptr(), &mut arg) };
        match rc {
            ffi::ESPANK_SUCCESS if arg.is_null() => Ok(Some(Vec::new())),
            // SAFETY: on success Slurm points `arg` at a NUL-terminated string it owns.
            ffi::ESPANK_SUCCESS => Ok(Some(unsafe { CStr::from_ptr(arg) }.to_bytes().to_vec())),
            ffi::ESPANK_ERROR => Ok(None),
            code => Err(SpankError { call: "spank_option_getopt", code }),
        }
    }

    pub fn job_id(self) -> Result<u32, SpankError> {
        let mut id: u32 = 0;
        // SAFETY: S_JOB_ID takes one `uint32_t *` vararg.
        let rc = unsafe { ffi::spank_get_item(self.0, ffi::S_JOB_ID, &mut id as *mut u32) };
        check("spank_get_item(S_JOB_ID)", rc).map(|()| id)
    }

    /// The number of the step's tasks on this node (remote context).
    pub fn local_task_count(self) -> Result<u32, SpankError> {
        let mut n: u32 = 0;
        // SAFETY: S_JOB_LOCAL_TASK_COUNT takes one `uint32_t *` vararg.
        let rc =
            unsafe { ffi::spank_get_item(self.0, ffi::S_JOB_LOCAL_TASK_COUNT, &mut n as *mut u32) };
        check("spank_get_item(S_JOB_LOCAL_TASK_COUNT)", rc).map(|()| n)
    }

    /// A variable of the job's environment (remote context); `Ok(None)` when unset.
    pub fn getenv(self, name: &CStr) -> Result<Option<String>, SpankError> {
        // Job variables kace reads are short GPU lists; 4 KiB is far beyond any real value.
        let mut buf = vec![0u8; 4096];
        // SAFETY: `buf` is writable for its whole length, which is passed as `len`.
        let rc = unsafe {
            ffi::spank_getenv(self.0, name.as_ptr(), buf.as_mut_ptr().cast(), buf.len() as c_int)
        };
        match rc {
            ffi::ESPANK_SUCCESS => {
                let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
                buf.truncate(end);
                Ok(Some(String::from_utf8_lossy(&buf).into_owned()))
            }
            ffi::ESPANK_ENV_NOEXIST => Ok(None),
            code => Err(SpankError { call: "spank_getenv", code }),
        }
    }

    /// Sets a variable in the job's environment (remote context), overwriting.
    pub fn setenv(self, name: &CStr, value: &CStr) -> Result<(), SpankError> {
        // SAFETY: the handle is live and both strings are NUL-terminated.
        check("spank_setenv", unsafe {
            ffi::spank_setenv(self.0, name.as_ptr(), value.as_ptr(), 1)
        })
    }

    /// Sets a job-control variable (allocator/local context); the prolog and epilog see it as
    /// `SPANK_<name>`, and slurmctld's job_submit plugins in `spank_job_env`.
    pub fn job_control_setenv(self, name: &CStr, value: &CStr) -> Result<(), SpankError> {
        // SAFETY: the handle is live and both strings are NUL-terminated.
        check("spank_job_control_setenv", unsafe {
            ffi::spank_job_control_setenv(self.0, name.as_ptr(), value.as_ptr(), 1)
        })
    }
}

/// A `struct spank_option` at a fixed address for the whole process.
pub struct OptionCell(std::cell::UnsafeCell<ffi::SpankOption>);

// SAFETY: Slurm calls plugins from one thread per process, and the cell is written only by
// Slurm through the pointer it is given; Rust code never reads or writes it.
unsafe impl Sync for OptionCell {}

impl OptionCell {
    pub const fn new(opt: ffi::SpankOption) -> OptionCell {
        OptionCell(std::cell::UnsafeCell::new(opt))
    }

    fn ptr(&'static self) -> *mut ffi::SpankOption {
        self.0.get()
    }
}

/// Slurm's log levels the plugin uses.
#[derive(Debug, Clone, Copy)]
pub enum Level {
    Error,
    Info,
    Verbose,
}

/// Logs `msg` through Slurm (the daemon's log file, or stderr of sbatch/srun).
pub fn log(level: Level, msg: &str) {
    // Messages may quote escaped user values but never contain NUL; if one did, drop it rather
    // than lose the message.
    let msg = CString::new(msg.replace('\0', "")).unwrap_or_default();
    let f = match level {
        Level::Error => ffi::slurm_error,
        Level::Info => ffi::slurm_info,
        Level::Verbose => ffi::slurm_verbose,
    };
    // SAFETY: a constant "%s" format with one NUL-terminated string argument; user data is never
    // used as the format.
    unsafe { f(c"%s".as_ptr(), msg.as_ptr()) };
}
