//! Keeping GPUs filled, end to end on a real Slurm cluster (one node, one fake GPU, the real
//! kace-prolog, kace-epilog and kace-dispatch): when a partner leaves, the survivor gets a new
//! one from the leaving job's epilog (the refill), and a job submitted while a kace job runs
//! alone joins it through dispatch (an open GPU).

mod common;

use std::time::{Duration, Instant};

use common::{artifact, field, kace, lead_with_candidates, worker};
use kace_e2e::{kace as setup, Cluster, NodeSpec};

const MAX_HOLD_S: u64 = 120;

fn cluster() -> Cluster {
    Cluster::builder()
        .nodes(vec![NodeSpec::new("n1", 1)])
        .prolog(setup::hook("kace-prolog", "").unwrap())
        .epilog(setup::hook("kace-epilog", "").unwrap())
        .epilog_slurmctld(setup::hook("kace-dispatch", "").unwrap())
        .start()
        .unwrap()
}

fn spooled_decisions(c: &Cluster) -> Vec<kace_sql::spool::SpooledDecision> {
    kace_sql::spool::spooled_decisions(&c.dir().join("kace-spool"))
        .unwrap_or_default()
        .into_iter()
        .filter_map(|(_, d)| d.ok())
        .collect()
}

fn state(c: &Cluster, id: u32) -> String {
    field(&c.job(id).unwrap(), "JobState").to_string()
}

#[test]
fn a_survivor_gets_a_new_partner_when_its_partner_ends() {
    let test = "a_survivor_gets_a_new_partner_when_its_partner_ends";
    let Some(art) = artifact() else { return };
    if kace_e2e::e2e_available(test).is_none() {
        return;
    }
    let c = cluster();
    common::prepare(&c, &art, MAX_HOLD_S);
    let (lead_w, cands) = lead_with_candidates(&c.dir().join("kace.db"), 2);
    let submit = |w: &str, secs: u32| {
        let opt = format!("--kace-colocate={w}");
        c.sbatch(&[&opt, "--gres=shard:1", "--wrap", &worker(secs, 3)]).unwrap()
    };
    // A long lead; its first partner is short, so the lead survives it.
    let lead = submit(&lead_w, 30);
    let first = submit(&cands[0], 4);
    let second = submit(&cands[1], 4);
    let out = kace(&c, &["dispatch"]);
    assert!(out.contains(&format!("released job {lead} as a lead")), "{out}");
    // No dispatch pass from here: only the prologs and epilogs act (EpilogSlurmctld passes
    // find the GPU completing or full while the epilog refills it).
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut first_partner = None;
    while Instant::now() < deadline {
        let started: Vec<u32> =
            [first, second].into_iter().filter(|j| state(&c, *j) != "PENDING").collect();
        if first_partner.is_none() && started.len() == 1 {
            first_partner = Some(started[0]);
        }
        if started.len() == 2 {
            break;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    let first_partner = first_partner.expect("the lead chose a partner");
    let other = if first_partner == first { second } else { first };
    assert_ne!(state(&c, other), "PENDING", "the survivor got no new partner");
    assert_eq!(state(&c, lead), "RUNNING", "the lead (survivor) ended too soon");
    // The refill was decided by the first partner's epilog and spooled with its verdicts.
    let refill = spooled_decisions(&c)
        .into_iter()
        .find(|d| d.key.ends_with(&format!("/{first_partner}/refill")))
        .expect("the leaving partner's epilog spooled a refill decision");
    assert_eq!(refill.decision.lead_job, Some(lead.to_string()));
    assert_eq!(refill.decision.chosen_job, Some(other.to_string()));
    let nodes = c.run_ok("scontrol", &["-o", "-d", "show", "job", &other.to_string()]).unwrap();
    assert!(nodes.contains("NodeList=n1"), "{nodes}");
    let sinfo = c.run_ok("sinfo", &["-h", "-N", "-o", "%N %t"]).unwrap();
    assert!(!sinfo.contains("drain"), "{sinfo}");
}

#[test]
fn a_late_arrival_joins_an_open_gpu() {
    let test = "a_late_arrival_joins_an_open_gpu";
    let Some(art) = artifact() else { return };
    if kace_e2e::e2e_available(test).is_none() {
        return;
    }
    let c = cluster();
    common::prepare(&c, &art, MAX_HOLD_S);
    let (lead_w, cands) = lead_with_candidates(&c.dir().join("kace.db"), 1);
    let submit = |w: &str, secs: u32| {
        let opt = format!("--kace-colocate={w}");
        c.sbatch(&[&opt, "--gres=shard:1", "--wrap", &worker(secs, 3)]).unwrap()
    };
    // The lead starts with nothing held: it runs alone.
    let lead = submit(&lead_w, 30);
    kace(&c, &["dispatch"]);
    c.wait_job(lead, "running", Duration::from_secs(20), |j| field(j, "JobState") == "RUNNING")
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    // A job arrives later; a dispatch pass offers it to the open GPU.
    let late = submit(&cands[0], 4);
    let out = kace(&c, &["dispatch"]);
    assert!(
        out.contains(&format!("released job {late} to join the kace jobs on n1 GPU 0")),
        "{out}"
    );
    let j = c
        .wait_job(late, "running", Duration::from_secs(20), |j| field(j, "JobState") != "PENDING")
        .unwrap();
    assert_eq!(field(&j, "NodeList"), "n1");
    assert_eq!(state(&c, lead), "RUNNING");
}
