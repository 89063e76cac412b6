//! Two deciders moving the same held job (the load test's race: dispatch released a job while
//! an epilog that had seen it held a moment before retargeted it). Slurm 22.05's scheduler
//! cannot take a second retarget of a typed request (clear, then set): the job stayed pending for
//! ever ("job_spec lacks GRES counter"), and slurmctld's scheduler crashed with a divide error
//! when the job had been released meanwhile. The second decider now finds the job taken and
//! leaves it where the first one sent it.

mod common;

use std::time::Duration;

use kace_e2e::{Cluster, NodeSpec};
use kace_node::slurm::{Slurm, Target};

#[test]
#[ignore = "needs root and Slurm"]
fn retargeting_a_job_another_decider_released_keeps_slurmctld_up() {
    let test = "retargeting_a_job_another_decider_released_keeps_slurmctld_up";
    kace_e2e::require_e2e(test);
    let c = Cluster::builder()
        .nodes(vec![NodeSpec::new("n1", 2).shards_per_gpu(2)])
        .typed_gpus(true)
        .start()
        .unwrap();
    // kace's commands reach this cluster through SLURM_CONF (the only test in this binary).
    std::env::set_var("SLURM_CONF", c.conf());
    let slurm = c.slurm();
    let commands = common::commands(slurm, Duration::from_secs(5));
    // GPU g1 is full, so a job sent there stays pending, released.
    let blocker = c.sbatch(&["--gres=shard:g1:2", "--wrap", "sleep 60"]).unwrap();
    c.wait_job(blocker, "running", Duration::from_secs(20), |j| {
        j.get("JobState").map(String::as_str) == Some("RUNNING")
    })
    .unwrap();
    let p = c.sbatch(&["--kace-colocate=bert", "--gres=shard:1", "--wrap", "sleep 1"]).unwrap();
    let g = |kind: &str| Target { node: "n1".into(), kind: Some(kind.into()) };
    // The first decider sends it to the full GPU and releases it.
    commands.pin(p, &g("g1"), 1, None, None).unwrap();
    commands.release(p).unwrap();
    std::thread::sleep(Duration::from_secs(1));
    let j = c.job(p).unwrap();
    assert_eq!(j.get("JobState").map(String::as_str), Some("PENDING"), "{j:?}");
    // The second, which saw it held before, would move it to the free GPU: it finds it taken.
    let second = commands.pin(p, &g("g0"), 1, None, None);
    assert!(matches!(second, Err(kace_node::Error::Taken { job, .. }) if job == p), "{second:?}");
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        c.slurmctld_running(),
        "slurmctld died: {}",
        c.slurmctld_log().lines().rev().take(10).collect::<Vec<_>>().join("\n")
    );
    // Where the first decider sent it, it runs once there is room.
    c.run_ok("scancel", &[&blocker.to_string()]).unwrap();
    let done = c.wait_done(p, Duration::from_secs(30)).unwrap();
    assert_eq!(done.get("JobState").map(String::as_str), Some("COMPLETED"), "{done:?}");
    let log = c.slurmctld_log();
    assert!(!log.contains("lacks GRES counter"), "{log}");
}
