//! What a simulation is judged by: per-run metrics, their mean and spread over seeds, ratios
//! against a baseline, and a bounded-size utilisation timeline.

use crate::engine::Outcome;

/// Busy GPUs and running jobs over time, as averages over equal buckets. The bucket width
/// doubles (merging neighbours) whenever the run outgrows [`Timeline::MAX_BUCKETS`], so memory
/// stays fixed however long the simulation runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Timeline {
    width: f64,
    busy: Vec<f64>,
    jobs: Vec<f64>,
}

impl Default for Timeline {
    fn default() -> Self {
        Timeline::new()
    }
}

impl Timeline {
    /// Most buckets kept.
    pub const MAX_BUCKETS: usize = 512;

    /// An empty timeline with one-second buckets.
    pub fn new() -> Self {
        Timeline { width: 1.0, busy: Vec::new(), jobs: Vec::new() }
    }

    /// Records `busy` GPUs and `jobs` running jobs over [t0, t1).
    pub fn add(&mut self, t0: f64, t1: f64, busy: f64, jobs: f64) {
        while t1 > self.width * Self::MAX_BUCKETS as f64 {
            self.coarsen();
        }
        let mut t = t0;
        while t < t1 {
            let i = ((t / self.width) as usize).min(Self::MAX_BUCKETS - 1);
            let end = ((i + 1) as f64 * self.width).min(t1);
            if self.busy.len() <= i {
                self.busy.resize(i + 1, 0.0);
                self.jobs.resize(i + 1, 0.0);
            }
            self.busy[i] += busy * (end - t);
            self.jobs[i] += jobs * (end - t);
            if end <= t {
                break;
            }
            t = end;
        }
    }

    fn coarsen(&mut self) {
        self.width *= 2.0;
        let merge = |v: &[f64]| v.chunks(2).map(|c| c.iter().sum()).collect::<Vec<f64>>();
        self.busy = merge(&self.busy);
        self.jobs = merge(&self.jobs);
    }

    /// Bucket width in seconds.
    pub fn width(&self) -> f64 {
        self.width
    }

    /// (bucket start in seconds, mean busy GPUs, mean running jobs) per bucket.
    pub fn points(&self) -> Vec<(f64, f64, f64)> {
        self.busy
            .iter()
            .zip(&self.jobs)
            .enumerate()
            .map(|(i, (b, j))| (i as f64 * self.width, b / self.width, j / self.width))
            .collect()
    }
}

/// One run's results. Times in seconds, throughput in steps per second; "work" is a job's
/// length alone (steps over its exclusive throughput), so work per second is the number of
/// GPUs' worth of exclusive progress the cluster makes: sharing gains show as values above
/// the exclusive run's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Metrics {
    /// When the last job finished.
    pub makespan_s: f64,
    /// Mean job completion time (finish − submit).
    pub mean_jct_s: f64,
    /// 95th percentile of job completion time.
    pub p95_jct_s: f64,
    /// Mean wait in the queue (start − submit).
    pub mean_wait_s: f64,
    /// GPU-hours with at least one job.
    pub gpu_busy_h: f64,
    /// Fraction of busy GPU time with two jobs.
    pub shared_fraction: f64,
    /// All steps over the makespan.
    pub steps_per_s: f64,
    /// Steps per second until the last job started (the queue was never empty before then
    /// at a high enough load): throughput without the drain at the end.
    pub sustained_steps_per_s: f64,
    /// Exclusive GPU-seconds of work per second until the last job started.
    pub sustained_work_per_s: f64,
    /// Fraction of the time until the last job started with jobs waiting: near 1 means the
    /// queue was never empty and the sustained throughput is the cluster's capacity.
    pub queued_fraction: f64,
    /// Out-of-memory failures.
    pub ooms: f64,
    /// Pairs formed.
    pub pairings: f64,
    /// Share of pairs formed that the policy had trained on (kace), else 0.
    pub seen_share: f64,
    /// The busy GPUs' modelled energy per unit of work (seconds of one GPU's busy power per
    /// exclusive GPU-second; [`kace_selector::energy`]): below the exclusive run's, sharing saved
    /// energy. Modelled: the artifact has no power data.
    pub energy_per_work: f64,
}

impl Metrics {
    /// Field names, in [`Metrics::values`] order.
    pub const NAMES: [&'static str; 14] = [
        "makespan_s",
        "mean_jct_s",
        "p95_jct_s",
        "mean_wait_s",
        "gpu_busy_h",
        "shared_fraction",
        "steps_per_s",
        "sustained_steps_per_s",
        "sustained_work_per_s",
        "queued_fraction",
        "ooms",
        "pairings",
        "seen_share",
        "energy_per_work",
    ];

    /// Field values, in [`Metrics::NAMES`] order.
    pub fn values(&self) -> [f64; 14] {
        [
            self.makespan_s,
            self.mean_jct_s,
            self.p95_jct_s,
            self.mean_wait_s,
            self.gpu_busy_h,
            self.shared_fraction,
            self.steps_per_s,
            self.sustained_steps_per_s,
            self.sustained_work_per_s,
            self.queued_fraction,
            self.ooms,
            self.pairings,
            self.seen_share,
            self.energy_per_work,
        ]
    }

    /// The metrics of a run.
    pub fn of(o: &Outcome) -> Metrics {
        let n = o.finish.len().max(1) as f64;
        let makespan = o.finish.iter().copied().fold(0.0, f64::max);
        let mut jct: Vec<f64> = o.finish.iter().zip(&o.submit).map(|(f, s)| f - s).collect();
        let mean_jct = jct.iter().sum::<f64>() / n;
        let wait = o.start.iter().zip(&o.submit).map(|(a, s)| a - s).sum::<f64>() / n;
        let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
        Metrics {
            makespan_s: makespan,
            mean_jct_s: mean_jct,
            p95_jct_s: percentile(&mut jct, 0.95),
            mean_wait_s: wait,
            gpu_busy_h: o.busy_gpu_s / 3600.0,
            shared_fraction: ratio(o.shared_gpu_s, o.busy_gpu_s),
            steps_per_s: ratio(o.total_steps, makespan),
            sustained_steps_per_s: ratio(o.sustained.steps, o.sustained.until),
            sustained_work_per_s: ratio(o.sustained.work_s, o.sustained.until),
            queued_fraction: ratio(o.sustained.queued_s, o.sustained.until),
            ooms: o.ooms as f64,
            pairings: o.pairings as f64,
            seen_share: ratio(o.pairings_seen as f64, o.pairings as f64),
            energy_per_work: ratio(o.busy_energy_s, o.total_work_s),
        }
    }
}

/// The `q` quantile by the nearest-rank rule (reorders `v`). 0 for an empty slice.
pub fn percentile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
    *v.select_nth_unstable_by(rank, f64::total_cmp).1
}

/// Mean and sample standard deviation (0 for fewer than two values).
pub fn mean_std(v: &[f64]) -> (f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0);
    }
    let n = v.len() as f64;
    let m = v.iter().sum::<f64>() / n;
    if v.len() < 2 {
        return (m, 0.0);
    }
    let var = v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (n - 1.0);
    (m, var.sqrt())
}

/// The ratios a policy is compared to a baseline by, per run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ratios {
    /// Sustained work per second over the baseline's: the throughput gain (1.10 = +10 %).
    pub throughput: f64,
    /// Sustained steps per second over the baseline's.
    pub steps: f64,
    /// Makespan over the baseline's (below 1 is better).
    pub makespan: f64,
    /// Mean job completion time over the baseline's (below 1 is better).
    pub mean_jct: f64,
    /// Modelled energy per unit of work over the baseline's (below 1: less energy).
    pub energy_per_work: f64,
}

impl Ratios {
    /// `m` against `base`.
    pub fn of(m: &Metrics, base: &Metrics) -> Ratios {
        let r = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
        Ratios {
            throughput: r(m.sustained_work_per_s, base.sustained_work_per_s),
            steps: r(m.sustained_steps_per_s, base.sustained_steps_per_s),
            makespan: r(m.makespan_s, base.makespan_s),
            mean_jct: r(m.mean_jct_s, base.mean_jct_s),
            energy_per_work: r(m.energy_per_work, base.energy_per_work),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeline_averages_and_coarsens_without_losing_area() {
        let mut t = Timeline::new();
        t.add(0.0, 2.5, 4.0, 8.0);
        let p = t.points();
        assert_eq!(p.len(), 3);
        assert_eq!((p[0].1, p[0].2), (4.0, 8.0));
        assert_eq!(p[2].1, 2.0, "half of the third second");
        t.add(2.5, 10_000.0, 1.0, 1.0);
        assert!(t.points().len() <= Timeline::MAX_BUCKETS);
        let area: f64 = t.points().iter().map(|p| p.1 * t.width()).sum();
        assert!((area - (4.0 * 2.5 + (10_000.0 - 2.5))).abs() < 1e-6, "{area}");
    }

    #[test]
    fn percentiles_and_spread() {
        let mut v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&mut v, 0.95), 95.0);
        assert_eq!(percentile(&mut v, 1.0), 100.0);
        assert_eq!(percentile(&mut [], 0.5), 0.0);
        assert_eq!(mean_std(&[2.0, 4.0]), (3.0, 2f64.sqrt()));
        assert_eq!(mean_std(&[5.0]), (5.0, 0.0));
    }
}
