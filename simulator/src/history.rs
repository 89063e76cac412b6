//! A site's history, day by day: each day a trace of jobs drawn from the workloads the site has
//! (popular ones repeat; new ones arrive over time), kace deciding with the model of the
//! previous night, each formed pair observed at the artifact's measured throughputs with
//! measurement noise, and a retraining every night with the selector's training code, as
//! `kace retrain` runs it. `kace eval history` prints what this returns.
//!
//! Two trainings are compared on the same days: [`Training::Repeats`] (what `kace retrain` does
//! now: repeats merged, each corroborated group corrected from its own observations,
//! [`kace_selector::training::train_observed`]) and [`Training::Independent`] (every
//! observation an independent group of one global model, [`kace_selector::training::train`],
//! as before issue 34). Both keep at most [`MAX_GROUPS_PER_LONE_USER`] untrusted observations
//! per workload combination and user, as the store's training set does.
//!
//! The ground truth is the artifact's measured pairs: a pair it has no measurement of (too
//! large for the GPU's memory, or never measured) is never offered. Decisions and the oracle
//! are in normalised progress (Σ colocated / exclusive), the measure the gain rule asks in, so
//! that "no partner" (1: the lead alone, the other job later) compares with a pair.
//!
//! Pure: the caller reads the data; everything random comes from the seed.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use kace_selector::dataset::{ColocationData, Group};
use kace_selector::decision::{decide, GpuState, Joiner, OnGpu, Policy};
use kace_selector::eval::colocations::n_occur_split;
use kace_selector::selection::{EXPLORE_PAIRS, EXPLORE_WEIGHT};
use kace_selector::slowdown::group_key;
use kace_selector::training::TrainingPolicy;
use kace_selector::{Model, ModelKind, Objective, Profile, SelectionRules};

use crate::error::SimError;
use crate::night::{first_model, measured, retrain, Store, Verdict, MEASUREMENT_NOISE};
use crate::rng::{SplitMix64, Zipf};

pub use crate::night::{Training, MAX_GROUPS_PER_LONE_USER};

/// What the simulated site looks like. The defaults were set before any history was run, from
/// what the issue describes (a site that runs the same workloads again and again; 1–2 %
/// measurement noise), not from the figures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HistorySpec {
    /// Days simulated.
    pub days: usize,
    /// Jobs submitted per day.
    pub jobs_per_day: usize,
    /// Workloads the site has on day 1; the others arrive one per day ([`Self::new_per_day`]).
    pub initial_workloads: usize,
    /// New workloads per day from day 2, until every workload of the data has arrived.
    pub new_per_day: usize,
    /// Held candidates a lead is offered (the queue's next jobs).
    pub window: usize,
    /// Users submitting; each job's user is drawn uniformly.
    pub users: usize,
    /// Zipf exponent of workload popularity (0: uniform).
    pub popularity: f64,
    /// Measurement noise of one observation: standard deviation of each member's log
    /// throughput (0.015: the 1–2 % measured on repeats).
    pub noise: f64,
    /// The admin's import before day 1: the paper's n_occur split of the initial workloads'
    /// measured pairs, trusted.
    pub import_n_occur: u32,
    /// Exploratory groups per cold workload (`selection.explore_pairs`; 0: none). Default the
    /// production default.
    pub explore_pairs: u32,
    /// Doubts of predicted gain an exploratory group must show (`selection.explore_weight`).
    pub explore_weight: f64,
}

impl Default for HistorySpec {
    fn default() -> Self {
        HistorySpec {
            days: 14,
            jobs_per_day: 48,
            initial_workloads: 14,
            new_per_day: 1,
            window: 8,
            users: 4,
            popularity: 1.0,
            noise: MEASUREMENT_NOISE,
            import_n_occur: 3,
            explore_pairs: EXPLORE_PAIRS,
            explore_weight: EXPLORE_WEIGHT,
        }
    }
}

/// One simulated day, decided with the model of the night before.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Day {
    /// 1-based.
    pub day: usize,
    /// Decisions (one per lead).
    pub decisions: usize,
    /// Groups formed.
    pub formed: usize,
    /// Σ achieved / Σ oracle normalised progress over the day's decisions (the oracle picks
    /// the best measured candidate, or none when no pair beats 1).
    pub oracle_ratio: f64,
    /// Σ (achieved − 1) / Σ (oracle − 1): the share of the oracle's gain over no sharing kept.
    pub gain_share: Option<f64>,
    /// Share of formed groups measured slower together than one after the other (ground truth
    /// Σ colocated / exclusive < 1).
    pub harmful_share: Option<f64>,
    /// Per-job mean absolute percentage error of the day's model on the measured groups
    /// observed at least twice before the day (ground truth, not a noisy observation).
    pub mape_repeated: Option<f64>,
    /// The same on every measured pair of the workloads the site has.
    pub mape_all: f64,
    /// Groups observed at least twice before the day.
    pub repeated_groups: usize,
    /// Workloads that arrived this day.
    pub new_workloads: usize,
    /// Decisions whose lead's workload the day's model never trained on.
    pub cold_decisions: usize,
    /// Their Σ achieved / Σ oracle.
    pub cold_oracle_ratio: Option<f64>,
    /// Groups formed with a workload the day's model never trained on.
    pub cold_formed: usize,
    /// Of those, harmful ones.
    pub cold_harmful: usize,
    /// Groups formed to explore a cold workload (`selection.explore_pairs`).
    pub explored: usize,
    /// Of those, harmful ones.
    pub explored_harmful: usize,
    /// Observations training had the night before.
    pub observations: usize,
    /// Whether the night before's training was activated (day 1: the import's model).
    pub activated: bool,
    /// Why it was not (the activation rule's words).
    pub refusal: Option<String>,
    /// Groups the day's model carries a correction for.
    pub corrected: usize,
}

/// One seed's history under one training.
#[derive(Debug, Clone, PartialEq)]
pub struct History {
    /// The seed.
    pub seed: u64,
    /// The training.
    pub training: Training,
    /// Its days.
    pub days: Vec<Day>,
}

/// The measured ground truth: each ordered pair's (first, second) throughput.
struct Truth {
    pairs: HashMap<(String, String), (f64, f64)>,
    profiles: BTreeMap<String, Profile>,
}

impl Truth {
    fn of(data: &ColocationData) -> Result<Truth, SimError> {
        if data.k != 2 {
            return Err(SimError::World(format!(
                "a site history needs pairs, not groups of {}",
                data.k
            )));
        }
        let mut pairs = HashMap::new();
        for g in &data.groups {
            let (a, b) = (g.workloads[0].clone(), g.workloads[1].clone());
            let (ta, tb) = (g.throughputs[0], g.throughputs[1]);
            if !(ta > 0.0 && tb > 0.0) {
                return Err(SimError::World(format!("pair {a}+{b}: throughputs must be > 0")));
            }
            pairs.insert((b.clone(), a.clone()), (tb, ta));
            pairs.insert((a, b), (ta, tb));
        }
        let profiles = data.profiles().into_iter().collect();
        Ok(Truth { pairs, profiles })
    }

    fn group(&self, a: &str, b: &str, thr: (f64, f64)) -> Option<Group> {
        Some(Group {
            workloads: vec![a.to_string(), b.to_string()],
            profiles: vec![*self.profiles.get(a)?, *self.profiles.get(b)?],
            throughputs: vec![thr.0, thr.1],
        })
    }

    /// Ground-truth normalised progress of a pair.
    fn progress(&self, a: &str, b: &str) -> Option<f64> {
        let (ta, tb) = self.pairs.get(&(a.to_string(), b.to_string()))?;
        let (pa, pb) = (self.profiles.get(a)?, self.profiles.get(b)?);
        Some(ta / pa.exclusive_throughput() + tb / pb.exclusive_throughput())
    }
}

/// Per-job absolute percentage errors of `model` on the measured pairs `keys` (ordered pairs
/// as the data hold them).
fn job_errors(model: &Model, truth: &Truth, pairs: &[(String, String)]) -> Vec<f64> {
    let Model::Slowdown(m) = model else { return Vec::new() };
    let mut out = Vec::new();
    for (a, b) in pairs {
        let Some(thr) = truth.pairs.get(&(a.clone(), b.clone())) else { continue };
        let Some(g) = truth.group(a, b, *thr) else { continue };
        let s = m.slowdowns(&g.members());
        for (j, slowdown) in s.iter().enumerate() {
            let predicted = slowdown * g.profiles[j].exclusive_throughput();
            out.push((predicted - g.throughputs[j]).abs() / g.throughputs[j]);
        }
    }
    out
}

fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// Runs one seed's history under `training` (see the module docs).
pub fn run_history(
    data: &ColocationData,
    spec: &HistorySpec,
    seed: u64,
    training: Training,
) -> Result<History, SimError> {
    if spec.days == 0 || spec.jobs_per_day == 0 || spec.window == 0 || spec.users == 0 {
        return Err(SimError::Config("days, jobs per day, window and users must be ≥ 1".into()));
    }
    if !(spec.explore_weight.is_finite() && spec.explore_weight >= 0.0) {
        return Err(SimError::Config(format!(
            "explore weight {}: must be a number ≥ 0",
            spec.explore_weight
        )));
    }
    if !(spec.noise.is_finite() && spec.noise >= 0.0) {
        return Err(SimError::Config(format!("noise {}: must be a number ≥ 0", spec.noise)));
    }
    let truth = Truth::of(data)?;
    let names: Vec<String> = data.workloads();
    if names.len() < 2 {
        return Err(SimError::World("a site history needs at least two workloads".into()));
    }
    let mut rng = SplitMix64::new(seed ^ 0x6b61_6365_6869_7374);
    // Arrival order and popularity: one seeded shuffle each.
    let shuffle = |rng: &mut SplitMix64, v: &mut Vec<String>| {
        for i in (1..v.len()).rev() {
            let j = rng.below(i + 1);
            v.swap(i, j);
        }
    };
    let mut arrival = names.clone();
    shuffle(&mut rng, &mut arrival);
    let mut by_popularity = names.clone();
    shuffle(&mut rng, &mut by_popularity);
    let initial = spec.initial_workloads.clamp(2, names.len());
    let arrived_by = |day: usize| -> usize {
        (initial + spec.new_per_day * day.saturating_sub(1)).min(names.len())
    };

    // The admin's import: the paper's split of the initial workloads' measured pairs.
    let first: BTreeSet<&String> = arrival[..initial].iter().collect();
    let sub = ColocationData {
        k: 2,
        groups: data
            .groups
            .iter()
            .filter(|g| g.workloads.iter().all(|w| first.contains(w)))
            .cloned()
            .collect(),
    };
    let (import, _) = n_occur_split(&sub, (seed & 0xffff_ffff) as u32, spec.import_n_occur);
    let mut store = Store::default();
    for &i in &import {
        store.push(sub.groups[i].clone(), Vec::new(), true, 0);
    }
    let policy = TrainingPolicy::new(ModelKind::Slowdown, Objective::NormalisedProgress);
    let mut model = first_model(&store, training, &policy)?;
    let mut active_upto = store.len();
    let mut activated = true;
    let mut refusal: Option<String> = None;
    // How often each combination was observed in what the model was trained on.
    let mut trained_counts: HashMap<String, usize> = HashMap::new();
    for c in store.combinations() {
        *trained_counts.entry(c.clone()).or_default() += 1;
    }
    let decision_policy = Policy {
        rules: SelectionRules {
            objective: Objective::NormalisedProgress,
            refuse_likely_harm: true,
            explore_pairs: spec.explore_pairs,
            explore_weight: spec.explore_weight,
            ..SelectionRules::default()
        },
        max_jobs_per_gpu: 2,
        multi_user: true,
        min_alone_runs: 1,
    };
    // Each workload's exploratory groups so far, as the decider keeps them.
    let mut explored: BTreeMap<String, u32> = BTreeMap::new();
    let mut days = Vec::with_capacity(spec.days);
    for day in 1..=spec.days {
        let have = arrived_by(day);
        let new_workloads = have - arrived_by(day - 1).min(have);
        let present: BTreeSet<&String> = arrival[..have].iter().collect();
        let popular: Vec<&String> = by_popularity.iter().filter(|w| present.contains(w)).collect();
        let zipf = Zipf::new(popular.len(), spec.popularity);
        let mut queue: Vec<(String, String)> = (0..spec.jobs_per_day)
            .map(|_| {
                let w = popular[zipf.sample(&mut rng)].clone();
                (w, format!("u{}", rng.below(spec.users)))
            })
            .collect();
        let Model::Slowdown(sm) = &model else {
            return Err(SimError::Config("a site history runs the slowdown model".into()));
        };
        let mut d = Day {
            day,
            new_workloads,
            observations: store.len(),
            activated,
            refusal: refusal.clone(),
            corrected: sm.corrections.len(),
            ..Day::default()
        };
        let (mut achieved, mut oracle) = (0.0, 0.0);
        let (mut cold_achieved, mut cold_oracle) = (0.0, 0.0);
        let mut harmful = 0usize;
        while !queue.is_empty() {
            let (lead, lead_user) = queue.remove(0);
            let offered: Vec<usize> = (0..queue.len().min(spec.window))
                .filter(|&i| truth.pairs.contains_key(&(lead.clone(), queue[i].0.clone())))
                .collect();
            let lead_profile = truth.profiles.get(&lead).copied();
            let Some(lead_profile) = lead_profile else { continue };
            let running = [OnGpu { profile: &lead_profile, workload: &lead, user: None }];
            let cand_profiles: Vec<Option<Profile>> =
                offered.iter().map(|&i| truth.profiles.get(&queue[i].0).copied()).collect();
            let joiners: Vec<Joiner<'_>> = offered
                .iter()
                .zip(&cand_profiles)
                .map(|(&i, p)| Joiner { profile: p.as_ref(), workload: &queue[i].0, user: None })
                .collect();
            let counts: Vec<(&str, u32)> = explored.iter().map(|(w, &n)| (w.as_str(), n)).collect();
            let gpu = GpuState {
                running: &running,
                memory_gib: None,
                failed_pairs: &[],
                explored: &counts,
                // No user reaches the decision (`user: None` matches anyone's), so exploration
                // is never kept to one user's jobs and needs no vouching here.
                vouched: &[],
            };
            let decision = decide(&gpu, &joiners, &model, &decision_policy);
            let choice = decision.chosen();
            let explores: Vec<String> = choice
                .and_then(|c| decision.selection.verdicts.get(c))
                .map(|v| v.explores.clone())
                .unwrap_or_default();
            drop(counts);
            let best = offered
                .iter()
                .filter_map(|&i| truth.progress(&lead, &queue[i].0))
                .fold(1.0_f64, f64::max);
            let cold = !sm.knows(Some(&lead));
            d.decisions += 1;
            oracle += best;
            let got = match choice {
                None => 1.0,
                Some(c) => {
                    let at = offered[c];
                    let (partner, partner_user) = queue.remove(at);
                    let value = truth.progress(&lead, &partner).unwrap_or(1.0);
                    d.formed += 1;
                    if value < 1.0 {
                        harmful += 1;
                    }
                    if !explores.is_empty() {
                        d.explored += 1;
                        d.explored_harmful += usize::from(value < 1.0);
                        for w in &explores {
                            *explored.entry(w.clone()).or_default() += 1;
                        }
                    }
                    if !sm.knows(Some(&lead)) || !sm.knows(Some(&partner)) {
                        d.cold_formed += 1;
                        if value < 1.0 {
                            d.cold_harmful += 1;
                        }
                    }
                    // The observation: the measured throughputs with measurement noise.
                    if let Some(&(ta, tb)) = truth.pairs.get(&(lead.clone(), partner.clone())) {
                        let noisy = (
                            measured(ta, spec.noise, &mut rng),
                            measured(tb, spec.noise, &mut rng),
                        );
                        if let Some(g) = truth.group(&lead, &partner, noisy) {
                            let mut users = vec![lead_user.clone(), partner_user];
                            users.sort_unstable();
                            users.dedup();
                            store.push(g, users, false, day as i64);
                        }
                    }
                    value
                }
            };
            achieved += got;
            if cold {
                d.cold_decisions += 1;
                cold_achieved += got;
                cold_oracle += best;
            }
        }
        d.oracle_ratio = if oracle > 0.0 { achieved / oracle } else { 1.0 };
        let possible = oracle - d.decisions as f64;
        d.gain_share = (possible > 1e-12).then(|| (achieved - d.decisions as f64) / possible);
        d.harmful_share = (d.formed > 0).then(|| harmful as f64 / d.formed as f64);
        d.cold_oracle_ratio = (cold_oracle > 0.0).then(|| cold_achieved / cold_oracle);
        // The day's model against the ground truth.
        let measured: Vec<(String, String)> = data
            .groups
            .iter()
            .filter(|g| g.workloads.iter().all(|w| present.contains(w)))
            .map(|g| (g.workloads[0].clone(), g.workloads[1].clone()))
            .collect();
        let repeated: Vec<(String, String)> = measured
            .iter()
            .filter(|(a, b)| {
                trained_counts.get(&group_key([a.as_str(), b.as_str()])).copied().unwrap_or(0) >= 2
            })
            .cloned()
            .collect();
        d.repeated_groups = repeated.len();
        d.mape_all = mean(&job_errors(&model, &truth, &measured)).unwrap_or(f64::NAN);
        d.mape_repeated = mean(&job_errors(&model, &truth, &repeated));
        days.push(d);
        // The night: retrain on everything observed so far.
        if day < spec.days {
            match retrain(&store, &model, active_upto, training, &policy)? {
                Verdict::Activated { model: m, .. } => {
                    model = *m;
                    refusal = None;
                    active_upto = store.len();
                    activated = true;
                    trained_counts.clear();
                    let (_, _, kept) = store.training_set();
                    for &i in &kept {
                        *trained_counts.entry(store.combinations()[i].clone()).or_default() += 1;
                    }
                }
                Verdict::Refused(why) => {
                    activated = false;
                    refusal = Some(why);
                }
            }
        }
    }
    Ok(History { seed, training, days })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Eight workloads, every pair measured, each pair with its own interference.
    fn data() -> ColocationData {
        crate::retraining::tests::data(1.0)
    }

    fn spec() -> HistorySpec {
        HistorySpec {
            days: 4,
            jobs_per_day: 40,
            initial_workloads: 7,
            import_n_occur: 5,
            ..HistorySpec::default()
        }
    }

    #[test]
    fn a_history_is_reproducible_and_its_figures_are_shares() {
        let d = data();
        let a = run_history(&d, &spec(), 3, Training::Repeats).unwrap();
        assert_eq!(a, run_history(&d, &spec(), 3, Training::Repeats).unwrap());
        assert_ne!(a.days, run_history(&d, &spec(), 4, Training::Repeats).unwrap().days);
        assert_eq!(a.days.len(), 4);
        assert_eq!(a.days.iter().map(|x| x.new_workloads).collect::<Vec<_>>(), vec![0, 1, 0, 0]);
        for x in &a.days {
            assert!(x.oracle_ratio > 0.0 && x.oracle_ratio <= 1.0 + 1e-12, "{x:?}");
            assert!(x.harmful_share.is_none_or(|h| (0.0..=1.0).contains(&h)));
            assert!(x.decisions >= 20 && x.decisions <= 40 && x.formed <= x.decisions);
            assert!(x.mape_all.is_finite());
        }
        // Observations accumulate night after night.
        assert!(a.days.windows(2).all(|w| w[1].observations > w[0].observations));
    }

    #[test]
    fn repeated_groups_are_learnt_by_their_corrections_not_by_the_global_model_alone() {
        let d = data();
        let s = HistorySpec { days: 6, ..spec() };
        let r = run_history(&d, &s, 1, Training::Repeats).unwrap();
        let i = run_history(&d, &s, 1, Training::Independent).unwrap();
        let last = |h: &History| h.days.last().cloned().unwrap();
        let (lr, li) = (last(&r), last(&i));
        assert!(lr.repeated_groups > 0);
        // Each pair has its own interference (±36 %), which the profile-only model cannot
        // learn; the corrections do. (The independent training's doubt is so wide here that it
        // forms no pair, and so never learns one.)
        let mr = lr.mape_repeated.unwrap();
        assert!(mr < 0.05 && mr < lr.mape_all / 2.0, "repeated {mr} vs all {}", lr.mape_all);
        assert!(li.mape_all > 2.0 * mr, "independent {} vs repeats {mr}", li.mape_all);
        assert!(lr.formed > 0);
    }

    #[test]
    fn exploration_is_bounded_per_new_workload_and_off_when_asked() {
        let d = data();
        let s = HistorySpec { days: 6, explore_pairs: 1, explore_weight: 0.0, ..spec() };
        let on = run_history(&d, &s, 2, Training::Repeats).unwrap();
        let explored: usize = on.days.iter().map(|x| x.explored).sum();
        // Each exploratory group spends one of the budget of at least one of the 8 workloads
        // (one each here), whatever the nights learn.
        assert!(explored <= 8, "{explored}");
        assert!(on.days.iter().all(|x| x.explored_harmful <= x.explored && x.explored <= x.formed));
        let off = HistorySpec { explore_pairs: 0, ..s };
        let none = run_history(&d, &off, 2, Training::Repeats).unwrap();
        assert!(none.days.iter().all(|x| x.explored == 0));
        let bad = HistorySpec { explore_weight: -1.0, ..s };
        assert!(run_history(&d, &bad, 2, Training::Repeats).is_err());
    }

    #[test]
    fn bad_specs_and_data_are_errors() {
        let d = data();
        assert!(run_history(&d, &HistorySpec { days: 0, ..spec() }, 1, Training::Repeats).is_err());
        assert!(run_history(&d, &HistorySpec { noise: f64::NAN, ..spec() }, 1, Training::Repeats)
            .is_err());
        let triples = ColocationData { k: 3, groups: Vec::new() };
        assert!(run_history(&triples, &spec(), 1, Training::Repeats).is_err());
    }
}
