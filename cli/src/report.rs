//! `kace report`: predicted against observed for every group kace formed, the share of GPU time
//! shared per day and the gain over running alone, from the database only (see
//! `kace_observe::report`); `--svg FILE` draws it.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use kace_node::{Clock, SystemClock};
use kace_observe::report::{build, parse_since, svg, usage_by, By};
use kace_observe::time::date;

use crate::context::{num, print_json, Ctx};
use crate::keyed;
use crate::output::table;

/// `kace report`
#[derive(Debug, Args)]
pub struct ReportArgs {
    /// How far back: 7d, 12h, 30m, 2w.
    #[arg(long, default_value = "7d")]
    since: String,
    /// Also draw the report as an SVG file.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    /// Instead, kace GPU-hours alone and shared over the period by user or account.
    #[arg(long, value_parser = keyed::parser(&["user", "account"], By::from_key))]
    by: Option<By>,
}

/// `kace report --by`: one row per user or account.
fn print_usage(args: &ReportArgs, by: By, ctx: &Ctx, span: f64, now: f64) -> Result<()> {
    let db = ctx.open_read_only()?;
    let rows = usage_by(&db, by, now - span, now)?;
    if ctx.json() {
        return print_json(&serde_json::to_value(&rows)?);
    }
    let name = by.key();
    println!(
        "kace GPU-hours by {name} from {} to {} ({})",
        date(now - span),
        date(now),
        args.since
    );
    let h = |v: f64| format!("{v:.2}");
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.key.clone(),
                r.jobs.to_string(),
                h(r.alone_gpu_h),
                h(r.shared_gpu_h),
                h(r.shared_share_h),
                h(r.alone_gpu_h + r.shared_share_h),
            ]
        })
        .collect();
    if body.is_empty() {
        println!("no kace job observed in the period");
        return Ok(());
    }
    print!(
        "{}",
        table(&[name, "jobs", "alone h", "shared h", "share of shared h", "GPU h"], &body)
    );
    Ok(())
}

/// Joules in a readable unit.
fn joules(j: f64) -> String {
    match j.abs() {
        a if a >= 1e9 => format!("{:.2} GJ", j / 1e9),
        a if a >= 1e6 => format!("{:.2} MJ", j / 1e6),
        a if a >= 1e3 => format!("{:.2} kJ", j / 1e3),
        _ => format!("{j:.1} J"),
    }
}

/// The report's energy lines: what the GPUs spent, per unit of work, what sharing saved, and
/// each workload's joules per step.
fn print_energy(e: &kace_observe::energy::Energy) {
    if e.observations_with_energy == 0 {
        println!(
            "energy: no observation has one ({} without: kace-sampler not running, or a GPU \
             without NVML's energy counter)",
            e.observations_without_energy
        );
        return;
    }
    let per_work = |v: Option<f64>| v.map(|v| format!("{v:.1}")).unwrap_or_else(|| "-".into());
    println!(
        "energy: {} alone, {} shared, over {} observation(s) ({} without energy); J per \
         exclusive-second of work: alone {}, shared {}",
        joules(e.alone_j),
        joules(e.shared_j),
        e.observations_with_energy,
        e.observations_without_energy,
        per_work(e.j_per_work_alone),
        per_work(e.j_per_work_shared)
    );
    match (e.saved_j, e.sequential_j) {
        (Some(saved), Some(seq)) => println!(
            "energy saved by sharing: {} of {} ({}) against running the shared work one job \
             after another at each workload's joules per step alone",
            joules(saved),
            joules(seq),
            e.saved_fraction.map(|f| format!("{:.1} %", f * 100.0)).unwrap_or_else(|| "-".into())
        ),
        _ => println!(
            "energy saved by sharing: not known (no shared workload was also observed alone with \
             energy)"
        ),
    }
    let opt = |v: Option<f64>| v.map(num).unwrap_or_else(|| "-".into());
    let rows: Vec<Vec<String>> = e
        .workloads
        .iter()
        .map(|w| {
            vec![
                w.workload.clone(),
                opt(w.j_per_step_alone),
                opt(w.j_per_step_shared),
                w.alone_observations.to_string(),
                w.shared_observations.to_string(),
            ]
        })
        .collect();
    if !rows.is_empty() {
        print!(
            "{}",
            table(&["workload", "J/step alone", "J/step shared", "alone obs", "shared obs"], &rows)
        );
    }
}

/// Runs `kace report`.
pub fn run(args: ReportArgs, ctx: &Ctx) -> Result<()> {
    let span = parse_since(&args.since)?;
    let now = SystemClock.now();
    if let Some(by) = args.by {
        return print_usage(&args, by, ctx, span, now);
    }
    let db = ctx.open_read_only()?;
    let r = build(&db, ctx.config.selection.objective, now - span, now)?;
    if let Some(path) = &args.svg {
        std::fs::write(path, svg(&r))
            .with_context(|| format!("couldn't write {}", path.display()))?;
        ctx.info(&format!("report: wrote {}", path.display()));
    }
    if ctx.json() {
        return print_json(&serde_json::to_value(&r)?);
    }
    let t = &r.totals;
    let opt = |v: Option<f64>| v.map(num).unwrap_or_else(|| "-".into());
    println!("kace report from {} to {} ({})", date(r.since), date(r.until), r.objective);
    println!(
        "{} observed group(s), {} with a prediction; median predicted/observed {}; mean |error| {}",
        t.groups,
        t.predicted_groups,
        opt(t.median_ratio),
        t.mean_abs_error.map(|e| format!("{:.1} %", e * 100.0)).unwrap_or("-".into())
    );
    println!(
        "GPU time shared: {}; mean gain over running alone: {}",
        t.shared_fraction.map(|f| format!("{:.1} %", f * 100.0)).unwrap_or("-".into()),
        t.mean_gain.map(|g| format!("{}×", num(g))).unwrap_or("-".into())
    );
    print_energy(&r.energy);
    let formed: Vec<String> = t.groups_formed.iter().map(|(k, n)| format!("{k} {n}")).collect();
    let released: Vec<String> =
        t.released.iter().filter(|(_, n)| **n > 0).map(|(k, n)| format!("{k} {n}")).collect();
    println!(
        "groups formed: {}; jobs released: {}; median hold: {}",
        formed.join(", "),
        if released.is_empty() { "none recorded".into() } else { released.join(", ") },
        t.median_hold_s.map(kace_observe::time::span).unwrap_or_else(|| "-".into())
    );
    let p = &t.priority;
    if p.choices > 0 {
        println!(
            "priority order: {} of {} choice(s) passed over a candidate of higher priority{}",
            p.inversions,
            p.choices,
            p.max_gap.map(|g| format!(" (by at most {})", num(g))).unwrap_or_default()
        );
    }
    let rows: Vec<Vec<String>> = r
        .groups
        .iter()
        .map(|g| {
            vec![
                date(g.start),
                g.jobs.join("+"),
                g.workloads.join("+"),
                g.model_version.map(|v| v.to_string()).unwrap_or_else(|| "-".into()),
                opt(g.predicted),
                opt(g.observed),
                opt(g.normalised_progress),
            ]
        })
        .collect();
    if !rows.is_empty() {
        println!();
        print!(
            "{}",
            table(&["start", "jobs", "workloads", "model", "predicted", "observed", "gain"], &rows)
        );
    }
    let days: Vec<Vec<String>> = r
        .days
        .iter()
        .map(|d| {
            vec![
                date(d.day)[..10].to_string(),
                num(d.shared_gpu_s),
                num(d.alone_gpu_s),
                format!("{:.1} %", d.shared_fraction * 100.0),
                opt(d.mean_gain),
            ]
        })
        .collect();
    if !days.is_empty() {
        println!();
        print!("{}", table(&["day", "shared GPU-s", "alone GPU-s", "shared", "gain"], &days));
    }
    Ok(())
}
