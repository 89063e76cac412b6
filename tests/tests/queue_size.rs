//! kace with a large queue in slurmctld (the "one decider" issue's queue-size e2e): before the
//! decider, kace read the whole queue as JSON (`squeue --json`, which 22.05 prints whole even
//! with `-j`) and stopped entirely above ~2 700 jobs on 22.05 — no pairs and no `max_hold` — and
//! above ~300 running jobs on 26.05. Here `KACE_QUEUE_HELD` plain held jobs (default 3 000) and
//! `KACE_QUEUE_RUNNING` plain running ones (default 300, `sleep` on nodes with many CPUs) sit
//! in slurmctld while kace jobs arrive, with the `kace dispatch --watch` service and the
//! PrologSlurmctld/EpilogSlurmctld nudges.
//!
//! Asserted: a kace lead gets its partner on its GPU; a kace job that finds no partner is
//! released by `max_hold` (5 s) within 5 s of it; the decider's passes read no whole-queue JSON
//! (its own command counts). The bench size: `KACE_QUEUE_HELD=20000 KACE_QUEUE_RUNNING=1000`.

mod common;

use std::time::{Duration, Instant};

use common::{env_usize, field};
use kace_e2e::{kace as setup, Cluster, NodeSpec};

const MAX_HOLD_S: u64 = 5;

/// How many pending jobs wait for each reason (`squeue -o "%i|%r"` lines).
fn reasons(listing: &str) -> std::collections::BTreeMap<&str, usize> {
    let mut by_reason = std::collections::BTreeMap::new();
    for (_, reason) in listing.lines().filter_map(|l| l.split_once('|')) {
        *by_reason.entry(reason).or_insert(0) += 1;
    }
    by_reason
}

fn count(c: &Cluster, states: &str) -> usize {
    c.run_ok("squeue", &["-h", "-t", states, "-o", "%i"]).unwrap_or_default().lines().count()
}

#[test]
#[ignore = "needs root and Slurm"]
fn a_large_queue_stops_neither_pairing_nor_max_hold() {
    let test = "a_large_queue_stops_neither_pairing_nor_max_hold";
    kace_e2e::require_e2e(test);
    let held = env_usize("KACE_QUEUE_HELD", 3000);
    let running = env_usize("KACE_QUEUE_RUNNING", 300);
    // Two plain nodes with many CPUs for the running sleeps, one GPU node for kace.
    let cpus = (running / 2 + 8) as u32;
    let c = setup::with_nudges(
        Cluster::builder()
            .nodes(vec![
                NodeSpec { cpus: 4, ..NodeSpec::new("n1", 1) },
                NodeSpec { cpus, ..NodeSpec::new("n2", 0) },
                NodeSpec { cpus, ..NodeSpec::new("n3", 0) },
            ])
            .typed_gpus(true)
            .prolog(setup::hook("kace-prolog", "").unwrap())
            .epilog(setup::hook("kace-epilog", "").unwrap()),
    )
    .unwrap()
    .slurm_conf_line("MaxJobCount=60000")
    // slurmd waits 2 × MessageTimeout for a batch job's prolog-launch RPC
    // (src/slurmd/slurmd/req.c, "REQUEST_LAUNCH_PROLOG notification failed"): with 150 launches
    // per node at once on 2 cores the default 10 s outlasted it once (CI 2026-12-04: n2 drained
    // "Prolog error", 257 of 300 ran) — Slurm's launch path under load, not kace's prolog.
    .slurm_conf_line("MessageTimeout=30")
    .start()
    .unwrap();
    let dir = c.dir().to_path_buf();
    common::prepare(&c, MAX_HOLD_S);
    // Without the refill, a job that arrives while the GPU is full is placed by max_hold alone.
    let conf = dir.join("etc/kace.conf");
    let text = std::fs::read_to_string(&conf).unwrap();
    std::fs::write(&conf, format!("{text}[selection]\nrefill = false\n")).unwrap();
    let t = Instant::now();
    c.submit_many(held, "--hold --wrap true").unwrap();
    c.submit_many(running, "-x n1 --wrap 'sleep 900'").unwrap();
    let until = Instant::now() + Duration::from_secs(300);
    // On a loaded 2-core machine slurmd can fail a few of the 300 batch launches at once;
    // slurmctld then requeues each one held ("launch failed requeued held", CI 2026-12-03:
    // 288 of 300 ran). Those are released again, counted and printed: the test is about the
    // queue's size, not about Slurm's launch path.
    let mut relaunched = 0;
    while count(&c, "R") < running {
        let pending = c.run_ok("squeue", &["-h", "-t", "PD", "-o", "%i|%r"]).unwrap_or_default();
        let failed: Vec<&str> = pending
            .lines()
            .filter_map(|l| l.split_once('|'))
            .filter(|(_, reason)| reason.contains("launch failed"))
            .map(|(id, _)| id)
            .collect();
        if !failed.is_empty() {
            relaunched += failed.len();
            let _ = c.run_ok("scontrol", &["release", &failed.join(",")]);
        }
        assert!(
            Instant::now() < until,
            "only {} of {running} plain jobs run; pending reasons: {:?}\n{}\n{}",
            count(&c, "R"),
            reasons(&pending),
            c.run_ok("sinfo", &["-N", "-o", "%N %T %E"]).unwrap_or_default(),
            ["n2", "n3"]
                .map(|n| c.slurmd_log(n))
                .join("\n")
                .lines()
                .filter(|l| l.contains("error"))
                .take(20)
                .collect::<Vec<_>>()
                .join("\n")
        );
        std::thread::sleep(Duration::from_secs(2));
    }
    if relaunched > 0 {
        eprintln!("queue size: {relaunched} plain job launch(es) failed and were released again");
    }
    eprintln!(
        "queue size: {held} held and {running} running plain jobs in slurmctld after {:.0?}",
        t.elapsed()
    );

    let mut watch = setup::watch(&dir, c.conf()).unwrap();

    // A lead and its best partner: the decider releases the lead onto the free GPU and, as it
    // starts, the partner beside it (the lead's first partner comes without the refill).
    let (lead_w, cands) = common::lead_with_candidates(&dir.join("kace.db"), 1);
    let submit = |w: &str, secs: u32| {
        let opt = format!("--kace-colocate={w}");
        c.sbatch(&[&opt, "--gres=shard:1", "--wrap", &common::worker(secs, 3)]).unwrap()
    };
    let lead = submit(&lead_w, 40);
    let partner = submit(&cands[0], 4);
    for id in [lead, partner] {
        c.wait_job(id, "running", Duration::from_secs(60), |j| field(j, "JobState") == "RUNNING")
            .unwrap();
    }
    assert_eq!(
        common::placement(&c, lead),
        common::placement(&c, partner),
        "the partner is on the lead's GPU"
    );

    // A job that arrives while the GPU is full waits; the partner leaves after 4 s; no refill:
    // max_hold (5 s) places it beside the lead, on time.
    let late = submit(&cands[0], 3);
    let submitted = Instant::now();
    c.wait_job(late, "released", Duration::from_secs(MAX_HOLD_S + 30), |j| {
        field(j, "Reason") != "JobHeldUser"
    })
    .unwrap();
    let waited = submitted.elapsed();
    assert!(
        waited >= Duration::from_secs(MAX_HOLD_S - 1)
            && waited <= Duration::from_secs(MAX_HOLD_S + 4),
        "released {waited:?} after submission (max_hold {MAX_HOLD_S} s)"
    );
    // The decider prints a pass's lines when the pass ends, a moment after the release. Beside
    // the lead once the partner has left; if the partner is still there when max_hold expires
    // (its end comes late on a loaded machine: seen at 20 000 jobs and 1 000 running), to Slurm
    // unpinned: either way max_hold was kept.
    let placed = format!("released job {late} onto n1 GPU 0: held longer than {MAX_HOLD_S} s");
    let handed = format!(
        "handed job {late} back to Slurm, unpinned and asking for a whole GPU: it was held \
         longer than max_hold"
    );
    let said = || std::fs::read_to_string(dir.join("dispatch-watch.out")).unwrap_or_default();
    let told = || said().contains(&placed) || said().contains(&handed);
    let until = Instant::now() + Duration::from_secs(10);
    while !told() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(told(), "{}", said());
    let _ = watch.kill();
    let _ = watch.wait();

    let state =
        kace_node::decider_state::DeciderState::peek(&dir.join("run/decider")).unwrap().unwrap();
    assert!(
        !state.commands_total.contains_key("whole_queue"),
        "the decider read the whole queue as JSON: {:?}",
        state.commands_total
    );
    assert!(
        state.commands_total.get("list").copied().unwrap_or(0) > 0,
        "{:?}",
        state.commands_total
    );
    eprintln!("queue size: the decider's commands {:?}", state.commands_total);
    let _ = c.run("scancel", &["-u", "root"]);
}
