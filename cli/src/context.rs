//! What every database subcommand shares: the loaded configuration, the resolved database path,
//! the output format and verbosity, and opening the database.

use std::path::{Path, PathBuf};

use anyhow::Result;
use kace_config::{Config, Origin};
use kace_sql::Db;

use crate::output::Format;

/// Global settings of one `kace` invocation.
#[derive(Debug)]
pub struct Ctx {
    /// The configuration (file or defaults).
    pub config: Config,
    /// The database path: `--db`, else the config's `database.path`.
    pub db_path: PathBuf,
    /// `--format`.
    pub format: Format,
    /// `-v` count.
    pub verbose: u8,
}

impl Ctx {
    /// Loads the configuration (`--config`, `$KACE_CONFIG`, `/etc/slurm/kace.conf`) and resolves
    /// the database path.
    pub fn load(
        config: Option<&Path>,
        db: Option<PathBuf>,
        format: Format,
        verbose: u8,
    ) -> Result<Ctx> {
        let (config, origin) = Config::load(config)?;
        let db_path = db.unwrap_or_else(|| config.database.path.clone());
        let ctx = Ctx { config, db_path, format, verbose };
        match origin {
            Origin::File(p) => ctx.info(&format!("config: {}", p.display())),
            Origin::Defaults => ctx.info("config: none found, using defaults"),
        }
        ctx.info(&format!("database: {}", ctx.db_path.display()));
        Ok(ctx)
    }

    /// Prints a progress line to stderr with `-v`.
    pub fn info(&self, msg: &str) {
        if self.verbose > 0 {
            eprintln!("kace: {msg}");
        }
    }

    /// Opens the database for writing (it must exist and be up to date).
    pub fn open(&self) -> Result<Db> {
        Ok(Db::open(&self.db_path)?)
    }

    /// Opens the database read-only, as the prolog does.
    pub fn open_read_only(&self) -> Result<Db> {
        Ok(Db::open_read_only(&self.db_path)?)
    }

    /// Slurm's commands as configured, each call within the configured timeout and all of them
    /// within `budget`.
    pub fn slurm(&self, budget: std::time::Duration) -> kace_node::slurm::Commands {
        // A person runs these: what Slurm's output skips is said on stderr only.
        kace_node::slurm::Commands::configured(
            &self.config.node,
            Some(std::time::Instant::now() + budget),
            kace_log::Logger::new(None),
        )
    }

    /// Whether output should be JSON.
    pub fn json(&self) -> bool {
        self.format == Format::Json
    }
}

/// Prints a JSON value (pretty) to stdout.
pub fn print_json(v: &serde_json::Value) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

/// Formats a number for tables: 4 significant decimals for small values, fewer for large.
pub fn num(v: f64) -> String {
    if !v.is_finite() {
        return v.to_string();
    }
    let a = v.abs();
    // A hostile progress file's 7.5e304 steps/s would otherwise print 305 digits.
    if a >= 1e9 {
        format!("{v:.3e}")
    } else if a >= 1e5 {
        format!("{v:.0}")
    } else if a >= 100.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}
