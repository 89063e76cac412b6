//! Scoring choices against the oracle: per-target results, their means, and fit quality.
//! The two protocols live in [`paper`] (the artifact's, exactly) and [`colocations`] (any data);
//! [`splits`] evaluates the SM split chooser on raw MPS sweeps.

pub mod colocations;
pub mod paper;
pub mod run;
pub mod splits;

pub use crate::tuning::Folds;
pub use run::{EvalOptions, ModelChoice, Protocol, KACE};

use std::collections::BTreeMap;

use crate::dataset::Group;
use crate::features::{Feature, FEATURE_COUNT};
use crate::policy::{argmax_first, rule_name, rule_pick, Objective};

/// Report key of the paper's linear model.
pub const KACE_LR: &str = "kace-lr";
/// Report key of the oracle (always 1.0 after normalisation).
pub const ORACLE: &str = "oracle";
/// Report key of the random policy's expectation.
pub const RANDOM: &str = "random";
/// Report key of the paper's "best rule": per target, the best of random, sm%, memcap and mem%.
pub const BEST_RULE: &str = "best-rule";

/// How one policy did for one target workload in one run, normalised by the oracle.
#[derive(Debug, Clone, PartialEq)]
pub struct TargetResult {
    /// The target (high-priority) workload.
    pub target: String,
    /// The seed of the run.
    pub seed: u32,
    /// Number of candidate groups the target had.
    pub candidates: usize,
    /// The oracle's objective value (the best candidate's).
    pub oracle: f64,
    /// Policy key → objective of its pick / oracle.
    pub normalised: BTreeMap<String, f64>,
    /// kace's decisions in normalised progress, when kace was evaluated.
    pub progress: Option<ProgressOutcome>,
}

/// One target's decisions measured in normalised progress (Σ colocated / exclusive), where 1 is
/// what the jobs achieve one after the other: below 1 a pair is harmful.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProgressOutcome {
    /// kace's pick without the gain rule.
    pub plain: f64,
    /// kace's pick with the gain rule; `None`: it chose no partner.
    pub gated: Option<f64>,
    /// The best candidate's.
    pub best: f64,
}

/// Squared error and R² of a model's predictions, in z-scored target units.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FitQuality {
    /// Mean squared error.
    pub mse: f64,
    /// Coefficient of determination.
    pub r2: f64,
}

impl FitQuality {
    /// Compares predictions with truth.
    pub fn of(truth: &[f64], predicted: &[f64]) -> FitQuality {
        let n = truth.len().max(1) as f64;
        let mean = truth.iter().sum::<f64>() / n;
        let sse: f64 = truth.iter().zip(predicted).map(|(t, p)| (t - p) * (t - p)).sum();
        let sst: f64 = truth.iter().map(|t| (t - mean) * (t - mean)).sum();
        FitQuality { mse: sse / n, r2: if sst > 0.0 { 1.0 - sse / sst } else { f64::NAN } }
    }
}

/// One policy against another, seed by seed. Each seed is one independent replicate (its own
/// split and fit); the targets within a seed share one model, so they are not independent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PairedDifference {
    /// Seeds in which both policies were scored.
    pub seeds: usize,
    /// Mean over seeds of (first policy's mean − second's).
    pub mean: f64,
    /// Standard error of that mean (sample standard deviation over seeds / √seeds); NaN with
    /// fewer than two seeds.
    pub standard_error: f64,
    /// Seeds in which the first policy did better.
    pub better: usize,
    /// Seeds in which it did worse.
    pub worse: usize,
    /// Seeds in which both did the same.
    pub equal: usize,
}

/// A whole evaluation: every target of every seed, and the means.
#[derive(Debug, Clone, PartialEq)]
pub struct EvalReport {
    /// The n_occur setting, when the protocol has one.
    pub n_occur: Option<u32>,
    /// Seeds evaluated.
    pub seeds: Vec<u32>,
    /// The protocol the models were trained and chose under.
    pub protocol: Protocol,
    /// What a choice was worth.
    pub objective: Objective,
    /// One result per (seed, target) with at least two candidates.
    pub targets: Vec<TargetResult>,
    /// Per model key: fit quality per run, in run order.
    pub model_fit: BTreeMap<String, Vec<FitQuality>>,
    /// Rows each run's models were fitted on.
    pub train_rows: Vec<usize>,
    /// kace's absolute percentage error of each test job's colocated throughput, as a fraction.
    pub job_errors: Vec<f64>,
    /// kace's settings, doubt weight and new-workload weight, one per run.
    pub tuned: Vec<(crate::slowdown::SlowdownParams, f64, f64)>,
}

/// Mean, minimum, median and maximum of a set of values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    /// Mean.
    pub mean: f64,
    /// Smallest.
    pub min: f64,
    /// Median.
    pub median: f64,
    /// Largest.
    pub max: f64,
}

impl Spread {
    /// The spread of `values` (`None` when empty or any is NaN).
    pub fn of(values: &[f64]) -> Option<Spread> {
        if values.is_empty() || values.iter().any(|v| v.is_nan()) {
            return None;
        }
        let mut v = values.to_vec();
        v.sort_unstable_by(f64::total_cmp);
        let m = v.len() / 2;
        let median = if v.len() % 2 == 1 { v[m] } else { (v[m - 1] + v[m]) / 2.0 };
        Some(Spread {
            mean: v.iter().sum::<f64>() / v.len() as f64,
            min: v[0],
            median,
            max: v[v.len() - 1],
        })
    }
}

/// Report key of kace with the gain rule ("no partner" allowed).
pub const KACE_GATED: &str = "kace-gated";

impl EvalReport {
    /// Policy key → mean normalised objective over every (seed, target) row.
    pub fn means(&self) -> BTreeMap<String, f64> {
        mean_by_key(self.targets.iter())
    }

    /// Target → (policy key → mean over seeds).
    pub fn per_target(&self) -> BTreeMap<String, BTreeMap<String, f64>> {
        let mut names: Vec<&str> = self.targets.iter().map(|t| t.target.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        names
            .into_iter()
            .map(|n| (n.to_string(), mean_by_key(self.targets.iter().filter(|t| t.target == n))))
            .collect()
    }

    /// Seed → (policy key → mean over that seed's targets).
    pub fn per_seed(&self) -> BTreeMap<u32, BTreeMap<String, f64>> {
        let mut seeds: Vec<u32> = self.targets.iter().map(|t| t.seed).collect();
        seeds.sort_unstable();
        seeds.dedup();
        seeds
            .into_iter()
            .map(|s| (s, mean_by_key(self.targets.iter().filter(|t| t.seed == s))))
            .collect()
    }

    /// Policy `a` against policy `b`, seed by seed; `None` when no seed scored both.
    pub fn paired(&self, a: &str, b: &str) -> Option<PairedDifference> {
        let diffs: Vec<f64> =
            self.per_seed().values().filter_map(|m| Some(m.get(a)? - m.get(b)?)).collect();
        if diffs.is_empty() {
            return None;
        }
        let n = diffs.len() as f64;
        let mean = diffs.iter().sum::<f64>() / n;
        let var = diffs.iter().map(|d| (d - mean) * (d - mean)).sum::<f64>() / (n - 1.0);
        let same = |d: &&f64| d.abs() <= 1e-12;
        Some(PairedDifference {
            seeds: diffs.len(),
            mean,
            standard_error: if diffs.len() > 1 { (var / n).sqrt() } else { f64::NAN },
            better: diffs.iter().filter(|d| !same(d) && **d > 0.0).count(),
            worse: diffs.iter().filter(|d| !same(d) && **d < 0.0).count(),
            equal: diffs.iter().filter(same).count(),
        })
    }

    /// A model's fit quality per run (empty if it was not evaluated).
    pub fn fit(&self, model: &str) -> &[FitQuality] {
        self.model_fit.get(model).map(Vec::as_slice).unwrap_or(&[])
    }

    /// A model's mean MSE over runs.
    pub fn mse(&self, model: &str) -> f64 {
        mean(self.fit(model).iter().map(|f| f.mse))
    }

    /// The spread over seeds of a policy's per-seed mean.
    pub fn seed_spread(&self, policy: &str) -> Option<Spread> {
        let v: Vec<f64> = self.per_seed().values().filter_map(|m| m.get(policy).copied()).collect();
        Spread::of(&v)
    }

    /// kace's mean absolute percentage error of test jobs' colocated throughput, in percent.
    pub fn mape(&self) -> f64 {
        100.0 * mean(self.job_errors.iter().copied())
    }

    /// Share of formed groups that are harmful (measured normalised progress < 1), for
    /// [`KACE`] (always forms), [`KACE_GATED`] (may choose none) and [`ORACLE`] (here: the
    /// candidate with the best measured normalised progress, which always forms).
    pub fn harmful_share(&self, policy: &str) -> Option<f64> {
        let picks: Vec<f64> = self
            .targets
            .iter()
            .filter_map(|t| t.progress)
            .filter_map(|p| match policy {
                KACE => Some(p.plain),
                KACE_GATED => p.gated,
                ORACLE => Some(p.best),
                _ => None,
            })
            .collect();
        if picks.is_empty() {
            return None;
        }
        Some(picks.iter().filter(|v| **v < 1.0).count() as f64 / picks.len() as f64)
    }

    /// Share of targets for which the gain rule chose no partner.
    pub fn none_share(&self) -> Option<f64> {
        let all: Vec<&ProgressOutcome> =
            self.targets.iter().filter_map(|t| t.progress.as_ref()).collect();
        if all.is_empty() {
            return None;
        }
        Some(all.iter().filter(|p| p.gated.is_none()).count() as f64 / all.len() as f64)
    }

    /// The gain (normalised progress − 1; 0 for no partner) that a policy realised, as a share
    /// of what an oracle that may also choose no partner realises. `plain` scores kace without
    /// the gain rule (its harmful picks count as losses).
    pub fn gain_share(&self, gated: bool) -> Option<f64> {
        let (mut got, mut best) = (0.0, 0.0);
        for p in self.targets.iter().filter_map(|t| t.progress) {
            got += if gated { p.gated.map_or(0.0, |v| v - 1.0) } else { p.plain - 1.0 };
            best += (p.best - 1.0).max(0.0);
        }
        (best > 0.0).then(|| got / best)
    }

    /// A model's mean R² over runs.
    pub fn r2(&self, model: &str) -> f64 {
        mean(self.fit(model).iter().map(|f| f.r2))
    }
}

fn mean(values: impl Iterator<Item = f64>) -> f64 {
    let (s, n) = values.fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    if n == 0 {
        f64::NAN
    } else {
        s / n as f64
    }
}

fn mean_by_key<'a>(rows: impl Iterator<Item = &'a TargetResult>) -> BTreeMap<String, f64> {
    let mut acc: BTreeMap<String, (f64, usize)> = BTreeMap::new();
    for r in rows {
        for (k, v) in &r.normalised {
            let e = acc.entry(k.clone()).or_insert((0.0, 0));
            e.0 += v;
            e.1 += 1;
        }
    }
    acc.into_iter().map(|(k, (s, n))| (k, s / n as f64)).collect()
}

/// Scores one target's candidates: the oracle, the random expectation, every single-feature
/// rule, the best rule, and each model's pick (`model_picks`: report key → chosen index).
pub fn score_target(
    target: &str,
    seed: u32,
    candidates: &[&Group],
    model_picks: &[(&str, usize)],
    objective: Objective,
) -> Option<TargetResult> {
    let values: Vec<f64> = candidates.iter().map(|g| objective.value(g)).collect();
    let oracle_idx = argmax_first(&values)?;
    let oracle = values[oracle_idx];
    if oracle <= 0.0 {
        return None;
    }
    let features: Vec<[f64; FEATURE_COUNT]> = candidates.iter().map(|g| g.features()).collect();
    let mut out = BTreeMap::new();
    out.insert(ORACLE.to_string(), 1.0);
    let random = values.iter().sum::<f64>() / values.len() as f64 / oracle;
    out.insert(RANDOM.to_string(), random);
    for f in Feature::ALL {
        if let Some(i) = rule_pick(&features, f) {
            out.insert(rule_name(f).to_string(), values[i] / oracle);
        }
    }
    let best_rule = ["sm%", "memcap", "mem%"].iter().map(|k| out[*k]).fold(random, f64::max);
    out.insert(BEST_RULE.to_string(), best_rule);
    for (key, idx) in model_picks {
        if let Some(v) = values.get(*idx) {
            out.insert(key.to_string(), v / oracle);
        }
    }
    Some(TargetResult {
        target: target.to_string(),
        seed,
        candidates: candidates.len(),
        oracle,
        normalised: out,
        progress: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::features::Profile;

    fn group(names: [&str; 2], memcap: [f64; 2], thr: [f64; 2]) -> Group {
        let mk = |m: f64| {
            let mut f = [1.0; FEATURE_COUNT];
            f[Feature::Memcap.index()] = m;
            Profile::new(f)
        };
        Group {
            workloads: names.iter().map(|s| s.to_string()).collect(),
            profiles: vec![mk(memcap[0]), mk(memcap[1])],
            throughputs: thr.to_vec(),
        }
    }

    #[test]
    fn scores_are_normalised_by_the_oracle() {
        let a = group(["t", "x"], [1.0, 5.0], [10.0, 10.0]);
        let b = group(["t", "y"], [1.0, 2.0], [5.0, 5.0]);
        let c = group(["t", "z"], [1.0, 9.0], [4.0, 6.0]);
        let r = score_target("t", 10, &[&a, &b, &c], &[(KACE_LR, 2)], Objective::ThroughputSum)
            .unwrap();
        assert_eq!(r.oracle, 20.0);
        assert_eq!(r.normalised[ORACLE], 1.0);
        assert_eq!(r.normalised["memcap"], 0.5);
        assert_eq!(r.normalised[KACE_LR], 0.5);
        assert!((r.normalised[RANDOM] - 40.0 / 3.0 / 20.0).abs() < 1e-12);
        // All other features tie, so those rules pick the first row (the oracle here).
        assert_eq!(r.normalised["threads"], 1.0);
        assert_eq!(r.normalised[BEST_RULE], 1.0);
        assert!(score_target("t", 10, &[], &[], Objective::ThroughputSum).is_none());
    }

    #[test]
    fn paired_difference_is_taken_seed_by_seed() {
        let row = |seed: u32, target: &str, a: f64, b: f64| TargetResult {
            target: target.into(),
            seed,
            candidates: 2,
            oracle: 1.0,
            normalised: [(KACE_LR.to_string(), a), (RANDOM.to_string(), b)].into(),
            progress: None,
        };
        let report = EvalReport {
            n_occur: Some(3),
            seeds: vec![1, 2, 3],
            protocol: Protocol::Production,
            objective: Objective::ThroughputSum,
            // Seed 1: +0.1 and +0.3 → +0.2; seed 2: 0; seed 3: −0.1.
            targets: vec![
                row(1, "x", 0.9, 0.8),
                row(1, "y", 1.0, 0.7),
                row(2, "x", 0.5, 0.5),
                row(3, "x", 0.6, 0.7),
            ],
            model_fit: BTreeMap::new(),
            train_rows: vec![],
            job_errors: vec![],
            tuned: vec![],
        };
        let d = report.paired(KACE_LR, RANDOM).unwrap();
        assert_eq!((d.seeds, d.better, d.worse, d.equal), (3, 1, 1, 1));
        assert!((d.mean - 0.1 / 3.0).abs() < 1e-12);
        let var = [0.2f64, 0.0, -0.1].iter().map(|v| (v - d.mean).powi(2)).sum::<f64>() / 2.0;
        assert!((d.standard_error - (var / 3.0).sqrt()).abs() < 1e-12);
        assert!(report.paired(KACE_LR, "nobody").is_none());
    }

    #[test]
    fn fit_quality_of_a_perfect_and_a_mean_prediction() {
        let t = [1.0, 2.0, 3.0];
        assert_eq!(FitQuality::of(&t, &t), FitQuality { mse: 0.0, r2: 1.0 });
        let q = FitQuality::of(&t, &[2.0, 2.0, 2.0]);
        assert!((q.r2).abs() < 1e-15 && (q.mse - 2.0 / 3.0).abs() < 1e-15);
    }
}
