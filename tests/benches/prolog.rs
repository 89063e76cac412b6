//! The node prolog and one decider pass on a real local cluster as slurmctld's queue grows:
//! `KACE_BENCH_SIZES` jobs in slurmctld (default 10, 1 000, 5 000, 20 000; 200 of them held
//! kace candidates, the rest plain held jobs, which cost slurmctld a record each), then per
//! size: the whole kace-prolog of `KACE_BENCH_LEADS` leads (default 5; 100 make a p99; as it
//! logs its own time: its Slurm read is of its
//! own job only, so it should not grow with the queue; MPS start is the fake's) and the wall
//! time of 3 decider passes (`kace dispatch`, one process each: the listing of every job,
//! client-side filtered by squeue, and the decision over every held kace candidate for the
//! lead's GPU). Target: prolog p99 ≤ 50 ms, independent of the queue.
//!
//! `cargo bench -p kace-e2e --bench prolog` as root with Slurm installed (the system's, or the
//! one under `$KACE_SLURM_PREFIX`), trained on the repository's demo data; it says why when it
//! cannot run. Submitting 20 000 jobs takes a few minutes on 2 cores.

#[path = "../tests/common/mod.rs"]
mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::percentile;
use kace_e2e::{kace as setup, Cluster, NodeSpec};

const CANDIDATES: usize = 200;
const LEADS: usize = 5;
const PASSES: usize = 3;

fn sizes() -> Vec<usize> {
    std::env::var("KACE_BENCH_SIZES")
        .ok()
        .map(|v| v.split(',').filter_map(|s| s.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![10, 1000, 5000, 20_000])
}

fn main() {
    if kace_e2e::e2e_available("bench prolog").is_none() {
        return;
    }
    let c = Cluster::builder()
        .nodes(vec![NodeSpec { cpus: 64, ..NodeSpec::new("n1", 1) }])
        .prolog(setup::hook("kace-prolog", "").unwrap())
        .epilog(setup::hook("kace-epilog", "").unwrap())
        .slurm_conf_line("MaxJobCount=50000")
        .start()
        .unwrap();
    common::prepare(&c, 86_400);
    let (lead, cands) = common::lead_with_candidates(&c.dir().join("kace.db"), 4);
    let log = c.dir().join("log/kace-kace-prolog.log");
    let kace_bin = setup::bin_dir().unwrap().join("kace");
    for i in 0..CANDIDATES {
        let w = format!("--kace-colocate={}", cands[i % cands.len()]);
        c.sbatch(&[&w, "--gres=shard:1", "--wrap", "sleep 1"]).unwrap();
    }
    let mut in_ctld = CANDIDATES;
    let mut rows = Vec::new();
    for n in sizes() {
        let t = Instant::now();
        c.submit_many(n.saturating_sub(in_ctld), "--hold --wrap true").unwrap();
        in_ctld = in_ctld.max(n);
        eprintln!("bench: {in_ctld} jobs in slurmctld (submitted in {:.1?})", t.elapsed());
        let mut prolog_ms = Vec::new();
        let mut pass_ms = Vec::new();
        for rep in 0..common::env_usize("KACE_BENCH_LEADS", LEADS) {
            let opt = format!("--kace-colocate={lead}");
            let id = c.sbatch(&[&opt, "-w", "n1", "--gres=shard:1", "--wrap", "sleep 2"]).unwrap();
            c.run_ok("scontrol", &["release", &id.to_string()]).unwrap();
            // "lead …" or "… joined …" (a partner of the last lead may still run there).
            let prefix = format!("kace: prolog: job {id}: ");
            let deadline = Instant::now() + Duration::from_secs(60);
            let line = loop {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                if let Some(l) =
                    text.lines().find(|l| l.starts_with(&prefix) && l.ends_with(" ms)"))
                {
                    break l.to_string();
                }
                assert!(Instant::now() < deadline, "no prolog line for job {id}:\n{text}");
                std::thread::sleep(Duration::from_millis(20));
            };
            let ms: f64 = line
                .rsplit('(')
                .next()
                .and_then(|t| t.strip_suffix(" ms)"))
                .and_then(|t| t.parse().ok())
                .unwrap_or_else(|| panic!("no time in {line:?}"));
            prolog_ms.push(ms);
            if rep < PASSES {
                // One decider pass with the lead running: its partner is chosen among every
                // held candidate.
                let t = Instant::now();
                let out = Command::new(&kace_bin)
                    .args(["--format", "json", "dispatch"])
                    .env("KACE_CONFIG", c.dir().join("etc/kace.conf"))
                    .env("SLURM_CONF", c.conf())
                    .output()
                    .unwrap();
                pass_ms.push(t.elapsed().as_secs_f64() * 1000.0);
                assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            }
            c.wait_done(id, Duration::from_secs(60)).unwrap();
        }
        let p50 = percentile(&mut prolog_ms.clone(), 0.5);
        let p99 = percentile(&mut prolog_ms, 0.99);
        let pass = percentile(&mut pass_ms, 0.5);
        rows.push((in_ctld, p50, p99, pass));
    }
    let leads = common::env_usize("KACE_BENCH_LEADS", LEADS);
    println!(
        "kace-prolog of {leads} leads and one decider pass on a local Slurm cluster ({CANDIDATES} held kace candidates)"
    );
    // Fewer than 100 samples make no p99: the column is then their largest, and says so.
    let high = if leads >= 100 { "prolog p99 ms" } else { "prolog max ms" };
    println!(
        "{:>16}  {:>14}  {:>14}  {:>18}",
        "jobs in ctld", "prolog p50 ms", high, "decider pass ms"
    );
    for (n, p50, p99, pass) in rows {
        println!("{n:>16}  {p50:>14.1}  {p99:>14.1}  {pass:>18.0}");
    }
}
