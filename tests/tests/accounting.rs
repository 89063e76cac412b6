//! Slurm's priority order with accounting on (issue 29): a cluster with its own MariaDB and
//! slurmdbd, `AccountingStorageEnforce=associations,limits,qos`, multifactor priority with
//! fair-share, two users in two accounts (`daemon` in `heavy`, Fairshare=1, with prior usage;
//! `bin` in `light`, Fairshare=9). One node, one typed GPU of 2 shards.
//!
//! The same burst is run twice behind a blocker holding the whole GPU: plain shard jobs (Slurm
//! alone), then kace jobs (gate, decider, `selection.priority_window = 1`). kace must start the
//! light user's jobs before the heavy user's, as Slurm does, and its estimate of each pending
//! job's priority must be Slurm's own. Prints the fair-share table (each user's median wait).

mod common;

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::time::{Duration, Instant};

use common::field;
use kace_e2e::{kace as setup, Cluster, NodeSpec};
use kace_node::slurm::{QueuedJob, Slurm};

const HEAVY: (u32, &str) = (1, "daemon");
// Not `nobody`: 26.05 never resolves that name to a uid (src/common/uid.h, SLURM_AUTH_NOBODY_NAME),
// so its association matches no job and sbatch says "Invalid account".
const LIGHT: (u32, &str) = (2, "bin");
const MAX_HOLD_S: u64 = 600;

/// One accounting cluster at a time: each runs MariaDB, slurmdbd and slurmctld, and two on
/// two cores slowed `scontrol show config` past its 10 s timeout.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn wait_for(c: &Cluster, what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !done() {
        assert!(t0.elapsed() < limit, "{what} within {limit:?}\n{}", c.slurmctld_log());
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// One node with `gpus` typed GPUs of 2 shards each, the kace hooks and nudges, accounting
/// set up by the `sacctmgr` commands `setup`, jobs kept an hour after they end.
fn accounting_cluster(gpus: u32, setup: &[&str]) -> kace_e2e::ClusterBuilder {
    setup::with_nudges(
        Cluster::builder()
            .nodes(vec![NodeSpec::new("n1", gpus).shards_per_gpu(2)])
            .typed_gpus(true)
            .prolog(setup::hook("kace-prolog", "").unwrap())
            .epilog(setup::hook("kace-epilog", "").unwrap()),
    )
    .unwrap()
    .accounting(setup)
    .slurm_conf_line("MinJobAge=3600")
}

/// `sbatch` as `uid`; returns the job id.
fn submit(c: &Cluster, uid: u32, args: &[&str]) -> u32 {
    let out_opt = format!("--output={}/out/%j.out", c.dir().display());
    let chdir = format!("--chdir={}/work", c.dir().display());
    let out = c
        .command("sbatch")
        .uid(uid)
        .gid(uid)
        .env("HOME", "/nonexistent")
        .args(["--parsable", &out_opt, &chdir])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "sbatch {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    kace_e2e::parse_job_id(&String::from_utf8_lossy(&out.stdout)).unwrap()
}

/// The fair-share factor `sshare` gives `user`.
fn fair_share(c: &Cluster, user: &str) -> f64 {
    let out = c.run_ok("sshare", &["-n", "-P", "-a", "-o", "User,FairShare"]).unwrap();
    out.lines()
        .filter_map(|l| l.split_once('|'))
        .find(|(u, _)| *u == user)
        .and_then(|(_, f)| f.parse().ok())
        .unwrap_or(f64::NAN)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Start − submit of each finished job, by user.
fn waits(c: &Cluster, jobs: &[(u32, &str)]) -> BTreeMap<String, Vec<f64>> {
    let mut by_user: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for (id, user) in jobs {
        let j = c.wait_done(*id, Duration::from_secs(120)).unwrap();
        assert_eq!(field(&j, "JobState"), "COMPLETED", "{j:?}\n{}", c.slurmctld_log());
        let t = |k: &str| kace_node::slurm::parse_utc(field(&j, k)).unwrap();
        by_user.entry(user.to_string()).or_default().push(t("StartTime") - t("SubmitTime"));
    }
    by_user
}

/// What the decider service printed (`kace dispatch --watch`'s stdout and stderr).
fn decider_log(dir: &std::path::Path) -> String {
    ["dispatch-watch.out", "dispatch-watch.err"]
        .map(|f| std::fs::read_to_string(dir.join(f)).unwrap_or_default())
        .join("")
}

fn start_of(c: &Cluster, id: u32) -> f64 {
    kace_node::slurm::parse_utc(field(&c.job(id).unwrap(), "StartTime")).unwrap()
}

#[test]
#[ignore = "needs root, Slurm, slurmdbd and MariaDB"]
fn kace_starts_jobs_in_slurms_fair_share_order() {
    let test = "kace_starts_jobs_in_slurms_fair_share_order";
    kace_e2e::require_e2e(test);
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let c = accounting_cluster(
        1,
        &[
            "add account heavy Fairshare=1",
            "add account light Fairshare=9",
            "add user daemon Account=heavy",
            "add user bin Account=light",
        ],
    )
    .slurm_conf_line("PriorityType=priority/multifactor")
    .slurm_conf_line("PriorityWeightFairshare=100000")
    .slurm_conf_line("PriorityWeightAge=1000")
    .slurm_conf_line("PriorityMaxAge=1-0")
    .slurm_conf_line("PriorityWeightQOS=10000")
    .slurm_conf_line("PriorityCalcPeriod=1")
    .slurm_conf_line("PriorityDecayHalfLife=7-0")
    .start()
    .unwrap();
    let dir = c.dir().to_path_buf();
    common::prepare(&c, MAX_HOLD_S);
    let conf = dir.join("etc/kace.conf");
    let mut text = std::fs::read_to_string(&conf).unwrap();
    text.push_str("[selection]\npriority_window = 1\n");
    std::fs::write(&conf, text).unwrap();
    std::env::set_var("SLURM_CONF", c.conf());

    // The heavy user's prior usage: slurmctld applies it at the job's end and recomputes the
    // fair-share factors once per PriorityCalcPeriod (a minute).
    let usage = submit(&c, HEAVY.0, &["-c", "4", "--wrap", "sleep 4"]);
    c.wait_done(usage, Duration::from_secs(60)).unwrap();
    wait_for(&c, "the heavy user's fair-share to fall", Duration::from_secs(90), || {
        fair_share(&c, HEAVY.1) < fair_share(&c, LIGHT.1)
    });
    let (fs_heavy, fs_light) = (fair_share(&c, HEAVY.1), fair_share(&c, LIGHT.1));
    eprintln!("accounting: fair-share heavy {fs_heavy}, light {fs_light}");

    let burst = |kace: bool| -> Vec<(u32, &'static str)> {
        // The blocker is a kace job of the whole GPU: its end wakes the decider at once
        // (EpilogSlurmctld); a plain job's end is seen at the next reading of the nodes, which
        // would add up to a backstop period to the kace run's waits only.
        let blocker = if kace {
            submit(&c, 0, &["--kace-colocate=bert-infer", "--gres=shard:2", "--wrap", "sleep 6"])
        } else {
            submit(&c, 0, &["--gres=shard:2", "--wrap", "sleep 6"])
        };
        wait_for(&c, "the blocker running", Duration::from_secs(30), || {
            field(&c.job(blocker).unwrap(), "JobState") == "RUNNING"
        });
        let mut args = vec!["--gres=shard:1"];
        if kace {
            args.push("--kace-colocate=bert-infer");
        }
        args.extend(["--wrap", "sleep 3"]);
        let mut jobs = Vec::new();
        for _ in 0..4 {
            jobs.push((submit(&c, HEAVY.0, &args), HEAVY.1));
        }
        for _ in 0..2 {
            jobs.push((submit(&c, LIGHT.0, &args), LIGHT.1));
        }
        jobs
    };

    // 1. Slurm alone. While the jobs wait, kace's estimate of each one's priority is Slurm's.
    let plain = burst(false);
    let commands = common::commands(c.slurm(), Duration::from_secs(10));
    c.reset_rpc_counts().unwrap();
    let inputs = commands.priority_inputs().unwrap();
    let rpcs: u64 = c.rpc_counts().unwrap().values().sum();
    let counted: u64 = commands.counts.snapshot().iter().map(|(k, n)| k.rpcs() * n).sum();
    eprintln!("accounting: reading the priority factors cost {rpcs} RPC(s) (counted {counted})");
    assert!(rpcs <= counted, "{:?}", c.rpc_counts().unwrap());
    assert!(inputs.unmodelled().is_empty(), "{inputs:?}");
    let listing = c
        .run_ok(
            "squeue",
            &[
                "-h",
                "-t",
                "PD",
                "-O",
                "JobID:|,UserName:|,Account:|,QOS:|,Partition:|,PriorityLong:|",
            ],
        )
        .unwrap();
    let now =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    let mut compared = 0;
    for line in listing.lines() {
        let f: Vec<&str> = line.split('|').map(str::trim).collect();
        let job = QueuedJob {
            id: f[0].parse().unwrap(),
            user: f[1].into(),
            account: f[2].into(),
            qos: f[3].into(),
            partition: f[4].into(),
            submitted: Some(now),
            ..QueuedJob::default()
        };
        let slurm: f64 = f[5].parse().unwrap();
        let ours = kace_node::priority::estimate(&inputs, &job, now).unwrap();
        // The age factor moves by 1000 a day: under a point over this test.
        assert!((ours - slurm).abs() <= 2.0, "job {}: kace {ours}, Slurm {slurm}", job.id);
        compared += 1;
    }
    assert_eq!(compared, plain.len(), "{listing}");
    let plain_waits = waits(&c, &plain);

    // 2. The same burst as kace jobs: the decider serves Slurm's order.
    let mut watch = setup::watch(&dir, c.conf()).unwrap();
    let kace_jobs = burst(true);
    let kace_waits = waits(&c, &kace_jobs);
    // Billing (issue 29 item 6): sacct shows whom each kace job joined on its GPU (the
    // AdminComment its pin's update sets; slurmctld stores it at the job's end): every named
    // partner is a kace job of the burst that ran at the same time.
    let ids: Vec<String> = kace_jobs.iter().map(|(id, _)| id.to_string()).collect();
    let mut comments: BTreeMap<u32, String> = BTreeMap::new();
    wait_for(&c, "slurmdbd to hold the kace jobs' ends", Duration::from_secs(60), || {
        let out = c
            .run_ok(
                "sacct",
                &["-X", "-n", "-P", "-o", "JobID,State,AdminComment", "-j", &ids.join(",")],
            )
            .unwrap_or_default();
        comments = out
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.splitn(3, '|').collect();
                (f.len() == 3 && f[1] == "COMPLETED")
                    .then(|| Some((f[0].parse().ok()?, f[2].to_string())))
                    .flatten()
            })
            .collect();
        comments.len() == ids.len()
    });
    eprintln!("accounting: sacct AdminComment {comments:?}");
    let span = |id: u32| {
        let j = c.job(id).unwrap();
        let t = |k: &str| kace_node::slurm::parse_utc(field(&j, k)).unwrap();
        (t("StartTime"), t("EndTime"))
    };
    let mut shared = 0;
    for (&id, comment) in &comments {
        let (_, p) = kace_node::slurm::read_mark(comment)
            .unwrap_or_else(|| panic!("job {id}: no kace mark: {comments:?}"));
        for q in &p {
            let ((s1, e1), (s2, e2)) = (span(id), span(*q));
            assert!(
                // Slurm's times are whole seconds: a job that joined as its partner ended
                // starts in the second the partner ends.
                comments.contains_key(q) && s1 <= e2 && s2 <= e1,
                "job {id} names {q}, which did not run beside it: {comments:?}"
            );
        }
        shared += usize::from(!p.is_empty());
    }
    assert!(shared >= 1, "no kace job shows a partner in sacct: {comments:?}");
    let light_last = kace_jobs
        .iter()
        .filter(|(_, u)| *u == LIGHT.1)
        .map(|(id, _)| start_of(&c, *id))
        .fold(f64::NEG_INFINITY, f64::max);
    let heavy_first = kace_jobs
        .iter()
        .filter(|(_, u)| *u == HEAVY.1)
        .map(|(id, _)| start_of(&c, *id))
        .fold(f64::INFINITY, f64::min);
    let _ = watch.kill();
    let _ = watch.wait();

    eprintln!("accounting: fair-share table (median wait, s; one run)");
    eprintln!("accounting: | user | fair-share | Slurm alone | kace |");
    for (user, fs) in [(HEAVY.1, fs_heavy), (LIGHT.1, fs_light)] {
        eprintln!(
            "accounting: | {user} | {fs:.3} | {:.0} | {:.0} |",
            median(plain_waits[user].clone()),
            median(kace_waits[user].clone())
        );
    }
    let decider = decider_log(&dir);
    assert!(
        light_last <= heavy_first,
        "the light user's kace jobs start before the heavy user's (last light {light_last}, \
         first heavy {heavy_first})\n{decider}"
    );
    // Slurm alone gives the same order.
    let plain_light_last = plain
        .iter()
        .filter(|(_, u)| *u == LIGHT.1)
        .map(|(id, _)| start_of(&c, *id))
        .fold(f64::NEG_INFINITY, f64::max);
    let plain_heavy_first = plain
        .iter()
        .filter(|(_, u)| *u == HEAVY.1)
        .map(|(id, _)| start_of(&c, *id))
        .fold(f64::INFINITY, f64::min);
    assert!(plain_light_last <= plain_heavy_first, "Slurm's own order differs: the test is wrong");
}

/// QOS limits before the release (issue 29 item 1): with `MaxJobsPerUser=1` on the user's
/// QOS, kace must not release a second job of that user while the first runs (Slurm would
/// keep it pending for the limit, `QOSMaxJobsPerUserLimit`, and kace would count its GPU
/// share as taken); it waits held, and the decider says why. Another user's job beside it is
/// released as usual.
#[test]
#[ignore = "needs root, Slurm, slurmdbd and MariaDB"]
fn kace_releases_no_job_a_qos_limit_would_keep_pending() {
    let test = "kace_releases_no_job_a_qos_limit_would_keep_pending";
    kace_e2e::require_e2e(test);
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let c = accounting_cluster(
        2,
        &[
            "add qos one MaxJobsPerUser=1",
            "add account heavy",
            "add account light",
            "add user daemon Account=heavy QOS=normal,one DefaultQOS=one",
            "add user bin Account=light",
        ],
    )
    .start()
    .unwrap();
    let dir = c.dir().to_path_buf();
    common::prepare(&c, MAX_HOLD_S);
    std::env::set_var("SLURM_CONF", c.conf());
    let mut watch = setup::watch(&dir, c.conf()).unwrap();

    let kace = ["--kace-colocate=bert-infer", "--gres=shard:1", "--wrap", "sleep 6"];
    let first = submit(&c, HEAVY.0, &kace);
    let second = submit(&c, HEAVY.0, &kace);
    let other = submit(&c, LIGHT.0, &kace);
    // Until both of the user's jobs are done, the second is never released while the first
    // runs: Slurm never shows it pending for the limit.
    let mut reasons = BTreeMap::new();
    // What `kace status` says of the second job while the first runs (the decider's memory).
    let mut kept_back: Option<String> = None;
    wait_for(&c, "the three jobs to end", Duration::from_secs(120), || {
        if kept_back.is_none() && field(&c.job(first).unwrap(), "JobState") == "RUNNING" {
            let status = common::json(&c, &["status"]);
            kept_back = status["held"]
                .as_array()
                .and_then(|h| h.iter().find(|j| j["job"] == second))
                .and_then(|j| j["kept_back"].as_str())
                .map(str::to_string);
        }
        for id in [first, second, other] {
            let j = c.job(id).unwrap();
            *reasons
                .entry((id, field(&j, "JobState").to_string(), field(&j, "Reason").to_string()))
                .or_insert(0) += 1;
        }
        [first, second, other]
            .iter()
            .all(|id| field(&c.job(*id).unwrap(), "JobState") == "COMPLETED")
    });
    let decider = decider_log(&dir);
    let _ = watch.kill();
    let _ = watch.wait();
    eprintln!("accounting: states and reasons seen {reasons:?}");
    assert!(
        !reasons.keys().any(|(_, _, r)| r.contains("MaxJobsPerUser")),
        "a job was released into the QOS limit: {reasons:?}\n{decider}"
    );
    let times = |id: u32| {
        let j = c.job(id).unwrap();
        let t = |k: &str| kace_node::slurm::parse_utc(field(&j, k)).unwrap();
        (t("StartTime"), t("EndTime"))
    };
    let ((s1, e1), (s2, e2), (s3, _)) = (times(first), times(second), times(other));
    assert!(s2 >= e1 || e2 <= s1, "the user's two jobs overlapped: {s1}..{e1} and {s2}..{e2}");
    assert!(decider.contains("waits for a limit: QOSMaxJobsPerUserLimit (QOS one)"), "{decider}");
    assert_eq!(
        kept_back.as_deref(),
        Some("waits for a limit: QOSMaxJobsPerUserLimit (QOS one)"),
        "kace status of the held job"
    );
    // The other user's job did not wait for the heavy user's limit.
    assert!(s3 < e1.max(e2), "{reasons:?}");
}

/// Preemption (`PreemptType=preempt/qos`, `PreemptMode=REQUEUE`): a plain job of a QOS that
/// preempts `normal` takes the GPU of a running kace job. Slurm requeues the kace job; kace holds
/// it again and unpins it (it is not left pinned to the GPU the preemptor holds), leaves that GPU
/// to the preemptor while it runs, and places the job anew once the GPU is free: it completes,
/// once requeued, never beside the preemptor.
#[test]
#[ignore = "needs root, Slurm, slurmdbd and MariaDB"]
fn a_preempted_kace_job_is_held_again_unpinned_and_runs_after_the_preemptor() {
    let test = "a_preempted_kace_job_is_held_again_unpinned_and_runs_after_the_preemptor";
    kace_e2e::require_e2e(test);
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let c = accounting_cluster(
        1,
        &[
            "add qos high Priority=100 Preempt=normal",
            "add account heavy",
            "add account light",
            "add user daemon Account=heavy QOS=normal DefaultQOS=normal",
            "add user bin Account=light QOS=normal,high DefaultQOS=normal",
        ],
    )
    .slurm_conf_line("PreemptType=preempt/qos")
    .slurm_conf_line("PreemptMode=REQUEUE")
    .slurm_conf_line("JobRequeue=1")
    .start()
    .unwrap();
    let dir = c.dir().to_path_buf();
    common::prepare(&c, MAX_HOLD_S);
    std::env::set_var("SLURM_CONF", c.conf());
    let mut watch = setup::watch(&dir, c.conf()).unwrap();

    let victim = submit(
        &c,
        HEAVY.0,
        &["--kace-colocate=bert-infer", "--gres=shard:1", "--requeue", "--wrap", "sleep 10"],
    );
    wait_for(&c, "the kace job running", Duration::from_secs(60), || {
        field(&c.job(victim).unwrap(), "JobState") == "RUNNING"
    });
    let preemptor = submit(&c, LIGHT.0, &["--qos=high", "--gres=shard:2", "--wrap", "sleep 8"]);
    wait_for(&c, "the preemptor running", Duration::from_secs(60), || {
        field(&c.job(preemptor).unwrap(), "JobState") == "RUNNING"
    });
    // Requeued, then held again and unpinned by kace while the preemptor runs.
    wait_for(&c, "the requeued kace job held again", Duration::from_secs(40), || {
        let j = c.job(victim).unwrap();
        field(&j, "JobState") == "PENDING"
            && field(&j, "Reason") == "JobHeldUser"
            && matches!(field(&j, "ReqNodeList"), "" | "(null)")
    });
    let p = c.wait_done(preemptor, Duration::from_secs(60)).unwrap();
    assert_eq!(field(&p, "JobState"), "COMPLETED", "{p:?}");
    let v = c.wait_done(victim, Duration::from_secs(180)).unwrap();
    let decider = decider_log(&dir);
    let _ = watch.kill();
    let _ = watch.wait();
    assert_eq!(field(&v, "JobState"), "COMPLETED", "{v:?}\n{decider}");
    assert!(field(&v, "Restarts").parse::<u32>().unwrap_or(0) >= 1, "requeued once: {v:?}");
    let t = |j: &kace_e2e::JobInfo, k: &str| kace_node::slurm::parse_utc(field(j, k)).unwrap();
    assert!(t(&v, "StartTime") >= t(&p, "EndTime"), "ran beside its preemptor: {v:?} {p:?}");
    assert!(decider.contains(&format!("held job {victim} again")), "{decider}");
}
