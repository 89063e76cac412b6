//! The GPU run's own steps that no kace command covers: probing the MPS control program
//! ([`probe`]), running a group of workloads together under one MPS daemon with each end
//! recorded by the epilog's own code ([`colocate`]), and the trained model's prediction next to
//! each observed group ([`compare`]). `bench/gpu/run` drives them; `--dry-run` points them at the
//! fakes in `bench/gpu/fake/`.

#![warn(missing_docs)]

pub mod colocate;
pub mod compare;
pub mod probe;

use std::fmt;

/// Why a bench step could not run.
#[derive(Debug)]
#[non_exhaustive]
pub enum BenchError {
    /// A node-side step (MPS, GPU state, epilog) failed.
    Node(kace_node::Error),
    /// The database could not be read.
    Db(kace_sql::Error),
    /// A workload could not be started or waited for.
    Workload {
        /// The workload.
        workload: String,
        /// The OS's reason.
        cause: std::io::Error,
    },
    /// The arguments make no sense.
    Usage(String),
    /// Workloads of a group exited non-zero or were killed (their observations are still
    /// spooled where the progress allowed).
    WorkloadsFailed(usize),
}

impl fmt::Display for BenchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BenchError::Node(e) => write!(f, "{e}"),
            BenchError::Db(e) => write!(f, "{e}"),
            BenchError::Workload { workload, cause } => {
                write!(f, "couldn't run workload {workload}: {cause}")
            }
            BenchError::Usage(m) => write!(f, "{m}"),
            BenchError::WorkloadsFailed(n) => write!(f, "{n} workload(s) of the group failed"),
        }
    }
}

impl std::error::Error for BenchError {}

impl From<kace_node::Error> for BenchError {
    fn from(e: kace_node::Error) -> Self {
        BenchError::Node(e)
    }
}

impl From<kace_sql::Error> for BenchError {
    fn from(e: kace_sql::Error) -> Self {
        BenchError::Db(e)
    }
}
