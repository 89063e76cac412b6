//! kace's workload profiling: Nsight Compute CSV aggregation into the six kernel metrics
//! ([`ncu`]), the progress-file protocol ([`progress`]), GPU sampling behind a trait with a real
//! NVML backend and a fake ([`nvml`]), and the exclusive profiling run ([`run`]).

pub mod ncu;
pub mod nvml;
pub mod progress;
pub mod run;
