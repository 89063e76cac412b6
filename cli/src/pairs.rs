//! `kace pairs list|clear`: the pairs of workloads kace stops pairing because their jobs failed
//! together on a shared MPS server (kace_sql::failures), and an admin's clearance of one.

use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Result;
use clap::{Args, Subcommand};
use serde_json::json;

use crate::context::{print_json, Ctx};
use crate::output::table;

/// `kace pairs …`
#[derive(Debug, Args)]
pub struct PairsArgs {
    #[command(subcommand)]
    command: Option<PairsCommand>,
}

#[derive(Debug, Subcommand)]
enum PairsCommand {
    /// The blocked pairs (the default).
    List,
    /// Pair two workloads again: their failures so far no longer count (later ones do).
    Clear {
        /// One workload of the pair.
        a: String,
        /// The other.
        b: String,
    },
}

/// Runs `kace pairs …`.
pub fn run(args: PairsArgs, ctx: &Ctx) -> Result<()> {
    match args.command.unwrap_or(PairsCommand::List) {
        PairsCommand::List => {
            let pairs = ctx.open_read_only()?.failed_pairs()?;
            if ctx.json() {
                return print_json(&json!(pairs));
            }
            if pairs.is_empty() {
                println!("no blocked pairs: no two kace jobs failed together on a shared GPU");
                return Ok(());
            }
            let rows: Vec<Vec<String>> = pairs
                .iter()
                .map(|p| {
                    vec![
                        p.workloads.0.clone(),
                        p.workloads.1.clone(),
                        format!(
                            "{} ({}), {} ({})",
                            p.jobs[0].0, p.jobs[0].1, p.jobs[1].0, p.jobs[1].1
                        ),
                        format!("{} GPU {}", p.node, p.gpu),
                        p.user.clone().unwrap_or_else(|| "everyone".into()),
                        format!("{:.0}", p.since),
                    ]
                })
                .collect();
            print!(
                "{}",
                table(&["workload", "with", "jobs (exit)", "where", "for", "since"], &rows)
            );
            println!("`kace pairs clear A B` pairs them again");
            Ok(())
        }
        PairsCommand::Clear { a, b } => {
            kace_sql::validate_workload_name(&a)?;
            kace_sql::validate_workload_name(&b)?;
            let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
            let was = ctx.open()?.clear_failed_pair(&a, &b, now)?;
            if ctx.json() {
                return print_json(&json!({ "cleared": [a, b], "was_blocked": was }));
            }
            if was {
                println!("{a} and {b} may share a GPU again");
            } else {
                println!("{a} and {b} were not blocked; cleared anyway (failures so far no longer count)");
            }
            Ok(())
        }
    }
}
