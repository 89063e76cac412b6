//! Finds the kace SPANK plugin (`libkace_spank.so`) for the test cluster, building it when it is
//! missing or older than its sources, so `cargo test --workspace` works from a clean tree. A
//! plugin loads only into the Slurm series whose headers it was built against, so for a Slurm
//! under `$KACE_SLURM_PREFIX` it is always built against that prefix's `include/`, in a target
//! directory of its own.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::SystemTime;

use crate::{HarnessError, SlurmInstall};

const SO: &str = "libkace_spank.so";

/// The plugin to load: `$KACE_SPANK_SO` if set; for a Slurm under `$KACE_SLURM_PREFIX` one built
/// against its headers into `target/kace-e2e-plugin-<version>/`; else the `.so` cargo built next
/// to the test binary (`target/<profile>/`), else one built into `target/kace-e2e-plugin/`.
pub fn plugin_path() -> Result<PathBuf, HarnessError> {
    static FOUND: OnceLock<Result<PathBuf, HarnessError>> = OnceLock::new();
    FOUND.get_or_init(locate).clone()
}

fn locate() -> Result<PathBuf, HarnessError> {
    if let Some(p) = std::env::var_os("KACE_SPANK_SO") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(HarnessError::Plugin(format!("KACE_SPANK_SO={} does not exist", p.display())))
        };
    }
    let slurm = SlurmInstall::from_env();
    let sources = newest_source();
    let exe = std::env::current_exe()
        .map_err(|e| HarnessError::Plugin(format!("couldn't find the test binary: {e}")))?;
    // Test binaries live in target/<profile>/deps/, a program (kace-demo) in target/<profile>/.
    let deps = exe.parent().map(Path::to_path_buf);
    let profile = crate::kace::profile_dir(&exe);
    if slurm.prefix.is_none() {
        for dir in [profile.clone(), deps].into_iter().flatten() {
            let so = dir.join(SO);
            if is_fresh(&so, sources) {
                return Ok(so);
            }
        }
    }
    // A separate target dir: the outer `cargo test` may still hold the lock on its own.
    let name = match slurm.prefix {
        Some(_) => format!("kace-e2e-plugin-{}", slurm.label()),
        None => "kace-e2e-plugin".to_string(),
    };
    let target = profile
        .as_deref()
        .and_then(Path::parent)
        .map(|t| t.join(&name))
        .unwrap_or_else(|| std::env::temp_dir().join(&name));
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
    let out = Command::new(cargo)
        .args(["build", "--offline", "-p", "kace-spank", "--manifest-path"])
        .arg(&manifest)
        .arg("--target-dir")
        .arg(&target)
        .env("SLURM_INCLUDE_DIR", slurm.include_dir())
        .env_remove("KACE_SLURM_VERSION")
        .output()
        .map_err(|e| {
            HarnessError::Plugin(format!("couldn't run cargo build -p kace-spank: {e}"))
        })?;
    if !out.status.success() {
        return Err(HarnessError::Plugin(format!(
            "cargo build -p kace-spank failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    let so = target.join("debug").join(SO);
    if so.is_file() {
        Ok(so)
    } else {
        Err(HarnessError::Plugin(format!("cargo build -p kace-spank made no {}", so.display())))
    }
}

fn mtime(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

/// The newest modification time among the plugin's sources.
fn newest_source() -> Option<SystemTime> {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../spank-plugin");
    let mut files = vec![crate_dir.join("build.rs"), crate_dir.join("Cargo.toml")];
    if let Ok(entries) = std::fs::read_dir(crate_dir.join("src")) {
        files.extend(entries.flatten().map(|e| e.path()));
    }
    files.iter().filter_map(|f| mtime(f)).max()
}

fn is_fresh(so: &Path, sources: Option<SystemTime>) -> bool {
    match (mtime(so), sources) {
        (Some(built), Some(src)) => built >= src,
        (Some(_), None) => true,
        (None, _) => false,
    }
}
