//! The simulated world's ground truth: the workloads, their profiles and exclusive throughput,
//! what each measured pair achieves together, and which pairs do not fit in a GPU's memory.

use std::collections::HashMap;

use kace_selector::dataset::ColocationData;
use kace_selector::Profile;

use crate::error::SimError;

/// A workload's index in its [`World`].
pub type WorkloadId = u16;

/// What happens when two workloads share a GPU.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PairKind {
    /// Measured: each runs at its colocated throughput (steps/s), in the order asked.
    Measured {
        /// The first job's throughput beside the second.
        first: f64,
        /// The second job's throughput beside the first.
        second: f64,
    },
    /// Σ memcap exceeds the GPU's memory: the job that joins fails with out-of-memory.
    OverMemory,
    /// Never measured but would fit: the world has no ground truth, so no policy may form it.
    Unknown,
}

/// One measured colocation, by workload name.
#[derive(Debug, Clone, PartialEq)]
pub struct MeasuredPair {
    /// The two workloads (they may be equal).
    pub workloads: [String; 2],
    /// Each one's throughput while colocated, in the same order.
    pub throughputs: [f64; 2],
}

/// The ground truth a simulation runs on.
#[derive(Debug, Clone, PartialEq)]
pub struct World {
    names: Vec<String>,
    profiles: Vec<Profile>,
    gpu_memory_gib: f64,
    /// `pairs[a * n + b]`: a first (the job already on the GPU), b joining.
    pairs: Vec<PairKind>,
    index: HashMap<String, WorkloadId>,
}

impl World {
    /// A world from named profiles, the measured pairs and the GPU's memory (GiB).
    ///
    /// A pair measured twice keeps its first measurement (the artifact's table has each
    /// unordered pair once). A self pair's first throughput goes to the job that was on the GPU
    /// first.
    pub fn new(
        workloads: Vec<(String, Profile)>,
        measured: &[MeasuredPair],
        gpu_memory_gib: f64,
    ) -> Result<World, SimError> {
        if workloads.is_empty() {
            return Err(SimError::World("no workloads".into()));
        }
        if workloads.len() > usize::from(WorkloadId::MAX) {
            return Err(SimError::World(format!("{} workloads is too many", workloads.len())));
        }
        if !(gpu_memory_gib.is_finite() && gpu_memory_gib > 0.0) {
            return Err(SimError::Config(format!(
                "GPU memory must be a positive number of GiB, not {gpu_memory_gib}"
            )));
        }
        let mut index = HashMap::new();
        let mut names = Vec::with_capacity(workloads.len());
        let mut profiles = Vec::with_capacity(workloads.len());
        for (i, (name, p)) in workloads.into_iter().enumerate() {
            let x = p.exclusive_throughput();
            if !(x.is_finite() && x > 0.0) {
                return Err(SimError::World(format!(
                    "workload {name}: exclusive throughput must be positive, not {x}"
                )));
            }
            if !(p.memcap().is_finite() && p.memcap() >= 0.0) {
                return Err(SimError::World(format!("workload {name}: bad memcap {}", p.memcap())));
            }
            if index.insert(name.clone(), i as WorkloadId).is_some() {
                return Err(SimError::World(format!("workload {name} is listed twice")));
            }
            names.push(name);
            profiles.push(p);
        }
        let n = names.len();
        let mut pairs = vec![PairKind::Unknown; n * n];
        for a in 0..n {
            for b in 0..n {
                if profiles[a].memcap() + profiles[b].memcap() > gpu_memory_gib {
                    pairs[a * n + b] = PairKind::OverMemory;
                }
            }
        }
        for m in measured {
            let id = |w: &str| {
                index.get(w).map(|&i| usize::from(i)).ok_or_else(|| {
                    SimError::World(format!("a measured pair names {w}, which has no profile"))
                })
            };
            let (a, b) = (id(&m.workloads[0])?, id(&m.workloads[1])?);
            let [ta, tb] = m.throughputs;
            if !(ta.is_finite() && tb.is_finite() && ta > 0.0 && tb > 0.0) {
                return Err(SimError::World(format!(
                    "pair ({}, {}): colocated throughputs must be positive, not ({ta}, {tb})",
                    m.workloads[0], m.workloads[1]
                )));
            }
            if matches!(pairs[a * n + b], PairKind::Measured { .. }) {
                continue;
            }
            // A measured pair did fit, whatever the summed memcap says.
            pairs[a * n + b] = PairKind::Measured { first: ta, second: tb };
            pairs[b * n + a] = PairKind::Measured { first: tb, second: ta };
            if a == b {
                pairs[a * n + a] = PairKind::Measured { first: ta, second: tb };
            }
        }
        Ok(World { names, profiles, gpu_memory_gib, pairs, index })
    }

    /// The world of a 2-way colocation table (the artifact's pair table): every workload in it,
    /// with the profile it has there, and every row as a measured pair.
    pub fn from_colocations(data: &ColocationData, gpu_memory_gib: f64) -> Result<World, SimError> {
        if data.k != 2 {
            return Err(SimError::World(format!(
                "the simulator shares GPUs in pairs; the table has groups of {}",
                data.k
            )));
        }
        let profiles = data.profiles();
        let workloads: Vec<(String, Profile)> = data
            .workloads()
            .into_iter()
            .filter_map(|w| profiles.get(&w).map(|p| (w.clone(), *p)))
            .collect();
        let measured: Vec<MeasuredPair> = data
            .groups
            .iter()
            .map(|g| MeasuredPair {
                workloads: [g.workloads[0].clone(), g.workloads[1].clone()],
                throughputs: [g.throughputs[0], g.throughputs[1]],
            })
            .collect();
        World::new(workloads, &measured, gpu_memory_gib)
    }

    /// Number of workloads.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether the world has no workloads (never true for a constructed world).
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// A workload's name.
    pub fn name(&self, w: WorkloadId) -> &str {
        &self.names[usize::from(w)]
    }

    /// Every workload name, by id.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// A workload's id by name.
    pub fn id(&self, name: &str) -> Option<WorkloadId> {
        self.index.get(name).copied()
    }

    /// A workload's profile.
    pub fn profile(&self, w: WorkloadId) -> &Profile {
        &self.profiles[usize::from(w)]
    }

    /// This world as a model sees it while `workload` is new: its profile without kernel
    /// metrics (the NVML system profile an unprofiled workload gets from its first runs).
    /// The ground truth (throughputs, memory, pairs) is the same.
    pub fn with_system_only(&self, workload: WorkloadId) -> World {
        let mut w = self.clone();
        let i = usize::from(workload);
        w.profiles[i] = w.profiles[i].system_only();
        w
    }

    /// A workload's throughput alone (steps/s).
    pub fn exclusive(&self, w: WorkloadId) -> f64 {
        self.profiles[usize::from(w)].exclusive_throughput()
    }

    /// The GPU memory every GPU has (GiB).
    pub fn gpu_memory_gib(&self) -> f64 {
        self.gpu_memory_gib
    }

    /// What happens when `joiner` joins a GPU where `first` runs.
    #[inline]
    pub fn pair(&self, first: WorkloadId, joiner: WorkloadId) -> PairKind {
        self.pairs[usize::from(first) * self.names.len() + usize::from(joiner)]
    }

    /// How many unordered pairs (self pairs included) are of each kind:
    /// (measured, over memory, unknown).
    pub fn pair_counts(&self) -> (usize, usize, usize) {
        let n = self.names.len();
        let mut c = (0, 0, 0);
        for a in 0..n {
            for b in a..n {
                match self.pairs[a * n + b] {
                    PairKind::Measured { .. } => c.0 += 1,
                    PairKind::OverMemory => c.1 += 1,
                    PairKind::Unknown => c.2 += 1,
                }
            }
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kace_selector::{Feature, FEATURE_COUNT};

    pub(crate) fn profile(exclusive: f64, memcap: f64) -> Profile {
        let mut f = [1.0; FEATURE_COUNT];
        f[Feature::ExclusiveThroughput.index()] = exclusive;
        f[Feature::Memcap.index()] = memcap;
        Profile::new(f)
    }

    fn pair(a: &str, b: &str, ta: f64, tb: f64) -> MeasuredPair {
        MeasuredPair { workloads: [a.into(), b.into()], throughputs: [ta, tb] }
    }

    #[test]
    fn pairs_are_measured_over_memory_or_unknown_in_both_orders() {
        let w = World::new(
            vec![
                ("a".into(), profile(10.0, 10.0)),
                ("b".into(), profile(5.0, 10.0)),
                ("c".into(), profile(4.0, 25.0)),
            ],
            &[pair("a", "b", 6.0, 4.0), pair("c", "c", 2.0, 3.0)],
            32.0,
        )
        .unwrap();
        let (a, b, c) = (w.id("a").unwrap(), w.id("b").unwrap(), w.id("c").unwrap());
        assert_eq!(w.pair(a, b), PairKind::Measured { first: 6.0, second: 4.0 });
        assert_eq!(w.pair(b, a), PairKind::Measured { first: 4.0, second: 6.0 });
        assert_eq!(w.pair(a, c), PairKind::OverMemory);
        assert_eq!(w.pair(a, a), PairKind::Unknown);
        // Measured beats the memory rule: the pair ran, so it fitted.
        assert_eq!(w.pair(c, c), PairKind::Measured { first: 2.0, second: 3.0 });
        assert_eq!(w.pair_counts(), (2, 2, 2));
    }

    #[test]
    fn bad_worlds_are_errors() {
        let ok = || vec![("a".to_string(), profile(10.0, 1.0))];
        assert!(matches!(World::new(vec![], &[], 32.0), Err(SimError::World(_))));
        assert!(matches!(World::new(ok(), &[], 0.0), Err(SimError::Config(_))));
        let e = World::new(ok(), &[pair("a", "zz", 1.0, 1.0)], 32.0).unwrap_err();
        assert!(e.to_string().contains("zz"), "{e}");
        let e = World::new(ok(), &[pair("a", "a", 1.0, -1.0)], 32.0).unwrap_err();
        assert!(e.to_string().contains("positive"), "{e}");
        let e = World::new(vec![("a".into(), profile(0.0, 1.0))], &[], 32.0).unwrap_err();
        assert!(e.to_string().contains("exclusive"), "{e}");
        let mut twice = ok();
        twice.push(("a".into(), profile(1.0, 1.0)));
        assert!(World::new(twice, &[], 32.0).is_err());
    }
}

/// A three-workload world small enough to check timelines by hand (tests only).
#[cfg(test)]
pub(crate) mod tests_support {
    use super::*;
    use kace_selector::{Feature, FEATURE_COUNT};

    /// A profile whose features are all 1 except exclusive throughput and memcap.
    pub(crate) fn profile(exclusive: f64, memcap: f64) -> Profile {
        let mut f = [1.0; FEATURE_COUNT];
        f[Feature::ExclusiveThroughput.index()] = exclusive;
        f[Feature::Memcap.index()] = memcap;
        Profile::new(f)
    }

    /// a: 10 steps/s, 10 GiB; b: 5 steps/s, 10 GiB; c: 4 steps/s, 25 GiB on a 32 GiB GPU.
    /// Measured: a+b run at 6 + 4, b+b at 3 + 3. a+c and b+c are over memory, c+c too, a+a is
    /// unknown.
    pub(crate) fn tiny_world() -> World {
        let m = |a: &str, b: &str, ta: f64, tb: f64| MeasuredPair {
            workloads: [a.into(), b.into()],
            throughputs: [ta, tb],
        };
        World::new(
            vec![
                ("a".into(), profile(10.0, 10.0)),
                ("b".into(), profile(5.0, 10.0)),
                ("c".into(), profile(4.0, 25.0)),
            ],
            &[m("a", "b", 6.0, 4.0), m("b", "b", 3.0, 3.0)],
            32.0,
        )
        .expect("a valid world")
    }
}
