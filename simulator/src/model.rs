//! The kace model the simulator runs with, trained as production trains it: kace's default
//! model kind on every pair of the n_occur = 3 training split (about a fifth of the measured
//! pairs), never on the rest of the ground truth the simulation scores it against.

use kace_selector::dataset::{ColocationData, Group};
use kace_selector::eval::colocations::n_occur_split;
use kace_selector::{Model, ModelKind, Objective, SlowdownParams};

use crate::error::SimError;

/// The paper's "~20 %" training setting.
pub const KACE_N_OCCUR: u32 = 3;

/// A trained kace model and what it learnt from.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainedKace {
    /// The model.
    pub model: Model,
    /// The split seed.
    pub seed: u32,
    /// Rows of the pair table it was fitted on.
    pub fit_rows: Vec<usize>,
    /// The fitted pairs, by workload name.
    pub fit_pairs: Vec<[String; 2]>,
}

/// Trains a `kind` model on the n_occur = 3 training split of `data` for `seed`. For the
/// paper's seeds (10…50) the split is exactly the artifact's training file.
pub fn train_kace(
    data: &ColocationData,
    seed: u32,
    kind: ModelKind,
) -> Result<TrainedKace, SimError> {
    let (train, _) = n_occur_split(data, seed, KACE_N_OCCUR);
    if train.len() < 3 {
        return Err(SimError::World(format!(
            "only {} pairs qualify for kace's training split",
            train.len()
        )));
    }
    let groups: Vec<&Group> = train.iter().map(|&i| &data.groups[i]).collect();
    let model = Model::train(kind, &groups, Objective::ThroughputSum, SlowdownParams::default())?;
    let fit_pairs = train
        .iter()
        .map(|&i| [data.groups[i].workloads[0].clone(), data.groups[i].workloads[1].clone()])
        .collect();
    Ok(TrainedKace { model, seed, fit_rows: train, fit_pairs })
}
