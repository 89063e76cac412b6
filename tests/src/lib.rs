//! Harness for kace's end-to-end tests: a real Slurm cluster started on localhost in a temporary
//! directory, with fake GPUs, the kace SPANK plugin and the gate. The Slurm is the system's
//! (Debian 12's 22.05) or the one under `$KACE_SLURM_PREFIX` (see [`SlurmInstall`]).
//!
//! ```no_run
//! use kace_e2e::{Cluster, Hook};
//! let Some(()) = kace_e2e::e2e_available("my_test") else { return };
//! let cluster = Cluster::builder().prolog(Hook::Script("exit 0".into())).start().unwrap();
//! let id = cluster.sbatch(&["--kace-colocate=bert", "--wrap", "true"]).unwrap();
//! ```
//! Tests in one binary usually share one cluster through [`shared`].

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
    Io { what: String, source: String },
    /// A command exited non-zero (`status` is `None` when killed by a signal).
    Command { command: String, status: Option<i32>, stderr: String },
    /// Something did not happen in time; `detail` holds the last state seen (and log tails).
    Timeout { what: String, waited: Duration, detail: String },
    /// A daemon exited while the cluster was starting; `log` is the end of its log file.
    DaemonExited { daemon: String, log: String },
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

/// Whether end-to-end tests can run here. Outside CI, prints why not and returns `None` when not
/// root (Slurm's daemons need it) or when Slurm is not installed. With `CI=true` (`.ci/run` sets
/// it) either is a failure: CI runs as root and installs Slurm (`.ci/install-deps`).
pub fn e2e_available(test: &str) -> Option<()> {
    let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
    if !sys::is_root() {
        assert!(!ci, "{test}: CI=true but not root: end-to-end tests start Slurm daemons");
        eprintln!("SKIPPED {test}: end-to-end tests start Slurm daemons and must run as root");
        return None;
    }
    let slurm = SlurmInstall::from_env();
    let missing: Vec<PathBuf> =
        PROGRAMS.iter().map(|p| slurm.program(p)).filter(|p| !p.exists()).collect();
    if !missing.is_empty() {
        assert!(!ci, "{test}: CI=true but Slurm is not installed (missing {missing:?}); run .ci/install-deps");
        eprintln!("SKIPPED {test}: Slurm is not installed (missing {missing:?}); run .ci/install-deps as root");
        return None;
    }
    Some(())
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
/// `build()` and torn down when the process exits. `None` (with a printed reason) when
/// end-to-end tests cannot run here; see [`e2e_available`].
pub fn shared(test: &str, build: impl FnOnce() -> ClusterBuilder) -> Option<Arc<Cluster>> {
    e2e_available(test)?;
    let mut slot = SHARED.lock().unwrap_or_else(PoisonError::into_inner);
    let result = slot.get_or_insert_with(|| {
        let started = build().start().map(Arc::new).map_err(|e| e.to_string());
        if started.is_ok() {
            sys::at_exit(drop_shared);
        }
        started
    });
    match result {
        Ok(c) => Some(Arc::clone(c)),
        Err(e) => panic!("{test}: couldn't start the test cluster: {e}"),
    }
}
