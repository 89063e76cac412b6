//! Jobs that failed on a shared MPS server and the pairs they block (see `crate::failures`).

use rusqlite::params;

use super::Db;
use crate::error::{sql, Error, Result};
use crate::failures::{failed_pairs, pair_of, Clearance, FailedPair, GpuFailure};
use crate::types::Partner;

/// Most failure records read to find the blocked pairs: the newest, a few per day on a large
/// site; older ones have long been cleared or superseded.
const FAILURES_READ: i64 = 10_000;

impl Db {
    /// Stores a failure record once per key; `false` when the key was stored before.
    pub fn insert_gpu_failure(&mut self, f: &GpuFailure) -> Result<bool> {
        f.validate()?;
        let partners = serde_json::to_string(&f.partners)
            .map_err(|source| Error::Json { what: format!("failure {}", f.key), source })?;
        let n = self
            .conn
            .execute(
                "INSERT INTO gpu_failures (key, job, workload, user, node, gpu, end, exit, \
                 partners, mps_fatal_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) \
                 ON CONFLICT(key) DO NOTHING",
                params![
                    f.key,
                    f.job,
                    f.workload,
                    f.user,
                    f.node,
                    f.gpu,
                    f.end,
                    f.exit,
                    partners,
                    f.mps_fatal_at
                ],
            )
            .map_err(sql("store failure", &self.path))?;
        Ok(n == 1)
    }

    /// The newest failure records, newest first (at most 10 000).
    pub fn gpu_failures(&self) -> Result<Vec<GpuFailure>> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT key, job, workload, user, node, gpu, end, exit, partners, mps_fatal_at \
                 FROM gpu_failures ORDER BY end DESC, id DESC LIMIT ?1",
            )
            .map_err(sql("read failures", &self.path))?;
        let rows = stmt
            .query_map([FAILURES_READ], |r| {
                let partners: String = r.get(8)?;
                Ok((
                    GpuFailure {
                        key: r.get(0)?,
                        job: r.get(1)?,
                        workload: r.get(2)?,
                        user: r.get(3)?,
                        node: r.get(4)?,
                        gpu: r.get(5)?,
                        end: r.get(6)?,
                        exit: r.get(7)?,
                        partners: Vec::new(),
                        mps_fatal_at: r.get(9)?,
                    },
                    partners,
                ))
            })
            .map_err(sql("read failures", &self.path))?;
        let mut out = Vec::new();
        for row in rows {
            let (mut f, partners) = row.map_err(sql("read failures", &self.path))?;
            f.partners = serde_json::from_str::<Vec<Partner>>(&partners)
                .map_err(|source| Error::Json { what: format!("failure {}", f.key), source })?;
            out.push(f);
        }
        Ok(out)
    }

    /// Admins' clearances of failed pairs.
    pub fn pair_clearances(&self) -> Result<Vec<Clearance>> {
        let mut stmt = self
            .conn
            .prepare("SELECT workload_a, workload_b, cleared_at FROM pair_clearances")
            .map_err(sql("read pair clearances", &self.path))?;
        let rows = stmt
            .query_map([], |r| Ok(Clearance { workloads: (r.get(0)?, r.get(1)?), at: r.get(2)? }))
            .map_err(sql("read pair clearances", &self.path))?;
        rows.collect::<rusqlite::Result<Vec<_>>>().map_err(sql("read pair clearances", &self.path))
    }

    /// The pairs of workloads kace does not pair now ([`failed_pairs`]).
    pub fn failed_pairs(&self) -> Result<Vec<FailedPair>> {
        Ok(failed_pairs(&self.gpu_failures()?, &self.pair_clearances()?))
    }

    /// Clears the pair of `a` and `b` as of `now`: failures before it no longer block it.
    /// Returns whether the pair was blocked.
    pub fn clear_failed_pair(&mut self, a: &str, b: &str, now: f64) -> Result<bool> {
        let (a, b) = pair_of(a, b);
        let was = self.failed_pairs()?.iter().any(|p| p.workloads == (a.clone(), b.clone()));
        self.conn
            .execute(
                "INSERT INTO pair_clearances (workload_a, workload_b, cleared_at) \
                 VALUES (?1, ?2, ?3) ON CONFLICT(workload_a, workload_b) \
                 DO UPDATE SET cleared_at = excluded.cleared_at",
                params![a, b, now],
            )
            .map_err(sql("clear failed pair", &self.path))?;
        Ok(was)
    }
}
