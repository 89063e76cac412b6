//! One job's story for `kace explain`: what Slurm says (state, user, submitted, started, ended,
//! node) and what kace's records say — how long it was held, when and by what it was released
//! (as a lead, as a lead's partner, by a refill, as a late arrival, or by `max_hold`), and with
//! whom it ran.

use kace_node::slurm::Slurm;
use kace_sql::spool::ReleaseKind;
use kace_sql::{NewDecision, Observation};
use serde::Serialize;

use crate::releases::{released, Place};

/// What released a held kace job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReleasedBy {
    /// `kace dispatch` released it as a lead onto a GPU with no kace job (its prolog decided).
    Lead,
    /// A running job's prolog chose it as a partner.
    Partner,
    /// An ending job's epilog chose it to refill the place on its GPU.
    Refill,
    /// `kace dispatch` offered it, held, to an open GPU and the decision chose it.
    LateArrival,
    /// It waited `max_hold` and `kace dispatch` released it where it fits whatever the model's
    /// gain (from dispatch's record; inferred for records from before dispatch kept them: no
    /// decision names it and it started after the deadline).
    MaxHold,
    /// The decider handed it back to Slurm unpinned, asking for a whole GPU (the record's
    /// candidate says why).
    HandBack,
}

/// The release.
#[derive(Debug, Clone, Serialize)]
pub struct Release {
    /// By what.
    pub by: ReleasedBy,
    /// When, Unix seconds (the decision's time; for `max_hold`, the deadline).
    pub at: Option<f64>,
    /// The first kace job of the GPU it joined (partners, refills, late arrivals, max_hold
    /// onto an open GPU).
    pub lead_job: Option<String>,
    /// Where it went, when a record says so.
    pub place: Option<Place>,
    /// Why the decider handed it back to Slurm (hand-backs only).
    pub why: Option<String>,
}

/// What Slurm says about the job now.
#[derive(Debug, Clone, Serialize)]
pub struct SlurmFacts {
    /// `JobState`.
    pub state: String,
    /// `Reason`.
    pub reason: String,
    /// Owner.
    pub user: String,
    /// The gate's workload mark, when a kace job.
    pub workload: Option<String>,
    /// `NodeList`.
    pub node: String,
    /// Submitted, Unix seconds.
    pub submitted: Option<f64>,
    /// Started, Unix seconds.
    pub started: Option<f64>,
    /// Ended, Unix seconds.
    pub ended: Option<f64>,
}

/// A stretch the job shared its GPU, from the epilog's observations.
#[derive(Debug, Clone, Serialize)]
pub struct RanWith {
    /// The partners' jobs and workloads.
    pub partners: Vec<(String, String)>,
    /// From, Unix seconds.
    pub start: f64,
    /// To, Unix seconds.
    pub end: f64,
    /// The job's steps/s over it.
    pub throughput: f64,
}

/// Everything `kace explain` adds to the decisions.
#[derive(Debug, Clone, Serialize)]
pub struct Story {
    /// The job id.
    pub job: String,
    /// Slurm's view (`None` when Slurm no longer knows the job or could not be asked).
    pub slurm: Option<SlurmFacts>,
    /// Why Slurm had nothing.
    pub slurm_error: Option<String>,
    /// Seconds from submission to start (or to now, while still pending).
    pub held_s: Option<f64>,
    /// How it left the hold, when it did.
    pub released: Option<Release>,
    /// The stretches it ran beside other kace jobs (after `kace ingest`).
    pub ran_with: Vec<RanWith>,
    /// Stretches it ran alone (seconds in all).
    pub alone_s: f64,
}

/// Puts the story together. `decisions` are (decision, Unix time, spool key) from the
/// database and the spool; `observations` those of this job.
pub fn story(
    slurm: Option<&dyn Slurm>,
    job: &str,
    decisions: &[(NewDecision, f64, Option<String>)],
    observations: &[Observation],
    max_hold_s: u64,
    now: f64,
) -> Story {
    let (facts, slurm_error) = match (slurm, job.parse::<u32>()) {
        (None, _) => (None, Some("Slurm was not asked".to_string())),
        (Some(_), Err(_)) => (None, Some(format!("{job:?} is not a Slurm job id"))),
        (Some(s), Ok(id)) => match s.job(id) {
            Ok(d) => (
                Some(SlurmFacts {
                    state: d.state.clone(),
                    reason: d.reason.clone(),
                    user: d.user.clone(),
                    workload: d.workload().map(str::to_string),
                    node: d.nodes.clone(),
                    submitted: d.submitted,
                    started: d.started,
                    ended: d.ended,
                }),
                None,
            ),
            Err(e) => (None, Some(e.to_string())),
        },
    };
    // Only a kace job (the gate's mark) was held; a plain job merely waited in Slurm's queue
    // (the re-audit's L11: "held 1s" for a job kace never held).
    let held_s = facts.as_ref().filter(|f| f.workload.is_some()).and_then(|f| {
        let until = match (f.started, f.state.as_str()) {
            (Some(s), _) => Some(s),
            (None, "PENDING") => Some(now),
            _ => None,
        };
        f.submitted.zip(until).map(|(s, u)| (u - s).max(0.0))
    });
    // The newest record that released it (a requeued job has one per run).
    let recorded = decisions
        .iter()
        .filter_map(|(d, at, key)| released(d, *at, key.as_deref()))
        .filter(|r| r.job == job)
        .max_by(|a, b| a.at.total_cmp(&b.at));
    let as_lead = decisions.iter().find(|(d, _, _)| d.lead_job.as_deref() == Some(job));
    let released = if let Some(r) = recorded {
        let by = match r.kind {
            ReleaseKind::Lead => ReleasedBy::Partner,
            ReleaseKind::Refill => ReleasedBy::Refill,
            ReleaseKind::LateArrival => ReleasedBy::LateArrival,
            ReleaseKind::MaxHold => ReleasedBy::MaxHold,
            ReleaseKind::LeadRelease => ReleasedBy::Lead,
            ReleaseKind::HandBack => ReleasedBy::HandBack,
        };
        Some(Release { by, at: Some(r.at), lead_job: r.beside, place: Some(r.place), why: r.why })
    } else if let Some((_, at, _)) = as_lead {
        // Only its prolog's decision (dispatch kept no records before): it led a free GPU.
        Some(Release {
            by: ReleasedBy::Lead,
            at: Some(*at),
            lead_job: None,
            place: Some(Place::FreeGpu),
            why: None,
        })
    } else {
        facts.as_ref().and_then(|f| {
            let (sub, start) = f.submitted.zip(f.started)?;
            let deadline = sub + max_hold_s as f64;
            (f.workload.is_some() && start >= deadline).then_some(Release {
                by: ReleasedBy::MaxHold,
                at: Some(deadline),
                lead_job: None,
                place: None,
                why: None,
            })
        })
    };
    let mut mine: Vec<&Observation> = observations.iter().filter(|o| o.job == job).collect();
    mine.sort_by(|a, b| a.start.total_cmp(&b.start));
    let ran_with = mine
        .iter()
        .filter(|o| !o.partners.is_empty())
        .map(|o| RanWith {
            partners: o.partners.iter().map(|p| (p.job.clone(), p.workload.clone())).collect(),
            start: o.start,
            end: o.end,
            throughput: o.throughput,
        })
        .collect();
    let alone_s = mine
        .iter()
        .filter(|o| o.partners.is_empty())
        .map(|o| o.end - o.start)
        .fold(0.0, |a, b| a + b);
    Story { job: job.to_string(), slurm: facts, slurm_error, held_s, released, ran_with, alone_s }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kace_node::slurm::{JobDetail, NodeGpus, QueuedJob, Target};
    use kace_sql::Partner;

    struct OneJob(JobDetail);

    impl Slurm for OneJob {
        fn listing(&self) -> kace_node::Result<kace_node::slurm::Listing> {
            Ok(kace_node::slurm::Listing::default())
        }
        fn job(&self, id: u32) -> kace_node::Result<JobDetail> {
            if id == self.0.id {
                Ok(self.0.clone())
            } else {
                Err(kace_node::Error::Parse { what: "job".into(), text: "Invalid job id".into() })
            }
        }
        fn queued(&self, _: u32) -> kace_node::Result<Option<QueuedJob>> {
            Ok(None)
        }
        fn job_gpus(&self, _: u32, _: &str) -> kace_node::Result<Vec<u32>> {
            Ok(Vec::new())
        }
        fn pin(
            &self,
            _: u32,
            _: &Target,
            _: u32,
            _: Option<&str>,
            _: Option<&str>,
        ) -> kace_node::Result<()> {
            Ok(())
        }
        fn release(&self, _: u32) -> kace_node::Result<()> {
            Ok(())
        }
        fn hand_back(&self, _: u32, _: u32) -> kace_node::Result<()> {
            Ok(())
        }
        fn set_time_limit(&self, _: u32, _: u64, _: Option<&str>) -> kace_node::Result<()> {
            Ok(())
        }
        fn site_limits(&self) -> kace_node::Result<kace_node::limits::Limits> {
            Ok(kace_node::limits::Limits::default())
        }
        fn hold_again(&self, _: u32) -> kace_node::Result<()> {
            Ok(())
        }
        fn steps_here(&self, _: u32, _: &str) -> kace_node::Result<bool> {
            Ok(false)
        }
        fn nodes(&self) -> kace_node::Result<Vec<NodeGpus>> {
            Ok(Vec::new())
        }

        fn priority_inputs(&self) -> kace_node::Result<kace_node::priority::PriorityInputs> {
            Ok(Default::default())
        }
    }

    fn detail(id: u32, submitted: f64, started: Option<f64>) -> JobDetail {
        JobDetail {
            id,
            state: if started.is_some() { "COMPLETED" } else { "PENDING" }.into(),
            reason: "None".into(),
            admin_comment: "kace:bert".into(),
            nodes: "n1".into(),
            user: "alice".into(),
            submitted: Some(submitted),
            started,
            ended: started.map(|s| s + 60.0),
            ..Default::default()
        }
    }

    fn decision(lead: &str, chosen: Option<&str>) -> NewDecision {
        NewDecision {
            lead_job: Some(lead.into()),
            lead_workload: "resnet".into(),
            chosen_workload: chosen.map(|_| "bert".into()),
            chosen_job: chosen.map(str::to_string),
            model_version: Some(1),
            candidates: Vec::new(),
        }
    }

    #[test]
    fn released_by_partner_lead_or_max_hold() {
        let s = OneJob(detail(7, 1000.0, Some(1010.0)));
        let ds = vec![(decision("5", Some("7")), 1009.0, Some("c/5/decision".to_string()))];
        let st = story(Some(&s), "7", &ds, &[], 300, 2000.0);
        let r = st.released.unwrap();
        assert_eq!(
            (r.by, r.at, r.lead_job.as_deref()),
            (ReleasedBy::Partner, Some(1009.0), Some("5"))
        );
        assert_eq!(st.held_s, Some(10.0));
        assert_eq!(st.slurm.unwrap().user, "alice");
        // A plain job kace never held was not "held 10s" (the re-audit's L11).
        let plain =
            OneJob(JobDetail { admin_comment: String::new(), ..detail(8, 1000.0, Some(1010.0)) });
        assert_eq!(story(Some(&plain), "8", &[], &[], 300, 2000.0).held_s, None);

        let st = story(Some(&s), "7", &[(decision("7", None), 1011.0, None)], &[], 300, 2000.0);
        assert_eq!(st.released.unwrap().by, ReleasedBy::Lead);
        // Chosen by an ending job's epilog: a refill.
        let ds = vec![(decision("5", Some("7")), 1009.0, Some("c/6/refill".to_string()))];
        let r = story(Some(&s), "7", &ds, &[], 300, 2000.0).released.unwrap();
        assert_eq!((r.by, r.lead_job.as_deref()), (ReleasedBy::Refill, Some("5")));
        // Offered by dispatch to the open GPU of job 5: a late arrival.
        let ds = vec![(decision("5", Some("7")), 1009.5, Some("c/7/1009500/n1/join".to_string()))];
        let r = story(Some(&s), "7", &ds, &[], 300, 2000.0).released.unwrap();
        assert_eq!(
            (r.by, r.lead_job.as_deref(), r.place),
            (ReleasedBy::LateArrival, Some("5"), Some(Place::OpenGpu))
        );
        // Dispatch's lead release comes before its own prolog's decision; the release counts.
        let ds = vec![
            (decision("7", None), 1009.2, Some("c/7/1009200/n1/lead_release".to_string())),
            (decision("7", None), 1010.0, Some("c/7/1010000/n1/decision".to_string())),
        ];
        let r = story(Some(&s), "7", &ds, &[], 300, 2000.0).released.unwrap();
        assert_eq!((r.by, r.at), (ReleasedBy::Lead, Some(1009.2)));

        // Released by max_hold, recorded by dispatch: onto a free GPU, or an open one.
        let late = OneJob(detail(7, 1000.0, Some(1301.0)));
        let ds = vec![(decision("7", None), 1300.5, Some("c/7/1300500/n1/max_hold".to_string()))];
        let r = story(Some(&late), "7", &ds, &[], 300, 2000.0).released.unwrap();
        assert_eq!(
            (r.by, r.at, r.place),
            (ReleasedBy::MaxHold, Some(1300.5), Some(Place::FreeGpu))
        );
        let ds = vec![(decision("5", Some("7")), 1300.5, Some("c/7/1300500/n1/max_hold".into()))];
        let r = story(Some(&late), "7", &ds, &[], 300, 2000.0).released.unwrap();
        assert_eq!(
            (r.by, r.place, r.lead_job.as_deref()),
            (ReleasedBy::MaxHold, Some(Place::OpenGpu), Some("5"))
        );
        // Started after the deadline with no decision naming it: max_hold (inferred).
        let r = story(Some(&late), "7", &[], &[], 300, 2000.0).released.unwrap();
        assert_eq!((r.by, r.at), (ReleasedBy::MaxHold, Some(1300.0)));
        // Before the deadline and no decision: not known.
        assert!(story(Some(&s), "7", &[], &[], 300, 2000.0).released.is_none());
    }

    #[test]
    fn still_held_counts_to_now_and_unknown_jobs_say_why() {
        let s = OneJob(detail(8, 1000.0, None));
        let st = story(Some(&s), "8", &[], &[], 300, 1100.0);
        assert_eq!(st.held_s, Some(100.0));
        // An empty float sum is -0.0 in Rust; JSON would show it.
        assert!(st.alone_s == 0.0 && st.alone_s.is_sign_positive());
        assert!(st.released.is_none());
        let st = story(Some(&s), "9", &[], &[], 300, 1100.0);
        assert!(st.slurm.is_none() && st.slurm_error.unwrap().contains("Invalid job id"));
        let st = story(Some(&s), "x;rm", &[], &[], 300, 1100.0);
        assert!(st.slurm_error.unwrap().contains("not a Slurm job id"));
    }

    #[test]
    fn partners_come_from_the_observations() {
        let o = |key: &str, partners: Vec<Partner>, start: f64, end: f64| Observation {
            key: key.into(),
            job: "7".into(),
            workload: "bert".into(),
            partners,
            node: "n1".into(),
            gpu: "0".into(),
            mps_share: None,
            start,
            end,
            steps: Some(10.0),
            throughput: 2.0,
            user: None,
            account: None,
            gpu_sm_pct: None,
            gpu_energy_j: None,
        };
        let obs = vec![
            o("c/7/1", vec![Partner { job: "5".into(), workload: "resnet".into() }], 20.0, 50.0),
            o("c/7/0", vec![], 10.0, 20.0),
        ];
        let st = story(None, "7", &[], &obs, 300, 100.0);
        assert_eq!(st.ran_with.len(), 1);
        assert_eq!(st.ran_with[0].partners, vec![("5".to_string(), "resnet".to_string())]);
        assert_eq!(st.alone_s, 10.0);
    }
}
