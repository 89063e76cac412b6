//! `kace`, the admin command: parses arguments, runs one subcommand, maps errors to exit codes.
//!
//! Exit codes: 0 success; 1 failure; 2 bad usage; 3 the database is missing, damaged or of the
//! wrong schema version; 4 `kace db check` found problems; 5 `kace doctor` found warnings (and
//! no failures); 6 `kace doctor` found failures.

mod context;
mod db_cmd;
mod dispatch;
mod doctor;
mod eval;
mod explain;
mod history_eval;
mod ingest;
mod keyed;
mod man;
mod metrics;
mod model;
mod observations;
mod output;
mod pairs;
mod profile;
mod report;
mod retrain;
mod select;
mod simulate;
mod splits;
mod splits_eval;
mod status;
mod train;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};

use crate::context::Ctx;
use crate::output::Format;

/// Interference-aware GPU co-scheduling for Slurm.
#[derive(Debug, Parser)]
#[command(name = "kace", version, about, long_about = None)]
struct Cli {
    /// Output format.
    #[arg(long, global = true, value_enum, default_value_t = Format::Table)]
    format: Format,
    /// Database file (default: `database.path` from the config).
    #[arg(long, global = true, value_name = "PATH")]
    db: Option<PathBuf>,
    /// Config file (default: $KACE_CONFIG, else /etc/slurm/kace.conf).
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Say more about what is done (on stderr).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Evaluate choosing policies against the oracle on measured colocations.
    Eval(eval::EvalArgs),
    /// Create, migrate or check the database.
    Db(db_cmd::DbArgs),
    /// Move the epilog's spooled observations into the database.
    Ingest(ingest::IngestArgs),
    /// Import, measure and show workload profiles.
    Profile(profile::ProfileArgs),
    /// Import and list observed colocations.
    Observations(observations::ObservationsArgs),
    /// Fit a new model version from the observed groups (pairs, triples, …).
    Train(train::TrainArgs),
    /// Nightly: ingest the spool, train, activate only a model that is not worse, prune old files.
    Retrain(retrain::RetrainArgs),
    /// List, show and activate model versions.
    Model(model::ModelArgs),
    /// Show the partner the prolog would choose.
    Select(select::SelectArgs),
    /// Simulate a cluster under each pairing policy, on measured colocations.
    Simulate(simulate::SimulateArgs),
    /// Release held kace jobs: leads onto free GPUs, and any held longer than max_hold.
    Dispatch(dispatch::DispatchArgs),
    /// Check this host's kace setup (node, controller or both): each check ok, warn or fail.
    Doctor(doctor::DoctorArgs),
    /// Why a job was or was not paired: Slurm's view of it and kace's decisions.
    Explain(explain::ExplainArgs),
    /// What kace is doing now: GPUs and their kace jobs, held jobs, the active model.
    Status(status::StatusArgs),
    /// kace's figures in Prometheus's text format (`--textfile DIR` for node_exporter).
    Metrics(metrics::MetricsArgs),
    /// Predicted against observed, GPU time shared and the gain over running alone.
    Report(report::ReportArgs),
    /// Pairs of workloads kace stops pairing after their jobs failed together on one GPU.
    Pairs(pairs::PairsArgs),
    /// Train, list or turn off the chooser of a joiner's SM share (`mps.sm_split`).
    Splits(splits::SplitsArgs),
    /// Write the man pages into DIR (used by packaging).
    #[command(hide = true)]
    GenerateMan(man::GenerateManArgs),
}

fn main() -> ExitCode {
    output::exit_quietly_when_stdout_closes();
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("kace: {err:#}");
            ExitCode::from(exit_code(&err))
        }
    }
}

/// The one place errors become exit codes.
fn exit_code(err: &anyhow::Error) -> u8 {
    for cause in err.chain() {
        if cause.downcast_ref::<db_cmd::ProblemsFound>().is_some() {
            return 4;
        }
        if let Some(doctor::Unhealthy(worst)) = cause.downcast_ref::<doctor::Unhealthy>() {
            return if *worst == kace_node::doctor::Status::Fail { 6 } else { 5 };
        }
        if let Some(kace_observe::Error::Usage(_)) = cause.downcast_ref::<kace_observe::Error>() {
            return 2;
        }
        if let Some(e) = cause.downcast_ref::<kace_sql::Error>() {
            use kace_sql::Error as E;
            if matches!(
                e,
                E::Missing { .. }
                    | E::Corrupt { .. }
                    | E::NotInitialised { .. }
                    | E::SchemaTooNew { .. }
                    | E::SchemaTooOld { .. }
            ) {
                return 3;
            }
        }
    }
    1
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let ctx = || Ctx::load(cli.config.as_deref(), cli.db.clone(), cli.format, cli.verbose);
    match cli.command {
        Command::Eval(args) => eval::run(args, cli.format),
        Command::Db(args) => db_cmd::run(args, &ctx().context("config")?).context("db"),
        Command::Ingest(args) => ingest::run(args, &ctx().context("config")?).context("ingest"),
        Command::Profile(args) => profile::run(args, &ctx().context("config")?).context("profile"),
        Command::Observations(args) => {
            observations::run(args, &ctx().context("config")?).context("observations")
        }
        Command::Train(args) => train::run(args, &ctx().context("config")?).context("train"),
        Command::Retrain(args) => retrain::run(args, &ctx().context("config")?).context("retrain"),
        Command::Model(args) => model::run(args, &ctx().context("config")?).context("model"),
        Command::Select(args) => select::run(args, &ctx().context("config")?).context("select"),
        Command::Simulate(args) => simulate::run(args, cli.format),
        Command::Dispatch(args) => {
            dispatch::run(args, &ctx().context("config")?).context("dispatch")
        }
        Command::Doctor(args) => doctor::run(args, &ctx().context("config")?).context("doctor"),
        Command::Explain(args) => explain::run(args, &ctx().context("config")?).context("explain"),
        Command::Status(args) => status::run(args, &ctx().context("config")?).context("status"),
        Command::Metrics(args) => metrics::run(args, &ctx().context("config")?).context("metrics"),
        Command::Report(args) => report::run(args, &ctx().context("config")?).context("report"),
        Command::Pairs(args) => pairs::run(args, &ctx().context("config")?).context("pairs"),
        Command::Splits(args) => splits::run(args, &ctx().context("config")?).context("splits"),
        Command::GenerateMan(args) => man::run(args),
    }
}
