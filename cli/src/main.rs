//! `kace`, the admin command: parses arguments, runs one subcommand, maps errors to exit codes.

mod eval;
mod output;
mod simulate;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::output::Format;

/// Interference-aware GPU co-scheduling for Slurm.
#[derive(Debug, Parser)]
#[command(name = "kace", version, about, long_about = None)]
struct Cli {
    /// Output format.
    #[arg(long, global = true, value_enum, default_value_t = Format::Table)]
    format: Format,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Evaluate choosing policies against the oracle on measured colocations.
    Eval(eval::EvalArgs),
    /// Simulate a cluster under each pairing policy, on measured colocations.
    Simulate(simulate::SimulateArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("kace: {err:#}");
            ExitCode::from(1)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Eval(args) => eval::run(args, cli.format),
        Command::Simulate(args) => simulate::run(args, cli.format),
    }
}
