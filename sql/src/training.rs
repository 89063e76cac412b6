//! A training against the store: read the observed groups, the trusted reference and the active
//! model, run the library's training policy ([`kace_selector::training::train`]), store the new
//! version with its [`TrainingRecord`] and activate it when the policy says so. `kace train`
//! and the nightly `kace retrain` print what this returns; the rules live in the selector's
//! training library and in the record, not in the CLI.

use kace_selector::eval::FitQuality;
use kace_selector::training::{
    self, DataFacts, Evidence, Refusal, TrainingError, TrainingPolicy, TrainingRecord,
};
use kace_selector::ModelKind;

use kace_selector::dataset::Group;
use kace_selector::Profile;

use crate::convert::{load_active_model, model_to_new_model, selector_profile};
use crate::types::ObservedGroup;
use crate::{Db, Error, Result};

/// What a training came to.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// A new version was stored (and activated, or not: see [`Stored::refusal`]).
    Stored(Box<Stored>),
    /// Too few usable observed groups to fit a model and hold some out: a young installation.
    /// `kace train` reports it as an error; the nightly `kace retrain` as "model unchanged".
    NotEnoughGroups {
        /// Observed groups the model kind can learn from whose workloads all have profiles.
        usable: usize,
        /// Observed groups skipped for a missing profile.
        skipped: usize,
        /// Usable groups needed: [`training::MIN_FIT_GROUPS`] to fit plus one to hold out.
        needed: usize,
    },
    /// The training data have not changed since model `version` of the same kind was fitted
    /// on them with the same split: nothing is stored (the nightly retrain would otherwise add
    /// one a night).
    Unchanged {
        /// The stored version fitted on the same data.
        version: i64,
    },
}

/// A stored training.
#[derive(Debug, Clone)]
pub struct Stored {
    /// The stored model version.
    pub version: i64,
    /// Whether it is now the active version.
    pub activated: bool,
    /// Its kind.
    pub kind: ModelKind,
    /// The validation fit's error on the held-out groups.
    pub quality: FitQuality,
    /// How it compared with the version active before (`None`: there was none, or it could not
    /// compete).
    pub previous: Option<VersusActive>,
    /// Why it was not activated (`None`: it was).
    pub refusal: Option<Refusal>,
    /// What it saw and decided, as stored with the model.
    pub record: TrainingRecord,
    /// Why the active model could not compete, when it could not (for the log).
    pub notes: Vec<String>,
}

/// How a new model compared with the one active before it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VersusActive {
    /// The version active before.
    pub version: i64,
    /// Held-out groups it had not seen (0: nothing to compare there).
    pub groups: usize,
    /// The new model's validation fit on them.
    pub new: Option<FitQuality>,
    /// The active model on them.
    pub active: Option<FitQuality>,
    /// The new (stored) model against it on the trusted reference (`None`: no trusted group).
    pub reference: Option<training::Comparison>,
    /// The new (stored) model against it on the held-out groups both have seen.
    pub seen: Option<training::Comparison>,
}

/// Trains under `policy` on what `db` holds and stores the result (see the module docs).
/// `policy.force_activation` also stores a model fitted on unchanged data again.
pub fn train(db: &mut Db, policy: &TrainingPolicy) -> Result<Outcome> {
    let started = std::time::Instant::now();
    let set = training_set(db)?;
    let digest = set.digest();
    if !policy.force_activation {
        let same = db.models()?.into_iter().rev().find(|m| {
            m.model.training_digest == digest
                && stored_record(&m.model.metrics).is_some_and(|r| r.same_training(policy))
        });
        if let Some(m) = same {
            return Ok(Outcome::Unchanged { version: m.version });
        }
    }
    let mut notes = Vec::new();
    let active = match load_active_model(db) {
        Ok((v, m)) if m.serves(policy.objective) => Some((v, m)),
        Ok((v, _)) => {
            notes.push(format!("active model {v} does not serve {}", policy.objective.key()));
            None
        }
        Err(Error::NoActiveModel) => None,
        // An active model this build cannot read is "worse than anything".
        Err(Error::BadModel { version, reason }) => {
            notes.push(format!("active model {version} unusable ({reason})"));
            None
        }
        Err(e) => return Err(e),
    };
    // What the active model was fitted on: its groups' observations, up to the row id its
    // record kept (models from before kace kept it: not known).
    let upto = match &active {
        Some((v, _)) => {
            stored_record(&db.model(*v)?.model.metrics).and_then(|r| r.observations_upto)
        }
        None => None,
    };
    let seen = upto.map(|u| set.seen_upto(u));
    // The admin's imports and what the admin marked: the reference a new model may not get
    // worse on (the library's activation rule).
    let trusted = set.trusted();
    let reference = trusted.iter().any(|&t| t).then_some(trusted.as_slice());
    let competitor = active.as_ref().map(|(_, m)| training::Active {
        model: m,
        seen: seen.as_deref(),
        trusted: reference,
    });
    // Who observed each group and whether it is trusted: a group's own correction needs
    // corroboration (the selector's `training::repeats`).
    let evidence: Vec<Evidence> = set
        .observed
        .iter()
        .map(|o| {
            let mut users: Vec<String> = o.members.iter().filter_map(|m| m.user.clone()).collect();
            users.sort_unstable();
            users.dedup();
            Evidence { users, trusted: o.trusted, day: o.day() }
        })
        .collect();
    let t = match training::train_observed(&set.groups, Some(&evidence), competitor, policy) {
        Err(TrainingError::NotEnoughGroups { usable, needed }) => {
            return Ok(Outcome::NotEnoughGroups { usable, skipped: set.skipped, needed })
        }
        Err(e) => return Err(Error::Training(e)),
        Ok(t) => t,
    };
    let previous = active.as_ref().map(|a| VersusActive {
        version: a.0,
        groups: t.compared_groups,
        new: t.compared_quality,
        active: t.active_quality,
        reference: t.reference,
        seen: t.seen_comparison,
    });
    let facts = DataFacts {
        skipped_groups: set.skipped,
        capped_groups: set.capped,
        trusted_groups: trusted.iter().filter(|&&t| t).count(),
        observations_upto: set.newest_observation(),
        active_version: previous.map(|p| p.version),
    };
    let mut record = TrainingRecord::new(&t, policy, facts);
    record.train_wall_s = Some(started.elapsed().as_secs_f64());
    let metrics = serde_json::to_value(&record)
        .map_err(|source| Error::Json { what: "training record".into(), source })?;
    let version = db.insert_model(&model_to_new_model(&t.model, metrics, digest, t.fit_groups)?)?;
    if t.activate {
        db.activate_model(version)?;
    }
    Ok(Outcome::Stored(Box::new(Stored {
        version,
        activated: t.activate,
        kind: policy.kind,
        quality: t.quality,
        previous,
        refusal: t.refusal,
        record,
        notes,
    })))
}

/// The training record stored with a model, when its metrics hold one this build reads.
pub fn stored_record(metrics: &serde_json::Value) -> Option<TrainingRecord> {
    serde_json::from_value(metrics.clone()).ok()
}

/// Training examples: observed groups (pairs, triples, …) whose workloads all have their system
/// metrics (kernel metrics too, or a system-only profile: see [`selector_profile`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TrainingSet {
    /// Each group as the selector sees it (names, profiles, per-job colocated throughput).
    pub groups: Vec<Group>,
    /// The observed groups, parallel to `groups`.
    pub observed: Vec<ObservedGroup>,
    /// Observed groups left out because a profile was missing or incomplete.
    pub skipped: usize,
    /// Observed groups left out because one user already had
    /// [`crate::types::MAX_GROUPS_PER_LONE_USER`] of their workload combination.
    pub capped: usize,
}

impl TrainingSet {
    /// The row id of the newest observation any group uses (0 when there is none): stored with
    /// a model as `observations_upto`, so that a later training knows which groups it has seen.
    pub fn newest_observation(&self) -> i64 {
        self.observed.iter().map(ObservedGroup::newest).max().unwrap_or(0)
    }

    /// For each group, whether it is trusted (see [`ObservedGroup::trusted`]): the reference a
    /// new model is checked on.
    pub fn trusted(&self) -> Vec<bool> {
        self.observed.iter().map(|o| o.trusted).collect()
    }

    /// For each group, whether a model trained on observations up to row id `upto` has seen
    /// it (all its observations were stored by then).
    pub fn seen_upto(&self, upto: i64) -> Vec<bool> {
        self.observed.iter().map(|o| o.newest() <= upto).collect()
    }

    /// A stable digest of the examples (FNV-1a over keys and values), so that two trainings on
    /// the same data are recognisable.
    pub fn digest(&self) -> String {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut eat = |bytes: &[u8]| {
            for b in bytes {
                h = (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
            }
        };
        for (o, g) in self.observed.iter().zip(&self.groups) {
            for m in &o.members {
                eat(m.key.as_bytes());
            }
            let values = g.profiles.iter().flat_map(|p| p.features.iter()).chain(&g.throughputs);
            for v in values {
                eat(&v.to_bits().to_le_bytes());
            }
        }
        format!("fnv1a64:{h:016x}")
    }

    /// How many groups of each size k the set holds.
    pub fn sizes(&self) -> std::collections::BTreeMap<usize, usize> {
        let mut out = std::collections::BTreeMap::new();
        for g in &self.groups {
            *out.entry(g.k()).or_insert(0) += 1;
        }
        out
    }
}

/// The observed groups training may use: every trusted group, and of the others at most
/// [`crate::types::MAX_GROUPS_PER_LONE_USER`] per workload combination and user (the first in
/// the store's order; a group of several users counts for each, an unknown user is one user).
/// One user can thus add a few groups of a combination, never outweigh the rest with a flood
/// (the re-audit's H1: 20 forged pairs). Returns the kept groups, in their order, and how many
/// were left out.
pub fn limit_lone_users(mut observed: Vec<ObservedGroup>) -> (Vec<ObservedGroup>, usize) {
    use std::collections::BTreeMap;
    let mut taken: BTreeMap<(Vec<String>, Option<String>), usize> = BTreeMap::new();
    let before = observed.len();
    observed.retain(|o| {
        if o.trusted {
            return true;
        }
        let mut combination: Vec<String> = o.members.iter().map(|m| m.workload.clone()).collect();
        combination.sort_unstable();
        let mut users: Vec<Option<String>> = o.members.iter().map(|m| m.user.clone()).collect();
        users.sort_unstable();
        users.dedup();
        let full = users.iter().any(|u| {
            taken.get(&(combination.clone(), u.clone())).copied().unwrap_or(0)
                >= crate::types::MAX_GROUPS_PER_LONE_USER
        });
        if full {
            return false;
        }
        for u in users {
            *taken.entry((combination.clone(), u)).or_default() += 1;
        }
        true
    });
    let capped = before - observed.len();
    (observed, capped)
}

/// Builds the training set from the database: every observed group of any size k ≥ 2, with
/// what one user alone shows capped ([`limit_lone_users`]).
pub fn training_set(db: &Db) -> Result<TrainingSet> {
    let (observed, capped) = limit_lone_users(db.observed_groups()?);
    let profiles = db.all_profiles(None)?;
    let mut set = TrainingSet { capped, ..TrainingSet::default() };
    for o in observed {
        let found: Option<Vec<Profile>> = o
            .members
            .iter()
            .map(|m| {
                let p = profiles.get(&m.workload).and_then(selector_profile)?;
                (m.throughput > 0.0).then_some(p)
            })
            .collect();
        match found {
            Some(profiles) => {
                set.groups.push(Group {
                    workloads: o.members.iter().map(|m| m.workload.clone()).collect(),
                    profiles,
                    throughputs: o.members.iter().map(|m| m.throughput).collect(),
                });
                set.observed.push(o);
            }
            None => set.skipped += 1,
        }
    }
    Ok(set)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The re-audit's H1 as one user's flood: 20 forged pairs of one combination from one user
    /// count as `MAX_GROUPS_PER_LONE_USER`; another user's, trusted ones and other combinations
    /// count on their own.
    #[test]
    fn one_users_flood_is_capped_per_combination() {
        use crate::types::{ObservedMember, MAX_GROUPS_PER_LONE_USER};
        let group = |id: i64, a: &str, b: &str, user: Option<&str>, trusted: bool| ObservedGroup {
            members: [a, b]
                .iter()
                .enumerate()
                .map(|(k, w)| ObservedMember {
                    workload: w.to_string(),
                    throughput: 1.0,
                    key: format!("c/{id}/{k}"),
                    id: 2 * id + k as i64,
                    user: user.map(str::to_string),
                    end: 0.0,
                })
                .collect(),
            trusted,
        };
        let mut all: Vec<ObservedGroup> =
            (0..20).map(|i| group(i, "resnet", "unet", Some("nobody"), false)).collect();
        // The same pair the other way round is the same combination.
        all.push(group(20, "unet", "resnet", Some("nobody"), false));
        all.extend((21..24).map(|i| group(i, "resnet", "unet", Some("alice"), false)));
        all.extend((24..34).map(|i| group(i, "resnet", "unet", None, true)));
        all.push(group(34, "resnet", "bert", Some("nobody"), false));
        let (kept, capped) = limit_lone_users(all);
        let count = |user: Option<&str>, trusted: bool| {
            kept.iter()
                .filter(|g| g.trusted == trusted && g.members[0].user.as_deref() == user)
                .count()
        };
        assert_eq!(count(Some("nobody"), false), MAX_GROUPS_PER_LONE_USER + 1, "5 + the bert pair");
        assert_eq!(count(Some("alice"), false), 3);
        assert_eq!(count(None, true), 10);
        assert_eq!(capped, 21 - MAX_GROUPS_PER_LONE_USER);
        // Order is kept: the first of nobody's are the ones taken.
        assert_eq!(kept[0].members[0].key, "c/0/0");
    }
}
