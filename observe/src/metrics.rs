//! `kace metrics --textfile DIR`: kace's figures in Prometheus's text exposition format, for
//! node_exporter's textfile collector, written atomically to `DIR/kace.prom` (a temporary file
//! in DIR, fsync, rename: the collector never reads half a file).
//!
//! Names follow Prometheus's conventions: a `kace_` prefix, base units (seconds, ratios), and
//! `_total` on counters. Counters are counts over the database's whole history, so they only
//! grow while the database does (`kace prune` resets them, which Prometheus treats as a counter
//! reset).

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use kace_selector::Objective;
use kace_sql::Db;

use kace_sql::spool::ReleaseKind;

use crate::releases::{count_by, groups_by_kind, released, Released};
use crate::report::{self, Report};
use crate::{Error, Result};

/// The file node_exporter reads.
pub const FILE_NAME: &str = "kace.prom";

/// Upper bounds of the hold-time histogram's buckets, seconds: from a watch-loop pass (1 s)
/// to the default `max_hold` (600 s) and past it.
pub const HOLD_BUCKETS_S: [f64; 11] =
    [1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0];

/// The window of "recent" groups for the predicted/observed quantiles.
pub const RECENT_S: f64 = 7.0 * 86_400.0;

/// What the database cannot say and the caller found out (from Slurm or the file system).
#[derive(Debug, Clone, Default)]
pub struct Live {
    /// Kace jobs held now (`None`: Slurm was not asked).
    pub held_jobs: Option<usize>,
    /// Seconds the oldest held kace job has waited.
    pub oldest_hold_s: Option<f64>,
    /// Observation records waiting in the spool.
    pub spool_files: Option<usize>,
    /// Files in the quarantine.
    pub quarantined_files: Option<usize>,
    /// The decider's Slurm commands since its state began, by kind (`None`: no decider state
    /// on this host, or unreadable).
    pub decider_commands: Option<std::collections::BTreeMap<String, u64>>,
    /// The Slurm RPCs the decider made in the last full minute.
    pub decider_rpcs_last_minute: Option<u64>,
    /// The decider's priority inversions since its state began: releases that passed over a
    /// held job of higher priority, and the seconds such jobs waited after it.
    pub priority_inversions: Option<(u64, f64)>,
    /// The decider's passes since its state began and the seconds they took together, and its
    /// slowest pass in the last full minute (`None` there: none counted).
    pub decider_passes: Option<(u64, f64, Option<f64>)>,
}

/// Counts the `.json` records directly in `dir`: none when it does not exist yet, `None` when
/// it cannot be read.
pub fn count_records(dir: &Path) -> Option<usize> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Some(0),
        Err(_) => return None,
    };
    Some(
        entries
            .flatten()
            .filter(|e| {
                e.file_type().is_ok_and(|t| t.is_file())
                    && e.file_name().to_string_lossy().ends_with(kace_sql::spool::RECORD_SUFFIX)
            })
            .count(),
    )
}

struct Out(String);

impl Out {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}");
        let _ = writeln!(self.0, "# TYPE {name} {kind}");
    }
    fn sample(&mut self, name: &str, labels: &[(&str, &str)], v: f64) {
        let _ = write!(self.0, "{name}");
        if !labels.is_empty() {
            let l: Vec<String> = labels
                .iter()
                .map(|(k, v)| {
                    let v = v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
                    format!("{k}=\"{v}\"")
                })
                .collect();
            let _ = write!(self.0, "{{{}}}", l.join(","));
        }
        let _ = writeln!(self.0, " {}", number(v));
    }
    fn one(&mut self, name: &str, kind: &str, help: &str, v: f64) {
        self.family(name, kind, help);
        self.sample(name, &[], v);
    }
}

/// Prometheus's float syntax (`+Inf`, `-Inf`, `NaN`).
fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v == f64::INFINITY {
        "+Inf".into()
    } else if v == f64::NEG_INFINITY {
        "-Inf".into()
    } else {
        format!("{v}")
    }
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let pos = q * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

/// The exposition text at `now`.
pub fn render(db: &Db, objective: Objective, live: &Live, now: f64) -> Result<String> {
    let mut o = Out(String::new());
    let decisions = db.decisions(1_000_000)?;
    let releases: Vec<Released> = decisions
        .iter()
        .filter_map(|d| released(&d.decision, d.created_at, d.key.as_deref()))
        .collect();
    o.family(
        "kace_groups_formed_total",
        "counter",
        "Colocated groups formed (a held job released onto a GPU running kace jobs), by kind: a starting job's prolog (lead), an ending job's epilog (refill), dispatch offering a held job to an open GPU (late_arrival), or a job released by max_hold onto an open GPU (max_hold).",
    );
    for (kind, n) in groups_by_kind(&releases) {
        o.sample("kace_groups_formed_total", &[("kind", kind)], n as f64);
    }
    o.family(
        "kace_jobs_released_total",
        "counter",
        "Held kace jobs released, by what released them (lead: dispatch onto a free GPU; partner: a starting job's prolog; refill: an ending job's epilog; late_arrival: dispatch onto an open GPU; max_hold: held longer than dispatch.max_hold_s) and where to (free_gpu, open_gpu).",
    );
    for ((by, place), n) in count_by(&releases) {
        o.sample("kace_jobs_released_total", &[("by", by), ("place", place)], n as f64);
    }
    let holds: Vec<f64> = releases.iter().filter_map(|r| r.held_s).collect();
    o.family(
        "kace_hold_seconds",
        "histogram",
        "How long each released kace job was held, from its submission (or --begin time) to its release.",
    );
    for le in HOLD_BUCKETS_S {
        let n = holds.iter().filter(|h| **h <= le).count();
        o.sample("kace_hold_seconds_bucket", &[("le", &number(le))], n as f64);
    }
    o.sample("kace_hold_seconds_bucket", &[("le", "+Inf")], holds.len() as f64);
    o.sample("kace_hold_seconds_sum", &[], holds.iter().sum());
    o.sample("kace_hold_seconds_count", &[], holds.len() as f64);
    // Only the hooks' records are decisions that may choose no one.
    let hooks: Vec<_> =
        decisions.iter().filter(|d| ReleaseKind::of_key(d.key.as_deref()).by_hook()).collect();
    let paired = hooks.iter().filter(|d| d.decision.chosen_job.is_some()).count();
    o.family(
        "kace_decisions_total",
        "counter",
        "Partner decisions made by the prologs and epilogs, by outcome.",
    );
    o.sample("kace_decisions_total", &[("outcome", "paired")], paired as f64);
    o.sample("kace_decisions_total", &[("outcome", "alone")], (hooks.len() - paired) as f64);

    let all = db.observations()?;
    let live_obs: Vec<_> = all.iter().filter(|x| x.node != report::IMPORTED_NODE).collect();
    o.family(
        "kace_observations_total",
        "counter",
        "Observations in the database, by origin (epilog: observed on this cluster).",
    );
    o.sample("kace_observations_total", &[("origin", "epilog")], live_obs.len() as f64);
    o.sample(
        "kace_observations_total",
        &[("origin", "imported")],
        (all.len() - live_obs.len()) as f64,
    );
    let (mut shared, mut alone) = (0.0, 0.0);
    for x in &live_obs {
        let span = (x.end - x.start).max(0.0);
        if x.partners.is_empty() {
            alone += span;
        } else {
            shared += span / (x.partners.len() + 1) as f64;
        }
    }
    o.family(
        "kace_gpu_seconds_total",
        "counter",
        "GPU time with kace jobs observed by the epilogs, by whether the GPU was shared.",
    );
    o.sample("kace_gpu_seconds_total", &[("sharing", "shared")], shared);
    o.sample("kace_gpu_seconds_total", &[("sharing", "alone")], alone);
    o.one(
        "kace_gpu_time_shared_ratio",
        "gauge",
        "Fraction of observed kace GPU time that was shared (0 when none was observed).",
        if shared + alone > 0.0 { shared / (shared + alone) } else { 0.0 },
    );

    let all_energy = crate::energy::energy(&live_obs, &|_| None);
    o.family(
        "kace_gpu_energy_joules_total",
        "counter",
        "GPU energy over the observed kace intervals (NVML's counter, read by kace-sampler), by whether the GPU was shared.",
    );
    o.sample("kace_gpu_energy_joules_total", &[("sharing", "shared")], all_energy.shared_j);
    o.sample("kace_gpu_energy_joules_total", &[("sharing", "alone")], all_energy.alone_j);

    let r: Report = report::build(db, objective, now - RECENT_S, now)?;
    o.family(
        "kace_energy_per_work_joules",
        "gauge",
        "Joules per exclusive-second of work (what a job does in one second alone) in the last 7 days, by whether the GPU was shared (NaN: none measured).",
    );
    for (sharing, v) in
        [("shared", r.energy.j_per_work_shared), ("alone", r.energy.j_per_work_alone)]
    {
        o.sample("kace_energy_per_work_joules", &[("sharing", sharing)], v.unwrap_or(f64::NAN));
    }
    o.one(
        "kace_energy_saved_joules",
        "gauge",
        "Energy sharing saved in the last 7 days against running the shared work one job after another at each workload's joules per step alone (negative: it cost; NaN: not known).",
        r.energy.saved_j.unwrap_or(f64::NAN),
    );
    o.one(
        "kace_energy_saved_ratio",
        "gauge",
        "kace_energy_saved_joules over the energy the shared work would have taken one job after another (NaN: not known).",
        r.energy.saved_fraction.unwrap_or(f64::NAN),
    );
    let mut ratios: Vec<f64> = r
        .groups
        .iter()
        .filter_map(|g| g.predicted.zip(g.observed))
        .filter(|(_, obs)| *obs > 0.0)
        .map(|(p, obs)| p / obs)
        .collect();
    ratios.sort_by(f64::total_cmp);
    o.family(
        "kace_group_predicted_observed_ratio",
        "summary",
        "Predicted over observed objective of the groups kace formed in the last 7 days.",
    );
    for q in ["0.1", "0.5", "0.9"] {
        let qv: f64 = q.parse().unwrap_or(0.5);
        o.sample("kace_group_predicted_observed_ratio", &[("quantile", q)], quantile(&ratios, qv));
    }
    o.sample("kace_group_predicted_observed_ratio_sum", &[], ratios.iter().fold(0.0, |a, b| a + b));
    o.sample("kace_group_predicted_observed_ratio_count", &[], ratios.len() as f64);
    let gains: Vec<f64> = r.groups.iter().filter_map(|g| g.normalised_progress).collect();
    o.one(
        "kace_group_gain_ratio",
        "gauge",
        "Mean normalised progress (sum of colocated/exclusive throughput) of the last 7 days' groups; 1 is no gain over running alone (NaN: none).",
        if gains.is_empty() { f64::NAN } else { gains.iter().sum::<f64>() / gains.len() as f64 },
    );

    let models = db.models()?;
    let active = models.iter().find(|m| m.active);
    o.family("kace_model_info", "gauge", "The active model (value 1), by version and kind.");
    if let Some(m) = active {
        o.sample(
            "kace_model_info",
            &[("version", &m.version.to_string()), ("kind", &m.model.kind)],
            1.0,
        );
    }
    o.one(
        "kace_model_version",
        "gauge",
        "Version of the active model (0: none).",
        active.map_or(0.0, |m| m.version as f64),
    );
    o.one(
        "kace_model_holdout_mse",
        "gauge",
        "Held-out mean squared error of the active model, in the objective's units squared (NaN: not recorded).",
        active
            .and_then(|m| kace_sql::training::stored_record(&m.model.metrics))
            .map_or(f64::NAN, |r| r.holdout_mse),
    );
    o.one(
        "kace_model_training_groups",
        "gauge",
        "Groups the active model was trained on (fit and held out).",
        active.map_or(0.0, |m| m.model.training_size as f64),
    );
    let last = models.iter().max_by_key(|m| m.version);
    o.one(
        "kace_last_training_timestamp_seconds",
        "gauge",
        "When the newest model version was trained (0: never).",
        last.map_or(0.0, |m| m.created_at),
    );
    o.one(
        "kace_last_training_activated",
        "gauge",
        "1 when the newest trained version is the active one (it was not worse than the one before), else 0.",
        last.map_or(0.0, |m| if m.active { 1.0 } else { 0.0 }),
    );
    o.one(
        "kace_models_total",
        "counter",
        "Model versions trained and stored.",
        models.len() as f64,
    );
    if let Some(n) = live.held_jobs {
        o.one(
            "kace_held_jobs",
            "gauge",
            "Kace jobs held now, waiting for a partner or a GPU.",
            n as f64,
        );
    }
    if let Some(s) = live.oldest_hold_s {
        o.one(
            "kace_oldest_hold_seconds",
            "gauge",
            "How long the oldest held kace job has waited.",
            s,
        );
    }
    if let Some(n) = live.spool_files {
        o.one(
            "kace_spool_records",
            "gauge",
            "Observation records in the spool, not ingested yet.",
            n as f64,
        );
    }
    if let Some(n) = live.quarantined_files {
        o.one(
            "kace_quarantined_records",
            "gauge",
            "Records moved to the quarantine by ingest (unreadable or invalid).",
            n as f64,
        );
    }
    if let Some(counts) = &live.decider_commands {
        o.family(
            "kace_slurm_commands_total",
            "counter",
            "Slurm commands the decider ran, by kind (list: the pass's squeue; job: one job's \
             read; whole_queue: a 22.05 squeue --json; nodes: sinfo; update: a request change; \
             update_nodes: one naming nodes; release; hold; steps: scontrol listpids; config, \
             shares, partitions: the priority factors and limit enforcement; qos, assocs: \
             sacctmgr, slurmdbd only).",
        );
        for (kind, n) in counts {
            o.sample("kace_slurm_commands_total", &[("kind", kind)], *n as f64);
        }
    }
    if let Some((n, seconds)) = live.priority_inversions {
        o.one(
            "kace_priority_inversions_total",
            "counter",
            "Releases that passed over a held kace job of higher priority (Slurm's multifactor \
             order, as kace estimates it), bounded by selection.priority_window.",
            n as f64,
        );
        o.one(
            "kace_priority_inversion_seconds_total",
            "counter",
            "Seconds held kace jobs waited after a job of lower priority was released ahead of \
             them, until their own release.",
            seconds,
        );
    }
    if let Some((n, seconds, slowest)) = live.decider_passes {
        o.family(
            "kace_decider_pass_seconds",
            "summary",
            "How long the decider's passes took (listing, decisions, releases): a nudge waits \
             for the pass running when it arrives, then for its own.",
        );
        o.sample("kace_decider_pass_seconds_sum", &[], seconds);
        o.sample("kace_decider_pass_seconds_count", &[], n as f64);
        if let Some(s) = slowest {
            o.one(
                "kace_decider_slowest_pass_seconds",
                "gauge",
                "The decider's slowest pass in the last full minute.",
                s,
            );
        }
    }
    if let Some(n) = live.decider_rpcs_last_minute {
        o.one(
            "kace_slurm_rpcs_last_minute",
            "gauge",
            "Slurm RPCs the decider made in the last full minute (each command counted at its \
             measured cost, ARCHITECTURE.md).",
            n as f64,
        );
    }
    o.one("kace_metrics_timestamp_seconds", "gauge", "When this file was written.", now);
    Ok(o.0)
}

/// Writes `text` to `dir/kace.prom` atomically; returns the path.
pub fn write_textfile(dir: &Path, text: &str) -> Result<PathBuf> {
    let path = dir.join(FILE_NAME);
    // Not ending in .prom: the collector skips it while it is being written.
    let tmp = dir.join(format!(".{FILE_NAME}.{}.tmp", std::process::id()));
    let werr = |p: &Path| {
        let p = p.to_path_buf();
        move |cause| Error::Write { path: p, cause }
    };
    let result = (|| {
        let mut f = std::fs::File::create(&tmp).map_err(werr(&tmp))?;
        f.write_all(text.as_bytes()).map_err(werr(&tmp))?;
        f.sync_all().map_err(werr(&tmp))?;
        drop(f);
        std::fs::rename(&tmp, &path).map_err(werr(&path))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map(|()| path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_quantiles() {
        assert_eq!(number(f64::NAN), "NaN");
        assert_eq!(number(f64::INFINITY), "+Inf");
        assert_eq!(number(1.5), "1.5");
        assert_eq!(number(3.0), "3");
        assert!(quantile(&[], 0.5).is_nan());
        assert_eq!(quantile(&[1.0, 2.0, 3.0], 0.5), 2.0);
        assert_eq!(quantile(&[1.0, 3.0], 0.5), 2.0);
        assert_eq!(quantile(&[1.0, 3.0], 0.9), 2.8);
    }

    /// A fresh database in its own temporary directory (removed by the test).
    fn empty_db(name: &str) -> (std::path::PathBuf, Db) {
        let d = std::env::temp_dir().join(format!("kace-prom-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let _ = std::fs::remove_file(d.join("kace.db"));
        let (db, _) = Db::create(&d.join("kace.db")).unwrap();
        (d, db)
    }

    #[test]
    fn the_deciders_priority_inversions_are_counters() {
        let (d, db) = empty_db("inv");
        let live = Live { priority_inversions: Some((3, 42.5)), ..Live::default() };
        let text = render(&db, Objective::ThroughputSum, &live, 1000.0).unwrap();
        assert!(text.contains("# TYPE kace_priority_inversions_total counter\n"), "{text}");
        assert!(text.contains("\nkace_priority_inversions_total 3\n"), "{text}");
        assert!(text.contains("\nkace_priority_inversion_seconds_total 42.5\n"), "{text}");
        let none = render(&db, Objective::ThroughputSum, &Live::default(), 1000.0).unwrap();
        assert!(!none.contains("kace_priority_inversion"), "no decider here: {none}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn the_deciders_pass_times_are_a_summary_and_its_slowest_pass_a_gauge() {
        let (d, db) = empty_db("pass");
        let live = Live { decider_passes: Some((40, 6.5, Some(0.75))), ..Live::default() };
        let text = render(&db, Objective::ThroughputSum, &live, 1000.0).unwrap();
        assert!(
            text.contains(
                "# TYPE kace_decider_pass_seconds summary
"
            ),
            "{text}"
        );
        assert!(text.contains("\nkace_decider_pass_seconds_sum 6.5\n"), "{text}");
        assert!(text.contains("\nkace_decider_pass_seconds_count 40\n"), "{text}");
        assert!(text.contains("\nkace_decider_slowest_pass_seconds 0.75\n"), "{text}");
        let quiet = Live { decider_passes: Some((40, 6.5, None)), ..Live::default() };
        let text = render(&db, Objective::ThroughputSum, &quiet, 1000.0).unwrap();
        assert!(!text.contains("kace_decider_slowest_pass"), "no pass last minute: {text}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn label_values_are_escaped() {
        let mut o = Out(String::new());
        o.sample("m", &[("a", "x\"y\\z\nw")], 1.0);
        assert_eq!(o.0, "m{a=\"x\\\"y\\\\z\\nw\"} 1\n");
    }

    #[test]
    fn the_textfile_is_replaced_whole() {
        let d = std::env::temp_dir().join(format!("kace-prom-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let p = write_textfile(&d, "a 1\n").unwrap();
        write_textfile(&d, "a 2\n").unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "a 2\n");
        let left: Vec<_> = std::fs::read_dir(&d).unwrap().flatten().collect();
        assert_eq!(left.len(), 1, "a temporary file was left behind");
        assert!(write_textfile(&d.join("missing"), "x").is_err());
        let _ = std::fs::remove_dir_all(&d);
    }
}
