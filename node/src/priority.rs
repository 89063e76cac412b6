//! The priority Slurm would give a held kace job, and the order the decider serves held jobs
//! in. Pure: the factors come from Slurm through [`crate::slurm::Slurm::priority_inputs`].
//!
//! Why kace computes it: the gate holds kace jobs with priority 0, and slurmctld computes no
//! priority for a held job (priority/multifactor's `decay_apply_weighted_factors` skips
//! priority 0; `sprio` lists none). Lab on 22.05.8 with slurmdbd (tests/tests/accounting.rs):
//! a held job shows priority 0 while a `--begin` job beside it keeps its fair-share priority
//! (100000, then 33333 after its user's usage). kace therefore evaluates the multifactor
//! formula (src/plugins/priority/multifactor/priority_multifactor.c, `_get_priority_internal`:
//! the weighted age, fair-share, partition and QOS factors, minus the nice value) from what
//! slurmctld publishes: the weights from `scontrol show config`, each association's fair-share
//! factor from `sshare` (the `FairShare` column is the factor the plugin uses), the QOS
//! priorities from `sacctmgr` and the partitions' `PriorityJobFactor` from `scontrol show
//! partition`, each normalised by its largest value as the plugin does. The job-size, TRES,
//! association and site factors are not modelled; [`PriorityInputs::unmodelled`] names the
//! weights a site set that kace leaves out.

use std::collections::BTreeMap;

use crate::slurm::QueuedJob;

/// The multifactor weights and settings (`scontrol show config`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Weights {
    /// `PriorityWeightAge`.
    pub age: f64,
    /// `PriorityWeightFairshare`.
    pub fairshare: f64,
    /// `PriorityWeightPartition`.
    pub partition: f64,
    /// `PriorityWeightQOS`.
    pub qos: f64,
    /// `PriorityMaxAge`, seconds (Slurm's default is 7 days).
    pub max_age_s: f64,
    /// `PriorityCalcPeriod`, seconds: how often slurmctld recomputes fair-share.
    pub calc_period_s: f64,
    /// Weights kace does not model that the site set above 0 (`PriorityWeightJobSize`, …).
    pub unmodelled: Vec<String>,
}

/// What the estimate needs from Slurm. `weights: None`: Slurm does not run
/// priority/multifactor, and its order is the submission order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PriorityInputs {
    /// The weights, under priority/multifactor.
    pub weights: Option<Weights>,
    /// Each association's fair-share factor, by (account, user).
    pub fairshare: BTreeMap<(String, String), f64>,
    /// Each QOS's priority, normalised by the largest (0 to 1).
    pub qos: BTreeMap<String, f64>,
    /// Each partition's `PriorityJobFactor`, normalised by the largest (0 to 1).
    pub partitions: BTreeMap<String, f64>,
}

impl PriorityInputs {
    /// The weights a site set that the estimate leaves out (empty when none).
    pub fn unmodelled(&self) -> &[String] {
        self.weights.as_ref().map(|w| w.unmodelled.as_slice()).unwrap_or(&[])
    }

    /// How long these inputs stay current, seconds: slurmctld recomputes fair-share once per
    /// `PriorityCalcPeriod`, so reading more often only adds RPCs.
    pub fn fresh_for_s(&self) -> f64 {
        self.weights.as_ref().map(|w| w.calc_period_s).unwrap_or(300.0).max(60.0)
    }
}

/// The priority slurmctld would give `j` at `now` if kace had not held it; `None` without
/// priority/multifactor (Slurm's order is then the submission order, [`order`]).
pub fn estimate(inputs: &PriorityInputs, j: &QueuedJob, now: f64) -> Option<f64> {
    let w = inputs.weights.as_ref()?;
    let since = j.eligible.or(j.submitted).unwrap_or(now);
    let age = if w.max_age_s > 0.0 { ((now - since) / w.max_age_s).clamp(0.0, 1.0) } else { 1.0 };
    let fairshare =
        inputs.fairshare.get(&(j.account.clone(), j.user.clone())).copied().unwrap_or(0.0);
    let qos = inputs.qos.get(&j.qos).copied().unwrap_or(0.0);
    // A job listed in several partitions gets the best of them: it starts in whichever Slurm
    // picks (the plugin keeps one priority per partition, `priority_array`).
    let partition = crate::slurm::split_words(&j.partition)
        .iter()
        .filter_map(|p| inputs.partitions.get(p).copied())
        .fold(0.0, f64::max);
    let p = w.age * age + w.fairshare * fairshare + w.partition * partition + w.qos * qos
        - j.nice as f64;
    // Priority 0 is Slurm's hold; the plugin never goes below 1.
    Some(p.max(1.0))
}

/// The indices of `jobs` in the order Slurm would start them: highest estimated priority
/// first; equal priorities (and every job without priority/multifactor) by submission, then
/// by id.
pub fn order(inputs: &PriorityInputs, jobs: &[&QueuedJob], now: f64) -> Vec<usize> {
    let prio: Vec<Option<f64>> = jobs.iter().map(|j| estimate(inputs, j, now)).collect();
    let mut idx: Vec<usize> = (0..jobs.len()).collect();
    idx.sort_by(|&a, &b| {
        let by_prio = prio[b].unwrap_or(0.0).total_cmp(&prio[a].unwrap_or(0.0));
        let submitted = |i: usize| jobs[i].submitted.unwrap_or(f64::INFINITY);
        by_prio.then(submitted(a).total_cmp(&submitted(b))).then(jobs[a].id.cmp(&jobs[b].id))
    });
    idx
}

/// Reads the priority settings of `scontrol show config` (`Key = Value` lines).
pub fn parse_config(out: &str) -> Option<Weights> {
    let kv: BTreeMap<&str, &str> =
        out.lines().filter_map(|l| l.split_once('=')).map(|(k, v)| (k.trim(), v.trim())).collect();
    if kv.get("PriorityType").copied() != Some("priority/multifactor") {
        return None;
    }
    let num = |k: &str| kv.get(k).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    let secs = |k: &str, default: f64| {
        kv.get(k).and_then(|v| crate::slurm::parse_duration(v)).unwrap_or(default)
    };
    let unmodelled = ["PriorityWeightJobSize", "PriorityWeightAssoc", "PriorityWeightTRES"]
        .iter()
        .filter(|k| match kv.get(**k) {
            // PriorityWeightTRES is a list (`cpu=1000,gres/gpu=2000`), `(null)` when unset.
            Some(v) => !matches!(*v, "" | "0" | "(null)"),
            None => false,
        })
        .map(|k| k.to_string())
        .collect();
    Some(Weights {
        age: num("PriorityWeightAge"),
        fairshare: num("PriorityWeightFairShare"),
        partition: num("PriorityWeightPartition"),
        qos: num("PriorityWeightQOS"),
        max_age_s: secs("PriorityMaxAge", 7.0 * 86400.0),
        calc_period_s: secs("PriorityCalcPeriod", 300.0),
        unmodelled,
    })
}

/// Reads `sshare -n -P -a -o Account,User,FairShare`: each user association's factor (the
/// account lines, with no user, are the tree's inner nodes).
pub fn parse_shares(out: &str) -> BTreeMap<(String, String), f64> {
    out.lines()
        .filter_map(|l| {
            let mut f = l.split('|').map(str::trim);
            let (account, user, fs) = (f.next()?, f.next()?, f.next()?);
            let fs = fs.parse::<f64>().ok().filter(|v| v.is_finite())?;
            (!user.is_empty()).then(|| ((account.to_string(), user.to_string()), fs.max(0.0)))
        })
        .collect()
}

/// `name|value` lines (`sacctmgr -n -P show qos format=Name,Priority`), each value divided
/// by the largest, as slurmctld normalises QOS priorities.
pub fn parse_named_values(out: &str) -> BTreeMap<String, f64> {
    let raw: Vec<(String, f64)> = out
        .lines()
        .filter_map(|l| {
            let (name, v) = l.split_once('|')?;
            let v = v.trim().trim_end_matches('|').parse::<f64>().ok()?;
            Some((name.trim().to_string(), v))
        })
        .filter(|(n, v)| !n.is_empty() && v.is_finite() && *v >= 0.0)
        .collect();
    normalised(raw)
}

/// The `PriorityJobFactor` of each partition in `scontrol -o show partition`, normalised by
/// the largest.
pub fn parse_partitions(out: &str) -> BTreeMap<String, f64> {
    let raw: Vec<(String, f64)> = out
        .lines()
        .filter_map(|l| {
            let fields: BTreeMap<&str, &str> =
                l.split_whitespace().filter_map(|w| w.split_once('=')).collect();
            let name = fields.get("PartitionName")?;
            let factor = fields.get("PriorityJobFactor")?.parse::<f64>().ok()?;
            Some((name.to_string(), factor))
        })
        .filter(|(_, v)| v.is_finite() && *v >= 0.0)
        .collect();
    normalised(raw)
}

fn normalised(raw: Vec<(String, f64)>) -> BTreeMap<String, f64> {
    let max = raw.iter().map(|(_, v)| *v).fold(0.0, f64::max);
    raw.into_iter().map(|(n, v)| (n, if max > 0.0 { v / max } else { 0.0 })).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: u32, user: &str, account: &str, qos: &str, submitted: f64) -> QueuedJob {
        QueuedJob {
            id,
            user: user.into(),
            account: account.into(),
            qos: qos.into(),
            partition: "debug".into(),
            submitted: Some(submitted),
            ..QueuedJob::default()
        }
    }

    fn inputs() -> PriorityInputs {
        PriorityInputs {
            weights: Some(Weights {
                age: 1000.0,
                fairshare: 100000.0,
                partition: 0.0,
                qos: 10000.0,
                max_age_s: 86400.0,
                calc_period_s: 60.0,
                unmodelled: Vec::new(),
            }),
            fairshare: [
                (("heavy".to_string(), "daemon".to_string()), 0.25),
                (("light".to_string(), "nobody".to_string()), 0.75),
            ]
            .into(),
            qos: [("normal".to_string(), 0.0), ("high".to_string(), 1.0)].into(),
            partitions: BTreeMap::new(),
        }
    }

    #[test]
    fn the_estimate_is_the_multifactor_sum() {
        let i = inputs();
        // Half a day old: half the age weight.
        let j = job(1, "nobody", "light", "normal", 0.0);
        assert_eq!(estimate(&i, &j, 43200.0), Some(500.0 + 75000.0));
        let j = QueuedJob { nice: 100, ..job(2, "daemon", "heavy", "high", 0.0) };
        assert_eq!(estimate(&i, &j, 0.0), Some(25000.0 + 10000.0 - 100.0));
        // An unknown association has no share: the factor is 0, and the plugin's floor is 1.
        assert_eq!(estimate(&i, &job(3, "x", "y", "", 0.0), 0.0), Some(1.0));
        assert_eq!(estimate(&PriorityInputs::default(), &j, 0.0), None);
    }

    #[test]
    fn the_order_is_by_priority_then_submission() {
        let i = inputs();
        let a = job(10, "daemon", "heavy", "normal", 0.0);
        let b = job(11, "daemon", "heavy", "normal", 5.0);
        let c = job(12, "nobody", "light", "normal", 9.0);
        assert_eq!(order(&i, &[&a, &b, &c], 10.0), vec![2, 0, 1]);
        // Without multifactor: submission order.
        assert_eq!(order(&PriorityInputs::default(), &[&c, &b, &a], 10.0), vec![2, 1, 0]);
    }

    #[test]
    fn slurms_outputs_are_read() {
        let config = "PriorityType            = priority/multifactor\n\
                      PriorityMaxAge          = 1-00:00:00\n\
                      PriorityCalcPeriod      = 00:01:00\n\
                      PriorityWeightAge       = 1000\n\
                      PriorityWeightFairShare = 100000\n\
                      PriorityWeightJobSize   = 0\n\
                      PriorityWeightTRES      = cpu=100\n";
        let w = parse_config(config).unwrap();
        assert_eq!((w.age, w.max_age_s, w.calc_period_s), (1000.0, 86400.0, 60.0));
        // scontrol spells it `FairShare` (src/api/config_info.c).
        assert_eq!(w.fairshare, 100000.0);
        assert_eq!(w.unmodelled, vec!["PriorityWeightTRES".to_string()]);
        assert!(parse_config("PriorityType = priority/basic\n").is_none());
        let shares = parse_shares(
            "root|||\nroot|root|1.000000\nlight||\nlight|nobody|0.333333\nbad|u|nan\n",
        );
        assert_eq!(shares.len(), 2);
        assert_eq!(shares[&("light".into(), "nobody".into())], 0.333333);
        let qos = parse_named_values("normal|0\nhigh|1000\nodd|x\n");
        assert_eq!((qos["normal"], qos["high"], qos.len()), (0.0, 1.0, 2));
        let parts = parse_partitions(
            "PartitionName=pa AllowGroups=ALL PriorityJobFactor=2 PriorityTier=1\n\
             PartitionName=pb PriorityJobFactor=1\n",
        );
        assert_eq!((parts["pa"], parts["pb"]), (1.0, 0.5));
    }
}
