//! `kace-dispatch`: what slurmctld runs as `PrologSlurmctld=` and `EpilogSlurmctld=` (which
//! take a path, no arguments). For a kace job's start or end it nudges the decider service and
//! returns; without a service it runs one decider pass itself ([`kace_node::dispatch::on_event`]).
//! What a pass released goes to syslog (slurmctld keeps no output of these scripts). It always
//! exits 0: a failing PrologSlurmctld would requeue the job.

use std::process::ExitCode;

use kace_log::Logger;
use kace_node::dispatch::{on_event, report_lines, Event};
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
        // Run by slurmctld, the script's environment says whose event it is (the SPANK job
        // environment is passed to PrologSlurmctld and EpilogSlurmctld); run by hand, always.
        let by_slurmctld = std::env::var_os("SLURM_SCRIPT_CONTEXT").is_some();
        let kace_job = !by_slurmctld || std::env::var_os("SPANK_KACE_COLOCATE").is_some();
        match on_event(&config, kace_job, SystemClock.now(), &log) {
            Ok(Event::NotKace | Event::Nudged | Event::Passed(None)) => {}
            Ok(Event::Passed(Some(r))) => {
                for line in report_lines(&r, config.dispatch.max_hold_s) {
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
