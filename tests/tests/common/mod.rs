//! Shared by the co-scheduling tests: the project's synthetic training data
//! (`packaging/demo/`, as the demo uses), running `kace` against a test cluster, a
//! progress-writing job script, a cluster's kace setup (config, fake MPS control, a database
//! with the demo profiles and a model trained on its pairs), where a job landed, read
//! through kace's own Slurm interface, and a `kace-sampler` process that stops with its guard.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use kace_e2e::{kace as setup, Cluster, JobInfo};
use kace_node::read_path::{decide_from_store, JobSpec, ReadPathDecision};
use kace_node::slurm_json::JsonJob;
use kace_selector::decision::Policy;
use kace_sql::Db;

/// GPU memory the tests configure (no NVML here).
pub const GPU_GIB: f64 = 32.0;

/// The profiles and pairs the tests train on: the repository's synthetic demo data, so a fresh
/// checkout runs every co-scheduling test.
pub struct TrainingData {
    pub profiles: PathBuf,
    pub pairs: PathBuf,
}

pub fn training_data() -> TrainingData {
    let dir = kace_e2e::demo::data_dir();
    TrainingData { profiles: dir.join("profiles.csv"), pairs: dir.join("pairs.csv") }
}

/// Runs `kace args` with the cluster's configuration; returns stdout, failing on error.
pub fn kace(c: &Cluster, args: &[&str]) -> String {
    let bin = setup::bin_dir().unwrap().join("kace");
    let out = Command::new(&bin)
        .args(args)
        .env("KACE_CONFIG", c.dir().join("etc/kace.conf"))
        .env("SLURM_CONF", c.conf())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "kace {args:?} failed: {}{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

pub fn json(c: &Cluster, args: &[&str]) -> serde_json::Value {
    let mut full = vec!["--format", "json"];
    full.extend_from_slice(args);
    serde_json::from_str(&kace(c, &full)).unwrap()
}

pub fn field<'a>(j: &'a JobInfo, k: &str) -> &'a str {
    j.get(k).map(String::as_str).unwrap_or("")
}

/// A batch script that reports progress for `seconds` at `rate` steps per tick.
pub fn worker(seconds: u32, rate: u32) -> String {
    let ticks = seconds * 5;
    format!(
        "for i in $(seq 0 {ticks}); do echo \"$(date +%s.%N) $((i*{rate}))\" >> \"$KACE_PROGRESS_FILE\"; \
         sleep 0.2; done; echo GPUS=$SLURM_JOB_GPUS PIPE=$CUDA_MPS_PIPE_DIRECTORY"
    )
}

/// Writes the cluster's kace.conf and fake MPS control, and builds its database from the demo
/// data; returns the number of pairs the first model was trained on.
pub fn prepare(c: &Cluster, max_hold_s: u64) -> u64 {
    let dir = c.dir();
    std::fs::write(dir.join("etc/kace.conf"), setup::conf(dir, max_hold_s)).unwrap();
    let fake = dir.join("fake-mps");
    std::fs::write(&fake, setup::fake_mps_script(dir)).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let data = training_data();
    kace(c, &["db", "init"]);
    kace(c, &["profile", "import", data.profiles.to_str().unwrap()]);
    kace(c, &["observations", "import", data.pairs.to_str().unwrap()]);
    let first = json(c, &["train"]);
    first["metrics"]["fit_groups"].as_u64().unwrap()
        + first["metrics"]["holdout_groups"].as_u64().unwrap()
}

/// kace's own view of a job (state, node, allocation): `squeue --json` read by the parser the
/// prolog and dispatch use.
pub fn kace_view(c: &Cluster, id: u32) -> JsonJob {
    let out = c.run_ok("squeue", &["--json", "-j", &id.to_string()]).unwrap();
    let (jobs, _) = kace_node::slurm_json::jobs(&out).unwrap();
    jobs.into_iter().find(|j| j.id == id).unwrap_or_else(|| panic!("job {id} is not listed"))
}

/// The node and GPU indices a running job holds shards of, as kace reads them.
/// Read from `scontrol -o -d show job` with kace's detail reader: one job on every release
/// (`squeue --json` on 22.05 prints the whole queue whatever `-j` says: at 20 000 jobs it lost
/// the partner's allocation).
pub fn placement(c: &Cluster, id: u32) -> (String, Vec<u32>) {
    let text = c.run_ok("scontrol", &["-o", "-d", "show", "job", &id.to_string()]).unwrap();
    let node = text
        .split_whitespace()
        .find_map(|w| w.strip_prefix("NodeList="))
        .unwrap_or_default()
        .to_string();
    let gpus = kace_node::slurm::detail_gpus(&text, &node).unwrap();
    (node, gpus)
}

/// The complete profiles' workloads in `db`, sorted.
pub fn profiled_workloads(db: &Db) -> Vec<String> {
    let all = db.all_profiles(None).unwrap();
    let mut names: Vec<String> =
        all.keys().filter(|w| all[*w].complete().is_some()).cloned().collect();
    names.sort();
    names
}

/// The prolog's decision for `lead` among `others` (same user, the test GPU's memory).
pub fn decision(db: &Db, lead: &str, others: &[&String]) -> ReadPathDecision {
    let specs: Vec<JobSpec> = others.iter().map(|w| JobSpec::anyone(w)).collect();
    decide_from_store(
        db,
        &[JobSpec::anyone(lead)],
        &specs,
        &Policy::default(),
        Some(GPU_GIB),
        None,
        &[],
    )
    .unwrap()
}

/// The candidates of decision `d` (made among `others`) that passed every filter, with their
/// predictions, best first.
pub fn passing(d: &ReadPathDecision, others: &[&String]) -> Vec<(f64, String)> {
    let mut passing: Vec<(f64, String)> = d
        .selection
        .verdicts
        .iter()
        .zip(others)
        .filter(|(v, _)| v.rejection.is_none())
        .map(|(v, w)| (v.prediction.unwrap(), w.to_string()))
        .collect();
    passing.sort_by(|a, b| b.0.total_cmp(&a.0));
    passing
}

/// A lead workload and `k` candidates that pass every filter with it, best first.
pub fn lead_with_candidates(db_path: &Path, k: usize) -> (String, Vec<String>) {
    let db = Db::open_read_only(db_path).unwrap();
    let names = profiled_workloads(&db);
    for lead in &names {
        let others: Vec<&String> = names.iter().filter(|w| *w != lead).collect();
        let passing = passing(&decision(&db, lead, &others), &others);
        if passing.len() >= k {
            return (lead.to_string(), passing.into_iter().take(k).map(|p| p.1).collect());
        }
    }
    panic!("no lead with {k} fitting candidates");
}

/// Cancels `ids` and waits (up to `timeout`) until none is pending or running, reading states as
/// kace does (the harness's `scontrol show job` text would be fooled by forged comments).
pub fn cancel_and_wait(c: &Cluster, ids: &[u32], timeout: std::time::Duration) {
    if ids.is_empty() {
        return;
    }
    let list: Vec<String> = ids.iter().map(u32::to_string).collect();
    let mut args = vec!["--quiet"];
    args.extend(list.iter().map(String::as_str));
    let _ = c.run("scancel", &args);
    let deadline = std::time::Instant::now() + timeout;
    while std::time::Instant::now() < deadline {
        let Ok(out) = c.run_ok("squeue", &["--json"]) else { break };
        let Ok((jobs, _)) = kace_node::slurm_json::jobs(&out) else { break };
        let active = jobs.iter().any(|j| {
            ids.contains(&j.id)
                && matches!(j.state.as_str(), "PENDING" | "RUNNING" | "CONFIGURING" | "COMPLETING")
        });
        if !active {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// kace's Slurm commands for a test cluster's own Slurm programs, `timeout` per call and no
/// deadline. They find the cluster through `SLURM_CONF`, as the hooks do: the caller sets it.
pub fn commands(
    slurm: &kace_e2e::SlurmInstall,
    timeout: std::time::Duration,
) -> kace_node::slurm::Commands {
    kace_node::slurm::Commands {
        scontrol: slurm.program("scontrol"),
        squeue: slurm.program("squeue"),
        sinfo: slurm.program("sinfo"),
        timeout,
        deadline: None,
        logger: kace_log::Logger::new(None),
        counts: Default::default(),
    }
}

/// The `p` quantile (0–1, nearest rank) of `v`, sorted in place; NaN when empty.
pub fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(((v.len().max(1) - 1) as f64 * p).round() as usize).copied().unwrap_or(f64::NAN)
}

/// The environment variable `name` as a count (a bench or scale size), or `default`.
pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}
