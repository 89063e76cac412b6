//! The MPS control daemon of one GPU, behind the [`MpsControl`] trait. [`NvidiaMps`] drives
//! `nvidia-cuda-mps-control` the way NVIDIA documents it: `-d` starts the daemon, commands such
//! as `start_server -uid N`, `get_server_list` and `quit` go to it on standard input, and the
//! environment names its pipe and log directories and the GPU.
//!
//! A job's MPS clients are ended the way NVIDIA's MPS guide asks ("Client Early Termination"):
//! `terminate_client <server PID> <client PID>` first, so that the server drops the client's
//! outstanding GPU work, and only then may the process die; a client killed with work still
//! queued can leave the server and its other clients (the job's partners) hung. See
//! [`end_job_clients`].

use std::path::PathBuf;
use std::time::{Duration, Instant};

use kace_layout::{GpuIndex, MpsDirs};

use crate::error::{io, Result};
use crate::exec::{self, Invocation};

/// Starting and stopping one GPU's MPS control daemon.
pub trait MpsControl {
    /// Whether a control daemon answers on these directories.
    fn running(&self, dirs: &MpsDirs) -> bool;
    /// Starts the control daemon for `gpu` and a server for user `uid` ([`server_uid`]: the
    /// job's user, or with `multi_user` the service account); `multi_user` starts the daemon
    /// with `-M` (one server for every user: `mps.multi_user`).
    fn start(&self, dirs: &MpsDirs, gpu: GpuIndex, uid: u32, multi_user: bool) -> Result<()>;
    /// Stops the control daemon (and its server).
    fn quit(&self, dirs: &MpsDirs) -> Result<()>;
    /// Every client of every server of this daemon, as `(server PID, client PID)`.
    fn clients(&self, _dirs: &MpsDirs) -> Result<Vec<(u32, u32)>> {
        Ok(Vec::new())
    }
    /// `terminate_client <server> <client>`: the server drops the client's outstanding work.
    fn terminate_client(&self, _dirs: &MpsDirs, _server: u32, _client: u32) -> Result<()> {
        Ok(())
    }
}

/// Tells whether process `pid` belongs to job `job` of user `uid`.
pub trait JobOfProcess {
    /// Whether `pid` is one of the job's processes.
    fn belongs(&self, pid: u32, job: u32, uid: u32) -> bool;
}

/// Reads `/proc` (or a stand-in root in tests): a process belongs to a job when it runs as the
/// job's user and its environment holds `SLURM_JOB_ID=<job>`, which slurmstepd gives every task.
/// The user check means a process claiming another's job id can only be its own user's.
#[derive(Debug, Clone)]
pub struct ProcFs {
    /// `/proc`.
    pub root: PathBuf,
}

impl JobOfProcess for ProcFs {
    fn belongs(&self, pid: u32, job: u32, uid: u32) -> bool {
        use std::io::Read;
        use std::os::unix::fs::MetadataExt;
        let dir = self.root.join(pid.to_string());
        if std::fs::metadata(&dir).map(|m| m.uid()).ok() != Some(uid) {
            return false;
        }
        let mut environ = Vec::new();
        let read = std::fs::File::open(dir.join("environ"))
            .and_then(|f| f.take(1 << 20).read_to_end(&mut environ));
        let want = format!("SLURM_JOB_ID={job}");
        read.is_ok() && environ.split(|b| *b == 0).any(|v| v == want.as_bytes())
    }
}

/// Ends the MPS clients of `job` on one GPU in NVIDIA's order: `terminate_client` for each, then
/// waits (until `deadline`) for them to leave the server's list. Returns the clients ended;
/// errors of single clients are in the messages, the others still go on.
pub fn end_job_clients(
    mps: &dyn MpsControl,
    procs: &dyn JobOfProcess,
    dirs: &MpsDirs,
    job: u32,
    uid: u32,
    deadline: Instant,
) -> (Vec<u32>, Vec<String>) {
    let mut problems = Vec::new();
    let mine = |list: Vec<(u32, u32)>| -> Vec<(u32, u32)> {
        list.into_iter().filter(|(_, c)| procs.belongs(*c, job, uid)).collect()
    };
    let ours = match mps.clients(dirs) {
        Ok(l) => mine(l),
        Err(e) => return (Vec::new(), vec![format!("couldn't list MPS clients: {e}")]),
    };
    let mut ended = Vec::new();
    for (server, client) in &ours {
        match mps.terminate_client(dirs, *server, *client) {
            Ok(()) => ended.push(*client),
            Err(e) => problems.push(format!("couldn't terminate MPS client {client}: {e}")),
        }
    }
    while !ended.is_empty() && Instant::now() < deadline {
        match mps.clients(dirs) {
            Ok(l) if l.iter().all(|(_, c)| !ended.contains(c)) => return (ended, problems),
            Ok(_) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => {
                problems.push(format!("couldn't list MPS clients: {e}"));
                break;
            }
        }
    }
    if !ended.is_empty() && Instant::now() >= deadline {
        problems.push("terminated clients still listed at the deadline".into());
    }
    (ended, problems)
}

/// The real control program (or a stand-in at the same configured path).
#[derive(Debug, Clone)]
pub struct NvidiaMps {
    /// `nvidia-cuda-mps-control`, by absolute path.
    pub program: PathBuf,
    /// Per-call timeout.
    pub timeout: Duration,
    /// No call runs past this (the prolog's budget).
    pub deadline: Option<Instant>,
}

impl NvidiaMps {
    fn timeout(&self) -> Duration {
        match self.deadline {
            Some(d) => self.timeout.min(d.saturating_duration_since(Instant::now())),
            None => self.timeout,
        }
    }

    fn invocation(&self, dirs: &MpsDirs, args: &[&str]) -> Invocation {
        Invocation::new(&self.program, args.iter().copied())
            .env("CUDA_MPS_PIPE_DIRECTORY", &dirs.pipe)
            .env("CUDA_MPS_LOG_DIRECTORY", &dirs.log)
    }
}

impl MpsControl for NvidiaMps {
    fn running(&self, dirs: &MpsDirs) -> bool {
        if !dirs.pipe.is_dir() {
            return false;
        }
        // The control client exits non-zero when no daemon listens on the pipe directory.
        let inv = self.invocation(dirs, &[]).stdin("get_server_list\n");
        exec::run(&inv, self.timeout()).is_ok_and(|o| o.success())
    }

    fn start(&self, dirs: &MpsDirs, gpu: GpuIndex, uid: u32, multi_user: bool) -> Result<()> {
        for d in [&dirs.pipe, &dirs.log] {
            std::fs::create_dir_all(d).map_err(io("create MPS directory", d))?;
            // The daemon runs as root with its pipes here: a directory a user could change is
            // refused.
            kace_layout::trusted_dir::ensure_trusted_dir(d)
                .map_err(|e| io("use MPS directory", d)(std::io::Error::other(e)))?;
        }
        // -d daemonises: the call returns once the daemon is up, and it leaves our process
        // group, so the prolog's own cleanup does not touch it.
        let args: &[&str] = if multi_user { &["-d", "-M"] } else { &["-d"] };
        let daemon = self.invocation(dirs, args).env("CUDA_VISIBLE_DEVICES", gpu.0.to_string());
        exec::run_ok(&daemon, self.timeout())?;
        // Starting the job user's server now, not at the first CUDA call, keeps that start-up
        // out of the job's first steps.
        let server = self.invocation(dirs, &[]).stdin(&format!("start_server -uid {uid}\n"));
        exec::run_ok(&server, self.timeout())?;
        Ok(())
    }

    fn quit(&self, dirs: &MpsDirs) -> Result<()> {
        let inv = self.invocation(dirs, &[]).stdin("quit\n");
        exec::run_ok(&inv, self.timeout())?;
        Ok(())
    }

    fn clients(&self, dirs: &MpsDirs) -> Result<Vec<(u32, u32)>> {
        if !dirs.pipe.is_dir() {
            return Ok(Vec::new());
        }
        let servers =
            exec::run_ok(&self.invocation(dirs, &[]).stdin("get_server_list\n"), self.timeout())?;
        let mut out = Vec::new();
        for server in pids(&servers) {
            let inv = self.invocation(dirs, &[]).stdin(&format!("get_client_list {server}\n"));
            let clients = exec::run_ok(&inv, self.timeout())?;
            out.extend(pids(&clients).into_iter().map(|c| (server, c)));
        }
        Ok(out)
    }

    fn terminate_client(&self, dirs: &MpsDirs, server: u32, client: u32) -> Result<()> {
        let inv =
            self.invocation(dirs, &[]).stdin(&format!("terminate_client {server} {client}\n"));
        exec::run_ok(&inv, self.timeout())?;
        Ok(())
    }
}

/// The uid of account `name` from the system's user database (`getpwnam_r`: files, LDAP, SSSD,
/// whatever NSS is configured with). `None` when there is no such account or it cannot be read.
pub fn account_uid(name: &str) -> Option<u32> {
    let c = std::ffi::CString::new(name).ok()?;
    let mut buf = vec![0u8; 16 * 1024];
    // SAFETY: all-zero is a valid `passwd` (null pointers, zero ids); it is only read after
    // getpwnam_r filled it.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut out: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: `c` is NUL-terminated, `buf` outlives the call and its length is passed, and
    // `pw`/`out` are valid for writes; the strings written into `buf` are not used.
    let rc = unsafe {
        libc::getpwnam_r(c.as_ptr(), &mut pw, buf.as_mut_ptr().cast(), buf.len(), &mut out)
    };
    (rc == 0 && !out.is_null()).then_some(pw.pw_uid)
}

/// Whom a GPU's MPS server is started for. Without `multi_user` it is the job's user (MPS then
/// serves only that user's clients, so kace pairs only that user's jobs). With it, the
/// configured service account `server_user`, never a job's user: a `-M` server serves every
/// user's clients, and its owner could kill or ptrace it and with it every client's work (the
/// re-audit's M3). Refused when the account is unknown, is root, or is the job's own user.
pub fn server_uid(
    multi_user: bool,
    server_user: &str,
    job_uid: u32,
) -> std::result::Result<u32, String> {
    if !multi_user {
        return Ok(job_uid);
    }
    match account_uid(server_user) {
        None => Err(format!("mps.server_user {server_user:?} is no account on this node")),
        Some(0) => Err(format!("mps.server_user {server_user:?} is root here")),
        Some(u) if u == job_uid => Err(format!(
            "the job runs as mps.server_user {server_user:?}, the account that owns the shared server"
        )),
        Some(u) => Ok(u),
    }
}

/// The PIDs in the control program's answer: one per line; anything else is ignored.
fn pids(text: &str) -> Vec<u32> {
    text.lines().filter_map(|l| l.trim().parse().ok()).filter(|p| *p > 0).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    /// A control daemon whose server 100 has clients 7 (the job's), 8 (its partner's) and 9 (the
    /// job's, but another user's: a forged job id); it records every command.
    struct Recording {
        clients: RefCell<Vec<(u32, u32)>>,
        calls: RefCell<Vec<String>>,
    }

    impl MpsControl for Recording {
        fn running(&self, _: &MpsDirs) -> bool {
            true
        }
        fn start(&self, _: &MpsDirs, _: GpuIndex, _: u32, _: bool) -> Result<()> {
            Ok(())
        }
        fn quit(&self, _: &MpsDirs) -> Result<()> {
            self.calls.borrow_mut().push("quit".into());
            Ok(())
        }
        fn clients(&self, _: &MpsDirs) -> Result<Vec<(u32, u32)>> {
            self.calls.borrow_mut().push("get_client_list".into());
            Ok(self.clients.borrow().clone())
        }
        fn terminate_client(&self, _: &MpsDirs, server: u32, client: u32) -> Result<()> {
            self.calls.borrow_mut().push(format!("terminate_client {server} {client}"));
            self.clients.borrow_mut().retain(|(_, c)| *c != client);
            Ok(())
        }
    }

    /// The re-audit's M3: with `mps.multi_user` the server was started for the lead's uid,
    /// whose user then owned the process serving another user's job.
    #[test]
    fn a_shared_server_runs_as_the_service_account_never_a_jobs_user() {
        assert_eq!(server_uid(false, "", 1000), Ok(1000));
        assert_eq!(account_uid("nobody"), Some(65534));
        assert_eq!(server_uid(true, "nobody", 1000), Ok(65534));
        let e = server_uid(true, "nobody", 65534).unwrap_err();
        assert!(e.contains("the job runs as mps.server_user"), "{e}");
        let e = server_uid(true, "root", 1000).unwrap_err();
        assert!(e.contains("is root here"), "{e}");
        let e = server_uid(true, "kace-no-such-account", 1000).unwrap_err();
        assert!(e.contains("is no account on this node"), "{e}");
        assert_eq!(account_uid("a\0b"), None);
    }

    struct Owners;
    impl JobOfProcess for Owners {
        fn belongs(&self, pid: u32, job: u32, uid: u32) -> bool {
            matches!((pid, job, uid), (7, 42, 1000))
        }
    }

    #[test]
    fn only_the_jobs_clients_are_terminated_and_awaited() {
        let mps = Recording {
            clients: RefCell::new(vec![(100, 7), (100, 8), (100, 9)]),
            calls: RefCell::new(Vec::new()),
        };
        let dirs = kace_layout::mps_dirs(std::path::Path::new("/x"), GpuIndex(0));
        let deadline = Instant::now() + Duration::from_secs(2);
        let (ended, problems) = end_job_clients(&mps, &Owners, &dirs, 42, 1000, deadline);
        assert_eq!((ended, problems), (vec![7], Vec::<String>::new()));
        assert_eq!(
            mps.calls.borrow().as_slice(),
            ["get_client_list", "terminate_client 100 7", "get_client_list"]
        );
        assert_eq!(mps.clients.borrow().as_slice(), [(100, 8), (100, 9)]);
    }

    #[test]
    fn a_job_is_known_by_its_user_and_slurm_job_id_in_proc() {
        let root = kace_test_support::TempDir::new("procfs");
        std::fs::create_dir_all(root.join("7")).unwrap();
        std::fs::write(root.join("7/environ"), b"HOME=/x\0SLURM_JOB_ID=42\0PATH=/bin\0").unwrap();
        let me = {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata(root.join("7")).unwrap().uid()
        };
        let procs = ProcFs { root: root.path().to_path_buf() };
        assert!(procs.belongs(7, 42, me));
        assert!(!procs.belongs(7, 4, me), "SLURM_JOB_ID=42 is not job 4");
        assert!(!procs.belongs(7, 42, me + 1), "another user's process");
        assert!(!procs.belongs(8, 42, me), "no such process");
        assert_eq!(pids("1234\n\n 99 \nserver gone\n0\n"), vec![1234, 99]);
    }
}
