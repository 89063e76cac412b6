//! Caps the progress files of running kace jobs (`<progress_root>/<job>.progress`), which their
//! users write: a job may append without bound, and the file shares a disk with the spool. Each
//! tick, a file holding more than `sampler.progress_max_bytes` is compacted in place to the
//! points the epilog needs ([`kace_profiling::progress::Thinner`]); a file below the cap is
//! only `stat`ed, so a well-behaved job (the Python helper caps itself at 1 MiB) pays nothing.
//!
//! Root does this to a user's file, so: the directory must be root's and not writable by
//! others; names are opened with `O_NOFOLLOW | O_NONBLOCK`, and only a regular file that is
//! the inode the prolog created (its recorded identity, whatever its link count; without a
//! record, a file with one link), the same one that was `lstat`ed, is touched; everything after
//! opening goes through the descriptor. The job keeps appending while this runs, so nothing is truncated: the kept lines
//! are written just before the last complete line read and the part before them is cut out of
//! the file with `fallocate(FALLOC_FL_COLLAPSE_RANGE)`, which the kernel does atomically with
//! respect to appends (ext4, XFS). Where the file system cannot collapse (tmpfs, btrfs), that
//! part is punched out instead (`FALLOC_FL_PUNCH_HOLE`): the disk space is freed and readers
//! skip the leading hole (`SEEK_DATA`), though the file's apparent size still grows.

use std::collections::HashSet;
use std::fmt;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use kace_profiling::progress::{data_start, Thinner, MAX_FORMATTED_LINE};

/// A line longer than this is junk, not a progress line (the longest real one is ~40 bytes).
const MAX_LINE: usize = 4096;

/// How a file was made smaller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// The old part was cut out of the file (its size shrank).
    Collapse,
    /// The old part became a hole (its disk use shrank; readers skip the hole).
    PunchHole,
}

/// What capping one file did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Capped {
    /// At or below the cap: not touched.
    Below,
    /// Compacted: the bytes of complete lines before and after (what the job appended
    /// meanwhile not counted), the thinning's resolution (seconds) and how.
    Compacted {
        /// Bytes of complete lines before.
        before: u64,
        /// Bytes of complete lines after.
        after: u64,
        /// The thinning's resolution, in seconds.
        resolution: f64,
        /// How the file was shortened.
        method: Method,
    },
}

/// Why a file could not be capped.
#[derive(Debug)]
pub enum CapError {
    /// The progress root is not a directory only root can change.
    Untrusted(kace_layout::trusted_dir::UntrustedDir),
    /// Not the regular file the prolog created (without its record: not one with one link),
    /// or it changed between `lstat` and `open`.
    NotPlain(PathBuf),
    /// A file operation failed: `op` on `path`.
    Io {
        /// The operation (`open`, `chown`, …).
        op: &'static str,
        /// The file it was on.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
}

impl fmt::Display for CapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CapError::Untrusted(e) => write!(f, "refusing the progress directory: {e}"),
            CapError::NotPlain(p) => {
                write!(
                    f,
                    "{} is not the regular file its prolog created (nor one with one link); left alone",
                    p.display()
                )
            }
            CapError::Io { op, path, source } => {
                write!(f, "couldn't {op} {}: {source}", path.display())
            }
        }
    }
}

impl std::error::Error for CapError {}

/// The cap over one progress directory.
#[derive(Debug)]
pub struct ProgressCap {
    root: PathBuf,
    max_bytes: u64,
    warmup_steps: u64,
    /// Files whose failure was logged already (logged again once they recover).
    failing: HashSet<PathBuf>,
}

impl ProgressCap {
    /// Caps the files in `root` at `max_bytes`, keeping the first point past `warmup_steps`.
    pub fn new(root: &Path, max_bytes: u64, warmup_steps: u64) -> ProgressCap {
        ProgressCap { root: root.to_path_buf(), max_bytes, warmup_steps, failing: HashSet::new() }
    }

    /// Caps every job's progress file once; returns how many were compacted. A directory that
    /// does not exist yet holds nothing to cap.
    pub fn tick(&mut self, log: &dyn Fn(&str)) -> usize {
        let entries = match std::fs::read_dir(&self.root) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return 0,
            Err(e) => {
                if self.failing.insert(self.root.clone()) {
                    log(&format!(
                        "kace: sampler: couldn't list progress files in {}: {e}",
                        self.root.display()
                    ));
                }
                return 0;
            }
        };
        if let Err(e) = kace_layout::trusted_dir::check_trusted_dir(&self.root) {
            if self.failing.insert(self.root.clone()) {
                log(&format!(
                    "kace: sampler: couldn't cap progress files: {}",
                    CapError::Untrusted(e)
                ));
            }
            return 0;
        }
        self.failing.remove(&self.root);
        let mut compacted = 0;
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(job) = name.to_str().and_then(|n| n.strip_suffix(".progress")) else {
                continue;
            };
            if job.is_empty() || !job.bytes().all(|b| b.is_ascii_digit()) {
                continue;
            }
            let path = entry.path();
            match cap_file(&path, self.max_bytes, self.warmup_steps) {
                Ok(Capped::Below) => {
                    self.failing.remove(&path);
                }
                Ok(Capped::Compacted { before, after, resolution, method }) => {
                    self.failing.remove(&path);
                    compacted += 1;
                    log(&format!(
                        "kace: sampler: job {job}: compacted {before} bytes of its progress file to \
                         {after} ({method:?}; interval ends move by {resolution} s at most)"
                    ));
                }
                Err(e) => {
                    if self.failing.insert(path.clone()) {
                        log(&format!(
                            "kace: sampler: job {job}: couldn't cap its progress file: {e}"
                        ));
                    }
                }
            }
        }
        compacted
    }
}

/// Caps one progress file at `max_bytes` of data (see the module docs). The directory holding
/// it must already have been checked.
pub fn cap_file(path: &Path, max_bytes: u64, warmup_steps: u64) -> Result<Capped, CapError> {
    cap_file_with(path, max_bytes, warmup_steps, true)
}

/// As [`cap_file`]; `collapse = false` goes straight to punching a hole (for tests of that
/// path on file systems that can collapse).
fn cap_file_with(
    path: &Path,
    max_bytes: u64,
    warmup_steps: u64,
    collapse: bool,
) -> Result<Capped, CapError> {
    let io = |op: &'static str| move |source| CapError::Io { op, path: path.to_path_buf(), source };
    let seen = std::fs::symlink_metadata(path).map_err(io("inspect"))?;
    // The inode the prolog created may be capped whatever links the job added to it (the
    // re-audit's M4: a hard link left a file uncapped); without a record (an older prolog) only
    // a file with one link is.
    let recorded = kace_profiling::progress::recorded_identity(path);
    let ours = |m: &std::fs::Metadata| match recorded {
        Some(id) => (m.dev(), m.ino()) == (id.dev, id.ino),
        None => m.nlink() == 1,
    };
    if !seen.file_type().is_file() || !ours(&seen) {
        return Err(CapError::NotPlain(path.to_path_buf()));
    }
    if seen.len() <= max_bytes {
        return Ok(Capped::Below);
    }
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(path)
        .map_err(io("open (not following links)"))?;
    let meta = f.metadata().map_err(io("inspect"))?;
    if !meta.file_type().is_file()
        || !ours(&meta)
        || (meta.dev(), meta.ino()) != (seen.dev(), seen.ino())
    {
        return Err(CapError::NotPlain(path.to_path_buf()));
    }
    let start = data_start(&f).map_err(io("find the data in"))?;
    let size = meta.len();
    if size.saturating_sub(start) <= max_bytes {
        return Ok(Capped::Below);
    }
    // Everything up to the last complete line read is thinned; a partial last line (the job
    // may be writing it) stays where it is, unless it is too long to be a progress line.
    let budget = usize::try_from(max_bytes / 2).unwrap_or(usize::MAX) / MAX_FORMATTED_LINE;
    let mut thinner = Thinner::new(warmup_steps, budget);
    f.seek(SeekFrom::Start(start)).map_err(io("seek in"))?;
    let end = thin(&mut f, size - start, &mut thinner).map_err(io("read"))? + start;
    let kept = thinner.text();
    let block = meta.blksize().max(512);
    let cut = (end.saturating_sub(kept.len() as u64) / block) * block;
    if cut <= start {
        return Ok(Capped::Below);
    }
    // The kept lines end exactly where the thinned part ended, newlines before them filling up
    // to the cut (empty lines are skipped by every reader).
    let pad = usize::try_from(end - cut).unwrap_or(usize::MAX) - kept.len();
    let mut text = Vec::with_capacity(pad + kept.len());
    text.resize(pad, b'\n');
    text.extend_from_slice(kept.as_bytes());
    // No fsync: a crash between these two steps leaves the job's older lines first, and the
    // reader skips the kept ones as going backwards; the power loss it would guard against
    // ends the job anyway.
    f.write_all_at(&text, cut).map_err(io("write the kept lines to"))?;
    let method = if collapse && fallocate(&f, libc::FALLOC_FL_COLLAPSE_RANGE, 0, cut).is_ok() {
        Method::Collapse
    } else {
        fallocate(&f, libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, start, cut - start)
            .map_err(io("free the thinned part of"))?;
        Method::PunchHole
    };
    Ok(Capped::Compacted {
        before: end - start,
        after: end - cut,
        resolution: thinner.resolution(),
        method,
    })
}

/// Feeds the complete lines among the next `len` bytes of `r` to `thinner`; returns how many
/// bytes it consumed: up to the last newline, or all of them when what follows it is too long
/// to be a line.
fn thin(r: &mut impl Read, len: u64, thinner: &mut Thinner) -> std::io::Result<u64> {
    let mut r = r.take(len);
    let mut buf = vec![0u8; 64 << 10];
    let mut line: Vec<u8> = Vec::with_capacity(MAX_LINE);
    let mut junk = false;
    let (mut read, mut consumed) = (0u64, 0u64);
    loop {
        let n = r.read(&mut buf)?;
        if n == 0 {
            break;
        }
        for (i, &b) in buf[..n].iter().enumerate() {
            if b == b'\n' {
                if junk {
                    thinner.skipped += 1;
                } else {
                    thinner.push_line(&String::from_utf8_lossy(&line));
                }
                line.clear();
                junk = false;
                consumed = read + i as u64 + 1;
            } else if !junk {
                if line.len() == MAX_LINE {
                    junk = true;
                    line.clear();
                } else {
                    line.push(b);
                }
            }
        }
        read += n as u64;
    }
    Ok(if junk { read } else { consumed })
}

fn fallocate(f: &File, mode: libc::c_int, offset: u64, len: u64) -> std::io::Result<()> {
    let (Ok(offset), Ok(len)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
        return Err(std::io::Error::from(std::io::ErrorKind::InvalidInput));
    };
    // SAFETY: fallocate on a descriptor we own; no memory is passed.
    if unsafe { libc::fallocate(f.as_raw_fd(), mode, offset, len) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kace_profiling::progress;
    use std::os::unix::fs::PermissionsExt;

    fn root(tag: &str) -> kace_test_support::TempDir {
        let d = kace_test_support::TempDir::new(tag);
        std::fs::set_permissions(&*d, std::fs::Permissions::from_mode(0o755)).unwrap();
        d
    }

    /// 100 000 lines at 3 steps/s from t = 1000, a partial line being written at the end.
    fn runaway(path: &Path) -> String {
        let mut text: String = (0..100_000u32)
            .map(|i| {
                let t = 1000.0 + f64::from(i) * 0.01;
                format!("{t} {}\n", (t - 1000.0) * 3.0)
            })
            .collect();
        text.push_str("2000 3000");
        std::fs::write(path, &text).unwrap();
        text
    }

    #[test]
    fn a_hole_is_punched_where_the_file_cannot_be_collapsed_and_readers_skip_it() {
        let d = root("cap-punch");
        let file = d.join("7.progress");
        let text = runaway(&file);
        let before = progress::parse(&format!("{text}\n")).throughput(0).unwrap();
        let got = cap_file_with(&file, 64 << 10, 0, false).unwrap();
        let Capped::Compacted { method, after, .. } = got else { panic!("{got:?}") };
        assert_eq!(method, Method::PunchHole);
        assert!(after <= 32 << 10, "{got:?}");
        let m = std::fs::metadata(&file).unwrap();
        assert_eq!(m.len(), text.len() as u64, "a punched file keeps its size");
        assert!(m.blocks() * 512 <= 80 << 10, "{} bytes still allocated", m.blocks() * 512);
        // The job finishes its partial line; the reader starts after the hole.
        std::io::Write::write_all(
            &mut std::fs::OpenOptions::new().append(true).open(&file).unwrap(),
            b"\n",
        )
        .unwrap();
        let read = progress::read(&file).unwrap();
        assert_eq!(read.skipped, 0);
        assert_eq!(read.throughput(0).unwrap(), before);
        // Capped again, the hole is skipped, not read.
        assert_eq!(cap_file_with(&file, 64 << 10, 0, false).unwrap(), Capped::Below);
    }

    /// The re-audit's M4: the job hard-linked its progress file elsewhere and wrote 309 MB in
    /// 10 s, uncapped. The file its prolog created is capped by its recorded inode whatever
    /// its link count; a name whose inode is not the recorded one is still left alone.
    #[test]
    fn the_prologs_file_is_capped_through_a_hard_link_and_no_other_inode_is() {
        let d = root("cap-link");
        let file = d.join("33.progress");
        // SAFETY: geteuid has no preconditions.
        progress::create_for_job(&d, &file, unsafe { libc::geteuid() }).unwrap();
        let elsewhere = d.join("link-33");
        std::fs::hard_link(&file, &elsewhere).unwrap();
        let lines: String = (0..40_000).map(|i| format!("{} {i}\n", 1000 + i)).collect();
        std::fs::write(&elsewhere, &lines).unwrap();
        assert_eq!(std::fs::metadata(&file).unwrap().nlink(), 2);
        assert!(matches!(cap_file(&file, 64 << 10, 0).unwrap(), Capped::Compacted { .. }));
        assert!(std::fs::metadata(&elsewhere).unwrap().len() <= 64 << 10);
        assert!(progress::read(&file).unwrap().points.len() >= 2);
        // Another inode under a job's name with a record naming a different one: untouched.
        let other = d.join("34.progress");
        progress::create_for_job(&d, &other, unsafe { libc::geteuid() }).unwrap();
        // Moved away, not removed: a freed inode number could be given to the new file.
        std::fs::rename(&other, d.join("kept")).unwrap();
        std::fs::write(&other, &lines).unwrap();
        assert!(matches!(cap_file(&other, 64 << 10, 0), Err(CapError::NotPlain(_))));
        assert_eq!(std::fs::metadata(&other).unwrap().len(), lines.len() as u64);
    }

    #[test]
    fn junk_and_strange_files_are_bounded_or_left_alone() {
        let d = root("cap-junk");
        // A line of 1 MiB with no newline: junk, cut away.
        let junk = d.join("8.progress");
        let mut text = "1 1\n2 2\n".to_string();
        text.push_str(&"9".repeat(1 << 20));
        std::fs::write(&junk, &text).unwrap();
        assert!(matches!(cap_file(&junk, 64 << 10, 0).unwrap(), Capped::Compacted { .. }));
        assert!(std::fs::metadata(&junk).unwrap().len() <= 8 << 10);
        assert_eq!(progress::read(&junk).unwrap().points.len(), 2);
        // A symlink, a hard link and a FIFO are not followed, touched or read.
        let big = d.join("big");
        std::fs::write(&big, "1 1\n".repeat(100_000)).unwrap();
        std::os::unix::fs::symlink(&big, d.join("9.progress")).unwrap();
        assert!(matches!(cap_file(&d.join("9.progress"), 64 << 10, 0), Err(CapError::NotPlain(_))));
        std::fs::hard_link(&big, d.join("10.progress")).unwrap();
        assert!(matches!(
            cap_file(&d.join("10.progress"), 64 << 10, 0),
            Err(CapError::NotPlain(_))
        ));
        let fifo = std::ffi::CString::new(d.join("11.progress").to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        assert!(matches!(
            cap_file(&d.join("11.progress"), 64 << 10, 0),
            Err(CapError::NotPlain(_))
        ));
        assert_eq!(std::fs::metadata(&big).unwrap().len(), 400_000);
        // Over the directory: only <job>.progress names, each failure logged once.
        let mut cap = ProgressCap::new(&d, 64 << 10, 0);
        let lines = std::cell::RefCell::new(Vec::new());
        let log = |l: &str| lines.borrow_mut().push(l.to_string());
        assert_eq!(cap.tick(&log), 0);
        assert_eq!(cap.tick(&log), 0);
        let lines = lines.into_inner();
        assert_eq!(lines.len(), 3, "{lines:#?}");
        assert!(lines.iter().all(|l| l.contains("couldn't cap its progress file")), "{lines:#?}");
        assert_eq!(std::fs::metadata(&big).unwrap().len(), 400_000, "big is no job's file");
    }

    #[test]
    fn a_directory_others_can_write_is_refused() {
        if !kace_layout::trusted_dir::running_as_root() {
            return; // Only root's caps are a danger; the check itself is kace-layout's.
        }
        let d = root("cap-untrusted");
        let file = d.join("5.progress");
        runaway(&file);
        std::fs::set_permissions(&*d, std::fs::Permissions::from_mode(0o777)).unwrap();
        let mut cap = ProgressCap::new(&d, 64 << 10, 0);
        let lines = std::cell::RefCell::new(Vec::new());
        assert_eq!(cap.tick(&|l: &str| lines.borrow_mut().push(l.to_string())), 0);
        assert!(lines.borrow()[0].contains("refusing the progress directory"), "{:?}", lines);
        assert!(std::fs::metadata(&file).unwrap().len() > 1 << 20);
    }
}
