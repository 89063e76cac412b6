//! `kace explain JOB`: what Slurm says about the job (held how long, released when and by
//! what, with whom it ran: `kace_observe::history`) and why it was or was not paired, from the
//! prolog's decisions: those in the database (after `kace ingest`) and those still in the spool;
//! and what its epilog measured: its profile from its alone intervals, or an out-of-memory exit
//! under the memory guard.

use std::time::Duration;

use anyhow::Result;
use clap::Args;
use kace_node::{Clock, SystemClock};
use kace_observe::history::{story, ReleasedBy, Story};
use kace_observe::releases::Place;
use kace_observe::time::{date, span};
use kace_sql::failures::{FailedPair, GpuFailure};
use kace_sql::spool::{spooled_decisions, spooled_profiles, ReleaseKind};
use kace_sql::{DecisionCandidate, NewDecision, ObservedProfile, TimeLimitChange, FEATURE_COLUMNS};
use serde_json::json;

use crate::context::{num, print_json, Ctx};
use crate::output::{printable, table};

/// How long the Slurm query may take.
const SLURM_BUDGET: Duration = Duration::from_secs(15);

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
    /// Its spool key (says a prolog's decision from an epilog's refill).
    key: Option<String>,
}

/// Runs `kace explain`.
pub fn run(args: ExplainArgs, ctx: &Ctx) -> Result<()> {
    let mut all: Vec<Found> = Vec::new();
    let job = args.job.trim();
    let mut observations = Vec::new();
    let mut measured: Vec<(ObservedProfile, &'static str)> = Vec::new();
    let mut failures: Vec<GpuFailure> = Vec::new();
    let mut failed_pairs: Vec<FailedPair> = Vec::new();
    match ctx.open_read_only() {
        Ok(db) => {
            all.extend(db.decisions(MAX_DECISIONS)?.into_iter().map(|d| Found {
                decision: d.decision,
                created_at: d.created_at,
                source: "database",
                key: d.key,
            }));
            observations = db.observations()?.into_iter().filter(|o| o.job == job).collect();
            measured.extend(db.observed_profiles_of_job(job)?.into_iter().map(|p| (p, "database")));
            failures = db.gpu_failures()?.into_iter().filter(|f| f.job == job).collect();
            failed_pairs = db.failed_pairs()?;
        }
        Err(e) => {
            eprintln!("kace: explain: couldn't read the database ({e:#}); using the spool only")
        }
    }
    for (path, read) in spooled_decisions(&ctx.config.spool.dir)? {
        match read {
            Ok(d) => all.push(Found {
                decision: d.decision,
                created_at: d.created_at,
                source: "spool",
                key: Some(d.key),
            }),
            Err(why) => eprintln!(
                "kace: explain: skipping {}: {}",
                printable(&path.display().to_string()),
                printable(&why)
            ),
        }
    }
    for p in spooled_profiles(&ctx.config.spool.dir)? {
        if p.job == job && !measured.iter().any(|(m, _)| m.key == p.key) {
            measured.push((p, "spool"));
        }
    }
    all.sort_by(|a, b| a.created_at.total_cmp(&b.created_at));
    let slurm = ctx.slurm(SLURM_BUDGET);
    let timed: Vec<(NewDecision, f64, Option<String>)> =
        all.iter().map(|f| (f.decision.clone(), f.created_at, f.key.clone())).collect();
    let st = story(
        Some(&slurm),
        job,
        &timed,
        &observations,
        ctx.config.dispatch.max_hold_s,
        SystemClock.now(),
    );
    // Dispatch's releases onto free GPUs record a release, not a choice among candidates.
    let decided = |f: &&Found| ReleaseKind::of_key(f.key.as_deref()).decides();
    let led: Vec<&Found> = all
        .iter()
        .filter(decided)
        .filter(|f| f.decision.lead_job.as_deref() == Some(job))
        .collect();
    let seen: Vec<(&Found, &DecisionCandidate)> = all
        .iter()
        .filter(decided)
        .filter_map(|f| {
            let c = f.decision.candidates.iter().find(|c| c.job.as_deref() == Some(job))?;
            Some((f, c))
        })
        .collect();
    // Time limits a release lengthened for sharing (selection.time_limit = extend): this
    // job's, set when it or a job beside it was released.
    let mut lengthened: Vec<(&Found, String, &TimeLimitChange)> = Vec::new();
    for f in &all {
        for c in &f.decision.candidates {
            for t in c.time_limits.iter().filter(|t| t.job == job) {
                lengthened.push((f, c.job.clone().unwrap_or_default(), t));
            }
        }
    }

    let job = printable(job);
    if ctx.json() {
        let lengthened: Vec<_> = lengthened
            .iter()
            .map(|(f, released, t)| {
                json!({"released_job": released, "from_s": t.from_s, "to_s": t.to_s,
                       "at": f.created_at, "source": f.source})
            })
            .collect();
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
        let measured: Vec<_> =
            measured.iter().map(|(p, source)| json!({"record": p, "source": source})).collect();
        let failed: Vec<_> = failures
            .iter()
            .map(|f| json!({"failure": f, "explanation": failure(f, &failed_pairs)}))
            .collect();
        return print_json(&json!({"job": job, "story": st, "led": led, "candidate_in": seen,
                                  "measured": measured, "time_limits": lengthened,
                                  "failed_sharing": failed}));
    }
    print!("{}", render_story(&st));
    for (f, released, t) in &lengthened {
        let why = if *released == job {
            "at its release".to_string()
        } else {
            format!("when job {} joined its GPU", printable(released))
        };
        println!(
            "job {job}'s time limit was lengthened from {} to {} for sharing {why} ({}) [{}]",
            span(t.from_s),
            span(t.to_s),
            date(f.created_at),
            f.source
        );
    }
    for (p, source) in &measured {
        println!("{} [{source}]", printable(&measurement(&job, p)));
    }
    for f in &failures {
        println!("{} [database]", printable(&failure(f, &failed_pairs)));
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
            "job {job} ({}) led its GPU and {} among {} held kace job(s), {model}, \
             decided {} [{}]",
            printable(&d.lead_workload),
            printable(&chosen),
            d.candidates.len(),
            date(f.created_at),
            f.source
        );
        // The priority Slurm would have given each (kace's estimate; records of a decider
        // without priority/multifactor, and older ones, have none).
        let priorities = d.candidates.iter().any(|c| c.priority.is_some());
        let rows: Vec<Vec<String>> = d
            .candidates
            .iter()
            .map(|c| {
                let mut row = vec![c.job.clone().unwrap_or_default(), c.workload.clone()];
                if priorities {
                    row.push(c.priority.map(|p| format!("{p:.0}")).unwrap_or_else(|| "-".into()));
                }
                row.push(c.prediction.map(num).unwrap_or_else(|| "-".into()));
                row.push(verdict(d, c));
                row
            })
            .collect();
        let header: &[&str] = if priorities {
            &["job", "workload", "priority", "predicted", "verdict"]
        } else {
            &["job", "workload", "predicted", "verdict"]
        };
        if !rows.is_empty() {
            print!("{}", table(header, &rows));
        }
    }
    for (f, c) in &seen {
        let who = match ReleaseKind::of_key(f.key.as_deref()) {
            ReleaseKind::LateArrival => "kace dispatch offered held jobs to the open GPU of job",
            ReleaseKind::Refill => "an ending job's epilog chose a new partner for job",
            _ => "job",
        };
        let what = match ReleaseKind::of_key(f.key.as_deref()) {
            ReleaseKind::Lead => " chose a partner",
            _ => "",
        };
        println!(
            "job {job} ({}) was held when {who} {} ({}){what} at {}: {} [{}]",
            printable(&c.workload),
            printable(f.decision.lead_job.as_deref().unwrap_or("?")),
            printable(&f.decision.lead_workload),
            date(f.created_at),
            printable(&verdict(&f.decision, c)),
            f.source
        );
    }
    Ok(())
}

/// What a failure on a shared server meant, in the words of the job's user: with whom, and
/// whether it blocked the pair (both jobs failed) or was the job's own (only it failed).
fn failure(f: &GpuFailure, pairs: &[FailedPair]) -> String {
    let with: Vec<String> =
        f.partners.iter().map(|p| format!("job {} ({})", p.job, p.workload)).collect();
    let logged = f.mps_fatal_at.map_or(String::new(), |t| {
        format!(" (the GPU's MPS server logged a fatal GPU error at {})", date(t))
    });
    let head = format!(
        "job {} ({}) failed (exit {}) at {} while sharing the MPS server of GPU {} on {} with \
         {}{logged}",
        f.job,
        f.workload,
        f.exit,
        date(f.end),
        f.gpu,
        f.node,
        with.join(", ")
    );
    let blocked = pairs.iter().find(|p| p.jobs.iter().any(|(j, _)| *j == f.job));
    match blocked {
        Some(p) => {
            let other = p.jobs.iter().find(|(j, _)| *j != f.job).map_or("?", |(j, _)| j.as_str());
            let (a, b) = &p.workloads;
            format!(
                "{head}; job {other} failed with it: a fatal GPU error in one MPS client ends \
                 every client's work on the server, and MPS does not say whose it was, so kace \
                 no longer pairs {a} with {b} until an admin runs `kace pairs clear {a} {b}`"
            )
        }
        None => format!(
            "{head}; no partner failed with it (or an admin cleared the pair): nothing is blocked"
        ),
    }
}

/// What the epilog measured of the job, in one sentence.
fn measurement(job: &str, p: &ObservedProfile) -> String {
    let w = &p.profile.workload;
    if let Some(limit) = p.oom_limit_mib {
        return format!(
            "job {job} ({w}) ran out of GPU memory under its memory limit of {limit} MiB \
             (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT): it failed alone, its partners ran on, and \
             {w}'s memcap is now at least {} GiB, so its next limit is higher",
            num(limit as f64 / 1024.0)
        );
    }
    let values: Vec<String> = FEATURE_COLUMNS
        .iter()
        .zip(p.profile.values)
        .filter_map(|(k, v)| Some(format!("{k} {}", num(v?))))
        .collect();
    format!(
        "job {job} ({w}) ran alone for {:.0} s; its epilog measured {w}'s profile from {} \
         sampler reading(s): {}",
        p.alone_seconds,
        p.samples,
        values.join(", ")
    )
}

/// Why one candidate fared as it did in one decision.
fn verdict(d: &NewDecision, c: &DecisionCandidate) -> String {
    if c.job.is_some() && c.job == d.chosen_job {
        let mut chosen = match c.prediction {
            Some(p) => format!("chosen (predicted {})", num(p)),
            None => "chosen".into(),
        };
        if let Some(t) = c.thread_pct {
            chosen.push_str(&format!(
                ", with {t} % of the GPU's SMs (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, mps.sm_split)"
            ));
        }
        if c.explores.is_empty() {
            return chosen;
        }
        let new: Vec<String> = c.explores.iter().map(|w| printable(w).into_owned()).collect();
        return format!(
            "{chosen}, to explore new workload {} (the model had not learnt it; \
             selection.explore_pairs)",
            new.join(", ")
        );
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

/// The Slurm side of the job in words, dates in UTC.
fn render_story(st: &Story) -> String {
    let mut out = String::new();
    match &st.slurm {
        Some(f) => {
            let what =
                f.workload.as_deref().map(|w| format!("kace job, workload {}", printable(w)));
            out.push_str(&format!(
                "job {} ({}, user {}): {} {}{}\n",
                printable(&st.job),
                what.unwrap_or_else(|| "not a kace job".into()),
                if f.user.is_empty() { "?".into() } else { printable(&f.user) },
                printable(&f.state),
                if f.node.is_empty() || f.node == "(null)" {
                    String::new()
                } else {
                    format!("on {}", printable(&f.node))
                },
                if f.state == "PENDING" {
                    format!(" ({})", printable(&f.reason))
                } else {
                    String::new()
                },
            ));
            let t = |v: Option<f64>| v.map(date).unwrap_or_else(|| "-".into());
            out.push_str(&format!(
                "  submitted {}, started {}, ended {}\n",
                t(f.submitted),
                t(f.started),
                t(f.ended)
            ));
        }
        None => out.push_str(&format!(
            "job {}: Slurm has nothing to say ({}); kace's records follow\n",
            printable(&st.job),
            printable(st.slurm_error.as_deref().unwrap_or("unknown"))
        )),
    }
    if let Some(h) = st.held_s {
        out.push_str(&format!("  held {}", span(h)));
        match &st.released {
            Some(r) => {
                let when = r.at.map(date).unwrap_or_else(|| "-".into());
                let by = match r.by {
                    ReleasedBy::Lead => "as a lead onto a free GPU (kace dispatch)".to_string(),
                    ReleasedBy::Partner => format!(
                        "as the partner chosen by job {}",
                        r.lead_job.as_deref().unwrap_or("?")
                    ),
                    ReleasedBy::Refill => format!(
                        "to refill the GPU of job {} (an ending job's epilog chose it)",
                        r.lead_job.as_deref().map(printable).unwrap_or("?".into())
                    ),
                    ReleasedBy::LateArrival => format!(
                        "as a late arrival: joined the open GPU of job {} (kace dispatch offered it there)",
                        r.lead_job.as_deref().map(printable).unwrap_or("?".into())
                    ),
                    ReleasedBy::MaxHold => match (r.place, r.lead_job.as_deref()) {
                        (Some(Place::OpenGpu), Some(l)) => format!(
                            "by max_hold onto the open GPU of job {} (held too long; kace dispatch)",
                            printable(l)
                        ),
                        (Some(Place::FreeGpu), _) => {
                            "by max_hold onto a free GPU (held too long; kace dispatch)".into()
                        }
                        _ => "by max_hold (held too long; kace dispatch)".into(),
                    },
                    ReleasedBy::HandBack => format!(
                        "to Slurm, unpinned and asking for a whole GPU (kace dispatch: {})",
                        printable(r.why.as_deref().unwrap_or("no reason recorded"))
                    ),
                };
                out.push_str(&format!("; released {when} {by}\n"));
            }
            None => out.push('\n'),
        }
    }
    for w in &st.ran_with {
        let with: Vec<String> = w
            .partners
            .iter()
            .map(|(j, wl)| format!("job {} ({})", printable(j), printable(wl)))
            .collect();
        out.push_str(&format!(
            "  ran with {} from {} for {} at {} steps/s\n",
            with.join(", "),
            date(w.start),
            span(w.end - w.start),
            num(w.throughput)
        ));
    }
    if st.alone_s > 0.0 {
        out.push_str(&format!("  ran alone for {}\n", span(st.alone_s)));
    }
    out
}
