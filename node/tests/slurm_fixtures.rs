//! kace's Slurm readers on output captured from each supported Slurm release on the clusters the
//! e2e suite starts (`node/tests/fixtures/<version>/`, written by the e2e test `slurm_output`
//! with `KACE_FIXTURES_OUT=$PWD/node/tests/fixtures` from the repository root: cargo runs it in `tests/`): 22.05 (Debian 12), 25.11 and 26.05.

#[path = "fixtures/check.rs"]
mod check;

use std::path::{Path, PathBuf};

fn fixture(version: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(version)
}

#[test]
fn slurm_22_05() {
    check::check(&fixture("22.05.8"));
}

#[test]
fn slurm_25_11() {
    check::check(&fixture("25.11.7"));
}

#[test]
fn slurm_26_05() {
    check::check(&fixture("26.05.3"));
}

/// The 26.05 text `scontrol -o show job` prints for the partner, whose comment, name and
/// command line forge fields: read word by word with the last `Key=` winning (as kace did), the
/// forged node wins; the JSON record has the real one. This is why kace reads JSON.
#[test]
fn scontrol_text_is_forgeable_json_is_not() {
    let dir = fixture("26.05.3");
    let text = std::fs::read_to_string(dir.join("scontrol-partner.txt")).unwrap();
    let last = |key: &str| {
        text.split_whitespace().filter_map(|w| w.strip_prefix(key)).next_back().unwrap().to_string()
    };
    assert_eq!(last("NodeList="), "n9");
    assert_eq!(last("GRES="), "shard:g0:1(IDX:0)");
    let partner = check::roles(&dir)["partner"];
    let json = std::fs::read_to_string(dir.join("job-partner.json")).unwrap();
    let (jobs, _) = kace_node::slurm_json::jobs(&json).unwrap();
    let p = jobs.iter().find(|j| j.id == partner).unwrap();
    assert_eq!(p.nodes, "n1");
    assert_eq!(p.gres[0].indices, vec![1]);
}
