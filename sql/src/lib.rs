//! kace's SQLite store: schema and migrations, typed queries for workloads, profiles,
//! observations, models and decisions, and the observation spool with its exactly-once ingest.
//!
//! # Layout
//! - [`schema`]: the migrations, keyed on `PRAGMA user_version`.
//! - [`db`]: [`Db`], the only place SQL is written.
//! - [`types`]: the records and their validation.
//! - [`spool`]: the epilog's atomic spool files and `ingest`.
//! - [`convert`]: stored models and profiles as the selector's types.
//! - [`training`]: the training set and a training against the store.
//!
//! Readers (the prolog) open with [`Db::open_read_only`]; writers use a rollback journal and a
//! busy timeout, never WAL, because the database may sit on a network file system.

#![warn(missing_docs)]

pub mod convert;
pub mod db;
pub mod error;
pub mod failures;
pub mod profile_table;
pub mod schema;
pub mod spool;
pub mod training;
pub mod types;

pub use db::{CheckReport, Db, InsertCount, Migration, SplitModelRecord, DB_MODE};
pub use error::{Error, Result};
pub use schema::CURRENT_VERSION;
pub use types::*;
