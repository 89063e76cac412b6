//! The binaries as slurmd runs them (no PATH, root, odd environments): they always exit 0,
//! within the budget, and say on stderr why they did nothing.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn run(bin: &str, env: &[(&str, String)]) -> (Output, Duration) {
    let started = Instant::now();
    let out = Command::new(bin).env_clear().envs(env.iter().map(|(k, v)| (k, v))).output().unwrap();
    (out, started.elapsed())
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

const PROLOG: &str = env!("CARGO_BIN_EXE_kace-prolog");
const EPILOG: &str = env!("CARGO_BIN_EXE_kace-epilog");

fn kace_job(config: &str) -> Vec<(&'static str, String)> {
    vec![
        ("SLURM_JOB_ID", "42".into()),
        ("SPANK_KACE_COLOCATE", "bert".into()),
        ("SLURM_JOB_UID", "0".into()),
        ("SLURM_JOB_USER", "root".into()),
        ("SLURMD_NODENAME", "n1".into()),
        ("SLURM_JOB_GPUS", "0".into()),
        ("KACE_CONFIG", config.into()),
    ]
}

#[test]
fn no_environment_or_a_plain_job_exits_0() {
    for bin in [PROLOG, EPILOG] {
        let (out, _) = run(bin, &[]);
        assert!(out.status.success());
        assert!(stderr(&out).contains("couldn't read the job's environment"), "{}", stderr(&out));
        let (out, took) = run(bin, &[("SLURM_JOB_ID", "7".into())]);
        assert!(out.status.success());
        assert_eq!(stderr(&out), "", "a plain job is silent");
        assert!(took < Duration::from_secs(2), "{took:?}");
    }
}

#[test]
fn a_bad_configuration_exits_0_and_says_so() {
    for bin in [PROLOG, EPILOG] {
        let (out, _) = run(bin, &kace_job("/nonexistent/kace.conf"));
        assert!(out.status.success());
        assert!(stderr(&out).contains("couldn't load the configuration"), "{}", stderr(&out));
    }
}

#[test]
fn a_hanging_slurm_command_is_cut_off_within_the_budget() {
    let dir = kace_test_support::TempDir::new("node-bin");
    let hang = dir.join("hang");
    std::fs::write(&hang, "#!/bin/sh\nexec /bin/sleep 30\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&hang, std::fs::Permissions::from_mode(0o755)).unwrap();
    let d = dir.display();
    let h = hang.display();
    let conf: PathBuf = dir.join("kace.conf");
    std::fs::write(
        &conf,
        format!(
            "[database]\npath = \"{d}/k.db\"\n[spool]\ndir = \"{d}/spool\"\n\
             [node]\nscontrol = \"{h}\"\nsqueue = \"{h}\"\nmps_control = \"{h}\"\n\
             command_timeout_ms = 5000\nprolog_budget_ms = 700\nmps_root = \"{d}/mps\"\n\
             progress_root = \"{d}/progress\"\nstate_dir = \"{d}/state\"\n"
        ),
    )
    .unwrap();
    let (out, took) = run(PROLOG, &kace_job(conf.to_str().unwrap()));
    assert!(out.status.success());
    // The budget (0.7 s) caps each command, whatever its own timeout (5 s).
    assert!(took < Duration::from_secs(3), "{took:?}: {}", stderr(&out));
    assert!(stderr(&out).contains("and was killed"), "{}", stderr(&out));
    let (out, took) = run(EPILOG, &kace_job(conf.to_str().unwrap()));
    assert!(out.status.success());
    assert!(took < Duration::from_secs(8), "{took:?}: {}", stderr(&out));
}

/// Reliability audit finding 13: a kace.conf that cannot be read (a FIFO nobody writes, like a
/// hung NFS mount) hung the hook forever, because the watchdog started after the read. The
/// watchdog starts before the read now, and the re-audit's L5 made the read itself refuse a
/// FIFO at once (it is opened non-blocking): the hook exits 0 without waiting for its budget,
/// and says what the file is.
#[test]
fn an_unreadable_configuration_cannot_hang_the_hook() {
    let dir = kace_test_support::TempDir::new("node-fifo");
    let fifo = dir.join("kace.conf");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let (out, took) = run(PROLOG, &kace_job(fifo.to_str().unwrap()));
    assert!(out.status.success());
    assert!(took < Duration::from_secs(3), "{took:?}");
    assert!(stderr(&out).contains("a FIFO, not a regular file; nothing done"), "{}", stderr(&out));
}
