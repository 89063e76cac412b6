//! kace's cluster simulator: what interference-aware pairing buys a whole cluster, measured on
//! a discrete-event model driven by measured colocations.
//!
//! Pure: traces and data are parsed from any `Read` or passed in; nothing here opens files.
//!
//! # Layout
//! - [`world`]: the ground truth: workloads, exclusive and colocated throughput, memory.
//! - [`trace`]: jobs; a seeded generator and the CSV trace format.
//! - [`policy`]: exclusive FIFO, queue order (Slurm shard), memcap, kace, oracle.
//! - [`model`]: kace's model, trained as `kace train` does, on the paper's n_occur = 3 split only.
//! - [`onboarding`]: what a new workload (no observations, system profile only) costs.
//! - [`history`]: a site's days, retrained every night: what learning from repeats buys.
//! - [`night`]: one night's retraining as `kace retrain` runs it, shared by [`history`] and
//!   [`retraining`].
//! - [`retraining`]: kace retrained every simulated night during a cluster run.
//! - [`engine`]: the event loop and its model of a GPU shared in pairs.
//! - [`metrics`]: makespan, completion times, throughput, ratios, the utilisation timeline.
//! - [`plot`]: an SVG of completion-time CDFs and utilisation.
//! - [`rng`]: SplitMix64 and the distributions traces are drawn from.

#![warn(missing_docs)]

pub mod engine;
pub mod error;
pub mod history;
pub mod metrics;
pub mod model;
pub mod night;
pub mod onboarding;
pub mod plot;
pub mod policy;
pub mod retraining;
pub mod rng;
pub mod trace;
pub mod world;

pub use engine::{simulate, Outcome, DEFAULT_WINDOW};
pub use error::SimError;
pub use metrics::{Metrics, Ratios};
pub use model::{train_kace, TrainedKace};
pub use policy::{PairingPolicy, PolicyKind};
pub use trace::{generate, read_trace, Job, TraceSpec, UserId, UserMix};
pub use world::{PairKind, WorkloadId, World};
