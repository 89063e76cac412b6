//! `Db`'s model versions: insertion, activation and reading back.

use super::*;

impl Db {
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
    pub fn active_model_record(&self) -> Result<Option<ModelRecord>> {
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
}
