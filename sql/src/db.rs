//! The `Db` handle: opening (read-only or writer), migrations and integrity checks. Its typed
//! queries live beside it by concern, each an `impl Db` of its own: `db/profiles.rs`
//! (workloads and profile measurements), `db/observations.rs`, `db/models.rs` and
//! `db/decisions.rs`. No SQL string exists outside this crate.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::types::ToSql;
use rusqlite::{params, params_from_iter, Connection, OpenFlags, OptionalExtension};

use crate::error::{sql, Error, Result};
use crate::schema::{CURRENT_VERSION, MIGRATIONS};
use crate::types::is_observed_source;
use crate::types::quote_untrusted;
use crate::types::{
    corroborated, feature_value_problem, implausibility, Bound, DecisionRecord, ModelRecord,
    NewDecision, NewModel, NewProfile, Observation, ObservationFilter, ObservedGroup,
    ObservedMember, ObservedProfile, Partner, Profile, EXCLUSIVE, FEATURE_COLUMNS, FEATURE_COUNT,
    MAX_RATIO_TO_EXCLUSIVE, MEMCAP, OBSERVED_KEPT, OBSERVED_SOURCE, OOM_RAISE_HALF_LIFE_S,
    OOM_RAISE_INTERVAL_S, OOM_SOURCE, SM_PCT,
};

mod decisions;
mod failures;
mod models;
mod observations;
mod profiles;
mod split_models;
pub use split_models::SplitModelRecord;

/// Mode of a database file `kace db init` creates (before the umask): owner read-write, its
/// group read, nobody else. SQLite gives its journal the same mode.
pub const DB_MODE: u32 = 0o640;

/// How long a connection waits for another process's lock before giving up. The nightly
/// retrain may hold the write lock for a few seconds while prologs read.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// An open kace database.
#[derive(Debug)]
pub struct Db {
    conn: Connection,
    path: PathBuf,
    read_only: bool,
    /// The time profiles are read at (Unix seconds; `None`: the system clock): how far an
    /// out-of-memory raise has faded ([`crate::OOM_RAISE_HALF_LIFE_S`]). The prolog and the
    /// decider pass their own clock ([`Db::set_now`]), so that their tests' clocks hold here too.
    now: Option<f64>,
}

/// What `Db::migrate` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Migration {
    /// Schema version before.
    pub from: i64,
    /// Schema version after.
    pub to: i64,
}

/// What `Db::check` found. An empty `problems` list means the database is healthy.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CheckReport {
    /// Schema version found.
    pub schema_version: i64,
    /// Rows per table.
    pub counts: Vec<(&'static str, i64)>,
    /// Every problem, in words.
    pub problems: Vec<String>,
}

/// Result of inserting observations.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InsertCount {
    /// New rows.
    pub inserted: usize,
    /// Keys that were already stored (nothing changed for them).
    pub duplicates: usize,
}

/// The WHERE clause selecting what `f` names, with numbered placeholders from `?first`, and
/// their values. Refuses an empty filter: removing every observation takes `kace db init`.
fn filter_sql(f: &ObservationFilter, first: usize) -> Result<(String, Vec<String>)> {
    let mut parts = Vec::new();
    let mut binds = Vec::new();
    for (col, v) in [("key", &f.key), ("job", &f.job), ("node", &f.node)] {
        if let Some(v) = v {
            binds.push(v.clone());
            parts.push(format!("{col} = ?{}", first + binds.len() - 1));
        }
    }
    if parts.is_empty() {
        return Err(Error::Invalid {
            reason: "name the observations: a key, a job or a node".into(),
        });
    }
    Ok((parts.join(" AND "), binds))
}

pub(crate) fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

fn json_col<T: serde::de::DeserializeOwned>(what: &str, text: &str) -> Result<T> {
    serde_json::from_str(text).map_err(|source| Error::Json { what: what.to_string(), source })
}

fn to_json<T: serde::Serialize>(what: &str, v: &T) -> Result<String> {
    serde_json::to_string(v).map_err(|source| Error::Json { what: what.to_string(), source })
}

/// `?1, ?2, …, ?n`: the placeholders of an insert of `n` values.
fn placeholders(n: usize) -> String {
    (1..=n).map(|i| format!("?{i}")).collect::<Vec<_>>().join(", ")
}

/// An insert's leading values followed by a profile's feature values, in [`FEATURE_COLUMNS`]
/// order (NULL where a feature was not measured).
fn with_features<'a>(
    head: &'a [&'a dyn ToSql],
    values: &'a [Option<f64>; FEATURE_COUNT],
) -> impl Iterator<Item = &'a dyn ToSql> {
    head.iter().copied().chain(values.iter().map(|v| v as &dyn ToSql))
}

impl Db {
    /// Reads profiles as at `now` (Unix seconds) instead of the system clock's time.
    pub fn set_now(&mut self, now: f64) {
        self.now = Some(now);
    }

    /// The time profiles are read at: [`Db::set_now`]'s, else the system clock's.
    pub(crate) fn now(&self) -> f64 {
        self.now.unwrap_or_else(now)
    }

    /// Opens an existing, up-to-date database read-only: what the prolog does. Never writes,
    /// never creates, never takes the write lock.
    pub fn open_read_only(path: &Path) -> Result<Db> {
        Db::open_read_only_within(path, BUSY_TIMEOUT)
    }

    /// [`Db::open_read_only`], waiting at most `busy` for a writer's lock (a prolog passes what
    /// is left of its time budget, so a locked database cannot run it into its watchdog).
    pub fn open_read_only_within(path: &Path, busy: Duration) -> Result<Db> {
        if !path.exists() {
            return Err(Error::Missing { path: path.to_path_buf() });
        }
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(path, flags).map_err(sql("open database", path))?;
        let db = Db { conn, path: path.to_path_buf(), read_only: true, now: None };
        db.configure(busy)?;
        db.require_current()?;
        Ok(db)
    }

    /// Opens an existing, up-to-date database for writing (admin CLI, retrain).
    pub fn open(path: &Path) -> Result<Db> {
        let db = Db::open_writer(path, false)?;
        db.require_current()?;
        Ok(db)
    }

    /// Opens a database for `kace db migrate` / `kace db check`: any schema version is accepted.
    pub fn open_any_version(path: &Path) -> Result<Db> {
        Db::open_writer(path, false)
    }

    /// Creates the database if needed and brings its schema up to date (`kace db init`). A
    /// new file is created mode [`DB_MODE`] (0640): it holds every user's decisions (who ran
    /// what, beside whom), which `kace status` hides under Slurm's `PrivateData`; the readers
    /// that need it (kace-dispatch as SlurmUser, `kace report` users) get it through the
    /// file's group (admin guide, "What kace trusts"). An existing file keeps its mode.
    pub fn create(path: &Path) -> Result<(Db, Migration)> {
        use std::os::unix::fs::OpenOptionsExt;
        match std::fs::OpenOptions::new().write(true).create_new(true).mode(DB_MODE).open(path) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(source) => {
                return Err(Error::Io {
                    op: "create database".into(),
                    path: path.to_path_buf(),
                    source,
                })
            }
        }
        let mut db = Db::open_writer(path, true)?;
        let m = db.migrate()?;
        Ok((db, m))
    }

    fn open_writer(path: &Path, create: bool) -> Result<Db> {
        if !create && !path.exists() {
            return Err(Error::Missing { path: path.to_path_buf() });
        }
        let mut flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        if create {
            flags |= OpenFlags::SQLITE_OPEN_CREATE;
        }
        let conn = Connection::open_with_flags(path, flags).map_err(sql("open database", path))?;
        let db = Db { conn, path: path.to_path_buf(), read_only: false, now: None };
        db.configure(BUSY_TIMEOUT)?;
        // A rollback journal, never WAL: WAL needs shared memory that network file systems do
        // not provide, and the DB may sit on NFS next to slurm.conf. Setting it also converts a
        // file someone switched to WAL back.
        let mode: String = db
            .conn
            .query_row("PRAGMA journal_mode = DELETE", [], |r| r.get(0))
            .map_err(sql("set journal mode", path))?;
        if !mode.eq_ignore_ascii_case("delete") {
            return Err(Error::Invalid {
                reason: format!("couldn't set rollback journal on {}: got {mode}", path.display()),
            });
        }
        db.conn
            .pragma_update(None, "foreign_keys", true)
            .map_err(sql("enable foreign keys", path))?;
        Ok(db)
    }

    fn configure(&self, busy: Duration) -> Result<()> {
        self.conn.busy_timeout(busy).map_err(sql("set busy timeout", &self.path))?;
        // Reading the schema here turns "not a database" into an error at open time, not at
        // the first query deep inside a command.
        self.conn
            .query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get::<_, i64>(0))
            .map_err(sql("read database schema", &self.path))?;
        Ok(())
    }

    /// The database path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether this handle was opened read-only.
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// `PRAGMA user_version`: the schema version of the file.
    pub fn schema_version(&self) -> Result<i64> {
        self.conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(sql("read schema version", &self.path))
    }

    fn require_current(&self) -> Result<()> {
        let v = self.schema_version()?;
        let path = self.path.clone();
        match v {
            0 => Err(Error::NotInitialised { path }),
            v if v > CURRENT_VERSION => {
                Err(Error::SchemaTooNew { path, found: v, supported: CURRENT_VERSION })
            }
            v if v < CURRENT_VERSION => {
                Err(Error::SchemaTooOld { path, found: v, needed: CURRENT_VERSION })
            }
            _ => Ok(()),
        }
    }

    /// Applies every pending migration, each in its own transaction.
    pub fn migrate(&mut self) -> Result<Migration> {
        let from = self.schema_version()?;
        if from > CURRENT_VERSION {
            return Err(Error::SchemaTooNew {
                path: self.path.clone(),
                found: from,
                supported: CURRENT_VERSION,
            });
        }
        if from == 0 {
            // A non-empty file without our version stamp is someone else's database: refuse
            // rather than add tables to it.
            let tables: i64 = self
                .conn
                .query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))
                .map_err(sql("read database schema", &self.path))?;
            if tables > 0 {
                return Err(Error::Invalid {
                    reason: format!(
                        "couldn't initialise {}: it already holds tables that are not kace's",
                        self.path.display()
                    ),
                });
            }
        }
        let path = self.path.clone();
        for (i, step) in MIGRATIONS.iter().enumerate().skip(from as usize) {
            let to = i as i64 + 1;
            let tx = self.conn.transaction().map_err(sql("begin migration", &path))?;
            tx.execute_batch(step).map_err(sql("apply migration", &path))?;
            tx.pragma_update(None, "user_version", to)
                .map_err(sql("stamp schema version", &path))?;
            tx.commit().map_err(sql("commit migration", &path))?;
        }
        Ok(Migration { from, to: CURRENT_VERSION })
    }

    /// Runs SQLite's integrity and foreign-key checks and kace's own invariants.
    pub fn check(&self) -> Result<CheckReport> {
        let p = &self.path;
        let mut report =
            CheckReport { schema_version: self.schema_version()?, ..Default::default() };
        let mut stmt =
            self.conn.prepare("PRAGMA integrity_check").map_err(sql("check integrity", p))?;
        let lines: Vec<String> = stmt
            .query_map([], |r| r.get(0))
            .and_then(|rows| rows.collect())
            .map_err(sql("check integrity", p))?;
        report
            .problems
            .extend(lines.into_iter().filter(|l| l != "ok").map(|l| format!("sqlite: {l}")));
        if report.schema_version != CURRENT_VERSION {
            report.problems.push(format!(
                "schema version is {}, this kace needs {CURRENT_VERSION}",
                report.schema_version
            ));
            return Ok(report);
        }
        let fk: i64 = self
            .conn
            .query_row("SELECT count(*) FROM pragma_foreign_key_check", [], |r| r.get(0))
            .map_err(sql("check foreign keys", p))?;
        if fk > 0 {
            report.problems.push(format!("{fk} rows reference missing rows"));
        }
        for table in ["workloads", "profiles", "observations", "models", "decisions"] {
            let n: i64 = self
                .conn
                .query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
                .map_err(sql("count rows", p))?;
            report.counts.push((table, n));
        }
        self.check_profiles(&mut report)?;
        self.check_observations(&mut report)?;
        self.check_models(&mut report)?;
        Ok(report)
    }

    fn check_profiles(&self, report: &mut CheckReport) -> Result<()> {
        let p = &self.path;
        let cols = FEATURE_COLUMNS.join(", ");
        let mut stmt = self
            .conn
            .prepare(&format!("SELECT id, {cols} FROM profiles"))
            .map_err(sql("check profiles", p))?;
        let mut rows = stmt.query([]).map_err(sql("check profiles", p))?;
        while let Some(row) = rows.next().map_err(sql("check profiles", p))? {
            let id: i64 = row.get(0).map_err(sql("check profiles", p))?;
            for (i, name) in FEATURE_COLUMNS.iter().enumerate() {
                let v: Option<f64> = row.get(i + 1).map_err(sql("check profiles", p))?;
                if let Some(why) = v.and_then(|v| feature_value_problem(i, v)) {
                    report.problems.push(format!("profile row {id}: {name}: {why}"));
                }
            }
        }
        Ok(())
    }

    fn check_observations(&self, report: &mut CheckReport) -> Result<()> {
        let p = &self.path;
        let mut stmt = self
            .conn
            .prepare(
                "SELECT o.key, o.partners, o.exclusive, o.start_time, o.end_time, o.throughput, \
                 w.name FROM observations o JOIN workloads w ON w.id = o.workload_id \
                 WHERE o.quarantined IS NULL",
            )
            .map_err(sql("check observations", p))?;
        let exclusive = self.exclusive_bounds()?;
        let mut rows = stmt.query([]).map_err(sql("check observations", p))?;
        while let Some(row) = rows.next().map_err(sql("check observations", p))? {
            type Row = (String, String, bool, f64, f64, f64, String);
            let get = |r: &rusqlite::Row<'_>| -> rusqlite::Result<Row> {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?))
            };
            let (key, partners, alone, start, end, thr, workload) =
                get(row).map_err(sql("check observations", p))?;
            let excl = Bound { exclusive: exclusive.get(&workload).copied(), sm_pct: None };
            let probe = Observation {
                key: key.clone(),
                job: String::new(),
                workload,
                partners: Vec::new(),
                node: String::new(),
                gpu: String::new(),
                mps_share: None,
                start,
                end,
                steps: None,
                throughput: thr,
                user: None,
                account: None,
                gpu_sm_pct: None,
                gpu_energy_j: None,
            };
            if let Some(why) = implausibility(&probe, excl) {
                report.problems.push(format!("{why} (kace observations quarantine --key {key})"));
            }
            match serde_json::from_str::<Vec<Partner>>(&partners) {
                Ok(list) if list.is_empty() != alone => report
                    .problems
                    .push(format!("observation {key}: exclusive flag disagrees with partners")),
                Ok(_) => {}
                Err(e) => report.problems.push(format!("observation {key}: bad partners: {e}")),
            }
            if end < start || !thr.is_finite() || thr < 0.0 {
                report.problems.push(format!("observation {key}: bad interval or throughput"));
            }
        }
        Ok(())
    }

    fn check_models(&self, report: &mut CheckReport) -> Result<()> {
        let models = self.models()?;
        if !models.is_empty() && !models.iter().any(|m| m.active) {
            report.problems.push("models exist but none is active (kace model activate N)".into());
        }
        for m in &models {
            if m.model.features.is_empty() {
                report.problems.push(format!("model {}: no features", m.version));
            }
            // JSON has no inf or NaN: serde_json writes them as null.
            if let Some(v) = m.model.metrics.get("holdout_mse") {
                if !v.as_f64().is_some_and(f64::is_finite) {
                    report.problems.push(format!(
                        "model {}{}: held-out MSE is not a finite number ({v})",
                        m.version,
                        if m.active { " (active)" } else { "" }
                    ));
                }
            }
            // The prolog must be able to use the active model; an old version of an unknown
            // kind is history, not a problem.
            if m.active {
                if let Err(e) = crate::convert::model_from_record(m) {
                    report.problems.push(e.to_string());
                }
            }
        }
        Ok(())
    }
}
