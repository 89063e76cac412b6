//! The pairing policies the simulator compares, each reduced to one table: for the workload on
//! a GPU and a pending candidate's workload, is the candidate acceptable and how good is it.
//! A job's choice depends only on the two workloads, so the table is computed once per world
//! and a choice inside the simulation is a lookup per candidate.

use kace_selector::decision::{decide, GpuState, Joiner, OnGpu, Policy as DecisionPolicy};
use kace_selector::{Objective, Predictor, SelectionRules};

use crate::trace::UserId;
use crate::world::{PairKind, WorkloadId, World};

/// Which policy a [`PairingPolicy`] implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PolicyKind {
    /// One job per GPU, first come first served: the baseline.
    Exclusive,
    /// Two slots per GPU; a free slot takes the first pending job (Slurm's gres/shard).
    QueueOrder,
    /// A free slot takes the pending job with the smallest memcap that fits.
    Memcap,
    /// kace as deployed: the job kace's one decision predicts best, whenever a GPU has room
    /// (a lead's start, a partner's end, a later arrival while the GPU is open).
    Kace,
    /// kace choosing only at a lead's start (kace before the refill and dispatch of open
    /// GPUs): a survivor runs alone until it ends, and a lead that found no partner never gets
    /// one.
    KaceAtStart,
    /// As kace, with the measured throughput instead of a prediction.
    Oracle,
}

impl PolicyKind {
    /// Every policy, in report order.
    pub const ALL: [PolicyKind; 6] = [
        PolicyKind::Exclusive,
        PolicyKind::QueueOrder,
        PolicyKind::Memcap,
        PolicyKind::KaceAtStart,
        PolicyKind::Kace,
        PolicyKind::Oracle,
    ];

    /// Stable name (CLI, JSON).
    pub fn key(self) -> &'static str {
        match self {
            PolicyKind::Exclusive => "exclusive",
            PolicyKind::QueueOrder => "queue-order",
            PolicyKind::Memcap => "memcap",
            PolicyKind::Kace => "kace",
            PolicyKind::KaceAtStart => "kace-at-start",
            PolicyKind::Oracle => "oracle",
        }
    }

    /// Parses [`PolicyKind::key`].
    pub fn from_key(s: &str) -> Option<PolicyKind> {
        PolicyKind::ALL.into_iter().find(|p| p.key() == s)
    }
}

/// A policy as the simulator runs it: `score[first × n + candidate]` is `None` when the
/// candidate may not join a GPU running `first`, else its merit (higher is better; ties go to
/// the earlier job in the queue).
#[derive(Debug, Clone, PartialEq)]
pub struct PairingPolicy {
    kind: PolicyKind,
    n: usize,
    score: Vec<Option<f64>>,
    /// Pairs the policy learnt from (kace's training pairs), to report how often it formed
    /// one it had seen; empty when not applicable.
    seen: Vec<bool>,
    /// Whether only jobs of one user may share a GPU (MPS's per-user servers; off under
    /// `mps.multi_user`).
    same_user: bool,
}

impl PairingPolicy {
    fn table(
        kind: PolicyKind,
        world: &World,
        f: impl Fn(WorkloadId, WorkloadId) -> Option<f64>,
    ) -> PairingPolicy {
        let n = world.len();
        let mut score = Vec::with_capacity(n * n);
        for a in 0..n {
            for b in 0..n {
                let (a, b) = (a as WorkloadId, b as WorkloadId);
                // Unmeasured pairs have no ground truth: no policy may form them.
                let s = if world.pair(a, b) == PairKind::Unknown { None } else { f(a, b) };
                score.push(s);
            }
        }
        // The policies that run on kace's MPS set-up keep MPS's same-user rule; Slurm's plain
        // shards (queue order) pair whoever comes next.
        let same_user = !matches!(kind, PolicyKind::Exclusive | PolicyKind::QueueOrder);
        PairingPolicy { kind, n, score, seen: Vec::new(), same_user }
    }

    /// No sharing.
    pub fn exclusive(world: &World) -> PairingPolicy {
        PairingPolicy::table(PolicyKind::Exclusive, world, |_, _| None)
    }

    /// Slurm's shard gres: any pending job joins, in queue order. It does not know memory, so
    /// it forms pairs that run out of it.
    pub fn queue_order(world: &World) -> PairingPolicy {
        PairingPolicy::table(PolicyKind::QueueOrder, world, |_, _| Some(0.0))
    }

    /// The smallest-memcap rule: among jobs that fit in `rules`' usable memory, the smallest.
    pub fn memcap(world: &World, rules: &SelectionRules) -> PairingPolicy {
        let usable = usable_memory(world, rules);
        PairingPolicy::table(PolicyKind::Memcap, world, |a, b| {
            let need = world.profile(a).memcap() + world.profile(b).memcap();
            (need <= usable).then(|| -world.profile(b).memcap())
        })
    }

    /// kace: the production decision ([`decide`]) with `predictor` and `rules` (memory fit,
    /// gain threshold), one candidate at a time; the merit is the predicted objective. Users
    /// are not in the table: the engine applies the same-user rule ([`PairingPolicy::users_may_share`])
    /// at lookup, as the decision would for two named users.
    pub fn kace(world: &World, predictor: &dyn Predictor, rules: &SelectionRules) -> PairingPolicy {
        PairingPolicy::kace_as(PolicyKind::Kace, world, predictor, rules)
    }

    /// kace deciding only at a lead's start (see [`PolicyKind::KaceAtStart`]).
    pub fn kace_at_start(
        world: &World,
        predictor: &dyn Predictor,
        rules: &SelectionRules,
    ) -> PairingPolicy {
        PairingPolicy::kace_as(PolicyKind::KaceAtStart, world, predictor, rules)
    }

    fn kace_as(
        kind: PolicyKind,
        world: &World,
        predictor: &dyn Predictor,
        rules: &SelectionRules,
    ) -> PairingPolicy {
        let policy = DecisionPolicy {
            // A table holds no per-workload state, so it cannot spend an exploration budget
            // (`selection.explore_pairs` counts each workload's exploratory groups): an
            // exploratory pair would be formed without bound. None; a nightly retraining
            // (`crate::retraining`) learns only from the pairs the gain rule accepts.
            rules: SelectionRules { explore_pairs: 0, ..rules.clone() },
            max_jobs_per_gpu: 2,
            // Users are checked by the engine, so the table holds every user's pairs.
            multi_user: true,
            ..DecisionPolicy::default()
        };
        PairingPolicy::table(kind, world, |a, b| {
            let cand =
                [Joiner { profile: Some(world.profile(b)), workload: world.name(b), user: None }];
            let running =
                [OnGpu { profile: world.profile(a), workload: world.name(a), user: None }];
            let gpu = GpuState {
                running: &running,
                memory_gib: rules.gpu_memory_gib,
                failed_pairs: &[],
                explored: &[],
                vouched: &[],
            };
            let d = decide(&gpu, &cand, predictor, &policy);
            d.chosen().and(d.selection.verdicts[0].prediction)
        })
    }

    /// kace's rules with perfect knowledge: the pair must fit in usable memory and its measured
    /// normalised progress (Σ colocated / exclusive) beat the job on the GPU alone (1) by
    /// `rules.min_gain`, as `select`'s gain rule asks; its merit is the measured objective.
    pub fn oracle(world: &World, rules: &SelectionRules) -> PairingPolicy {
        let usable = usable_memory(world, rules);
        PairingPolicy::table(PolicyKind::Oracle, world, |a, b| {
            let PairKind::Measured { first, second } = world.pair(a, b) else { return None };
            let need = world.profile(a).memcap() + world.profile(b).memcap();
            let progress = first / world.exclusive(a) + second / world.exclusive(b);
            let merit = match rules.objective {
                Objective::ThroughputSum => first + second,
                Objective::NormalisedProgress => progress,
                Objective::Energy => kace_selector::energy::work_per_energy([
                    (world.profile(a), first / world.exclusive(a)),
                    (world.profile(b), second / world.exclusive(b)),
                ]),
            };
            (need <= usable && progress > 1.0 + rules.min_gain).then_some(merit)
        })
    }

    /// Marks the pairs (by workload name) the policy was trained on, for reporting.
    pub fn with_seen_pairs(mut self, world: &World, pairs: &[[String; 2]]) -> PairingPolicy {
        self.seen = vec![false; self.n * self.n];
        for [a, b] in pairs {
            if let (Some(a), Some(b)) = (world.id(a), world.id(b)) {
                let (a, b) = (usize::from(a), usize::from(b));
                self.seen[a * self.n + b] = true;
                self.seen[b * self.n + a] = true;
            }
        }
        self
    }

    /// The policy with `mps.multi_user` set as given: on, jobs of different users may share a
    /// GPU (one MPS server for all users, no isolation between them); off (the default), only
    /// one user's jobs share.
    pub fn multi_user(mut self, on: bool) -> PairingPolicy {
        self.same_user =
            !on && !matches!(self.kind, PolicyKind::Exclusive | PolicyKind::QueueOrder);
        self
    }

    /// Whether a job of `candidate` may join a GPU running a job of `first`.
    #[inline]
    pub fn users_may_share(&self, first: UserId, candidate: UserId) -> bool {
        !self.same_user || first == candidate
    }

    /// Whether the same-user rule applies.
    pub fn same_user(&self) -> bool {
        self.same_user
    }

    /// Which policy this is.
    pub fn kind(&self) -> PolicyKind {
        self.kind
    }

    /// Whether the policy ever puts two jobs on a GPU.
    pub fn shares(&self) -> bool {
        self.kind != PolicyKind::Exclusive
    }

    /// Whether a GPU asks for a partner only when its lead starts: no refill when a partner
    /// leaves, and no later arrival for a GPU whose lead found none.
    pub fn at_start_only(&self) -> bool {
        self.kind == PolicyKind::KaceAtStart
    }

    /// The merit of `candidate` joining a GPU running `first`, or `None` if it may not.
    #[inline]
    pub fn score(&self, first: WorkloadId, candidate: WorkloadId) -> Option<f64> {
        self.score[usize::from(first) * self.n + usize::from(candidate)]
    }

    /// Whether `other` may take over from this policy mid-run: the same kind, over a world of
    /// as many workloads, with the same user rule (the engine's open-GPU index depends on it).
    pub fn replaceable_by(&self, other: &PairingPolicy) -> bool {
        self.kind == other.kind && self.n == other.n && self.same_user == other.same_user
    }

    /// Whether the pair was among the policy's training pairs.
    #[inline]
    pub fn seen(&self, a: WorkloadId, b: WorkloadId) -> bool {
        !self.seen.is_empty() && self.seen[usize::from(a) * self.n + usize::from(b)]
    }
}

fn usable_memory(world: &World, rules: &SelectionRules) -> f64 {
    rules.gpu_memory_gib.unwrap_or(world.gpu_memory_gib()) * (1.0 - rules.memory_margin)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::world::tests_support::tiny_world;
    use kace_selector::{Member, Objective};

    /// Predicts the pair's summed exclusive throughput (a deliberately naive model).
    struct SumOfExclusive;
    impl Predictor for SumOfExclusive {
        fn predict(&self, m: &[Member<'_>], _: Objective) -> f64 {
            m.iter().map(|m| m.profile.exclusive_throughput()).sum()
        }
    }

    fn rules() -> SelectionRules {
        SelectionRules { gpu_memory_gib: Some(32.0), memory_margin: 0.0, ..Default::default() }
    }

    #[test]
    fn tables_follow_each_rule() {
        let w = tiny_world();
        let (a, b, c) = (0, 1, 2);
        let q = PairingPolicy::queue_order(&w);
        assert_eq!(q.score(a, b), Some(0.0));
        assert_eq!(q.score(a, c), Some(0.0), "queue order does not know memory");
        assert_eq!(q.score(a, a), None, "unknown pairs are never formed");
        let m = PairingPolicy::memcap(&w, &rules());
        assert_eq!(m.score(a, b), Some(-10.0));
        assert_eq!(m.score(a, c), None);
        let o = PairingPolicy::oracle(&w, &rules());
        // 6 + 4 = 10 steps/s is no more than a alone, yet 6/10 + 4/5 = 1.4 of one job's work.
        assert_eq!(o.score(a, b), Some(10.0));
        assert_eq!(o.score(b, a), Some(10.0));
        assert_eq!(o.score(b, b), Some(6.0), "3/5 + 3/5 = 1.2");
        let strict = SelectionRules { min_gain: 0.3, ..rules() };
        let o = PairingPolicy::oracle(&w, &strict);
        assert_eq!((o.score(a, b), o.score(b, b)), (Some(10.0), None));
        let by_progress = SelectionRules { objective: Objective::NormalisedProgress, ..rules() };
        let o = PairingPolicy::oracle(&w, &by_progress);
        assert!(o.score(a, b).is_some_and(|s| (s - 1.4).abs() < 1e-12));
        let k = PairingPolicy::kace(&w, &SumOfExclusive, &rules());
        assert_eq!(k.score(a, b), Some(15.0));
        assert_eq!(k.score(b, b), Some(10.0));
        assert_eq!(k.score(a, c), None, "kace's selection checks memory");
        let e = PairingPolicy::exclusive(&w);
        assert!(!e.shares() && e.score(b, b).is_none());
    }

    #[test]
    fn keys_round_trip_and_seen_pairs_are_symmetric() {
        for p in PolicyKind::ALL {
            assert_eq!(PolicyKind::from_key(p.key()), Some(p));
        }
        let w = tiny_world();
        let k = PairingPolicy::queue_order(&w).with_seen_pairs(&w, &[["a".into(), "b".into()]]);
        assert!(k.seen(0, 1) && k.seen(1, 0) && !k.seen(1, 1));
    }

    #[test]
    fn the_same_user_rule_is_kaces_unless_multi_user() {
        let w = tiny_world();
        let k = PairingPolicy::kace(&w, &SumOfExclusive, &rules());
        assert!(k.same_user() && k.users_may_share(3, 3) && !k.users_may_share(3, 4));
        let m = k.multi_user(true);
        assert!(!m.same_user() && m.users_may_share(3, 4));
        assert!(PairingPolicy::oracle(&w, &rules()).same_user());
        // Slurm's plain shards pair whoever comes next, whatever the setting.
        assert!(!PairingPolicy::queue_order(&w).multi_user(false).same_user());
    }
}
