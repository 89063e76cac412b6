//! `kace retrain`: the nightly job — ingest the spool, then train and publish a new model version
//! only when it is not worse than the active one on held-out pairs.

use anyhow::{Context, Result};
use clap::Args;

use crate::context::Ctx;
use crate::{ingest, train};

/// `kace retrain`
#[derive(Debug, Args)]
pub struct RetrainArgs {
    #[command(flatten)]
    ingest: ingest::IngestArgs,
    #[command(flatten)]
    train: train::TrainArgs,
}

/// Runs `kace retrain`.
pub fn run(args: RetrainArgs, ctx: &Ctx) -> Result<()> {
    ingest::run(args.ingest, ctx).context("ingest")?;
    train::run(args.train, ctx).context("train")
}
