//! One colocated group on one GPU, as Slurm and kace would run it but without Slurm: the GPU's
//! MPS daemon through [`NvidiaMps`], each job's start in the GPU's state record (the prolog's
//! part), the workloads as MPS clients writing their progress files, and each job's end through
//! [`kace_node::epilog::run`], which spools the observations exactly as on a cluster.

use std::cell::RefCell;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use kace_config::Config;
use kace_layout::{mps_dirs, progress_file, GpuIndex};
use kace_node::env::JobEnv;
use kace_node::epilog::{self, Outcome};
use kace_node::gpu::GpuInfo;
use kace_node::mps::{MpsControl, NvidiaMps};
use kace_node::slurm::{JobDetail, NodeGpus, QueuedJob, Slurm, Target};
use kace_node::{state, Clock, ExecError, Node, SystemClock};
use kace_sql::Observation;

use crate::BenchError;

/// One group to run.
#[derive(Debug, Clone)]
pub struct GroupSpec {
    /// The program that runs a workload: called as `runner WORKLOAD`.
    pub runner: PathBuf,
    /// The workloads, started together.
    pub workloads: Vec<String>,
    /// Job id of the first workload (the others follow): observation keys are built from it.
    pub first_job: u32,
    /// The GPU.
    pub gpu: GpuIndex,
    /// Node name recorded in the observations.
    pub node: String,
    /// Cluster name recorded in the observation keys.
    pub cluster: String,
    /// The MPS server's user (the caller's uid).
    pub uid: u32,
    /// Workloads still running after this are killed.
    pub timeout: Duration,
}

/// What a group run produced.
#[derive(Debug, Clone, Default)]
pub struct GroupOutcome {
    /// Observations the epilog spooled, every job's.
    pub observations: Vec<Observation>,
    /// Workloads that exited non-zero or were killed, with why.
    pub failed: Vec<(String, String)>,
    /// Whether the last job's epilog stopped the MPS daemon.
    pub stopped_mps: bool,
}

/// The bench's stand-in for Slurm: the epilog only asks whether the GPU's other jobs still run
/// on the node (`queued`), as Slurm answers for a running kace job.
#[derive(Debug, Default)]
pub struct LocalJobs {
    running: RefCell<Vec<u32>>,
    node: RefCell<String>,
}

fn no_slurm<T>(what: &str) -> kace_node::Result<T> {
    Err(kace_node::Error::Exec(ExecError::Spawn {
        command: what.to_string(),
        cause: "the GPU bench runs without Slurm".into(),
    }))
}

impl Slurm for LocalJobs {
    fn listing(&self) -> kace_node::Result<kace_node::slurm::Listing> {
        no_slurm("squeue")
    }
    fn job(&self, _id: u32) -> kace_node::Result<JobDetail> {
        no_slurm("scontrol show job")
    }
    fn queued(&self, id: u32) -> kace_node::Result<Option<QueuedJob>> {
        // The bench's own node: the name the epilog passes is the one this job runs on.
        Ok(self.running.borrow().contains(&id).then(|| QueuedJob {
            id,
            state: "R".into(),
            node: self.node.borrow().clone(),
            ..QueuedJob::default()
        }))
    }
    fn job_gpus(&self, _id: u32, _node: &str) -> kace_node::Result<Vec<u32>> {
        no_slurm("scontrol show job")
    }
    fn pin(
        &self,
        _id: u32,
        _target: &Target,
        _shards: u32,
        _ours: Option<&str>,
        _comment: Option<&str>,
    ) -> kace_node::Result<()> {
        no_slurm("scontrol update")
    }
    fn release(&self, _id: u32) -> kace_node::Result<()> {
        no_slurm("scontrol release")
    }
    fn hand_back(&self, _id: u32, _shards: u32) -> kace_node::Result<()> {
        no_slurm("scontrol release")
    }
    fn set_time_limit(&self, _id: u32, _minutes: u64, _c: Option<&str>) -> kace_node::Result<()> {
        no_slurm("scontrol update")
    }
    fn site_limits(&self) -> kace_node::Result<kace_node::limits::Limits> {
        no_slurm("sacctmgr")
    }
    fn hold_again(&self, _id: u32) -> kace_node::Result<()> {
        no_slurm("scontrol uhold")
    }
    fn steps_here(&self, _id: u32, _node: &str) -> kace_node::Result<bool> {
        no_slurm("scontrol listpids")
    }
    fn nodes(&self) -> kace_node::Result<Vec<NodeGpus>> {
        no_slurm("sinfo")
    }

    fn priority_inputs(&self) -> kace_node::Result<kace_node::priority::PriorityInputs> {
        no_slurm("scontrol show config")
    }
}

/// GPU memory is not asked for by the epilog; this answers from the configuration.
struct ConfiguredGpu(Option<f64>);

impl GpuInfo for ConfiguredGpu {
    fn memory_gib(&self, _gpu: GpuIndex) -> Result<f64, String> {
        self.0.ok_or_else(|| "not configured".into())
    }
}

/// Runs the group to its end. The MPS daemon is started when it is not running; the epilog of
/// the last job stops it, as on a node.
pub fn run(
    config: &Config,
    mps: &NvidiaMps,
    spec: &GroupSpec,
    log: &dyn Fn(&str),
) -> Result<GroupOutcome, BenchError> {
    if spec.workloads.is_empty() {
        return Err(BenchError::Usage("a group needs at least one workload".into()));
    }
    let dirs = mps_dirs(&config.node.mps_root, spec.gpu);
    if !mps.running(&dirs) {
        mps.start(&dirs, spec.gpu, spec.uid, config.mps.multi_user)?;
    }
    let root = &config.node.progress_root;
    std::fs::create_dir_all(root).map_err(|cause| kace_node::Error::Io {
        op: "create progress directory".into(),
        path: root.clone(),
        cause,
    })?;
    let clock = SystemClock;
    let slurm = LocalJobs::default();
    slurm.node.replace(spec.node.clone());
    let mut children: Vec<(u32, String, Child)> = Vec::new();
    for (i, w) in spec.workloads.iter().enumerate() {
        let job = spec.first_job + i as u32;
        let lock = state::lock_gpu(
            &config.node.state_dir,
            &spec.node,
            spec.gpu,
            Instant::now() + Duration::from_secs(5),
        )?;
        lock.add(job, w, clock.now(), None)?;
        drop(lock);
        let child = Command::new(&spec.runner)
            .arg(w)
            .env(kace_profiling::progress::ENV_VAR, progress_file(root, job))
            .env("CUDA_MPS_PIPE_DIRECTORY", &dirs.pipe)
            .env("CUDA_MPS_LOG_DIRECTORY", &dirs.log)
            .env("CUDA_VISIBLE_DEVICES", spec.gpu.0.to_string())
            .spawn()
            .map_err(|cause| BenchError::Workload { workload: w.clone(), cause })?;
        slurm.running.borrow_mut().push(job);
        children.push((job, w.clone(), child));
    }
    let started = Instant::now();
    let mut out = GroupOutcome::default();
    while !children.is_empty() {
        let mut i = 0;
        while i < children.len() {
            let (job, ref w, ref mut child) = children[i];
            let status = match child.try_wait() {
                Ok(Some(s)) => Some(s.to_string()).filter(|_| !s.success()),
                Ok(None) if started.elapsed() > spec.timeout => {
                    let _ = child.kill();
                    let _ = child.wait();
                    Some(format!("killed after {:?}", spec.timeout))
                }
                Ok(None) => {
                    i += 1;
                    continue;
                }
                Err(e) => Some(format!("couldn't wait for it: {e}")),
            };
            if let Some(why) = status {
                out.failed.push((w.clone(), why));
            }
            slurm.running.borrow_mut().retain(|j| *j != job);
            let env = JobEnv {
                job,
                uid: spec.uid,
                user: String::new(),
                account: String::new(),
                node: spec.node.clone(),
                cluster: spec.cluster.clone(),
                kace: true,
                gpu: Some(spec.gpu),
                mps_share: None,
                exit: None,
                slurm_start: None,
            };
            let node = Node {
                config,
                slurm: &slurm,
                mps,
                gpus: &ConfiguredGpu(config.node.gpu_memory_gib),
                clock: &clock,
                deadline: Instant::now() + Duration::from_millis(config.node.prolog_budget_ms),
                log,
                // In-process, under no slurmd: nothing to watch.
                host: &kace_node::slurmd::ProcSlurmd::default(),
            };
            if let Outcome::Done { observations, stopped_mps, .. } = epilog::run(&node, &env) {
                out.observations.extend(observations);
                out.stopped_mps |= stopped_mps;
            }
            children.remove(i);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(out)
}
