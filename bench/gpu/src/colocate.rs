//! One colocated group on one GPU, as Slurm and kace would run it but without Slurm: the GPU's
//! MPS daemon through [`NvidiaMps`], each job's start in the GPU's state record (the prolog's
//! part), the workloads as MPS clients writing their progress files, and each job's end through
//! [`kace_node::epilog::run`], which spools the observations exactly as on a cluster. A member
//! may run under an MPS active thread percentage ([`Member`], `WORKLOAD@PCT`): the joiner-share
//! sweep of `bench/gpu/run` measures the deployable SM split with it.

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

/// The MPS variable a client reads once, when it creates its CUDA context: the fraction of the
/// GPU's SMs its kernels may use. Fixed for the client's life, hence the sweep's "lead unset,
/// joiner at p %" (what kace can deploy beside a running job).
pub const THREAD_PERCENTAGE_VAR: &str = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE";

/// One member of a group: a workload and, when given, its MPS active thread percentage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The workload's name, as the runner knows it.
    pub workload: String,
    /// [`THREAD_PERCENTAGE_VAR`] for this member (1..=100); `None`: the variable is unset (MPS
    /// gives the client every SM), even when the bench's own environment has it.
    pub share: Option<u8>,
}

impl Member {
    /// Parses `WORKLOAD` or `WORKLOAD@PCT` (PCT a whole number from 1 to 100). The error says
    /// what was wrong in the log style of kace, for clap to print.
    pub fn parse(arg: &str) -> Result<Member, String> {
        let bad = |cause: &str| format!("kace: colocate: couldn't read member '{arg}': {cause}");
        let (workload, share) = match arg.split_once('@') {
            None => (arg, None),
            Some((w, pct)) => {
                // Digits only: "+30", " 30" or "30.0" are typos, not percentages.
                let n = pct
                    .bytes()
                    .all(|b| b.is_ascii_digit())
                    .then(|| pct.parse::<u8>().ok())
                    .flatten()
                    .filter(|n| (1..=100).contains(n));
                let Some(n) = n else {
                    return Err(bad(&format!(
                        "the share after '@' must be a whole percentage from 1 to 100, not '{pct}'"
                    )));
                };
                (w, Some(n))
            }
        };
        if workload.is_empty() || workload.contains(char::is_whitespace) {
            return Err(bad("the workload name is empty or has blanks"));
        }
        Ok(Member { workload: workload.to_string(), share })
    }
}

impl std::fmt::Display for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.share {
            Some(p) => write!(f, "{}@{p}", self.workload),
            None => f.write_str(&self.workload),
        }
    }
}

/// One group to run.
#[derive(Debug, Clone)]
pub struct GroupSpec {
    /// The program that runs a workload: called as `runner WORKLOAD`.
    pub runner: PathBuf,
    /// The members, started together; member `i` is job `first_job + i`.
    pub workloads: Vec<Member>,
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
    /// Per member, in the spec's order: its steps/s while the whole group ran together (see
    /// [`together`]); `None` when no such interval was observed.
    pub together: Vec<Option<f64>>,
}

/// Each member's throughput over the intervals it shared with every other member (member `i` is
/// job `first_job + i`): steps over seconds, so intervals weigh by length. The tail a member
/// runs alone after its partner ended is left out: a sweep cell is the pair's rate side by side.
pub fn together(first_job: u32, members: usize, observations: &[Observation]) -> Vec<Option<f64>> {
    (0..members)
        .map(|i| {
            let job = (first_job + i as u32).to_string();
            let (mut steps, mut secs) = (0.0, 0.0);
            for o in observations {
                let dur = o.end - o.start;
                if o.job == job && o.partners.len() + 1 == members && dur > 0.0 {
                    steps += o.throughput * dur;
                    secs += dur;
                }
            }
            (secs > 0.0).then(|| steps / secs)
        })
        .collect()
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
    let mut children: Vec<(u32, &Member, Child)> = Vec::new();
    for (i, m) in spec.workloads.iter().enumerate() {
        let w = &m.workload;
        let job = spec.first_job + i as u32;
        let lock = state::lock_gpu(
            &config.node.state_dir,
            &spec.node,
            spec.gpu,
            Instant::now() + Duration::from_secs(5),
        )?;
        lock.add(job, w, clock.now(), None)?;
        drop(lock);
        let mut cmd = Command::new(&spec.runner);
        cmd.arg(w)
            .env(kace_profiling::progress::ENV_VAR, progress_file(root, job))
            .env("CUDA_MPS_PIPE_DIRECTORY", &dirs.pipe)
            .env("CUDA_MPS_LOG_DIRECTORY", &dirs.log)
            .env("CUDA_VISIBLE_DEVICES", spec.gpu.0.to_string());
        // A member without a share runs unset, whatever the bench inherited: "lead at 100" must
        // be what the lead really had.
        match m.share {
            Some(p) => cmd.env(THREAD_PERCENTAGE_VAR, p.to_string()),
            None => cmd.env_remove(THREAD_PERCENTAGE_VAR),
        };
        let child =
            cmd.spawn().map_err(|cause| BenchError::Workload { workload: w.clone(), cause })?;
        slurm.running.borrow_mut().push(job);
        children.push((job, m, child));
    }
    let started = Instant::now();
    let mut out = GroupOutcome::default();
    while !children.is_empty() {
        let mut i = 0;
        while i < children.len() {
            let (job, m, ref mut child) = children[i];
            let w = &m.workload;
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
                // As the epilog reads it from the job's environment: the observation says so.
                mps_share: m.share.map(f64::from),
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
    out.together = together(spec.first_job, spec.workloads.len(), &out.observations);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kace_sql::Partner;

    #[test]
    fn members_take_an_optional_share() {
        let m = Member::parse("gemm").unwrap();
        assert_eq!(m, Member { workload: "gemm".into(), share: None });
        assert_eq!(Member::parse("gemm@30").unwrap().share, Some(30));
        assert_eq!(Member::parse("gemm@1").unwrap().share, Some(1));
        assert_eq!(Member::parse("gemm@100").unwrap().share, Some(100));
        assert_eq!(Member::parse("gemm@030").unwrap().share, Some(30));
        assert_eq!(Member::parse("gemm@30").unwrap().to_string(), "gemm@30");
        assert_eq!(m.to_string(), "gemm");
        for bad in [
            "gemm@0",
            "gemm@101",
            "gemm@256",
            "gemm@",
            "gemm@-5",
            "gemm@+30",
            "gemm@30.5",
            "gemm@ 30",
            "gemm@abc",
            "gemm@30@40",
            "@30",
            "",
            "two words@30",
        ] {
            let err = Member::parse(bad).unwrap_err();
            assert!(err.starts_with("kace: colocate: couldn't read member"), "{bad}: {err}");
        }
        assert!(Member::parse("gemm@0").unwrap_err().contains("from 1 to 100"));
    }

    fn obs(job: u32, partners: &[u32], start: f64, end: f64, throughput: f64) -> Observation {
        Observation {
            key: format!("c/{job}/{start}"),
            job: job.to_string(),
            workload: format!("w{job}"),
            partners: partners
                .iter()
                .map(|p| Partner { job: p.to_string(), workload: format!("w{p}") })
                .collect(),
            node: "n".into(),
            gpu: "0".into(),
            mps_share: None,
            start,
            end,
            steps: None,
            throughput,
            user: None,
            account: None,
            gpu_sm_pct: None,
            gpu_energy_j: None,
        }
    }

    #[test]
    fn together_is_the_shared_rate_weighted_by_time() {
        let o = [
            obs(10, &[11], 0.0, 8.0, 5.0),
            obs(10, &[], 8.0, 9.0, 50.0), // alone after its partner ended: not a sweep cell
            obs(11, &[10], 0.0, 2.0, 4.0),
            obs(11, &[10], 2.0, 8.0, 8.0),
            obs(12, &[10], 0.0, 0.0, 9.0), // an empty interval says nothing
        ];
        let t = together(10, 2, &o);
        assert_eq!(t.len(), 2);
        assert_eq!(t[0], Some(5.0));
        assert!((t[1].unwrap() - 7.0).abs() < 1e-12);
        assert_eq!(together(12, 1, &o), vec![None]);
        assert_eq!(together(10, 3, &o), vec![None, None, None]);
    }
}
