//! GPU sampling behind a trait: the real backend reads NVML through `nvml-wrapper`; the fake
//! replays a fixed script so that `kace profile run` can be tested without a GPU.

use std::fmt;

use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;

/// Environment variable that selects the fake backend (tests only). Its value is a fake
/// description, see [`FakeSampler::from_spec`]. When unset, the real NVML backend is used.
pub const FAKE_ENV_VAR: &str = "KACE_FAKE_NVML";

/// One reading of the GPU while the workload runs.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Sample {
    /// Unix seconds when taken.
    pub time: f64,
    /// SM utilization of the workload's processes, % (None when NVML had no fresh sample).
    pub sm_pct: Option<f64>,
    /// Memory (bandwidth) utilization of the workload's processes, %.
    pub mem_pct: Option<f64>,
    /// Device memory in use, bytes.
    pub used_bytes: Option<u64>,
    /// The GPU's energy counter, millijoules since the driver was loaded (NVML's
    /// `nvmlDeviceGetTotalEnergyConsumption`, Volta and newer; None where unsupported).
    pub energy_mj: Option<u64>,
    /// The GPU's power draw, watts (`nvmlDeviceGetPowerUsage`, reported in mW).
    pub power_w: Option<f64>,
}

/// Why the GPU could not be sampled.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerError {
    /// What was being done.
    pub op: &'static str,
    /// NVML's description.
    pub cause: String,
}

impl fmt::Display for SamplerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "couldn't {}: {}", self.op, self.cause)
    }
}

impl std::error::Error for SamplerError {}

/// A source of GPU readings for one device.
pub trait GpuSampler {
    /// The GPU model name (stored with the profile).
    fn gpu_model(&mut self) -> Result<String, SamplerError>;
    /// Total device memory, bytes.
    fn total_memory_bytes(&mut self) -> Result<u64, SamplerError>;
    /// Takes one reading.
    fn sample(&mut self, now: f64) -> Result<Sample, SamplerError>;
    /// Compute processes on the GPU now (a profiling run must start on an idle GPU: the
    /// utilization it reads is device-wide in effect).
    fn busy_processes(&mut self) -> Result<usize, SamplerError>;
}

/// The real backend: NVML through `nvml-wrapper`, loaded at run time.
pub struct NvmlSampler {
    nvml: Nvml,
    index: u32,
    /// NVML returns per-process samples newer than this timestamp (µs).
    last_seen_us: u64,
}

fn nv(op: &'static str) -> impl Fn(NvmlError) -> SamplerError {
    move |e| SamplerError { op, cause: e.to_string() }
}

impl NvmlSampler {
    /// Loads `libnvidia-ml.so.1` and opens GPU `index`. Without a driver this fails with a
    /// message saying so; it never panics.
    pub fn open(index: u32) -> Result<NvmlSampler, SamplerError> {
        let nvml = Nvml::init().map_err(|e| SamplerError {
            op: "initialise NVML",
            cause: format!(
                "{e} (is the NVIDIA driver installed and libnvidia-ml.so.1 loadable on this host?)"
            ),
        })?;
        nvml.device_by_index(index).map_err(nv("open the GPU"))?;
        Ok(NvmlSampler { nvml, index, last_seen_us: 0 })
    }
}

impl GpuSampler for NvmlSampler {
    fn gpu_model(&mut self) -> Result<String, SamplerError> {
        let dev = self.nvml.device_by_index(self.index).map_err(nv("open the GPU"))?;
        dev.name().map_err(nv("read the GPU name"))
    }

    fn total_memory_bytes(&mut self) -> Result<u64, SamplerError> {
        let dev = self.nvml.device_by_index(self.index).map_err(nv("open the GPU"))?;
        Ok(dev.memory_info().map_err(nv("read GPU memory"))?.total)
    }

    fn busy_processes(&mut self) -> Result<usize, SamplerError> {
        let dev = self.nvml.device_by_index(self.index).map_err(nv("open the GPU"))?;
        Ok(dev.running_compute_processes().map_err(nv("list GPU processes"))?.len())
    }

    fn sample(&mut self, now: f64) -> Result<Sample, SamplerError> {
        let dev = self.nvml.device_by_index(self.index).map_err(nv("open the GPU"))?;
        let used = dev.memory_info().map_err(nv("read GPU memory"))?.used;
        // Per-process utilization, summed over the processes on the GPU: a profiling run is
        // exclusive, so they all belong to the workload (as with the artifact's `nvidia-smi
        // pmon`). Per pid only the newest sample of this period counts.
        let (sm, mem) = match dev.process_utilization_stats(self.last_seen_us) {
            Ok(samples) => {
                let mut newest: std::collections::HashMap<u32, (u64, u32, u32)> =
                    std::collections::HashMap::new();
                for s in samples {
                    self.last_seen_us = self.last_seen_us.max(s.timestamp);
                    let e = newest.entry(s.pid).or_insert((0, 0, 0));
                    if s.timestamp >= e.0 {
                        *e = (s.timestamp, s.sm_util, s.mem_util);
                    }
                }
                if newest.is_empty() {
                    (None, None)
                } else {
                    let sm: u32 = newest.values().map(|v| v.1).sum();
                    let mem: u32 = newest.values().map(|v| v.2).sum();
                    (Some(f64::from(sm)), Some(f64::from(mem)))
                }
            }
            // No sample since the last call: nothing ran in that period.
            Err(NvmlError::NotFound) => (None, None),
            // GPUs without per-process accounting: fall back to device-wide rates, which
            // equal the process's in an exclusive run.
            Err(NvmlError::NotSupported) => {
                let u = dev.utilization_rates().map_err(nv("read GPU utilization"))?;
                (Some(f64::from(u.gpu)), Some(f64::from(u.memory)))
            }
            Err(e) => return Err(nv("read per-process GPU utilization")(e)),
        };
        // Energy and power are the whole GPU's; a GPU without them (before Volta, some vGPU
        // profiles) still gives every other reading.
        let energy_mj = optional(dev.total_energy_consumption(), "read the GPU's energy counter")?;
        let power_w =
            optional(dev.power_usage(), "read the GPU's power")?.map(|mw| f64::from(mw) / 1e3);
        Ok(Sample {
            time: now,
            sm_pct: sm,
            mem_pct: mem,
            used_bytes: Some(used),
            energy_mj,
            power_w,
        })
    }
}

/// A reading NVML may not support on this GPU: `None` then, an error otherwise.
fn optional<T>(r: Result<T, NvmlError>, op: &'static str) -> Result<Option<T>, SamplerError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(NvmlError::NotSupported) => Ok(None),
        Err(e) => Err(nv(op)(e)),
    }
}

/// A scripted sampler. Readings are replayed in order and the last one repeats.
///
/// Its power and energy behave as NVML's do on the H200 run of 2026-12-04
/// (docs/measurements/2026-12-04-h200-first-run.md): power rises with SM activity from the
/// GPU's idle draw (82 W there, 595 W under a matrix loop), and the energy counter is the
/// integral of power, in mJ, counting from an arbitrary start (the last driver load), never
/// backwards. Here power = `idle_w + (busy_w − idle_w) × SM % / 100`.
#[derive(Debug, Clone, PartialEq)]
pub struct FakeSampler {
    /// Reported GPU model.
    pub model: String,
    /// Reported total memory, bytes.
    pub total_bytes: u64,
    /// `(sm %, mem %, used MiB)` readings.
    pub script: Vec<(f64, f64, u64)>,
    /// Compute processes reported as already running.
    pub busy: usize,
    /// Power at 0 % SM, watts (`idle_w=`; default [`FAKE_IDLE_W`]).
    pub idle_w: f64,
    /// Power at 100 % SM, watts (`busy_w=`; default [`FAKE_BUSY_W`]).
    pub busy_w: f64,
    next: usize,
    /// The energy counter at the last reading (mJ) and that reading's time and power.
    energy: Option<(f64, f64, f64)>,
}

/// The fake's power at 0 % SM, watts (a V100's idle draw is about 40–60 W, the H200's 82 W).
pub const FAKE_IDLE_W: f64 = 60.0;
/// The fake's power at 100 % SM, watts (a V100 SXM2's limit is 300 W).
pub const FAKE_BUSY_W: f64 = 300.0;
/// Where the fake's energy counter starts, mJ (as if the driver had been loaded a while ago).
const FAKE_ENERGY_START_MJ: f64 = 1.0e9;

impl FakeSampler {
    /// A fake with the given readings.
    pub fn new(model: &str, total_mib: u64, script: Vec<(f64, f64, u64)>) -> FakeSampler {
        FakeSampler {
            model: model.to_string(),
            total_bytes: total_mib << 20,
            script,
            busy: 0,
            idle_w: FAKE_IDLE_W,
            busy_w: FAKE_BUSY_W,
            next: 0,
            energy: None,
        }
    }

    /// Parses `gpu=NAME;total_mib=N;busy=N;idle_w=W;busy_w=W;samples=SM,MEM,MIB SM,MEM,MIB …`
    /// (keys optional except `samples`). This is how tests drive `kace profile run` through [`FAKE_ENV_VAR`].
    pub fn from_spec(spec: &str) -> Result<FakeSampler, String> {
        let mut fake = FakeSampler::new("Fake GPU", 32 * 1024, Vec::new());
        for part in spec.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) =
                part.split_once('=').ok_or_else(|| format!("{part:?} is not key=value"))?;
            match k.trim() {
                "gpu" => fake.model = v.trim().to_string(),
                "total_mib" => {
                    let mib: u64 = v.trim().parse().map_err(|_| format!("bad total_mib {v:?}"))?;
                    fake.total_bytes = mib << 20;
                }
                "busy" => fake.busy = v.trim().parse().map_err(|_| format!("bad busy {v:?}"))?,
                "idle_w" | "busy_w" => {
                    let w: f64 = v.trim().parse().map_err(|_| format!("bad {k} {v:?}"))?;
                    if !(w.is_finite() && (0.0..=10_000.0).contains(&w)) {
                        return Err(format!("{k} {v:?} is not a power in watts"));
                    }
                    if k.trim() == "idle_w" {
                        fake.idle_w = w;
                    } else {
                        fake.busy_w = w;
                    }
                }
                "samples" => {
                    for triple in v.split_whitespace() {
                        let f: Vec<&str> = triple.split(',').collect();
                        let parsed = match f.as_slice() {
                            [a, b, c] => a.parse().ok().zip(b.parse().ok()).zip(c.parse().ok()),
                            _ => None,
                        };
                        let ((sm, mem), mib) = parsed
                            .ok_or_else(|| format!("bad sample {triple:?} (want SM,MEM,MIB)"))?;
                        fake.script.push((sm, mem, mib));
                    }
                }
                other => return Err(format!("unknown key {other:?}")),
            }
        }
        if fake.script.is_empty() {
            return Err("no samples".into());
        }
        Ok(fake)
    }
}

impl GpuSampler for FakeSampler {
    fn gpu_model(&mut self) -> Result<String, SamplerError> {
        Ok(self.model.clone())
    }

    fn total_memory_bytes(&mut self) -> Result<u64, SamplerError> {
        Ok(self.total_bytes)
    }

    fn busy_processes(&mut self) -> Result<usize, SamplerError> {
        Ok(self.busy)
    }

    fn sample(&mut self, now: f64) -> Result<Sample, SamplerError> {
        let i = self.next.min(self.script.len().saturating_sub(1));
        self.next += 1;
        let Some(&(sm, mem, mib)) = self.script.get(i) else {
            return Err(SamplerError { op: "sample the fake GPU", cause: "empty script".into() });
        };
        let power = self.idle_w + (self.busy_w - self.idle_w) * sm.clamp(0.0, 100.0) / 100.0;
        // The counter integrates power between readings (trapezoids), as the real one
        // integrates it continuously; a reading taken earlier than the last adds nothing.
        let mj = match self.energy {
            None => FAKE_ENERGY_START_MJ,
            Some((mj, t, p)) => mj + (now - t).max(0.0) * (p + power) / 2.0 * 1e3,
        };
        self.energy = Some((mj, now.max(self.energy.map_or(now, |e| e.1)), power));
        Ok(Sample {
            time: now,
            sm_pct: Some(sm),
            mem_pct: Some(mem),
            used_bytes: Some(mib << 20),
            energy_mj: Some(mj as u64),
            power_w: Some(power),
        })
    }
}

/// Environment variable that sets how many GPUs the fake backend has (default 1; tests only).
pub const FAKE_GPUS_ENV_VAR: &str = "KACE_FAKE_NVML_GPUS";

/// How many GPUs this host has: the fake's [`FAKE_GPUS_ENV_VAR`] when [`FAKE_ENV_VAR`] is set,
/// else NVML's device count.
pub fn gpu_count() -> Result<u32, SamplerError> {
    match std::env::var(FAKE_ENV_VAR) {
        Ok(spec) if !spec.is_empty() => match std::env::var(FAKE_GPUS_ENV_VAR) {
            Ok(n) => n.trim().parse().map_err(|_| SamplerError {
                op: "set up the fake NVML backend",
                cause: format!("{FAKE_GPUS_ENV_VAR}={n:?} is not a count"),
            }),
            Err(_) => Ok(1),
        },
        _ => {
            let nvml = Nvml::init().map_err(|e| SamplerError {
                op: "initialise NVML",
                cause: format!(
                    "{e} (is the NVIDIA driver installed and libnvidia-ml.so.1 loadable on this host?)"
                ),
            })?;
            nvml.device_count().map_err(nv("count the GPUs"))
        }
    }
}

/// Opens the sampler for GPU `index`: the fake when [`FAKE_ENV_VAR`] is set, else NVML.
pub fn open_sampler(index: u32) -> Result<Box<dyn GpuSampler>, SamplerError> {
    match std::env::var(FAKE_ENV_VAR) {
        Ok(spec) if !spec.is_empty() => FakeSampler::from_spec(&spec)
            .map(|f| Box::new(f) as Box<dyn GpuSampler>)
            .map_err(|cause| SamplerError { op: "set up the fake NVML backend", cause }),
        _ => NvmlSampler::open(index).map(|s| Box::new(s) as Box<dyn GpuSampler>),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fake_spec_parses_and_replays() {
        let mut f =
            FakeSampler::from_spec("gpu=Fake V100; total_mib=1024; samples=1,2,3 4,5,6").unwrap();
        assert_eq!(f.gpu_model().unwrap(), "Fake V100");
        assert_eq!(f.total_memory_bytes().unwrap(), 1024 << 20);
        assert_eq!(f.sample(1.0).unwrap().sm_pct, Some(1.0));
        assert_eq!(f.sample(2.0).unwrap().used_bytes, Some(6 << 20));
        assert_eq!(f.sample(3.0).unwrap().mem_pct, Some(5.0));
        assert!(FakeSampler::from_spec("samples=1,2").is_err());
        assert!(FakeSampler::from_spec("colour=blue;samples=1,2,3").is_err());
        assert!(FakeSampler::from_spec("gpu=x").is_err());
        assert!(FakeSampler::from_spec("idle_w=-1;samples=1,2,3").is_err());
        assert!(FakeSampler::from_spec("busy_w=lots;samples=1,2,3").is_err());
    }

    #[test]
    fn the_fake_energy_counter_integrates_its_power() {
        let mut f =
            FakeSampler::from_spec("idle_w=50; busy_w=250; samples=0,0,1 100,0,1 50,0,1").unwrap();
        let a = f.sample(10.0).unwrap();
        assert_eq!(a.power_w, Some(50.0));
        let b = f.sample(12.0).unwrap();
        assert_eq!(b.power_w, Some(250.0));
        // 2 s from 50 W to 250 W: 300 J.
        assert_eq!(b.energy_mj.unwrap() - a.energy_mj.unwrap(), 300_000);
        let c = f.sample(13.0).unwrap();
        assert_eq!(c.power_w, Some(150.0));
        assert_eq!(c.energy_mj.unwrap() - b.energy_mj.unwrap(), 200_000);
        // A reading out of order never runs the counter backwards.
        let d = f.sample(11.0).unwrap();
        assert!(d.energy_mj.unwrap() >= c.energy_mj.unwrap());
    }

    #[test]
    fn real_backend_fails_cleanly_without_a_driver() {
        // On a machine without the NVIDIA driver this must be an error, not a panic; with a
        // driver it must open GPU 0. Either way the call returns.
        match NvmlSampler::open(0) {
            Ok(mut s) => assert!(!s.gpu_model().unwrap().is_empty()),
            Err(e) => {
                let m = e.to_string();
                assert!(
                    m.starts_with("couldn't initialise NVML")
                        || m.starts_with("couldn't open the GPU"),
                    "{m}"
                );
            }
        }
    }
}
