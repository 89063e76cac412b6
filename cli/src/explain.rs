//! `kace explain JOB`: why a job was or was not paired, from the prolog's decisions: those in
//! the database (after `kace ingest`) and those still in the spool.

use anyhow::Result;
use clap::Args;
use kace_sql::spool::spooled_decisions;
use kace_sql::{DecisionCandidate, NewDecision};
use serde_json::json;

use crate::context::{num, print_json, Ctx};
use crate::output::{printable, table};

/// Decisions read from the database at most (newest first).
const MAX_DECISIONS: usize = 100_000;

/// `kace explain`
#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// The Slurm job id.
    #[arg(value_name = "JOB")]
    job: String,
}

/// One decision and where it was found.
struct Found {
    decision: NewDecision,
    created_at: f64,
    source: &'static str,
}

/// Runs `kace explain`.
pub fn run(args: ExplainArgs, ctx: &Ctx) -> Result<()> {
    let mut all: Vec<Found> = Vec::new();
    match ctx.open_read_only() {
        Ok(db) => all.extend(db.decisions(MAX_DECISIONS)?.into_iter().map(|d| Found {
            decision: d.decision,
            created_at: d.created_at,
            source: "database",
        })),
        Err(e) => {
            eprintln!("kace: explain: couldn't read the database ({e:#}); using the spool only")
        }
    }
    for (path, read) in spooled_decisions(&ctx.config.spool.dir)? {
        match read {
            Ok(d) => {
                all.push(Found { decision: d.decision, created_at: d.created_at, source: "spool" })
            }
            Err(why) => eprintln!(
                "kace: explain: skipping {}: {}",
                printable(&path.display().to_string()),
                printable(&why)
            ),
        }
    }
    all.sort_by(|a, b| a.created_at.total_cmp(&b.created_at));
    let job = args.job.trim();
    let led: Vec<&Found> =
        all.iter().filter(|f| f.decision.lead_job.as_deref() == Some(job)).collect();
    let seen: Vec<(&Found, &DecisionCandidate)> = all
        .iter()
        .filter_map(|f| {
            let c = f.decision.candidates.iter().find(|c| c.job.as_deref() == Some(job))?;
            Some((f, c))
        })
        .collect();

    let job = printable(job);
    if ctx.json() {
        let led: Vec<_> = led
            .iter()
            .map(|f| json!({"decision": f.decision, "at": f.created_at, "source": f.source}))
            .collect();
        let seen: Vec<_> = seen
            .iter()
            .map(|(f, c)| {
                json!({"lead_job": f.decision.lead_job, "verdict": verdict(&f.decision, c),
                       "candidate": c, "at": f.created_at, "source": f.source})
            })
            .collect();
        return print_json(&json!({"job": job, "led": led, "candidate_in": seen}));
    }
    if led.is_empty() && seen.is_empty() {
        println!(
            "job {job} appears in no kace decision: no lead chose among held kace jobs while it \
             was held, and it never led a GPU (not a kace job, or released by `kace dispatch` \
             onto a GPU whose prolog has not run or could not decide)"
        );
        return Ok(());
    }
    for f in &led {
        let d = &f.decision;
        let chosen = match (&d.chosen_job, &d.chosen_workload) {
            (Some(j), Some(w)) => format!("chose job {j} ({w})"),
            _ => "chose no partner".to_string(),
        };
        let model =
            d.model_version.map(|v| format!("model version {v}")).unwrap_or("no model".into());
        println!(
            "job {job} ({}) led its GPU and {} among {} held kace job(s), {model} [{}]",
            printable(&d.lead_workload),
            printable(&chosen),
            d.candidates.len(),
            f.source
        );
        let rows: Vec<Vec<String>> = d
            .candidates
            .iter()
            .map(|c| {
                vec![
                    c.job.clone().unwrap_or_default(),
                    c.workload.clone(),
                    c.prediction.map(num).unwrap_or_else(|| "-".into()),
                    verdict(d, c),
                ]
            })
            .collect();
        if !rows.is_empty() {
            print!("{}", table(&["job", "workload", "predicted", "verdict"], &rows));
        }
    }
    for (f, c) in &seen {
        println!(
            "job {job} ({}) was held when job {} ({}) chose a partner: {} [{}]",
            printable(&c.workload),
            printable(f.decision.lead_job.as_deref().unwrap_or("?")),
            printable(&f.decision.lead_workload),
            printable(&verdict(&f.decision, c)),
            f.source
        );
    }
    Ok(())
}

/// Why one candidate fared as it did in one decision.
fn verdict(d: &NewDecision, c: &DecisionCandidate) -> String {
    if c.job.is_some() && c.job == d.chosen_job {
        return match c.prediction {
            Some(p) => format!("chosen (predicted {})", num(p)),
            None => "chosen".into(),
        };
    }
    if let Some(r) = &c.rejected {
        return format!("rejected: {r}");
    }
    let best = d
        .candidates
        .iter()
        .find(|x| x.job.is_some() && x.job == d.chosen_job)
        .and_then(|x| x.prediction);
    match (c.prediction, best) {
        (Some(p), Some(b)) => {
            format!("not chosen: predicted {}, the chosen one {}", num(p), num(b))
        }
        (Some(p), None) => format!("not chosen: predicted {}, but no partner was released", num(p)),
        _ => "not evaluated".into(),
    }
}
