//! `kace`, the admin command: parses arguments, runs one subcommand, maps errors to exit codes.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Interference-aware GPU co-scheduling for Slurm.
#[derive(Debug, Parser)]
#[command(name = "kace", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the version and exit.
    Version,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("kace: {err:#}");
            ExitCode::from(1)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Version => {
            println!("kace {}", env!("CARGO_PKG_VERSION"));
            Ok(ExitCode::SUCCESS)
        }
    }
}
