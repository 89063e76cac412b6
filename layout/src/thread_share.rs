//! The SM split's hand-over from the prolog to the SPANK plugin (issue 33 item 3): when the
//! decider chose a share for a job it added beside a running one (its release ticket says so,
//! [`crate::release_ticket`]), the prolog writes it into a root-owned file beside the job's
//! progress file, and the plugin sets it as the tasks' `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`.
//!
//! The variable is per client and read when a process creates its CUDA context (NVIDIA's MPS
//! guide, "Environment Variables": `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` on a client limits the
//! fraction of the GPU's SMs its kernels may use), so every process of the job gets the same
//! percentage; unlike a memory limit it is a fraction, not an amount, and is not divided
//! among tasks. A job can still raise its own processes' share back to 100 % by resetting the
//! variable before CUDA starts: that only returns the pair to what MPS does unasked, so the
//! share is a placement hint, not a policy kace enforces.

use std::path::{Path, PathBuf};

/// The variable NVIDIA's MPS client reads.
pub const VAR: &str = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE";

/// Longest share file accepted (two digits and a newline).
pub const MAX_FILE_BYTES: u64 = 8;

/// A percentage kace sets, 1…99 (100 is what MPS does unasked: nothing is set then), from its
/// decimal digits only.
pub fn parse_percent(text: &str) -> Option<u8> {
    if text.is_empty() || text.len() > 2 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok().filter(|p| (1..=99).contains(p))
}

/// The share file of job `job_id` under `progress_root`.
pub fn file(progress_root: &Path, job_id: u32) -> PathBuf {
    progress_root.join(format!("{job_id}.smshare"))
}

/// The share the prolog wrote for `job_id`: only a regular file owned by `owner` (root), not a
/// link, in the one form written here. `None` when there is none.
pub fn read(progress_root: &Path, job_id: u32, owner: u32) -> Result<Option<u8>, String> {
    let parse = |text: &str| text.strip_suffix('\n').and_then(parse_percent);
    let path = file(progress_root, job_id);
    crate::handover::read_parsed(&path, MAX_FILE_BYTES, owner, parse, "a percentage of 1-99")
}

/// Writes `share` as job `job_id`'s share file (mode 0644: the plugin reads it in the job's own
/// context), replacing any earlier one atomically; with `None` (or a value outside 1…99),
/// removes it. The caller has checked that `progress_root` is root's.
pub fn write(progress_root: &Path, job_id: u32, share: Option<u8>) -> std::io::Result<()> {
    let text = share.filter(|p| (1..=99).contains(p)).map(|p| format!("{p}\n"));
    crate::handover::write(&file(progress_root, job_id), text.as_deref(), 0o644)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn only_a_percentage_below_100_parses() {
        assert_eq!(parse_percent("40"), Some(40));
        assert_eq!(parse_percent("1"), Some(1));
        for bad in ["", "0", "100", "+4", "-4", "4.5", " 4", "040", "999"] {
            assert_eq!(parse_percent(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_share_file_is_read_only_in_the_form_and_from_the_owner_the_prolog_gives_it() {
        let dir = std::env::temp_dir().join(format!("kace-thread-share-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let me = std::fs::metadata(&dir).unwrap().uid();
        assert_eq!(read(&dir, 7, me), Ok(None));
        write(&dir, 7, Some(30)).unwrap();
        assert_eq!(read(&dir, 7, me), Ok(Some(30)));
        assert!(read(&dir, 7, me + 1).is_err());
        std::os::unix::fs::symlink(file(&dir, 7), file(&dir, 8)).unwrap();
        assert!(read(&dir, 8, me).is_err());
        std::fs::write(file(&dir, 9), "100\n").unwrap();
        assert!(read(&dir, 9, me).is_err());
        write(&dir, 7, Some(100)).unwrap();
        assert_eq!(read(&dir, 7, me), Ok(None));
        write(&dir, 7, None).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
