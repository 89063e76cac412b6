//! `kace eval splits`: reads the artifact's raw MPS sweeps and system profiles, runs the split
//! chooser's nested evaluation (held-out pairs over seeds, and leave-one-workload-out) and
//! prints the figures issue 33 asks for, with their spread and whether its goals are met.

use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use kace_selector::dataset::{read_exclusive_sweeps, read_mps_sweeps, read_system_profiles};
use kace_selector::eval::splits::{
    evaluate, PolicyScore, SplitProtocol, SplitReport, CHOOSER, POLICIES,
};
use kace_selector::eval::Spread;
use kace_selector::splits::{
    artifact_candidates, examples, Dropped, DOUBT_WEIGHTS, MAX_LOSS_VS_DEFAULT,
};
use serde_json::{json, Value};

use crate::output::{table, Format};

/// The sweep file used unless `--sweeps` says otherwise, inside the artifact folder.
pub const DEFAULT_SWEEPS: &str = "raw_mps_sweeps/merged0505_0617_0520_0520_share_steps_stage2.csv";
/// The system profiles, inside the artifact folder.
pub const DEFAULT_PROFILES: &str = "workload_profiles/baseline_labels.csv";

/// Each workload's exclusive sweep (throughput alone at 10…100 %), inside the artifact folder.
pub const DEFAULT_EXCLUSIVE: &str = "raw_mps_sweeps/baseline_steps_stage2.csv";

/// The goal on the mean: within 2 % of the best split.
pub const GOAL_CHOSEN_VS_BEST: f64 = 0.98;

/// What to evaluate.
pub struct Input {
    /// The sweep file.
    pub sweeps: PathBuf,
    /// The profile table.
    pub profiles: PathBuf,
    /// The exclusive sweeps, when the alone-at-share features may be used.
    pub exclusive: Option<PathBuf>,
    /// Seeds of the held-out-pair splits.
    pub seeds: Vec<u32>,
    /// Share of unordered pairs held out per seed.
    pub test_fraction: f64,
    /// The fallback rule without the doubt term (κ = 0): the margin alone.
    pub no_doubt: bool,
}

fn open(path: &Path) -> Result<File> {
    File::open(path).with_context(|| format!("couldn't open {}", path.display()))
}

/// Runs the evaluation and renders it.
pub fn run(input: &Input, format: Format) -> Result<String> {
    if input.seeds.is_empty() {
        bail!("couldn't evaluate: --seeds is empty");
    }
    let rows = read_mps_sweeps(&input.sweeps.display().to_string(), open(&input.sweeps)?)?;
    let profiles =
        read_system_profiles(&input.profiles.display().to_string(), open(&input.profiles)?)?;
    let candidates = artifact_candidates();
    let exclusive = match &input.exclusive {
        Some(p) => Some(read_exclusive_sweeps(&p.display().to_string(), open(p)?)?),
        None => None,
    };
    let (ex, dropped) = examples(&rows, &profiles, exclusive.as_ref(), &candidates);
    if ex.len() < 10 {
        bail!(
            "couldn't evaluate: only {} pair(s) of {} were measured at every split with both \
             workloads profiled",
            ex.len(),
            rows.len()
        );
    }
    let held = SplitProtocol::HeldOutPairs { test_fraction: input.test_fraction };
    let weights: &[f64] = if input.no_doubt { &[0.0] } else { &DOUBT_WEIGHTS };
    let pairs =
        evaluate(&ex, &candidates, held, &input.seeds, weights).context("couldn't evaluate")?;
    let lowo = evaluate(&ex, &candidates, SplitProtocol::LeaveOneWorkloadOut, &[], weights)
        .context("couldn't evaluate")?;
    Ok(match format {
        Format::Json => {
            let mut s =
                serde_json::to_string_pretty(&document(input, rows.len(), dropped, &pairs, &lowo))
                    .unwrap_or_default();
            s.push('\n');
            s
        }
        Format::Table => text(input, rows.len(), dropped, &pairs, &lowo),
    })
}

fn spread_json(s: &Spread) -> Value {
    json!({"mean": s.mean, "min": s.min, "median": s.median, "max": s.max})
}

fn score_json(s: &PolicyScore) -> Value {
    json!({
        "chosen_vs_best": s.chosen_vs_best,
        "chosen_vs_default": s.chosen_vs_default,
        "worst_vs_default": s.worst_vs_default,
        "spread": {
            "chosen_vs_best": spread_json(&s.chosen_vs_best_runs),
            "chosen_vs_default": spread_json(&s.chosen_vs_default_runs),
            "worst_vs_default": spread_json(&s.worst_vs_default_runs),
        },
    })
}

/// Whether the two goals hold for a score.
fn goals(s: &PolicyScore) -> Value {
    json!({
        "chosen_vs_best_at_least": GOAL_CHOSEN_VS_BEST,
        "chosen_vs_best_met": s.chosen_vs_best >= GOAL_CHOSEN_VS_BEST,
        "worst_vs_default_at_least": 1.0 - MAX_LOSS_VS_DEFAULT,
        "worst_vs_default_met": s.worst_vs_default >= 1.0 - MAX_LOSS_VS_DEFAULT,
    })
}

/// Every test pair for which the chooser gave less than the goal's share of 100/100: what the
/// worst-case figure is made of.
fn losses(r: &SplitReport) -> Value {
    let mut out = Vec::new();
    for run in &r.runs {
        for p in &run.pairs {
            let Some(&(vs_best, vs_default)) = p.ratios.get(CHOOSER) else { continue };
            if vs_default < 1.0 - MAX_LOSS_VS_DEFAULT {
                out.push(json!({
                    "seed": run.seed,
                    "heldout": run.heldout,
                    "workloads": p.workloads,
                    "chosen": p.chosen.to_string(),
                    "best": p.best.to_string(),
                    "chosen_vs_best": vs_best,
                    "chosen_vs_default": vs_default,
                }));
            }
        }
    }
    Value::Array(out)
}

fn report_json(r: &SplitReport) -> Value {
    let policies: serde_json::Map<String, Value> =
        POLICIES.iter().filter_map(|p| Some((p.to_string(), score_json(&r.score(p)?)))).collect();
    let mut v = json!({
        "protocol": r.protocol.key(),
        "runs": r.runs.len(),
        "scored_pairs": r.scored_pairs(),
        "moved_share": r.moved_share(),
        "chosen_settings": r.chosen_settings(),
        "chosen_doubt_weights": r.chosen_doubt_weights(),
        "policies": policies,
        "losses": losses(r),
    });
    if let Some(s) = r.score(CHOOSER) {
        v["chosen_vs_best"] = json!(s.chosen_vs_best);
        v["chosen_vs_default"] = json!(s.chosen_vs_default);
        v["worst_vs_default"] = json!(s.worst_vs_default);
        v["goals"] = goals(&s);
    }
    v
}

/// Examples that carry the alone-at-share features.
fn ex_alone(r: &SplitReport) -> usize {
    r.alone_examples
}

fn document(
    input: &Input,
    rows: usize,
    dropped: Dropped,
    pairs: &SplitReport,
    lowo: &SplitReport,
) -> Value {
    let mut doc = report_json(pairs);
    doc["seeds"] = json!(input.seeds);
    doc["test_fraction"] = json!(input.test_fraction);
    doc["fallback"] = json!(if input.no_doubt { "margin" } else { "doubt-weighted margin" });
    doc["protocol"] = json!(format!(
        "nested; outer: held-out pairs ({} of the unordered pairs per seed, both orders \
         together); inner: 5 folds of the training pairs choose the ridge strength and the \
         fallback margin",
        input.test_fraction
    ));
    doc["objective"] = json!(
        "normalised throughput: sum over the two jobs of colocated / exclusive throughput \
         (Exclusive100)"
    );
    doc["candidates"] = json!(pairs.candidates.iter().map(|s| s.to_string()).collect::<Vec<_>>());
    doc["data"] = json!({
        "sweeps": input.sweeps.display().to_string(),
        "profiles": input.profiles.display().to_string(),
        "exclusive_sweeps": input.exclusive.as_ref().map(|p| p.display().to_string()),
        "with_alone_features": ex_alone(pairs),
        "rows": rows,
        "examples": pairs.examples,
        "dropped": {
            "unmeasured": dropped.unmeasured,
            "unprofiled": dropped.unprofiled,
            "implausible": dropped.implausible,
        },
    });
    doc["leave_one_workload_out"] = report_json(lowo);
    doc["product"] = json!("off: nothing in the node sets CUDA_MPS_ACTIVE_THREAD_PERCENTAGE yet");
    doc
}

/// The three settings the inner search chose most often, with how many runs chose each.
fn most_common(r: &SplitReport) -> String {
    let mut v: Vec<(String, usize)> = r.chosen_settings().into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let shown: Vec<String> = v.iter().take(3).map(|(k, n)| format!("{k} ({n})")).collect();
    shown.join("; ")
}

fn text(
    input: &Input,
    rows: usize,
    dropped: Dropped,
    pairs: &SplitReport,
    lowo: &SplitReport,
) -> String {
    let f = |v: f64| format!("{v:.4}");
    let sp = |s: &Spread| format!("{:.4} / {:.4} / {:.4}", s.min, s.median, s.max);
    let mut out = format!(
        "SM split chooser, nested — {} ordered pairs from {} sweep rows ({} not measured at every \
         split, {} unprofiled, {} implausible)\n\n",
        pairs.examples, rows, dropped.unmeasured, dropped.unprofiled, dropped.implausible
    );
    for (r, what) in [
        (
            pairs,
            format!("held-out pairs, seeds {:?}, {} held out", input.seeds, input.test_fraction),
        ),
        (lowo, "leave-one-workload-out".to_string()),
    ] {
        out.push_str(&format!("{what} — normalised throughput, mean over every test pair\n"));
        let header = [
            "policy",
            "chosen/best",
            "min/median/max over runs",
            "chosen/100-100",
            "worst/100-100",
        ];
        let body: Vec<Vec<String>> = POLICIES
            .iter()
            .filter_map(|p| {
                let s = r.score(p)?;
                Some(vec![
                    p.to_string(),
                    f(s.chosen_vs_best),
                    sp(&s.chosen_vs_best_runs),
                    f(s.chosen_vs_default),
                    f(s.worst_vs_default),
                ])
            })
            .collect();
        out.push_str(&table(&header, &body));
        if let Some(s) = r.score(CHOOSER) {
            let yes = |b: bool| if b { "met" } else { "not met" };
            out.push_str(&format!(
                "goals: chosen/best ≥ {GOAL_CHOSEN_VS_BEST} {}; worst/100-100 ≥ {} {}; the \
                 chooser left 100/100 for {:.1} % of pairs\nsettings chosen most often (of {} \
                 runs): {}; doubt weight κ chosen: {:?}\n\n",
                yes(s.chosen_vs_best >= GOAL_CHOSEN_VS_BEST),
                1.0 - MAX_LOSS_VS_DEFAULT,
                yes(s.worst_vs_default >= 1.0 - MAX_LOSS_VS_DEFAULT),
                100.0 * r.moved_share(),
                r.runs.len(),
                most_common(r),
                r.chosen_doubt_weights()
            ));
        }
    }
    out.push_str(
        "Off in the product: nothing in the node sets CUDA_MPS_ACTIVE_THREAD_PERCENTAGE yet.\n",
    );
    out
}
