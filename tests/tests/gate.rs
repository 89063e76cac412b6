//! The gate (`packaging/job_submit.lua`) on a real Slurm cluster against submissions a user's own
//! client can make: a SPANK environment entry that imitates kace's (the audit's user-plugstack
//! reproduction: a user's own SPANK plugin sets `SPANK_KACE_COLOCATE`, which slurmd would pass to
//! the root prolog unchanged), and workload names, where the Lua rule must agree with the Rust
//! one (`kace_layout::workload_name`) that the plugin, the database and the node programs use.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;

use kace_e2e::Cluster;

fn cluster(test: &str) -> Arc<Cluster> {
    kace_e2e::shared(test, Cluster::builder)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The attacker's SPANK plugin (the audit's `evil.c`): in sbatch it adds `$EVIL_ENTRY` (name)
/// = `$EVIL_VALUE` to the job's SPANK environment, as any user may with their own plugstack.
const EVIL_C: &str = r#"
#include <slurm/spank.h>
#include <stdlib.h>
SPANK_PLUGIN(evil, 1);
int slurm_spank_init_post_opt(spank_t sp, int ac, char **av) {
  spank_context_t c = spank_context();
  const char *name = getenv("EVIL_ENTRY");
  const char *value = getenv("EVIL_VALUE");
  if ((c == S_CTX_ALLOCATOR || c == S_CTX_LOCAL) && name)
    spank_job_control_setenv(sp, name, value ? value : "resnet50-train", 1);
  return 0;
}
"#;

/// The attacker's client configuration: the site's slurm.conf with their own plugstack, which
/// loads only `evil.so`. Returns that slurm.conf.
fn attacker_conf(c: &Cluster) -> PathBuf {
    let dir = c.dir().join("attacker");
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("evil.c");
    let so = dir.join("evil.so");
    std::fs::write(&src, EVIL_C).unwrap();
    // Against the headers of the Slurm under test: sbatch loads a plugin of its own series only.
    let out = Command::new("gcc")
        .arg(format!("-I{}", c.slurm().include_dir().display()))
        .args(["-shared", "-fPIC", "-o"])
        .arg(&so)
        .arg(&src)
        .output()
        .expect("gcc runs");
    assert!(out.status.success(), "couldn't build evil.so: {}", stderr(&out));
    std::fs::write(dir.join("plugstack.conf"), format!("optional {}\n", so.display())).unwrap();
    let site = std::fs::read_to_string(c.conf()).unwrap();
    let mine: String = site
        .lines()
        .filter(|l| !l.starts_with("PlugStackConfig="))
        .map(|l| format!("{l}\n"))
        .chain([format!("PlugStackConfig={}\n", dir.join("plugstack.conf").display())])
        .collect();
    let conf = dir.join("slurm.conf");
    std::fs::write(&conf, mine).unwrap();
    conf
}

fn sbatch_with(c: &Cluster, conf: &Path, entry: &str, args: &[&str]) -> Output {
    let mut cmd = c.command("sbatch");
    // --begin keeps the jobs from running (the gate refuses --hold on a kace job).
    cmd.env("SLURM_CONF", conf).env("EVIL_ENTRY", entry).args(["--parsable", "--begin=now+1hour"]);
    cmd.args(args).args(["--gres=shard:1", "--wrap", "sleep 1"]);
    cmd.output().expect("sbatch runs")
}

#[test]
#[ignore = "needs root and Slurm"]
fn a_spank_entry_imitating_kaces_is_refused() {
    let c = cluster("a_spank_entry_imitating_kaces_is_refused");
    let conf = attacker_conf(&c);
    // Control: the attacker's plugin really reaches the gate, with a harmless entry.
    let out = sbatch_with(&c, &conf, "HARMLESS", &[]);
    assert!(out.status.success(), "a harmless entry was refused: {}", stderr(&out));
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    c.run_ok("scancel", &[&id]).unwrap();

    for entry in ["SPANK_KACE_COLOCATE", "SPANK_SPANK_KACE_COLOCATE", "KACE_OTHER", "spank_kace_x"]
    {
        let out = sbatch_with(&c, &conf, entry, &[]);
        let err = stderr(&out);
        assert!(
            !out.status.success(),
            "{entry} was accepted: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        assert!(
            err.contains(&format!("kace: couldn't accept SPANK environment entry \"{entry}\"")),
            "{entry}: {err}"
        );
    }
    // The attacker's plugin sending KACE_COLOCATE itself is just a kace request: the gate holds
    // and marks it exactly as if kace's plugin had sent it, so nothing is gained.
    let out = sbatch_with(&c, &conf, "KACE_COLOCATE", &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let id: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    let job = c.job(id).unwrap();
    assert_eq!(job.get("AdminComment").map(String::as_str), Some("kace:resnet50-train"));
    c.run_ok("scancel", &[&id.to_string()]).unwrap();
    assert!(c.slurmctld_running(), "slurmctld died:\n{}", c.slurmctld_log());
}

#[test]
#[ignore = "needs root and Slurm"]
fn the_lua_and_rust_workload_rules_agree() {
    let c = cluster("the_lua_and_rust_workload_rules_agree");
    let long_ok = "a".repeat(128);
    let long_bad = "a".repeat(129);
    let mut names: Vec<&str> = kace_layout::workload_name::HOSTILE_SAMPLES.to_vec();
    names.extend([long_ok.as_str(), long_bad.as_str()]);
    for name in names {
        // The bare form: only the gate checks the job name.
        let job_name = format!("--job-name={name}");
        let out = c
            .run(
                "sbatch",
                &["--parsable", "--kace-colocate", &job_name, "--gres=shard:1", "--wrap", "true"],
            )
            .unwrap();
        let rust = kace_layout::workload_name::check(name.as_bytes()).is_ok();
        assert_eq!(
            out.status.success(),
            rust,
            "{name:?}: gate and Rust disagree: {}",
            stderr(&out)
        );
        if rust {
            let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
            c.run_ok("scancel", &[&id]).unwrap();
        } else {
            assert!(stderr(&out).contains(kace_layout::workload_name::RULE), "{}", stderr(&out));
        }
    }
}
