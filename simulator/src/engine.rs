//! The discrete-event simulation: GPUs with up to two jobs, a FIFO queue, and a policy that
//! fills a GPU's free slot from the first `window` pending jobs.
//!
//! # Model
//! - Under `kace-at-start` (kace before its refill and dispatch of open GPUs) a GPU asks only
//!   when its lead starts: a survivor runs alone, and a lead that found no partner is never
//!   open.
//! - Each GPU holds a *first* job (the lead, or the job left when its partner ended) and at
//!   most one partner. Alone, a job runs at its workload's exclusive throughput; beside a
//!   partner, at the measured colocated throughput of the pair. Rates change only when a
//!   partner joins or leaves; the remaining steps are brought up to date at each change and
//!   the job's finish event is rescheduled (older events are recognised by a version number
//!   and dropped when they surface: lazy deletion keeps every operation O(log n)).
//! - A GPU with no job takes the queue's head as its lead (the kace dispatch releases the
//!   oldest held job onto a GPU with no kace job). A GPU with one job, whether it just got a
//!   lead or just lost a partner, asks the policy for a partner among the first `window`
//!   pending jobs, the kace prolog's bounded candidate list. The policy may refuse every
//!   candidate; the GPU then stays *open* and is offered each job that later enters the window.
//!   Offers go to the open GPU whose job's workload gives the best merit, so finding one costs
//!   O(workloads), not O(GPUs).
//! - Arrivals go to an idle GPU when there is one (they become leads), else to the queue's
//!   tail. At equal times, completions are handled before arrivals.
//! - A pair over the GPU's memory can only be formed by a policy that does not check memory
//!   (queue order): the joining job fails at start with out-of-memory, is counted, stays at
//!   its place in the queue and from then on only runs alone (its user resubmits it without
//!   sharing). The failure costs no simulated time, which flatters queue order.
//! - A pair never measured has no ground truth and no policy forms it.
//! - Nights ([`simulate_with_nights`]): at every multiple of [`DAY_S`] while a decision is left
//!   to make (jobs queued or still to arrive), a night hook gets the colocations that ended since
//!   the last night (what the epilogs recorded) and may hand back a new policy of the same kind
//!   (kace retrained, [`crate::retraining`]); from then on it decides, and every open GPU is
//!   asked again under it, since a candidate the old table refused may now be accepted.
//! - Users: under MPS's per-user servers only one user's jobs share a GPU, so a candidate of
//!   another user than the job on the GPU is passed over (the policy's same-user rule; off for
//!   `mps.multi_user` and for queue order). Open GPUs are indexed by their job's workload and,
//!   under the rule, its user.

use std::borrow::Cow;
use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, VecDeque};

use crate::error::SimError;
use crate::metrics::Timeline;
use crate::policy::{PairingPolicy, PolicyKind};
use crate::trace::{Job, UserId};
use crate::world::{PairKind, WorkloadId, World};
use kace_selector::energy::group_power;

const NONE: u32 = u32::MAX;

/// The default candidate window: how many pending jobs, from the queue's head, a free slot
/// considers (the prolog's candidate list is bounded the same way).
pub const DEFAULT_WINDOW: usize = 32;

/// A simulated day, in seconds: nights fall at its multiples.
pub const DAY_S: f64 = 86_400.0;

/// A colocation that ended: what a site observes of a pair (its epilog records the pair when
/// a member ends).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Colocation {
    /// The workload of the job that was on the GPU first.
    pub first: WorkloadId,
    /// The workload of the job that joined it.
    pub second: WorkloadId,
    /// Their users, in the same order.
    pub users: [UserId; 2],
    /// When the second joined (seconds).
    pub start_s: f64,
    /// When the first of the two ended (seconds).
    pub end_s: f64,
}

/// What happens at each night of a run ([`simulate_with_nights`]).
pub trait Nights {
    /// Night `night` (1-based, at `night × DAY_S`): `ended` are the colocations that ended since
    /// the night before. Returns the policy that decides from now on, or `None` to keep the
    /// one deciding; it must be of the same kind, over the same world, with the same user rule.
    fn night(
        &mut self,
        night: u32,
        ended: &[Colocation],
    ) -> Result<Option<PairingPolicy>, SimError>;
}

/// How much work was done by the time the last job started: the cluster's throughput while
/// the queue still held jobs, free of the drain at the end.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sustained {
    /// When the last job started (seconds).
    pub until: f64,
    /// Steps done by then, partial jobs included.
    pub steps: f64,
    /// Work done by then in exclusive GPU-seconds (steps over exclusive throughput).
    pub work_s: f64,
    /// Seconds, by then, with at least one job waiting in the queue.
    pub queued_s: f64,
}

/// What one simulation produced. Per-job vectors are in the trace's order.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The policy simulated.
    pub policy: PolicyKind,
    /// GPUs in the cluster.
    pub gpus: usize,
    /// Submission time of each job.
    pub submit: Vec<f64>,
    /// When each job started (a job that failed with out-of-memory: when it started for good).
    pub start: Vec<f64>,
    /// When each job finished.
    pub finish: Vec<f64>,
    /// Jobs that failed with out-of-memory on joining a GPU.
    pub ooms: u64,
    /// Pairs formed.
    pub pairings: u64,
    /// Pairs formed that were among the policy's training pairs.
    pub pairings_seen: u64,
    /// GPU-seconds with at least one job.
    pub busy_gpu_s: f64,
    /// GPU-seconds with two jobs.
    pub shared_gpu_s: f64,
    /// The busy GPUs' energy by the power model ([`kace_selector::energy`]), in seconds of one
    /// GPU's busy power: modelled, not measured (the artifact has no power data).
    pub busy_energy_s: f64,
    /// Every job's steps, summed.
    pub total_steps: f64,
    /// Every job's length alone, summed (exclusive GPU-seconds).
    pub total_work_s: f64,
    /// Work done when the last job started.
    pub sustained: Sustained,
    /// Busy GPUs and running jobs over time.
    pub timeline: Timeline,
    /// Events processed (arrivals and completions, stale ones excluded).
    pub events: u64,
    /// Nights that fell while a decision was left to make (0 without a night hook).
    pub nights: u32,
}

#[derive(Debug, Clone, Copy)]
struct Event {
    t: f64,
    job: u32,
    version: u32,
}

impl PartialEq for Event {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Event {}
impl PartialOrd for Event {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Event {
    // Reversed: BinaryHeap is a max-heap and the earliest event must come out first; equal
    // times go by job index so that runs are deterministic.
    fn cmp(&self, other: &Self) -> Ordering {
        other.t.total_cmp(&self.t).then(other.job.cmp(&self.job))
    }
}

#[derive(Debug, Clone, Copy)]
struct JobState {
    remaining: f64,
    rate: f64,
    last: f64,
    version: u32,
    gpu: u32,
    alone_only: bool,
}

struct Sim<'a> {
    world: &'a World,
    /// Borrowed until a night replaces it.
    policy: Cow<'a, PairingPolicy>,
    jobs: &'a [Job],
    window: usize,
    now: f64,
    st: Vec<JobState>,
    start: Vec<f64>,
    finish: Vec<f64>,
    /// `slots[2g]` is GPU g's first job, `slots[2g + 1]` its partner.
    slots: Vec<u32>,
    idle: Vec<u32>,
    /// Open GPUs (one job, no acceptable candidate), by the workload of their job, then by its
    /// user under the same-user rule (else all under user 0).
    open: Vec<BTreeMap<UserId, BTreeSet<u32>>>,
    open_total: usize,
    queue: VecDeque<u32>,
    heap: BinaryHeap<Event>,
    busy: usize,
    running: usize,
    shared: usize,
    started: usize,
    done_steps: f64,
    done_work: f64,
    out_ooms: u64,
    pairings: u64,
    pairings_seen: u64,
    busy_gpu_s: f64,
    shared_gpu_s: f64,
    /// Each GPU's modelled power now (0 while idle), in units of its busy power.
    power: Vec<f64>,
    power_sum: f64,
    busy_energy_s: f64,
    queued_s: f64,
    sustained: Option<Sustained>,
    timeline: Timeline,
    events: u64,
    /// Whether colocations are recorded (a night hook reads them).
    observing: bool,
    /// Colocations that ended since the last night.
    ended: Vec<Colocation>,
    nights: u32,
}

/// Runs `jobs` on `gpus` GPUs under `policy`, choosing partners among the first `window`
/// pending jobs. Jobs need not be sorted by submission time. The policy never changes: no
/// night is held.
pub fn simulate(
    world: &World,
    policy: &PairingPolicy,
    jobs: &[Job],
    gpus: usize,
    window: usize,
) -> Result<Outcome, SimError> {
    run(world, policy, jobs, gpus, window, None)
}

/// As [`simulate`], with a night at every multiple of [`DAY_S`] while a decision is left to
/// make: `nights` gets the day's ended colocations and may replace the policy (see the module
/// docs). Fails if a night's hook fails or hands back a policy that cannot replace `policy`.
pub fn simulate_with_nights(
    world: &World,
    policy: &PairingPolicy,
    jobs: &[Job],
    gpus: usize,
    window: usize,
    nights: &mut dyn Nights,
) -> Result<Outcome, SimError> {
    run(world, policy, jobs, gpus, window, Some(nights))
}

fn run(
    world: &World,
    policy: &PairingPolicy,
    jobs: &[Job],
    gpus: usize,
    window: usize,
    mut nights: Option<&mut dyn Nights>,
) -> Result<Outcome, SimError> {
    if gpus == 0 {
        return Err(SimError::Config("the cluster has zero GPUs".into()));
    }
    if gpus >= (NONE / 2) as usize || jobs.len() >= NONE as usize {
        return Err(SimError::Config(format!("{gpus} GPUs and {} jobs is too many", jobs.len())));
    }
    if window == 0 {
        return Err(SimError::Config("the candidate window must hold at least one job".into()));
    }
    if jobs.is_empty() {
        return Err(SimError::Config("the trace has no jobs".into()));
    }
    for (i, j) in jobs.iter().enumerate() {
        if usize::from(j.workload) >= world.len() {
            return Err(SimError::Config(format!("job {i}: workload id {} unknown", j.workload)));
        }
        if !(j.submit.is_finite() && j.submit >= 0.0 && j.steps.is_finite() && j.steps > 0.0) {
            return Err(SimError::Config(format!(
                "job {i}: submit time {} and steps {} must be finite, ≥ 0 and > 0",
                j.submit, j.steps
            )));
        }
    }
    let mut order: Vec<u32> = (0..jobs.len() as u32).collect();
    order.sort_by(|&a, &b| jobs[a as usize].submit.total_cmp(&jobs[b as usize].submit));
    let mut sim = Sim {
        world,
        policy: Cow::Borrowed(policy),
        jobs,
        window,
        now: 0.0,
        st: jobs
            .iter()
            .map(|j| JobState {
                remaining: j.steps,
                rate: 0.0,
                last: 0.0,
                version: 0,
                gpu: NONE,
                alone_only: false,
            })
            .collect(),
        start: vec![f64::NAN; jobs.len()],
        finish: vec![f64::NAN; jobs.len()],
        slots: vec![NONE; 2 * gpus],
        // Popped from the back, so GPU 0 is used first.
        idle: (0..gpus as u32).rev().collect(),
        open: vec![BTreeMap::new(); world.len()],
        open_total: 0,
        queue: VecDeque::new(),
        heap: BinaryHeap::new(),
        busy: 0,
        running: 0,
        shared: 0,
        started: 0,
        done_steps: 0.0,
        done_work: 0.0,
        out_ooms: 0,
        pairings: 0,
        pairings_seen: 0,
        busy_gpu_s: 0.0,
        shared_gpu_s: 0.0,
        power: vec![0.0; gpus],
        power_sum: 0.0,
        busy_energy_s: 0.0,
        queued_s: 0.0,
        sustained: None,
        timeline: Timeline::new(),
        events: 0,
        observing: nights.is_some(),
        ended: Vec::new(),
        nights: 0,
    };
    let mut next = 0;
    let mut next_night: u32 = 1;
    loop {
        let arrival = order.get(next).map(|&j| jobs[j as usize].submit);
        if let Some(hook) = nights.as_deref_mut() {
            // A stale finish event must not hold a night after the last real event.
            while sim.heap.peek().is_some_and(|ev| sim.stale(ev)) {
                sim.heap.pop();
            }
            let upcoming = match (sim.heap.peek().map(|ev| ev.t), arrival) {
                (Some(e), Some(a)) => Some(e.min(a)),
                (e, a) => e.or(a),
            };
            let at = f64::from(next_night) * DAY_S;
            // Once nothing is queued or still to come, no decision is left that a new model
            // could change.
            let decisions_left = next < order.len() || !sim.queue.is_empty();
            if decisions_left && upcoming.is_some_and(|t| t >= at) {
                sim.advance(at);
                sim.night(hook, next_night)?;
                next_night += 1;
                #[cfg(test)]
                sim.check_invariants();
                continue;
            }
        }
        let first = sim.heap.peek().copied();
        match (first, arrival) {
            (Some(ev), a) if a.is_none_or(|a| ev.t <= a) => {
                sim.heap.pop();
                if sim.stale(&ev) {
                    continue;
                }
                sim.advance(ev.t);
                sim.complete(ev.job);
            }
            (_, Some(a)) => {
                sim.advance(a);
                sim.arrive(order[next]);
                next += 1;
            }
            (_, None) => break,
        }
        sim.events += 1;
        #[cfg(test)]
        sim.check_invariants();
    }
    let total_steps = jobs.iter().map(|j| j.steps).sum();
    let total_work_s = jobs.iter().map(|j| j.steps / world.exclusive(j.workload)).sum();
    let sustained =
        sim.sustained.unwrap_or(Sustained { until: 0.0, steps: 0.0, work_s: 0.0, queued_s: 0.0 });
    Ok(Outcome {
        policy: policy.kind(),
        gpus,
        submit: jobs.iter().map(|j| j.submit).collect(),
        start: sim.start,
        finish: sim.finish,
        ooms: sim.out_ooms,
        pairings: sim.pairings,
        pairings_seen: sim.pairings_seen,
        busy_gpu_s: sim.busy_gpu_s,
        shared_gpu_s: sim.shared_gpu_s,
        busy_energy_s: sim.busy_energy_s,
        total_steps,
        total_work_s,
        sustained,
        timeline: sim.timeline,
        events: sim.events,
        nights: sim.nights,
    })
}

impl Sim<'_> {
    /// Everything the O(log n) bookkeeping promises, checked by brute force after every event
    /// (unit tests only).
    #[cfg(test)]
    fn check_invariants(&self) {
        assert!(self.idle.is_empty() || self.queue.is_empty(), "idle GPU while jobs wait");
        let (mut busy, mut shared, mut open) = (0, 0, 0);
        for g in 0..self.slots.len() / 2 {
            let (a, b) = (self.slots[2 * g], self.slots[2 * g + 1]);
            assert!(b == NONE || a != NONE, "GPU {g}: partner without a first job");
            busy += usize::from(a != NONE);
            shared += usize::from(b != NONE);
            let listed = self
                .open
                .iter()
                .position(|by_user| by_user.values().any(|set| set.contains(&(g as u32))));
            let alone = a != NONE && b == NONE;
            let shareable = alone
                && self.policy.shares()
                && !self.policy.at_start_only()
                && !self.st[a as usize].alone_only;
            if shareable {
                let wa = self.workload(a);
                assert_eq!(listed, Some(usize::from(wa)), "GPU {g}: alone, shareable, not open");
                assert!(
                    self.open[usize::from(wa)]
                        .get(&self.open_user(a))
                        .is_some_and(|set| set.contains(&(g as u32))),
                    "GPU {g}: open under another user"
                );
                for &c in self.queue.iter().take(self.window) {
                    let acceptable = !self.st[c as usize].alone_only
                        && self.policy.users_may_share(self.user(a), self.user(c))
                        && self.policy.score(wa, self.workload(c)).is_some();
                    assert!(!acceptable, "GPU {g} is open but job {c} in the window fits");
                }
                open += 1;
            } else {
                assert_eq!(listed, None, "GPU {g} is open but cannot take a partner");
            }
        }
        assert_eq!((busy, shared, open), (self.busy, self.shared, self.open_total));
        for g in 0..self.slots.len() / 2 {
            assert_eq!(self.power[g] > 0.0, self.slots[2 * g] != NONE, "GPU {g}: power when idle");
        }
        let sum: f64 = self.power.iter().sum();
        assert!(
            (sum - self.power_sum).abs() < 1e-6 * (1.0 + sum),
            "power {sum} vs {}",
            self.power_sum
        );
        assert_eq!(self.running, busy + shared);
    }

    /// Whether a finish event was superseded (its job's rate changed) or its job is done.
    fn stale(&self, ev: &Event) -> bool {
        self.st[ev.job as usize].version != ev.version || !self.finish[ev.job as usize].is_nan()
    }

    /// A night: the hook reads the day's colocations and may replace the policy; every open
    /// GPU is then asked again, since the new table may accept a candidate the old refused.
    fn night(&mut self, hook: &mut dyn Nights, night: u32) -> Result<(), SimError> {
        self.nights += 1;
        let ended = std::mem::take(&mut self.ended);
        let Some(next) = hook.night(night, &ended)? else { return Ok(()) };
        if !self.policy.replaceable_by(&next) {
            return Err(SimError::Config(format!(
                "night {night}: a {} policy cannot replace {} mid-run",
                next.kind().key(),
                self.policy.kind().key()
            )));
        }
        self.policy = Cow::Owned(next);
        let mut open: Vec<u32> = self
            .open
            .iter_mut()
            .flat_map(|by_user| std::mem::take(by_user).into_values().flatten())
            .collect();
        open.sort_unstable();
        self.open_total = 0;
        for g in open {
            let first = self.slots[2 * g as usize];
            self.fill(g, first);
        }
        Ok(())
    }

    fn workload(&self, j: u32) -> WorkloadId {
        self.jobs[j as usize].workload
    }

    fn user(&self, j: u32) -> UserId {
        self.jobs[j as usize].user
    }

    /// The user an open GPU whose job is `j` is listed under.
    fn open_user(&self, j: u32) -> UserId {
        if self.policy.same_user() {
            self.user(j)
        } else {
            0
        }
    }

    fn advance(&mut self, t: f64) {
        let dt = t - self.now;
        if dt > 0.0 {
            self.busy_gpu_s += self.busy as f64 * dt;
            self.shared_gpu_s += self.shared as f64 * dt;
            self.busy_energy_s += self.power_sum * dt;
            if !self.queue.is_empty() {
                self.queued_s += dt;
            }
            self.timeline.add(self.now, t, self.busy as f64, self.running as f64);
            self.now = t;
        }
    }

    /// Brings the job's remaining steps up to now, switches it to `rate` and reschedules its end.
    fn set_rate(&mut self, j: u32, rate: f64) {
        let now = self.now;
        let s = &mut self.st[j as usize];
        s.remaining = (s.remaining - s.rate * (now - s.last)).max(0.0);
        s.rate = rate;
        s.last = now;
        s.version = s.version.wrapping_add(1);
        self.heap.push(Event { t: now + s.remaining / rate, job: j, version: s.version });
    }

    /// GPU g's modelled power from now on.
    fn set_power(&mut self, g: u32, power: f64) {
        let old = std::mem::replace(&mut self.power[g as usize], power);
        self.power_sum += power - old;
    }

    /// Sets the rates of the jobs on GPU g from the ground truth, and its modelled power.
    fn retime(&mut self, g: u32) {
        let (a, b) = (self.slots[2 * g as usize], self.slots[2 * g as usize + 1]);
        if b == NONE {
            self.set_rate(a, self.world.exclusive(self.workload(a)));
            let p = group_power([(self.world.profile(self.workload(a)), 1.0)]);
            self.set_power(g, p);
            return;
        }
        let (wa, wb) = (self.workload(a), self.workload(b));
        let (ra, rb) = match self.world.pair(wa, wb) {
            PairKind::Measured { first, second } => (first, second),
            // Never formed: policies refuse unknown pairs and over-memory joins fail first.
            PairKind::OverMemory | PairKind::Unknown => {
                (self.world.exclusive(wa), self.world.exclusive(wb))
            }
        };
        self.set_rate(a, ra);
        self.set_rate(b, rb);
        let p = group_power([
            (self.world.profile(wa), ra / self.world.exclusive(wa)),
            (self.world.profile(wb), rb / self.world.exclusive(wb)),
        ]);
        self.set_power(g, p);
    }

    fn place(&mut self, g: u32, j: u32) {
        let base = 2 * g as usize;
        if self.slots[base] == NONE {
            self.slots[base] = j;
            self.busy += 1;
        } else {
            self.slots[base + 1] = j;
            self.shared += 1;
            self.pairings += 1;
            if self.policy.seen(self.workload(self.slots[base]), self.workload(j)) {
                self.pairings_seen += 1;
            }
        }
        self.st[j as usize].gpu = g;
        self.start[j as usize] = self.now;
        self.running += 1;
        self.started += 1;
        self.retime(g);
        if self.started == self.jobs.len() {
            self.snapshot();
        }
    }

    fn snapshot(&mut self) {
        let (mut steps, mut work) = (self.done_steps, self.done_work);
        for &j in self.slots.iter().filter(|&&j| j != NONE) {
            let s = &self.st[j as usize];
            let left = (s.remaining - s.rate * (self.now - s.last)).max(0.0);
            let done = self.jobs[j as usize].steps - left;
            steps += done;
            work += done / self.world.exclusive(self.workload(j));
        }
        self.sustained =
            Some(Sustained { until: self.now, steps, work_s: work, queued_s: self.queued_s });
    }

    fn arrive(&mut self, j: u32) {
        self.queue.push_back(j);
        if let Some(g) = self.idle.pop() {
            self.start_lead(g);
        } else if self.queue.len() <= self.window {
            self.offer(self.queue.len() - 1);
        }
    }

    fn complete(&mut self, j: u32) {
        let g = self.st[j as usize].gpu;
        let base = 2 * g as usize;
        self.finish[j as usize] = self.now;
        self.running -= 1;
        let steps = self.jobs[j as usize].steps;
        self.done_steps += steps;
        self.done_work += steps / self.world.exclusive(self.workload(j));
        if self.slots[base + 1] != NONE {
            if self.observing {
                let (a, b) = (self.slots[base], self.slots[base + 1]);
                self.ended.push(Colocation {
                    first: self.workload(a),
                    second: self.workload(b),
                    users: [self.user(a), self.user(b)],
                    start_s: self.start[b as usize],
                    end_s: self.now,
                });
            }
            if self.slots[base] == j {
                self.slots[base] = self.slots[base + 1];
            }
            self.slots[base + 1] = NONE;
            self.shared -= 1;
            let survivor = self.slots[base];
            self.retime(g);
            if !self.policy.at_start_only() {
                self.fill(g, survivor);
            }
            return;
        }
        self.slots[base] = NONE;
        self.busy -= 1;
        self.set_power(g, 0.0);
        let (w, u) = (usize::from(self.workload(j)), self.open_user(j));
        if self.open[w].get_mut(&u).is_some_and(|set| set.remove(&g)) {
            self.open_total -= 1;
        }
        if self.queue.is_empty() {
            self.idle.push(g);
        } else {
            self.start_lead(g);
        }
    }

    fn start_lead(&mut self, g: u32) {
        let Some(lead) = self.queue.pop_front() else {
            self.idle.push(g);
            return;
        };
        self.place(g, lead);
        self.window_moved();
        self.fill(g, lead);
    }

    /// Asks the policy for a partner of `first`, alone on GPU g.
    fn fill(&mut self, g: u32, first: u32) {
        if !self.policy.shares() || self.st[first as usize].alone_only {
            return;
        }
        let (wf, uf) = (self.workload(first), self.user(first));
        loop {
            let mut best: Option<(usize, f64)> = None;
            for (pos, &c) in self.queue.iter().take(self.window).enumerate() {
                if self.st[c as usize].alone_only || !self.policy.users_may_share(uf, self.user(c))
                {
                    continue;
                }
                if let Some(s) = self.policy.score(wf, self.jobs[c as usize].workload) {
                    if best.is_none_or(|(_, b)| s > b) {
                        best = Some((pos, s));
                    }
                }
            }
            let Some((pos, _)) = best else {
                // Kace at start only: a lead that found no partner stays alone.
                let key = self.open_user(first);
                if !self.policy.at_start_only()
                    && self.open[usize::from(wf)].entry(key).or_default().insert(g)
                {
                    self.open_total += 1;
                }
                return;
            };
            let c = self.queue[pos];
            if self.world.pair(wf, self.workload(c)) == PairKind::OverMemory {
                self.oom(c);
                continue;
            }
            self.queue.remove(pos);
            self.place(g, c);
            self.window_moved();
            return;
        }
    }

    fn oom(&mut self, j: u32) {
        self.out_ooms += 1;
        self.st[j as usize].alone_only = true;
    }

    /// A job left the window: the one that slid into its last place is offered to open GPUs
    /// (and the next, while offers succeed).
    fn window_moved(&mut self) {
        while self.open_total > 0 && self.queue.len() >= self.window {
            if !self.offer(self.window - 1) {
                break;
            }
        }
    }

    /// Offers the queued job at `pos` to the open GPU that values it most. Returns whether it
    /// was placed.
    fn offer(&mut self, pos: usize) -> bool {
        if self.open_total == 0 || !self.policy.shares() {
            return false;
        }
        let j = self.queue[pos];
        if self.st[j as usize].alone_only {
            return false;
        }
        let (wj, uj) = (self.workload(j), self.open_user(j));
        let mut best: Option<(usize, f64)> = None;
        for (a, by_user) in self.open.iter().enumerate() {
            if by_user.get(&uj).is_none_or(BTreeSet::is_empty) {
                continue;
            }
            if let Some(s) = self.policy.score(a as WorkloadId, wj) {
                if best.is_none_or(|(_, b)| s > b) {
                    best = Some((a, s));
                }
            }
        }
        let Some((a, _)) = best else { return false };
        if self.world.pair(a as WorkloadId, wj) == PairKind::OverMemory {
            self.oom(j);
            return false;
        }
        let Some(g) = self.open[a].get_mut(&uj).and_then(BTreeSet::pop_first) else {
            return false;
        };
        self.open_total -= 1;
        self.queue.remove(pos);
        // No recursion into `window_moved`: its caller's loop offers the next entrant.
        self.place(g, j);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;
    use crate::trace::{generate, TraceSpec};
    use crate::world::tests_support::tiny_world;
    use kace_selector::SelectionRules;

    fn job(world: &World, submit: f64, w: &str, steps: f64) -> Job {
        Job { submit, workload: world.id(w).expect("known workload"), steps, user: 0 }
    }

    fn rules() -> SelectionRules {
        SelectionRules { gpu_memory_gib: Some(32.0), memory_margin: 0.0, ..Default::default() }
    }

    fn assert_times(got: &[f64], want: &[f64]) {
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!((g - w).abs() < 1e-9, "job {i}: {g} vs {w} (all: {got:?})");
        }
    }

    #[test]
    fn exclusive_fifo_runs_one_job_per_gpu_in_order() {
        let w = tiny_world();
        // a alone: 10 steps/s, b alone: 5 steps/s.
        let jobs = [job(&w, 0.0, "a", 100.0), job(&w, 0.0, "b", 50.0), job(&w, 1.0, "a", 50.0)];
        let o = simulate(&w, &PairingPolicy::exclusive(&w), &jobs, 2, 8).unwrap();
        // Both GPUs free at t = 10; job 0's completion comes first (lower index), job 2 takes
        // its GPU and runs 50 / 10 = 5 s.
        assert_times(&o.start, &[0.0, 0.0, 10.0]);
        assert_times(&o.finish, &[10.0, 10.0, 15.0]);
        assert_eq!((o.ooms, o.pairings), (0, 0));
        assert!((o.busy_gpu_s - 25.0).abs() < 1e-9);
        assert!((o.busy_gpu_s - o.total_work_s).abs() < 1e-9);
        let m = Metrics::of(&o);
        assert_eq!(m.makespan_s, 15.0);
        assert!((m.mean_wait_s - 3.0).abs() < 1e-12);
        assert!((m.mean_jct_s - (10.0 + 10.0 + 14.0) / 3.0).abs() < 1e-12);
    }

    #[test]
    fn queue_order_pairs_in_order_rates_change_and_ooms_are_counted() {
        let w = tiny_world();
        let jobs = [
            job(&w, 0.0, "a", 120.0),
            job(&w, 0.0, "b", 40.0),
            job(&w, 0.0, "c", 8.0),
            job(&w, 0.0, "b", 30.0),
        ];
        let o = simulate(&w, &PairingPolicy::queue_order(&w), &jobs, 1, 8).unwrap();
        // t=0: a leads, b joins: a 6, b 4 steps/s; b ends at 40 / 4 = 10 with a at 60 left.
        // t=10: the head, c, joins a and runs out of memory (10 + 25 > 32 GiB); the next b
        // joins: a 6, b 4; b ends at 10 + 30 / 4 = 17.5, a has 60 − 45 = 15 left.
        // t=17.5: a alone at 10 steps/s ends at 19; c (alone only now) leads: 8 / 4 → 21.
        assert_times(&o.start, &[0.0, 0.0, 19.0, 10.0]);
        assert_times(&o.finish, &[19.0, 10.0, 21.0, 17.5]);
        assert_eq!((o.ooms, o.pairings), (1, 2));
        assert!((o.shared_gpu_s - 17.5).abs() < 1e-9);
        assert!((o.busy_gpu_s - 21.0).abs() < 1e-9);
        // Sustained throughput is measured when c started (t = 19): everything but c was done.
        assert!((o.sustained.until - 19.0).abs() < 1e-9);
        assert!((o.sustained.steps - 190.0).abs() < 1e-9);
    }

    #[test]
    fn oracle_applies_the_gain_rule_and_a_survivor_gets_a_new_partner() {
        let w = tiny_world();
        // a beside b progresses 6/10 + 4/5 = 1.4 of one job alone, b beside b 3/5 + 3/5 = 1.2.
        let strict = SelectionRules { min_gain: 0.3, ..rules() };
        let o = PairingPolicy::oracle(&w, &strict);
        let jobs = [job(&w, 0.0, "b", 30.0), job(&w, 0.0, "a", 60.0), job(&w, 0.0, "b", 30.0)];
        let r = simulate(&w, &o, &jobs, 1, 8).unwrap();
        // t=0: b leads and takes a (1.4 > 1.3), not b (1.2): b ends at 30 / 4 = 7.5, a has 15
        // left. t=7.5: the survivor a takes the last b as its new partner: a ends at 10, b has
        // 20 left and runs alone at 5 to 14.
        assert_times(&r.start, &[0.0, 0.0, 7.5]);
        assert_times(&r.finish, &[7.5, 10.0, 14.0]);
        // Two b's: 1.2 is below the threshold, so they run one after the other; without the
        // threshold they share at 3 steps/s each.
        let bb = [job(&w, 0.0, "b", 30.0), job(&w, 0.0, "b", 30.0)];
        let r = simulate(&w, &o, &bb, 1, 8).unwrap();
        assert_times(&r.finish, &[6.0, 12.0]);
        let r = simulate(&w, &PairingPolicy::oracle(&w, &rules()), &bb, 1, 8).unwrap();
        assert_times(&r.finish, &[10.0, 10.0]);
    }

    /// Predicts a group's summed exclusive throughput: every fitting pair beats a job alone.
    struct Optimist;
    impl kace_selector::Predictor for Optimist {
        fn predict(&self, m: &[kace_selector::Member<'_>], _: kace_selector::Objective) -> f64 {
            m.iter().map(|m| m.profile.exclusive_throughput()).sum()
        }
    }

    #[test]
    fn kace_at_start_neither_refills_nor_takes_late_arrivals() {
        let w = tiny_world();
        let deployed = PairingPolicy::kace(&w, &Optimist, &rules());
        let at_start = PairingPolicy::kace_at_start(&w, &Optimist, &rules());
        // A late arrival: a leads alone at t=0, b arrives at t=2.
        let late = [job(&w, 0.0, "a", 100.0), job(&w, 2.0, "b", 20.0)];
        let o = simulate(&w, &deployed, &late, 1, 8).unwrap();
        assert_times(&o.start, &[0.0, 2.0]);
        let o = simulate(&w, &at_start, &late, 1, 8).unwrap();
        assert!(o.start[1] >= o.finish[0] - 1e-9, "joined an open GPU: {o:?}");
        // A survivor: a takes b at t=0; when b ends, the deployed mechanism gives a the next b.
        let survivor = [job(&w, 0.0, "a", 100.0), job(&w, 0.0, "b", 8.0), job(&w, 0.0, "b", 8.0)];
        let o = simulate(&w, &deployed, &survivor, 1, 8).unwrap();
        assert!(o.start[2] < o.finish[0], "no refill: {o:?}");
        assert_eq!(o.pairings, 2);
        let o = simulate(&w, &at_start, &survivor, 1, 8).unwrap();
        assert!(o.start[2] >= o.finish[0] - 1e-9, "refilled: {o:?}");
        assert_eq!(o.pairings, 1);
    }

    /// Predicts every pair slower than one job alone: every pair is refused.
    struct Pessimist;
    impl kace_selector::Predictor for Pessimist {
        fn predict(&self, _: &[kace_selector::Member<'_>], _: kace_selector::Objective) -> f64 {
            0.0
        }
    }

    /// A night hook that keeps what each night is given and hands `next` over at night `at`.
    struct Swap {
        at: u32,
        next: Option<PairingPolicy>,
        given: Vec<(u32, Vec<Colocation>)>,
    }
    impl Nights for Swap {
        fn night(
            &mut self,
            n: u32,
            ended: &[Colocation],
        ) -> Result<Option<PairingPolicy>, SimError> {
            self.given.push((n, ended.to_vec()));
            Ok(if n == self.at { self.next.take() } else { None })
        }
    }

    #[test]
    fn a_policy_handed_over_at_night_is_asked_for_every_open_gpu() {
        let w = tiny_world();
        // a runs two days alone unless b joins; b waits from t = 1.
        let jobs = [job(&w, 0.0, "a", 10.0 * 2.0 * DAY_S), job(&w, 1.0, "b", 20.0)];
        let refusing = PairingPolicy::kace(&w, &Pessimist, &rules());
        let o = simulate(&w, &refusing, &jobs, 1, 8).unwrap();
        assert_times(&o.start, &[0.0, 2.0 * DAY_S]);
        let accepting = PairingPolicy::kace(&w, &Optimist, &rules());
        let mut hook = Swap { at: 1, next: Some(accepting), given: Vec::new() };
        let o = simulate_with_nights(&w, &refusing, &jobs, 1, 8, &mut hook).unwrap();
        // The open GPU takes b as soon as the night's table accepts it: 20 steps at 4/s.
        assert_times(&o.start, &[0.0, DAY_S]);
        assert_times(&o.finish[1..], &[DAY_S + 5.0]);
        assert_eq!(o.pairings, 1);
        // Once b has started, no decision is left: no second night while a runs on.
        assert_eq!(o.nights, 1);
        assert_eq!(hook.given, vec![(1, Vec::new())]);
    }

    #[test]
    fn nights_that_keep_the_policy_change_no_decision_and_report_each_days_pairs() {
        let w = tiny_world();
        for seed in 1..=3 {
            // About 11 days of arrivals.
            let users = crate::trace::UserMix { users: 3, skew: 0.0, workloads_per_user: 0 };
            let spec = TraceSpec { users, ..TraceSpec::new(2_000, 1.2, 3, seed) };
            let jobs = generate(&w, &spec).unwrap();
            for p in
                [PairingPolicy::kace(&w, &Optimist, &rules()), PairingPolicy::oracle(&w, &rules())]
            {
                let plain = simulate(&w, &p, &jobs, 3, 4).unwrap();
                let mut hook = Swap { at: 0, next: None, given: Vec::new() };
                let o = simulate_with_nights(&w, &p, &jobs, 3, 4, &mut hook).unwrap();
                assert_eq!((o.start.clone(), o.finish.clone()), (plain.start, plain.finish));
                assert_eq!((o.pairings, o.events), (plain.pairings, plain.events));
                assert!(o.nights >= 5, "{}", o.nights);
                assert_eq!(hook.given.len(), o.nights as usize);
                let mut reported = 0;
                for (n, ended) in &hook.given {
                    let (from, to) = (f64::from(n - 1) * DAY_S, f64::from(*n) * DAY_S);
                    for c in ended {
                        assert!(c.start_s <= c.end_s && c.end_s > from && c.end_s <= to, "{c:?}");
                        assert!(w.pair(c.first, c.second) != PairKind::Unknown);
                    }
                    reported += ended.len();
                }
                assert!(reported > 0 && reported as u64 <= o.pairings, "{reported}");
            }
        }
    }

    #[test]
    fn a_policy_of_another_kind_cannot_take_over() {
        let w = tiny_world();
        let jobs = [job(&w, 0.0, "a", 10.0 * 2.0 * DAY_S), job(&w, 1.0, "b", 20.0)];
        let refusing = PairingPolicy::kace(&w, &Pessimist, &rules());
        let mut hook =
            Swap { at: 1, next: Some(PairingPolicy::oracle(&w, &rules())), given: Vec::new() };
        let e = simulate_with_nights(&w, &refusing, &jobs, 1, 8, &mut hook).unwrap_err();
        assert!(matches!(&e, SimError::Config(m) if m.contains("night 1")), "{e}");
    }

    #[test]
    fn only_one_users_jobs_share_unless_multi_user() {
        let w = tiny_world();
        let mine = |submit, wl, steps, user| Job { user, ..job(&w, submit, wl, steps) };
        // a (user 0) leads; b of user 1 is held, then b of user 0 arrives at t = 1.
        let jobs = [mine(0.0, "a", 100.0, 0), mine(0.0, "b", 20.0, 1), mine(1.0, "b", 20.0, 0)];
        let rule = PairingPolicy::kace(&w, &Optimist, &rules());
        let o = simulate(&w, &rule, &jobs, 1, 8).unwrap();
        // User 1's b never joins a: user 0's later b does (an open GPU, under the rule's index).
        assert_eq!(o.start[2], 1.0, "{o:?}");
        assert!(o.start[1] >= o.finish[0] - 1e-9, "shared across users: {o:?}");
        let multi = simulate(&w, &rule.multi_user(true), &jobs, 1, 8).unwrap();
        assert_eq!(multi.start[1], 0.0, "{multi:?}");
        // Queue order (Slurm's plain shards) pairs whoever is next.
        let q = simulate(&w, &PairingPolicy::queue_order(&w), &jobs, 1, 8).unwrap();
        assert_eq!(q.start[1], 0.0, "{q:?}");
    }

    #[test]
    fn the_window_bounds_the_candidates_and_open_gpus_get_later_entrants() {
        let w = tiny_world();
        let jobs = [job(&w, 0.0, "a", 100.0), job(&w, 1.0, "c", 4.0), job(&w, 2.0, "b", 20.0)];
        let memcap = PairingPolicy::memcap(&w, &rules());
        // Window 1: c (does not fit) blocks b from a's view until a ends at 10.
        let o = simulate(&w, &memcap, &jobs, 1, 1).unwrap();
        assert_times(&o.start, &[0.0, 10.0, 11.0]);
        // c (4 steps at 4/s) ends at 11; b then leads: 20 / 5 → 15.
        assert_times(&o.finish, &[10.0, 11.0, 15.0]);
        // Window 2: b arrives inside the window and the open GPU takes it at t = 2.
        let o = simulate(&w, &memcap, &jobs, 1, 2).unwrap();
        // a: 20 steps by t=2, then 6/s; b: 20 / 4 → 7; a: 80 − 30 = 50 at 10/s → 12.
        assert_times(&o.start, &[0.0, 12.0, 2.0]);
        assert_times(&o.finish, &[12.0, 13.0, 7.0]);
        assert_eq!(o.ooms, 0, "memcap knows memory");
    }

    #[test]
    fn bad_configurations_are_errors() {
        let w = tiny_world();
        let jobs = [job(&w, 0.0, "a", 1.0)];
        let p = PairingPolicy::exclusive(&w);
        assert!(matches!(simulate(&w, &p, &jobs, 0, 8), Err(SimError::Config(_))));
        assert!(matches!(simulate(&w, &p, &jobs, 1, 0), Err(SimError::Config(_))));
        assert!(matches!(simulate(&w, &p, &[], 1, 8), Err(SimError::Config(_))));
        let bad = [Job { submit: 0.0, workload: 9, steps: 1.0, user: 0 }];
        assert!(matches!(simulate(&w, &p, &bad, 1, 8), Err(SimError::Config(_))));
        let bad = [Job { submit: f64::NAN, workload: 0, steps: 1.0, user: 0 }];
        assert!(matches!(simulate(&w, &p, &bad, 1, 8), Err(SimError::Config(_))));
    }

    #[test]
    fn bookkeeping_holds_under_random_traces_windows_and_loads() {
        // `check_invariants` runs after every event of every simulation in unit tests.
        let w = tiny_world();
        for (seed, load, gpus, window) in
            [(1, 0.5, 3, 1), (2, 0.9, 4, 2), (3, 1.5, 5, 3), (4, 3.0, 2, 8), (5, 1.0, 7, 4)]
        {
            let users = crate::trace::UserMix { users: 5, skew: 1.0, workloads_per_user: 2 };
            for spec in [
                TraceSpec::new(400, load, gpus, seed),
                TraceSpec { users, ..TraceSpec::new(400, load, gpus, seed) },
            ] {
                let jobs = generate(&w, &spec).unwrap();
                for p in [
                    PairingPolicy::exclusive(&w),
                    PairingPolicy::queue_order(&w),
                    PairingPolicy::memcap(&w, &rules()),
                    PairingPolicy::oracle(&w, &rules()),
                    PairingPolicy::oracle(&w, &rules()).multi_user(true),
                ] {
                    let o = simulate(&w, &p, &jobs, gpus, window).unwrap();
                    assert!(o.finish.iter().all(|f| f.is_finite()));
                }
            }
        }
    }

    #[test]
    fn every_job_runs_once_and_work_is_conserved() {
        let w = tiny_world();
        let jobs = generate(&w, &TraceSpec::new(3_000, 1.5, 16, 9)).unwrap();
        for p in [
            PairingPolicy::exclusive(&w),
            PairingPolicy::queue_order(&w),
            PairingPolicy::memcap(&w, &rules()),
            PairingPolicy::oracle(&w, &rules()),
        ] {
            let o = simulate(&w, &p, &jobs, 16, 8).unwrap();
            for (i, j) in jobs.iter().enumerate() {
                assert!(o.start[i] >= j.submit && o.finish[i] > o.start[i], "{i}");
            }
            // No GPU ever holds more than two jobs, nor is busy for longer than the run.
            let m = Metrics::of(&o);
            assert!(o.busy_gpu_s <= 16.0 * m.makespan_s + 1e-6);
            assert!(o.shared_gpu_s <= o.busy_gpu_s + 1e-6);
            if p.kind() == PolicyKind::Exclusive {
                assert!((o.busy_gpu_s - o.total_work_s).abs() < 1e-6 * o.total_work_s);
                // Alone, each job draws its own modelled power for its length alone.
                let energy: f64 = jobs
                    .iter()
                    .map(|j| {
                        j.steps / w.exclusive(j.workload)
                            * group_power([(w.profile(j.workload), 1.0)])
                    })
                    .sum();
                assert!((o.busy_energy_s - energy).abs() < 1e-6 * energy, "{}", o.busy_energy_s);
            }
            // A busy GPU draws at least its idle power and at most its busy power.
            let idle = kace_selector::energy::IDLE_POWER_FRACTION;
            assert!(o.busy_energy_s >= idle * o.busy_gpu_s - 1e-6);
            assert!(o.busy_energy_s <= o.busy_gpu_s + 1e-6);
            assert!(o.sustained.steps <= o.total_steps + 1e-6);
        }
    }
}
