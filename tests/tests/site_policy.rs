//! The site's Slurm policies on a real cluster (issue 29): two nodes of one typed fake GPU each
//! (2 shards), in partitions `pa` (n1, feature `fa`) and `pb` (n2, feature `fb`) beside the
//! default `debug` (both), the gate, the real prolog and epilog, the decider service with its
//! slurmctld nudges. Each kace job must run where its partition, `-w` and constraint let it;
//! `--exclude` is refused at submission with one line; a job kace cannot place (a `-w` of two
//! nodes) is handed back and runs; a job whose only node is drained is never pinned there and
//! goes to Slurm at `max_hold`, asking for the whole GPU, and runs once the node is back; a
//! requeued kace job is held again and unpinned instead of staying pinned to its old GPU; a
//! pair of jobs with `--time` gets its limits lengthened by what sharing costs; a GPU a plain
//! job holds is left to it; a maintenance reservation on a busy node is never pinned into.

mod common;

use std::time::{Duration, Instant};

use common::field;
use kace_e2e::{kace as setup, Cluster, NodeSpec};

const MAX_HOLD_S: u64 = 8;

fn wait_for(c: &Cluster, what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !done() {
        assert!(t0.elapsed() < limit, "{what} within {limit:?}\n{}", c.slurmctld_log());
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
#[ignore = "needs root and Slurm"]
fn kace_jobs_run_only_where_the_sites_policies_let_them() {
    let test = "kace_jobs_run_only_where_the_sites_policies_let_them";
    kace_e2e::require_e2e(test);
    let node = |n: &str, f: &str| NodeSpec::new(n, 1).shards_per_gpu(2).features(&[f]);
    let c = setup::with_nudges(
        Cluster::builder()
            .nodes(vec![node("n1", "fa"), node("n2", "fb")])
            .typed_gpus(true)
            .prolog(setup::hook("kace-prolog", "").unwrap())
            .epilog(setup::hook("kace-epilog", "").unwrap()),
    )
    .unwrap()
    .slurm_conf_line("MinJobAge=3600")
    .slurm_conf_line("PartitionName=pa Nodes=n1 MaxTime=INFINITE State=UP")
    .slurm_conf_line("PartitionName=pb Nodes=n2 MaxTime=INFINITE State=UP")
    .start()
    .unwrap();
    let dir = c.dir().to_path_buf();
    common::prepare(&c, MAX_HOLD_S);
    let mut watch = setup::watch(&dir, c.conf()).unwrap();
    let kace_job = |extra: &[&str], script: &str| {
        let mut args = vec!["--kace-colocate=bert-infer", "--gres=shard:1"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--wrap", script]);
        c.sbatch(&args)
    };
    let done = |id: u32| {
        let j = c.wait_done(id, Duration::from_secs(60)).unwrap();
        assert_eq!(field(&j, "JobState"), "COMPLETED", "{j:?}\n{}", c.slurmctld_log());
        j
    };

    // 1. Partitions, the user's own -w and constraints decide the node.
    let cases: [(&[&str], &str); 5] = [
        (&["-p", "pb"], "n2"),
        (&["-p", "pa"], "n1"),
        (&["-w", "n2"], "n2"),
        (&["-C", "fa"], "n1"),
        // An OR in the constraint (`|` is also the listing's delimiter).
        (&["-p", "pb", "-C", "fa|fb"], "n2"),
    ];
    for (extra, want) in cases {
        let id = kace_job(extra, "sleep 1").unwrap();
        let j = done(id);
        assert_eq!(field(&j, "NodeList"), want, "{extra:?}: {j:?}");
    }

    // 1b. A GPU a plain job holds is left to it: a kace job that may run on either node runs
    //     on the other at once, instead of being pinned behind the plain job to wait.
    let plain = c.sbatch(&["--gres=shard:2", "-w", "n1", "--wrap", "sleep 40"]).unwrap();
    wait_for(&c, "the plain job running", Duration::from_secs(30), || {
        field(&c.job(plain).unwrap(), "JobState") == "RUNNING"
    });
    // Past the nodes the decider remembers (dispatch's NODES_FRESH_S, 5 s).
    std::thread::sleep(Duration::from_secs(6));
    let beside = kace_job(&[], "sleep 1").unwrap();
    assert_eq!(field(&done(beside), "NodeList"), "n2");
    assert_eq!(field(&c.job(plain).unwrap(), "JobState"), "RUNNING", "it did not wait for it");
    c.run_ok("scancel", &[&plain.to_string()]).unwrap();
    c.wait_done(plain, Duration::from_secs(30)).unwrap();

    // 2. --exclude cannot be honoured (22.05's squeue cannot show it): one line at submission.
    let refused = c
        .run(
            "sbatch",
            &["--kace-colocate=bert-infer", "--gres=shard:1", "-x", "n1", "--wrap", "true"],
        )
        .unwrap();
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && said.contains("--exclude"), "{said}");

    // 3. A job kace cannot place (it must span two nodes) goes back to Slurm, and runs.
    let both = kace_job(&["-N", "2", "-w", "n[1-2]"], "sleep 1").unwrap();
    done(both);

    // 4. A drained node is never pinned to; at max_hold the job goes to Slurm asking for the
    //    whole GPU, and runs once the node is back.
    c.run_ok("scontrol", &["update", "nodename=n1", "state=drain", "reason=maintenance"]).unwrap();
    // The decider reads the nodes at most every 5 s (dispatch's NODES_FRESH_S): a job released
    // onto a node drained since is held again once Slurm says ReqNodeNotAvail; here the drain
    // is older than that.
    std::thread::sleep(Duration::from_secs(6));
    let drained = kace_job(&["-p", "pa"], "sleep 1").unwrap();
    let t0 = Instant::now();
    wait_for(&c, "the hand-back at max_hold", Duration::from_secs(MAX_HOLD_S + 20), || {
        let j = c.job(drained).unwrap();
        assert!(field(&j, "ReqNodeList").is_empty() || field(&j, "ReqNodeList") == "(null)");
        field(&j, "Reason") != "JobHeldUser"
    });
    assert!(t0.elapsed() >= Duration::from_secs(MAX_HOLD_S - 2), "handed back before max_hold");
    let j = c.job(drained).unwrap();
    assert_eq!(field(&j, "JobState"), "PENDING", "{j:?}");
    let tres = field(&j, "TresPerNode");
    assert!(tres.ends_with("shard:2"), "asks for the whole GPU: {j:?}");
    c.run_ok("scontrol", &["update", "nodename=n1", "state=resume"]).unwrap();
    assert_eq!(field(&done(drained), "NodeList"), "n1");

    // 4b. A maintenance reservation on a busy node (state `mixed$`): no kace job is pinned
    //     there, not even beside the kace job running on it; at max_hold the job goes to Slurm,
    //     which starts it once the reservation is gone.
    let busy = kace_job(&["-p", "pa"], "sleep 30").unwrap();
    wait_for(&c, "the job on n1 running", Duration::from_secs(30), || {
        field(&c.job(busy).unwrap(), "JobState") == "RUNNING"
    });
    c.run_ok(
        "scontrol",
        &[
            "create",
            "reservation",
            "ReservationName=maint",
            "StartTime=now",
            "Duration=10",
            "Nodes=n1",
            "Flags=maint,ignore_jobs",
            "Users=root",
        ],
    )
    .unwrap();
    std::thread::sleep(Duration::from_secs(6)); // past the decider's remembered nodes
    let state = c.run_ok("sinfo", &["-h", "-n", "n1", "-o", "%T"]).unwrap();
    assert!(state.trim().ends_with('$') || state.contains("maint"), "n1 is {state}");
    let reserved = kace_job(&["-p", "pa"], "sleep 1").unwrap();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(MAX_HOLD_S + 6) {
        let j = c.job(reserved).unwrap();
        assert!(
            matches!(field(&j, "ReqNodeList"), "" | "(null)"),
            "pinned into the maintenance: {j:?}"
        );
        assert_eq!(field(&j, "JobState"), "PENDING", "{j:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
    c.run_ok("scontrol", &["delete", "reservation", "maint"]).unwrap();
    c.run_ok("scancel", &[&busy.to_string()]).unwrap();
    assert_eq!(field(&done(reserved), "NodeList"), "n1");

    // 5. A requeued kace job is held again and unpinned, not left pinned to its old GPU.
    let long = kace_job(&["-p", "pb"], "sleep 60").unwrap();
    wait_for(&c, "the long job running", Duration::from_secs(30), || {
        field(&c.job(long).unwrap(), "JobState") == "RUNNING"
    });
    c.run_ok("scontrol", &["requeue", &long.to_string()]).unwrap();
    wait_for(&c, "the requeued job held again", Duration::from_secs(30), || {
        let j = c.job(long).unwrap();
        field(&j, "JobState") == "PENDING"
            && field(&j, "Reason") == "JobHeldUser"
            && matches!(field(&j, "ReqNodeList"), "" | "(null)")
    });
    c.run_ok("scancel", &[&long.to_string()]).unwrap();

    // 6. Sharing must not kill a job at its time limit: a pair on n2 (the only GPU of `pb`)
    //    gets its limits lengthened by what sharing is predicted to cost.
    let (lead_w, partner_w) = {
        let db = kace_sql::Db::open_read_only(&dir.join("kace.db")).unwrap();
        let names = common::profiled_workloads(&db);
        names
            .iter()
            .find_map(|lead| {
                let others: Vec<&String> = names.iter().filter(|w| *w != lead).collect();
                let d = common::decision(&db, lead, &others);
                common::passing(&d, &others).first().map(|(_, p)| (lead.clone(), p.clone()))
            })
            .expect("a pair the model accepts")
    };
    let timed = |w: &str| {
        let opt = format!("--kace-colocate={w}");
        c.sbatch(&[&opt, "--gres=shard:1", "-p", "pb", "--time=10", "--wrap", "sleep 20"]).unwrap()
    };
    let lead = timed(&lead_w);
    wait_for(&c, "the timed lead running", Duration::from_secs(30), || {
        field(&c.job(lead).unwrap(), "JobState") == "RUNNING"
    });
    let partner = timed(&partner_w);
    wait_for(&c, "the partner running beside it", Duration::from_secs(30), || {
        field(&c.job(partner).unwrap(), "JobState") == "RUNNING"
    });
    for id in [lead, partner] {
        let j = c.job(id).unwrap();
        assert_eq!(field(&j, "NodeList"), "n2", "{j:?}");
        // `TimeLimit=00:10:00` as submitted; longer (and at most twice) once lengthened.
        let limit = kace_node::slurm::parse_duration(field(&j, "TimeLimit")).unwrap();
        assert!(limit > 600.0 && limit <= 1200.0, "job {id}'s time limit {limit} s: {j:?}");
    }
    done(lead);
    done(partner);

    let _ = watch.kill();
    let _ = watch.wait();
    let log = std::fs::read_to_string(dir.join("dispatch-watch.out")).unwrap_or_default()
        + &std::fs::read_to_string(dir.join("log/kace-kace-dispatch.log")).unwrap_or_default();
    assert!(log.contains(&format!("handed job {both} back to Slurm")), "{log}");
    assert!(log.contains(&format!("handed job {drained} back to Slurm")), "{log}");
    assert!(log.contains(&format!("held job {long} again")), "{log}");
    assert!(log.contains(&format!("lengthened job {partner}'s time limit from 10 to")), "{log}");
    // Recorded for `kace explain`.
    common::kace(&c, &["ingest"]);
    let why = common::kace(&c, &["explain", &drained.to_string()]);
    assert!(why.contains("to Slurm, unpinned"), "{why}");
}
