//! The service loop: one reading of every GPU per interval into its ring, until told to stop.
//! A GPU that cannot be read is logged (once per failure streak) and skipped; the others go on.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kace_profiling::nvml::GpuSampler;

use crate::progress_cap::ProgressCap;
use crate::ring::{ring_path, Reading, Ring, RingError};

/// One GPU being sampled.
struct Gpu {
    index: u32,
    sampler: Box<dyn GpuSampler>,
    ring: Ring,
    failing: bool,
}

/// The sampler service over a set of GPUs.
pub struct Service {
    gpus: Vec<Gpu>,
    progress_cap: Option<ProgressCap>,
}

impl Service {
    /// Opens (or continues) the ring of each GPU under `dir`, which must exist.
    pub fn open(
        dir: &Path,
        capacity: u32,
        samplers: Vec<(u32, Box<dyn GpuSampler>)>,
    ) -> Result<Service, RingError> {
        let gpus = samplers
            .into_iter()
            .map(|(index, sampler)| {
                let ring = Ring::create(&ring_path(dir, index), capacity)?;
                Ok(Gpu { index, sampler, ring, failing: false })
            })
            .collect::<Result<Vec<_>, RingError>>()?;
        Ok(Service { gpus, progress_cap: None })
    }

    /// Also caps running jobs' progress files at every tick.
    pub fn with_progress_cap(mut self, cap: ProgressCap) -> Service {
        self.progress_cap = Some(cap);
        self
    }

    /// Takes one reading of every GPU at `now` (and caps progress files); returns how many
    /// readings were stored.
    pub fn tick(&mut self, now: f64, log: &dyn Fn(&str)) -> usize {
        if let Some(cap) = &mut self.progress_cap {
            cap.tick(log);
        }
        let mut stored = 0;
        for g in &mut self.gpus {
            let result = g.sampler.sample(now).map_err(|e| e.to_string()).and_then(|s| {
                let r = Reading {
                    time: now,
                    sm_pct: s.sm_pct,
                    mem_pct: s.mem_pct,
                    used_bytes: s.used_bytes,
                    energy_mj: s.energy_mj,
                    power_w: s.power_w,
                };
                g.ring.push(&r).map_err(|e| format!("couldn't store the reading: {e}"))
            });
            match result {
                Ok(()) => {
                    if std::mem::replace(&mut g.failing, false) {
                        log(&format!("kace: sampler: GPU {} readable again", g.index));
                    }
                    stored += 1;
                }
                Err(e) => {
                    if !std::mem::replace(&mut g.failing, true) {
                        log(&format!("kace: sampler: couldn't sample GPU {}: {e}", g.index));
                    }
                }
            }
        }
        stored
    }

    /// Ticks every `interval` until `stop` is set (checked at least every 100 ms).
    pub fn run(
        &mut self,
        interval: Duration,
        stop: &AtomicBool,
        now: &dyn Fn() -> f64,
        log: &dyn Fn(&str),
    ) {
        let mut next = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            if Instant::now() >= next {
                self.tick(now(), log);
                next += interval;
                // Fell far behind (suspended, overloaded): skip the missed ticks.
                if next < Instant::now() {
                    next = Instant::now() + interval;
                }
            }
            let wait = next.saturating_duration_since(Instant::now());
            std::thread::sleep(wait.min(Duration::from_millis(100)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kace_profiling::nvml::{FakeSampler, Sample, SamplerError};
    use std::cell::RefCell;

    struct Broken;
    impl GpuSampler for Broken {
        fn gpu_model(&mut self) -> Result<String, SamplerError> {
            Ok("x".into())
        }
        fn total_memory_bytes(&mut self) -> Result<u64, SamplerError> {
            Ok(0)
        }
        fn sample(&mut self, _now: f64) -> Result<Sample, SamplerError> {
            Err(SamplerError { op: "read", cause: "GPU fell off the bus".into() })
        }
        fn busy_processes(&mut self) -> Result<usize, SamplerError> {
            Ok(0)
        }
    }

    #[test]
    fn every_gpu_is_read_and_a_broken_one_is_logged_once() {
        let dir = kace_test_support::TempDir::new("sampler-svc");
        let fake = FakeSampler::new("Fake", 1024, vec![(30.0, 20.0, 100), (50.0, 40.0, 300)]);
        let mut svc =
            Service::open(&dir, 16, vec![(0, Box::new(fake)), (1, Box::new(Broken))]).unwrap();
        let lines = RefCell::new(Vec::new());
        let log = |l: &str| lines.borrow_mut().push(l.to_string());
        for t in 0..3 {
            assert_eq!(svc.tick(100.0 + f64::from(t), &log), 1);
        }
        assert_eq!(lines.borrow().len(), 1, "{:?}", lines.borrow());
        assert!(lines.borrow()[0].starts_with("kace: sampler: couldn't sample GPU 1:"));
        let got = Ring::open(&ring_path(&dir, 0)).unwrap().readings(0.0, 1e9).unwrap();
        assert_eq!(got.len(), 3);
        assert_eq!(got[1].sm_pct, Some(50.0));
        assert_eq!(got[2].used_bytes, Some(300 << 20));
        // Power and the energy counter come through (the fake's: 60 W + 240 W × SM %).
        assert_eq!(got[1].power_w, Some(60.0 + 240.0 * 0.5));
        assert!(got[2].energy_mj > got[1].energy_mj, "{got:?}");
    }
}
