//! The progress-file protocol: a job appends `<unix-seconds> <steps-done>` lines to the file
//! named by `KACE_PROGRESS_FILE`; throughput is steps per second after the warm-up. A line
//! `<unix-seconds> oom` says the job ran out of GPU memory then (kace's PyTorch hook writes it
//! for an uncaught CUDA out-of-memory error); the epilog reads it with the job's exit status.
//!
//! The file is written by user code, so it is untrusted: reading is bounded, and malformed or
//! backwards-going lines are skipped and counted rather than trusted. Its creation by the root
//! prolog ([`create_for_job`]) lives here too: only in a root-owned directory, handed to the job
//! user through the open descriptor, never by path, with the inode it made recorded beside it
//! ([`recorded_identity`]) for the sampler's cap; and its removal by the epilog
//! ([`remove_for_job`]).

use std::fmt;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Environment variable that tells a job where to write its progress.
pub const ENV_VAR: &str = "KACE_PROGRESS_FILE";

/// Most bytes read from a progress file (a line per step for days is still far below this).
pub const MAX_BYTES: u64 = 16 * 1024 * 1024;

/// One progress line.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    /// Unix seconds.
    pub time: f64,
    /// Steps done so far (cumulative).
    pub steps: f64,
}

/// The valid points of a progress file and how many lines were refused.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Progress {
    /// Points in file order, time and steps non-decreasing.
    pub points: Vec<Point>,
    /// Lines that were malformed, not finite, or went backwards.
    pub skipped: usize,
    /// When the job reported running out of GPU memory (the first `<unix-seconds> oom` line).
    pub oom_at: Option<f64>,
    /// The file held more than [`MAX_BYTES`] past its data start: only that much was read.
    pub truncated: bool,
    /// Well-formed lines whose time lay outside the window they were read with
    /// ([`read_within`]): skipped before they could make every later line go backwards (the
    /// re-audit's L7: one `1e308 15` line lost the job's observation).
    pub outside: usize,
}

/// Throughput over the measured window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Throughput {
    /// Steps per second between `from` and `to`.
    pub steps_per_second: f64,
    /// Start of the measured window (the first point at or past the warm-up).
    pub from: Point,
    /// End of the measured window (the last point).
    pub to: Point,
}

/// Why no throughput could be computed.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ProgressError {
    /// The file could not be read.
    Read(String),
    /// Fewer than two points after the warm-up.
    TooFewPoints {
        /// Valid points in the file.
        points: usize,
        /// Warm-up steps asked for.
        warmup_steps: u64,
    },
    /// The measured window has no duration.
    NoElapsedTime,
}

impl fmt::Display for ProgressError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProgressError::Read(e) => write!(f, "couldn't read progress file: {e}"),
            ProgressError::TooFewPoints { points, warmup_steps } => write!(
                f,
                "the job reported {points} valid progress lines; at least two are needed after \
                 the first {warmup_steps} warm-up steps (does it write \"<unix-seconds> \
                 <steps-done>\" lines to ${ENV_VAR}?)"
            ),
            ProgressError::NoElapsedTime => {
                write!(f, "the progress lines after the warm-up all have the same time")
            }
        }
    }
}

impl std::error::Error for ProgressError {}

/// Why the prolog could not create a job's progress file.
#[derive(Debug)]
pub enum CreateError {
    /// The progress root is not a directory only root can change.
    Untrusted(kace_layout::trusted_dir::UntrustedDir),
    /// A file operation failed: `op` on `path`.
    Io {
        /// The operation (`open`, `chown`, …).
        op: &'static str,
        /// The file it was on.
        path: std::path::PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
}

impl fmt::Display for CreateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CreateError::Untrusted(e) => write!(f, "refusing the progress directory: {e}"),
            CreateError::Io { op, path, source } => {
                write!(f, "couldn't {op} {}: {source}", path.display())
            }
        }
    }
}

impl std::error::Error for CreateError {}

/// Creates `file` (a job's progress file, inside `root`) empty, mode 0600, owned by `uid`.
///
/// `root` must be root's and not group- or world-writable, or a user could swap a symlink in
/// between two of these steps. The file is created with `O_EXCL | O_NOFOLLOW` after removing
/// any old one, and handed over with `fchown` on the descriptor just opened: the audit showed
/// that a `chown` by path in a user-writable root lets the user win a race and have root chown
/// any file to them.
pub fn create_for_job(root: &Path, file: &Path, uid: u32) -> Result<(), CreateError> {
    use std::os::unix::fs::OpenOptionsExt;
    kace_layout::trusted_dir::ensure_trusted_dir(root).map_err(CreateError::Untrusted)?;
    let io =
        |op: &'static str| move |source| CreateError::Io { op, path: file.to_path_buf(), source };
    // A requeued job's, or a left-over one: the file and its recorded inode both go.
    remove_for_job(file).map_err(io("remove old progress file"))?;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(file)
        .map_err(io("create progress file"))?;
    std::os::unix::fs::fchown(&f, Some(uid), None).map_err(io("hand over progress file"))?;
    // The identity is taken from the descriptor the file was created through, so it names
    // this inode whatever links the job adds to it later.
    let meta = f.metadata().map_err(io("inspect progress file"))?;
    let text = FileId { dev: meta.dev(), ino: meta.ino() }.to_string();
    let mut idf = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(identity_file(file))
        .map_err(io("create progress file identity"))?;
    idf.write_all(text.as_bytes()).map_err(io("write progress file identity"))
}

/// The inode of a job's progress file as its prolog created it: `(device, inode)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileId {
    /// `st_dev`.
    pub dev: u64,
    /// `st_ino`.
    pub ino: u64,
}

impl fmt::Display for FileId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.dev, self.ino)
    }
}

/// Where the prolog records the identity of `file` (a job's progress file): beside it, named
/// `<job>.progress.id`, root's and 0600. The directory is root's and not writable by others,
/// so a job's user can neither forge this file nor put another inode under the progress
/// file's name; a hard link the user makes elsewhere to the progress file leaves both alone.
pub fn identity_file(file: &Path) -> std::path::PathBuf {
    let mut name = file.as_os_str().to_owned();
    name.push(".id");
    std::path::PathBuf::from(name)
}

/// The identity the prolog recorded for `file`, if there is a readable one: a regular file of
/// this process's user (root on a node), not a link, at most a line long. `None` otherwise
/// (a progress file made by an older prolog has none).
pub fn recorded_identity(file: &Path) -> Option<FileId> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(identity_file(file))
        .ok()?;
    let meta = f.metadata().ok()?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if !meta.file_type().is_file() || meta.uid() != me || meta.nlink() != 1 {
        return None;
    }
    let mut text = String::new();
    f.take(64).read_to_string(&mut text).ok()?;
    let mut it = text.split_whitespace();
    let (dev, ino) = (it.next()?.parse().ok()?, it.next()?.parse().ok()?);
    it.next().is_none().then_some(FileId { dev, ino })
}

/// Removes a job's progress file and its recorded identity (the epilog, once the file was
/// read). A file that is not there is no error; the first failure is returned.
pub fn remove_for_job(file: &Path) -> std::io::Result<()> {
    let mut first = Ok(());
    for p in [file.to_path_buf(), identity_file(file)] {
        match std::fs::remove_file(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                if first.is_ok() {
                    first = Err(std::io::Error::new(e.kind(), format!("{}: {e}", p.display())));
                }
            }
        }
    }
    first
}

/// What one line says, `None` when it is malformed or not finite (empty lines included: callers
/// skip those without counting them).
fn parse_line(line: &str) -> Option<Line> {
    let mut it = line.split_whitespace();
    match (it.next(), it.next(), it.next()) {
        (Some(t), Some("oom"), None) => match t.parse::<f64>() {
            Ok(time) if time.is_finite() => Some(Line::Oom(time)),
            _ => None,
        },
        (Some(t), Some(s), None) => match (t.parse::<f64>(), s.parse::<f64>()) {
            (Ok(time), Ok(steps)) if time.is_finite() && steps.is_finite() && steps >= 0.0 => {
                Some(Line::Point(Point { time, steps }))
            }
            _ => None,
        },
        _ => None,
    }
}

/// What one well-formed progress line says.
enum Line {
    /// `<time> <steps>`.
    Point(Point),
    /// `<time> oom`: the job ran out of GPU memory then.
    Oom(f64),
}

/// Whether `p` may follow `last`: neither time nor steps go backwards.
fn follows(last: Option<&Point>, p: &Point) -> bool {
    last.is_none_or(|last| p.time >= last.time && p.steps >= last.steps)
}

/// Parses progress text.
pub fn parse(text: &str) -> Progress {
    parse_within(text, f64::NEG_INFINITY..=f64::INFINITY)
}

/// Parses progress text, taking only lines whose time lies in `window` (the others count as
/// [`Progress::outside`]).
pub fn parse_within(text: &str, window: std::ops::RangeInclusive<f64>) -> Progress {
    let mut out = Progress::default();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        match parse_line(line) {
            Some(Line::Oom(time)) if window.contains(&time) => {
                out.oom_at.get_or_insert(time);
            }
            Some(Line::Point(p)) if !window.contains(&p.time) => out.outside += 1,
            Some(Line::Oom(_)) => out.outside += 1,
            Some(Line::Point(p)) if follows(out.points.last(), &p) => out.points.push(p),
            _ => out.skipped += 1,
        }
    }
    out
}

/// Longest line written by [`format_point`], in bytes (newline included).
pub const MAX_FORMATTED_LINE: usize = 64;

/// `p` as a progress line that parses back to exactly `p`: the shortest decimal form, or
/// scientific notation where that is shorter (a hostile 1e300 would otherwise print 301 digits).
pub fn format_point(p: &Point) -> String {
    fn number(x: f64) -> String {
        let plain = x.to_string();
        if plain.len() <= 24 {
            plain
        } else {
            format!("{x:e}")
        }
    }
    format!("{} {}\n", number(p.time), number(p.steps))
}

/// A rate (steps per second) for a log line: three decimals, or scientific notation from 1e9
/// on (the re-audit's L11: a forged rate printed 300 digits into the epilog's log).
pub fn format_rate(v: f64) -> String {
    if v.is_finite() && v.abs() < 1e9 {
        format!("{v:.3}")
    } else {
        format!("{v:.3e}")
    }
}

/// The points of a progress file that its readers need, in bounded memory, fed one line at a
/// time: a file compacted to these gives the same throughput over any interval up to
/// [`Thinner::resolution`] seconds at each end.
///
/// The readers ([`Progress::throughput`] and the epilog's per-interval throughput) use only the
/// first and the last point inside an interval, after the warm-up. So the thinner keeps, for each
/// time bucket of `resolution` seconds, its first and last point, plus the first point past the
/// warm-up (steps only grow, so there is one); whenever more than `budget` points are kept, the
/// buckets double, which keeps the first and last point of every coarser bucket. Lines that
/// are malformed or go backwards are dropped, as [`parse`] skips them; the last point kept is
/// the last one accepted, so lines appended later are accepted exactly as before.
#[derive(Debug, Clone)]
pub struct Thinner {
    warmup_steps: f64,
    budget: usize,
    resolution: f64,
    /// Kept points, and whether each is pinned (the first past the warm-up: never replaced).
    kept: Vec<(Point, bool)>,
    warm: bool,
    /// The first out-of-memory line's time: kept whatever else is thinned.
    oom_at: Option<f64>,
    /// Lines dropped as malformed or backwards.
    pub skipped: usize,
}

/// The finest bucket, seconds: progress lines carry no finer time that matters.
const FINEST_RESOLUTION: f64 = 0.001;

impl Thinner {
    /// A thinner keeping at most `budget` points (at least 8) past `warmup_steps`.
    pub fn new(warmup_steps: u64, budget: usize) -> Thinner {
        Thinner {
            warmup_steps: warmup_steps as f64,
            budget: budget.max(8),
            resolution: FINEST_RESOLUTION,
            kept: Vec::new(),
            warm: false,
            oom_at: None,
            skipped: 0,
        }
    }

    /// Seconds per bucket so far: the most the throughput's window can move at each end.
    pub fn resolution(&self) -> f64 {
        self.resolution
    }

    /// Feeds one line (without its newline).
    pub fn push_line(&mut self, line: &str) {
        let line = line.trim();
        if line.is_empty() {
            return;
        }
        match parse_line(line) {
            Some(Line::Oom(time)) => {
                self.oom_at.get_or_insert(time);
            }
            Some(Line::Point(p)) if follows(self.kept.last().map(|k| &k.0), &p) => self.push(p),
            _ => self.skipped += 1,
        }
    }

    fn push(&mut self, p: Point) {
        let pinned = !self.warm && p.steps >= self.warmup_steps;
        self.warm |= pinned;
        self.add(p, pinned);
        while self.kept.len() > self.budget && self.resolution.is_finite() {
            self.resolution *= 2.0;
            let kept = std::mem::take(&mut self.kept);
            for (q, pin) in kept {
                self.add(q, pin);
            }
        }
    }

    fn bucket(&self, p: &Point) -> f64 {
        (p.time / self.resolution).floor()
    }

    /// Adds `p` as its bucket's last point: it replaces the previous last one, unless that one
    /// is the bucket's first or pinned.
    fn add(&mut self, p: Point, pinned: bool) {
        let n = self.kept.len();
        let b = self.bucket(&p);
        if !pinned && n >= 2 {
            let (last, last_pinned) = self.kept[n - 1];
            let before = self.kept[n - 2].0;
            if !last_pinned && self.bucket(&last) == b && self.bucket(&before) == b {
                self.kept[n - 1] = (p, false);
                return;
            }
        }
        self.kept.push((p, pinned));
    }

    /// The points kept, in order.
    pub fn points(&self) -> impl Iterator<Item = &Point> {
        self.kept.iter().map(|k| &k.0)
    }

    /// The kept lines as text that [`parse`] reads back to the same points and out-of-memory
    /// time: the points, then the first `oom` line if there was one.
    pub fn text(&self) -> String {
        let mut text: String = self.points().map(format_point).collect();
        if let Some(t) = self.oom_at {
            text.push_str(&format!("{t} oom\n"));
        }
        text
    }
}

/// The offset of a file's first data: past the hole that kace-sampler's cap punches at the start
/// of an oversize progress file where the file system cannot cut it out. Readers start there.
pub fn data_start(f: &File) -> std::io::Result<u64> {
    // SAFETY: lseek on a descriptor we own.
    let off = unsafe { libc::lseek(f.as_raw_fd(), 0, libc::SEEK_DATA) };
    if off >= 0 {
        return Ok(off as u64);
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        // No data at all (empty, or one hole): nothing before the end.
        Some(libc::ENXIO) => f.metadata().map(|m| m.len()),
        // A file system without SEEK_DATA: data from the start.
        Some(libc::EINVAL) | Some(libc::EOPNOTSUPP) => Ok(0),
        _ => Err(e),
    }
}

/// Reads and parses a progress file: the one reader of the format, used by the epilog, `kace
/// status` and `kace profile run`. The file is the user's, so it is opened without following
/// symlinks and without blocking (a FIFO), only a regular file is read, and at most
/// [`MAX_BYTES`] of it ([`Progress::truncated`] says when there was more). A file that does not
/// exist is a job that never reported progress: no points, which `throughput` then explains.
pub fn read(path: &Path) -> Result<Progress, ProgressError> {
    read_within(path, f64::NEG_INFINITY..=f64::INFINITY)
}

/// As [`read`], taking only lines whose time lies in `window`: the epilog passes the job's run
/// by its node's clock (with slack), so that a line from another clock or a forged time is
/// dropped instead of turning every later line into one that goes backwards.
pub fn read_within(
    path: &Path,
    window: std::ops::RangeInclusive<f64>,
) -> Result<Progress, ProgressError> {
    use std::os::unix::fs::OpenOptionsExt;
    let err = |what: &str, e: std::io::Error| {
        ProgressError::Read(format!("{}: {what}: {e}", path.display()))
    };
    let f = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Progress::default()),
        Err(e) => return Err(err("couldn't open it (not following links)", e)),
    };
    let meta = f.metadata().map_err(|e| err("couldn't inspect it", e))?;
    if !meta.file_type().is_file() {
        return Err(ProgressError::Read(format!("{}: not a regular file", path.display())));
    }
    // kace-sampler's cap may have punched out the file's start (kace_sampler::progress_cap).
    let start = data_start(&f).map_err(|e| err("couldn't find its data", e))?;
    let mut f = f;
    f.seek(SeekFrom::Start(start)).map_err(|e| err("couldn't read it", e))?;
    let mut buf = Vec::new();
    f.take(MAX_BYTES).read_to_end(&mut buf).map_err(|e| err("couldn't read it", e))?;
    let mut progress = parse_within(&String::from_utf8_lossy(&buf), window);
    progress.truncated = meta.len().saturating_sub(start) > MAX_BYTES;
    Ok(progress)
}

impl Progress {
    /// Steps per second from the first point with at least `warmup_steps` steps done to the
    /// last point. Dropping the warm-up matters: the first steps include CUDA context creation,
    /// kernel autotuning and data-loader start-up (the artifact drops its first 10 log entries).
    pub fn throughput(&self, warmup_steps: u64) -> Result<Throughput, ProgressError> {
        let after: Vec<&Point> =
            self.points.iter().filter(|p| p.steps >= warmup_steps as f64).collect();
        let (Some(from), Some(to)) = (after.first(), after.last()) else {
            return Err(ProgressError::TooFewPoints { points: self.points.len(), warmup_steps });
        };
        if after.len() < 2 {
            return Err(ProgressError::TooFewPoints { points: self.points.len(), warmup_steps });
        }
        let dt = to.time - from.time;
        if dt <= 0.0 {
            return Err(ProgressError::NoElapsedTime);
        }
        Ok(Throughput { steps_per_second: (to.steps - from.steps) / dt, from: **from, to: **to })
    }
}

#[cfg(test)]
mod create_tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    /// The audit's race: with a user-writable progress root, a user swapping the new file for
    /// a symlink to a root-only file got root to chown that file to them. Such a root is now
    /// refused outright, and in a trusted root the file is handed over by descriptor.
    #[test]
    fn a_user_writable_root_is_refused_and_the_file_is_handed_over_by_descriptor() {
        if !kace_layout::trusted_dir::running_as_root() {
            // Without root nothing can be chowned; the check itself is tested in kace-layout.
            let d = kace_test_support::TempDir::new("progress-nonroot");
            assert!(create_for_job(&d, &d.join("1.progress"), 65534).is_ok());
            return;
        }
        let d = kace_test_support::TempDir::new("progress-root");
        std::fs::set_permissions(&*d, std::fs::Permissions::from_mode(0o755)).unwrap();
        let victim = d.join("victim");
        std::fs::write(&victim, "root secret\n").unwrap();
        let public = d.join("pub");
        std::fs::create_dir(&public).unwrap();
        std::fs::set_permissions(&public, std::fs::Permissions::from_mode(0o777)).unwrap();
        // What the racing user would leave: the job's file name as a symlink to the victim.
        let name = public.join("100.progress");
        std::os::unix::fs::symlink(&victim, &name).unwrap();
        let err = create_for_job(&public, &name, 65534).unwrap_err();
        assert!(matches!(err, CreateError::Untrusted(_)), "{err}");
        assert_eq!(std::fs::metadata(&victim).unwrap().uid(), 0);

        let trusted = d.join("progress");
        let file = trusted.join("100.progress");
        create_for_job(&trusted, &file, 65534).unwrap();
        let m = std::fs::symlink_metadata(&file).unwrap();
        assert!(m.file_type().is_file());
        assert_eq!((m.uid(), m.mode() & 0o777), (65534, 0o600));
        // A leftover symlink at the job's name is removed, not followed.
        std::fs::remove_file(&file).unwrap();
        std::os::unix::fs::symlink(&victim, &file).unwrap();
        create_for_job(&trusted, &file, 65534).unwrap();
        assert_eq!(std::fs::metadata(&victim).unwrap().uid(), 0);
        assert!(std::fs::symlink_metadata(&file).unwrap().file_type().is_file());
    }
    /// The re-audit's M4: a hard link made the sampler leave a progress file uncapped. The
    /// prolog now records the inode it created; the link changes neither the file's identity
    /// nor the record, and the epilog removes both.
    #[test]
    fn the_created_inode_is_recorded_and_survives_a_hard_link() {
        let d = kace_test_support::TempDir::new("progress-identity");
        let file = d.join("7.progress");
        create_for_job(&d, &file, 0).unwrap();
        let m = std::fs::metadata(&file).unwrap();
        let id = recorded_identity(&file).unwrap();
        assert_eq!(id, FileId { dev: m.dev(), ino: m.ino() });
        std::fs::hard_link(&file, d.join("elsewhere")).unwrap();
        assert_eq!(recorded_identity(&file), Some(id));
        assert_eq!(std::fs::metadata(&file).unwrap().nlink(), 2);
        // Created again (a requeued job): a new inode and a new record.
        create_for_job(&d, &file, 0).unwrap();
        let again = recorded_identity(&file).unwrap();
        assert_eq!(again.ino, std::fs::metadata(&file).unwrap().ino());
        // A record that is not one line of two numbers, or a link, is no record.
        std::fs::write(identity_file(&file), "1 2 3\n").unwrap();
        assert_eq!(recorded_identity(&file), None);
        std::fs::remove_file(identity_file(&file)).unwrap();
        std::os::unix::fs::symlink(d.join("elsewhere"), identity_file(&file)).unwrap();
        assert_eq!(recorded_identity(&file), None);
        remove_for_job(&file).unwrap();
        assert!(std::fs::symlink_metadata(&file).is_err());
        assert!(std::fs::symlink_metadata(identity_file(&file)).is_err());
        remove_for_job(&file).unwrap();
    }
}

#[cfg(test)]
mod read_tests {
    use super::*;

    /// The re-audit's L7: one line `1e308 15` made every later line go backwards and the job
    /// lost its observation. Read within the job's run, it is dropped and counted.
    #[test]
    fn rates_print_short() {
        assert_eq!(format_rate(12.3456), "12.346");
        assert_eq!(format_rate(7.5e304), "7.500e304");
        assert!(format_rate(f64::INFINITY).len() < 10);
    }

    #[test]
    fn a_line_outside_the_window_is_dropped_not_let_block_the_rest() {
        let text = "100 0\n1e308 15\n101 10\n102 20\n103 oom\n5 0\n";
        let all = parse(text);
        assert_eq!((all.points.len(), all.skipped, all.outside), (2, 3, 0));
        let within = parse_within(text, 90.0..=200.0);
        assert_eq!((within.points.len(), within.skipped, within.outside), (3, 0, 2));
        assert_eq!(within.oom_at, Some(103.0));
        assert_eq!(within.throughput(0).unwrap().steps_per_second, 10.0);
    }

    #[test]
    fn hostile_progress_files_are_refused_or_bounded() {
        let d = kace_test_support::TempDir::new("progress-read");
        let p = read(&d.join("missing")).unwrap();
        assert!(p.points.is_empty() && !p.truncated);
        std::fs::write(d.join("secret"), "1 1\n2 2\n").unwrap();
        std::os::unix::fs::symlink(d.join("secret"), d.join("link")).unwrap();
        let e = read(&d.join("link")).unwrap_err();
        assert!(e.to_string().contains("not following links"), "a symlink was followed: {e}");
        let fifo = std::ffi::CString::new(d.join("fifo").to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let e = read(&d.join("fifo")).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "a FIFO was read: {e}");
        std::fs::write(d.join("garbage"), b"\xff\xfe\x00 nonsense\n1 2 3\n").unwrap();
        let p = read(&d.join("garbage")).unwrap();
        assert!(p.points.is_empty() && p.skipped > 0);
        let big = File::create(d.join("huge")).unwrap();
        big.set_len(MAX_BYTES + 10).unwrap();
        // Data at its start: a file that is only a hole has nothing to read.
        std::os::unix::fs::FileExt::write_all_at(&big, b"1 1\n", 0).unwrap();
        let p = read(&d.join("huge")).unwrap();
        assert!(p.truncated);
        assert_eq!(p.points, vec![Point { time: 1.0, steps: 1.0 }]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_skips_bad_lines() {
        let p = parse("100 0\n101 5\nnonsense\n102 4\n102.5 x\n103 15 extra\n104 20\n\n");
        assert_eq!(p.points.len(), 3);
        assert_eq!(p.skipped, 4);
        assert_eq!(p.points[2], Point { time: 104.0, steps: 20.0 });
        assert_eq!(p.oom_at, None);
    }

    #[test]
    fn an_out_of_memory_line_is_kept_apart_from_the_points() {
        let p = parse(
            "100 0
101 5
101.5 oom
102 oom
NaN oom
x oom
",
        );
        assert_eq!(p.points.len(), 2);
        assert_eq!(p.oom_at, Some(101.5));
        assert_eq!(p.skipped, 2);
    }

    #[test]
    fn throughput_drops_warmup() {
        // Slow start (context creation), then 10 steps/s.
        let p = parse("0 0\n5 1\n6 10\n7 20\n8 30\n");
        let t = p.throughput(10).unwrap();
        assert_eq!(t.steps_per_second, 10.0);
        assert_eq!(t.from.time, 6.0);
        let all = p.throughput(0).unwrap();
        assert!(all.steps_per_second < 10.0);
    }

    #[test]
    fn too_few_points_is_an_error() {
        assert!(matches!(parse("1 1\n").throughput(0), Err(ProgressError::TooFewPoints { .. })));
        assert!(matches!(
            parse("1 20\n2 30").throughput(25),
            Err(ProgressError::TooFewPoints { .. })
        ));
        assert_eq!(parse("1 20\n1 30").throughput(0), Err(ProgressError::NoElapsedTime));
        assert!(parse("").throughput(0).is_err());
    }
}

#[cfg(test)]
mod thinner_tests {
    use super::*;

    /// First and last point inside `[a, b]` past the warm-up: what the epilog measures from.
    fn window(points: &[Point], a: f64, b: f64, warmup: f64) -> Option<f64> {
        let inside: Vec<&Point> =
            points.iter().filter(|p| p.time >= a && p.time <= b && p.steps >= warmup).collect();
        let (f, l) = (inside.first()?, inside.last()?);
        (l.time > f.time).then(|| (l.steps - f.steps) / (l.time - f.time))
    }

    #[test]
    fn thinned_points_are_bounded_and_give_the_same_rates() {
        // 200 000 points over 1000 s at 5 steps/s, 1 step/s from 400 s on, with jitter.
        let mut text = String::new();
        let (mut t, mut s) = (1_000_000.0f64, 0.0f64);
        for i in 0..200_000u32 {
            text.push_str(&format!("{t} {s}\n"));
            let dt = 0.005 * (1.0 + f64::from(i % 7) / 10.0);
            s += dt * if t < 1_000_400.0 { 5.0 } else { 1.0 };
            t += dt;
        }
        text.push_str("garbage\n1 1\n");
        let full = parse(&text);
        let mut th = Thinner::new(20, 500);
        for line in text.lines() {
            th.push_line(line);
        }
        let kept: Vec<Point> = th.points().copied().collect();
        assert!(kept.len() <= 500, "{}", kept.len());
        assert_eq!(th.skipped, full.skipped);
        assert_eq!(kept.last(), full.points.last(), "the last accepted point is kept");
        let warm = full.points.iter().find(|p| p.steps >= 20.0);
        assert!(kept.iter().any(|p| Some(p) == warm), "the first point past the warm-up");
        let r = th.resolution();
        assert!(r < 10.0, "{r}");
        for (a, b) in [(1e6, 1_000_400.0), (1_000_400.0, 1_001_000.0), (1_000_100.0, 1_000_123.4)] {
            let (x, y) = (window(&full.points, a, b, 20.0), window(&kept, a, b, 20.0));
            let (x, y) = (x.unwrap(), y.unwrap());
            assert!((x - y).abs() <= 0.02 * x, "[{a}, {b}]: {x} vs {y} (resolution {r})");
        }
        let (whole, thin) =
            (full.throughput(20).unwrap(), Progress { points: kept, ..Progress::default() });
        assert_eq!(thin.throughput(20).unwrap(), whole);
    }

    /// The cap must not erase the epilog's evidence that a job ran out of memory.
    #[test]
    fn thinning_keeps_the_first_out_of_memory_line() {
        let mut text: String = (0..1000).map(|i| format!("{} {}\n", 100 + i, 5 * i)).collect();
        text.push_str("1100.5 oom\n1101 oom\n");
        let mut th = Thinner::new(0, 8);
        for line in text.lines() {
            th.push_line(line);
        }
        let back = parse(&th.text());
        assert_eq!(back.oom_at, Some(1100.5));
        assert!(back.points.len() <= 8, "{}", back.points.len());
        assert_eq!(back.points.last(), parse(&text).points.last());
    }

    #[test]
    fn formatted_points_parse_back_exactly_and_stay_short() {
        for p in [
            Point { time: 1_764_550_000.123_456, steps: 12.0 },
            Point { time: -1.5e300, steps: 1.797_693_134_862_315_7e308 },
            Point { time: 5e-324, steps: 0.1 + 0.2 },
        ] {
            let line = format_point(&p);
            assert!(line.len() <= MAX_FORMATTED_LINE, "{line}");
            assert_eq!(parse(&line).points, vec![p], "{line}");
        }
    }
}
