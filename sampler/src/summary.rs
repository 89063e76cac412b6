//! What kace-sampler's readings say of a time window: the system profile (what `kace profile
//! run` measures on an idle GPU, taken from a job's alone intervals instead) and the GPU's
//! energy over it.

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

/// Share of a window the readings with an energy value must span for the GPU's energy over
/// the window to be estimated from them (scaled up to the whole window): with the sampler's 1 s
/// interval a window of a few seconds has too few to say.
pub const MIN_ENERGY_COVERAGE: f64 = 0.5;

/// Most a GPU's mean power may be for an energy estimate to be believed, W (an H200 draws up
/// to 700 W; a counter that jumps by more was reset or misread).
pub const MAX_GPU_POWER_W: f64 = 5_000.0;

/// The GPU's energy over `[from, to]`, joules, from the readings inside it: the energy counter's
/// rise between the first and the last reading that has one, scaled to the whole window, or,
/// on a GPU without the counter, the mean of at least three power readings times the window.
/// `None` when the readings span less than [`MIN_ENERGY_COVERAGE`] of the window, when the
/// counter ran backwards (the driver was reloaded) or implies more than [`MAX_GPU_POWER_W`].
/// The energy is the whole GPU's, whoever ran on it.
pub fn energy_within(readings: &[Reading], from: f64, to: f64) -> Option<f64> {
    let window = to - from;
    if !(window.is_finite() && window > 0.0) {
        return None;
    }
    let inside = || readings.iter().filter(move |r| r.time >= from && r.time <= to);
    let counted: Vec<(f64, u64)> = inside().filter_map(|r| Some((r.time, r.energy_mj?))).collect();
    let joules = match (counted.first(), counted.last()) {
        (Some(&(t0, e0)), Some(&(t1, e1))) if t1 - t0 >= MIN_ENERGY_COVERAGE * window => {
            let rise = e1.checked_sub(e0)? as f64 / 1e3;
            rise * window / (t1 - t0)
        }
        _ => {
            let power: Vec<(f64, f64)> =
                inside().filter_map(|r| Some((r.time, r.power_w?))).collect();
            let span = power.last()?.0 - power.first()?.0;
            if power.len() < 3 || span < MIN_ENERGY_COVERAGE * window {
                return None;
            }
            power.iter().map(|p| p.1).sum::<f64>() / power.len() as f64 * window
        }
    };
    (joules.is_finite() && joules <= MAX_GPU_POWER_W * window).then_some(joules)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(sm: Option<f64>, mem: Option<f64>, used_gib: Option<u64>) -> Reading {
        Reading {
            time: 0.0,
            sm_pct: sm,
            mem_pct: mem,
            used_bytes: used_gib.map(|g| g << 30),
            ..Reading::default()
        }
    }

    fn e(time: f64, energy_mj: Option<u64>, power_w: Option<f64>) -> Reading {
        Reading { time, energy_mj, power_w, ..Reading::default() }
    }

    #[test]
    fn energy_is_the_counters_rise_scaled_to_the_window() {
        // 200 W between readings at 11 s and 19 s of a 10..20 window: 1 600 J seen, 2 000 J.
        let rs: Vec<Reading> = (11..=19)
            .map(|t| e(f64::from(t), Some(9_000_000 + 200_000 * t as u64), None))
            .collect();
        let j = energy_within(&rs, 10.0, 20.0).unwrap();
        assert!((j - 2_000.0).abs() < 1e-6, "{j}");
        // Readings outside the window do not count.
        assert!((energy_within(&rs, 15.0, 19.0).unwrap() - 800.0).abs() < 1e-6);
    }

    #[test]
    fn without_the_counter_the_mean_power_serves() {
        let rs = [e(0.0, None, Some(100.0)), e(1.0, None, Some(200.0)), e(2.0, None, Some(300.0))];
        assert_eq!(energy_within(&rs, 0.0, 4.0), Some(800.0));
        // Too few power readings, or too short a span.
        assert_eq!(energy_within(&rs[..2], 0.0, 2.0), None);
        assert_eq!(energy_within(&rs, 0.0, 10.0), None);
    }

    #[test]
    fn a_reset_counter_a_short_span_or_an_absurd_rise_gives_nothing() {
        let reset = [e(0.0, Some(5_000_000), None), e(9.0, Some(1_000), None)];
        assert_eq!(energy_within(&reset, 0.0, 10.0), None);
        let short = [e(0.0, Some(0), None), e(4.0, Some(400_000), None)];
        assert_eq!(energy_within(&short, 0.0, 10.0), None);
        let absurd = [e(0.0, Some(0), None), e(10.0, Some(u64::MAX / 2), None)];
        assert_eq!(energy_within(&absurd, 0.0, 10.0), None);
        assert_eq!(energy_within(&[], 0.0, 10.0), None);
        assert_eq!(energy_within(&short, 5.0, 5.0), None);
        assert_eq!(energy_within(&short, 0.0, f64::NAN), None);
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
