//! Shared by the co-scheduling tests: the artifact's location, running `kace` against a test
//! cluster, a progress-writing job script, and a cluster's kace setup (config, fake MPS
//! control, a database with the artifact's profiles and a model trained on its pairs).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use kace_e2e::{kace as setup, Cluster, JobInfo};
use kace_selector::decision::Policy;
use kace_sql::decide::{decide, Decision, JobSpec};
use kace_sql::Db;

/// GPU memory the tests configure (no NVML here), as the artifact's V100.
pub const GPU_GIB: f64 = 32.0;

pub fn artifact() -> Option<PathBuf> {
    let dir = kace_test_support::artifact_dir();
    if dir.join("pairs").is_dir() {
        Some(dir)
    } else {
        eprintln!("SKIPPED: the KACE artifact is not at {} (set KACE_ARTIFACT_DIR)", dir.display());
        None
    }
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

/// Writes the cluster's kace.conf and fake MPS control, and builds its database from the
/// artifact; returns the number of pairs the first model was trained on.
pub fn prepare(c: &Cluster, art: &Path, max_hold_s: u64) -> u64 {
    let dir = c.dir();
    std::fs::write(dir.join("etc/kace.conf"), setup::conf(dir, max_hold_s)).unwrap();
    let fake = dir.join("fake-mps");
    std::fs::write(&fake, setup::fake_mps_script(dir)).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    kace(c, &["db", "init"]);
    let profiles = art.join("workload_profiles/derived_workload_profiles.csv");
    kace(c, &["profile", "import", profiles.to_str().unwrap()]);
    let pairs = art.join("pairs/MPS100_kernel_labels_targetMPS100.csv");
    kace(c, &["observations", "import", pairs.to_str().unwrap()]);
    let first = json(c, &["train"]);
    first["metrics"]["fit_groups"].as_u64().unwrap()
        + first["metrics"]["holdout_groups"].as_u64().unwrap()
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
pub fn decision(db: &Db, lead: &str, others: &[&String]) -> Decision {
    let specs: Vec<JobSpec> = others.iter().map(|w| JobSpec::anyone(w)).collect();
    decide(db, &[JobSpec::anyone(lead)], &specs, &Policy::default(), Some(GPU_GIB), None).unwrap()
}

/// The candidates of decision `d` (made among `others`) that passed every filter, with their
/// predictions, best first.
pub fn passing(d: &Decision, others: &[&String]) -> Vec<(f64, String)> {
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
