//! The read path of every decision: the active model, the profiles of a GPU's jobs and of the
//! candidates and the pairs that failed together, read from the store, then the selector's
//! one decision ([`kace_selector::decision::decide`]). The decider (`crate::dispatch`),
//! `kace status` and `kace select` decide through [`decide_from_store`].

use std::collections::HashMap;

use kace_selector::decision::{GpuState, Joiner, OnGpu, Policy};
use kace_selector::{Profile, Rejection, Selection};
use kace_sql::convert::{load_active_model, missing_system_metrics, selector_profile};
use kace_sql::Db;

use crate::error::ReadPathError;

/// A job of a decision (running on the GPU, or a held candidate), as Slurm shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobSpec {
    /// Its workload.
    pub workload: String,
    /// Its user (`None`: unknown, matches anyone, as in `kace select --dry-run`).
    pub user: Option<String>,
}

impl JobSpec {
    /// A job of `workload` whose user is unknown.
    pub fn anyone(workload: &str) -> JobSpec {
        JobSpec { workload: workload.to_string(), user: None }
    }
}

/// Everything a decision from the store needed and produced: the selector's verdicts and
/// ranking, the model version, and what each rejected candidate's reason says.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadPathDecision {
    /// Version of the model used.
    pub model_version: i64,
    /// Verdicts parallel to the candidates, the chosen index and the baseline.
    pub selection: Selection,
    /// The passing candidates, best first: the order in which to release them.
    pub ranked: Vec<usize>,
    /// Per candidate, the system features its profile lacks (empty when it has them all, or has
    /// no profile).
    pub incomplete: Vec<Vec<&'static str>>,
    /// Per candidate with no profile, or whose profile rests only on kace's observations of too
    /// few alone runs (`profile.min_alone_runs`): how many it has. `None` for the others.
    pub too_few_alone_runs: Vec<Option<u32>>,
    /// The policy's `min_alone_runs`, for the reason text.
    pub min_alone_runs: u32,
    /// Time spent reading the model and the profiles.
    pub db_time: std::time::Duration,
    /// Time spent filtering and predicting.
    pub predict_time: std::time::Duration,
}

impl ReadPathDecision {
    /// Candidate `i`'s reason for not being chosen, in the words every caller shows
    /// (`None`: it passed).
    pub fn reason(&self, i: usize) -> Option<String> {
        let r = self.selection.verdicts.get(i)?.rejection.as_ref()?;
        let missing = self.incomplete.get(i).map(Vec::as_slice).unwrap_or_default();
        let runs = self.too_few_alone_runs.get(i).copied().flatten();
        Some(match r {
            Rejection::UnknownProfile if runs.is_some() => format!(
                "unknown profile (observed alone in {} of the {} runs needed)",
                runs.unwrap_or(0),
                self.min_alone_runs
            ),
            Rejection::UnknownProfile if !missing.is_empty() => {
                format!("incomplete profile (missing {})", missing.join(", "))
            }
            other => other.to_string(),
        })
    }
}

/// The read path of every decision: the active model, the profiles of the jobs on the GPU and
/// of the candidates (one query), then [`kace_selector::decision::decide`]. The jobs on the GPU
/// must have complete profiles; candidates without one are rejected as unknown, and so are
/// candidates whose profile only kace observed, in fewer than `policy.min_alone_runs` alone runs
/// (such a workload on the GPU is an error: it is not paired yet). `explored`: each workload's
/// exploratory groups so far ([`GpuState::explored`]); the decider passes its counts, a dry
/// run none.
pub fn decide_from_store(
    db: &Db,
    running: &[JobSpec],
    candidates: &[JobSpec],
    policy: &Policy,
    gpu_memory_gib: Option<f64>,
    gpu_model: Option<&str>,
    explored: &[(&str, u32)],
) -> Result<ReadPathDecision, ReadPathError> {
    let started = std::time::Instant::now();
    let (model_version, model) = load_active_model(db)?;
    let objective = policy.rules.objective;
    if !model.serves(objective) {
        return Err(ReadPathError::WrongObjective {
            version: model_version,
            kind: model.kind().key(),
            objective: objective.key(),
        });
    }
    let mut names: Vec<&str> =
        running.iter().chain(candidates).map(|c| c.workload.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    let stored = db.profiles(&names, gpu_model)?;
    // Pairs that failed together on a shared server (two small queries; none is blocked on a
    // healthy site).
    let failed = db.failed_pairs()?;
    let failed_pairs: Vec<(&str, &str, Option<&str>)> = failed
        .iter()
        .map(|p| (p.workloads.0.as_str(), p.workloads.1.as_str(), p.user.as_deref()))
        .collect();
    let converted: HashMap<&str, Profile> =
        stored.iter().filter_map(|(w, p)| selector_profile(p).map(|sp| (w.as_str(), sp))).collect();
    for r in running {
        if let Some(p) = stored.get(&r.workload).filter(|p| !p.usable(policy.min_alone_runs)) {
            return Err(ReadPathError::TooFewAloneRuns {
                workload: r.workload.clone(),
                runs: p.observed_runs,
                needed: policy.min_alone_runs,
            });
        }
        if !converted.contains_key(r.workload.as_str()) {
            let missing = stored.get(&r.workload).map(missing_system_metrics).unwrap_or_default();
            return Err(ReadPathError::NoProfile { workload: r.workload.clone(), missing });
        }
    }
    let on_gpu: Vec<OnGpu<'_>> = running
        .iter()
        .filter_map(|r| {
            Some(OnGpu {
                profile: converted.get(r.workload.as_str())?,
                workload: &r.workload,
                user: r.user.as_deref(),
            })
        })
        .collect();
    let too_few_alone_runs: Vec<Option<u32>> = candidates
        .iter()
        .map(|c| match stored.get(&c.workload) {
            // Never seen: its alone runs will measure it.
            None => Some(0),
            Some(p) => (!p.usable(policy.min_alone_runs)).then_some(p.observed_runs),
        })
        .collect();
    let joiners: Vec<Joiner<'_>> = candidates
        .iter()
        .zip(&too_few_alone_runs)
        .map(|(c, few)| Joiner {
            profile: converted.get(c.workload.as_str()).filter(|_| few.is_none()),
            workload: &c.workload,
            user: c.user.as_deref(),
        })
        .collect();
    let incomplete = candidates
        .iter()
        .map(|c| stored.get(&c.workload).map(missing_system_metrics).unwrap_or_default())
        .collect();
    let vouched: Vec<&str> =
        stored.iter().filter(|(_, p)| p.vouched()).map(|(w, _)| w.as_str()).collect();
    let db_time = started.elapsed();
    let gpu = GpuState {
        running: &on_gpu,
        memory_gib: gpu_memory_gib,
        failed_pairs: &failed_pairs,
        explored,
        vouched: &vouched,
    };
    let d = kace_selector::decision::decide(&gpu, &joiners, &model, policy);
    let predict_time = started.elapsed().saturating_sub(db_time);
    Ok(ReadPathDecision {
        model_version,
        selection: d.selection,
        ranked: d.ranked,
        incomplete,
        too_few_alone_runs,
        min_alone_runs: policy.min_alone_runs,
        db_time,
        predict_time,
    })
}
