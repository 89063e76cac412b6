//! What the co-scheduling tests add to a cluster: the kace binaries (built when missing or
//! stale), a kace.conf for the cluster, hooks that run kace-prolog, kace-epilog and
//! `kace dispatch` with that configuration, and a fake `nvidia-cuda-mps-control` that records
//! every call and keeps a pid file per GPU, the way the real one keeps a daemon.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::SystemTime;

use crate::{HarnessError, Hook, SlurmInstall};

const BINS: [&str; 5] = ["kace", "kace-prolog", "kace-epilog", "kace-dispatch", "kace-sampler"];
/// The crates the binaries are built from (for the staleness check).
const CRATES: [&str; 10] = [
    "node",
    "cli",
    "sql",
    "selector",
    "config",
    "layout",
    "profiling",
    "simulator",
    "log",
    "sampler",
];

/// The directory holding fresh `kace`, `kace-prolog` and `kace-epilog`: `$KACE_BIN_DIR` if set,
/// else cargo's own output next to the test binary, else a build into `target/kace-e2e-plugin`.
pub fn bin_dir() -> Result<PathBuf, HarnessError> {
    static FOUND: OnceLock<Result<PathBuf, HarnessError>> = OnceLock::new();
    FOUND.get_or_init(locate).clone()
}

fn locate() -> Result<PathBuf, HarnessError> {
    if let Some(d) = std::env::var_os("KACE_BIN_DIR") {
        return Ok(PathBuf::from(d));
    }
    let newest = newest_source();
    let exe = std::env::current_exe()
        .map_err(|e| HarnessError::Plugin(format!("couldn't find the test binary: {e}")))?;
    // Test binaries live in target/<profile>/deps/, a program (kace-demo) in target/<profile>/.
    let profile = profile_dir(&exe);
    if let Some(dir) = &profile {
        if fresh(dir, newest) {
            return Ok(dir.clone());
        }
    }
    // A separate target dir, shared with the plugin build: the outer cargo holds its own lock.
    let target = profile
        .as_deref()
        .and_then(Path::parent)
        .map(|t| t.join("kace-e2e-plugin"))
        .unwrap_or_else(|| std::env::temp_dir().join("kace-e2e-plugin"));
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
    // A benchmark (built optimised) measures optimised binaries; tests use debug ones.
    let release = profile.as_deref().and_then(Path::file_name).is_some_and(|n| n == "release");
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--offline", "-p", "kace-node", "-p", "kace-cli", "-p", "kace-sampler"]);
    if release {
        cmd.arg("--release");
    }
    let out =
        cmd.arg("--manifest-path")
            .arg(&manifest)
            .arg("--target-dir")
            .arg(&target)
            .output()
            .map_err(|e| HarnessError::Plugin(format!("couldn't run cargo build for kace: {e}")))?;
    if !out.status.success() {
        return Err(HarnessError::Plugin(format!(
            "cargo build -p kace-node -p kace-cli -p kace-sampler failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(target.join(if release { "release" } else { "debug" }))
}

/// cargo's `target/<profile>` directory for the running executable: its own directory for a
/// program cargo put there (`kace-demo`), the parent for a test binary in `deps/`.
pub(crate) fn profile_dir(exe: &Path) -> Option<PathBuf> {
    let dir = exe.parent()?;
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.parent().map(Path::to_path_buf)
    } else {
        Some(dir.to_path_buf())
    }
}

fn mtime(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

fn newest_in(dir: &Path, newest: &mut Option<SystemTime>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            newest_in(&p, newest);
        } else if let Some(t) = mtime(&p) {
            *newest = Some(newest.map_or(t, |n| n.max(t)));
        }
    }
}

fn newest_source() -> Option<SystemTime> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut newest = None;
    for c in CRATES {
        newest_in(&root.join(c).join("src"), &mut newest);
        if let Some(t) = mtime(&root.join(c).join("Cargo.toml")) {
            newest = Some(newest.map_or(t, |n: SystemTime| n.max(t)));
        }
    }
    newest
}

fn fresh(dir: &Path, newest: Option<SystemTime>) -> bool {
    BINS.iter().all(|b| match (mtime(&dir.join(b)), newest) {
        (Some(built), Some(src)) => built >= src,
        (Some(_), None) => true,
        (None, _) => false,
    })
}

/// A hook that runs `program args` (a kace binary) with the cluster's kace.conf and slurm.conf
/// (`{dir}/etc/kace.conf`); Slurm gives hooks no PATH and, on the controller, maybe no
/// SLURM_CONF.
pub fn hook(program: &str, args: &str) -> Result<Hook, HarnessError> {
    let bin = bin_dir()?.join(program);
    Ok(Hook::Script(format!(
        "export KACE_CONFIG={{dir}}/etc/kace.conf SLURM_CONF={{dir}}/etc/slurm.conf\n\
         exec {} {args} 2>>{{dir}}/log/kace-{program}.log",
        bin.display()
    )))
}

/// The decider's service, `kace dispatch --watch`, for the cluster in `dir` (its
/// `etc/kace.conf`, and `slurm_conf`); what it prints goes to `{dir}/dispatch-watch.out` (its
/// pass lines, which tests read) and `.err`.
pub fn watch(dir: &Path, slurm_conf: &Path) -> Result<std::process::Child, HarnessError> {
    let file = |name: &str| {
        let p = dir.join(name);
        std::fs::File::create(&p).map_err(|e| HarnessError::Io {
            what: format!("couldn't create {}", p.display()),
            source: e.to_string(),
        })
    };
    Command::new(bin_dir()?.join("kace"))
        .args(["dispatch", "--watch"])
        .env("KACE_CONFIG", dir.join("etc/kace.conf"))
        .env("SLURM_CONF", slurm_conf)
        .stdout(file("dispatch-watch.out")?)
        .stderr(file("dispatch-watch.err")?)
        .spawn()
        .map_err(|e| HarnessError::Io {
            what: "couldn't start kace dispatch --watch".into(),
            source: e.to_string(),
        })
}

/// The configuration the tests start from: everything under the cluster directory, the Slurm
/// commands of the install under test, the fake MPS control, a 32 GiB GPU (no NVML here), and
/// `max_hold_s`.
pub fn conf(dir: &Path, max_hold_s: u64) -> String {
    let d = dir.display();
    let slurm = SlurmInstall::from_env();
    let [scontrol, squeue, sinfo] =
        ["scontrol", "squeue", "sinfo"].map(|p| slurm.program(p).display().to_string());
    format!(
        "[database]\npath = \"{d}/kace.db\"\n\
         [spool]\ndir = \"{d}/kace-spool\"\nquarantine = \"{d}/kace-quarantine\"\n\
         [profiling]\nwarmup_steps = 0\n\
         [node]\nscontrol = \"{scontrol}\"\nsqueue = \"{squeue}\"\nsinfo = \"{sinfo}\"\n\
         mps_control = \"{d}/fake-mps\"\ncommand_timeout_ms = 2000\n\
         prolog_budget_ms = 5000\nmps_root = \"{d}/mps\"\nprogress_root = \"{d}/progress\"\n\
         state_dir = \"{d}/state\"\ngpu_memory_gib = 32.0\n\
         [dispatch]\nmax_hold_s = {max_hold_s}\nlock = \"{d}/run/dispatch.lock\"\n\
         socket = \"{d}/run/dispatch.sock\"\nsubmitted = \"{d}/run/submitted\"\n\
         state_dir = \"{d}/run/decider\"\n"
    )
}

/// A running `kace-sampler`, stopped when dropped.
#[derive(Debug)]
pub struct Sampler(std::process::Child);

impl Drop for Sampler {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `kace-sampler --config CONF`, its log in `log`, reading the fake NVML `fake_nvml` (a
/// `KACE_FAKE_NVML` spec, `kace_profiling::nvml::FakeSampler::from_spec`) or, with `None`, the
/// real NVML (on a machine without a driver the sampler then only caps progress files).
pub fn start_sampler(
    conf: &Path,
    fake_nvml: Option<&str>,
    log: &Path,
) -> Result<Sampler, HarnessError> {
    let stderr = std::fs::File::create(log)
        .map_err(|e| HarnessError::Plugin(format!("couldn't create {}: {e}", log.display())))?;
    let mut cmd = Command::new(bin_dir()?.join("kace-sampler"));
    cmd.arg("--config").arg(conf).stderr(stderr);
    match fake_nvml {
        Some(spec) => cmd.env("KACE_FAKE_NVML", spec),
        None => cmd.env_remove("KACE_FAKE_NVML"),
    };
    cmd.spawn()
        .map(Sampler)
        .map_err(|e| HarnessError::Plugin(format!("couldn't start kace-sampler: {e}")))
}

/// A stand-in for `nvidia-cuda-mps-control`: `-d` starts a detached placeholder "daemon" whose
/// pid it keeps in `$CUDA_MPS_PIPE_DIRECTORY/fake-mps.pid`; `get_server_list` succeeds only
/// while that daemon lives; `quit` ends it. Every call is appended to `{dir}/mps-calls.log` as
/// `<verb> <pipe dir>`. With `{dir}/mps-fail` present every call fails.
pub fn fake_mps_script(dir: &Path) -> String {
    let d = dir.display();
    format!(
        r#"#!/bin/bash
log={d}/mps-calls.log
pid="$CUDA_MPS_PIPE_DIRECTORY/fake-mps.pid"
if [ -e {d}/mps-fail ]; then echo "fail $*" >> "$log"; echo "fake MPS: broken" >&2; exit 1; fi
if [ "$1" = "-d" ]; then
  echo "start $CUDA_MPS_PIPE_DIRECTORY gpu=$CUDA_VISIBLE_DEVICES" >> "$log"
  setsid /bin/sleep 100000 </dev/null >/dev/null 2>&1 &
  echo $! > "$pid"
  exit 0
fi
read -r cmd
case "$cmd" in
  get_server_list) [ -f "$pid" ] && kill -0 "$(cat "$pid")" 2>/dev/null ;;
  quit) echo "quit $CUDA_MPS_PIPE_DIRECTORY" >> "$log"; kill "$(cat "$pid")" 2>/dev/null; rm -f "$pid" ;;
  start_server*) echo "server $CUDA_MPS_PIPE_DIRECTORY $cmd" >> "$log" ;;
  *) echo "unknown $cmd" >> "$log"; exit 1 ;;
esac
"#
    )
}

/// One of kace's GPU state records, read back by a test: which GPU, which job and workload,
/// and when it started and ended there (`f64::INFINITY` while it runs).
#[derive(Debug, Clone, PartialEq)]
pub struct GpuRecord {
    /// `<node>/<gpu>`, as the state directory names them.
    pub at: String,
    /// The job.
    pub job: u32,
    /// Its workload, as recorded.
    pub workload: String,
    /// Start, Unix seconds.
    pub start: f64,
    /// End, Unix seconds.
    pub end: f64,
}

/// Every record (running and ended) under a cluster's kace `state_dir`.
pub fn gpu_records(state_dir: &Path) -> Vec<GpuRecord> {
    let mut out = Vec::new();
    for node in std::fs::read_dir(state_dir).into_iter().flatten().flatten() {
        if !node.path().is_dir() || node.file_name() == "expect" {
            continue;
        }
        for gpu in std::fs::read_dir(node.path()).into_iter().flatten().flatten() {
            let at = format!(
                "{}/{}",
                node.file_name().to_string_lossy(),
                gpu.file_name().to_string_lossy()
            );
            for sub in ["jobs", "ended"] {
                for f in std::fs::read_dir(gpu.path().join(sub)).into_iter().flatten().flatten() {
                    let Ok(job) = f.file_name().to_string_lossy().parse::<u32>() else { continue };
                    let text = std::fs::read_to_string(f.path()).unwrap_or_default();
                    let v: Vec<&str> = text.split_whitespace().collect();
                    out.push(GpuRecord {
                        at: at.clone(),
                        job,
                        workload: v.first().unwrap_or(&"").to_string(),
                        start: v.get(1).and_then(|s| s.parse().ok()).unwrap_or(0.0),
                        end: v.get(2).and_then(|s| s.parse().ok()).unwrap_or(f64::INFINITY),
                    });
                }
            }
        }
    }
    out
}

/// `builder` with every kace hook: slurmd's Prolog and Epilog (`kace-prolog`, `kace-epilog`)
/// and the decider's nudges ([`with_nudges`]).
pub fn with_hooks(builder: crate::ClusterBuilder) -> Result<crate::ClusterBuilder, HarnessError> {
    with_nudges(builder.prolog(hook("kace-prolog", "")?).epilog(hook("kace-epilog", "")?))
}

/// `builder` with slurmctld's PrologSlurmctld and EpilogSlurmctld running `kace-dispatch`: the
/// nudges that wake the decider as kace jobs start and end.
pub fn with_nudges(builder: crate::ClusterBuilder) -> Result<crate::ClusterBuilder, HarnessError> {
    Ok(builder
        .prolog_slurmctld(hook("kace-dispatch", "")?)
        .epilog_slurmctld(hook("kace-dispatch", "")?))
}
