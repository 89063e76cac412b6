//! `kace eval`: runs the paper's protocol or kace's general one on data files, under both the
//! paper's and kace's production training protocol, and prints every policy's normalised
//! objective; `kace eval splits` and `kace eval history` hand over to their own modules.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use kace_plot::bars::{per_target_bars, policy_bars};
use kace_selector::dataset::{
    read_colocations, read_n_occur_splits, read_unseen_splits, ColocationData,
};
use kace_selector::eval::paper::PAPER_SEEDS;
use kace_selector::eval::{
    colocations, paper, EvalOptions, EvalReport, ModelChoice, Protocol, BEST_RULE, KACE,
    KACE_GATED, KACE_LR, ORACLE, RANDOM,
};
use kace_selector::Objective;
use kace_simulator::history::HistorySpec;
use serde_json::{json, Value};

use crate::keyed;
use crate::output::{table, Format};
use crate::{history_eval, splits_eval};

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
    /// Evaluate the SM split chooser (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` per member) on the
    /// artifact's raw MPS sweeps, nested. Not used by the product yet.
    Splits(SplitsArgs),
    /// Replay a simulated site's days on the artifact's measured pairs: kace deciding with the
    /// model of the night before, retrained every night as `kace retrain` does, against one
    /// global model of independent observations (issue 34).
    History(HistoryArgs),
}

/// An inclusive range of seeds from `--seeds` (a single seed is `SeedRange(s, s)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SeedRange(u32, u32);

impl std::fmt::Display for SeedRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0 == self.1 {
            write!(f, "{}", self.0)
        } else {
            write!(f, "{}-{}", self.0, self.1)
        }
    }
}

fn parse_seed_range(s: &str) -> Result<SeedRange, String> {
    let num = |v: &str| {
        v.trim().parse::<u32>().map_err(|_| {
            format!("'{s}' is not a seed or a range of seeds (a whole number ≥ 0, or A-B)")
        })
    };
    match s.split_once('-') {
        None => num(s).map(|v| SeedRange(v, v)),
        Some((a, b)) => {
            let (a, b) = (num(a)?, num(b)?);
            if a > b {
                return Err(format!("seed range '{s}' is empty (start > end)"));
            }
            if b - a >= 100_000 {
                return Err(format!("seed range '{s}' has more than 100000 seeds"));
            }
            Ok(SeedRange(a, b))
        }
    }
}

impl Common {
    /// Every seed named, ascending, each once.
    fn seeds(&self) -> Vec<u32> {
        let mut out: Vec<u32> = self.seeds.iter().flat_map(|r| r.0..=r.1).collect();
        out.sort_unstable();
        out.dedup();
        out
    }
}

/// Options every evaluation shares.
#[derive(Debug, Args)]
struct Common {
    /// Seeds of the runs, comma-separated; `A-B` is every seed from A to B (the paper's are
    /// 10,20,30,40,50; `kace eval colocations` can re-derive splits for any seed).
    #[arg(long, value_delimiter = ',', value_parser = parse_seed_range, default_values_t = PAPER_SEEDS.map(|s| SeedRange(s, s)).to_vec())]
    seeds: Vec<SeedRange>,
    /// Evaluate only this model (default: every model): `kace` (kace's per-job slowdown model,
    /// the production default) or `kace-lr` (the paper's linear regression).
    #[arg(long, value_parser = keyed::parser(&["kace", "kace-lr"], ModelChoice::from_key))]
    model: Option<ModelChoice>,
    /// What a choice is worth: `throughput-sum` (the paper's: Σ colocated throughput, steps/s)
    /// or `normalised-progress` (Σ colocated / exclusive throughput per job).
    #[arg(long, default_value = "throughput-sum",
          value_parser = keyed::parser(&["throughput-sum", "normalised-progress"], Objective::from_key))]
    objective: Objective,
    /// Write an SVG bar chart of the result to this file.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
    /// Put each target workload's own result in the JSON and chart it per workload.
    #[arg(long)]
    per_workload: bool,
    /// Nested evaluation: choose kace's settings by cross-validation inside each training set
    /// only (leave-one-workload-out for unseen workloads), as `kace train` does; the production
    /// protocol's figures come first.
    #[arg(long)]
    nested: bool,
}

#[derive(Debug, Args)]
struct PaperArgs {
    /// The artifact folder (with pairs/ and splits/).
    #[arg(long, value_name = "DIR")]
    data: PathBuf,
    /// Minimum training appearances per workload (2…10; 3 is the paper's "~20 %" setting).
    #[arg(long, value_name = "N", required_unless_present = "unseen")]
    n_occur: Option<u32>,
    /// Run the held-out-workload experiment instead.
    #[arg(long)]
    unseen: bool,
    /// With --unseen: the held-out workload has only its system profile (exclusive
    /// throughput, SM %, memory-bandwidth %, memcap: what NVML samples), no Nsight Compute
    /// kernel metrics, in the inner cross-validation as in the test. Only kace is evaluated
    /// (the paper's model needs every kernel metric).
    #[arg(long, requires = "unseen")]
    system_only: bool,
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

#[derive(Debug, Args)]
struct SplitsArgs {
    /// The artifact folder (with raw_mps_sweeps/ and workload_profiles/).
    #[arg(long, value_name = "DIR")]
    data: PathBuf,
    /// The sweep file, relative to --data unless absolute: the merged campaigns, which have the
    /// most pairs measured at all nine splits and at 100/100.
    #[arg(long, value_name = "FILE.csv", default_value = splits_eval::DEFAULT_SWEEPS)]
    sweeps: PathBuf,
    /// The system profiles (exclusive throughput, sm%, mem%, memcap), relative to --data unless
    /// absolute.
    #[arg(long, value_name = "FILE.csv", default_value = splits_eval::DEFAULT_PROFILES)]
    profiles: PathBuf,
    /// Each workload's exclusive sweep (throughput alone at 10…100 %), relative to --data
    /// unless absolute: offers the chooser each member's throughput alone at its share as
    /// features (inner cross-validation decides whether to use them).
    #[arg(long, value_name = "FILE.csv", default_value = splits_eval::DEFAULT_EXCLUSIVE)]
    exclusive: PathBuf,
    /// Offer the chooser only the system profiles, not the exclusive sweeps.
    #[arg(long)]
    system_only: bool,
    /// Seeds of the held-out-pair splits; `A-B` is every seed from A to B.
    #[arg(long, value_delimiter = ',', value_parser = parse_seed_range, default_value = "1-10")]
    seeds: Vec<SeedRange>,
    /// Share of the pairs held out per seed.
    #[arg(long, value_name = "F", default_value_t = 0.2)]
    test_fraction: f64,
    /// The fallback rule's margin alone, without discounting each predicted gain by its doubt
    /// (the first rule tried; docs/models.md, *The SM split*).
    #[arg(long)]
    no_doubt: bool,
}

#[derive(Debug, Args)]
struct HistoryArgs {
    /// The artifact folder (with pairs/).
    #[arg(long, value_name = "DIR")]
    data: PathBuf,
    /// Days simulated.
    #[arg(long, value_name = "N", default_value_t = 14)]
    days: usize,
    /// Seeds of the histories; `A-B` is every seed from A to B.
    #[arg(long, value_delimiter = ',', value_parser = parse_seed_range, default_value = "1-10")]
    seeds: Vec<SeedRange>,
    /// Jobs submitted per day.
    #[arg(long, value_name = "N", default_value_t = HistorySpec::default().jobs_per_day)]
    jobs_per_day: usize,
    /// Workloads the site has on day 1 (the others arrive one a day).
    #[arg(long, value_name = "N", default_value_t = HistorySpec::default().initial_workloads)]
    initial_workloads: usize,
    /// Measurement noise of an observation (standard deviation of log throughput).
    #[arg(long, value_name = "SD", default_value_t = HistorySpec::default().noise)]
    noise: f64,
    /// Exploratory groups per new workload (kace.conf's selection.explore_pairs; 0: none).
    #[arg(long, value_name = "N", default_value_t = HistorySpec::default().explore_pairs)]
    explore_pairs: u32,
    /// Doubts of predicted gain an exploratory group must show (selection.explore_weight).
    #[arg(long, value_name = "W", default_value_t = HistorySpec::default().explore_weight)]
    explore_weight: f64,
}

/// The two protocols' reports of one evaluation; `native` is the one the command is about.
struct Evaluation {
    title: String,
    native: Protocol,
    reports: Vec<EvalReport>,
    /// Whether the test workloads were never seen in training (names the MAPE key).
    unseen: bool,
}

impl Evaluation {
    fn native(&self) -> &EvalReport {
        self.reports.iter().find(|r| r.protocol == self.native).unwrap_or(&self.reports[0])
    }
}

/// Runs `kace eval`.
pub fn run(args: EvalArgs, format: Format) -> Result<()> {
    let (eval, common) = match args.command {
        EvalCommand::Paper(a) => (eval_paper(&a)?, a.common),
        EvalCommand::Colocations(a) => (eval_colocations(&a)?, a.common),
        EvalCommand::History(a) => {
            let mut seeds: Vec<u32> = a.seeds.iter().flat_map(|r| r.0..=r.1).collect();
            seeds.sort_unstable();
            seeds.dedup();
            let spec = HistorySpec {
                days: a.days,
                jobs_per_day: a.jobs_per_day,
                initial_workloads: a.initial_workloads,
                noise: a.noise,
                explore_pairs: a.explore_pairs,
                explore_weight: a.explore_weight,
                ..HistorySpec::default()
            };
            let input = history_eval::Input { data: a.data, spec, seeds };
            print!("{}", history_eval::run(&input, format)?);
            return Ok(());
        }
        EvalCommand::Splits(a) => {
            let seeds: Vec<u32> = {
                let mut v: Vec<u32> = a.seeds.iter().flat_map(|r| r.0..=r.1).collect();
                v.sort_unstable();
                v.dedup();
                v
            };
            let resolve = |p: &Path| if p.is_absolute() { p.to_path_buf() } else { a.data.join(p) };
            let input = splits_eval::Input {
                sweeps: resolve(&a.sweeps),
                profiles: resolve(&a.profiles),
                exclusive: (!a.system_only).then(|| resolve(&a.exclusive)),
                seeds,
                test_fraction: a.test_fraction,
                no_doubt: a.no_doubt,
            };
            print!("{}", splits_eval::run(&input, format)?);
            return Ok(());
        }
    };
    if eval.native().targets.is_empty() {
        bail!("couldn't evaluate: no target workload had two or more candidates in the test data");
    }
    print!("{}", render(&eval, format, common.per_workload));
    if let Some(path) = &common.plot {
        write_plot(path, &eval, common.per_workload)?;
    }
    Ok(())
}

fn options(c: &Common, protocol: Protocol) -> Result<EvalOptions> {
    if c.seeds.is_empty() {
        bail!("couldn't evaluate: --seeds is empty");
    }
    Ok(EvalOptions {
        protocol,
        objective: c.objective,
        models: match c.model {
            None => ModelChoice::ALL.to_vec(),
            Some(m) => vec![m],
        },
        nested: c.nested,
        ..EvalOptions::default()
    })
}

const PROTOCOLS: [Protocol; 2] = [Protocol::Paper, Protocol::Production];

fn eval_paper(a: &PaperArgs) -> Result<Evaluation> {
    let pairs = load_colocations(&a.data.join("pairs/MPS100_kernel_labels_targetMPS100.csv"))?;
    let mut reports = Vec::new();
    let title = if a.unseen {
        let path = a.data.join("splits/unseen_workload_splits.csv");
        let rows = read_unseen_splits(&path.display().to_string(), open(&path)?)?;
        for p in PROTOCOLS {
            let mut opts = options(&a.common, p)?;
            if a.system_only {
                opts.system_only = true;
                opts.models = vec![ModelChoice::Kace];
            }
            reports
                .push(paper::evaluate_unseen(&pairs, &rows, &opts).context("couldn't evaluate")?);
        }
        if a.system_only {
            "KACE artifact, unseen workloads with system profiles only (leave-one-workload-out)"
                .to_string()
        } else {
            "KACE artifact, unseen workloads (leave-one-workload-out)".to_string()
        }
    } else {
        let n_occur = a.n_occur.unwrap_or(3);
        let path = a.data.join("splits/n_occur_splits.csv");
        let splits = read_n_occur_splits(&path.display().to_string(), open(&path)?)?;
        for p in PROTOCOLS {
            let opts = options(&a.common, p)?;
            reports.push(
                paper::evaluate_paper(&pairs, &splits, n_occur, &a.common.seeds(), &opts)
                    .context("couldn't evaluate")?,
            );
        }
        format!("KACE artifact, n_occur={n_occur}")
    };
    let native = if a.common.nested { Protocol::Production } else { Protocol::Paper };
    Ok(Evaluation { title, native, reports, unseen: a.unseen })
}

fn eval_colocations(a: &ColocationArgs) -> Result<Evaluation> {
    let data = load_colocations(&a.data)?;
    let test = match &a.test {
        Some(t) => {
            let test = load_colocations(t)?;
            if test.k != data.k {
                bail!(
                    "couldn't evaluate: --data has groups of {} but --test of {}",
                    data.k,
                    test.k
                );
            }
            Some(test)
        }
        None => None,
    };
    let mut reports = Vec::new();
    for p in PROTOCOLS {
        let opts = options(&a.common, p)?;
        let r = match &test {
            Some(test) => colocations::evaluate_train_test(&data, test, &opts),
            None => colocations::evaluate_split(&data, a.n_occur, &a.common.seeds(), &opts),
        };
        reports.push(r.context("couldn't evaluate")?);
    }
    let title = format!("{} ({}-way), n_occur={}", a.data.display(), data.k, a.n_occur);
    Ok(Evaluation { title, native: Protocol::Production, reports, unseen: false })
}

fn open(path: &Path) -> Result<File> {
    File::open(path).with_context(|| format!("couldn't open {}", path.display()))
}

fn load_colocations(path: &Path) -> Result<ColocationData> {
    Ok(read_colocations(&path.display().to_string(), open(path)?)?)
}

/// Policies in report order: the models, the paper's named rules, then the other rules.
const FIRST: [&str; 8] = [KACE, KACE_LR, ORACLE, BEST_RULE, "memcap", "mem%", RANDOM, "sm%"];

fn ordered_keys(means: &BTreeMap<String, f64>) -> Vec<String> {
    let mut out: Vec<String> =
        FIRST.iter().filter(|k| means.contains_key(**k)).map(|k| k.to_string()).collect();
    out.extend(means.keys().filter(|k| !FIRST.contains(&k.as_str())).cloned());
    out
}

fn num_or_null(v: Option<f64>) -> Value {
    v.filter(|v| v.is_finite()).map_or(Value::Null, |v| json!(v))
}

/// Harm, gain and prediction error of kace's decisions, and the spread over seeds.
fn decision_json(r: &EvalReport, unseen: bool) -> serde_json::Map<String, Value> {
    let mut m = serde_json::Map::new();
    m.insert(
        "harmful_share".into(),
        json!({
            KACE: num_or_null(r.harmful_share(KACE)),
            KACE_GATED: num_or_null(r.harmful_share(KACE_GATED)),
            ORACLE: num_or_null(r.harmful_share(ORACLE)),
        }),
    );
    m.insert(
        "oracle_gain_share".into(),
        json!({ KACE: num_or_null(r.gain_share(false)), KACE_GATED: num_or_null(r.gain_share(true)) }),
    );
    m.insert("no_partner_share".into(), num_or_null(r.none_share()));
    let mape = if r.job_errors.is_empty() { None } else { Some(r.mape()) };
    m.insert(if unseen { "mape_unseen" } else { "mape_seen" }.into(), num_or_null(mape));
    let spread: serde_json::Map<String, Value> = ordered_keys(&r.means())
        .into_iter()
        .filter_map(|k| {
            let s = r.seed_spread(&k)?;
            Some((k, json!({"mean": s.mean, "min": s.min, "median": s.median, "max": s.max})))
        })
        .collect();
    m.insert("seed_spread".into(), spread.into());
    let mut chosen: BTreeMap<String, usize> = BTreeMap::new();
    for (p, kappa, kappa_new) in &r.tuned {
        *chosen
            .entry(format!(
                "alpha={} scale={} neighbours={} doubt_weight={kappa} \
                 new_workload_weight={kappa_new}",
                p.alpha, p.workload_scale, p.neighbours
            ))
            .or_insert(0) += 1;
    }
    m.insert("chosen_settings".into(), json!(chosen));
    m
}

fn protocol_json(r: &EvalReport, per_workload: bool, unseen: bool) -> Value {
    let means = r.means();
    let nt: serde_json::Map<String, Value> =
        ordered_keys(&means).into_iter().map(|k| (k.clone(), json!(means[&k]))).collect();
    let fit: serde_json::Map<String, Value> =
        r.model_fit.keys().map(|m| (m.clone(), json!({"mse": r.mse(m), "r2": r.r2(m)}))).collect();
    let mut v = json!({
        "normalized_throughput": nt,
        "mse": r.mse(KACE_LR),
        "r2": r.r2(KACE_LR),
        "model_fit": fit,
        "rows": r.targets.len(),
        "train_rows": r.train_rows,
    });
    if let Some(d) = r.paired(KACE, KACE_LR) {
        v["paired"] = json!({
            "kace-minus-kace-lr": {
                "seeds": d.seeds,
                "mean_difference": d.mean,
                "standard_error": if d.standard_error.is_finite() { json!(d.standard_error) } else { Value::Null },
                "better": d.better,
                "worse": d.worse,
                "equal": d.equal,
            }
        });
    }
    if per_workload {
        v["per_workload"] = json!(r.per_target());
    }
    if let Value::Object(o) = &mut v {
        o.extend(decision_json(r, unseen));
    }
    v
}

/// The training rows of each run: listed for a few runs, summarised for many.
fn rows_per_run(rows: &[usize]) -> String {
    match (rows.iter().min(), rows.iter().max()) {
        (Some(lo), Some(hi)) if rows.len() > 10 => {
            let mean = rows.iter().sum::<usize>() as f64 / rows.len() as f64;
            format!("{lo}–{hi} (mean {mean:.1})")
        }
        _ => format!("{rows:?}"),
    }
}

/// One line saying how kace did against the paper's model, seed by seed.
fn paired_line(r: &EvalReport) -> Option<String> {
    let d = r.paired(KACE, KACE_LR)?;
    let spread = if d.standard_error.is_finite() {
        format!(" ± {:.4} (standard error over {} seeds", d.standard_error, d.seeds)
    } else {
        format!(" ({} seed", d.seeds)
    };
    Some(format!(
        "{} protocol: {KACE} − {KACE_LR} = {:+.4}{spread}; {KACE} better in {}, worse in {}, equal in {})\n",
        r.protocol.key(),
        d.mean,
        d.better,
        d.worse,
        d.equal
    ))
}

/// One line on harm, the gain rule and prediction error.
fn decision_line(r: &EvalReport, unseen: bool) -> String {
    let pct = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{:.1} %", 100.0 * v));
    let spread = r
        .seed_spread(KACE)
        .filter(|_| r.seeds.len() > 1)
        .map(|s| {
            format!(
                "; {KACE} over seeds: mean {:.4}, min {:.4}, median {:.4}, max {:.4}",
                s.mean, s.min, s.median, s.max
            )
        })
        .unwrap_or_default();
    format!(
        "{} protocol: harmful picks {KACE} {}, {KACE_GATED} {} (no partner for {}), oracle {}; \
         {KACE_GATED} realises {} of the oracle's gain ({KACE} {}); MAPE {} {:.1} %{spread}\n",
        r.protocol.key(),
        pct(r.harmful_share(KACE)),
        pct(r.harmful_share(KACE_GATED)),
        pct(r.none_share()),
        pct(r.harmful_share(ORACLE)),
        pct(r.gain_share(true)),
        pct(r.gain_share(false)),
        if unseen { "unseen" } else { "seen" },
        r.mape(),
    )
}

fn render(eval: &Evaluation, format: Format, per_workload: bool) -> String {
    let native = eval.native();
    match format {
        Format::Json => {
            let mut doc = protocol_json(native, per_workload, eval.unseen);
            doc["n_occur"] = json!(native.n_occur);
            doc["seeds"] = json!(native.seeds);
            doc["protocol"] = json!(native.protocol.key());
            doc["objective"] = json!(native.objective.key());
            doc["by_protocol"] = eval
                .reports
                .iter()
                .map(|r| {
                    (r.protocol.key().to_string(), protocol_json(r, per_workload, eval.unseen))
                })
                .collect::<serde_json::Map<_, _>>()
                .into();
            let mut s = serde_json::to_string_pretty(&doc).unwrap_or_default();
            s.push('\n');
            s
        }
        Format::Table => {
            let means: Vec<BTreeMap<String, f64>> =
                eval.reports.iter().map(EvalReport::means).collect();
            let mut header = vec!["policy".to_string()];
            header.extend(eval.reports.iter().map(|r| format!("{} protocol", r.protocol.key())));
            let rows: Vec<Vec<String>> = ordered_keys(&native.means())
                .into_iter()
                .map(|k| {
                    let mut row = vec![k.clone()];
                    row.extend(
                        means.iter().map(|m| m.get(&k).map_or("-".into(), |v| format!("{v:.4}"))),
                    );
                    row
                })
                .collect();
            let header_refs: Vec<&str> = header.iter().map(String::as_str).collect();
            let mut s =
                format!("{} — normalised {} (oracle = 1)\n\n", eval.title, native.objective.key());
            s.push_str(&table(&header_refs, &rows));
            s.push('\n');
            for r in &eval.reports {
                let fits: Vec<String> = r
                    .model_fit
                    .keys()
                    .map(|m| format!("{m}: MSE {:.4}, R² {:.4}", r.mse(m), r.r2(m)))
                    .collect();
                s.push_str(&format!(
                    "{} protocol: {} (seed, target) rows; fitted on {} rows per run; {}\n",
                    r.protocol.key(),
                    r.targets.len(),
                    rows_per_run(&r.train_rows),
                    fits.join("; ")
                ));
            }
            for line in eval.reports.iter().filter_map(paired_line) {
                s.push_str(&line);
            }
            for r in &eval.reports {
                s.push_str(&decision_line(r, eval.unseen));
            }
            let prod =
                eval.reports.iter().find(|r| r.protocol == Protocol::Production).unwrap_or(native);
            let cols: Vec<&str> = [KACE, KACE_LR, BEST_RULE, "memcap", RANDOM]
                .into_iter()
                .filter(|c| prod.targets.iter().any(|t| t.normalised.contains_key(*c)))
                .collect();
            let rows: Vec<Vec<String>> = prod
                .per_target()
                .iter()
                .map(|(t, m)| {
                    let mut r = vec![t.clone()];
                    r.extend(
                        cols.iter().map(|c| m.get(*c).map_or("-".into(), |v| format!("{v:.4}"))),
                    );
                    r
                })
                .collect();
            let mut header = vec!["workload (production protocol, mean over seeds)"];
            header.extend(&cols);
            s.push('\n');
            s.push_str(&table(&header, &rows));
            s
        }
    }
}

fn write_plot(path: &Path, eval: &Evaluation, per_workload: bool) -> Result<()> {
    let native = eval.native();
    let title = format!("{} ({} protocol)", eval.title, native.protocol.key());
    let svg = if per_workload {
        per_target_bars(&title, &[KACE, KACE_LR, BEST_RULE, "memcap", RANDOM], &native.per_target())
    } else {
        let means = native.means();
        let shown: Vec<(String, f64)> =
            FIRST.iter().filter_map(|k| means.get(*k).map(|v| (k.to_string(), *v))).collect();
        policy_bars(&title, &shown)
    };
    std::fs::write(path, svg).with_context(|| format!("couldn't write plot {}", path.display()))
}
