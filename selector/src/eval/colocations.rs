//! kace's general evaluation for any colocation data set and any group size k: a seeded shuffle,
//! the greedy n_occur rule, a fit with training-set normalisation only, and a choice for every
//! target among the test groups that contain it.

use std::collections::{HashMap, HashSet};

use super::{score_target, EvalReport, FitQuality, KACE_LR};
use crate::dataset::ColocationData;
use crate::error::SelectorError;
use crate::features::FEATURE_COUNT;
use crate::linear::LinearModel;
use crate::numpy_rng::permutation;
use crate::policy::{argmax_first, Objective};

/// The greedy n_occur split. Rows are visited in the order of NumPy's
/// `RandomState(seed).permutation(n)` (what pandas' `sample(frac=1, random_state=seed)` uses);
/// a self group (all members the same workload) goes to test; any other group goes to train
/// while one of its distinct workloads has fewer than `n_occur` training appearances.
/// Returns (train, test) row indices in visiting order.
pub fn n_occur_split(data: &ColocationData, seed: u32, n_occur: u32) -> (Vec<usize>, Vec<usize>) {
    let mut counts: HashMap<&str, u32> = HashMap::new();
    let (mut train, mut test) = (Vec::new(), Vec::new());
    for i in permutation(seed, data.groups.len()) {
        let g = &data.groups[i];
        if g.is_self_group() {
            test.push(i);
            continue;
        }
        let members: HashSet<&str> = g.workloads.iter().map(String::as_str).collect();
        if members.iter().any(|w| counts.get(w).copied().unwrap_or(0) < n_occur) {
            for w in members {
                *counts.entry(w).or_insert(0) += 1;
            }
            train.push(i);
        } else {
            test.push(i);
        }
    }
    (train, test)
}

fn fit(data: &ColocationData, rows: &[usize]) -> Result<LinearModel, SelectorError> {
    let x: Vec<[f64; FEATURE_COUNT]> = rows.iter().map(|&i| data.groups[i].features()).collect();
    let y: Vec<f64> = rows.iter().map(|&i| data.groups[i].total_throughput()).collect();
    LinearModel::fit(&x, &y)
}

fn quality(model: &LinearModel, data: &ColocationData, rows: &[usize]) -> FitQuality {
    let yz: Vec<f64> = rows
        .iter()
        .map(|&i| (data.groups[i].total_throughput() - model.y_mean) / model.y_std)
        .collect();
    let pred: Vec<f64> = rows
        .iter()
        .map(|&i| model.predict_with_scale(&data.groups[i].features(), &model.x_scale))
        .collect();
    FitQuality::of(&yz, &pred)
}

fn score(
    model: &LinearModel,
    test: &ColocationData,
    rows: &[usize],
    targets: &[String],
    seed: u32,
    report: &mut EvalReport,
) {
    for t in targets {
        let cands: Vec<usize> =
            rows.iter().copied().filter(|&i| test.groups[i].contains(t)).collect();
        if cands.is_empty() {
            continue;
        }
        let preds: Vec<f64> =
            cands.iter().map(|&i| model.predict(&test.groups[i].features())).collect();
        let groups: Vec<_> = cands.iter().map(|&i| &test.groups[i]).collect();
        let picks: Vec<(&str, usize)> =
            argmax_first(&preds).map(|p| vec![(KACE_LR, p)]).unwrap_or_default();
        if let Some(r) = score_target(t, seed, &groups, &picks, Objective::ThroughputSum) {
            report.targets.push(r);
        }
    }
}

/// Evaluates on one data set: per seed, split with [`n_occur_split`], fit on the training
/// groups, and choose for every workload among the test groups that contain it.
pub fn evaluate_split(
    data: &ColocationData,
    n_occur: u32,
    seeds: &[u32],
) -> Result<EvalReport, SelectorError> {
    let targets = data.workloads();
    let mut report = EvalReport {
        n_occur: Some(n_occur),
        seeds: seeds.to_vec(),
        targets: Vec::new(),
        fit: Vec::new(),
        train_rows: Vec::new(),
    };
    for &seed in seeds {
        let (train, test) = n_occur_split(data, seed, n_occur);
        if train.is_empty() {
            return Err(SelectorError::Invalid(format!(
                "seed {seed}: no group qualifies for training (are all groups self groups?)"
            )));
        }
        let model = fit(data, &train)?;
        report.fit.push(quality(&model, data, &test));
        report.train_rows.push(train.len());
        score(&model, data, &test, &targets, seed, &mut report);
    }
    Ok(report)
}

/// Trains on all of `train` and evaluates on `test`. The targets are the test workloads never
/// seen in training, or every test workload when all were seen.
pub fn evaluate_train_test(
    train: &ColocationData,
    test: &ColocationData,
) -> Result<EvalReport, SelectorError> {
    let rows: Vec<usize> = (0..train.groups.len()).collect();
    let model = fit(train, &rows)?;
    let seen: HashSet<String> = train.workloads().into_iter().collect();
    let all = test.workloads();
    let unseen: Vec<String> = all.iter().filter(|w| !seen.contains(*w)).cloned().collect();
    let targets = if unseen.is_empty() { all } else { unseen };
    let test_rows: Vec<usize> = (0..test.groups.len()).collect();
    let mut report = EvalReport {
        n_occur: None,
        seeds: Vec::new(),
        targets: Vec::new(),
        fit: vec![quality(&model, test, &test_rows)],
        train_rows: vec![rows.len()],
    };
    score(&model, test, &test_rows, &targets, 0, &mut report);
    Ok(report)
}
