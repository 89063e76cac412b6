//! The prolog, epilog and dispatch logic against a fake Slurm, a fake MPS control and a fixed
//! GPU, with a real (temporary) database and spool: what is released, what is recorded, what is
//! observed, and that failures leave the job alone.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kace_config::Config;
use kace_layout::release_ticket::{self, Ticket};
use kace_layout::{GpuIndex, MpsDirs};
use kace_node::env::JobEnv;
use kace_node::error::{Error, ExecError, Result};
use kace_node::gpu::GpuInfo;
use kace_node::mps::MpsControl;
use kace_node::read_path::{decide_from_store, JobSpec};
use kace_node::slurm::{GresAlloc, JobDetail, NodeGpus, QueuedJob, RunningJob, Slurm, Target};
use kace_node::slurmd::HookHost;
use kace_node::{dispatch, epilog, prolog, Clock, Node};
use kace_selector::dataset::Group;
use kace_selector::{Model, ModelKind, Objective, Profile, SlowdownParams};
use kace_sql::convert::model_to_new_model;
use kace_sql::spool::{spooled_decisions, ReleaseKind};
use kace_sql::{Db, NewProfile, FEATURE_COUNT};
use kace_test_support::TempDir;

/// A Slurm that holds jobs in memory and records every command.
#[derive(Default)]
struct FakeSlurm {
    pending: RefCell<Vec<QueuedJob>>,
    details: RefCell<BTreeMap<u32, JobDetail>>,
    on_node: RefCell<Vec<u32>>,
    /// Jobs with a step on the node (past their prolog), as slurmstepd answers
    /// `scontrol listpids`.
    stepped: RefCell<Vec<u32>>,
    running: RefCell<Vec<RunningJob>>,
    nodes: Vec<NodeGpus>,
    /// Jobs whose release fails (cancelled meanwhile).
    gone: Vec<u32>,
    /// Job reads that fail first, as while slurmctld restarts.
    unreachable_reads: std::cell::Cell<u32>,
    /// Queue listings that fail first, as while slurmctld is down.
    unreachable_listings: std::cell::Cell<u32>,
    /// What `priority_inputs` answers (default: no multifactor, submission order).
    priority: kace_node::priority::PriorityInputs,
    /// The `AdminComment`s the decider's updates set; the listing reads them back.
    comments: RefCell<BTreeMap<u32, String>>,
    /// Jobs not kace's that count against limits, as the listing shows them.
    others: RefCell<Vec<kace_node::limits::Counted>>,
    /// What `site_limits` answers (default: none enforced).
    limits: kace_node::limits::Limits,
    /// The decider's state directory, when a test wants the begun releases each pin saw
    /// there (`begun_at_pin`).
    decider_dir: Option<std::path::PathBuf>,
    begun_at_pin: RefCell<Vec<Vec<u32>>>,
    calls: RefCell<Vec<String>>,
}

fn failed(what: &str) -> Error {
    Error::Exec(ExecError::Failed {
        command: what.into(),
        code: Some(1),
        stderr: "Invalid job id specified".into(),
    })
}

impl FakeSlurm {
    /// An `AdminComment` an update set, kept for the listing.
    fn comment(&self, id: u32, comment: Option<&str>) {
        if let Some(c) = comment {
            self.calls.borrow_mut().push(format!("comment {id} {c}"));
            self.comments.borrow_mut().insert(id, c.to_string());
        }
    }

    /// A running job as the queue listing shows it.
    fn listed(r: &RunningJob) -> QueuedJob {
        QueuedJob {
            id: r.id,
            workload: r.workload.clone(),
            user: r.user.clone(),
            reason: "None".into(),
            state: r.state.clone(),
            node: r.node.clone(),
            started: r.started,
            ..QueuedJob::default()
        }
    }
}

impl Slurm for FakeSlurm {
    fn listing(&self) -> Result<kace_node::slurm::Listing> {
        self.calls.borrow_mut().push("squeue".into());
        if self.unreachable_listings.get() > 0 {
            self.unreachable_listings.set(self.unreachable_listings.get() - 1);
            return Err(failed("squeue"));
        }
        let mut q = self.pending.borrow().clone();
        q.extend(self.running.borrow().iter().map(FakeSlurm::listed));
        q.sort_by_key(|j| j.id);
        for j in &mut q {
            if let Some(c) = self.comments.borrow().get(&j.id) {
                j.partners = kace_node::slurm::read_mark(c).map(|(_, p)| p).unwrap_or_default();
            }
        }
        Ok(kace_node::slurm::Listing::of_kace(q, self.others.borrow().clone()))
    }
    fn queued(&self, id: u32) -> Result<Option<QueuedJob>> {
        self.calls.borrow_mut().push(format!("queued {id}"));
        if self.unreachable_reads.get() > 0 {
            self.unreachable_reads.set(self.unreachable_reads.get() - 1);
            return Err(Error::Exec(ExecError::Failed {
                command: "squeue -j".into(),
                code: Some(1),
                stderr: "Unable to contact slurm controller (connect failure)".into(),
            }));
        }
        if let Some(j) = self.pending.borrow().iter().find(|j| j.id == id) {
            return Ok(Some(j.clone()));
        }
        if let Some(r) = self.running.borrow().iter().find(|r| r.id == id) {
            return Ok(Some(FakeSlurm::listed(r)));
        }
        let Some(d) = self.details.borrow().get(&id).cloned() else { return Ok(None) };
        let Some(workload) = d.workload().map(str::to_string) else { return Ok(None) };
        // A job Slurm no longer has on the node is listed as ended.
        let on = self.on_node.borrow();
        let state = if on.is_empty() || on.contains(&id) { "R" } else { "CD" };
        Ok(Some(QueuedJob {
            id,
            workload,
            user: d.user.clone(),
            reason: d.reason.clone(),
            state: state.into(),
            node: d.nodes.clone(),
            ..QueuedJob::default()
        }))
    }
    fn job(&self, id: u32) -> Result<JobDetail> {
        self.calls.borrow_mut().push(format!("show {id}"));
        self.details.borrow().get(&id).cloned().ok_or_else(|| failed("scontrol show job"))
    }
    fn job_gpus(&self, id: u32, _node: &str) -> Result<Vec<u32>> {
        self.calls.borrow_mut().push(format!("gpus {id}"));
        if let Some(r) = self.running.borrow().iter().find(|r| r.id == id) {
            return Ok(r.gpus.clone());
        }
        let d = self.details.borrow().get(&id).cloned().ok_or_else(|| failed("scontrol"))?;
        Ok(d.gres.iter().flat_map(|g| g.indices.clone()).collect())
    }
    fn pin(
        &self,
        id: u32,
        target: &Target,
        shards: u32,
        _ours: Option<&str>,
        comment: Option<&str>,
    ) -> Result<()> {
        self.calls
            .borrow_mut()
            .push(format!("pin {id} {} {:?} {shards}", target.node, target.kind));
        if let Some(dir) = &self.decider_dir {
            let begun = kace_node::decider_state::DeciderState::peek(dir)
                .ok()
                .flatten()
                .map(|s| s.begun.keys().copied().collect())
                .unwrap_or_default();
            self.begun_at_pin.borrow_mut().push(begun);
        }
        self.comment(id, comment);
        if self.gone.contains(&id) {
            return Err(failed("scontrol update"));
        }
        Ok(())
    }
    fn release(&self, id: u32) -> Result<()> {
        self.calls.borrow_mut().push(format!("release {id}"));
        let mut p = self.pending.borrow_mut();
        let Some(j) = p.iter_mut().find(|j| j.id == id) else {
            return Err(failed("scontrol release"));
        };
        j.reason = "None".into();
        Ok(())
    }
    fn hand_back(&self, id: u32, shards: u32) -> Result<()> {
        self.calls.borrow_mut().push(format!("hand back {id} {shards}"));
        let mut p = self.pending.borrow_mut();
        let Some(j) = p.iter_mut().find(|j| j.id == id && j.held()) else {
            return Err(failed("scontrol release"));
        };
        j.reason = "None".into();
        Ok(())
    }
    fn set_time_limit(&self, id: u32, minutes: u64, comment: Option<&str>) -> Result<()> {
        self.calls.borrow_mut().push(format!("time limit {id} {minutes}"));
        self.comment(id, comment);
        Ok(())
    }
    fn site_limits(&self) -> Result<kace_node::limits::Limits> {
        self.calls.borrow_mut().push("limits".into());
        Ok(self.limits.clone())
    }
    fn hold_again(&self, id: u32) -> Result<()> {
        self.calls.borrow_mut().push(format!("hold again {id}"));
        let mut p = self.pending.borrow_mut();
        let Some(j) = p.iter_mut().find(|j| j.id == id && j.pending()) else {
            return Err(failed("scontrol uhold"));
        };
        j.reason = "JobHeldUser".into();
        j.req_nodes.clear();
        Ok(())
    }
    fn steps_here(&self, id: u32, _node: &str) -> Result<bool> {
        self.calls.borrow_mut().push(format!("steps {id}"));
        Ok(self.stepped.borrow().contains(&id))
    }
    fn nodes(&self) -> Result<Vec<NodeGpus>> {
        self.calls.borrow_mut().push("sinfo".into());
        Ok(self.nodes.clone())
    }
    fn priority_inputs(&self) -> Result<kace_node::priority::PriorityInputs> {
        self.calls.borrow_mut().push("priority".into());
        Ok(self.priority.clone())
    }
}

#[derive(Default)]
struct FakeMps {
    up: RefCell<bool>,
    fail: bool,
    calls: RefCell<Vec<String>>,
}

impl MpsControl for FakeMps {
    fn running(&self, _dirs: &MpsDirs) -> bool {
        *self.up.borrow()
    }
    fn start(&self, _dirs: &MpsDirs, gpu: GpuIndex, uid: u32, _multi: bool) -> Result<()> {
        self.calls.borrow_mut().push(format!("start {} {uid}", gpu.0));
        if self.fail {
            return Err(failed("nvidia-cuda-mps-control -d"));
        }
        *self.up.borrow_mut() = true;
        Ok(())
    }
    fn quit(&self, _dirs: &MpsDirs) -> Result<()> {
        self.calls.borrow_mut().push("quit".into());
        *self.up.borrow_mut() = false;
        Ok(())
    }
}

struct NoNvml;
impl GpuInfo for NoNvml {
    fn memory_gib(&self, _gpu: GpuIndex) -> std::result::Result<f64, String> {
        Err("couldn't initialise NVML: no driver".into())
    }
}

struct FixedClock(RefCell<f64>);
impl Clock for FixedClock {
    fn now(&self) -> f64 {
        *self.0.borrow()
    }
}

const WORKLOADS: [&str; 6] = ["alpha", "beta", "gamma", "delta", "eps", "zeta"];

/// A profile per workload (deterministic, varied) and an active slowdown model trained on
/// synthetic pairs.
fn make_db(path: &Path) {
    let (mut db, _) = Db::create(path).unwrap();
    let feats = |i: usize| -> [f64; FEATURE_COUNT] {
        let f = i as f64;
        [
            256.0 * (1.0 + f),
            20.0 + 13.0 * f,
            10.0 + 11.0 * (5.0 - f),
            30.0 + 7.0 * f,
            32.0 + 4.0 * f,
            1024.0 * f,
            2.0 + f,
            30.0 + 10.0 * f,
            60.0 - 8.0 * f,
            2.0 + 3.0 * f,
        ]
    };
    let profiles: Vec<NewProfile> = WORKLOADS
        .iter()
        .enumerate()
        .map(|(i, w)| NewProfile {
            workload: w.to_string(),
            gpu_model: "Fake".into(),
            source: "test".into(),
            values: feats(i).map(Some),
        })
        .collect();
    db.insert_profiles(&profiles).unwrap();
    let mut groups = Vec::new();
    for (i, wi) in WORKLOADS.iter().enumerate() {
        for (j, wj) in WORKLOADS.iter().enumerate().skip(i) {
            let (a, b) = (feats(i), feats(j));
            // Interference grows with the partners' summed SM use.
            let slow = 1.0 + (a[7] + b[7]) / 150.0;
            groups.push(Group {
                workloads: vec![wi.to_string(), wj.to_string()],
                profiles: vec![Profile::new(a), Profile::new(b)],
                throughputs: vec![a[6] / slow, b[6] / slow],
            });
        }
    }
    let refs: Vec<&Group> = groups.iter().collect();
    let model = Model::train(
        ModelKind::Slowdown,
        &refs,
        Objective::ThroughputSum,
        SlowdownParams::default(),
    )
    .unwrap();
    let v = db
        .insert_model(&model_to_new_model(&model, serde_json::json!({}), "t".into(), 1).unwrap())
        .unwrap();
    db.activate_model(v).unwrap();
}

fn config(dir: &Path, db: &Path) -> Config {
    let mut c = Config::default();
    c.database.path = db.to_path_buf();
    c.spool.dir = dir.join("spool");
    c.node.state_dir = dir.join("state");
    c.dispatch.state_dir = dir.join("decider");
    c.node.mps_root = dir.join("mps");
    c.node.progress_root = dir.join("progress");
    c.node.gpu_memory_gib = Some(32.0);
    c.profiling.warmup_steps = 0;
    c
}

fn held(id: u32, w: &str, user: &str, gres: &str) -> QueuedJob {
    QueuedJob {
        id,
        workload: w.into(),
        user: user.into(),
        reason: "JobHeldUser".into(),
        tres_per_node: gres.into(),
        submitted: Some(1000.0 + f64::from(id)),
        req_nodes: String::new(),
        state: "PD".into(),
        ..QueuedJob::default()
    }
}

fn running_detail(id: u32, w: &str, gpu: u32, kind: Option<&str>) -> JobDetail {
    JobDetail {
        id,
        state: "RUNNING".into(),
        reason: "None".into(),
        admin_comment: format!("kace:{w}"),
        nodes: "n1".into(),
        gres: vec![GresAlloc {
            name: "shard".into(),
            kind: kind.map(str::to_string),
            count: 1,
            indices: vec![gpu],
        }],
        ..Default::default()
    }
}

fn job_env(job: u32, gpu: u32) -> JobEnv {
    JobEnv {
        job,
        uid: 0,
        user: "alice".into(),
        account: "acct".into(),
        node: "n1".into(),
        cluster: "c".into(),
        kace: true,
        gpu: Some(GpuIndex(gpu)),
        mps_share: None,
        exit: None,
        slurm_start: None,
    }
}

struct World {
    _t: TempDir,
    dir: PathBuf,
    config: Config,
    slurm: FakeSlurm,
    mps: FakeMps,
    clock: FixedClock,
    logs: RefCell<Vec<String>>,
    host: FakeHost,
}

/// A hook's slurmd that can die.
struct FakeHost(std::cell::Cell<bool>);

impl HookHost for FakeHost {
    fn slurmd_alive(&self) -> bool {
        self.0.get()
    }
    fn slurmd_pid(&self) -> Option<u32> {
        Some(4242)
    }
}

impl World {
    fn new(tag: &str, slurm: FakeSlurm) -> World {
        let t = TempDir::new(&format!("node-{tag}"));
        let dir = t.path().to_path_buf();
        let db = dir.join("k.db");
        make_db(&db);
        // The packages create the spool (packaging/kace.spec).
        std::fs::create_dir_all(dir.join("spool")).unwrap();
        World {
            config: config(&dir, &db),
            dir,
            _t: t,
            slurm,
            mps: FakeMps::default(),
            clock: FixedClock(RefCell::new(2000.0)),
            logs: RefCell::new(Vec::new()),
            host: FakeHost(std::cell::Cell::new(true)),
        }
    }

    fn with<R>(&self, f: impl FnOnce(&Node) -> R) -> R {
        let log = |m: &str| self.logs.borrow_mut().push(m.to_string());
        let node = Node {
            config: &self.config,
            slurm: &self.slurm,
            mps: &self.mps,
            gpus: &NoNvml,
            clock: &self.clock,
            deadline: Instant::now() + Duration::from_secs(5),
            log: &log,
            host: &self.host,
        };
        f(&node)
    }

    fn expected_choice(&self, lead: &str, cands: &[QueuedJob]) -> Option<u32> {
        let db = Db::open_read_only(&self.config.database.path).unwrap();
        let specs: Vec<JobSpec> = cands
            .iter()
            .map(|c| JobSpec { workload: c.workload.clone(), user: Some(c.user.clone()) })
            .collect();
        let running = [JobSpec { workload: lead.into(), user: Some("alice".into()) }];
        let d =
            decide_from_store(&db, &running, &specs, &self.config.policy(), Some(32.0), None, &[])
                .unwrap();
        d.selection.chosen.map(|i| cands[i].id)
    }
}

fn lead_slurm(kind: Option<&str>) -> FakeSlurm {
    let s = FakeSlurm::default();
    *s.pending.borrow_mut() = vec![
        held(11, "beta", "alice", "gres:shard:1"),
        held(12, "zeta", "alice", "gres:shard:1"),
        held(13, "gamma", "bob", "gres:shard:1"),
        held(14, "unknown-wl", "alice", "gres:shard:1"),
        held(15, "delta", "alice", "gres:gpu:1"),
        held(16, "eps", "alice", "gres:shard:2"),
        held(17, "alpha", "alice", "gres:shard:1"),
    ];
    s.details.borrow_mut().insert(10, running_detail(10, "alpha", 1, kind));
    *s.on_node.borrow_mut() = vec![10];
    s
}

/// The lead's job on its GPU as Slurm lists it while it starts (PrologSlurmctld's moment).
fn starting_lead(id: u32, w: &str, gpu: u32) -> RunningJob {
    RunningJob {
        id,
        node: "n1".into(),
        gpus: vec![gpu],
        state: "CF".into(),
        user: "alice".into(),
        workload: w.into(),
        started: Some(1990.0),
    }
}

/// n1 with one typed GPU per entry of `kinds` (index order).
fn node_n1(kinds: &[&str]) -> Vec<NodeGpus> {
    let gpus = kinds.iter().map(|k| Some(k.to_string()).filter(|k| !k.is_empty())).collect();
    vec![NodeGpus {
        shards_per_gpu: 4,
        partitions: Vec::new(),
        max_time_s: Vec::new(),
        features: Vec::new(),
        busy_gpus: Vec::new(),
        name: "n1".into(),
        gpus,
        usable: true,
    }]
}

/// The re-audit's L8: jobs released in slurmctld's first second were pinned by a node list
/// read before its restart, while the nodes had not registered again (22.05 shows them
/// `unknown`, a busy one with `shard:0`), and waited 59 s as BadConstraints. A listing that
/// fails drops the remembered nodes: the next pass reads them afresh.
#[test]
fn the_nodes_are_read_afresh_after_slurmctld_did_not_answer() {
    let mut s = FakeSlurm { nodes: node_n1(&[""]), ..FakeSlurm::default() };
    *s.pending.get_mut() = (5..9).map(|j| held(j, "beta", "bob", "gres:shard:1")).collect();
    let w = World::new("restart-nodes", s);
    let mut state = kace_node::decider_state::DeciderState::default();
    let sinfo = |w: &World| w.slurm.calls.borrow().iter().filter(|c| *c == "sinfo").count();
    dispatch::run(&w.slurm, &dispatch_settings(&w), &mut state, 1500.0).unwrap();
    assert_eq!(sinfo(&w), 1);
    dispatch::run(&w.slurm, &dispatch_settings(&w), &mut state, 1501.0).unwrap();
    assert_eq!(sinfo(&w), 1, "read at most every 5 s");
    w.slurm.unreachable_listings.set(1);
    assert!(dispatch::run(&w.slurm, &dispatch_settings(&w), &mut state, 1502.0).is_err());
    dispatch::run(&w.slurm, &dispatch_settings(&w), &mut state, 1503.0).unwrap();
    assert_eq!(
        sinfo(&w),
        2,
        "after slurmctld did not answer, the nodes are read again: {:?}",
        w.slurm.calls.borrow()
    );
}

/// The re-audit's L6: while a lead nobody profiled ran, the watch loop logged "couldn't choose
/// a joiner … couldn't find a profile" every pass (102 lines over its run). Its GPU takes no
/// joiner, said once for the job, and it is no problem.
#[test]
fn a_lead_nobody_profiled_takes_no_joiner_said_once_not_each_pass() {
    let mut s = FakeSlurm::default();
    *s.pending.get_mut() = vec![held(11, "beta", "alice", "gres:shard:1")];
    s.details.borrow_mut().insert(10, running_detail(10, "evilnew", 1, None));
    *s.on_node.borrow_mut() = vec![10];
    s.nodes = node_n1(&[""]);
    s.running.get_mut().push(RunningJob {
        gpus: vec![0],
        state: "R".into(),
        ..starting_lead(10, "evilnew", 0)
    });
    let w = World::new("unprofiled-lead", s);
    let mut state = kace_node::decider_state::DeciderState::default();
    let mut notes = Vec::new();
    for pass in 0..3 {
        let r =
            dispatch::run(&w.slurm, &dispatch_settings(&w), &mut state, 1500.0 + f64::from(pass))
                .unwrap();
        assert!(r.joiners.is_empty(), "{r:?}");
        assert!(r.problems.is_empty(), "pass {pass}: {:?}", r.problems);
        notes.extend(r.notes);
    }
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(notes[0].contains("takes no joiner while it runs job(s) [10]"), "{notes:?}");
    assert!(notes[0].contains("evilnew"), "{notes:?}");
}

/// When a lead starts, the decider chooses its partner by the one decision, pins it to the
/// lead's node and GPU type, records the decision (every candidate's verdict) before the
/// release, and reads Slurm once for the listing and once for the lead's GPU.
#[test]
fn the_decider_releases_the_predicted_best_beside_a_starting_lead_and_spools_every_verdict() {
    let mut s = lead_slurm(Some("g1"));
    s.nodes = node_n1(&["g1"]);
    s.running.get_mut().push(RunningJob { gpus: vec![0], ..starting_lead(10, "alpha", 0) });
    let w = World::new("lead", s);
    let expected = w.expected_choice(
        "alpha",
        &[
            held(11, "beta", "alice", ""),
            held(12, "zeta", "alice", ""),
            held(16, "eps", "alice", ""),
            held(17, "alpha", "alice", ""),
        ],
    );
    let expected = expected.expect("the synthetic data give a choice");
    let mut state = kace_node::decider_state::DeciderState::default();
    let r = dispatch::run(&w.slurm, &dispatch_settings(&w), &mut state, 1500.0).unwrap();
    assert_eq!(r.joiners, vec![(expected, "n1".to_string(), 0)], "{r:?}");
    let calls = w.slurm.calls.borrow().clone();
    let shards = if expected == 16 { 2 } else { 1 };
    assert!(calls.contains(&format!("pin {expected} n1 Some(\"g1\") {shards}")), "{calls:?}");
    assert_eq!(calls.iter().filter(|c| c.starts_with("release")).count(), 1, "{calls:?}");
    assert_eq!(calls.iter().filter(|c| *c == "squeue").count(), 1, "{calls:?}");
    assert_eq!(calls.iter().filter(|c| c.starts_with("gpus")).count(), 1, "{calls:?}");
    assert_eq!(state.gpus.get(&10), Some(&("n1".to_string(), vec![0])));
    assert!(state.begun.is_empty(), "finished releases are forgotten");

    // Job 15 asks for no shard: nothing to pair, handed back to Slurm (its own record).
    assert_eq!(r.handed_back.iter().map(|(j, _)| *j).collect::<Vec<_>>(), vec![15], "{r:?}");
    let placed: Vec<_> = r
        .records
        .iter()
        .filter(|d| ReleaseKind::of_key(Some(&d.key)) != ReleaseKind::HandBack)
        .collect();
    let [d] = placed.as_slice() else { panic!("{r:?}") };
    assert_eq!(ReleaseKind::of_key(Some(&d.key)), ReleaseKind::Lead);
    // The cluster's name comes from Slurm's environment or slurm.conf (`cluster` without).
    let cluster = dispatch::Settings::of(&w.config).cluster;
    assert!(d.key.starts_with(&format!("{cluster}/10/")), "keyed by the lead: {}", d.key);
    assert_eq!(d.decision.chosen_job, Some(expected.to_string()));
    let by_job: BTreeMap<String, &kace_sql::DecisionCandidate> =
        d.decision.candidates.iter().map(|c| (c.job.clone().unwrap(), c)).collect();
    assert_eq!(by_job.len(), 6, "the shard-less job is no candidate: {by_job:?}");
    assert!(by_job["13"].rejected.as_deref().unwrap().contains("different user"));
    assert!(by_job["14"].rejected.as_deref().unwrap().contains("unknown profile"));
    assert!(by_job[&expected.to_string()].prediction.is_some());
    assert_eq!(by_job["11"].held_s, Some(489.0));
    // The pair's decision and job 15's hand-back.
    let spooled = kace_sql::spool::spooled_decisions(&w.config.spool.dir).unwrap();
    assert_eq!(spooled.len(), 2);
    // The released job's prolog is told by ticket; the handed-back one asks Slurm.
    let ticket = release_ticket::read(&w.config.spool.dir, expected).unwrap().unwrap();
    assert_eq!((ticket.node.as_str(), ticket.at), ("n1", 1500.0));
    assert_eq!(ticket.workload, by_job[&expected.to_string()].workload);
    assert_eq!(release_ticket::read(&w.config.spool.dir, 15).unwrap(), None);

    // The next pass knows the lead's GPU: no read.
    let before = w.slurm.calls.borrow().len();
    dispatch::run(&w.slurm, &dispatch_settings(&w), &mut state, 1501.0).unwrap();
    assert!(!w.slurm.calls.borrow()[before..].iter().any(|c| c.starts_with("gpus")));
}

/// The node prolog lists no queue and moves no job: it checks the gate's mark (that job only),
/// records the job on its GPU and starts MPS; the partner's prolog joins the lead.
#[test]
fn the_prolog_records_and_starts_mps_but_lists_and_moves_nothing() {
    let w = World::new("prolog", lead_slurm(Some("g1")));
    let out = w.with(|n| prolog::run(n, &job_env(10, 1)));
    assert_eq!(out, prolog::Outcome::Led);
    w.slurm.details.borrow_mut().insert(11, running_detail(11, "beta", 1, Some("g1")));
    w.slurm.on_node.borrow_mut().push(11);
    let out = w.with(|n| prolog::run(n, &job_env(11, 1)));
    assert_eq!(out, prolog::Outcome::Joined { with: vec![10] });
    let calls = w.slurm.calls.borrow().clone();
    assert!(
        calls.iter().all(|c| c.starts_with("queued ") || c.starts_with("steps ")),
        "only single-job reads: {calls:?}"
    );
    assert_eq!(w.mps.calls.borrow().as_slice(), ["start 1 0"]);
}

/// A job the decider released onto this node is known by its ticket: its prolog asks
/// slurmctld nothing about it, and uses the ticket once. A ticket for another node, or too old,
/// is not believed: the prolog reads the job from Slurm, as without one.
#[test]
fn the_prolog_of_a_job_the_decider_released_here_reads_its_ticket_not_slurm() {
    let w = World::new("ticket", lead_slurm(Some("g1")));
    let spool = w.config.spool.dir.clone();
    let ticket = |node: &str, at: f64| Ticket {
        node: node.into(),
        at,
        workload: "alpha".into(),
        thread_pct: None,
    };
    release_ticket::write(&spool, 10, &ticket("n1", 1990.0)).unwrap();
    assert_eq!(w.with(|n| prolog::run(n, &job_env(10, 1))), prolog::Outcome::Led);
    assert!(
        !w.slurm.calls.borrow().iter().any(|c| c.starts_with("queued")),
        "{:?}",
        w.slurm.calls.borrow()
    );
    assert_eq!(release_ticket::read(&spool, 10).unwrap(), None, "used once");
    for (job, t) in [(11, ticket("n2", 1990.0)), (12, ticket("n1", 2000.0 - 601.0))] {
        w.slurm.details.borrow_mut().insert(job, running_detail(job, "beta", 1, Some("g1")));
        w.slurm.on_node.borrow_mut().push(job);
        release_ticket::write(&spool, job, &t).unwrap();
        w.slurm.calls.borrow_mut().clear();
        w.with(|n| prolog::run(n, &job_env(job, 1)));
        let queued = format!("queued {job}");
        assert!(w.slurm.calls.borrow().contains(&queued), "{:?}", w.slurm.calls.borrow());
        let said = format!("job {job}: couldn't use its release ticket: it names node");
        assert!(w.logs.borrow().iter().any(|l| l.contains(&said)), "{:?}", w.logs.borrow());
    }
}

/// Job 10 (alice's alpha) running on n1's GPU 0 since 1000.
fn alpha_running_since_1000() -> RunningJob {
    RunningJob {
        id: 10,
        node: "n1".into(),
        gpus: vec![0],
        state: "R".into(),
        workload: "alpha".into(),
        user: "alice".into(),
        started: Some(1000.0),
    }
}

/// Jobs 10 (alpha) and 11 (beta) on GPU 0 of n1, as their prologs and epilogs read them.
fn alpha_and_beta_on_gpu0(tag: &str) -> World {
    let s = FakeSlurm::default();
    s.details.borrow_mut().insert(10, running_detail(10, "alpha", 0, None));
    s.details.borrow_mut().insert(11, running_detail(11, "beta", 0, None));
    *s.on_node.borrow_mut() = vec![10, 11];
    World::new(tag, s)
}

/// Progress lines a second apart from `from` to `to` at `rate` steps a second.
fn lines(from: u32, to: u32, rate: f64) -> String {
    (from..=to).map(|t| format!("{t} {}\n", (f64::from(t - from) * rate) as u64)).collect()
}

/// A split chooser that gives every joiner 40 % of the SMs beside a lead at 100 %: a predicted
/// log gain of 0.5 at 100/40, no doubt, margin 0 (`kace_selector::splits` owns its form).
fn joiner_at_40() -> kace_selector::splits::SplitModel {
    use kace_selector::dataset::ThreadSplit;
    use kace_selector::splits::{FeatureSet, SplitModel, SplitTerm, PAIR_FEATURES};
    let term = SplitTerm {
        scale: kace_selector::zscore::ZScore {
            mean: vec![0.0; PAIR_FEATURES],
            std: vec![1.0; PAIR_FEATURES],
        },
        intercept: 0.5,
        coefficients: vec![0.0; PAIR_FEATURES],
        sigma: 0.0,
        inverse: vec![0.0; PAIR_FEATURES * PAIR_FEATURES],
        n: 20,
    };
    SplitModel {
        candidates: vec![ThreadSplit { first: 100, second: 40 }, ThreadSplit::DEFAULT],
        features: FeatureSet::System,
        terms: vec![Some(term), None],
        alpha: 1.0,
        margin: Some(0.0),
        doubt_weight: 0.0,
    }
}

/// Issue 33 item 3: with `mps.sm_split` and a split chooser stored, a joiner beside one running
/// kace job gets the chooser's share: its release ticket carries it, its record says so, and
/// the decider remembers it (no share is chosen beside a job that has one). Off, or without a
/// chooser, nothing is set.
#[test]
fn with_sm_split_the_decider_gives_the_joiner_the_choosers_share_through_its_ticket() {
    let setup = |tag: &str| {
        let mut s = lead_slurm(Some("g1"));
        s.nodes = node_n1(&["g1"]);
        s.running.get_mut().push(RunningJob { gpus: vec![0], ..starting_lead(10, "alpha", 0) });
        World::new(tag, s)
    };
    let released = |w: &World, settings: dispatch::Settings<'_>| {
        let mut state = kace_node::decider_state::DeciderState::default();
        let r = dispatch::run(&w.slurm, &settings, &mut state, 1500.0).unwrap();
        assert!(r.problems.is_empty(), "{:?}", r.problems);
        let [(joiner, _, _)] = r.joiners.as_slice() else { panic!("{r:?}") };
        let ticket = release_ticket::read(&w.config.spool.dir, *joiner).unwrap().unwrap();
        let record = r
            .records
            .iter()
            .flat_map(|d| &d.decision.candidates)
            .find(|c| c.job.as_deref() == Some(&joiner.to_string()))
            .unwrap()
            .thread_pct;
        (ticket.thread_pct, record, state.thread_pcts.get(joiner).copied())
    };

    // Off (the default), with a chooser stored: nothing set.
    let w = setup("split-off");
    Db::open(&w.config.database.path)
        .unwrap()
        .insert_split_model(&joiner_at_40(), &serde_json::json!({}))
        .unwrap();
    assert_eq!(released(&w, dispatch_settings(&w)), (None, None, None));

    // On without a chooser: nothing set.
    let w = setup("split-none");
    let on = dispatch::Settings { sm_split: true, ..dispatch_settings(&w) };
    assert_eq!(released(&w, on), (None, None, None));

    // On with one: 40 %.
    let w = setup("split-on");
    Db::open(&w.config.database.path)
        .unwrap()
        .insert_split_model(&joiner_at_40(), &serde_json::json!({}))
        .unwrap();
    let on = dispatch::Settings { sm_split: true, ..dispatch_settings(&w) };
    assert_eq!(released(&w, on), (Some(40), Some(40), Some(40)));
}

/// The prolog of a job whose ticket carries a share hands it to the SPANK plugin (a root file
/// beside its progress file) and records it on the GPU; the epilogs then keep every interval
/// the capped job ran in out of the observations (and it measures no profile), and remove the
/// file.
#[test]
fn a_share_from_the_ticket_reaches_the_tasks_and_its_intervals_are_not_observed() {
    let w = alpha_and_beta_on_gpu0("share");
    assert!(matches!(w.with(|n| prolog::run(n, &job_env(10, 0))), prolog::Outcome::Led));
    *w.clock.0.borrow_mut() = 2010.0;
    let ticket =
        Ticket { node: "n1".into(), at: 2009.0, workload: "beta".into(), thread_pct: Some(40) };
    release_ticket::write(&w.config.spool.dir, 11, &ticket).unwrap();
    assert!(matches!(w.with(|n| prolog::run(n, &job_env(11, 0))), prolog::Outcome::Joined { .. }));
    let root = w.config.node.progress_root.clone();
    let me = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&root).unwrap());
    assert_eq!(kace_layout::thread_share::read(&root, 11, me), Ok(Some(40)));
    assert_eq!(kace_layout::thread_share::read(&root, 10, me), Ok(None));
    assert!(w
        .logs
        .borrow()
        .iter()
        .any(|l| l.contains("SM share CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=40")));

    std::fs::write(root.join("10.progress"), lines(2000, 2030, 2.0)).unwrap();
    std::fs::write(root.join("11.progress"), lines(2010, 2040, 2.0)).unwrap();
    *w.clock.0.borrow_mut() = 2030.0;
    let out = w.with(|n| epilog::run(n, &job_env(10, 0)));
    let epilog::Outcome::Done { observations, .. } = out else { panic!("{out:?}") };
    // The lead's alone interval only: the shared one ran beside a capped job.
    assert_eq!(observations.len(), 1, "{observations:#?}");
    assert!(observations[0].partners.is_empty());
    *w.slurm.on_node.borrow_mut() = vec![11];
    *w.clock.0.borrow_mut() = 2040.0;
    let out = w.with(|n| epilog::run(n, &job_env(11, 0)));
    let epilog::Outcome::Done { observations, profile, .. } = out else { panic!("{out:?}") };
    assert!(observations.is_empty() && profile.is_none(), "{observations:?} {profile:?}");
    let logs = w.logs.borrow().join("\n");
    assert!(logs.contains("ran with an SM share kace set; not observed"), "{logs}");
    assert!(logs.contains("ran with an SM share of 40 %; no profile measurement"), "{logs}");
    assert_eq!(kace_layout::thread_share::read(&root, 11, me), Ok(None));
}

/// Whether the GPU's other kace jobs still run is asked of the node's slurmstepd first (no
/// RPC); only a job without a step there (in its prolog, or gone) is read from slurmctld.
#[test]
fn a_partner_with_a_step_on_the_node_costs_no_slurmctld_read() {
    let w = World::new("steps", lead_slurm(Some("g1")));
    assert_eq!(w.with(|n| prolog::run(n, &job_env(10, 1))), prolog::Outcome::Led);
    w.slurm.stepped.borrow_mut().push(10);
    w.slurm.details.borrow_mut().insert(11, running_detail(11, "beta", 1, Some("g1")));
    w.slurm.on_node.borrow_mut().push(11);
    w.slurm.calls.borrow_mut().clear();
    let out = w.with(|n| prolog::run(n, &job_env(11, 1)));
    assert_eq!(out, prolog::Outcome::Joined { with: vec![10] });
    let calls = w.slurm.calls.borrow().clone();
    assert_eq!(calls, ["queued 11", "steps 10"], "the partner is not read from slurmctld");

    // Job 12 joins while 11 has no step (its prolog just ended) and 10's slurmd lost it: 11
    // is read and still runs, 10 is read and is gone.
    w.slurm.stepped.borrow_mut().clear();
    w.slurm.pending.borrow_mut().retain(|j| j.id != 11 && j.id != 12);
    *w.slurm.on_node.borrow_mut() = vec![11, 12];
    w.slurm.details.borrow_mut().insert(12, running_detail(12, "gamma", 1, Some("g1")));
    w.slurm.calls.borrow_mut().clear();
    let out = w.with(|n| prolog::run(n, &job_env(12, 1)));
    assert_eq!(out, prolog::Outcome::Joined { with: vec![11] });
    let calls = w.slurm.calls.borrow().clone();
    for c in ["steps 10", "queued 10", "steps 11", "queued 11"] {
        assert!(calls.iter().any(|x| x == c), "{c} in {calls:?}");
    }
}

#[test]
fn a_cancelled_choice_falls_back_to_the_next_best() {
    let mut s = lead_slurm(None);
    s.nodes = node_n1(&["", ""]);
    s.running.get_mut().push(starting_lead(10, "alpha", 1));
    let w0 = World::new("cancel0", FakeSlurm::default());
    let first = w0
        .expected_choice(
            "alpha",
            &[
                held(11, "beta", "alice", ""),
                held(12, "zeta", "alice", ""),
                held(16, "eps", "alice", ""),
                held(17, "alpha", "alice", ""),
            ],
        )
        .unwrap();
    s.gone = vec![first];
    let w = World::new("cancel", s);
    let mut state = kace_node::decider_state::DeciderState::default();
    let r = dispatch::run(&w.slurm, &dispatch_settings(&w), &mut state, 1500.0).unwrap();
    let [(partner, _, 1)] = r.joiners.as_slice() else { panic!("{r:?}") };
    assert_ne!(*partner, first);
    assert!(
        r.problems.iter().any(|p| p.starts_with(&format!("couldn't release job {first}"))),
        "{r:?}"
    );
    // The failed release's record was withdrawn: only the real ones are in the spool.
    let spooled = kace_sql::spool::spooled_decisions(&w.config.spool.dir).unwrap();
    assert_eq!(spooled.len(), r.records.len(), "{spooled:?}");
    // Untyped GPUs: pinned to the node only.
    let shards = if *partner == 16 { 2 } else { 1 };
    let pinned = format!("pin {partner} n1 None {shards}");
    assert!(w.slurm.calls.borrow().contains(&pinned), "{:?}", w.slurm.calls.borrow());
}

#[test]
fn without_a_database_a_starting_lead_gets_no_partner_and_the_pass_says_why() {
    let mut s = lead_slurm(None);
    s.nodes = node_n1(&[""]);
    s.running.get_mut().push(starting_lead(10, "alpha", 0));
    let mut w = World::new("nodb", s);
    w.config.database.path = w.dir.join("missing.db");
    let mut state = kace_node::decider_state::DeciderState::default();
    let r = dispatch::run(&w.slurm, &dispatch_settings(&w), &mut state, 1500.0).unwrap();
    assert!(r.joiners.is_empty() && r.leads.is_empty(), "{r:?}");
    assert!(r.problems.iter().any(|p| p.contains("couldn't open the database")), "{r:?}");
    assert!(!w.slurm.calls.borrow().iter().any(|c| c.starts_with("release")));
}

#[test]
fn a_failing_mps_control_or_slurm_leaves_the_job_running_alone() {
    let mut w = World::new("mpsfail", FakeSlurm::default());
    w.mps.fail = true;
    // Slurm knows nothing: the gate's mark cannot be checked, so the job runs as a plain one.
    let out = w.with(|n| prolog::run(n, &job_env(10, 0)));
    assert_eq!(out, prolog::Outcome::NotKace);
    assert!(w.logs.borrow().join("\n").contains("not the gate's AdminComment mark"));
    assert!(w.mps.calls.borrow().is_empty(), "no MPS daemon for an unconfirmed job");
    // A marked job whose MPS daemon cannot start still runs (alone: nothing is held).
    w.slurm.details.borrow_mut().insert(10, running_detail(10, "alpha", 0, None));
    let out = w.with(|n| prolog::run(n, &job_env(10, 0)));
    assert_eq!(out, prolog::Outcome::Led);
    let logs = w.logs.borrow().join("\n");
    assert!(logs.contains("couldn't start the MPS control daemon for GPU 0"), "{logs}");
    w.config.node.state_dir = w.dir.join("state2");
    let plain = JobEnv { kace: false, ..job_env(20, 0) };
    assert_eq!(w.with(|n| prolog::run(n, &plain)), prolog::Outcome::NotKace);
    // No GPU in the environment nor in Slurm's record of the allocation: nothing to record.
    let no_gres = JobDetail { gres: Vec::new(), ..running_detail(21, "alpha", 0, None) };
    w.slurm.details.borrow_mut().insert(21, no_gres);
    let no_gpu = JobEnv { gpu: None, ..job_env(21, 0) };
    assert_eq!(w.with(|n| prolog::run(n, &no_gpu)), prolog::Outcome::NoGpu);
}

/// Reliability audit finding 1: a `SPANK_KACE_COLOCATE` entry a user sent past the gate (no
/// AdminComment mark) does not make a kace job: no record, no MPS daemon, no release, and its
/// epilog finds no record either.
#[test]
fn only_the_gates_mark_makes_a_kace_job() {
    let s = lead_slurm(None);
    let mut forged = running_detail(30, "alpha", 1, None);
    forged.admin_comment = String::new();
    s.details.borrow_mut().insert(30, forged);
    let w = World::new("forged", s);
    assert_eq!(w.with(|n| prolog::run(n, &job_env(30, 1))), prolog::Outcome::NotKace);
    assert!(w.logs.borrow().iter().any(|l| l.contains("not the gate's AdminComment mark")));
    assert!(w.mps.calls.borrow().is_empty());
    assert!(!w.slurm.calls.borrow().iter().any(|c| c.starts_with("release")));
    let out = w.with(|n| epilog::run(n, &job_env(30, 1)));
    let epilog::Outcome::Done { observations, stopped_mps, .. } = out else { panic!("{out:?}") };
    assert_eq!((observations.len(), stopped_mps), (0, false));
    assert!(!w.slurm.calls.borrow().iter().any(|c| c.starts_with("release")));
}

#[test]
fn epilogs_observe_each_interval_and_the_last_one_stops_mps() {
    let w = alpha_and_beta_on_gpu0("epi");
    // Lead 10 starts at 2000, partner 11 at 2010; 10 ends at 2030, 11 at 2040.
    assert!(matches!(w.with(|n| prolog::run(n, &job_env(10, 0))), prolog::Outcome::Led));
    *w.clock.0.borrow_mut() = 2010.0;
    assert!(matches!(w.with(|n| prolog::run(n, &job_env(11, 0))), prolog::Outcome::Joined { .. }));
    // 4 steps/s alone, 2 steps/s shared (alpha's exclusive throughput is 2; ingest refuses
    // more than 4 times that as implausible).
    let mut p10 = lines(2000, 2010, 4.0);
    p10.push_str(
        &(2011..=2030).map(|t| format!("{t} {}\n", 40 + (t - 2010) * 2)).collect::<String>(),
    );
    std::fs::write(w.config.node.progress_root.join("10.progress"), p10).unwrap();
    std::fs::write(w.config.node.progress_root.join("11.progress"), lines(2010, 2040, 4.0))
        .unwrap();

    *w.clock.0.borrow_mut() = 2030.0;
    let out = w.with(|n| epilog::run(n, &job_env(10, 0)));
    let epilog::Outcome::Done { observations, stopped_mps, .. } = out else { panic!("{out:?}") };
    assert!(!stopped_mps, "job 11 still runs");
    assert_eq!(observations.len(), 2, "{observations:#?}");
    assert!(observations[0].partners.is_empty());
    assert!((observations[0].throughput - 4.0).abs() < 1e-9);
    assert_eq!(observations[1].partners[0].job, "11");
    assert_eq!(observations[1].partners[0].workload, "beta");
    assert!((observations[1].throughput - 2.0).abs() < 1e-9);
    assert!(!w.config.node.progress_root.join("10.progress").exists());

    *w.slurm.on_node.borrow_mut() = vec![11];
    *w.clock.0.borrow_mut() = 2040.0;
    let out = w.with(|n| epilog::run(n, &job_env(11, 0)));
    let epilog::Outcome::Done { observations, stopped_mps, .. } = out else { panic!("{out:?}") };
    assert!(stopped_mps);
    assert_eq!(observations.len(), 2);
    assert_eq!(observations[0].partners[0].job, "10");
    assert_eq!(w.mps.calls.borrow().as_slice(), ["start 0 0", "quit"]);
    // Everything is in the spool, and ingest pairs the two shared intervals.
    let mut db = Db::open(&w.config.database.path).unwrap();
    let r = kace_sql::spool::ingest(&mut db, &w.config.spool.dir, &w.dir.join("q")).unwrap();
    assert_eq!((r.inserted, r.quarantined.len()), (4, 0));
    assert_eq!(db.observed_groups().unwrap().len(), 1);
}

/// Issue 33 item 2: two jobs that fail seconds apart on one MPS server (the way a fatal GPU
/// error in one client ends every client's work) each spool a failure record naming the other;
/// ingest stores them and the pair of workloads is blocked. A job cancelled beside a partner,
/// or one that failed while its partner ran on, blocks nothing.
#[test]
fn two_jobs_failing_together_on_one_server_block_their_pair() {
    let s = FakeSlurm::default();
    s.details.borrow_mut().insert(10, running_detail(10, "alpha", 0, None));
    s.details.borrow_mut().insert(11, running_detail(11, "beta", 0, None));
    *s.on_node.borrow_mut() = vec![10, 11];
    let w = World::new("failed-together", s);
    assert!(matches!(w.with(|n| prolog::run(n, &job_env(10, 0))), prolog::Outcome::Led));
    *w.clock.0.borrow_mut() = 2010.0;
    assert!(matches!(w.with(|n| prolog::run(n, &job_env(11, 0))), prolog::Outcome::Joined { .. }));
    let failed = |job: u32, code: u32, signal: u32| JobEnv {
        exit: Some(kace_node::env::JobExit { code, signal }),
        ..job_env(job, 0)
    };
    // Job 11 fails first; 10 four seconds later (its own error handling took that long).
    *w.clock.0.borrow_mut() = 2030.0;
    w.with(|n| epilog::run(n, &failed(11, 1, 0)));
    *w.slurm.on_node.borrow_mut() = vec![10];
    *w.clock.0.borrow_mut() = 2034.0;
    w.with(|n| epilog::run(n, &failed(10, 1, 0)));
    let logs = w.logs.borrow().join("\n");
    assert!(
        logs.contains("job 11: failed (1:0) while sharing its GPU's MPS server with job(s) 10"),
        "{logs}"
    );
    assert!(logs.contains("job 10: failed (1:0) while sharing its GPU's MPS server with job(s) 11"));

    let mut db = Db::open(&w.config.database.path).unwrap();
    let all = kace_sql::spool::ingest_all(&mut db, &w.config.spool.dir, &w.dir.join("q")).unwrap();
    assert_eq!((all.failures.inserted, all.failures.quarantined.len()), (2, 0));
    let pairs = db.failed_pairs().unwrap();
    assert_eq!(pairs.len(), 1, "{pairs:?}");
    assert_eq!(pairs[0].workloads, ("alpha".to_string(), "beta".to_string()));
    assert_eq!(pairs[0].since, 2034.0);
    // Cleared by an admin, it is allowed again.
    assert!(db.clear_failed_pair("beta", "alpha", 2100.0).unwrap());
    assert!(db.failed_pairs().unwrap().is_empty());
    drop(db);

    // Cancelled (SIGTERM) beside a partner: no record.
    *w.slurm.on_node.borrow_mut() = vec![12, 13];
    w.slurm.details.borrow_mut().insert(12, running_detail(12, "alpha", 0, None));
    w.slurm.details.borrow_mut().insert(13, running_detail(13, "beta", 0, None));
    *w.clock.0.borrow_mut() = 3000.0;
    w.with(|n| prolog::run(n, &job_env(12, 0)));
    w.with(|n| prolog::run(n, &job_env(13, 0)));
    *w.clock.0.borrow_mut() = 3010.0;
    w.with(|n| epilog::run(n, &failed(13, 0, 15)));
    let failures = w.config.spool.dir.join(kace_sql::spool::FAILURES_DIR);
    let spooled = || std::fs::read_dir(&failures).map(|d| d.count()).unwrap_or(0);
    assert_eq!(spooled(), 0, "a cancelled job is no failure");
}

fn dispatch_settings(w: &World) -> dispatch::Settings<'_> {
    // These tests are about the decision among every candidate; the priority window has its
    // own tests (`..._priority_...`).
    dispatch::Settings { priority_window: 64, ..dispatch::Settings::of(&w.config) }
}

/// One decider pass with a fresh memory.
fn pass(w: &World, now: f64) -> dispatch::PassReport {
    let mut state = kace_node::decider_state::DeciderState::default();
    dispatch::run(&w.slurm, &dispatch_settings(w), &mut state, now).unwrap()
}

#[test]
fn dispatch_releases_leads_onto_free_gpus_and_places_expired_holds() {
    let mut s = FakeSlurm::default();
    *s.pending.borrow_mut() = vec![
        held(5, "alpha", "alice", "gres:shard:1"),
        held(6, "beta", "alice", "gres:shard:1"),
        held(7, "gamma", "alice", "gres:shard:1"),
        held(8, "delta", "alice", "gres:shard:1"),
    ];
    // Job 8 was submitted long ago.
    s.pending.borrow_mut()[3].submitted = Some(0.0);
    s.nodes = vec![
        NodeGpus {
            shards_per_gpu: 4,
            partitions: Vec::new(),
            max_time_s: Vec::new(),
            features: Vec::new(),
            busy_gpus: Vec::new(),
            name: "n1".into(),
            gpus: vec![Some("g0".into()), Some("g1".into())],
            usable: true,
        },
        NodeGpus {
            shards_per_gpu: 4,
            partitions: Vec::new(),
            max_time_s: Vec::new(),
            features: Vec::new(),
            busy_gpus: Vec::new(),
            name: "n2".into(),
            gpus: vec![None],
            usable: false,
        },
    ];
    // GPU g0 is full (two kace jobs), g1 is free.
    *s.running.borrow_mut() = vec![
        RunningJob {
            id: 1,
            node: "n1".into(),
            gpus: vec![0],
            state: "R".into(),
            ..Default::default()
        },
        RunningJob {
            id: 2,
            node: "n1".into(),
            gpus: vec![0],
            state: "R".into(),
            ..Default::default()
        },
    ];
    s.details.borrow_mut().insert(1, running_detail(1, "zeta", 0, Some("g0")));
    s.details.borrow_mut().insert(2, running_detail(2, "beta", 0, Some("g0")));
    let w = World::new("dispatch", s);
    let r = pass(&w, 1100.0);
    // The expired job takes the free GPU, never the full one; nothing is left for a lead.
    assert_eq!(r.expired, vec![(8, "n1".to_string(), 1)], "{r:?}");
    assert!(r.leads.is_empty() && r.joiners.is_empty(), "{r:?}");
    assert!(w.slurm.calls.borrow().contains(&"pin 8 n1 Some(\"g1\") 1".to_string()));
    // Recorded: released by max_hold onto a free GPU (it leads there), held 1100 s.
    let [rec] = r.records.as_slice() else { panic!("{r:?}") };
    assert!(rec.key.ends_with("/8/1100000/n1/max_hold"), "{}", rec.key);
    assert_eq!(ReleaseKind::of_key(Some(&rec.key)), ReleaseKind::MaxHold);
    assert_eq!(
        (rec.decision.lead_job.as_deref(), rec.decision.chosen_job.as_deref()),
        (Some("8"), None)
    );
    assert_eq!(rec.decision.candidates[0].held_s, Some(1100.0));
    assert_eq!(spooled_decisions(&w.config.spool.dir).unwrap().len(), 1);
    // Job 8 is now released but not started: it takes g1, so a second pass releases nothing.
    {
        let mut p = w.slurm.pending.borrow_mut();
        p[3].req_nodes = "n1".into();
        p[3].tres_per_node = "gres:shard:g1:1".into();
    }
    let r = pass(&w, 1101.0);
    assert!(r.leads.is_empty() && r.expired.is_empty() && r.joiners.is_empty(), "{r:?}");
    assert!(r.still_held);

    // A kace job completing (its epilog runs) holds nothing back: the decider waits for no
    // hook. One completing for longer than a hook runs (its node's slurmd gone) is named.
    let mut ending = held(3, "beta", "alice", "gres:shard:g0:1");
    ending.state = "CG".into();
    ending.reason = "None".into();
    ending.node = "n1".into();
    ending.ended = Some(1100.0);
    w.slurm.pending.borrow_mut().push(ending);
    let r = pass(&w, 1102.0);
    assert!(r.stuck.is_empty(), "{r:?}");
    let window = dispatch_settings(&w).stuck_after_s;
    let r = pass(&w, 1100.0 + window + 1.0);
    assert_eq!(r.stuck.len(), 1, "{r:?}");
    assert_eq!((r.stuck[0].0, r.stuck[0].2), (3, "completing"), "{r:?}");
    let lines = dispatch::report_lines(&r, 600).join("\n");
    assert!(lines.contains("job 3 has been completing for 36 s"), "{lines}");
    assert!(lines.contains("scontrol requeue 3"), "{lines}");
}

/// A GPU a job kace does not manage holds (a plain `--gres=gpu` job: Slurm shows its GRES in
/// use, no kace job is on it) is neither free nor open: the first held job leads on the other
/// GPU instead of being pinned beside it to wait (issue 29). A GPU whose reading shows a kace
/// job that has left since is free at once, without waiting for the nodes to be read again.
#[test]
fn a_gpu_a_plain_job_holds_is_left_to_it_and_one_a_kace_job_left_is_not() {
    let world = |name: &str, busy: Vec<u32>| {
        let mut s = FakeSlurm { nodes: node_n1(&["g0", "g1"]), ..FakeSlurm::default() };
        s.nodes[0].busy_gpus = busy;
        *s.pending.get_mut() = vec![held(6, "beta", "alice", "gres:shard:1")];
        World::new(name, s)
    };
    // A plain job on GPU 0: the held job leads on GPU 1.
    let w = world("plain-gpu", vec![0]);
    let r = pass(&w, 1000.0);
    assert_eq!(r.leads, vec![(6, "n1".to_string(), 1)], "{r:?}");
    assert!(!w.slurm.calls.borrow().iter().any(|c| c.starts_with("pin 6 n1 Some(\"g0\")")));

    // Both GPUs in use: the plain job's on GPU 0, kace job 5 on GPU 1. No lead is placed.
    let w = world("plain-and-kace", vec![0, 1]);
    w.slurm.running.borrow_mut().push(RunningJob {
        id: 5,
        node: "n1".into(),
        gpus: vec![1],
        state: "R".into(),
        ..Default::default()
    });
    w.slurm.details.borrow_mut().insert(5, running_detail(5, "zeta", 1, Some("g1")));
    let settings = dispatch_settings(&w);
    let mut state = kace_node::decider_state::DeciderState::default();
    let r = dispatch::run(&w.slurm, &settings, &mut state, 1000.0).unwrap();
    assert!(r.leads.is_empty() && r.expired.is_empty(), "{r:?}");
    // Job 5 ends. The nodes read at 1000 still show GPU 1 in use, but a kace job was seen there
    // since: it is free at once (the refill does not wait for the next reading); GPU 0 stays
    // the plain job's.
    w.slurm.running.borrow_mut().clear();
    let r = dispatch::run(&w.slurm, &settings, &mut state, 1002.0).unwrap();
    assert_eq!(r.leads, vec![(6, "n1".to_string(), 1)], "{r:?}");
    // A decider that never saw a kace job on GPU 1 believes the reading: both GPUs are taken,
    // and the held job stays held, pinned nowhere.
    let w = world("plain-both", vec![0, 1]);
    let r = pass(&w, 1003.0);
    assert!(r.leads.is_empty() && r.expired.is_empty() && r.still_held, "{r:?}");
    assert!(!w.slurm.calls.borrow().iter().any(|c| c.starts_with("pin ")));
}

/// A kace job Slurm shows starting for longer than any prolog runs (a batch job whose slurmd
/// was killed during its prolog stays "running, reason Prolog" for good) holds no other kace
/// job: the decider never waits for a hook; once the job counts as stuck it is named, and no
/// partner is sent to its GPU (it would wait beside a job that runs nothing).
#[test]
fn a_job_stuck_in_its_prolog_gets_no_partner_and_holds_nothing_back() {
    let mut s = FakeSlurm { nodes: node_n1(&["g0", "g1"]), ..FakeSlurm::default() };
    *s.pending.get_mut() = vec![held(5, "beta", "alice", "gres:shard:1")];
    s.running.get_mut().push(RunningJob {
        state: "R".into(),
        started: Some(1000.0),
        ..starting_lead(1, "zeta", 0)
    });
    // Slurm shows it running with reason Prolog: starting.
    let w = World::new("stuck", s);
    let window = dispatch_settings(&w).stuck_after_s;
    assert_eq!(window, 35.0, "the default budget (5 s) and the launch slack (30 s)");
    {
        // The listing's reason for job 1 (FakeSlurm lists running jobs with reason None).
        let mut p = w.slurm.pending.borrow_mut();
        let mut stuck = FakeSlurm::listed(&w.slurm.running.borrow()[0]);
        stuck.reason = "Prolog".into();
        p.push(stuck);
    }
    w.slurm.running.borrow_mut().clear();
    w.slurm.details.borrow_mut().insert(1, running_detail(1, "zeta", 0, Some("g0")));
    let r = pass(&w, 1000.0 + window + 5.0);
    assert_eq!(r.stuck, vec![(1, window + 5.0, "starting")], "{r:?}");
    // GPU 0 is the stuck job's: the held job leads on GPU 1, not beside it.
    assert_eq!(r.leads, vec![(5, "n1".to_string(), 1)], "{r:?}");
    assert!(r.joiners.is_empty(), "{r:?}");
}

/// Dispatch offers held jobs to an open GPU (a kace job below the limit, nothing starting or
/// ending there) by the same decision a lead makes, before it releases leads onto free GPUs;
/// a GPU whose kace job is completing is left to that job's epilog.
#[test]
fn dispatch_fills_open_gpus_before_free_ones() {
    let mut s = lead_slurm(Some("g1"));
    s.nodes = vec![NodeGpus {
        shards_per_gpu: 4,
        partitions: Vec::new(),
        max_time_s: Vec::new(),
        features: Vec::new(),
        busy_gpus: Vec::new(),
        name: "n1".into(),
        gpus: vec![Some("g0".into()), Some("g1".into())],
        usable: true,
    }];
    *s.running.borrow_mut() = vec![RunningJob {
        id: 10,
        node: "n1".into(),
        gpus: vec![1],
        state: "R".into(),
        workload: "alpha".into(),
        user: "alice".into(),
        ..Default::default()
    }];
    let w = World::new("open", s);
    let expected = w
        .expected_choice(
            "alpha",
            &[
                held(11, "beta", "alice", ""),
                held(12, "zeta", "alice", ""),
                held(16, "eps", "alice", ""),
                held(17, "alpha", "alice", ""),
            ],
        )
        .unwrap();
    let r = pass(&w, 1100.0);
    assert_eq!(r.joiners, vec![(expected, "n1".to_string(), 1)], "{r:?}");
    // The oldest remaining held job leads on the free GPU g0.
    let first_left = [11, 12, 13, 14, 16, 17].into_iter().find(|j| *j != expected).unwrap();
    assert_eq!(r.leads, vec![(first_left, "n1".to_string(), 0)], "{r:?}");
    // Both releases are recorded: the late arrival with the decision over every candidate (the
    // same predictions a lead would make) and the lead with its hold.
    let kinds: Vec<ReleaseKind> =
        r.records.iter().map(|d| ReleaseKind::of_key(Some(&d.key))).collect();
    assert_eq!(kinds, [ReleaseKind::HandBack, ReleaseKind::LateArrival, ReleaseKind::LeadRelease]);
    let join = &r.records[1].decision;
    assert_eq!(join.lead_job.as_deref(), Some("10"));
    assert_eq!(join.chosen_job, Some(expected.to_string()));
    assert!(join.model_version.is_some());
    let c = join.candidates.iter().find(|c| c.job == join.chosen_job).unwrap();
    assert!(c.prediction.is_some() && c.rejected.is_none(), "{c:?}");
    assert_eq!(c.held_s, Some(100.0 - f64::from(expected)));
    let lead = &r.records[2].decision;
    assert_eq!(
        (lead.lead_job.clone(), lead.chosen_job.clone()),
        (Some(first_left.to_string()), None)
    );

    // The same GPU with its only kace job completing: it is free for a lead once it leaves.
    let w2 = World::new("open-cg", lead_slurm(Some("g1")));
    let mut s2 = FakeSlurm::default();
    *s2.pending.borrow_mut() = w2.slurm.pending.borrow().clone();
    s2.details.borrow_mut().insert(10, running_detail(10, "alpha", 1, Some("g1")));
    s2.nodes = vec![NodeGpus {
        shards_per_gpu: 4,
        partitions: Vec::new(),
        max_time_s: Vec::new(),
        features: Vec::new(),
        busy_gpus: Vec::new(),
        name: "n1".into(),
        gpus: vec![None, Some("g1".into())],
        usable: true,
    }];
    *s2.running.borrow_mut() = vec![RunningJob {
        id: 10,
        node: "n1".into(),
        gpus: vec![1],
        state: "CG".into(),
        ..Default::default()
    }];
    let w2 = World { slurm: s2, ..w2 };
    let r = pass(&w2, 1100.0);
    assert!(r.joiners.is_empty(), "{r:?}");
    assert_eq!(r.leads.iter().map(|l| l.2).collect::<Vec<_>>(), vec![0, 1], "{r:?}");
}

/// A pass decides every place before it moves a job: each release's record and begun note are
/// durable before the first pin (one save of the decider's state for the round, not one per
/// release), and the moves follow. A move that fails gives its GPU to the next candidate in
/// the same pass.
#[test]
fn a_pass_notes_every_release_as_begun_before_its_first_move() {
    let mut s = FakeSlurm { nodes: node_n1(&["g0", "g1", "g2"]), ..FakeSlurm::default() };
    *s.pending.get_mut() = vec![
        held(5, "alpha", "alice", "gres:shard:1"),
        held(6, "beta", "alice", "gres:shard:1"),
        held(7, "gamma", "alice", "gres:shard:1"),
        held(8, "delta", "alice", "gres:shard:1"),
    ];
    s.gone = vec![6];
    let mut w = World::new("staged", s);
    w.slurm.decider_dir = Some(w.config.dispatch.state_dir.clone());
    let mut state = kace_node::decider_state::DeciderState::default();
    let r = dispatch::run(&w.slurm, &dispatch_settings(&w), &mut state, 1000.0).unwrap();
    // Round one: 5, 6 and 7 onto the three GPUs, all noted before the first pin; 6's pin
    // fails, and round two gives its GPU to 8.
    let seen = w.slurm.begun_at_pin.borrow().clone();
    assert_eq!(seen[0], vec![5, 6, 7], "{seen:?}");
    assert_eq!(seen.len(), 4, "{seen:?}");
    assert_eq!(seen[3], vec![8], "the second round notes its own release: {seen:?}");
    let mut leads: Vec<(u32, u32)> = r.leads.iter().map(|l| (l.0, l.2)).collect();
    leads.sort();
    assert_eq!(leads, vec![(5, 0), (7, 2), (8, 1)], "{r:?}");
    assert!(r.problems.iter().any(|p| p.starts_with("couldn't release job 6")), "{r:?}");
    // Nothing stays noted once the moves are made, and only real releases are recorded.
    assert!(state.begun.is_empty(), "{:?}", state.begun);
    let spooled = kace_sql::spool::spooled_decisions(&w.config.spool.dir).unwrap();
    assert_eq!(spooled.len(), 3, "{spooled:?}");
}

/// A job held past `max_hold` with no free GPU goes to an open GPU where the group fits (no
/// gain threshold), and its record says so: the GPU's lead, the job chosen, its hold.
#[test]
fn dispatch_places_an_expired_hold_on_an_open_gpu_and_records_it() {
    let s = FakeSlurm::default();
    let mut old = held(11, "beta", "alice", "gres:shard:1");
    old.submitted = Some(100.0);
    *s.pending.borrow_mut() = vec![old];
    let s = FakeSlurm {
        nodes: vec![NodeGpus {
            shards_per_gpu: 4,
            partitions: Vec::new(),
            max_time_s: Vec::new(),
            features: Vec::new(),
            busy_gpus: Vec::new(),
            name: "n1".into(),
            gpus: vec![Some("g1".into())],
            usable: true,
        }],
        ..s
    };
    *s.running.borrow_mut() = vec![RunningJob { started: None, ..alpha_running_since_1000() }];
    let w = World::new("expired-open", s);
    let r = pass(&w, 1100.0);
    assert_eq!(r.expired, vec![(11, "n1".to_string(), 0)], "{r:?}");
    let [rec] = r.records.as_slice() else { panic!("{r:?}") };
    assert_eq!(ReleaseKind::of_key(Some(&rec.key)), ReleaseKind::MaxHold);
    let d = &rec.decision;
    assert_eq!((d.lead_job.as_deref(), d.chosen_job.as_deref()), (Some("10"), Some("11")));
    assert_eq!(d.candidates.len(), 1);
    assert_eq!(d.candidates[0].held_s, Some(1000.0));
    assert!(d.candidates[0].prediction.is_some(), "{d:?}");
}

/// The refill: when a kace job leaves a GPU that still runs a kace job (EpilogSlurmctld's
/// nudge), the decider chooses a new joiner for the survivor by the same decision a lead's
/// partner gets, pinned to the survivor's node and GPU type, and spools it as a refill; while
/// that joiner is on its way, nobody else is sent there.
#[test]
fn a_survivor_gets_a_new_partner_when_its_partner_leaves() {
    let mut s = lead_slurm(Some("g1"));
    s.nodes = node_n1(&["g0", "g1"]);
    let survivor = RunningJob { state: "R".into(), ..starting_lead(10, "alpha", 1) };
    let leaving = RunningJob { state: "CG".into(), ..starting_lead(9, "zeta", 1) };
    *s.running.get_mut() = vec![leaving, survivor];
    // GPU 0 is taken by a plain job's pin: only the survivor's GPU matters here.
    let mut plain = held(8, "alpha", "alice", "gres:shard:g0:1");
    plain.reason = "None".into();
    plain.req_nodes = "n1".into();
    s.pending.get_mut().push(plain);
    let w = World::new("refill", s);
    let expected = w
        .expected_choice(
            "alpha",
            &[
                held(11, "beta", "alice", ""),
                held(12, "zeta", "alice", ""),
                held(16, "eps", "alice", ""),
                held(17, "alpha", "alice", ""),
            ],
        )
        .unwrap();
    // The decider saw job 9 running (it learnt its GPU then).
    let mut state = kace_node::decider_state::DeciderState::default();
    state.gpus.insert(9, ("n1".into(), vec![1]));
    let r = dispatch::run(&w.slurm, &dispatch_settings(&w), &mut state, 1500.0).unwrap();
    assert_eq!(r.joiners, vec![(expected, "n1".to_string(), 1)], "{r:?}");
    let shards = if expected == 16 { 2 } else { 1 };
    let calls = w.slurm.calls.borrow().clone();
    assert!(calls.contains(&format!("pin {expected} n1 Some(\"g1\") {shards}")), "{calls:?}");
    let refill = r.records.iter().find(|d| d.key.ends_with("/refill")).expect("a refill");
    assert_eq!(refill.decision.lead_job.as_deref(), Some("10"));
    assert_eq!(refill.decision.chosen_job, Some(expected.to_string()));

    // The joiner is on its way (released, pinned to n1 g1, not started): nobody else goes.
    {
        let mut p = w.slurm.pending.borrow_mut();
        let j = p.iter_mut().find(|j| j.id == expected).unwrap();
        j.req_nodes = "n1".into();
        j.tres_per_node = format!("gres:shard:g1:{shards}");
    }
    let r = dispatch::run(&w.slurm, &dispatch_settings(&w), &mut state, 1501.0).unwrap();
    assert!(r.joiners.is_empty() && r.leads.is_empty(), "{r:?}");
}

/// A release begun by a decider that died between the pin and the release is finished by the
/// next pass, pinned where it was going (its pin is kace's own), and never made twice.
#[test]
fn a_release_begun_before_a_crash_is_finished_once() {
    let mut s = FakeSlurm { nodes: node_n1(&["g0"]), ..FakeSlurm::default() };
    let mut pinned = held(5, "beta", "alice", "gres:shard:g0:1");
    pinned.req_nodes = "n1".into();
    *s.pending.get_mut() = vec![pinned];
    let w = World::new("begun", s);
    let mut state = kace_node::decider_state::DeciderState::default();
    state.begun.insert(
        5,
        kace_node::decider_state::Begun { node: "n1".into(), kind: Some("g0".into()), shards: 1 },
    );
    let r = dispatch::run(&w.slurm, &dispatch_settings(&w), &mut state, 1500.0).unwrap();
    assert_eq!(r.resumed, vec![5], "{r:?}");
    assert!(r.leads.is_empty(), "the job is not released a second time: {r:?}");
    assert!(state.begun.is_empty());
    let calls = w.slurm.calls.borrow().clone();
    assert_eq!(calls.iter().filter(|c| *c == "release 5").count(), 1, "{calls:?}");
    let r = dispatch::run(&w.slurm, &dispatch_settings(&w), &mut state, 1501.0).unwrap();
    assert!(r.resumed.is_empty() && r.leads.is_empty(), "{r:?}");
}

/// Load audit finding 1: after a slurmctld restart the epilog gets no GPU variable. It finds
/// the GPU in kace's own record, and a record Slurm no longer has is ended with a time, never
/// deleted, so its partner's shared interval is not stored as "alone".
#[test]
fn an_epilog_without_gpu_variables_uses_the_record_and_stale_records_are_ended() {
    let s = FakeSlurm::default();
    s.details.borrow_mut().insert(10, running_detail(10, "alpha", 0, None));
    s.details.borrow_mut().insert(11, running_detail(11, "beta", 0, None));
    *s.on_node.borrow_mut() = vec![10, 11];
    let w = World::new("restart", s);
    assert!(matches!(w.with(|n| prolog::run(n, &job_env(10, 0))), prolog::Outcome::Led));
    *w.clock.0.borrow_mut() = 2010.0;
    w.with(|n| prolog::run(n, &job_env(11, 0)));
    std::fs::write(
        w.config.node.progress_root.join("11.progress"),
        (2010..=2040).map(|t| format!("{t} {}\n", (t - 2010) * 4)).collect::<String>(),
    )
    .unwrap();
    // Job 10's epilog never ran (slurmd crashed); job 11 ends without GPU variables.
    *w.slurm.on_node.borrow_mut() = vec![11];
    *w.clock.0.borrow_mut() = 2040.0;
    let out = w.with(|n| epilog::run(n, &JobEnv { gpu: None, ..job_env(11, 0) }));
    let epilog::Outcome::Done { observations, stopped_mps, .. } = out else { panic!("{out:?}") };
    assert!(stopped_mps);
    assert!(!observations.is_empty());
    assert!(
        observations.iter().all(|o| o.partners.iter().any(|p| p.job == "10")),
        "every interval of 11 overlapped 10's record: {observations:#?}"
    );
    let logs = w.logs.borrow().join("\n");
    assert!(logs.contains("kace's record puts it on GPU 0"), "{logs}");
}

/// GPU 0's sampler ring with one reading a second over `times`: 40 % SM, 20 % memory
/// bandwidth, 3 GiB, 200 W.
fn busy_ring(dir: &std::path::Path, times: std::ops::RangeInclusive<u32>) {
    std::fs::create_dir_all(dir).unwrap();
    let ring = kace_sampler::ring::ring_path(dir, 0);
    let mut r = kace_sampler::Ring::create(&ring, 4096).unwrap();
    for t in times {
        r.push(&kace_sampler::Reading {
            time: f64::from(t),
            sm_pct: Some(40.0),
            mem_pct: Some(20.0),
            used_bytes: Some(3 << 30),
            energy_mj: Some(5_000_000 + 200_000 * u64::from(t)),
            power_w: Some(200.0),
        })
        .unwrap();
    }
}

/// The audit's finding: a 1 s alone run with no sampler reading was stored as a profile
/// measurement although `profile.min_samples = 10`, and so made its workload a candidate.
#[test]
fn an_alone_run_below_min_samples_stores_no_profile_and_says_so() {
    let s = FakeSlurm::default();
    s.details.borrow_mut().insert(30, running_detail(30, "newbie", 0, None));
    *s.on_node.borrow_mut() = vec![30];
    let mut w = World::new("min-samples", s);
    w.config.sampler.dir = w.dir.join("samples");
    w.config.profile.min_samples = 10;
    w.config.profiling.warmup_steps = 0;
    // Four readings while it ran alone, fewer than the ten needed.
    busy_ring(&w.config.sampler.dir, 2000..=2003);
    assert!(matches!(w.with(|n| prolog::run(n, &job_env(30, 0))), prolog::Outcome::Led));
    let progress: String = (2000..=2003).map(|t| format!("{t} {}\n", (t - 2000) * 4)).collect();
    std::fs::write(w.config.node.progress_root.join("30.progress"), progress).unwrap();
    *w.clock.0.borrow_mut() = 2003.0;
    let out = w.with(|n| epilog::run(n, &job_env(30, 0)));
    let epilog::Outcome::Done { profile, observations, .. } = out else { panic!("{out:?}") };
    assert!(profile.is_none(), "{profile:?}");
    assert_eq!(observations.len(), 1, "the observation is still made: {observations:?}");
    let logs = w.logs.borrow().join("\n");
    assert!(
        logs.contains(
            "4 sampler reading(s) in 3 s alone, fewer than profile.min_samples = 10 with both \
             utilizations; no profile measurement (its progress lines alone gave 4.000 steps/s, \
             not stored)"
        ),
        "{logs}"
    );
}

/// The audit's full spool: the observation could not be written, and the epilog deleted the
/// progress file anyway (and blamed "too few progress lines"). Now the observation is parked
/// in the progress root and moved into the spool by a later epilog; when even that fails, the
/// progress file is kept.
#[test]
fn a_full_spool_loses_no_observation() {
    let s = FakeSlurm::default();
    s.details.borrow_mut().insert(10, running_detail(10, "alpha", 0, None));
    s.details.borrow_mut().insert(11, running_detail(11, "alpha", 0, None));
    *s.on_node.borrow_mut() = vec![10];
    let mut w = World::new("full-spool", s);
    // The sampler's readings of both alone runs, so that each is a profile measurement.
    w.config.sampler.dir = w.dir.join("samples");
    w.config.profile.min_samples = 5;
    busy_ring(&w.config.sampler.dir, 1990..=4020);
    let spool = w.config.spool.dir.clone();
    let progress = |job: u32, from: u32| {
        let text: String =
            (from..=from + 10).map(|t| format!("{t} {}\n", (t - from) * 2)).collect();
        std::fs::write(w.config.node.progress_root.join(format!("{job}.progress")), text).unwrap();
    };
    assert!(matches!(w.with(|n| prolog::run(n, &job_env(10, 0))), prolog::Outcome::Led));
    progress(10, 2000);
    // A spool that cannot take a file: a regular file where the directory should be.
    let blocked = w.dir.join("blocked-spool");
    std::fs::write(&blocked, "").unwrap();
    w.config.spool.dir = blocked;
    *w.clock.0.borrow_mut() = 2010.0;
    let out = w.with(|n| epilog::run(n, &job_env(10, 0)));
    let epilog::Outcome::Done { observations, .. } = out else { panic!("{out:?}") };
    assert_eq!(observations.len(), 1);
    let logs = w.logs.borrow().join("\n");
    assert!(logs.contains("parked it as"), "{logs}");
    assert!(!logs.contains("too few progress lines"), "{logs}");
    // Its alone run's profile measurement (from the progress lines) is parked as well.
    assert!(logs.contains("couldn't spool the profile measurement"), "{logs}");
    let parked_profiles = |root: &std::path::Path| {
        std::fs::read_dir(root)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".parked-profile.json"))
            .count()
    };
    assert_eq!(parked_profiles(&w.config.node.progress_root), 1, "{logs}");

    // The spool has room again: the next epilog on the node moves the parked one in.
    w.config.spool.dir = spool;
    *w.slurm.on_node.borrow_mut() = vec![11];
    *w.clock.0.borrow_mut() = 3000.0;
    assert!(matches!(w.with(|n| prolog::run(n, &job_env(11, 0))), prolog::Outcome::Led));
    progress(11, 3000);
    *w.clock.0.borrow_mut() = 3010.0;
    w.with(|n| epilog::run(n, &job_env(11, 0)));
    let mut db = Db::open(&w.config.database.path).unwrap();
    let r = kace_sql::spool::ingest(&mut db, &w.config.spool.dir, &w.dir.join("q")).unwrap();
    assert_eq!(r.inserted, 2, "{r:?}");
    assert_eq!(parked_profiles(&w.config.node.progress_root), 0);
    let q = w.dir.join("q");
    let r = kace_sql::spool::ingest_profiles(&mut db, &w.config.spool.dir, &q).unwrap();
    // Job 10's parked measurement and job 11's own.
    assert_eq!(r.inserted, 2, "{r:?}");

    // Neither the spool nor the progress root can take it: the progress file is kept.
    if kace_layout::trusted_dir::running_as_root() {
        use std::os::unix::fs::PermissionsExt;
        *w.slurm.on_node.borrow_mut() = vec![10];
        *w.clock.0.borrow_mut() = 4000.0;
        assert!(matches!(w.with(|n| prolog::run(n, &job_env(10, 0))), prolog::Outcome::Led));
        progress(10, 4000);
        w.config.spool.dir = w.dir.join("blocked-spool");
        let root = w.config.node.progress_root.clone();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o777)).unwrap();
        *w.clock.0.borrow_mut() = 4010.0;
        w.with(|n| epilog::run(n, &job_env(10, 0)));
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(root.join("10.progress.unspooled").is_file(), "the progress file was not kept");
        assert!(w.logs.borrow().join("\n").contains("kept the progress file"));
    }
}

/// The audit's requeue: a job id that runs twice kept only one run's observation (the second
/// run's spool file replaced the first's, or was dropped as "already stored" after an ingest).
#[test]
fn a_requeued_job_keeps_both_runs_observations() {
    let s = FakeSlurm::default();
    s.details.borrow_mut().insert(10, running_detail(10, "alpha", 0, None));
    *s.on_node.borrow_mut() = vec![10];
    let w = World::new("requeue", s);
    let mut db = Db::open(&w.config.database.path).unwrap();
    for (start, rate) in [(2000u32, 2u32), (3000, 3)] {
        *w.clock.0.borrow_mut() = f64::from(start);
        assert!(matches!(w.with(|n| prolog::run(n, &job_env(10, 0))), prolog::Outcome::Led));
        let text: String =
            (start..=start + 10).map(|t| format!("{t} {}\n", (t - start) * rate)).collect();
        std::fs::write(w.config.node.progress_root.join("10.progress"), text).unwrap();
        *w.clock.0.borrow_mut() = f64::from(start + 10);
        let out = w.with(|n| epilog::run(n, &job_env(10, 0)));
        let epilog::Outcome::Done { observations, .. } = out else { panic!("{out:?}") };
        assert_eq!(observations.len(), 1);
        // The first run is ingested before the second ends.
        kace_sql::spool::ingest(&mut db, &w.config.spool.dir, &w.dir.join("q")).unwrap();
    }
    let stored = db.observations().unwrap();
    let mut rates: Vec<f64> = stored.iter().map(|o| o.throughput).collect();
    rates.sort_by(f64::total_cmp);
    assert_eq!(rates, vec![2.0, 3.0], "{stored:#?}");
}

/// The audit's poisoned progress file: a user's two jobs wrote 1.5e308 steps/s, which passed
/// every check into the spool, the database and the retrained model. The epilog still spools
/// what the file says (it cannot know better), but ingest quarantines it against the workload's
/// exclusive throughput, so nothing absurd reaches training.
#[test]
fn a_poisoned_progress_file_never_reaches_the_database() {
    let s = FakeSlurm::default();
    s.details.borrow_mut().insert(10, running_detail(10, "alpha", 0, None));
    *s.on_node.borrow_mut() = vec![10];
    let w = World::new("poison", s);
    assert!(matches!(w.with(|n| prolog::run(n, &job_env(10, 0))), prolog::Outcome::Led));
    std::fs::write(w.config.node.progress_root.join("10.progress"), "2001 0\n2002 1.5e308\n")
        .unwrap();
    *w.clock.0.borrow_mut() = 2010.0;
    let out = w.with(|n| epilog::run(n, &job_env(10, 0)));
    let epilog::Outcome::Done { observations, .. } = out else { panic!("{out:?}") };
    assert_eq!(observations.len(), 1);
    let mut db = Db::open(&w.config.database.path).unwrap();
    let r = kace_sql::spool::ingest(&mut db, &w.config.spool.dir, &w.dir.join("q")).unwrap();
    assert_eq!((r.inserted, r.quarantined.len()), (0, 1), "{r:?}");
    assert!(r.quarantined[0].1.contains("exclusive throughput"), "{r:?}");
    assert_eq!(db.observation_count().unwrap(), 0);
}

/// The audit's class of symlink races applies to `state_dir` too: root writes and renames the
/// GPU records there. One a user could change is refused; the job runs alone.
#[test]
fn a_state_dir_others_can_write_is_refused() {
    if !kace_layout::trusted_dir::running_as_root() {
        return; // Only root's writes can be turned against the system; CI runs as root.
    }
    let s = FakeSlurm::default();
    s.details.borrow_mut().insert(10, running_detail(10, "alpha", 0, None));
    *s.on_node.borrow_mut() = vec![10];
    let mut w = World::new("open-state", s);
    let open = w.dir.join("open-state");
    std::fs::create_dir_all(&open).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    w.config.node.state_dir = open.clone();
    let out = w.with(|n| prolog::run(n, &job_env(10, 0)));
    assert!(!matches!(out, prolog::Outcome::Led), "{out:?}");
    let logs = w.logs.borrow().join("\n");
    assert!(logs.contains("writable by its group or everyone"), "{logs}");
    assert!(!open.join("n1/gpu0/jobs/10").exists());
}

/// The audit's information exposure: every user could list which jobs ran which workloads on
/// each GPU. The per-node job records are 0750 now.
#[test]
fn job_records_are_not_world_readable() {
    let s = FakeSlurm::default();
    s.details.borrow_mut().insert(10, running_detail(10, "alpha", 0, None));
    *s.on_node.borrow_mut() = vec![10];
    let w = World::new("private-state", s);
    assert!(matches!(w.with(|n| prolog::run(n, &job_env(10, 0))), prolog::Outcome::Led));
    use std::os::unix::fs::PermissionsExt;
    let node_dir = w.config.node.state_dir.join("n1");
    for d in [node_dir.clone(), node_dir.join("gpu0"), node_dir.join("gpu0/jobs")] {
        let mode = std::fs::metadata(&d).unwrap().permissions().mode();
        assert_eq!(mode & 0o007, 0, "{} is {mode:o}", d.display());
    }
}

/// A job may append to its progress file without bound (the file shares a disk with the spool);
/// kace-sampler's cap compacts it while the job keeps appending, and the epilog still measures
/// both intervals exactly: 4 steps/s alone, 2 steps/s with its partner.
#[test]
fn a_runaway_progress_writer_is_capped_and_still_observed() {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let s = FakeSlurm::default();
    s.details.borrow_mut().insert(10, running_detail(10, "alpha", 0, None));
    s.details.borrow_mut().insert(11, running_detail(11, "beta", 0, None));
    *s.on_node.borrow_mut() = vec![10, 11];
    let w = World::new("runaway", s);
    assert!(matches!(w.with(|n| prolog::run(n, &job_env(10, 0))), prolog::Outcome::Led));
    *w.clock.0.borrow_mut() = 2010.0;
    assert!(matches!(w.with(|n| prolog::run(n, &job_env(11, 0))), prolog::Outcome::Joined { .. }));
    let file = w.config.node.progress_root.join("10.progress");

    // 1.2 million lines (about 30 MB) over the job's 30 s, appended 2 000 at a time.
    const LINES: u32 = 1_200_000;
    let writer = {
        let file = file.clone();
        std::thread::spawn(move || {
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&file)
                .unwrap();
            let mut written = 0u64;
            for chunk in 0..LINES / 2000 {
                let mut text = String::new();
                for i in chunk * 2000..(chunk + 1) * 2000 {
                    let t = 2000.0 + 30.0 * f64::from(i) / f64::from(LINES);
                    let steps =
                        if t <= 2010.0 { (t - 2000.0) * 4.0 } else { 40.0 + (t - 2010.0) * 2.0 };
                    text.push_str(&format!("{t} {steps}\n"));
                }
                f.write_all(text.as_bytes()).unwrap();
                written += text.len() as u64;
            }
            f.write_all(b"2030 80\n").unwrap();
            written + 8
        })
    };
    const CAP: u64 = 1 << 20;
    let mut cap =
        kace_sampler::progress_cap::ProgressCap::new(&w.config.node.progress_root, CAP, 0);
    let lines = RefCell::new(Vec::new());
    let log = |l: &str| lines.borrow_mut().push(l.to_string());
    let mut compactions = 0;
    while !writer.is_finished() {
        compactions += cap.tick(&log);
    }
    let written = writer.join().unwrap();
    compactions += cap.tick(&log);
    let logs = lines.borrow().join("\n");
    assert!(compactions >= 2, "{compactions} compactions: {logs}");
    assert!(!logs.contains("couldn't"), "{logs}");
    let meta = std::fs::metadata(&file).unwrap();
    let f = std::fs::File::open(&file).unwrap();
    let data = meta.len() - kace_profiling::progress::data_start(&f).unwrap();
    assert!(written > 20 * CAP && data <= CAP, "{written} bytes written, {data} left");
    // Nothing the job appended during a compaction was torn or lost.
    let prog = kace_profiling::progress::read(&file).unwrap();
    assert_eq!(prog.skipped, 0);
    assert_eq!(
        prog.points.last(),
        Some(&kace_profiling::progress::Point { time: 2030.0, steps: 80.0 })
    );

    *w.clock.0.borrow_mut() = 2030.0;
    let out = w.with(|n| epilog::run(n, &job_env(10, 0)));
    let epilog::Outcome::Done { observations, .. } = out else { panic!("{out:?}") };
    assert_eq!(observations.len(), 2, "{observations:#?}");
    assert!(observations[0].partners.is_empty());
    assert!((observations[0].throughput - 4.0).abs() < 1e-6, "{observations:#?}");
    assert_eq!(observations[1].partners[0].job, "11");
    assert!((observations[1].throughput - 2.0).abs() < 1e-6, "{observations:#?}");
}

/// A workload no admin measured alone (kernel metrics only, from an ncu import) is no candidate
/// until it has run alone once: its epilog then measures it from the sampler's readings and its
/// progress lines (source `observed`), ingest stores that, and the next decision takes it.
#[test]
fn an_unprofiled_workload_profiles_itself_alone_and_then_is_a_candidate() {
    let s = FakeSlurm::default();
    s.details.borrow_mut().insert(20, running_detail(20, "newbie", 0, None));
    *s.on_node.borrow_mut() = vec![20];
    let mut w = World::new("onboard", s);
    w.config.sampler.dir = w.dir.join("samples");
    w.config.profile.min_samples = 5;
    let mut kernel = [None; FEATURE_COUNT];
    for (i, v) in kernel.iter_mut().enumerate().take(6) {
        *v = Some(10.0 * (i as f64 + 1.0));
    }
    Db::open(&w.config.database.path)
        .unwrap()
        .insert_profiles(&[NewProfile {
            workload: "newbie".into(),
            gpu_model: "Fake".into(),
            source: "ncu:newbie.csv".into(),
            values: kernel,
        }])
        .unwrap();
    let verdict = |w: &World| {
        let db = Db::open_read_only(&w.config.database.path).unwrap();
        let cand = [JobSpec { workload: "newbie".into(), user: Some("alice".into()) }];
        let lead = [JobSpec { workload: "alpha".into(), user: Some("alice".into()) }];
        let d = decide_from_store(&db, &lead, &cand, &w.config.policy(), Some(32.0), None, &[])
            .unwrap();
        (d.reason(0), d.selection.verdicts[0].prediction)
    };
    let (reason, _) = verdict(&w);
    assert_eq!(
        reason.as_deref(),
        Some("unknown profile (observed alone in 0 of the 1 runs needed)")
    );

    // The sampler's ring: start-up (idle, until the warm-up ends at 2002), then 40 % SM, 20 %
    // memory bandwidth and 3 GiB while the job runs alone from 2000 to 2030.
    std::fs::create_dir_all(&w.config.sampler.dir).unwrap();
    let ring = kace_sampler::ring::ring_path(&w.config.sampler.dir, 0);
    let mut r = kace_sampler::Ring::create(&ring, 600).unwrap();
    for t in 1990..=2040 {
        let busy = (2002..=2030).contains(&t);
        r.push(&kace_sampler::Reading {
            time: f64::from(t),
            sm_pct: Some(if busy { 40.0 } else { 0.0 }),
            mem_pct: Some(if busy { 20.0 } else { 0.0 }),
            used_bytes: Some(if busy { 3 << 30 } else { 0 }),
            ..kace_sampler::Reading::default()
        })
        .unwrap();
    }
    w.config.profiling.warmup_steps = 8;
    assert!(matches!(w.with(|n| prolog::run(n, &job_env(20, 0))), prolog::Outcome::Led));
    let progress: String = (2000..=2030).map(|t| format!("{t} {}\n", (t - 2000) * 4)).collect();
    std::fs::write(w.config.node.progress_root.join("20.progress"), progress).unwrap();
    *w.clock.0.borrow_mut() = 2030.0;
    let out = w.with(|n| epilog::run(n, &job_env(20, 0)));
    let epilog::Outcome::Done { profile: Some(p), .. } = out else { panic!("{out:?}") };
    assert_eq!(p.profile.source, kace_sql::OBSERVED_SOURCE);
    assert_eq!(&p.profile.values[6..], &[Some(4.0), Some(40.0), Some(20.0), Some(3.0)]);
    assert_eq!((p.samples, p.alone_seconds, p.job.as_str()), (29, 28.0, "20"));

    let mut db = Db::open(&w.config.database.path).unwrap();
    let r =
        kace_sql::spool::ingest_profiles(&mut db, &w.config.spool.dir, &w.dir.join("q")).unwrap();
    assert_eq!((r.inserted, r.quarantined.len()), (1, 0));
    let stored = &db.profiles(&["newbie"], None).unwrap()["newbie"];
    assert_eq!(stored.sources[0].as_deref(), Some("ncu:newbie.csv"));
    assert_eq!(stored.sources[9].as_deref(), Some(kace_sql::OBSERVED_SOURCE));
    let (reason, prediction) = verdict(&w);
    assert_eq!(reason, None, "a candidate after one alone run");
    assert!(prediction.is_some());
    // A site that wants two alone runs first still waits.
    w.config.profile.min_alone_runs = 2;
    let (reason, _) = verdict(&w);
    assert_eq!(
        reason.as_deref(),
        Some("unknown profile (observed alone in 1 of the 2 runs needed)")
    );
    // Nor does it take a partner when it leads: its runs keep measuring it alone.
    let db = Db::open_read_only(&w.config.database.path).unwrap();
    let lead = [JobSpec { workload: "newbie".into(), user: Some("alice".into()) }];
    let cand = [JobSpec { workload: "alpha".into(), user: Some("alice".into()) }];
    let e = decide_from_store(&db, &lead, &cand, &w.config.policy(), Some(32.0), None, &[])
        .unwrap_err();
    assert!(e.to_string().contains("observed alone in 1 of the 2 runs needed"), "{e}");
}

/// The memory guard: each kace job gets memcap × (1 + margin) as its limit file for the plugin;
/// a partner that runs out of memory under it is recorded (its memcap rises, so its next limit
/// is higher) while the lead's run and observations are untouched.
#[test]
fn a_partner_out_of_memory_under_its_limit_is_recorded_and_its_next_limit_is_higher() {
    let s = FakeSlurm::default();
    s.details.borrow_mut().insert(10, running_detail(10, "alpha", 0, None));
    s.details.borrow_mut().insert(11, running_detail(11, "beta", 0, None));
    s.details.borrow_mut().insert(12, running_detail(12, "beta", 0, None));
    s.details.borrow_mut().insert(13, running_detail(13, "beta", 0, None));
    *s.on_node.borrow_mut() = vec![10, 11];
    let mut w = World::new("oom", s);
    // The sampler saw the GPU's memory in use reach 5.3 GiB while job 11 ran: that backs its
    // out-of-memory line under a 5 632 MiB limit (90 % of it is 5 069 MiB).
    w.config.sampler.dir = w.dir.join("samples");
    std::fs::create_dir_all(&w.config.sampler.dir).unwrap();
    let ring = kace_sampler::ring::ring_path(&w.config.sampler.dir, 0);
    let mut r = kace_sampler::Ring::create(&ring, 600).unwrap();
    for t in 2000..=2040 {
        let used = if (2015..=2020).contains(&t) { 5427 << 20 } else { 2 << 30 };
        let reading = kace_sampler::Reading {
            time: f64::from(t),
            sm_pct: Some(50.0),
            mem_pct: Some(20.0),
            used_bytes: Some(used),
            ..kace_sampler::Reading::default()
        };
        r.push(&reading).unwrap();
    }
    drop(r);
    let limit_of = |job: u32| {
        let f = kace_layout::memory_limit::file(&w.config.node.progress_root, job);
        std::fs::read_to_string(f).ok()
    };
    assert!(matches!(w.with(|n| prolog::run(n, &job_env(10, 0))), prolog::Outcome::Led));
    *w.clock.0.borrow_mut() = 2010.0;
    assert!(matches!(w.with(|n| prolog::run(n, &job_env(11, 0))), prolog::Outcome::Joined { .. }));
    // alpha's memcap is 2 GiB, beta's 5 GiB; the margin is 10 %.
    assert_eq!(limit_of(10).as_deref(), Some("0=2253M\n"));
    assert_eq!(limit_of(11).as_deref(), Some("0=5632M\n"));

    let lines = |from: u32, to: u32| -> String {
        (from..=to).map(|t| format!("{t} {}\n", (t - from) * 2)).collect()
    };
    std::fs::write(w.config.node.progress_root.join("10.progress"), lines(2000, 2040)).unwrap();
    let mut p11 = lines(2010, 2020);
    p11.push_str("2020.5 oom\n");
    std::fs::write(w.config.node.progress_root.join("11.progress"), p11).unwrap();
    *w.clock.0.borrow_mut() = 2021.0;
    let failed =
        JobEnv { exit: Some(kace_node::env::JobExit { code: 1, signal: 0 }), ..job_env(11, 0) };
    let out = w.with(|n| epilog::run(n, &failed));
    let epilog::Outcome::Done { profile: Some(p), stopped_mps, .. } = out else {
        panic!("{out:?}")
    };
    assert!(!stopped_mps, "the lead still runs");
    assert_eq!(p.profile.source, kace_sql::OOM_SOURCE);
    assert_eq!(p.oom_limit_mib, Some(5632));
    assert_eq!(p.profile.values[kace_sql::MEMCAP], Some(5.5));
    assert_eq!(p.samples, 12, "the readings from its start (2010) to its end (2021) back it");
    assert_eq!(limit_of(11), None, "the limit file goes with the job");
    assert!(w
        .logs
        .borrow()
        .iter()
        .any(|l| l.contains("ran out of GPU memory at 2020 under its limit of 5632 MiB")));

    // The lead runs on and ends normally, observed alone and with its partner.
    *w.slurm.on_node.borrow_mut() = vec![10];
    *w.clock.0.borrow_mut() = 2040.0;
    let out = w.with(|n| epilog::run(n, &job_env(10, 0)));
    let epilog::Outcome::Done { observations, stopped_mps, .. } = out else { panic!("{out:?}") };
    assert!(stopped_mps);
    assert_eq!(observations.len(), 3, "{observations:#?}");
    assert_eq!(observations[1].partners[0].job, "11");

    let mut db = Db::open(&w.config.database.path).unwrap();
    kace_sql::spool::ingest_profiles(&mut db, &w.config.spool.dir, &w.dir.join("q")).unwrap();
    drop(db);
    // beta's next job gets a higher limit: 5.5 GiB × 1.1.
    *w.slurm.on_node.borrow_mut() = vec![12];
    *w.clock.0.borrow_mut() = 2050.0;
    w.with(|n| prolog::run(n, &job_env(12, 0)));
    assert_eq!(limit_of(12).as_deref(), Some("0=6196M\n"));
    // Never above the GPU's memory (the re-audit's M1: 39 583 MiB on a 32 GiB GPU): on a
    // 4 GiB GPU the same memcap gets the whole GPU, no more.
    w.config.node.gpu_memory_gib = Some(4.0);
    *w.slurm.on_node.borrow_mut() = vec![12, 13];
    w.with(|n| prolog::run(n, &job_env(13, 0)));
    assert_eq!(limit_of(13).as_deref(), Some("0=4096M\n"));
}

/// The re-audit's M1: a job's own `<t> oom` line and a failed exit raised its workload's memcap
/// for every user with nothing behind it. Now the sampler must have seen the GPU's memory near
/// the limit, and a limit at the GPU's size already raises nothing.
#[test]
fn an_oom_line_that_roots_measurements_do_not_back_raises_nothing() {
    let s = FakeSlurm::default();
    s.details.borrow_mut().insert(11, running_detail(11, "beta", 0, None));
    *s.on_node.borrow_mut() = vec![11];
    let mut w = World::new("oom-forged", s);
    w.config.sampler.dir = w.dir.join("samples");
    let failed =
        JobEnv { exit: Some(kace_node::env::JobExit { code: 1, signal: 0 }), ..job_env(11, 0) };
    let forge = |w: &World| {
        w.with(|n| prolog::run(n, &job_env(11, 0)));
        std::fs::write(
            w.config.node.progress_root.join("11.progress"),
            "2000 0\n2001 4\n2002 oom\n",
        )
        .unwrap();
        let out = w.with(|n| epilog::run(n, &failed));
        let epilog::Outcome::Done { profile, .. } = out else { panic!("{out:?}") };
        assert!(
            profile.as_ref().is_none_or(|p| p.profile.source != kace_sql::OOM_SOURCE),
            "{profile:?}"
        );
    };
    // No sampler running: nothing backs it.
    forge(&w);
    assert!(w
        .logs
        .borrow()
        .iter()
        .any(|l| l.contains("couldn't read the GPU's samples to back it")));
    // The sampler ran and saw 2 GiB in use, far under the 5 632 MiB limit.
    std::fs::create_dir_all(&w.config.sampler.dir).unwrap();
    let ring = kace_sampler::ring::ring_path(&w.config.sampler.dir, 0);
    let mut r = kace_sampler::Ring::create(&ring, 600).unwrap();
    for t in 1990..=2010 {
        let reading = kace_sampler::Reading {
            time: f64::from(t),
            sm_pct: Some(50.0),
            mem_pct: Some(20.0),
            used_bytes: Some(2 << 30),
            ..kace_sampler::Reading::default()
        };
        r.push(&reading).unwrap();
    }
    drop(r);
    forge(&w);
    assert!(w.logs.borrow().iter().any(|l| l.contains("saw at most 2048 MiB in use on the GPU")));
    // A limit already the whole GPU's (5 GiB here) raises nothing, whatever the readings.
    w.config.node.gpu_memory_gib = Some(5.0);
    forge(&w);
    assert!(w.logs.borrow().iter().any(|l| l.contains("a memcap never exceeds the GPU")));
}

#[test]
fn an_oom_line_from_a_job_that_succeeded_or_without_a_limit_raises_nothing() {
    let s = FakeSlurm::default();
    s.details.borrow_mut().insert(10, running_detail(10, "alpha", 0, None));
    *s.on_node.borrow_mut() = vec![10];
    let mut w = World::new("oom-not", s);
    w.with(|n| prolog::run(n, &job_env(10, 0)));
    std::fs::write(w.config.node.progress_root.join("10.progress"), "2000 0\n2001 oom\n").unwrap();
    let ok =
        JobEnv { exit: Some(kace_node::env::JobExit { code: 0, signal: 0 }), ..job_env(10, 0) };
    let out = w.with(|n| epilog::run(n, &ok));
    let epilog::Outcome::Done { profile, .. } = out else { panic!("{out:?}") };
    assert!(profile.is_none_or(|p| p.profile.source != kace_sql::OOM_SOURCE));
    // With the guard off, no limit file is written and an OOM has no limit to record.
    w.config.mps.memory_limit = false;
    w.with(|n| prolog::run(n, &job_env(10, 0)));
    assert!(!kace_layout::memory_limit::file(&w.config.node.progress_root, 10).exists());
}

/// A writer holding the database's lock (a long `kace retrain`) cannot hold a lead's prolog past
/// its budget: the prolog waits for the lock only as long as its budget allows (SQLite's own
/// busy timeout is 10 s), then runs the lead alone and says why.
#[test]
fn a_locked_database_cannot_hold_the_prolog_past_its_budget() {
    let w = World::new("db-locked", lead_slurm(Some("g1")));
    let writer = rusqlite::Connection::open(&w.config.database.path).unwrap();
    writer.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let started = Instant::now();
    let out = w.with(|n| prolog::run(n, &job_env(10, 1)));
    let took = started.elapsed();
    writer.execute_batch("ROLLBACK").unwrap();
    assert!(matches!(out, prolog::Outcome::Led), "{out:?}");
    // World gives every hook a 5 s budget.
    assert!(took < Duration::from_secs(7), "the prolog took {took:?}");
    let logs = w.logs.borrow().join("\n");
    assert!(logs.contains("couldn't set a memory limit"), "{logs}");
    assert!(!w.slurm.calls.borrow().iter().any(|c| c.starts_with("release")));
}

/// Zero-touch: a workload nobody ran Nsight Compute on (system metrics only) is a candidate,
/// its kernel metrics filled by the model; one still lacking a system metric is not, and the
/// verdict names only what is missing of those.
#[test]
fn a_profile_without_kernel_metrics_is_a_candidate_and_a_missing_system_metric_is_named() {
    let w = World::new("sysonly", FakeSlurm::default());
    let mut system = [None; FEATURE_COUNT];
    system[6..].copy_from_slice(&[Some(4.0), Some(40.0), Some(20.0), Some(3.0)]);
    let mut half = system;
    half[7] = None;
    let profile = |workload: &str, values| NewProfile {
        workload: workload.into(),
        gpu_model: "Fake".into(),
        source: "manual".into(),
        values,
    };
    Db::open(&w.config.database.path)
        .unwrap()
        .insert_profiles(&[profile("sysonly", system), profile("half", half)])
        .unwrap();
    let db = Db::open_read_only(&w.config.database.path).unwrap();
    let spec = |w: &str| JobSpec { workload: w.into(), user: Some("alice".into()) };
    let d = decide_from_store(
        &db,
        &[spec("alpha")],
        &[spec("sysonly"), spec("half")],
        &w.config.policy(),
        Some(32.0),
        None,
        &[],
    )
    .unwrap();
    assert_ne!(d.reason(0).as_deref().map(|r| r.starts_with("incomplete profile")), Some(true));
    assert!(d.selection.verdicts[0].prediction.is_some(), "{:?}", d.reason(0));
    assert_eq!(d.reason(1).as_deref(), Some("incomplete profile (missing sm_pct)"));
}

/// A lead whose prolog starts while slurmctld restarts is still a kace job: the prolog reads the
/// job again until slurmctld answers (within half its budget), instead of running it as plain,
/// which would store its partner's interval as alone.
#[test]
fn a_prolog_during_a_slurmctld_restart_reads_the_job_again() {
    let s = FakeSlurm::default();
    s.details.borrow_mut().insert(20, running_detail(20, "alpha", 0, None));
    *s.on_node.borrow_mut() = vec![20];
    s.unreachable_reads.set(2);
    let w = World::new("restart", s);
    let out = w.with(|n| prolog::run(n, &job_env(20, 0)));
    assert!(matches!(out, prolog::Outcome::Led), "{out:?}");
    let reads = w.slurm.calls.borrow().iter().filter(|c| *c == "queued 20").count();
    assert!(reads >= 3, "{:?}", w.slurm.calls.borrow());
    assert!(w.logs.borrow().iter().any(|l| l.contains("couldn't read the job from Slurm")));
}

/// Right after a slurmctld restart slurmd may run a prolog with no GPU in its environment: the
/// prolog takes the GPU from Slurm's record of the allocation and records the job there, so
/// that its partner's interval is not stored as alone (the load test's job 41).
#[test]
fn a_prolog_without_the_gpu_in_its_environment_takes_it_from_slurms_record() {
    let s = FakeSlurm::default();
    s.details.borrow_mut().insert(20, running_detail(20, "alpha", 1, None));
    *s.on_node.borrow_mut() = vec![20];
    let w = World::new("no-gpu-env", s);
    let env = JobEnv { gpu: None, ..job_env(20, 1) };
    let out = w.with(|n| prolog::run(n, &env));
    assert!(matches!(out, prolog::Outcome::Led), "{out:?}");
    let lock = kace_node::state::lock_gpu(
        &w.config.node.state_dir,
        "n1",
        GpuIndex(1),
        std::time::Instant::now() + std::time::Duration::from_secs(5),
    )
    .unwrap();
    assert_eq!(lock.running().iter().map(|r| r.job).collect::<Vec<_>>(), [20]);
    assert!(w.logs.borrow().iter().any(|l| l.contains("Slurm's record puts it on GPU 1")));
}

/// The exact environment and JSON record Slurm 26.05 gave a lead's prolog when slurmctld
/// started the job after its restart and before the nodes registered again (captured in a real
/// load run, job 15; tests/tests/restart_prolog.rs reproduces it): no GPU variable at all, and a
/// record whose `gres_detail` (`shard:g0:1(1/4,0/4)`) names GPU 0. Read through the real
/// `scontrol --json` path, the prolog leads on GPU 0.
#[test]
fn a_prolog_started_before_the_nodes_registered_again_leads_on_the_gpu_of_slurms_record() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/26.05.3");
    let text =
        std::fs::read_to_string(fixtures.join("prolog-env-before-registration.txt")).unwrap();
    let vars: BTreeMap<&str, &str> = text.lines().filter_map(|l| l.split_once('=')).collect();
    let env = JobEnv::read(|k| vars.get(k).map(|v| v.to_string())).unwrap();
    assert_eq!((env.job, env.kace, env.gpu, env.node.as_str()), (15, true, None, "n1"));

    // Slurm's record, as kace's real Commands read it from `scontrol --json show job`.
    let t = TempDir::new("node-before-registration");
    let scontrol = t.path().join("scontrol");
    let record = fixtures.join("job-before-registration.json");
    std::fs::write(&scontrol, format!("#!/bin/sh\nexec cat {}\n", record.display())).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&scontrol, std::fs::Permissions::from_mode(0o755)).unwrap();
    let commands = kace_node::slurm::Commands {
        scontrol: scontrol.clone(),
        squeue: scontrol.clone(),
        sinfo: scontrol,
        timeout: Duration::from_secs(5),
        deadline: None,
        logger: kace_log::Logger::new(None),
        counts: Default::default(),
    };
    let detail = commands.job(15).unwrap();
    assert_eq!((detail.workload(), detail.single_gpu()), (Some("gpt2-finetune"), Some(0)));

    let s = FakeSlurm::default();
    s.details.borrow_mut().insert(15, detail);
    *s.on_node.borrow_mut() = vec![15];
    let w = World::new("before-registration", s);
    let out = w.with(|n| prolog::run(n, &env));
    assert!(matches!(out, prolog::Outcome::Led), "{out:?}");
    let lock = kace_node::state::lock_gpu(
        &w.config.node.state_dir,
        "n1",
        GpuIndex(0),
        Instant::now() + Duration::from_secs(5),
    )
    .unwrap();
    assert_eq!(lock.running().iter().map(|r| r.job).collect::<Vec<_>>(), [15]);
    assert!(
        w.logs.borrow().iter().any(|l| l.contains("Slurm's record puts it on GPU 0")),
        "{:?}",
        w.logs.borrow()
    );
}

/// The re-audit's M2: one epilog whose clock was a day ahead ended its job a day in the future,
/// and every later job on that GPU named it as a partner; one whose clock was an hour behind
/// lost the observations with the reason "too few progress lines". Now the next epilog takes
/// the future end back to its own clock (later jobs are alone again) and the reasons name the
/// clock.
#[test]
fn a_clock_step_in_one_epilog_names_the_clock_and_poisons_no_later_observation() {
    let s = FakeSlurm::default();
    for j in [10, 11, 12, 13] {
        s.details.borrow_mut().insert(j, running_detail(j, "alpha", 0, None));
    }
    let w = World::new("clock", s);
    let lines = |job: u32, from: u32, to: u32| {
        let text: String = (from..=to).map(|t| format!("{t} {}\n", (t - from) * 2)).collect();
        std::fs::write(w.config.node.progress_root.join(format!("{job}.progress")), text).unwrap();
    };
    let at = |t: f64| *w.clock.0.borrow_mut() = t;
    let observations = |job: u32| {
        let out = w.with(|n| epilog::run(n, &job_env(job, 0)));
        let epilog::Outcome::Done { observations, .. } = out else { panic!("{out:?}") };
        observations
    };
    // Job 10 runs 2000-2030; its epilog's clock is a day ahead.
    *w.slurm.on_node.borrow_mut() = vec![10];
    at(2000.0);
    w.with(|n| prolog::run(n, &job_env(10, 0)));
    lines(10, 2000, 2030);
    at(2030.0 + 86_400.0);
    observations(10);
    // Job 11 runs 2040-2070 on the real clock: job 10's end lies in its future.
    *w.slurm.on_node.borrow_mut() = vec![11];
    at(2040.0);
    w.with(|n| prolog::run(n, &job_env(11, 0)));
    lines(11, 2040, 2070);
    at(2070.0);
    assert!(observations(11).is_empty());
    let logs = w.logs.borrow().join("\n");
    assert!(
        logs.contains("job 10's record on GPU 0 ends 86360 s after this node's clock"),
        "{logs}"
    );
    assert!(logs.contains("the clock of the epilog that ended it was ahead"), "{logs}");
    // Job 12, later: alone, no phantom partner.
    *w.slurm.on_node.borrow_mut() = vec![12];
    at(2080.0);
    w.with(|n| prolog::run(n, &job_env(12, 0)));
    lines(12, 2080, 2110);
    at(2110.0);
    let obs = observations(12);
    assert!(!obs.is_empty() && obs.iter().all(|o| o.partners.is_empty()), "{obs:#?}");
    // Each observation carries its job's user (training caps what one user alone shows).
    assert!(obs.iter().all(|o| o.user.as_deref() == Some("alice")), "{obs:#?}");
    // Job 13's epilog has its clock an hour behind: the reason is the clock.
    *w.slurm.on_node.borrow_mut() = vec![13];
    at(3000.0);
    w.with(|n| prolog::run(n, &job_env(13, 0)));
    lines(13, 3000, 3030);
    at(3030.0 - 3600.0);
    assert!(observations(13).is_empty());
    let logs = w.logs.borrow().join("\n");
    assert!(
        logs.contains("before it started by its prolog's (3000): the clock stepped back"),
        "{logs}"
    );
    assert!(!logs.contains("too few progress lines"), "{logs}");
    // Job 14 on a node whose clock is an hour behind slurmctld's (Slurm 25.11 and 26.05 tell
    // the epilog the job's start by slurmctld's clock): not observed, and the reason names it.
    *w.slurm.on_node.borrow_mut() = vec![14];
    w.slurm.details.borrow_mut().insert(14, running_detail(14, "alpha", 0, None));
    at(4000.0);
    w.with(|n| prolog::run(n, &job_env(14, 0)));
    lines(14, 4000, 4030);
    at(4030.0);
    let env = JobEnv { slurm_start: Some(4000.0 + 3600.0), ..job_env(14, 0) };
    let out = w.with(|n| epilog::run(n, &env));
    let epilog::Outcome::Done { observations, .. } = out else { panic!("{out:?}") };
    assert!(observations.is_empty(), "{observations:#?}");
    let logs = w.logs.borrow().join("\n");
    assert!(logs.contains("this node's clock is -3600 s off the controller's"), "{logs}");
}

/// The re-audit's L7: one line `1e308 15` made every later line go backwards and the job lost
/// its observation ("too few progress lines"). Lines outside the job's run by the node's clock
/// are dropped and said; a job whose every line lies outside is told apart from one with too
/// few lines.
#[test]
fn a_progress_line_timed_outside_the_run_is_dropped_and_said() {
    let s = FakeSlurm::default();
    for j in [20, 21] {
        s.details.borrow_mut().insert(j, running_detail(j, "alpha", 0, None));
    }
    let mut w = World::new("outside", s);
    w.config.sampler.dir = w.dir.join("samples");
    busy_ring(&w.config.sampler.dir, 1990..=2040);
    let at = |t: f64| *w.clock.0.borrow_mut() = t;
    let write = |job: u32, text: String| {
        std::fs::write(w.config.node.progress_root.join(format!("{job}.progress")), text).unwrap()
    };
    let observations = |job: u32| {
        let out = w.with(|n| epilog::run(n, &job_env(job, 0)));
        let epilog::Outcome::Done { observations, .. } = out else { panic!("{out:?}") };
        observations
    };
    *w.slurm.on_node.borrow_mut() = vec![20];
    at(2000.0);
    w.with(|n| prolog::run(n, &job_env(20, 0)));
    let mut text: String = (2000..=2015).map(|t| format!("{t} {}\n", (t - 2000) * 2)).collect();
    text.push_str("1e308 15\n");
    text.extend((2016..=2030).map(|t| format!("{t} {}\n", (t - 2000) * 2)));
    write(20, text);
    at(2030.0);
    let obs = observations(20);
    assert!(!obs.is_empty(), "{:#?}", w.logs.borrow());
    assert!((obs[0].throughput - 2.0).abs() < 1e-9, "{obs:#?}");
    // The sampler ran: the interval carries the GPU's SM utilization that ingest checks the
    // claimed rate against.
    assert_eq!(obs[0].gpu_sm_pct, Some(40.0), "{obs:#?}");
    // And the GPU's energy over it (200 W for the 30 s the job ran alone).
    let joules = obs[0].gpu_energy_j.unwrap();
    assert!((joules - 200.0 * (obs[0].end - obs[0].start)).abs() < 1e-6, "{obs:#?}");
    let logs = w.logs.borrow().join("\n");
    assert!(logs.contains("skipped 1 progress line(s) timed outside its run"), "{logs}");
    // Every line a day ahead of the node's clock: the reason says so.
    *w.slurm.on_node.borrow_mut() = vec![21];
    at(3000.0);
    w.with(|n| prolog::run(n, &job_env(21, 0)));
    write(21, (3000..=3030).map(|t| format!("{} {}\n", t + 86_400, (t - 3000) * 2)).collect());
    at(3030.0);
    assert!(observations(21).is_empty());
    let logs = w.logs.borrow().join("\n");
    assert!(
        logs.contains("its 31 progress line(s) lie outside its run by this node's clock"),
        "{logs}"
    );
}

/// The re-audit's L4: on a full or read-only spool the observations were parked but the lead's
/// decision was lost. The decider parks it in its own directory (the job is released anyway:
/// a full spool must hold no kace job) and its next pass moves it into the spool.
#[test]
fn a_full_spool_loses_no_decision() {
    let mut s = FakeSlurm { nodes: node_n1(&[""]), ..FakeSlurm::default() };
    *s.pending.get_mut() = vec![held(5, "beta", "alice", "gres:shard:1")];
    let mut w = World::new("full-spool-decision", s);
    let spool = w.config.spool.dir.clone();
    let blocked = w.dir.join("blocked-spool");
    std::fs::write(&blocked, "").unwrap();
    w.config.spool.dir = blocked;
    let mut state = kace_node::decider_state::DeciderState::default();
    let r = dispatch::run(&w.slurm, &dispatch_settings(&w), &mut state, 1500.0).unwrap();
    assert_eq!(r.leads.len(), 1, "{r:?}");
    assert!(r.problems.iter().any(|p| p.contains("parked it as")), "{r:?}");
    let park = w.config.dispatch.state_dir.join("parked");
    let parked = || std::fs::read_dir(&park).map(|d| d.count()).unwrap_or(0);
    assert_eq!(parked(), 1);
    // The spool has room again: the next pass moves it in, and ingest stores it.
    w.config.spool.dir = spool;
    dispatch::run(&w.slurm, &dispatch_settings(&w), &mut state, 1501.0).unwrap();
    assert_eq!(parked(), 0);
    assert_eq!(spooled_decisions(&w.config.spool.dir).unwrap().len(), 1);
    let mut db = Db::open(&w.config.database.path).unwrap();
    let q = w.dir.join("q");
    let r = kace_sql::spool::ingest_decisions(&mut db, &w.config.spool.dir, &q).unwrap();
    assert_eq!(r.inserted, 1, "{r:?}");
}

/// A job the decider released onto a GPU whose type is the only one of its kind on the node
/// lands there: its GPU is known without a read when it runs. Onto a type two GPUs share, it
/// may land on either: that one is read once.
#[test]
fn a_job_released_onto_a_gpu_of_its_own_type_is_not_read_again() {
    for (kinds, read) in [(["g0", "g1"], false), (["g", "g"], true)] {
        let s = FakeSlurm { nodes: node_n1(&kinds), ..FakeSlurm::default() };
        *s.pending.borrow_mut() = vec![held(5, "alpha", "alice", "gres:shard:1")];
        let w = World::new(&format!("sole-{read}"), s);
        let mut state = kace_node::decider_state::DeciderState::default();
        let settings = dispatch_settings(&w);
        let r = dispatch::run(&w.slurm, &settings, &mut state, 1000.0).unwrap();
        let [(5, node, gpu)] = r.leads.as_slice() else { panic!("{r:?}") };
        let gpu = *gpu;
        assert_eq!(node, "n1");
        // Released, then started by Slurm on that GPU.
        w.slurm.pending.borrow_mut().clear();
        w.slurm.running.borrow_mut().push(RunningJob {
            id: 5,
            node: "n1".into(),
            gpus: vec![gpu],
            state: "R".into(),
            workload: "alpha".into(),
            ..Default::default()
        });
        w.slurm.pending.borrow_mut().push(held(6, "beta", "alice", "gres:shard:1"));
        w.slurm.calls.borrow_mut().clear();
        dispatch::run(&w.slurm, &settings, &mut state, 1001.0).unwrap();
        let calls = w.slurm.calls.borrow().clone();
        assert_eq!(calls.contains(&"gpus 5".to_string()), read, "{kinds:?}: {calls:?}");
    }
}

fn policy_node(name: &str, partition: &str) -> NodeGpus {
    NodeGpus {
        name: name.into(),
        gpus: vec![Some("g0".into())],
        shards_per_gpu: 2,
        usable: true,
        partitions: vec![partition.into()],
        max_time_s: vec![None],
        features: Vec::new(),
        busy_gpus: Vec::new(),
    }
}

/// Each job goes only where its partitions and its user's `-w` allow; what kace cannot place
/// (several `-w` nodes, a partition without GPUs) goes back to Slurm, unpinned and asking for
/// a whole GPU, at once and recorded.
#[test]
fn dispatch_places_jobs_only_where_their_policies_allow() {
    let s = FakeSlurm {
        nodes: vec![policy_node("n1", "pa"), policy_node("n2", "pb")],
        ..FakeSlurm::default()
    };
    let job = |id: u32, partition: &str, req_nodes: &str| QueuedJob {
        partition: partition.into(),
        req_nodes: req_nodes.into(),
        ..held(id, "alpha", "alice", "gres:shard:1")
    };
    *s.pending.borrow_mut() = vec![
        job(5, "pb", ""),
        job(6, "pa,pb", "n1"),
        job(7, "pa", "n[1-2]"),
        job(8, "pc", ""),
        QueuedJob { tres_per_node: "gres/gpu:1".into(), ..job(9, "pa", "") },
    ];
    let w = World::new("policies", s);
    let r = pass(&w, 1010.0);
    let mut leads = r.leads.clone();
    leads.sort();
    assert_eq!(leads, vec![(5, "n2".to_string(), 0), (6, "n1".to_string(), 0)], "{r:?}");
    let mut back: Vec<u32> = r.handed_back.iter().map(|(j, _)| *j).collect();
    back.sort_unstable();
    assert_eq!(back, vec![7, 8, 9], "{r:?}");
    let why = |id: u32| r.handed_back.iter().find(|(j, _)| *j == id).unwrap().1.clone();
    assert!(why(7).contains("several nodes") && why(9).contains("no shard"), "{r:?}");
    let calls = w.slurm.calls.borrow();
    assert!(calls.contains(&"hand back 7 2".to_string()), "{calls:?}");
    let kinds: Vec<ReleaseKind> =
        r.records.iter().map(|d| ReleaseKind::of_key(Some(&d.key))).collect();
    assert_eq!(kinds.iter().filter(|k| **k == ReleaseKind::HandBack).count(), 3, "{kinds:?}");
    let rec = r.records.iter().find(|d| d.decision.lead_job.as_deref() == Some("8")).unwrap();
    assert!(rec.decision.candidates[0].rejected.as_deref().unwrap().contains("no GPU node"));
}

/// max_hold is a bound: a job held past it that no GPU takes (its only GPU is full) goes to
/// Slurm asking for the whole GPU, so that Slurm cannot crowd it beside the kace jobs there.
#[test]
fn dispatch_hands_an_expired_job_no_gpu_takes_back_asking_for_a_whole_gpu() {
    let s = FakeSlurm { nodes: vec![policy_node("n1", "debug")], ..FakeSlurm::default() };
    let mut old = held(12, "beta", "alice", "gres:shard:1");
    old.submitted = Some(0.0);
    *s.pending.borrow_mut() = vec![old];
    let on_gpu = |id: u32| RunningJob {
        id,
        node: "n1".into(),
        gpus: vec![0],
        state: "R".into(),
        workload: "alpha".into(),
        user: "alice".into(),
        ..Default::default()
    };
    *s.running.borrow_mut() = vec![on_gpu(10), on_gpu(11)];
    let w = World::new("expired-full", s);
    let r = pass(&w, 1100.0);
    assert!(r.expired.is_empty() && r.leads.is_empty() && r.joiners.is_empty(), "{r:?}");
    assert_eq!(r.handed_back.iter().map(|(j, _)| *j).collect::<Vec<_>>(), vec![12], "{r:?}");
    assert!(w.slurm.calls.borrow().contains(&"hand back 12 2".to_string()));
    assert!(!r.still_held, "{r:?}");
}

/// A released job Slurm keeps pending for a policy reason, and a requeued one (pinned to its
/// old GPU), are held again and unpinned; the first rests before it is offered again, the
/// requeued one is placed anew at once; one waiting for its GPU is left alone.
#[test]
fn dispatch_holds_again_jobs_slurm_will_not_start_where_kace_put_them() {
    let s = FakeSlurm { nodes: vec![policy_node("n1", "debug")], ..FakeSlurm::default() };
    let released = |id: u32, reason: &str, restarts: u32| QueuedJob {
        reason: reason.into(),
        req_nodes: "n1".into(),
        restarts,
        ..held(id, "alpha", "alice", "gres:shard:1")
    };
    *s.pending.borrow_mut() = vec![
        released(20, "QOSMaxJobsPerUserLimit", 0),
        released(21, "BeginTime", 1),
        released(22, "Resources", 0),
    ];
    let w = World::new("hold-again", s);
    let settings = dispatch_settings(&w);
    let mut state = kace_node::decider_state::DeciderState::default();
    // The requeued job at once; the limited one once its reason has lasted (Slurm gives some
    // reasons for a moment).
    let r = dispatch::run(&w.slurm, &settings, &mut state, 1004.0).unwrap();
    let again: Vec<u32> = r.held_again.iter().map(|(j, _)| *j).collect();
    assert_eq!(again, vec![21], "{r:?}");
    let r = dispatch::run(&w.slurm, &settings, &mut state, 1010.0).unwrap();
    let again: Vec<u32> = r.held_again.iter().map(|(j, _)| *j).collect();
    assert_eq!(again, vec![20], "{r:?}");
    // Job 22 is on its way to the only GPU: nothing else is released there.
    assert!(r.leads.is_empty(), "{r:?}");
    // Next pass: 22 has started; 21 is placed again, 20 rests.
    w.slurm.pending.borrow_mut().retain(|j| j.id != 22);
    *w.slurm.running.borrow_mut() = vec![RunningJob {
        id: 22,
        node: "n1".into(),
        gpus: vec![0],
        state: "R".into(),
        workload: "alpha".into(),
        user: "alice".into(),
        ..Default::default()
    }];
    let r = dispatch::run(&w.slurm, &settings, &mut state, 1012.0).unwrap();
    assert!(r.held_again.is_empty(), "{r:?}");
    let placed: Vec<u32> =
        r.leads.iter().chain(&r.joiners).chain(&r.expired).map(|(j, _, _)| *j).collect();
    assert!(!placed.contains(&20), "a resting job was released: {r:?}");
    assert!(state.resting.contains_key(&20) && state.requeues.get(&21) == Some(&1));
}

/// Sharing must not kill a job at its time limit: a job joining an open GPU, and the job there,
/// get their limits lengthened by what sharing is predicted to cost them (the joiner's while
/// it is still held), from their own limits; past the cap the pair is not formed.
#[test]
fn dispatch_lengthens_time_limits_of_a_group_or_does_not_pair() {
    let setup = |limit_s: f64| {
        let s = FakeSlurm::default();
        let mut old = held(11, "beta", "alice", "gres:shard:1");
        old.submitted = Some(100.0);
        old.time_limit_s = Some(limit_s);
        *s.pending.borrow_mut() = vec![old];
        let s = FakeSlurm {
            nodes: vec![NodeGpus {
                shards_per_gpu: 4,
                partitions: Vec::new(),
                max_time_s: Vec::new(),
                features: Vec::new(),
                busy_gpus: Vec::new(),
                name: "n1".into(),
                gpus: vec![Some("g1".into())],
                usable: true,
            }],
            ..s
        };
        *s.running.borrow_mut() = vec![alpha_running_since_1000()];
        s
    };
    let s = setup(3600.0);
    let w = World::new("time-limits", s);
    // The running job's limit as the listing gives it.
    let mut state = kace_node::decider_state::DeciderState::default();
    let r = dispatch::run(&w.slurm, &dispatch_settings(&w), &mut state, 1100.0).unwrap();
    assert_eq!(r.expired, vec![(11, "n1".to_string(), 0)], "{r:?}");
    let [(job, old, new)] = r.lengthened.as_slice() else { panic!("{r:?}") };
    assert_eq!((*job, *old), (11, 3600.0), "{r:?}");
    assert!(*new > 3600.0 && *new <= 7200.0, "{r:?}");
    let calls = w.slurm.calls.borrow().clone();
    let set = calls.iter().position(|c| c.starts_with("time limit 11 ")).expect("set");
    let released = calls.iter().position(|c| c == "release 11").expect("released");
    assert!(set < released, "the joiner's limit is set while it is held: {calls:?}");
    assert_eq!(state.own_limits.get(&11), Some(&3600.0));
    // The release's record says so (`kace explain`), on the released job's own entry.
    let mine = r.records[0].decision.candidates.iter().find(|c| c.job.as_deref() == Some("11"));
    let limits = &mine.expect("its entry").time_limits;
    assert_eq!(limits.len(), 1, "{limits:?}");
    assert_eq!((limits[0].job.as_str(), limits[0].from_s, limits[0].to_s), ("11", 3600.0, *new));

    // A limit already at the cap of its own: not paired; max_hold then hands it to Slurm.
    let s = setup(7200.0);
    let w = World::new("time-limits-cap", s);
    let mut state = kace_node::decider_state::DeciderState::default();
    state.own_limits.insert(11, 3600.0);
    let r = dispatch::run(&w.slurm, &dispatch_settings(&w), &mut state, 1100.0).unwrap();
    assert!(r.expired.is_empty() && r.lengthened.is_empty(), "{r:?}");
    assert_eq!(r.handed_back.iter().map(|(j, _)| *j).collect::<Vec<_>>(), vec![11], "{r:?}");
}

/// A joiner given an SM share (`mps.sm_split`) is planned no faster than its share: its limit
/// is lengthened to at least limit / share. Where the cap refuses that, the share is dropped
/// and the pair formed as MPS runs it unasked.
#[test]
fn a_joiner_with_an_sm_share_gets_the_time_its_share_needs_or_no_share() {
    let run = |tag: &str, cap: f64| {
        let s = FakeSlurm::default();
        let mut j = held(11, "beta", "alice", "gres:shard:1");
        j.time_limit_s = Some(1000.0);
        *s.pending.borrow_mut() = vec![j];
        let s = FakeSlurm { nodes: node_n1(&["g1"]), ..s };
        *s.running.borrow_mut() = vec![alpha_running_since_1000()];
        let w = World::new(tag, s);
        Db::open(&w.config.database.path)
            .unwrap()
            .insert_split_model(&joiner_at_40(), &serde_json::json!({}))
            .unwrap();
        let settings = dispatch::Settings {
            sm_split: true,
            time_limit_cap: cap,
            time_limit: kace_config::TimeLimit::Extend,
            ..dispatch_settings(&w)
        };
        let mut state = kace_node::decider_state::DeciderState::default();
        let r = dispatch::run(&w.slurm, &settings, &mut state, 1100.0).unwrap();
        assert_eq!(r.joiners.iter().map(|j| j.0).collect::<Vec<_>>(), [11], "{r:?}");
        let ticket = release_ticket::read(&w.config.spool.dir, 11).unwrap().unwrap();
        let new = r.lengthened.iter().find(|l| l.0 == 11).map(|l| l.2);
        (ticket.thread_pct, new)
    };
    let (share, new) = run("share-time", 10.0);
    assert_eq!(share, Some(40));
    assert!(new.is_some_and(|n| n >= 1000.0 / 0.4), "{new:?}");
    let (share, new) = run("share-time-cap", 2.0);
    assert_eq!(share, None);
    assert!(new.is_some_and(|n| n <= 2000.0), "{new:?}");
}

/// Multifactor inputs where alice (account `light`) has three times bob's (`heavy`) share.
fn fair_share_inputs() -> kace_node::priority::PriorityInputs {
    kace_node::priority::PriorityInputs {
        weights: Some(kace_node::priority::Weights {
            fairshare: 100_000.0,
            age: 1000.0,
            max_age_s: 86_400.0,
            calc_period_s: 60.0,
            ..Default::default()
        }),
        fairshare: [
            (("light".to_string(), "alice".to_string()), 0.75),
            (("heavy".to_string(), "bob".to_string()), 0.25),
        ]
        .into(),
        ..Default::default()
    }
}

/// The site-policy audit's §1: kace served held jobs oldest first, so a user with three times
/// another's fair-share priority waited behind that user's backlog. Leads now start in the
/// order Slurm's priority gives, and the factors are read once per PriorityCalcPeriod.
#[test]
fn leads_start_in_slurms_priority_order_not_submission_order() {
    let mut s =
        FakeSlurm { nodes: node_n1(&[""]), priority: fair_share_inputs(), ..FakeSlurm::default() };
    let bob = |id| QueuedJob { account: "heavy".into(), ..held(id, "beta", "bob", "gres:shard:1") };
    let alice =
        |id| QueuedJob { account: "light".into(), ..held(id, "beta", "alice", "gres:shard:1") };
    *s.pending.get_mut() = vec![bob(5), bob(6), bob(7), alice(8)];
    let w = World::new("priority-leads", s);
    let mut state = kace_node::decider_state::DeciderState::default();
    let r =
        dispatch::run(&w.slurm, &dispatch::Settings::of(&w.config), &mut state, 1500.0).unwrap();
    assert_eq!(r.leads, vec![(8, "n1".to_string(), 0)], "{r:?}");
    let record = &r.records[0].decision.candidates[0];
    assert_eq!(record.priority.map(f64::round), Some(75_000.0 + 6.0), "{record:?}");
    // Read once; the next pass within the period reads no factor again.
    dispatch::run(&w.slurm, &dispatch::Settings::of(&w.config), &mut state, 1510.0).unwrap();
    let reads = w.slurm.calls.borrow().iter().filter(|c| *c == "priority").count();
    assert_eq!(reads, 1, "{:?}", w.slurm.calls.borrow());
}

/// A joiner is chosen for throughput only among the first `selection.priority_window` held
/// jobs of Slurm's order; with a window of 1 it is the first of them that may go there.
#[test]
fn a_joiner_is_chosen_inside_the_priority_window() {
    let mut s = lead_slurm(Some("g1"));
    s.nodes = node_n1(&["g1"]);
    s.running.get_mut().push(RunningJob { gpus: vec![0], ..starting_lead(10, "alpha", 0) });
    let w = World::new("priority-window", s);
    // Without multifactor, Slurm's order is the submission order: 11 first.
    let first = w.expected_choice("alpha", &[held(11, "beta", "alice", "")]);
    assert_eq!(first, Some(11), "the synthetic data pair beta beside alpha");
    let settings = dispatch::Settings { priority_window: 1, ..dispatch::Settings::of(&w.config) };
    let mut state = kace_node::decider_state::DeciderState::default();
    // The lead shared its GPU with job 7 before.
    w.slurm.comments.borrow_mut().insert(10, "kace:alpha shared=7".into());
    let r = dispatch::run(&w.slurm, &settings, &mut state, 1500.0).unwrap();
    assert_eq!(r.joiners, vec![(11, "n1".to_string(), 0)], "{r:?}");
    assert!(r.passed_over.is_empty(), "{r:?}");
    // The joiner names the lead in its AdminComment (sacct's record), within its pin's update;
    // the lead's limit is not lengthened (it has none), so no update is made for it alone.
    let calls = w.slurm.calls.borrow().clone();
    let at = calls.iter().position(|c| c == "comment 11 kace:beta shared=10");
    let pin = calls.iter().position(|c| c.starts_with("pin 11 "));
    assert!(at.is_some() && at == pin.map(|p| p + 1), "{calls:?}");
    assert!(!calls.iter().any(|c| c.starts_with("comment 10 ")), "{calls:?}");
    let d = &r.records.iter().find(|d| d.decision.chosen_job.is_some()).unwrap().decision;
    assert_eq!(d.candidates.len(), 1, "only the window is offered: {d:?}");
}

/// A job passed over `priority_window` times by jobs of lower priority is the only candidate
/// at its next chance, so the reordering is bounded; each pass-over is counted.
#[test]
fn a_job_passed_over_as_often_as_the_window_is_offered_alone() {
    let mut s = lead_slurm(Some("g1"));
    s.nodes = node_n1(&["g1"]);
    s.running.get_mut().push(RunningJob { gpus: vec![0], ..starting_lead(10, "alpha", 0) });
    let w = World::new("priority-due", s);
    let window = 4;
    let settings =
        dispatch::Settings { priority_window: window, ..dispatch::Settings::of(&w.config) };
    let in_window = [
        held(11, "beta", "alice", ""),
        held(12, "zeta", "alice", ""),
        held(13, "gamma", "bob", ""),
        held(14, "unknown-wl", "alice", ""),
    ];
    let free_choice = w.expected_choice("alpha", &in_window).expect("a choice");
    let mut state = kace_node::decider_state::DeciderState::default();
    let r = dispatch::run(&w.slurm, &settings, &mut state, 1500.0).unwrap();
    assert_eq!(r.joiners, vec![(free_choice, "n1".to_string(), 0)], "{r:?}");
    if free_choice != 11 {
        assert_eq!(state.overtaken.get(&11), Some(&1), "{state:?}");
        assert_eq!(state.inversions_total, 1);
        assert_eq!(r.passed_over[0].0, free_choice, "{r:?}");
    }
    // Job 12 (zeta) has been passed over `window` times: it alone is offered now.
    let w = World::new("priority-due-2", {
        let mut s = lead_slurm(Some("g1"));
        s.nodes = node_n1(&["g1"]);
        s.running.get_mut().push(RunningJob { gpus: vec![0], ..starting_lead(10, "alpha", 0) });
        s
    });
    let mut state = kace_node::decider_state::DeciderState::default();
    state.overtaken.insert(12, window as u32);
    // Passed over since 1400 (12) and 1450 (999, which has left the queue): each stops
    // waiting at its release or when the pass no longer lists it held.
    state.passed_over_since.insert(12, 1400.0);
    state.passed_over_since.insert(999, 1450.0);
    let r = dispatch::run(&w.slurm, &settings, &mut state, 1500.0).unwrap();
    let alone = w.expected_choice("alpha", &[held(12, "zeta", "alice", "")]);
    let joined: Vec<u32> = r.joiners.iter().map(|j| j.0).collect();
    assert_eq!(joined, alone.into_iter().collect::<Vec<_>>(), "{r:?}");
    let (expected, still) =
        if joined.contains(&12) { (150.0, None) } else { (50.0, Some(&1400.0)) };
    assert_eq!(state.inversion_seconds_total, expected, "{state:?}");
    assert_eq!(state.passed_over_since.get(&12), still, "{state:?}");
    assert!(!state.passed_over_since.contains_key(&999), "{state:?}");
    let d =
        &r.records.iter().find(|d| d.decision.lead_job.as_deref() == Some("10")).unwrap().decision;
    assert_eq!(d.candidates.len(), 1, "{d:?}");
    assert_eq!(d.candidates[0].job.as_deref(), Some("12"));
}

/// A QOS limit (issue 29 item 1): a held job whose user already runs as many jobs as the QOS
/// allows (a plain job counts too) is neither offered nor released, and said once; another
/// user's is; and within one pass, a release counts before the next job is offered.
#[test]
fn a_job_a_limit_would_keep_pending_is_not_released() {
    use kace_node::limits::{Counted, Limits, QosLimits};
    let mut limits = Limits { enforced: true, ..Limits::default() };
    limits
        .qos
        .insert("one".into(), QosLimits { max_jobs_per_user: Some(1), ..QosLimits::default() });
    let in_qos =
        |id, user: &str| QueuedJob { qos: "one".into(), ..held(id, "beta", user, "gres:shard:1") };
    let mut s = FakeSlurm { nodes: node_n1(&["", "", ""]), limits, ..FakeSlurm::default() };
    // alice runs a plain job in QOS one; carol's two kace jobs would both fit the free GPUs.
    *s.others.get_mut() =
        vec![Counted { user: "alice".into(), qos: "one".into(), ..Counted::default() }];
    *s.pending.get_mut() =
        vec![in_qos(5, "alice"), in_qos(6, "bob"), in_qos(7, "carol"), in_qos(8, "carol")];
    let w = World::new("qos-limit", s);
    let mut state = kace_node::decider_state::DeciderState::default();
    let settings = dispatch::Settings::of(&w.config);
    let r = dispatch::run(&w.slurm, &settings, &mut state, 1500.0).unwrap();
    let leads: Vec<u32> = r.leads.iter().map(|l| l.0).collect();
    assert_eq!(leads, vec![6, 7], "alice's job and carol's second wait for the QOS: {r:?}");
    assert!(
        r.notes.iter().any(|n| n == "job 5 waits for a limit: QOSMaxJobsPerUserLimit (QOS one)"),
        "{r:?}"
    );
    // Said once, and the limits are not read again within the period.
    let r = dispatch::run(&w.slurm, &settings, &mut state, 1510.0).unwrap();
    assert!(!r.notes.iter().any(|n| n.starts_with("job 5 waits")), "{r:?}");
    let reads = w.slurm.calls.borrow().iter().filter(|c| *c == "limits").count();
    assert_eq!(reads, 1, "{:?}", w.slurm.calls.borrow());
    // Past max_hold, alice's job still waits: Slurm would not start it either.
    let late = 1000.0 + 5.0 + settings.max_hold_s as f64 + 1.0;
    let r = dispatch::run(&w.slurm, &settings, &mut state, late.max(1520.0)).unwrap();
    assert!(
        r.handed_back.iter().all(|(j, _)| *j != 5) && r.expired.iter().all(|e| e.0 != 5),
        "{r:?}"
    );
}
