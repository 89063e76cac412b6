//! `kace-dispatch`: `kace dispatch` as a program Slurm can run from `EpilogSlurmctld=` (which
//! takes a path, no arguments). It reads kace.conf, runs one dispatch pass under the dispatch
//! lock, logs what it released to stderr and syslog (slurmctld keeps no EpilogSlurmctld output)
//! and exits 0: a failing EpilogSlurmctld is only logged by Slurm, and the timer's
//! `kace dispatch` retries anyway.

use std::process::ExitCode;

use kace_log::Logger;
use kace_node::{Clock, SystemClock};

fn main() -> ExitCode {
    let early = Logger::system();
    let run = || {
        let config = match kace_config::Config::load(None) {
            Ok((c, _)) => c,
            Err(e) => {
                early.line(&format!(
                    "kace: dispatch: couldn't load the configuration: {e}; nothing done"
                ));
                return;
            }
        };
        let log = Logger::new(config.log.socket());
        match kace_node::dispatch::run_configured(&config, SystemClock.now(), &log) {
            Ok(None) => {}
            Ok(Some(r)) => {
                for line in kace_node::dispatch::report_lines(&r, config.dispatch.max_hold_s) {
                    log.line(&line);
                }
            }
            Err(e) => log.line(&format!("kace: dispatch: couldn't dispatch: {e}")),
        }
    };
    if std::panic::catch_unwind(run).is_err() {
        early.line("kace: dispatch: couldn't finish: internal error (see the panic above)");
    }
    ExitCode::SUCCESS
}
