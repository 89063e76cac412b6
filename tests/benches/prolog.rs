//! The prolog on a real local cluster with 10, 100 and 1 000 held kace candidates: wall time
//! from prolog start to partner release, split into Slurm queries, database and prediction, as
//! kace-prolog measures and logs them (median of 3 leads per size). Targets: database +
//! prediction under 10 ms at 1 000 candidates, the whole prolog under 1 s.
//!
//! `cargo bench -p kace-e2e --bench prolog` as root with Slurm installed (the system's, or the
//! one under `$KACE_SLURM_PREFIX`), trained on the repository's demo data; it says why when it
//! cannot run.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use kace_e2e::{kace as setup, Cluster, NodeSpec};

const SIZES: [usize; 3] = [10, 100, 1000];
const REPS: usize = 3;

fn main() {
    if kace_e2e::e2e_available("bench prolog").is_none() {
        return;
    }
    let c = Cluster::builder()
        .nodes(vec![NodeSpec::new("n1", 1)])
        .prolog(setup::hook("kace-prolog", "").unwrap())
        .epilog(setup::hook("kace-epilog", "").unwrap())
        .slurm_conf_line("MaxJobCount=20000")
        .start()
        .unwrap();
    common::prepare(&c, 86_400);
    // Without the refill: otherwise each leaving job's epilog gives the GPU the next held job,
    // the GPU never empties, and the next lead starts beside them instead of as a lead.
    let conf = c.dir().join("etc/kace.conf");
    let text = std::fs::read_to_string(&conf).unwrap();
    std::fs::write(&conf, format!("{text}[selection]\nrefill = false\n")).unwrap();
    let (lead, cands) = common::lead_with_candidates(&c.dir().join("kace.db"), 4);
    let log = c.dir().join("log/kace-kace-prolog.log");

    let mut held: Vec<u32> = Vec::new();
    let mut rows = Vec::new();
    for n in SIZES {
        let t = Instant::now();
        while held.len() < n {
            let w = format!("--kace-colocate={}", cands[held.len() % cands.len()]);
            held.push(c.sbatch(&[&w, "--gres=shard:1", "--wrap", "sleep 1"]).unwrap());
        }
        eprintln!("bench: {n} held candidates (submitted in {:.1?})", t.elapsed());
        let mut samples: Vec<[f64; 4]> = Vec::new();
        for _ in 0..REPS {
            let opt = format!("--kace-colocate={lead}");
            let id = c.sbatch(&[&opt, "-w", "n1", "--gres=shard:1", "--wrap", "sleep 1"]).unwrap();
            c.run_ok("scontrol", &["release", &id.to_string()]).unwrap();
            let prefix = format!("kace: prolog: job {id}: lead ");
            let deadline = Instant::now() + Duration::from_secs(60);
            let line = loop {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                if let Some(l) = text.lines().find(|l| l.starts_with(&prefix)) {
                    break l.to_string();
                }
                assert!(Instant::now() < deadline, "no prolog line for job {id}:\n{text}");
                std::thread::sleep(Duration::from_millis(20));
            };
            let ms = |key: &str| -> f64 {
                let from = line.find(&format!("{key}=")).unwrap() + key.len() + 1;
                line[from..].split("ms").next().unwrap().parse().unwrap()
            };
            samples.push([ms("slurm"), ms("db"), ms("predict"), ms("total")]);
            let partner = held
                .iter()
                .copied()
                .find(|p| line.contains(&format!("released job {p} ")))
                .unwrap_or_else(|| panic!("no partner released: {line}"));
            c.wait_done(id, Duration::from_secs(60)).unwrap();
            let _ = c.run("scancel", &[&partner.to_string()]);
            c.wait_done(partner, Duration::from_secs(60)).unwrap();
            held.retain(|p| *p != partner);
            let w = format!("--kace-colocate={}", cands[0]);
            held.push(c.sbatch(&[&w, "--gres=shard:1", "--wrap", "sleep 1"]).unwrap());
        }
        let median = |k: usize| {
            let mut v: Vec<f64> = samples.iter().map(|s| s[k]).collect();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        rows.push((n, median(0), median(1), median(2), median(3)));
    }
    println!("kace-prolog on a local Slurm cluster, median of {REPS} leads (ms)");
    println!(
        "{:>10}  {:>9}  {:>7}  {:>10}  {:>13}  {:>9}",
        "candidates", "slurm", "db", "prediction", "kace (db+pred)", "total"
    );
    for (n, s, d, p, t) in rows {
        println!("{n:>10}  {s:>9.2}  {d:>7.2}  {p:>10.3}  {:>13.2}  {t:>9.2}", d + p);
    }
}
