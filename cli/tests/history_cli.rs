//! `kace eval history` end to end through the built binary: the documented JSON keys, one value
//! per day, the spread over seeds, the table, and clear errors; and the simulated store's cap
//! kept equal to the real store's.

use std::process::{Command, Output};

use kace_test_support::artifact;

fn kace(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kace")).args(args).output().expect("kace runs")
}

#[test]
fn the_simulated_cap_is_the_stores() {
    assert_eq!(
        kace_simulator::history::MAX_GROUPS_PER_LONE_USER,
        kace_sql::MAX_GROUPS_PER_LONE_USER
    );
}

#[test]
fn a_missing_artifact_is_a_clear_error() {
    let out = kace(&["eval", "history", "--data", "/nonexistent-kace-artifact", "--days", "1"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("couldn't open") && err.contains("MPS100_kernel_labels"), "{err}");
}

#[test]
#[ignore = "needs ../shared/data/kace-artifact"]
fn history_json_has_the_documented_keys_per_day_for_both_trainings() {
    let dir = artifact();
    let args =
        ["eval", "history", "--data", dir.to_str().unwrap(), "--days", "3", "--seeds", "1-2"];
    let out = kace(&[&args[..], &["--format", "json"]].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    assert_eq!(v["seeds"], serde_json::json!([1, 2]));
    assert_eq!(v["training"], "repeats");
    for arm in [&v, &v["independent"]] {
        let days = arm["days"].as_array().expect("days[]");
        assert_eq!(days.len(), 3);
        for (i, d) in days.iter().enumerate() {
            assert_eq!(d["day"], i + 1);
            let ratio = d["oracle_ratio"].as_f64().expect("oracle_ratio");
            assert!(ratio > 0.5 && ratio <= 1.0 + 1e-9, "{ratio}");
            let all = d["mape_all"].as_f64().expect("mape_all");
            assert!(all > 0.0 && all < 1.0, "{all}");
            let harm = d["harmful_share"].as_f64().expect("harmful_share");
            assert!((0.0..=1.0).contains(&harm));
            assert!(d.get("mape_repeated").is_some(), "key present (null before any repeat)");
            let s = &d["spread"]["oracle_ratio"];
            let (lo, hi) = (s["min"].as_f64().unwrap(), s["max"].as_f64().unwrap());
            assert!(lo <= ratio + 1e-12 && ratio <= hi + 1e-12, "{lo} {ratio} {hi}");
        }
        // Day 1 has seen nothing twice; by day 3 something has been.
        assert!(days[0]["mape_repeated"].is_null());
        assert!(days[2]["repeated_groups"].as_f64().unwrap() > 0.0);
    }
    // Both trainings decide day 1 with the same import, on the same trace.
    assert_eq!(v["days"][0]["decisions"], v["independent"]["days"][0]["decisions"]);
    assert_eq!(v["goals"]["goals"].as_array().map(Vec::len), Some(4));
    // The table names both trainings and the goals.
    let out = kace(&args);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for want in ["kace retrain (repeats merged", "independent observations", "goals on day 3"] {
        assert!(text.contains(want), "{want}: {text}");
    }
}
