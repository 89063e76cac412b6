//! `kace profile run`: runs a workload alone, samples the GPU while it runs, and turns the
//! samples and the job's progress file into the four system metrics.

use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::nvml::{GpuSampler, Sample, SamplerError};
use crate::process_tree::kill_tree;
use crate::progress::{self, ProgressError};

/// What to run and how to measure it.
#[derive(Debug, Clone)]
pub struct RunSpec {
    /// The program.
    pub program: OsString,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Steps treated as warm-up: progress before them and GPU samples taken before the job
    /// reached them are dropped.
    pub warmup_steps: u64,
    /// Sampling period.
    pub interval: Duration,
    /// Where the job writes its progress (exported as `KACE_PROGRESS_FILE`).
    pub progress_file: PathBuf,
    /// Kill the job, with every process it started, after this long (None: wait for it).
    pub timeout: Option<Duration>,
    /// Run even when other compute processes use the GPU (their load then pollutes the
    /// workload's utilization).
    pub allow_busy_gpu: bool,
    /// The automatic PyTorch progress hook's directory, put first on the workload's
    /// `PYTHONPATH` as the plugin does for a kace job (None: `PYTHONPATH` left as it is).
    pub python_hook: Option<PathBuf>,
}

/// The measured system metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct SystemMetrics {
    /// Steps per second after the warm-up.
    pub exclusive_throughput: f64,
    /// Mean SM utilization after the warm-up, %.
    pub sm_pct: f64,
    /// Mean memory utilization after the warm-up, %.
    pub mem_pct: f64,
    /// Peak device memory used over the whole run, GiB rounded to 0.1 as in the artifact.
    pub memcap_gib: f64,
    /// GPU model name.
    pub gpu_model: String,
    /// Samples taken / used for the means.
    pub samples_taken: usize,
    /// Samples inside the measured window that had utilization values.
    pub samples_used: usize,
    /// Progress lines skipped as malformed.
    pub progress_lines_skipped: usize,
}

/// Why a profiling run produced no metrics.
#[derive(Debug)]
#[non_exhaustive]
pub enum RunError {
    /// The program could not be started.
    Spawn {
        /// The program.
        program: OsString,
        /// The OS error.
        source: std::io::Error,
    },
    /// Waiting for the program failed.
    Wait(std::io::Error),
    /// The program failed: its metrics would describe a crash.
    Failed(ExitStatus),
    /// The program ran longer than the timeout and was killed.
    TimedOut(Duration),
    /// The GPU could not be sampled.
    Sampler(SamplerError),
    /// The progress file gave no throughput.
    Progress(ProgressError),
    /// Other compute processes were using the GPU: the run would not be exclusive.
    GpuBusy {
        /// How many.
        processes: usize,
    },
    /// No utilization sample fell after the warm-up.
    NoSamples {
        /// Samples taken in total.
        taken: usize,
    },
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunError::Spawn { program, source } => {
                write!(f, "couldn't start {}: {source}", program.to_string_lossy())
            }
            RunError::Wait(e) => write!(f, "couldn't wait for the workload: {e}"),
            RunError::Failed(s) => write!(f, "the workload failed ({s}); nothing was stored"),
            RunError::TimedOut(d) => write!(f, "the workload ran longer than {d:?} and was killed"),
            RunError::Sampler(e) => write!(f, "{e}"),
            RunError::Progress(e) => write!(f, "{e}"),
            RunError::GpuBusy { processes } => write!(
                f,
                "the GPU is not idle ({processes} compute process(es) running); a profiling run \
                 must be exclusive (or pass --allow-busy-gpu)"
            ),
            RunError::NoSamples { taken } => write!(
                f,
                "none of the {taken} GPU samples fell after the warm-up; run the workload \
                 longer or sample more often"
            ),
        }
    }
}

impl std::error::Error for RunError {}

fn unix_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// Runs the workload to completion while sampling, then computes the metrics.
pub fn run(spec: &RunSpec, sampler: &mut dyn GpuSampler) -> Result<SystemMetrics, RunError> {
    let gpu_model = sampler.gpu_model().map_err(RunError::Sampler)?;
    let busy = sampler.busy_processes().map_err(RunError::Sampler)?;
    if busy > 0 && !spec.allow_busy_gpu {
        return Err(RunError::GpuBusy { processes: busy });
    }
    // A stale file from an earlier run would mix two runs' progress.
    let _ = std::fs::remove_file(&spec.progress_file);
    let mut command = Command::new(&spec.program);
    command.args(&spec.args).env(progress::ENV_VAR, &spec.progress_file);
    if let Some(hook) = &spec.python_hook {
        use std::os::unix::ffi::{OsStrExt, OsStringExt};
        let old = std::env::var_os("PYTHONPATH");
        let value = kace_layout::python_path_with_hook(hook, old.as_ref().map(|o| o.as_bytes()));
        command.env("PYTHONPATH", OsString::from_vec(value));
    }
    let mut child = command
        .spawn()
        .map_err(|source| RunError::Spawn { program: spec.program.clone(), source })?;
    let started = Instant::now();
    let mut samples: Vec<Sample> = Vec::new();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) => {}
            Err(e) => {
                kill_tree(&mut child);
                return Err(RunError::Wait(e));
            }
        }
        if spec.timeout.is_some_and(|t| started.elapsed() > t) {
            kill_tree(&mut child);
            return Err(RunError::TimedOut(spec.timeout.unwrap_or_default()));
        }
        match sampler.sample(unix_now()) {
            Ok(s) => samples.push(s),
            Err(e) => {
                kill_tree(&mut child);
                return Err(RunError::Sampler(e));
            }
        }
        std::thread::sleep(spec.interval);
    };
    if !status.success() {
        return Err(RunError::Failed(status));
    }
    let prog = progress::read(&spec.progress_file).map_err(RunError::Progress)?;
    let thr = prog.throughput(spec.warmup_steps).map_err(RunError::Progress)?;
    summarise(&samples, thr, gpu_model, prog.skipped)
}

/// Turns the samples and the throughput window into metrics (separate for testing).
pub fn summarise(
    samples: &[Sample],
    thr: progress::Throughput,
    gpu_model: String,
    progress_lines_skipped: usize,
) -> Result<SystemMetrics, RunError> {
    // Utilization counts only inside the measured window (after the warm-up), like the
    // artifact's dropping of the first pmon samples; the memory peak counts over the whole run
    // because warm-up allocations are real memory the pair must fit.
    let in_window: Vec<(f64, f64)> = samples
        .iter()
        .filter(|s| s.time >= thr.from.time && s.time <= thr.to.time)
        .filter_map(|s| s.sm_pct.zip(s.mem_pct))
        .collect();
    if in_window.is_empty() {
        return Err(RunError::NoSamples { taken: samples.len() });
    }
    let n = in_window.len() as f64;
    let sm = in_window.iter().map(|v| v.0).sum::<f64>() / n;
    let mem = in_window.iter().map(|v| v.1).sum::<f64>() / n;
    let peak = samples.iter().filter_map(|s| s.used_bytes).max().unwrap_or(0);
    let gib = peak as f64 / (1024.0 * 1024.0 * 1024.0);
    Ok(SystemMetrics {
        exclusive_throughput: thr.steps_per_second,
        sm_pct: sm,
        mem_pct: mem,
        memcap_gib: (gib * 10.0).round() / 10.0,
        gpu_model,
        samples_taken: samples.len(),
        samples_used: in_window.len(),
        progress_lines_skipped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::progress::parse;

    fn s(time: f64, sm: f64, mem: f64, mib: u64) -> Sample {
        Sample {
            time,
            sm_pct: Some(sm),
            mem_pct: Some(mem),
            used_bytes: Some(mib << 20),
            ..Sample::default()
        }
    }

    #[test]
    fn warmup_samples_are_dropped_but_memory_peak_is_kept() {
        let thr = parse("0 0\n10 10\n20 110\n").throughput(10).unwrap();
        let samples =
            [s(1.0, 99.0, 99.0, 8192), s(12.0, 40.0, 20.0, 4096), s(18.0, 60.0, 30.0, 4096)];
        let m = summarise(&samples, thr, "g".into(), 0).unwrap();
        assert_eq!(m.exclusive_throughput, 10.0);
        assert_eq!((m.sm_pct, m.mem_pct), (50.0, 25.0));
        assert_eq!(m.memcap_gib, 8.0);
        assert_eq!((m.samples_taken, m.samples_used), (3, 2));
    }

    #[test]
    fn no_sample_after_warmup_is_an_error() {
        let thr = parse("0 0\n10 10\n20 110\n").throughput(10).unwrap();
        let err = summarise(&[s(1.0, 1.0, 1.0, 1)], thr, "g".into(), 0).unwrap_err();
        assert!(matches!(err, RunError::NoSamples { taken: 1 }));
    }
}
