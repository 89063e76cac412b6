//! `kace status`: every GPU with its kace jobs (who, since when, with whom, predicted against
//! observed so far), the held kace jobs with their wait, their `max_hold` deadline and the
//! partner each would be offered if it led a GPU now, and the active model.
//!
//! Slurm is asked as the calling user, so what a user sees of other users' jobs is what Slurm's
//! `PrivateData` lets `squeue` show them; database facts are only added to jobs Slurm listed.

use std::collections::{BTreeMap, HashMap};

use kace_config::Config;
use kace_layout::progress_file;
use kace_node::read_path::{decide_from_store, JobSpec};
use kace_node::slurm::{QueuedJob, Slurm};
use kace_selector::decision::Policy;
use kace_selector::{Member, Model, Objective, Predictor, Profile};
use kace_sql::convert::{model_from_record, selector_profile};
use kace_sql::Db;
use serde::Serialize;

use crate::Result;

/// Held jobs for which the would-be partner is computed (each costs one prediction per other
/// held job); beyond this the column is left empty and a problem says so.
pub const MAX_OFFERS: usize = 200;

/// What one `kace status` shows.
#[derive(Debug, Clone, Serialize)]
pub struct Status {
    /// When it was taken, Unix seconds.
    pub at: f64,
    /// The objective predictions are in.
    pub objective: &'static str,
    /// Every GPU Slurm knows of, by node and index.
    pub gpus: Vec<Gpu>,
    /// Kace jobs still held, oldest first.
    pub held: Vec<Held>,
    /// Kace jobs released but not started yet.
    pub starting: Vec<u32>,
    /// The model the prolog uses now.
    pub model: Option<ModelSummary>,
    /// What could not be read (the rest is still shown).
    pub problems: Vec<String>,
}

/// Whether a GPU can take kace jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuOccupancy {
    /// No kace job: dispatch may release a lead onto it.
    Free,
    /// Kace jobs below `selection.max_jobs_per_gpu`: another may still join.
    Open,
    /// As many kace jobs as it takes.
    Full,
    /// No kace job, but Slurm shows it in use: a job kace does not manage holds it, and the
    /// decider leaves it to that job.
    Others,
    /// Its node is down or drained.
    Unusable,
}

/// One GPU.
#[derive(Debug, Clone, Serialize)]
pub struct Gpu {
    /// Node name.
    pub node: String,
    /// Index on the node.
    pub index: u32,
    /// GPU type when typed.
    pub kind: Option<String>,
    /// Free, open, full, others' or unusable.
    pub state: GpuOccupancy,
    /// Its kace jobs (only the caller's with `--user`).
    pub jobs: Vec<Running>,
    /// Kace jobs on it not shown (other users' with `--user`).
    pub hidden_jobs: usize,
    /// The model's prediction for the group on it (objective units), when every member is
    /// profiled.
    pub predicted: Option<f64>,
    /// The group's objective from the progress files so far, when every member reported.
    pub observed: Option<f64>,
}

/// One running kace job.
#[derive(Debug, Clone, Serialize)]
pub struct Running {
    /// Job id.
    pub job: u32,
    /// Its workload.
    pub workload: String,
    /// Its user.
    pub user: String,
    /// When it started, Unix seconds.
    pub since: Option<f64>,
    /// The other kace jobs on its GPU.
    pub with: Vec<u32>,
    /// Its predicted throughput in this group (steps/s; the slowdown model predicts each
    /// member, the linear model only the sum).
    pub predicted_throughput: Option<f64>,
    /// Steps/s since its warm-up, from its progress file (when readable from here).
    pub observed_throughput: Option<f64>,
}

/// One held kace job.
#[derive(Debug, Clone, Serialize)]
pub struct Held {
    /// Job id.
    pub job: u32,
    /// Its workload.
    pub workload: String,
    /// Its user.
    pub user: String,
    /// Submission, Unix seconds.
    pub submitted: Option<f64>,
    /// Seconds held so far.
    pub waited_s: Option<f64>,
    /// When `kace dispatch` releases it whatever the model says (`max_hold`), Unix seconds;
    /// `None` while a dependency or `--begin` blocks it (then `no_partner` says which).
    pub max_hold_at: Option<f64>,
    /// The held job kace would choose as its partner if it led a GPU now.
    pub would_pair_with: Option<Offer>,
    /// Why there is none, when there is none.
    pub no_partner: Option<String>,
    /// Its place in the decider's line (1 = next): held jobs are offered in Slurm's priority
    /// order (oldest first without priority/multifactor), to the GPUs their policies allow.
    pub place: usize,
    /// The priority Slurm would give it (kace's estimate; `None` without multifactor).
    pub priority: Option<f64>,
    /// Why the decider hands it back to Slurm at its next pass instead of placing it, if it does
    /// (a `-w` of several nodes, a reservation, no shard, …).
    pub handed_back: Option<String>,
    /// Why the decider keeps it back, from its memory at its last pass (root's view only): a
    /// QOS or association limit Slurm would keep it pending for, or a rest after Slurm kept it
    /// pending for a policy reason.
    pub kept_back: Option<String>,
}

/// A would-be partner.
#[derive(Debug, Clone, Serialize)]
pub struct Offer {
    /// Job id.
    pub job: u32,
    /// Workload.
    pub workload: String,
    /// The pair's predicted objective.
    pub predicted: f64,
}

/// The active model.
#[derive(Debug, Clone, Serialize)]
pub struct ModelSummary {
    /// Version.
    pub version: i64,
    /// `slowdown` or `linear`.
    pub kind: String,
    /// When it was trained, Unix seconds.
    pub trained_at: f64,
    /// Groups it was trained on (fit and held out).
    pub groups: usize,
    /// Its held-out mean squared error, when recorded.
    pub holdout_mse: Option<f64>,
}

/// A running kace job placed on its GPU, before it is shown.
struct Placed {
    job: u32,
    workload: String,
    user: String,
    since: Option<f64>,
}

/// What every GPU's row is computed with.
struct Shared<'a> {
    config: &'a Config,
    model: &'a Option<(ModelSummary, Model)>,
    profiles: &'a HashMap<String, Profile>,
    mine: &'a dyn Fn(&str) -> bool,
}

/// What to show.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Only this user's jobs.
    pub user: Option<String>,
}

/// At most this many running jobs' GPUs are read from Slurm (one RPC each) by one view, for
/// the jobs the decider's memory does not know.
const MAX_GPU_READS: usize = 32;

/// Reads the active model's summary and decoded model.
pub fn active_model_summary(db: &Db) -> Result<Option<(ModelSummary, Model)>> {
    let Some(rec) = db.active_model_record()? else { return Ok(None) };
    let model = model_from_record(&rec)?;
    let summary = ModelSummary {
        version: rec.version,
        kind: rec.model.kind.clone(),
        trained_at: rec.created_at,
        groups: rec.model.training_size,
        holdout_mse: kace_sql::training::stored_record(&rec.model.metrics)
            .map(|r| r.holdout_mse)
            .filter(|m| m.is_finite()),
    };
    Ok(Some((summary, model)))
}

/// Takes the status at `now`. Slurm must answer; a missing or unreadable database only
/// removes the predictions and the model (said in `problems`).
pub fn gather(
    slurm: &dyn Slurm,
    db: Option<&Db>,
    config: &Config,
    now: f64,
    opts: &Options,
) -> Result<Status> {
    let mut problems = Vec::new();
    let queue = slurm.kace_queue()?;
    // The decider's memory is root's; another user's view reads the GPUs (boundedly) itself.
    let memory = kace_node::decider_state::DeciderState::peek(&config.dispatch.state_dir)
        .ok()
        .flatten()
        .unwrap_or_default();
    let running = kace_node::dispatch::running_jobs(slurm, &queue, &memory, MAX_GPU_READS);
    let nodes = slurm.nodes()?;
    let mine = |user: &str| opts.user.as_deref().is_none_or(|u| u == user);

    // Each running kace job on the GPU(s) its allocation names.
    let mut on_gpu: BTreeMap<(String, u32), Vec<Placed>> = BTreeMap::new();
    for r in &running {
        if r.gpus.is_empty() {
            problems
                .push(format!("couldn't find the GPU of running job {} in its allocation", r.id));
        }
        for i in &r.gpus {
            on_gpu.entry((r.node.clone(), *i)).or_default().push(Placed {
                job: r.id,
                workload: if r.workload.is_empty() { "?".into() } else { r.workload.clone() },
                user: r.user.clone(),
                since: r.started,
            });
        }
    }

    let (model, profiles) = match db {
        Some(db) => {
            let model = active_model_summary(db).unwrap_or_else(|e| {
                problems.push(format!("couldn't read the active model: {e}"));
                None
            });
            let profiles: HashMap<String, Profile> = match db.all_profiles(None) {
                Ok(all) => all
                    .into_iter()
                    .filter_map(|(w, p)| selector_profile(&p).map(|sp| (w, sp)))
                    .collect(),
                Err(e) => {
                    problems.push(format!("couldn't read the profiles: {e}"));
                    HashMap::new()
                }
            };
            (model, profiles)
        }
        None => (None, HashMap::new()),
    };
    let objective = config.selection.objective;

    let shared = Shared { config, model: &model, profiles: &profiles, mine: &mine };
    let mut gpus = Vec::new();
    for n in &nodes {
        for (i, kind) in n.gpus.iter().enumerate() {
            let key = (n.name.clone(), i as u32);
            let jobs = on_gpu.remove(&key).unwrap_or_default();
            let others = jobs.is_empty() && n.busy_gpus.contains(&(i as u32));
            gpus.push(gpu_status((n.usable, others), key, kind.clone(), &jobs, &shared));
        }
    }
    // Jobs on GPUs sinfo did not list (a node that left the partition): still shown.
    for (key, jobs) in on_gpu {
        gpus.push(gpu_status((false, false), key, None, &jobs, &shared));
    }

    let held_jobs: Vec<&QueuedJob> = queue.iter().filter(|j| j.held()).collect();
    // The decider's line is Slurm's priority order (kace's estimate, `kace_node::priority`):
    // read as the decider reads it (3 RPCs), only when there is a line to order.
    let inputs = if held_jobs.len() >= 2 {
        slurm.priority_inputs().unwrap_or_else(|e| {
            problems.push(format!(
                "couldn't read Slurm's priority factors ({e}); places are in submission order"
            ));
            Default::default()
        })
    } else {
        Default::default()
    };
    let held_jobs: Vec<&QueuedJob> = kace_node::priority::order(&inputs, &held_jobs, now)
        .into_iter()
        .map(|i| held_jobs[i])
        .collect();
    // A job an admin (or, before the gate, its user) holds was not released by kace: not
    // "released, not started yet" (the re-audit's L11).
    let held_elsewhere = |j: &&QueuedJob| j.reason.starts_with("JobHeld");
    let starting: Vec<u32> = queue
        .iter()
        .filter(|j| j.pending() && !j.held() && !held_elsewhere(j) && mine(&j.user))
        .map(|j| j.id)
        .collect();
    let max_hold = config.dispatch.max_hold_s as f64;
    // The one decision's rules, as every decider builds them from the configuration.
    let mut policy = config.policy();
    policy.rules.objective = objective;
    if held_jobs.len() > MAX_OFFERS {
        problems.push(format!(
            "{} held jobs: would-be partners are shown for the oldest {MAX_OFFERS} only",
            held_jobs.len()
        ));
    }
    let mut held = Vec::new();
    for (k, j) in held_jobs.iter().enumerate() {
        if !mine(&j.user) {
            continue;
        }
        let blocked = j.blocked(now);
        let (offer, why) = match db {
            // Dispatch and the prolog leave it alone until Slurm could start it.
            _ if blocked.is_some() => (None, blocked.clone()),
            None => (None, Some("no database".to_string())),
            Some(_) if k >= MAX_OFFERS => (None, Some("not computed (queue too long)".into())),
            Some(db) => would_pair_with(db, j, &held_jobs, &policy, config.node.gpu_memory_gib),
        };
        held.push(Held {
            job: j.id,
            workload: j.workload.clone(),
            user: j.user.clone(),
            submitted: j.submitted,
            waited_s: j.submitted.map(|s| now - s),
            // As dispatch counts it: from submission or the --begin time; not while blocked.
            max_hold_at: j.hold_started().filter(|_| blocked.is_none()).map(|s| s + max_hold),
            would_pair_with: offer,
            no_partner: why,
            place: k + 1,
            priority: kace_node::priority::estimate(&inputs, j, now),
            handed_back: kace_node::placement::wants(j).err().map(|why| why.to_string()),
            kept_back: kept_back(&memory, j.id, now),
        });
    }
    Ok(Status {
        at: now,
        objective: objective.key(),
        gpus,
        held,
        starting,
        model: model.map(|m| m.0),
        problems,
    })
}

/// Why the decider's memory says it keeps job `id` back, if it does.
fn kept_back(memory: &kace_node::decider_state::DeciderState, id: u32, now: f64) -> Option<String> {
    if let Some(why) = memory.limit_said.get(&id) {
        return Some(format!("waits for a limit: {why}"));
    }
    memory.resting.get(&id).filter(|&&until| until > now).map(|until| {
        format!(
            "held again after Slurm kept it pending for a policy reason; offered again in {:.0} s",
            until - now
        )
    })
}

/// One GPU's line; `(usable, others)`: its node takes jobs, and a job kace does not manage
/// holds it.
fn gpu_status(
    (usable, others): (bool, bool),
    (node, index): (String, u32),
    kind: Option<String>,
    jobs: &[Placed],
    sh: &Shared<'_>,
) -> Gpu {
    let Shared { config, model, profiles, mine } = *sh;
    let state = match (usable, jobs.len()) {
        (false, _) => GpuOccupancy::Unusable,
        (true, 0) if others => GpuOccupancy::Others,
        (true, 0) => GpuOccupancy::Free,
        (true, n) if n < config.selection.max_jobs_per_gpu => GpuOccupancy::Open,
        _ => GpuOccupancy::Full,
    };
    let objective = config.selection.objective;
    let observed: Vec<Option<f64>> = jobs.iter().map(|j| observed_so_far(config, j.job)).collect();
    let found: Option<Vec<&Profile>> = jobs.iter().map(|j| profiles.get(&j.workload)).collect();
    let (predicted, per_job) = match (model, &found) {
        (Some((_, m)), Some(ps)) if !ps.is_empty() => {
            let members: Vec<Member<'_>> = ps
                .iter()
                .zip(jobs)
                .map(|(p, j)| Member { profile: p, workload: Some(&j.workload) })
                .collect();
            let per_job: Vec<Option<f64>> = match m {
                _ if ps.len() == 1 => vec![Some(ps[0].exclusive_throughput())],
                Model::Slowdown(s) => s
                    .slowdowns(&members)
                    .iter()
                    .zip(ps)
                    .map(|(s, p)| Some(s * p.exclusive_throughput()))
                    .collect(),
                Model::Linear { .. } => vec![None; ps.len()],
            };
            let group = if ps.len() == 1 {
                match objective {
                    Objective::ThroughputSum => ps[0].exclusive_throughput(),
                    Objective::NormalisedProgress => 1.0,
                    Objective::Energy => kace_selector::energy::work_per_energy([(ps[0], 1.0)]),
                }
            } else {
                m.predict(&members, objective)
            };
            (Some(group), per_job)
        }
        _ => (None, vec![None; jobs.len()]),
    };
    let observed_group = match (&found, observed.iter().copied().collect::<Option<Vec<f64>>>()) {
        (_, None) => None,
        (_, Some(obs)) if obs.is_empty() => None,
        (_, Some(obs)) if objective == Objective::ThroughputSum => Some(obs.iter().sum()),
        (Some(ps), Some(obs)) => {
            Some(obs.iter().zip(ps).map(|(o, p)| o / p.exclusive_throughput()).sum())
        }
        (None, Some(_)) => None,
    };
    let all_ids: Vec<u32> = jobs.iter().map(|j| j.job).collect();
    let shown: Vec<Running> = jobs
        .iter()
        .zip(observed)
        .zip(per_job)
        .filter(|((j, _), _)| mine(&j.user))
        .map(|((j, obs), pred)| Running {
            job: j.job,
            workload: j.workload.clone(),
            user: j.user.clone(),
            since: j.since,
            with: all_ids.iter().copied().filter(|x| *x != j.job).collect(),
            predicted_throughput: pred,
            observed_throughput: obs,
        })
        .collect();
    Gpu {
        node,
        index,
        kind,
        state,
        hidden_jobs: jobs.len() - shown.len(),
        jobs: shown,
        predicted,
        observed: observed_group,
    }
}

/// Steps/s since the warm-up from the job's progress file, read the epilog's safe way; `None`
/// when the file is not here (another node) or has too few lines yet.
fn observed_so_far(config: &Config, job: u32) -> Option<f64> {
    let path = progress_file(&config.node.progress_root, job);
    let progress = kace_profiling::progress::read(&path).ok()?;
    progress.throughput(config.profiling.warmup_steps).ok().map(|t| t.steps_per_second)
}

/// Why no candidate was chosen, as counts of rejections by reason (most frequent first, at
/// most [`MAX_REASONS`]): one bounded line however many jobs are held. The full list of
/// candidates and reasons is `kace explain JOB`'s.
fn rejection_counts(verdicts: &[kace_selector::Verdict]) -> String {
    let mut counts: BTreeMap<&'static str, usize> = BTreeMap::new();
    for r in verdicts.iter().filter_map(|v| v.rejection.as_ref()) {
        *counts.entry(r.kind()).or_default() += 1;
    }
    if counts.is_empty() {
        return "none predicted to gain".to_string();
    }
    let mut by_count: Vec<(&str, usize)> = counts.into_iter().collect();
    by_count.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let more = by_count.len().saturating_sub(MAX_REASONS);
    let mut parts: Vec<String> =
        by_count.iter().take(MAX_REASONS).map(|(r, n)| format!("{n} × {r}")).collect();
    parts.push("kace explain JOB lists each".into());
    if more > 0 {
        parts.insert(MAX_REASONS, format!("{more} other reason(s)"));
    }
    parts.join("; ")
}

/// At most this many reasons are counted in one held job's line.
const MAX_REASONS: usize = 4;

/// The partner the decider would choose if `lead` led a GPU now, among the other held jobs.
fn would_pair_with(
    db: &Db,
    lead: &QueuedJob,
    held: &[&QueuedJob],
    policy: &Policy,
    gpu_memory_gib: Option<f64>,
) -> (Option<Offer>, Option<String>) {
    let others: Vec<&&QueuedJob> = held.iter().filter(|j| j.id != lead.id).collect();
    if others.is_empty() {
        return (None, Some("no other held job".into()));
    }
    let user = |j: &QueuedJob| Some(j.user.clone()).filter(|u| !u.is_empty());
    let specs: Vec<JobSpec> =
        others.iter().map(|j| JobSpec { workload: j.workload.clone(), user: user(j) }).collect();
    let running = [JobSpec { workload: lead.workload.clone(), user: user(lead) }];
    match decide_from_store(db, &running, &specs, policy, gpu_memory_gib, None, &[]) {
        Ok(d) => match d.selection.chosen {
            Some(c) => {
                let j = others[c];
                let predicted = d.selection.verdicts[c].prediction.unwrap_or(f64::NAN);
                (Some(Offer { job: j.id, workload: j.workload.clone(), predicted }), None)
            }
            None => (None, Some(rejection_counts(&d.selection.verdicts))),
        },
        Err(e) => (None, Some(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kace_node::slurm::{JobDetail, NodeGpus, RunningJob, Target};

    struct Cluster {
        queue: Vec<QueuedJob>,
        running: Vec<RunningJob>,
        nodes: Vec<NodeGpus>,
        priority: kace_node::priority::PriorityInputs,
    }

    impl Slurm for Cluster {
        fn listing(&self) -> kace_node::Result<kace_node::slurm::Listing> {
            // The running jobs are in the listing too, as Slurm lists them.
            let running = self.running.iter().map(|r| QueuedJob {
                id: r.id,
                workload: r.workload.clone(),
                user: r.user.clone(),
                state: r.state.clone(),
                node: r.node.clone(),
                started: r.started,
                ..Default::default()
            });
            let jobs = self.queue.iter().cloned().chain(running).collect();
            Ok(kace_node::slurm::Listing::of_kace(jobs, Vec::new()))
        }
        fn queued(&self, _: u32) -> kace_node::Result<Option<QueuedJob>> {
            panic!("status needs no per-job query but the GPUs of running jobs")
        }
        fn job(&self, _: u32) -> kace_node::Result<JobDetail> {
            panic!("status needs no per-job query but the GPUs of running jobs")
        }
        fn job_gpus(&self, id: u32, _: &str) -> kace_node::Result<Vec<u32>> {
            Ok(self.running.iter().find(|r| r.id == id).map(|r| r.gpus.clone()).unwrap_or_default())
        }
        fn pin(
            &self,
            _: u32,
            _: &Target,
            _: u32,
            _: Option<&str>,
            _: Option<&str>,
        ) -> kace_node::Result<()> {
            panic!("status changes nothing")
        }
        fn release(&self, _: u32) -> kace_node::Result<()> {
            panic!("status changes nothing")
        }
        fn hand_back(&self, _: u32, _: u32) -> kace_node::Result<()> {
            panic!("status changes nothing")
        }
        fn set_time_limit(&self, _: u32, _: u64, _: Option<&str>) -> kace_node::Result<()> {
            panic!("status changes nothing")
        }
        fn site_limits(&self) -> kace_node::Result<kace_node::limits::Limits> {
            panic!("status reads no limits")
        }
        fn hold_again(&self, _: u32) -> kace_node::Result<()> {
            panic!("status changes nothing")
        }
        fn steps_here(&self, _: u32, _: &str) -> kace_node::Result<bool> {
            panic!("status asks no slurmstepd")
        }
        fn nodes(&self) -> kace_node::Result<Vec<NodeGpus>> {
            Ok(self.nodes.clone())
        }

        fn priority_inputs(&self) -> kace_node::Result<kace_node::priority::PriorityInputs> {
            Ok(self.priority.clone())
        }
    }

    fn held(id: u32, user: &str, submitted: f64) -> QueuedJob {
        QueuedJob {
            id,
            workload: "bert".into(),
            user: user.into(),
            reason: kace_node::slurm::GATE_HOLD_REASON.into(),
            tres_per_node: "gres/shard:1".into(),
            submitted: Some(submitted),
            state: "PD".into(),
            ..Default::default()
        }
    }

    fn run(id: u32, node: &str, user: &str) -> RunningJob {
        RunningJob {
            id,
            node: node.into(),
            gpus: vec![0],
            state: "R".into(),
            user: user.into(),
            workload: "resnet".into(),
            started: Some(900.0),
        }
    }

    fn cluster() -> Cluster {
        let node = |name: &str, usable: bool| NodeGpus {
            name: name.into(),
            gpus: vec![None],
            shards_per_gpu: 4,
            usable,
            partitions: Vec::new(),
            max_time_s: Vec::new(),
            features: Vec::new(),
            busy_gpus: Vec::new(),
        };
        Cluster {
            queue: vec![held(10, "alice", 950.0), held(11, "bob", 990.0)],
            running: vec![run(1, "n1", "alice"), run(2, "n1", "bob"), run(3, "n2", "alice")],
            nodes: vec![
                node("n1", true),
                node("n2", true),
                node("n3", true),
                node("n4", false),
                NodeGpus { busy_gpus: vec![0], ..node("n5", true) },
            ],
            priority: Default::default(),
        }
    }

    #[test]
    fn a_held_jobs_reasons_are_counted_by_kind_in_one_bounded_line() {
        use kace_selector::{Rejection, Verdict};
        let v = |r: Rejection| Verdict { rejection: Some(r), ..Verdict::default() };
        let mut verdicts: Vec<Verdict> = (0..5000)
            .map(|i| v(Rejection::MemoryDoesNotFit { needed_gib: f64::from(i), usable_gib: 28.0 }))
            .collect();
        verdicts.extend((0..300).map(|_| v(Rejection::DifferentUser)));
        verdicts.push(v(Rejection::UnknownProfile));
        let line = rejection_counts(&verdicts);
        assert!(line.starts_with("5000 × memory does not fit; 300 × different user"), "{line}");
        assert!(
            line.contains("1 × unknown profile") && line.ends_with("kace explain JOB lists each")
        );
        assert!(line.len() < 200, "{line}");
        assert_eq!(rejection_counts(&[]), "none predicted to gain");
    }

    #[test]
    fn the_deciders_memory_says_why_a_job_is_kept_back() {
        let mut m = kace_node::decider_state::DeciderState::default();
        m.limit_said.insert(10, "QOSMaxJobsPerUserLimit (QOS one)".into());
        m.resting.insert(11, 1060.0);
        m.resting.insert(12, 990.0);
        assert_eq!(
            kept_back(&m, 10, 1000.0).as_deref(),
            Some("waits for a limit: QOSMaxJobsPerUserLimit (QOS one)")
        );
        let rest = kept_back(&m, 11, 1000.0).unwrap();
        assert!(rest.contains("policy reason") && rest.ends_with("in 60 s"), "{rest}");
        // A rest that is over, and a job the decider said nothing of: nothing.
        assert_eq!(kept_back(&m, 12, 1000.0), None);
        assert_eq!(kept_back(&m, 13, 1000.0), None);
    }

    #[test]
    fn gpus_are_full_open_free_or_unusable_and_holds_have_deadlines() {
        let mut config = Config::default();
        config.dispatch.max_hold_s = 300;
        let s = gather(&cluster(), None, &config, 1000.0, &Options::default()).unwrap();
        let states: Vec<GpuOccupancy> = s.gpus.iter().map(|g| g.state).collect();
        assert_eq!(
            states,
            [
                GpuOccupancy::Full,
                GpuOccupancy::Open,
                GpuOccupancy::Free,
                GpuOccupancy::Unusable,
                GpuOccupancy::Others
            ]
        );
        assert_eq!(s.gpus[0].jobs[0].with, vec![2]);
        assert_eq!(s.gpus[0].jobs[1].with, vec![1]);
        assert!(s.gpus[1].jobs[0].with.is_empty());
        assert_eq!(s.held.len(), 2);
        assert_eq!((s.held[0].waited_s, s.held[0].max_hold_at), (Some(50.0), Some(1250.0)));
        assert_eq!(s.held[0].no_partner.as_deref(), Some("no database"));
        assert!(s.model.is_none() && s.gpus[0].predicted.is_none());
    }

    /// The re-audit's L11: an admin-held kace job was listed as "released, not started yet".
    #[test]
    fn only_jobs_kace_released_are_starting() {
        let mut c = cluster();
        let pending =
            |id: u32, reason: &str| QueuedJob { reason: reason.into(), ..held(id, "alice", 990.0) };
        c.queue.push(pending(12, "JobHeldAdmin"));
        c.queue.push(pending(13, "Priority"));
        let s = gather(&c, None, &Config::default(), 1000.0, &Options::default()).unwrap();
        assert_eq!(s.starting, vec![13]);
    }

    #[test]
    fn a_blocked_hold_has_no_deadline_and_says_why() {
        let mut c = cluster();
        c.queue[0].dependency = "afterok:7(unfulfilled)".into();
        c.queue[1].eligible = Some(1100.0);
        let mut config = Config::default();
        config.dispatch.max_hold_s = 300;
        let s = gather(&c, None, &config, 1000.0, &Options::default()).unwrap();
        assert_eq!(s.held[0].max_hold_at, None);
        assert!(s.held[0].no_partner.as_deref().unwrap().contains("dependency"));
        assert_eq!(s.held[1].max_hold_at, None);
        assert!(s.held[1].no_partner.as_deref().unwrap().contains("--begin"));
        c.queue[1].eligible = Some(980.0);
        let s = gather(&c, None, &config, 1000.0, &Options::default()).unwrap();
        assert_eq!(s.held[1].max_hold_at, Some(990.0 + 300.0));
    }

    #[test]
    fn one_user_sees_their_own_jobs_and_counts_the_others() {
        let opts = Options { user: Some("alice".into()) };
        let s = gather(&cluster(), None, &Config::default(), 1000.0, &opts).unwrap();
        let shown: Vec<u32> = s.gpus.iter().flat_map(|g| g.jobs.iter().map(|j| j.job)).collect();
        assert_eq!(shown, vec![1, 3]);
        assert_eq!(s.gpus[0].hidden_jobs, 1);
        // The GPU is still full: bob's job takes its place whether shown or not.
        assert_eq!(s.gpus[0].state, GpuOccupancy::Full);
        assert_eq!(s.held.iter().map(|h| h.job).collect::<Vec<_>>(), vec![10]);
        // Its place counts every user's held jobs ahead of it.
        let all =
            gather(&cluster(), None, &Config::default(), 1000.0, &Options::default()).unwrap();
        let place = |st: &Status, id: u32| st.held.iter().find(|h| h.job == id).unwrap().place;
        assert_eq!(place(&s, 10), place(&all, 10));
    }

    /// The place is the decider's: Slurm's priority order (issue 29 item 7), not submission
    /// order, with each job's estimated priority.
    #[test]
    fn places_follow_slurms_priority_order() {
        let mut c = cluster();
        // bob (submitted later) has three times alice's fair-share.
        c.priority = kace_node::priority::PriorityInputs {
            weights: Some(kace_node::priority::Weights { fairshare: 1000.0, ..Default::default() }),
            fairshare: [
                (("a".to_string(), "alice".to_string()), 0.25),
                (("b".to_string(), "bob".to_string()), 0.75),
            ]
            .into_iter()
            .collect(),
            ..Default::default()
        };
        c.queue[0].account = "a".into();
        c.queue[1].account = "b".into();
        let s = gather(&c, None, &Config::default(), 1000.0, &Options::default()).unwrap();
        let line: Vec<(u32, usize)> = s.held.iter().map(|h| (h.job, h.place)).collect();
        assert_eq!(line, [(11, 1), (10, 2)]);
        assert_eq!(s.held[0].priority.map(f64::round), Some(750.0));
        // Without multifactor: oldest first, no priority shown.
        let s = gather(&cluster(), None, &Config::default(), 1000.0, &Options::default()).unwrap();
        assert_eq!(s.held.iter().map(|h| h.job).collect::<Vec<_>>(), [10, 11]);
        assert!(s.held.iter().all(|h| h.priority.is_none()));
    }

    #[test]
    fn a_held_job_kace_will_hand_back_says_so() {
        let mut c = cluster();
        c.queue[0].req_nodes = "n[1-2]".into();
        let s = gather(&c, None, &Config::default(), 1000.0, &Options::default()).unwrap();
        let h = s.held.iter().find(|h| h.job == c.queue[0].id).unwrap();
        assert!(h.handed_back.as_deref().unwrap().contains("several nodes"), "{h:?}");
        assert_eq!((h.place, s.held.iter().filter(|h| h.handed_back.is_none()).count()), (1, 1));
    }
}
