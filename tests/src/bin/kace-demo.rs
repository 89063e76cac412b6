//! `kace-demo`: kace end to end on a throwaway local Slurm cluster with a fake GPU, printing a
//! timeline of who ran with whom, predicted against observed. Run it through `./demo` (root,
//! Debian 12), which installs Slurm and builds kace first. See `kace_e2e::demo`.

use std::process::ExitCode;
use std::time::Instant;

use kace_e2e::demo;

fn main() -> ExitCode {
    let started = Instant::now();
    if kace_e2e::e2e_available("kace-demo").is_none() {
        eprintln!("kace-demo: run it as root on a machine with Slurm: ./demo installs Slurm first");
        return ExitCode::FAILURE;
    }
    let mut say = |line: &str| println!("{line}");
    match demo::run(&mut say) {
        Ok((recorded, explain)) => {
            // A recording lets tests/tests/demo.rs render a real run without a cluster.
            if let Some(path) = std::env::var_os("KACE_DEMO_RECORD") {
                let json = serde_json::to_string_pretty(&recorded).expect("recording serialises");
                if let Err(e) = std::fs::write(&path, json + "\n") {
                    eprintln!("kace-demo: couldn't write {}: {e}", path.to_string_lossy());
                }
            }
            println!("\n{}", demo::render(&recorded));
            println!("{explain}");
            println!(
                "kace-demo: done in {:.0?}; the cluster and its files are gone",
                started.elapsed()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("kace-demo: failed: {e}");
            ExitCode::FAILURE
        }
    }
}
