//! Test support shared by every crate's tests (a dev-dependency only, never shipped): where the
//! third-party data under `../shared/data` live, the Python with the real PyTorch, transformers
//! and Lightning, scratch directories removed on drop, and Prometheus's text parser run on a
//! metrics file.
//!
//! Tests that need the shared data are marked `#[ignore = "needs ../shared/data/..."]`, so a fresh
//! checkout's `cargo test` never counts them as passed without running them; CI runs them with
//! `--include-ignored`. Once such a test runs, missing data is a failure, not a skip.

#![warn(missing_docs)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The shared data folder: `$KACE_DATA_DIR`, or `../shared/data` beside the checkout.
pub fn shared_data_dir() -> PathBuf {
    std::env::var_os("KACE_DATA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data"))
}

/// Where the KACE artifact is looked for: `$KACE_ARTIFACT_DIR`, or `kace-artifact` in the shared
/// data folder.
pub fn artifact_dir() -> PathBuf {
    std::env::var_os("KACE_ARTIFACT_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| shared_data_dir().join("kace-artifact"))
}

/// The KACE artifact's folder. Panics, saying where it looked, when the artifact is not there:
/// only tests marked `#[ignore = "needs ../shared/data/kace-artifact"]` call this.
pub fn artifact() -> PathBuf {
    let dir = artifact_dir();
    assert!(
        dir.join("pairs/MPS100_kernel_labels_targetMPS100.csv").is_file(),
        "this test needs the KACE artifact, which is not at {} (set KACE_ARTIFACT_DIR, or run \
         without --include-ignored)",
        dir.display()
    );
    dir
}

/// A file inside the shared data folder, by its path there. Panics, saying where it looked, when
/// it is missing: only tests marked `#[ignore = "needs ../shared/data/..."]` call this.
pub fn shared_file(rel: &str) -> PathBuf {
    let p = shared_data_dir().join(rel);
    assert!(
        p.is_file(),
        "this test needs {}, which is missing (set KACE_DATA_DIR, or run without \
         --include-ignored)",
        p.display()
    );
    p
}

/// Where `.ci/install-deps` puts the venv with the real PyTorch, transformers and Lightning.
pub const DEFAULT_REAL_PYTHON: &str = "/opt/kace-pyenv/bin/python";

/// The Python whose `torch`, `transformers` and `lightning` are the real ones from PyPI:
/// `$KACE_REAL_PYTHON`, else [`DEFAULT_REAL_PYTHON`]. Tests using it are `#[ignore = "needs
/// torch …"]`; once one runs, a missing venv is a failure with this message, not a skip.
pub fn real_python() -> PathBuf {
    let p = std::env::var_os("KACE_REAL_PYTHON")
        .map_or_else(|| PathBuf::from(DEFAULT_REAL_PYTHON), PathBuf::from);
    assert!(
        p.exists(),
        "no Python with the real libraries at {} (.ci/install-deps makes it; or set \
         KACE_REAL_PYTHON)",
        p.display()
    );
    p
}

/// A fresh, empty directory under the system temp dir, removed with everything in it when
/// dropped (kept when `KACE_KEEP_TEMP` is set, to inspect a failure). Hand-written rather than
/// `tempfile`, whose dependency tree costs more build time than these few lines.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    /// A new directory named after `tag`, this process and a counter, so that parallel tests
    /// and test binaries never share one.
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::SeqCst);
        let p = std::env::temp_dir().join(format!("kace-test-{tag}-{}-{n}", std::process::id()));
        // A leftover from an earlier process with the same pid.
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(&p)
            .unwrap_or_else(|e| panic!("couldn't create test directory {}: {e}", p.display()));
        TempDir(p)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

/// A `TempDir` is used wherever its path is (`dir.join(..)`, `dir.to_str()`).
impl std::ops::Deref for TempDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for TempDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::env::var_os("KACE_KEEP_TEMP").is_none() {
            let _ = fs::remove_dir_all(&self.0);
        }
    }
}

/// Parses a Prometheus text file with Prometheus's own Python parser (`prometheus_client`,
/// Debian's python3-prometheus-client) and prints `name type sample=value…` per family;
/// `None` (with the reason) when python3 or the module is missing outside CI.
pub fn parse_with_prometheus_client(path: &Path) -> Option<String> {
    const SCRIPT: &str = r#"
import sys
from prometheus_client.parser import text_string_to_metric_families
text = open(sys.argv[1]).read()
for fam in text_string_to_metric_families(text):
    samples = " ".join("%s%s=%r" % (s.name, sorted(s.labels.items()), s.value) for s in fam.samples)
    print(fam.name, fam.type, samples)
"#;
    let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
    let mut why = Vec::new();
    // Debian's python3-prometheus-client is in the system Python, which a pyenv or venv on
    // PATH may shadow.
    for python in ["python3", "/usr/bin/python3"] {
        match Command::new(python).arg("-c").arg(SCRIPT).arg(path).output() {
            Ok(o) if o.status.success() => {
                return Some(String::from_utf8_lossy(&o.stdout).into_owned())
            }
            Ok(o) => {
                let err = String::from_utf8_lossy(&o.stderr).into_owned();
                assert!(
                    err.contains("No module named 'prometheus_client'"),
                    "prometheus_client refused {}: {err}",
                    path.display()
                );
                why.push(format!("{python}: no prometheus_client"));
            }
            Err(e) => why.push(format!("{python}: {e}")),
        }
    }
    assert!(!ci, "CI=true but no Python with prometheus_client: {why:?}");
    eprintln!("SKIPPED the parser check ({why:?}): install python3-prometheus-client");
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temp_dirs_are_distinct_and_removed_on_drop() {
        let a = TempDir::new("x");
        let b = TempDir::new("x");
        assert_ne!(a.path(), b.path());
        fs::write(a.join("f"), "1").unwrap();
        let p = a.path().to_path_buf();
        drop(a);
        assert!(!p.exists());
        assert!(b.path().is_dir());
    }
}
