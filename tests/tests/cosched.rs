//! Co-scheduling end to end on a real Slurm cluster (one node, one fake GPU): kace-prolog,
//! kace-epilog and `kace dispatch` (EpilogSlurmctld and a "timer" the test plays), with a
//! database holding the project's synthetic demo profiles and a model trained on its pairs.
//!
//! A lead and five held candidates are submitted so that queue order, the smallest-memory rule
//! and kace's model each prefer a different candidate (one more does not fit in memory). The
//! candidate kace ranks best must start on the lead's node and GPU while the lead runs, the
//! others stay held until dispatched, no GPU ever runs more than a lead and its partner (dispatch
//! must not release another lead onto a shared GPU), nobody waits past `max_hold`, the fake MPS control sees
//! one daemon per busy period, the epilogs spool observations that `kace ingest` and
//! `kace train` take in, and `kace explain` says why each job was or was not chosen.

mod common;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{decision, field, json, kace, passing, placement, profiled_workloads, worker};
use kace_e2e::{kace as setup, Cluster, JobInfo, NodeSpec};
use kace_sql::{Db, MEMCAP};

const MAX_HOLD_S: u64 = 25;

/// The workloads of the scenario: a lead and candidates in queue order, with the one kace
/// must choose, chosen so that the first in queue, the smallest memcap and kace all differ.
struct Scenario {
    lead: String,
    queue: Vec<String>,
    best: String,
    smallest: String,
    unfit: Option<String>,
}

fn scenario(db: &Db) -> Scenario {
    let all = db.all_profiles(None).unwrap();
    let memcap = |w: &str| all[w].values[MEMCAP].unwrap();
    let names = profiled_workloads(db);
    for lead in &names {
        let others: Vec<&String> = names.iter().filter(|w| *w != lead).collect();
        let d = decision(db, lead, &others);
        let passing = passing(&d, &others);
        if passing.len() < 4 {
            continue;
        }
        let best = passing[0].1.as_str();
        let Some((_, smallest)) = passing[1..]
            .iter()
            .filter(|(_, w)| memcap(w) < memcap(best))
            .min_by(|a, b| memcap(&a.1).total_cmp(&memcap(&b.1)))
        else {
            continue;
        };
        let smallest = smallest.as_str();
        let rest: Vec<&str> = passing[1..]
            .iter()
            .map(|p| p.1.as_str())
            .filter(|w| *w != smallest && memcap(w) > memcap(smallest))
            .take(2)
            .collect();
        if rest.len() < 2 {
            continue;
        }
        let unfit = d
            .selection
            .verdicts
            .iter()
            .zip(&others)
            .find(|(v, _)| v.rejection.as_ref().is_some_and(|r| r.to_string().contains("memory")))
            .map(|(_, w)| w.to_string());
        let mut queue = vec![rest[0].to_string(), smallest.to_string(), rest[1].to_string()];
        queue.extend(unfit.clone());
        queue.push(best.to_string());
        return Scenario {
            lead: lead.to_string(),
            queue,
            best: best.to_string(),
            smallest: smallest.to_string(),
            unfit,
        };
    }
    panic!("no lead in the demo data has four fitting candidates");
}

fn mps_calls(c: &Cluster) -> Vec<String> {
    std::fs::read_to_string(c.dir().join("mps-calls.log"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// Running kace jobs per (node, GPU), as dispatch reads them.
fn jobs_per_gpu(c: &Cluster) -> BTreeMap<(String, u32), Vec<u32>> {
    let out = c.run_ok("squeue", &["--json", "-t", "R,CF"]).unwrap();
    let (jobs, _) = kace_node::slurm_json::jobs(&out).unwrap();
    let mut per: BTreeMap<(String, u32), Vec<u32>> = BTreeMap::new();
    for r in kace_node::slurm::running_kace_jobs(jobs) {
        for g in r.gpus {
            per.entry((r.node.clone(), g)).or_default().push(r.id);
        }
    }
    per
}

/// One node with one GPU, the kace hooks and the demo's database, model and kace.conf; with
/// the number of groups the first model was trained on.
fn one_gpu_cluster() -> (Cluster, u64) {
    let c = setup::with_hooks(Cluster::builder().nodes(vec![NodeSpec::new("n1", 1)]))
        .unwrap()
        .start()
        .unwrap();
    let first_size = common::prepare(&c, MAX_HOLD_S);
    (c, first_size)
}

#[test]
#[ignore = "needs root and Slurm"]
fn kace_pairs_the_best_candidate_and_learns_from_the_pair() {
    let test = "kace_pairs_the_best_candidate_and_learns_from_the_pair";
    kace_e2e::require_e2e(test);
    let (c, first_size) = one_gpu_cluster();
    let dir = c.dir().to_path_buf();

    let s = {
        let db = Db::open_read_only(&dir.join("kace.db")).unwrap();
        scenario(&db)
    };
    eprintln!(
        "lead {}, queue {:?}, kace {} / smallest memcap {}",
        s.lead, s.queue, s.best, s.smallest
    );
    assert_ne!(s.queue[0], s.best);
    assert_ne!(s.queue[0], s.smallest);
    assert_ne!(s.best, s.smallest);

    let submit = |w: &str, secs: u32| {
        let opt = format!("--kace-colocate={w}");
        c.sbatch(&[&opt, "--gres=shard:1", "--wrap", &worker(secs, 3)]).unwrap()
    };
    let lead = submit(&s.lead, 10);
    let mut ids: BTreeMap<String, u32> = BTreeMap::new();
    for w in &s.queue {
        ids.insert(w.clone(), submit(w, 4));
    }
    let best = ids[&s.best];
    let all: Vec<u32> = std::iter::once(lead).chain(ids.values().copied()).collect();
    for id in &all {
        assert_eq!(field(&c.job(*id).unwrap(), "Reason"), "JobHeldUser");
    }

    // The timer's dispatch: the oldest held kace job (the lead) goes onto the free GPU.
    let out = kace(&c, &["dispatch"]);
    assert!(out.contains(&format!("released job {lead} as a lead onto n1 GPU 0")), "{out}");
    let lead_info = c
        .wait_job(lead, "running", Duration::from_secs(20), |j| field(j, "JobState") == "RUNNING")
        .unwrap();
    let partner = c
        .wait_job(best, "running beside the lead", Duration::from_secs(20), |j| {
            field(j, "JobState") != "PENDING"
        })
        .unwrap();
    let lead_now = c.job(lead).unwrap();
    assert_eq!(
        field(&lead_now, "JobState"),
        "RUNNING",
        "the lead ended before its partner started"
    );
    assert_eq!(field(&partner, "NodeList"), field(&lead_info, "NodeList"));
    // The partner is on the lead's GPU (the node has one: GPU 0), and nothing else is.
    assert_eq!(placement(&c, lead), ("n1".to_string(), vec![0]));
    assert_eq!(placement(&c, best), ("n1".to_string(), vec![0]), "the partner's GPU");
    let per_gpu = jobs_per_gpu(&c);
    assert_eq!(per_gpu.get(&("n1".to_string(), 0)).map(Vec::len), Some(2), "{per_gpu:?}");
    // The timer runs now: the GPU runs a lead and its partner, so no new lead goes there.
    let out = kace(&c, &["dispatch"]);
    assert!(!out.contains("as a lead"), "dispatch released a lead onto a shared GPU: {out}");
    // While the lead runs, every other candidate stays held.
    for (w, id) in &ids {
        if *id != best {
            let j = c.job(*id).unwrap();
            assert_eq!(field(&j, "Reason"), "JobHeldUser", "{w} ({id}) left the hold: {j:?}");
        }
    }
    let starts: Vec<String> =
        mps_calls(&c).into_iter().filter(|l| l.starts_with("start")).collect();
    assert_eq!(starts.len(), 1, "one MPS daemon for the GPU: {starts:?}");
    assert!(starts[0].contains(&format!("{}/mps/0/pipe gpu=0", dir.display())), "{starts:?}");

    // From here the timer keeps running dispatch until every job has run.
    let deadline = Instant::now() + Duration::from_secs(150);
    loop {
        let done = all.iter().all(|id| {
            let j = c.job(*id).unwrap();
            !matches!(field(&j, "JobState"), "PENDING" | "RUNNING" | "CONFIGURING" | "COMPLETING")
        });
        if done {
            break;
        }
        assert!(Instant::now() < deadline, "jobs did not all finish: {}", c.slurmctld_log());
        kace(&c, &["dispatch"]);
        // A GPU never runs more than a lead and its partner.
        for (gpu, jobs) in jobs_per_gpu(&c) {
            assert!(jobs.len() <= 2, "GPU {gpu:?} runs {jobs:?}: {}", c.slurmctld_log());
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    let t = |j: &JobInfo, k: &str| kace_node_time(field(j, k));
    for id in &all {
        let j = c.job(*id).unwrap();
        assert_eq!(field(&j, "JobState"), "COMPLETED", "{j:?}");
        let waited = t(&j, "StartTime") - t(&j, "SubmitTime");
        // max_hold, plus one timer period (1 s here) and Slurm's start latency (≤ 1 s), with room.
        assert!(waited <= (MAX_HOLD_S + 8) as f64, "job {id} waited {waited} s: {j:?}");
    }
    // EpilogSlurmctld ran kace-dispatch (the shell made its log) without complaint.
    let hook_log = std::fs::read_to_string(dir.join("log/kace-kace-dispatch.log"))
        .expect("EpilogSlurmctld ran kace-dispatch");
    assert!(!hook_log.contains("couldn't"), "{hook_log}");
    let sinfo = c.run_ok("sinfo", &["-h", "-N", "-o", "%N %t"]).unwrap();
    assert!(!sinfo.contains("drain"), "{sinfo}");

    // MPS: every daemon started was stopped when its GPU had no kace job left.
    let calls = mps_calls(&c);
    let n_start = calls.iter().filter(|l| l.starts_with("start")).count();
    let n_quit = calls.iter().filter(|l| l.starts_with("quit")).count();
    assert!(n_start >= 1 && n_start == n_quit, "{calls:#?}");
    assert!(!dir.join("mps/0/pipe/fake-mps.pid").exists(), "{calls:#?}");

    // Observations and decisions are in the spool; ingest and train take them in.
    let spooled = std::fs::read_dir(dir.join("kace-spool"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_file())
        .count();
    assert!(spooled >= 2, "observations in the spool: {spooled}");
    let ingested = json(&c, &["ingest"]);
    assert!(ingested["inserted"].as_u64().unwrap() >= 2, "{ingested}");
    assert!(ingested["decisions"]["inserted"].as_u64().unwrap() >= 1, "{ingested}");
    let again = json(&c, &["train"]);
    let size = again["metrics"]["fit_groups"].as_u64().unwrap()
        + again["metrics"]["holdout_groups"].as_u64().unwrap();
    assert!(size > first_size, "the new pair was not trained on: {first_size} -> {size}");

    // explain, from the database now.
    let e = kace(&c, &["explain", &best.to_string()]);
    assert!(e.contains(&format!("when job {lead}")) && e.contains("chosen (predicted"), "{e}");
    let e = kace(&c, &["explain", &ids[&s.smallest].to_string()]);
    assert!(e.contains("not chosen: predicted"), "{e}");
    if let Some(u) = &s.unfit {
        let e = kace(&c, &["explain", &ids[u].to_string()]);
        assert!(e.contains("memory does not fit"), "{e}");
    }
    let e = kace(&c, &["explain", &lead.to_string()]);
    assert!(e.contains(&format!("chose job {best}")), "{e}");
}

/// Issue 33 item 3 on a real cluster: with `mps.sm_split` on and a chooser trained by `kace
/// splits train` on a lead-at-100 % sweep of the demo workloads (a joiner at 40 % does best for
/// every pair), the partner the decider releases beside a running lead gets 40 % in its task's
/// environment through its release ticket, prolog and the SPANK plugin; `kace explain` says so;
/// the epilogs observe no interval the capped job ran in.
#[test]
#[ignore = "needs root and Slurm"]
fn the_partner_gets_the_sm_share_the_chooser_picks() {
    let test = "the_partner_gets_the_sm_share_the_chooser_picks";
    kace_e2e::require_e2e(test);
    let (c, _) = one_gpu_cluster();
    let dir = c.dir().to_path_buf();
    let conf = dir.join("etc/kace.conf");
    let text = std::fs::read_to_string(&conf).unwrap() + "[mps]\nsm_split = true\n";
    std::fs::write(&conf, text).unwrap();

    // The sweep: every ordered pair of the demo workloads, the joiner at 40, 70 and 100 %.
    let (lead_w, like) = common::lead_with_candidates(&dir.join("kace.db"), 1);
    let mut sweep = String::from(
        "workload1,workload2,\"(LS100, BE40)\",\"(LS100, BE70)\",\"(LS100, BE100)\"\n",
    );
    {
        let db = Db::open_read_only(&dir.join("kace.db")).unwrap();
        let all = db.all_profiles(None).unwrap();
        let names = profiled_workloads(&db);
        let excl = |w: &str| all[w].values[kace_sql::EXCLUSIVE].unwrap();
        for a in &names {
            for b in names.iter().filter(|b| *b != a) {
                let cell = |n: f64| format!("\"({}, {})\"", excl(a) * n / 2.0, excl(b) * n / 2.0);
                sweep.push_str(&format!("{a},{b},{},{},{}\n", cell(1.5), cell(1.2), cell(1.0)));
            }
        }
    }
    let sweeps = dir.join("share-sweeps.csv");
    std::fs::write(&sweeps, sweep).unwrap();
    let trained = json(&c, &["splits", "train", "--sweeps", &sweeps.display().to_string()]);
    assert_eq!(trained["metrics"]["ever_leaves_default"], true, "{trained}");

    let probe = format!("echo SM=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE; {}", worker(4, 3));
    let lead_opt = format!("--kace-colocate={lead_w}");
    let lead = c.sbatch(&[&lead_opt, "--gres=shard:1", "--wrap", &worker(10, 3)]).unwrap();
    let opt = format!("--kace-colocate={}", like[0]);
    let partner = c.sbatch(&[&opt, "--gres=shard:1", "--wrap", &probe]).unwrap();
    let out = kace(&c, &["dispatch"]);
    assert!(out.contains(&format!("released job {lead} as a lead onto n1 GPU 0")), "{out}");
    let deadline = Instant::now() + Duration::from_secs(90);
    for id in [lead, partner] {
        loop {
            let j = c.job(id).unwrap();
            if !matches!(
                field(&j, "JobState"),
                "PENDING" | "RUNNING" | "CONFIGURING" | "COMPLETING"
            ) {
                assert_eq!(field(&j, "JobState"), "COMPLETED", "{j:?}");
                break;
            }
            assert!(Instant::now() < deadline, "job {id} did not finish: {}", c.slurmctld_log());
            kace(&c, &["dispatch"]);
            std::thread::sleep(Duration::from_secs(1));
        }
    }
    let out = c.job_output(partner);
    assert!(out.contains("SM=40\n"), "the partner's share: {out}");
    let out = c.job_output(lead);
    assert!(!out.contains("SM="), "{out}");
    let e = kace(&c, &["explain", &partner.to_string()]);
    assert!(e.contains("with 40 % of the GPU's SMs"), "{e}");
    let epilogs = std::fs::read_to_string(dir.join("log/kace-kace-epilog.log")).unwrap_or_default();
    assert!(epilogs.contains("ran with an SM share kace set; not observed"), "{epilogs}");
    assert!(epilogs.contains("ran with an SM share of 40 %; no profile measurement"), "{epilogs}");
}

/// `YYYY-MM-DDTHH:MM:SS` in this host's time zone, as Unix seconds (via `date`, which knows it).
fn kace_node_time(s: &str) -> f64 {
    let out = Command::new("date").args(["-d", s, "+%s"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or_else(|_| panic!("time {s:?}"))
}
