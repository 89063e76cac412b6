//! What kace is doing and how well it does it, for admins and users: the live view of GPUs,
//! their kace jobs and the held queue ([`status`]), what Slurm says about one job next to kace's
//! decisions ([`history`]), the Prometheus textfile ([`metrics`]) and the predicted-against-
//! observed report with its SVG ([`report`]) and its energy figures ([`energy`]), all counting
//! releases one way ([`releases`]). Slurm is asked through `kace_node::slurm::Slurm`,
//! everything else comes from the database; the CLI only parses arguments and prints.

#![warn(missing_docs)]

pub mod energy;
pub mod history;
pub mod metrics;
pub mod releases;
pub mod report;
pub mod status;
pub mod time;

use std::fmt;

/// Why an observability command could not produce its view.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// Slurm could not be asked.
    Slurm(kace_node::Error),
    /// The database could not be read.
    Db(kace_sql::Error),
    /// A file could not be written.
    Write {
        /// The file.
        path: std::path::PathBuf,
        /// The OS's reason.
        cause: std::io::Error,
    },
    /// An argument makes no sense.
    Usage(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Slurm(e) => write!(f, "couldn't ask Slurm: {e}"),
            Error::Db(e) => write!(f, "{e}"),
            Error::Write { path, cause } => write!(f, "couldn't write {}: {cause}", path.display()),
            Error::Usage(m) => write!(f, "{m}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Slurm(e) => Some(e),
            Error::Db(e) => Some(e),
            Error::Write { cause, .. } => Some(cause),
            Error::Usage(_) => None,
        }
    }
}

impl From<kace_node::Error> for Error {
    fn from(e: kace_node::Error) -> Self {
        Error::Slurm(e)
    }
}

impl From<kace_sql::Error> for Error {
    fn from(e: kace_sql::Error) -> Self {
        Error::Db(e)
    }
}

/// This crate's results.
pub type Result<T> = std::result::Result<T, Error>;
