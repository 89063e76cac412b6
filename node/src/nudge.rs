//! Waking the decider. `kace-dispatch`, run by slurmctld as `PrologSlurmctld=` and
//! `EpilogSlurmctld=` when a kace job starts or ends, sends one datagram to the decider's Unix
//! socket (`dispatch.socket`) and returns: the decider passes at once, and slurmctld waits for
//! nothing. The gate (job_submit.lua) cannot open a socket; it rewrites `dispatch.submitted` on
//! each kace submission, and the decider looks at that file's time ten times a second (a
//! `stat`, no Slurm RPC). The decider's backstop (`dispatch.backstop_s`) covers a lost nudge.
//!
//! The socket is the decider's (root) with mode 0660 in its directory: slurmctld's scripts run
//! as SlurmUser, so a site whose SlurmUser is not root gives that directory SlurmUser's group
//! (packaging/kace.tmpfiles). A nudge carries nothing: whoever sends one can at most make the
//! decider pass sooner, and nudges that arrive during a pass make one more pass, not many.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use crate::error::{io, Result};

/// How often the gate's file is looked at while nothing else wakes the decider.
pub const SUBMITTED_POLL: Duration = Duration::from_millis(100);

/// Why the decider woke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// A nudge arrived on the socket.
    Nudged,
    /// The gate marked a submission.
    Submitted,
    /// The time asked for came.
    Timeout,
}

/// The decider's end: the bound socket and the gate's file.
#[derive(Debug)]
pub struct Listener {
    socket: UnixDatagram,
    path: PathBuf,
    submitted: PathBuf,
    seen: Option<SystemTime>,
}

impl Listener {
    /// Binds `socket` (replacing a stale socket left by an earlier decider: the caller holds
    /// the dispatch lock, so no other decider listens there) and notes the gate's file's time.
    pub fn bind(socket: &Path, submitted: &Path) -> Result<Listener> {
        if let Some(dir) = socket.parent() {
            std::fs::create_dir_all(dir).map_err(io("create the directory of", socket))?;
        }
        match std::fs::symlink_metadata(socket) {
            Ok(m) if m.file_type().is_socket() => {
                std::fs::remove_file(socket).map_err(io("remove the stale socket", socket))?
            }
            Ok(_) => {
                return Err(crate::Error::Parse {
                    what: socket.display().to_string(),
                    text: "exists and is not a socket; remove it or choose dispatch.socket".into(),
                })
            }
            Err(_) => {}
        }
        let s = UnixDatagram::bind(socket).map_err(io("bind", socket))?;
        std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o660))
            .map_err(io("set the mode of", socket))?;
        Ok(Listener {
            socket: s,
            path: socket.to_path_buf(),
            submitted: submitted.to_path_buf(),
            seen: mtime(submitted),
        })
    }

    /// Waits until a nudge arrives, the gate marks a submission, or `until`. Every nudge
    /// queued by then is taken: nudges sent during a pass wake the decider once.
    pub fn wait(&mut self, until: Instant) -> Wake {
        loop {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Wake::Timeout;
            }
            let slice = left.min(SUBMITTED_POLL);
            let _ = self.socket.set_read_timeout(Some(slice));
            let mut buf = [0u8; 16];
            if self.socket.recv(&mut buf).is_ok() {
                self.drain();
                return Wake::Nudged;
            }
            let now = mtime(&self.submitted);
            if now.is_some() && now != self.seen {
                self.seen = now;
                return Wake::Submitted;
            }
        }
    }

    fn drain(&self) {
        let _ = self.socket.set_nonblocking(true);
        let mut buf = [0u8; 16];
        while self.socket.recv(&mut buf).is_ok() {}
        let _ = self.socket.set_nonblocking(false);
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn mtime(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

/// Sends one nudge to the decider listening on `socket`. An error means no decider listens
/// there (no socket, or nobody bound to it).
pub fn nudge(socket: &Path) -> std::io::Result<()> {
    let s = UnixDatagram::unbound()?;
    s.send_to(b"!", socket).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nudge_or_the_gates_file_wakes_the_listener_and_nudges_coalesce() {
        let dir = std::env::temp_dir().join(format!("kace-nudge-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("d.sock");
        let submitted = dir.join("submitted");
        assert!(nudge(&sock).is_err(), "nobody listens yet");
        let mut l = Listener::bind(&sock, &submitted).unwrap();
        let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o660);
        let soon = || Instant::now() + Duration::from_millis(300);
        assert_eq!(l.wait(soon()), Wake::Timeout);
        for _ in 0..5 {
            nudge(&sock).unwrap();
        }
        assert_eq!(l.wait(soon()), Wake::Nudged);
        assert_eq!(l.wait(soon()), Wake::Timeout, "five nudges wake it once");
        std::fs::write(&submitted, "").unwrap();
        assert_eq!(l.wait(Instant::now() + Duration::from_secs(2)), Wake::Submitted);
        drop(l);
        assert!(!sock.exists(), "the socket goes with its listener");
        // A stale socket (a decider that died) is replaced; anything else is refused.
        let stale = UnixDatagram::bind(&sock).unwrap();
        drop(stale);
        let l = Listener::bind(&sock, &submitted).unwrap();
        drop(l);
        std::fs::write(&sock, "not a socket").unwrap();
        assert!(Listener::bind(&sock, &submitted).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
