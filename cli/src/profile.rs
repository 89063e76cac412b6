//! `kace profile import|import-ncu|run|list|show`: get workload profiles into the database and
//! look at them.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use kace_profiling::{ncu, nvml, run as prun};
use kace_sql::{
    validate_workload_name, NewProfile, FEATURE_COLUMNS, FEATURE_COUNT, FIRST_SYSTEM_FEATURE,
};
use serde_json::json;

use crate::context::{num, print_json, Ctx};
use crate::output::table;

/// GPU model recorded when none is given (the artifact's profiles come from a V100 32 GB, but
/// kace cannot know what a file describes).
const UNSPECIFIED_GPU: &str = "unspecified";

/// `kace profile …`
#[derive(Debug, Args)]
pub struct ProfileArgs {
    #[command(subcommand)]
    command: ProfileCommand,
}

#[derive(Debug, Subcommand)]
enum ProfileCommand {
    /// Import profile tables: the artifact's CSVs or kace's own CSV/JSON (directories: every
    /// .csv/.json inside).
    Import {
        /// GPU model the profiles were measured on (a `gpu_model` column overrides it).
        #[arg(long, default_value = UNSPECIFIED_GPU)]
        gpu_model: String,
        /// Files or directories.
        #[arg(required = true, value_name = "FILE|DIR")]
        paths: Vec<PathBuf>,
    },
    /// Compute the six kernel metrics from an Nsight Compute CSV export (`--page details` or
    /// `--page raw`) and store them.
    ImportNcu {
        /// Workload name.
        #[arg(long)]
        workload: String,
        /// GPU model profiled.
        #[arg(long, default_value = UNSPECIFIED_GPU)]
        gpu_model: String,
        /// The `ncu --csv` export.
        #[arg(value_name = "FILE.csv")]
        file: PathBuf,
    },
    /// Run a workload alone, sample the GPU (NVML) and its progress file, and store its
    /// exclusive throughput, SM %, memory % and peak memory.
    Run {
        /// Workload name.
        #[arg(long)]
        workload: String,
        /// Steps to drop at the start (default: the config's `profiling.warmup_steps`).
        #[arg(long)]
        warmup_steps: Option<u64>,
        /// GPU index to sample.
        #[arg(long, default_value_t = 0)]
        gpu: u32,
        /// Sampling period in ms (default: the config's `profiling.sample_interval_ms`).
        #[arg(long)]
        interval_ms: Option<u64>,
        /// Kill the workload after this many seconds.
        #[arg(long)]
        timeout_s: Option<u64>,
        /// Run even when other compute processes use the GPU.
        #[arg(long)]
        allow_busy_gpu: bool,
        /// The automatic PyTorch progress hook's directory, put first on the workload's
        /// PYTHONPATH as the plugin does for kace jobs (default: /usr/share/kace/python/autohook
        /// when it holds the hook).
        #[arg(long, value_name = "DIR")]
        python_hook: Option<PathBuf>,
        /// Leave PYTHONPATH as it is: the workload reports progress itself.
        #[arg(long, conflicts_with = "python_hook")]
        no_python_hook: bool,
        /// The workload's command line.
        #[arg(last = true, required = true, value_name = "CMD")]
        command: Vec<OsString>,
    },
    /// List every workload's current profile.
    List,
    /// Show one workload's current profile.
    Show {
        /// Workload name.
        workload: String,
    },
}

/// Runs `kace profile …`.
pub fn run(args: ProfileArgs, ctx: &Ctx) -> Result<()> {
    match args.command {
        ProfileCommand::Import { gpu_model, paths } => import(ctx, &gpu_model, &paths),
        ProfileCommand::ImportNcu { workload, gpu_model, file } => {
            import_ncu(ctx, &workload, &gpu_model, &file)
        }
        ProfileCommand::Run {
            workload,
            warmup_steps,
            gpu,
            interval_ms,
            timeout_s,
            allow_busy_gpu,
            python_hook,
            no_python_hook,
            command,
        } => {
            let python_hook = python_hook_for_run(python_hook, no_python_hook)?;
            let spec = RunOptions {
                warmup_steps: warmup_steps.unwrap_or(ctx.config.profiling.warmup_steps),
                interval: Duration::from_millis(
                    interval_ms.unwrap_or(ctx.config.profiling.sample_interval_ms).max(1),
                ),
                timeout: timeout_s.map(Duration::from_secs),
                allow_busy_gpu,
                python_hook,
            };
            profile_run(ctx, &workload, gpu, spec, command)
        }
        ProfileCommand::List => list(ctx),
        ProfileCommand::Show { workload } => show(ctx, &workload),
    }
}

fn expand(paths: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut inside: Vec<PathBuf> = std::fs::read_dir(p)
                .with_context(|| format!("couldn't read directory {}", p.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| {
                    f.extension().is_some_and(|e| {
                        e.eq_ignore_ascii_case("csv") || e.eq_ignore_ascii_case("json")
                    })
                })
                .collect();
            inside.sort();
            files.extend(inside);
        } else {
            files.push(p.clone());
        }
    }
    if files.is_empty() {
        bail!("couldn't find any .csv or .json file in the given directories");
    }
    Ok(files)
}

fn import(ctx: &Ctx, gpu_model: &str, paths: &[PathBuf]) -> Result<()> {
    let mut all: Vec<NewProfile> = Vec::new();
    for f in expand(paths)? {
        let got = read_profile_file(&f, gpu_model)?;
        ctx.info(&format!("profile import: {} profile(s) from {}", got.len(), f.display()));
        all.extend(got);
    }
    // Every file is checked before anything is stored: one bad file stores nothing.
    let mut db = ctx.open()?;
    let n = db.insert_profiles(&all)?;
    let mut names: Vec<&str> = all.iter().map(|p| p.workload.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    if ctx.json() {
        print_json(
            &json!({ "stored": n.inserted, "already_stored": n.duplicates, "workloads": names }),
        )
    } else {
        println!(
            "stored {} profile measurement(s) for {} workload(s), {} already stored",
            n.inserted,
            names.len(),
            n.duplicates
        );
        Ok(())
    }
}

fn import_ncu(ctx: &Ctx, workload: &str, gpu_model: &str, file: &Path) -> Result<()> {
    validate_workload_name(workload)?;
    let bytes = std::fs::read(file).with_context(|| format!("couldn't read {}", file.display()))?;
    // Kernel names may hold bytes that are not UTF-8; they are never used, so lossy is safe.
    let text = String::from_utf8_lossy(&bytes);
    let m = ncu::aggregate(&text)
        .map_err(|e| anyhow!("couldn't compute kernel metrics from {}: {e}", file.display()))?;
    let mut values = [None; FEATURE_COUNT];
    for (v, x) in values.iter_mut().zip(m.values()) {
        *v = Some(x);
    }
    let profile = NewProfile {
        workload: workload.to_string(),
        gpu_model: gpu_model.to_string(),
        source: format!("ncu:{}", file.file_name().unwrap_or_default().to_string_lossy()),
        values,
    };
    ctx.open()?.insert_profiles(std::slice::from_ref(&profile))?;
    if ctx.json() {
        let metrics: serde_json::Map<String, serde_json::Value> = FEATURE_COLUMNS[..6]
            .iter()
            .zip(m.values())
            .map(|(k, v)| (k.to_string(), json!(v)))
            .collect();
        print_json(&json!({
            "workload": workload,
            "kernels": m.kernels,
            "total_duration_ns": m.total_duration_ns,
            "layout": format!("{:?}", m.layout).to_lowercase(),
            "metrics": metrics,
        }))
    } else {
        println!(
            "{workload}: kernel metrics from {} kernel launch(es), {:.0} ns total",
            m.kernels, m.total_duration_ns
        );
        let rows: Vec<Vec<String>> = FEATURE_COLUMNS[..6]
            .iter()
            .zip(m.values())
            .map(|(k, v)| vec![k.to_string(), num(v)])
            .collect();
        print!("{}", table(&["metric", "value"], &rows));
        Ok(())
    }
}

struct RunOptions {
    warmup_steps: u64,
    interval: Duration,
    timeout: Option<Duration>,
    allow_busy_gpu: bool,
    python_hook: Option<PathBuf>,
}

/// The hook directory a profiling run uses: the one named (which must hold the hook), else the
/// packages' when installed, so that an unmodified PyTorch script is measured as in a kace job.
fn python_hook_for_run(named: Option<PathBuf>, none: bool) -> Result<Option<PathBuf>> {
    if none {
        return Ok(None);
    }
    match named {
        Some(dir) if kace_layout::is_python_hook(&dir) => Ok(Some(dir)),
        Some(dir) => {
            bail!(
                "--python-hook {}: no sitecustomize.py there (the packages install the hook in {})",
                dir.display(),
                kace_layout::DEFAULT_PYTHON_HOOK
            )
        }
        None => {
            let dir = PathBuf::from(kace_layout::DEFAULT_PYTHON_HOOK);
            Ok(kace_layout::is_python_hook(&dir).then_some(dir))
        }
    }
}

fn profile_run(
    ctx: &Ctx,
    workload: &str,
    gpu: u32,
    o: RunOptions,
    command: Vec<OsString>,
) -> Result<()> {
    validate_workload_name(workload)?;
    // Open the database first: an hour-long run whose result cannot be stored is wasted.
    let mut db = ctx.open()?;
    let mut sampler = nvml::open_sampler(gpu)?;
    // A fresh directory (create_dir fails on an existing path or symlink): the progress file
    // must not be one that someone else prepared in the shared temp directory.
    let dir = std::env::temp_dir().join(format!("kace-profile-{}", std::process::id()));
    std::fs::create_dir(&dir).with_context(|| format!("couldn't create {}", dir.display()))?;
    let progress_file = dir.join("progress");
    let mut parts = command.into_iter();
    let program = parts.next().ok_or_else(|| anyhow!("no command given after --"))?;
    let spec = prun::RunSpec {
        program,
        args: parts.collect(),
        warmup_steps: o.warmup_steps,
        interval: o.interval,
        progress_file,
        timeout: o.timeout,
        allow_busy_gpu: o.allow_busy_gpu,
        python_hook: o.python_hook,
    };
    let hook = match &spec.python_hook {
        Some(dir) => format!("progress hook {} on PYTHONPATH", dir.display()),
        None => "no progress hook on PYTHONPATH".to_string(),
    };
    ctx.info(&format!(
        "profile run: running {} (warm-up {} steps; {hook})",
        spec.program.to_string_lossy(),
        o.warmup_steps
    ));
    let result = prun::run(&spec, sampler.as_mut());
    let _ = std::fs::remove_dir_all(&dir);
    let m = result?;
    let mut values = [None; FEATURE_COUNT];
    values[FIRST_SYSTEM_FEATURE] = Some(m.exclusive_throughput);
    values[FIRST_SYSTEM_FEATURE + 1] = Some(m.sm_pct);
    values[FIRST_SYSTEM_FEATURE + 2] = Some(m.mem_pct);
    values[FIRST_SYSTEM_FEATURE + 3] = Some(m.memcap_gib);
    db.insert_profiles(&[NewProfile {
        workload: workload.to_string(),
        gpu_model: m.gpu_model.clone(),
        source: "nvml".into(),
        values,
    }])?;
    if ctx.json() {
        print_json(&json!({
            "workload": workload,
            "gpu_model": m.gpu_model,
            "exclusive_throughput": m.exclusive_throughput,
            "sm_pct": m.sm_pct,
            "mem_pct": m.mem_pct,
            "memcap_gib": m.memcap_gib,
            "samples_taken": m.samples_taken,
            "samples_used": m.samples_used,
            "progress_lines_skipped": m.progress_lines_skipped,
        }))
    } else {
        println!(
            "{workload} on {}: {} steps/s, SM {}%, memory {}%, peak {} GiB ({} of {} samples after warm-up)",
            m.gpu_model,
            num(m.exclusive_throughput),
            num(m.sm_pct),
            num(m.mem_pct),
            m.memcap_gib,
            m.samples_used,
            m.samples_taken
        );
        Ok(())
    }
}

fn profile_json(p: &kace_sql::Profile) -> serde_json::Value {
    let values: serde_json::Map<String, serde_json::Value> =
        FEATURE_COLUMNS.iter().zip(p.values).map(|(k, v)| (k.to_string(), json!(v))).collect();
    let sources: serde_json::Map<String, serde_json::Value> =
        FEATURE_COLUMNS.iter().zip(&p.sources).map(|(k, s)| (k.to_string(), json!(s))).collect();
    json!({
        "workload": p.workload,
        "gpu_model": p.gpu_model,
        "updated_at": p.updated_at,
        "complete": p.complete().is_some(),
        "values": values,
        "sources": sources,
        "observed_alone_runs": p.observed_runs,
        "observed_samples": p.observed_samples,
    })
}

fn list(ctx: &Ctx) -> Result<()> {
    let db = ctx.open_read_only()?;
    let mut profiles: Vec<_> = db.all_profiles(None)?.into_values().collect();
    profiles.sort_by(|a, b| a.workload.cmp(&b.workload));
    if ctx.json() {
        return print_json(&json!(profiles.iter().map(profile_json).collect::<Vec<_>>()));
    }
    let rows: Vec<Vec<String>> = profiles
        .iter()
        .map(|p| {
            let v = |i: usize| p.values[i].map(num).unwrap_or_else(|| "-".into());
            let missing = p.missing();
            vec![
                p.workload.clone(),
                p.gpu_model.clone(),
                v(6),
                v(7),
                v(8),
                v(9),
                if missing.is_empty() {
                    "complete".into()
                } else {
                    format!("missing {}", missing.join(","))
                },
            ]
        })
        .collect();
    print!(
        "{}",
        table(&["workload", "gpu", "excl_thr", "sm%", "mem%", "memcap_gib", "status"], &rows)
    );
    Ok(())
}

fn show(ctx: &Ctx, workload: &str) -> Result<()> {
    let db = ctx.open_read_only()?;
    let got = db.profiles(&[workload], None)?;
    let p = got
        .get(workload)
        .ok_or_else(|| anyhow!("couldn't find a profile for workload {workload:?}"))?;
    if ctx.json() {
        return print_json(&profile_json(p));
    }
    println!("{} ({})", p.workload, p.gpu_model);
    if p.observed_runs > 0 {
        println!(
            "observed alone in {} run(s) by kace (the newest from {} sampler readings)",
            p.observed_runs, p.observed_samples
        );
    }
    let rows: Vec<Vec<String>> = FEATURE_COLUMNS
        .iter()
        .zip(p.values)
        .zip(&p.sources)
        .map(|((k, v), s)| {
            vec![
                k.to_string(),
                v.map(num).unwrap_or_else(|| "-".into()),
                s.as_deref().unwrap_or("-").to_string(),
            ]
        })
        .collect();
    print!("{}", table(&["feature", "value", "source"], &rows));
    Ok(())
}

/// Reads one profile file, choosing the format by extension (`.json`, else CSV).
fn read_profile_file(path: &Path, gpu_model: &str) -> Result<Vec<kace_sql::NewProfile>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("couldn't read {}", path.display()))?;
    let source = format!("file:{}", path.file_name().unwrap_or_default().to_string_lossy());
    let is_json = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("json"));
    kace_sql::profile_table::parse(&text, is_json, gpu_model, &source)
        .with_context(|| format!("couldn't import profiles from {}", path.display()))
}
