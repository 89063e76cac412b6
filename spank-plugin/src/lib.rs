//! kace's SPANK plugin, loaded by Slurm from plugstack.conf: the C entry points, the one panic
//! boundary they all go through, and the dispatch by context. The logic lives in pure modules
//! ([`workload`], [`config`], [`layout`]) that other crates may reuse.
//!
//! | context | hook | what happens |
//! |---|---|---|
//! | sbatch, srun | `init` | registers `--kace-colocate[=WORKLOAD]` |
//! | sbatch, srun | option callback | validates the value; a bad one stops the submission |
//! | sbatch, srun | `init_post_opt` | `KACE_COLOCATE=<workload or empty>` in the job-control env |
//! | slurmd | `init` | parses the plugstack.conf arguments; logs the version, or the error |
//! | slurmstepd | `user_init` | MPS and progress variables for a kace job's tasks |
//! | prolog | `job_prolog` | logs the workload a kace job asked for |
//!
//! SPANK rules of Slurm 25.05 on (kept on 22.05 too): any non-zero return is an error, so every
//! hook returns 0 or -1 and nothing else; only sbatch/srun (a bad `--kace-colocate` stops the
//! submission) and slurmd start (bad plugstack.conf arguments) ever return -1. In slurmstepd
//! nothing fails, and [`slurm_spank_init_failure_mode`] makes a failed init there a job failure,
//! never a drained node.

#![warn(missing_docs)]

pub mod config;
mod ffi;
mod guard;
pub use kace_layout as layout;
mod option;
mod remote;
mod slurm;
mod slurmd;
pub mod workload;

use std::ffi::{c_char, c_int, CStr};

use slurm::{log, Context, Handle, Level};

mod version {
    include!(concat!(env!("OUT_DIR"), "/slurm_version.rs"));
}
pub use version::SLURM_VERSION_NUMBER;

/// The plugin's name, as Slurm reads it (`plugin_name`, NUL-terminated).
#[allow(non_upper_case_globals)]
#[no_mangle]
pub static plugin_name: [u8; 5] = *b"kace\0";

/// The plugin's type: a SPANK plugin (`plugin_type`, NUL-terminated).
#[allow(non_upper_case_globals)]
#[no_mangle]
pub static plugin_type: [u8; 6] = *b"spank\0";

/// Must equal the loading Slurm's major.minor, hence read from its headers by build.rs.
#[allow(non_upper_case_globals)]
#[no_mangle]
pub static plugin_version: u32 = SLURM_VERSION_NUMBER;

/// How Slurm (25.05 on) treats a failed `slurm_spank_init` of this `required` plugin: the job
/// fails, the node is not drained. Older Slurm does not look the symbol up.
#[allow(non_upper_case_globals)]
#[no_mangle]
pub static slurm_spank_init_failure_mode: c_int = ffi::ESPANK_JOB_FAILURE;

/// Runs one hook body inside the plugin's single panic boundary, logging through Slurm.
fn boundary(phase: &str, on_panic: c_int, body: impl FnOnce() -> c_int) -> c_int {
    guard::run(phase, on_panic, body, |msg| log(Level::Error, msg))
}

/// The plugin arguments from plugstack.conf, as byte strings.
///
/// # Safety
/// `argv` must point to `argc` NUL-terminated strings that outlive the hook call.
unsafe fn args<'a>(argc: c_int, argv: *const *const c_char) -> Vec<&'a [u8]> {
    if argv.is_null() {
        return Vec::new();
    }
    (0..usize::try_from(argc).unwrap_or(0))
        .map(|i| *argv.add(i))
        .filter(|p| !p.is_null())
        .map(|p| CStr::from_ptr(p).to_bytes())
        .collect()
}

/// `slurm_spank_init`: every context but job_script.
///
/// # Safety
/// Called by Slurm with a live handle and its `argc`/`argv`.
#[no_mangle]
pub unsafe extern "C" fn slurm_spank_init(
    sp: ffi::Spank,
    argc: c_int,
    argv: *const *const c_char,
) -> c_int {
    boundary("init", -1, || match Context::current() {
        Context::Allocator | Context::Local => option::register(Handle::new(sp)),
        // slurmstepd: a failure here must not fail the job (nor drain the node); the job then
        // runs without kace's task variables, and the error is logged.
        Context::Remote => {
            option::register(Handle::new(sp));
            0
        }
        Context::Slurmd => slurmd::check_config(&args(argc, argv)),
        Context::JobScript | Context::Unknown => 0,
    })
}

/// `slurm_spank_init_post_opt`: sbatch/srun publish the request.
///
/// # Safety
/// Called by Slurm with a live handle.
#[no_mangle]
pub unsafe extern "C" fn slurm_spank_init_post_opt(
    sp: ffi::Spank,
    _argc: c_int,
    _argv: *const *const c_char,
) -> c_int {
    boundary("init_post_opt", -1, || match Context::current() {
        Context::Allocator | Context::Local => option::publish(Handle::new(sp)),
        _ => 0,
    })
}

/// `slurm_spank_user_init`: slurmstepd sets a kace job's task environment.
///
/// # Safety
/// Called by Slurm with a live handle and its `argc`/`argv`.
#[no_mangle]
pub unsafe extern "C" fn slurm_spank_user_init(
    sp: ffi::Spank,
    argc: c_int,
    argv: *const *const c_char,
) -> c_int {
    boundary("user_init", 0, || match Context::current() {
        Context::Remote => remote::set_task_env(Handle::new(sp), &args(argc, argv)),
        _ => 0,
    })
}

/// `slurm_spank_job_prolog`: job_script context; always 0 (a failure would drain the node).
///
/// # Safety
/// Called by Slurm with a live handle.
#[no_mangle]
pub unsafe extern "C" fn slurm_spank_job_prolog(
    sp: ffi::Spank,
    _argc: c_int,
    _argv: *const *const c_char,
) -> c_int {
    boundary("job_prolog", 0, || option::note_in_prolog(Handle::new(sp)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// build.rs takes the version from the headers it was pointed at (SLURM_INCLUDE_DIR, else
    /// /usr/include); with neither it refuses to build, so a header is always there to compare.
    #[test]
    #[cfg_attr(not(kace_slurm_headers), ignore = "built from KACE_SLURM_VERSION: no Slurm headers")]
    fn plugin_version_comes_from_the_slurm_headers() {
        let source = env!("KACE_SLURM_VERSION_SOURCE");
        let header = std::fs::read_to_string(source).expect("build.rs read this header");
        let line = header
            .lines()
            .find(|l| l.starts_with("#define SLURM_VERSION_NUMBER"))
            .expect("slurm_version.h defines SLURM_VERSION_NUMBER");
        let hex = line.rsplit("0x").next().unwrap();
        assert_eq!(plugin_version, u32::from_str_radix(hex.trim(), 16).unwrap());
    }

    /// The value of `name` in an `enum` of a C header such as `slurm_errno.h`: entries count up
    /// from the last explicit value, as the C compiler counts them.
    fn enum_value(header: &str, name: &str) -> Option<i64> {
        let mut next: Option<i64> = None;
        for line in header.lines() {
            let entry = line.split("/*").next().unwrap_or("").trim().trim_end_matches(',');
            if entry.contains("enum") || entry.starts_with('}') {
                next = Some(0);
                continue;
            }
            let (ident, explicit) = match entry.split_once('=') {
                Some((i, v)) => (i.trim(), v.trim().parse::<i64>().ok()),
                None => (entry, None),
            };
            let is_name = |c: char| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_';
            if !ident.starts_with(|c: char| c.is_ascii_uppercase()) || !ident.chars().all(is_name) {
                continue;
            }
            let Some(value) = explicit.or(next) else { continue };
            if ident == name {
                return Some(value);
            }
            next = Some(value + 1);
        }
        None
    }

    /// The `slurm_errno.h` beside the `slurm_version.h` build.rs read.
    fn build_errno_header() -> String {
        let source = env!("KACE_SLURM_VERSION_SOURCE");
        let errno = std::path::Path::new(source).with_file_name("slurm_errno.h");
        std::fs::read_to_string(&errno).expect("slurm_errno.h beside slurm_version.h")
    }

    /// The codes the plugin compares with are Slurm's: read from the headers it was built
    /// against. Slurm before 25.05 has no `ESPANK_JOB_FAILURE` (and ignores
    /// `slurm_spank_init_failure_mode`); where the header has it, the plugin's mode is that code.
    #[test]
    #[cfg_attr(not(kace_slurm_headers), ignore = "built from KACE_SLURM_VERSION: no Slurm headers")]
    fn spank_codes_are_the_headers() {
        let header = build_errno_header();
        assert_eq!(enum_value(&header, "ESPANK_ERROR"), Some(i64::from(ffi::ESPANK_ERROR)));
        assert_eq!(
            enum_value(&header, "ESPANK_ENV_NOEXIST"),
            Some(i64::from(ffi::ESPANK_ENV_NOEXIST))
        );
        if let Some(job_failure) = enum_value(&header, "ESPANK_JOB_FAILURE") {
            assert_eq!(i64::from(slurm_spank_init_failure_mode), job_failure);
        }
    }

    /// A failed init in slurmstepd is a job failure, never a drained node: the mode is
    /// `ESPANK_JOB_FAILURE` as the supported releases that have it define it (their source is in
    /// `../shared/vendor`, or `$KACE_SLURM_VENDOR`, as `.ci/slurm-from-source` reads it).
    #[test]
    #[ignore = "needs ../shared/vendor/slurm-*.tar.xz"]
    fn init_failure_is_a_job_failure_never_a_drained_node() {
        let vendor = std::env::var("KACE_SLURM_VENDOR")
            .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/vendor").into());
        for release in ["25.11.7", "26.05.3"] {
            let tarball = format!("{vendor}/slurm-{release}.tar.xz");
            let out = std::process::Command::new("tar")
                .args(["-xJOf", &tarball, &format!("slurm-{release}/slurm/slurm_errno.h")])
                .output()
                .expect("tar runs");
            assert!(out.status.success(), "couldn't read slurm_errno.h from {tarball}");
            let header = String::from_utf8_lossy(&out.stdout);
            let job_failure = enum_value(&header, "ESPANK_JOB_FAILURE");
            assert_eq!(job_failure, Some(i64::from(slurm_spank_init_failure_mode)), "{release}");
            let node_failure = enum_value(&header, "ESPANK_NODE_FAILURE");
            assert_ne!(node_failure, job_failure, "{release}");
        }
    }

    #[test]
    fn exported_names_are_nul_terminated_c_strings() {
        assert_eq!(CStr::from_bytes_with_nul(&plugin_name).unwrap(), c"kace");
        assert_eq!(CStr::from_bytes_with_nul(&plugin_type).unwrap(), c"spank");
    }
}
