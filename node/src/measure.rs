//! The profile measurement of a job's alone intervals: kace-sampler's readings of the job's GPU
//! while no other kace job shared it give its SM %, memory-bandwidth % and peak memory (memcap),
//! and its progress lines over the same intervals its exclusive throughput. This is what
//! `kace profile run` measures on an idle GPU, taken from the jobs users run anyway, so a
//! workload nobody profiled gets a profile (source `observed`) by running once.

use kace_profiling::progress::Point;
use kace_sampler::{summarise, Reading, SystemProfile};
use kace_sql::{NewProfile, FEATURE_COUNT, FIRST_SYSTEM_FEATURE, MEMCAP, OBSERVED_SOURCE};

use crate::epilog::{throughput_within, Segment};

/// What the alone intervals of one run gave.
#[derive(Debug, Clone, PartialEq)]
pub struct AloneRun {
    /// Seconds the job ran alone (after its warm-up, when progress lines tell it).
    pub seconds: f64,
    /// The sampler's summary, when enough readings fell inside.
    pub system: Option<SystemProfile>,
    /// Readings inside the alone intervals (with or without both utilizations).
    pub readings: usize,
    /// Steps per second over the alone intervals, when progress lines tell it.
    pub throughput: Option<f64>,
}

impl AloneRun {
    /// The measurement to store, when the run gave anything: exclusive throughput, SM %,
    /// memory-bandwidth % and memcap, as far as known.
    pub fn profile(&self, workload: &str, gpu_model: &str) -> Option<NewProfile> {
        let mut values = [None; FEATURE_COUNT];
        values[FIRST_SYSTEM_FEATURE] = self.throughput;
        if let Some(s) = self.system {
            values[FIRST_SYSTEM_FEATURE + 1] = Some(s.sm_pct);
            values[FIRST_SYSTEM_FEATURE + 2] = Some(s.mem_pct);
            values[MEMCAP] = Some(s.memcap_gib);
        }
        values.iter().any(Option::is_some).then(|| NewProfile {
            workload: workload.to_string(),
            gpu_model: gpu_model.to_string(),
            source: OBSERVED_SOURCE.to_string(),
            values,
        })
    }
}

/// Measures the alone intervals among `segments` (those with no partner). `readings` are the
/// GPU's readings over the job's run; `points` its progress lines. A job's first steps (its
/// warm-up: start-up, data loading, compilation) are not its steady state: when progress lines
/// tell when the warm-up ended, readings and steps before it are left out.
pub fn alone_run(
    segments: &[Segment],
    readings: &[Reading],
    points: &[Point],
    warmup: u64,
    min_samples: usize,
) -> AloneRun {
    let steady_from = points.iter().find(|p| p.steps >= warmup as f64).map(|p| p.time);
    let mut inside: Vec<Reading> = Vec::new();
    let (mut seconds, mut steps, mut stepped_seconds) = (0.0, 0.0, 0.0);
    for s in segments.iter().filter(|s| s.partners.is_empty()) {
        let from = steady_from.map_or(s.start, |t| t.max(s.start));
        if from >= s.end {
            continue;
        }
        seconds += s.end - from;
        inside.extend(readings.iter().filter(|r| r.time >= from && r.time <= s.end));
        if let Some((rate, n)) = throughput_within(points, from, s.end, warmup) {
            steps += n;
            stepped_seconds += n / rate;
        }
    }
    AloneRun {
        seconds,
        system: summarise(&inside, min_samples.max(1)),
        readings: inside.len(),
        throughput: (stepped_seconds > 0.0 && steps > 0.0).then(|| steps / stepped_seconds),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::JobRecord;

    fn seg(start: f64, end: f64, partner: bool) -> Segment {
        let partners = if partner {
            vec![JobRecord {
                job: 9,
                workload: "p".into(),
                start,
                end: None,
                user: None,
                thread_pct: None,
            }]
        } else {
            Vec::new()
        };
        Segment { start, end, partners }
    }

    fn reading(t: f64, sm: f64, gib: u64) -> Reading {
        Reading {
            time: t,
            sm_pct: Some(sm),
            mem_pct: Some(sm / 2.0),
            used_bytes: Some(gib << 30),
            ..Reading::default()
        }
    }

    #[test]
    fn only_alone_readings_after_the_warmup_count() {
        // Alone 0–20, shared 20–30 (a busy partner: 90 % SM, 20 GiB), alone again 30–40.
        let segs = [seg(0.0, 20.0, false), seg(20.0, 30.0, true), seg(30.0, 40.0, false)];
        let mut readings: Vec<Reading> = (0..=40)
            .map(|t| {
                let shared = (21..30).contains(&t);
                reading(f64::from(t), if shared { 90.0 } else { 40.0 }, if shared { 20 } else { 3 })
            })
            .collect();
        // Start-up before the warm-up ends at t = 5: idle GPU, no memory yet.
        for r in readings.iter_mut().take(5) {
            *r = reading(r.time, 0.0, 0);
        }
        // Warm-up of 10 steps reached at t = 5, then 2 steps/s alone and 1 step/s shared.
        let points: Vec<Point> = (0..=40)
            .map(|t| {
                let t = f64::from(t);
                let steps = if t <= 20.0 {
                    2.0 * t
                } else if t <= 30.0 {
                    40.0 + (t - 20.0)
                } else {
                    50.0 + 2.0 * (t - 30.0)
                };
                Point { time: t, steps }
            })
            .collect();
        let run = alone_run(&segs, &readings, &points, 10, 5);
        let sys = run.system.expect("enough readings");
        assert_eq!(sys.sm_pct, 40.0, "shared and start-up readings left out");
        assert_eq!(sys.memcap_gib, 3.0);
        assert_eq!(run.seconds, 25.0);
        assert_eq!(run.readings, 27);
        assert!((run.throughput.unwrap() - 2.0).abs() < 1e-9, "{:?}", run.throughput);
        let p = run.profile("w", "Fake").unwrap();
        assert_eq!(p.source, OBSERVED_SOURCE);
        assert_eq!(&p.values[6..], &[Some(2.0), Some(40.0), Some(20.0), Some(3.0)]);
        assert_eq!(p.values[..6], [None; 6]);
    }

    #[test]
    fn no_alone_time_or_readings_measure_nothing() {
        let shared = [seg(0.0, 10.0, true)];
        let readings: Vec<Reading> = (0..10).map(|t| reading(f64::from(t), 50.0, 2)).collect();
        let run = alone_run(&shared, &readings, &[], 0, 1);
        assert_eq!((run.system, run.throughput, run.seconds), (None, None, 0.0));
        assert_eq!(run.profile("w", "g"), None);
        // Alone, but the sampler was not running and the job wrote no progress.
        let run = alone_run(&[seg(0.0, 10.0, false)], &[], &[], 0, 1);
        assert_eq!(run.profile("w", "g"), None);
        // Too few readings for a summary; progress lines still give the throughput.
        let points = [Point { time: 1.0, steps: 0.0 }, Point { time: 9.0, steps: 16.0 }];
        let run = alone_run(&[seg(0.0, 10.0, false)], &readings[..3], &points, 0, 5);
        assert_eq!(run.system, None);
        assert_eq!(run.profile("w", "g").unwrap().values[6], Some(2.0));
    }
}
