//! The `Db` handle: opening (read-only or writer), migrations, integrity checks and every typed
//! query. No SQL string exists outside this crate.

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
    feature_value_problem, implausibility, DecisionRecord, ModelRecord, NewDecision, NewModel,
    NewProfile, Observation, ObservationFilter, ObservedGroup, ObservedMember, ObservedProfile,
    Partner, Profile, EXCLUSIVE, FEATURE_COLUMNS, FEATURE_COUNT, MAX_RATIO_TO_EXCLUSIVE, MEMCAP,
    OBSERVED_KEPT, OBSERVED_SOURCE, OOM_RAISE_INTERVAL_S, OOM_SOURCE,
};

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
        let db = Db { conn, path: path.to_path_buf(), read_only: true };
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
        let db = Db { conn, path: path.to_path_buf(), read_only: false };
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
        let exclusive = self.exclusive_throughputs()?;
        let mut rows = stmt.query([]).map_err(sql("check observations", p))?;
        while let Some(row) = rows.next().map_err(sql("check observations", p))? {
            type Row = (String, String, bool, f64, f64, f64, String);
            let get = |r: &rusqlite::Row<'_>| -> rusqlite::Result<Row> {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?))
            };
            let (key, partners, alone, start, end, thr, workload) =
                get(row).map_err(sql("check observations", p))?;
            let excl = exclusive.get(&workload).copied();
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
                if let Err(e) = crate::decide::model_from_record(m) {
                    report.problems.push(e.to_string());
                }
            }
        }
        Ok(())
    }

    // ---- workloads -------------------------------------------------------------------------

    fn workload_id(conn: &Connection, path: &Path, name: &str) -> Result<i64> {
        crate::types::validate_workload_name(name)?;
        conn.execute(
            "INSERT INTO workloads (name, created_at) VALUES (?1, ?2) ON CONFLICT(name) DO NOTHING",
            params![name, now()],
        )
        .map_err(sql("add workload", path))?;
        conn.query_row("SELECT id FROM workloads WHERE name = ?1", [name], |r| r.get(0))
            .map_err(sql("look up workload", path))
    }

    /// All workload names, sorted.
    pub fn workloads(&self) -> Result<Vec<String>> {
        let p = &self.path;
        let mut stmt = self
            .conn
            .prepare("SELECT name FROM workloads ORDER BY name")
            .map_err(sql("list workloads", p))?;
        let names = stmt.query_map([], |r| r.get(0)).and_then(|r| r.collect());
        names.map_err(sql("list workloads", p))
    }

    // ---- profiles --------------------------------------------------------------------------

    /// Stores profile measurements, all or none. One identical to its workload's newest
    /// measurement from the same source (same GPU model and values) is not stored again but
    /// counted as a duplicate, so importing a file twice changes nothing, even when kace
    /// observed the workload in between.
    pub fn insert_profiles(&mut self, profiles: &[NewProfile]) -> Result<InsertCount> {
        for pr in profiles {
            pr.validate()?;
        }
        let path = self.path.clone();
        let tx = self.conn.transaction().map_err(sql("begin profile import", &path))?;
        let t = now();
        let mut count = InsertCount::default();
        let cols = FEATURE_COLUMNS.join(", ");
        for pr in profiles {
            let wid = Db::workload_id(&tx, &path, &pr.workload)?;
            // The same measurement as the workload's newest one from this source is the same
            // file imported again: storing it would change nothing but the row count.
            let newest = tx
                .query_row(
                    &format!(
                        "SELECT gpu_model, source, {cols} FROM profiles WHERE workload_id = ?1 \
                         AND source = ?2 ORDER BY created_at DESC, id DESC LIMIT 1"
                    ),
                    params![wid, pr.source],
                    |r| {
                        let mut values = [None; FEATURE_COUNT];
                        for (i, v) in values.iter_mut().enumerate() {
                            *v = r.get::<_, Option<f64>>(i + 2)?;
                        }
                        Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, values))
                    },
                )
                .optional()
                .map_err(sql("look up profile", &path))?;
            if newest.is_some_and(|(g, s, v)| g == pr.gpu_model && s == pr.source && v == pr.values)
            {
                count.duplicates += 1;
                continue;
            }
            count.inserted += 1;
            let head: [&dyn ToSql; 4] = [&wid, &pr.gpu_model, &pr.source, &t];
            let sqltext = format!(
                "INSERT INTO profiles (workload_id, gpu_model, source, created_at, {cols}) \
                 VALUES ({})",
                placeholders(head.len() + FEATURE_COUNT)
            );
            let mut stmt = tx.prepare_cached(&sqltext).map_err(sql("store profile", &path))?;
            stmt.execute(params_from_iter(with_features(&head, &pr.values)))
                .map_err(sql("store profile", &path))?;
        }
        tx.commit().map_err(sql("commit profile import", &path))?;
        Ok(count)
    }

    /// The current profile of each named workload that has one (others are simply absent from
    /// the map). Per feature, the newest non-NULL measurement wins, so an ncu import and a later
    /// `kace profile run` combine into one profile. With `gpu_model`, only measurements on that
    /// GPU model count.
    pub fn profiles(
        &self,
        names: &[&str],
        gpu_model: Option<&str>,
    ) -> Result<HashMap<String, Profile>> {
        // The names go in as one JSON array: one statement text whatever their number, so it
        // is parsed once per connection (parsing a thousand `?` was about 7 % of a decision
        // among 1 000 candidates) and no limit on bound variables applies.
        let list = to_json("workload names", &names)?;
        let mut out = HashMap::with_capacity(names.len());
        self.load_profiles(
            "w.name IN (SELECT value FROM json_each(?))",
            &[list.as_str()],
            gpu_model,
            &mut out,
        )?;
        Ok(out)
    }

    /// The current profile of every workload.
    pub fn all_profiles(&self, gpu_model: Option<&str>) -> Result<HashMap<String, Profile>> {
        let mut out = HashMap::new();
        self.load_profiles("1 = 1", &[], gpu_model, &mut out)?;
        Ok(out)
    }

    fn load_profiles(
        &self,
        filter: &str,
        names: &[&str],
        gpu_model: Option<&str>,
        out: &mut HashMap<String, Profile>,
    ) -> Result<()> {
        let p = &self.path;
        let cols = FEATURE_COLUMNS.iter().map(|c| format!("p.{c}")).collect::<Vec<_>>().join(", ");
        let gpu_filter = if gpu_model.is_some() { " AND p.gpu_model = ?" } else { "" };
        let text = format!(
            "SELECT w.name, p.gpu_model, p.created_at, p.source, p.samples, {cols} FROM profiles p \
             JOIN workloads w ON w.id = p.workload_id WHERE {filter}{gpu_filter} \
             ORDER BY w.name, p.created_at DESC, p.id DESC"
        );
        let mut stmt = self.conn.prepare_cached(&text).map_err(sql("load profiles", p))?;
        let binds = names.iter().copied().chain(gpu_model);
        let mut rows = stmt.query(params_from_iter(binds)).map_err(sql("load profiles", p))?;
        // The newest observed memcap per workload, which may raise an admin's (see Profile).
        let mut observed_memcap: HashMap<String, (f64, Arc<str>)> = HashMap::new();
        let text_of = |row: &rusqlite::Row<'_>, i: usize| -> Result<String> {
            row.get_ref(i)
                .and_then(|v| v.as_str().map_err(Into::into))
                .map(str::to_owned)
                .map_err(sql("load profiles", p))
        };
        // Rows come grouped by workload, newest first: the name and source of a row are
        // compared with the previous row's before anything is allocated for them, and every
        // value of a measurement shares its one source text.
        let (mut name, mut source) = (String::new(), Arc::<str>::from(""));
        while let Some(row) = rows.next().map_err(sql("load profiles", p))? {
            if row.get_ref(0).ok().and_then(|v| v.as_str().ok()) != Some(name.as_str()) {
                name = text_of(row, 0)?;
            }
            if row.get_ref(3).ok().and_then(|v| v.as_str().ok()) != Some(&*source) {
                source = text_of(row, 3)?.into();
            }
            let samples: Option<i64> = row.get(4).map_err(sql("load profiles", p))?;
            let mut values = [None; FEATURE_COUNT];
            for (i, v) in values.iter_mut().enumerate() {
                *v = row.get(i + 5).map_err(sql("load profiles", p))?;
            }
            let observed = is_observed_source(&source);
            let prof = match out.get_mut(&name) {
                Some(prof) => prof,
                None => {
                    let prof = Profile {
                        workload: name.clone(),
                        gpu_model: row.get(1).map_err(sql("load profiles", p))?,
                        updated_at: row.get(2).map_err(sql("load profiles", p))?,
                        values: [None; FEATURE_COUNT],
                        sources: Default::default(),
                        observed_runs: 0,
                        observed_samples: 0,
                    };
                    out.entry(name.clone()).or_insert(prof)
                }
            };
            if &*source == OBSERVED_SOURCE {
                if prof.observed_runs == 0 {
                    prof.observed_samples = samples.unwrap_or(0).max(0) as u64;
                }
                prof.observed_runs += 1;
            }
            if observed {
                if let Some(m) = values[MEMCAP] {
                    if !observed_memcap.contains_key(&name) {
                        observed_memcap.insert(name.clone(), (m, source.clone()));
                    }
                }
            }
            // Rows come newest first: a value is taken where none is known yet, and an admin's
            // value replaces one kace observed.
            for (i, v) in values.into_iter().enumerate() {
                let Some(v) = v else { continue };
                let have_observed = prof.sources[i].as_deref().is_some_and(is_observed_source);
                if prof.values[i].is_none() || (have_observed && !observed) {
                    prof.values[i] = Some(v);
                    prof.sources[i] = Some(source.clone());
                }
            }
        }
        for (name, (memcap, source)) in observed_memcap {
            if let Some(prof) = out.get_mut(&name) {
                if prof.values[MEMCAP].is_none_or(|m| memcap > m) {
                    prof.values[MEMCAP] = Some(memcap);
                    prof.sources[MEMCAP] = Some(source);
                }
            }
        }
        Ok(())
    }

    /// Stores a profile measurement the epilog spooled, unless its key is stored already (the
    /// same record ingested again, or by another ingest at once: the key is UNIQUE), and keeps
    /// only the newest [`OBSERVED_KEPT`] of its workload, GPU model and source. Returns whether
    /// it was inserted.
    pub fn insert_observed_profile(&mut self, o: &ObservedProfile) -> Result<bool> {
        o.validate()?;
        if let Some(why) = self.observed_profile_problem(o)? {
            return Err(Error::Invalid { reason: why });
        }
        let path = self.path.clone();
        let tx = self.conn.transaction().map_err(sql("begin profile measurement", &path))?;
        let wid = Db::workload_id(&tx, &path, &o.profile.workload)?;
        let cols = FEATURE_COLUMNS.join(", ");
        let samples = i64::try_from(o.samples).unwrap_or(i64::MAX);
        let oom_limit = o.oom_limit_mib.map(|m| i64::try_from(m).unwrap_or(i64::MAX));
        let head: [&dyn ToSql; 9] = [
            &wid,
            &o.profile.gpu_model,
            &o.profile.source,
            &o.created_at,
            &o.key,
            &o.job,
            &samples,
            &oom_limit,
            &o.alone_seconds,
        ];
        let n = tx
            .execute(
                &format!(
                    "INSERT INTO profiles (workload_id, gpu_model, source, created_at, key, job, \
                     samples, oom_limit_mib, alone_seconds, {cols}) VALUES ({}) \
                     ON CONFLICT(key) DO NOTHING",
                    placeholders(head.len() + FEATURE_COUNT)
                ),
                params_from_iter(with_features(&head, &o.profile.values)),
            )
            .map_err(sql("store profile measurement", &path))?;
        // Every kace job's run adds one: keep the newest few per workload, GPU model and source,
        // so that the prolog's read of a workload's profile stays a few rows.
        tx.execute(
            "DELETE FROM profiles WHERE workload_id = ?1 AND gpu_model = ?2 AND source = ?3 \
             AND key IS NOT NULL AND id NOT IN (SELECT id FROM profiles WHERE workload_id = ?1 \
             AND gpu_model = ?2 AND source = ?3 AND key IS NOT NULL \
             ORDER BY created_at DESC, id DESC LIMIT ?4)",
            params![wid, o.profile.gpu_model, o.profile.source, OBSERVED_KEPT as i64],
        )
        .map_err(sql("prune profile measurements", &path))?;
        tx.commit().map_err(sql("commit profile measurement", &path))?;
        Ok(n == 1)
    }

    /// Why a measurement kace made from a job's run may not be stored, judged against what the
    /// admin measured: an exclusive throughput more than [`MAX_RATIO_TO_EXCLUSIVE`] times off
    /// the admin's (the re-audit's H1(b): one alone run at 9e8 steps/s against the admin's 12),
    /// or a second out-of-memory raise of the workload's memcap within
    /// [`crate::types::OOM_RAISE_INTERVAL_S`] (M1: five 5-second jobs, five raises). The same
    /// record ingested again is not a problem (its key makes it a duplicate).
    fn observed_profile_problem(&self, o: &ObservedProfile) -> Result<Option<String>> {
        let p = &self.path;
        let name = &o.profile.workload;
        let key = quote_untrusted(&o.key);
        if let Some(x) = o.profile.values[EXCLUSIVE] {
            if let Some(e) = self.exclusive_throughputs()?.get(name).copied() {
                if x > MAX_RATIO_TO_EXCLUSIVE * e || x * MAX_RATIO_TO_EXCLUSIVE < e {
                    return Ok(Some(format!(
                        "observed profile {key}: exclusive throughput {x} is more than \
                         {MAX_RATIO_TO_EXCLUSIVE} times off {name}'s admin-measured {e}"
                    )));
                }
            }
        }
        if o.profile.source == OOM_SOURCE {
            let last: Option<f64> = self
                .conn
                .query_row(
                    "SELECT max(p.created_at) FROM profiles p JOIN workloads w ON \
                     w.id = p.workload_id WHERE w.name = ?1 AND p.source = ?2 AND p.key != ?3",
                    params![name, OOM_SOURCE, o.key],
                    |r| r.get(0),
                )
                .map_err(sql("look up out-of-memory raises", p))?;
            if let Some(t) = last.filter(|t| (o.created_at - t).abs() < OOM_RAISE_INTERVAL_S) {
                return Ok(Some(format!(
                    "observed profile {key}: {name}'s memcap was raised for running out of \
                     memory at {t:.0}, less than {OOM_RAISE_INTERVAL_S:.0} s before; one raise a day"
                )));
            }
        }
        Ok(None)
    }

    /// The profile measurements kace made from `job`'s runs, oldest first (for `kace explain`).
    pub fn observed_profiles_of_job(&self, job: &str) -> Result<Vec<ObservedProfile>> {
        let p = &self.path;
        let cols = FEATURE_COLUMNS.iter().map(|c| format!("p.{c}")).collect::<Vec<_>>().join(", ");
        let mut stmt = self
            .conn
            .prepare_cached(&format!(
                "SELECT p.key, w.name, p.gpu_model, p.source, p.created_at, p.samples, \
                 p.oom_limit_mib, p.alone_seconds, {cols} FROM profiles p JOIN workloads w ON w.id = p.workload_id \
                 WHERE p.job = ?1 AND p.key IS NOT NULL ORDER BY p.created_at, p.id"
            ))
            .map_err(sql("load profile measurements", p))?;
        let rows = stmt
            .query_map([job], |r| {
                let mut values = [None; FEATURE_COUNT];
                for (i, v) in values.iter_mut().enumerate() {
                    *v = r.get(i + 8)?;
                }
                Ok(ObservedProfile {
                    key: r.get(0)?,
                    job: job.to_string(),
                    created_at: r.get(4)?,
                    profile: NewProfile {
                        workload: r.get(1)?,
                        gpu_model: r.get(2)?,
                        source: r.get(3)?,
                        values,
                    },
                    samples: r.get::<_, Option<i64>>(5)?.unwrap_or(0).max(0) as u64,
                    alone_seconds: r.get::<_, Option<f64>>(7)?.unwrap_or(0.0),
                    oom_limit_mib: r.get::<_, Option<i64>>(6)?.map(|m| m.max(0) as u64),
                })
            })
            .and_then(|r| r.collect());
        rows.map_err(sql("load profile measurements", p))
    }

    // ---- observations ----------------------------------------------------------------------

    /// Stores observations in one transaction; a key already stored is left as it is. Fails,
    /// storing nothing, when one is invalid or implausible (see [`Db::implausible`]) or when
    /// one file names a key twice with different content.
    pub fn insert_observations(&mut self, obs: &[Observation]) -> Result<InsertCount> {
        self.insert_observations_as(obs, false)
    }

    /// [`Db::insert_observations`] for an admin's import (`kace observations import`): the rows
    /// are trusted, part of the reference a new model is checked on (see
    /// `kace_selector::training`). The spool's records, which any job's progress lines shape,
    /// never come in this way. A key already stored keeps its row and its flag.
    pub fn insert_admin_observations(&mut self, obs: &[Observation]) -> Result<InsertCount> {
        self.insert_observations_as(obs, true)
    }

    fn insert_observations_as(
        &mut self,
        obs: &[Observation],
        trusted: bool,
    ) -> Result<InsertCount> {
        let exclusive = self.exclusive_throughputs()?;
        let mut seen: HashMap<&str, &Observation> = HashMap::new();
        for o in obs {
            o.validate()?;
            if let Some(why) = implausibility(o, exclusive.get(&o.workload).copied()) {
                return Err(Error::Invalid { reason: why });
            }
            if let Some(prev) = seen.insert(&o.key, o) {
                if prev != o {
                    return Err(Error::Invalid {
                        reason: format!("observation key {} given twice, differently", o.key),
                    });
                }
            }
        }
        let path = self.path.clone();
        let tx = self.conn.transaction().map_err(sql("begin observation insert", &path))?;
        let mut count = InsertCount::default();
        let t = now();
        for o in obs {
            let wid = Db::workload_id(&tx, &path, &o.workload)?;
            for partner in &o.partners {
                Db::workload_id(&tx, &path, &partner.workload)?;
            }
            let partners = to_json("observation partners", &o.partners)?;
            let mut stmt = tx
                .prepare_cached(
                    "INSERT INTO observations (key, job, workload_id, partners, node, gpu, \
                     mps_share, start_time, end_time, steps, throughput, exclusive, ingested_at, \
                     trusted, user) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15) \
                     ON CONFLICT(key) DO NOTHING",
                )
                .map_err(sql("store observation", &path))?;
            let n = stmt
                .execute(params![
                    o.key,
                    o.job,
                    wid,
                    partners,
                    o.node,
                    o.gpu,
                    o.mps_share,
                    o.start,
                    o.end,
                    o.steps,
                    o.throughput,
                    o.exclusive(),
                    t,
                    trusted,
                    o.user
                ])
                .map_err(sql("store observation", &path))?;
            if n == 1 {
                count.inserted += 1;
            } else {
                count.duplicates += 1;
            }
        }
        tx.commit().map_err(sql("commit observations", &path))?;
        Ok(count)
    }

    /// Each workload's exclusive throughput as an admin measured it (the newest such value):
    /// the plausibility bound of observations. Never kace's own measurements of jobs' alone runs
    /// (sources [`OBSERVED_SOURCE`], [`OOM_SOURCE`]): a user sets those with one run, and moved
    /// the bound with them (the re-audit's H1(b)). A workload only kace measured has none here,
    /// so its observations get [`crate::types::MAX_UNPROFILED_THROUGHPUT`].
    pub fn exclusive_throughputs(&self) -> Result<HashMap<String, f64>> {
        let p = &self.path;
        let mut stmt = self
            .conn
            .prepare(
                "SELECT w.name, p.exclusive_throughput FROM profiles p \
                 JOIN workloads w ON w.id = p.workload_id \
                 WHERE p.exclusive_throughput IS NOT NULL AND p.source NOT IN (?1, ?2) \
                 ORDER BY p.created_at, p.id",
            )
            .map_err(sql("load exclusive throughputs", p))?;
        let rows = stmt
            .query_map([OBSERVED_SOURCE, OOM_SOURCE], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, f64>(1)?))
            })
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
            .map_err(sql("load exclusive throughputs", p))?;
        // Later rows are newer: the last value per workload wins.
        Ok(rows.into_iter().collect())
    }

    /// Why `o` is implausible against its workload's stored exclusive throughput, if it is.
    pub fn implausible(&self, o: &Observation) -> Result<Option<String>> {
        let e = self.exclusive_throughputs()?;
        Ok(implausibility(o, e.get(&o.workload).copied()))
    }

    /// Deletes the stored observations `which` selects; returns how many.
    pub fn remove_observations(&mut self, which: &ObservationFilter) -> Result<usize> {
        let (clause, binds) = filter_sql(which, 1)?;
        self.conn
            .execute(&format!("DELETE FROM observations WHERE {clause}"), params_from_iter(binds))
            .map_err(sql("remove observations", &self.path))
    }

    /// Quarantines the stored observations `which` selects, with `reason`: they stay in the
    /// database for inspection but leave training and listings. Returns how many.
    pub fn quarantine_observations(
        &mut self,
        which: &ObservationFilter,
        reason: &str,
    ) -> Result<usize> {
        // The reason is ?1, the filter's values follow.
        let (clause, mut binds) = filter_sql(which, 2)?;
        binds.insert(0, reason.to_string());
        self.conn
            .execute(
                &format!(
                    "UPDATE observations SET quarantined = ?1 WHERE quarantined IS NULL AND \
                     ({clause})"
                ),
                params_from_iter(binds),
            )
            .map_err(sql("quarantine observations", &self.path))
    }

    /// The quarantined observations' keys and reasons, in key order.
    pub fn quarantined_observations(&self) -> Result<Vec<(String, String)>> {
        let p = &self.path;
        let mut stmt = self
            .conn
            .prepare(
                "SELECT key, quarantined FROM observations WHERE quarantined IS NOT NULL \
                 ORDER BY key",
            )
            .map_err(sql("load quarantined observations", p))?;
        let rows = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .and_then(|rows| rows.collect())
            .map_err(sql("load quarantined observations", p));
        rows
    }

    /// Marks the stored observations `which` selects as trusted (an admin vouches for them):
    /// the groups they form join the reference a new model is checked on. Returns how many
    /// changed.
    pub fn trust_observations(&mut self, which: &ObservationFilter) -> Result<usize> {
        let (clause, binds) = filter_sql(which, 1)?;
        self.conn
            .execute(
                &format!("UPDATE observations SET trusted = 1 WHERE trusted = 0 AND ({clause})"),
                params_from_iter(binds),
            )
            .map_err(sql("trust observations", &self.path))
    }

    /// Whether an observation with this key is stored.
    pub fn has_observation(&self, key: &str) -> Result<bool> {
        self.conn
            .query_row("SELECT 1 FROM observations WHERE key = ?1", [key], |_| Ok(()))
            .optional()
            .map(|o| o.is_some())
            .map_err(sql("look up observation", &self.path))
    }

    /// Number of stored observations.
    pub fn observation_count(&self) -> Result<i64> {
        self.conn
            .query_row("SELECT count(*) FROM observations", [], |r| r.get(0))
            .map_err(sql("count observations", &self.path))
    }

    /// Every stored observation that is not quarantined, in key order.
    pub fn observations(&self) -> Result<Vec<Observation>> {
        Ok(self.stored_observations()?.into_iter().map(|(_, o, _)| o).collect())
    }

    /// [`Db::observations`], each with its row id (what a trained model records as the newest
    /// observation it saw) and whether it is trusted.
    fn stored_observations(&self) -> Result<Vec<(i64, Observation, bool)>> {
        let p = &self.path;
        let mut stmt = self
            .conn
            .prepare(
                "SELECT o.key, o.job, w.name, o.partners, o.node, o.gpu, o.mps_share, \
                 o.start_time, o.end_time, o.steps, o.throughput, o.id, o.trusted, o.user \
                 FROM observations o \
                 JOIN workloads w ON w.id = o.workload_id WHERE o.quarantined IS NULL \
                 ORDER BY o.key",
            )
            .map_err(sql("load observations", p))?;
        let mut rows = stmt.query([]).map_err(sql("load observations", p))?;
        let mut out = Vec::new();
        while let Some(r) = rows.next().map_err(sql("load observations", p))? {
            type Row = (i64, Observation, String, bool);
            let get = |r: &rusqlite::Row<'_>| -> rusqlite::Result<Row> {
                let partners: String = r.get(3)?;
                Ok((
                    r.get(11)?,
                    Observation {
                        key: r.get(0)?,
                        job: r.get(1)?,
                        workload: r.get(2)?,
                        partners: Vec::new(),
                        node: r.get(4)?,
                        gpu: r.get(5)?,
                        mps_share: r.get(6)?,
                        start: r.get(7)?,
                        end: r.get(8)?,
                        steps: r.get(9)?,
                        throughput: r.get(10)?,
                        user: r.get(13)?,
                    },
                    partners,
                    r.get(12)?,
                ))
            };
            let (id, mut o, partners, trusted) = get(r).map_err(sql("load observations", p))?;
            o.partners = json_col(&format!("partners of observation {}", o.key), &partners)?;
            out.push((id, o, trusted));
        }
        Ok(out)
    }

    /// The training examples: groups of observations of k ≥ 2 jobs that ran together, each
    /// naming exactly the others as its partners (by job and workload), over a common interval.
    /// Each observation is used at most once; observations whose partners' own observations
    /// are missing or disagree are left out.
    pub fn observed_groups(&self) -> Result<Vec<ObservedGroup>> {
        let all = self.stored_observations()?;
        let ids: HashMap<&str, (i64, bool)> =
            all.iter().map(|(id, o, t)| (o.key.as_str(), (*id, *t))).collect();
        let shared: Vec<&Observation> =
            all.iter().map(|(_, o, _)| o).filter(|o| !o.partners.is_empty()).collect();
        // Index by job so matching is linear in the number of observations.
        let mut by_job: HashMap<&str, Vec<&Observation>> = HashMap::new();
        for o in &shared {
            by_job.entry(o.job.as_str()).or_default().push(o);
        }
        let mut used: HashSet<&str> = HashSet::new();
        let mut groups = Vec::new();
        for a in &shared {
            if used.contains(a.key.as_str()) {
                continue;
            }
            // The group as `a` sees it: job → workload.
            let mut roster: HashMap<&str, &str> = HashMap::new();
            roster.insert(&a.job, &a.workload);
            for p in &a.partners {
                roster.insert(&p.job, &p.workload);
            }
            if roster.len() != a.partners.len() + 1 {
                continue; // a job named twice: not a group kace can learn from
            }
            // Another member's observation agrees when it names the same jobs with the same
            // workloads, its own included.
            let agrees = |b: &Observation| {
                roster.get(b.job.as_str()) == Some(&b.workload.as_str())
                    && b.partners.len() + 1 == roster.len()
                    && b.partners.iter().all(|q| {
                        q.job != b.job && roster.get(q.job.as_str()) == Some(&q.workload.as_str())
                    })
            };
            let mut members: Vec<&Observation> = vec![a];
            let (mut from, mut to) = (a.start, a.end);
            for p in &a.partners {
                let found = by_job.get(p.job.as_str()).and_then(|obs| {
                    obs.iter().find(|b| {
                        !used.contains(b.key.as_str())
                            && members.iter().all(|m| m.key != b.key)
                            && agrees(b)
                            && b.start <= to
                            && from <= b.end
                    })
                });
                let Some(b) = found else { break };
                from = from.max(b.start);
                to = to.min(b.end);
                members.push(b);
            }
            if members.len() != roster.len() {
                continue;
            }
            for m in &members {
                used.insert(&m.key);
            }
            let row = |m: &Observation| ids.get(m.key.as_str()).copied().unwrap_or_default();
            groups.push(ObservedGroup {
                members: members
                    .iter()
                    .map(|m| ObservedMember {
                        workload: m.workload.clone(),
                        throughput: m.throughput,
                        key: m.key.clone(),
                        id: row(m).0,
                        user: m.user.clone(),
                    })
                    .collect(),
                trusted: members.iter().all(|m| row(m).1),
            });
        }
        Ok(groups)
    }

    // ---- models ----------------------------------------------------------------------------

    /// Stores a new model version (inactive) and returns its version number.
    pub fn insert_model(&mut self, m: &NewModel) -> Result<i64> {
        if m.kind.is_empty() || m.features.is_empty() {
            return Err(Error::Invalid { reason: "model without kind or features".into() });
        }
        let p = self.path.clone();
        self.conn
            .execute(
                "INSERT INTO models (kind, features, normalisation, coefficients, body, metrics, \
                 training_digest, training_size, created_at, active) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, 0)",
                params![
                    m.kind,
                    to_json("model features", &m.features)?,
                    to_json("model normalisation", &m.normalisation)?,
                    to_json("model coefficients", &m.coefficients)?,
                    to_json("model", &m.body)?,
                    to_json("model metrics", &m.metrics)?,
                    m.training_digest,
                    m.training_size as i64,
                    now()
                ],
            )
            .map_err(sql("store model", &p))?;
        Ok(self.conn.last_insert_rowid())
    }

    /// Makes `version` the only active model, atomically.
    pub fn activate_model(&mut self, version: i64) -> Result<()> {
        let p = self.path.clone();
        let tx = self.conn.transaction().map_err(sql("begin model activation", &p))?;
        let exists = tx
            .query_row("SELECT 1 FROM models WHERE version = ?1", [version], |_| Ok(()))
            .optional()
            .map_err(sql("look up model", &p))?;
        if exists.is_none() {
            return Err(Error::NoSuchModel { version });
        }
        tx.execute("UPDATE models SET active = 0 WHERE active = 1", [])
            .map_err(sql("deactivate model", &p))?;
        tx.execute("UPDATE models SET active = 1 WHERE version = ?1", [version])
            .map_err(sql("activate model", &p))?;
        tx.commit().map_err(sql("commit model activation", &p))
    }

    const MODEL_COLS: &'static str = "version, kind, features, normalisation, coefficients, body, \
        metrics, training_digest, training_size, created_at, active";

    fn read_model(&self, row: &rusqlite::Row<'_>) -> Result<ModelRecord> {
        let p = &self.path;
        let g = |row: &rusqlite::Row<'_>| -> rusqlite::Result<_> {
            Ok((
                row.get::<_, i64>(0)?,
                row.get::<_, String>(1)?,
                [
                    row.get::<_, String>(2)?,
                    row.get::<_, String>(3)?,
                    row.get::<_, String>(4)?,
                    row.get::<_, String>(5)?,
                    row.get::<_, String>(6)?,
                ],
                row.get::<_, String>(7)?,
                row.get::<_, i64>(8)?,
                row.get::<_, f64>(9)?,
                row.get::<_, bool>(10)?,
            ))
        };
        let (version, kind, js, digest, size, created_at, active) =
            g(row).map_err(sql("load model", p))?;
        let what = |w: &str| format!("{w} of model {version}");
        Ok(ModelRecord {
            version,
            model: NewModel {
                kind,
                features: json_col(&what("features"), &js[0])?,
                normalisation: json_col(&what("normalisation"), &js[1])?,
                coefficients: json_col(&what("coefficients"), &js[2])?,
                body: json_col(&what("body"), &js[3])?,
                metrics: json_col(&what("metrics"), &js[4])?,
                training_digest: digest,
                training_size: size.max(0) as usize,
            },
            created_at,
            active,
        })
    }

    fn query_models(&self, tail: &str, bind: Option<i64>) -> Result<Vec<ModelRecord>> {
        let p = &self.path;
        let text = format!("SELECT {} FROM models {tail}", Db::MODEL_COLS);
        let mut stmt = self.conn.prepare_cached(&text).map_err(sql("load models", p))?;
        let mut rows = stmt.query(params_from_iter(bind)).map_err(sql("load models", p))?;
        let mut out = Vec::new();
        while let Some(r) = rows.next().map_err(sql("load models", p))? {
            out.push(self.read_model(r)?);
        }
        Ok(out)
    }

    /// Every model version, oldest first.
    pub fn models(&self) -> Result<Vec<ModelRecord>> {
        self.query_models("ORDER BY version", None)
    }

    /// One model version.
    pub fn model(&self, version: i64) -> Result<ModelRecord> {
        self.query_models("WHERE version = ?1", Some(version))?
            .pop()
            .ok_or(Error::NoSuchModel { version })
    }

    /// The active model, if one is.
    pub fn active_model(&self) -> Result<Option<ModelRecord>> {
        Ok(self.query_models("WHERE active = 1", None)?.pop())
    }

    /// The active model's version, kind and body as stored (JSON text), if one is: what every
    /// decision reads. A body is large (a site's every trained workload), so it is decoded once,
    /// straight into the model, not first into a [`ModelRecord`]'s JSON value.
    pub(crate) fn active_model_body(&self) -> Result<Option<(i64, String, String)>> {
        let p = &self.path;
        self.conn
            .prepare_cached("SELECT version, kind, body FROM models WHERE active = 1")
            .and_then(|mut stmt| {
                stmt.query_row([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))).optional()
            })
            .map_err(sql("load the active model", p))
    }

    // ---- decisions -------------------------------------------------------------------------

    /// Records a partner choice made now.
    pub fn insert_decision(&mut self, d: &NewDecision) -> Result<i64> {
        // Without a key there is no conflict: the row is always inserted.
        self.insert_decision_at(None, d, now())?.ok_or_else(|| Error::Invalid {
            reason: "decision without a key was not stored".into(),
        })
    }

    /// Records a spooled partner choice made at `created_at` (Unix seconds) under its spool
    /// `key`, unless that key is stored already: the same record ingested again, or by another
    /// ingest at the same moment (the key is UNIQUE, so the database, not a check before the
    /// insert, decides). A record from before keys (a NULL key) counts as the same when its
    /// lead job and time match. Returns the row id, or `None` for a duplicate.
    pub fn insert_spooled_decision(
        &mut self,
        key: &str,
        d: &NewDecision,
        created_at: f64,
    ) -> Result<Option<i64>> {
        let p = &self.path;
        let seen: bool = self
            .conn
            .query_row(
                "SELECT EXISTS (SELECT 1 FROM decisions WHERE key IS NULL AND lead_job IS ?1 \
                 AND created_at = ?2)",
                params![d.lead_job, created_at],
                |r| r.get(0),
            )
            .map_err(sql("look up decision", p))?;
        if seen {
            return Ok(None);
        }
        self.insert_decision_at(Some(key), d, created_at)
    }

    fn insert_decision_at(
        &mut self,
        key: Option<&str>,
        d: &NewDecision,
        created_at: f64,
    ) -> Result<Option<i64>> {
        crate::types::validate_workload_name(&d.lead_workload)?;
        let n = self
            .conn
            .execute(
                "INSERT INTO decisions (key, lead_job, lead_workload, chosen_workload, \
                 chosen_job, model_version, candidates, created_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) ON CONFLICT(key) DO NOTHING",
                params![
                    key,
                    d.lead_job,
                    d.lead_workload,
                    d.chosen_workload,
                    d.chosen_job,
                    d.model_version,
                    to_json("decision candidates", &d.candidates)?,
                    created_at
                ],
            )
            .map_err(sql("store decision", &self.path))?;
        Ok((n == 1).then(|| self.conn.last_insert_rowid()))
    }

    /// The newest `limit` decisions, newest first.
    pub fn decisions(&self, limit: usize) -> Result<Vec<DecisionRecord>> {
        let p = &self.path;
        let mut stmt = self
            .conn
            .prepare(
                "SELECT id, lead_job, lead_workload, chosen_workload, chosen_job, model_version, \
                 candidates, created_at, key FROM decisions ORDER BY id DESC LIMIT ?1",
            )
            .map_err(sql("load decisions", p))?;
        let mut rows = stmt.query([limit as i64]).map_err(sql("load decisions", p))?;
        let mut out = Vec::new();
        while let Some(r) = rows.next().map_err(sql("load decisions", p))? {
            let g = |r: &rusqlite::Row<'_>| -> rusqlite::Result<_> {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, Option<String>>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, Option<String>>(3)?,
                    r.get::<_, Option<String>>(4)?,
                    r.get::<_, Option<i64>>(5)?,
                    r.get::<_, String>(6)?,
                    r.get::<_, f64>(7)?,
                    r.get::<_, Option<String>>(8)?,
                ))
            };
            let (
                id,
                lead_job,
                lead_workload,
                chosen_workload,
                chosen_job,
                model_version,
                c,
                t,
                key,
            ) = g(r).map_err(sql("load decisions", p))?;
            out.push(DecisionRecord {
                id,
                decision: NewDecision {
                    lead_job,
                    lead_workload,
                    chosen_workload,
                    chosen_job,
                    model_version,
                    candidates: json_col(&format!("candidates of decision {id}"), &c)?,
                },
                created_at: t,
                key,
            });
        }
        Ok(out)
    }
}
