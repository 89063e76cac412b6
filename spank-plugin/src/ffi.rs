//! Hand-written declarations of the part of Slurm's `<slurm/spank.h>` (22.05) the plugin uses.
//!
//! Hand-written rather than bindgen: the surface is ten functions and one struct, and it keeps
//! libclang out of the build. The enum values below were checked against Debian 12's
//! `/usr/include/slurm/spank.h` and `slurm_errno.h`; they are identical from 20.11 to 26.05.
//! The functions are resolved when Slurm loads the plugin into sbatch, srun, slurmd or
//! slurmstepd, all of which export them.

use std::ffi::{c_char, c_int, c_void};

/// `spank_t`: Slurm's opaque per-call handle.
pub type Spank = *mut c_void;

/// `spank_opt_cb_f`.
pub type OptionCallback = extern "C" fn(val: c_int, optarg: *const c_char, remote: c_int) -> c_int;

/// `struct spank_option`. Slurm keeps the pointer it is given, so instances must live for the
/// life of the process.
#[repr(C)]
pub struct SpankOption {
    pub name: *const c_char,
    pub arginfo: *const c_char,
    pub usage: *const c_char,
    /// 0: no value, 1: value required, 2: value optional (`--opt` or `--opt=value`).
    pub has_arg: c_int,
    pub val: c_int,
    pub cb: Option<OptionCallback>,
}

/// `enum spank_context`.
pub mod ctx {
    use std::ffi::c_int;
    pub const LOCAL: c_int = 1;
    pub const REMOTE: c_int = 2;
    pub const ALLOCATOR: c_int = 3;
    pub const SLURMD: c_int = 4;
    pub const JOB_SCRIPT: c_int = 5;
}

/// `enum spank_item`: only the items the plugin reads.
pub const S_JOB_ID: c_int = 2;
/// `S_JOB_LOCAL_TASK_COUNT`: the step's tasks on this node (`uint32_t *`).
pub const S_JOB_LOCAL_TASK_COUNT: c_int = 6;

/// `ESPANK_SUCCESS`.
pub const ESPANK_SUCCESS: c_int = 0;
/// `ESPANK_ERROR`; from `spank_option_getopt` it means "the option wasn't used".
pub const ESPANK_ERROR: c_int = 3000;
/// `ESPANK_ENV_NOEXIST`: the variable is not in the job's environment.
pub const ESPANK_ENV_NOEXIST: c_int = 3004;
/// `ESPANK_JOB_FAILURE` (slurm_errno.h from 25.05; checked against 26.05.3): as
/// `slurm_spank_init_failure_mode`, a failed init in slurmstepd fails the job instead of
/// draining the node (the default, `ESPANK_NODE_FAILURE`, 3011).
pub const ESPANK_JOB_FAILURE: c_int = 3012;

extern "C" {
    pub fn spank_context() -> c_int;
    pub fn spank_option_register(sp: Spank, opt: *mut SpankOption) -> c_int;
    pub fn spank_option_getopt(sp: Spank, opt: *mut SpankOption, optarg: *mut *mut c_char)
        -> c_int;
    pub fn spank_get_item(sp: Spank, item: c_int, ...) -> c_int;
    pub fn spank_getenv(sp: Spank, var: *const c_char, buf: *mut c_char, len: c_int) -> c_int;
    pub fn spank_setenv(
        sp: Spank,
        var: *const c_char,
        val: *const c_char,
        overwrite: c_int,
    ) -> c_int;
    pub fn spank_job_control_setenv(
        sp: Spank,
        name: *const c_char,
        value: *const c_char,
        overwrite: c_int,
    ) -> c_int;
    pub fn spank_strerror(err: c_int) -> *const c_char;
    pub fn slurm_error(fmt: *const c_char, ...);
    pub fn slurm_info(fmt: *const c_char, ...);
    pub fn slurm_verbose(fmt: *const c_char, ...);
}
