//! `Db`'s observations: insertion with the plausibility rules, quarantine and trust, and the
//! observed groups training reads.

use super::*;

impl Db {
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
        let bounds = self.bounds()?;
        let mut seen: HashMap<&str, &Observation> = HashMap::new();
        for o in obs {
            o.validate()?;
            if let Some(why) =
                implausibility(o, bounds.get(&o.workload).copied().unwrap_or_default())
            {
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
                     trusted, user, account, gpu_energy_j) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, \
                     ?16, ?17) \
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
                    o.user,
                    o.account,
                    o.gpu_energy_j
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

    /// Each user's newest exclusive throughput of `workload` from kace's alone-run
    /// measurements (source `observed`), as `(user, value)`; measurements without a user (made
    /// before migration 5) are not counted.
    pub fn observed_exclusive_by_user(&self, workload: &str) -> Result<Vec<(String, f64)>> {
        Ok(self
            .observed_exclusive_by_workload_and_user(Some(workload))?
            .remove(workload)
            .unwrap_or_default())
    }

    /// [`Db::observed_exclusive_by_user`] for one workload, or for every workload in one read.
    fn observed_exclusive_by_workload_and_user(
        &self,
        workload: Option<&str>,
    ) -> Result<HashMap<String, Vec<(String, f64)>>> {
        let p = &self.path;
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT w.name, p.user, p.exclusive_throughput FROM profiles p \
                 JOIN workloads w ON w.id = p.workload_id \
                 WHERE (?1 IS NULL OR w.name = ?1) AND p.source = ?2 AND p.user IS NOT NULL \
                 AND p.exclusive_throughput IS NOT NULL ORDER BY p.created_at DESC, p.id DESC",
            )
            .map_err(sql("load observed exclusive throughputs", p))?;
        let rows = stmt
            .query_map(params![workload, OBSERVED_SOURCE], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, f64>(2)?))
            })
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
            .map_err(sql("load observed exclusive throughputs", p))?;
        // Rows come newest first: the first of each workload and user is its newest.
        let mut out: HashMap<String, Vec<(String, f64)>> = HashMap::new();
        let mut seen = HashSet::new();
        for (w, u, x) in rows {
            if seen.insert((w.clone(), u.clone())) {
                out.entry(w).or_default().push((u, x));
            }
        }
        Ok(out)
    }

    /// The exclusive throughput each workload's observations are bounded by: the admin's
    /// ([`Db::exclusive_throughputs`]), or for a workload no admin profiled, what at least two
    /// users' alone runs agree on ([`corroborated`]). A workload in neither has no bound of
    /// its own ([`crate::MAX_UNPROFILED_THROUGHPUT`] applies).
    pub fn exclusive_bounds(&self) -> Result<HashMap<String, f64>> {
        let mut out = self.exclusive_throughputs()?;
        for (name, per_user) in self.observed_exclusive_by_workload_and_user(None)? {
            if out.contains_key(&name) {
                continue;
            }
            let values: Vec<f64> = per_user.into_iter().map(|(_, x)| x).collect();
            if let Some(e) = corroborated(&values) {
                out.insert(name, e);
            }
        }
        Ok(out)
    }

    /// What each workload's observations are judged by ([`implausibility`]): its bound
    /// ([`Db::exclusive_bounds`]) and its current profile's SM utilization alone.
    pub fn bounds(&self) -> Result<HashMap<String, Bound>> {
        let mut out: HashMap<String, Bound> = self
            .exclusive_bounds()?
            .into_iter()
            .map(|(w, e)| (w, Bound { exclusive: Some(e), sm_pct: None }))
            .collect();
        for (w, p) in self.all_profiles(None)? {
            if let Some(sm) = p.values[SM_PCT] {
                out.entry(w).or_default().sm_pct = Some(sm);
            }
        }
        Ok(out)
    }

    /// Why `o` is implausible against what kace knows of its workload ([`Db::bounds`]), if
    /// it is.
    pub fn implausible(&self, o: &Observation) -> Result<Option<String>> {
        let b = self.bounds()?;
        Ok(implausibility(o, b.get(&o.workload).copied().unwrap_or_default()))
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
                 o.start_time, o.end_time, o.steps, o.throughput, o.id, o.trusted, o.user, \
                 o.account, o.gpu_energy_j FROM observations o \
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
                        account: r.get(14)?,
                        gpu_sm_pct: None,
                        gpu_energy_j: r.get(15)?,
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
                        end: m.end,
                    })
                    .collect(),
                trusted: members.iter().all(|m| row(m).1),
            });
        }
        Ok(groups)
    }
}
