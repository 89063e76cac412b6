//! `kace-gpu-bench`: the GPU run's steps that are not kace commands (see the library). Thin:
//! arguments in, one step, JSON or a table out; exit 1 on any error.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use kace_config::Config;
use kace_gpu_bench::{colocate, compare, probe, BenchError};
use kace_layout::GpuIndex;
use kace_node::mps::NvidiaMps;
use serde_json::json;

/// Steps of bench/gpu/run.
#[derive(Debug, Parser)]
#[command(name = "kace-gpu-bench")]
struct Cli {
    /// kace.conf of the run.
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    /// GPU index.
    #[arg(long, global = true, default_value_t = 0)]
    gpu: u32,
    #[command(subcommand)]
    step: Step,
}

#[derive(Debug, Subcommand)]
enum Step {
    /// Start the GPU's MPS daemon and a server through kace's MPS control, check it, quit it.
    Probe,
    /// Run workloads together under MPS; each end goes through the epilog (observations spooled).
    Colocate {
        /// Program run as `RUNNER WORKLOAD`.
        #[arg(long)]
        runner: PathBuf,
        /// Job id of the first workload.
        #[arg(long)]
        first_job: u32,
        /// Node name in the observations.
        #[arg(long, default_value = "gpu-bench")]
        node: String,
        /// Cluster name in the observation keys.
        #[arg(long, default_value = "gpu-bench")]
        cluster: String,
        /// Kill workloads still running after this many seconds.
        #[arg(long, default_value_t = 120)]
        timeout_s: u64,
        /// The workloads: `WORKLOAD`, or `WORKLOAD@PCT` to run that member with
        /// CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=PCT (1..=100; the others run with it unset).
        #[arg(required = true, value_parser = colocate::Member::parse)]
        workloads: Vec<colocate::Member>,
    },
    /// The active model's prediction next to every observed group.
    Compare {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

fn uid() -> u32 {
    // The MPS server runs as the user whose clients it serves: the bench's own user.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|v| v.split_whitespace().next().and_then(|u| u.parse().ok()))
        })
        .unwrap_or(0)
}

fn run(cli: Cli) -> Result<(), Box<dyn std::error::Error>> {
    let (config, _) = Config::load(cli.config.as_deref())?;
    let mps = NvidiaMps {
        program: config.node.mps_control.clone(),
        timeout: Duration::from_millis(config.node.command_timeout_ms),
        deadline: None,
    };
    let gpu = GpuIndex(cli.gpu);
    match cli.step {
        Step::Probe => {
            let v = probe::run(&mps, &config.node.mps_root, gpu, uid());
            println!("{}", serde_json::to_string_pretty(&v)?);
        }
        Step::Colocate { runner, first_job, node, cluster, timeout_s, workloads } => {
            let spec = colocate::GroupSpec {
                runner,
                workloads,
                first_job,
                gpu,
                node,
                cluster,
                uid: uid(),
                timeout: Duration::from_secs(timeout_s),
            };
            let log = |m: &str| eprintln!("{m}");
            let out = colocate::run(&config, &mps, &spec, &log)?;
            let obs: Vec<_> = out
                .observations
                .iter()
                .map(|o| {
                    json!({
                        "key": o.key, "workload": o.workload,
                        "partners": o.partners.iter().map(|p| &p.workload).collect::<Vec<_>>(),
                        "seconds": o.end - o.start, "throughput": o.throughput,
                        "gpu_energy_j": o.gpu_energy_j, "mps_share": o.mps_share,
                    })
                })
                .collect();
            let failed: Vec<_> =
                out.failed.iter().map(|(w, why)| json!({"workload": w, "why": why})).collect();
            let names: Vec<_> = spec.workloads.iter().map(|m| &m.workload).collect();
            let shares: Vec<_> = spec.workloads.iter().map(|m| m.share).collect();
            // "together": each member's steps/s side by side, in the order given (the sweep's
            // cells); "shares": null where the member ran with the percentage unset.
            let v = json!({
                "workloads": names, "shares": shares, "together": out.together,
                "observations": obs, "failed": failed, "stopped_mps": out.stopped_mps,
            });
            println!("{}", serde_json::to_string(&v)?);
            if !out.failed.is_empty() {
                return Err(Box::new(BenchError::WorkloadsFailed(out.failed.len())));
            }
        }
        Step::Compare { json } => {
            let db = kace_sql::Db::open_read_only(&config.database.path)?;
            let objective = config.selection.objective;
            let (version, rows) = compare::rows(&db, objective, &config.training)?;
            if json {
                let v: Vec<_> = rows
                    .iter()
                    .map(|r| {
                        json!({"workloads": r.workloads, "throughputs": r.throughputs,
                               "observed": r.observed, "predicted": r.predicted,
                               "held_out": r.held_out})
                    })
                    .collect();
                let out =
                    json!({"model_version": version, "objective": objective.key(), "groups": v});
                println!("{}", serde_json::to_string_pretty(&out)?);
            } else {
                println!("model v{version}, objective {}", objective.key());
                println!(
                    "{:<48} {:>10} {:>10} {:>8}  fit/held out",
                    "group", "predicted", "observed", "error"
                );
                for r in &rows {
                    let err = (r.predicted - r.observed) / r.observed * 100.0;
                    println!(
                        "{:<48} {:>10.3} {:>10.3} {:>7.1}%  {}",
                        r.workloads.join("+"),
                        r.predicted,
                        r.observed,
                        err,
                        if r.held_out { "held out" } else { "fit" }
                    );
                }
            }
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kace-gpu-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
