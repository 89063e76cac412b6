//! The re-audit's attacks that live on a node, end to end on a real Slurm cluster with the real
//! plugin, prolog, epilog and `kace-sampler` (issue "trust only what kace can check"):
//!
//! - M4: a job hard-links its progress file into a directory it may write and appends through
//!   the link; the sampler, running without NVML as on a node whose driver it cannot read,
//!   still caps the file its prolog created (by the inode the prolog recorded).
//! - H1 over two nights: one user's forged pairs (spooled as the epilog writes them) and live
//!   kace jobs reporting forged rates, then the nightly `kace retrain` each night: the
//!   decisions for every other user's jobs stay as they were.

mod common;

use std::time::Duration;

use common::{field, json, kace};
use kace_e2e::{kace as setup, Cluster, NodeSpec};

/// One node with one fake GPU, the real plugin, prolog, epilog and decider hooks, and kace set
/// up with the demo's data (`max_hold` 1 s).
fn kace_cluster() -> Cluster {
    let c = Cluster::builder()
        .nodes(vec![NodeSpec::new("n1", 1)])
        .plugin_args("mps_root={dir}/mps progress_root={dir}/progress")
        .prolog(setup::hook("kace-prolog", "").unwrap())
        .epilog(setup::hook("kace-epilog", "").unwrap())
        .prolog_slurmctld(setup::hook("kace-dispatch", "").unwrap())
        .epilog_slurmctld(setup::hook("kace-dispatch", "").unwrap())
        .start()
        .unwrap();
    common::prepare(&c, 1);
    c
}

/// Appends progress lines to the file named by its argument as fast as it can for 6 s (about
/// 20 MB here; the re-audit wrote 40 MB/s), then prints how many.
const APPEND: &str = "import sys, time\n\
f = open(sys.argv[1], 'a')\n\
t0 = time.time()\n\
n = 0\n\
while time.time() - t0 < 6:\n    \
f.write(''.join(f'{time.time():.6f} {n + i}\\n' for i in range(2000)))\n    \
f.flush()\n    \
n += 2000\n    \
time.sleep(0.01)\n\
print('LINES', n)\n";

/// The cap in these tests: the smallest `sampler.progress_max_bytes` allows.
const CAP: u64 = 65_536;

#[test]
#[ignore = "needs root and Slurm"]
fn a_hard_linked_progress_file_is_capped_by_a_sampler_without_nvml() {
    kace_e2e::require_e2e("a_hard_linked_progress_file_is_capped_by_a_sampler_without_nvml");
    let c = kace_cluster();
    let dir = c.dir().to_path_buf();
    let conf = dir.join("etc/kace.conf");
    let mut text = std::fs::read_to_string(&conf).unwrap();
    text.push_str(&format!(
        "[sampler]\ndir = \"{}/samples\"\ninterval_ms = 200\ncapacity = 100\n\
         progress_max_bytes = {CAP}\n",
        dir.display()
    ));
    std::fs::write(&conf, text).unwrap();
    // A directory anyone may write, on the progress root's file system (as /tmp is on many
    // nodes): where the job puts its second link.
    let public = dir.join("public");
    std::fs::create_dir_all(&public).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&public, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let log = dir.join("log/kace-sampler.log");
    // No KACE_FAKE_NVML: this machine has no NVML, so the sampler only caps.
    let _sampler = setup::start_sampler(&conf, None, &log).unwrap();

    let (lead_w, _) = common::lead_with_candidates(&dir.join("kace.db"), 1);
    // Appends through the link ([`APPEND`]; the rate only changes how far past the cap one
    // interval's lines go), then gives the sampler up to 10 s to catch up (a debug build on a
    // loaded machine thins a few MB slowly) and reports the file's disk use and links as the
    // job sees them.
    let script = format!(
        "ln \"$KACE_PROGRESS_FILE\" {pub}/link-$SLURM_JOB_ID || exit 3\n\
         python3 - {pub}/link-$SLURM_JOB_ID <<'EOF'\n{APPEND}EOF\n\
         for i in $(seq 50); do [ $(stat -c %b \"$KACE_PROGRESS_FILE\") -lt 2048 ] && break; sleep 0.2; done\n\
         echo LINKS=$(stat -c %h \"$KACE_PROGRESS_FILE\") BLOCKS=$(stat -c %b \"$KACE_PROGRESS_FILE\")\n",
        pub = public.display()
    );
    let opt = format!("--kace-colocate={lead_w}");
    let id = c.sbatch(&[&opt, "--gres=shard:1", "--wrap", &script]).unwrap();
    wait_ended(&c, &[id]);
    let out = c.job_output(id);
    assert_eq!(field(&c.job(id).unwrap(), "JobState"), "COMPLETED", "{out}");
    let lines: u64 = out
        .lines()
        .find_map(|l| l.strip_prefix("LINES "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no line count: {out}"));
    let blocks: u64 = out
        .lines()
        .find_map(|l| l.split("BLOCKS=").nth(1))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no block count: {out}"));
    assert!(out.contains("LINKS=2"), "the job's link was made: {out}");
    // The job wrote at least 20 bytes a line; what stays on disk (512-byte blocks, which a
    // punched hole frees on file systems that cannot collapse) is the cap plus what the
    // last interval appended, far below what was written.
    let written = lines * 20;
    let on_disk = blocks * 512;
    assert!(written > 4 << 20, "the job wrote too little to test the cap: {written}");
    assert!(on_disk < 1 << 20, "{on_disk} bytes on disk after {written} written: {out}");
    let sampler_log = std::fs::read_to_string(&log).unwrap();
    assert!(sampler_log.contains("capping progress files only"), "{sampler_log}");
    assert!(sampler_log.contains(&format!("job {id}: compacted")), "{sampler_log}");
    assert!(!sampler_log.contains("couldn't cap"), "{sampler_log}");
    // The epilog removed the file and its recorded identity; the job's own link remains
    // (the user's, in the user's directory).
    assert!(!dir.join(format!("progress/{id}.progress")).exists());
    assert!(!dir.join(format!("progress/{id}.progress.id")).exists());
    assert!(public.join(format!("link-{id}")).exists());
}

/// `nobody`'s uid and gid on Debian.
const NOBODY: u32 = 65534;

/// Waits until `ids` have ended, running the controller's timer meanwhile.
fn wait_ended(c: &Cluster, ids: &[u32]) {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while ids.iter().any(|id| {
        let j = c.job(*id).unwrap();
        matches!(field(&j, "JobState"), "PENDING" | "RUNNING" | "CONFIGURING" | "COMPLETING")
    }) {
        assert!(std::time::Instant::now() < deadline, "jobs {ids:?} did not end");
        kace(c, &["dispatch"]);
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
#[ignore = "needs root and Slurm"]
fn one_users_forged_pairs_over_two_nights_change_no_other_users_decisions() {
    kace_e2e::require_e2e("one_users_forged_pairs_over_two_nights_change_no_other_users_decisions");
    let c = kace_cluster();
    let dir = c.dir().to_path_buf();
    let db_path = dir.join("kace.db");
    let (lead, cands) = common::lead_with_candidates(&db_path, 3);
    let target = cands.last().unwrap().clone();
    let exclusive =
        kace_sql::Db::open_read_only(&db_path).unwrap().exclusive_throughputs().unwrap();
    let (xl, xt) = (exclusive[&lead], exclusive[&target]);
    let mut others: Vec<&str> = cands.iter().map(String::as_str).collect();
    others.push(&lead);
    let list = others.join(",");
    // What every other user's job would get beside `lead`: the choice and every prediction.
    let decisions = || {
        let d = json(
            &c,
            &["select", "--dry-run", "--lead", &lead, "--candidates", &list, "--gpu-memory", "32"],
        );
        // The choice, and the candidates that pass in the order of their predictions.
        let mut passing: Vec<(f64, String)> = d["candidates"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["rejected"].is_null())
            .filter_map(|c| Some((c["prediction"].as_f64()?, c["workload"].as_str()?.to_string())))
            .collect();
        passing.sort_by(|a, b| b.0.total_cmp(&a.0));
        (d["chosen"].clone(), passing.into_iter().map(|p| p.1).collect::<Vec<_>>())
    };
    let active = || {
        let models = json(&c, &["model", "list"]);
        let a: Vec<_> =
            models.as_array().unwrap().iter().filter(|m| m["active"] == true).cloned().collect();
        assert_eq!(a.len(), 1, "{models}");
        a[0]["version"].clone()
    };
    let before = decisions();
    let first_model = active();

    let out_opt = format!("--output={}/out/%j.out", dir.display());
    let chdir = format!("--chdir={}/work", dir.display());
    let spool = dir.join("kace-spool");
    let now =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    for night in 0..2u32 {
        // Live: two of nobody's kace jobs report 3.9 times the admin's exclusive rate.
        let mut ids = Vec::new();
        for (w, rate) in [(&lead, 3.9 * xl), (&target, 3.9 * xt)] {
            use std::os::unix::process::CommandExt;
            let opt = format!("--kace-colocate={w}");
            let script = common::worker(6, (rate / 5.0).ceil() as u32);
            let out = c
                .command("sbatch")
                .uid(NOBODY)
                .gid(NOBODY)
                .env("HOME", "/nonexistent")
                .args(["--parsable", &out_opt, &chdir, &opt, "--gres=shard:1", "--wrap", &script])
                .output()
                .unwrap();
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            ids.push(kace_e2e::parse_job_id(&String::from_utf8_lossy(&out.stdout)).unwrap());
        }
        wait_ended(&c, &ids);
        // Spooled: 20 forged pairs of `lead` and `target` at 3.9 times each one's exclusive
        // throughput (inside the 4x bound), as nobody's epilogs would write them.
        let day = now - f64::from(1 - night) * 86_400.0;
        for i in 0..20u32 {
            let (a, b) = (
                format!("{}", 90_000 + night * 100 + 2 * i),
                format!("{}", 90_001 + night * 100 + 2 * i),
            );
            for (job, w, other, ow, thr) in
                [(&a, &lead, &b, &target, 3.9 * xl), (&b, &target, &a, &lead, 3.9 * xt)]
            {
                let o = kace_sql::Observation {
                    key: format!("c/{job}/{}/0", day as u64),
                    job: job.clone(),
                    workload: w.clone(),
                    partners: vec![kace_sql::Partner { job: other.clone(), workload: ow.clone() }],
                    node: "n1".into(),
                    gpu: "0".into(),
                    mps_share: None,
                    start: day - 200.0,
                    end: day - 100.0,
                    steps: Some(thr * 100.0),
                    throughput: thr,
                    user: Some("nobody".into()),
                    account: None,
                    gpu_sm_pct: None,
                    gpu_energy_j: None,
                };
                kace_sql::spool::write_record(&spool, &o).unwrap();
            }
        }
        let out = kace(&c, &["retrain"]);
        assert!(out.contains("ingested"), "night {night}: {out}");
        // A model trained beside the forged pairs is activated only when it is no worse on
        // the admin's trusted reference (the forged pairs weigh as one merged group of one
        // user, with no correction of its own: uncorroborated); whatever the nightly retrain
        // activated, every other user's choice beside the lead, and the order of the
        // candidates, stay as they were.
        assert!(
            out.contains("trusted group(s)") || out.contains("model unchanged"),
            "night {night}: no comparison on the trusted reference: {out}"
        );
        assert_eq!(decisions(), before, "night {night}: {out}");
    }
    let now_active = active();
    assert!(now_active.as_u64() >= first_model.as_u64());
    // Nothing was lost: nobody's 80 spooled observations are in the database.
    let db = kace_sql::Db::open_read_only(&db_path).unwrap();
    let forged = db.observations().unwrap().into_iter().filter(|o| o.job.starts_with("90")).count();
    assert_eq!(forged, 80);
}

/// The re-audit's M2 and L7 with the job's own clock stepped (libfaketime on the job's progress
/// writer only, a day ahead): its lines lie outside its run by the node's clock, so it is not
/// observed and the epilog says it is the clock; the next job on that GPU is observed alone, as
/// it ran, with no phantom partner.
#[test]
#[ignore = "needs root and Slurm"]
fn a_job_whose_clock_is_a_day_ahead_is_not_observed_and_poisons_nothing() {
    kace_e2e::require_e2e("a_job_whose_clock_is_a_day_ahead_is_not_observed_and_poisons_nothing");
    let c = kace_cluster();
    let dir = c.dir().to_path_buf();
    let (lead, _) = common::lead_with_candidates(&dir.join("kace.db"), 1);
    let opt = format!("--kace-colocate={lead}");
    let ahead = format!("faketime -f +1d sh -c '{}'", common::worker(6, 2).replace('\'', "'\\''"));
    let skewed = c.sbatch(&[&opt, "--gres=shard:1", "--wrap", &ahead]).unwrap();
    wait_ended(&c, &[skewed]);
    let plain = c.sbatch(&[&opt, "--gres=shard:1", "--wrap", &common::worker(6, 2)]).unwrap();
    wait_ended(&c, &[plain]);
    for id in [skewed, plain] {
        assert_eq!(field(&c.job(id).unwrap(), "JobState"), "COMPLETED", "{}", c.job_output(id));
    }
    let log = std::fs::read_to_string(dir.join("log/kace-kace-epilog.log")).unwrap();
    assert!(
        log.contains(&format!(
            "job {skewed}: its 31 progress line(s) lie outside its run by this node's clock"
        )),
        "{log}"
    );
    assert!(!log.contains(&format!("job {skewed}: too few progress lines")), "{log}");
    json(&c, &["ingest"]);
    let db = kace_sql::Db::open_read_only(&dir.join("kace.db")).unwrap();
    let all = db.observations().unwrap();
    assert!(all.iter().all(|o| o.job != skewed.to_string()), "{all:#?}");
    let mine: Vec<_> = all.iter().filter(|o| o.job == plain.to_string()).collect();
    assert!(!mine.is_empty() && mine.iter().all(|o| o.partners.is_empty()), "{mine:#?}\n{log}");
    assert!(mine.iter().all(|o| (o.throughput - 10.0).abs() < 0.5), "{mine:#?}");
}
