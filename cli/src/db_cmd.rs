//! `kace db init|migrate|check`: create the database, upgrade its schema, verify it.

use std::fmt;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use kace_sql::{Db, CURRENT_VERSION};
use serde_json::json;

use crate::context::{print_json, Ctx};

/// `kace db …`
#[derive(Debug, Args)]
pub struct DbArgs {
    #[command(subcommand)]
    command: DbCommand,
}

#[derive(Debug, Subcommand)]
enum DbCommand {
    /// Create the database (if missing) and bring its schema up to date.
    Init,
    /// Apply pending schema migrations to an existing database.
    Migrate,
    /// Run SQLite's integrity check and kace's invariants; exit 4 when problems are found.
    Check,
}

/// `db check` found problems (mapped to exit code 4 in main).
#[derive(Debug)]
pub struct ProblemsFound(pub usize);

impl fmt::Display for ProblemsFound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the database has {} problem(s)", self.0)
    }
}

impl std::error::Error for ProblemsFound {}

/// Runs `kace db …`.
pub fn run(args: DbArgs, ctx: &Ctx) -> Result<()> {
    let path = &ctx.db_path;
    match args.command {
        DbCommand::Init => {
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("couldn't create directory {}", dir.display()))?;
            }
            let (_, m) = Db::create(path)?;
            report_migration(ctx, "initialised", m.from, m.to)
        }
        DbCommand::Migrate => {
            let mut db = Db::open_any_version(path)?;
            let m = db.migrate()?;
            report_migration(ctx, "migrated", m.from, m.to)
        }
        DbCommand::Check => {
            let db = Db::open_any_version(path)?;
            let r = db.check()?;
            if ctx.json() {
                let counts: serde_json::Map<String, serde_json::Value> =
                    r.counts.iter().map(|(t, n)| (t.to_string(), json!(n))).collect();
                print_json(&json!({
                    "path": path,
                    "schema_version": r.schema_version,
                    "expected_schema_version": CURRENT_VERSION,
                    "counts": counts,
                    "problems": r.problems,
                }))?;
            } else {
                println!("database {}: schema version {}", path.display(), r.schema_version);
                for (t, n) in &r.counts {
                    println!("  {t}: {n} rows");
                }
                for p in &r.problems {
                    println!("problem: {p}");
                }
                if r.problems.is_empty() {
                    println!("ok");
                }
            }
            if r.problems.is_empty() {
                Ok(())
            } else {
                Err(ProblemsFound(r.problems.len()).into())
            }
        }
    }
}

fn report_migration(ctx: &Ctx, verb: &str, from: i64, to: i64) -> Result<()> {
    if ctx.json() {
        print_json(&json!({ "path": ctx.db_path, "from_version": from, "to_version": to }))
    } else {
        if from == to {
            println!("database {}: schema version {to}, up to date", ctx.db_path.display());
        } else {
            println!("database {}: {verb}, schema version {from} → {to}", ctx.db_path.display());
        }
        Ok(())
    }
}
