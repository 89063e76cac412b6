//! kace-sampler's logic: readings of each GPU kept in a bounded ring file per GPU ([`ring`]),
//! the service loop that fills them ([`service`]), and the system profile and the GPU's energy
//! of a time window ([`summary`]), which the epilog turns into a profile measurement of source
//! `observed` and each observation's energy. Being the
//! one root service on every node with an interval, it also caps running jobs' progress files
//! ([`progress_cap`]).
//!
//! Why a separate service: a job pays nothing for it (NVML readings are taken outside the job),
//! and the readings of a job's alone intervals are exactly the system profile `kace profile run`
//! would measure on an idle GPU, so a site gets profiles without an admin profiling anything.

#![warn(missing_docs)]

pub mod progress_cap;
pub mod ring;
pub mod service;
pub mod summary;

pub use ring::{Reading, Ring, RingError};
pub use summary::{energy_within, summarise, SystemProfile};
