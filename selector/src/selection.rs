//! kace's production choice: given the jobs already on a GPU and the held candidates, filter out
//! what cannot or should not share, predict the rest, and pick the best.

use crate::features::Profile;
use crate::policy::Objective;
use crate::slowdown::Member;

/// Anything that predicts a group's objective from its members.
pub trait Predictor {
    /// The predicted objective of the group, in the objective's own units (NaN: no answer).
    fn predict(&self, members: &[Member<'_>], objective: Objective) -> f64;

    /// The gain in normalised progress (Σ colocated / exclusive) over the running jobs that the
    /// predictor wants to see before it trusts a group: larger for groups it knows less about.
    /// Only [`SelectionRules::refuse_likely_harm`] asks for it.
    fn required_gain(&self, _members: &[Member<'_>]) -> f64 {
        0.0
    }

    /// The gain in normalised progress over the running jobs that a group with a workload the
    /// predictor has never learnt from must show, whatever the rules say; `None` when it knows
    /// every member. This is how a new workload is tried beside safe partners first: `select`
    /// always asks.
    fn new_workload_gain(&self, _members: &[Member<'_>]) -> Option<f64> {
        None
    }

    /// Whether the predictor has learnt from groups with `workload` in them (a workload it has
    /// not is "cold": [`Predictor::new_workload_gain`] applies to its groups, and
    /// [`SelectionRules::explore_pairs`] may try it). A predictor without per-workload terms
    /// knows every workload.
    fn knows(&self, _workload: Option<&str>) -> bool {
        true
    }

    /// How doubtful the predictor is about a group, in normalised progress (log units for the
    /// slowdown model): the unit of [`Predictor::required_gain`] and
    /// [`Predictor::new_workload_gain`]. 0 for a predictor that has no measure of it.
    fn doubt(&self, _members: &[Member<'_>]) -> f64 {
        0.0
    }

    /// The group's predicted objective and its predicted normalised progress: what [`select`]
    /// asks of every candidate. Asks [`Predictor::predict`] once per measure; a predictor that
    /// derives both from one computation answers both at once.
    fn predict_with_progress(&self, members: &[Member<'_>], objective: Objective) -> (f64, f64) {
        predict_each(self, members, objective)
    }
}

/// [`Predictor::predict_with_progress`] by asking [`Predictor::predict`] once per measure.
pub(crate) fn predict_each<P: Predictor + ?Sized>(
    p: &P,
    members: &[Member<'_>],
    objective: Objective,
) -> (f64, f64) {
    let predicted = p.predict(members, objective);
    let progress = match objective {
        Objective::NormalisedProgress => predicted,
        Objective::ThroughputSum | Objective::Energy => {
            p.predict(members, Objective::NormalisedProgress)
        }
    };
    (predicted, progress)
}

/// The filters and thresholds of a choice.
#[derive(Debug, Clone, PartialEq)]
pub struct SelectionRules {
    /// The GPU's memory in GiB; `None` skips the memory check (unknown GPU).
    pub gpu_memory_gib: Option<f64>,
    /// Fraction of GPU memory kept free: the group must fit in `memory × (1 − margin)`.
    pub memory_margin: f64,
    /// Refuse candidates of another user (MPS serialises clients of different users).
    pub require_same_user: bool,
    /// A candidate is chosen only when the group's predicted normalised progress (Σ colocated /
    /// exclusive) beats the running jobs' by this fraction (0.05 = 5 %): the GPU must do more
    /// work per second with the joiner than without it. For a predictor that cannot predict
    /// normalised progress, the group objective must beat the running jobs' instead.
    pub min_gain: f64,
    /// What the prediction and the baseline are measured in.
    pub objective: Objective,
    /// Refuse a candidate unless the group's predicted normalised progress beats the running
    /// jobs' by the predictor's [`Predictor::required_gain`]: a pair slower together than one
    /// after the other (Σ colocated / exclusive < 1) is worse than no partner. Skipped for a
    /// predictor that cannot predict normalised progress (NaN).
    pub refuse_likely_harm: bool,
    /// Exploration of cold workloads (a workload the predictor has never learnt from,
    /// [`Predictor::knows`]): when no candidate passes, a group whose every cold workload has
    /// been in fewer than this many exploratory groups (the caller counts them) and which is
    /// predicted to gain at least [`SelectionRules::explore_weight`] × the predictor's doubt is
    /// formed anyway, the one with the highest lower bound (predicted progress − doubt) among
    /// them: so the site measures the new workload beside its safest partner, and the nightly
    /// retrain learns it. 0 (the library's default): never.
    pub explore_pairs: u32,
    /// The doubts of predicted gain an exploratory group must show (`κ_explore`, below the
    /// model's κ and κ_new, which refuse it): its predicted normalised progress must beat the
    /// GPU's without it by `explore_weight × doubt`, so no exploratory group is predicted
    /// harmful, and one is harmful only when the truth lies more than this many doubts below the
    /// prediction.
    pub explore_weight: f64,
}

/// Exploratory groups per cold workload in production (`selection.explore_pairs`), chosen on
/// the simulated site's development seeds (101–105, `kace eval history`).
pub const EXPLORE_PAIRS: u32 = 3;

/// `selection.explore_weight`'s production default, chosen with [`EXPLORE_PAIRS`].
pub const EXPLORE_WEIGHT: f64 = 0.5;

impl Default for SelectionRules {
    fn default() -> Self {
        SelectionRules {
            gpu_memory_gib: None,
            memory_margin: 0.05,
            require_same_user: true,
            min_gain: 0.0,
            objective: Objective::ThroughputSum,
            refuse_likely_harm: false,
            explore_pairs: 0,
            explore_weight: EXPLORE_WEIGHT,
        }
    }
}

/// A held job that might join the GPU.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate<'a> {
    /// Its profile, when the workload is known.
    pub profile: Option<&'a Profile>,
    /// Its workload name, for models with per-workload terms.
    pub workload: Option<&'a str>,
    /// Whether it belongs to the same user as the jobs on the GPU.
    pub same_user: bool,
    /// Whether a group with it may be formed to explore a cold workload
    /// ([`SelectionRules::explore_pairs`]): the caller says no where the group would put one
    /// user's cold workload, profiled only by kace's measurements of that user's own runs,
    /// beside another user's job ([`crate::decision::decide`]).
    pub may_explore: bool,
}

/// Why a candidate was not chosen.
#[derive(Debug, Clone, PartialEq)]
pub enum Rejection {
    /// No profile for its workload.
    UnknownProfile,
    /// Σ memcap would not fit in the GPU's usable memory.
    MemoryDoesNotFit {
        /// GiB the group would need.
        needed_gib: f64,
        /// GiB usable after the margin.
        usable_gib: f64,
    },
    /// Another user's job: MPS would time-slice it, not share.
    DifferentUser,
    /// The GPU already holds as many kace jobs as it may (`selection.max_jobs_per_gpu`).
    GpuFull {
        /// Kace jobs on the GPU.
        running: usize,
        /// The limit.
        limit: usize,
    },
    /// The group is predicted to progress no better than its jobs one after the other, by the
    /// predictor's margin for doubt.
    LikelyHarmful {
        /// Predicted normalised progress of the group.
        predicted: f64,
        /// What it had to exceed.
        required: f64,
    },
    /// The group has a workload the model has never learnt from, and is not predicted to
    /// progress better than its jobs one after the other by the model's margin for new
    /// workloads ([`Predictor::new_workload_gain`]).
    DoubtfulNewWorkload {
        /// Predicted normalised progress of the group.
        predicted: f64,
        /// What it had to exceed.
        required: f64,
    },
    /// Its workload and one on the GPU failed together on a shared MPS server (a fatal GPU
    /// error in one client ends every client's work there, and MPS does not say whose it was):
    /// they are not paired again until an admin clears the pair (`kace pairs clear`).
    FailedTogether {
        /// The workload on the GPU it failed with.
        with: String,
    },
    /// The predicted gain over the running jobs without a joiner is not above the threshold.
    BelowGainThreshold {
        /// The group's predicted normalised progress, or its objective when `progress` is false.
        predicted: f64,
        /// What it had to exceed.
        required: f64,
        /// Whether the two are normalised progress (the predictor could tell it) rather than
        /// the objective.
        progress: bool,
    },
}

impl Rejection {
    /// The reason without this candidate's figures: the same for every candidate refused so
    /// (the words [`Rejection`]'s `Display` begins with), for counting refusals by reason.
    pub fn kind(&self) -> &'static str {
        match self {
            Rejection::UnknownProfile => "unknown profile",
            Rejection::MemoryDoesNotFit { .. } => "memory does not fit",
            Rejection::DifferentUser => "different user",
            Rejection::GpuFull { .. } => "the GPU is full",
            Rejection::LikelyHarmful { .. } => "likely harmful",
            Rejection::DoubtfulNewWorkload { .. } => "new workload, not yet a safe pair",
            Rejection::BelowGainThreshold { .. } => "below gain threshold",
            Rejection::FailedTogether { .. } => "failed together before",
        }
    }
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = self.kind();
        match self {
            Rejection::UnknownProfile => write!(f, "{kind}"),
            Rejection::MemoryDoesNotFit { needed_gib, usable_gib } => {
                write!(f, "{kind} ({needed_gib:.1} GiB > {usable_gib:.1} GiB)")
            }
            Rejection::DifferentUser => write!(f, "{kind} (MPS would serialise)"),
            Rejection::FailedTogether { with } => write!(
                f,
                "{kind} (with {with} on a shared MPS server; `kace pairs clear` allows it again)"
            ),
            Rejection::GpuFull { running, limit } => {
                write!(f, "{kind} ({running} kace jobs, at most {limit})")
            }
            Rejection::LikelyHarmful { predicted, required }
            | Rejection::DoubtfulNewWorkload { predicted, required }
            | Rejection::BelowGainThreshold { predicted, required, progress: true } => {
                write!(f, "{kind} (predicted progress {predicted:.3} ≤ {required:.3})")
            }
            Rejection::BelowGainThreshold { predicted, required, progress: false } => {
                write!(f, "{kind} (predicted {predicted:.3} ≤ {required:.3})")
            }
        }
    }
}

/// The verdict on one candidate.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Verdict {
    /// The predicted group objective, when the candidate got that far.
    pub prediction: Option<f64>,
    /// The group's predicted normalised progress (Σ colocated / exclusive rate over its
    /// members), for a candidate that passed, when the predictor tells it: what sharing costs
    /// each member's run time (the decider extends time limits by it).
    pub progress: Option<f64>,
    /// Why it was refused, if it was.
    pub rejection: Option<Rejection>,
    /// For a candidate chosen to explore ([`SelectionRules::explore_pairs`]): the group's cold
    /// workloads, whose exploratory counts the caller adds one to when it forms the group.
    /// Empty for every other verdict.
    pub explores: Vec<String>,
}

/// The outcome of a choice: one verdict per candidate (in input order) and the chosen index.
#[derive(Debug, Clone, PartialEq)]
pub struct Selection {
    /// Verdicts, parallel to the candidates.
    pub verdicts: Vec<Verdict>,
    /// The chosen candidate, if any passed.
    pub chosen: Option<usize>,
    /// The running jobs' objective alone (the gain baseline).
    pub baseline: f64,
}

/// Chooses the candidate whose group with `running` (the jobs already on the GPU, lead first)
/// has the highest predicted objective, after the filters. Ties go to the earliest candidate,
/// which callers order by submission so that the older job wins. No workload has explored yet
/// ([`select_exploring`] with no counts).
pub fn select(
    running: &[Member<'_>],
    candidates: &[Candidate<'_>],
    predictor: &dyn Predictor,
    rules: &SelectionRules,
) -> Selection {
    select_exploring(running, candidates, predictor, rules, &[])
}

/// [`select`], with each workload's exploratory groups so far (`explored`: name and count;
/// absent: 0), which bound [`SelectionRules::explore_pairs`].
pub fn select_exploring(
    running: &[Member<'_>],
    candidates: &[Candidate<'_>],
    predictor: &dyn Predictor,
    rules: &SelectionRules,
    explored: &[(&str, u32)],
) -> Selection {
    // One job alone is measured; a group already sharing is predicted, so that a joiner must
    // raise what the GPU does now, not what its jobs would do each alone.
    let baseline = match (running.len(), rules.objective) {
        (0 | 1, Objective::ThroughputSum) => {
            running.iter().map(|m| m.profile.exclusive_throughput()).sum()
        }
        (0 | 1, Objective::NormalisedProgress) => running.len() as f64,
        (0 | 1, Objective::Energy) => {
            crate::energy::work_per_energy(running.iter().map(|m| (m.profile, 1.0)))
        }
        _ => predictor.predict(running, rules.objective),
    };
    let required = baseline * (1.0 + rules.min_gain);
    // Whether a joiner is better than none is asked in normalised progress, whatever the
    // objective: jobs' steps per second are in their own units, so under the throughput-sum
    // objective a fast job alone (40 steps/s) would refuse a partner that makes the GPU do 1.5×
    // the work of running the two one after the other. The objective ranks what passes.
    let baseline_progress = match running {
        [] => 0.0,
        [_] => 1.0,
        _ => predictor.predict(running, Objective::NormalisedProgress),
    };
    let required_progress = baseline_progress * (1.0 + rules.min_gain);
    let running_mem: f64 = running.iter().map(|m| m.profile.memcap()).sum();
    let usable = rules.gpu_memory_gib.map(|m| m * (1.0 - rules.memory_margin));
    let mut group: Vec<Member<'_>> = running.to_vec();
    let mut chosen: Option<(usize, f64)> = None;
    let explored_count =
        |w: &str| explored.iter().find(|(n, _)| *n == w).map_or(0, |&(_, count)| count);
    // Candidates refused for a doubt about a cold workload that may be explored instead:
    // (index, lower bound, the cold workloads).
    let mut explorable: Vec<(usize, f64, Vec<String>)> = Vec::new();
    let mut verdicts: Vec<Verdict> = candidates
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let reject = |r| Verdict { rejection: Some(r), ..Verdict::default() };
            let Some(p) = c.profile else { return reject(Rejection::UnknownProfile) };
            if rules.require_same_user && !c.same_user {
                return reject(Rejection::DifferentUser);
            }
            let needed = running_mem + p.memcap();
            if let Some(usable_gib) = usable {
                if needed > usable_gib {
                    return reject(Rejection::MemoryDoesNotFit { needed_gib: needed, usable_gib });
                }
            }
            group.push(Member { profile: p, workload: c.workload });
            let (predicted, progress) = predictor.predict_with_progress(&group, rules.objective);
            let new_gain = predictor.new_workload_gain(&group);
            let harm_gain = rules.refuse_likely_harm.then(|| predictor.required_gain(&group));
            // Exploration's budget: every cold member named and under its count.
            let cold: Option<Vec<String>> = (rules.explore_pairs > 0
                && c.may_explore
                && new_gain.is_some())
            .then(|| {
                group
                    .iter()
                    .filter(|m| !predictor.knows(m.workload))
                    .map(|m| m.workload.map(str::to_string))
                    .collect::<Option<Vec<String>>>()
            })
            .flatten()
            .filter(|c| !c.is_empty() && c.iter().all(|w| explored_count(w) < rules.explore_pairs));
            let doubt = cold.as_ref().map(|_| predictor.doubt(&group));
            group.pop();
            let below = |predicted, required, progress| Verdict {
                prediction: Some(predicted),
                progress: None,
                explores: Vec::new(),
                rejection: Some(Rejection::BelowGainThreshold { predicted, required, progress }),
            };
            // NaN predictions fail these tests too, so they are never chosen.
            if predicted.is_nan() {
                return below(predicted, required, false);
            }
            let in_progress = !progress.is_nan() && !required_progress.is_nan();
            if in_progress && progress <= required_progress {
                return Verdict {
                    prediction: Some(predicted),
                    ..below(progress, required_progress, true)
                };
            }
            // A predictor trained for one objective only: the objective decides.
            if !in_progress && predicted <= required {
                return below(predicted, required, false);
            }
            let mut doubts = [harm_gain.map(|g| (g, false)), new_gain.map(|g| (g, true))];
            // The larger margin decides, and names the reason.
            doubts.sort_by(|a, b| {
                a.map_or(f64::NEG_INFINITY, |d| d.0)
                    .total_cmp(&b.map_or(f64::NEG_INFINITY, |d| d.0))
            });
            if let (true, Some((gain, new))) = (in_progress, doubts[1]) {
                let needed = baseline_progress + gain;
                if !needed.is_nan() && progress <= needed {
                    let (predicted_progress, required) = (progress, needed);
                    if let (Some(cold), Some(doubt)) = (cold, doubt) {
                        let floor = baseline_progress + rules.explore_weight * doubt;
                        if doubt.is_finite() && progress > floor {
                            explorable.push((i, progress - doubt, cold));
                        }
                    }
                    return Verdict {
                        prediction: Some(predicted),
                        progress: None,
                        explores: Vec::new(),
                        rejection: Some(if new {
                            Rejection::DoubtfulNewWorkload {
                                predicted: predicted_progress,
                                required,
                            }
                        } else {
                            Rejection::LikelyHarmful { predicted: predicted_progress, required }
                        }),
                    };
                }
            }
            if chosen.is_none_or(|(_, best)| predicted > best) {
                chosen = Some((i, predicted));
            }
            Verdict {
                prediction: Some(predicted),
                progress: in_progress.then_some(progress),
                rejection: None,
                explores: Vec::new(),
            }
        })
        .collect();
    // Exploration never displaces a group that passed: only when none did, the safest
    // explorable one (highest lower bound; the earliest on ties) is formed.
    if chosen.is_none() {
        let safest =
            explorable.into_iter().fold(None, |best: Option<(usize, f64, Vec<String>)>, e| {
                if best.as_ref().is_none_or(|b| e.1 > b.1) {
                    Some(e)
                } else {
                    best
                }
            });
        if let Some((i, _, cold)) = safest {
            if let Some(v) = verdicts.get_mut(i) {
                let progress = match v.rejection {
                    Some(Rejection::DoubtfulNewWorkload { predicted, .. })
                    | Some(Rejection::LikelyHarmful { predicted, .. }) => Some(predicted),
                    _ => None,
                };
                v.rejection = None;
                v.progress = progress;
                v.explores = cold;
                chosen = Some((i, v.prediction.unwrap_or(f64::NAN)));
            }
        }
    }
    Selection { verdicts, chosen: chosen.map(|c| c.0), baseline }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::features::Feature;

    use crate::features::{combine, FEATURE_COUNT};

    /// Predicts the group's summed exclusive throughput minus its memcap, so tests can steer it,
    /// and has no answer in normalised progress (a model trained for one objective only).
    pub(crate) struct Toy;
    impl Predictor for Toy {
        fn predict(&self, m: &[Member<'_>], o: Objective) -> f64 {
            let f = combine(m.iter().map(|m| m.profile));
            match o {
                Objective::ThroughputSum => {
                    f[Feature::ExclusiveThroughput.index()] - f[Feature::Memcap.index()]
                }
                Objective::NormalisedProgress | Objective::Energy => f64::NAN,
            }
        }
    }

    fn lead(p: &Profile) -> [Member<'_>; 1] {
        [Member { profile: p, workload: Some("lead") }]
    }

    /// A profile with only an exclusive throughput and a memcap: what [`Toy`] reads.
    pub(crate) fn prof(excl: f64, mem: f64) -> Profile {
        let mut f = [0.0; FEATURE_COUNT];
        f[Feature::ExclusiveThroughput.index()] = excl;
        f[Feature::Memcap.index()] = mem;
        Profile::new(f)
    }

    /// Predicts each member of a pair at a fixed normalised rate by the candidate's exclusive
    /// throughput (a stand-in workload id): 1 → both at 0.9, 2 → both at 0.95.
    struct Rates;
    impl Rates {
        fn rate(m: &[Member<'_>]) -> f64 {
            match m.last().map(|c| c.profile.exclusive_throughput()) {
                Some(x) if m.len() == 2 && x == 1.0 => 0.9,
                Some(x) if m.len() == 2 && x == 2.0 => 0.95,
                _ => 1.0,
            }
        }
    }
    impl Predictor for Rates {
        fn predict(&self, m: &[Member<'_>], o: Objective) -> f64 {
            let r = Rates::rate(m);
            match o {
                Objective::NormalisedProgress => r * m.len() as f64,
                Objective::ThroughputSum => f64::NAN,
                Objective::Energy => {
                    crate::energy::work_per_energy(m.iter().map(|x| (x.profile, r)))
                }
            }
        }
    }

    #[test]
    fn the_energy_objective_prefers_the_pair_that_does_more_work_per_joule() {
        use crate::features::test_profile;
        // A lead at 30 % SM. Candidate 1 (30 % SM) keeps both at 0.9 of their speed: 1.8 units
        // of work at well under the busy power. Candidate 2 (90 % SM) keeps both at 0.95: more
        // work (1.9), but the SMs saturate and the GPU draws its busy power.
        let lp = test_profile(5.0, 30.0);
        let (quiet, busy) = (test_profile(1.0, 30.0), test_profile(2.0, 90.0));
        let cands = [
            Candidate { profile: Some(&quiet), workload: None, same_user: true, may_explore: true },
            Candidate { profile: Some(&busy), workload: None, same_user: true, may_explore: true },
        ];
        let rules = |objective| SelectionRules { objective, ..SelectionRules::default() };
        let by_progress = select(&lead(&lp), &cands, &Rates, &rules(Objective::NormalisedProgress));
        assert_eq!(by_progress.chosen, Some(1));
        let by_energy = select(&lead(&lp), &cands, &Rates, &rules(Objective::Energy));
        assert_eq!(by_energy.chosen, Some(0), "{by_energy:?}");
        // The baseline is the lead alone's work per energy. The busy pair is below it (the lead
        // alone keeps a quiet GPU) but still passes: whether a joiner is better than none is
        // asked in normalised progress, and against the two run one after the other it saves.
        let alone = crate::energy::work_per_energy([(&lp, 1.0)]);
        assert_eq!(by_energy.baseline, alone);
        assert!(by_energy.verdicts.iter().all(|v| v.rejection.is_none()), "{by_energy:?}");
        let busy_pair = by_energy.verdicts[1].prediction.unwrap();
        assert!(busy_pair < alone, "{busy_pair} vs {alone}");
        let one_after_other =
            2.0 / (1.0 / alone + 1.0 / crate::energy::work_per_energy([(&busy, 1.0)]));
        assert!(busy_pair > one_after_other, "{busy_pair} vs {one_after_other}");
    }

    #[test]
    fn filters_then_picks_the_best_prediction() {
        let lp = prof(10.0, 4.0);
        let lead = lead(&lp);
        let (a, b, c, d) = (prof(5.0, 2.0), prof(9.0, 3.0), prof(30.0, 40.0), prof(50.0, 1.0));
        let cands = [
            Candidate { profile: None, workload: None, same_user: true, may_explore: true },
            Candidate { profile: Some(&a), workload: None, same_user: true, may_explore: true },
            Candidate { profile: Some(&b), workload: None, same_user: true, may_explore: true },
            Candidate { profile: Some(&c), workload: None, same_user: true, may_explore: true },
            Candidate { profile: Some(&d), workload: None, same_user: false, may_explore: true },
        ];
        let rules = SelectionRules { gpu_memory_gib: Some(32.0), ..SelectionRules::default() };
        let s = select(&lead, &cands, &Toy, &rules);
        assert_eq!(s.chosen, Some(2));
        assert_eq!(s.baseline, 10.0);
        assert_eq!(s.verdicts[0].rejection, Some(Rejection::UnknownProfile));
        assert_eq!(s.verdicts[1].prediction, Some(9.0));
        // 10 + 5 − 6 = 9 does not beat the lead alone (10).
        assert!(matches!(s.verdicts[1].rejection, Some(Rejection::BelowGainThreshold { .. })));
        assert_eq!(s.verdicts[2].prediction, Some(12.0));
        assert!(matches!(
            s.verdicts[3].rejection,
            Some(Rejection::MemoryDoesNotFit { needed_gib, .. }) if needed_gib == 44.0
        ));
        assert_eq!(s.verdicts[4].rejection, Some(Rejection::DifferentUser));
    }

    #[test]
    fn gain_threshold_and_ties() {
        let lp = prof(10.0, 0.0);
        let lead = lead(&lp);
        let a = prof(2.0, 0.0);
        let cands = [
            Candidate { profile: Some(&a), workload: None, same_user: true, may_explore: true },
            Candidate { profile: Some(&a), workload: None, same_user: true, may_explore: true },
        ];
        let loose = SelectionRules::default();
        assert_eq!(select(&lead, &cands, &Toy, &loose).chosen, Some(0));
        let strict = SelectionRules { min_gain: 0.25, ..loose };
        let s = select(&lead, &cands, &Toy, &strict);
        assert_eq!(s.chosen, None);
        assert!(s.verdicts.iter().all(|v| v.rejection.is_some()));
        assert_eq!(select(&lead, &[], &Toy, &strict).chosen, None);
    }

    /// Predicts throughput as [`Toy`] does, and normalised progress as the candidate's memcap
    /// (so tests can steer both), with a doubt margin of 0.1.
    struct Doubtful;
    impl Predictor for Doubtful {
        fn predict(&self, m: &[Member<'_>], objective: Objective) -> f64 {
            match objective {
                Objective::ThroughputSum => Toy.predict(m, objective),
                Objective::NormalisedProgress | Objective::Energy => {
                    m.last().map_or(1.0, |c| c.profile.memcap())
                }
            }
        }
        fn required_gain(&self, _: &[Member<'_>]) -> f64 {
            0.1
        }
    }

    #[test]
    fn likely_harmful_groups_are_refused_only_when_asked() {
        let lp = prof(10.0, 0.0);
        let lead = lead(&lp);
        // Progress 0.9 (harmful), 1.05 (a gain, but within the doubt margin), 1.3 (clear gain);
        // throughput prefers the first.
        let (a, b, c) = (prof(30.0, 0.9), prof(20.0, 1.05), prof(5.0, 1.3));
        let cands: Vec<Candidate> = [&a, &b, &c]
            .into_iter()
            .map(|p| Candidate {
                profile: Some(p),
                workload: None,
                same_user: true,
                may_explore: true,
            })
            .collect();
        let plain = SelectionRules::default();
        // The gain rule alone refuses the harmful one and takes the best throughput of the rest.
        let s = select(&lead, &cands, &Doubtful, &plain);
        assert_eq!(s.chosen, Some(1));
        assert_eq!(
            s.verdicts[0].rejection,
            Some(Rejection::BelowGainThreshold { predicted: 0.9, required: 1.0, progress: true })
        );
        let guarded = SelectionRules { refuse_likely_harm: true, ..plain };
        let s = select(&lead, &cands, &Doubtful, &guarded);
        assert_eq!(s.chosen, Some(2));
        assert!(matches!(s.verdicts[0].rejection, Some(Rejection::BelowGainThreshold { .. })));
        assert!(matches!(
            s.verdicts[1].rejection,
            Some(Rejection::LikelyHarmful { required, .. }) if (required - 1.1).abs() < 1e-12
        ));
        assert!(s.verdicts[1].rejection.as_ref().unwrap().to_string().contains("likely harmful"));
        // Nothing clears the margin: no partner at all.
        let s = select(&lead, &cands[..2], &Doubtful, &guarded);
        assert_eq!(s.chosen, None);
    }

    /// A fast job (40 steps/s alone) beside a slow one (8 alone): 34.4 steps/s together, below
    /// the fast job alone, yet 1.48× the work of running the two one after the other.
    struct FastBesideSlow;
    impl Predictor for FastBesideSlow {
        fn predict(&self, m: &[Member<'_>], o: Objective) -> f64 {
            match (m.len(), o) {
                (2, Objective::ThroughputSum) => 34.4,
                (2, Objective::NormalisedProgress) => 1.48,
                _ => f64::NAN,
            }
        }
    }

    #[test]
    fn the_gain_rule_asks_for_progress_not_steps_per_second() {
        let (fast, slow) = (prof(40.0, 0.0), prof(8.0, 0.0));
        let lead = lead(&fast);
        let cands = [Candidate {
            profile: Some(&slow),
            workload: None,
            same_user: true,
            may_explore: true,
        }];
        let s = select(&lead, &cands, &FastBesideSlow, &SelectionRules::default());
        assert_eq!((s.chosen, s.baseline), (Some(0), 40.0));
        assert_eq!(s.verdicts[0].prediction, Some(34.4));
        let strict = SelectionRules { min_gain: 0.5, ..SelectionRules::default() };
        let s = select(&lead, &cands, &FastBesideSlow, &strict);
        assert_eq!(s.chosen, None);
        let r = s.verdicts[0].rejection.as_ref().unwrap();
        assert_eq!(
            r,
            &Rejection::BelowGainThreshold { predicted: 1.48, required: 1.5, progress: true }
        );
        assert_eq!(r.to_string(), "below gain threshold (predicted progress 1.480 ≤ 1.500)");
    }

    /// As [`Doubtful`], and it has never learnt from workload "new".
    struct KnowsAllButNew;
    impl Predictor for KnowsAllButNew {
        fn predict(&self, m: &[Member<'_>], objective: Objective) -> f64 {
            Doubtful.predict(m, objective)
        }
        fn required_gain(&self, _: &[Member<'_>]) -> f64 {
            0.1
        }
        fn new_workload_gain(&self, m: &[Member<'_>]) -> Option<f64> {
            m.iter().any(|m| m.workload == Some("new")).then_some(0.4)
        }
    }

    #[test]
    fn a_new_workload_needs_a_clearly_safe_partner_whatever_the_rules() {
        let lp = prof(10.0, 0.0);
        let lead = lead(&lp);
        // Progress 1.3 and 1.6, both gains; the first is the better throughput.
        let (a, b) = (prof(30.0, 1.3), prof(5.0, 1.6));
        let cand = |p, w| Candidate {
            profile: Some(p),
            workload: Some(w),
            same_user: true,
            may_explore: true,
        };
        let plain = SelectionRules::default();
        // Known workloads: no doubt rule unless asked.
        let s = select(&lead, &[cand(&a, "x"), cand(&b, "y")], &KnowsAllButNew, &plain);
        assert_eq!(s.chosen, Some(0));
        // The new workload beside the lead needs progress above 1 + 0.4.
        let s = select(&lead, &[cand(&a, "new"), cand(&b, "new")], &KnowsAllButNew, &plain);
        assert_eq!(s.chosen, Some(1));
        assert_eq!(
            s.verdicts[0].rejection,
            Some(Rejection::DoubtfulNewWorkload { predicted: 1.3, required: 1.4 })
        );
        assert!(s.verdicts[0].rejection.as_ref().unwrap().to_string().starts_with("new workload"));
        // With the doubt rule on too, the larger margin decides and names the reason.
        let guarded = SelectionRules { refuse_likely_harm: true, ..plain };
        let s = select(&lead, &[cand(&a, "new")], &KnowsAllButNew, &guarded);
        assert!(matches!(s.verdicts[0].rejection, Some(Rejection::DoubtfulNewWorkload { .. })));
        let s = select(&lead, &[cand(&prof(30.0, 1.05), "x")], &KnowsAllButNew, &guarded);
        assert!(matches!(s.verdicts[0].rejection, Some(Rejection::LikelyHarmful { .. })));
    }

    /// As [`KnowsAllButNew`], and it says which workload is new and how doubtful a group is:
    /// the candidate's exclusive throughput / 100, so tests can steer it.
    pub(crate) struct Cold;
    impl Predictor for Cold {
        fn predict(&self, m: &[Member<'_>], objective: Objective) -> f64 {
            Doubtful.predict(m, objective)
        }
        fn required_gain(&self, _: &[Member<'_>]) -> f64 {
            0.1
        }
        fn new_workload_gain(&self, m: &[Member<'_>]) -> Option<f64> {
            KnowsAllButNew.new_workload_gain(m)
        }
        fn knows(&self, w: Option<&str>) -> bool {
            w.is_some_and(|w| w != "new")
        }
        fn doubt(&self, m: &[Member<'_>]) -> f64 {
            m.last().map_or(0.0, |c| c.profile.exclusive_throughput() / 100.0)
        }
    }

    /// The rules of the exploration tests: the harm rule on, two exploratory groups a workload.
    pub(crate) fn exploring_rules() -> SelectionRules {
        SelectionRules {
            refuse_likely_harm: true,
            explore_pairs: 2,
            explore_weight: 0.5,
            ..SelectionRules::default()
        }
    }

    /// A candidate of the GPU's user.
    fn cand<'a>(p: &'a Profile, w: &'a str) -> Candidate<'a> {
        Candidate { profile: Some(p), workload: Some(w), same_user: true, may_explore: true }
    }

    #[test]
    fn a_new_workload_is_explored_beside_its_safest_partner_within_its_budget() {
        let lp = prof(10.0, 0.0);
        let lead = lead(&lp);
        let rules = exploring_rules();
        // Both need progress above 1 + 0.4 as new workloads. The first is predicted at 1.3 with
        // doubt 0.2 (lower bound 1.1), the second at 1.35 with doubt 0.3 (lower bound 1.05):
        // the first is the safer one, though the second is predicted higher.
        let (a, b) = (prof(20.0, 1.3), prof(30.0, 1.35));
        let cands = [cand(&a, "new"), cand(&b, "new")];
        let s = select_exploring(&lead, &cands, &Cold, &rules, &[]);
        assert_eq!(s.chosen, Some(0));
        assert_eq!(s.verdicts[0].rejection, None);
        assert_eq!(s.verdicts[0].explores, vec!["new".to_string()]);
        assert_eq!(s.verdicts[0].progress, Some(1.3));
        assert!(matches!(s.verdicts[1].rejection, Some(Rejection::DoubtfulNewWorkload { .. })));
        assert!(s.verdicts[1].explores.is_empty());
        // Under its budget it is explored again; at it, never.
        let once = select_exploring(&lead, &cands, &Cold, &rules, &[("new", 1), ("x", 9)]);
        assert_eq!(once.chosen, Some(0));
        let spent = select_exploring(&lead, &cands, &Cold, &rules, &[("new", 2)]);
        assert_eq!(spent.chosen, None);
        assert!(spent.verdicts.iter().all(|v| v.explores.is_empty() && v.rejection.is_some()));
        // `select` counts nothing; the library's default explores nothing.
        assert_eq!(select(&lead, &cands, &Cold, &rules).chosen, Some(0));
        let off = SelectionRules { explore_pairs: 0, ..rules.clone() };
        assert_eq!(select_exploring(&lead, &cands, &Cold, &off, &[]).chosen, None);
        assert_eq!(SelectionRules::default().explore_pairs, 0);
    }

    #[test]
    fn exploration_needs_a_predicted_gain_of_its_margin_and_never_displaces_a_passing_pair() {
        let lp = prof(10.0, 0.0);
        let lead = lead(&lp);
        let rules = exploring_rules();
        // Predicted at 1.08 with doubt 0.2: below 1 + 0.5 × 0.2, not explored; nor is one
        // predicted harmful (0.95), whatever its doubt.
        let (thin, harmful) = (prof(20.0, 1.08), prof(1.0, 0.95));
        let s = select_exploring(
            &lead,
            &[cand(&thin, "new"), cand(&harmful, "new")],
            &Cold,
            &rules,
            &[],
        );
        assert_eq!(s.chosen, None);
        assert!(matches!(s.verdicts[0].rejection, Some(Rejection::DoubtfulNewWorkload { .. })));
        assert!(matches!(s.verdicts[1].rejection, Some(Rejection::BelowGainThreshold { .. })));
        // A known workload within the doubt margin (1.05 ≤ 1.1) is never explored.
        let near = prof(1.0, 1.05);
        let s = select_exploring(&lead, &[cand(&near, "x")], &Cold, &rules, &[]);
        assert_eq!(s.chosen, None);
        assert!(matches!(s.verdicts[0].rejection, Some(Rejection::LikelyHarmful { .. })));
        // A pair that passes wins over an explorable one.
        let (explorable, known) = (prof(20.0, 1.3), prof(5.0, 1.2));
        let s = select_exploring(
            &lead,
            &[cand(&explorable, "new"), cand(&known, "x")],
            &Cold,
            &rules,
            &[],
        );
        assert_eq!(s.chosen, Some(1));
        assert!(s.verdicts.iter().all(|v| v.explores.is_empty()));
        // A new workload on the GPU is explored beside a known joiner, and counted.
        let new_lead = [Member { profile: &lp, workload: Some("new") }];
        let s = select_exploring(&new_lead, &[cand(&explorable, "x")], &Cold, &rules, &[]);
        assert_eq!((s.chosen, s.verdicts[0].explores.clone()), (Some(0), vec!["new".into()]));
        let spent =
            select_exploring(&new_lead, &[cand(&explorable, "x")], &Cold, &rules, &[("new", 2)]);
        assert_eq!(spent.chosen, None);
    }
}
