//! `kace ingest`: move the epilog's observations and profile measurements and the prolog's
//! decisions from the spool into the database, exactly once.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use kace_sql::spool;
use serde_json::json;

use crate::context::{print_json, Ctx};

/// `kace ingest`
#[derive(Debug, Args)]
pub struct IngestArgs {
    /// Spool directory (default: the config's `spool.dir`).
    #[arg(long, value_name = "DIR")]
    spool: Option<PathBuf>,
    /// Quarantine directory for unreadable files (default: the config's `spool.quarantine`).
    #[arg(long, value_name = "DIR")]
    quarantine: Option<PathBuf>,
}

impl IngestArgs {
    /// The spool and quarantine directories: the options, else the config's.
    pub fn dirs(&self, ctx: &Ctx) -> (PathBuf, PathBuf) {
        (
            self.spool.clone().unwrap_or_else(|| ctx.config.spool.dir.clone()),
            self.quarantine.clone().unwrap_or_else(|| ctx.config.spool.quarantine.clone()),
        )
    }
}

/// Tells the admin, on stderr, about files ingest could not take.
pub fn warn(r: &spool::IngestReport) {
    for (p, why) in &r.quarantined {
        eprintln!("kace: ingest: quarantined {}: {why}", p.display());
    }
    for p in &r.stale_temp_files {
        eprintln!("kace: ingest: {} is an abandoned write (older than an hour)", p.display());
    }
    for p in &r.requeued {
        eprintln!("kace: ingest: {} now parses; taken back from quarantine", p.display());
    }
    for p in &r.hidden {
        eprintln!(
            "kace: ingest: {} is a hidden file, not a kace record (the epilog writes none); left alone",
            p.display()
        );
    }
}

/// Runs `kace ingest`.
pub fn run(args: IngestArgs, ctx: &Ctx) -> Result<()> {
    let (dir, qdir) = args.dirs(ctx);
    let mut db = ctx.open()?;
    let spool::Ingested { profiles: p, observations: r, decisions: d, failures: f } =
        spool::ingest_all(&mut db, &dir, &qdir)?;
    if ctx.json() {
        let q: Vec<_> =
            r.quarantined.iter().map(|(p, why)| json!({ "file": p, "reason": why })).collect();
        print_json(&json!({
            "inserted": r.inserted,
            "duplicates": r.duplicates,
            "quarantined": q,
            "vanished": r.vanished,
            "stale_temp_files": r.stale_temp_files,
            "requeued": r.requeued,
            "hidden": r.hidden,
            "decisions": {
                "inserted": d.inserted,
                "duplicates": d.duplicates,
                "quarantined": d.quarantined.len(),
            },
            "profiles": {
                "inserted": p.inserted,
                "duplicates": p.duplicates,
                "quarantined": p.quarantined.len(),
            },
            "failures": {
                "inserted": f.inserted,
                "duplicates": f.duplicates,
                "quarantined": f.quarantined.len(),
            },
        }))?;
    } else {
        println!(
            "ingested {} new observation(s), {} already stored, {} quarantined",
            r.inserted,
            r.duplicates,
            r.quarantined.len()
        );
        println!(
            "ingested {} new decision(s), {} already stored, {} quarantined",
            d.inserted,
            d.duplicates,
            d.quarantined.len()
        );
        println!(
            "ingested {} new profile measurement(s), {} already stored, {} quarantined",
            p.inserted,
            p.duplicates,
            p.quarantined.len()
        );
        if f.inserted + f.quarantined.len() > 0 {
            println!(
                "ingested {} new failure(s) on a shared GPU, {} already stored, {} quarantined",
                f.inserted,
                f.duplicates,
                f.quarantined.len()
            );
        }
        warn(&p);
        warn(&r);
        warn(&d);
        warn(&f);
    }
    Ok(())
}
