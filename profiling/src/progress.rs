//! The progress-file protocol: a job appends `<unix-seconds> <steps-done>` lines to the file
//! named by `KACE_PROGRESS_FILE`; throughput is steps per second after the warm-up.
//!
//! The file is written by user code, so it is untrusted: reading is bounded, and malformed or
//! backwards-going lines are skipped and counted rather than trusted.

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

/// Parses progress text.
pub fn parse(text: &str) -> Progress {
    let mut out = Progress::default();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let mut it = line.split_whitespace();
        let point = match (it.next(), it.next(), it.next()) {
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
mod tests {
    use super::*;

    #[test]
    fn parses_and_skips_bad_lines() {
        let p = parse("100 0\n101 5\nnonsense\n102 4\n102.5 x\n103 15 extra\n104 20\n\n");
        assert_eq!(p.points.len(), 3);
        assert_eq!(p.skipped, 4);
        assert_eq!(p.points[2], Point { time: 104.0, steps: 20.0 });
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
