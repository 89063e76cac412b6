//! Jobs that failed while sharing a GPU's MPS server, and the pairs of workloads kace stops
//! pairing because of them (issue 33 item 2).
//!
//! A fatal GPU error in one MPS client (an illegal address, a client killed with work queued)
//! ends every client's work on that server, and MPS does not say whose it was (NVIDIA's MPS
//! guide, "Error Containment": every client of the GPU receives the fatal exception; the server
//! refuses new clients until they have all exited). A failure of one job beside a partner
//! proves nothing on its own: its own bug fails it too, and what a job writes about itself is
//! its user's word. A *pair* is blocked only when both jobs failed, on the same node and GPU,
//! within [`FAILED_TOGETHER_WINDOW_S`] of each other, each naming the other as a partner: what
//! slurmd reported of two jobs, which no single user can bring about for another user's job.
//! Both jobs of one user block the pair for that user's jobs only (one user must not be able to
//! stop everyone's pairing of two workload names by failing two of their own jobs); jobs of two
//! users block it for everyone; a record without its user blocks nothing.
//! An admin clears a pair (`kace pairs clear A B`); failures before the clearance no longer
//! count, later ones block it again.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::types::{quote_untrusted, validate_workload_name, Partner, MAX_KEY_LEN};

/// How far apart two jobs' failures may be to count as one fault of their shared server: the
/// fault reaches every client at once, but each job's exit (its own error handling, Slurm's
/// kill of the rest of its tasks) and its epilog's clock add seconds.
pub const FAILED_TOGETHER_WINDOW_S: f64 = 60.0;

/// Most partners one failure record names (a GPU holds at most a few kace jobs).
pub const MAX_FAILURE_PARTNERS: usize = 32;

/// A kace job that failed while other jobs were on its GPU's MPS server (written by the
/// epilog, spooled, stored once per key at ingest).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuFailure {
    /// Unique key (`<cluster>/<job>/<run>/<node>/failure`).
    pub key: String,
    /// The job.
    pub job: String,
    /// Its workload.
    pub workload: String,
    /// Its user, when the epilog knew it.
    #[serde(default)]
    pub user: Option<String>,
    /// Node name.
    pub node: String,
    /// The GPU on the node.
    pub gpu: String,
    /// When it ended, Unix seconds.
    pub end: f64,
    /// How it ended, as Slurm reported it (`<exit code>:<signal>`).
    pub exit: String,
    /// The jobs on the same server in the last [`FAILED_TOGETHER_WINDOW_S`] before its end.
    pub partners: Vec<Partner>,
    /// When the GPU's MPS server logged a fatal GPU error while the job ran (its `server.log`;
    /// `kace_node::mps_log`), if it did: the cause, told to the users. It blocks nothing by
    /// itself: the log does not say whose the fault was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps_fatal_at: Option<f64>,
}

impl GpuFailure {
    /// Checks what ingest stores: bounded names and keys without control characters, a finite
    /// end, one to [`MAX_FAILURE_PARTNERS`] partners of valid workloads.
    pub fn validate(&self) -> Result<()> {
        let bad = |why: String| {
            Err(Error::Invalid { reason: format!("failure {}: {why}", quote_untrusted(&self.key)) })
        };
        validate_workload_name(&self.workload)?;
        for (what, v) in [
            ("key", &self.key),
            ("job", &self.job),
            ("node", &self.node),
            ("gpu", &self.gpu),
            ("exit", &self.exit),
        ] {
            if v.is_empty() || v.len() > MAX_KEY_LEN || v.chars().any(char::is_control) {
                return bad(format!(
                    "{what} {} is empty, too long or has control characters",
                    quote_untrusted(v)
                ));
            }
        }
        if !self.end.is_finite() || self.end < 0.0 {
            return bad(format!("end {} is not a time", self.end));
        }
        if self.mps_fatal_at.is_some_and(|t| !t.is_finite() || t < 0.0) {
            return bad("mps_fatal_at is not a time".into());
        }
        if self.partners.is_empty() || self.partners.len() > MAX_FAILURE_PARTNERS {
            return bad(format!("{} partners (1 to {MAX_FAILURE_PARTNERS})", self.partners.len()));
        }
        for p in &self.partners {
            validate_workload_name(&p.workload)?;
            if p.job.is_empty() || p.job.len() > MAX_KEY_LEN || p.job.chars().any(char::is_control)
            {
                return bad(format!("partner job {}", quote_untrusted(&p.job)));
            }
        }
        Ok(())
    }
}

/// Two workloads kace no longer pairs: their jobs failed together on a shared server.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FailedPair {
    /// The pair, in name order.
    pub workloads: (String, String),
    /// When the newest corroborated failure of the pair ended.
    pub since: f64,
    /// The jobs of that failure, in the pair's order, with how each ended.
    pub jobs: [(String, String); 2],
    /// Whose pairs it blocks: `Some(user)` when both jobs were that user's (only that user's
    /// jobs are kept apart), `None` when they were two users' (everyone's).
    pub user: Option<String>,
    /// Node and GPU of that failure.
    pub node: String,
    /// The GPU on that node.
    pub gpu: String,
}

/// An admin's clearance of a pair: failures of the pair that ended before `at` no longer count.
#[derive(Debug, Clone, PartialEq)]
pub struct Clearance {
    /// The pair, in name order.
    pub workloads: (String, String),
    /// When it was cleared, Unix seconds.
    pub at: f64,
}

/// The pair of `a` and `b` in name order.
pub fn pair_of(a: &str, b: &str) -> (String, String) {
    if a <= b {
        (a.to_string(), b.to_string())
    } else {
        (b.to_string(), a.to_string())
    }
}

/// The pairs the failures block (see the module docs): for each pair of workloads, the newest
/// corroborated failure not older than its clearance. Pure; in name order.
pub fn failed_pairs(failures: &[GpuFailure], clearances: &[Clearance]) -> Vec<FailedPair> {
    let mut out: std::collections::BTreeMap<((String, String), Option<String>), FailedPair> =
        Default::default();
    for f in failures {
        for p in &f.partners {
            // The partner's own record, naming this job back, on the same server, close in time.
            let Some(g) = failures.iter().find(|g| {
                g.job == p.job
                    && g.node == f.node
                    && g.gpu == f.gpu
                    && (g.end - f.end).abs() <= FAILED_TOGETHER_WINDOW_S
                    && g.partners.iter().any(|q| q.job == f.job)
            }) else {
                continue;
            };
            let user = match (&f.user, &g.user) {
                (Some(a), Some(b)) if a == b => Some(a.clone()),
                (Some(_), Some(_)) => None,
                _ => continue,
            };
            let workloads = pair_of(&f.workload, &g.workload);
            let since = f.end.max(g.end);
            let cleared = clearances.iter().any(|c| c.workloads == workloads && c.at >= since);
            let key = (workloads.clone(), user.clone());
            if cleared || out.get(&key).is_some_and(|old| old.since >= since) {
                continue;
            }
            let (first, second) = if f.workload <= g.workload { (f, g) } else { (g, f) };
            out.insert(
                key,
                FailedPair {
                    workloads,
                    since,
                    user,
                    jobs: [
                        (first.job.clone(), first.exit.clone()),
                        (second.job.clone(), second.exit.clone()),
                    ],
                    node: f.node.clone(),
                    gpu: f.gpu.clone(),
                },
            );
        }
    }
    out.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(job: &str, workload: &str, end: f64, partners: &[(&str, &str)]) -> GpuFailure {
        GpuFailure {
            key: format!("c/{job}/1/n1/failure"),
            job: job.into(),
            workload: workload.into(),
            user: Some("ann".into()),
            node: "n1".into(),
            gpu: "0".into(),
            end,
            exit: "1:0".into(),
            partners: partners
                .iter()
                .map(|(j, w)| Partner { job: j.to_string(), workload: w.to_string() })
                .collect(),
            mps_fatal_at: None,
        }
    }

    #[test]
    fn only_two_jobs_that_name_each_other_and_failed_close_together_block_their_pair() {
        let a = failure("1", "bert", 1000.0, &[("2", "resnet")]);
        let b = failure("2", "resnet", 1010.0, &[("1", "bert")]);
        let pairs = failed_pairs(&[a.clone(), b.clone()], &[]);
        assert_eq!(pairs.len(), 1);
        assert_eq!(pairs[0].workloads, ("bert".into(), "resnet".into()));
        assert_eq!(pairs[0].since, 1010.0);
        assert_eq!(pairs[0].jobs[0].0, "1");
        // One job's failure alone (its user's bug, or its word): nothing.
        assert!(failed_pairs(std::slice::from_ref(&a), &[]).is_empty());
        // Too far apart, another GPU, or a record that does not name the job back: nothing.
        let late = GpuFailure { end: 1000.0 + FAILED_TOGETHER_WINDOW_S + 1.0, ..b.clone() };
        assert!(failed_pairs(&[a.clone(), late], &[]).is_empty());
        let elsewhere = GpuFailure { gpu: "1".into(), ..b.clone() };
        assert!(failed_pairs(&[a.clone(), elsewhere], &[]).is_empty());
        let unrelated = failure("2", "resnet", 1010.0, &[("7", "bert")]);
        assert!(failed_pairs(&[a.clone(), unrelated], &[]).is_empty());
        // One user's two jobs block the pair for that user; two users' for everyone; a record
        // without its user, nothing.
        assert_eq!(pairs[0].user.as_deref(), Some("ann"));
        let bobs = GpuFailure { user: Some("bob".into()), ..b.clone() };
        assert_eq!(failed_pairs(&[a.clone(), bobs], &[])[0].user, None);
        let unknown = GpuFailure { user: None, ..b.clone() };
        assert!(failed_pairs(&[a.clone(), unknown], &[]).is_empty());
    }

    #[test]
    fn a_clearance_lifts_the_failures_before_it_and_a_later_one_blocks_again() {
        let a = failure("1", "bert", 1000.0, &[("2", "resnet")]);
        let b = failure("2", "resnet", 1010.0, &[("1", "bert")]);
        let cleared = [Clearance { workloads: pair_of("resnet", "bert"), at: 2000.0 }];
        assert!(failed_pairs(&[a.clone(), b.clone()], &cleared).is_empty());
        let c = failure("3", "resnet", 3000.0, &[("4", "bert")]);
        let d = failure("4", "bert", 3001.0, &[("3", "resnet")]);
        let pairs = failed_pairs(&[a, b, c, d], &cleared);
        assert_eq!(pairs.len(), 1);
        assert_eq!((pairs[0].since, pairs[0].jobs[0].0.as_str()), (3001.0, "4"));
    }

    #[test]
    fn records_out_of_bounds_are_refused() {
        let ok = failure("1", "bert", 1000.0, &[("2", "resnet")]);
        assert!(ok.validate().is_ok());
        for bad in [
            GpuFailure { partners: Vec::new(), ..ok.clone() },
            GpuFailure { end: f64::NAN, ..ok.clone() },
            GpuFailure { node: "n\n1".into(), ..ok.clone() },
            GpuFailure { workload: "a b".into(), ..ok.clone() },
            failure("1", "bert", 1.0, &[("2", "bad name")]),
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }
}
