//! The system profile of a time window: what `kace profile run` measures on an idle GPU, taken
//! from kace-sampler's readings of a job's alone intervals instead.

use crate::ring::Reading;

/// The system part of a workload profile, from readings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SystemProfile {
    /// Mean SM utilization, %.
    pub sm_pct: f64,
    /// Mean memory-bandwidth utilization, %.
    pub mem_pct: f64,
    /// Peak device memory in use, GiB (the paper's memcap).
    pub memcap_gib: f64,
    /// Readings it was computed from.
    pub samples: usize,
}

/// The profile of `readings`, or `None` when fewer than `min_samples` carry both utilizations
/// (NVML gave nothing, or the window was too short to trust).
pub fn summarise(readings: &[Reading], min_samples: usize) -> Option<SystemProfile> {
    let both: Vec<(f64, f64)> =
        readings.iter().filter_map(|r| Some((r.sm_pct?, r.mem_pct?))).collect();
    if both.is_empty() || both.len() < min_samples {
        return None;
    }
    let n = both.len() as f64;
    let peak = readings.iter().filter_map(|r| r.used_bytes).max()?;
    Some(SystemProfile {
        sm_pct: both.iter().map(|b| b.0).sum::<f64>() / n,
        mem_pct: both.iter().map(|b| b.1).sum::<f64>() / n,
        memcap_gib: peak as f64 / f64::from(1u32 << 30),
        samples: both.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(sm: Option<f64>, mem: Option<f64>, used_gib: Option<u64>) -> Reading {
        Reading { time: 0.0, sm_pct: sm, mem_pct: mem, used_bytes: used_gib.map(|g| g << 30) }
    }

    #[test]
    fn means_of_utilization_and_peak_memory() {
        let p = summarise(
            &[
                r(Some(40.0), Some(10.0), Some(3)),
                r(Some(60.0), Some(30.0), Some(5)),
                r(None, None, Some(9)),
            ],
            2,
        )
        .unwrap();
        assert_eq!(p, SystemProfile { sm_pct: 50.0, mem_pct: 20.0, memcap_gib: 9.0, samples: 2 });
    }

    #[test]
    fn too_few_readings_give_no_profile() {
        assert_eq!(summarise(&[r(Some(40.0), Some(10.0), Some(3))], 2), None);
        assert_eq!(summarise(&[r(None, None, Some(3)); 5], 1), None);
        assert_eq!(summarise(&[], 0), None);
        assert_eq!(summarise(&[r(Some(1.0), Some(1.0), None)], 1), None);
    }
}
