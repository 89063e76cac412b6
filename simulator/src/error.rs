//! The simulator's error type: bad traces, unusable data, impossible configurations.

use std::fmt;

use kace_selector::training::TrainingError;
use kace_selector::{DataError, SelectorError};

/// Everything that can stop a simulation. Inputs are checked before it starts; once running,
/// only a night's retraining can fail it ([`SimError::Model`], or [`SimError::Config`] for a
/// policy that cannot take over).
#[derive(Debug, Clone, PartialEq)]
pub enum SimError {
    /// A trace file is malformed: names the file, the line (header = 1) and the column.
    Trace(DataError),
    /// The cluster or trace configuration cannot be simulated (zero GPUs, a load of 0, …).
    Config(String),
    /// The measured data cannot describe a world (no workloads, a pair of unknown workloads,
    /// non-positive throughput, …).
    World(String),
    /// Training the kace model failed.
    Model(TrainingError),
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SimError::Trace(e) => write!(f, "{e}"),
            SimError::Config(m) => write!(f, "invalid simulation: {m}"),
            SimError::World(m) => write!(f, "unusable ground truth: {m}"),
            SimError::Model(e) => write!(f, "training kace: {e}"),
        }
    }
}

impl std::error::Error for SimError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SimError::Trace(e) => Some(e),
            SimError::Model(e) => Some(e),
            _ => None,
        }
    }
}

impl From<DataError> for SimError {
    fn from(e: DataError) -> Self {
        SimError::Trace(e)
    }
}

impl From<TrainingError> for SimError {
    fn from(e: TrainingError) -> Self {
        SimError::Model(e)
    }
}

impl From<SelectorError> for SimError {
    fn from(e: SelectorError) -> Self {
        SimError::Model(TrainingError::Fit(e))
    }
}
