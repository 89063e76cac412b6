//! One night's retraining as `kace retrain` runs it, shared by the site history ([`crate::history`])
//! and the cluster simulation's nightly retraining ([`crate::retraining`]): the store of
//! observations with the store's per-user cap, the training through the selector's library
//! against the active model under its activation rule, and an observation's measurement noise.
//!
//! The training policy itself is the selector's ([`kace_selector::training`]); this module only
//! feeds it what a site's store would.

use std::collections::{BTreeSet, HashMap};

use kace_selector::dataset::Group;
use kace_selector::slowdown::group_key;
use kace_selector::training::{train, train_observed, Active, Evidence, TrainingPolicy};
use kace_selector::Model;

use crate::error::SimError;
use crate::rng::SplitMix64;

/// The store's cap on one user's untrusted groups per workload combination
/// (`kace_sql::types::MAX_GROUPS_PER_LONE_USER`; kace-sql sits above this crate, so the value
/// is repeated here and a test in `cli/tests` keeps the two equal).
pub const MAX_GROUPS_PER_LONE_USER: usize = 5;

/// Measurement noise of one observation unless a caller sets another: the standard deviation
/// of each member's log throughput, 1.5 %, the 1–2 % measured on repeats.
pub const MEASUREMENT_NOISE: f64 = 0.015;

/// Which nightly training runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Training {
    /// Repeats merged, per-group corrections (`kace retrain` since issue 34).
    Repeats,
    /// Every observation an independent group of one global model (before issue 34).
    Independent,
}

impl Training {
    /// Stable name, for reports.
    pub fn key(self) -> &'static str {
        match self {
            Training::Repeats => "repeats",
            Training::Independent => "independent",
        }
    }
}

/// A standard normal draw.
pub fn standard_normal(rng: &mut SplitMix64) -> f64 {
    // Box–Muller; 1 − u is in (0, 1], so the logarithm is finite.
    let (u, v) = (1.0 - rng.next_f64(), rng.next_f64());
    (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
}

/// `throughput` as one observation measures it: × exp(N(0, `noise`)).
pub fn measured(throughput: f64, noise: f64, rng: &mut SplitMix64) -> f64 {
    throughput * (noise * standard_normal(rng)).exp()
}

/// The store's per-user cap ([`MAX_GROUPS_PER_LONE_USER`]), in the store's order: which
/// observations training keeps.
/// `combination[i]` is observation i's workload combination ([`group_key`]).
fn capped(evidence: &[Evidence], combination: &[String]) -> Vec<usize> {
    let mut taken: HashMap<(String, String), usize> = HashMap::new();
    let mut keep = Vec::new();
    for (i, (e, combination)) in evidence.iter().zip(combination).enumerate() {
        if e.trusted {
            keep.push(i);
            continue;
        }
        let users: BTreeSet<&String> = e.users.iter().collect();
        let full = users.iter().any(|u| {
            taken.get(&(combination.clone(), (*u).clone())).copied().unwrap_or(0)
                >= MAX_GROUPS_PER_LONE_USER
        });
        if full {
            continue;
        }
        for u in users {
            *taken.entry((combination.clone(), u.clone())).or_default() += 1;
        }
        keep.push(i);
    }
    keep
}

/// What a simulated site has observed, in the store's order.
#[derive(Debug, Clone, Default)]
pub struct Store {
    groups: Vec<Group>,
    evidence: Vec<Evidence>,
    /// Per observation, its combination (sorted names), for the cap.
    combination: Vec<String>,
}

impl Store {
    /// Appends one observation: `users` observed `g` on `day` (`trusted`: an admin's import).
    pub fn push(&mut self, g: Group, users: Vec<String>, trusted: bool, day: i64) {
        self.combination.push(group_key(g.workloads.iter().map(String::as_str)));
        self.groups.push(g);
        self.evidence.push(Evidence { users, trusted, day: Some(day) });
    }

    /// Observations stored.
    pub fn len(&self) -> usize {
        self.groups.len()
    }

    /// Whether nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// Observation `i`.
    pub fn group(&self, i: usize) -> Option<&Group> {
        self.groups.get(i)
    }

    /// Each observation's workload combination ([`group_key`]), in the store's order.
    pub fn combinations(&self) -> &[String] {
        &self.combination
    }

    /// The training set after the cap: groups, evidence, and for each its store index.
    pub fn training_set(&self) -> (Vec<Group>, Vec<Evidence>, Vec<usize>) {
        let keep = capped(&self.evidence, &self.combination);
        (
            keep.iter().map(|&i| self.groups[i].clone()).collect(),
            keep.iter().map(|&i| self.evidence[i].clone()).collect(),
            keep,
        )
    }
}

/// What a night's training decided.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// The activation rule accepts the new model: it serves from the next day on.
    Activated {
        /// The new model (boxed: it is large beside a refusal).
        model: Box<Model>,
        /// The store indices of the observations it was fitted on.
        fit: Vec<usize>,
    },
    /// The activation rule refuses it (its words): the active model keeps serving.
    Refused(String),
}

/// The first model, before any night: the store's training set with no active model to beat.
pub fn first_model(
    store: &Store,
    training: Training,
    policy: &TrainingPolicy,
) -> Result<Model, SimError> {
    let (groups, evidence, _) = store.training_set();
    Ok(match training {
        Training::Repeats => train_observed(&groups, Some(&evidence), None, policy)?.model,
        Training::Independent => train(&groups, None, policy)?.model,
    })
}

/// The night's training, as `kace retrain` runs it: the store's training set, the active model
/// as competitor (it saw the first `active_upto` observations; the trusted ones are the
/// reference), the selector's training code, and its activation rule.
pub fn retrain(
    store: &Store,
    active: &Model,
    active_upto: usize,
    training: Training,
    policy: &TrainingPolicy,
) -> Result<Verdict, SimError> {
    let (groups, evidence, at) = store.training_set();
    let seen: Vec<bool> = at.iter().map(|&i| i < active_upto).collect();
    let trusted: Vec<bool> = evidence.iter().map(|e| e.trusted).collect();
    let reference = trusted.iter().any(|&t| t).then_some(trusted.as_slice());
    let competitor = Active { model: active, seen: Some(&seen), trusted: reference };
    let t = match training {
        Training::Repeats => train_observed(&groups, Some(&evidence), Some(competitor), policy)?,
        Training::Independent => train(&groups, Some(competitor), policy)?,
    };
    Ok(match t.refusal {
        None => Verdict::Activated {
            model: Box::new(t.model),
            fit: t.fit_indices.iter().filter_map(|&i| at.get(i).copied()).collect(),
        },
        Some(r) => Verdict::Refused(r.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_keeps_five_untrusted_groups_per_combination_and_user() {
        let e =
            |u: &str, trusted: bool| Evidence { users: vec![u.to_string()], trusted, day: None };
        let mut ev: Vec<Evidence> = (0..7).map(|_| e("u", false)).collect();
        ev.push(e("v", false));
        ev.push(e("u", true));
        ev.push(e("u", false));
        let mut combination = vec!["a|b".to_string(); 9];
        combination.push("a|c".to_string());
        assert_eq!(capped(&ev, &combination), vec![0, 1, 2, 3, 4, 7, 8, 9]);
    }

    #[test]
    fn measurement_noise_is_seeded_and_zero_noise_is_exact() {
        let (mut a, mut b) = (SplitMix64::new(4), SplitMix64::new(4));
        let x: Vec<f64> = (0..50).map(|_| measured(10.0, 0.015, &mut a)).collect();
        let y: Vec<f64> = (0..50).map(|_| measured(10.0, 0.015, &mut b)).collect();
        assert_eq!(x, y);
        assert!(x.iter().all(|v| (v / 10.0).ln().abs() < 0.1), "{x:?}");
        assert!(x.iter().any(|&v| v != 10.0));
        assert_eq!(measured(10.0, 0.0, &mut a), 10.0);
    }
}
