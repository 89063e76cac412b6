//! `Db`'s workloads and profile measurements: admin imports, kace's observed measurements
//! (alone runs, out-of-memory records) and the profiles a decision reads.

use super::*;

impl Db {
    pub(super) fn workload_id(conn: &Connection, path: &Path, name: &str) -> Result<i64> {
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
        let mut observed_memcap: HashMap<String, (f64, Arc<str>, f64)> = HashMap::new();
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
                        let at: f64 = row.get(2).map_err(sql("load profiles", p))?;
                        observed_memcap.insert(name.clone(), (m, source.clone(), at));
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
        let now = self.now();
        for (name, (memcap, source, at)) in observed_memcap {
            if let Some(prof) = out.get_mut(&name) {
                // An out-of-memory raise over an admin's value fades back to it (the re-audit's
                // M1: raises must not stay for ever): half its excess every
                // OOM_RAISE_HALF_LIFE_S, renewed only by a new, sampler-backed raise.
                let admin = prof.values[MEMCAP].filter(|_| {
                    prof.sources[MEMCAP].as_deref().is_some_and(|s| !is_observed_source(s))
                });
                let memcap = match admin {
                    Some(base) if &*source == OOM_SOURCE && memcap > base => {
                        let age = (now - at).max(0.0);
                        base + (memcap - base) * (-age / OOM_RAISE_HALF_LIFE_S).exp2()
                    }
                    _ => memcap,
                };
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
        let head: [&dyn ToSql; 10] = [
            &wid,
            &o.profile.gpu_model,
            &o.profile.source,
            &o.created_at,
            &o.key,
            &o.job,
            &samples,
            &oom_limit,
            &o.alone_seconds,
            &o.user,
        ];
        let n = tx
            .execute(
                &format!(
                    "INSERT INTO profiles (workload_id, gpu_model, source, created_at, key, job, \
                     samples, oom_limit_mib, alone_seconds, user, {cols}) VALUES ({}) \
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
            } else {
                // No admin value: what other users' alone runs agree on bounds it, when at
                // least two of them do (one user's claim bounds nothing, its own least).
                let others: Vec<f64> = self
                    .observed_exclusive_by_user(name)?
                    .into_iter()
                    .filter(|(u, _)| Some(u) != o.user.as_ref())
                    .map(|(_, x)| x)
                    .collect();
                if let Some(e) = corroborated(&others) {
                    if x > MAX_RATIO_TO_EXCLUSIVE * e || x * MAX_RATIO_TO_EXCLUSIVE < e {
                        return Ok(Some(format!(
                            "observed profile {key}: exclusive throughput {x} is more than \
                             {MAX_RATIO_TO_EXCLUSIVE} times off the {e} other users' alone runs \
                             of {name} agree on (no admin profiled it)"
                        )));
                    }
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
                 p.oom_limit_mib, p.alone_seconds, p.user, {cols} FROM profiles p JOIN workloads w ON w.id = p.workload_id \
                 WHERE p.job = ?1 AND p.key IS NOT NULL ORDER BY p.created_at, p.id"
            ))
            .map_err(sql("load profile measurements", p))?;
        let rows = stmt
            .query_map([job], |r| {
                let mut values = [None; FEATURE_COUNT];
                for (i, v) in values.iter_mut().enumerate() {
                    *v = r.get(i + 9)?;
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
                    user: r.get(8)?,
                })
            })
            .and_then(|r| r.collect());
        rows.map_err(sql("load profile measurements", p))
    }
}
