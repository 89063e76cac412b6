//! `kace model list|show|activate`: the stored model versions.

use anyhow::Result;
use clap::{Args, Subcommand};
use serde_json::json;

use kace_selector::{Feature, Model};

use crate::context::{num, print_json, Ctx};
use crate::output::table;

/// `kace model …`
#[derive(Debug, Args)]
pub struct ModelArgs {
    #[command(subcommand)]
    command: ModelCommand,
}

#[derive(Debug, Subcommand)]
enum ModelCommand {
    /// List every version.
    List,
    /// Show one version (default: the active one) with its coefficients and metrics.
    Show {
        /// Version number.
        version: Option<i64>,
    },
    /// Make a version the one the prolog uses.
    Activate {
        /// Version number.
        version: i64,
    },
}

/// Runs `kace model …`.
pub fn run(args: ModelArgs, ctx: &Ctx) -> Result<()> {
    match args.command {
        ModelCommand::List => {
            let models = ctx.open_read_only()?.models()?;
            if ctx.json() {
                let items: Vec<_> = models
                    .iter()
                    .map(|m| {
                        json!({
                            "version": m.version,
                            "kind": m.model.kind,
                            "active": m.active,
                            "created_at": m.created_at,
                            "training_size": m.model.training_size,
                            "training_digest": m.model.training_digest,
                            "metrics": m.model.metrics,
                        })
                    })
                    .collect();
                return print_json(&json!(items));
            }
            let metric = |m: &kace_sql::ModelRecord, k: &str| {
                m.model
                    .metrics
                    .get(k)
                    .and_then(|v| v.as_f64())
                    .map(num)
                    .unwrap_or_else(|| "-".into())
            };
            let rows: Vec<Vec<String>> = models
                .iter()
                .map(|m| {
                    vec![
                        m.version.to_string(),
                        if m.active { "*".into() } else { String::new() },
                        m.model.kind.clone(),
                        m.model.training_size.to_string(),
                        metric(m, "holdout_mse"),
                        metric(m, "holdout_r2"),
                    ]
                })
                .collect();
            print!(
                "{}",
                table(
                    &["version", "active", "kind", "fit_groups", "holdout_mse", "holdout_r2"],
                    &rows
                )
            );
            Ok(())
        }
        ModelCommand::Show { version } => {
            let db = ctx.open_read_only()?;
            let m = match version {
                Some(v) => db.model(v)?,
                None => db.active_model_record()?.ok_or(kace_sql::Error::NoActiveModel)?,
            };
            if ctx.json() {
                return print_json(&serde_json::to_value(&m)?);
            }
            println!(
                "version {}{} ({})",
                m.version,
                if m.active { ", active" } else { "" },
                m.model.kind
            );
            println!(
                "training set: {} groups, digest {}",
                m.model.training_size, m.model.training_digest
            );
            println!("metrics: {}", m.model.metrics);
            let model = kace_sql::convert::model_from_record(&m)?;
            print!("{}", coefficient_tables(&model));
            Ok(())
        }
        ModelCommand::Activate { version } => {
            ctx.open()?.activate_model(version)?;
            if ctx.json() {
                print_json(&json!({ "active": version }))
            } else {
                println!("model version {version} is now active");
                Ok(())
            }
        }
    }
}

/// The model's coefficients as tables: per feature, and for the slowdown model per workload
/// (its sensitivity, pressure and ceiling: what an admin checks first when a choice surprises).
fn coefficient_tables(model: &Model) -> String {
    match model {
        Model::Linear { model: m, .. } => {
            let rows: Vec<Vec<String>> = Feature::ALL
                .iter()
                .zip(&m.coefficients)
                .map(|(f, w)| vec![f.key().to_string(), num(*w)])
                .collect();
            table(&["feature", "z-scored weight"], &rows)
        }
        Model::Slowdown(m) => {
            let n = Feature::ALL.len();
            let weight = |i: usize| m.weights.get(i).map(|w| num(*w)).unwrap_or_else(|| "-".into());
            let rows: Vec<Vec<String>> = Feature::ALL
                .iter()
                .enumerate()
                .map(|(i, f)| {
                    vec![f.key().to_string(), weight(i), weight(n + i), weight(2 * n + i)]
                })
                .collect();
            let mut out = format!("intercept (log slowdown): {}\n", num(m.intercept));
            // What a group with a never-trained workload must gain before it is formed.
            out.push_str(&format!(
                "new-workload weight (margin = weight × doubt): {}\n",
                num(m.new_workload_weight)
            ));
            out.push_str(&table(
                &["feature (ln 1+x, z-scored)", "own", "partners", "own × partners"],
                &rows,
            ));
            let rows: Vec<Vec<String>> = m
                .sensitivity
                .iter()
                .map(|(w, s)| {
                    let pressure = m.pressure.get(w).map(|p| num(*p)).unwrap_or_else(|| "-".into());
                    vec![w.clone(), num(*s), pressure, num(m.ceiling_of(Some(w)))]
                })
                .collect();
            out.push('\n');
            out.push_str(&table(&["workload", "sensitivity", "pressure", "ceiling"], &rows));
            out
        }
    }
}
