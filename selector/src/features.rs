//! The paper's ten workload features, a workload profile, and how k profiles combine into one
//! feature vector for a colocation group.

/// Number of features in a profile and in a combined group vector.
pub const FEATURE_COUNT: usize = 10;

/// One of the ten per-workload features KACE profiles, in the artifact's order.
///
/// The first six come from Nsight Compute (duration-weighted over the profiled kernels); the last
/// four from an exclusive run (NVML / `nvidia-smi pmon` and the job's own progress).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Feature {
    /// Mean threads per kernel launch (grid × block), duration-weighted.
    Threads,
    /// Nsight Compute "Compute (SM) Throughput" %, duration-weighted.
    SmThroughput,
    /// Nsight Compute "DRAM Throughput" %, duration-weighted.
    DramThroughput,
    /// Nsight Compute "Memory Throughput" %, duration-weighted.
    MemoryThroughput,
    /// Threads × registers per thread, duration-weighted.
    Registers,
    /// Grid size × static shared memory per block (bytes), duration-weighted.
    StaticSharedMemory,
    /// Throughput when the workload runs alone (steps per second).
    ExclusiveThroughput,
    /// Mean per-process SM utilisation % while running alone.
    SmUtil,
    /// Mean per-process memory-controller utilisation % while running alone.
    MemUtil,
    /// Peak GPU memory used while running alone, in GiB.
    Memcap,
}

impl Feature {
    /// Every feature, in the artifact's column order.
    pub const ALL: [Feature; FEATURE_COUNT] = [
        Feature::Threads,
        Feature::SmThroughput,
        Feature::DramThroughput,
        Feature::MemoryThroughput,
        Feature::Registers,
        Feature::StaticSharedMemory,
        Feature::ExclusiveThroughput,
        Feature::SmUtil,
        Feature::MemUtil,
        Feature::Memcap,
    ];

    /// Position of this feature in a feature vector.
    pub fn index(self) -> usize {
        self as usize
    }

    /// The artifact's name for the feature: the column suffix after `wN` in its tables, and the
    /// column name in its results.
    pub fn artifact_name(self) -> &'static str {
        match self {
            Feature::Threads => "_Threads",
            Feature::SmThroughput => "_Compute (SM) Throughput",
            Feature::DramThroughput => "_DRAM Throughput",
            Feature::MemoryThroughput => "_Memory Throughput",
            Feature::Registers => "_Registers",
            Feature::StaticSharedMemory => "_Static Shared Memory",
            Feature::ExclusiveThroughput => "exclusive_throughput",
            Feature::SmUtil => "sm%",
            Feature::MemUtil => "mem%",
            Feature::Memcap => "memcap",
        }
    }

    /// A short stable identifier (for config files, JSON and the database).
    pub fn key(self) -> &'static str {
        match self {
            Feature::Threads => "threads",
            Feature::SmThroughput => "sm_throughput",
            Feature::DramThroughput => "dram_throughput",
            Feature::MemoryThroughput => "memory_throughput",
            Feature::Registers => "registers",
            Feature::StaticSharedMemory => "static_shared_memory",
            Feature::ExclusiveThroughput => "exclusive_throughput",
            Feature::SmUtil => "sm_util",
            Feature::MemUtil => "mem_util",
            Feature::Memcap => "memcap",
        }
    }

    /// Looks a feature up by its artifact name or its key.
    pub fn from_name(name: &str) -> Option<Feature> {
        Feature::ALL.into_iter().find(|f| f.artifact_name() == name || f.key() == name)
    }

    /// Whether the group value is the mean of the members' values rather than their sum.
    ///
    /// The artifact averages exactly the features whose name contains `%` (the two utilisation
    /// percentages); the Nsight Compute throughput percentages are summed, as in the paper's code.
    pub fn is_averaged(self) -> bool {
        self.artifact_name().contains('%')
    }

    /// Whether the feature comes from Nsight Compute (a kernel profile, which needs an admin and
    /// an idle GPU) rather than from an exclusive run that NVML can sample on any node
    /// (`kace-sampler`): the first six are kernel metrics, the last four system metrics.
    pub fn is_kernel_metric(self) -> bool {
        self.index() < Feature::ExclusiveThroughput.index()
    }

    /// The six Nsight Compute features.
    pub const KERNEL: [Feature; 6] = [
        Feature::Threads,
        Feature::SmThroughput,
        Feature::DramThroughput,
        Feature::MemoryThroughput,
        Feature::Registers,
        Feature::StaticSharedMemory,
    ];

    /// The four system features an exclusive run yields (NVML and the job's progress).
    pub const SYSTEM: [Feature; 4] =
        [Feature::ExclusiveThroughput, Feature::SmUtil, Feature::MemUtil, Feature::Memcap];
}

/// A workload's profile: its features measured alone, indexed by [`Feature::index`].
///
/// The four system features are always known; the six kernel metrics
/// ([`Feature::is_kernel_metric`]) may be absent: a workload that only ran under kace has a
/// system profile sampled by NVML, not an Nsight Compute profile. Models predict from what a
/// profile has (the slowdown model fills absent kernel metrics from the trained workloads
/// nearest in system-profile space; the paper's linear model has no answer without them).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Profile {
    /// Feature values in [`Feature::ALL`] order. Without kernel metrics the six kernel values
    /// are 0 and mean nothing: read them through [`Profile::value`].
    pub features: [f64; FEATURE_COUNT],
    /// Whether the six kernel metrics were measured.
    pub has_kernel_metrics: bool,
}

/// A profile for the crate's tests: every feature 1 but the exclusive throughput and the SM
/// utilisation.
#[cfg(test)]
pub(crate) fn test_profile(excl: f64, sm: f64) -> Profile {
    let mut f = [1.0; FEATURE_COUNT];
    f[Feature::ExclusiveThroughput.index()] = excl;
    f[Feature::SmUtil.index()] = sm;
    Profile::new(f)
}

impl Profile {
    /// A complete profile from values in [`Feature::ALL`] order.
    pub fn new(features: [f64; FEATURE_COUNT]) -> Self {
        Profile { features, has_kernel_metrics: true }
    }

    /// A profile from what was measured: `None` when a system feature is missing (nothing can
    /// be predicted without it); without every kernel metric, a system-only profile (a partial
    /// kernel profile is not used: the six come from one Nsight Compute run).
    pub fn from_measured(values: [Option<f64>; FEATURE_COUNT]) -> Option<Profile> {
        let mut features = [0.0; FEATURE_COUNT];
        for f in Feature::SYSTEM {
            features[f.index()] = values[f.index()]?;
        }
        let kernel: Option<Vec<f64>> = Feature::KERNEL.iter().map(|f| values[f.index()]).collect();
        match kernel {
            Some(k) => {
                for (f, v) in Feature::KERNEL.iter().zip(k) {
                    features[f.index()] = v;
                }
                Some(Profile::new(features))
            }
            None => Some(Profile { features, has_kernel_metrics: false }),
        }
    }

    /// This profile with its kernel metrics hidden: what a workload has before anyone ran
    /// Nsight Compute on it.
    pub fn system_only(&self) -> Profile {
        let mut features = self.features;
        for f in Feature::KERNEL {
            features[f.index()] = 0.0;
        }
        Profile { features, has_kernel_metrics: false }
    }

    /// The value of one feature, `None` for a kernel metric the profile does not have.
    pub fn value(&self, feature: Feature) -> Option<f64> {
        (self.has_kernel_metrics || !feature.is_kernel_metric()).then(|| self.get(feature))
    }

    /// The value of one feature (0 for an absent kernel metric; see [`Profile::value`]).
    pub fn get(&self, feature: Feature) -> f64 {
        self.features[feature.index()]
    }

    /// Peak memory in GiB.
    pub fn memcap(&self) -> f64 {
        self.get(Feature::Memcap)
    }

    /// Exclusive throughput in steps per second.
    pub fn exclusive_throughput(&self) -> f64 {
        self.get(Feature::ExclusiveThroughput)
    }
}

/// A group's feature vector: the members' features summed, or averaged where
/// [`Feature::is_averaged`]. Works for any group size k ≥ 1.
pub fn combine<'a, I>(profiles: I) -> [f64; FEATURE_COUNT]
where
    I: IntoIterator<Item = &'a Profile>,
{
    let mut out = [0.0; FEATURE_COUNT];
    let mut k = 0usize;
    for p in profiles {
        k += 1;
        for (o, v) in out.iter_mut().zip(p.features.iter()) {
            *o += v;
        }
    }
    if k > 0 {
        for f in Feature::ALL {
            if f.is_averaged() {
                out[f.index()] /= k as f64;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_utilisation_percentages_are_averaged() {
        let averaged: Vec<_> = Feature::ALL.into_iter().filter(|f| f.is_averaged()).collect();
        assert_eq!(averaged, vec![Feature::SmUtil, Feature::MemUtil]);
    }

    #[test]
    fn combine_sums_and_averages_for_any_k() {
        let a = Profile::new([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 80.0, 40.0, 1.5]);
        let b = Profile::new([10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 20.0, 10.0, 2.5]);
        let pair = combine([&a, &b]);
        assert_eq!(pair, [11.0, 22.0, 33.0, 44.0, 55.0, 66.0, 77.0, 50.0, 25.0, 4.0]);
        let triple = combine([&a, &b, &b]);
        assert_eq!(triple[Feature::Threads.index()], 21.0);
        assert!((triple[Feature::SmUtil.index()] - 40.0).abs() < 1e-12);
        assert_eq!(combine([&a]), a.features);
    }

    #[test]
    fn kernel_metrics_may_be_absent_system_metrics_may_not() {
        assert_eq!(Feature::ALL.iter().filter(|f| f.is_kernel_metric()).count(), 6);
        assert!(Feature::SYSTEM.iter().all(|f| !f.is_kernel_metric()));
        let full = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0];
        let measured = full.map(Some);
        assert_eq!(Profile::from_measured(measured), Some(Profile::new(full)));
        // NVML only: the sampler's system profile.
        let mut sys = measured;
        for f in Feature::KERNEL {
            sys[f.index()] = None;
        }
        let p = Profile::from_measured(sys).unwrap();
        assert!(!p.has_kernel_metrics);
        assert_eq!(p, Profile::new(full).system_only());
        assert_eq!(p.value(Feature::Threads), None);
        assert_eq!(p.value(Feature::Memcap), Some(10.0));
        assert_eq!(p.exclusive_throughput(), 7.0);
        // One kernel metric short is a system-only profile; a system metric short is none.
        let mut partial = measured;
        partial[Feature::Registers.index()] = None;
        assert!(!Profile::from_measured(partial).unwrap().has_kernel_metrics);
        let mut no_memcap = measured;
        no_memcap[Feature::Memcap.index()] = None;
        assert_eq!(Profile::from_measured(no_memcap), None);
    }

    #[test]
    fn names_round_trip() {
        for f in Feature::ALL {
            assert_eq!(Feature::from_name(f.artifact_name()), Some(f));
            assert_eq!(Feature::from_name(f.key()), Some(f));
            assert_eq!(Feature::ALL[f.index()], f);
        }
        assert_eq!(Feature::from_name("bogus"), None);
    }
}
