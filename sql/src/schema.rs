//! The schema and its migrations, keyed on `PRAGMA user_version`.
//!
//! Migration `n` (1-based) takes a database from version `n - 1` to `n`. Migrations are only ever
//! appended: a released one is never edited, because sites upgrade from any older version.

/// The schema version this build reads and writes.
pub const CURRENT_VERSION: i64 = MIGRATIONS.len() as i64;

/// Each entry is one migration's SQL, applied in one transaction together with the
/// `user_version` bump, so a failed migration leaves the previous version intact.
pub(crate) const MIGRATIONS: &[&str] = &[
    // 1: the initial schema.
    r#"
CREATE TABLE workloads (
    id          INTEGER PRIMARY KEY,
    name        TEXT NOT NULL UNIQUE,
    created_at  REAL NOT NULL
);

-- One row per measurement; a NULL feature was not measured by that source. The current profile
-- of a workload takes, per feature, the newest non-NULL value (see Db::profiles).
CREATE TABLE profiles (
    id                    INTEGER PRIMARY KEY,
    workload_id           INTEGER NOT NULL REFERENCES workloads(id),
    gpu_model             TEXT NOT NULL,
    source                TEXT NOT NULL,
    created_at            REAL NOT NULL,
    threads               REAL,
    sm_throughput         REAL,
    dram_throughput       REAL,
    memory_throughput     REAL,
    registers             REAL,
    static_shared_memory  REAL,
    exclusive_throughput  REAL,
    sm_pct                REAL,
    mem_pct               REAL,
    memcap_gib            REAL
);
CREATE INDEX profiles_by_workload ON profiles(workload_id, created_at);

-- `key` is the spool record's unique key: ingest inserts each key once, which is what makes
-- re-running it (or running two at once) harmless.
CREATE TABLE observations (
    id           INTEGER PRIMARY KEY,
    key          TEXT NOT NULL UNIQUE,
    job          TEXT NOT NULL,
    workload_id  INTEGER NOT NULL REFERENCES workloads(id),
    partners     TEXT NOT NULL,
    node         TEXT NOT NULL,
    gpu          TEXT NOT NULL,
    mps_share    REAL,
    start_time   REAL NOT NULL,
    end_time     REAL NOT NULL,
    steps        REAL,
    throughput   REAL NOT NULL,
    exclusive    INTEGER NOT NULL CHECK (exclusive IN (0, 1)),
    ingested_at  REAL NOT NULL
);
CREATE INDEX observations_by_job ON observations(job);

CREATE TABLE models (
    version          INTEGER PRIMARY KEY AUTOINCREMENT,
    kind             TEXT NOT NULL,
    features         TEXT NOT NULL,
    normalisation    TEXT NOT NULL,
    coefficients     TEXT NOT NULL,
    body             TEXT NOT NULL,
    metrics          TEXT NOT NULL,
    training_digest  TEXT NOT NULL,
    training_size    INTEGER NOT NULL,
    created_at       REAL NOT NULL,
    active           INTEGER NOT NULL DEFAULT 0 CHECK (active IN (0, 1))
);
-- At most one active model, enforced by SQLite rather than by every writer's care.
CREATE UNIQUE INDEX models_one_active ON models(active) WHERE active = 1;

CREATE TABLE decisions (
    id               INTEGER PRIMARY KEY,
    lead_job         TEXT,
    lead_workload    TEXT NOT NULL,
    chosen_workload  TEXT,
    chosen_job       TEXT,
    model_version    INTEGER,
    candidates       TEXT NOT NULL,
    created_at       REAL NOT NULL
);
"#,
    // 2: decisions stored once per spool key (a UNIQUE key, so two ingests at once cannot both
    // insert one; rows from before have no key), and observations that can be quarantined:
    // kept for inspection, but out of training and out of `observations list`.
    r#"
ALTER TABLE decisions ADD COLUMN key TEXT;
CREATE UNIQUE INDEX decisions_by_key ON decisions(key);
ALTER TABLE observations ADD COLUMN quarantined TEXT;
"#,
    // 3: profile measurements kace makes itself from jobs' alone runs (source `observed`) or
    // after an out-of-memory exit (source `observed-oom`): stored once per spool key, with the
    // job they come from, the sampler readings they rest on and the memory limit the job hit.
    r#"
ALTER TABLE profiles ADD COLUMN key TEXT;
CREATE UNIQUE INDEX profiles_by_key ON profiles(key);
ALTER TABLE profiles ADD COLUMN job TEXT;
ALTER TABLE profiles ADD COLUMN samples INTEGER;
ALTER TABLE profiles ADD COLUMN oom_limit_mib INTEGER;
ALTER TABLE profiles ADD COLUMN alone_seconds REAL;
CREATE INDEX profiles_by_job ON profiles(job);
"#,
    // 4: observations kace may trust (issue 31): the admin's imports, and any the admin marks
    // (`kace observations trust`), and the job's user (what one user alone claims is capped). They are the fixed reference a new model may not get worse
    // on; no job's progress lines set the flag. Rows from before that `observations import`
    // stored from a pair table are recognisable by key and node.
    r#"
ALTER TABLE observations ADD COLUMN trusted INTEGER NOT NULL DEFAULT 0 CHECK (trusted IN (0, 1));
ALTER TABLE observations ADD COLUMN user TEXT;
UPDATE observations SET trusted = 1 WHERE node = 'imported' AND key LIKE 'import/%';
"#,
    // 5: the user whose job a profile measurement kace made came from (issue 31): a workload no
    // admin profiled is bounded by what several users measured, never by one user alone.
    r#"
ALTER TABLE profiles ADD COLUMN user TEXT;
"#,
    // 6: the account an observed job was charged to (issue 29 item 6: `kace report --by
    // account`); rows from before have none.
    r#"
ALTER TABLE observations ADD COLUMN account TEXT;
"#,
    // 7: jobs that failed while sharing a GPU's MPS server, and admins' clearances of the pairs
    // they block (issue 33 item 2; failures.rs).
    r#"
CREATE TABLE gpu_failures (
    id        INTEGER PRIMARY KEY,
    key       TEXT NOT NULL UNIQUE,
    job       TEXT NOT NULL,
    workload  TEXT NOT NULL,
    user      TEXT,
    node      TEXT NOT NULL,
    gpu       TEXT NOT NULL,
    end       REAL NOT NULL,
    exit      TEXT NOT NULL,
    partners  TEXT NOT NULL
);
CREATE INDEX gpu_failures_job ON gpu_failures (job);
CREATE TABLE pair_clearances (
    workload_a  TEXT NOT NULL,
    workload_b  TEXT NOT NULL,
    cleared_at  REAL NOT NULL,
    PRIMARY KEY (workload_a, workload_b)
);
"#,
    // 8: the GPU's energy over an observed interval (issue 33 item 4: `kace report`'s energy
    // per unit of work and what sharing saved), and when the GPU's MPS server logged a fatal
    // fault while a failed job ran (item 2); rows from before have neither.
    r#"
ALTER TABLE observations ADD COLUMN gpu_energy_j REAL;
ALTER TABLE gpu_failures ADD COLUMN mps_fatal_at REAL;
"#,
    // 9: the SM split chooser for joiners (issue 33 item 3, `kace splits train`): the model as
    // JSON, what cross-validation measured, and which one the decider uses (at most one).
    r#"
CREATE TABLE split_models (
    version     INTEGER PRIMARY KEY AUTOINCREMENT,
    body        TEXT NOT NULL,
    metrics     TEXT NOT NULL,
    created_at  REAL NOT NULL,
    active      INTEGER NOT NULL DEFAULT 0 CHECK (active IN (0, 1))
);
CREATE UNIQUE INDEX split_models_one_active ON split_models(active) WHERE active = 1;
"#,
];
