//! The store's error type: one documented variant per way the database or the spool can fail.

use std::fmt;
use std::path::PathBuf;

/// Everything that can go wrong in `kace-sql`.
///
/// Messages are phrased `couldn't <verb> <object>: <cause>` so that a binary can prefix its phase
/// (`kace: ingest: …`) and print the chain unchanged.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The database file does not exist (and the caller did not ask to create it).
    Missing {
        /// The path that was looked for.
        path: PathBuf,
    },
    /// The file exists but SQLite says it is not a database, or its pages are damaged.
    Corrupt {
        /// The database path.
        path: PathBuf,
        /// SQLite's own description.
        cause: String,
    },
    /// The database has no kace schema yet (`PRAGMA user_version` is 0).
    NotInitialised {
        /// The database path.
        path: PathBuf,
    },
    /// The database was written by a newer kace whose schema this build does not know.
    SchemaTooNew {
        /// The database path.
        path: PathBuf,
        /// The schema version found in the file.
        found: i64,
        /// The newest version this build knows.
        supported: i64,
    },
    /// The schema is older than this build; `kace db migrate` brings it up to date.
    SchemaTooOld {
        /// The database path.
        path: PathBuf,
        /// The schema version found in the file.
        found: i64,
        /// The version this build needs.
        needed: i64,
    },
    /// Any other SQLite failure, with what was being done.
    Sqlite {
        /// What the store was doing ("insert observation", "load profiles", …).
        op: &'static str,
        /// The underlying error.
        source: rusqlite::Error,
    },
    /// A JSON column or spool file could not be encoded or decoded.
    Json {
        /// What was being encoded or decoded.
        what: String,
        /// The underlying error.
        source: serde_json::Error,
    },
    /// A value handed to the store breaks one of its rules (bad name, negative throughput, …).
    Invalid {
        /// What was wrong, in words.
        reason: String,
    },
    /// A model version that does not exist was asked for.
    NoSuchModel {
        /// The version asked for.
        version: i64,
    },
    /// No model version is active, so nothing can be predicted.
    NoActiveModel,
    /// A stored model is of a kind or shape this build cannot use.
    BadModel {
        /// Its version.
        version: i64,
        /// What is wrong.
        reason: String,
    },
    /// A file-system operation on the database or spool failed.
    Io {
        /// What was being done ("read spool directory", …).
        op: String,
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A spool or quarantine directory is not one only root can change, so root refuses to
    /// create, rename or remove files in it.
    UntrustedDir(kace_layout::trusted_dir::UntrustedDir),
    /// The training policy failed (a bad setting, or the fit itself).
    Training(kace_selector::training::TrainingError),
}

/// Shorthand for results in this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Missing { path } => write!(
                f,
                "couldn't open database {}: no such file (create it with `kace db init`)",
                path.display()
            ),
            Error::Corrupt { path, cause } => write!(
                f,
                "couldn't read database {}: the file is not a valid kace database ({cause})",
                path.display()
            ),
            Error::NotInitialised { path } => write!(
                f,
                "couldn't use database {}: it has no kace schema (run `kace db init`)",
                path.display()
            ),
            Error::SchemaTooNew { path, found, supported } => write!(
                f,
                "couldn't use database {}: schema version {found} is newer than this kace \
                 supports ({supported}); upgrade kace",
                path.display()
            ),
            Error::SchemaTooOld { path, found, needed } => write!(
                f,
                "couldn't use database {}: schema version {found} is older than {needed} \
                 (run `kace db migrate`)",
                path.display()
            ),
            Error::Sqlite { op, source } => write!(f, "couldn't {op}: {source}"),
            Error::Json { what, source } => write!(f, "couldn't decode {what}: {source}"),
            Error::Invalid { reason } => write!(f, "{reason}"),
            Error::NoSuchModel { version } => {
                write!(f, "couldn't find model version {version}: no such version")
            }
            Error::NoActiveModel => {
                write!(f, "couldn't find an active model (train one with `kace train`)")
            }
            Error::BadModel { version, reason } => {
                write!(f, "couldn't use model version {version}: {reason}")
            }
            Error::Io { op, path, source } => {
                write!(f, "couldn't {op} {}: {source}", path.display())
            }
            Error::UntrustedDir(e) => write!(f, "couldn't use a spool directory: {e}"),
            Error::Training(e) => write!(f, "couldn't train a model: {e}"),
        }
    }
}

// The Display of every variant already contains its cause; returning it again as a `source`
// would print it twice in an anyhow chain, so there is none.
impl std::error::Error for Error {}

/// Wraps a rusqlite error with the operation that failed, turning "not a database" and
/// "malformed" into [`Error::Corrupt`] so that callers can tell damage from other failures.
pub(crate) fn sql(op: &'static str, path: &std::path::Path) -> impl Fn(rusqlite::Error) -> Error {
    let path = path.to_path_buf();
    move |source| {
        if let rusqlite::Error::SqliteFailure(e, msg) = &source {
            if matches!(
                e.code,
                rusqlite::ErrorCode::NotADatabase | rusqlite::ErrorCode::DatabaseCorrupt
            ) {
                return Error::Corrupt {
                    path: path.clone(),
                    cause: msg.clone().unwrap_or_else(|| e.to_string()),
                };
            }
        }
        Error::Sqlite { op, source }
    }
}
