//! What the decider remembers between passes and across its own restarts, in
//! `dispatch.state_dir` (root's, 0700): the GPUs of the kace jobs on GPUs (read from Slurm once
//! per job: an allocation does not change), the releases it began and has not finished (a pass
//! that ended between `scontrol update` and `scontrol release`), and how many Slurm commands of
//! each kind it ran, minute by minute (`kace metrics`, `kace doctor --controller`).
//!
//! One JSON file, `state.json`, replaced atomically after each pass that changed it. An
//! unreadable file is set aside as `state.json.bad` and the decider starts empty: it reads the
//! GPUs again and finds begun releases by their pins ([`crate::dispatch`]).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{io, Error, Result};
use crate::slurm::CommandKind;

/// The file's name in `dispatch.state_dir`.
pub const FILE: &str = "state.json";

/// At most this many bytes are read of the file (ten thousands of running jobs fit).
const MAX_BYTES: u64 = 16 << 20;

/// How many minutes of command counts are kept.
pub const MINUTES_KEPT: usize = 60;

/// Where a begun release was going.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Begun {
    /// The node it is pinned to.
    pub node: String,
    /// The GPU type it is pinned to, when typed.
    pub kind: Option<String>,
    /// Its shards.
    pub shards: u32,
}

/// Slurm commands of each kind run in one minute, and its slowest pass.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Minute {
    /// Unix minute (seconds / 60).
    pub minute: u64,
    /// Commands by [`CommandKind::name`].
    pub commands: BTreeMap<String, u64>,
    /// The RPCs those commands made.
    pub rpcs: u64,
    /// The slowest pass that began in this minute, seconds.
    #[serde(default)]
    pub slowest_pass_s: f64,
}

/// The decider's memory.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeciderState {
    /// A kace job on a GPU, or released onto one it alone can land on → (its node, the
    /// indices of its GPUs there).
    pub gpus: BTreeMap<u32, (String, Vec<u32>)>,
    /// Releases begun and not finished, by job.
    pub begun: BTreeMap<u32, Begun>,
    /// Commands since the decider's state began, by kind name.
    pub commands_total: BTreeMap<String, u64>,
    /// The last [`MINUTES_KEPT`] minutes' counts, oldest first.
    pub minutes: Vec<Minute>,
    /// Jobs handed back to Slurm (unpinned, a whole GPU's shards): never held again by kace.
    #[serde(default)]
    pub handed_back: BTreeSet<u32>,
    /// Jobs held again after Slurm kept them pending for a policy reason → until when (Unix
    /// seconds) they are not released again, so that a limit that holds is not met each pass.
    #[serde(default)]
    pub resting: BTreeMap<u32, f64>,
    /// Released jobs first seen pending for a policy reason → when (Unix seconds): held again
    /// only once it lasts (`dispatch::POLICY_GRACE_S`).
    #[serde(default)]
    pub policy_seen: BTreeMap<u32, f64>,
    /// Requeued jobs held again → the restart count that was dealt with.
    #[serde(default)]
    pub requeues: BTreeMap<u32, u32>,
    /// Jobs whose time limit kace lengthened for sharing → their limit before (seconds): the
    /// cap (`selection.time_limit_cap`) counts from it.
    #[serde(default)]
    pub own_limits: BTreeMap<u32, f64>,
    /// kace jobs on a GPU that take no joiner because their workload cannot be paired yet (no
    /// profile, or too few alone runs): said once each, not every pass (the re-audit's L6).
    #[serde(default)]
    pub unpaired_said: BTreeSet<u32>,
    /// Held jobs → how often a job of lower priority was released onto a GPU they could
    /// have taken (`selection.priority_window` bounds it; [`crate::dispatch`]).
    #[serde(default)]
    pub overtaken: BTreeMap<u32, u32>,
    /// Releases that passed over a held job of higher priority, since the state began
    /// (`kace metrics`' priority inversions).
    #[serde(default)]
    pub inversions_total: u64,
    /// Held jobs → when a job of lower priority was first released onto a GPU they could have
    /// taken; at their own release (or when they leave the queue) the time since is added to
    /// [`DeciderState::inversion_seconds_total`].
    #[serde(default)]
    pub passed_over_since: BTreeMap<u32, f64>,
    /// Seconds jobs waited, since the state began, after a job of lower priority was released
    /// ahead of them (`kace metrics`' priority inversion time; issue 29 item 2).
    #[serde(default)]
    pub inversion_seconds_total: f64,
    /// The nodes and when they were read (Unix seconds), in this process only.
    #[serde(skip)]
    pub nodes: Option<(f64, Vec<crate::slurm::NodeGpus>)>,
    /// When a pass last saw a kace job on (or on its way to) each GPU, node and index, in this
    /// process only: a GPU the nodes' reading shows in use is another job's only when no kace
    /// job was seen there since that reading (it may be a kace job that has left since).
    #[serde(skip)]
    pub kace_seen: BTreeMap<(String, u32), f64>,
    /// The priority factors and when they were read, in this process only.
    #[serde(skip)]
    pub priority: Option<(f64, crate::priority::PriorityInputs)>,
    /// The site's QOS and association limits and when they were read, in this process only.
    #[serde(skip)]
    pub limits: Option<(f64, crate::limits::Limits)>,
    /// Held jobs a limit keeps back, with the reason last said (said once per reason, not
    /// every pass).
    #[serde(default)]
    pub limit_said: BTreeMap<u32, String>,
    /// Workloads → the exploratory groups they were released into
    /// (`selection.explore_pairs` bounds them; [`crate::dispatch`]). Kept while the decider's
    /// state lasts: a workload the model has learnt is no longer explored, whatever its count;
    /// a state set aside as unreadable starts the counts again.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub explored: BTreeMap<String, u32>,
    /// Jobs released with an SM share (`mps.sm_split`) → that share, while on a GPU: the
    /// joiner's split chooser assumes the running job has none, so none is chosen beside one.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub thread_pcts: BTreeMap<u32, u8>,
    /// Passes since the state began, and the seconds they took together (`kace metrics`: how
    /// long a nudge waits for its pass grows with it).
    #[serde(default)]
    pub passes_total: u64,
    /// See [`DeciderState::passes_total`].
    #[serde(default)]
    pub pass_seconds_total: f64,
}

impl DeciderState {
    /// The state in `dir`; empty when there is none. An unreadable one is set aside (and said
    /// in the returned note) so that the decider starts clean instead of failing every pass.
    pub fn load(dir: &Path) -> (DeciderState, Option<String>) {
        let path = dir.join(FILE);
        let text = match read_bounded(&path) {
            Ok(Some(t)) => t,
            Ok(None) => return (DeciderState::default(), None),
            Err(e) => return (DeciderState::default(), Some(e.to_string())),
        };
        match serde_json::from_str(&text) {
            Ok(s) => (s, None),
            Err(e) => {
                let bad = dir.join(format!("{FILE}.bad"));
                let _ = std::fs::rename(&path, &bad);
                let note = format!(
                    "couldn't read {}: {e}; set it aside as {} and started empty",
                    path.display(),
                    bad.display()
                );
                (DeciderState::default(), Some(note))
            }
        }
    }

    /// The state in `dir` for a reader (`kace status`, `kace metrics`, `kace doctor`): nothing
    /// is set aside. `Ok(None)` when there is none.
    pub fn peek(dir: &Path) -> std::result::Result<Option<DeciderState>, String> {
        let path = dir.join(FILE);
        match read_bounded(&path).map_err(|e| e.to_string())? {
            None => Ok(None),
            Some(text) => serde_json::from_str(&text)
                .map(Some)
                .map_err(|e| format!("couldn't read {}: {e}", path.display())),
        }
    }

    /// Writes the state to `dir` atomically (creating `dir`, root-only).
    pub fn save(&self, dir: &Path) -> Result<()> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io("create", dir))?;
        let body = serde_json::to_vec(self).map_err(|e| Error::Parse {
            what: "the decider's state".into(),
            text: e.to_string(),
        })?;
        let tmp: PathBuf = dir.join(format!(".{FILE}.{}", std::process::id()));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)
            .map_err(io("create", &tmp))?;
        f.write_all(&body).map_err(io("write", &tmp))?;
        f.sync_all().map_err(io("sync", &tmp))?;
        let path = dir.join(FILE);
        std::fs::rename(&tmp, &path).map_err(io("rename into place", &path))
    }

    /// The nodes read at most `max_age_s` before `now`, if this process read them.
    pub fn fresh_nodes(&self, now: f64, max_age_s: f64) -> Option<Vec<crate::slurm::NodeGpus>> {
        self.nodes
            .as_ref()
            .filter(|(at, _)| (0.0..=max_age_s).contains(&(now - at)))
            .map(|n| n.1.clone())
    }

    /// Adds the commands run since `before` (a snapshot of the same counter) at `now`.
    pub fn count(
        &mut self,
        now: f64,
        before: &BTreeMap<CommandKind, u64>,
        after: &BTreeMap<CommandKind, u64>,
    ) {
        let minute = (now.max(0.0) / 60.0) as u64;
        if self.minutes.last().is_none_or(|m| m.minute != minute) {
            self.minutes.push(Minute { minute, ..Minute::default() });
        }
        let excess = self.minutes.len().saturating_sub(MINUTES_KEPT);
        self.minutes.drain(..excess);
        for (kind, n) in after {
            let d = n.saturating_sub(before.get(kind).copied().unwrap_or(0));
            if d == 0 {
                continue;
            }
            *self.commands_total.entry(kind.name().into()).or_default() += d;
            if let Some(m) = self.minutes.last_mut() {
                *m.commands.entry(kind.name().into()).or_default() += d;
                m.rpcs += d * kind.rpcs();
            }
        }
    }

    /// Counts a pass that began at `now` and took `seconds`.
    pub fn count_pass(&mut self, now: f64, seconds: f64) {
        let seconds = seconds.max(0.0);
        self.passes_total = self.passes_total.saturating_add(1);
        self.pass_seconds_total += seconds;
        let minute = (now.max(0.0) / 60.0) as u64;
        if self.minutes.last().is_none_or(|m| m.minute != minute) {
            self.minutes.push(Minute { minute, ..Minute::default() });
            let excess = self.minutes.len().saturating_sub(MINUTES_KEPT);
            self.minutes.drain(..excess);
        }
        if let Some(m) = self.minutes.last_mut() {
            m.slowest_pass_s = m.slowest_pass_s.max(seconds);
        }
    }

    /// The slowest pass of the last full minute before `now`, seconds (`None`: not counted).
    pub fn slowest_pass_last_minute(&self, now: f64) -> Option<f64> {
        let last = ((now.max(0.0) / 60.0) as u64).checked_sub(1)?;
        self.minutes.iter().find(|m| m.minute == last).map(|m| m.slowest_pass_s)
    }

    /// The RPCs of the last full minute before `now` (`None` when it was not counted).
    pub fn rpcs_last_minute(&self, now: f64) -> Option<u64> {
        let minute = (now.max(0.0) / 60.0) as u64;
        let last = minute.checked_sub(1)?;
        self.minutes.iter().find(|m| m.minute == last).map(|m| m.rpcs)
    }
}

/// The file, if it exists, read without following a link and within [`MAX_BYTES`].
fn read_bounded(path: &Path) -> Result<Option<String>> {
    let f = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io("open", path)(e)),
    };
    let meta = f.metadata().map_err(io("stat", path))?;
    if !meta.is_file() || meta.permissions().mode() & 0o022 != 0 {
        return Err(Error::Parse {
            what: path.display().to_string(),
            text: "not a regular file that only its owner may write".into(),
        });
    }
    let mut text = String::new();
    f.take(MAX_BYTES).read_to_string(&mut text).map_err(io("read", path))?;
    Ok(Some(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_survives_a_round_trip_and_an_unreadable_file_is_set_aside() {
        let dir = std::env::temp_dir().join(format!("kace-decider-state-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut s = DeciderState::default();
        s.gpus.insert(7, ("n1".into(), vec![1]));
        s.begun.insert(9, Begun { node: "n2".into(), kind: Some("g0".into()), shards: 2 });
        let before = BTreeMap::new();
        let after = BTreeMap::from([(CommandKind::List, 3), (CommandKind::Nodes, 1)]);
        s.count(120.0, &before, &after);
        assert_eq!(s.minutes[0].rpcs, 8, "a listing and sinfo are two RPCs each");
        assert_eq!(s.rpcs_last_minute(185.0), Some(8));
        assert_eq!(s.rpcs_last_minute(250.0), None);
        s.count_pass(121.0, 0.25);
        s.count_pass(150.0, 0.5);
        s.count_pass(190.0, 0.125);
        assert_eq!((s.passes_total, s.pass_seconds_total), (3, 0.875));
        assert_eq!(s.slowest_pass_last_minute(185.0), Some(0.5), "the slowest of minute 2");
        assert_eq!(s.slowest_pass_last_minute(130.0), None, "minute 1 had no pass");
        s.save(&dir).unwrap();
        assert_eq!(DeciderState::load(&dir), (s, None));
        std::fs::write(dir.join(FILE), "{not json").unwrap();
        let (empty, note) = DeciderState::load(&dir);
        assert_eq!(empty, DeciderState::default());
        assert!(note.unwrap().contains("set it aside"));
        assert!(dir.join("state.json.bad").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn only_the_last_hour_of_counts_is_kept() {
        let mut s = DeciderState::default();
        let one = BTreeMap::from([(CommandKind::Job, 1)]);
        for m in 0..100u64 {
            s.count(m as f64 * 60.0, &BTreeMap::new(), &one);
        }
        assert_eq!(s.minutes.len(), MINUTES_KEPT);
        assert_eq!(s.commands_total["job"], 100);
    }
}
