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

use crate::decide::{active_model, model_to_new_model, training_set};
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
    pub previous: Option<Comparison>,
    /// Why it was not activated (`None`: it was).
    pub refusal: Option<Refusal>,
    /// What it saw and decided, as stored with the model.
    pub record: TrainingRecord,
    /// Why the active model could not compete, when it could not (for the log).
    pub notes: Vec<String>,
}

/// How a new model compared with the one active before it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Comparison {
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
    let active = match active_model(db) {
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
    let previous = active.as_ref().map(|a| Comparison {
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
