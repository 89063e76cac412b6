//! What `kace dispatch` must never release: a job an admin held (`JobHeldAdmin`), and, while
//! Slurm would not start it, a job with an unmet dependency or a `--begin` ahead — neither as a
//! lead nor for `max_hold`. A job held by the gate alone is released as usual.

use std::cell::RefCell;

use kace_node::decider_state::DeciderState;
use kace_node::slurm::{JobDetail, NodeGpus, QueuedJob, Slurm, Target};
use kace_node::{dispatch, Error, Result};

struct Queue {
    jobs: Vec<QueuedJob>,
    released: RefCell<Vec<u32>>,
}

impl Slurm for Queue {
    fn listing(&self) -> Result<kace_node::slurm::Listing> {
        Ok(kace_node::slurm::Listing::of_kace(self.jobs.clone(), Vec::new()))
    }
    fn queued(&self, id: u32) -> Result<Option<QueuedJob>> {
        Ok(self.jobs.iter().find(|j| j.id == id).cloned())
    }
    fn job_gpus(&self, _id: u32, _node: &str) -> Result<Vec<u32>> {
        Ok(vec![])
    }
    fn job(&self, id: u32) -> Result<JobDetail> {
        let j = self.jobs.iter().find(|j| j.id == id).ok_or_else(|| Error::Parse {
            what: format!("job {id}"),
            text: "not in this fake".into(),
        })?;
        Ok(JobDetail {
            id,
            state: "PENDING".into(),
            reason: j.reason.clone(),
            admin_comment: format!("kace:{}", j.workload),
            user: j.user.clone(),
            submitted: j.submitted,
            ..JobDetail::default()
        })
    }
    fn pin(
        &self,
        _id: u32,
        _target: &Target,
        _shards: u32,
        _ours: Option<&str>,
        _comment: Option<&str>,
    ) -> Result<()> {
        Ok(())
    }
    fn release(&self, id: u32) -> Result<()> {
        self.released.borrow_mut().push(id);
        Ok(())
    }
    fn hand_back(&self, id: u32, _shards: u32) -> Result<()> {
        self.released.borrow_mut().push(id);
        Ok(())
    }
    fn set_time_limit(&self, _id: u32, _minutes: u64, _comment: Option<&str>) -> Result<()> {
        Ok(())
    }
    fn site_limits(&self) -> Result<kace_node::limits::Limits> {
        Ok(kace_node::limits::Limits::default())
    }
    fn hold_again(&self, _id: u32) -> Result<()> {
        Ok(())
    }
    fn steps_here(&self, _id: u32, _node: &str) -> Result<bool> {
        Ok(false)
    }
    fn nodes(&self) -> Result<Vec<NodeGpus>> {
        Ok(vec![NodeGpus {
            name: "n1".into(),
            gpus: vec![None, None, None, None],
            shards_per_gpu: 4,
            usable: true,
            partitions: vec!["debug".into()],
            max_time_s: vec![None],
            features: Vec::new(),
            busy_gpus: Vec::new(),
        }])
    }
    fn priority_inputs(&self) -> Result<kace_node::priority::PriorityInputs> {
        Ok(Default::default())
    }
}

fn job(
    id: u32,
    reason: &str,
    dependency: &str,
    eligible: Option<f64>,
    submitted: f64,
) -> QueuedJob {
    QueuedJob {
        id,
        workload: "w".into(),
        user: "alice".into(),
        reason: reason.into(),
        tres_per_node: "gres/shard:1".into(),
        submitted: Some(submitted),
        state: "PD".into(),
        dependency: dependency.into(),
        eligible,
        ..QueuedJob::default()
    }
}

#[test]
fn admin_holds_dependencies_and_begin_times_are_never_released() {
    let now = 10_000.0;
    let q = Queue {
        jobs: vec![
            job(1, "JobHeldAdmin", "", None, 0.0),
            job(2, "JobHeldUser", "afterok:9(unfulfilled)", None, 0.0),
            job(3, "JobHeldUser", "", Some(now + 3600.0), 0.0),
            // Its --begin passed 10 s ago: max_hold (600 s) counts from then.
            job(4, "JobHeldUser", "", Some(now - 10.0), 0.0),
        ],
        released: RefCell::new(vec![]),
    };
    // max_hold_s is 600 by default.
    let spool = kace_test_support::TempDir::new("dispatch-holds");
    let mut config = kace_config::Config::default();
    config.spool.dir = spool.path().to_path_buf();
    config.dispatch.state_dir = spool.path().join("decider");
    let settings = dispatch::Settings::of(&config);
    let mut state = DeciderState::default();
    let r = dispatch::run(&q, &settings, &mut state, now).unwrap();
    assert!(r.expired.is_empty(), "{r:?}");
    // Only job 4 may lead (free to start, held by the gate alone).
    assert_eq!(r.leads.iter().map(|l| l.0).collect::<Vec<_>>(), vec![4], "{r:?}");
    assert_eq!(*q.released.borrow(), vec![4]);

    // Much later every job has waited past max_hold, but only the free ones are released.
    let q = Queue { jobs: q.jobs, released: RefCell::new(vec![]) };
    let later = now + 7200.0;
    let r = dispatch::run(&q, &settings, &mut state, later).unwrap();
    let mut expired: Vec<u32> = r.expired.iter().map(|e| e.0).collect();
    expired.sort_unstable();
    assert_eq!(expired, vec![3, 4], "{r:?}");
    assert!(!q.released.borrow().contains(&1) && !q.released.borrow().contains(&2));
    // Both are recorded as max_hold releases onto free GPUs (each leads its own), with how
    // long each was held: job 3 since its --begin, job 4 since its --begin 10 s before `now`.
    let mut holds: Vec<(String, Option<String>, Option<f64>)> = r
        .records
        .iter()
        .map(|d| {
            let kind = kace_sql::spool::ReleaseKind::of_key(Some(&d.key));
            (kind.name().to_string(), d.decision.lead_job.clone(), d.decision.candidates[0].held_s)
        })
        .collect();
    holds.sort_by(|a, b| a.1.cmp(&b.1));
    assert_eq!(
        holds,
        vec![
            ("max_hold".into(), Some("3".into()), Some(3600.0)),
            ("max_hold".into(), Some("4".into()), Some(7210.0)),
        ]
    );
    assert!(r.records.iter().all(|d| d.decision.chosen_job.is_none()));
    let spooled = kace_sql::spool::spooled_decisions(&config.spool.dir).unwrap();
    assert_eq!(spooled.len(), 3, "the lead release of the first pass and the two max_hold ones");
}
