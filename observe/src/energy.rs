//! What kace's GPUs spent in energy (issue 33 item 4), from the observations' energy (each
//! interval's GPU energy, from kace-sampler's reading of NVML's energy counter): joules per step
//! of each workload alone and shared, joules per unit of work, and the energy sharing saved
//! against running the same work one job after another. `kace report` and `kace metrics` show it.
//!
//! A unit of work is one *exclusive-second*: what a job does in one second alone on the GPU
//! (its steps over its workload's exclusive throughput), so that work is comparable across
//! workloads. A job's energy in a shared interval is its equal share of the GPU's
//! ([`Observation::energy_share_j`]). What sharing saved is the shared intervals' steps at each
//! workload's joules per step alone, less what those intervals took; its sign says whether
//! sharing paid.
//!
//! Steps come from the jobs' progress files, which their users write: a job that claims more
//! steps than it did makes its workload look cheaper per step. Ingest bounds claimed rates
//! against what kace measured ([`kace_sql::types::implausibility`]); the energy itself is root's.

use std::collections::BTreeMap;

use kace_sql::Observation;
use serde::Serialize;

/// One workload's energy per step.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct WorkloadEnergy {
    /// The workload.
    pub workload: String,
    /// Joules per step while its jobs had the GPU alone (`None`: never observed alone with energy).
    pub j_per_step_alone: Option<f64>,
    /// Joules per step while sharing (its share of the GPU's energy).
    pub j_per_step_shared: Option<f64>,
    /// Observations with energy and steps, alone and shared.
    pub alone_observations: usize,
    /// The same, shared.
    pub shared_observations: usize,
}

/// The energy figures of a set of observations.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Energy {
    /// Observations with an energy reading.
    pub observations_with_energy: usize,
    /// Observations without one (no sampler, a GPU without the counter, older records).
    pub observations_without_energy: usize,
    /// Joules the GPUs used over the observed intervals, alone and shared (each GPU counted once).
    pub alone_j: f64,
    /// The same, shared.
    pub shared_j: f64,
    /// Joules per exclusive-second of work alone (`None`: no work measured with energy). For
    /// one job alone this is the GPU's mean power while it ran.
    pub j_per_work_alone: Option<f64>,
    /// Joules per exclusive-second of work while sharing.
    pub j_per_work_shared: Option<f64>,
    /// What the shared intervals whose workload has a joules-per-step alone would have taken
    /// run one after another (their steps at that rate), joules.
    pub sequential_j: Option<f64>,
    /// What those same intervals took, joules.
    pub compared_shared_j: Option<f64>,
    /// `sequential_j − compared_shared_j`: what sharing saved (negative: it cost).
    pub saved_j: Option<f64>,
    /// `saved_j / sequential_j`.
    pub saved_fraction: Option<f64>,
    /// Per workload, by name.
    pub workloads: Vec<WorkloadEnergy>,
}

#[derive(Default)]
struct Sums {
    energy_j: f64,
    steps: f64,
    count: usize,
}

impl Sums {
    fn per_step(&self) -> Option<f64> {
        (self.steps > 0.0).then(|| self.energy_j / self.steps)
    }
}

/// The energy figures of `observations`; `exclusive(w)` is workload `w`'s exclusive throughput
/// (steps/s), when a profile has it.
pub fn energy(observations: &[&Observation], exclusive: &dyn Fn(&str) -> Option<f64>) -> Energy {
    let mut e = Energy::default();
    let mut per: BTreeMap<&str, (Sums, Sums)> = BTreeMap::new();
    let (mut work_alone, mut work_shared) = ((0.0, 0.0), (0.0, 0.0));
    for o in observations {
        let Some(j) = o.energy_share_j() else {
            e.observations_without_energy += 1;
            continue;
        };
        e.observations_with_energy += 1;
        let alone = o.exclusive();
        if alone {
            e.alone_j += j;
        } else {
            e.shared_j += j;
        }
        let Some(steps) = o.steps.filter(|s| s.is_finite() && *s > 0.0) else { continue };
        let sums = per.entry(o.workload.as_str()).or_default();
        let s = if alone { &mut sums.0 } else { &mut sums.1 };
        s.energy_j += j;
        s.steps += steps;
        s.count += 1;
        if let Some(x) = exclusive(&o.workload).filter(|x| x.is_finite() && *x > 0.0) {
            let w = if alone { &mut work_alone } else { &mut work_shared };
            w.0 += j;
            w.1 += steps / x;
        }
    }
    let per_work = |(j, work): (f64, f64)| (work > 0.0).then(|| j / work);
    e.j_per_work_alone = per_work(work_alone);
    e.j_per_work_shared = per_work(work_shared);
    let (mut sequential, mut took, mut compared) = (0.0, 0.0, false);
    for (alone, shared) in per.values() {
        if let Some(rate) = alone.per_step() {
            if shared.count > 0 {
                sequential += shared.steps * rate;
                took += shared.energy_j;
                compared = true;
            }
        }
    }
    if compared {
        e.sequential_j = Some(sequential);
        e.compared_shared_j = Some(took);
        e.saved_j = Some(sequential - took);
        e.saved_fraction = (sequential > 0.0).then(|| (sequential - took) / sequential);
    }
    e.workloads = per
        .into_iter()
        .map(|(w, (alone, shared))| WorkloadEnergy {
            workload: w.to_string(),
            j_per_step_alone: alone.per_step(),
            j_per_step_shared: shared.per_step(),
            alone_observations: alone.count,
            shared_observations: shared.count,
        })
        .collect();
    e
}

#[cfg(test)]
mod tests {
    use super::*;
    use kace_sql::types::Partner;

    fn obs(
        job: &str,
        w: &str,
        partner: Option<&str>,
        secs: f64,
        steps: f64,
        gpu_j: Option<f64>,
    ) -> Observation {
        Observation {
            key: format!("c/{job}/{secs}"),
            job: job.into(),
            workload: w.into(),
            partners: partner
                .map(|p| vec![Partner { job: format!("{p}-job"), workload: p.into() }])
                .unwrap_or_default(),
            node: "n1".into(),
            gpu: "0".into(),
            mps_share: None,
            start: 1000.0,
            end: 1000.0 + secs,
            steps: Some(steps),
            throughput: steps / secs,
            user: None,
            account: None,
            gpu_sm_pct: None,
            gpu_energy_j: gpu_j,
        }
    }

    #[test]
    fn sharing_saves_what_the_idle_power_would_have_cost_twice() {
        // Alone: a at 10 steps/s, 200 W (20 J/step); b at 5 steps/s, 150 W (30 J/step). Together
        // for 100 s: a at 6 steps/s, b at 3, the GPU at 250 W: 25 000 J, 12 500 each.
        let all = [
            obs("1", "a", None, 100.0, 1000.0, Some(20_000.0)),
            obs("2", "b", None, 100.0, 500.0, Some(15_000.0)),
            obs("3", "a", Some("b"), 100.0, 600.0, Some(25_000.0)),
            obs("4", "b", Some("a"), 100.0, 300.0, Some(25_000.0)),
            obs("5", "a", None, 50.0, 500.0, None),
        ];
        let refs: Vec<&Observation> = all.iter().collect();
        let excl = |w: &str| match w {
            "a" => Some(10.0),
            "b" => Some(5.0),
            _ => None,
        };
        let e = energy(&refs, &excl);
        assert_eq!((e.observations_with_energy, e.observations_without_energy), (4, 1));
        assert_eq!((e.alone_j, e.shared_j), (35_000.0, 25_000.0));
        // Alone: 35 000 J for 200 exclusive-seconds; shared: 25 000 J for 60 + 60.
        assert!((e.j_per_work_alone.unwrap() - 175.0).abs() < 1e-9, "{e:?}");
        assert!((e.j_per_work_shared.unwrap() - 25_000.0 / 120.0).abs() < 1e-9, "{e:?}");
        // One after the other: 600 × 20 + 300 × 30 = 21 000 J against 25 000 J: a loss here.
        assert_eq!(e.sequential_j, Some(21_000.0));
        assert_eq!(e.saved_j, Some(-4_000.0));
        let a = &e.workloads[0];
        assert_eq!((a.workload.as_str(), a.j_per_step_alone), ("a", Some(20.0)));
        assert!((a.j_per_step_shared.unwrap() - 12_500.0 / 600.0).abs() < 1e-9);
    }

    #[test]
    fn a_pair_that_does_more_work_per_joule_saves() {
        // As above, but the pair runs a at 8 and b at 4 steps/s: 800 × 20 + 400 × 30 = 28 000 J.
        let all = [
            obs("1", "a", None, 100.0, 1000.0, Some(20_000.0)),
            obs("2", "b", None, 100.0, 500.0, Some(15_000.0)),
            obs("3", "a", Some("b"), 100.0, 800.0, Some(25_000.0)),
            obs("4", "b", Some("a"), 100.0, 400.0, Some(25_000.0)),
        ];
        let refs: Vec<&Observation> = all.iter().collect();
        let e = energy(&refs, &|_| None);
        assert_eq!(e.saved_j, Some(3_000.0));
        assert!((e.saved_fraction.unwrap() - 3.0 / 28.0).abs() < 1e-12);
        // Without profiles there is no unit of work, but joules per step still are.
        assert_eq!((e.j_per_work_alone, e.j_per_work_shared), (None, None));
    }

    #[test]
    fn nothing_to_compare_without_alone_energy_or_any_energy() {
        let all = [obs("3", "a", Some("b"), 100.0, 800.0, Some(25_000.0))];
        let refs: Vec<&Observation> = all.iter().collect();
        let e = energy(&refs, &|_| Some(10.0));
        assert_eq!((e.sequential_j, e.saved_j, e.saved_fraction), (None, None, None));
        assert_eq!(energy(&[], &|_| None), Energy::default());
    }
}
