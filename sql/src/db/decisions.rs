//! `Db`'s partner decisions, for `kace explain`.

use super::*;

impl Db {
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
