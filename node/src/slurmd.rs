//! Whether the slurmd that runs this hook still lives. A prolog outlives a slurmd killed or
//! restarted meanwhile, and Slurm then never hears that it ended: the job stays "running,
//! reason Prolog" and runs nothing until an admin requeues it (`tests/tests/stuck_prolog.rs`).
//! Such a prolog must not send a joiner to its job's GPU, to wait beside a job that does not
//! run. [`ProcSlurmd`] finds the hook's slurmd among its ancestors in `/proc` when the hook
//! starts and later checks that the same process (pid and start time) is still there.

use std::path::Path;

/// The process that runs this hook.
pub trait HookHost {
    /// Whether the slurmd that started this hook still runs (true when there is none to watch).
    fn slurmd_alive(&self) -> bool;
    /// The watched slurmd's pid, for log lines.
    fn slurmd_pid(&self) -> Option<u32>;
}

/// The hook's slurmd, found in `/proc` by walking up from this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProcSlurmd {
    /// (pid, start time in clock ticks since boot) of the nearest ancestor named `slurmd`;
    /// `None` when there is none (run by hand, by a test, or by slurmstepd).
    found: Option<(u32, u64)>,
}

/// How far up the ancestry to look: slurmd, a site's wrapper script or two, the hook.
const MAX_DEPTH: usize = 8;

impl ProcSlurmd {
    /// Looks for the nearest `slurmd` among this process's ancestors.
    pub fn find() -> ProcSlurmd {
        ProcSlurmd::find_in(Path::new("/proc"), std::process::id())
    }

    /// Looks for the nearest `slurmd` among the ancestors of `pid` under the proc root `proc`.
    pub fn find_in(proc: &Path, pid: u32) -> ProcSlurmd {
        let mut at = pid;
        for _ in 0..MAX_DEPTH {
            let Some(stat) = read_stat(proc, at) else { break };
            if stat.ppid <= 1 {
                break;
            }
            let Some(parent) = read_stat(proc, stat.ppid) else { break };
            if parent.comm == "slurmd" {
                return ProcSlurmd { found: Some((stat.ppid, parent.start)) };
            }
            at = stat.ppid;
        }
        ProcSlurmd { found: None }
    }

    /// Whether the slurmd found under `proc` is still the same process.
    pub fn alive_in(&self, proc: &Path) -> bool {
        match self.found {
            None => true,
            Some((pid, start)) => {
                read_stat(proc, pid).is_some_and(|s| s.comm == "slurmd" && s.start == start)
            }
        }
    }
}

impl HookHost for ProcSlurmd {
    fn slurmd_alive(&self) -> bool {
        self.alive_in(Path::new("/proc"))
    }

    fn slurmd_pid(&self) -> Option<u32> {
        self.found.map(|f| f.0)
    }
}

/// The fields of `/proc/<pid>/stat` this needs.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stat {
    comm: String,
    ppid: u32,
    start: u64,
}

fn read_stat(proc: &Path, pid: u32) -> Option<Stat> {
    let text = std::fs::read_to_string(proc.join(pid.to_string()).join("stat")).ok()?;
    parse_stat(&text)
}

/// Parses `pid (comm) state ppid … starttime …`: `comm` may hold spaces and parentheses, so
/// the fields after it are counted from the last `)`.
fn parse_stat(text: &str) -> Option<Stat> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text.get(open + 1..close)?.to_string();
    let rest: Vec<&str> = text.get(close + 1..)?.split_whitespace().collect();
    // After the comm: state (field 3), ppid (4), …, starttime (22).
    let ppid = rest.get(1)?.parse().ok()?;
    let start = rest.get(19)?.parse().ok()?;
    Some(Stat { comm, ppid, start })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kace_test_support::TempDir;

    fn stat(pid: u32, comm: &str, ppid: u32, start: u64) -> String {
        format!(
            "{pid} ({comm}) S {ppid} {pid} {pid} 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 {start} \
             1000 10 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n"
        )
    }

    fn write(proc: &Path, pid: u32, text: &str) {
        std::fs::create_dir_all(proc.join(pid.to_string())).unwrap();
        std::fs::write(proc.join(pid.to_string()).join("stat"), text).unwrap();
    }

    #[test]
    fn stat_is_read_past_a_comm_with_spaces_and_parentheses() {
        let s = parse_stat(&stat(42, "a) b (c", 7, 123_456)).unwrap();
        assert_eq!(s, Stat { comm: "a) b (c".into(), ppid: 7, start: 123_456 });
        assert_eq!(parse_stat("42 (x"), None);
        assert_eq!(parse_stat("42 (x) S"), None);
    }

    #[test]
    fn the_slurmd_above_a_wrapper_is_watched_until_it_is_gone_or_replaced() {
        let t = TempDir::new("slurmd-proc");
        let proc = t.path();
        write(proc, 100, &stat(100, "slurmd", 1, 5000));
        write(proc, 200, &stat(200, "bash", 100, 6000));
        write(proc, 300, &stat(300, "kace-prolog", 200, 6001));
        let s = ProcSlurmd::find_in(proc, 300);
        assert_eq!(s.slurmd_pid(), Some(100));
        assert!(s.alive_in(proc));
        // Restarted: the same pid number, another process.
        write(proc, 100, &stat(100, "slurmd", 1, 9000));
        assert!(!s.alive_in(proc));
        // Killed.
        std::fs::remove_dir_all(proc.join("100")).unwrap();
        assert!(!s.alive_in(proc));
    }

    #[test]
    fn without_a_slurmd_above_there_is_nothing_to_watch() {
        let t = TempDir::new("slurmd-none");
        let proc = t.path();
        // Reparented to init after its slurmd died before it started, or run by hand.
        write(proc, 300, &stat(300, "kace-prolog", 1, 6001));
        let s = ProcSlurmd::find_in(proc, 300);
        assert_eq!(s.slurmd_pid(), None);
        assert!(s.alive_in(proc));
        assert!(ProcSlurmd::find().slurmd_alive(), "cargo test runs under no slurmd");
    }
}
