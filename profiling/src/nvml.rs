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
        Ok(Sample { time: now, sm_pct: sm, mem_pct: mem, used_bytes: Some(used) })
    }
}

/// A scripted sampler. Readings are replayed in order and the last one repeats.
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
    next: usize,
}

impl FakeSampler {
    /// A fake with the given readings.
    pub fn new(model: &str, total_mib: u64, script: Vec<(f64, f64, u64)>) -> FakeSampler {
        FakeSampler {
            model: model.to_string(),
            total_bytes: total_mib << 20,
            script,
            busy: 0,
            next: 0,
        }
    }

    /// Parses `gpu=NAME;total_mib=N;busy=N;samples=SM,MEM,MIB SM,MEM,MIB …` (keys optional
    /// except `samples`). This is how tests drive `kace profile run` through [`FAKE_ENV_VAR`].
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
        Ok(Sample { time: now, sm_pct: Some(sm), mem_pct: Some(mem), used_bytes: Some(mib << 20) })
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
