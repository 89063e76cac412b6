//! kace at scale on a real Slurm (the "one decider" issue's scale e2e): `KACE_SCALE_NODES`
//! slurmd on localhost (default 4; the bench size is 16) × 4 typed fake GPUs of 2 shards, the
//! real kace-prolog, kace-epilog, PrologSlurmctld/EpilogSlurmctld `kace-dispatch` and the
//! `kace dispatch --watch` service. The same burst of `KACE_SCALE_JOBS` jobs (default 6 per
//! GPU) runs twice in one run: as plain `shard:2` jobs (a GPU each) and as `--kace-colocate`
//! `shard:1` jobs (paired by kace). The stand-in job appends a progress line a second from bash
//! builtins (no fork per tick).
//!
//! Asserted: slurmctld alive and no node drained; every job completed; no job released twice
//! (the decider's log); kace's makespan ≤ 1.25× and hold p95 ≤ 2× plain's; GPU occupancy by
//! kace jobs ≥ 90 % while kace jobs are held; ≤ 8 slurmctld RPCs per kace job beyond a plain
//! job's (sdiag, less the test's own; 11 on 22.05, see there); with nothing held, ≤ 0.2 RPC/s. Printed: the table row
//! for docs/measurements (`--nocapture`).
//!
//! The bench size: `KACE_SCALE_NODES=16 KACE_SCALE_JOBS=600 cargo test -p kace-e2e --test scale
//! -- --ignored --nocapture` (with `KACE_SLURM_PREFIX` for a source-built Slurm).

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{env_usize, field, kace, percentile};
use kace_e2e::{kace as setup, Cluster, NodeSpec};

const GPUS_PER_NODE: u32 = 4;
/// Each job's run, seconds: long against Slurm's start latency, short for CI. A released job
/// starts at slurmctld's next background tick (`queue_job_scheduler` only counts a request;
/// `_slurmctld_background` wakes at the next whole second, src/slurmctld/controller.c), unless
/// an epilog's completion schedules at once: up to 1 s a start, plus the prolog, which plain jobs
/// started at submission do not pay. With 8 s jobs 6–12 % of the GPU time
/// went between jobs, most of it that (docs/measurements/2026-12-03-decider-scale.md); real GPU
/// jobs run minutes. `KACE_SCALE_JOB_S` sets another length for a bench run (each start's fixed
/// cost then weighs less; docs/measurements/2026-12-07-decider-16-nodes.md).
const JOB_S: u32 = 12;

/// The stand-in: a progress line a second, from bash builtins only (`read -t` on a pipe that
/// never has data is the sleep).
fn script(seconds: u32) -> String {
    format!(
        "#!/bin/bash\nexec 3<> <(:)\nfor ((i = 0; i <= {seconds}; i++)); do\n  \
         [ -n \"$KACE_PROGRESS_FILE\" ] && echo \"$EPOCHREALTIME $((i * 10))\" >> \"$KACE_PROGRESS_FILE\"\n  \
         read -t 1 -u 3\ndone\nexit 0\n"
    )
}

fn rpcs(c: &Cluster) -> u64 {
    c.rpc_counts().unwrap_or_default().values().sum()
}

/// Per-job RPCs of each message type in `k` beyond `plain`'s, largest first.
fn kinds_beyond(k: &BTreeMap<String, u64>, plain: &BTreeMap<String, u64>, jobs: usize) -> String {
    let mut v: Vec<(String, f64)> = k
        .iter()
        .map(|(kind, n)| {
            let base = plain.get(kind).copied().unwrap_or(0);
            (kind.clone(), (*n as f64 - base as f64) / jobs as f64)
        })
        .filter(|(_, d)| d.abs() >= 0.05)
        .collect();
    v.sort_by(|a, b| b.1.total_cmp(&a.1));
    v.iter().map(|(k, d)| format!("{k} {d:+.2}")).collect::<Vec<_>>().join(", ")
}

fn reset_rpcs(c: &Cluster) {
    c.reset_rpc_counts().unwrap();
}

fn unix(c: &Cluster, text: &str) -> f64 {
    let _ = c;
    kace_node::slurm::parse_utc(text).unwrap_or(f64::NAN)
}

/// One phase's figures.
#[derive(Debug, Default)]
struct Phase {
    makespan: f64,
    hold_p50: f64,
    hold_p95: f64,
    rpcs: u64,
    /// The RPCs by message type.
    kinds: BTreeMap<String, u64>,
    /// `squeue` calls the test made while waiting (one RPC each).
    polls: u64,
    first_submit: f64,
    last_start: f64,
    /// Each job's start and end as Slurm recorded them (whole seconds).
    spans: BTreeMap<u32, (f64, f64)>,
}

/// GPU-seconds within `[a, b]` that `by_gpu`'s spans cover, each GPU's overlapping spans
/// counted once.
fn covered(by_gpu: &mut BTreeMap<String, Vec<(f64, f64)>>, a: f64, b: f64) -> f64 {
    let mut covered = 0.0;
    for spans in by_gpu.values_mut() {
        spans.sort_by(|x, y| x.0.total_cmp(&y.0));
        let mut reach = a;
        for &(s, e) in spans.iter() {
            let (s, e) = (s.max(reach), e.min(b));
            if e > s {
                covered += e - s;
                reach = e;
            }
        }
    }
    covered
}

/// Submits every job (`args` per job), waits for all to end, and measures.
fn phase(c: &Cluster, jobs: &[Vec<String>], limit: Duration) -> (Phase, Vec<u32>) {
    reset_rpcs(c);
    let ids: Vec<u32> = jobs
        .iter()
        .map(|a| c.sbatch(&a.iter().map(String::as_str).collect::<Vec<_>>()).unwrap())
        .collect();
    let t0 = Instant::now();
    let mut polls = 0;
    loop {
        polls += 1;
        let left = c.run_ok("squeue", &["-h", "-o", "%i"]).unwrap_or_default();
        let left = left.lines().filter(|l| !l.trim().is_empty()).count();
        if left == 0 {
            break;
        }
        assert!(t0.elapsed() < limit, "{left} jobs never finished\n{}", c.slurmctld_log());
        std::thread::sleep(Duration::from_secs(2));
    }
    let kinds = c.rpc_counts().unwrap_or_default();
    let rpcs = kinds.values().sum();
    let mut holds = Vec::new();
    let mut spans = BTreeMap::new();
    let (mut first, mut last_end, mut last_start) = (f64::INFINITY, 0.0f64, 0.0f64);
    for id in &ids {
        let j = c.job(*id).unwrap();
        assert_eq!(field(&j, "JobState"), "COMPLETED", "{j:?}");
        let (sub, start, end) = (
            unix(c, field(&j, "SubmitTime")),
            unix(c, field(&j, "StartTime")),
            unix(c, field(&j, "EndTime")),
        );
        holds.push(start - sub);
        spans.insert(*id, (start, end));
        first = first.min(sub);
        last_end = last_end.max(end);
        last_start = last_start.max(start);
    }
    let p = Phase {
        makespan: last_end - first,
        hold_p50: percentile(&mut holds, 0.5),
        hold_p95: percentile(&mut holds, 0.95),
        rpcs,
        kinds,
        polls,
        first_submit: first,
        last_start,
        spans,
    };
    (p, ids)
}

#[test]
#[ignore = "needs root and Slurm"]
fn a_burst_on_many_nodes_pairs_without_racing_or_idling() {
    let test = "a_burst_on_many_nodes_pairs_without_racing_or_idling";
    kace_e2e::require_e2e(test);
    let nodes = env_usize("KACE_SCALE_NODES", 4);
    let gpus = nodes * GPUS_PER_NODE as usize;
    let jobs = env_usize("KACE_SCALE_JOBS", 6 * gpus);
    let specs: Vec<NodeSpec> = (1..=nodes)
        .map(|i| {
            NodeSpec { cpus: 16, ..NodeSpec::new(&format!("n{i}"), GPUS_PER_NODE) }
                .shards_per_gpu(2)
        })
        .collect();
    let c = setup::with_nudges(
        Cluster::builder()
            .nodes(specs)
            .typed_gpus(true)
            .prolog(setup::hook("kace-prolog", "").unwrap())
            .epilog(setup::hook("kace-epilog", "").unwrap()),
    )
    .unwrap()
    .slurm_conf_line("MinJobAge=3600")
    .start()
    .unwrap();
    let dir = c.dir().to_path_buf();
    common::prepare(&c, 600);
    let names = {
        let db = kace_sql::Db::open_read_only(&dir.join("kace.db")).unwrap();
        common::profiled_workloads(&db)
    };
    let stand_in = dir.join("stand-in.sh");
    let job_s = env_usize("KACE_SCALE_JOB_S", JOB_S as usize).clamp(2, 3600) as u32;
    std::fs::write(&stand_in, script(job_s)).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&stand_in, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let mut watch = setup::watch(&dir, c.conf()).unwrap();
    let limit = Duration::from_secs(60 + (jobs as u64 * u64::from(job_s)) / gpus as u64 * 3);
    let script_path = stand_in.display().to_string();

    // The same jobs as plain ones (a GPU each), then as kace ones (a GPU's half each).
    let plain_jobs: Vec<Vec<String>> =
        (0..jobs).map(|_| vec!["--gres=shard:2".into(), script_path.clone()]).collect();
    let (plain, _) = phase(&c, &plain_jobs, limit);
    let kace_jobs: Vec<Vec<String>> = (0..jobs)
        .map(|i| {
            vec![
                format!("--kace-colocate={}", names[i % names.len()]),
                "--gres=shard:1".into(),
                script_path.clone(),
            ]
        })
        .collect();
    let decider_dir = dir.join("run/decider");
    let passes = || {
        kace_node::decider_state::DeciderState::peek(&decider_dir)
            .ok()
            .flatten()
            .map(|s| (s.passes_total, s.pass_seconds_total, s.minutes))
            .unwrap_or_default()
    };
    let (passes_before, seconds_before, _) = passes();
    let (k, ids) = phase(&c, &kace_jobs, limit);
    let (passes_after, seconds_after, minutes) = passes();
    let kace_passes = passes_after.saturating_sub(passes_before);
    let mean_pass_ms = 1e3 * (seconds_after - seconds_before) / kace_passes.max(1) as f64;
    let first_minute = (k.first_submit / 60.0) as u64;
    let slowest_pass_ms = 1e3
        * minutes
            .iter()
            .filter(|m| m.minute >= first_minute)
            .map(|m| m.slowest_pass_s)
            .fold(0.0, f64::max);

    // With nothing held: the decider's backstop only.
    std::thread::sleep(Duration::from_secs(3));
    reset_rpcs(&c);
    let idle_s = 30.0;
    std::thread::sleep(Duration::from_secs_f64(idle_s));
    let idle = rpcs(&c);
    let _ = watch.kill();
    let _ = watch.wait();

    // Occupancy while kace jobs were held: GPU time covered by kace's own records.
    let recs = setup::gpu_records(&dir.join("state"));
    let (a, b) = (k.first_submit, k.last_start);
    let mut by_gpu: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    // The same GPUs with Slurm's start and end of each job (its allocation, the prolog's time
    // included), to hold against plain jobs measured the same way.
    let mut by_gpu_slurm: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for r in recs.iter().filter(|r| ids.contains(&r.job)) {
        by_gpu.entry(r.at.clone()).or_default().push((r.start, r.end));
        if let Some(&span) = k.spans.get(&r.job) {
            by_gpu_slurm.entry(r.at.clone()).or_default().push(span);
        }
    }
    let share = |covered: f64, a: f64, b: f64| {
        if b > a {
            covered / (gpus as f64 * (b - a))
        } else {
            1.0
        }
    };
    let occupancy = share(covered(&mut by_gpu, a, b), a, b);
    let by_slurm = share(covered(&mut by_gpu_slurm, a, b), a, b);
    // A plain job holds a whole GPU (shard:2 of 2): its own span is its GPU's.
    let mut plain_spans: BTreeMap<String, Vec<(f64, f64)>> =
        plain.spans.iter().map(|(j, span)| (j.to_string(), vec![*span])).collect();
    let (pa, pb) = (plain.first_submit, plain.last_start);
    let plain_by_slurm = share(covered(&mut plain_spans, pa, pb), pa, pb);

    // No job released twice, by the one decider's own account.
    let mut log = std::fs::read_to_string(dir.join("dispatch-watch.out")).unwrap_or_default();
    log += &std::fs::read_to_string(dir.join("log/kace-kace-dispatch.log")).unwrap_or_default();
    let mut released: BTreeMap<u32, usize> = BTreeMap::new();
    for line in log.lines() {
        let Some(rest) = line.split("released job ").nth(1) else { continue };
        if let Some(j) = rest.split_whitespace().next().and_then(|j| j.parse().ok()) {
            *released.entry(j).or_default() += 1;
        }
    }
    let twice: Vec<_> = released.iter().filter(|(_, n)| **n > 1).collect();
    let paired = recs
        .iter()
        .filter(|r| ids.contains(&r.job))
        .filter(|r| {
            recs.iter()
                .any(|o| o.at == r.at && o.job != r.job && o.start < r.end && o.end > r.start)
        })
        .count();

    let extra_rpcs = (k.rpcs.saturating_sub(k.polls) as f64
        - plain.rpcs.saturating_sub(plain.polls) as f64)
        / jobs as f64;
    eprintln!(
        "scale: {nodes} nodes × {GPUS_PER_NODE} GPUs, {jobs} jobs of {job_s} s | plain shard:2: \
         makespan {:.0} s, hold p50 {:.0} s p95 {:.0} s, {} RPCs | kace: makespan {:.0} s, hold \
         p50 {:.0} s p95 {:.0} s, {} RPCs, {paired} of {jobs} ran paired, occupancy while held \
         {:.1} % | kace RPCs per job beyond plain {extra_rpcs:.2} | idle {idle} RPCs in {idle_s} s \
         | occupancy while held by Slurm's start and end: kace {:.1} %, plain {:.1} %",
        plain.makespan,
        plain.hold_p50,
        plain.hold_p95,
        plain.rpcs,
        k.makespan,
        k.hold_p50,
        k.hold_p95,
        k.rpcs,
        occupancy * 100.0,
        by_slurm * 100.0,
        plain_by_slurm * 100.0
    );
    eprintln!(
        "scale: RPCs per kace job beyond plain, by type: {}",
        kinds_beyond(&k.kinds, &plain.kinds, jobs)
    );
    eprintln!(
        "scale: the decider's passes while kace jobs ran: {kace_passes}, {mean_pass_ms:.0} ms \
         on average, the slowest {slowest_pass_ms:.0} ms"
    );

    c.run_ok("scontrol", &["ping"]).unwrap();
    let sinfo = c.run_ok("sinfo", &["-h", "-N", "-o", "%N %t"]).unwrap();
    assert!(!sinfo.contains("drain") && !sinfo.contains("down"), "{sinfo}");
    assert!(twice.is_empty(), "released twice: {twice:?}");
    assert!(k.makespan <= 1.25 * plain.makespan, "makespan {} vs {}", k.makespan, plain.makespan);
    assert!(
        k.hold_p95 <= 2.0 * plain.hold_p95.max(1.0),
        "hold p95 {} vs {}",
        k.hold_p95,
        plain.hold_p95
    );
    assert!(occupancy >= 0.9, "GPU occupancy while held {:.3}", occupancy);
    // The goal is 8. Slurm 22.05 forces three more commands per job through its command line
    // (tests/tests/slurm_output.rs measures each): no `scontrol --json`, so the prolog's and the
    // pin's one-job reads are `squeue -j` (+1 each, its partitions), and no direct untyped→typed
    // GRES change (+1, the clear). One libslurm update would carry it all (ARCHITECTURE.md).
    // `slurm 26.05.3`, or Debian's `slurm-wlm 22.05.8`.
    let version = c.run_ok("scontrol", &["-V"]).unwrap_or_default();
    let before_23 = version.split_whitespace().last().is_some_and(|v| v.starts_with("22."));
    let budget = if before_23 { 11.0 } else { 8.0 };
    assert!(
        extra_rpcs <= budget,
        "{extra_rpcs:.2} RPCs per kace job beyond a plain one (budget {budget})"
    );
    assert!(idle as f64 <= 0.2 * idle_s, "{idle} RPCs in {idle_s} s with nothing held");
    // The pairing happened at all (the model accepts some of these pairs).
    assert!(paired > 0, "no kace job ran paired");
    kace(&c, &["ingest"]);
}
