//! `kace doctor`: prints [`kace_node::doctor`]'s findings for this host, one line each with the
//! fix under it, and fails with the worst status (warnings exit 5, failures 6).

use anyhow::Result;
use clap::Args;
use kace_node::doctor::{self, Finding, Role, Setup, Status};
use serde_json::json;

use crate::context::{print_json, Ctx};

/// `kace doctor`
#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Only the compute-node checks (plugin, Prolog/Epilog, shard GRES, DB, spool, MPS, NVML).
    #[arg(long, conflicts_with = "controller")]
    node: bool,
    /// Only the controller checks (gate, JobSubmitPlugins, EpilogSlurmctld, dispatch lock, DB).
    #[arg(long)]
    controller: bool,
    /// This node's Slurm NodeName (default: the short host name).
    #[arg(long, value_name = "NAME")]
    node_name: Option<String>,
}

/// The setup is not healthy: the worst status found (the exit code says which).
#[derive(Debug)]
pub struct Unhealthy(pub Status);

impl std::fmt::Display for Unhealthy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Status::Fail => f.write_str("kace cannot work here until the failures above are fixed"),
            _ => f.write_str("kace works here, with the warnings above"),
        }
    }
}

impl std::error::Error for Unhealthy {}

/// Runs `kace doctor`.
pub fn run(args: DoctorArgs, ctx: &Ctx) -> Result<()> {
    let role = match (args.node, args.controller) {
        (true, _) => Role::Node,
        (_, true) => Role::Controller,
        _ => Role::Both,
    };
    let node_name = match args.node_name {
        Some(n) => n,
        None => short_hostname()?,
    };
    let setup = Setup { role, node_name, kace_version: env!("CARGO_PKG_VERSION").to_string() };
    // `--db` names the database to check, as for every other command.
    let mut config = ctx.config.clone();
    config.database.path = ctx.db_path.clone();
    let findings = doctor::run(&config, &setup);
    if ctx.json() {
        let rows: Vec<_> = findings
            .iter()
            .map(|f| {
                json!({"status": f.status.to_string(), "check": f.check, "detail": f.detail, "fix": f.fix})
            })
            .collect();
        print_json(&json!({ "findings": rows, "worst": doctor::worst(&findings).to_string() }))?;
    } else {
        for f in &findings {
            print_finding(f);
        }
    }
    match doctor::worst(&findings) {
        Status::Ok => Ok(()),
        worst => Err(Unhealthy(worst).into()),
    }
}

fn print_finding(f: &Finding) {
    println!("{:<5} {:<16} {}", f.status, f.check, f.detail);
    if !f.fix.is_empty() {
        println!("{:<5} {:<16} fix: {}", "", "", f.fix);
    }
}

fn short_hostname() -> Result<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map_err(|e| anyhow::anyhow!("couldn't read the host name: {e}; use --node-name"))?;
    Ok(name.trim().split('.').next().unwrap_or_default().to_string())
}
