//! What a GPU's MPS server log says of a fatal GPU fault: the epilog of a job that failed on a
//! shared server looks in `server.log` (in the daemon's `CUDA_MPS_LOG_DIRECTORY`) for the
//! server's fault lines while the job ran, and the failure record carries when it saw one.
//!
//! The lines, as NVIDIA's MPS server wrote them on the H200 run of 2026-12-04 (driver
//! 580.159.04; docs/measurements/2026-12-04-h200-first-run.md) after one client wrote to an
//! illegal address: `Client {PID: N} encountered a fatal GPU error.`, `Server is handling a fatal
//! GPU error.` and one line per client to be torn down. Each line opens with the daemon's
//! `[YYYY-MM-DD HH:MM:SS.mmm <kind> <pid>]` stamp in the node's local time (the same stamp in
//! the control daemon's log lines quoted in NVIDIA's k8s-device-plugin issue 1614). The PID the
//! first line names was the *partner's* (the first client connected), not the faulting one's:
//! the log tells that a fault happened and when, not whose. So the record keeps only the time,
//! and the fault blocks nothing by itself (`kace_sql::failures`: two jobs' exit statuses do).

use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// The server log's name in the daemon's log directory.
pub const SERVER_LOG: &str = "server.log";

/// Most bytes read from the end of the server log (a busy server logs each client's connect and
/// exit; the job's own run is the log's end).
pub const MAX_LOG_BYTES: u64 = 1 << 20;

/// What marks a fatal fault in the server log.
const FATAL: &str = "fatal GPU error";

/// The times (Unix seconds) of the fatal-fault lines of `text` within `[from, to]`, oldest
/// first. `local` turns a stamp's date and time (`YYYY-MM-DD`, `HH:MM:SS[.fff]`) into Unix
/// seconds; a fault line whose stamp does not parse is left out (its time is unknown).
pub fn fatal_faults(
    text: &str,
    from: f64,
    to: f64,
    local: &dyn Fn(&str, &str) -> Option<f64>,
) -> Vec<f64> {
    let mut out: Vec<f64> = text
        .lines()
        .filter(|l| l.contains(FATAL))
        .filter_map(|l| {
            let stamp = l.strip_prefix('[')?.split(']').next()?;
            let mut parts = stamp.split_whitespace();
            local(parts.next()?, parts.next()?)
        })
        .filter(|t| (from..=to).contains(t))
        .collect();
    out.sort_by(f64::total_cmp);
    out
}

/// A stamp's local date and time as Unix seconds, through the C library's `mktime` (the node's
/// time zone, daylight saving decided by the library). `None` for anything but
/// `YYYY-MM-DD` and `HH:MM:SS[.fff]` with plausible fields.
pub fn local_time(date: &str, time: &str) -> Option<f64> {
    let num = |s: &str| -> Option<i32> {
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.parse().ok()).flatten()
    };
    let mut d = date.split('-');
    let (y, mo, day) = (num(d.next()?)?, num(d.next()?)?, num(d.next()?)?);
    let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
    let mut t = hms.split(':');
    let (h, mi, s) = (num(t.next()?)?, num(t.next()?)?, num(t.next()?)?);
    if d.next().is_some() || t.next().is_some() {
        return None;
    }
    if !((1970..=9999).contains(&y)
        && (1..=12).contains(&mo)
        && (1..=31).contains(&day)
        && h < 24
        && mi < 60
        && s < 61)
    {
        return None;
    }
    let frac = if frac.is_empty() {
        0.0
    } else {
        num(frac)?;
        format!("0.{frac}").parse::<f64>().ok()?
    };
    // SAFETY: `tm` is a plain C struct fully initialised here; mktime only reads and normalises
    // it and returns -1 on failure.
    let secs = unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        tm.tm_year = y - 1900;
        tm.tm_mon = mo - 1;
        tm.tm_mday = day;
        tm.tm_hour = h;
        tm.tm_min = mi;
        tm.tm_sec = s;
        tm.tm_isdst = -1;
        libc::mktime(&mut tm)
    };
    (secs != -1).then_some(secs as f64 + frac)
}

/// The times of the fatal faults the server log in `log_dir` shows within `[from, to]`: empty
/// when there is no log (no MPS, or a server that logged nothing) or it cannot be read. Reads at
/// most the last [`MAX_LOG_BYTES`], a regular file, never through a symlink.
pub fn faults_in(log_dir: &Path, from: f64, to: f64) -> std::io::Result<Vec<f64>> {
    let path = log_dir.join(SERVER_LOG);
    let mut f = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(&path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let meta = f.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::other(format!("{} is not a regular file", path.display())));
    }
    f.seek(SeekFrom::Start(meta.len().saturating_sub(MAX_LOG_BYTES)))?;
    let mut bytes = Vec::new();
    f.take(MAX_LOG_BYTES).read_to_end(&mut bytes)?;
    Ok(fatal_faults(&String::from_utf8_lossy(&bytes), from, to, &local_time))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A UTC stamp reader, so that the tests do not depend on the machine's zone.
    fn utc(date: &str, time: &str) -> Option<f64> {
        let d: Vec<i64> = date.split('-').map(|x| x.parse().ok()).collect::<Option<_>>()?;
        let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
        let t: Vec<i64> = hms.split(':').map(|x| x.parse().ok()).collect::<Option<_>>()?;
        // Days from 1970-01-01 to the date (civil calendar, Howard Hinnant's algorithm).
        let (y, m) = if d[1] <= 2 { (d[0] - 1, d[1] + 9) } else { (d[0], d[1] - 3) };
        let era = y.div_euclid(400);
        let yoe = y - era * 400;
        let doy = (153 * m + 2) / 5 + d[2] - 1;
        let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
        let f: f64 = format!("0.{frac}").parse().ok()?;
        Some((days * 86_400 + t[0] * 3600 + t[1] * 60 + t[2]) as f64 + f)
    }

    const LOG: &str = "\
[2026-12-04 17:20:00.100 Other  4242] Startup
[2026-12-04 17:20:05.500 Other  4242] New client 4300 connected
[2026-12-04 17:20:09.250 Other  4242] Client {PID: 4300} encountered a fatal GPU error.
[2026-12-04 17:20:09.251 Other  4242] Server is handling a fatal GPU error.
[2026-12-04 17:20:09.260 Other  4242] Client 4300 to be torn down
garbage line with a fatal GPU error but no stamp
[not a stamp] fatal GPU error
[2026-12-04 17:40:00.000 Other  4242] Server is handling a fatal GPU error.
";

    #[test]
    fn the_fault_lines_inside_the_window_with_their_times() {
        let at = |t: &str| utc("2026-12-04", t).unwrap();
        let got = fatal_faults(LOG, at("17:20:00"), at("17:21:00"), &utc);
        assert_eq!(got, vec![at("17:20:09.250"), at("17:20:09.251")]);
        // The later fault is another job's.
        assert_eq!(fatal_faults(LOG, at("17:30:00"), at("17:45:00"), &utc), vec![at("17:40:00")]);
        assert!(fatal_faults(LOG, at("18:00:00"), at("19:00:00"), &utc).is_empty());
        assert!(fatal_faults("", 0.0, 1e10, &utc).is_empty());
    }

    #[test]
    fn local_stamps_parse_and_nonsense_does_not() {
        let a = local_time("2026-12-04", "17:20:09.250").unwrap();
        let b = local_time("2026-12-04", "17:20:10").unwrap();
        assert!((b - a - 0.75).abs() < 1e-6, "{a} {b}");
        for (d, t) in [
            ("2026-13-04", "17:20:09"),
            ("2026-12-04", "25:00:00"),
            ("2026-12", "17:20:09"),
            ("2026-12-04-1", "17:20:09"),
            ("2026-12-04", "17:20"),
            ("2026-12-04", "17:20:09.x"),
            ("+2026-12-04", "17:20:09"),
            ("", ""),
        ] {
            assert_eq!(local_time(d, t), None, "{d} {t}");
        }
    }

    #[test]
    fn the_log_is_read_from_its_end_and_a_missing_one_is_no_fault() {
        let dir = kace_test_support::TempDir::new("mps-log");
        assert_eq!(faults_in(&dir, 0.0, 1e10).unwrap(), Vec::<f64>::new());
        let now = local_time("2026-12-04", "17:20:09").unwrap();
        let mut text = "x".repeat(MAX_LOG_BYTES as usize + 10);
        text.push_str(
            "\n[2026-12-04 17:20:09.000 Other 1] Server is handling a fatal GPU error.\n",
        );
        std::fs::write(dir.join(SERVER_LOG), text).unwrap();
        assert_eq!(faults_in(&dir, now - 1.0, now + 1.0).unwrap(), vec![now]);
        std::fs::remove_file(dir.join(SERVER_LOG)).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.join(SERVER_LOG)).unwrap();
        assert!(faults_in(&dir, 0.0, 1e10).is_err(), "a symlink is not followed");
    }
}
