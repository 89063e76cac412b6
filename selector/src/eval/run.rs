//! One train-and-choose run shared by every protocol: fit the models, score their picks for
//! each target against the oracle, and measure their fit.

use std::collections::BTreeMap;

use super::{score_target, EvalReport, FitQuality, ProgressOutcome};
use crate::dataset::{ColocationData, Group};
use crate::error::SelectorError;
use crate::features::FEATURE_COUNT;
use crate::linear::LinearModel;
use crate::model::{Model, ModelKind};
use crate::numpy_rng::train_test_split_train;
use crate::policy::{argmax_first, Objective};
use crate::selection::Predictor;
use crate::slowdown::{SlowdownModel, SlowdownParams};
use crate::tuning::{fit_tuned, grid, Folds};
use crate::zscore::ZScore;

/// Report key of kace's production model (the slowdown model).
pub const KACE: &str = "kace";

/// How a model is trained and how its choice is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Protocol {
    /// The artifact's: fit on the trainer's inner 80 % subset; the paper's linear model
    /// normalises each candidate set with that set's own statistics.
    #[default]
    Paper,
    /// kace's: fit on every training group; normalisation from training data only (what a
    /// prolog can do — it never sees a candidate set's statistics in advance).
    Production,
}

impl Protocol {
    /// Stable name.
    pub fn key(self) -> &'static str {
        match self {
            Protocol::Paper => "paper",
            Protocol::Production => "production",
        }
    }
}

/// A model the evaluation can train.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ModelChoice {
    /// The paper's linear regression on summed features.
    KaceLr,
    /// kace's per-job slowdown model (the production default).
    Kace,
}

impl ModelChoice {
    /// Every model, default first.
    pub const ALL: [ModelChoice; 2] = [ModelChoice::Kace, ModelChoice::KaceLr];

    /// Report key.
    pub fn key(self) -> &'static str {
        match self {
            ModelChoice::KaceLr => super::KACE_LR,
            ModelChoice::Kace => KACE,
        }
    }

    /// Parses [`ModelChoice::key`].
    pub fn from_key(s: &str) -> Option<ModelChoice> {
        ModelChoice::ALL.into_iter().find(|m| m.key() == s)
    }

    /// The kind of model trained.
    pub fn kind(self) -> ModelKind {
        match self {
            ModelChoice::KaceLr => ModelKind::Linear,
            ModelChoice::Kace => ModelKind::Slowdown,
        }
    }
}

/// What an evaluation runs.
#[derive(Debug, Clone, PartialEq)]
pub struct EvalOptions {
    /// Training and choice protocol.
    pub protocol: Protocol,
    /// What a choice is worth.
    pub objective: Objective,
    /// Models to train and score.
    pub models: Vec<ModelChoice>,
    /// Settings of the slowdown model (when not [`EvalOptions::nested`]).
    pub slowdown: SlowdownParams,
    /// Choose the slowdown model's settings by cross-validation inside each training set
    /// ([`crate::tuning`]) instead of using [`EvalOptions::slowdown`]. The doubt weight of the
    /// gain rule is chosen that way in both cases.
    pub nested: bool,
    /// How the inner cross-validation splits a training set.
    pub inner_folds: Folds,
    /// Hide the kernel metrics of a test workload never trained on (the unseen-workload
    /// experiment's held-out one) from the models: what a new workload with only its NVML
    /// system profile gets. Scores, rules and the oracle still use the measured data.
    pub system_only: bool,
}

impl Default for EvalOptions {
    fn default() -> Self {
        EvalOptions {
            protocol: Protocol::Paper,
            objective: Objective::ThroughputSum,
            models: ModelChoice::ALL.to_vec(),
            slowdown: SlowdownParams::default(),
            nested: false,
            inner_folds: Folds::default(),
            system_only: false,
        }
    }
}

/// The seed the artifact's trainer passes to its inner `train_test_split`.
pub(crate) const INNER_SPLIT_SEED: u32 = 30;

/// The paper protocol's fit subset of a training list (scikit-learn's 80 % split, seed 30).
pub(crate) fn inner_fit_subset(train: &[usize]) -> Vec<usize> {
    train_test_split_train(INNER_SPLIT_SEED, train.len(), 0.2)
        .into_iter()
        .map(|i| train[i])
        .collect()
}

/// One run's data: what to fit on, and each target's candidate groups in test order.
pub(crate) struct Run<'a> {
    pub train: &'a ColocationData,
    pub fit_rows: &'a [usize],
    pub test: &'a ColocationData,
    pub test_rows: &'a [usize],
    pub targets: Vec<(String, Vec<usize>)>,
    pub seed: u32,
    /// A workload whose kernel metrics the models do not see ([`EvalOptions::system_only`]).
    pub hide_kernel_of: Option<&'a str>,
}

fn predict(m: &Model, g: &Group, objective: Objective) -> f64 {
    m.predict(&g.members(), objective)
}

/// Trains the paper's linear model for an objective on the given rows of a data set.
pub fn fit_linear(
    data: &ColocationData,
    rows: &[usize],
    objective: Objective,
) -> Result<LinearModel, SelectorError> {
    let x: Vec<[f64; FEATURE_COUNT]> = rows.iter().map(|&i| data.groups[i].features()).collect();
    let y: Vec<f64> = rows.iter().map(|&i| objective.value(&data.groups[i])).collect();
    LinearModel::fit(&x, &y)
}

/// The relative error of each job's predicted colocated throughput in `scored`, as a fraction of
/// what it measured: `|predicted ratio × exclusive − measured| / measured`, the ratio predicted
/// from `shown` (the same group as the model sees it: its kernel metrics may be hidden). Nothing
/// is rescaled per group or run, so this is the error of the absolute throughput (MAPE's terms).
pub fn job_errors<'a>(
    model: &SlowdownModel,
    scored: &'a Group,
    shown: &Group,
) -> impl Iterator<Item = f64> + 'a {
    let preds = model.slowdowns(&shown.members());
    preds
        .into_iter()
        .zip(scored.profiles.iter().zip(&scored.throughputs))
        .map(|(pred, (p, measured))| (pred * p.exclusive_throughput() - measured).abs() / measured)
}

/// Runs one train-and-choose round and appends its results to `report`.
pub(crate) fn run(
    run: Run<'_>,
    opts: &EvalOptions,
    report: &mut EvalReport,
) -> Result<(), SelectorError> {
    let obj = opts.objective;
    let groups: Vec<&Group> = run.fit_rows.iter().map(|&i| &run.train.groups[i]).collect();
    let mut fitted: Vec<(ModelChoice, Model)> = Vec::new();
    for &m in &opts.models {
        let model = match m {
            ModelChoice::Kace => {
                let candidates = if opts.nested { grid() } else { vec![opts.slowdown] };
                let (model, tuned) = fit_tuned(&groups, &candidates, opts.inner_folds)?;
                report.tuned.push((tuned.params, tuned.doubt_weight, tuned.new_workload_weight));
                Model::Slowdown(model)
            }
            ModelChoice::KaceLr => Model::train(m.kind(), &groups, obj, opts.slowdown)?,
        };
        fitted.push((m, model));
    }
    let truth: Vec<f64> = run.test_rows.iter().map(|&i| obj.value(&run.test.groups[i])).collect();
    let shown_data = run.hide_kernel_of.map(|w| {
        let mut d = run.test.clone();
        for g in &mut d.groups {
            for (p, name) in g.profiles.iter_mut().zip(&g.workloads) {
                if name == w {
                    *p = p.system_only();
                }
            }
        }
        d
    });
    // What the models see of the test groups; what they are scored on is `run.test`.
    let shown = shown_data.as_ref().unwrap_or(run.test);
    if let Some((_, Model::Slowdown(sm))) = fitted.iter().find(|(m, _)| *m == ModelChoice::Kace) {
        for &i in run.test_rows {
            report.job_errors.extend(job_errors(sm, &run.test.groups[i], &shown.groups[i]));
        }
    }
    for (m, f) in &fitted {
        let q = match (f, opts.protocol) {
            (Model::Linear { model: lr, .. }, Protocol::Paper) => {
                self_normalised_quality(lr, run.test, run.test_rows, obj)
            }
            _ => {
                let pred: Vec<f64> =
                    run.test_rows.iter().map(|&i| predict(f, &shown.groups[i], obj)).collect();
                quality_in_test_units(&truth, &pred)
            }
        };
        report.model_fit.entry(m.key().to_string()).or_default().push(q);
    }
    report.train_rows.push(run.fit_rows.len());
    for (target, cands) in &run.targets {
        // One candidate is no choice; the artifact also drops such targets (its candidate-set
        // z-scoring is undefined for one row).
        if cands.len() < 2 {
            continue;
        }
        let groups: Vec<&Group> = cands.iter().map(|&i| &run.test.groups[i]).collect();
        let seen: Vec<&Group> = cands.iter().map(|&i| &shown.groups[i]).collect();
        let mut picks: Vec<(&str, usize)> = Vec::new();
        for (m, f) in &fitted {
            let pick = match (f, opts.protocol) {
                (Model::Linear { model: lr, .. }, Protocol::Paper) => {
                    // Without kernel metrics the paper's model has no answer.
                    if seen.iter().any(|g| g.profiles.iter().any(|p| !p.has_kernel_metrics)) {
                        None
                    } else {
                        let feats: Vec<[f64; FEATURE_COUNT]> =
                            seen.iter().map(|g| g.features()).collect();
                        candidate_normalised_pick(lr, &feats)
                    }
                }
                _ => argmax_first(&seen.iter().map(|g| predict(f, g, obj)).collect::<Vec<_>>()),
            };
            if let Some(p) = pick {
                picks.push((m.key(), p));
            }
        }
        if let Some(mut r) = score_target(target, run.seed, &groups, &picks, obj) {
            if let Some((_, f)) = fitted.iter().find(|(m, _)| *m == ModelChoice::Kace) {
                r.progress = progress_outcome(f, &groups, &seen, obj);
            }
            report.targets.push(r);
        }
    }
    Ok(())
}

/// What the production gain rule makes of one target's candidates: kace's plain pick, the pick
/// when "no partner" is allowed (the best predicted candidate among those the rule forms), and
/// the best measured normalised progress.
fn progress_outcome(
    model: &Model,
    groups: &[&Group],
    seen: &[&Group],
    obj: Objective,
) -> Option<ProgressOutcome> {
    let measured: Vec<f64> = groups.iter().map(|g| g.normalised_progress()).collect();
    let predicted: Vec<f64> = seen.iter().map(|g| predict(model, g, obj)).collect();
    let plain = argmax_first(&predicted)?;
    let gated: Vec<f64> = seen
        .iter()
        .zip(&predicted)
        .map(|(g, p)| {
            let m = g.members();
            let progress = model.predict(&m, Objective::NormalisedProgress);
            // As `select` with `refuse_likely_harm`: the larger of the two margins.
            let gain = model.required_gain(&m).max(model.new_workload_gain(&m).unwrap_or(0.0));
            if progress > 1.0 + gain {
                *p
            } else {
                f64::NAN
            }
        })
        .collect();
    Some(ProgressOutcome {
        plain: measured[plain],
        gated: argmax_first(&gated).map(|i| measured[i]),
        best: measured.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    })
}

/// The paper's pick: z-score the candidates with their own statistics, predict, take the first
/// argmax.
pub fn candidate_normalised_pick(
    model: &LinearModel,
    candidates: &[[f64; FEATURE_COUNT]],
) -> Option<usize> {
    let scale = ZScore::fit(candidates, FEATURE_COUNT, 1);
    let preds: Vec<f64> = candidates.iter().map(|x| model.predict_with_scale(x, &scale)).collect();
    argmax_first(&preds)
}

/// The artifact's Fig. 2 "allpairs" MSE and R²: the test set z-scored with its own statistics.
pub fn self_normalised_quality(
    model: &LinearModel,
    data: &ColocationData,
    rows: &[usize],
    objective: Objective,
) -> FitQuality {
    let x: Vec<[f64; FEATURE_COUNT]> = rows.iter().map(|&i| data.groups[i].features()).collect();
    let y: Vec<f64> = rows.iter().map(|&i| objective.value(&data.groups[i])).collect();
    let scale = ZScore::fit(&x, FEATURE_COUNT, 1);
    let (ym, ys) = ZScore::fit_column(&y, 1);
    let yz: Vec<f64> = y.iter().map(|v| (v - ym) / ys).collect();
    let pred: Vec<f64> = x.iter().map(|r| model.predict_with_scale(r, &scale)).collect();
    FitQuality::of(&yz, &pred)
}

/// MSE and R² of raw predictions, expressed in units of the test targets' own spread.
fn quality_in_test_units(truth: &[f64], pred: &[f64]) -> FitQuality {
    let (m, s) = ZScore::fit_column(truth, 1);
    let z = |v: &f64| (v - m) / s;
    FitQuality::of(
        &truth.iter().map(z).collect::<Vec<_>>(),
        &pred.iter().map(z).collect::<Vec<_>>(),
    )
}

/// Each target's candidate groups among `rows`, in row order.
pub(crate) fn candidates_by_target(
    data: &ColocationData,
    rows: &[usize],
    targets: &[String],
    starts_with: bool,
) -> Vec<(String, Vec<usize>)> {
    targets
        .iter()
        .map(|t| {
            let c = rows
                .iter()
                .copied()
                .filter(|&i| {
                    let g = &data.groups[i];
                    if starts_with {
                        g.has_member_starting_with(t)
                    } else {
                        g.contains(t)
                    }
                })
                .collect();
            (t.clone(), c)
        })
        .collect()
}

/// A new, empty report.
pub(crate) fn empty_report(
    n_occur: Option<u32>,
    seeds: Vec<u32>,
    opts: &EvalOptions,
) -> EvalReport {
    EvalReport {
        n_occur,
        seeds,
        protocol: opts.protocol,
        objective: opts.objective,
        targets: Vec::new(),
        model_fit: BTreeMap::new(),
        train_rows: Vec::new(),
        job_errors: Vec::new(),
        tuned: Vec::new(),
    }
}
