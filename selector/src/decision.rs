//! The one decision kace makes, wherever it is made (the decider, for a starting lead's partner,
//! a GPU a job left and an open GPU; `kace select --dry-run`, `kace status` and the simulator):
//! given the kace jobs on one GPU and the held candidates, which candidate's
//! joining raises the GPU's predicted objective most, or none, with every candidate's reason.
//!
//! It adds to [`select`](crate::selection::select) what a GPU's state decides: the job limit
//! per GPU, and who may share it (MPS time-slices clients of different users unless the control
//! daemon runs in multi-user mode). Callers do not re-rank or re-word what it returns:
//! [`Decision::ranked`] is the order in which to try candidates when the first can no longer be
//! released.

use crate::features::Profile;
use crate::selection::{
    select_exploring, Candidate, Predictor, Rejection, Selection, SelectionRules,
};
use crate::slowdown::Member;

/// The site's rules for filling a GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// Memory margin, gain threshold and objective. Its `gpu_memory_gib` and
    /// `require_same_user` are set from the GPU's state and [`Policy::multi_user`].
    pub rules: SelectionRules,
    /// At most this many kace jobs share one GPU (`selection.max_jobs_per_gpu`, ≥ 2).
    pub max_jobs_per_gpu: usize,
    /// Whether jobs of different users may share a GPU (`mps.multi_user`: the MPS control
    /// daemon runs with `-M`, one server for all users, no isolation between them).
    pub multi_user: bool,
    /// A workload whose profile rests only on kace's own observations (no admin measured it)
    /// is a candidate after this many observed alone runs (`profile.min_alone_runs`, ≥ 1);
    /// before, it is an unknown profile. The store's read path applies it, where the profile's
    /// sources are known.
    pub min_alone_runs: u32,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            rules: SelectionRules::default(),
            max_jobs_per_gpu: 2,
            multi_user: false,
            min_alone_runs: 1,
        }
    }
}

/// A kace job running on the GPU.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OnGpu<'a> {
    /// Its workload's profile.
    pub profile: &'a Profile,
    /// Its workload's name.
    pub workload: &'a str,
    /// Its user (`None`: unknown, as in a dry run; it matches any user).
    pub user: Option<&'a str>,
}

/// A held job that might join.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Joiner<'a> {
    /// Its workload's profile, when known.
    pub profile: Option<&'a Profile>,
    /// Its workload's name.
    pub workload: &'a str,
    /// Its user (`None`: unknown; it matches any user).
    pub user: Option<&'a str>,
}

/// One GPU as the decision sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuState<'a> {
    /// The kace jobs on it, oldest first (at least one: a free GPU gets a lead from dispatch,
    /// in queue order, not a joiner).
    pub running: &'a [OnGpu<'a>],
    /// Its memory in GiB (`None`: unknown, memory is not checked).
    pub memory_gib: Option<f64>,
    /// Pairs of workloads (either order) that failed together on a shared MPS server and may
    /// not share a GPU until an admin clears them, with whose jobs they keep apart (`None`:
    /// everyone's; an unknown user matches, as in [`Joiner::user`]): a candidate paired so with
    /// a job on the GPU is refused ([`Rejection::FailedTogether`]).
    pub failed_pairs: &'a [(&'a str, &'a str, Option<&'a str>)],
    /// How many exploratory groups each cold workload has been in so far (name, count; absent:
    /// none), which [`SelectionRules::explore_pairs`] bounds. The decider keeps the counts
    /// (`DeciderState::explored`), the simulator its own; a dry run passes none.
    pub explored: &'a [(&'a str, u32)],
    /// Workloads whose profile an admin vouched for (imported or measured it: not only kace's
    /// observations of users' own runs). A cold workload is explored beside another user's
    /// job only when it is one of these; otherwise only beside its own user's jobs, so that a
    /// user who names new workloads and runs them alone cannot have them tried beside other
    /// users' jobs (issue 31). Matters only under `mps.multi_user`, where users share a GPU.
    pub vouched: &'a [&'a str],
}

/// What the decision returns.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// Every candidate's verdict (parallel to the candidates), the chosen one and the
    /// baseline: the GPU's objective without a joiner.
    pub selection: Selection,
    /// The candidates that passed, best first (the chosen one first; equal predictions in
    /// candidate order): the order in which to release them.
    pub ranked: Vec<usize>,
}

impl Decision {
    /// The chosen candidate, if any.
    pub fn chosen(&self) -> Option<usize> {
        self.selection.chosen
    }
}

fn same_user(a: Option<&str>, b: Option<&str>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => a == b,
        _ => true,
    }
}

/// Decides which candidate joins `gpu`. Candidates are in queue order (oldest first), which
/// breaks ties.
pub fn decide(
    gpu: &GpuState<'_>,
    candidates: &[Joiner<'_>],
    predictor: &dyn Predictor,
    policy: &Policy,
) -> Decision {
    let limit = policy.max_jobs_per_gpu;
    if gpu.running.is_empty() || gpu.running.len() >= limit {
        let rejection = Rejection::GpuFull { running: gpu.running.len(), limit };
        let verdicts = candidates
            .iter()
            .map(|_| crate::selection::Verdict {
                rejection: Some(rejection.clone()),
                ..Default::default()
            })
            .collect();
        return Decision {
            selection: Selection { verdicts, chosen: None, baseline: f64::NAN },
            ranked: Vec::new(),
        };
    }
    let running: Vec<Member<'_>> = gpu
        .running
        .iter()
        .map(|r| Member { profile: r.profile, workload: Some(r.workload) })
        .collect();
    // The candidates a failed pair excludes are refused before selection, so that none of them
    // can be chosen; the others' verdicts keep their places.
    let failed_with = |c: &Joiner<'_>| -> Option<&str> {
        let mine = |u: Option<&str>, scope: &str| u.is_none_or(|u| u == scope);
        gpu.running.iter().find_map(|r| {
            let w = r.workload;
            gpu.failed_pairs
                .iter()
                .any(|&(a, b, scope)| {
                    ((a, b) == (w, c.workload) || (b, a) == (w, c.workload))
                        && scope.is_none_or(|s| mine(r.user, s) && mine(c.user, s))
                })
                .then_some(w)
        })
    };
    let blocked: Vec<Option<&str>> = candidates.iter().map(failed_with).collect();
    let open: Vec<usize> = (0..candidates.len()).filter(|&i| blocked[i].is_none()).collect();
    // An exploratory group's cold members must be the same user's jobs or vouched for
    // ([`GpuState::vouched`]); a known workload needs neither.
    let settled = |w: &str| predictor.knows(Some(w)) || gpu.vouched.contains(&w);
    let running_settled = gpu.running.iter().all(|r| settled(r.workload));
    let cands: Vec<Candidate<'_>> = open
        .iter()
        .map(|&i| &candidates[i])
        .map(|c| {
            let same = gpu.running.iter().all(|r| same_user(r.user, c.user));
            Candidate {
                profile: c.profile,
                workload: Some(c.workload),
                same_user: same,
                may_explore: same || (running_settled && settled(c.workload)),
            }
        })
        .collect();
    let rules = SelectionRules {
        gpu_memory_gib: gpu.memory_gib,
        require_same_user: !policy.multi_user,
        ..policy.rules.clone()
    };
    let chosen_open = select_exploring(&running, &cands, predictor, &rules, gpu.explored);
    let mut open_verdicts = chosen_open.verdicts.into_iter();
    let verdicts = blocked
        .iter()
        .map(|b| match b {
            Some(with) => crate::selection::Verdict {
                rejection: Some(Rejection::FailedTogether { with: with.to_string() }),
                ..Default::default()
            },
            None => open_verdicts.next().unwrap_or_default(),
        })
        .collect();
    let selection = Selection {
        verdicts,
        chosen: chosen_open.chosen.and_then(|k| open.get(k).copied()),
        baseline: chosen_open.baseline,
    };
    let mut ranked: Vec<usize> =
        (0..candidates.len()).filter(|&i| selection.verdicts[i].rejection.is_none()).collect();
    // Stable: equal predictions keep queue order, as `select` breaks its own ties.
    ranked.sort_by(|&a, &b| {
        let p = |i: usize| selection.verdicts[i].prediction.unwrap_or(f64::NEG_INFINITY);
        p(b).total_cmp(&p(a))
    });
    if let Some(c) = selection.chosen {
        ranked.retain(|&i| i != c);
        ranked.insert(0, c);
    }
    Decision { selection, ranked }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::selection::tests::{exploring_rules, prof, Cold, Toy};

    fn joiner<'a>(p: &'a Profile, w: &'a str, user: &'a str) -> Joiner<'a> {
        Joiner { profile: Some(p), workload: w, user: Some(user) }
    }

    #[test]
    fn ranks_passing_candidates_and_keeps_every_reason() {
        let lead = prof(10.0, 4.0);
        let running = [OnGpu { profile: &lead, workload: "lead", user: Some("ann") }];
        let (a, b, c) = (prof(5.0, 2.0), prof(9.0, 3.0), prof(8.0, 3.0));
        let cands = [
            joiner(&a, "a", "ann"),
            joiner(&b, "b", "bob"),
            joiner(&c, "c", "ann"),
            joiner(&b, "b", "ann"),
            Joiner { profile: None, workload: "x", user: Some("ann") },
        ];
        let gpu = GpuState {
            running: &running,
            memory_gib: Some(32.0),
            failed_pairs: &[],
            explored: &[],
            vouched: &[],
        };
        let d = decide(&gpu, &cands, &Toy, &Policy::default());
        assert_eq!(d.chosen(), Some(3));
        assert_eq!(d.ranked, vec![3, 2]);
        assert_eq!(d.selection.verdicts[1].rejection, Some(Rejection::DifferentUser));
        assert_eq!(d.selection.verdicts[4].rejection, Some(Rejection::UnknownProfile));
        // Under mps.multi_user, bob's job ties with ann's and the older one wins.
        let multi = Policy { multi_user: true, ..Policy::default() };
        let d = decide(&gpu, &cands, &Toy, &multi);
        assert_eq!((d.chosen(), d.ranked.clone()), (Some(1), vec![1, 3, 2]));
    }

    #[test]
    fn a_cold_workload_is_explored_beside_another_users_job_only_when_an_admin_vouched_for_it() {
        // As in selection's exploration tests: "new" is cold, predicted at 1.3 with doubt 0.2
        // beside the lead (explorable, not passing).
        let lp = prof(10.0, 0.0);
        let running = [OnGpu { profile: &lp, workload: "lead", user: Some("ann") }];
        let a = prof(20.0, 1.3);
        let policy = Policy { rules: exploring_rules(), multi_user: true, ..Policy::default() };
        let gpu = GpuState {
            running: &running,
            memory_gib: None,
            failed_pairs: &[],
            explored: &[],
            vouched: &[],
        };
        let chosen = |gpu: &GpuState<'_>, user: &str| {
            let d = decide(gpu, &[joiner(&a, "new", user)], &Cold, &policy);
            (d.chosen(), d.selection.verdicts[0].explores.clone())
        };
        // The GPU's own user: explored, vouched for or not.
        assert_eq!(chosen(&gpu, "ann"), (Some(0), vec!["new".to_string()]));
        // Another user's self-measured workload: not tried beside ann's job.
        let (none, _) = chosen(&gpu, "bob");
        assert_eq!(none, None);
        // Vouched for by an admin: explored beside anyone's.
        let vouched = GpuState { vouched: &["new"], ..gpu };
        assert_eq!(chosen(&vouched, "bob"), (Some(0), vec!["new".to_string()]));
        // A cold lead of ann's is not tried beside bob's known job unless vouched for.
        let cold_lead = [OnGpu { profile: &lp, workload: "new", user: Some("ann") }];
        let on_cold = GpuState { running: &cold_lead, ..gpu };
        let known = |user| decide(&on_cold, &[joiner(&a, "x", user)], &Cold, &policy).chosen();
        assert_eq!((known("ann"), known("bob")), (Some(0), None));
        let on_vouched = GpuState { vouched: &["new"], ..on_cold };
        assert_eq!(
            decide(&on_vouched, &[joiner(&a, "x", "bob")], &Cold, &policy).chosen(),
            Some(0)
        );
    }

    #[test]
    fn a_pair_that_failed_together_is_refused_in_either_order_and_the_rest_keep_their_places() {
        let lead = prof(10.0, 4.0);
        let running = [OnGpu { profile: &lead, workload: "lead", user: Some("ann") }];
        let (a, c) = (prof(5.0, 2.0), prof(8.0, 3.0));
        let cands = [joiner(&a, "a", "ann"), joiner(&c, "c", "ann"), joiner(&a, "a2", "ann")];
        let free = GpuState {
            running: &running,
            memory_gib: Some(32.0),
            failed_pairs: &[],
            explored: &[],
            vouched: &[],
        };
        let before = decide(&free, &cands, &Toy, &Policy::default());
        assert_eq!(before.chosen(), Some(1));
        for pairs in [[("c", "lead", None)], [("lead", "c", Some("ann"))]] {
            let gpu = GpuState { failed_pairs: &pairs, ..free };
            let d = decide(&gpu, &cands, &Toy, &Policy::default());
            assert_eq!(
                d.selection.verdicts[1].rejection,
                Some(Rejection::FailedTogether { with: "lead".into() })
            );
            assert_ne!(d.chosen(), Some(1));
            assert!(!d.ranked.contains(&1));
            // The others are judged as before, in their own places.
            assert_eq!(d.selection.verdicts[0], before.selection.verdicts[0]);
            assert_eq!(d.selection.verdicts[2], before.selection.verdicts[2]);
        }
        // A pair of two other workloads changes nothing.
        let gpu = GpuState { failed_pairs: &[("a", "c", None)], ..free };
        assert_eq!(decide(&gpu, &cands, &Toy, &Policy::default()), before);
        // Blocked for bob's jobs only: ann's are paired as before.
        let gpu = GpuState { failed_pairs: &[("c", "lead", Some("bob"))], ..free };
        assert_eq!(decide(&gpu, &cands, &Toy, &Policy::default()), before);
    }

    #[test]
    fn a_full_gpu_takes_nobody_and_a_third_job_must_raise_the_group() {
        let (x, y) = (prof(10.0, 4.0), prof(6.0, 2.0));
        let two = [
            OnGpu { profile: &x, workload: "x", user: None },
            OnGpu { profile: &y, workload: "y", user: None },
        ];
        let small = prof(3.0, 1.0);
        let cands = [Joiner { profile: Some(&small), workload: "s", user: None }];
        let gpu = GpuState {
            running: &two,
            memory_gib: None,
            failed_pairs: &[],
            explored: &[],
            vouched: &[],
        };
        let d = decide(&gpu, &cands, &Toy, &Policy::default());
        assert_eq!(d.chosen(), None);
        assert_eq!(
            d.selection.verdicts[0].rejection,
            Some(Rejection::GpuFull { running: 2, limit: 2 })
        );
        let three = Policy { max_jobs_per_gpu: 3, ..Policy::default() };
        let d = decide(&gpu, &cands, &Toy, &three);
        // The pair is predicted at 16 − 6 = 10; with s, 19 − 7 = 12.
        assert_eq!(d.selection.baseline, 10.0);
        assert_eq!((d.chosen(), d.selection.verdicts[0].prediction), (Some(0), Some(12.0)));
        let greedy = prof(1.0, 5.0);
        let cands = [Joiner { profile: Some(&greedy), workload: "g", user: None }];
        let d = decide(&gpu, &cands, &Toy, &three);
        assert!(matches!(
            d.selection.verdicts[0].rejection,
            Some(Rejection::BelowGainThreshold { .. })
        ));
        assert_eq!(d.chosen(), None);
    }
}
