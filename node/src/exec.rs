//! Running an external program the way a root prolog must: by absolute path, with its own
//! timeout, killed (with everything it started) when the timeout passes, output bounded.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::error::ExecError;

/// Most bytes kept of a program's stdout or stderr (squeue for 10 000 jobs is far below).
pub const MAX_OUTPUT: u64 = 8 * 1024 * 1024;

/// How often a running program is checked for exit.
const POLL: Duration = Duration::from_millis(2);

/// How long its output pipes may stay open after it exited, at least.
const GRACE: Duration = Duration::from_millis(50);

/// What a finished program left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    /// Exit code (`None` when killed by a signal).
    pub code: Option<i32>,
    /// Standard output, lossily decoded.
    pub stdout: String,
    /// Standard error, lossily decoded.
    pub stderr: String,
}

impl Output {
    /// Whether it exited 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

/// One invocation: program, arguments, extra environment, optional standard input.
#[derive(Debug, Clone)]
pub struct Invocation {
    /// The program, by absolute path.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Variables added to (or replacing in) the inherited environment.
    pub env: Vec<(OsString, OsString)>,
    /// Bytes written to its standard input (then closed); `None` gives it /dev/null.
    pub stdin: Option<Vec<u8>>,
}

impl Invocation {
    /// `program args…` with the inherited environment and no input.
    pub fn new<I, S>(program: &Path, args: I) -> Invocation
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        Invocation {
            program: program.to_path_buf(),
            args: args.into_iter().map(Into::into).collect(),
            env: Vec::new(),
            stdin: None,
        }
    }

    /// Adds an environment variable.
    pub fn env(mut self, key: &str, value: impl Into<OsString>) -> Invocation {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Feeds `input` on standard input.
    pub fn stdin(mut self, input: &str) -> Invocation {
        self.stdin = Some(input.as_bytes().to_vec());
        self
    }

    /// The command line, for messages.
    pub fn shown(&self) -> String {
        let mut s = self.program.display().to_string();
        for a in &self.args {
            s.push(' ');
            s.push_str(&a.to_string_lossy());
        }
        s
    }
}

/// Runs `inv`, waiting at most `timeout`. The program runs in its own process group, and on
/// timeout the whole group gets SIGKILL, so a hanging `scontrol` or a stuck helper it forked
/// cannot outlive the prolog.
pub fn run(inv: &Invocation, timeout: Duration) -> Result<Output, ExecError> {
    let shown = inv.shown();
    if !inv.program.is_absolute() {
        return Err(ExecError::NotAbsolute { program: inv.program.clone() });
    }
    let mut cmd = Command::new(&inv.program);
    cmd.args(&inv.args)
        .envs(inv.env.iter().map(|(k, v)| (k, v)))
        .stdin(if inv.stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = cmd
        .spawn()
        .map_err(|e| ExecError::Spawn { command: shown.clone(), cause: e.to_string() })?;
    let pid = child.id();
    if let (Some(input), Some(mut pipe)) = (inv.stdin.clone(), child.stdin.take()) {
        // A separate thread: a program that does not read its input must not block us.
        thread::spawn(move || {
            let _ = pipe.write_all(&input);
        });
    }
    let reader = |pipe: Option<Box<dyn Read + Send>>| {
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(p) = pipe {
                let _ = p.take(MAX_OUTPUT).read_to_end(&mut buf);
            }
            let _ = tx.send(buf);
        });
        rx
    };
    let out = reader(child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let err = reader(child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() >= deadline => {
                kill_group(pid);
                let _ = child.wait();
                return Err(ExecError::Timeout { command: shown, after: timeout });
            }
            Ok(None) => thread::sleep(POLL),
            Err(e) => {
                kill_group(pid);
                let _ = child.wait();
                return Err(ExecError::Spawn { command: shown, cause: e.to_string() });
            }
        }
    };
    // A helper it left behind may still hold the pipes open: wait for them only until the
    // deadline, then end that helper's group. A daemon that detached itself properly (its own
    // session, its descriptors closed, as `nvidia-cuda-mps-control -d` does) is not affected.
    let collect = |rx: mpsc::Receiver<Vec<u8>>| {
        let left = deadline.saturating_duration_since(Instant::now()).max(GRACE);
        rx.recv_timeout(left).ok()
    };
    let (stdout, stderr) = match (collect(out), collect(err)) {
        (Some(o), Some(e)) => (o, e),
        _ => {
            kill_group(pid);
            return Err(ExecError::Timeout { command: shown, after: timeout });
        }
    };
    Ok(Output {
        code: status.code(),
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    })
}

/// Runs `inv` and requires exit 0; returns stdout.
pub fn run_ok(inv: &Invocation, timeout: Duration) -> Result<String, ExecError> {
    let out = run(inv, timeout)?;
    if out.success() {
        Ok(out.stdout)
    } else {
        Err(ExecError::Failed {
            command: inv.shown(),
            code: out.code,
            stderr: out.stderr.trim().chars().take(500).collect(),
        })
    }
}

fn kill_group(pid: u32) {
    if let Ok(pid) = i32::try_from(pid) {
        if pid > 0 {
            // SAFETY: kill has no memory preconditions; -pid names the group we created for
            // this child (process_group(0) made its pid the group id), never anything else.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Invocation {
        Invocation::new(Path::new("/bin/sh"), ["-c", script])
    }

    #[test]
    fn output_and_exit_code_come_back() {
        let out = run(&sh("echo out; echo err >&2; exit 3"), Duration::from_secs(5)).unwrap();
        assert_eq!(
            (out.code, out.stdout.as_str(), out.stderr.as_str()),
            (Some(3), "out\n", "err\n")
        );
        let e = run_ok(&sh("exit 4"), Duration::from_secs(5)).unwrap_err();
        assert!(e.to_string().contains("exited with 4"), "{e}");
    }

    #[test]
    fn stdin_and_env_reach_the_program() {
        let inv = sh("read line; echo \"$line $KACE_X\"").env("KACE_X", "y").stdin("quit\n");
        assert_eq!(run_ok(&inv, Duration::from_secs(5)).unwrap(), "quit y\n");
    }

    #[test]
    fn a_hanging_program_and_its_children_are_killed_at_the_timeout() {
        let started = Instant::now();
        // The background sleep keeps stdout open: only killing the group ends the wait.
        let e = run(&sh("sleep 30 & sleep 30"), Duration::from_millis(200)).unwrap_err();
        assert!(matches!(e, ExecError::Timeout { .. }), "{e}");
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    }

    #[test]
    fn missing_and_relative_programs_are_errors() {
        let e = run(
            &Invocation::new(Path::new("/nonexistent/scontrol"), ["x"]),
            Duration::from_secs(1),
        )
        .unwrap_err();
        assert!(matches!(e, ExecError::Spawn { .. }), "{e}");
        let e = run(&Invocation::new(Path::new("scontrol"), ["x"]), Duration::from_secs(1))
            .unwrap_err();
        assert!(matches!(e, ExecError::NotAbsolute { .. }), "{e}");
    }
}
