//! What a new workload costs before kace has learnt it: the same trace under kace twice, once
//! with the workload known (trained on, Nsight Compute profile) and once new (no observed
//! group in training, only the system profile NVML samples), compared on the workload's first
//! jobs and on the whole cluster.
//!
//! The model is not retrained during these runs (they run as `kace simulate --retrain never`
//! whatever the option says): a new workload stays new for the whole trace, so its first N
//! jobs are exactly what it costs until the first retraining (`kace retrain`, nightly) learns
//! from the pairs it was tried in. Retrained nightly, a workload would stop being new after the
//! first night that observed it, and the comparison would mix what it costs with what the
//! nights learnt about every other workload.

use kace_selector::dataset::{ColocationData, Group};
use kace_selector::eval::colocations::n_occur_split;
use kace_selector::{Model, ModelKind, Objective, SelectionRules};

use crate::engine::simulate;
use crate::error::SimError;
use crate::metrics::Metrics;
use crate::model::{deployed, KACE_N_OCCUR};
use crate::policy::PairingPolicy;
use crate::trace::Job;
use crate::world::{PairKind, WorkloadId, World};

/// How kace treats one workload, known or new.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Treatment {
    /// Workloads kace would pair it with (in either role: it on the GPU, or joining).
    pub partners: usize,
    /// Of those, pairs measured slower together than one after the other (Σ colocated /
    /// exclusive < 1).
    pub harmful_partners: usize,
    /// Mean completion time (finish − submit) of its first jobs in the trace, seconds.
    pub first_jobs_mean_jct_s: f64,
    /// Its first jobs' mean time running, seconds (completion time less the queue wait):
    /// what sharing costs or gains them.
    pub first_jobs_mean_run_s: f64,
    /// Exclusive GPU-seconds of work per second the cluster did until the last job started.
    pub sustained_work_per_s: f64,
}

/// One workload, known and new, on one trace.
#[derive(Debug, Clone, PartialEq)]
pub struct NewWorkloadCost {
    /// The workload.
    pub workload: String,
    /// How many of its jobs (the first in the trace) are compared.
    pub first_jobs: usize,
    /// Trained on and fully profiled.
    pub known: Treatment,
    /// Never trained on, system profile only.
    pub new: Treatment,
}

/// Trains kace as `kace train` does ([`deployed`]: validated on a held-out fifth, then
/// settings, doubt weight and new-workload weight by cross-validation and refitted on every
/// pair) on the n_occur = 3 split for `seed`, without the groups of `leave_out`.
fn trained(
    data: &ColocationData,
    seed: u32,
    leave_out: Option<&str>,
    objective: Objective,
) -> Result<Model, SimError> {
    let (train, _) = n_occur_split(data, seed, KACE_N_OCCUR);
    let observed: Vec<Group> = train
        .iter()
        .map(|&i| &data.groups[i])
        .filter(|g| leave_out.is_none_or(|w| !g.contains(w)))
        .cloned()
        .collect();
    Ok(deployed(&observed, ModelKind::Slowdown, objective)?.0)
}

fn treatment(
    world: &World,
    policy: &PairingPolicy,
    jobs: &[Job],
    gpus: usize,
    window: usize,
    w: WorkloadId,
    first_jobs: usize,
) -> Result<Treatment, SimError> {
    let (mut partners, mut harmful) = (0, 0);
    for b in 0..world.len() as WorkloadId {
        if policy.score(w, b).is_none() && policy.score(b, w).is_none() {
            continue;
        }
        partners += 1;
        if let PairKind::Measured { first, second } = world.pair(w, b) {
            if first / world.exclusive(w) + second / world.exclusive(b) < 1.0 {
                harmful += 1;
            }
        }
    }
    let o = simulate(world, policy, jobs, gpus, window)?;
    let mut mine: Vec<usize> = (0..jobs.len()).filter(|&i| jobs[i].workload == w).collect();
    mine.sort_by(|&a, &b| jobs[a].submit.total_cmp(&jobs[b].submit));
    mine.truncate(first_jobs);
    let n = mine.len().max(1) as f64;
    Ok(Treatment {
        partners,
        harmful_partners: harmful,
        first_jobs_mean_jct_s: mine.iter().map(|&i| o.finish[i] - o.submit[i]).sum::<f64>() / n,
        first_jobs_mean_run_s: mine.iter().map(|&i| o.finish[i] - o.start[i]).sum::<f64>() / n,
        sustained_work_per_s: Metrics::of(&o).sustained_work_per_s,
    })
}

/// Runs `jobs` under kace with `workload` known and new (see the module docs). The model is
/// trained on the paper's n_occur = 3 split for `model_seed`; `rules` are kace's, and
/// `multi_user` is `mps.multi_user` ([`PairingPolicy::multi_user`]).
#[allow(clippy::too_many_arguments)]
pub fn new_workload_cost(
    data: &ColocationData,
    world: &World,
    jobs: &[Job],
    gpus: usize,
    window: usize,
    rules: &SelectionRules,
    model_seed: u32,
    workload: &str,
    first_jobs: usize,
    multi_user: bool,
) -> Result<NewWorkloadCost, SimError> {
    let w = world
        .id(workload)
        .ok_or_else(|| SimError::Config(format!("no workload named {workload} in the data")))?;
    if !jobs.iter().any(|j| j.workload == w) {
        return Err(SimError::Config(format!("the trace has no job of {workload}")));
    }
    let known_model = trained(data, model_seed, None, rules.objective)?;
    let known_policy = PairingPolicy::kace(world, &known_model, rules).multi_user(multi_user);
    let known = treatment(world, &known_policy, jobs, gpus, window, w, first_jobs)?;
    let new_model = trained(data, model_seed, Some(workload), rules.objective)?;
    // The decisions see the system profile; the run itself is the same ground truth.
    let new_policy =
        PairingPolicy::kace(&world.with_system_only(w), &new_model, rules).multi_user(multi_user);
    let new = treatment(world, &new_policy, jobs, gpus, window, w, first_jobs)?;
    Ok(NewWorkloadCost { workload: workload.to_string(), first_jobs, known, new })
}

/// New against known over many comparisons (workloads × traces), each weighing the same.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// Comparisons summarised.
    pub comparisons: usize,
    /// Mean partners kace accepts for a known workload.
    pub partners_known: f64,
    /// … for a new one.
    pub partners_new: f64,
    /// Harmful share of the partners kace accepts for known workloads (pooled).
    pub harmful_share_known: f64,
    /// … for new ones.
    pub harmful_share_new: f64,
    /// Mean over comparisons of the first jobs' mean completion time, new over known.
    pub first_jobs_jct_ratio: f64,
    /// Mean over comparisons of the cluster's sustained work per second, new over known.
    pub cluster_work_ratio: f64,
    /// Smallest such ratio.
    pub cluster_work_ratio_min: f64,
    /// Largest such ratio.
    pub cluster_work_ratio_max: f64,
}

impl Summary {
    /// The summary of `costs` (`None` when empty).
    pub fn of(costs: &[NewWorkloadCost]) -> Option<Summary> {
        if costs.is_empty() {
            return None;
        }
        let n = costs.len() as f64;
        let mean = |f: &dyn Fn(&NewWorkloadCost) -> f64| costs.iter().map(f).sum::<f64>() / n;
        let share = |f: &dyn Fn(&NewWorkloadCost) -> &Treatment| {
            let all: usize = costs.iter().map(|c| f(c).partners).sum();
            let bad: usize = costs.iter().map(|c| f(c).harmful_partners).sum();
            if all == 0 {
                0.0
            } else {
                bad as f64 / all as f64
            }
        };
        let work: Vec<f64> = costs
            .iter()
            .map(|c| c.new.sustained_work_per_s / c.known.sustained_work_per_s)
            .collect();
        Some(Summary {
            comparisons: costs.len(),
            partners_known: mean(&|c| c.known.partners as f64),
            partners_new: mean(&|c| c.new.partners as f64),
            harmful_share_known: share(&|c| &c.known),
            harmful_share_new: share(&|c| &c.new),
            first_jobs_jct_ratio: mean(&|c| {
                c.new.first_jobs_mean_jct_s / c.known.first_jobs_mean_jct_s
            }),
            cluster_work_ratio: work.iter().sum::<f64>() / n,
            cluster_work_ratio_min: work.iter().copied().fold(f64::INFINITY, f64::min),
            cluster_work_ratio_max: work.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cost(known: (usize, usize, f64, f64), new: (usize, usize, f64, f64)) -> NewWorkloadCost {
        let t = |(p, h, jct, work): (usize, usize, f64, f64)| Treatment {
            partners: p,
            harmful_partners: h,
            first_jobs_mean_jct_s: jct,
            first_jobs_mean_run_s: jct,
            sustained_work_per_s: work,
        };
        NewWorkloadCost { workload: "w".into(), first_jobs: 10, known: t(known), new: t(new) }
    }

    #[test]
    fn summary_weighs_each_comparison_and_pools_partners() {
        let c = [
            cost((10, 2, 100.0, 50.0), (2, 0, 50.0, 49.0)),
            cost((6, 0, 10.0, 40.0), (2, 1, 20.0, 42.0)),
        ];
        let s = Summary::of(&c).unwrap();
        assert_eq!(s.comparisons, 2);
        assert_eq!((s.partners_known, s.partners_new), (8.0, 2.0));
        assert_eq!((s.harmful_share_known, s.harmful_share_new), (2.0 / 16.0, 0.25));
        assert_eq!(s.first_jobs_jct_ratio, 1.25);
        assert!((s.cluster_work_ratio - (0.98 + 1.05) / 2.0).abs() < 1e-12);
        assert_eq!((s.cluster_work_ratio_min, s.cluster_work_ratio_max), (0.98, 1.05));
        assert_eq!(Summary::of(&[]), None);
    }
}
