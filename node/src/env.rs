//! What Slurm tells a prolog or epilog about its job, read from the environment once, so the
//! logic below takes a plain struct (and tests build one by hand).

use kace_layout::GpuIndex;

use crate::error::{Error, Result};

/// Set by the SPANK plugin (`spank_job_control_setenv`) for every kace job. Its absence spares a
/// plain job any work; its presence proves nothing (a user can send any `SPANK_*` entry past
/// the gate): only the gate's AdminComment mark makes a kace job.
pub const KACE_VAR: &str = "SPANK_KACE_COLOCATE";

/// One job's facts from the prolog/epilog environment.
#[derive(Debug, Clone, PartialEq)]
pub struct JobEnv {
    /// `SLURM_JOB_ID`.
    pub job: u32,
    /// `SLURM_JOB_UID`.
    pub uid: u32,
    /// `SLURM_JOB_USER` (empty when unset).
    pub user: String,
    /// `SLURM_JOB_ACCOUNT` (empty when unset): slurmd sets it from the job's credential
    /// (src/plugins/prep/script/prep_script_slurmd.c).
    pub account: String,
    /// `SLURMD_NODENAME`.
    pub node: String,
    /// `SLURM_CLUSTER_NAME` (for observation keys; `cluster` when unset).
    pub cluster: String,
    /// Whether the job's environment has [`KACE_VAR`]: it may be a kace job, to be confirmed
    /// by the gate's mark (prolog) or kace's own record (epilog).
    pub kace: bool,
    /// The job's GPU (from `SLURM_JOB_GPUS`, else `CUDA_VISIBLE_DEVICES`).
    pub gpu: Option<GpuIndex>,
    /// `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`, when set.
    pub mps_share: Option<f64>,
    /// How the job ended, from the epilog's `SLURM_JOB_EXIT_CODE2` (`<exit code>:<signal>`);
    /// `None` in the prolog, or when Slurm did not say.
    pub exit: Option<JobExit>,
    /// When the job started by slurmctld's clock (`SLURM_JOB_START_TIME`, which Slurm 25.11 and
    /// 26.05 give prologs and epilogs, `src/plugins/prep/script/prep_script_slurmd.c`; 22.05
    /// does not): the one clock a node's is checked against.
    pub slurm_start: Option<f64>,
}

/// A job's exit status as Slurm gives it to the epilog.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobExit {
    /// The batch script's exit code.
    pub code: u32,
    /// The signal that ended it (0: none).
    pub signal: u32,
}

impl JobExit {
    /// Reads `<exit code>:<signal>`.
    pub fn parse(text: &str) -> Option<JobExit> {
        let (code, signal) = text.trim().split_once(':')?;
        Some(JobExit { code: code.parse().ok()?, signal: signal.parse().ok()? })
    }

    /// Whether the job failed (a non-zero exit or a signal).
    pub fn failed(&self) -> bool {
        self.code != 0 || self.signal != 0
    }

    /// Whether it ended by the signal Slurm sends a cancelled or timed-out job (SIGTERM, then
    /// SIGKILL): ended by someone or something else, not failed of itself.
    pub fn cancelled(&self) -> bool {
        self.code == 0 && matches!(self.signal, 9 | 15)
    }
}

impl JobEnv {
    /// Reads the variables through `get` (the process environment in the binaries).
    pub fn read(get: impl Fn(&str) -> Option<String>) -> Result<JobEnv> {
        let num = |var: &'static str| -> Result<u32> {
            let v = get(var).ok_or(Error::Env { var, why: "is not set".into() })?;
            v.trim().parse().map_err(|_| Error::Env { var, why: format!("is not a number: {v:?}") })
        };
        let job = num("SLURM_JOB_ID")?;
        let kace = get(KACE_VAR).is_some();
        // A plain job needs nothing else: return before asking for what it may lack.
        if !kace {
            return Ok(JobEnv {
                job,
                uid: 0,
                user: String::new(),
                account: String::new(),
                node: String::new(),
                cluster: String::new(),
                kace,
                gpu: None,
                mps_share: None,
                exit: None,
                slurm_start: None,
            });
        }
        let node = get("SLURMD_NODENAME")
            .filter(|n| !n.is_empty() && n.len() <= 256)
            .ok_or(Error::Env { var: "SLURMD_NODENAME", why: "is not set".into() })?;
        Ok(JobEnv {
            job,
            uid: num("SLURM_JOB_UID")?,
            user: get("SLURM_JOB_USER").unwrap_or_default(),
            account: get("SLURM_JOB_ACCOUNT").filter(|a| a.len() <= 256).unwrap_or_default(),
            node,
            cluster: get("SLURM_CLUSTER_NAME")
                .filter(|c| !c.is_empty())
                .unwrap_or("cluster".into()),
            kace,
            gpu: kace_layout::job_gpu(
                get("SLURM_JOB_GPUS").as_deref(),
                get("CUDA_VISIBLE_DEVICES").as_deref(),
            ),
            mps_share: get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
                .and_then(|v| v.trim().parse::<f64>().ok())
                .filter(|v| v.is_finite() && *v > 0.0 && *v <= 100.0),
            exit: get("SLURM_JOB_EXIT_CODE2").as_deref().and_then(JobExit::parse),
            slurm_start: get("SLURM_JOB_START_TIME")
                .and_then(|v| v.trim().parse::<f64>().ok())
                .filter(|v| v.is_finite() && *v > 0.0),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> =
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn a_plain_job_needs_only_its_id() {
        let e = JobEnv::read(env(&[("SLURM_JOB_ID", "7")])).unwrap();
        assert_eq!((e.job, e.kace), (7, false));
        assert!(JobEnv::read(env(&[])).is_err());
        assert!(JobEnv::read(env(&[("SLURM_JOB_ID", "x")])).is_err());
    }

    #[test]
    fn a_kace_job_with_an_empty_value_is_still_a_kace_job() {
        let e = JobEnv::read(env(&[
            ("SLURM_JOB_ID", "8"),
            (KACE_VAR, ""),
            ("SLURM_JOB_UID", "1001"),
            ("SLURM_JOB_USER", "alice"),
            ("SLURMD_NODENAME", "n1"),
            ("SLURM_JOB_GPUS", "1"),
            ("CUDA_VISIBLE_DEVICES", "0"),
            ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "50"),
            ("SLURM_JOB_EXIT_CODE2", "1:0"),
        ]))
        .unwrap();
        assert!(e.kace);
        assert_eq!(e.exit, Some(JobExit { code: 1, signal: 0 }));
        assert!(e.exit.is_some_and(|x| x.failed()));
        assert_eq!(JobExit::parse("0:9").map(|x| x.failed()), Some(true));
        assert_eq!(JobExit::parse("0:0").map(|x| x.failed()), Some(false));
        assert_eq!(JobExit::parse("x:0"), None);
        assert_eq!((e.uid, e.user.as_str(), e.node.as_str()), (1001, "alice", "n1"));
        assert_eq!(
            (e.gpu, e.mps_share, e.cluster.as_str()),
            (Some(GpuIndex(1)), Some(50.0), "cluster")
        );
        let no_node = env(&[("SLURM_JOB_ID", "8"), (KACE_VAR, "x"), ("SLURM_JOB_UID", "0")]);
        assert!(JobEnv::read(no_node).is_err());
    }
}
