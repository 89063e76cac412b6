//! The power model of the energy objective (`selection.objective = "energy"`, issue 33 item 4)
//! and of the simulator's energy figures: what a GPU draws with a group of jobs on it, from each
//! member's SM utilisation alone and its rate in the group.
//!
//! **The model (modelled, not measured per pair).** A GPU draws its idle power plus a dynamic
//! part that grows with the SM activity its jobs keep up: each member contributes its SM
//! utilisation alone times its normalised rate in the group (colocated / exclusive
//! throughput), so a job slowed to half its speed keeps the SMs half as busy; the dynamic part
//! saturates at the GPU's busy power. In units of the busy power:
//!
//! `P = f + (1 − f) · min(1, Σᵢ smᵢ/100 · rᵢ)`,
//!
//! with `f` = [`IDLE_POWER_FRACTION`]. Work per unit of energy is `Σᵢ rᵢ / P` (exclusive-seconds
//! per busy-power-second): sharing pays the idle power once for two jobs' work, and a job that
//! slows its partner gains nothing for it. Where the numbers come from: on the H200 run of
//! 2026-12-04 (docs/measurements/2026-12-04-h200-first-run.md) the GPU drew 82 W idle and 595 W
//! under a matrix loop that kept every SM busy; the KACE artifact has no power data, so the
//! simulator's energy figures rest on this model alone and say so.

use crate::features::{Feature, Profile};

/// The GPU's idle power over its power with every SM busy: 82 W / 595 W, measured on the H200
/// (a V100's, from NVIDIA's 300 W limit and a typical 40–50 W idle draw, is about 0.15).
pub const IDLE_POWER_FRACTION: f64 = 82.0 / 595.0;

/// The modelled power of a GPU running `members` (each `(profile, normalised rate)`), in units
/// of its busy power. An empty group draws the idle power.
pub fn group_power<'a>(members: impl IntoIterator<Item = (&'a Profile, f64)>) -> f64 {
    let busy: f64 = members
        .into_iter()
        .map(|(p, rate)| (p.get(Feature::SmUtil) / 100.0).clamp(0.0, 1.0) * rate.max(0.0))
        .sum();
    IDLE_POWER_FRACTION + (1.0 - IDLE_POWER_FRACTION) * busy.min(1.0)
}

/// Work per unit of energy of a group (Σ normalised rates over [`group_power`]): the energy
/// objective's value. NaN when a rate is not a number.
pub fn work_per_energy<'a>(members: impl IntoIterator<Item = (&'a Profile, f64)> + Clone) -> f64 {
    let work: f64 = members.clone().into_iter().map(|(_, r)| r).sum();
    work / group_power(members)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::features::test_profile;

    #[test]
    fn one_job_alone_draws_idle_plus_its_activity() {
        let p = test_profile(10.0, 50.0);
        let f = IDLE_POWER_FRACTION;
        assert!((group_power([(&p, 1.0)]) - (f + (1.0 - f) * 0.5)).abs() < 1e-12);
        assert_eq!(group_power(std::iter::empty()), f);
        // Activity saturates at the busy power.
        let busy = test_profile(10.0, 90.0);
        assert_eq!(group_power([(&busy, 1.0), (&busy, 1.0)]), 1.0);
    }

    #[test]
    fn a_pair_that_keeps_its_speed_does_more_work_per_joule() {
        let (a, b) = (test_profile(10.0, 40.0), test_profile(5.0, 40.0));
        let alone = work_per_energy([(&a, 1.0)]);
        // Together each at 0.8 of its speed: 1.6 units of work for one idle power.
        let shared = work_per_energy([(&a, 0.8), (&b, 0.8)]);
        assert!(shared > alone, "{shared} vs {alone}");
        // Slowed to half each, the pair does the work of one job alone for more power.
        let slowed = work_per_energy([(&a, 0.5), (&b, 0.5)]);
        assert!((slowed - alone).abs() < 1e-12, "{slowed} vs {alone}");
        assert!(work_per_energy([(&a, f64::NAN)]).is_nan());
    }
}
