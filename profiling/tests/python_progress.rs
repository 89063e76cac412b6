//! The Python writer (`python/kace_progress.py`, what jobs use) against the Rust reader (what the
//! epilog and `kace profile run` use): lines one writes, the other must read as the true rate.

use std::path::PathBuf;
use std::process::Command;

use kace_profiling::progress;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn lines_from_the_python_helper_read_as_its_rate() {
    let dir = kace_test_support::TempDir::new("pyprogress");
    let file = dir.join("job.progress");
    // 40 steps, 20 ms apart: about 50 steps/s, every step written (interval 0).
    let out = Command::new("python3")
        .arg(repo().join("python/kace_progress.py"))
        .args(["40", "0.02"])
        .env("KACE_PROGRESS_FILE", &file)
        .env("KACE_PROGRESS_INTERVAL", "0")
        .env_remove("RANK")
        .env_remove("SLURM_PROCID")
        .output()
        .expect("python3 runs (.ci/install-deps installs it)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let p = progress::read(&file).unwrap();
    assert_eq!(p.skipped, 0);
    assert_eq!(p.points.len(), 40);
    assert_eq!(p.points.last().unwrap().steps, 40.0);
    let rate = p.throughput(5).unwrap().steps_per_second;
    // sleep() only ever overshoots, so the rate is at most 50/s; a loaded CI machine slows it.
    assert!(rate > 10.0 && rate <= 50.5, "rate {rate}");
}
