//! The few libc calls the harness needs, declared by hand to keep the crate dependency-free.

use std::ffi::c_int;

extern "C" {
    fn geteuid() -> u32;
    fn kill(pid: i32, sig: c_int) -> c_int;
    fn atexit(f: extern "C" fn()) -> c_int;
}

pub const SIGTERM: c_int = 15;
pub const SIGKILL: c_int = 9;

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { geteuid() == 0 }
}

/// Sends `sig` to `pid`; false if the process does not exist (or is not ours to signal).
pub fn signal(pid: u32, sig: c_int) -> bool {
    let Ok(pid) = i32::try_from(pid) else { return false };
    // SAFETY: kill has no memory preconditions; pid > 0 targets one process, never a group.
    pid > 0 && unsafe { kill(pid, sig) } == 0
}

/// Runs `f` when the process exits normally (libtest's `main` returning or `process::exit`).
pub fn at_exit(f: extern "C" fn()) {
    // SAFETY: `f` is a plain function that lives for the whole program.
    unsafe { atexit(f) };
}
