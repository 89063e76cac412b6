//! The shared shell of `kace-prolog` and `kace-epilog`: environment and configuration in, the
//! real Slurm/MPS/NVML behind the traits, a watchdog that ends the process at the budget, a
//! panic guard, and exit 0 whatever happened. Every line it logs starts `kace: <phase>:` and goes
//! to stderr and syslog ([`kace_log::Logger`], the socket from `[log]` in kace.conf).

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kace_config::Config;
use kace_log::Logger;

use crate::env::JobEnv;
use crate::gpu::Nvml;
use crate::mps::NvidiaMps;
use crate::slurm::Commands;
use crate::{Node, SystemClock};

/// Which hook is running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// slurmd `Prolog=`.
    Prolog,
    /// slurmd `Epilog=`.
    Epilog,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Prolog => "prolog",
            Phase::Epilog => "epilog",
        }
    }
}

/// Extra time the watchdog allows past the budget for the logic to wind down by itself.
const WATCHDOG_GRACE: Duration = Duration::from_millis(500);

/// Runs the hook and returns success, always.
pub fn main(phase: Phase) -> ExitCode {
    let started = Instant::now();
    let name = phase.name();
    // Until the configuration names another socket, the system's.
    let early = Logger::system();
    if std::panic::catch_unwind(|| body(phase, started, &early)).is_err() {
        early.line(&format!(
            "kace: {name}: couldn't finish: internal error (see the panic above); the job is not affected"
        ));
    }
    ExitCode::SUCCESS
}

fn body(phase: Phase, started: Instant, early: &Logger) {
    let name = phase.name();
    let env = match JobEnv::read(|k| std::env::var(k).ok()) {
        Ok(e) => e,
        Err(e) => {
            early.line(&format!(
                "kace: {name}: couldn't read the job's environment: {e}; nothing done"
            ));
            return;
        }
    };
    // A plain job: nothing to read, nothing to run.
    if !env.kace {
        return;
    }
    // Found first, while the slurmd that started the hook is surely its ancestor.
    let host = crate::slurmd::ProcSlurmd::find();
    // The watchdog starts before the configuration is read: a kace.conf that cannot be read
    // (a FIFO, a hung NFS mount) must not hang the hook. It watches the default budget until
    // the configuration names another.
    let job = env.job;
    let default_budget = kace_config::Node::default().prolog_budget_ms;
    let limit_ms = Arc::new(AtomicU64::new(default_budget));
    let watched = Arc::clone(&limit_ms);
    // The system's syslog until the configuration names another socket.
    let watchdog_log = Arc::new(Mutex::new(early.clone()));
    let watchdog = Arc::clone(&watchdog_log);
    std::thread::spawn(move || loop {
        let limit = Duration::from_millis(watched.load(Ordering::Relaxed));
        if started.elapsed() >= limit + WATCHDOG_GRACE {
            let line = format!(
                "kace: {name}: job {job}: couldn't finish within {limit:?}; stopped, the job is not affected"
            );
            match watchdog.lock() {
                Ok(l) => l.line(&line),
                Err(_) => kace_log::stderr_line(&line),
            }
            std::process::exit(0);
        }
        std::thread::sleep(Duration::from_millis(20));
    });
    let config = match Config::load(None) {
        Ok((c, _)) => c,
        Err(e) => {
            early.line(&format!(
                "kace: {name}: job {}: couldn't load the configuration: {e}; nothing done",
                env.job
            ));
            return;
        }
    };
    let logger = Logger::new(config.log.socket());
    if let Ok(mut l) = watchdog_log.lock() {
        *l = logger.clone();
    }
    limit_ms.store(config.node.prolog_budget_ms, Ordering::Relaxed);
    let budget = Duration::from_millis(config.node.prolog_budget_ms);
    let deadline = started + budget;
    let timeout = Duration::from_millis(config.node.command_timeout_ms);
    let slurm = Commands::configured(&config.node, Some(deadline), logger.clone());
    let mps =
        NvidiaMps { program: config.node.mps_control.clone(), timeout, deadline: Some(deadline) };
    let log = |m: &str| logger.line(m);
    let node = Node {
        config: &config,
        slurm: &slurm,
        mps: &mps,
        gpus: &Nvml,
        clock: &SystemClock,
        deadline,
        log: &log,
        host: &host,
    };
    match phase {
        Phase::Prolog => {
            crate::prolog::run(&node, &env);
        }
        Phase::Epilog => {
            crate::epilog::run(&node, &env);
        }
    }
}
