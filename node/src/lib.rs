//! kace's node and controller side: what `kace-prolog`, `kace-epilog` and `kace dispatch` do,
//! behind small traits for everything outside (Slurm's commands, the MPS control program, NVML,
//! the clock), so that the logic is tested without a cluster or a GPU.
//!
//! # Layout
//! - [`exec`]: running a program by absolute path with a timeout (kills its process group).
//! - [`slurm`]: the [`slurm::Slurm`] trait, the real commands and the parsers of their output.
//! - [`slurm_json`]: Slurm's JSON job records, read across releases.
//! - [`gres`]: the one parser of Slurm's GRES text (requests, allocations, node GPUs).
//! - [`mps`]: the [`mps::MpsControl`] trait and `nvidia-cuda-mps-control`.
//! - [`gpu`]: GPU memory from NVML or the configuration.
//! - [`state`]: per-GPU locks and the record of kace jobs on each GPU.
//! - [`slurmd`]: whether the slurmd that runs a hook still lives.
//! - [`env`](mod@env): the job facts in a prolog/epilog environment.
//! - [`measure`]: the profile measurement of a job's alone intervals (sampler readings, progress).
//! - [`dispatch`]: the decider, the one process that moves kace jobs; [`decider_state`] what it
//!   remembers; [`nudge`] how slurmctld's events wake it.
//! - [`read_path`]: the store's side of every decision (model, profiles, failed pairs), then
//!   the selector's one decision.
//! - [`prolog`], [`epilog`]: the node hooks (set up and observe; they move no job).
//! - [`doctor`]: `kace doctor`'s checks of a node's or the controller's setup.
//! - [`hook`]: the binaries' shell around the prolog and epilog (panic guard, watchdog, backends).
//! - [`error`]: the crate's errors.
//!
//! Everything here returns errors; the binaries log them and still exit 0, because a non-zero
//! prolog or epilog drains the node.

#![warn(missing_docs)]

pub mod decider_state;
pub mod dispatch;
pub mod doctor;
pub mod env;
pub mod epilog;
pub mod error;
pub mod exec;
pub mod gpu;
pub mod gres;
pub mod hook;
pub mod limits;
pub mod measure;
pub mod mps;
pub mod mps_log;
pub mod nudge;
pub mod placement;
pub mod priority;
pub mod prolog;
pub mod read_path;
pub mod slurm;
pub mod slurm_json;
pub mod slurmd;
pub mod state;

use std::time::Instant;

pub use error::{Error, ExecError, Result};

/// A source of the current time (Unix seconds), so tests can fix it.
pub trait Clock {
    /// Now, in Unix seconds.
    fn now(&self) -> f64;
}

/// The system clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> f64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0)
    }
}

/// Everything the node-side logic works with.
pub struct Node<'a> {
    /// The site configuration.
    pub config: &'a kace_config::Config,
    /// Slurm's commands.
    pub slurm: &'a dyn slurm::Slurm,
    /// The MPS control program.
    pub mps: &'a dyn mps::MpsControl,
    /// GPU facts.
    pub gpus: &'a dyn gpu::GpuInfo,
    /// The clock.
    pub clock: &'a dyn Clock,
    /// Nothing new is started after this.
    pub deadline: Instant,
    /// Where log lines go (slurmd's log, through stderr, in the binaries).
    pub log: &'a dyn Fn(&str),
    /// The slurmd that runs the hook (a prolog whose slurmd died sends no joiner).
    pub host: &'a dyn slurmd::HookHost,
}

impl Node<'_> {
    /// Fails with [`Error::Budget`] when the deadline has passed.
    pub fn check_budget(&self, step: &str) -> Result<()> {
        if Instant::now() >= self.deadline {
            return Err(Error::Budget { step: step.to_string() });
        }
        Ok(())
    }
}
