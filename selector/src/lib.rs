//! kace's pure decision core: workload profiles, group features, normalisation, models,
//! choosing rules, the production selection and the evaluation protocols.
//!
//! Nothing here touches files, processes, Slurm or SQLite: callers read data and pass it in
//! (`dataset` parses from any `Read`), so every decision can be tested and benchmarked alone.
//!
//! # Layout
//! - [`features`]: the ten features, [`Profile`], [`combine`] for groups of any size k.
//! - [`zscore`], [`linear`]: normalisation and the paper's OLS model.
//! - [`policy`]: single-feature rules, argmax/argmin with the artifact's tie rule, objectives.
//! - [`slowdown`], [`model`]: kace's per-job slowdown model, and the deployable [`Model`].
//! - [`selection`]: the filters and the choice among candidates.
//! - [`energy`]: the power model of the energy objective and the simulator's energy figures.
//! - [`decision`]: the one decision for a GPU (job limit, users), which every caller makes.
//! - [`splits`]: the SM split (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`) chooser, evaluated only.
//! - [`tuning`]: settings chosen by cross-validation inside the training data.
//! - [`training`]: the fit / validate / activate policy of `kace train`.
//! - [`dataset`]: the artifact's `wN_` tables and split files.
//! - [`eval`]: scoring against the oracle; the paper's exact protocol and kace's general one.
//! - [`numpy_rng`]: NumPy-compatible permutations, to re-derive the paper's splits.

#![warn(missing_docs)]

pub mod dataset;
pub mod decision;
pub mod energy;
pub mod error;
pub mod eval;
pub mod features;
pub mod linear;
pub mod model;
pub mod numpy_rng;
pub mod policy;
pub mod selection;
pub mod slowdown;
pub mod splits;
pub mod training;
pub mod tuning;
pub mod zscore;

pub use error::{DataError, SelectorError};
pub use features::{combine, Feature, Profile, FEATURE_COUNT};
pub use linear::LinearModel;
pub use model::{Model, ModelKind};
pub use policy::Objective;
pub use selection::{select, Candidate, Predictor, Rejection, Selection, SelectionRules, Verdict};
pub use slowdown::{Member, SlowdownModel, SlowdownParams};
