//! Ending a profiled workload together with everything it started: a timed-out
//! `kace profile run -- bash train.sh` must not leave `python train.py` running on the GPU.
//!
//! Why not a process group (as the prolog's `exec` does): `kace profile run` is interactive, and
//! a child in its own group no longer receives the terminal's Ctrl-C, so interrupting kace would
//! leave the workload running. The workload therefore stays in kace's group and is ended by
//! walking `/proc` for its descendants. Each round stops (SIGSTOP) every descendant found, so
//! none can fork or be re-parented while the tree is read, until a round finds nothing new;
//! then all are killed. A process that detaches itself (double fork, setsid) before the walk
//! escapes, as it would a group kill. On systems without `/proc` only the direct child is
//! killed.

use std::collections::BTreeSet;
use std::process::Child;

/// The direct children of every process, read from `/proc/<pid>/stat` (`ppid` is field 4,
/// after the parenthesised command name, which may itself hold spaces and parentheses).
fn parent_links() -> Vec<(i32, i32)> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(|e| {
        let pid: i32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let after_name = &stat[stat.rfind(')')? + 1..];
        let ppid: i32 = after_name.split_whitespace().nth(1)?.parse().ok()?;
        Some((pid, ppid))
    })
    .collect()
}

fn signal(pid: i32, sig: libc::c_int) {
    if pid > 1 {
        // SAFETY: kill has no memory preconditions; `pid` is a positive pid read from /proc
        // as a descendant of our own child (never 0, -1 or a group).
        unsafe { libc::kill(pid, sig) };
    }
}

/// The descendants of `root` (not `root` itself) in one snapshot of the parent links.
fn descendants(root: i32, links: &[(i32, i32)]) -> BTreeSet<i32> {
    let mut out = BTreeSet::new();
    let mut frontier = vec![root];
    while let Some(p) = frontier.pop() {
        for &(child, parent) in links {
            if parent == p && child != root && out.insert(child) {
                frontier.push(child);
            }
        }
    }
    out
}

/// Every current descendant of `root`, each stopped.
fn stop_descendants(root: i32) -> BTreeSet<i32> {
    let mut found: BTreeSet<i32> = BTreeSet::new();
    // Each round stops what it finds, so a round finding nothing new means the tree is frozen;
    // ten rounds are plenty for any real launcher.
    for _ in 0..10 {
        let new: Vec<i32> =
            descendants(root, &parent_links()).into_iter().filter(|p| !found.contains(p)).collect();
        if new.is_empty() {
            break;
        }
        for pid in new {
            signal(pid, libc::SIGSTOP);
            found.insert(pid);
        }
    }
    found
}

/// Kills `child` and all its descendants, and reaps `child`.
pub fn kill_tree(child: &mut Child) {
    let root = i32::try_from(child.id()).unwrap_or(0);
    if root > 1 {
        signal(root, libc::SIGSTOP);
        for pid in stop_descendants(root) {
            signal(pid, libc::SIGKILL);
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    /// Alive and not a zombie (a killed orphan may wait as a zombie for a slow init).
    fn running(pid: i32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| s[s.rfind(')')? + 1..].split_whitespace().next().map(str::to_string))
            .is_some_and(|state| state != "Z" && state != "X")
    }

    #[test]
    fn descendants_follow_parent_links_only() {
        let links = [(10, 1), (11, 10), (12, 11), (13, 1), (14, 12)];
        assert_eq!(descendants(10, &links), BTreeSet::from([11, 12, 14]));
        assert!(descendants(13, &links).is_empty());
    }

    #[test]
    fn a_shell_and_its_grandchildren_all_end() {
        if !std::path::Path::new("/proc/self/stat").exists() {
            eprintln!("skipping: no /proc");
            return;
        }
        let dir = kace_test_support::TempDir::new("tree");
        let pids = dir.join("pids");
        // Two levels below the shell: a sub-shell that starts a sleep.
        let script = format!(
            "sleep 300 & echo $! >> {p}; (sleep 300 & echo $! >> {p}; wait) & wait",
            p = pids.display()
        );
        let mut child =
            Command::new("sh").arg("-c").arg(script).stdout(Stdio::null()).spawn().unwrap();
        let started = Instant::now();
        let grandchildren: Vec<i32> = loop {
            let text = std::fs::read_to_string(&pids).unwrap_or_default();
            let v: Vec<i32> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
            if v.len() == 2 {
                break v;
            }
            assert!(started.elapsed() < Duration::from_secs(10), "the script did not start");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(grandchildren.iter().all(|p| running(*p)));
        kill_tree(&mut child);
        let deadline = Instant::now() + Duration::from_secs(5);
        while grandchildren.iter().any(|p| running(*p)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let left: Vec<&i32> = grandchildren.iter().filter(|p| running(**p)).collect();
        assert!(left.is_empty(), "still running: {left:?}");
    }
}
