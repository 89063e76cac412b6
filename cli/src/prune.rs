//! Removing what the spool leaves behind: quarantined files (each with its `.reason`) and
//! abandoned `.tmp.*` writes older than a retention period. `kace ingest` never deletes either
//! (the admin may want to look at them); the nightly `kace retrain` ages them out so that the
//! spool does not grow forever. Records waiting to be ingested are never touched.

use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// What one prune did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PruneReport {
    /// Files removed.
    pub removed: Vec<PathBuf>,
    /// Files that were old enough but could not be removed, with the reason. Reported, not
    /// fatal: a file left behind costs disk space, not correctness.
    pub failed: Vec<(PathBuf, String)>,
}

/// Which files may go, by directory: in the quarantine everything, in the spool only the
/// abandoned temporary writes (`.tmp.<pid>.<name>`, see `kace_sql::spool`).
#[derive(Debug, Clone, Copy)]
enum Keep {
    Nothing,
    RecordsAndLiveWrites,
}

/// Removes files older than `keep` (by modification time, relative to `now`) from `quarantine`
/// and abandoned writes from `spool`. A missing directory has nothing to prune.
pub fn prune(spool: &Path, quarantine: &Path, keep: Duration, now: SystemTime) -> PruneReport {
    let mut report = PruneReport::default();
    let cutoff = now.checked_sub(keep).unwrap_or(SystemTime::UNIX_EPOCH);
    prune_dir(quarantine, Keep::Nothing, cutoff, &mut report);
    prune_dir(spool, Keep::RecordsAndLiveWrites, cutoff, &mut report);
    report
}

fn prune_dir(dir: &Path, keep: Keep, cutoff: SystemTime, report: &mut PruneReport) {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == ErrorKind::NotFound => return,
        Err(e) => {
            report.failed.push((dir.to_path_buf(), format!("couldn't list it: {e}")));
            return;
        }
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if matches!(keep, Keep::RecordsAndLiveWrites) && !name.starts_with(".tmp.") {
            continue;
        }
        // Only plain files: a sub-directory or link here was put by someone else, for a reason.
        let Ok(meta) = entry.path().symlink_metadata() else { continue };
        if !meta.file_type().is_file() {
            continue;
        }
        let Ok(mtime) = meta.modified() else { continue };
        if mtime >= cutoff {
            continue;
        }
        let path = entry.path();
        match fs::remove_file(&path) {
            Ok(()) => report.removed.push(path),
            // Another prune or an admin got there first.
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => report.failed.push((path, e.to_string())),
        }
    }
    report.removed.sort();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;

    const DAY: Duration = Duration::from_secs(86_400);

    fn file(dir: &Path, name: &str, age: Duration, now: SystemTime) -> PathBuf {
        let p = dir.join(name);
        fs::write(&p, "x").unwrap();
        File::options().write(true).open(&p).unwrap().set_modified(now - age).unwrap();
        p
    }

    #[test]
    fn removes_old_quarantine_and_abandoned_writes_only() {
        let root = kace_test_support::TempDir::new("prune");
        let (spool, q) = (root.join("spool"), root.join("q"));
        fs::create_dir_all(&spool).unwrap();
        fs::create_dir_all(q.join("sub")).unwrap();
        let now = SystemTime::now();
        let old_q = file(&q, "a.json", 40 * DAY, now);
        let old_reason = file(&q, "a.json.reason", 40 * DAY, now);
        let new_q = file(&q, "b.json", DAY, now);
        let old_tmp = file(&spool, ".tmp.12.c.json", 40 * DAY, now);
        let new_tmp = file(&spool, ".tmp.13.d.json", DAY, now);
        // An old record not yet ingested is data, never pruned.
        let old_record = file(&spool, "e.json", 40 * DAY, now);

        let r = prune(&spool, &q, 30 * DAY, now);
        assert_eq!(r.failed, vec![]);
        let mut want = vec![old_q.clone(), old_reason.clone(), old_tmp.clone()];
        want.sort();
        let mut got = r.removed.clone();
        got.sort();
        assert_eq!(got, want);
        for p in [&old_q, &old_reason, &old_tmp] {
            assert!(!p.exists(), "{} should be gone", p.display());
        }
        for p in [&new_q, &new_tmp, &old_record] {
            assert!(p.exists(), "{} should stay", p.display());
        }
        assert!(q.join("sub").is_dir());
    }

    #[test]
    fn missing_directories_have_nothing_to_prune() {
        let none = Path::new("/nonexistent/kace-prune");
        assert_eq!(prune(none, none, DAY, SystemTime::now()), PruneReport::default());
    }
}
