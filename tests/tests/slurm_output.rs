//! What this Slurm prints for the commands kace runs, captured from a real cluster and read by
//! kace's parsers (`node/tests/fixtures/check.rs`, the same checks the unit tests run on the
//! committed captures). Jobs in every state kace must tell apart: a lead and the partner kace's
//! own `pin` moved onto its GPU, a held job whose comment, name and command line forge fields,
//! an admin's hold, an unmet dependency, a `--begin` ahead, a plain job on an untyped request,
//! and a plain held job whose AdminComment has a newline.
//!
//! With `KACE_FIXTURES_OUT=<dir>` the capture is kept in `<dir>/<version>/` (this is how
//! `node/tests/fixtures/` was made: run it once per release with `KACE_SLURM_PREFIX`).

#[path = "../../node/tests/fixtures/check.rs"]
mod check;

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use kace_e2e::{Cluster, NodeSpec};
use kace_node::slurm::{Slurm, Target, QUEUE_FORMAT, QUEUE_STATES};

const FORGED: &str = "AdminComment=kace:forged JobState=RUNNING Reason=None NodeList=n9 \
                      GRES=shard:g0:1(IDX:0) TresPerNode=gres/shard:g1:1";

#[test]
#[ignore = "needs root and Slurm"]
fn kace_reads_what_this_slurm_prints() {
    let test = "kace_reads_what_this_slurm_prints";
    kace_e2e::require_e2e(test);
    let c = Cluster::builder()
        .nodes(vec![
            NodeSpec::new("n1", 2).shards_per_gpu(2).features(&["fa"]),
            NodeSpec::new("n2", 2).shards_per_gpu(2).features(&["fb"]),
        ])
        .typed_gpus(true)
        .start()
        .unwrap();
    // kace's Commands find the cluster as the hooks do, through SLURM_CONF (one test in this
    // binary, so setting it for the process is safe).
    std::env::set_var("SLURM_CONF", c.conf());
    let slurm = c.slurm();
    let commands = common::commands(slurm, Duration::from_secs(10));
    let comment = format!("--comment={FORGED}");
    let name = format!("--job-name=x {FORGED}");
    let forged_script = format!("sleep 600 # {FORGED}");
    let kace = |w: &str, extra: &[&str]| {
        let opt = format!("--kace-colocate={w}");
        let mut args = vec![opt.as_str(), "--gres=shard:1"];
        args.extend_from_slice(extra);
        c.sbatch(&args).unwrap()
    };
    let mut roles: BTreeMap<&str, u32> = BTreeMap::new();

    let lead = {
        let args = ["--kace-colocate=lead", "--gres=shard:g1:1", "-w", "n1", "--wrap", "sleep 600"];
        c.sbatch(&args).unwrap()
    };
    c.run_ok("scontrol", &["release", &lead.to_string()]).unwrap();
    roles.insert("lead", lead);
    let partner = kace("partner", &[&comment, &name, "--wrap", &forged_script]);
    commands
        .pin(partner, &Target { node: "n1".into(), kind: Some("g1".into()) }, 1, None, None)
        .unwrap();
    commands.release(partner).unwrap();
    roles.insert("partner", partner);
    roles.insert("held", kace("held", &[&comment, &name, "--wrap", &forged_script]));
    let admin = kace("admin", &["--wrap", "sleep 600"]);
    c.run_ok("scontrol", &["hold", &admin.to_string()]).unwrap();
    roles.insert("admin", admin);
    let dep = format!("--dependency=afterok:{lead}");
    roles.insert("dependent", kace("dependent", &[&dep, "--wrap", "sleep 600"]));
    roles.insert("begin", kace("begin", &["--begin=now+1hour", "--wrap", "sleep 600"]));
    roles.insert("timed", kace("timed", &["--time=5", "--wrap", "sleep 600"]));
    // A constraint with an OR: `|` is also the listing's delimiter.
    roles.insert("either", kace("either", &["--begin=now+1hour", "-C", "fa|fb", "--wrap", "true"]));
    let plain = c.sbatch(&["--gres=shard:1", "-w", "n2", "--wrap", "sleep 600"]).unwrap();
    roles.insert("plain", plain);
    let note = c.sbatch(&["--hold", "--gres=shard:1", "--wrap", "true"]).unwrap();
    c.run_ok("scontrol", &["update", &format!("jobid={note}"), "AdminComment=note\n9|kace:x|"])
        .unwrap();
    roles.insert("note", note);

    // Lead, partner and the plain job running.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let queue = commands.kace_queue().unwrap();
        let running: Vec<_> = queue.iter().filter(|j| j.on_gpu() && !j.starting()).collect();
        let plain_up = commands.job(plain).unwrap().state == "RUNNING";
        if running.len() == 2 && plain_up {
            break;
        }
        assert!(Instant::now() < deadline, "not running yet: {running:?}\n{}", c.slurmctld_log());
        std::thread::sleep(Duration::from_millis(200));
    }

    let version = c.run_ok("scontrol", &["-V"]).unwrap();
    // `slurm 26.05.3`, or Debian's `slurm-wlm 22.05.8`.
    let version = version.split_whitespace().last().unwrap_or("unknown").to_string();
    let out = match std::env::var_os("KACE_FIXTURES_OUT") {
        Some(d) => PathBuf::from(d).join(&version),
        None => c.dir().join("capture"),
    };
    std::fs::create_dir_all(&out).unwrap();
    let save = |name: &str, program: &str, args: &[&str]| {
        let text = c.run_ok(program, args).unwrap();
        std::fs::write(out.join(name), text).unwrap();
    };
    save("queue.txt", "squeue", &["-h", "-t", QUEUE_STATES, "-O", QUEUE_FORMAT]);
    let held = roles["held"].to_string();
    save("job-held.json", "squeue", &["--json", "-j", &held]);
    save("job-partner.json", "squeue", &["--json", "-j", &partner.to_string()]);
    // `scontrol --json` exists from 23.02 (kace uses it there; 22.05 refuses the option).
    let sc = c.run("scontrol", &["--json", "show", "job", &held]).unwrap();
    if sc.status.success() {
        std::fs::write(out.join("scontrol-held.json"), &sc.stdout).unwrap();
    }
    save("running.json", "squeue", &["--json", "-t", "R,CF"]);
    save("nodes.txt", "sinfo", &["-h", "-N", "-O", kace_node::slurm::NODES_FORMAT]);
    save("on-n1.txt", "squeue", &["-h", "-w", "n1", "-O", "JobID:|"]);
    save("scontrol-partner.txt", "scontrol", &["-o", "-d", "show", "job", &partner.to_string()]);
    std::fs::write(out.join("roles.json"), serde_json::to_string_pretty(&roles).unwrap() + "\n")
        .unwrap();
    eprintln!("slurm_output: Slurm {version}, captured into {}", out.display());

    check::check(&out);
    // And live, through the real commands: the forged text changes nothing kace reads.
    let queue = commands.kace_queue().unwrap();
    let h = queue.iter().find(|j| j.id == roles["held"]).unwrap();
    assert_eq!((h.workload.as_str(), h.held()), ("held", true), "{h:?}");
    let p = commands.job(partner).unwrap();
    assert_eq!((p.workload(), p.nodes.as_str()), (Some("partner"), "n1"), "{p:?}");
    assert_eq!(p.on_gpu(1).and_then(|g| g.kind.as_deref()), Some("g1"), "{p:?}");
    // The decider's one read of a running job's GPU, forged text and all.
    assert_eq!(commands.job_gpus(partner, "n1").unwrap(), vec![1]);
    let q = commands.queued(partner).unwrap().expect("the partner, read singly");
    assert_eq!((q.workload.as_str(), q.node.as_str(), q.state.as_str()), ("partner", "n1", "R"));

    // What each command costs slurmctld, against the table the decider, `kace metrics` and
    // `kace doctor --controller` count with (CommandKind::rpcs): sdiag around each call.
    let held = roles["held"];
    type Op = Box<dyn Fn(&kace_node::slurm::Commands)>;
    let ops: Vec<(&str, Op)> = vec![
        ("the pass's listing", Box::new(|s| drop(s.kace_queue().unwrap()))),
        ("one job, listed", Box::new(move |s| drop(s.queued(partner).unwrap()))),
        ("one job's record", Box::new(move |s| drop(s.job(partner).unwrap()))),
        ("one job's GPUs", Box::new(move |s| drop(s.job_gpus(partner, "n1").unwrap()))),
        ("a step on the node", Box::new(move |s| assert!(s.steps_here(partner, "n1").unwrap()))),
        ("the nodes", Box::new(|s| drop(s.nodes().unwrap()))),
        // priority/basic here: the weights only (tests/tests/accounting.rs reads the rest).
        ("the priority factors", Box::new(|s| drop(s.priority_inputs().unwrap()))),
        ("a time limit", Box::new(move |s| s.set_time_limit(held, 30, None).unwrap())),
        ("holding again", Box::new(move |s| s.hold_again(held).unwrap())),
        (
            "a pin",
            Box::new(move |s| {
                let to = Target { node: "n2".into(), kind: Some("g0".into()) };
                s.pin(held, &to, 1, None, Some("kace:w shared=1")).unwrap()
            }),
        ),
        ("its release", Box::new(move |s| s.release(held).unwrap())),
    ];
    let mut over = Vec::new();
    for (what, op) in &ops {
        let s = common::commands(slurm, Duration::from_secs(10));
        c.reset_rpc_counts().unwrap();
        op(&s);
        let seen = c.rpc_counts().unwrap();
        // A released job's launch sends slurmd's own messages (prolog and step completions,
        // registrations), which are not the command's.
        let seen: BTreeMap<String, u64> = seen
            .into_iter()
            .filter(|(k, _)| !k.starts_with("MESSAGE_") && !k.contains("COMPLETE"))
            .collect();
        let total: u64 = seen.values().sum();
        let table: u64 = s.counts.snapshot().iter().map(|(k, n)| k.rpcs() * n).sum();
        eprintln!("slurm_output: {what}: {total} RPC(s) (table: {table}): {seen:?}");
        if total > table {
            over.push(format!("{what}: {total} > {table} ({seen:?})"));
        }
    }
    assert!(over.is_empty(), "commands cost more than kace counts: {over:?}");
}
