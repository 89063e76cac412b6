//! The observation spool: the epilog writes one JSON file per observation (write, fsync, rename,
//! fsync the directory), and `ingest` moves them into the database exactly once.
//!
//! Exactly once holds because the database stores each observation `key` once (a UNIQUE column)
//! and a file is removed only after the transaction that stored it has committed. A crash between
//! commit and removal, a re-run, or two ingests running at once therefore only meet keys that are
//! already stored, which change nothing. A file that cannot be read as an observation is moved to
//! the quarantine directory next to a `.reason` file: nothing is dropped silently.
//!
//! The prolog's partner decisions travel the same way, in the `decisions/` sub-directory (the
//! prolog opens the database read-only): [`write_decision`] and [`ingest_decisions`]. A
//! decision is stored once per key, so re-ingesting changes nothing either.
//!
//! Profile measurements the epilog makes from a job's alone intervals (and out-of-memory
//! records of the memory guard) travel in `profiles/`: [`write_profile`], [`ingest_profiles`].
//!
//! This module owns the spool's whole life cycle, for every record kind: keys
//! ([`observation_key`], [`decision_key`]), writing, listing and reading, ingest, quarantine
//! (and taking back a quarantined file that was only half copied), and [`prune`].

use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::db::Db;
use crate::error::{Error, Result};
use crate::failures::GpuFailure;
use crate::types::{implausibility, NewDecision, Observation, ObservedProfile};

/// Suffix of a complete spool record.
pub const RECORD_SUFFIX: &str = ".json";

/// Largest observation file accepted; a real record is a few hundred bytes.
pub const MAX_RECORD_BYTES: u64 = 64 * 1024;

/// Largest decision file accepted and written. A decision lists every held candidate (about 90
/// bytes each, compact), so a lead with thousands of held jobs writes a large one; beyond this
/// the candidates that were not evaluated are left out of the record (see [`write_decision`]).
pub const MAX_DECISION_BYTES: u64 = 1024 * 1024;

/// The key of one observation: `<cluster>/<job>/<run>/<segment>`, where `<run>` is the run's
/// start in Unix milliseconds. A job id that recurs (`scontrol requeue`, a reset id counter)
/// therefore keeps every run's observations instead of the later run replacing the earlier.
pub fn observation_key(cluster: &str, job: &str, run_start: f64, segment: usize) -> String {
    format!("{cluster}/{job}/{}/{segment}", run_millis(run_start))
}

/// The key of a lead's decision: `<cluster>/<job>/<run>/<node>/decision` (see
/// [`observation_key`]; the node tells apart the prologs of a multi-node job).
pub fn decision_key(cluster: &str, job: &str, node: &str, run_start: f64) -> String {
    release_key(ReleaseKind::Lead, cluster, job, node, run_start)
}

/// The key of a decision record of `kind`: `<cluster>/<job>/<time>/<node>/<suffix>`. For the
/// hooks' kinds `<job>` is the job whose prolog or epilog decided and `<time>` its run's
/// start; for dispatch's, the released job and the release time.
pub fn release_key(kind: ReleaseKind, cluster: &str, job: &str, node: &str, at: f64) -> String {
    format!("{cluster}/{job}/{}/{node}/{}", run_millis(at), kind.suffix())
}

/// Who made a decision record, which says how the job it names left kace's hold. The kind is
/// the last part of the record's key, so the records of every kind share one table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ReleaseKind {
    /// A starting job's prolog chose a partner for its GPU (`…/decision`).
    Lead,
    /// An ending job's epilog chose a new partner for the jobs it left (`…/refill`).
    Refill,
    /// Dispatch offered a held job to an open GPU and the decision chose it (`…/join`).
    LateArrival,
    /// Dispatch released a job held longer than `max_hold` where it fits (`…/max_hold`): onto
    /// a free GPU (the record's lead is the job itself) or an open one (the record's chosen job).
    MaxHold,
    /// Dispatch released the oldest held job as a lead onto a free GPU (`…/lead_release`; its
    /// prolog's own decision follows under `…/decision`).
    LeadRelease,
    /// The decider handed a held job back to Slurm unpinned, asking for a whole GPU
    /// (`…/hand_back`): kace could not place it within the site's policies, or not within
    /// `max_hold`. The record's candidate names why (`rejected`).
    HandBack,
}

impl ReleaseKind {
    /// Every kind, in a fixed order (for counting).
    pub const ALL: [ReleaseKind; 6] = [
        ReleaseKind::Lead,
        ReleaseKind::Refill,
        ReleaseKind::LateArrival,
        ReleaseKind::MaxHold,
        ReleaseKind::LeadRelease,
        ReleaseKind::HandBack,
    ];

    /// The last part of its records' keys.
    pub fn suffix(self) -> &'static str {
        match self {
            ReleaseKind::Lead => "decision",
            ReleaseKind::Refill => "refill",
            ReleaseKind::LateArrival => "join",
            ReleaseKind::MaxHold => "max_hold",
            ReleaseKind::LeadRelease => "lead_release",
            ReleaseKind::HandBack => "hand_back",
        }
    }

    /// Its name in metrics labels and JSON.
    pub fn name(self) -> &'static str {
        match self {
            ReleaseKind::Lead => "lead",
            ReleaseKind::Refill => "refill",
            ReleaseKind::LateArrival => "late_arrival",
            ReleaseKind::MaxHold => "max_hold",
            ReleaseKind::LeadRelease => "lead_release",
            ReleaseKind::HandBack => "hand_back",
        }
    }

    /// The kind of a record from its key; keys of other shapes (and rows from before keys were
    /// stored) are a prolog's decision, the only kind there was then.
    pub fn of_key(key: Option<&str>) -> ReleaseKind {
        let last = key.and_then(|k| k.rsplit('/').next()).unwrap_or("");
        ReleaseKind::ALL.into_iter().find(|k| k.suffix() == last).unwrap_or(ReleaseKind::Lead)
    }

    /// Whether a prolog or an epilog made it (dispatch's own releases are also in its log).
    pub fn by_hook(self) -> bool {
        matches!(self, ReleaseKind::Lead | ReleaseKind::Refill)
    }

    /// Whether the one decision function ranked candidates for it (dispatch's releases onto
    /// free GPUs rank nothing: they record the release and the hold).
    pub fn decides(self) -> bool {
        matches!(self, ReleaseKind::Lead | ReleaseKind::Refill | ReleaseKind::LateArrival)
    }
}

fn run_millis(t: f64) -> i64 {
    // `as` saturates; a non-finite start (never written by kace) becomes 0.
    if t.is_finite() {
        (t * 1000.0).round() as i64
    } else {
        0
    }
}

/// Mode of spool, decision and quarantine files: they name users' jobs and workloads, which
/// other users need not see (root and the admin group read them).
pub const FILE_MODE: u32 = 0o640;

/// Mode of the directories the spool creates (`decisions/`, the quarantine).
pub const DIR_MODE: u32 = 0o750;

/// Records stored per transaction: large enough to amortise the commit's fsyncs, small enough
/// that a prolog waiting for the lock is not held up for long.
const BATCH: usize = 256;

fn io_err(op: &str, path: &Path) -> impl FnOnce(std::io::Error) -> Error {
    let (op, path) = (op.to_string(), path.to_path_buf());
    move |source| Error::Io { op, path, source }
}

/// FNV-1a, 64 bits: a stable, dependency-free hash to keep sanitised file names unique.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3))
}

/// The file name of a record: the key made safe for a file name, plus a hash of the exact key
/// so that two keys that sanitise alike cannot overwrite each other.
pub fn record_file_name(key: &str) -> String {
    let safe: String = key
        .chars()
        .take(100)
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_') { c } else { '_' })
        .collect();
    format!("{safe}-{:016x}{RECORD_SUFFIX}", fnv1a(key.as_bytes()))
}

fn sync_dir(dir: &Path) -> Result<()> {
    // Makes the rename itself durable: without it a power cut can lose the directory entry.
    File::open(dir).and_then(|d| d.sync_all()).map_err(io_err("sync spool directory", dir))
}

/// Writes one observation into `dir` atomically: readers see either no file or a complete one.
/// Writing the same key again replaces the file with identical content.
pub fn write_record(dir: &Path, obs: &Observation) -> Result<PathBuf> {
    obs.validate()?;
    trusted(dir)?;
    let body = serde_json::to_vec_pretty(obs)
        .map_err(|source| Error::Json { what: format!("observation {}", obs.key), source })?;
    write_atomic(dir, &record_file_name(&obs.key), &body)
}

/// Suffix of an observation parked outside the spool (see [`write_or_park`]).
pub const PARKED_SUFFIX: &str = ".parked.json";

/// Suffix of a profile measurement parked outside the spool (see [`write_or_park`]).
pub const PARKED_PROFILE_SUFFIX: &str = ".parked-profile.json";

/// A record a node writes into the spool, which [`write_or_park`] parks outside it while the
/// spool cannot take it: an observation, a profile measurement or a decision.
pub trait Parkable: serde::Serialize + serde::de::DeserializeOwned {
    /// The suffix of its parked files.
    const PARKED_SUFFIX: &'static str;
    /// Largest parked file read back.
    const MAX_BYTES: u64 = MAX_RECORD_BYTES;
    /// Its unique key.
    fn key(&self) -> &str;
    /// Writes it into the spool, checking it as ingest will.
    fn spool(&self, spool: &Path) -> Result<PathBuf>;
    /// Its parked file's content.
    fn body(&self) -> Result<Vec<u8>> {
        serde_json::to_vec(self)
            .map_err(|source| Error::Json { what: format!("record {}", self.key()), source })
    }
}

/// Suffix of a failure record parked outside the spool (see [`write_or_park`]).
pub const PARKED_FAILURE_SUFFIX: &str = ".parked-failure.json";

impl Parkable for GpuFailure {
    const PARKED_SUFFIX: &'static str = PARKED_FAILURE_SUFFIX;
    fn key(&self) -> &str {
        &self.key
    }
    fn spool(&self, spool: &Path) -> Result<PathBuf> {
        write_failure(spool, self)
    }
}

/// Suffix of a decision parked outside the spool (see [`write_or_park`]).
pub const PARKED_DECISION_SUFFIX: &str = ".parked-decision.json";

/// Decisions are parked like observations (the re-audit's L4: on a full or read-only spool the
/// observations were kept and the decisions lost).
impl Parkable for SpooledDecision {
    const PARKED_SUFFIX: &'static str = PARKED_DECISION_SUFFIX;
    const MAX_BYTES: u64 = MAX_DECISION_BYTES;
    fn key(&self) -> &str {
        &self.key
    }
    fn spool(&self, spool: &Path) -> Result<PathBuf> {
        write_decision(spool, self)
    }
    fn body(&self) -> Result<Vec<u8>> {
        validate_decision(self)?;
        compact_decision(self)
    }
}

impl Parkable for Observation {
    const PARKED_SUFFIX: &'static str = PARKED_SUFFIX;
    fn key(&self) -> &str {
        &self.key
    }
    fn spool(&self, spool: &Path) -> Result<PathBuf> {
        write_record(spool, self)
    }
}

impl Parkable for ObservedProfile {
    const PARKED_SUFFIX: &'static str = PARKED_PROFILE_SUFFIX;
    fn key(&self) -> &str {
        &self.key
    }
    fn spool(&self, spool: &Path) -> Result<PathBuf> {
        write_profile(spool, self)
    }
}

/// Where [`write_or_park`] put a record.
#[derive(Debug)]
pub enum Written {
    /// In the spool, as usual.
    Spooled(PathBuf),
    /// Parked, because the spool could not take it (`cause`).
    Parked {
        /// The parked file.
        path: PathBuf,
        /// Why the spool could not take it.
        cause: Error,
    },
}

/// Writes `record` into `spool`; when that fails (a full spool), parks it in `park` instead, a
/// root-owned directory on the node (the progress root), from which [`unpark`] moves it into
/// the spool later. An error only when neither worked (then the record is lost) or the record
/// is invalid.
pub fn write_or_park<R: Parkable>(spool: &Path, park: &Path, record: &R) -> Result<Written> {
    match record.spool(spool) {
        Ok(p) => Ok(Written::Spooled(p)),
        Err(Error::Invalid { reason }) => Err(Error::Invalid { reason }),
        Err(cause) => {
            trusted(park)?;
            let body = record.body()?;
            let name = record_file_name(record.key()).replace(RECORD_SUFFIX, R::PARKED_SUFFIX);
            let path = write_atomic(park, &name, &body)?;
            Ok(Written::Parked { path, cause })
        }
    }
}

/// Moves the observations, profile measurements and decisions parked in `park` into `spool`; returns how
/// many moved. Stops at the first that cannot be written (the spool is still full): the rest
/// stay parked for the next call.
pub fn unpark(park: &Path, spool: &Path) -> Result<usize> {
    Ok(unpark_kind::<Observation>(park, spool)?
        + unpark_kind::<ObservedProfile>(park, spool)?
        + unpark_kind::<SpooledDecision>(park, spool)?
        + unpark_kind::<GpuFailure>(park, spool)?)
}

fn unpark_kind<R: Parkable>(park: &Path, spool: &Path) -> Result<usize> {
    let entries = match fs::read_dir(park) {
        Ok(e) => e,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(io_err("read parked records", park)(e)),
    };
    let mut parked: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            !name.starts_with('.') && name.ends_with(R::PARKED_SUFFIX)
        })
        .map(|e| e.path())
        .collect();
    parked.sort();
    let mut moved = 0;
    for p in parked {
        let record = match read_bounded(&p, R::MAX_BYTES)? {
            None => continue,
            Some(Ok(buf)) => serde_json::from_slice::<R>(&buf).ok(),
            Some(Err(_)) => None,
        };
        // Only kace parks here; anything unreadable is left for the admin, not deleted.
        let Some(record) = record else { continue };
        record.spool(spool)?;
        fs::remove_file(&p).map_err(io_err("remove parked record", &p))?;
        moved += 1;
    }
    Ok(moved)
}

/// Sub-directory of the spool that holds decision records.
pub const DECISIONS_DIR: &str = "decisions";

/// A decision record as the prolog, the epilog or dispatch spools it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpooledDecision {
    /// Unique key (see [`release_key`]; its last part is the [`ReleaseKind`]).
    pub key: String,
    /// Unix seconds when the decision was made.
    pub created_at: f64,
    /// What was decided.
    pub decision: NewDecision,
}

/// Checks what ingest will check of a decision record.
fn validate_decision(d: &SpooledDecision) -> Result<()> {
    crate::types::validate_workload_name(&d.decision.lead_workload)?;
    if d.key.is_empty() || d.key.len() > crate::types::MAX_KEY_LEN || !d.created_at.is_finite() {
        return Err(Error::Invalid { reason: format!("decision key {:?} or time is bad", d.key) });
    }
    Ok(())
}

/// Writes a decision record into `<spool>/decisions/` atomically, creating that directory.
///
/// The record is compact JSON. One still larger than [`MAX_DECISION_BYTES`] (tens of thousands
/// of held candidates) is stored compacted rather than lost: the chosen candidate and those with
/// a prediction stay, and as many of the rest as fit; `kace explain` then finds the lead and the
/// candidates kept.
pub fn write_decision(spool: &Path, d: &SpooledDecision) -> Result<PathBuf> {
    validate_decision(d)?;
    let dir = spool.join(DECISIONS_DIR);
    create_dir(&dir).map_err(io_err("create decision spool", &dir))?;
    trusted(&dir)?;
    let body = compact_decision(d)?;
    write_atomic(&dir, &record_file_name(&d.key), &body)
}

/// Removes the record of a decision that was written before its release and whose release then
/// failed (the decider records first, so that a crash between the two loses nothing). A record
/// already ingested, or never written, is not there: nothing to do.
pub fn withdraw_decision(spool: &Path, key: &str) -> Result<()> {
    let path = spool.join(DECISIONS_DIR).join(record_file_name(key));
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_err("remove the withdrawn decision", &path)(e)),
    }
}

fn compact_decision(d: &SpooledDecision) -> Result<Vec<u8>> {
    let json = |d: &SpooledDecision| {
        serde_json::to_vec(d)
            .map_err(|source| Error::Json { what: format!("decision {}", d.key), source })
    };
    let body = json(d)?;
    // The trailing newline write_atomic adds counts too.
    if (body.len() as u64) < MAX_DECISION_BYTES {
        return Ok(body);
    }
    let mut kept = d.clone();
    let chosen = d.decision.chosen_job.as_deref();
    kept.decision
        .candidates
        .sort_by_key(|c| (c.job.is_none() || c.job.as_deref() != chosen, c.prediction.is_none()));
    let mut n = kept.decision.candidates.len();
    loop {
        n /= 2;
        kept.decision.candidates.truncate(n.max(1));
        let body = json(&kept)?;
        if (body.len() as u64) < MAX_DECISION_BYTES || n <= 1 {
            return Ok(body);
        }
    }
}

/// The decision records still in `<spool>/decisions/` (not yet ingested), in file-name order;
/// unreadable ones come back as the reason. A missing directory is an empty spool.
pub fn spooled_decisions(
    spool: &Path,
) -> Result<Vec<(PathBuf, std::result::Result<SpooledDecision, String>)>> {
    let dir = spool.join(DECISIONS_DIR);
    let entries = match fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err("read decision spool", &dir)(e)),
    };
    let mut paths: Vec<PathBuf> = Vec::new();
    for entry in entries {
        let entry = entry.map_err(io_err("read decision spool", &dir))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with('.') && name.ends_with(RECORD_SUFFIX) {
            paths.push(entry.path());
        }
    }
    paths.sort();
    let mut out = Vec::new();
    for p in paths {
        let read = match read_bounded(&p, MAX_DECISION_BYTES)? {
            None => continue,
            Some(Err(why)) => Err(why),
            Some(Ok(buf)) => parse_decision(&buf),
        };
        out.push((p, read));
    }
    Ok(out)
}

/// A decision record that parses and passes the checks ingest makes, or why not.
fn parse_decision(buf: &[u8]) -> std::result::Result<SpooledDecision, String> {
    let d = serde_json::from_slice::<SpooledDecision>(buf)
        .map_err(|e| format!("not a valid decision record: {e}"))?;
    validate_decision(&d).map_err(|e| e.to_string())?;
    Ok(d)
}

/// Moves the decision records of `<spool>/decisions/` into `db` (see [`ingest`]). A record
/// that cannot be stored (one that parses but fails validation, say from another kace version)
/// is quarantined like one that does not parse: it never blocks the records after it.
pub fn ingest_decisions(db: &mut Db, spool: &Path, quarantine_dir: &Path) -> Result<IngestReport> {
    let mut report = IngestReport::default();
    let dir = spool.join(DECISIONS_DIR);
    if dir.is_dir() {
        trusted(&dir)?;
        for entry in fs::read_dir(&dir).map_err(io_err("read decision spool", &dir))?.flatten() {
            if is_stale_temp(&entry) {
                report.stale_temp_files.push(entry.path());
            }
        }
        report.stale_temp_files.sort();
    }
    for (path, read) in spooled_decisions(spool)? {
        let stored = match read {
            Err(why) => Err(why),
            Ok(d) => match db.insert_spooled_decision(&d.key, &d.decision, d.created_at) {
                Ok(inserted) => Ok(inserted),
                Err(Error::Invalid { reason }) => Err(reason),
                // The database, not the record, failed: keep the file for the next run.
                Err(e) => return Err(e),
            },
        };
        report.settle(path, stored.map(|inserted| inserted.is_some()), quarantine_dir)?;
    }
    Ok(report)
}

/// Sub-directory of the spool that holds profile measurements (see [`write_profile`]).
pub const PROFILES_DIR: &str = "profiles";

/// The key of a job's profile measurement: `<cluster>/<job>/<run>/<node>/profile` (see
/// [`observation_key`]).
pub fn profile_key(cluster: &str, job: &str, node: &str, run_start: f64) -> String {
    format!("{cluster}/{job}/{}/{node}/profile", run_millis(run_start))
}

/// Writes a profile measurement into `<spool>/profiles/` atomically, creating that directory.
pub fn write_profile(spool: &Path, p: &ObservedProfile) -> Result<PathBuf> {
    p.validate()?;
    write_in(spool, PROFILES_DIR, "profile", &p.key, p)
}

/// Writes a checked record of kind `what` into `<spool>/<sub>/` atomically, creating that
/// directory.
fn write_in<T: serde::Serialize>(
    spool: &Path,
    sub: &str,
    what: &str,
    key: &str,
    record: &T,
) -> Result<PathBuf> {
    let dir = spool.join(sub);
    create_dir(&dir).map_err(io_err("create spool directory", &dir))?;
    trusted(&dir)?;
    let body = serde_json::to_vec(record)
        .map_err(|source| Error::Json { what: format!("{what} {key}"), source })?;
    write_atomic(&dir, &record_file_name(key), &body)
}

/// A record of kind `what` that parses and passes `validate` (the checks ingest makes), or
/// why not.
fn parse_valid<T: serde::de::DeserializeOwned>(
    buf: &[u8],
    what: &str,
    validate: fn(&T) -> Result<()>,
) -> std::result::Result<T, String> {
    let r =
        serde_json::from_slice::<T>(buf).map_err(|e| format!("not a valid {what} record: {e}"))?;
    validate(&r).map_err(|e| e.to_string())?;
    Ok(r)
}

fn parse_profile(buf: &[u8]) -> std::result::Result<ObservedProfile, String> {
    parse_valid(buf, "profile", ObservedProfile::validate)
}

/// The profile measurements still in `<spool>/profiles/` (not yet ingested) that parse, in
/// file-name order (for `kace explain`; ingest quarantines the others).
pub fn spooled_profiles(spool: &Path) -> Result<Vec<ObservedProfile>> {
    let dir = spool.join(PROFILES_DIR);
    let entries = match fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err("read profile spool", &dir)(e)),
    };
    let mut paths: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            !name.starts_with('.') && name.ends_with(RECORD_SUFFIX)
        })
        .collect();
    paths.sort();
    let mut out = Vec::new();
    for p in paths {
        if let Some(Ok(buf)) = read_bounded(&p, MAX_RECORD_BYTES)? {
            out.extend(parse_profile(&buf).ok());
        }
    }
    Ok(out)
}

/// How far an observation's end may lie beyond this host's clock at ingest: more is a clock
/// step on the node whose epilog wrote it (the re-audit's M2), not a measurement.
pub const MAX_CLOCK_AHEAD_S: f64 = 300.0;

/// Why `o` cannot be stored at time `now`: it ends in the future (`None`: it does not).
pub fn future_end(o: &Observation, now: f64) -> Option<String> {
    (o.end > now + MAX_CLOCK_AHEAD_S).then(|| {
        format!(
            "observation {}: it ends at {:.0}, {:.0} s after this host's clock ({now:.0}): the \
             clock of node {} was ahead when its epilog ran (or this host's is behind)",
            o.key,
            o.end,
            o.end - now,
            crate::types::quote_untrusted(&o.node)
        )
    })
}

/// Moves the profile measurements of `<spool>/profiles/` into `db`, each key once (see
/// [`ingest`]); a record that does not parse or validate goes to quarantine with its reason.
pub fn ingest_profiles(db: &mut Db, spool: &Path, quarantine_dir: &Path) -> Result<IngestReport> {
    ingest_subdir(db, &spool.join(PROFILES_DIR), quarantine_dir, parse_profile, |db, p| {
        db.insert_observed_profile(p)
    })
}

/// Sub-directory of the spool that holds failures on a shared server (see [`write_failure`]).
pub const FAILURES_DIR: &str = "failures";

/// The key of a job's failure record: `<cluster>/<job>/<run>/<node>/failure`.
pub fn failure_key(cluster: &str, job: &str, node: &str, run_start: f64) -> String {
    format!("{cluster}/{job}/{}/{node}/failure", run_millis(run_start))
}

/// Writes a failure record into `<spool>/failures/` atomically, creating that directory.
pub fn write_failure(spool: &Path, f: &GpuFailure) -> Result<PathBuf> {
    f.validate()?;
    write_in(spool, FAILURES_DIR, "failure", &f.key, f)
}

fn parse_failure(buf: &[u8]) -> std::result::Result<GpuFailure, String> {
    parse_valid(buf, "failure", GpuFailure::validate)
}

/// Moves the failure records of `<spool>/failures/` into `db`, each key once (as
/// [`ingest_profiles`]).
pub fn ingest_failures(db: &mut Db, spool: &Path, quarantine_dir: &Path) -> Result<IngestReport> {
    ingest_subdir(db, &spool.join(FAILURES_DIR), quarantine_dir, parse_failure, |db, f| {
        db.insert_gpu_failure(f)
    })
}

/// What [`ingest_all`] stored, by kind of record.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Ingested {
    /// Profile measurements.
    pub profiles: IngestReport,
    /// Observations.
    pub observations: IngestReport,
    /// The deciders' decisions.
    pub decisions: IngestReport,
    /// Failures on a shared MPS server.
    pub failures: IngestReport,
}

/// Moves every kind of record of the spool into `db`: profile measurements first (a new
/// workload's observed exclusive throughput is then known when its observations are judged for
/// plausibility), then observations, decisions and failures.
pub fn ingest_all(db: &mut Db, spool: &Path, quarantine_dir: &Path) -> Result<Ingested> {
    Ok(Ingested {
        profiles: ingest_profiles(db, spool, quarantine_dir)?,
        observations: ingest(db, spool, quarantine_dir)?,
        decisions: ingest_decisions(db, spool, quarantine_dir)?,
        failures: ingest_failures(db, spool, quarantine_dir)?,
    })
}

/// The one loop over a record sub-directory of the spool: each record read bounded, parsed
/// and stored once per key; a refused one quarantined with its reason; a database error stops
/// the run and keeps the file for the next.
fn ingest_subdir<T>(
    db: &mut Db,
    dir: &Path,
    quarantine_dir: &Path,
    parse: fn(&[u8]) -> std::result::Result<T, String>,
    store: impl Fn(&mut Db, &T) -> Result<bool>,
) -> Result<IngestReport> {
    let mut report = IngestReport::default();
    if !dir.is_dir() {
        return Ok(report);
    }
    trusted(dir)?;
    let mut paths: Vec<PathBuf> = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_err("read spool", dir))? {
        let entry = entry.map_err(io_err("read spool", dir))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            if is_stale_temp(&entry) {
                report.stale_temp_files.push(entry.path());
            }
        } else if name.ends_with(RECORD_SUFFIX) {
            paths.push(entry.path());
        }
    }
    paths.sort();
    for path in paths {
        let stored = match read_bounded(&path, MAX_RECORD_BYTES)? {
            None => {
                report.vanished += 1;
                continue;
            }
            Some(Err(why)) => Err(why),
            Some(Ok(buf)) => match parse(&buf) {
                Err(why) => Err(why),
                Ok(record) => match store(db, &record) {
                    Ok(inserted) => Ok(inserted),
                    Err(Error::Invalid { reason }) => Err(reason),
                    // The database, not the record, failed: keep the file for the next run.
                    Err(e) => return Err(e),
                },
            },
        };
        report.settle(path, stored, quarantine_dir)?;
    }
    Ok(report)
}

impl IngestReport {
    /// A record the store refused goes to the quarantine with its reason (or counts as vanished
    /// when another ingest took it first).
    fn refuse(&mut self, path: PathBuf, reason: String, quarantine_dir: &Path) -> Result<()> {
        if quarantine(&path, quarantine_dir, &reason)? {
            self.quarantined.push((path, reason));
        } else {
            self.vanished += 1;
        }
        Ok(())
    }

    /// Settles one record by what storing it gave: stored, or stored before (either way the
    /// file goes), or refused with a reason.
    fn settle(
        &mut self,
        path: PathBuf,
        stored: std::result::Result<bool, String>,
        quarantine_dir: &Path,
    ) -> Result<()> {
        match stored {
            Err(reason) => self.refuse(path, reason, quarantine_dir),
            Ok(inserted) => {
                if inserted {
                    self.inserted += 1;
                } else {
                    self.duplicates += 1;
                }
                remove_ingested(&[path])
            }
        }
    }
}

/// The one bounded reader of spool records: at most `limit` bytes of a regular file, opened
/// without following a symlink. `None` when it vanished; `Some(Err)` when it is not something
/// to read.
fn read_bounded(path: &Path, limit: u64) -> Result<Option<std::result::Result<Vec<u8>, String>>> {
    // Opened without following a symlink and without blocking on a FIFO, then checked by the
    // descriptor: nothing can be swapped in between a check by path and the open.
    let mut f = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Ok(Some(Err("not a regular file (a symlink)".into())))
        }
        Err(e) => return Err(io_err("open spool record", path)(e)),
    };
    let meta = f.metadata().map_err(io_err("inspect spool record", path))?;
    if !meta.file_type().is_file() {
        return Ok(Some(Err("not a regular file".into())));
    }
    let mut buf = Vec::new();
    // Reading one byte past the limit tells "too large" from "exactly at the limit".
    Read::by_ref(&mut f)
        .take(limit + 1)
        .read_to_end(&mut buf)
        .map_err(io_err("read spool record", path))?;
    if buf.len() as u64 > limit {
        return Ok(Some(Err(format!("larger than {limit} bytes"))));
    }
    Ok(Some(Ok(buf)))
}

/// Writes `body` to `dir/name` atomically (temporary file, fsync, rename, fsync the directory).
fn write_atomic(dir: &Path, name: &str, body: &[u8]) -> Result<PathBuf> {
    let tmp = dir.join(format!(".tmp.{}.{name}", std::process::id()));
    let dest = dir.join(name);
    let write = || -> std::io::Result<()> {
        let mut f = OpenOptions::new().write(true).create_new(true).mode(FILE_MODE).open(&tmp)?;
        f.write_all(body)?;
        f.write_all(b"\n")?;
        f.sync_all()
    };
    if let Err(e) = write() {
        let _ = fs::remove_file(&tmp);
        return Err(io_err("write spool record", &tmp)(e));
    }
    fs::rename(&tmp, &dest).map_err(io_err("publish spool record", &dest))?;
    sync_dir(dir)?;
    Ok(dest)
}

/// What one ingest run did.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct IngestReport {
    /// Observations newly stored.
    pub inserted: usize,
    /// Records whose key was already stored (removed from the spool, DB unchanged).
    pub duplicates: usize,
    /// Files moved to quarantine, with the reason.
    pub quarantined: Vec<(PathBuf, String)>,
    /// Files that another ingest took between listing and reading.
    pub vanished: usize,
    /// Temporary files older than [`STALE_TEMP`]: writes that never completed (the writer
    /// died before its rename). They are left for the admin to inspect.
    pub stale_temp_files: Vec<PathBuf>,
    /// Files quarantined unparsed earlier that parse now (a copy that was not complete yet),
    /// moved back into the spool to be ingested.
    pub requeued: Vec<PathBuf>,
    /// Hidden files (`.*`, not kace's `.tmp.*`): not kace's records, left where they are and
    /// reported.
    pub hidden: Vec<PathBuf>,
}

/// Age after which a `.tmp.*` file in the spool is reported as an abandoned write.
pub const STALE_TEMP: std::time::Duration = std::time::Duration::from_secs(3600);

/// Whether a spool entry is a `.tmp.*` write older than [`STALE_TEMP`]: its writer died before
/// the rename.
fn is_stale_temp(entry: &fs::DirEntry) -> bool {
    let age = entry.metadata().ok().and_then(|m| m.modified().ok()).and_then(|t| t.elapsed().ok());
    entry.file_name().to_string_lossy().starts_with(".tmp.") && age.is_some_and(|a| a > STALE_TEMP)
}

enum Read1 {
    Record(Box<Observation>),
    Bad(String),
    Gone,
}

fn read_record(path: &Path) -> Result<Read1> {
    let buf = match read_bounded(path, MAX_RECORD_BYTES)? {
        None => return Ok(Read1::Gone),
        Some(Err(why)) => return Ok(Read1::Bad(why)),
        Some(Ok(buf)) => buf,
    };
    let obs: Observation = match serde_json::from_slice(&buf) {
        Ok(o) => o,
        Err(e) => return Ok(Read1::Bad(format!("not a valid observation record: {e}"))),
    };
    if let Err(e) = obs.validate() {
        return Ok(Read1::Bad(e.to_string()));
    }
    Ok(Read1::Record(Box::new(obs)))
}

/// Refuses, when running as root, a directory that someone other than root could change:
/// root creates, renames and removes files there.
fn trusted(dir: &Path) -> Result<()> {
    if kace_layout::trusted_dir::running_as_root() {
        kace_layout::trusted_dir::check_trusted_dir(dir).map_err(Error::UntrustedDir)?;
    }
    Ok(())
}

/// Creates `dir` and its missing parents with [`DIR_MODE`].
fn create_dir(dir: &Path) -> std::io::Result<()> {
    fs::DirBuilder::new().recursive(true).mode(DIR_MODE).create(dir)
}

fn quarantine(path: &Path, qdir: &Path, reason: &str) -> Result<bool> {
    create_dir(qdir).map_err(io_err("create quarantine directory", qdir))?;
    trusted(qdir)?;
    let name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    let dest = qdir.join(&name);
    let mut reason_name = name;
    reason_name.push(".reason");
    let reason_path = qdir.join(reason_name);
    // The reason goes first so that a file in quarantine always has one.
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(FILE_MODE)
        .open(&reason_path)
        .and_then(|mut f| f.write_all(format!("{reason}\n").as_bytes()))
        .map_err(io_err("write quarantine reason", &reason_path))?;
    match fs::rename(path, &dest) {
        Ok(()) => Ok(true),
        // Another ingest quarantined it first.
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io_err("move file to quarantine", path)(e)),
    }
}

/// Reason prefixes of records quarantined because they did not parse. Such a file may have been
/// caught while it was still being copied in; once it parses, it goes back to the spool.
const UNPARSED: [&str; 3] =
    ["not a valid observation record", "not a valid decision record", "not a valid profile record"];

/// Moves quarantined files that were quarantined unparsed and now parse back into the spool
/// (observations) or its `decisions/` directory, with their `.reason` removed: a half-copied
/// file completes inside the quarantine, and would otherwise never be ingested.
fn requeue_completed(spool: &Path, qdir: &Path, report: &mut IngestReport) -> Result<()> {
    let entries = match fs::read_dir(qdir) {
        Ok(e) => e,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_err("read quarantine directory", qdir)(e)),
    };
    let mut names: Vec<PathBuf> = Vec::new();
    for entry in entries {
        let entry = entry.map_err(io_err("read quarantine directory", qdir))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(RECORD_SUFFIX) && !name.starts_with('.') {
            names.push(entry.path());
        }
    }
    names.sort();
    for path in names {
        let mut reason_path = path.clone().into_os_string();
        reason_path.push(".reason");
        let reason_path = PathBuf::from(reason_path);
        let Ok(reason) = fs::read_to_string(&reason_path) else { continue };
        if !UNPARSED.iter().any(|p| reason.starts_with(p)) {
            continue;
        }
        let Some(Ok(buf)) = read_bounded(&path, MAX_DECISION_BYTES)? else { continue };
        let dest_dir = if serde_json::from_slice::<Observation>(&buf)
            .is_ok_and(|o| o.validate().is_ok() && buf.len() as u64 <= MAX_RECORD_BYTES)
        {
            spool.to_path_buf()
        } else if parse_decision(&buf).is_ok() {
            spool.join(DECISIONS_DIR)
        } else if parse_profile(&buf).is_ok() {
            spool.join(PROFILES_DIR)
        } else {
            continue;
        };
        create_dir(&dest_dir).map_err(io_err("create spool directory", &dest_dir))?;
        let dest = dest_dir.join(path.file_name().unwrap_or_default());
        match fs::rename(&path, &dest) {
            Ok(()) => {
                let _ = fs::remove_file(&reason_path);
                report.requeued.push(dest);
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(io_err("move file back from quarantine", &path)(e)),
        }
    }
    Ok(())
}

fn remove_ingested(paths: &[PathBuf]) -> Result<()> {
    for p in paths {
        match fs::remove_file(p) {
            Ok(()) => {}
            // Another ingest removed it after storing the same key: fine.
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(io_err("remove ingested spool record", p)(e)),
        }
    }
    Ok(())
}

/// Stores a batch and then, only after its transaction committed, removes its files: a crash
/// in between leaves files whose keys are stored, which the next run counts as duplicates.
fn flush(
    db: &mut Db,
    batch: &mut Vec<(PathBuf, Observation)>,
    report: &mut IngestReport,
) -> Result<()> {
    if batch.is_empty() {
        return Ok(());
    }
    let obs: Vec<Observation> = batch.iter().map(|(_, o)| o.clone()).collect();
    let n = db.insert_observations(&obs)?;
    report.inserted += n.inserted;
    report.duplicates += n.duplicates;
    let paths: Vec<PathBuf> = batch.drain(..).map(|(p, _)| p).collect();
    remove_ingested(&paths)
}

/// Moves every record in `spool` into `db`, quarantining bad files in `quarantine_dir`.
///
/// Files whose names start with `.` are writes in progress and are left alone (old `.tmp.*`
/// ones are reported); sub-directories are ignored. Records are taken in file-name order.
pub fn ingest(db: &mut Db, spool: &Path, quarantine_dir: &Path) -> Result<IngestReport> {
    // (path, is a regular file)
    let mut entries: Vec<(PathBuf, bool)> = Vec::new();
    let mut report = IngestReport::default();
    trusted(spool)?;
    requeue_completed(spool, quarantine_dir, &mut report)?;
    // Plausibility is judged against the profiles as they are when the ingest starts.
    let bounds = db.bounds()?;
    for entry in fs::read_dir(spool).map_err(io_err("read spool directory", spool))? {
        let entry = entry.map_err(io_err("read spool directory", spool))?;
        let ft = match entry.file_type() {
            Ok(ft) => ft,
            Err(e) if e.kind() == ErrorKind::NotFound => continue,
            Err(e) => return Err(io_err("inspect spool entry", &entry.path())(e)),
        };
        let name = entry.file_name().to_string_lossy().into_owned();
        if ft.is_dir() {
            continue;
        }
        if name.starts_with(".tmp.") {
            if is_stale_temp(&entry) {
                report.stale_temp_files.push(entry.path());
            }
            continue;
        }
        if name.starts_with('.') {
            // Never written by kace (its temporary files are `.tmp.*`), nor moved: it may be
            // the file system's (NFS's `.nfs*` of a file still open) or an admin's. Said at
            // each ingest, not skipped in silence for ever (the re-audit's L10).
            report.hidden.push(entry.path());
            continue;
        }
        entries.push((entry.path(), ft.is_file()));
    }
    entries.sort();
    report.hidden.sort();

    let mut batch: Vec<(PathBuf, Observation)> = Vec::new();
    for (path, regular) in entries {
        let is_record = path.to_string_lossy().ends_with(RECORD_SUFFIX);
        // Symlinks, FIFOs and the like are never written by the epilog; following them as
        // root could read anything, so they go to quarantine unread.
        let read = if !regular {
            Read1::Bad("not a regular file".into())
        } else if is_record {
            read_record(&path)?
        } else {
            Read1::Bad(format!("not a spool record (name does not end in {RECORD_SUFFIX})"))
        };
        match read {
            Read1::Gone => report.vanished += 1,
            Read1::Bad(reason) => report.refuse(path, reason, quarantine_dir)?,
            Read1::Record(obs) => {
                if let Some(reason) = future_end(&obs, crate::db::now()) {
                    report.refuse(path, reason, quarantine_dir)?;
                    continue;
                }
                let bound = bounds.get(&obs.workload).copied().unwrap_or_default();
                if let Some(reason) = implausibility(&obs, bound) {
                    report.refuse(path, reason, quarantine_dir)?;
                    continue;
                }
                batch.push((path, *obs));
                if batch.len() >= BATCH {
                    flush(db, &mut batch, &mut report)?;
                }
            }
        }
    }
    flush(db, &mut batch, &mut report)?;
    Ok(report)
}

// ---- pruning --------------------------------------------------------------------------------

/// What one prune did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PruneReport {
    /// Files removed.
    pub removed: Vec<PathBuf>,
    /// Files that were old enough but could not be removed, with the reason. Reported, not
    /// fatal: a file left behind costs disk space, not correctness.
    pub failed: Vec<(PathBuf, String)>,
}

/// Which files may go, by directory: in the quarantine everything, in the spool and its
/// `decisions/` only the abandoned temporary writes (`.tmp.<pid>.<name>`, see [`write_atomic`]).
#[derive(Debug, Clone, Copy)]
enum Keep {
    Nothing,
    RecordsAndLiveWrites,
}

/// Removes files older than `keep` (by modification time, relative to `now`) from `quarantine`
/// and abandoned writes from `spool`, its `decisions/` and its `profiles/`, and old release
/// tickets from its `released/` ([`kace_layout::release_ticket`]). Quarantined
/// files (each with its `.reason`) are kept that long for the admin to look at; records waiting
/// to be ingested are never touched. A missing directory has nothing to prune.
pub fn prune(
    spool: &Path,
    quarantine: &Path,
    keep: std::time::Duration,
    now: std::time::SystemTime,
) -> PruneReport {
    let mut report = PruneReport::default();
    let cutoff = now.checked_sub(keep).unwrap_or(std::time::SystemTime::UNIX_EPOCH);
    prune_dir(quarantine, Keep::Nothing, cutoff, &mut report);
    prune_dir(spool, Keep::RecordsAndLiveWrites, cutoff, &mut report);
    prune_dir(&spool.join(DECISIONS_DIR), Keep::RecordsAndLiveWrites, cutoff, &mut report);
    prune_dir(&spool.join(PROFILES_DIR), Keep::RecordsAndLiveWrites, cutoff, &mut report);
    // The decider's release tickets its prologs did not use (a job cancelled before it started).
    let tickets = spool.join(kace_layout::release_ticket::DIR);
    prune_dir(&tickets, Keep::Nothing, cutoff, &mut report);
    report.removed.sort();
    report
}

fn prune_dir(dir: &Path, keep: Keep, cutoff: std::time::SystemTime, report: &mut PruneReport) {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == ErrorKind::NotFound => return,
        Err(e) => {
            report.failed.push((dir.to_path_buf(), format!("couldn't list it: {e}")));
            return;
        }
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if matches!(keep, Keep::RecordsAndLiveWrites) && !name.starts_with(".tmp.") {
            continue;
        }
        // Only plain files: a sub-directory or link here was put by someone else, for a reason.
        let Ok(meta) = entry.path().symlink_metadata() else { continue };
        if !meta.file_type().is_file() {
            continue;
        }
        let Ok(mtime) = meta.modified() else { continue };
        if mtime >= cutoff {
            continue;
        }
        let path = entry.path();
        match fs::remove_file(&path) {
            Ok(()) => report.removed.push(path),
            // Another prune or an admin got there first.
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => report.failed.push((path, e.to_string())),
        }
    }
}

#[cfg(test)]
mod prune_tests {
    use super::*;
    use std::fs::File;
    use std::time::{Duration, SystemTime};

    const DAY: Duration = Duration::from_secs(86_400);

    fn file(dir: &Path, name: &str, age: Duration, now: SystemTime) -> PathBuf {
        let p = dir.join(name);
        fs::write(&p, "x").unwrap();
        File::options().write(true).open(&p).unwrap().set_modified(now - age).unwrap();
        p
    }

    #[test]
    fn removes_old_quarantine_and_abandoned_writes_only() {
        let root = kace_test_support::TempDir::new("prune");
        let (spool, q) = (root.join("spool"), root.join("q"));
        fs::create_dir_all(&spool).unwrap();
        fs::create_dir_all(q.join("sub")).unwrap();
        let now = SystemTime::now();
        let old_q = file(&q, "a.json", 40 * DAY, now);
        let old_reason = file(&q, "a.json.reason", 40 * DAY, now);
        let new_q = file(&q, "b.json", DAY, now);
        let old_tmp = file(&spool, ".tmp.12.c.json", 40 * DAY, now);
        let new_tmp = file(&spool, ".tmp.13.d.json", DAY, now);
        // An abandoned decision write is pruned too.
        fs::create_dir_all(spool.join(DECISIONS_DIR)).unwrap();
        let old_decision_tmp = file(&spool.join(DECISIONS_DIR), ".tmp.14.f.json", 40 * DAY, now);
        // An old record not yet ingested is data, never pruned.
        let old_record = file(&spool, "e.json", 40 * DAY, now);
        // A release ticket no prolog used goes; a recent one stays.
        let tickets = spool.join(kace_layout::release_ticket::DIR);
        fs::create_dir_all(&tickets).unwrap();
        let old_ticket = file(&tickets, "17", 40 * DAY, now);
        let new_ticket = file(&tickets, "18", DAY, now);

        let r = prune(&spool, &q, 30 * DAY, now);
        assert_eq!(r.failed, vec![]);
        let mut want = vec![
            old_q.clone(),
            old_reason.clone(),
            old_tmp.clone(),
            old_decision_tmp.clone(),
            old_ticket.clone(),
        ];
        want.sort();
        let mut got = r.removed.clone();
        got.sort();
        assert_eq!(got, want);
        for p in [&old_q, &old_reason, &old_tmp] {
            assert!(!p.exists(), "{} should be gone", p.display());
        }
        for p in [&new_q, &new_tmp, &old_record, &new_ticket] {
            assert!(p.exists(), "{} should stay", p.display());
        }
        assert!(q.join("sub").is_dir());
    }

    #[test]
    fn missing_directories_have_nothing_to_prune() {
        let none = Path::new("/nonexistent/kace-prune");
        assert_eq!(prune(none, none, DAY, SystemTime::now()), PruneReport::default());
    }
}

#[cfg(test)]
mod read_tests {
    use super::*;

    /// Every record kind goes through this one reader: a symlink or a FIFO is refused by the
    /// descriptor (no check by path it could race), a file over the limit is named, a vanished
    /// one is gone, and exactly the limit is read.
    #[test]
    fn the_bounded_reader_refuses_links_fifos_and_oversized_files() {
        let d = kace_test_support::TempDir::new("spool-read");
        fs::write(d.join("ok.json"), "12345").unwrap();
        assert_eq!(read_bounded(&d.join("ok.json"), 5).unwrap(), Some(Ok(b"12345".to_vec())));
        let over = read_bounded(&d.join("ok.json"), 4).unwrap();
        assert_eq!(over, Some(Err("larger than 4 bytes".to_string())));
        assert_eq!(read_bounded(&d.join("gone.json"), 5).unwrap(), None);
        std::os::unix::fs::symlink(d.join("ok.json"), d.join("link.json")).unwrap();
        let link = read_bounded(&d.join("link.json"), 5).unwrap();
        assert_eq!(link, Some(Err("not a regular file (a symlink)".to_string())));
        let fifo = std::ffi::CString::new(d.join("fifo.json").to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let fifo = read_bounded(&d.join("fifo.json"), 5).unwrap();
        assert_eq!(fifo, Some(Err("not a regular file".to_string())));
        // The observation reader is the same reader.
        assert!(matches!(read_record(&d.join("link.json")).unwrap(), Read1::Bad(_)));
        assert!(matches!(read_record(&d.join("gone.json")).unwrap(), Read1::Gone));
    }
}
