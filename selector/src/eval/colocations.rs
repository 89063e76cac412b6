//! kace's general evaluation for any colocation data set and any group size k: a seeded shuffle,
//! the greedy n_occur rule, a fit, and a choice for every target among the test groups that
//! contain it.

use std::collections::{HashMap, HashSet};

use super::run::{
    candidates_by_target, empty_report, inner_fit_subset, run, EvalOptions, Protocol, Run,
};
use super::EvalReport;
use crate::dataset::ColocationData;
use crate::error::SelectorError;
use crate::numpy_rng::permutation;

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

/// Evaluates on one data set: per seed, split with [`n_occur_split`], fit (on the inner 80 %
/// under the paper protocol, on all training groups under production), and choose for every
/// workload among the test groups that contain it.
pub fn evaluate_split(
    data: &ColocationData,
    n_occur: u32,
    seeds: &[u32],
    opts: &EvalOptions,
) -> Result<EvalReport, SelectorError> {
    let targets = data.workloads();
    let mut report = empty_report(Some(n_occur), seeds.to_vec(), opts);
    for &seed in seeds {
        let (train, test) = n_occur_split(data, seed, n_occur);
        let fit_rows = match opts.protocol {
            Protocol::Paper => inner_fit_subset(&train),
            Protocol::Production => train,
        };
        if fit_rows.len() < 2 {
            return Err(SelectorError::Invalid(format!(
                "seed {seed}: only {} group(s) to train on (are most groups self groups?)",
                fit_rows.len()
            )));
        }
        let r = Run {
            train: data,
            fit_rows: &fit_rows,
            test: data,
            test_rows: &test,
            targets: candidates_by_target(data, &test, &targets, false),
            seed,
            hide_kernel_of: None,
        };
        run(r, opts, &mut report)?;
    }
    Ok(report)
}

/// Trains on all of `train` and evaluates on `test`. The targets are the test workloads never
/// seen in training, or every test workload when all were seen.
pub fn evaluate_train_test(
    train: &ColocationData,
    test: &ColocationData,
    opts: &EvalOptions,
) -> Result<EvalReport, SelectorError> {
    let all_train: Vec<usize> = (0..train.groups.len()).collect();
    let fit_rows = match opts.protocol {
        Protocol::Paper => inner_fit_subset(&all_train),
        Protocol::Production => all_train,
    };
    let seen: HashSet<String> = train.workloads().into_iter().collect();
    let all = test.workloads();
    let unseen: Vec<String> = all.iter().filter(|w| !seen.contains(*w)).cloned().collect();
    let targets = if unseen.is_empty() { all } else { unseen };
    let test_rows: Vec<usize> = (0..test.groups.len()).collect();
    let mut report = empty_report(None, Vec::new(), opts);
    let r = Run {
        train,
        fit_rows: &fit_rows,
        test,
        test_rows: &test_rows,
        targets: candidates_by_target(test, &test_rows, &targets, false),
        seed: 0,
        hide_kernel_of: None,
    };
    run(r, opts, &mut report)?;
    Ok(report)
}
