//! `kace eval` end to end through the built binary: JSON keys and values, tables, plots, and
//! clear errors for bad input. Tests needing the artifact skip with a message when it is absent.

use std::process::{Command, Output};

use kace_test_support::{artifact, TempDir};

fn kace(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kace")).args(args).output().expect("kace runs")
}

#[test]
#[ignore = "needs ../shared/data/kace-artifact"]
fn paper_json_has_the_documented_keys_and_the_papers_numbers() {
    let dir = artifact();
    let out = kace(&[
        "eval",
        "paper",
        "--data",
        dir.to_str().unwrap(),
        "--n-occur",
        "3",
        "--format",
        "json",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    assert_eq!(v["n_occur"], 3);
    assert_eq!(v["seeds"], serde_json::json!([10, 20, 30, 40, 50]));
    let nt = &v["normalized_throughput"];
    for (k, want) in [
        ("kace-lr", 0.9063),
        ("best-rule", 0.8374),
        ("memcap", 0.7850),
        ("mem%", 0.7182),
        ("random", 0.5431),
        ("sm%", 0.3543),
        ("oracle", 1.0),
    ] {
        let got = nt[k].as_f64().unwrap_or_else(|| panic!("key {k} present"));
        assert!((got - want).abs() < 0.0005, "{k}: {got} vs {want}");
    }
    assert!((v["mse"].as_f64().unwrap() - 0.1442).abs() < 0.0005);
    assert!((v["r2"].as_f64().unwrap() - 0.8547).abs() < 0.0005);
}

#[test]
#[ignore = "needs ../shared/data/kace-artifact"]
fn unseen_table_and_plots() {
    let dir = artifact();
    let d = TempDir::new("eval-cli-plots");
    let fig4 = d.join("fig4.svg");
    let out = kace(&[
        "eval",
        "paper",
        "--data",
        dir.to_str().unwrap(),
        "--unseen",
        "--plot",
        fig4.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.lines().any(|l| l.starts_with("kace-lr") && l.contains("0.888")), "{text}");
    assert!(std::fs::read_to_string(&fig4).unwrap().contains("kace-lr"));

    let fig5 = d.join("fig5.svg");
    let out = kace(&[
        "eval",
        "paper",
        "--data",
        dir.to_str().unwrap(),
        "--n-occur",
        "3",
        "--per-workload",
        "--plot",
        fig5.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    let svg = std::fs::read_to_string(&fig5).unwrap();
    assert!(svg.contains("whisper-large-v2_batch8-inf"));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("albert-base-v2_batch2-train"));
}

#[test]
#[ignore = "needs ../shared/data/kace-artifact"]
fn colocations_runs_on_three_way_data() {
    let dir = artifact();
    let f = dir.join("multiinstance/total_labels_batch2-8_targetMPS100.csv");
    let out = kace(&[
        "eval",
        "colocations",
        "--data",
        f.to_str().unwrap(),
        "--n-occur",
        "3",
        "--seeds",
        "20,10,1-3,2",
        "--format",
        "json",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // Ranges expand; seeds come back ascending, each once.
    assert_eq!(v["seeds"], serde_json::json!([1, 2, 3, 10, 20]));
    let nt = &v["normalized_throughput"];
    assert!(nt["kace-lr"].as_f64().unwrap() > nt["best-rule"].as_f64().unwrap());
    // The seed-by-seed comparison of kace with the paper's model, in both protocols.
    for p in ["paper", "production"] {
        let d = &v["by_protocol"][p]["paired"]["kace-minus-kace-lr"];
        assert_eq!(d["seeds"], 5, "{p}: {d}");
        let counts = ["better", "worse", "equal"].map(|k| d[k].as_u64().unwrap());
        assert_eq!(counts.iter().sum::<u64>(), 5);
        assert!(d["standard_error"].as_f64().unwrap() >= 0.0);
    }
    for bad in ["--seeds=5-1", "--seeds=1-x", "--seeds=-3"] {
        let out = kace(&["eval", "colocations", "--data", f.to_str().unwrap(), bad]);
        assert_eq!(out.status.code(), Some(2), "--seeds {bad}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("--seeds"));
    }
}

#[test]
fn train_on_one_file_test_on_another() {
    let d = TempDir::new("eval-cli-split");
    // Two tiny synthetic 2-way tables: workload "new" appears only in the test file.
    let header = {
        let mut c = Vec::new();
        for i in 1..=2 {
            c.push(format!("workload{i}"));
            for f in kace_selector::Feature::ALL {
                c.push(format!("w{i}{}", f.artifact_name()));
            }
            c.push(format!("w{i}throughput"));
        }
        c.join(",")
    };
    let row = |a: &str, b: &str, fa: f64, fb: f64, t: f64| {
        let mut c = vec![a.to_string()];
        c.extend((0..10).map(|j| format!("{}", fa + j as f64)));
        c.push(format!("{t}"));
        c.push(b.to_string());
        c.extend((0..10).map(|j| format!("{}", fb + j as f64 * 0.5)));
        c.push(format!("{}", t / 2.0));
        c.join(",")
    };
    let train = d.join("train.csv");
    let test = d.join("test.csv");
    let mut tr = vec![header.clone()];
    for i in 0..12 {
        let x = i as f64;
        tr.push(row(&format!("a{}", i % 4), &format!("b{}", i % 3), x, 2.0 * x, 10.0 + 3.0 * x));
    }
    std::fs::write(&train, tr.join("\n")).unwrap();
    let te = [
        header,
        row("new", "a1", 1.0, 2.0, 5.0),
        row("new", "b2", 9.0, 1.0, 40.0),
        row("a1", "b2", 3.0, 3.0, 20.0),
    ];
    std::fs::write(&test, te.join("\n")).unwrap();
    let out = kace(&[
        "eval",
        "colocations",
        "--data",
        train.to_str().unwrap(),
        "--test",
        test.to_str().unwrap(),
        "--format",
        "json",
        "--per-workload",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // Only the unseen workload is a target.
    assert_eq!(v["rows"], 1);
    assert!(v["per_workload"]["new"].is_object());
}

#[test]
fn malformed_data_is_a_clear_error() {
    let d = TempDir::new("eval-cli-bad");
    let bad = d.join("bad.csv");
    std::fs::write(&bad, "workload1,workload2\nx,y\n").unwrap();
    let out = kace(&["eval", "colocations", "--data", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.csv, line 1, column 'w1_Threads': missing column"), "{err}");
    assert!(!err.contains("panicked"));

    let out = kace(&["eval", "colocations", "--data", d.join("absent.csv").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("couldn't open"));

    let out = kace(&["eval", "paper", "--data", d.to_str().unwrap(), "--n-occur", "3"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("couldn't open") && err.contains("pairs"), "{err}");
    let out = kace(&["eval", "paper", "--data", d.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "--n-occur is required without --unseen");

    let out = kace(&["eval", "paper", "--data", "x", "--seeds", "ten"]);
    assert_eq!(out.status.code(), Some(2), "clap rejects bad option values");
}

#[test]
#[ignore = "needs ../shared/data/kace-artifact"]
fn nested_json_has_the_decision_quality_keys() {
    let dir = artifact();
    let json = |extra: &[&str]| -> serde_json::Value {
        let mut args = vec!["eval", "paper", "--data", dir.to_str().unwrap(), "--nested"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--format", "json"]);
        let out = kace(&args);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("valid JSON")
    };
    let v = json(&["--n-occur", "3", "--seeds", "1-4"]);
    assert_eq!(v["protocol"], "production", "--nested puts kace's own protocol first");
    assert_eq!(v["seeds"], serde_json::json!([1, 2, 3, 4]));
    let kace = v["normalized_throughput"]["kace"].as_f64().unwrap();
    let s = &v["seed_spread"]["kace"];
    let [min, median, max, mean] =
        ["min", "median", "max", "mean"].map(|k| s[k].as_f64().unwrap_or_else(|| panic!("{k}")));
    assert!(min <= median && median <= max && (mean - kace).abs() < 1e-12, "{s}");
    for k in ["kace", "kace-gated", "oracle"] {
        let h = v["harmful_share"][k].as_f64().unwrap_or_else(|| panic!("harmful_share.{k}"));
        assert!((0.0..=1.0).contains(&h), "{k}: {h}");
    }
    assert!(v["mape_seen"].as_f64().unwrap() > 0.0);
    assert!(v["by_protocol"]["paper"]["mape_seen"].is_number());
    assert!(v["oracle_gain_share"]["kace-gated"].is_number());
    assert_eq!(
        v["chosen_settings"].as_object().unwrap().values().filter_map(|n| n.as_u64()).sum::<u64>(),
        4
    );

    // Unseen workloads, leave-one-workload-out: the figures README.md states.
    let u = json(&["--unseen"]);
    assert!((u["normalized_throughput"]["kace"].as_f64().unwrap() - 0.9621).abs() < 5e-5, "{u}");
    assert!((u["mape_unseen"].as_f64().unwrap() - 50.0).abs() < 0.05, "{u}");
    // The same with only the held-out workload's system profile: what the missing Nsight
    // Compute profile costs (docs/models.md).
    let s = json(&["--unseen", "--system-only"]);
    assert!((s["normalized_throughput"]["kace"].as_f64().unwrap() - 0.9482).abs() < 5e-5, "{s}");
    assert!(s["normalized_throughput"].get("kace-lr").is_none(), "the paper's model needs ncu");
    assert!((s["mape_unseen"].as_f64().unwrap() - 47.5).abs() < 0.05, "{s}");
}

/// A small artifact-shaped folder whose best split is learnable: ten workloads, every ordered
/// pair measured at the nine splits and at 100/100; the first member's best share is its SM
/// utilisation's share of the pair's.
fn synthetic_sweeps(d: &TempDir) -> std::path::PathBuf {
    let root = d.join("artifact");
    std::fs::create_dir_all(root.join("raw_mps_sweeps")).unwrap();
    std::fs::create_dir_all(root.join("workload_profiles")).unwrap();
    let ws: Vec<(String, f64, f64)> =
        (0..10).map(|i| (format!("w{i}"), 5.0 + 2.0 * i as f64, 10.0 + 9.0 * i as f64)).collect();
    let mut labels = String::from("Type,Exclusive100,sm%,mem%,memcap,Exclusive50\n");
    let mut alone = String::from("workload,10,20,30,40,50,60,70,80,90,100\n");
    for (n, excl, sm) in &ws {
        labels.push_str(&format!(
            "{n},{excl},{sm},{},{},{}\n",
            sm / 3.0,
            1.0 + sm / 20.0,
            excl / 2.0
        ));
        let cells: Vec<String> = (1..=10).map(|p| format!("{}", excl * p as f64 / 10.0)).collect();
        alone.push_str(&format!("{n},{}\n", cells.join(",")));
    }
    let mut sweeps = String::from("workload1,workload2");
    for p in 1..=9 {
        sweeps.push_str(&format!(",\"(LS{}, BE{})\"", 10 * p, 100 - 10 * p));
    }
    sweeps.push_str(",\"(LS100, BE100)\"\n");
    for a in &ws {
        for b in &ws {
            if a.0 == b.0 {
                continue;
            }
            let share = a.2 / (a.2 + b.2);
            sweeps.push_str(&format!("{},{}", a.0, b.0));
            for p in 1..=10 {
                let n = if p == 10 {
                    1.17
                } else {
                    let d = p as f64 / 10.0 - share;
                    1.3 - 1.5 * d * d
                };
                sweeps.push_str(&format!(",\"({}, {})\"", a.1 * n / 2.0, b.1 * n / 2.0));
            }
            sweeps.push('\n');
        }
    }
    std::fs::write(root.join("workload_profiles/baseline_labels.csv"), labels).unwrap();
    std::fs::write(root.join("raw_mps_sweeps/baseline_steps_stage2.csv"), alone).unwrap();
    std::fs::write(root.join("raw_mps_sweeps/sweeps.csv"), sweeps).unwrap();
    root
}

#[test]
fn splits_json_has_the_issues_keys_and_a_table_says_whether_goals_are_met() {
    let d = TempDir::new("eval-cli-splits");
    let root = synthetic_sweeps(&d);
    let data = root.to_str().unwrap();
    let args = [
        "eval",
        "splits",
        "--data",
        data,
        "--sweeps",
        "raw_mps_sweeps/sweeps.csv",
        "--seeds",
        "1-3",
    ];
    let out = kace(&[&args[..], &["--format", "json"]].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    for k in ["chosen_vs_best", "chosen_vs_default", "worst_vs_default"] {
        let x = v[k].as_f64().unwrap_or_else(|| panic!("key {k}"));
        assert!(x.is_finite() && x > 0.0, "{k}: {x}");
        assert!(v["leave_one_workload_out"][k].is_number(), "{k} under leave-one-workload-out");
        assert!(v["policies"]["kace-split"]["spread"][k]["median"].is_number(), "{k} spread");
    }
    assert_eq!(v["seeds"], serde_json::json!([1, 2, 3]));
    assert!(v["protocol"].as_str().unwrap().starts_with("nested"));
    assert_eq!(v["data"]["examples"], 90);
    assert_eq!(v["data"]["with_alone_features"], 90);
    // Learnable: close to the best split, never below 100/100.
    assert!(v["chosen_vs_best"].as_f64().unwrap() > 0.98, "{v}");
    assert!(v["worst_vs_default"].as_f64().unwrap() >= 0.99, "{v}");
    assert_eq!(v["goals"]["worst_vs_default_met"], true);
    assert!(v["product"].as_str().unwrap().starts_with("off"));

    let out = kace(&[&args[..], &["--system-only"]].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.lines().any(|l| l.starts_with("kace-split")), "{text}");
    assert!(text.contains("goals: chosen/best ≥ 0.98"), "{text}");
    assert!(text.contains("Off in the product"), "{text}");

    let bad = kace(&["eval", "splits", "--data", data, "--sweeps", "missing.csv"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("missing.csv"));
}

#[test]
#[ignore = "needs ../shared/data/kace-artifact"]
fn splits_json_on_the_artifact() {
    let dir = artifact();
    let out = kace(&["eval", "splits", "--data", dir.to_str().unwrap(), "--format", "json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    assert_eq!(v["seeds"], serde_json::json!((1..=10).collect::<Vec<u32>>()));
    for (k, want) in
        [("chosen_vs_best", 0.9705), ("chosen_vs_default", 1.0317), ("worst_vs_default", 0.9612)]
    {
        let got = v[k].as_f64().unwrap_or_else(|| panic!("key {k}"));
        assert!((got - want).abs() < 0.0005, "{k}: {got} vs {want}");
    }
    assert_eq!(v["goals"]["chosen_vs_best_met"], false);
    assert_eq!(v["goals"]["worst_vs_default_met"], false);
    assert_eq!(v["losses"].as_array().map(Vec::len), Some(2));
    let lowo = v["leave_one_workload_out"]["chosen_vs_best"].as_f64().unwrap();
    assert!((lowo - 0.9635).abs() < 0.0005, "{lowo}");
}
