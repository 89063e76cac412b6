//! The bridge between stored rows and the selector: model (de)serialisation, the training set
//! built from observations, and the read path of every decision (load the active model and
//! the profiles of the GPU's jobs and the candidates, then the selector's one decision).

use std::collections::HashMap;

use kace_selector::dataset::Group;
use kace_selector::decision::{GpuState, Joiner, OnGpu, Policy};
use kace_selector::{Feature, Model, ModelKind, Profile, Rejection, Selection};
use serde_json::json;

use crate::db::Db;
use crate::error::{Error, Result};
use crate::types::{ModelRecord, NewModel, ObservedGroup};

/// Version of the stored model body format; part of the `kind` column (`slowdown/1`,
/// `linear/1`) so a future change of a model's serialisation is recognised.
pub const MODEL_FORMAT: u32 = 1;

/// The `kind` column value for a model kind.
pub fn kind_column(kind: ModelKind) -> String {
    format!("{}/{MODEL_FORMAT}", kind.key())
}

/// Wraps a fitted model for storage, with its metrics and training-set digest.
pub fn model_to_new_model(
    model: &Model,
    metrics: serde_json::Value,
    training_digest: String,
    training_size: usize,
) -> Result<NewModel> {
    let body = serde_json::to_value(model)
        .map_err(|source| Error::Json { what: "model".into(), source })?;
    // The summary columns hold what an admin reads in `kace model show`; the body is what the
    // prolog loads.
    let (normalisation, coefficients) = match model {
        Model::Linear { model: m, objective } => (
            json!({"x_mean": m.x_scale.mean, "x_std": m.x_scale.std, "y_mean": m.y_mean, "y_std": m.y_std}),
            json!({"objective": objective, "intercept": m.intercept, "weights": m.coefficients}),
        ),
        Model::Slowdown(m) => (
            json!({"x_mean": m.scale.mean, "x_std": m.scale.std}),
            json!({
                "intercept": m.intercept,
                "weights": m.weights,
                "sensitivity": m.sensitivity,
                "pressure": m.pressure,
                "ceiling": m.ceiling,
            }),
        ),
    };
    Ok(NewModel {
        kind: kind_column(model.kind()),
        features: Feature::ALL.iter().map(|f| f.key().to_string()).collect(),
        normalisation,
        coefficients,
        body,
        metrics,
        training_digest,
        training_size,
    })
}

/// Reads a stored model back, refusing kinds and shapes this build does not know.
pub fn model_from_record(r: &ModelRecord) -> Result<Model> {
    checked_model(r.version, &r.model.kind, || serde_json::from_value(r.model.body.clone()))
}

/// The one check of a stored model, whichever way its body is read: a kind this build knows,
/// a body that decodes (`decode`) as a model of that kind, and a model that passes
/// [`Model::check`].
fn checked_model(
    version: i64,
    kind: &str,
    decode: impl FnOnce() -> serde_json::Result<Model>,
) -> Result<Model> {
    let bad = |reason: String| Error::BadModel { version, reason };
    let known = [ModelKind::Slowdown, ModelKind::Linear].map(kind_column);
    if !known.iter().any(|k| k == kind) {
        return Err(bad(format!("unknown kind {kind:?} (this kace reads {})", known.join(", "))));
    }
    let model = decode().map_err(|e| bad(format!("unreadable body: {e}")))?;
    if kind_column(model.kind()) != kind {
        return Err(bad(format!("body is a {} model, kind says {kind}", model.kind().key())));
    }
    model.check().map_err(bad)?;
    Ok(model)
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

/// Converts a stored profile to the selector's when its system metrics are all known: kernel
/// metrics may be missing (a workload kace observed but nobody ran Nsight Compute on), and the
/// model fills them from the workloads it trained on.
pub fn selector_profile(p: &crate::types::Profile) -> Option<Profile> {
    Profile::from_measured(p.values)
}

/// The system metrics a stored profile still lacks: what keeps it out of decisions.
fn missing_system_metrics(p: &crate::types::Profile) -> Vec<&'static str> {
    Feature::SYSTEM
        .iter()
        .filter(|f| p.values[f.index()].is_none())
        .map(|f| crate::types::FEATURE_COLUMNS[f.index()])
        .collect()
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

/// A job of a decision (running on the GPU, or a held candidate), as Slurm shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobSpec {
    /// Its workload.
    pub workload: String,
    /// Its user (`None`: unknown, matches anyone, as in `kace select --dry-run`).
    pub user: Option<String>,
}

impl JobSpec {
    /// A job of `workload` whose user is unknown.
    pub fn anyone(workload: &str) -> JobSpec {
        JobSpec { workload: workload.to_string(), user: None }
    }
}

/// Everything a decision needed and produced.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// Version of the model used.
    pub model_version: i64,
    /// Verdicts parallel to the candidates, the chosen index and the baseline.
    pub selection: Selection,
    /// The passing candidates, best first: the order in which to release them.
    pub ranked: Vec<usize>,
    /// Per candidate, the system features its profile lacks (empty when it has them all, or has
    /// no profile).
    pub incomplete: Vec<Vec<&'static str>>,
    /// Per candidate with no profile, or whose profile rests only on kace's observations of too
    /// few alone runs (`profile.min_alone_runs`): how many it has. `None` for the others.
    pub too_few_alone_runs: Vec<Option<u32>>,
    /// The policy's `min_alone_runs`, for the reason text.
    pub min_alone_runs: u32,
    /// Time spent reading the model and the profiles.
    pub db_time: std::time::Duration,
    /// Time spent filtering and predicting.
    pub predict_time: std::time::Duration,
}

impl Decision {
    /// Candidate `i`'s reason for not being chosen, in the words every caller shows
    /// (`None`: it passed).
    pub fn reason(&self, i: usize) -> Option<String> {
        let r = self.selection.verdicts.get(i)?.rejection.as_ref()?;
        let missing = self.incomplete.get(i).map(Vec::as_slice).unwrap_or_default();
        let runs = self.too_few_alone_runs.get(i).copied().flatten();
        Some(match r {
            Rejection::UnknownProfile if runs.is_some() => format!(
                "unknown profile (observed alone in {} of the {} runs needed)",
                runs.unwrap_or(0),
                self.min_alone_runs
            ),
            Rejection::UnknownProfile if !missing.is_empty() => {
                format!("incomplete profile (missing {})", missing.join(", "))
            }
            other => other.to_string(),
        })
    }
}

/// The active model, decoded.
pub fn active_model(db: &Db) -> Result<(i64, Model)> {
    let (version, kind, body) = db.active_model_body()?.ok_or(Error::NoActiveModel)?;
    let model = checked_model(version, &kind, || serde_json::from_str(&body))?;
    Ok((version, model))
}

/// The read path of every decision: the active model, the profiles of the jobs on the GPU and
/// of the candidates (one query), then [`kace_selector::decision::decide`]. The jobs on the GPU
/// must have complete profiles; candidates without one are rejected as unknown, and so are
/// candidates whose profile only kace observed, in fewer than `policy.min_alone_runs` alone runs
/// (such a workload on the GPU is an error: it is not paired yet).
pub fn decide(
    db: &Db,
    running: &[JobSpec],
    candidates: &[JobSpec],
    policy: &Policy,
    gpu_memory_gib: Option<f64>,
    gpu_model: Option<&str>,
) -> Result<Decision> {
    let started = std::time::Instant::now();
    let (model_version, model) = active_model(db)?;
    let objective = policy.rules.objective;
    if !model.serves(objective) {
        return Err(Error::BadModel {
            version: model_version,
            reason: format!(
                "a {} model trained for another objective cannot predict {}",
                model.kind().key(),
                objective.key()
            ),
        });
    }
    let mut names: Vec<&str> =
        running.iter().chain(candidates).map(|c| c.workload.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    let stored = db.profiles(&names, gpu_model)?;
    // Pairs that failed together on a shared server (two small queries; none is blocked on a
    // healthy site).
    let failed = db.failed_pairs()?;
    let failed_pairs: Vec<(&str, &str, Option<&str>)> = failed
        .iter()
        .map(|p| (p.workloads.0.as_str(), p.workloads.1.as_str(), p.user.as_deref()))
        .collect();
    let converted: HashMap<&str, Profile> =
        stored.iter().filter_map(|(w, p)| selector_profile(p).map(|sp| (w.as_str(), sp))).collect();
    for r in running {
        if let Some(p) = stored.get(&r.workload).filter(|p| !p.usable(policy.min_alone_runs)) {
            return Err(Error::TooFewAloneRuns {
                workload: r.workload.clone(),
                runs: p.observed_runs,
                needed: policy.min_alone_runs,
            });
        }
        if !converted.contains_key(r.workload.as_str()) {
            let missing = stored.get(&r.workload).map(missing_system_metrics).unwrap_or_default();
            return Err(Error::NoProfile { workload: r.workload.clone(), missing });
        }
    }
    let on_gpu: Vec<OnGpu<'_>> = running
        .iter()
        .filter_map(|r| {
            Some(OnGpu {
                profile: converted.get(r.workload.as_str())?,
                workload: &r.workload,
                user: r.user.as_deref(),
            })
        })
        .collect();
    let too_few_alone_runs: Vec<Option<u32>> = candidates
        .iter()
        .map(|c| match stored.get(&c.workload) {
            // Never seen: its alone runs will measure it.
            None => Some(0),
            Some(p) => (!p.usable(policy.min_alone_runs)).then_some(p.observed_runs),
        })
        .collect();
    let joiners: Vec<Joiner<'_>> = candidates
        .iter()
        .zip(&too_few_alone_runs)
        .map(|(c, few)| Joiner {
            profile: converted.get(c.workload.as_str()).filter(|_| few.is_none()),
            workload: &c.workload,
            user: c.user.as_deref(),
        })
        .collect();
    let incomplete = candidates
        .iter()
        .map(|c| stored.get(&c.workload).map(missing_system_metrics).unwrap_or_default())
        .collect();
    let db_time = started.elapsed();
    let gpu =
        GpuState { running: &on_gpu, memory_gib: gpu_memory_gib, failed_pairs: &failed_pairs };
    let d = kace_selector::decision::decide(&gpu, &joiners, &model, policy);
    let predict_time = started.elapsed().saturating_sub(db_time);
    Ok(Decision {
        model_version,
        selection: d.selection,
        ranked: d.ranked,
        incomplete,
        too_few_alone_runs,
        min_alone_runs: policy.min_alone_runs,
        db_time,
        predict_time,
    })
}

#[cfg(test)]
mod tests {
    use kace_selector::{Objective, SlowdownParams};

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

    fn slowdown_model() -> Model {
        let prof = |i: usize| Profile::new(std::array::from_fn(|f| 1.0 + (i * 7 + f * 3) as f64));
        let groups: Vec<Group> = (0..6)
            .flat_map(|i| (i + 1..6).map(move |j| (i, j)))
            .map(|(i, j)| Group {
                workloads: vec![format!("w{i}"), format!("w{j}")],
                profiles: vec![prof(i), prof(j)],
                throughputs: vec![
                    prof(i).exclusive_throughput() * (0.4 + 0.05 * j as f64),
                    prof(j).exclusive_throughput() * (0.8 - 0.05 * i as f64),
                ],
            })
            .collect();
        let refs: Vec<&Group> = groups.iter().collect();
        Model::train(
            ModelKind::Slowdown,
            &refs,
            Objective::ThroughputSum,
            SlowdownParams::default(),
        )
        .unwrap()
    }

    #[test]
    fn a_stored_body_reads_back_as_the_model_it_was() {
        let slowdown = slowdown_model();
        let Model::Slowdown(m) = &slowdown else { unreachable!() };
        assert!(!m.sensitivity.is_empty() && m.spread.widest() > 0.0);
        let rows: Vec<[f64; 10]> =
            (0..12).map(|i| std::array::from_fn(|j| (i * j % 5) as f64)).collect();
        let y: Vec<f64> = rows.iter().map(|r| r[6] + 2.0 * r[9]).collect();
        let linear = Model::Linear {
            objective: Objective::ThroughputSum,
            model: kace_selector::LinearModel::fit(&rows, &y).unwrap(),
        };
        for model in [slowdown, linear] {
            // As the store keeps it: through a JSON value (keys sorted), then as text.
            let text = serde_json::to_value(&model).unwrap().to_string();
            let kind = kind_column(model.kind());
            assert_eq!(checked_model(4, &kind, || serde_json::from_str(&text)).unwrap(), model);
        }
    }

    #[test]
    fn a_body_whose_tag_is_not_its_kind_column_is_refused() {
        let text = serde_json::to_string(&slowdown_model()).unwrap();
        let err = checked_model(4, &kind_column(ModelKind::Linear), || serde_json::from_str(&text));
        assert!(
            matches!(&err, Err(Error::BadModel { version: 4, reason }) if reason.contains("kind says")),
            "{err:?}"
        );
        // A body without its tag, or with one this build does not know, is unreadable.
        let untagged = text.replacen("\"kind\":\"slowdown\",", "", 1);
        assert_ne!(untagged, text);
        let retagged = text.replacen("\"kind\":\"slowdown\"", "\"kind\":\"quadratic\"", 1);
        for body in [untagged, retagged] {
            let err = checked_model(4, "slowdown/1", || serde_json::from_str(&body));
            assert!(
                matches!(&err, Err(Error::BadModel { reason, .. }) if reason.contains("unreadable")),
                "{err:?}"
            );
        }
    }
}
