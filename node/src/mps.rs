//! The MPS control daemon of one GPU, behind the [`MpsControl`] trait. [`NvidiaMps`] drives
//! `nvidia-cuda-mps-control` the way NVIDIA documents it: `-d` starts the daemon, commands such
//! as `start_server -uid N`, `get_server_list` and `quit` go to it on standard input, and the
//! environment names its pipe and log directories and the GPU.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use kace_layout::{GpuIndex, MpsDirs};

use crate::error::{io, Result};
use crate::exec::{self, Invocation};

/// Starting and stopping one GPU's MPS control daemon.
pub trait MpsControl {
    /// Whether a control daemon answers on these directories.
    fn running(&self, dirs: &MpsDirs) -> bool;
    /// Starts the control daemon for `gpu` and a server for user `uid`; `multi_user` starts
    /// the daemon with `-M` (one server for every user: `mps.multi_user`).
    fn start(&self, dirs: &MpsDirs, gpu: GpuIndex, uid: u32, multi_user: bool) -> Result<()>;
    /// Stops the control daemon (and its server).
    fn quit(&self, dirs: &MpsDirs) -> Result<()>;
}

/// The real control program (or a stand-in at the same configured path).
#[derive(Debug, Clone)]
pub struct NvidiaMps {
    /// `nvidia-cuda-mps-control`, by absolute path.
    pub program: PathBuf,
    /// Per-call timeout.
    pub timeout: Duration,
    /// No call runs past this (the prolog's budget).
    pub deadline: Option<Instant>,
}

impl NvidiaMps {
    fn timeout(&self) -> Duration {
        match self.deadline {
            Some(d) => self.timeout.min(d.saturating_duration_since(Instant::now())),
            None => self.timeout,
        }
    }

    fn invocation(&self, dirs: &MpsDirs, args: &[&str]) -> Invocation {
        Invocation::new(&self.program, args.iter().copied())
            .env("CUDA_MPS_PIPE_DIRECTORY", &dirs.pipe)
            .env("CUDA_MPS_LOG_DIRECTORY", &dirs.log)
    }
}

impl MpsControl for NvidiaMps {
    fn running(&self, dirs: &MpsDirs) -> bool {
        if !dirs.pipe.is_dir() {
            return false;
        }
        // The control client exits non-zero when no daemon listens on the pipe directory.
        let inv = self.invocation(dirs, &[]).stdin("get_server_list\n");
        exec::run(&inv, self.timeout()).is_ok_and(|o| o.success())
    }

    fn start(&self, dirs: &MpsDirs, gpu: GpuIndex, uid: u32, multi_user: bool) -> Result<()> {
        for d in [&dirs.pipe, &dirs.log] {
            std::fs::create_dir_all(d).map_err(io("create MPS directory", d))?;
            // The daemon runs as root with its pipes here: a directory a user could change is
            // refused.
            kace_layout::trusted_dir::ensure_trusted_dir(d)
                .map_err(|e| io("use MPS directory", d)(std::io::Error::other(e)))?;
        }
        // -d daemonises: the call returns once the daemon is up, and it leaves our process
        // group, so the prolog's own cleanup does not touch it.
        let args: &[&str] = if multi_user { &["-d", "-M"] } else { &["-d"] };
        let daemon = self.invocation(dirs, args).env("CUDA_VISIBLE_DEVICES", gpu.0.to_string());
        exec::run_ok(&daemon, self.timeout())?;
        // Starting the job user's server now, not at the first CUDA call, keeps that start-up
        // out of the job's first steps.
        let server = self.invocation(dirs, &[]).stdin(&format!("start_server -uid {uid}\n"));
        exec::run_ok(&server, self.timeout())?;
        Ok(())
    }

    fn quit(&self, dirs: &MpsDirs) -> Result<()> {
        let inv = self.invocation(dirs, &[]).stdin("quit\n");
        exec::run_ok(&inv, self.timeout())?;
        Ok(())
    }
}
