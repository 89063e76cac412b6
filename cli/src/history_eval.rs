//! `kace eval history`: reads the artifact's measured pairs, replays a simulated site's days
//! under both nightly trainings (`kace_simulator::history`) for every seed, and prints each
//! day's figures with their spread over seeds, and whether issue 34's goals are met.

use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use kace_selector::dataset::read_colocations;
use kace_selector::eval::Spread;
use kace_simulator::history::{run_history, Day, History, HistorySpec, Training};
use serde_json::{json, Value};

use crate::output::{table, Format};

/// The pair table inside the artifact folder.
pub const PAIRS: &str = "pairs/MPS100_kernel_labels_targetMPS100.csv";

/// Issue 34's goals after [`GOAL_DAY`] days (means over seeds).
pub const GOAL_DAY: usize = 7;
/// Per-job MAPE on groups seen at least twice, at most.
pub const GOAL_MAPE_REPEATED: f64 = 0.04;
/// Harmful share of formed groups, at most.
pub const GOAL_HARMFUL: f64 = 0.01;
/// Share of the oracle's gain kept, at least.
pub const GOAL_GAIN: f64 = 0.97;
/// Oracle ratio, at least.
pub const GOAL_ORACLE: f64 = 0.985;

/// What to run.
pub struct Input {
    /// The artifact folder.
    pub data: PathBuf,
    /// The site.
    pub spec: HistorySpec,
    /// Seeds.
    pub seeds: Vec<u32>,
}

fn open(path: &Path) -> Result<File> {
    File::open(path).with_context(|| format!("couldn't open {}", path.display()))
}

/// Runs every seed under both trainings and renders the result.
pub fn run(input: &Input, format: Format) -> Result<String> {
    if input.seeds.is_empty() {
        bail!("couldn't evaluate: --seeds is empty");
    }
    let path = input.data.join(PAIRS);
    let data = read_colocations(&path.display().to_string(), open(&path)?)?;
    let mut runs: Vec<(Training, Vec<History>)> = Vec::new();
    for training in [Training::Repeats, Training::Independent] {
        let mut hs = Vec::new();
        for &seed in &input.seeds {
            let h = run_history(&data, &input.spec, u64::from(seed), training)
                .with_context(|| format!("couldn't simulate seed {seed} ({})", training.key()))?;
            hs.push(h);
        }
        runs.push((training, hs));
    }
    Ok(match format {
        Format::Json => {
            let mut v = training_json(&runs[0].1, input.spec.days);
            v["seeds"] = json!(input.seeds);
            v["spec"] = spec_json(&input.spec);
            v["training"] = json!(runs[0].0.key());
            v["independent"] = training_json(&runs[1].1, input.spec.days);
            v["goals"] = goals_json(&runs[0].1);
            format!("{}\n", serde_json::to_string_pretty(&v)?)
        }
        Format::Table => {
            let mut out = format!(
                "kace eval history: {} day(s), {} seed(s) ({}), {} jobs a day, {} workloads on \
                 day 1 then {} new a day, measurement noise {:.1} %, explore_pairs {}, \
                 explore_weight {}\n",
                input.spec.days,
                input.seeds.len(),
                seeds_text(&input.seeds),
                input.spec.jobs_per_day,
                input.spec.initial_workloads,
                input.spec.new_per_day,
                100.0 * input.spec.noise,
                input.spec.explore_pairs,
                input.spec.explore_weight
            );
            for (training, hs) in &runs {
                out.push_str(&format!(
                    "\n{}: mean over seeds [min–max]\n",
                    match training {
                        Training::Repeats => "kace retrain (repeats merged, per-group corrections)",
                        Training::Independent => {
                            "independent observations, one global model (before issue 34)"
                        }
                    }
                ));
                out.push_str(&day_table(hs, input.spec.days));
            }
            out.push_str(&goals_text(&runs[0].1));
            out
        }
    })
}

fn seeds_text(seeds: &[u32]) -> String {
    match (seeds.first(), seeds.last()) {
        (Some(a), Some(b)) if seeds.len() > 1 && (b - a) as usize + 1 == seeds.len() => {
            format!("{a}-{b}")
        }
        _ => seeds.iter().map(u32::to_string).collect::<Vec<_>>().join(","),
    }
}

fn spec_json(s: &HistorySpec) -> Value {
    json!({
        "days": s.days,
        "jobs_per_day": s.jobs_per_day,
        "initial_workloads": s.initial_workloads,
        "new_per_day": s.new_per_day,
        "window": s.window,
        "users": s.users,
        "popularity": s.popularity,
        "noise": s.noise,
        "import_n_occur": s.import_n_occur,
        "explore_pairs": s.explore_pairs,
        "explore_weight": s.explore_weight,
    })
}

/// One figure of day `d` over the seeds (seeds where it is undefined are left out).
fn spread(hs: &[History], d: usize, f: impl Fn(&Day) -> Option<f64>) -> Option<Spread> {
    let v: Vec<f64> = hs.iter().filter_map(|h| h.days.get(d).and_then(&f)).collect();
    Spread::of(&v)
}

/// A day's figure, `None` where it is undefined (no group formed, nothing seen twice, …).
type Figure = fn(&Day) -> Option<f64>;

fn figures() -> Vec<(&'static str, Figure)> {
    vec![
        ("oracle_ratio", |d| Some(d.oracle_ratio)),
        ("gain_share", |d| d.gain_share),
        ("mape_repeated", |d| d.mape_repeated),
        ("mape_all", |d| Some(d.mape_all).filter(|v| v.is_finite())),
        ("harmful_share", |d| d.harmful_share),
        ("cold_oracle_ratio", |d| d.cold_oracle_ratio),
        ("formed", |d| Some(d.formed as f64)),
        ("decisions", |d| Some(d.decisions as f64)),
        ("repeated_groups", |d| Some(d.repeated_groups as f64)),
        ("new_workloads", |d| Some(d.new_workloads as f64)),
        ("cold_decisions", |d| Some(d.cold_decisions as f64)),
        ("cold_formed", |d| Some(d.cold_formed as f64)),
        ("cold_harmful", |d| Some(d.cold_harmful as f64)),
        ("explored", |d| Some(d.explored as f64)),
        ("explored_harmful", |d| Some(d.explored_harmful as f64)),
        ("observations", |d| Some(d.observations as f64)),
        ("activated", |d| Some(if d.activated { 1.0 } else { 0.0 })),
        ("corrected", |d| Some(d.corrected as f64)),
    ]
}

fn training_json(hs: &[History], days: usize) -> Value {
    let mut out = Vec::new();
    for d in 0..days {
        let mut day = serde_json::Map::new();
        day.insert("day".into(), json!(d + 1));
        let mut spreads = serde_json::Map::new();
        for (key, f) in figures() {
            let s = spread(hs, d, f);
            day.insert(key.into(), s.map_or(Value::Null, |s| json!(s.mean)));
            spreads.insert(
                key.into(),
                s.map_or(Value::Null, |s| json!({"min": s.min, "median": s.median, "max": s.max})),
            );
        }
        day.insert("spread".into(), Value::Object(spreads));
        let refusals: Vec<Value> =
            hs.iter().filter_map(|h| h.days.get(d)?.refusal.clone()).map(Value::from).collect();
        day.insert("refusals".into(), Value::Array(refusals));
        out.push(Value::Object(day));
    }
    json!({ "days": out })
}

fn cell(s: Option<Spread>, pct: bool) -> String {
    match s {
        None => "–".into(),
        Some(s) if pct => {
            format!("{:.2} % [{:.2}–{:.2}]", 100.0 * s.mean, 100.0 * s.min, 100.0 * s.max)
        }
        Some(s) => format!("{:.4} [{:.4}–{:.4}]", s.mean, s.min, s.max),
    }
}

fn day_table(hs: &[History], days: usize) -> String {
    let rows: Vec<Vec<String>> = (0..days)
        .map(|d| {
            let mean = |f: fn(&Day) -> f64| {
                let v: Vec<f64> = hs.iter().filter_map(|h| h.days.get(d)).map(f).collect();
                v.iter().sum::<f64>() / v.len().max(1) as f64
            };
            vec![
                format!("{}", d + 1),
                cell(spread(hs, d, |x| Some(x.oracle_ratio)), false),
                cell(spread(hs, d, |x| x.gain_share), true),
                cell(spread(hs, d, |x| x.mape_repeated), true),
                cell(spread(hs, d, |x| Some(x.mape_all).filter(|v| v.is_finite())), true),
                cell(spread(hs, d, |x| x.harmful_share), true),
                format!("{:.1}", mean(|x| x.formed as f64)),
                format!(
                    "{:.1} / {:.1} / {:.2}",
                    mean(|x| x.new_workloads as f64),
                    mean(|x| x.cold_formed as f64),
                    mean(|x| x.cold_harmful as f64)
                ),
                format!(
                    "{:.1} / {:.2}",
                    mean(|x| x.explored as f64),
                    mean(|x| x.explored_harmful as f64)
                ),
                cell(spread(hs, d, |x| x.cold_oracle_ratio), false),
            ]
        })
        .collect();
    table(
        &[
            "day",
            "oracle ratio",
            "gain kept",
            "MAPE seen ≥ 2",
            "MAPE all",
            "harmful",
            "formed",
            "new wl / cold formed / cold harmful",
            "explored / harmful",
            "cold-lead oracle ratio",
        ],
        &rows,
    )
}

/// Each goal on day [`GOAL_DAY`] (or the last day, if fewer): (name, mean, goal, met).
fn goals(hs: &[History]) -> Vec<(&'static str, Option<f64>, f64, bool)> {
    let days = hs.iter().map(|h| h.days.len()).min().unwrap_or(0);
    if days == 0 {
        return Vec::new();
    }
    let d = GOAL_DAY.min(days) - 1;
    let m = |f: fn(&Day) -> Option<f64>| spread(hs, d, f).map(|s| s.mean);
    let at_most = |v: Option<f64>, g: f64| v.is_some_and(|v| v <= g);
    let at_least = |v: Option<f64>, g: f64| v.is_some_and(|v| v >= g);
    let mape = m(|x| x.mape_repeated);
    let harm = m(|x| x.harmful_share);
    let gain = m(|x| x.gain_share);
    let oracle = m(|x| Some(x.oracle_ratio));
    vec![
        (
            "MAPE on groups seen ≥ 2 times ≤",
            mape,
            GOAL_MAPE_REPEATED,
            at_most(mape, GOAL_MAPE_REPEATED),
        ),
        ("harmful share ≤", harm, GOAL_HARMFUL, at_most(harm, GOAL_HARMFUL)),
        ("share of the oracle's gain ≥", gain, GOAL_GAIN, at_least(gain, GOAL_GAIN)),
        ("oracle ratio ≥", oracle, GOAL_ORACLE, at_least(oracle, GOAL_ORACLE)),
    ]
}

fn goals_json(hs: &[History]) -> Value {
    let day = GOAL_DAY.min(hs.iter().map(|h| h.days.len()).min().unwrap_or(0));
    let items: Vec<Value> = goals(hs)
        .into_iter()
        .map(|(name, v, g, met)| json!({"goal": name, "mean": v, "target": g, "met": met}))
        .collect();
    json!({"day": day, "goals": items})
}

fn goals_text(hs: &[History]) -> String {
    let day = GOAL_DAY.min(hs.iter().map(|h| h.days.len()).min().unwrap_or(0));
    let mut out = format!("\ngoals on day {day} (kace retrain, mean over seeds):\n");
    for (name, v, g, met) in goals(hs) {
        let (v, g) =
            if name.contains("oracle ratio") { (v, g) } else { (v.map(|v| 100.0 * v), 100.0 * g) };
        let shown = v.map_or("–".to_string(), |v| format!("{v:.4}"));
        out.push_str(&format!("  {name} {g}: {shown} {}\n", if met { "met" } else { "NOT met" }));
    }
    out
}
