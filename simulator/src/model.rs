//! The kace model the simulator runs with, trained as `kace train` trains it: the library's
//! training policy ([`kace_selector::training::train`]: validated on a held-out fifth, then
//! settings, doubt weight and new-workload weight chosen by cross-validation on every pair and
//! refitted on them all) on the n_occur = 3 training split (about a fifth of the measured
//! pairs), never on the rest of the ground truth the simulation scores it against.

use kace_selector::dataset::{ColocationData, Group};
use kace_selector::eval::colocations::n_occur_split;
use kace_selector::training::{train, TrainingPolicy};
use kace_selector::{Model, ModelKind, Objective};

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
    /// Rows of the pair table it was fitted on (the whole training split: the held-out fifth
    /// only validates).
    pub fit_rows: Vec<usize>,
    /// The fitted pairs, by workload name.
    pub fit_pairs: Vec<[String; 2]>,
}

/// What `kace train` makes of `observed` (pairs a site measured) with an unconfigured
/// `[training]` and `selection.objective = objective`, and which of them it fitted on
/// (indices into `observed`).
pub fn deployed(
    observed: &[Group],
    kind: ModelKind,
    objective: Objective,
) -> Result<(Model, Vec<usize>), SimError> {
    let policy = TrainingPolicy::new(kind, objective);
    let t = train(observed, None, &policy)?;
    Ok((t.model, t.fit_indices))
}

/// Trains a `kind` model as `kace train` does ([`deployed`]) on the n_occur = 3 training split
/// of `data` for `seed`, for the selection objective `objective`. For the paper's seeds
/// (10…50) the split is exactly the artifact's training file.
pub fn train_kace(
    data: &ColocationData,
    seed: u32,
    kind: ModelKind,
    objective: Objective,
) -> Result<TrainedKace, SimError> {
    let (train, _) = n_occur_split(data, seed, KACE_N_OCCUR);
    if train.len() < 3 {
        return Err(SimError::World(format!(
            "only {} pairs qualify for kace's training split",
            train.len()
        )));
    }
    let observed: Vec<Group> = train.iter().map(|&i| data.groups[i].clone()).collect();
    let (model, fit) = deployed(&observed, kind, objective)?;
    let fit_rows: Vec<usize> = fit.iter().map(|&i| train[i]).collect();
    let fit_pairs = fit_rows
        .iter()
        .map(|&i| [data.groups[i].workloads[0].clone(), data.groups[i].workloads[1].clone()])
        .collect();
    Ok(TrainedKace { model, seed, fit_rows, fit_pairs })
}
