//! `kace eval`: runs the paper's protocol or kace's general one on data files and prints the
//! normalised throughput of every policy.

use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use kace_selector::dataset::{
    read_colocations, read_n_occur_splits, read_unseen_splits, ColocationData,
};
use kace_selector::eval::chart::{per_target_bars, policy_bars};
use kace_selector::eval::paper::PAPER_SEEDS;
use kace_selector::eval::{colocations, paper, EvalReport, BEST_RULE, KACE_LR, ORACLE, RANDOM};
use serde_json::json;

use crate::output::{table, Format};

/// `kace eval …`
#[derive(Debug, Args)]
pub struct EvalArgs {
    #[command(subcommand)]
    command: EvalCommand,
}

#[derive(Debug, Subcommand)]
enum EvalCommand {
    /// Reproduce the KACE paper's evaluation on its artifact data, with its exact splits.
    Paper(PaperArgs),
    /// Evaluate on any colocation table in the `wN_` scheme (any group size k).
    Colocations(ColocationArgs),
}

/// Options every evaluation shares.
#[derive(Debug, Args)]
struct Common {
    /// Seeds of the runs, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = PAPER_SEEDS.to_vec())]
    seeds: Vec<u32>,
    /// Write an SVG bar chart of the result to this file.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
    /// Also report (and, with --plot, chart) each target workload's own result.
    #[arg(long)]
    per_workload: bool,
}

#[derive(Debug, Args)]
struct PaperArgs {
    /// The artifact folder (with pairs/, splits/, results/).
    #[arg(long, value_name = "DIR")]
    data: PathBuf,
    /// Minimum training appearances per workload (2…10; 3 is the paper's "~20 %" setting).
    #[arg(long, value_name = "N", required_unless_present = "unseen")]
    n_occur: Option<u32>,
    /// Run the held-out-workload experiment instead.
    #[arg(long)]
    unseen: bool,
    #[command(flatten)]
    common: Common,
}

#[derive(Debug, Args)]
struct ColocationArgs {
    /// Colocation table (CSV, `workloadI` / `wI…` columns).
    #[arg(long, value_name = "FILE.csv")]
    data: PathBuf,
    /// Train on all of --data and evaluate on this table instead of splitting.
    #[arg(long, value_name = "FILE.csv")]
    test: Option<PathBuf>,
    /// Minimum training appearances per workload in the greedy split.
    #[arg(long, value_name = "N", default_value_t = 3)]
    n_occur: u32,
    #[command(flatten)]
    common: Common,
}

/// Runs `kace eval`.
pub fn run(args: EvalArgs, format: Format) -> Result<()> {
    let (report, common, title) = match args.command {
        EvalCommand::Paper(a) => {
            let pairs =
                load_colocations(&a.data.join("pairs/MPS100_kernel_labels_targetMPS100.csv"))?;
            if a.unseen {
                let path = a.data.join("splits/unseen_workload_splits.csv");
                let rows = read_unseen_splits(&path.display().to_string(), open(&path)?)?;
                let r = paper::evaluate_unseen(&pairs, &rows).context("couldn't evaluate")?;
                (r, a.common, "KACE paper, unseen workloads".to_string())
            } else {
                check_seeds(&a.common.seeds)?;
                let n_occur = a.n_occur.unwrap_or(3);
                let path = a.data.join("splits/n_occur_splits.csv");
                let splits = read_n_occur_splits(&path.display().to_string(), open(&path)?)?;
                let r = paper::evaluate_paper(&pairs, &splits, n_occur, &a.common.seeds)
                    .context("couldn't evaluate")?;
                (r, a.common, format!("KACE paper protocol, n_occur={n_occur}"))
            }
        }
        EvalCommand::Colocations(a) => {
            let data = load_colocations(&a.data)?;
            let r = match &a.test {
                Some(test) => {
                    let test = load_colocations(test)?;
                    if test.k != data.k {
                        bail!(
                            "couldn't evaluate: --data has groups of {} but --test of {}",
                            data.k,
                            test.k
                        );
                    }
                    colocations::evaluate_train_test(&data, &test)
                }
                None => {
                    check_seeds(&a.common.seeds)?;
                    colocations::evaluate_split(&data, a.n_occur, &a.common.seeds)
                }
            }
            .context("couldn't evaluate")?;
            let title = format!("{} ({}-way), n_occur={}", a.data.display(), data.k, a.n_occur);
            (r, a.common, title)
        }
    };
    if report.targets.is_empty() {
        bail!("couldn't evaluate: no target workload had a candidate in the test data");
    }
    print!("{}", render(&report, format, common.per_workload));
    if let Some(path) = &common.plot {
        write_plot(path, &title, &report, common.per_workload)?;
    }
    Ok(())
}

fn check_seeds(seeds: &[u32]) -> Result<()> {
    if seeds.is_empty() {
        bail!("couldn't evaluate: --seeds is empty");
    }
    Ok(())
}

fn open(path: &Path) -> Result<File> {
    File::open(path).with_context(|| format!("couldn't open {}", path.display()))
}

fn load_colocations(path: &Path) -> Result<ColocationData> {
    Ok(read_colocations(&path.display().to_string(), open(path)?)?)
}

/// Policies in report order: the model, the paper's named rules, then the other rules.
fn ordered_policies(report: &EvalReport) -> Vec<(String, f64)> {
    let means = report.means();
    let first = [KACE_LR, ORACLE, BEST_RULE, "memcap", "mem%", RANDOM, "sm%"];
    let mut out: Vec<(String, f64)> =
        first.iter().filter_map(|k| means.get(*k).map(|v| (k.to_string(), *v))).collect();
    for (k, v) in &means {
        if !first.contains(&k.as_str()) {
            out.push((k.clone(), *v));
        }
    }
    out
}

fn render(report: &EvalReport, format: Format, per_workload: bool) -> String {
    let policies = ordered_policies(report);
    match format {
        Format::Json => {
            let mut doc = json!({
                "n_occur": report.n_occur,
                "seeds": report.seeds,
                "normalized_throughput": policies.iter().map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<_, _>>(),
                "mse": report.mse(),
                "r2": report.r2(),
                "rows": report.targets.len(),
                "train_rows": report.train_rows,
            });
            if per_workload {
                doc["per_workload"] = json!(report.per_target());
            }
            let mut s = serde_json::to_string_pretty(&doc).unwrap_or_default();
            s.push('\n');
            s
        }
        Format::Table => {
            let rows: Vec<Vec<String>> =
                policies.iter().map(|(k, v)| vec![k.clone(), format!("{v:.4}")]).collect();
            let mut s = table(&["policy", "normalised throughput"], &rows);
            s.push_str(&format!(
                "\n(seed, target) rows: {}   training rows per seed: {:?}\nMSE {:.4}   R² {:.4}  (z-scored test targets, mean over seeds)\n",
                report.targets.len(),
                report.train_rows,
                report.mse(),
                report.r2()
            ));
            if per_workload {
                let cols = [KACE_LR, BEST_RULE, "memcap", RANDOM];
                let per = report.per_target();
                let rows: Vec<Vec<String>> = per
                    .iter()
                    .map(|(t, m)| {
                        let mut r = vec![t.clone()];
                        r.extend(cols.iter().map(|c| {
                            m.get(*c).map(|v| format!("{v:.4}")).unwrap_or_else(|| "-".into())
                        }));
                        r
                    })
                    .collect();
                let mut header = vec!["workload"];
                header.extend(cols);
                s.push('\n');
                s.push_str(&table(&header, &rows));
            }
            s
        }
    }
}

fn write_plot(path: &Path, title: &str, report: &EvalReport, per_workload: bool) -> Result<()> {
    let svg = if per_workload {
        per_target_bars(title, &[KACE_LR, BEST_RULE, "memcap", RANDOM], &report.per_target())
    } else {
        let shown: Vec<(String, f64)> = ordered_policies(report)
            .into_iter()
            .filter(|(k, _)| {
                [KACE_LR, ORACLE, BEST_RULE, "memcap", "mem%", RANDOM, "sm%"].contains(&k.as_str())
            })
            .collect();
        policy_bars(title, &shown)
    };
    std::fs::write(path, svg).with_context(|| format!("couldn't write plot {}", path.display()))
}
