//! The progress-file protocol: a job appends `<unix-seconds> <steps-done>` lines to the file
//! named by `KACE_PROGRESS_FILE`; throughput is steps per second after the warm-up. A line
//! `<unix-seconds> oom` says the job ran out of GPU memory then (kace's PyTorch hook writes it
//! for an uncaught CUDA out-of-memory error); the epilog reads it with the job's exit status.
//!
//! The file is written by user code, so it is untrusted: reading is bounded, and malformed or
//! backwards-going lines are skipped and counted rather than trusted. Its creation by the root
//! prolog ([`create_for_job`]) lives here too: only in a root-owned directory, handed to the job
//! user through the open descriptor, never by path.

use std::fmt;
use std::io::Read;
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
    Io { op: &'static str, path: std::path::PathBuf, source: std::io::Error },
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
    match std::fs::remove_file(file) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io("remove old progress file")(e)),
    }
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(file)
        .map_err(io("create progress file"))?;
    std::os::unix::fs::fchown(&f, Some(uid), None).map_err(io("hand over progress file"))
}

/// Parses progress text.
pub fn parse(text: &str) -> Progress {
    let mut out = Progress::default();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let mut it = line.split_whitespace();
        let fields = (it.next(), it.next(), it.next());
        if let (Some(t), Some("oom"), None) = fields {
            match t.parse::<f64>() {
                Ok(time) if time.is_finite() => {
                    out.oom_at.get_or_insert(time);
                }
                _ => out.skipped += 1,
            }
            continue;
        }
        let point = match fields {
            (Some(t), Some(s), None) => match (t.parse::<f64>(), s.parse::<f64>()) {
                (Ok(time), Ok(steps)) if time.is_finite() && steps.is_finite() && steps >= 0.0 => {
                    Some(Point { time, steps })
                }
                _ => None,
            },
            _ => None,
        };
        let monotone = |p: &Point| {
            out.points.last().is_none_or(|last| p.time >= last.time && p.steps >= last.steps)
        };
        match point {
            Some(p) if monotone(&p) => out.points.push(p),
            _ => out.skipped += 1,
        }
    }
    out
}

/// Reads and parses a progress file, at most [`MAX_BYTES`] of it. A file that does not exist
/// is a job that never reported progress: no points, which `throughput` then explains.
pub fn read(path: &Path) -> Result<Progress, ProgressError> {
    let f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Progress::default()),
        Err(e) => return Err(ProgressError::Read(format!("{}: {e}", path.display()))),
    };
    let mut buf = Vec::new();
    f.take(MAX_BYTES)
        .read_to_end(&mut buf)
        .map_err(|e| ProgressError::Read(format!("{}: {e}", path.display())))?;
    Ok(parse(&String::from_utf8_lossy(&buf)))
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
