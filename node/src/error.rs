//! The node crate's errors: running external programs, reading what Slurm prints, local files,
//! the database and the time budget. Binaries log them as `kace: <phase>: couldn't …: <cause>`.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// Why an external program gave no usable result.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ExecError {
    /// The configured program is not an absolute path (Slurm gives hooks no PATH).
    NotAbsolute {
        /// The program as configured.
        program: PathBuf,
    },
    /// It could not be started (missing, not executable, …).
    Spawn {
        /// The command line.
        command: String,
        /// The OS's reason.
        cause: String,
    },
    /// It ran past its timeout and was killed.
    Timeout {
        /// The command line.
        command: String,
        /// The timeout.
        after: Duration,
    },
    /// It exited non-zero.
    Failed {
        /// The command line.
        command: String,
        /// Its exit code (`None`: killed by a signal).
        code: Option<i32>,
        /// The start of its standard error.
        stderr: String,
    },
}

impl fmt::Display for ExecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExecError::NotAbsolute { program } => {
                write!(f, "{} is not an absolute path", program.display())
            }
            ExecError::Spawn { command, cause } => write!(f, "couldn't start {command}: {cause}"),
            ExecError::Timeout { command, after } => {
                write!(f, "{command} did not finish within {after:?} and was killed")
            }
            ExecError::Failed { command, code: Some(c), stderr } => {
                write!(f, "{command} exited with {c}: {stderr}")
            }
            ExecError::Failed { command, code: None, stderr } => {
                write!(f, "{command} was killed by a signal: {stderr}")
            }
        }
    }
}

impl std::error::Error for ExecError {}

/// Everything that can stop a node-side step.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// An external program failed.
    Exec(ExecError),
    /// A program printed something kace cannot read.
    Parse {
        /// What was being read.
        what: String,
        /// The offending text (shortened).
        text: String,
    },
    /// A local file operation failed.
    Io {
        /// What was being done.
        op: String,
        /// On which path.
        path: PathBuf,
        /// The OS's reason.
        cause: std::io::Error,
    },
    /// The database could not be used.
    Db(kace_sql::Error),
    /// The configured time budget ran out before this step.
    Budget {
        /// The step that was not started.
        step: String,
    },
    /// A move's worker thread stopped before saying how the move went (a bug, or no thread
    /// could be started): the job may or may not have been released.
    NoOutcome {
        /// The job.
        job: u32,
    },
    /// A held job is no longer kace's to move: another decider moved or released it since
    /// the listing, or its user asked for something else meanwhile.
    Taken {
        /// The job.
        job: u32,
        /// What it is now.
        why: String,
    },
    /// A value from the job's environment is missing or unusable.
    Env {
        /// The variable.
        var: &'static str,
        /// What is wrong with it.
        why: String,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Exec(e) => e.fmt(f),
            Error::Parse { what, text } => write!(f, "couldn't read {what} from {text:?}"),
            Error::Io { op, path, cause } => write!(f, "couldn't {op} {}: {cause}", path.display()),
            Error::Db(e) => e.fmt(f),
            Error::Budget { step } => write!(f, "the time budget ran out before {step}"),
            Error::NoOutcome { job } => {
                write!(f, "the move of job {job} ended without an outcome (its worker stopped)")
            }
            Error::Taken { job, why } => write!(f, "job {job} was taken meanwhile: {why}"),
            Error::Env { var, why } => write!(f, "${var} {why}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<ExecError> for Error {
    fn from(e: ExecError) -> Error {
        Error::Exec(e)
    }
}

impl From<kace_sql::Error> for Error {
    fn from(e: kace_sql::Error) -> Error {
        Error::Db(e)
    }
}

/// Why the read path ([`crate::read_path::decide_from_store`]) decided nothing.
#[derive(Debug)]
#[non_exhaustive]
pub enum ReadPathError {
    /// The store could not be read, has no active model, or its active model is unusable.
    Store(kace_sql::Error),
    /// The active model was trained for an objective that cannot predict the configured one.
    WrongObjective {
        /// The active model's version.
        version: i64,
        /// Its kind (`slowdown`, `linear`).
        kind: &'static str,
        /// The configured objective (`selection.objective`).
        objective: &'static str,
    },
    /// A workload on the GPU has no complete profile.
    NoProfile {
        /// The workload.
        workload: String,
        /// The features still unknown (empty: no profile at all).
        missing: Vec<&'static str>,
    },
    /// A workload on the GPU whose profile only kace observed, in fewer alone runs than
    /// `profile.min_alone_runs`: it is not paired yet, so that its runs keep measuring it.
    TooFewAloneRuns {
        /// The workload.
        workload: String,
        /// Alone runs observed.
        runs: u32,
        /// Alone runs needed.
        needed: u32,
    },
}

impl ReadPathError {
    /// Whether the GPU simply cannot take a joiner yet (a workload on it is not profiled well
    /// enough to pair), as opposed to a failure of the read.
    pub fn is_unpaired(&self) -> bool {
        matches!(self, ReadPathError::NoProfile { .. } | ReadPathError::TooFewAloneRuns { .. })
    }
}

impl fmt::Display for ReadPathError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadPathError::Store(e) => e.fmt(f),
            ReadPathError::WrongObjective { version, kind, objective } => write!(
                f,
                "couldn't use model version {version}: a {kind} model trained for another \
                 objective cannot predict {objective}"
            ),
            ReadPathError::NoProfile { workload, missing } if missing.is_empty() => {
                write!(f, "couldn't find a profile for workload {workload:?}")
            }
            ReadPathError::NoProfile { workload, missing } => write!(
                f,
                "couldn't use the profile of workload {workload:?}: missing {}",
                missing.join(", ")
            ),
            ReadPathError::TooFewAloneRuns { workload, runs, needed } => write!(
                f,
                "couldn't pair workload {workload:?} yet: observed alone in {runs} of the \
                 {needed} runs needed (profile.min_alone_runs)"
            ),
        }
    }
}

impl std::error::Error for ReadPathError {}

impl From<kace_sql::Error> for ReadPathError {
    fn from(e: kace_sql::Error) -> ReadPathError {
        ReadPathError::Store(e)
    }
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, Error>;

/// An `Error::Io` builder for `map_err`.
pub(crate) fn io(op: &str, path: &std::path::Path) -> impl FnOnce(std::io::Error) -> Error {
    let (op, path) = (op.to_string(), path.to_path_buf());
    move |cause| Error::Io { op, path, cause }
}

/// A shortened copy of untrusted text for an error message.
pub(crate) fn short(text: &str) -> String {
    text.chars().take(200).collect()
}
