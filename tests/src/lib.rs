//! Harness for kace's end-to-end tests: a real Slurm cluster started on localhost in a temporary
//! directory, with fake GPUs, the kace SPANK plugin and the gate. The Slurm is the system's
//! (Debian 12's 22.05) or the one under `$KACE_SLURM_PREFIX` (see [`SlurmInstall`]).
//!
//! ```no_run
//! use kace_e2e::{Cluster, Hook};
//! // in a test marked #[ignore = "needs root and Slurm"]
//! kace_e2e::require_e2e("my_test");
//! let cluster = Cluster::builder().prolog(Hook::Script("exit 0".into())).start().unwrap();
//! let id = cluster.sbatch(&["--kace-colocate=bert", "--wrap", "true"]).unwrap();
//! ```
//! Tests in one binary usually share one cluster through [`shared`].

#![warn(missing_docs)]

pub mod accounting;
mod cluster;
pub mod conf;
pub mod demo;
mod install;
pub mod kace;
mod plugin;
mod sys;

use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

pub use cluster::{parse_fields, parse_job_id, Cluster, ClusterBuilder, Hook, JobInfo};
pub use conf::NodeSpec;
pub use install::{SlurmInstall, PREFIX_VAR};
pub use plugin::plugin_path;

/// What can go wrong setting up or driving a test cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HarnessError {
    /// A file or process operation failed; `what` says which.
    Io {
        /// The operation, and on what.
        what: String,
        /// The cause.
        source: String,
    },
    /// A command exited non-zero (`status` is `None` when killed by a signal).
    Command {
        /// The command line.
        command: String,
        /// Its exit status.
        status: Option<i32>,
        /// What it printed on stderr.
        stderr: String,
    },
    /// Something did not happen in time; `detail` holds the last state seen (and log tails).
    Timeout {
        /// What was waited for.
        what: String,
        /// For how long.
        waited: Duration,
        /// The last state seen.
        detail: String,
    },
    /// A daemon exited while the cluster was starting; `log` is the end of its log file.
    DaemonExited {
        /// Which daemon.
        daemon: String,
        /// The end of its log.
        log: String,
    },
    /// The SPANK plugin could not be found or built.
    Plugin(String),
    /// A command printed something the harness cannot read.
    Unexpected(String),
}

impl fmt::Display for HarnessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HarnessError::Io { what, source } => write!(f, "{what}: {source}"),
            HarnessError::Command { command, status, stderr } => {
                write!(f, "{command} exited with {status:?}: {stderr}")
            }
            HarnessError::Timeout { what, waited, detail } => {
                write!(f, "waited {waited:?} for {what}; last seen:\n{detail}")
            }
            HarnessError::DaemonExited { daemon, log } => {
                write!(f, "{daemon} exited during start; its log ends:\n{log}")
            }
            HarnessError::Plugin(why) => write!(f, "couldn't get the kace SPANK plugin: {why}"),
            HarnessError::Unexpected(what) => write!(f, "unexpected output: {what}"),
        }
    }
}

impl std::error::Error for HarnessError {}

/// The Slurm programs the harness needs.
const PROGRAMS: [&str; 6] = ["slurmctld", "slurmd", "sbatch", "scontrol", "sinfo", "squeue"];

/// Why end-to-end tests cannot run here (`None`: they can): not root (Slurm's daemons need it),
/// or Slurm's programs missing.
fn missing_prerequisite() -> Option<String> {
    if !sys::is_root() {
        return Some("end-to-end tests start Slurm daemons and must run as root".into());
    }
    let slurm = SlurmInstall::from_env();
    let missing: Vec<PathBuf> =
        PROGRAMS.iter().map(|p| slurm.program(p)).filter(|p| !p.exists()).collect();
    if !missing.is_empty() {
        return Some(format!(
            "Slurm is not installed (missing {missing:?}); run .ci/install-deps as root"
        ));
    }
    None
}

/// For an end-to-end test: fails it, saying why, when it cannot run here. Such tests are
/// `#[ignore = "needs root and Slurm"]`, so they run only when asked (`--ignored`, as `.ci/run`
/// does): a test that was asked for and could not run is a failure, never a silent pass.
pub fn require_e2e(test: &str) {
    if let Some(why) = missing_prerequisite() {
        panic!("{test}: {why}");
    }
}

/// For a program or a bench (`kace-demo`, `cargo bench --bench prolog`): whether end-to-end
/// runs are possible here. Outside CI, prints why not and returns `None`; with `CI=true`
/// (`.ci/run` sets it) that is a failure: CI runs as root and installs Slurm.
pub fn e2e_available(test: &str) -> Option<()> {
    let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
    let Some(why) = missing_prerequisite() else {
        return Some(());
    };
    assert!(!ci, "{test}: CI=true but {why}");
    eprintln!("SKIPPED {test}: {why}");
    None
}

/// The shared cluster, or why it could not start (so later tests fail fast instead of retrying).
static SHARED: Mutex<Option<Result<Arc<Cluster>, String>>> = Mutex::new(None);

extern "C" fn drop_shared() {
    // At exit the tests are done; dropping the last Arc stops the daemons and removes the dir.
    let taken = SHARED.lock().unwrap_or_else(PoisonError::into_inner).take();
    // Dropping the Arc here stops the daemons and removes the directory.
    let _ = std::panic::catch_unwind(move || drop(taken));
}

/// The cluster shared by the tests of this test binary, started by the first caller with
/// `build()` and torn down when the process exits. Fails the test when end-to-end tests cannot
/// run here ([`require_e2e`]) or the cluster did not start.
pub fn shared(test: &str, build: impl FnOnce() -> ClusterBuilder) -> Arc<Cluster> {
    require_e2e(test);
    let mut slot = SHARED.lock().unwrap_or_else(PoisonError::into_inner);
    let result = slot.get_or_insert_with(|| {
        let started = build().start().map(Arc::new).map_err(|e| e.to_string());
        if started.is_ok() {
            sys::at_exit(drop_shared);
        }
        started
    });
    match result {
        Ok(c) => Arc::clone(c),
        Err(e) => panic!("{test}: couldn't start the test cluster: {e}"),
    }
}

#[cfg(test)]
mod availability_tests {
    /// `kace-demo` and the prolog bench ask this; an inverted answer made `./demo` refuse to
    /// run on a machine with everything it needs.
    #[test]
    #[ignore = "needs root and Slurm"]
    fn with_root_and_slurm_the_programs_may_run() {
        super::require_e2e("with_root_and_slurm_the_programs_may_run");
        assert_eq!(super::e2e_available("availability"), Some(()));
    }
}
