//! The kace-sampler binary as systemd runs it, with the fake NVML backend: one pass reads
//! every GPU into its ring, and bad configuration is a clear error with exit code 2.

use std::process::Command;

use kace_sampler::ring::{ring_path, Ring};
use kace_test_support::TempDir;

fn dir(name: &str) -> TempDir {
    TempDir::new(&format!("sampler-bin-{name}"))
}

#[test]
fn one_pass_reads_every_gpu_into_its_ring() {
    let d = dir("once");
    let conf = d.join("kace.conf");
    let samples = d.join("samples");
    let progress = d.join("progress");
    std::fs::write(
        &conf,
        format!(
            "[sampler]\ndir = {:?}\ncapacity = 600\n[node]\nprogress_root = {:?}\n",
            samples, progress
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kace-sampler"))
        .args(["--once", "--config"])
        .arg(&conf)
        .env("KACE_FAKE_NVML", "gpu=Fake H200;total_mib=143000;samples=42,17,2048")
        .env("KACE_FAKE_NVML_GPUS", "2")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for gpu in 0..2 {
        let ring = Ring::open(&ring_path(&samples, gpu)).unwrap();
        assert_eq!(ring.capacity(), 600);
        let r = ring.readings(0.0, f64::MAX).unwrap();
        assert_eq!(r.len(), 1, "GPU {gpu}");
        assert_eq!(
            (r[0].sm_pct, r[0].mem_pct, r[0].used_bytes),
            (Some(42.0), Some(17.0), Some(2048 << 20))
        );
    }
}

#[test]
fn bad_configuration_is_refused_with_exit_code_2() {
    let d = dir("bad");
    let conf = d.join("kace.conf");
    std::fs::write(&conf, "[sampler]\ninterval_ms = 5\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kace-sampler"))
        .arg("--config")
        .arg(&conf)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("sampler.interval_ms = 5"));
    let out = Command::new(env!("CARGO_BIN_EXE_kace-sampler")).arg("--bogus").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// The service caps running jobs' progress files, on a node without a usable NVML too (before,
/// it exited there and nothing bounded a runaway writer).
#[test]
fn one_pass_caps_an_oversize_progress_file_even_without_nvml() {
    use std::os::unix::fs::PermissionsExt;
    let d = dir("cap");
    let conf = d.join("kace.conf");
    let progress = d.join("progress");
    std::fs::create_dir(&progress).unwrap();
    for p in [&*d, &progress] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let text: String = (0..200_000u32).map(|i| format!("{} {}\n", 1000 + i, 2 * i)).collect();
    std::fs::write(progress.join("42.progress"), &text).unwrap();
    std::fs::write(
        &conf,
        format!(
            "[sampler]\ndir = {:?}\nprogress_max_bytes = 65536\n[node]\nprogress_root = {:?}\n",
            d.join("samples"),
            progress
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kace-sampler"))
        .args(["--once", "--config"])
        .arg(&conf)
        .env_remove("KACE_FAKE_NVML")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("job 42: compacted"), "{stderr}");
    let len = std::fs::metadata(progress.join("42.progress")).unwrap().len();
    assert!(len <= 32 << 10, "{len} bytes left");
    let p = kace_profiling::progress::read(&progress.join("42.progress")).unwrap();
    assert_eq!(p.throughput(10).unwrap().steps_per_second, 2.0);
    assert_eq!(p.points.last().map(|p| p.time), Some(200_999.0));
}
