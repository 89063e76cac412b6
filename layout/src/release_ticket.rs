//! The decider's hand-over to the prolog of a job it releases: before releasing a kace job onto
//! a node, the decider writes `<spool>/released/<job>` (the node and the job's workload, as its
//! listing read them from the gate's mark), so that the job's prolog learns that it is a kace
//! job, and of which workload, without asking slurmctld again. On Slurm 22.05 that read cost
//! two RPCs a job (`squeue -j` loads the partitions too): issue 28's budget of 8 RPCs per kace
//! job beyond a plain job's is met only without it. A prolog that finds no ticket (a hand-back
//! at `max_hold`, a spool the node does not share, an NFS client that does not see the file
//! yet) reads its job from Slurm as before; the ticket is an optimisation, never the only path.
//!
//! Trust: the prolog runs as root and believes what the ticket says, so a ticket counts only
//! when the `released` directory and the file belong to root or to the owner of the spool
//! directory (the decider may run as SlurmUser), the directory is writable by nobody else, and
//! the file is a plain file of the one form written here. A job's user can write none of that.
//! A ticket older than [`MAX_AGE_S`] is not used (a job released and then cancelled before it
//! started leaves one; job ids are reused only after a cluster's id space wraps).

use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::workload_name::check;

/// The spool's sub-directory of tickets.
pub const DIR: &str = "released";

/// Longest ticket file accepted.
pub const MAX_FILE_BYTES: u64 = 512;

/// Oldest ticket used, seconds: a pinned release starts within seconds (its GPU was free or
/// open when the decider chose it); one that waits longer is read from Slurm.
pub const MAX_AGE_S: f64 = 600.0;

/// What the decider says of a job it released.
#[derive(Debug, Clone, PartialEq)]
pub struct Ticket {
    /// The node it was pinned to.
    pub node: String,
    /// When it was released (unix seconds, the decider's clock).
    pub at: f64,
    /// Its workload (the gate's mark, as the decider's listing read it).
    pub workload: String,
    /// The SM share the decider chose for it beside the GPU's running job
    /// (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`, [`crate::thread_share`]), 1…99; `None`: none set.
    pub thread_pct: Option<u8>,
}

impl Ticket {
    /// Form 1 without a share (what every prolog since the ticket reads), form 2 with one: a
    /// prolog of a kace release before shares refuses form 2 and reads Slurm, so its job runs
    /// with no share set, as before.
    fn text(&self) -> String {
        match self.thread_pct {
            None => format!("kace-release-ticket 1 {} {} {}\n", self.node, self.at, self.workload),
            Some(t) => {
                format!("kace-release-ticket 2 {} {} {} {t}\n", self.node, self.at, self.workload)
            }
        }
    }

    fn parse(text: &str) -> Option<Ticket> {
        let line = text.strip_suffix('\n')?;
        let mut words = line.split(' ');
        if words.next()? != "kace-release-ticket" {
            return None;
        }
        let form = words.next()?;
        if form != "1" && form != "2" {
            return None;
        }
        let node = words.next()?;
        let at: f64 = words.next()?.parse().ok()?;
        let workload = words.next()?;
        let thread_pct = match form {
            "2" => Some(crate::thread_share::parse_percent(words.next()?)?),
            _ => None,
        };
        let valid_node = !node.is_empty() && node.bytes().all(|b| b.is_ascii_graphic());
        (words.next().is_none()
            && valid_node
            && at.is_finite()
            && check(workload.as_bytes()).is_ok())
        .then(|| Ticket { node: node.to_string(), at, workload: workload.to_string(), thread_pct })
    }

    /// Whether the prolog of a job on `node` may use it at `now` (unix seconds): the node it
    /// was pinned to, and neither older than [`MAX_AGE_S`] nor more than 300 s ahead of the
    /// node's clock (the clocks of a cluster agree within that; `MAX_CLOCK_AHEAD_S` elsewhere).
    pub fn fits(&self, node: &str, now: f64) -> bool {
        self.node == node && now - self.at <= MAX_AGE_S && self.at - now <= 300.0
    }
}

/// The ticket file of job `job` under `spool`.
pub fn file(spool: &Path, job: u32) -> PathBuf {
    spool.join(DIR).join(job.to_string())
}

/// Writes job `job`'s ticket, replacing any earlier one atomically (a requeued job is released
/// again). Creates the directory (0750) when missing.
pub fn write(spool: &Path, job: u32, ticket: &Ticket) -> std::io::Result<()> {
    if check(ticket.workload.as_bytes()).is_err()
        || Ticket::parse(&ticket.text()).as_ref() != Some(ticket)
    {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("job {job}: not a ticket the prolog could read: {:?}", ticket.text()),
        ));
    }
    let dir = spool.join(DIR);
    std::fs::DirBuilder::new().recursive(true).mode(0o750).create(&dir)?;
    crate::handover::write(&file(spool, job), Some(&ticket.text()), 0o640)
}

/// Removes job `job`'s ticket (none there is fine).
pub fn remove(spool: &Path, job: u32) -> std::io::Result<()> {
    match std::fs::remove_file(file(spool, job)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Whether `spool`'s ticket directory may be believed: `Ok(false)` when there is none yet (the
/// decider creates it at its first release), `Err` with why when it is not root's or the
/// spool's owner's, or others may write into it (`kace doctor` says so once, the prologs at
/// each job).
pub fn dir_trusted(spool: &Path) -> Result<bool, String> {
    trusted_spool_owner(spool).map(|o| o.is_some())
}

/// The spool's owner when its ticket directory may be believed (see [`dir_trusted`]).
fn trusted_spool_owner(spool: &Path) -> Result<Option<u32>, String> {
    let spool_owner = match std::fs::metadata(spool) {
        Ok(m) => m.uid(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", spool.display())),
    };
    let path = spool.join(DIR);
    let dir = match std::fs::symlink_metadata(&path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let owner_ok = dir.uid() == 0 || dir.uid() == spool_owner;
    if !dir.file_type().is_dir() || !owner_ok || dir.mode() & 0o022 != 0 {
        return Err(format!(
            "{} is not a directory of root or the spool's owner writable by nobody else; ignored",
            path.display()
        ));
    }
    Ok(Some(spool_owner))
}

/// Job `job`'s ticket, if there is one kace wrote (see the module docs for what is trusted).
/// `Ok(None)`: none; `Err`: one that is not trusted or not readable, with why.
pub fn read(spool: &Path, job: u32) -> Result<Option<Ticket>, String> {
    let Some(spool_owner) = trusted_spool_owner(spool)? else {
        return Ok(None);
    };
    let path = file(spool, job);
    let trusted = |uid: u32| uid == 0 || uid == spool_owner;
    let owners = "root or the spool's owner";
    let Some(text) = crate::handover::read(&path, MAX_FILE_BYTES, trusted, owners)? else {
        return Ok(None);
    };
    Ticket::parse(&text)
        .map(Some)
        .ok_or_else(|| format!("{} is not a release ticket kace writes; ignored", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("kace-ticket-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn ticket() -> Ticket {
        Ticket {
            node: "n1".into(),
            at: 1_796_669_781.774_123_4,
            workload: "resnet-50".into(),
            thread_pct: None,
        }
    }

    #[test]
    fn a_written_ticket_reads_back_and_fits_its_node_within_its_age() {
        let spool = temp("roundtrip");
        assert_eq!(read(&spool, 7).unwrap(), None);
        write(&spool, 7, &ticket()).unwrap();
        let t = read(&spool, 7).unwrap().unwrap();
        assert_eq!(t, ticket());
        assert!(t.fits("n1", t.at + 1.0));
        assert!(!t.fits("n2", t.at + 1.0));
        assert!(!t.fits("n1", t.at + MAX_AGE_S + 1.0));
        assert!(!t.fits("n1", t.at - 301.0));
        // With a share, the second form; read back whole.
        let shared = Ticket { thread_pct: Some(40), ..ticket() };
        write(&spool, 8, &shared).unwrap();
        assert_eq!(read(&spool, 8).unwrap(), Some(shared));
        let text = std::fs::read_to_string(file(&spool, 8)).unwrap();
        assert!(text.starts_with("kace-release-ticket 2 n1 ") && text.ends_with(" resnet-50 40\n"));
        // Replaced atomically by a second release, removed by the prolog.
        write(&spool, 7, &Ticket { node: "n2".into(), ..ticket() }).unwrap();
        assert_eq!(read(&spool, 7).unwrap().unwrap().node, "n2");
        remove(&spool, 7).unwrap();
        remove(&spool, 7).unwrap();
        assert_eq!(read(&spool, 7).unwrap(), None);
        std::fs::remove_dir_all(&spool).unwrap();
    }

    #[test]
    fn a_ticket_in_another_form_or_place_is_refused_with_why() {
        let spool = temp("refused");
        // What a job's name could smuggle is refused on write.
        for workload in ["a b", "", "x\ny"] {
            assert!(write(&spool, 1, &Ticket { workload: workload.into(), ..ticket() }).is_err());
        }
        assert!(write(&spool, 1, &Ticket { node: "n 1".into(), ..ticket() }).is_err());
        write(&spool, 2, &ticket()).unwrap();
        let dir = spool.join(DIR);
        for text in [
            "kace-release-ticket 1 n1 5.0 w\nmore\n",
            "kace-release-ticket 2 n1 5.0 w\n",
            "kace-release-ticket 2 n1 5.0 w 100\n",
            "kace-release-ticket 2 n1 5.0 w 0\n",
            "kace-release-ticket 2 n1 5.0 w +40\n",
            "kace-release-ticket 1 n1 5.0 w 40\n",
            "kace-release-ticket 3 n1 5.0 w 40\n",
            "kace-release-ticket 1 n1 NaN w\n",
            "kace-release-ticket 1 n1 5.0 w",
            "kace-release-ticket 1 n1 5.0 w extra\n",
        ] {
            std::fs::write(dir.join("3"), text).unwrap();
            let e = read(&spool, 3).unwrap_err();
            assert!(e.contains("not a release ticket"), "{text:?}: {e}");
        }
        std::fs::write(dir.join("4"), "x".repeat(MAX_FILE_BYTES as usize + 1)).unwrap();
        assert!(read(&spool, 4).unwrap_err().contains("plain file"));
        std::os::unix::fs::symlink(dir.join("2"), dir.join("5")).unwrap();
        assert!(read(&spool, 5).unwrap_err().contains("plain file"));
        // A directory others may write into is not trusted, whatever it holds.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(read(&spool, 2).unwrap_err().contains("writable by nobody else"));
        std::fs::remove_dir_all(&spool).unwrap();
    }
}
