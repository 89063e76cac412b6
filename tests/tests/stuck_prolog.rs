//! A kace job whose node's slurmd is killed during its prolog (two nodes with two typed fake
//! GPUs each; the real kace-prolog, kace-epilog and `kace dispatch`).
//!
//! Slurm leaves such a batch job "running, reason Prolog" until an admin requeues it:
//! slurmctld waits for the prolog-complete message the killed slurmd never sends, and its
//! check for jobs missing from a node skips jobs in their prolog (`_foreach_purge_missing_jobs`,
//! 26.05.3). The decider waits for no hook (an earlier design waited for deciding prologs and
//! once held 127 kace jobs for 8 minutes behind two such jobs); once a job has been starting
//! longer than a hook runs (`node.prolog_budget_ms` + 30 s) it counts as stuck.
//!
//! Asserted: the prolog, which outlived its slurmd, recorded the job as its GPU's lead; Slurm
//! left the job starting; a decider pass after the stuck window released the held kace job as
//! a lead onto a free GPU, not beside the stuck job, and named the stuck job with the way out;
//! that lead ran to completion; requeued by the admin, the stuck job's epilog ended kace's
//! record of it on its GPU, and the decider no longer names it.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{field, worker};
use kace_e2e::{kace as setup, Cluster, NodeSpec};

/// A Slurm command kace runs (`squeue`, `scontrol`): the real one, 1.5 s late (and marked as
/// called) while `{dir}/slow-squeue` exists, so that the test can kill slurmd while the prolog
/// reads its job (with squeue on 22.05, scontrol --json from 23.02 on).
fn slow_read(dir: &Path, real: &Path) -> String {
    let d = dir.display();
    format!(
        "#!/bin/bash\nif [ -e {d}/slow-squeue ]; then touch {d}/in-squeue; sleep 1.5; fi\nexec {} \"$@\"\n",
        real.display()
    )
}

fn squeue_line(c: &Cluster, id: u32) -> String {
    c.run_ok("squeue", &["-h", "-t", "all", "-j", &id.to_string(), "-o", "%t|%r|%S"])
        .unwrap_or_default()
        .trim()
        .to_string()
}

#[test]
#[ignore = "needs root and Slurm"]
fn a_job_stuck_in_its_prolog_by_a_slurmd_crash_holds_no_other_kace_job() {
    let test = "a_job_stuck_in_its_prolog_by_a_slurmd_crash_holds_no_other_kace_job";
    kace_e2e::require_e2e(test);
    let mut c = Cluster::builder()
        .nodes(vec![NodeSpec::new("n1", 2), NodeSpec::new("n2", 2)])
        .typed_gpus(true)
        .prolog(setup::hook("kace-prolog", "").unwrap())
        .epilog(setup::hook("kace-epilog", "").unwrap())
        .start()
        .unwrap();
    let dir = c.dir().to_path_buf();
    common::prepare(&c, 600);
    // The tests' configuration gives the hooks 5 s (`prolog_budget_ms = 5000`).
    let window = 5.0 + kace_node::slurm::HOOK_LAUNCH_SLACK_S;
    // No decider runs on its own here (no PrologSlurmctld): the test passes by hand.
    let (stuck_w, others) = common::lead_with_candidates(&dir.join("kace.db"), 1);

    let conf_path = dir.join("etc/kace.conf");
    let mut conf = std::fs::read_to_string(&conf_path).unwrap();
    for program in ["squeue", "scontrol"] {
        let wrapper = dir.join(format!("slow-{program}-wrapper"));
        std::fs::write(&wrapper, slow_read(&dir, &c.slurm().program(program))).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
        conf = conf.replace(
            &format!("{program} = \"{}\"", c.slurm().program(program).display()),
            &format!("{program} = \"{}\"", wrapper.display()),
        );
        assert!(conf.contains(&format!("slow-{program}-wrapper")), "{conf}");
    }
    std::fs::write(&conf_path, conf).unwrap();

    // A kace job waiting for a partner, held by the gate: the one the stuck job's prolog picks.
    let opt = format!("--kace-colocate={}", others[0]);
    let waiting = c.sbatch(&[&opt, "--gres=shard:1", "--wrap", &worker(3, 10)]).unwrap();
    c.wait_job(waiting, "held by the gate", Duration::from_secs(10), |j| {
        field(j, "Reason") == "JobHeldUser"
    })
    .unwrap();

    // The stuck job: released onto n2's GPU 0 as the decider would; n2's slurmd killed while
    // its prolog reads the job from Slurm.
    std::fs::write(dir.join("slow-squeue"), "").unwrap();
    let opt = format!("--kace-colocate={stuck_w}");
    let stuck =
        c.sbatch(&[&opt, "--gres=shard:g0:1", "-w", "n2", "--wrap", &worker(3, 10)]).unwrap();
    c.run_ok("scontrol", &["release", &stuck.to_string()]).unwrap();
    let t0 = Instant::now();
    while !dir.join("in-squeue").exists() {
        assert!(t0.elapsed() < Duration::from_secs(30), "job {stuck}'s prolog never listed");
        std::thread::sleep(Duration::from_millis(20));
    }
    c.kill_slurmd("n2");
    std::fs::remove_file(dir.join("slow-squeue")).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    c.start_slurmd("n2").unwrap();

    // The prolog outlives the killed slurmd: it records the job as the lead on its GPU.
    // Nothing tells Slurm it ended.
    let prologs =
        || std::fs::read_to_string(dir.join("log/kace-kace-prolog.log")).unwrap_or_default();
    let t0 = Instant::now();
    while !prologs().contains(&format!("kace: prolog: job {stuck}: lead")) {
        assert!(t0.elapsed() < Duration::from_secs(30), "job {stuck}'s prolog: {}", prologs());
        std::thread::sleep(Duration::from_millis(200));
    }
    let j = c.job(waiting).unwrap();
    assert_eq!(field(&j, "Reason"), "JobHeldUser", "{j:?}");

    // A decider pass once the job counts as stuck.
    let started = {
        let line = squeue_line(&c, stuck);
        let start = line.rsplit('|').next().unwrap_or("");
        kace_node::slurm::parse_utc(start).unwrap_or_else(|| panic!("job {stuck}: {line:?}"))
    };
    let now = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    while now().as_secs_f64() < started + window + 1.0 {
        std::thread::sleep(Duration::from_millis(250));
    }
    let line = squeue_line(&c, stuck);
    assert!(
        line.starts_with("R|Prolog|") || line.starts_with("CF|"),
        "Slurm no longer shows job {stuck} starting ({line}): the behaviour under test changed"
    );
    let released = common::json(&c, &["dispatch"]);
    let lead = &released["leads"][0];
    assert_eq!(lead["job"].as_u64(), Some(u64::from(waiting)), "{released:#}");
    assert!(
        !(lead["node"] == "n2" && lead["gpu"] == 0),
        "released onto the stuck job's GPU: {released:#}"
    );
    let stuck_said = &released["stuck"][0];
    assert_eq!(stuck_said["job"].as_u64(), Some(u64::from(stuck)), "{released:#}");
    assert_eq!(stuck_said["state"], "starting", "{released:#}");
    let done = c.wait_done(waiting, Duration::from_secs(60)).unwrap();
    assert_eq!(field(&done, "JobState"), "COMPLETED", "{done:?}");

    // The admin's way out: requeued, its epilog ends kace's record of it on n2's GPU 0.
    c.run_ok("scontrol", &["requeue", &stuck.to_string()]).unwrap();
    c.wait_job(stuck, "requeued", Duration::from_secs(30), |j| field(j, "JobState") == "PENDING")
        .unwrap();
    let t0 = Instant::now();
    let open_records = || {
        setup::gpu_records(&dir.join("state"))
            .into_iter()
            .filter(|r| r.job == stuck && r.end.is_infinite())
            .map(|r| r.at)
            .collect::<Vec<_>>()
    };
    while !open_records().is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "job {stuck} still recorded on {:?} after its requeue",
            open_records()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = common::json(&c, &["dispatch"]);
    assert_eq!(out["stuck"], serde_json::json!([]), "{out:#}");
    // Slurm would start it again after its begin time (about 2 minutes); not waited for here.
    let _ = c.run("scancel", &[&stuck.to_string()]);
    c.wait_done(stuck, Duration::from_secs(30)).unwrap();
}
