//! The joiner's SM split chooser as stored: `kace splits train` adds and activates one, the
//! decider reads the active one (issue 33 item 3; `kace_selector::splits` owns the model).

use kace_selector::splits::SplitModel;
use rusqlite::params;

use super::{to_json, Db};
use crate::error::{sql, Error, Result};

/// A stored split chooser.
#[derive(Debug, Clone, PartialEq)]
pub struct SplitModelRecord {
    /// Its version (row id).
    pub version: i64,
    /// The chooser.
    pub model: SplitModel,
    /// What its training measured (JSON: cross-validation's figures, pairs, source).
    pub metrics: serde_json::Value,
    /// When it was stored, Unix seconds.
    pub created_at: f64,
    /// Whether the decider uses it.
    pub active: bool,
}

impl Db {
    /// Stores `model` with `metrics` and makes it the active split chooser (the one before it
    /// stays, inactive); returns its version.
    pub fn insert_split_model(
        &mut self,
        model: &SplitModel,
        metrics: &serde_json::Value,
    ) -> Result<i64> {
        let body = to_json("split model", model)?;
        let metrics = to_json("split model metrics", metrics)?;
        let now = self.now();
        let p = self.path.clone();
        let tx = self.conn.transaction().map_err(sql("begin storing the split model", &p))?;
        tx.execute("UPDATE split_models SET active = 0 WHERE active = 1", [])
            .map_err(sql("deactivate the split model", &p))?;
        tx.execute(
            "INSERT INTO split_models (body, metrics, created_at, active) VALUES (?1, ?2, ?3, 1)",
            params![body, metrics, now],
        )
        .map_err(sql("store the split model", &p))?;
        let version = tx.last_insert_rowid();
        tx.commit().map_err(sql("commit the split model", &p))?;
        Ok(version)
    }

    /// Makes no split chooser active (`kace splits off`): joiners get no share set even where
    /// `[splits] enabled` says so. Returns whether one was active.
    pub fn deactivate_split_models(&mut self) -> Result<bool> {
        let n = self
            .conn
            .execute("UPDATE split_models SET active = 0 WHERE active = 1", [])
            .map_err(sql("deactivate the split model", &self.path))?;
        Ok(n > 0)
    }

    /// The active split chooser, if any.
    pub fn active_split_model(&self) -> Result<Option<SplitModelRecord>> {
        self.split_models(true).map(|mut v| v.pop())
    }

    /// Every stored split chooser, oldest first (only the active one with `active_only`).
    pub fn split_models(&self, active_only: bool) -> Result<Vec<SplitModelRecord>> {
        let p = &self.path;
        let q = if active_only {
            "SELECT version, body, metrics, created_at, active FROM split_models WHERE active = 1"
        } else {
            "SELECT version, body, metrics, created_at, active FROM split_models ORDER BY version"
        };
        let mut stmt = self.conn.prepare(q).map_err(sql("read split models", p))?;
        let rows = stmt
            .query_map([], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, f64>(3)?,
                    r.get::<_, i64>(4)?,
                ))
            })
            .map_err(sql("read split models", p))?;
        let mut out = Vec::new();
        for row in rows {
            let (version, body, metrics, created_at, active) =
                row.map_err(sql("read split models", p))?;
            let json = |what: &str, text: &str| -> Result<serde_json::Value> {
                serde_json::from_str(text).map_err(|source| Error::Json {
                    what: format!("split model {version}'s {what}"),
                    source,
                })
            };
            let model: SplitModel = serde_json::from_value(json("body", &body)?)
                .map_err(|source| Error::Json { what: format!("split model {version}"), source })?;
            out.push(SplitModelRecord {
                version,
                model,
                metrics: json("metrics", &metrics)?,
                created_at,
                active: active == 1,
            });
        }
        Ok(out)
    }
}
