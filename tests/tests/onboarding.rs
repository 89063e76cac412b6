//! Zero-touch onboarding end to end on a real Slurm cluster (one node, one fake GPU), with the
//! real `kace-sampler` reading a fake NVML that replays fixed readings (`KACE_FAKE_NVML`, as the
//! sampler's own tests do) and the real plugin, prolog and epilog:
//!
//! 1. a workload no admin measured alone runs alone; its epilog turns the sampler's readings
//!    and its progress lines into a profile (source `observed`), `kace ingest` stores it, and
//!    the workload, refused before as an unknown profile, is now a candidate;
//! 2. on its next run it is paired with a lead that is a plain PyTorch training loop,
//!    unmodified, whose progress the plugin's automatic hook reports (the real torch from PyPI,
//!    in the venv `.ci/install-deps` makes);
//! 3. the partner's tasks get `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` with the limit computed from
//!    its observed memcap; it then "outgrows" it (it fails the way the memory guard makes a
//!    PyTorch job fail: an `oom` progress line and exit 1), the lead runs on and completes, both
//!    are recorded, `kace explain` says it, and its memcap is raised.
//!
//! Nobody measures the new workload: no `kace profile run`, no Nsight Compute; the default model
//! predicts from the system profile kace observed (kernel metrics filled from its neighbours).

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{field, json, kace};
use kace_e2e::{kace as setup, Cluster, NodeSpec};
use kace_sql::Db;

/// The workload nobody profiled alone.
const NEW: &str = "newcomer-train";

/// A plain PyTorch training loop, run with the real torch from PyPI
/// ([`kace_test_support::real_python`]): nothing in it knows about kace.
const TRAINING_LOOP: &str = "import time\nimport torch\n\ntorch.set_num_threads(1)\n\
                             model = torch.nn.Linear(16, 1)\n\
                             opt = torch.optim.SGD(model.parameters(), lr=0.01)\n\
                             x = torch.randn(8, 16)\nfor _ in range(120):\n    time.sleep(0.1)\n    \
                             opt.zero_grad()\n    model(x).sum().backward()\n    opt.step()\n";

/// A job of the new workload: `rate` steps per second for `seconds`, written by hand (its own
/// code reports progress); prints the memory limit it was given; with `oom`, it then reports
/// running out of GPU memory the way kace's PyTorch hook does and fails.
fn newcomer(seconds: u32, rate: f64, oom: bool) -> String {
    let tail =
        if oom { "print(f'{time.time():.3f} oom', file=f, flush=True)\nsys.exit(1)\n" } else { "" };
    let py = format!(
        "import os, sys, time\nf = open(os.environ['KACE_PROGRESS_FILE'], 'a')\n\
         t0 = time.time()\nwhile time.time() - t0 < {seconds}:\n    \
         print(f'{{time.time():.3f}} {{(time.time() - t0) * {rate}:.3f}}', file=f, flush=True)\n    \
         time.sleep(0.2)\n{tail}"
    );
    format!("echo LIMIT=${{CUDA_MPS_PINNED_DEVICE_MEM_LIMIT:-none}}\npython3 - <<'EOF'\n{py}EOF\n")
}

fn wait_done(c: &Cluster, ids: &[u32], timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let done = ids.iter().all(|id| {
            let j = c.job(*id).unwrap();
            !matches!(field(&j, "JobState"), "PENDING" | "RUNNING" | "CONFIGURING" | "COMPLETING")
        });
        if done {
            return;
        }
        assert!(Instant::now() < deadline, "jobs {ids:?} did not finish: {}", c.slurmctld_log());
        // The controller's timer: dispatch releases a lead onto the free GPU.
        kace(c, &["dispatch"]);
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
#[ignore = "needs root and Slurm"]
fn a_new_workload_profiles_itself_alone_is_paired_and_cannot_crash_its_partner() {
    let test = "a_new_workload_profiles_itself_alone_is_paired_and_cannot_crash_its_partner";
    kace_e2e::require_e2e(test);
    let hook_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../python/autohook");
    let hook_dir = hook_dir.canonicalize().unwrap();
    let c = Cluster::builder()
        .nodes(vec![NodeSpec::new("n1", 1)])
        .plugin_args(&format!(
            "mps_root={{dir}}/mps progress_root={{dir}}/progress python_hook={}",
            hook_dir.display()
        ))
        .prolog(setup::hook("kace-prolog", "").unwrap())
        .epilog(setup::hook("kace-epilog", "").unwrap())
        .prolog_slurmctld(setup::hook("kace-dispatch", "").unwrap())
        .epilog_slurmctld(setup::hook("kace-dispatch", "").unwrap())
        .start()
        .unwrap();
    let dir = c.dir().to_path_buf();
    common::prepare(&c, 600);
    let conf = dir.join("etc/kace.conf");
    let mut text = std::fs::read_to_string(&conf).unwrap();
    text.push_str(&format!(
        "[sampler]\ndir = \"{}/samples\"\ninterval_ms = 200\ncapacity = 3000\n\
         [profile]\nmin_alone_runs = 1\nmin_samples = 10\n\
         [mps]\nmemory_limit = true\nmemory_limit_margin = 0.1\n",
        dir.display()
    ));
    std::fs::write(&conf, text).unwrap();

    // The new workload mirrors a demo workload that pairs well with some lead, so that once its
    // system profile is measured the model sees the same kind of job.
    let (lead_w, like) = common::lead_with_candidates(&dir.join("kace.db"), 1);
    let like = &like[0];
    let model = Db::open_read_only(&dir.join("kace.db")).unwrap().profiles(&[like], None).unwrap()
        [like.as_str()]
    .clone();
    let v = |i: usize| model.values[i].unwrap();
    let memcap_mib = (v(9) * 1024.0).round() as u64;
    let fake = format!("gpu=Fake;idle_w=50;busy_w=250;samples={},{},{memcap_mib}", v(7), v(8));
    let _sampler =
        setup::start_sampler(&conf, Some(&fake), &dir.join("log/kace-sampler.log")).unwrap();

    let select = || {
        json(
            &c,
            &["select", "--dry-run", "--lead", &lead_w, "--candidates", NEW, "--gpu-memory", "32"],
        )
    };
    // Before: not a candidate.
    let before = select();
    assert_eq!(
        before["candidates"][0]["rejected"],
        "unknown profile (observed alone in 0 of the 1 runs needed)",
        "{before}"
    );

    // 1. It runs alone (dispatch makes it a lead on the free GPU) and measures itself.
    let opt = format!("--kace-colocate={NEW}");
    let alone = c.sbatch(&[&opt, "--gres=shard:1", "--wrap", &newcomer(8, v(6), false)]).unwrap();
    wait_done(&c, &[alone], Duration::from_secs(90));
    assert_eq!(field(&c.job(alone).unwrap(), "JobState"), "COMPLETED");
    assert!(c.job_output(alone).contains("LIMIT=none"), "no memcap yet: {}", c.job_output(alone));
    let ingested = json(&c, &["ingest"]);
    assert_eq!(ingested["profiles"]["inserted"], 1, "{ingested}");
    let shown = json(&c, &["profile", "show", NEW]);
    assert_eq!(shown["observed_alone_runs"], 1, "{shown}");
    assert_eq!(shown["sources"]["sm_pct"], "observed", "{shown}");
    assert_eq!(
        shown["sources"]["threads"],
        serde_json::Value::Null,
        "no admin measured it: {shown}"
    );
    assert_eq!(shown["values"]["sm_pct"], v(7), "{shown}");
    assert_eq!(shown["values"]["memcap_gib"].as_f64(), Some(memcap_mib as f64 / 1024.0));
    assert!(shown["observed_samples"].as_u64().unwrap() >= 10, "{shown}");
    let excl = shown["values"]["exclusive_throughput"].as_f64().unwrap();
    assert!((excl / v(6) - 1.0).abs() < 0.15, "observed {excl} steps/s, ran at {}", v(6));
    let after = select();
    assert_eq!(after["chosen"], NEW, "not chosen after its alone run: {after}");

    // 2. A PyTorch loop leads; the new workload is held and chosen as its partner.
    std::fs::write(dir.join("work/train.py"), TRAINING_LOOP).unwrap();
    let lead_script = format!(
        "export KACE_PROGRESS_INTERVAL=0.2\n{} {}/work/train.py",
        kace_test_support::real_python().display(),
        dir.display()
    );
    // The lead's first progress line comes after torch's import, which from a cold page cache
    // (the first real-library test of a CI run) outlasted the partner's run: nothing was shared
    // and the pair went unobserved. One import beforehand warms the cache.
    let warm = Command::new(kace_test_support::real_python()).args(["-c", "import torch"]).status();
    assert!(warm.is_ok_and(|s| s.success()), "couldn't import torch");
    let lead_opt = format!("--kace-colocate={lead_w}");
    let lead = c.sbatch(&[&lead_opt, "--gres=shard:1", "--wrap", &lead_script]).unwrap();
    let partner = c.sbatch(&[&opt, "--gres=shard:1", "--wrap", &newcomer(10, v(6), true)]).unwrap();
    kace(&c, &["dispatch"]);
    wait_done(&c, &[lead, partner], Duration::from_secs(120));
    let (l, p) = (c.job(lead).unwrap(), c.job(partner).unwrap());
    assert_eq!(field(&l, "JobState"), "COMPLETED", "the lead was ended: {l:?}");
    assert_eq!(field(&p, "JobState"), "FAILED", "{p:?}");
    // 3. The limit reached the partner's tasks: memcap × 1.1, in MiB, for device 0.
    let limit = ((memcap_mib as f64 / 1024.0) * 1024.0 * 1.1).ceil() as u64;
    let out = c.job_output(partner);
    assert!(out.contains(&format!("LIMIT=0={limit}M")), "{out}");

    let ingested = json(&c, &["ingest"]);
    assert!(ingested["inserted"].as_u64().unwrap() >= 2, "{ingested}");
    let e = kace(&c, &["explain", &lead.to_string()]);
    assert!(e.contains(&format!("chose job {partner}")), "{e}");
    let e = kace(&c, &["explain", &partner.to_string()]);
    assert!(
        e.contains(&format!("ran out of GPU memory under its memory limit of {limit} MiB")),
        "{e}"
    );
    // The lead's progress came from the hook alone, shared with the partner and alone again.
    let db = Db::open_read_only(&dir.join("kace.db")).unwrap();
    let lead_obs: Vec<_> =
        db.observations().unwrap().into_iter().filter(|o| o.job == lead.to_string()).collect();
    assert!(
        lead_obs.iter().any(|o| o.partners.iter().any(|p| p.job == partner.to_string())),
        "{lead_obs:#?}\n{}",
        std::fs::read_to_string(dir.join("log/kace-prolog.log")).unwrap_or_default()
            + &std::fs::read_to_string(dir.join("log/kace-epilog.log")).unwrap_or_default()
    );
    assert!(lead_obs.iter().any(|o| o.partners.is_empty()), "{lead_obs:#?}");
    // The sampler read the fake GPU's energy counter (its power: 50 W + 200 W × SM %), and each
    // interval long enough to span a few readings carries the GPU's energy over it.
    let watts = 50.0 + 200.0 * v(7) / 100.0;
    let long: Vec<_> = lead_obs.iter().filter(|o| o.end - o.start >= 2.0).collect();
    assert!(!long.is_empty(), "{lead_obs:#?}");
    for o in long {
        let j = o.gpu_energy_j.unwrap_or_else(|| panic!("no energy: {o:#?}"));
        let expect = watts * (o.end - o.start);
        assert!((j / expect - 1.0).abs() < 0.1, "{j} J, expected {expect}: {o:#?}");
    }
    let report = kace(&c, &["report", "--since", "1d"]);
    assert!(report.contains("energy saved by sharing: "), "{report}");
    let shown = json(&c, &["profile", "show", NEW]);
    assert_eq!(shown["sources"]["memcap_gib"], "observed-oom", "{shown}");
    assert_eq!(shown["values"]["memcap_gib"].as_f64(), Some(limit as f64 / 1024.0));
    let sinfo = c.run_ok("sinfo", &["-h", "-N", "-o", "%N %t"]).unwrap();
    assert!(!sinfo.contains("drain"), "{sinfo}");
}
