//! `kace simulate`: runs the cluster simulator on the artifact's measured pairs, for every
//! policy over several seeds, and prints the metrics with their spread and their ratios to
//! exclusive FIFO, and what MPS's same-user rule costs kace (deployed with it, against
//! `mps.multi_user`). kace is retrained every simulated night unless `--retrain never`.

use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use kace_selector::dataset::read_colocations;
use kace_selector::eval::paper::PAPER_SEEDS;
use kace_selector::{Objective, SelectionRules};
use kace_simulator::metrics::mean_std;
use kace_simulator::onboarding::{new_workload_cost, NewWorkloadCost, Summary, Treatment};
use kace_simulator::plot::comparison_svg;
use kace_simulator::retraining::{simulate_kace, Retrain, RetrainReport};
use kace_simulator::trace::write_trace;
use kace_simulator::{
    generate, read_trace, simulate, train_kace, Job, Metrics, Outcome, PairingPolicy, PolicyKind,
    Ratios, TraceSpec, UserMix, World, DEFAULT_WINDOW,
};
use serde_json::{json, Map, Value};

use crate::keyed;
use crate::output::{table, Format};

/// `kace simulate …`
#[derive(Debug, Args)]
pub struct SimulateArgs {
    /// The artifact folder (its pairs/ table is the ground truth and kace's training data).
    #[arg(long, value_name = "DIR")]
    data: PathBuf,
    /// Replay this trace (CSV: submit_s,workload,steps) instead of generating one per seed.
    #[arg(long, value_name = "FILE.csv")]
    trace: Option<PathBuf>,
    /// Nodes in the cluster.
    #[arg(long, default_value_t = 25)]
    nodes: usize,
    /// GPUs per node.
    #[arg(long, default_value_t = 4)]
    gpus_per_node: usize,
    /// Jobs per generated trace.
    #[arg(long, default_value_t = 5000)]
    jobs: usize,
    /// Offered load relative to exclusive capacity (above 1: the queue never empties).
    #[arg(long, default_value_t = 2.0)]
    load: f64,
    /// Mean job length alone, in minutes.
    #[arg(long, default_value_t = 30.0)]
    mean_minutes: f64,
    /// Tail index of the bounded-Pareto job lengths (smaller is heavier).
    #[arg(long, default_value_t = 1.5)]
    tail_alpha: f64,
    /// Seeds: each run draws its trace from one, and trains kace on the paper's split
    /// seed 10, 20, 30, 40, 50 in turn.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1u64, 2, 3, 4, 5])]
    seeds: Vec<u64>,
    /// Pending jobs, from the queue's head, a free slot considers.
    #[arg(long, default_value_t = DEFAULT_WINDOW)]
    window: usize,
    /// Policies to compare (exclusive always runs: it is the baseline).
    #[arg(long, value_delimiter = ',', default_values_t = PolicyKind::ALL.iter().map(|p| p.key().to_string()).collect::<Vec<_>>())]
    policies: Vec<String>,
    /// GPU memory in GiB (the artifact's V100 has 32).
    #[arg(long, default_value_t = 32.0)]
    gpu_memory: f64,
    /// Fraction of GPU memory kace, memcap and oracle keep free.
    #[arg(long, default_value_t = 0.05)]
    memory_margin: f64,
    /// Kind of model the kace policy trains (on the paper's n_occur = 3 training split).
    /// `slowdown` (kace's per-job slowdown model, the production default) or `linear` (the
    /// paper's linear regression).
    #[arg(long, default_value = "slowdown",
          value_parser = keyed::parser(&["slowdown", "linear"], kace_selector::ModelKind::from_key))]
    model: kace_selector::ModelKind,
    /// kace's (and oracle's) gain threshold over the job already on the GPU.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    min_gain: f64,
    /// What kace's and oracle's choices maximise: `throughput-sum`, `normalised-progress` or
    /// `energy` (work per unit of the power model's energy, `kace_selector::energy`).
    #[arg(long, default_value = "throughput-sum",
          value_parser = keyed::parser(&["throughput-sum", "normalised-progress", "energy"], Objective::from_key))]
    objective: Objective,
    /// Users submitting the generated traces' jobs (1: one user, the same-user rule is moot).
    #[arg(long, default_value_t = UserMix::shared_cluster().users)]
    users: usize,
    /// Zipf exponent of the users' job counts (0: every user alike; 1: a few heavy users, many
    /// light ones).
    #[arg(long, default_value_t = UserMix::shared_cluster().skew)]
    user_skew: f64,
    /// Distinct workloads each user runs (0: any of them).
    #[arg(long, default_value_t = UserMix::shared_cluster().workloads_per_user)]
    workloads_per_user: usize,
    /// Simulate `mps.multi_user` (one MPS server for all users: jobs of different users may
    /// share a GPU) for every policy; the same-user rule's cost is then measured the other way.
    #[arg(long)]
    multi_user: bool,
    /// Write the first seed's generated trace to this CSV file (replay it with --trace).
    #[arg(long, value_name = "FILE.csv", conflicts_with = "trace")]
    write_trace: Option<PathBuf>,
    /// Write an SVG (completion-time CDFs, utilisation) of the first seed to this file.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
    /// Also run kace on each seed's trace with this workload new (never observed, system
    /// profile only) and known, and report what its first jobs cost (`new_workload` in the
    /// JSON); comma-separated, or `all`.
    #[arg(long, value_delimiter = ',', value_name = "WORKLOAD")]
    new_workload: Vec<String>,
    /// How many of a new workload's first jobs `--new-workload` compares.
    #[arg(long, default_value_t = 10, value_name = "N")]
    first_jobs: usize,
    /// When kace's model is retrained during a run. `nightly` (the default, because production
    /// runs `kace retrain` every night): every 24 simulated hours, while jobs wait or are still
    /// to come, on the training split and every pair observed so far (its measured
    /// throughputs, ±1.5 % noise), as `kace retrain` trains, and used from then on only if the
    /// activation rule accepts it. `never`: the model trained before the run decides
    /// throughout. The `--new-workload` comparison always runs without retraining.
    #[arg(long, default_value = "nightly",
          value_parser = keyed::parser(&["nightly", "never"], Retrain::from_key))]
    retrain: Retrain,
}

/// Every run of one policy.
struct PolicyRuns {
    kind: PolicyKind,
    metrics: Vec<Metrics>,
    ratios: Vec<Ratios>,
    /// What retraining did in each run (kace's policies only).
    retrains: Vec<RetrainReport>,
}

/// Runs `kace simulate`.
pub fn run(args: SimulateArgs, format: Format) -> Result<()> {
    let gpus = args.nodes.checked_mul(args.gpus_per_node).unwrap_or(0);
    if gpus == 0 {
        bail!("couldn't simulate: the cluster has zero GPUs (--nodes × --gpus-per-node)");
    }
    if args.seeds.is_empty() {
        bail!("couldn't simulate: --seeds is empty");
    }
    if !(0.0..1.0).contains(&args.memory_margin) {
        bail!("couldn't simulate: --memory-margin must be in [0, 1)");
    }
    let mut kinds = vec![PolicyKind::Exclusive];
    for p in &args.policies {
        let Some(k) = PolicyKind::from_key(p.trim()) else {
            let known: Vec<&str> = PolicyKind::ALL.iter().map(|p| p.key()).collect();
            bail!("couldn't simulate: unknown policy '{p}' (known: {})", known.join(", "));
        };
        if !kinds.contains(&k) {
            kinds.push(k);
        }
    }
    kinds.sort();
    let pairs_path = args.data.join("pairs/MPS100_kernel_labels_targetMPS100.csv");
    let data = read_colocations(&pairs_path.display().to_string(), open(&pairs_path)?)?;
    let world = World::from_colocations(&data, args.gpu_memory).context("couldn't simulate")?;
    // kace as a site runs it by default (kace.conf's defaults), on the simulated GPU.
    let rules = SelectionRules {
        gpu_memory_gib: Some(args.gpu_memory),
        memory_margin: args.memory_margin,
        require_same_user: true,
        min_gain: args.min_gain,
        objective: args.objective,
        ..kace_config::Config::default().policy().rules
    };
    let kind = args.model;
    let replay = match &args.trace {
        Some(path) => Some(read_trace(&path.display().to_string(), open(path)?, &world)?),
        None => None,
    };
    let new_workloads: Vec<String> = if args.new_workload.iter().any(|w| w == "all") {
        world.names().to_vec()
    } else {
        for w in &args.new_workload {
            if world.id(w).is_none() {
                bail!("couldn't simulate: --new-workload {w}: no such workload in the data");
            }
        }
        args.new_workload.clone()
    };
    if args.first_jobs == 0 {
        bail!("couldn't simulate: --first-jobs must be at least 1");
    }
    let mut onboarding: Vec<Vec<NewWorkloadCost>> = vec![Vec::new(); new_workloads.len()];
    let mut runs: Vec<PolicyRuns> = kinds
        .iter()
        .map(|&kind| PolicyRuns { kind, metrics: vec![], ratios: vec![], retrains: vec![] })
        .collect();
    let mut first_outcomes: Vec<Outcome> = Vec::new();
    let mut jobs_per_run = 0;
    let mut distinct_users = 1;
    // kace on each seed's trace with `mps.multi_user` the other way round.
    let mut other_users: Vec<(Metrics, Ratios)> = Vec::new();
    for (i, &seed) in args.seeds.iter().enumerate() {
        let jobs: Vec<Job> = match &replay {
            Some(j) => j.clone(),
            None => {
                let spec = TraceSpec {
                    mean_exclusive_s: args.mean_minutes * 60.0,
                    tail_alpha: args.tail_alpha,
                    users: UserMix {
                        users: args.users,
                        skew: args.user_skew,
                        workloads_per_user: args.workloads_per_user,
                    },
                    ..TraceSpec::new(args.jobs, args.load, gpus, seed)
                };
                generate(&world, &spec).context("couldn't generate a trace")?
            }
        };
        jobs_per_run = jobs.len();
        if let (0, Some(path)) = (i, &args.write_trace) {
            std::fs::write(path, write_trace(&world, &jobs))
                .with_context(|| format!("couldn't write trace {}", path.display()))?;
        }
        let model_seed = PAPER_SEEDS[i % PAPER_SEEDS.len()];
        for (w, out) in new_workloads.iter().zip(onboarding.iter_mut()) {
            // A workload the trace never runs costs nothing to onboard in it.
            if !jobs.iter().any(|j| world.name(j.workload) == w) {
                continue;
            }
            out.push(
                new_workload_cost(
                    &data,
                    &world,
                    &jobs,
                    gpus,
                    args.window,
                    &rules,
                    model_seed,
                    w,
                    args.first_jobs,
                    args.multi_user,
                )
                .with_context(|| format!("couldn't simulate {w} as a new workload"))?,
            );
        }
        // One model per seed, trained as `kace train` would on the seed's observed pairs.
        let needs_kace =
            kinds.iter().any(|k| matches!(k, PolicyKind::Kace | PolicyKind::KaceAtStart));
        let trained = if needs_kace {
            Some(
                train_kace(&data, model_seed, kind, rules.objective)
                    .context("couldn't simulate")?,
            )
        } else {
            None
        };
        let mut base: Option<Metrics> = None;
        let users = jobs.iter().map(|j| j.user).collect::<std::collections::BTreeSet<_>>().len();
        distinct_users = distinct_users.max(users);
        for r in runs.iter_mut() {
            let policy = match r.kind {
                PolicyKind::Exclusive => PairingPolicy::exclusive(&world),
                PolicyKind::QueueOrder => PairingPolicy::queue_order(&world),
                PolicyKind::Memcap => PairingPolicy::memcap(&world, &rules),
                PolicyKind::Oracle => PairingPolicy::oracle(&world, &rules),
                PolicyKind::Kace | PolicyKind::KaceAtStart => {
                    let k = trained.as_ref().context("couldn't simulate: no kace model")?;
                    let (o, report) = simulate_kace(
                        &world,
                        &data,
                        k,
                        r.kind,
                        &rules,
                        args.multi_user,
                        &jobs,
                        gpus,
                        args.window,
                        args.retrain,
                        seed,
                    )
                    .with_context(|| format!("couldn't simulate {}", r.kind.key()))?;
                    r.retrains.push(report);
                    record(r, o, &mut base, (i == 0).then_some(&mut first_outcomes));
                    continue;
                }
            }
            .multi_user(args.multi_user);
            let o = simulate(&world, &policy, &jobs, gpus, args.window)
                .with_context(|| format!("couldn't simulate {}", r.kind.key()))?;
            record(r, o, &mut base, (i == 0).then_some(&mut first_outcomes));
        }
        // The same trace under kace with MPS's user setting the other way round.
        if let (true, Some(k)) = (kinds.contains(&PolicyKind::Kace), &trained) {
            let (o, _) = simulate_kace(
                &world,
                &data,
                k,
                PolicyKind::Kace,
                &rules,
                !args.multi_user,
                &jobs,
                gpus,
                args.window,
                args.retrain,
                seed,
            )
            .context("couldn't simulate kace with the other MPS user setting")?;
            let m = Metrics::of(&o);
            let b = base.unwrap_or(m);
            other_users.push((m, Ratios::of(&m, &b)));
        }
    }
    let setup = Setup {
        retrain: args.retrain,
        gpus,
        nodes: args.nodes,
        gpus_per_node: args.gpus_per_node,
        jobs: jobs_per_run,
        load: if replay.is_some() { None } else { Some(args.load) },
        window: args.window,
        seeds: args.seeds.clone(),
        pair_counts: world.pair_counts(),
        workloads: world.len(),
        users: distinct_users,
        user_mix: replay.is_none().then_some((args.user_skew, args.workloads_per_user)),
        multi_user: args.multi_user,
        objective: args.objective.key(),
    };
    print!("{}", render(&setup, &runs, &other_users, &onboarding, format));
    if let Some(path) = &args.plot {
        let labelled: Vec<(&str, &Outcome)> =
            runs.iter().map(|r| r.kind.key()).zip(first_outcomes.iter()).collect();
        let title =
            format!("kace simulate: {gpus} GPUs, {jobs_per_run} jobs, seed {}", args.seeds[0]);
        std::fs::write(path, comparison_svg(&title, &labelled))
            .with_context(|| format!("couldn't write plot {}", path.display()))?;
    }
    Ok(())
}

/// Adds one run's outcome to its policy's runs (its ratios against `base`, the seed's
/// exclusive run, which runs first), and keeps the first seed's outcomes for the plot.
fn record(
    r: &mut PolicyRuns,
    o: Outcome,
    base: &mut Option<Metrics>,
    first_outcomes: Option<&mut Vec<Outcome>>,
) {
    let m = Metrics::of(&o);
    let b = *base.get_or_insert(m);
    r.metrics.push(m);
    r.ratios.push(Ratios::of(&m, &b));
    if let Some(keep) = first_outcomes {
        keep.push(o);
    }
}

struct Setup {
    /// Whether kace was retrained during the runs.
    retrain: Retrain,
    gpus: usize,
    nodes: usize,
    gpus_per_node: usize,
    jobs: usize,
    load: Option<f64>,
    window: usize,
    seeds: Vec<u64>,
    pair_counts: (usize, usize, usize),
    workloads: usize,
    /// Distinct users in the traces (the most of any seed).
    users: usize,
    /// The generated traces' Zipf exponent and workloads per user (`None`: replayed).
    user_mix: Option<(f64, usize)>,
    /// Whether the policies ran as under `mps.multi_user`.
    multi_user: bool,
    /// What kace and oracle maximised.
    objective: &'static str,
}

/// Parses `--objective` by the objective's key, as kace.conf spells it.
/// What the same-user rule costs kace: its throughput ×exclusive with the rule and under
/// `mps.multi_user`, and the rule's over multi_user's, per seed (mean, std each).
struct UserRuleCost {
    with_rule: (f64, f64),
    multi_user: (f64, f64),
    ratio: (f64, f64),
    shared_with_rule: (f64, f64),
    shared_multi_user: (f64, f64),
}

fn user_rule_cost(
    setup: &Setup,
    runs: &[PolicyRuns],
    other: &[(Metrics, Ratios)],
) -> Option<UserRuleCost> {
    let kace = runs.iter().find(|r| r.kind == PolicyKind::Kace)?;
    if other.len() != kace.metrics.len() || other.is_empty() {
        return None;
    }
    let main: Vec<(Metrics, Ratios)> =
        kace.metrics.iter().copied().zip(kace.ratios.iter().copied()).collect();
    let (rule, multi) = if setup.multi_user { (other, &main[..]) } else { (&main[..], other) };
    Some(UserRuleCost {
        with_rule: stat(rule.iter().map(|(_, r)| r.throughput)),
        multi_user: stat(multi.iter().map(|(_, r)| r.throughput)),
        ratio: stat(
            rule.iter()
                .zip(multi)
                .map(|((a, _), (b, _))| a.sustained_work_per_s / b.sustained_work_per_s),
        ),
        shared_with_rule: stat(rule.iter().map(|(m, _)| 100.0 * m.shared_fraction)),
        shared_multi_user: stat(multi.iter().map(|(m, _)| 100.0 * m.shared_fraction)),
    })
}

fn open(path: &Path) -> Result<File> {
    File::open(path).with_context(|| format!("couldn't open {}", path.display()))
}

fn stat(v: impl Iterator<Item = f64>) -> (f64, f64) {
    mean_std(&v.collect::<Vec<_>>())
}

fn pm((m, s): (f64, f64), digits: usize) -> String {
    format!("{m:.digits$} ± {s:.digits$}")
}

/// kace's sustained throughput over oracle's, per seed.
fn kace_vs_oracle(runs: &[PolicyRuns]) -> Option<(f64, f64)> {
    ratio(runs, PolicyKind::Kace, PolicyKind::Oracle)
}

/// `a`'s sustained throughput over `b`'s, per seed (mean, std).
fn ratio(runs: &[PolicyRuns], a: PolicyKind, b: PolicyKind) -> Option<(f64, f64)> {
    let get = |k| runs.iter().find(|r| r.kind == k);
    let (k, o) = (get(a)?, get(b)?);
    Some(stat(
        k.metrics
            .iter()
            .zip(&o.metrics)
            .map(|(k, o)| k.sustained_work_per_s / o.sustained_work_per_s),
    ))
}

/// What retraining did in a policy's runs: per run, the nights held and how many of their
/// models the activation rule accepted and refused (`None`: the policy has no model).
fn retraining_json(r: &PolicyRuns) -> Option<Value> {
    if r.retrains.is_empty() {
        return None;
    }
    let per = |f: fn(&RetrainReport) -> usize| r.retrains.iter().map(f).collect::<Vec<_>>();
    let refusals: Vec<Vec<String>> = r
        .retrains
        .iter()
        .map(|t| t.nights.iter().filter_map(|n| n.refusal.clone()).collect())
        .collect();
    Some(json!({
        "mode": r.retrains[0].mode.key(),
        "nights": per(|t| t.nights.len()),
        "activated": per(RetrainReport::activated),
        "refused": per(RetrainReport::refused),
        "refusals": refusals,
    }))
}

/// The retraining line of the table's notes.
fn retraining_text(mode: Retrain, runs: &[PolicyRuns]) -> String {
    let with: Vec<&PolicyRuns> = runs.iter().filter(|r| !r.retrains.is_empty()).collect();
    if with.is_empty() {
        return String::new();
    }
    if mode == Retrain::Never {
        return "kace's model was not retrained during the runs (--retrain never)\n".into();
    }
    if with.iter().all(|r| r.retrains.iter().all(|t| t.nights.is_empty())) {
        // The default trace ends before its first night: say so, or the line reads as a
        // retraining that failed.
        return "kace retrained nightly: no run lasted until its first night (24 simulated \
                hours with jobs waiting or to come), so no model was retrained\n"
            .into();
    }
    let parts: Vec<String> = with
        .iter()
        .map(|r| {
            let nights: usize = r.retrains.iter().map(|t| t.nights.len()).sum();
            let activated: usize = r.retrains.iter().map(RetrainReport::activated).sum();
            format!(
                "{} {} night(s) over {} run(s), {activated} retrained model(s) activated, {} refused",
                r.kind.key(),
                nights,
                r.retrains.len(),
                nights - activated,
            )
        })
        .collect();
    format!(
        "kace retrained nightly (every 24 simulated hours while jobs wait or are to come): {}\n",
        parts.join("; ")
    )
}

/// The new-workload comparison of one workload over seeds: each treatment's fields as mean and
/// standard deviation, and the first jobs' completion time new over known.
fn onboarding_json(costs: &[NewWorkloadCost]) -> Option<Value> {
    let first = costs.first()?;
    let side = |f: fn(&NewWorkloadCost) -> &Treatment| {
        let s = |g: fn(&Treatment) -> f64| {
            let (m, sd) = stat(costs.iter().map(|c| g(f(c))));
            json!({"mean": m, "std": sd})
        };
        json!({
            "partners": s(|t| t.partners as f64),
            "harmful_partners": s(|t| t.harmful_partners as f64),
            "first_jobs_mean_jct_s": s(|t| t.first_jobs_mean_jct_s),
            "first_jobs_mean_run_s": s(|t| t.first_jobs_mean_run_s),
            "sustained_work_per_s": s(|t| t.sustained_work_per_s),
        })
    };
    let ratio = |g: fn(&Treatment) -> f64| {
        let (m, sd) = stat(costs.iter().map(|c| g(&c.new) / g(&c.known)));
        json!({"mean": m, "std": sd})
    };
    Some(json!({
        "workload": first.workload,
        "first_jobs": first.first_jobs,
        "seeds": costs.len(),
        "known": side(|c| &c.known),
        "new": side(|c| &c.new),
        "new_over_known": {
            "first_jobs_mean_jct": ratio(|t| t.first_jobs_mean_jct_s),
            "first_jobs_mean_run": ratio(|t| t.first_jobs_mean_run_s),
            "sustained_work_per_s": ratio(|t| t.sustained_work_per_s),
        },
    }))
}

fn render(
    setup: &Setup,
    runs: &[PolicyRuns],
    other_users: &[(Metrics, Ratios)],
    onboarding: &[Vec<NewWorkloadCost>],
    format: Format,
) -> String {
    let cost = user_rule_cost(setup, runs, other_users);
    let ms = |(m, s): (f64, f64)| json!({"mean": m, "std": s});
    match format {
        Format::Json => {
            let mut policies = Map::new();
            for r in runs {
                let mut mean = Map::new();
                let mut std = Map::new();
                for (j, name) in Metrics::NAMES.iter().enumerate() {
                    let (m, s) = stat(r.metrics.iter().map(|m| m.values()[j]));
                    mean.insert(name.to_string(), json!(m));
                    std.insert(name.to_string(), json!(s));
                }
                let ratio = |f: fn(&Ratios) -> f64| {
                    let (m, s) = stat(r.ratios.iter().map(f));
                    json!({"mean": m, "std": s})
                };
                let per_run: Vec<Value> = r
                    .metrics
                    .iter()
                    .map(|m| {
                        Value::Object(
                            Metrics::NAMES
                                .iter()
                                .zip(m.values())
                                .map(|(k, v)| (k.to_string(), json!(v)))
                                .collect(),
                        )
                    })
                    .collect();
                let mut entry = json!({
                        "mean": mean,
                        "std": std,
                        "vs_exclusive": {
                            "throughput": ratio(|r| r.throughput),
                            "steps_per_s": ratio(|r| r.steps),
                            "makespan": ratio(|r| r.makespan),
                            "mean_jct": ratio(|r| r.mean_jct),
                            "energy_per_work": ratio(|r| r.energy_per_work),
                        },
                        "runs": per_run,
                });
                if let (Some(rt), Some(obj)) = (retraining_json(r), entry.as_object_mut()) {
                    obj.insert("retraining".into(), rt);
                }
                policies.insert(r.kind.key().to_string(), entry);
            }
            let doc = json!({
                "retrain": setup.retrain.key(),
                "gpus": setup.gpus,
                "nodes": setup.nodes,
                "gpus_per_node": setup.gpus_per_node,
                "jobs": setup.jobs,
                "load": setup.load,
                "window": setup.window,
                "objective": setup.objective,
                "seeds": setup.seeds,
                "workloads": setup.workloads,
                "pairs": {
                    "measured": setup.pair_counts.0,
                    "over_memory": setup.pair_counts.1,
                    "unknown": setup.pair_counts.2,
                },
                "policies": policies,
                "kace_vs_oracle": kace_vs_oracle(runs).map(|(m, s)| json!({"mean": m, "std": s})),
                "kace_vs_kace_at_start": ratio(runs, PolicyKind::Kace, PolicyKind::KaceAtStart)
                    .map(|(m, s)| json!({"mean": m, "std": s})),
                "users": setup.users,
                "user_skew": setup.user_mix.map(|m| m.0),
                "workloads_per_user": setup.user_mix.map(|m| m.1),
                "multi_user": setup.multi_user,
                "same_user_rule": cost.as_ref().map(|c| json!({
                    "kace_with_rule_vs_exclusive": ms(c.with_rule),
                    "kace_multi_user_vs_exclusive": ms(c.multi_user),
                    "with_rule_vs_multi_user": ms(c.ratio),
                    "shared_percent_with_rule": ms(c.shared_with_rule),
                    "shared_percent_multi_user": ms(c.shared_multi_user),
                })),
                "new_workload": onboarding.iter().filter_map(|c| onboarding_json(c)).collect::<Vec<_>>(),
                "new_workload_summary": Summary::of(&onboarding.concat()).map(|s| json!({
                    "comparisons": s.comparisons,
                    "partners_known": s.partners_known,
                    "partners_new": s.partners_new,
                    "harmful_share_known": s.harmful_share_known,
                    "harmful_share_new": s.harmful_share_new,
                    "first_jobs_jct_new_over_known": s.first_jobs_jct_ratio,
                    "cluster_work_new_over_known": {
                        "mean": s.cluster_work_ratio,
                        "min": s.cluster_work_ratio_min,
                        "max": s.cluster_work_ratio_max,
                    },
                })),
            });
            let mut s = serde_json::to_string_pretty(&doc).unwrap_or_default();
            s.push('\n');
            s
        }
        Format::Table => {
            let rows: Vec<Vec<String>> = runs
                .iter()
                .map(|r| {
                    let m = |f: fn(&Metrics) -> f64| stat(r.metrics.iter().map(f));
                    let q = |f: fn(&Ratios) -> f64| stat(r.ratios.iter().map(f));
                    vec![
                        r.kind.key().to_string(),
                        pm(q(|r| r.throughput), 3),
                        pm(q(|r| r.steps), 3),
                        pm(m(|m| m.makespan_s / 3600.0), 1),
                        pm(m(|m| m.mean_jct_s / 3600.0), 1),
                        pm(m(|m| m.p95_jct_s / 3600.0), 1),
                        pm(m(|m| m.mean_wait_s / 3600.0), 1),
                        pm(m(|m| m.gpu_busy_h), 0),
                        pm(m(|m| 100.0 * m.shared_fraction), 1),
                        pm(m(|m| m.steps_per_s), 0),
                        pm(q(|r| r.energy_per_work), 3),
                        pm(m(|m| m.ooms), 0),
                    ]
                })
                .collect();
            let multi = if setup.multi_user { ", mps.multi_user" } else { "" };
            let users = match setup.user_mix {
                Some((skew, per)) => format!(
                    "{} users (Zipf {skew}, {} workloads each){multi}",
                    setup.users,
                    if per == 0 { "all".to_string() } else { per.to_string() },
                ),
                None => format!("{} users{multi}", setup.users),
            };
            let mut s = format!(
                "{} GPUs ({} × {}), {} jobs per run, {}window {}, objective {}, seeds {:?}, {users}\n\
                 ground truth: {} workloads; pairs measured {}, over memory {}, never measured {}\n\n",
                setup.gpus,
                setup.nodes,
                setup.gpus_per_node,
                setup.jobs,
                setup.load.map(|l| format!("load {l}, ")).unwrap_or_else(|| "replayed trace, ".into()),
                setup.window,
                setup.objective,
                setup.seeds,
                setup.workloads,
                setup.pair_counts.0,
                setup.pair_counts.1,
                setup.pair_counts.2
            );
            s.push_str(&table(
                &[
                    "policy",
                    "throughput ×excl",
                    "steps/s ×excl",
                    "makespan h",
                    "mean JCT h",
                    "p95 JCT h",
                    "mean wait h",
                    "GPU busy h",
                    "shared %",
                    "steps/s",
                    "energy/work ×excl",
                    "OOMs",
                ],
                &rows,
            ));
            s.push_str(
                "\nthroughput: exclusive GPU-seconds of work done per second until the last job \
                 started, over exclusive FIFO's (mean ± std over seeds)\n\
                 energy/work: the busy GPUs' energy per unit of work over exclusive FIFO's, by the \
                 power model (kace_selector::energy: modelled, the artifact has no power data)\n",
            );
            let (qm, qs) =
                stat(runs.iter().flat_map(|r| r.metrics.iter().map(|m| m.queued_fraction)));
            s.push_str(&format!(
                "jobs were waiting {:.1} % ± {:.1} of the time until the last start (all policies)\n",
                100.0 * qm,
                100.0 * qs
            ));
            if let Some((m, sd)) = kace_vs_oracle(runs) {
                s.push_str(&format!(
                    "kace reaches {:.1} % ± {:.1} of oracle pairing's throughput\n",
                    100.0 * m,
                    100.0 * sd
                ));
            }
            if let Some((m, sd)) = ratio(runs, PolicyKind::Kace, PolicyKind::KaceAtStart) {
                s.push_str(&format!(
                    "kace as deployed (refill, open GPUs) does {:.1} % ± {:.1} of the work of kace choosing at a lead's start only\n",
                    100.0 * m,
                    100.0 * sd
                ));
            }
            if let Some(c) = &cost {
                s.push_str(&format!(
                    "same-user rule (MPS's default): kace {} ×excl with it (GPUs shared {} %), {} under mps.multi_user ({} %): the rule keeps {:.1} % ± {:.1} of multi_user's throughput\n",
                    pm(c.with_rule, 3),
                    pm(c.shared_with_rule, 1),
                    pm(c.multi_user, 3),
                    pm(c.shared_multi_user, 1),
                    100.0 * c.ratio.0,
                    100.0 * c.ratio.1
                ));
            }
            s.push_str(&retraining_text(setup.retrain, runs));
            if let Some(k) = runs.iter().find(|r| r.kind == PolicyKind::Kace) {
                let (m, sd) = stat(k.metrics.iter().map(|m| m.seen_share));
                s.push_str(&format!(
                    "pairs kace formed that were in its training fit: {:.1} % ± {:.1}\n",
                    100.0 * m,
                    100.0 * sd
                ));
            }
            if let Some(sm) = Summary::of(&onboarding.concat()).filter(|s| s.comparisons > 1) {
                s.push_str(&format!(
                    "new workloads ({} comparisons): {:.1} partners ({:.1} % harmful) new vs \
                     {:.1} ({:.1} %) known; first jobs' completion time new / known {:.3}; \
                     cluster throughput new / known {:.4} ({:.4}–{:.4})\n",
                    sm.comparisons,
                    sm.partners_new,
                    100.0 * sm.harmful_share_new,
                    sm.partners_known,
                    100.0 * sm.harmful_share_known,
                    sm.first_jobs_jct_ratio,
                    sm.cluster_work_ratio,
                    sm.cluster_work_ratio_min,
                    sm.cluster_work_ratio_max,
                ));
            }
            for costs in onboarding.iter().filter(|c| !c.is_empty()) {
                let st = |f: fn(&NewWorkloadCost) -> f64| stat(costs.iter().map(f));
                s.push_str(&format!(
                    "new workload {}: partners {} (harmful {}) new vs {} (harmful {}) known; its \
                     first {} jobs' mean completion time new / known {}, running time {}; \
                     cluster throughput new / known {}\n",
                    costs[0].workload,
                    pm(st(|c| c.new.partners as f64), 1),
                    pm(st(|c| c.new.harmful_partners as f64), 1),
                    pm(st(|c| c.known.partners as f64), 1),
                    pm(st(|c| c.known.harmful_partners as f64), 1),
                    costs[0].first_jobs,
                    pm(st(|c| c.new.first_jobs_mean_jct_s / c.known.first_jobs_mean_jct_s), 3),
                    pm(st(|c| c.new.first_jobs_mean_run_s / c.known.first_jobs_mean_run_s), 3),
                    pm(st(|c| c.new.sustained_work_per_s / c.known.sustained_work_per_s), 4),
                ));
            }
            s
        }
    }
}
