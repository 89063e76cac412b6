//! Stored rows as the selector's types: a model's body both ways (kind column, format version,
//! the one check of what is read back), the active model decoded, and a profile with its
//! missing system metrics. The decision's read path (`kace_node::read_path`) and training
//! (`crate::training`) use these.

use kace_selector::{Feature, Model, ModelKind, Profile};
use serde_json::json;

use crate::db::Db;
use crate::error::{Error, Result};
use crate::types::{ModelRecord, NewModel};

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

/// The active model, decoded: its version and the model (see [`Db::active_model_record`] for
/// the stored row).
pub fn load_active_model(db: &Db) -> Result<(i64, Model)> {
    let (version, kind, body) = db.active_model_body()?.ok_or(Error::NoActiveModel)?;
    let model = checked_model(version, &kind, || serde_json::from_str(&body))?;
    Ok((version, model))
}

/// Converts a stored profile to the selector's when its system metrics are all known: kernel
/// metrics may be missing (a workload kace observed but nobody ran Nsight Compute on), and the
/// model fills them from the workloads it trained on.
pub fn selector_profile(p: &crate::types::Profile) -> Option<Profile> {
    Profile::from_measured(p.values)
}

/// The system metrics a stored profile still lacks: what keeps it out of decisions.
pub fn missing_system_metrics(p: &crate::types::Profile) -> Vec<&'static str> {
    Feature::SYSTEM
        .iter()
        .filter(|f| p.values[f.index()].is_none())
        .map(|f| crate::types::FEATURE_COLUMNS[f.index()])
        .collect()
}

#[cfg(test)]
mod tests {
    use kace_selector::dataset::Group;
    use kace_selector::{Objective, SlowdownParams};

    use super::*;

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
