//! How much memory a GPU has (for the memory filter) and its model (for profile measurements): NVML when a driver is there (or the fake
//! selected by `KACE_FAKE_NVML`), else the configured `node.gpu_memory_gib`, else unknown.

use kace_layout::GpuIndex;

/// A source of GPU facts.
pub trait GpuInfo {
    /// Total memory of `gpu` in GiB, or why it is unknown.
    fn memory_gib(&self, gpu: GpuIndex) -> std::result::Result<f64, String>;

    /// The model name of `gpu` (what profile measurements are recorded against), or why it is
    /// unknown.
    fn model(&self, _gpu: GpuIndex) -> std::result::Result<String, String> {
        Err("this GPU source does not tell models".into())
    }
}

/// NVML through kace-profiling's sampler (which honours `KACE_FAKE_NVML`).
///
/// Slurm numbers GPUs by their gres.conf order, NVML by PCI bus order; sites that list their
/// GPUs in gres.conf in /dev/nvidiaN order (the usual AutoDetect=nvml result) get the same
/// index. A mismatch only matters on nodes mixing GPU models.
#[derive(Debug, Clone, Copy, Default)]
pub struct Nvml;

impl GpuInfo for Nvml {
    fn memory_gib(&self, gpu: GpuIndex) -> std::result::Result<f64, String> {
        let mut s = kace_profiling::nvml::open_sampler(gpu.0).map_err(|e| e.to_string())?;
        let bytes = s.total_memory_bytes().map_err(|e| e.to_string())?;
        Ok(bytes as f64 / f64::from(1u32 << 30))
    }

    fn model(&self, gpu: GpuIndex) -> std::result::Result<String, String> {
        let mut s = kace_profiling::nvml::open_sampler(gpu.0).map_err(|e| e.to_string())?;
        s.gpu_model().map_err(|e| e.to_string())
    }
}

/// GPU memory for the filter: what `info` says, else `fallback`; the note says which and why.
pub fn memory_gib(
    info: &dyn GpuInfo,
    gpu: GpuIndex,
    fallback: Option<f64>,
) -> (Option<f64>, Option<String>) {
    match info.memory_gib(gpu) {
        Ok(g) if g.is_finite() && g > 0.0 => (Some(g), None),
        Ok(g) => (fallback, Some(format!("NVML reported {g} GiB"))),
        Err(e) => (fallback, Some(e)),
    }
}
