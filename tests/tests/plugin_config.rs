//! The plugin's plugstack.conf arguments on a real slurmd: a bad one is reported at slurmd start
//! (and, the plugin being `required`, stops slurmd from starting with it).

use kace_e2e::{Cluster, HarnessError, NodeSpec};

#[test]
#[ignore = "needs root and Slurm"]
fn unknown_plugin_argument_is_reported_at_slurmd_start() {
    let test = "unknown_plugin_argument_is_reported_at_slurmd_start";
    kace_e2e::require_e2e(test);
    let started = Cluster::builder()
        .nodes(vec![NodeSpec::new("n1", 1)])
        .plugin_args("mps_root={dir}/mps colour=blue")
        .start();
    match started {
        Err(HarnessError::DaemonExited { daemon, log }) => {
            assert_eq!(daemon, "slurmd -N n1");
            let expected = "error: kace: slurmd: couldn't parse plugin arguments: \
                            unknown key \"colour\" (known keys: mps_root, progress_root, python_hook)";
            assert!(log.contains(expected), "{log}");
        }
        Err(e) => panic!("expected slurmd to refuse the plugin, got: {e}"),
        Ok(c) => panic!("slurmd started with a bad plugin argument; log:\n{}", c.slurmd_log("n1")),
    }
}
