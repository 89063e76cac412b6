//! The models kace can deploy, behind one serialisable type: the paper's linear regression and
//! kace's per-job slowdown model (the default), with training from measured groups.

use serde::{Deserialize, Serialize};

use crate::dataset::Group;
use crate::error::SelectorError;
use crate::features::{combine, FEATURE_COUNT};
use crate::linear::LinearModel;
use crate::policy::Objective;
use crate::selection::Predictor;
use crate::slowdown::{Member, SlowdownModel, SlowdownParams};

/// Which kind of model to train.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ModelKind {
    /// kace's per-job slowdown model (see [`SlowdownModel`]); the production default.
    #[default]
    Slowdown,
    /// The paper's OLS on z-scored, summed group features.
    Linear,
}

impl ModelKind {
    /// Stable name, for config, the database and reports.
    pub fn key(self) -> &'static str {
        match self {
            ModelKind::Slowdown => "slowdown",
            ModelKind::Linear => "linear",
        }
    }

    /// Parses [`ModelKind::key`].
    pub fn from_key(s: &str) -> Option<ModelKind> {
        [ModelKind::Slowdown, ModelKind::Linear].into_iter().find(|k| k.key() == s)
    }

    /// Whether this kind learns from measured groups of `k` jobs. The slowdown model describes
    /// each job beside any set of partners; the linear model's summed features describe one
    /// group size, and kace's is the pair (what the paper measured and the prolog forms).
    pub fn learns_from(self, k: usize) -> bool {
        match self {
            ModelKind::Slowdown => k >= 2,
            ModelKind::Linear => k == 2,
        }
    }

    /// Whether this kind learns from `group`: its size ([`ModelKind::learns_from`]), and for
    /// the linear model, every member's kernel metrics (its summed features need them; the
    /// slowdown model fills absent ones).
    pub fn learns_from_group(self, group: &Group) -> bool {
        self.learns_from(group.k())
            && (self == ModelKind::Slowdown || group.profiles.iter().all(|p| p.has_kernel_metrics))
    }
}

/// A trained model of either kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Model {
    /// The paper's linear regression, trained to predict one objective.
    Linear {
        /// The objective it predicts.
        objective: Objective,
        /// The regression.
        model: LinearModel,
    },
    /// kace's slowdown model; it predicts either objective.
    Slowdown(SlowdownModel),
}

impl Model {
    /// Trains a model of `kind` on measured groups. The linear model learns `objective`
    /// directly; the slowdown model learns per-job slowdowns and serves both objectives.
    pub fn train(
        kind: ModelKind,
        groups: &[&Group],
        objective: Objective,
        params: SlowdownParams,
    ) -> Result<Model, SelectorError> {
        match kind {
            ModelKind::Linear => {
                let x: Vec<[f64; FEATURE_COUNT]> = groups.iter().map(|g| g.features()).collect();
                let y: Vec<f64> = groups.iter().map(|g| objective.value(g)).collect();
                Ok(Model::Linear { objective, model: LinearModel::fit(&x, &y)? })
            }
            ModelKind::Slowdown => Ok(Model::Slowdown(SlowdownModel::fit(groups, params)?)),
        }
    }

    /// The kind of this model.
    pub fn kind(&self) -> ModelKind {
        match self {
            Model::Linear { .. } => ModelKind::Linear,
            Model::Slowdown(_) => ModelKind::Slowdown,
        }
    }

    /// Whether the model can predict `objective`.
    pub fn serves(&self, objective: Objective) -> bool {
        match self {
            Model::Linear { objective: o, .. } => *o == objective,
            Model::Slowdown(_) => true,
        }
    }

    /// Checks a deserialised model: widths and finite parameters. Returns what is wrong.
    pub fn check(&self) -> Result<(), String> {
        match self {
            Model::Linear { model: m, .. } => {
                if m.width() != FEATURE_COUNT || m.x_scale.width() != FEATURE_COUNT {
                    return Err(format!("{} coefficients, expected {FEATURE_COUNT}", m.width()));
                }
                let all = m
                    .coefficients
                    .iter()
                    .chain(&m.x_scale.mean)
                    .chain(&m.x_scale.std)
                    .chain([&m.intercept, &m.y_mean, &m.y_std]);
                if !all.into_iter().all(|v| v.is_finite()) {
                    return Err("non-finite parameters".into());
                }
            }
            Model::Slowdown(m) => {
                let w = crate::slowdown::PROFILE_WIDTH;
                if m.weights.len() != w || m.scale.width() != w {
                    return Err(format!("{} weights, expected {w}", m.weights.len()));
                }
                let all = m
                    .weights
                    .iter()
                    .chain(&m.scale.mean)
                    .chain(&m.scale.std)
                    .chain(m.sensitivity.values())
                    .chain(m.pressure.values())
                    .chain([&m.intercept]);
                if !all.into_iter().all(|v| v.is_finite()) {
                    return Err("non-finite parameters".into());
                }
                // A ceiling below 1 would cap every prediction of its workload below "alone".
                if let Some((w, c)) = m.ceiling.iter().find(|(_, c)| !(c.is_finite() && **c >= 1.0))
                {
                    return Err(format!("ceiling {c} for {w} (must be a number ≥ 1)"));
                }
                if let Some((w, s)) = m.spread.iter().find(|(_, s)| !(s.is_finite() && *s >= 0.0)) {
                    return Err(format!("spread {s} for {w} (must be a number ≥ 0)"));
                }
                if let Some(w) = m.profiles.iter().find(|(_, p)| !p.iter().all(|v| v.is_finite())) {
                    return Err(format!("non-finite profile for {}", w.0));
                }
                if !(m.doubt_weight.is_finite() && m.doubt_weight >= 0.0) {
                    return Err(format!("doubt weight {} (must be a number ≥ 0)", m.doubt_weight));
                }
                if !(m.new_workload_weight.is_finite() && m.new_workload_weight >= 0.0) {
                    return Err(format!(
                        "new-workload weight {} (must be a number ≥ 0)",
                        m.new_workload_weight
                    ));
                }
                // A correction is a learnt log shift: one beyond the store's bound on an
                // observed ratio (4× alone) did not come from an honest measurement.
                let bound = crate::training::MAX_RATIO_TO_EXCLUSIVE.ln() + 1.0;
                for (key, c) in &m.corrections {
                    let members = key.split('|').count();
                    let fine = c.shift.len() == members
                        && c.sd.len() == members
                        && c.shift.iter().all(|v| v.is_finite() && v.abs() <= bound)
                        && c.sd.iter().all(|v| v.is_finite() && *v >= 0.0);
                    if !fine {
                        return Err(format!("correction for {key} is not a finite, bounded shift"));
                    }
                }
            }
        }
        Ok(())
    }
}

/// The energy objective of a group from its members' predicted slowdowns (normalised rates):
/// the power model's work per unit of energy ([`crate::energy`]).
fn energy_of(members: &[Member<'_>], slowdowns: &[f64]) -> f64 {
    crate::energy::work_per_energy(members.iter().map(|m| m.profile).zip(slowdowns.iter().copied()))
}

impl Predictor for Model {
    fn required_gain(&self, members: &[Member<'_>]) -> f64 {
        match self {
            Model::Linear { .. } => 0.0,
            Model::Slowdown(m) => m.required_gain(members),
        }
    }

    fn new_workload_gain(&self, members: &[Member<'_>]) -> Option<f64> {
        match self {
            Model::Linear { .. } => None,
            Model::Slowdown(m) => m.new_workload_gain(members),
        }
    }

    fn knows(&self, workload: Option<&str>) -> bool {
        match self {
            Model::Linear { .. } => true,
            Model::Slowdown(m) => m.knows(workload),
        }
    }

    fn doubt(&self, members: &[Member<'_>]) -> f64 {
        match self {
            Model::Linear { .. } => 0.0,
            Model::Slowdown(m) => m.doubt(members),
        }
    }

    fn predict(&self, members: &[Member<'_>], objective: Objective) -> f64 {
        match self {
            // Trained for one objective: asked for another, it has no answer (NaN is never
            // chosen by `select`); callers check [`Model::serves`] first.
            // Its summed features need every kernel metric: without them it has no answer.
            Model::Linear { objective: o, model } => {
                if *o == objective && members.iter().all(|m| m.profile.has_kernel_metrics) {
                    model.predict(&combine(members.iter().map(|m| m.profile)))
                } else {
                    f64::NAN
                }
            }
            Model::Slowdown(m) => match objective {
                Objective::ThroughputSum => m.throughput_sum(members),
                Objective::NormalisedProgress => m.normalised_progress(members),
                Objective::Energy => energy_of(members, &m.slowdowns(members)),
            },
        }
    }

    fn predict_with_progress(&self, members: &[Member<'_>], objective: Objective) -> (f64, f64) {
        match self {
            Model::Linear { .. } => crate::selection::predict_each(self, members, objective),
            // Both from one prediction of the slowdowns: the prolog scores every candidate so.
            Model::Slowdown(m) => match objective {
                Objective::ThroughputSum => m.sum_and_progress(members),
                Objective::NormalisedProgress => {
                    let progress = m.normalised_progress(members);
                    (progress, progress)
                }
                Objective::Energy => {
                    let s = m.slowdowns(members);
                    (energy_of(members, &s), s.iter().sum())
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::features::{Feature, Profile};

    /// Pairs of 5 workloads, each slowed by its partner's SM utilisation.
    fn pairs() -> Vec<Group> {
        let prof = |i: usize| {
            let mut f = [1.0; FEATURE_COUNT];
            f[Feature::ExclusiveThroughput.index()] = 10.0 + 3.0 * i as f64;
            f[Feature::SmUtil.index()] = 20.0 + 15.0 * i as f64;
            Profile::new(f)
        };
        let mut out = Vec::new();
        for i in 0..5 {
            for j in i..5 {
                let (a, b) = (prof(i), prof(j));
                let rate = |own: &Profile, other: &Profile| {
                    own.exclusive_throughput()
                        * (1.0 - other.features[Feature::SmUtil.index()] / 200.0)
                };
                out.push(Group {
                    workloads: vec![format!("w{i}"), format!("w{j}")],
                    throughputs: vec![rate(&a, &b), rate(&b, &a)],
                    profiles: vec![a, b],
                });
            }
        }
        out
    }

    #[test]
    fn the_energy_objective_is_the_power_models_value_at_the_predicted_slowdowns() {
        let data = pairs();
        let groups: Vec<&Group> = data.iter().collect();
        let m = Model::train(
            ModelKind::Slowdown,
            &groups,
            Objective::NormalisedProgress,
            Default::default(),
        )
        .unwrap();
        assert!(m.serves(Objective::Energy));
        let Model::Slowdown(sm) = &m else { panic!("not a slowdown model") };
        for g in &data {
            let members = g.members();
            let s = sm.slowdowns(&members);
            let want = crate::energy::work_per_energy(g.profiles.iter().zip(s.iter().copied()));
            assert_eq!(m.predict(&members, Objective::Energy).to_bits(), want.to_bits());
            let (energy, progress) = m.predict_with_progress(&members, Objective::Energy);
            assert_eq!(energy.to_bits(), want.to_bits());
            assert_eq!(progress.to_bits(), s.iter().sum::<f64>().to_bits());
        }
        // A linear model trained for throughput has no answer for it.
        let lin =
            Model::train(ModelKind::Linear, &groups, Objective::ThroughputSum, Default::default())
                .unwrap();
        assert!(!lin.serves(Objective::Energy));
        assert!(lin.predict(&data[0].members(), Objective::Energy).is_nan());
    }

    #[test]
    fn both_measures_at_once_are_the_two_predictions() {
        let data = pairs();
        let groups: Vec<&Group> = data.iter().collect();
        for (kind, objective) in [
            (ModelKind::Slowdown, Objective::ThroughputSum),
            (ModelKind::Slowdown, Objective::NormalisedProgress),
            (ModelKind::Linear, Objective::ThroughputSum),
        ] {
            let m = Model::train(kind, &groups, objective, Default::default()).unwrap();
            for g in &data {
                let members = g.members();
                let (predicted, progress) = m.predict_with_progress(&members, objective);
                let separately = m.predict(&members, Objective::NormalisedProgress);
                assert_eq!(predicted.to_bits(), m.predict(&members, objective).to_bits());
                assert_eq!(progress.to_bits(), separately.to_bits(), "{kind:?} {objective:?}");
            }
        }
    }
}
