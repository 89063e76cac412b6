//! `kace-dispatch`: one `kace dispatch` pass as a program Slurm can run from
//! `EpilogSlurmctld=` (which takes a path, no arguments). It reads kace.conf, runs one pass
//! under the dispatch lock, logs what it released on stderr (slurmctld's log) and exits 0: a
//! failing EpilogSlurmctld is only logged by Slurm, and the watch loop and the timer pass again.

use std::process::ExitCode;

use kace_node::{Clock, SystemClock};

fn main() -> ExitCode {
    let run = || {
        let config = match kace_config::Config::load(None) {
            Ok((c, _)) => c,
            Err(e) => {
                eprintln!("kace: dispatch: couldn't load the configuration: {e}; nothing done");
                return;
            }
        };
        match kace_node::dispatch::run_configured(&config, SystemClock.now()) {
            Ok(None) => {}
            Ok(Some(r)) => {
                for l in r.lines(config.dispatch.max_hold_s) {
                    eprintln!("kace: dispatch: {l}");
                }
                for p in &r.problems {
                    eprintln!("kace: dispatch: {p}");
                }
            }
            Err(e) => eprintln!("kace: dispatch: couldn't dispatch: {e}"),
        }
    };
    if std::panic::catch_unwind(run).is_err() {
        eprintln!("kace: dispatch: couldn't finish: internal error (see the panic above)");
    }
    ExitCode::SUCCESS
}
