//! `kace report`: how well kace did over a period, from the database alone — every observed
//! group of a real run (imported training pairs are left out) with the prediction its decision
//! made (and the model version that made it) against what the epilogs observed, the share of GPU
//! time that was shared, day by day, and the gain over running each job alone (the group's
//! normalised progress: Σ colocated / exclusive throughput; above 1 the GPU did more work than
//! running the jobs one after another), and the energy the GPUs spent ([`crate::energy`]).
//! [`svg`] draws it.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use kace_plot::{close, escape, nice, open, Panel, PALETTE};
use kace_selector::Objective;
use kace_sql::{Db, DecisionCandidate, NewDecision, Observation};
use serde::Serialize;

use crate::energy::{energy, Energy};
use crate::releases::{count_by, groups_by_kind, released, Released};
use crate::Result;

/// The `node` of observations imported from a table rather than observed by an epilog.
pub const IMPORTED_NODE: &str = "imported";

/// One observed group of a real run.
#[derive(Debug, Clone, Serialize)]
pub struct ReportGroup {
    /// Start of the common interval, Unix seconds.
    pub start: f64,
    /// End, Unix seconds.
    pub end: f64,
    /// Member jobs.
    pub jobs: Vec<String>,
    /// Member workloads.
    pub workloads: Vec<String>,
    /// Member throughputs, steps/s.
    pub throughputs: Vec<f64>,
    /// The objective as observed (`None` for normalised progress without profiles).
    pub observed: Option<f64>,
    /// The decision's prediction for the group, when a decision formed it.
    pub predicted: Option<f64>,
    /// The model version of that decision.
    pub model_version: Option<i64>,
    /// Σ throughput / exclusive throughput, when every member has a profile.
    pub normalised_progress: Option<f64>,
}

/// One day's GPU time.
#[derive(Debug, Clone, Serialize)]
pub struct Day {
    /// Midnight UTC, Unix seconds.
    pub day: f64,
    /// GPU-seconds with two or more kace jobs on the GPU.
    pub shared_gpu_s: f64,
    /// GPU-seconds with one kace job alone.
    pub alone_gpu_s: f64,
    /// shared / (shared + alone).
    pub shared_fraction: f64,
    /// Mean normalised progress of that day's groups.
    pub mean_gain: Option<f64>,
}

/// Summary figures.
#[derive(Debug, Clone, Serialize)]
pub struct Totals {
    /// Observed groups.
    pub groups: usize,
    /// Of which a decision predicted.
    pub predicted_groups: usize,
    /// Median of predicted / observed.
    pub median_ratio: Option<f64>,
    /// Mean of |predicted − observed| / observed.
    pub mean_abs_error: Option<f64>,
    /// GPU time shared over the period.
    pub shared_fraction: Option<f64>,
    /// Mean normalised progress of the groups.
    pub mean_gain: Option<f64>,
    /// Groups formed over the period by kind (lead, refill, late_arrival, max_hold), from the
    /// decision records.
    pub groups_formed: BTreeMap<&'static str, usize>,
    /// Jobs released over the period, by what released them (`by/place`, as in `kace metrics`).
    pub released: BTreeMap<String, usize>,
    /// Median hold of the released jobs, seconds.
    pub median_hold_s: Option<f64>,
    /// Priority order over the period, from the decision records' candidates.
    pub priority: PriorityOrder,
}

/// How kace's choices kept to Slurm's priority order (issue 29 item 2), from the candidates'
/// priorities each decision record carries (kace's estimate; `None` in records without
/// multifactor priority or from before it was kept).
#[derive(Debug, Clone, Default, Serialize)]
pub struct PriorityOrder {
    /// Choices among two or more candidates whose priorities are recorded.
    pub choices: usize,
    /// Of which the chosen job was not the one of highest priority among the candidates that
    /// passed the filters: a job of lower priority went first (bounded by
    /// `selection.priority_window`).
    pub inversions: usize,
    /// The most priority any chosen job was below the highest candidate's.
    pub max_gap: Option<f64>,
}

/// Counts the choices where a candidate of higher priority was passed over.
fn priority_order(decisions: &[&NewDecision]) -> PriorityOrder {
    let mut order = PriorityOrder::default();
    for d in decisions {
        let Some(chosen) = d.chosen_job.as_deref() else { continue };
        let eligible: Vec<&DecisionCandidate> =
            d.candidates.iter().filter(|c| c.rejected.is_none()).collect();
        let Some(mine) =
            eligible.iter().find(|c| c.job.as_deref() == Some(chosen)).and_then(|c| c.priority)
        else {
            continue;
        };
        let best = eligible
            .iter()
            .filter(|c| c.job.as_deref() != Some(chosen))
            .filter_map(|c| c.priority)
            .reduce(f64::max);
        let Some(best) = best else { continue };
        order.choices += 1;
        if best > mine {
            order.inversions += 1;
            order.max_gap = Some(order.max_gap.map_or(best - mine, |g: f64| g.max(best - mine)));
        }
    }
    order
}

/// The report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// From, Unix seconds.
    pub since: f64,
    /// To, Unix seconds.
    pub until: f64,
    /// The objective predictions and observations are in.
    pub objective: &'static str,
    /// Groups, oldest first.
    pub groups: Vec<ReportGroup>,
    /// Days, oldest first.
    pub days: Vec<Day>,
    /// Summary.
    pub totals: Totals,
    /// What the GPUs spent in energy over the period's observations.
    pub energy: Energy,
}

/// Parses `7d`, `12h`, `30m`, `90s` (or plain seconds) into seconds.
pub fn parse_since(s: &str) -> Result<f64> {
    let s = s.trim();
    let bad = || crate::Error::Usage(format!("--since {s:?}: want a span such as 7d, 12h or 30m"));
    let (num, unit) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => (&s[..i], c),
        _ => (s, 's'),
    };
    let n: f64 = num.parse().map_err(|_| bad())?;
    let mult = match unit {
        's' => 1.0,
        'm' => 60.0,
        'h' => 3600.0,
        'd' => 86_400.0,
        'w' => 604_800.0,
        _ => return Err(bad()),
    };
    if !(n.is_finite() && n > 0.0) {
        return Err(bad());
    }
    Ok(n * mult)
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 })
}

fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// What `kace report --by` groups GPU time by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum By {
    /// The job's user.
    User,
    /// The Slurm account the job was charged to.
    Account,
}

impl By {
    /// Stable name, for `kace report --by` and the JSON.
    pub fn key(self) -> &'static str {
        match self {
            By::User => "user",
            By::Account => "account",
        }
    }

    /// Parses [`By::key`].
    pub fn from_key(s: &str) -> Option<By> {
        [By::User, By::Account].into_iter().find(|b| b.key() == s)
    }
}

/// One user's or account's kace GPU time over a period, from the observations (each interval
/// of a job on its GPU, alone or beside other kace jobs).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct UsageRow {
    /// The user or account (`-` when the observation does not say: imports, older records).
    pub key: String,
    /// Distinct jobs.
    pub jobs: usize,
    /// Hours its jobs had their GPU to themselves (among kace jobs).
    pub alone_gpu_h: f64,
    /// Hours its jobs shared their GPU (wall time on the GPU).
    pub shared_gpu_h: f64,
    /// Their share of those GPUs: each shared interval divided by the jobs on the GPU.
    pub shared_share_h: f64,
}

/// kace GPU time in `[since, now]` by user or account, largest first.
pub fn usage_by(db: &Db, by: By, since: f64, now: f64) -> Result<Vec<UsageRow>> {
    let mut rows: BTreeMap<String, (UsageRow, std::collections::BTreeSet<String>)> =
        BTreeMap::new();
    for o in db.observations()? {
        if o.node == IMPORTED_NODE || o.end < since || o.start > now {
            continue;
        }
        let key = match by {
            By::User => o.user.clone(),
            By::Account => o.account.clone(),
        }
        .unwrap_or_else(|| "-".into());
        let span = (o.end.min(now) - o.start.max(since)).max(0.0) / 3600.0;
        let (row, jobs) = rows.entry(key.clone()).or_default();
        row.key = key;
        jobs.insert(o.job.clone());
        if o.partners.is_empty() {
            row.alone_gpu_h += span;
        } else {
            row.shared_gpu_h += span;
            row.shared_share_h += span / (1 + o.partners.len()) as f64;
        }
    }
    let mut out: Vec<UsageRow> = rows
        .into_values()
        .map(|(mut row, jobs)| {
            row.jobs = jobs.len();
            row
        })
        .collect();
    out.sort_by(|a, b| {
        (b.alone_gpu_h + b.shared_share_h).total_cmp(&(a.alone_gpu_h + a.shared_share_h))
    });
    Ok(out)
}

/// Builds the report for groups that ended in `[since, now]`.
pub fn build(db: &Db, objective: Objective, since: f64, now: f64) -> Result<Report> {
    let observations: Vec<Observation> = db
        .observations()?
        .into_iter()
        .filter(|o| o.node != IMPORTED_NODE && o.end >= since && o.start <= now)
        .collect();
    let by_key: HashMap<&str, &Observation> =
        observations.iter().map(|o| (o.key.as_str(), o)).collect();
    let profiles = db.all_profiles(None)?;
    let exclusive = |w: &str| {
        profiles.get(w).and_then(|p| p.values[kace_sql::FIRST_SYSTEM_FEATURE]).filter(|x| *x > 0.0)
    };
    let decisions = db.decisions(100_000)?;
    let releases: Vec<Released> = decisions
        .iter()
        .filter(|d| d.created_at >= since && d.created_at <= now)
        .filter_map(|d| released(&d.decision, d.created_at, d.key.as_deref()))
        .collect();

    let mut groups = Vec::new();
    for g in db.observed_groups()? {
        let members: Option<Vec<&Observation>> =
            g.members.iter().map(|m| by_key.get(m.key.as_str()).copied()).collect();
        let Some(members) = members else { continue }; // imported, or outside the period
        let start = members.iter().map(|o| o.start).fold(f64::NEG_INFINITY, f64::max);
        let end = members.iter().map(|o| o.end).fold(f64::INFINITY, f64::min);
        let jobs: Vec<String> = members.iter().map(|o| o.job.clone()).collect();
        let workloads: Vec<String> = members.iter().map(|o| o.workload.clone()).collect();
        let throughputs: Vec<f64> = members.iter().map(|o| o.throughput).collect();
        let np: Option<f64> = members
            .iter()
            .map(|o| exclusive(&o.workload).map(|x| o.throughput / x))
            .sum::<Option<f64>>();
        let observed = match objective {
            Objective::ThroughputSum => Some(throughputs.iter().sum()),
            Objective::NormalisedProgress => np,
            // The power model's value at the observed rates, in the prediction's units.
            Objective::Energy => members
                .iter()
                .map(|o| {
                    let p =
                        profiles.get(&o.workload).and_then(kace_sql::convert::selector_profile)?;
                    Some((p, o.throughput / exclusive(&o.workload)?))
                })
                .collect::<Option<Vec<_>>>()
                .map(|m| kace_selector::energy::work_per_energy(m.iter().map(|(p, r)| (p, *r)))),
        };
        // The newest decision whose lead and chosen partner are both in the group formed it.
        let formed = decisions
            .iter()
            .filter(|d| {
                let has = |j: &Option<String>| j.as_ref().is_some_and(|j| jobs.contains(j));
                has(&d.decision.lead_job) && has(&d.decision.chosen_job)
            })
            .max_by(|a, b| a.created_at.total_cmp(&b.created_at));
        let (predicted, model_version) = match formed {
            Some(d) => (
                d.decision
                    .candidates
                    .iter()
                    .find(|c| c.job.is_some() && c.job == d.decision.chosen_job)
                    .and_then(|c| c.prediction),
                d.decision.model_version,
            ),
            None => (None, None),
        };
        groups.push(ReportGroup {
            start,
            end,
            jobs,
            workloads,
            throughputs,
            observed,
            predicted,
            model_version,
            normalised_progress: np,
        });
    }
    groups.sort_by(|a, b| a.start.total_cmp(&b.start));

    let mut days: BTreeMap<i64, (f64, f64, Vec<f64>)> = BTreeMap::new();
    for o in &observations {
        let d = (o.start / 86_400.0).floor() as i64;
        let e = days.entry(d).or_default();
        let span = (o.end - o.start).max(0.0);
        if o.partners.is_empty() {
            e.1 += span;
        } else {
            // Each member observes the same stretch: count the GPU's time once.
            e.0 += span / (o.partners.len() + 1) as f64;
        }
    }
    for g in &groups {
        if let Some(np) = g.normalised_progress {
            days.entry((g.start / 86_400.0).floor() as i64).or_default().2.push(np);
        }
    }
    let days: Vec<Day> = days
        .into_iter()
        .map(|(d, (shared, alone, gains))| Day {
            day: d as f64 * 86_400.0,
            shared_gpu_s: shared,
            alone_gpu_s: alone,
            shared_fraction: if shared + alone > 0.0 { shared / (shared + alone) } else { 0.0 },
            mean_gain: mean(&gains),
        })
        .collect();

    let pairs: Vec<(f64, f64)> =
        groups.iter().filter_map(|g| g.predicted.zip(g.observed)).filter(|p| p.1 > 0.0).collect();
    let (shared, alone) =
        days.iter().fold((0.0, 0.0), |acc, d| (acc.0 + d.shared_gpu_s, acc.1 + d.alone_gpu_s));
    let gains: Vec<f64> = groups.iter().filter_map(|g| g.normalised_progress).collect();
    let totals = Totals {
        groups: groups.len(),
        predicted_groups: pairs.len(),
        median_ratio: median(pairs.iter().map(|(p, o)| p / o).collect()),
        mean_abs_error: mean(&pairs.iter().map(|(p, o)| (p - o).abs() / o).collect::<Vec<_>>()),
        shared_fraction: (shared + alone > 0.0).then(|| shared / (shared + alone)),
        mean_gain: mean(&gains),
        groups_formed: groups_by_kind(&releases),
        released: count_by(&releases)
            .into_iter()
            .map(|((by, place), n)| (format!("{by}/{place}"), n))
            .collect(),
        median_hold_s: median(releases.iter().filter_map(|r| r.held_s).collect()),
        priority: priority_order(
            &decisions
                .iter()
                .filter(|d| d.created_at >= since && d.created_at <= now)
                .map(|d| &d.decision)
                .collect::<Vec<_>>(),
        ),
    };
    let energy = energy(&observations.iter().collect::<Vec<_>>(), &exclusive);
    Ok(Report { since, until: now, objective: objective.key(), groups, days, totals, energy })
}

/// The report as an SVG: predicted against observed (identity line, colour by model version),
/// the share of GPU time shared per day, and the gain over running alone per day.
pub fn svg(r: &Report) -> String {
    let (pw, ph, top) = (300.0, 260.0, 70.0);
    let lefts = [70.0, 450.0, 830.0];
    let width = 1170.0;
    let height = top + ph + 50.0;
    let mut s = open(width, height, 12);
    let _ = writeln!(s, r##"<rect width="100%" height="100%" fill="white"/>"##);
    let t = &r.totals;
    let _ = writeln!(
        s,
        r##"<text x="20" y="24" font-size="16">kace report, {} to {}: {} observed group(s), {} predicted</text>"##,
        crate::time::date(r.since),
        crate::time::date(r.until),
        t.groups,
        t.predicted_groups
    );
    let pct = |v: Option<f64>| v.map(|v| format!("{:.1} %", v * 100.0)).unwrap_or("-".into());
    let _ = writeln!(
        s,
        r##"<text x="20" y="44">objective {}; median predicted/observed {}; mean |error| {}; GPU time shared {}; mean gain over alone {}</text>"##,
        r.objective,
        t.median_ratio.map(|v| format!("{v:.3}")).unwrap_or("-".into()),
        pct(t.mean_abs_error),
        pct(t.shared_fraction),
        t.mean_gain.map(|v| format!("{v:.2}×")).unwrap_or("-".into()),
    );

    // 1. predicted vs observed.
    let pts: Vec<(f64, f64, Option<i64>)> = r
        .groups
        .iter()
        .filter_map(|g| g.predicted.zip(g.observed).map(|(p, o)| (o, p, g.model_version)))
        .collect();
    let m = nice(pts.iter().map(|p| p.0.max(p.1)).fold(0.0, f64::max) * 1.05);
    let (x0, y0) = (lefts[0], top);
    let _ = writeln!(
        s,
        r##"<text x="{x0}" y="{:.0}" font-size="13">predicted against observed ({})</text>"##,
        top - 8.0,
        r.objective
    );
    Panel { x: x0, y: y0, w: pw, h: ph }.axes(&mut s, m, m, "observed", "predicted");
    let _ = writeln!(
        s,
        r##"<line x1="{x0}" y1="{:.1}" x2="{:.1}" y2="{y0}" stroke="#999" stroke-dasharray="4,3"/>"##,
        y0 + ph,
        x0 + pw
    );
    let mut versions: Vec<Option<i64>> = pts.iter().map(|p| p.2).collect();
    versions.sort();
    versions.dedup();
    for (o, p, v) in &pts {
        let c = PALETTE[versions.iter().position(|x| x == v).unwrap_or(0) % PALETTE.len()];
        let _ = writeln!(
            s,
            r##"<circle cx="{:.1}" cy="{:.1}" r="4" fill="{c}" fill-opacity="0.8"/>"##,
            x0 + o / m * pw,
            y0 + ph - p / m * ph
        );
    }
    for (i, v) in versions.iter().enumerate() {
        let label = v.map(|v| format!("model v{v}")).unwrap_or("no model".into());
        let ly = y0 + 14.0 + i as f64 * 16.0;
        let _ = writeln!(
            s,
            r##"<circle cx="{:.1}" cy="{:.1}" r="4" fill="{}"/><text x="{:.1}" y="{:.1}">{}</text>"##,
            x0 + 12.0,
            ly - 4.0,
            PALETTE[i % PALETTE.len()],
            x0 + 20.0,
            ly,
            escape(&label)
        );
    }
    if pts.is_empty() {
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="middle">no predicted group in this period</text>"##,
            x0 + pw / 2.0,
            y0 + ph / 2.0
        );
    }

    // 2 and 3: per day bars.
    let day_label = |d: f64| crate::time::date(d)[5..10].to_string();
    let bars = |s: &mut String,
                x0: f64,
                title: &str,
                yl: &str,
                vals: Vec<(String, f64)>,
                ymax: f64,
                guide: Option<f64>| {
        let _ = writeln!(
            s,
            r##"<text x="{x0}" y="{:.0}" font-size="13">{}</text>"##,
            top - 8.0,
            escape(title)
        );
        Panel { x: x0, y: top, w: pw, h: ph }.axes(s, 0.0, ymax, "day (UTC)", yl);
        let n = vals.len().max(1) as f64;
        let slot = pw / n;
        let bw = (slot * 0.7).min(40.0);
        for (i, (label, v)) in vals.iter().enumerate() {
            let h = (v / ymax).clamp(0.0, 1.0) * ph;
            let x = x0 + i as f64 * slot + (slot - bw) / 2.0;
            let _ = writeln!(
                s,
                r##"<rect x="{x:.1}" y="{:.1}" width="{bw:.1}" height="{h:.1}" fill="#1f77b4"/><text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
                top + ph - h,
                x + bw / 2.0,
                top + ph + 14.0,
                escape(label)
            );
        }
        if let Some(g) = guide {
            let gy = top + ph - (g / ymax) * ph;
            let _ = writeln!(
                s,
                r##"<line x1="{x0}" y1="{gy:.1}" x2="{:.1}" y2="{gy:.1}" stroke="#d62728" stroke-dasharray="4,3"/>"##,
                x0 + pw
            );
        }
        if vals.is_empty() {
            let _ = writeln!(
                s,
                r##"<text x="{:.1}" y="{:.1}" text-anchor="middle">no data</text>"##,
                x0 + pw / 2.0,
                top + ph / 2.0
            );
        }
    };
    let shares: Vec<(String, f64)> =
        r.days.iter().map(|d| (day_label(d.day), d.shared_fraction * 100.0)).collect();
    bars(&mut s, lefts[1], "GPU time shared per day", "% of kace GPU time", shares, 100.0, None);
    let gains: Vec<(String, f64)> =
        r.days.iter().filter_map(|d| d.mean_gain.map(|g| (day_label(d.day), g))).collect();
    let gmax = nice(gains.iter().map(|g| g.1).fold(1.0, f64::max) * 1.1);
    bars(
        &mut s,
        lefts[2],
        "gain over running alone (1 = none)",
        "work per GPU-second vs alone",
        gains,
        gmax,
        Some(1.0),
    );
    close(&mut s);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_parse() {
        assert_eq!(parse_since("7d").unwrap(), 604_800.0);
        assert_eq!(parse_since("12h").unwrap(), 43_200.0);
        assert_eq!(parse_since("90").unwrap(), 90.0);
        assert_eq!(parse_since("1.5m").unwrap(), 90.0);
        for bad in ["", "d", "-3d", "7y", "nand", "0h"] {
            assert!(parse_since(bad).is_err(), "{bad:?} accepted");
        }
    }

    fn chose(chosen: &str, candidates: &[(&str, Option<f64>, bool)]) -> NewDecision {
        NewDecision {
            lead_job: Some("1".into()),
            lead_workload: "a".into(),
            chosen_workload: Some("b".into()),
            chosen_job: Some(chosen.into()),
            model_version: None,
            candidates: candidates
                .iter()
                .map(|(job, priority, rejected)| DecisionCandidate {
                    job: Some(job.to_string()),
                    workload: "b".into(),
                    prediction: None,
                    rejected: rejected.then(|| "too big".into()),
                    held_s: None,
                    priority: *priority,
                    time_limits: Vec::new(),
                    explores: Vec::new(),
                    thread_pct: None,
                })
                .collect(),
        }
    }

    #[test]
    fn a_choice_below_a_fitting_candidates_priority_is_an_inversion() {
        let ds = [
            // 11 went before 12 of higher priority: one inversion, a gap of 400.
            chose("11", &[("11", Some(600.0), false), ("12", Some(1000.0), false)]),
            // The highest went first.
            chose("13", &[("13", Some(900.0), false), ("14", Some(100.0), false)]),
            // A rejected candidate of higher priority could not take the GPU: no inversion, and
            // no choice by priority (one candidate fitted).
            chose("15", &[("15", Some(1.0), false), ("16", Some(5000.0), true)]),
            // No priorities recorded (no multifactor): not a choice by priority.
            chose("17", &[("17", None, false), ("18", None, false)]),
            // Alone: nothing to compare.
            chose("19", &[("19", Some(3.0), false)]),
        ];
        let o = priority_order(&ds.iter().collect::<Vec<_>>());
        assert_eq!((o.choices, o.inversions, o.max_gap), (2, 1, Some(400.0)));
    }

    #[test]
    fn medians() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(vec![]), None);
    }
}
