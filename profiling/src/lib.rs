//! kace's workload profiling: Nsight Compute CSV aggregation into the six kernel metrics
//! ([`ncu`]), the progress-file protocol ([`progress`]), GPU sampling behind a trait with a real
//! NVML backend and a fake ([`nvml`]), and the exclusive profiling run ([`run`]), which ends a
//! timed-out workload with everything it started ([`process_tree`]).

#![warn(missing_docs)]

pub mod ncu;
pub mod nvml;
pub mod process_tree;
pub mod progress;
pub mod run;
