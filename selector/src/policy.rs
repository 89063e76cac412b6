//! The choosing rules: single-feature rules as the artifact defines them, the model's argmax, the
//! random expectation and the oracle, and the objective a choice is scored by.

use crate::dataset::Group;
use crate::features::{Feature, FEATURE_COUNT};

/// What a colocation is worth.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Objective {
    /// The paper's objective: the members' colocated throughputs summed (steps per second).
    #[default]
    ThroughputSum,
    /// Σ colocated / exclusive throughput per member: progress in "exclusive-job units", which
    /// stops one fast inference job from dominating the choice.
    NormalisedProgress,
    /// Work per unit of energy: normalised progress over the GPU's modelled power
    /// ([`crate::energy`]). Models are trained for normalised progress ([`Objective::trained_as`])
    /// and the power comes from the members' SM utilisation.
    Energy,
}

impl Objective {
    /// The objective's value for a measured group.
    pub fn value(self, g: &Group) -> f64 {
        match self {
            Objective::ThroughputSum => g.total_throughput(),
            Objective::NormalisedProgress => g.normalised_progress(),
            Objective::Energy => crate::energy::work_per_energy(
                g.profiles
                    .iter()
                    .zip(&g.throughputs)
                    .map(|(p, t)| (p, t / p.exclusive_throughput())),
            ),
        }
    }

    /// The objective a model serving this one is trained and validated in: the energy objective
    /// is derived from predicted normalised progress, so its models learn that.
    pub fn trained_as(self) -> Objective {
        match self {
            Objective::Energy => Objective::NormalisedProgress,
            o => o,
        }
    }

    /// Stable name, for config and reports.
    pub fn key(self) -> &'static str {
        match self {
            Objective::ThroughputSum => "throughput-sum",
            Objective::NormalisedProgress => "normalised-progress",
            Objective::Energy => "energy",
        }
    }

    /// Parses [`Objective::key`].
    pub fn from_key(s: &str) -> Option<Objective> {
        [Objective::ThroughputSum, Objective::NormalisedProgress, Objective::Energy]
            .into_iter()
            .find(|o| o.key() == s)
    }
}

/// Whether a single-feature rule picks the largest or the smallest group value.
///
/// The artifact maximises exclusive throughput, Compute (SM) Throughput and sm%, and minimises
/// every other feature (memcap and mem% included).
pub fn rule_maximises(feature: Feature) -> bool {
    matches!(feature, Feature::ExclusiveThroughput | Feature::SmThroughput | Feature::SmUtil)
}

/// The name a rule has in reports: `memcap`, `sm%` and `mem%` as in the paper; the others by
/// their key.
pub fn rule_name(feature: Feature) -> &'static str {
    match feature {
        Feature::SmUtil => "sm%",
        Feature::MemUtil => "mem%",
        f => f.key(),
    }
}

/// Index of the first largest value (NumPy's `argmax` tie rule). NaNs never win.
pub fn argmax_first(values: &[f64]) -> Option<usize> {
    let mut best: Option<(usize, f64)> = None;
    for (i, &v) in values.iter().enumerate() {
        if v.is_nan() {
            continue;
        }
        if best.is_none_or(|(_, b)| v > b) {
            best = Some((i, v));
        }
    }
    best.map(|(i, _)| i)
}

/// Index of the first smallest value. NaNs never win.
pub fn argmin_first(values: &[f64]) -> Option<usize> {
    let neg: Vec<f64> = values.iter().map(|v| -v).collect();
    argmax_first(&neg)
}

/// The candidate a single-feature rule picks, from the candidates' group feature vectors.
pub fn rule_pick(features: &[[f64; FEATURE_COUNT]], feature: Feature) -> Option<usize> {
    let col: Vec<f64> = features.iter().map(|f| f[feature.index()]).collect();
    if rule_maximises(feature) {
        argmax_first(&col)
    } else {
        argmin_first(&col)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ties_go_to_the_first_row() {
        assert_eq!(argmax_first(&[1.0, 3.0, 3.0]), Some(1));
        assert_eq!(argmin_first(&[2.0, 1.0, 1.0]), Some(1));
        assert_eq!(argmax_first(&[]), None);
        assert_eq!(argmax_first(&[f64::NAN, 0.5]), Some(1));
    }

    #[test]
    fn rules_follow_the_artifact_directions() {
        let mut a = [0.0; FEATURE_COUNT];
        let mut b = [0.0; FEATURE_COUNT];
        a[Feature::Memcap.index()] = 4.0;
        b[Feature::Memcap.index()] = 2.0;
        a[Feature::SmUtil.index()] = 90.0;
        b[Feature::SmUtil.index()] = 50.0;
        let f = [a, b];
        assert_eq!(rule_pick(&f, Feature::Memcap), Some(1));
        assert_eq!(rule_pick(&f, Feature::SmUtil), Some(0));
        assert_eq!(rule_name(Feature::Memcap), "memcap");
        assert_eq!(rule_name(Feature::MemUtil), "mem%");
    }

    #[test]
    fn objective_keys_round_trip() {
        for o in [Objective::ThroughputSum, Objective::NormalisedProgress] {
            assert_eq!(Objective::from_key(o.key()), Some(o));
        }
    }
}
