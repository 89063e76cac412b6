//! The site's QOS and association limits as the decider checks them before a release (issue 29
//! item 1): what `sacctmgr` says the limits are, what the pass's listing says is running, and
//! whether one more job would pass them. Pure: `Slurm::site_limits` reads, the decider asks.
//!
//! Modelled, because a kace job is one node with shards: jobs per user (`MaxJobsPU` of a QOS,
//! `MaxJobs` of a user's association), jobs per group (`GrpJobs` of a QOS, of a user's
//! association, of its account's), and the `gres/gpu` and `gres/shard` counts of `MaxTRESPU`
//! and `GrpTRES` (untyped; per node, as kace jobs are). Not modelled (Slurm still enforces
//! them; a released job that waits for one is held again, `dispatch::hold_again`): limits of
//! parent accounts above a job's own, partition QOS, CPU and memory TRES, typed GRES limits,
//! submit and wall-clock limits.

use std::collections::BTreeMap;

/// A GRES count limit or usage: `gres/gpu` and `gres/shard`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Gres {
    /// `gres/gpu`.
    pub gpu: Option<u64>,
    /// `gres/shard`.
    pub shard: Option<u64>,
}

/// One QOS's limits (`None`: no limit).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QosLimits {
    /// `MaxJobsPU`: running jobs per user.
    pub max_jobs_per_user: Option<u64>,
    /// `GrpJobs`: running jobs of the QOS.
    pub grp_jobs: Option<u64>,
    /// `MaxTRESPU`: GRES per user.
    pub max_gres_per_user: Gres,
    /// `GrpTRES`: GRES of the QOS.
    pub grp_gres: Gres,
}

/// One association's limits (`None`: no limit).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AssocLimits {
    /// `MaxJobs`: running jobs of the association.
    pub max_jobs: Option<u64>,
    /// `GrpJobs`: running jobs of the association (an account's: of all its users).
    pub grp_jobs: Option<u64>,
    /// `GrpTRES`: GRES of the association.
    pub grp_gres: Gres,
}

/// The limits slurmctld enforces, as `sacctmgr` gives them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Limits {
    /// Whether slurmctld enforces limits at all (`AccountingStorageEnforce` has `limits`,
    /// `safe` or `qos`... as `limits` does for both associations and QOS).
    pub enforced: bool,
    /// By QOS name.
    pub qos: BTreeMap<String, QosLimits>,
    /// By (account, user); an account's own association has user `""`.
    pub assocs: BTreeMap<(String, String), AssocLimits>,
}

/// A job that counts against limits: running, starting, or released by kace and not started
/// yet (it will count as soon as it starts).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counted {
    /// Its user's name.
    pub user: String,
    /// Its account.
    pub account: String,
    /// Its QOS.
    pub qos: String,
    /// Its GRES (per node).
    pub gres: Gres,
}

/// Jobs, `gres/gpu` and `gres/shard` summed over a group of counted jobs.
type Tally = (u64, u64, u64);

/// What the jobs that count hold, summed each way a limit looks at them (a lookup per check:
/// a pass checks every held job against every GPU it may take).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    /// By (QOS, user), QOS, (account, user) and account.
    qos_user: BTreeMap<(String, String), Tally>,
    qos: BTreeMap<String, Tally>,
    assoc: BTreeMap<(String, String), Tally>,
    account: BTreeMap<String, Tally>,
}

impl Usage {
    /// The usage of `jobs`.
    pub fn of(jobs: Vec<Counted>) -> Usage {
        let mut u = Usage::default();
        for j in jobs {
            u.add(j);
        }
        u
    }

    /// One more job counts (a release this pass).
    pub fn add(&mut self, job: Counted) {
        let (g, s) = (job.gres.gpu.unwrap_or(0), job.gres.shard.unwrap_or(0));
        let bump = |t: &mut Tally| *t = (t.0 + 1, t.1 + g, t.2 + s);
        bump(self.qos_user.entry((job.qos.clone(), job.user.clone())).or_default());
        bump(self.qos.entry(job.qos.clone()).or_default());
        bump(self.assoc.entry((job.account.clone(), job.user)).or_default());
        bump(self.account.entry(job.account).or_default());
    }
}

impl Limits {
    /// Why `job` would wait in Slurm for a limit if it were released now beside `usage`, in
    /// Slurm's reason's words; `None` when it would not (or limits are not enforced).
    pub fn blocks(&self, usage: &Usage, job: &Counted) -> Option<String> {
        if !self.enforced {
            return None;
        }
        let over = |used: u64, add: u64, limit: Option<u64>| limit.is_some_and(|l| used + add > l);
        let tally = |t: Option<&Tally>| t.copied().unwrap_or_default();
        let gres_over = |(_, g, s): Tally, limit: &Gres| {
            over(g, job.gres.gpu.unwrap_or(0), limit.gpu)
                || over(s, job.gres.shard.unwrap_or(0), limit.shard)
        };
        if let Some(q) = self.qos.get(&job.qos) {
            let user = tally(usage.qos_user.get(&(job.qos.clone(), job.user.clone())));
            let all = tally(usage.qos.get(&job.qos));
            if over(user.0, 1, q.max_jobs_per_user) {
                return Some(format!("QOSMaxJobsPerUserLimit (QOS {})", job.qos));
            }
            if over(all.0, 1, q.grp_jobs) {
                return Some(format!("QOSGrpJobsLimit (QOS {})", job.qos));
            }
            if gres_over(user, &q.max_gres_per_user) {
                return Some(format!("QOSMaxGRESPerUser (QOS {})", job.qos));
            }
            if gres_over(all, &q.grp_gres) {
                return Some(format!("QOSGrpGRES (QOS {})", job.qos));
            }
        }
        let key = (job.account.clone(), job.user.clone());
        if let Some(a) = self.assocs.get(&key) {
            let mine = tally(usage.assoc.get(&key));
            if over(mine.0, 1, a.max_jobs) {
                return Some(format!("AssocMaxJobsLimit (account {})", job.account));
            }
            if over(mine.0, 1, a.grp_jobs) {
                return Some(format!("AssocGrpJobsLimit (account {})", job.account));
            }
            if gres_over(mine, &a.grp_gres) {
                return Some(format!("AssocGrpGRES (account {})", job.account));
            }
        }
        if let Some(a) = self.assocs.get(&(job.account.clone(), String::new())) {
            let account = tally(usage.account.get(&job.account));
            if over(account.0, 1, a.grp_jobs) {
                return Some(format!("AssocGrpJobsLimit (account {})", job.account));
            }
            if gres_over(account, &a.grp_gres) {
                return Some(format!("AssocGrpGRES (account {})", job.account));
            }
        }
        None
    }

    /// Whether any limit is set at all (nothing to check otherwise).
    pub fn any(&self) -> bool {
        self.enforced && (!self.qos.is_empty() || !self.assocs.is_empty())
    }
}

/// Whether `AccountingStorageEnforce` (of `scontrol show config`, as
/// [`crate::doctor::parse_show_config`] reads it) enforces limits: `limits` (or `safe`, which
/// implies it) does, for associations and QOS alike.
pub fn enforced(config: &BTreeMap<String, String>) -> bool {
    config
        .get("AccountingStorageEnforce")
        .is_some_and(|v| v.split(',').any(|f| matches!(f.trim(), "limits" | "safe")))
}

/// The `gres/gpu` and `gres/shard` counts of a TRES list (`cpu=4,gres/gpu=2`); typed entries
/// (`gres/gpu:a100=1`) are not modelled.
pub fn parse_tres(tres: &str) -> Gres {
    let mut g = Gres::default();
    for part in tres.split(',') {
        let Some((k, v)) = part.split_once('=') else { continue };
        let Ok(n) = v.trim().parse::<u64>() else { continue };
        match k.trim() {
            "gres/gpu" => g.gpu = Some(n),
            "gres/shard" => g.shard = Some(n),
            _ => {}
        }
    }
    g
}

fn count(v: &str) -> Option<u64> {
    v.trim().parse().ok()
}

/// Reads `sacctmgr -n -P show qos format=Name,MaxJobsPU,GrpJobs,MaxTRESPU,GrpTRES`; QOS
/// without any modelled limit are left out.
pub fn parse_qos(out: &str) -> BTreeMap<String, QosLimits> {
    out.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split('|').collect();
            if f.len() < 5 || f[0].trim().is_empty() {
                return None;
            }
            let q = QosLimits {
                max_jobs_per_user: count(f[1]),
                grp_jobs: count(f[2]),
                max_gres_per_user: parse_tres(f[3]),
                grp_gres: parse_tres(f[4]),
            };
            (q != QosLimits::default()).then(|| (f[0].trim().to_string(), q))
        })
        .collect()
}

/// Reads `sacctmgr -n -P show assoc where cluster=C format=Account,User,Partition,MaxJobs,
/// GrpJobs,GrpTRES`; associations without any modelled limit are left out, and so are
/// per-partition ones (not modelled: a kace job's partition list is its own).
pub fn parse_assocs(out: &str) -> BTreeMap<(String, String), AssocLimits> {
    out.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split('|').collect();
            if f.len() < 6 || f[0].trim().is_empty() || !f[2].trim().is_empty() {
                return None;
            }
            let a = AssocLimits {
                max_jobs: count(f[3]),
                grp_jobs: count(f[4]),
                grp_gres: parse_tres(f[5]),
            };
            (a != AssocLimits::default())
                .then(|| ((f[0].trim().to_string(), f[1].trim().to_string()), a))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(user: &str, account: &str, qos: &str, shards: u64) -> Counted {
        Counted {
            user: user.into(),
            account: account.into(),
            qos: qos.into(),
            gres: Gres { gpu: None, shard: Some(shards) },
        }
    }

    #[test]
    fn sacctmgrs_limits_are_read() {
        let qos =
            parse_qos("normal||||\none|1||gres/shard=4|\ngrp||3|cpu=4|gres/gpu=2,gres/shard=8\n");
        assert_eq!(qos.len(), 2, "{qos:?}");
        assert_eq!(qos["one"].max_jobs_per_user, Some(1));
        assert_eq!(qos["one"].max_gres_per_user.shard, Some(4));
        assert_eq!(qos["grp"].grp_jobs, Some(3));
        assert_eq!(qos["grp"].grp_gres, Gres { gpu: Some(2), shard: Some(8) });
        let assocs = parse_assocs(
            "root||||||\nheavy|||||gres/shard=2\nheavy|daemon||1|||\nlight|bin|pa|1|||\n",
        );
        assert_eq!(assocs.len(), 2, "a per-partition association is not modelled: {assocs:?}");
        assert_eq!(assocs[&("heavy".into(), "".into())].grp_gres.shard, Some(2));
        assert_eq!(assocs[&("heavy".into(), "daemon".into())].max_jobs, Some(1));
        for (conf, want) in [
            ("AccountingStorageEnforce = associations,limits,qos\n", true),
            ("AccountingStorageEnforce = safe\n", true),
            ("AccountingStorageEnforce = associations\n", false),
            ("AccountingStorageEnforce = none\n", false),
            ("", false),
        ] {
            assert_eq!(enforced(&crate::doctor::parse_show_config(conf)), want, "{conf:?}");
        }
        assert_eq!(parse_tres("gres/gpu:a100=1,x"), Gres::default());
    }

    #[test]
    fn a_job_that_would_pass_a_limit_is_named_with_slurms_reason() {
        let mut limits = Limits { enforced: true, ..Limits::default() };
        limits
            .qos
            .insert("one".into(), QosLimits { max_jobs_per_user: Some(1), ..Default::default() });
        limits.assocs.insert(
            ("acct".into(), String::new()),
            AssocLimits { grp_gres: Gres { gpu: None, shard: Some(3) }, ..Default::default() },
        );
        let mut usage = Usage::default();
        assert_eq!(limits.blocks(&usage, &job("alice", "acct", "one", 1)), None);
        usage.add(job("alice", "acct", "one", 1));
        let why = limits.blocks(&usage, &job("alice", "acct", "one", 1)).unwrap();
        assert!(why.starts_with("QOSMaxJobsPerUserLimit"), "{why}");
        // Another user of that QOS is not held back by alice's job ...
        assert_eq!(limits.blocks(&usage, &job("bob", "acct", "one", 1)), None);
        // ... but the account's GrpTRES counts both: 1 + 3 shards > 3.
        let why = limits.blocks(&usage, &job("bob", "acct", "normal", 3)).unwrap();
        assert!(why.starts_with("AssocGrpGRES (account acct)"), "{why}");
        // Not enforced: nothing blocks.
        limits.enforced = false;
        assert_eq!(limits.blocks(&usage, &job("alice", "acct", "one", 1)), None);
        assert!(!limits.any());
    }
}
