//! Two kace jobs failing together on one GPU's MPS server, end to end on a real Slurm cluster
//! (issue 33 item 2): the way a fatal GPU error in one MPS client ends every client's work (the
//! GPU and its fault are what cannot exist here; the jobs fail as such clients do, seconds
//! apart with a CUDA error). Each epilog spools a failure record from Slurm's exit status,
//! `kace ingest` blocks the pair, `kace explain` tells each job's user what happened, the next
//! lead of that workload does not take the other beside it, and `kace pairs clear` lifts it.

mod common;

use std::time::Duration;

use common::{field, json, kace, lead_with_candidates};
use kace_e2e::{kace as setup, Cluster, NodeSpec};

/// A job that reports progress until the test drops `<dir>/fault`, then fails as a CUDA client
/// hit by a fatal error does (an error line, exit 1).
fn until_fault(dir: &std::path::Path) -> String {
    format!(
        "i=0; while [ ! -e {0}/fault ]; do echo \"$(date +%s.%N) $i\" >> \"$KACE_PROGRESS_FILE\"; \
         i=$((i+3)); sleep 0.2; done; echo 'CUDA error: an illegal memory access was encountered' >&2; \
         exit 1",
        dir.display()
    )
}

#[test]
#[ignore = "needs root and Slurm"]
fn jobs_that_fail_together_on_a_shared_server_are_not_paired_again() {
    let test = "jobs_that_fail_together_on_a_shared_server_are_not_paired_again";
    kace_e2e::require_e2e(test);
    let c = setup::with_hooks(Cluster::builder().nodes(vec![NodeSpec::new("n1", 1)]))
        .unwrap()
        .start()
        .unwrap();
    let dir = c.dir().to_path_buf();
    common::prepare(&c, 300);
    let (lead_w, cands) = lead_with_candidates(&dir.join("kace.db"), 1);
    let cand_w = &cands[0];
    let submit = |w: &str, script: &str| {
        let opt = format!("--kace-colocate={w}");
        c.sbatch(&[&opt, "--gres=shard:1", "--wrap", script]).unwrap()
    };
    let script = until_fault(&dir);
    let lead = submit(&lead_w, &script);
    let partner = submit(cand_w, &script);
    kace(&c, &["dispatch"]);
    for id in [lead, partner] {
        let running = c.wait_job(id, "running", Duration::from_secs(30), |j| {
            field(j, "JobState") == "RUNNING"
        });
        if let Err(e) = running {
            let log =
                std::fs::read_to_string(dir.join("log/kace-kace-dispatch.log")).unwrap_or_default();
            panic!("{e:?}\ndispatch log:\n{log}");
        }
    }
    // Both have written progress beside each other; then the fault reaches both, and the
    // server logs it as NVIDIA's did on the H200 (kace_node::mps_log: the node's local time,
    // the line naming the first client connected, which need not be the culprit).
    std::thread::sleep(Duration::from_secs(3));
    let now = std::process::Command::new("date").arg("+%Y-%m-%d %H:%M:%S.%3N").output().unwrap();
    let stamp = String::from_utf8(now.stdout).unwrap().trim().to_string();
    let log_dir = kace_layout::mps_dirs(&dir.join("mps"), kace_layout::GpuIndex(0)).log;
    std::fs::create_dir_all(&log_dir).unwrap();
    std::fs::write(
        log_dir.join("server.log"),
        format!(
            "[{stamp} Other  4242] Client {{PID: 4300}} encountered a fatal GPU error.\n\
             [{stamp} Other  4242] Server is handling a fatal GPU error.\n"
        ),
    )
    .unwrap();
    std::fs::write(dir.join("fault"), "").unwrap();
    for id in [lead, partner] {
        let j = c.wait_done(id, Duration::from_secs(30)).unwrap();
        assert_eq!(field(&j, "JobState"), "FAILED", "{j:?}");
    }
    let epilog_log =
        || std::fs::read_to_string(dir.join("log/kace-kace-epilog.log")).unwrap_or_default();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !epilog_log().contains(&format!("job {lead}: failed (1:0)"))
        || !epilog_log().contains(&format!("job {partner}: failed (1:0)"))
    {
        assert!(std::time::Instant::now() < deadline, "no failure records:\n{}", epilog_log());
        std::thread::sleep(Duration::from_millis(200));
    }

    let ingested = json(&c, &["ingest"]);
    assert_eq!(ingested["failures"]["inserted"], 2, "{ingested}");
    let pairs = json(&c, &["pairs"]);
    let listed = pairs.as_array().cloned().unwrap_or_default();
    assert_eq!(listed.len(), 1, "{pairs}");
    let mut want = [lead_w.clone(), cand_w.clone()];
    want.sort();
    assert_eq!(listed[0]["workloads"], serde_json::json!(want), "{pairs}");
    let told = kace(&c, &["explain", &partner.to_string()]);
    assert!(
        told.contains(&format!("job {lead} failed with it")) && told.contains("kace pairs clear"),
        "{told}"
    );
    assert!(told.contains("the GPU's MPS server logged a fatal GPU error at"), "{told}");

    // A new lead of the same workload does not take the other beside it: while the lead runs,
    // the decider's passes leave it held (it runs once the GPU is free, as a lead).
    std::fs::remove_file(dir.join("fault")).unwrap();
    let worker = common::worker(8, 3);
    let lead2 = submit(&lead_w, &worker);
    let held = submit(cand_w, &worker);
    kace(&c, &["dispatch"]);
    c.wait_job(lead2, "running", Duration::from_secs(30), |j| field(j, "JobState") == "RUNNING")
        .unwrap();
    for _ in 0..3 {
        kace(&c, &["dispatch"]);
        assert_eq!(field(&c.job(lead2).unwrap(), "JobState"), "RUNNING", "the lead ended early");
        assert_eq!(field(&c.job(held).unwrap(), "Reason"), "JobHeldUser", "it was paired anyway");
        std::thread::sleep(Duration::from_millis(500));
    }
    // The decision every decider makes says why.
    let d = json(&c, &["select", "--dry-run", "--lead", &lead_w, "--candidates", cand_w]);
    let why = d["candidates"][0]["rejected"].as_str().unwrap_or_default().to_string();
    assert!(why.starts_with("failed together before"), "{d}");

    let cleared = json(&c, &["pairs", "clear", cand_w, &lead_w]);
    assert_eq!(cleared["was_blocked"], true, "{cleared}");
    assert_eq!(json(&c, &["pairs"]), serde_json::json!([]));
    common::cancel_and_wait(&c, &[lead2, held], Duration::from_secs(30));
}
