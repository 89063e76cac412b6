//! `kace doctor` and kace's syslog lines on a real Slurm cluster (two nodes, one fake GPU each,
//! the packaged gate, kace's Prolog/Epilog/EpilogSlurmctld): doctor passes on the cluster as set
//! up (its warnings: no NVML on this host, host GPU numbering under task/none), and names each
//! fault a drill injects, one at a time and all together; then a kace job released by `kace dispatch` leaves its dispatch and
//! prolog lines, as ident `kace`, facility daemon, on a syslog socket the test listens on.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use kace_e2e::{kace as setup, Cluster};

/// The tests of this binary change the shared cluster's files: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn cluster(test: &str) -> Arc<Cluster> {
    let c = kace_e2e::shared(test, || {
        Cluster::builder()
            .prolog(setup::hook("kace-prolog", "").unwrap())
            .epilog(setup::hook("kace-epilog", "").unwrap())
            .prolog_slurmctld(setup::hook("kace-dispatch", "").unwrap())
            .epilog_slurmctld(setup::hook("kace-dispatch", "").unwrap())
    });
    prepare(&c);
    c
}

/// kace's side of the cluster, once: config (syslog to a socket in the cluster directory), fake
/// MPS control, spool, a database with the demo's profiles and a model trained on its pairs, and
/// the plugstack line as the package ships it (`optional`).
fn prepare(c: &Cluster) {
    static DONE: Mutex<bool> = Mutex::new(false);
    let mut done = DONE.lock().unwrap_or_else(|e| e.into_inner());
    if *done {
        return;
    }
    let dir = c.dir();
    let conf = format!(
        "{}[log]\nsyslog_socket = \"{}/syslog.sock\"\n",
        setup::conf(dir, 600),
        dir.display()
    );
    std::fs::write(dir.join("etc/kace.conf"), conf).unwrap();
    let fake = dir.join("fake-mps");
    std::fs::write(&fake, setup::fake_mps_script(dir)).unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::create_dir_all(dir.join("kace-spool")).unwrap();
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/demo");
    kace_ok(c, &["db", "init"]);
    kace_ok(c, &["profile", "import", demo.join("profiles.csv").to_str().unwrap()]);
    kace_ok(c, &["observations", "import", demo.join("pairs.csv").to_str().unwrap()]);
    kace_ok(c, &["train"]);
    let plugstack = dir.join("etc/plugstack.conf");
    let text = std::fs::read_to_string(&plugstack).unwrap();
    std::fs::write(&plugstack, text.replacen("required ", "optional ", 1)).unwrap();
    *done = true;
}

fn kace(c: &Cluster, args: &[&str]) -> Output {
    Command::new(setup::bin_dir().unwrap().join("kace"))
        .args(args)
        .env("KACE_CONFIG", c.dir().join("etc/kace.conf"))
        .env("SLURM_CONF", c.conf())
        .output()
        .unwrap()
}

fn kace_ok(c: &Cluster, args: &[&str]) -> String {
    let out = kace(c, args);
    assert!(out.status.success(), "kace {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `kace doctor --node-name n1 extra…`: (exit code, stdout).
fn doctor(c: &Cluster, extra: &[&str]) -> (i32, String) {
    let mut args = vec!["doctor", "--node-name", "n1"];
    args.extend_from_slice(extra);
    let out = kace(c, &args);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("$ kace {}\n{text}{}", args.join(" "), String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), text)
}

/// The (status, check) of every finding line.
fn verdicts(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let status = w.next()?;
            matches!(status, "ok" | "warn" | "fail").then(|| {
                // Check names are one or two words ("epilog slurmctld", "shard gres").
                let check = l[5..].trim_start();
                let check = check[..check.len().min(16)].trim_end().to_string();
                (status.to_string(), check)
            })
        })
        .collect()
}

fn failing(text: &str) -> Vec<String> {
    verdicts(text).into_iter().filter(|(s, _)| s == "fail").map(|(_, c)| c).collect()
}

#[test]
#[ignore = "needs root and Slurm"]
fn doctor_passes_on_the_cluster_and_names_injected_faults() {
    let _one = serial();
    let c = cluster("doctor_passes_on_the_cluster_and_names_injected_faults");
    let dir = c.dir();

    // Clean: every check ok except NVML (no driver on this host) and device numbering (the test
    // cluster runs task/none, so jobs see host GPU numbers): warnings, exit 5.
    let (code, text) = doctor(&c, &[]);
    let v = verdicts(&text);
    for check in [
        "plugstack",
        "prolog",
        "epilog",
        "prolog flags",
        "shard gres",
        "job_submit",
        "gate",
        "epilog slurmctld",
        "dispatch lock",
        "billing",
        "database",
        "model",
        "spool",
        "progress",
        "mps",
    ] {
        assert!(v.contains(&("ok".into(), check.into())), "{check} is not ok:\n{text}");
    }
    let not_ok: Vec<_> = v.iter().filter(|(s, _)| s != "ok").collect();
    let warned = |check: &str| ("warn".to_string(), check.to_string());
    assert_eq!(not_ok, [&warned("device numbering"), &warned("nvml")], "{text}");
    assert_eq!(code, 5, "warnings exit 5:\n{text}");
    // The node and controller halves are subsets.
    let (_, node) = doctor(&c, &["--node"]);
    assert!(!node.contains("gate") && node.contains("plugstack"), "{node}");
    let (_, ctl) = doctor(&c, &["--controller"]);
    assert!(ctl.contains("gate") && !ctl.contains("plugstack"), "{ctl}");

    // Fault 1: the plugstack snippet was removed (sbatch would lose --kace-colocate).
    let plugstack = dir.join("etc/plugstack.conf");
    let saved_plugstack = std::fs::read_to_string(&plugstack).unwrap();
    std::fs::write(&plugstack, "# kace removed\n").unwrap();
    let (code, text) = doctor(&c, &[]);
    assert_eq!(failing(&text), ["plugstack"], "{text}");
    assert!(text.contains("loads no libkace_spank.so"), "{text}");
    assert_eq!(code, 6, "{text}");
    std::fs::write(&plugstack, &saved_plugstack).unwrap();

    // Fault 2: the gate is an older kace's.
    let gate = dir.join("etc/job_submit.lua");
    let saved_gate = std::fs::read_to_string(&gate).unwrap();
    let old = saved_gate.replace(
        &format!("-- kace-gate-version: {}", env!("CARGO_PKG_VERSION")),
        "-- kace-gate-version: 0.0.1",
    );
    assert_ne!(old, saved_gate, "the packaged gate has no version line");
    std::fs::write(&gate, &old).unwrap();
    let (code, text) = doctor(&c, &[]);
    assert_eq!(failing(&text), ["gate"], "{text}");
    assert!(text.contains("kace 0.0.1's gate"), "{text}");
    assert_eq!(code, 6);

    // Fault 3 (together with 2): the database is not where the config says.
    let missing = dir.join("nowhere/kace.db");
    let (code, text) = doctor(&c, &["--db", missing.to_str().unwrap()]);
    assert_eq!(failing(&text), ["gate", "database"], "{text}");
    assert!(text.contains("kace db init"), "{text}");
    assert_eq!(code, 6);
    std::fs::write(&gate, &saved_gate).unwrap();

    // Fault 4: the spool is not a writable directory on this node (as under root_squash).
    let spool = dir.join("kace-spool");
    std::fs::rename(&spool, dir.join("kace-spool.moved")).unwrap();
    std::fs::write(&spool, "not a directory").unwrap();
    let (code, text) = doctor(&c, &["--node"]);
    assert_eq!(failing(&text), ["spool"], "{text}");
    assert!(text.contains("root_squash"), "{text}");
    assert_eq!(code, 6);
    std::fs::remove_file(&spool).unwrap();
    std::fs::rename(dir.join("kace-spool.moved"), &spool).unwrap();

    let (code, _) = doctor(&c, &[]);
    assert_eq!(code, 5, "restored: back to the two warnings alone");
}

#[test]
#[ignore = "needs root and Slurm"]
fn node_programs_and_dispatch_log_to_syslog() {
    let _one = serial();
    let c = cluster("node_programs_and_dispatch_log_to_syslog");
    let socket = c.dir().join("syslog.sock");
    let _ = std::fs::remove_file(&socket);
    let syslog = UnixDatagram::bind(&socket).unwrap();
    syslog.set_read_timeout(Some(Duration::from_millis(200))).unwrap();

    // The demo database's profiles are the workloads the gate and prolog know.
    let job = c
        .sbatch(&["--kace-colocate=resnet50-train", "--gres=shard:1", "--wrap", "sleep 2"])
        .unwrap();
    let released = kace_ok(&c, &["dispatch"]);
    assert!(released.contains(&format!("released job {job}")), "{released}");
    c.wait_done(job, Duration::from_secs(60)).unwrap();

    let mut lines = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut buf = [0u8; 8192];
    let prolog_line = format!("prolog: job {job}:");
    while Instant::now() < deadline && !lines.iter().any(|l: &String| l.contains(&prolog_line)) {
        if let Ok(n) = syslog.recv(&mut buf) {
            lines.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
    }
    eprintln!("syslog lines:\n{}", lines.join("\n"));
    let dispatch = lines
        .iter()
        .find(|l| l.contains(&format!("dispatch: released job {job} as a lead onto n")))
        .unwrap_or_else(|| panic!("no dispatch line for job {job}: {lines:#?}"));
    // <30>: facility daemon (3) × 8 + info (6); ident kace with the pid.
    assert!(dispatch.starts_with("<30>") && dispatch.contains(" kace["), "{dispatch}");
    let prolog = lines
        .iter()
        .find(|l| l.contains(&prolog_line))
        .unwrap_or_else(|| panic!("no prolog line for job {job}: {lines:#?}"));
    assert!(prolog.contains(" kace[") && prolog.contains("]: prolog: job"), "{prolog}");
    assert!(lines.iter().all(|l| !l.contains('\n')), "one line per event: {lines:#?}");
}
