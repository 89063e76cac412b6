//! kace's one log sink for the programs Slurm runs (`kace-prolog`, `kace-epilog`,
//! `kace-dispatch`, `kace dispatch`): each event is one line `kace: <phase>: …`, written to
//! stderr and sent to syslog (ident `kace`, facility daemon), which rsyslog and journald both
//! read from `/dev/log`.
//!
//! Why not stderr alone: slurmd keeps a successful prolog's output only at `debug2`, and
//! slurmctld keeps nothing of EpilogSlurmctld's, so at default log levels stderr reaches no log.
//!
//! Why not `syslog(3)`: glibc's client always writes to `/dev/log`; a socket path of our own lets
//! a site or a test point kace at another daemon, and the datagram is the same one glibc sends
//! (RFC 3164: `<PRI>Mmm dd hh:mm:ss ident[pid]: message`).
//!
//! Every line is made safe before it leaves: values in kace's messages come from users (job
//! names, workloads, a command's stderr), so control characters, newlines included, are written
//! as `\xNN` escapes (one event stays one line; nothing can forge a second line or a terminal
//! escape), and a line is cut at [`MAX_LINE`] bytes.

#![warn(missing_docs)]

use std::borrow::Cow;
use std::fmt;
use std::io::Write;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The syslog identifier of every kace program.
pub const IDENT: &str = "kace";

/// The socket rsyslog and journald listen on.
pub const DEFAULT_SOCKET: &str = "/dev/log";

/// Longest line sent, in bytes: journald and rsyslog accept more, but a line is an event, not
/// a dump (a command's whole stderr is cut here).
pub const MAX_LINE: usize = 4096;

/// syslog facility `daemon` (3), shifted as in `<syslog.h>`.
const FACILITY_DAEMON: u8 = 3 << 3;

/// How bad an event is; the syslog severity it is sent with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    /// Something kace should have done and couldn't (`couldn't …`): LOG_ERR.
    Error,
    /// kace did less than it could, on purpose or by policy: LOG_WARNING.
    Warning,
    /// What kace did (released a job, chose a partner): LOG_INFO.
    Info,
}

impl Severity {
    fn code(self) -> u8 {
        match self {
            Severity::Error => 3,
            Severity::Warning => 4,
            Severity::Info => 6,
        }
    }

    /// The severity a kace message line implies: `couldn't` is an error, anything else info.
    pub fn of(line: &str) -> Severity {
        if line.contains("couldn't") {
            Severity::Error
        } else {
            Severity::Info
        }
    }
}

/// Why a line could not be sent to syslog.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// No unbound datagram socket could be made.
    Socket(std::io::Error),
    /// The syslog daemon's socket refused the datagram (absent, not a datagram socket, full).
    Send {
        /// The socket.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Socket(e) => write!(f, "couldn't create a datagram socket: {e}"),
            Error::Send { path, source } => {
                write!(f, "couldn't send to syslog socket {}: {source}", path.display())
            }
        }
    }
}

impl std::error::Error for Error {}

/// The log sink: stderr always, syslog when a socket is configured.
#[derive(Debug, Clone)]
pub struct Logger {
    syslog: Option<Syslog>,
    stderr: bool,
}

#[derive(Debug, Clone)]
struct Syslog {
    path: PathBuf,
    socket: Arc<UnixDatagram>,
}

/// Writes `line` and its newline to stderr in one `write`, so that the lines of hooks appending
/// to one file at once interleave whole. (`writeln!` and `eprintln!` on the unbuffered stderr
/// write the text and the newline separately: two prologs sharing a log file then glued one's
/// line onto the other's.)
pub fn stderr_line(line: &str) {
    let _ = write_line(&mut std::io::stderr().lock(), line);
}

fn write_line(out: &mut impl Write, line: &str) -> std::io::Result<()> {
    let mut whole = String::with_capacity(line.len() + 1);
    whole.push_str(line);
    whole.push('\n');
    out.write_all(whole.as_bytes())
}

impl Logger {
    /// stderr plus syslog at `socket` (`None`: stderr only). A socket that cannot be made is
    /// said once on stderr; the logger then writes to stderr only.
    pub fn new(socket: Option<&Path>) -> Logger {
        let syslog = socket.and_then(|path| match UnixDatagram::unbound() {
            Ok(s) => Some(Syslog { path: path.to_path_buf(), socket: Arc::new(s) }),
            Err(e) => {
                stderr_line(&format!("kace: log: {}", Error::Socket(e)));
                None
            }
        });
        Logger { syslog, stderr: true }
    }

    /// stderr plus [`DEFAULT_SOCKET`].
    pub fn system() -> Logger {
        Logger::new(Some(Path::new(DEFAULT_SOCKET)))
    }

    /// Syslog only: for a command whose stderr a person reads (the line is printed there
    /// already).
    pub fn without_stderr(mut self) -> Logger {
        self.stderr = false;
        self
    }

    /// Logs one event with the severity its text implies ([`Severity::of`]).
    pub fn line(&self, line: &str) {
        self.log(Severity::of(line), line);
    }

    /// Logs one event. Failing to reach syslog is not an error a hook can act on: the line is
    /// still on stderr, and the send error is not repeated per line (no syslog daemon on a
    /// test host is common).
    pub fn log(&self, severity: Severity, line: &str) {
        let line = clean(line);
        if self.stderr {
            stderr_line(&line);
        }
        if let Some(s) = &self.syslog {
            let _ = s.send(severity, &line);
        }
    }

    /// Sends one event to syslog only, saying whether it arrived (for `kace doctor` and tests).
    pub fn send(&self, severity: Severity, line: &str) -> Result<(), Error> {
        match &self.syslog {
            Some(s) => s.send(severity, &clean(line)),
            None => Ok(()),
        }
    }
}

impl Syslog {
    fn send(&self, severity: Severity, line: &str) -> Result<(), Error> {
        let datagram = datagram(severity, &local_timestamp(), std::process::id(), line);
        self.socket
            .send_to(datagram.as_bytes(), &self.path)
            .map(drop)
            .map_err(|source| Error::Send { path: self.path.clone(), source })
    }
}

/// The RFC 3164 datagram for one line: `<PRI>TIMESTAMP kace[PID]: MESSAGE`. The ident already
/// says `kace`, so a leading `kace: ` of the line is not repeated.
pub fn datagram(severity: Severity, timestamp: &str, pid: u32, line: &str) -> String {
    let message = line.strip_prefix("kace: ").unwrap_or(line);
    format!("<{}>{timestamp} {IDENT}[{pid}]: {message}", FACILITY_DAEMON | severity.code())
}

/// `line` with every control character written as `\xNN` (or `\u{…}` past U+00FF) and cut at
/// [`MAX_LINE`] bytes, on a character boundary, with `…` marking the cut.
pub fn clean(line: &str) -> Cow<'_, str> {
    if line.len() <= MAX_LINE && !line.chars().any(char::is_control) {
        return Cow::Borrowed(line);
    }
    let mut out = String::with_capacity(line.len().min(MAX_LINE + 8));
    for c in line.chars() {
        if out.len() >= MAX_LINE {
            out.push('…');
            break;
        }
        if c.is_control() {
            if (c as u32) < 0x100 {
                out.push_str(&format!("\\x{:02x}", c as u32));
            } else {
                out.push_str(&format!("\\u{{{:x}}}", c as u32));
            }
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// The local time as RFC 3164 writes it: `Dec  1 01:07:56` (day padded with a space).
fn local_timestamp() -> String {
    const MONTHS: [&str; 12] =
        ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    // SAFETY: time(NULL) only returns the clock; localtime_r writes into `tm`, which we own, and
    // is the thread-safe form.
    let tm = unsafe {
        let now = libc::time(std::ptr::null_mut());
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&now, &mut tm).is_null() {
            return "Jan  1 00:00:00".to_string();
        }
        tm
    };
    let month = MONTHS.get(tm.tm_mon as usize).copied().unwrap_or("Jan");
    format!("{month} {:>2} {:02}:{:02}:{:02}", tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Records each `write` call it gets.
    #[derive(Default)]
    struct Calls(Vec<Vec<u8>>);

    impl Write for Calls {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.push(buf.to_vec());
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_line_and_its_newline_are_one_write() {
        let mut out = Calls::default();
        write_line(&mut out, "kace: prolog: job 12: lead").unwrap();
        write_line(&mut out, "").unwrap();
        assert_eq!(out.0, vec![b"kace: prolog: job 12: lead\n".to_vec(), b"\n".to_vec()]);
        // What it replaces: writeln! hands the writer the text and the newline apart.
        let mut split = Calls::default();
        let text = String::from("kace: prolog: job 13: lead");
        writeln!(split, "{text}").unwrap();
        assert_eq!(split.0.len(), 2, "{:?}", split.0);
    }

    #[test]
    fn clean_escapes_control_characters_and_keeps_one_line() {
        let forged = "kace: prolog: job 7: workload \"a\nkace: prolog: released\x1b[31m\"";
        let c = clean(forged);
        assert_eq!(c, "kace: prolog: job 7: workload \"a\\x0akace: prolog: released\\x1b[31m\"");
        assert!(!c.contains('\n'));
        assert_eq!(clean("plain line"), Cow::Borrowed("plain line"));
        assert_eq!(clean("c1\u{85}del\u{7f}"), "c1\\x85del\\x7f");
    }

    #[test]
    fn clean_cuts_long_lines_on_a_character_boundary() {
        let long = "é".repeat(MAX_LINE);
        let c = clean(&long);
        assert!(c.len() <= MAX_LINE + '…'.len_utf8());
        assert!(c.ends_with('…'));
    }

    #[test]
    fn datagram_is_rfc3164_with_facility_daemon() {
        let d = datagram(Severity::Error, "Dec  1 01:07:56", 42, "kace: prolog: couldn't x: y");
        assert_eq!(d, "<27>Dec  1 01:07:56 kace[42]: prolog: couldn't x: y");
        assert!(
            datagram(Severity::Info, "T", 1, "dispatch: released").starts_with("<30>T kace[1]:")
        );
        assert!(datagram(Severity::Warning, "T", 1, "x").starts_with("<28>"));
    }

    #[test]
    fn severity_follows_the_log_style() {
        assert_eq!(Severity::of("kace: epilog: couldn't write the spool: EROFS"), Severity::Error);
        assert_eq!(Severity::of("kace: dispatch: released job 3"), Severity::Info);
    }

    #[test]
    fn timestamp_has_the_rfc3164_shape() {
        let t = local_timestamp();
        assert_eq!(t.len(), 15, "{t:?}");
        assert_eq!(&t[3..4], " ");
        assert_eq!(&t[9..10], ":");
    }

    /// A real datagram socket in the place of /dev/log: what a syslog daemon receives.
    #[test]
    fn lines_reach_a_syslog_socket_cleaned() {
        let dir = std::env::temp_dir().join(format!("kace-log-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("log");
        let server = UnixDatagram::bind(&path).unwrap();
        server.set_read_timeout(Some(Duration::from_secs(5))).unwrap();

        let logger = Logger::new(Some(&path)).without_stderr();
        logger.line("kace: prolog: job 9: couldn't read progress file: bad byte \u{7}\nforged");
        logger.log(Severity::Info, "kace: dispatch: released job 9 as a lead onto n1 GPU 0");

        let mut buf = [0u8; 8192];
        let n = server.recv(&mut buf).unwrap();
        let first = String::from_utf8_lossy(&buf[..n]).to_string();
        let n = server.recv(&mut buf).unwrap();
        let second = String::from_utf8_lossy(&buf[..n]).to_string();
        let pid = std::process::id();
        assert!(first.starts_with("<27>"), "{first}");
        assert!(
            first.ends_with(&format!(
                " kace[{pid}]: prolog: job 9: couldn't read progress file: bad byte \\x07\\x0aforged"
            )),
            "{first}"
        );
        assert!(second.starts_with("<30>"), "{second}");
        assert!(second.ends_with("dispatch: released job 9 as a lead onto n1 GPU 0"), "{second}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_missing_socket_is_an_error_for_send_and_silent_for_log() {
        let logger = Logger::new(Some(Path::new("/nonexistent/kace-test/log"))).without_stderr();
        logger.line("kace: prolog: nothing listens");
        match logger.send(Severity::Info, "x") {
            Err(Error::Send { path, .. }) => {
                assert_eq!(path, Path::new("/nonexistent/kace-test/log"))
            }
            other => panic!("expected a send error, got {other:?}"),
        }
        assert!(Logger::new(None).send(Severity::Info, "x").is_ok());
    }
}
