//! `kace status`: one screen of what kace is doing (see `kace_observe::status`): GPUs with their
//! kace jobs, the held queue, the active model; `--format json` for programs.

use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use kace_node::{Clock, SystemClock};
use kace_observe::status::{self, GpuOccupancy, Options, Status};
use kace_observe::time::{date, span};

use crate::context::{num, print_json, Ctx};
use crate::output::table;

/// How long all of status's Slurm commands may take together.
const BUDGET: Duration = Duration::from_secs(30);

/// `kace status`
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Show only this user's jobs (without a name: yours). What other users' jobs you see at
    /// all is what Slurm shows you (its PrivateData setting).
    #[arg(long, value_name = "USER", num_args = 0..=1, default_missing_value = "")]
    user: Option<String>,
}

/// The calling user's name: `$USER`, else `$LOGNAME`.
fn me() -> Option<String> {
    ["USER", "LOGNAME"].iter().find_map(|v| std::env::var(v).ok().filter(|u| !u.is_empty()))
}

/// Runs `kace status`.
pub fn run(args: StatusArgs, ctx: &Ctx) -> Result<()> {
    let user = match args.user {
        Some(u) if u.is_empty() => {
            Some(me().context("--user without a name: couldn't tell who you are ($USER unset)")?)
        }
        other => other,
    };
    let slurm = ctx.slurm(BUDGET);
    let db = ctx.open_read_only();
    let mut s = status::gather(
        &slurm,
        db.as_ref().ok(),
        &ctx.config,
        SystemClock.now(),
        &Options { user },
    )?;
    if let Err(e) = &db {
        s.problems.push(format!("couldn't read the database ({e:#}): no predictions or model"));
    }
    if ctx.json() {
        return print_json(&serde_json::to_value(&s)?);
    }
    print!("{}", render(&s));
    Ok(())
}

fn opt(v: Option<f64>) -> String {
    v.map(num).unwrap_or_else(|| "-".into())
}

/// The human screen.
fn render(s: &Status) -> String {
    let mut out = format!("kace status at {}\n", date(s.at));
    match &s.model {
        Some(m) => out.push_str(&format!(
            "model: version {} ({}), trained {} on {} group(s){}\n",
            m.version,
            m.kind,
            date(m.trained_at),
            m.groups,
            m.holdout_mse.map(|e| format!(", held-out MSE {}", num(e))).unwrap_or_default()
        )),
        None => out.push_str("model: none active\n"),
    }
    let count = |st: GpuOccupancy| s.gpus.iter().filter(|g| g.state == st).count();
    out.push_str(&format!(
        "\nGPUs: {} shared or full, {} open, {} free, {} held by other jobs, {} unusable \
         (predictions in {}; observed so far from the progress files)\n",
        count(GpuOccupancy::Full),
        count(GpuOccupancy::Open),
        count(GpuOccupancy::Free),
        count(GpuOccupancy::Others),
        count(GpuOccupancy::Unusable),
        s.objective
    ));
    let mut rows = Vec::new();
    for g in &s.gpus {
        let state = format!("{:?}", g.state).to_lowercase();
        let gpu = match &g.kind {
            Some(k) => format!("{} ({k})", g.index),
            None => g.index.to_string(),
        };
        let group = format!("{} / {}", opt(g.predicted), opt(g.observed));
        if g.jobs.is_empty() {
            let note = if g.hidden_jobs > 0 {
                format!("{} other user's job(s)", g.hidden_jobs)
            } else {
                "-".into()
            };
            rows.push(vec![
                g.node.clone(),
                gpu,
                state,
                note,
                String::new(),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
                group,
            ]);
            continue;
        }
        for (i, j) in g.jobs.iter().enumerate() {
            let with = if j.with.is_empty() {
                "alone".to_string()
            } else {
                j.with.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
            };
            let since = j
                .since
                .map(|t| format!("{} ({} ago)", date(t), span(s.at - t)))
                .unwrap_or_else(|| "-".into());
            let first = i == 0;
            rows.push(vec![
                if first { g.node.clone() } else { String::new() },
                if first { gpu.clone() } else { String::new() },
                if first { state.clone() } else { String::new() },
                j.job.to_string(),
                j.workload.clone(),
                j.user.clone(),
                since,
                with,
                format!("{} / {}", opt(j.predicted_throughput), opt(j.observed_throughput)),
                if first { group.clone() } else { String::new() },
            ]);
        }
    }
    out.push_str(&table(
        &[
            "node",
            "gpu",
            "state",
            "job",
            "workload",
            "user",
            "since",
            "with",
            "steps/s pred/obs",
            "group pred/obs",
        ],
        &rows,
    ));
    out.push_str(&format!("\nheld kace jobs: {}\n", s.held.len()));
    if !s.held.is_empty() {
        let rows: Vec<Vec<String>> = s
            .held
            .iter()
            .map(|h| {
                let offer = match (&h.would_pair_with, &h.no_partner) {
                    (Some(o), _) => {
                        format!("job {} ({}), predicted {}", o.job, o.workload, num(o.predicted))
                    }
                    (None, Some(why)) => format!("none: {why}"),
                    (None, None) => "-".into(),
                };
                let offer = match (&h.handed_back, &h.kept_back) {
                    (Some(why), _) => format!("goes to Slurm at the next pass: {why}"),
                    (None, Some(why)) => format!("kept back: {why}"),
                    (None, None) => offer,
                };
                vec![
                    match h.priority {
                        Some(p) => format!("{} (priority {p:.0})", h.place),
                        None => h.place.to_string(),
                    },
                    h.job.to_string(),
                    h.workload.clone(),
                    h.user.clone(),
                    h.waited_s.map(span).unwrap_or_else(|| "-".into()),
                    h.max_hold_at.map(date).unwrap_or_else(|| "-".into()),
                    offer,
                ]
            })
            .collect();
        out.push_str(&table(
            &[
                "place",
                "job",
                "workload",
                "user",
                "waited",
                "max_hold release at",
                "would pair with if it led now",
            ],
            &rows,
        ));
    }
    if !s.starting.is_empty() {
        let ids: Vec<String> = s.starting.iter().map(u32::to_string).collect();
        out.push_str(&format!("released, not started yet: {}\n", ids.join(", ")));
    }
    for p in &s.problems {
        out.push_str(&format!("note: {p}\n"));
    }
    out
}
