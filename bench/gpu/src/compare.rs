//! The active model's prediction for every observed group whose workloads are profiled, next to
//! what was observed, in the configured objective's units: the run's final table.

use kace_config::Training;
use kace_selector::training::holdout_split;
use kace_selector::{Objective, Predictor};
use kace_sql::convert::load_active_model;
use kace_sql::training::training_set;
use kace_sql::Db;

use crate::BenchError;

/// One observed group.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Its workloads.
    pub workloads: Vec<String>,
    /// Each member's observed throughput, steps/s.
    pub throughputs: Vec<f64>,
    /// The objective as observed.
    pub observed: f64,
    /// The objective as the active model predicts it.
    pub predicted: f64,
    /// Whether `kace train` (with the configured fraction and seed) held this group out of the
    /// fit: only those rows are honest predictions.
    pub held_out: bool,
}

/// The active model's version and one row per observed group its kind learns from.
pub fn rows(
    db: &Db,
    objective: Objective,
    training: &Training,
) -> Result<(i64, Vec<Row>), BenchError> {
    let (version, model) = load_active_model(db)?;
    let set = training_set(db)?;
    let usable: Vec<_> = set.groups.iter().filter(|g| model.kind().learns_from(g.k())).collect();
    // The same split `kace train` made, so the table can say which rows the fit never saw.
    let (_, held) = holdout_split(usable.len(), training.holdout_fraction, training.seed);
    let rows = usable
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let members = g.members();
            Row {
                workloads: g.workloads.clone(),
                throughputs: g.throughputs.clone(),
                observed: objective.value(g),
                predicted: model.predict(&members, objective),
                held_out: held.contains(&i),
            }
        })
        .collect();
    Ok((version, rows))
}
