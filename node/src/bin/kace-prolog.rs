//! `kace-prolog`: the slurmd `Prolog=` entry point. A thin shell around
//! [`kace_node::prolog::run`]: it reads the job's environment and the configuration, gives the
//! logic real Slurm commands, MPS control and NVML, and always exits 0 within the configured
//! budget, because a failing prolog drains the node. Its stderr goes to slurmd's log.

use std::process::ExitCode;

fn main() -> ExitCode {
    kace_node::hook::main(kace_node::hook::Phase::Prolog)
}
