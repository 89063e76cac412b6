//! Co-scheduling on nodes with two typed fake GPUs each, and failure drills: each drill breaks
//! one thing kace depends on (database, scontrol, MPS control, NVML, a candidate vanishing, two
//! leads at once) and checks that the lead still runs, the node is not drained, and the prolog
//! said why it did less. One cluster for all cases; the cases take turns (a lock), since they
//! change the shared kace.conf.

mod common;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use common::{field, kace, lead_with_candidates, placement, worker};
use kace_e2e::{kace as setup, Cluster, NodeSpec};

const WAIT: Duration = Duration::from_secs(40);

static TURN: Mutex<()> = Mutex::new(());

struct Env {
    c: Arc<Cluster>,
    lead: String,
    cands: Vec<String>,
    /// Where this case's part of the shared decider log starts.
    log_from: usize,
    _turn: MutexGuard<'static, ()>,
}

fn env(test: &str) -> Env {
    let turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let c = kace_e2e::shared(test, || {
        Cluster::builder()
            .nodes(vec![
                NodeSpec::new("n1", 2).shards_per_gpu(2),
                NodeSpec::new("n2", 2).shards_per_gpu(2),
            ])
            .typed_gpus(true)
            .prolog(setup::hook("kace-prolog", "").unwrap())
            .epilog(setup::hook("kace-epilog", "").unwrap())
            .prolog_slurmctld(setup::hook("kace-dispatch", "").unwrap())
            .epilog_slurmctld(setup::hook("kace-dispatch", "").unwrap())
    });
    if !c.dir().join("kace.db").exists() {
        common::prepare(&c, 600);
    }
    // Each case starts from an empty queue (a failed case may leave held jobs behind), the
    // standard configuration and a working fake MPS control.
    let queued = c.run_ok("squeue", &["-h", "-O", "JobID:|"]).unwrap();
    common::cancel_and_wait(&c, &kace_node::slurm::parse_ids(&queued), WAIT);
    std::fs::write(c.dir().join("etc/kace.conf"), setup::conf(c.dir(), 600)).unwrap();
    let _ = std::fs::remove_file(c.dir().join("mps-fail"));
    let (lead, cands) = lead_with_candidates(&c.dir().join("kace.db"), 3);
    // A decider pass of the previous case (its kace-dispatch runs, with that case's kace.conf,
    // for as long as its broken Slurm commands take) ends before this case begins.
    let lock = c.dir().join("run/dispatch.lock");
    let until = Instant::now() + WAIT;
    while lock.exists() && kace_node::state::try_lock_file(&lock).ok().flatten().is_none() {
        assert!(Instant::now() < until, "a decider pass of an earlier case never ended");
        std::thread::sleep(Duration::from_millis(100));
    }
    let log_from = std::fs::metadata(c.dir().join("log/kace-kace-dispatch.log"))
        .map(|m| m.len() as usize)
        .unwrap_or(0);
    Env { c, lead, cands, log_from, _turn: turn }
}

impl Env {
    fn conf_line(&self, section: &str, line: &str) {
        let p = self.c.dir().join("etc/kace.conf");
        let text = std::fs::read_to_string(&p).unwrap();
        let header = format!("[{section}]\n");
        let key = line.split('=').next().unwrap().trim();
        let kept: Vec<&str> =
            text.lines().filter(|l| l.split('=').next().unwrap().trim() != key).collect();
        let text = kept.join("\n").replace(&header, &format!("{header}{line}\n"));
        std::fs::write(&p, text).unwrap();
    }

    fn submit(&self, workload: &str, gres: &str, node: Option<&str>, secs: u32) -> u32 {
        let opt = format!("--kace-colocate={workload}");
        let g = format!("--gres={gres}");
        let mut args = vec![opt.as_str(), g.as_str()];
        if let Some(n) = node {
            args.extend(["-w", n]);
        }
        let script = worker(secs, 2);
        args.extend(["--wrap", script.as_str()]);
        self.c.sbatch(&args).unwrap()
    }

    fn prolog_log(&self) -> String {
        std::fs::read_to_string(self.c.dir().join("log/kace-kace-prolog.log")).unwrap_or_default()
    }

    /// This case's part of the decider's log (kace-dispatch, run by PrologSlurmctld and
    /// EpilogSlurmctld).
    fn decider_log(&self) -> String {
        let all =
            std::fs::read(self.c.dir().join("log/kace-kace-dispatch.log")).unwrap_or_default();
        String::from_utf8_lossy(all.get(self.log_from..).unwrap_or_default()).into_owned()
    }

    /// Waits for `job` to complete and for its prolog or the decider to have logged `expect`,
    /// then checks the node is not drained. Returns the job's prolog lines and the decider's.
    fn lead_ran(&self, job: u32, expect: &str) -> String {
        let j = self.c.wait_done(job, WAIT).unwrap();
        assert_eq!(field(&j, "JobState"), "COMPLETED", "{j:?}");
        let prefix = format!("kace: prolog: job {job}: ");
        let lines = || -> String {
            let mine: String = self
                .prolog_log()
                .lines()
                .filter(|l| l.starts_with(&prefix))
                .map(|l| format!("{l}\n"))
                .collect();
            mine + &self.decider_log()
        };
        // Read until the line is there (10 s at most). CI on 26.05.3 once found a lead's last
        // line missing when two prologs ran at once: each wrote a line and its newline in two
        // writes to the shared log, so one's line was glued onto the other's (fixed in
        // kace_log::stderr_line); the slurmd logs below say what Slurm did if a line is missing
        // again.
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while !lines().contains(expect) && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(200));
        }
        let lines = lines();
        if !lines.contains(expect) {
            // Unfiltered: a panic's lines carry no job prefix.
            let all = self.prolog_log();
            let tail: Vec<&str> = all.lines().rev().take(40).collect();
            panic!(
                "job {job}: no {expect:?} in:\n{lines}\n--- the prolog log's last lines\n{}\n\
                 --- slurmd n1\n{}\n--- slurmd n2\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
                self.c.slurmd_log("n1"),
                self.c.slurmd_log("n2")
            );
        }
        let sinfo = self.c.run_ok("sinfo", &["-h", "-N", "-o", "%N %t"]).unwrap();
        assert!(!sinfo.contains("drain"), "{sinfo}");
        lines
    }

    fn cancel(&self, ids: &[u32]) {
        let ids: Vec<String> = ids.iter().map(u32::to_string).collect();
        let mut args = vec!["--quiet"];
        args.extend(ids.iter().map(String::as_str));
        let _ = self.c.run("scancel", &args);
        for id in ids {
            let _ = self.c.wait_done(id.parse().unwrap(), WAIT);
        }
    }

    /// A lead on n2's first GPU with held candidates; runs it and returns (lead, candidates).
    fn lead_with_held(&self) -> (u32, Vec<u32>) {
        let held: Vec<u32> =
            self.cands.iter().map(|w| self.submit(w, "shard:1", None, 3)).collect();
        let lead = self.submit(&self.lead, "shard:g0:1", Some("n2"), 3);
        self.c.run_ok("scontrol", &["release", &lead.to_string()]).unwrap();
        (lead, held)
    }
}

#[test]
#[ignore = "needs root and Slurm"]
fn the_partner_lands_on_the_leads_gpu_not_the_free_one() {
    let e = env("the_partner_lands_on_the_leads_gpu_not_the_free_one");
    // The lead takes n1's second GPU; the first stays free, where Slurm would put an untyped
    // shard job by itself.
    let p = e.submit(&e.cands[0], "shard:1", None, 3);
    let lead = e.submit(&e.lead, "shard:g1:1", Some("n1"), 6);
    e.c.run_ok("scontrol", &["release", &lead.to_string()]).unwrap();
    let pj = e.c.wait_job(p, "started", WAIT, |j| field(j, "JobState") != "PENDING").unwrap();
    assert_eq!(field(&pj, "NodeList"), "n1", "{pj:?}");
    // Both on n1's GPU 1 (typed g1), read as kace reads allocations.
    assert_eq!(placement(&e.c, lead), ("n1".to_string(), vec![1]), "the lead's GPU");
    assert_eq!(placement(&e.c, p), ("n1".to_string(), vec![1]), "the partner's GPU");
    let partner = common::kace_view(&e.c, p);
    assert_eq!(
        partner.gres.iter().find(|g| g.count > 0).and_then(|g| g.kind.as_deref()),
        Some("g1")
    );
    let out = e.c.wait_done(p, WAIT).unwrap();
    assert_eq!(field(&out, "JobState"), "COMPLETED");
    assert!(e.c.job_output(p).contains("GPUS=1 "), "{}", e.c.job_output(p));
    e.lead_ran(lead, &format!("released job {p}"));
}

#[test]
#[ignore = "needs root and Slurm"]
fn drill_database_missing() {
    let e = env("drill_database_missing");
    e.conf_line("database", &format!("path = \"{}/nope.db\"", e.c.dir().display()));
    let (lead, held) = e.lead_with_held();
    let lines = e.lead_ran(lead, "couldn't open the database");
    assert!(!lines.contains("to join the kace jobs"), "{lines}");
    e.cancel(&held);
}

#[test]
#[ignore = "needs root and Slurm"]
fn drill_database_corrupt() {
    let e = env("drill_database_corrupt");
    let bad = e.c.dir().join("corrupt.db");
    std::fs::write(&bad, vec![0x5a; 8192]).unwrap();
    e.conf_line("database", &format!("path = \"{}\"", bad.display()));
    let (lead, held) = e.lead_with_held();
    let lines = e.lead_ran(lead, "couldn't open the database");
    assert!(!lines.contains("to join the kace jobs"), "{lines}");
    e.cancel(&held);
}

#[test]
#[ignore = "needs root and Slurm"]
fn drill_scontrol_missing() {
    let e = env("drill_scontrol_missing");
    e.conf_line("node", "scontrol = \"/nonexistent/scontrol\"");
    let (lead, held) = e.lead_with_held();
    // The prolog reads the gate's mark with squeue; the decider reads the lead's GPU with
    // scontrol, and without it leaves the lead's node alone; its other releases fail loudly.
    let lines = e.lead_ran(lead, &format!("couldn't learn the GPU of kace job {lead}"));
    assert!(lines.contains(&format!("job {lead}: lead ")), "{lines}");
    assert!(!lines.contains("released job"), "{lines}");
    e.cancel(&held);
}

#[test]
#[ignore = "needs root and Slurm"]
fn drill_scontrol_hanging() {
    let e = env("drill_scontrol_hanging");
    let hang = e.c.dir().join("hanging-scontrol");
    std::fs::write(&hang, "#!/bin/bash\nexec /bin/sleep 60\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&hang, std::fs::Permissions::from_mode(0o755)).unwrap();
    e.conf_line("node", &format!("scontrol = \"{}\"", hang.display()));
    e.conf_line("node", "command_timeout_ms = 300");
    e.conf_line("node", "prolog_budget_ms = 2000");
    let started = Instant::now();
    let (lead, held) = e.lead_with_held();
    let lines = e.lead_ran(lead, "did not finish within 300ms and was killed");
    assert!(started.elapsed() < Duration::from_secs(30), "{:?}", started.elapsed());
    assert!(!lines.contains("released job"), "{lines}");
    e.cancel(&held);
}

#[test]
#[ignore = "needs root and Slurm"]
fn drill_mps_control_failing() {
    let e = env("drill_mps_control_failing");
    std::fs::write(e.c.dir().join("mps-fail"), "").unwrap();
    let (lead, held) = e.lead_with_held();
    let lines = e.lead_ran(lead, "couldn't start the MPS control daemon for GPU 0");
    // Choosing a partner does not need MPS.
    assert!(lines.contains("released job"), "{lines}");
    e.cancel(&held);
}

#[test]
#[ignore = "needs root and Slurm"]
fn drill_nvml_absent_and_no_memory_configured() {
    let e = env("drill_nvml_absent_and_no_memory_configured");
    let p = e.c.dir().join("etc/kace.conf");
    let text = std::fs::read_to_string(&p).unwrap();
    let text: String = text
        .lines()
        .filter(|l| !l.starts_with("gpu_memory_gib"))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&p, text).unwrap();
    let (lead, held) = e.lead_with_held();
    // The controller has no NVML of the nodes' GPUs: without a configured memory the decider
    // pairs nothing, and says so.
    let lines = e.lead_ran(lead, "node.gpu_memory_gib is not set");
    assert!(!lines.contains("to join the kace jobs"), "{lines}");
    e.cancel(&held);
}

#[test]
#[ignore = "needs root and Slurm"]
fn drill_candidate_cancelled_between_choice_and_release() {
    let e = env("drill_candidate_cancelled_between_choice_and_release");
    // scontrol that cancels the job it is asked to move first: the user's scancel landing
    // between the decider's choice and its release. `mkdir` claims the one cancellation
    // atomically: the decider may make several moves at once.
    let wrapper = e.c.dir().join("cancelling-scontrol");
    std::fs::write(
        &wrapper,
        "#!/bin/bash\nif [ \"$1 $2\" = \"--local update\" ] && mkdir {dir}/cancelled-once 2>/dev/null; then\n  \
         {scancel} \"${3#jobid=}\"; sleep 0.3\nfi\n\
         exec {scontrol} \"$@\"\n"
            .replace("{dir}", &e.c.dir().display().to_string())
            .replace("{scancel}", &e.c.slurm().program("scancel").display().to_string())
            .replace("{scontrol}", &e.c.slurm().program("scontrol").display().to_string()),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    e.conf_line("node", &format!("scontrol = \"{}\"", wrapper.display()));
    let (lead, held) = e.lead_with_held();
    let lines = e.lead_ran(lead, "couldn't release job");
    // The next best was released instead.
    let released: Vec<u32> = held
        .iter()
        .copied()
        .filter(|id| lines.contains(&format!("released job {id} to join the kace jobs")))
        .collect();
    assert_eq!(released.len(), 1, "{lines}");
    let j = e.c.wait_done(released[0], WAIT).unwrap();
    assert_eq!(field(&j, "JobState"), "COMPLETED", "{j:?}");
    e.cancel(&held);
}

#[test]
#[ignore = "needs root and Slurm"]
fn drill_two_leads_start_on_two_nodes_at_once() {
    let e = env("drill_two_leads_start_on_two_nodes_at_once");
    let held: Vec<u32> = e.cands.iter().map(|w| e.submit(w, "shard:1", None, 3)).collect();
    let a = e.submit(&e.lead, "shard:g0:1", Some("n1"), 4);
    let b = e.submit(&e.lead, "shard:g0:1", Some("n2"), 4);
    e.c.run_ok("scontrol", &["release", &a.to_string(), &b.to_string()]).unwrap();
    e.lead_ran(a, "lead ");
    e.lead_ran(b, "lead ");
    // No candidate was released twice: one decider moves jobs.
    let log = e.decider_log();
    for id in &held {
        let tag = format!("released job {id} ");
        assert!(log.matches(&tag).count() <= 1, "job {id} released twice:\n{log}");
    }
    e.cancel(&held);
    kace(&e.c, &["ingest"]);
}

/// Text a job's user controls, written to look like the fields kace reads.
const FORGED: &str = "AdminComment=kace:forged JobState=PENDING Reason=JobHeldUser \
                      NodeList=n9 GRES=shard:g0:1(IDX:0) TresPerNode=gres/shard:g1:1";

#[test]
#[ignore = "needs root and Slurm"]
fn drill_forged_comment_name_and_command_change_nothing_kace_reads() {
    let e = env("drill_forged_comment_name_and_command_change_nothing_kace_reads");
    // Held candidates whose comment, name and command line (26.05 prints it as SubmitLine=)
    // all carry forged fields.
    let comment = format!("--comment={FORGED}");
    let name = format!("--job-name=x {FORGED}");
    let script = format!("{} # {FORGED}", worker(3, 2));
    let held: Vec<u32> = e
        .cands
        .iter()
        .map(|w| {
            let opt = format!("--kace-colocate={w}");
            let args = [opt.as_str(), "--gres=shard:1", &comment, &name, "--wrap", &script];
            e.c.sbatch(&args).unwrap()
        })
        .collect();
    // A running job that is not kace's, with the same forged text, on n1: dispatch must not
    // count it as a kace job holding a GPU.
    let plain =
        e.c.sbatch(&["--gres=shard:g0:1", "-w", "n1", &comment, &name, "--wrap", "sleep 30"])
            .unwrap();
    // (The harness's own reading of `scontrol show job` text would be fooled by the forged
    // comment here, so this waits as kace reads.)
    let deadline = Instant::now() + WAIT;
    while common::kace_view(&e.c, plain).state != "RUNNING" {
        assert!(Instant::now() < deadline, "{:?}", common::kace_view(&e.c, plain));
        std::thread::sleep(Duration::from_millis(100));
    }
    for (id, w) in held.iter().zip(&e.cands) {
        let v = common::kace_view(&e.c, *id);
        assert_eq!(v.admin_comment, format!("kace:{w}"), "job {id}");
        assert_eq!((v.state.as_str(), v.reason.as_str()), ("PENDING", "JobHeldUser"), "job {id}");
        assert!(v.gres.is_empty() && v.nodes.is_empty(), "job {id}: {v:?}");
    }
    let plain_view = common::kace_view(&e.c, plain);
    assert_eq!(plain_view.admin_comment, "", "{plain_view:?}");
    let listed = kace(&e.c, &["--format", "json", "dispatch"]);
    // One dispatch pass: the plain job holds n1's g0, which is not kace's business; every free
    // GPU may get a lead, and none is n9 or a forged node.
    let d: serde_json::Value = serde_json::from_str(&listed).unwrap();
    for l in d["leads"].as_array().unwrap() {
        assert!(held.contains(&(l["job"].as_u64().unwrap() as u32)), "{d}");
        assert!(matches!(l["node"].as_str(), Some("n1" | "n2")), "{d}");
    }
    assert!(d["problems"].as_array().unwrap().is_empty(), "{d}");
    common::cancel_and_wait(&e.c, &[plain], WAIT);
    common::cancel_and_wait(&e.c, &held, WAIT);
}

#[test]
#[ignore = "needs root and Slurm"]
fn drill_newline_in_an_unrelated_admin_comment_stops_neither_dispatch_nor_max_hold() {
    let e = env("drill_newline_in_an_unrelated_admin_comment_stops_neither_dispatch_nor_max_hold");
    // An admin's note with a newline (and a field separator) on a job that is not kace's.
    let other = e.c.sbatch(&["--hold", "--gres=shard:1", "--wrap", "true"]).unwrap();
    e.c.run_ok("scontrol", &["update", &format!("jobid={other}"), "AdminComment=note\n9|kace:x|"])
        .unwrap();
    // Without the refill: otherwise the lead's epilog gives its partner the next held job, and
    // that one's the next, and no job is left held for max_hold.
    let conf = e.c.dir().join("etc/kace.conf");
    let text = std::fs::read_to_string(&conf).unwrap();
    std::fs::write(&conf, format!("{text}[selection]\nrefill = false\n")).unwrap();
    // A lead and held candidates: the decider lists the queue and releases the lead's partner.
    let (lead, held) = e.lead_with_held();
    let lines = e.lead_ran(lead, "released job ");
    assert!(!lines.contains("couldn't list"), "{lines}");
    // max_hold: with 1 s every held kace job is released by the next dispatch.
    e.conf_line("dispatch", "max_hold_s = 1");
    std::thread::sleep(Duration::from_millis(1100));
    // A dispatch pass waits while a kace job is still starting or completing (the lead's end
    // on a loaded machine): max_hold is kept by the next passes, as the timer runs them.
    let still_held = || -> Vec<u32> {
        held.iter()
            .copied()
            .filter(|id| field(&e.c.job(*id).unwrap(), "Reason") == "JobHeldUser")
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut out = String::new();
    let mut still = held.clone();
    while !still.is_empty() && Instant::now() < deadline {
        out.push_str(&kace(&e.c, &["dispatch"]));
        still = still_held();
        if !still.is_empty() {
            std::thread::sleep(Duration::from_millis(500));
        }
    }
    assert!(still.is_empty(), "still held 15 s after max_hold: {still:?}\n{out}");
    // The decider may have released some as leads before max_hold came; any the passes here
    // found still held went for max_hold.
    let log = e.decider_log();
    assert!(!log.contains("couldn't list"), "{log}");
    assert!(out.is_empty() || out.contains("held longer than 1 s"), "{out}");
    e.cancel(&held);
    e.cancel(&[other]);
}
