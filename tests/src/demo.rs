//! The newcomer's demo (`kace-demo`, run by `./demo`): a throwaway one-GPU Slurm cluster with
//! kace installed from this build, the synthetic demo profiles and pairs of `packaging/demo/`,
//! a small mixed queue submitted with `--kace-colocate`, and a timeline of who ran with whom,
//! predicted against observed.
//!
//! The GPU is fake, so the jobs are too: each one runs `fake-workload`, which appends progress
//! lines at the rate this module's [`TRUTH`] table gives for its workload next to whichever demo
//! job is registered on the same GPU. The table is the demo's ground truth; the shipped
//! `pairs.csv` (kace's training data here) was measured from it with ±3 % noise, and a test
//! checks both files against it. What the demo shows is kace's pipeline as built: the gate
//! holds, dispatch releases a lead, the lead's prolog predicts and releases the partner, the
//! epilogs measure what each job achieved beside whom, `kace ingest` stores it.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use kace_node::slurm::parse_utc;
use kace_sql::{Db, NewDecision, Observation};
use serde::{Deserialize, Serialize};

use crate::{kace as setup, Cluster, HarnessError, NodeSpec};

/// One demo workload's ground truth: how fast it runs alone, how much sharing slows it
/// (`sensitivity`) and how much it slows its partner (`pressure`). Beside partner `p`, workload
/// `w` runs at `exclusive × exp(−(w.sensitivity + p.pressure))`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Truth {
    /// The workload's name.
    pub workload: &'static str,
    /// Steps per second alone (the profile's `exclusive_throughput`).
    pub exclusive: f64,
    /// How much a partner slows it (in the exponent).
    pub sensitivity: f64,
    /// How much it slows a partner (in the exponent).
    pub pressure: f64,
    /// GiB of GPU memory it needs (the profile's `memcap_gib`).
    pub memcap: f64,
}

/// The demo's ground truth. Made-up numbers, not measurements; `packaging/demo/profiles.csv`
/// gives each workload a profile that goes with them (memory-heavy workloads press harder).
pub const TRUTH: [Truth; 7] = [
    Truth {
        workload: "resnet50-train",
        exclusive: 12.0,
        sensitivity: 0.20,
        pressure: 0.40,
        memcap: 9.0,
    },
    Truth {
        workload: "vit-train",
        exclusive: 10.0,
        sensitivity: 0.25,
        pressure: 0.35,
        memcap: 12.0,
    },
    Truth {
        workload: "unet-infer",
        exclusive: 20.0,
        sensitivity: 0.90,
        pressure: 0.80,
        memcap: 2.5,
    },
    Truth {
        workload: "gpt2-finetune",
        exclusive: 6.0,
        sensitivity: 0.30,
        pressure: 0.50,
        memcap: 24.0,
    },
    Truth {
        workload: "whisper-infer",
        exclusive: 18.0,
        sensitivity: 0.30,
        pressure: 0.25,
        memcap: 5.0,
    },
    Truth {
        workload: "bert-infer",
        exclusive: 40.0,
        sensitivity: 0.25,
        pressure: 0.15,
        memcap: 3.5,
    },
    Truth {
        workload: "lstm-train",
        exclusive: 8.0,
        sensitivity: 0.10,
        pressure: 0.10,
        memcap: 4.0,
    },
];

/// The lead, then the held candidates in queue order; `None` is the plain (non-kace) job.
/// Queue order would pick vit-train, the smallest-memory rule unet-infer (2.5 GiB), kace
/// bert-infer; gpt2-finetune does not fit in memory beside the lead.
pub const QUEUE: [Option<&str>; 7] = [
    Some("resnet50-train"),
    Some("vit-train"),
    Some("unet-infer"),
    None,
    Some("gpt2-finetune"),
    Some("whisper-infer"),
    Some("bert-infer"),
];

/// Seconds each kace job would take alone (its work is `exclusive × this` steps).
pub const WORK_S: f64 = 7.0;
/// How long the plain job runs.
const PLAIN_S: u32 = 5;
/// The fake GPU kace-sampler reads: busy at 97 % SM whoever runs (at least what any demo
/// profile's `sm_pct` says a job alone keeps busy, or ingest would refuse the jobs' claimed
/// rates as more work than the GPU did), so 293 W from the fake's power model (`idle_w` +
/// (`busy_w` − `idle_w`) × SM %), alone or shared.
pub const DEMO_NVML: &str = "gpu=Fake demo GPU;idle_w=60;busy_w=300;samples=97,50,8192";
/// Long enough that every pairing in the demo is kace's choice, not the `max_hold` release.
const MAX_HOLD_S: u64 = 150;

fn truth(w: &str) -> Option<&'static Truth> {
    TRUTH.iter().find(|t| t.workload == w)
}

/// Steps per second of `w` beside `partner` (`None`: alone), by the ground truth.
pub fn true_rate(w: &str, partner: Option<&str>) -> Option<f64> {
    let t = truth(w)?;
    match partner {
        None => Some(t.exclusive),
        Some(p) => Some(t.exclusive * (-(t.sensitivity + truth(p)?.pressure)).exp()),
    }
}

/// The rate table `fake-workload` reads: `<workload> <partner or -> <milli-steps per second>`.
pub fn rates_table() -> String {
    let mut s = String::new();
    for t in &TRUTH {
        let alone = true_rate(t.workload, None).unwrap_or(0.0);
        let _ = writeln!(s, "{} - {}", t.workload, (alone * 1000.0).round());
        for p in &TRUTH {
            let r = true_rate(t.workload, Some(p.workload)).unwrap_or(0.0);
            let _ = writeln!(s, "{} {} {}", t.workload, p.workload, (r * 1000.0).round());
        }
    }
    s
}

/// The fake workload: `fake-workload WORKLOAD STEPS`. It registers itself on its node's GPU,
/// and every 0.2 s advances by the rate the table gives beside whoever else is registered there,
/// appending `<unix time> <steps done>` to `$KACE_PROGRESS_FILE` (the progress-file protocol
/// the epilog measures), until STEPS are done. Pure bash: a fresh machine may lack python.
pub fn fake_workload_script(dir: &Path) -> String {
    let d = dir.display();
    format!(
        r#"#!/bin/bash
# kace demo: a stand-in for a GPU job (see tests/src/demo.rs). $1 = workload, $2 = steps.
set -euo pipefail
w=$1; total=$(( $2 * 1000 ))
reg="{d}/demo/on-gpu/$SLURMD_NODENAME"
mkdir -p "$reg"
echo "$w" > "$reg/$SLURM_JOB_ID"
trap 'rm -f "$reg/$SLURM_JOB_ID"' EXIT
rate() {{ awk -v w="$w" -v p="$1" '$1 == w && $2 == p {{ print $3; exit }}' {d}/demo/rates; }}
done_m=0
last=$(date +%s%3N)
echo "$(date +%s.%N) 0" >> "$KACE_PROGRESS_FILE"
while [ "$done_m" -lt "$total" ]; do
  sleep 0.2
  partner=-
  for f in "$reg"/*; do
    [ "$f" = "$reg/$SLURM_JOB_ID" ] || partner=$(cat "$f" 2>/dev/null || echo -)
  done
  now=$(date +%s%3N)
  r=$(rate "$partner")
  done_m=$(( done_m + ${{r:-0}} * (now - last) / 1000 ))
  last=$now
  printf '%s %d.%03d\n' "$(date +%s.%N)" $(( done_m / 1000 )) $(( done_m % 1000 )) >> "$KACE_PROGRESS_FILE"
done
echo "$w did $2 steps beside: $partner (last seen)"
"#
    )
}

/// One job of the demo as Slurm reported it (Unix seconds).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRun {
    /// Slurm's job id.
    pub id: String,
    /// `None` for the plain job.
    pub workload: Option<String>,
    /// When it was submitted.
    pub submit: f64,
    /// When it started.
    pub start: f64,
    /// When it ended.
    pub end: f64,
    /// Its final state.
    pub state: String,
}

/// Everything the timeline is drawn from, so it can be rendered (and tested) from a recording.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Recorded {
    /// Every job of the run.
    pub jobs: Vec<JobRun>,
    /// The leads' decisions, in order.
    pub decisions: Vec<NewDecision>,
    /// The epilogs' observations of the demo's jobs (after `kace ingest`).
    pub observations: Vec<Observation>,
}

fn fmt_rate(v: f64) -> String {
    format!("{v:.2}")
}

fn obs_of<'a>(r: &'a Recorded, id: &'a str) -> impl Iterator<Item = &'a Observation> + 'a {
    r.observations.iter().filter(move |o| o.job == id)
}

/// The timeline: each job's wait and run (alone or sharing the GPU), the pairs kace formed with
/// their predicted and observed throughput sums, and every lead's verdict on each candidate.
pub fn render(r: &Recorded) -> String {
    let mut s = String::new();
    let t0 = r.jobs.iter().map(|j| j.submit).fold(f64::INFINITY, f64::min);
    let t_end = r.jobs.iter().map(|j| j.end).fold(t0, f64::max);
    let span = (t_end - t0).max(1.0);
    const COLS: usize = 60;
    let col = |t: f64| (((t - t0) / span) * COLS as f64).round().clamp(0.0, COLS as f64) as usize;
    let name = |j: &JobRun| j.workload.clone().unwrap_or_else(|| "(plain job)".into());

    let _ = writeln!(
        s,
        "Timeline of GPU 0 on node n1 ({span:.0} s; '.' waiting, '=' running alone, \
         '#' sharing the GPU, '-' the plain job, which asked for no GPU)"
    );
    for j in &r.jobs {
        let mut bar = vec![' '; COLS];
        for c in bar.iter_mut().take(col(j.start)).skip(col(j.submit)) {
            *c = '.';
        }
        let run = if j.workload.is_some() { '=' } else { '-' };
        for c in bar.iter_mut().take(col(j.end)).skip(col(j.start)) {
            *c = run;
        }
        for o in obs_of(r, &j.id).filter(|o| !o.partners.is_empty()) {
            for c in bar.iter_mut().take(col(o.end)).skip(col(o.start)) {
                *c = '#';
            }
        }
        let _ = writeln!(
            s,
            "  {:>4} {:<15} |{}| {:>5.1}-{:<5.1}s",
            j.id,
            name(j),
            bar.iter().collect::<String>(),
            j.start - t0,
            j.end - t0
        );
    }

    let _ = writeln!(
        s,
        "\nWho ran with whom: the pairs kace formed, throughput sum in steps/s \
         (predicted by the model at the lead's start; observed by the epilogs; the demo's truth)"
    );
    let mut rows = vec![vec![
        "lead".to_string(),
        "partner".into(),
        "shared".into(),
        "predicted".into(),
        "observed".into(),
        "error".into(),
        "truth".into(),
    ]];
    for d in &r.decisions {
        let Some(lead) = d.lead_job.as_deref() else { continue };
        let Some(partner) = d.chosen_job.as_deref() else {
            rows.push(vec![
                format!("{lead} {}", d.lead_workload),
                "(none: ran alone)".into(),
                String::new(),
                String::new(),
                obs_of(r, lead)
                    .find(|o| o.partners.is_empty())
                    .map(|o| fmt_rate(o.throughput))
                    .unwrap_or_default(),
                String::new(),
                true_rate(&d.lead_workload, None).map(fmt_rate).unwrap_or_default(),
            ]);
            continue;
        };
        let pw = d.chosen_workload.clone().unwrap_or_default();
        let predicted = d
            .candidates
            .iter()
            .find(|c| c.job.as_deref() == Some(partner))
            .and_then(|c| c.prediction);
        let shared = |a: &str, b: &str| {
            obs_of(r, a).find(|o| o.partners.len() == 1 && o.partners[0].job == b).cloned()
        };
        let (a, b) = (shared(lead, partner), shared(partner, lead));
        let observed = match (&a, &b) {
            (Some(a), Some(b)) => Some(a.throughput + b.throughput),
            _ => None,
        };
        let overlap = match (&a, &b) {
            (Some(a), Some(b)) => format!("{:.1} s", a.end.min(b.end) - a.start.max(b.start)),
            _ => "-".into(),
        };
        let truth = true_rate(&d.lead_workload, Some(&pw))
            .zip(true_rate(&pw, Some(&d.lead_workload)))
            .map(|(x, y)| x + y);
        let error = match (predicted, observed) {
            (Some(p), Some(o)) if o > 0.0 => format!("{:+.1} %", (p - o) / o * 100.0),
            _ => "-".into(),
        };
        rows.push(vec![
            format!("{lead} {}", d.lead_workload),
            format!("{partner} {pw}"),
            overlap,
            predicted.map(fmt_rate).unwrap_or_else(|| "-".into()),
            observed.map(fmt_rate).unwrap_or_else(|| "-".into()),
            error,
            truth.map(fmt_rate).unwrap_or_default(),
        ]);
    }
    s.push_str(&table(&rows));

    let _ = writeln!(s, "\nWhat each lead's prolog decided (as `kace explain JOB` tells it)");
    for d in &r.decisions {
        let lead = d.lead_job.as_deref().unwrap_or("?");
        let alone = true_rate(&d.lead_workload, None).unwrap_or(f64::NAN);
        let choice = match (&d.chosen_job, &d.chosen_workload) {
            (Some(j), Some(w)) => format!("chose {j} {w}"),
            _ => "chose no partner".into(),
        };
        let _ = writeln!(
            s,
            "  lead {lead} {} (alone {}): {choice}, model v{}",
            d.lead_workload,
            fmt_rate(alone),
            d.model_version.map(|v| v.to_string()).unwrap_or_else(|| "-".into())
        );
        for c in &d.candidates {
            let id = c.job.as_deref().unwrap_or("?");
            let verdict = if c.job.is_some() && c.job == d.chosen_job {
                "chosen".to_string()
            } else if let Some(why) = &c.rejected {
                format!("rejected: {why}")
            } else {
                "not chosen: a better one was".into()
            };
            let predicted = c.prediction.map(fmt_rate).unwrap_or_else(|| "-".into());
            let _ =
                writeln!(s, "    {id:>4} {:<15} predicted {predicted:>6}  {verdict}", c.workload);
        }
        if d.candidates.is_empty() {
            let _ = writeln!(s, "    (no kace job was held)");
        }
    }
    if let Some(first) = r.decisions.first() {
        s.push_str(&versus(first));
    }
    s
}

/// For the first decision: the partner queue order and the smallest-memory rule would have
/// given the lead (among the candidates that fit), and each pair's true throughput sum.
fn versus(d: &NewDecision) -> String {
    let lead = d.lead_workload.as_str();
    let fits: Vec<&str> = d
        .candidates
        .iter()
        .filter(|c| c.rejected.as_deref().is_none_or(|r| !r.contains("memory")))
        .map(|c| c.workload.as_str())
        .collect();
    let memcap = |w: &str| truth(w).map_or(f64::INFINITY, |t| t.memcap);
    let sum = |p: &str| {
        true_rate(lead, Some(p)).zip(true_rate(p, Some(lead))).map_or(f64::NAN, |(a, b)| a + b)
    };
    let mut s = String::new();
    let alone = true_rate(lead, None).unwrap_or(f64::NAN);
    let mut line = |rule: &str, pick: Option<&str>| {
        if let Some(p) = pick {
            let _ = writeln!(
                s,
                "  {rule:<21} {p:<15} {} steps/s ({:+.0} % vs {lead} alone)",
                fmt_rate(sum(p)),
                (sum(p) / alone - 1.0) * 100.0
            );
        }
    };
    line("first in queue:", fits.first().copied());
    line("smallest memcap:", fits.iter().copied().min_by(|a, b| memcap(a).total_cmp(&memcap(b))));
    line("kace:", d.chosen_workload.as_deref());
    if s.is_empty() {
        return s;
    }
    format!("\nThe first lead's partner by each rule (true pair throughput):\n{s}")
}

/// Left-aligned columns, two spaces apart, indented by two.
fn table(rows: &[Vec<String>]) -> String {
    let n = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..n)
        .map(|i| rows.iter().map(|r| r.get(i).map_or(0, |c| c.chars().count())).max().unwrap_or(0))
        .collect();
    let mut s = String::new();
    for r in rows {
        let cells: Vec<String> = r.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        let _ = writeln!(s, "  {}", cells.join("  ").trim_end());
    }
    s
}

/// Where the repository's demo data lives.
pub fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/demo")
}

/// A path as the demo prints it: relative to the checkout when inside it, so that a recorded
/// run (the README's) shows no machine's directory layout.
fn for_display(p: &Path) -> String {
    let checkout = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap_or(Path::new("/"));
    let checkout = checkout.canonicalize().unwrap_or_else(|_| checkout.to_path_buf());
    let full = p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
    match full.strip_prefix(&checkout) {
        Ok(rel) => rel.display().to_string(),
        Err(_) => p.display().to_string(),
    }
}

fn err(what: &str, e: impl std::fmt::Display) -> HarnessError {
    HarnessError::Unexpected(format!("{what}: {e}"))
}

/// Runs `kace args` against the demo cluster; returns stdout.
fn kace(c: &Cluster, args: &[&str]) -> Result<String, HarnessError> {
    let bin = setup::bin_dir()?.join("kace");
    let out = Command::new(&bin)
        .args(args)
        .env("KACE_CONFIG", c.dir().join("etc/kace.conf"))
        .env("SLURM_CONF", c.conf())
        .output()
        .map_err(|e| err(&format!("couldn't run {}", bin.display()), e))?;
    if !out.status.success() {
        return Err(HarnessError::Command {
            command: format!("kace {}", args.join(" ")),
            status: out.status.code(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn write_exec(p: &Path, text: &str) -> Result<(), HarnessError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(p, text).map_err(|e| err(&format!("couldn't write {}", p.display()), e))?;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| err(&format!("couldn't chmod {}", p.display()), e))
}

fn field<'a>(j: &'a crate::JobInfo, k: &str) -> &'a str {
    j.get(k).map(String::as_str).unwrap_or("")
}

fn active(state: &str) -> bool {
    matches!(state, "PENDING" | "RUNNING" | "CONFIGURING" | "COMPLETING" | "SUSPENDED" | "")
}

/// Runs the demo, printing what it does as it goes; returns the recording and the output of
/// `kace explain` for the first lead. The cluster is torn down when this returns.
pub fn run(say: &mut dyn FnMut(&str)) -> Result<(Recorded, String), HarnessError> {
    let started = Instant::now();
    let c = Cluster::builder()
        .nodes(vec![NodeSpec::new("n1", 1)])
        .prolog(setup::hook("kace-prolog", "")?)
        .epilog(setup::hook("kace-epilog", "")?)
        .prolog_slurmctld(setup::hook("kace-dispatch", "")?)
        .epilog_slurmctld(setup::hook("kace-dispatch", "")?)
        .start()?;
    let dir = c.dir().to_path_buf();
    say(&format!(
        "1. started a throwaway Slurm cluster in {} (slurmctld + slurmd, node n1 with one fake \
         GPU as 4 shards), kace's SPANK plugin, gate, prolog, epilog and dispatch from {}",
        dir.display(),
        for_display(&setup::bin_dir()?)
    ));

    // The demo shows the choice among every held job: its whole queue inside the priority
    // window (default 4; its jobs have no multifactor priority, so the order is submission's).
    // kace-sampler reads the fake GPU five times a second, for the report's energy; the demo's
    // profiles stay the shipped ones (no alone run is long enough for `min_samples`).
    let conf = format!(
        "{}[selection]\npriority_window = 16\n\
         [sampler]\ndir = \"{d}/samples\"\ninterval_ms = 200\ncapacity = 3000\n\
         [profile]\nmin_samples = 100000\n",
        setup::conf(&dir, MAX_HOLD_S),
        d = dir.display()
    );
    let conf_path = dir.join("etc/kace.conf");
    std::fs::write(&conf_path, conf).map_err(|e| err("couldn't write kace.conf", e))?;
    std::fs::create_dir_all(dir.join("samples")).map_err(|e| err("couldn't mkdir samples", e))?;
    let _sampler =
        setup::start_sampler(&conf_path, Some(DEMO_NVML), &dir.join("log/kace-sampler.log"))?;
    write_exec(&dir.join("fake-mps"), &setup::fake_mps_script(&dir))?;
    std::fs::create_dir_all(dir.join("demo/on-gpu")).map_err(|e| err("couldn't mkdir demo", e))?;
    std::fs::write(dir.join("demo/rates"), rates_table())
        .map_err(|e| err("couldn't write the rates", e))?;
    let worker = dir.join("demo/fake-workload");
    write_exec(&worker, &fake_workload_script(&dir))?;

    let data = data_dir();
    let path = |f: &str| data.join(f).display().to_string();
    kace(&c, &["db", "init"])?;
    let p = kace(&c, &["profile", "import", &path("profiles.csv")])?;
    let o = kace(&c, &["observations", "import", &path("pairs.csv")])?;
    let t = kace(&c, &["train"])?;
    say(&format!(
        "2. kace db init; kace profile import packaging/demo/profiles.csv: {}\n   \
         kace observations import packaging/demo/pairs.csv: {}\n   kace train: {}",
        p.trim(),
        o.trim(),
        t.lines().next().unwrap_or("").trim()
    ));

    let mut ids: Vec<(String, Option<&str>)> = Vec::new();
    for w in QUEUE {
        let id = match w {
            Some(w) => {
                let steps = (truth(w).map_or(0.0, |t| t.exclusive) * WORK_S).round() as u64;
                let opt = format!("--kace-colocate={w}");
                let name = format!("--job-name={w}");
                c.sbatch(&[
                    &opt,
                    &name,
                    "--gres=shard:1",
                    &worker.display().to_string(),
                    w,
                    &steps.to_string(),
                ])?
            }
            None => c.sbatch(&["--job-name=plain", "--wrap", &format!("sleep {PLAIN_S}")])?,
        };
        ids.push((id.to_string(), w));
    }
    let shown: Vec<String> = ids
        .iter()
        .map(|(id, w)| format!("{id} {}", w.unwrap_or("plain (no --kace-colocate)")))
        .collect();
    say(&format!(
        "3. submitted, in this order: {}\n   the gate holds every --kace-colocate job; the plain \
         job is Slurm's as usual",
        shown.join(", ")
    ));

    let out = kace(&c, &["dispatch"])?;
    say(&format!("4. kace dispatch (the timer): {}", out.trim()));
    say("   ...the lead's prolog picks its partner; EpilogSlurmctld and the timer (every 1 s here) dispatch the rest");
    let deadline = Instant::now() + Duration::from_secs(150);
    let mut infos = BTreeMap::new();
    loop {
        infos.clear();
        for (id, _) in &ids {
            let n: u32 = id.parse().map_err(|e| err("job id", e))?;
            infos.insert(id.clone(), c.job(n)?);
        }
        if infos.values().all(|j| !active(field(j, "JobState"))) {
            break;
        }
        if Instant::now() > deadline {
            return Err(HarnessError::Timeout {
                what: "the demo's jobs to finish".into(),
                waited: Duration::from_secs(150),
                detail: format!("{infos:#?}"),
            });
        }
        kace(&c, &["dispatch"])?;
        std::thread::sleep(Duration::from_secs(1));
    }
    let ingested = kace(&c, &["ingest"])?;
    say(&format!("5. all jobs done; kace ingest: {}", ingested.trim().replace('\n', "; ")));

    // Slurm prints local time; ask again in UTC so the times parse without the zone database.
    let mut jobs = Vec::new();
    for (id, w) in &ids {
        let out = c
            .command("scontrol")
            .env("TZ", "UTC")
            .args(["-o", "show", "job", id])
            .output()
            .map_err(|e| err("scontrol", e))?;
        let j = crate::parse_fields(&String::from_utf8_lossy(&out.stdout));
        let time = |k: &str| {
            // Slurm prints UTC: the demo runs its commands with `TZ=UTC`.
            parse_utc(field(&j, k))
                .ok_or_else(|| err(&format!("job {id} {k}"), field(&j, k).to_string()))
        };
        jobs.push(JobRun {
            id: id.clone(),
            workload: w.map(str::to_string),
            submit: time("SubmitTime")?,
            start: time("StartTime")?,
            end: time("EndTime")?,
            state: field(&j, "JobState").to_string(),
        });
    }
    let db = Db::open_read_only(&dir.join("kace.db")).map_err(|e| err("open the database", e))?;
    let ours: Vec<&str> = ids.iter().map(|(id, _)| id.as_str()).collect();
    let mut decisions: Vec<_> = db
        .decisions(1000)
        .map_err(|e| err("read decisions", e))?
        .into_iter()
        .filter(|d| d.decision.lead_job.as_deref().is_some_and(|l| ours.contains(&l)))
        // The hooks' decisions; dispatch's release records are not a lead's choice.
        .filter(|d| kace_sql::spool::ReleaseKind::of_key(d.key.as_deref()).by_hook())
        .collect();
    decisions.sort_by(|a, b| a.created_at.total_cmp(&b.created_at));
    let observations: Vec<Observation> = db
        .observations()
        .map_err(|e| err("read observations", e))?
        .into_iter()
        .filter(|o| o.node != "imported" && ours.contains(&o.job.as_str()))
        .collect();
    // Observations carry sub-second times; use them for the kace jobs' start and end.
    for j in &mut jobs {
        let mine: Vec<&Observation> = observations.iter().filter(|o| o.job == j.id).collect();
        if let (Some(s), Some(e)) = (
            mine.iter().map(|o| o.start).reduce(f64::min),
            mine.iter().map(|o| o.end).reduce(f64::max),
        ) {
            j.start = s;
            j.end = e;
        }
    }
    let first_lead = ids[0].0.clone();
    let explain = kace(&c, &["explain", &first_lead])?;
    let report = kace(&c, &["report", "--since", "1d"])?;
    let energy: Vec<&str> = report.lines().filter(|l| l.starts_with("energy")).collect();
    // The report of this run as an SVG, for docs/observability.md's figure.
    if let Some(svg) = std::env::var_os("KACE_DEMO_REPORT_SVG") {
        let svg = PathBuf::from(svg);
        kace(&c, &["report", "--since", "1d", "--svg", &svg.display().to_string()])?;
        say(&format!("   kace report --since 1d --svg {}", for_display(&svg)));
    }
    let rec = Recorded {
        jobs,
        decisions: decisions.into_iter().map(|d| d.decision).collect(),
        observations,
    };
    say(&format!(
        "6. read back from the database in {:.0?}; tearing the cluster down",
        started.elapsed()
    ));
    drop(c);
    Ok((
        rec,
        format!(
            "$ kace explain {first_lead}\n{explain}\n$ kace report --since 1d   (its energy lines; \
             the fake GPU's power: {DEMO_NVML})\n{}\n",
            energy.join("\n")
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_inside_the_checkout_are_shown_relative_to_it() {
        let inside = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/figures");
        assert_eq!(for_display(&inside), "docs/figures");
        assert_eq!(for_display(Path::new("/nonexistent/kace")), "/nonexistent/kace");
    }

    #[test]
    fn rates_follow_the_truth() {
        assert_eq!(true_rate("bert-infer", None), Some(40.0));
        let r = true_rate("resnet50-train", Some("bert-infer")).unwrap();
        assert!((r - 12.0 * (-0.35f64).exp()).abs() < 1e-12);
        assert_eq!(true_rate("nope", None), None);
        let table = rates_table();
        assert_eq!(table.lines().count(), TRUTH.len() * (TRUTH.len() + 1));
        assert!(table.contains("bert-infer - 40000\n"));
    }
}
