//! The kace model the simulator runs with, trained the way the paper trained it: on the
//! n_occur = 3 training split (about a fifth of the measured pairs) and the trainer's inner
//! 80 % fit subset, never on the rest of the ground truth the simulation scores it against.

use kace_selector::dataset::ColocationData;
use kace_selector::eval::colocations::n_occur_split;
use kace_selector::eval::paper::fit_rows;
use kace_selector::numpy_rng::train_test_split_train;
use kace_selector::LinearModel;

use crate::error::SimError;

/// The paper's "~20 %" training setting.
pub const KACE_N_OCCUR: u32 = 3;

/// The seed the artifact's trainer passes to its inner `train_test_split(test_size=0.2)`.
const INNER_SPLIT_SEED: u32 = 30;

/// A trained kace model and what it learnt from.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainedKace {
    /// The model.
    pub model: LinearModel,
    /// The split seed.
    pub seed: u32,
    /// Rows of the pair table it was fitted on.
    pub fit_rows: Vec<usize>,
    /// The fitted pairs, by workload name.
    pub fit_pairs: Vec<[String; 2]>,
}

/// Trains kace on the n_occur = 3 split of `data` for `seed`. For the paper's seeds (10…50)
/// this is exactly the artifact's training set and fit subset.
pub fn train_kace(data: &ColocationData, seed: u32) -> Result<TrainedKace, SimError> {
    let (train, _) = n_occur_split(data, seed, KACE_N_OCCUR);
    if train.len() < 3 {
        return Err(SimError::World(format!(
            "only {} pairs qualify for kace's training split",
            train.len()
        )));
    }
    let fit: Vec<usize> = train_test_split_train(INNER_SPLIT_SEED, train.len(), 0.2)
        .into_iter()
        .map(|i| train[i])
        .collect();
    let model = fit_rows(data, &fit)?;
    let fit_pairs = fit
        .iter()
        .map(|&i| [data.groups[i].workloads[0].clone(), data.groups[i].workloads[1].clone()])
        .collect();
    Ok(TrainedKace { model, seed, fit_rows: fit, fit_pairs })
}
