//! `kace simulate` end to end through the built binary: the table, the JSON document, the plot,
//! a replayed trace, and clear errors for bad input. Skips with a message when the artifact is
//! absent.

use std::process::{Command, Output};

use kace_test_support::{artifact, TempDir};

fn kace(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kace")).args(args).output().expect("kace runs")
}

const SMALL: [&str; 8] =
    ["--nodes", "4", "--gpus-per-node", "2", "--jobs", "300", "--seeds", "1,2"];

#[test]
#[ignore = "needs ../shared/data/kace-artifact"]
fn json_reports_every_policy_with_spread_and_ratios() {
    let dir = artifact();
    let mut args = vec!["simulate", "--data", dir.to_str().unwrap(), "--format", "json"];
    args.extend(SMALL);
    let out = kace(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    assert_eq!(v["gpus"], 8);
    assert_eq!(v["jobs"], 300);
    assert_eq!(v["pairs"]["measured"], 181);
    for p in ["exclusive", "queue-order", "memcap", "kace", "oracle"] {
        let p = &v["policies"][p];
        assert_eq!(p["runs"].as_array().map(Vec::len), Some(2));
        for k in ["makespan_s", "mean_jct_s", "p95_jct_s", "mean_wait_s", "steps_per_s", "ooms"] {
            assert!(p["mean"][k].is_number() && p["std"][k].is_number(), "{k}");
        }
        assert!(p["vs_exclusive"]["throughput"]["mean"].is_number());
    }
    let base = &v["policies"]["exclusive"]["vs_exclusive"]["throughput"];
    assert_eq!((base["mean"].as_f64(), base["std"].as_f64()), (Some(1.0), Some(0.0)));
    assert!(v["kace_vs_oracle"]["mean"].as_f64().unwrap() > 0.0);
    // The default traces have users (a Zipf mix), and kace also ran under mps.multi_user.
    // 30 users, of whom the lightest may submit none of 300 jobs.
    assert!((25..=30).contains(&v["users"].as_u64().unwrap()), "{}", v["users"]);
    assert_eq!(v["multi_user"], false);
    let rule = &v["same_user_rule"];
    for k in
        ["kace_with_rule_vs_exclusive", "kace_multi_user_vs_exclusive", "with_rule_vs_multi_user"]
    {
        assert!(rule[k]["mean"].as_f64().unwrap() > 0.0, "{k}: {rule}");
    }
    // The rule only ever keeps pairs from forming.
    let shared = |k: &str| rule[k]["mean"].as_f64().unwrap();
    assert!(shared("shared_percent_with_rule") <= shared("shared_percent_multi_user"), "{rule}");
    assert_eq!(
        rule["kace_with_rule_vs_exclusive"],
        v["policies"]["kace"]["vs_exclusive"]["throughput"]
    );
    // One user: the rule costs nothing.
    let mut one = args.clone();
    one.extend(["--users", "1", "--policies", "kace"]);
    let v: serde_json::Value = serde_json::from_slice(&kace(&one).stdout).unwrap();
    let r = &v["same_user_rule"]["with_rule_vs_multi_user"];
    assert_eq!((r["mean"].as_f64(), r["std"].as_f64()), (Some(1.0), Some(0.0)), "{v}");
}

#[test]
#[ignore = "needs ../shared/data/kace-artifact"]
fn table_plot_and_a_replayed_trace() {
    let dir = artifact();
    let d = TempDir::new("simulate-cli-plot");
    let svg = d.join("sim.svg");
    let trace = d.join("trace.csv");
    std::fs::write(
        &trace,
        "submit_s,workload,steps\n0,bert-base-cased_batch8-inf,9000\n\
         0,wav2vec2-base-960h_batch2-inf,3000\n10,vit_h_14_batch2-train,500\n",
    )
    .unwrap();
    let out = kace(&[
        "simulate",
        "--data",
        dir.to_str().unwrap(),
        "--trace",
        trace.to_str().unwrap(),
        "--nodes",
        "1",
        "--gpus-per-node",
        "1",
        "--seeds",
        "1",
        "--policies",
        "kace,oracle",
        "--plot",
        svg.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("3 jobs per run, replayed trace"), "{text}");
    for p in ["exclusive", "kace", "oracle"] {
        assert!(text.lines().any(|l| l.starts_with(p)), "{p} row in {text}");
    }
    assert!(!text.lines().any(|l| l.starts_with("memcap")), "only the policies asked for");
    let svg = std::fs::read_to_string(svg).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("job completion time CDF"));
    assert_eq!(svg.matches("<polyline").count(), 6, "a CDF and a timeline per policy");
}

#[test]
#[ignore = "needs ../shared/data/kace-artifact"]
fn a_written_trace_replays_to_the_same_results() {
    let dir = artifact();
    let d = TempDir::new("simulate-cli-replay");
    let trace = d.join("t.csv");
    let data = dir.to_str().unwrap();
    let mut args = vec!["simulate", "--data", data, "--format", "json", "--seeds", "7"];
    args.extend(&SMALL[..6]);
    let mut first = args.clone();
    first.extend(["--write-trace", trace.to_str().unwrap()]);
    let a = kace(&first);
    assert!(a.status.success(), "{}", String::from_utf8_lossy(&a.stderr));
    let mut again = args.clone();
    again.extend(["--trace", trace.to_str().unwrap()]);
    let b = kace(&again);
    assert!(b.status.success(), "{}", String::from_utf8_lossy(&b.stderr));
    let (a, b): (serde_json::Value, serde_json::Value) =
        (serde_json::from_slice(&a.stdout).unwrap(), serde_json::from_slice(&b.stdout).unwrap());
    // The users travel in the trace: the same-user rule gives the same results on replay.
    assert_eq!(b["users"], a["users"]);
    assert_eq!(b["same_user_rule"], a["same_user_rule"]);
    for p in ["exclusive", "queue-order", "kace", "oracle"] {
        let (x, y) = (&a["policies"][p]["mean"], &b["policies"][p]["mean"]);
        for k in ["makespan_s", "mean_jct_s", "ooms"] {
            let (x, y) = (x[k].as_f64().unwrap(), y[k].as_f64().unwrap());
            assert!((x - y).abs() <= 1e-6 * x.abs().max(1.0), "{p} {k}: {x} vs {y}");
        }
    }
}

#[test]
#[ignore = "needs ../shared/data/kace-artifact"]
fn bad_input_is_a_clear_error() {
    let dir = artifact();
    let d = TempDir::new("simulate-cli-bad");
    let trace = d.join("bad.csv");
    std::fs::write(&trace, "submit_s,workload,steps\n0,bert-base-cased_batch8-inf,10\n1,gpt5,3\n")
        .unwrap();
    let data = dir.to_str().unwrap();
    let cases: [(Vec<&str>, &str); 4] = [
        (
            vec!["--trace", trace.to_str().unwrap()],
            "line 3, column 'workload': unknown workload 'gpt5'",
        ),
        (vec!["--nodes", "0"], "zero GPUs"),
        (vec!["--policies", "fastest"], "unknown policy 'fastest'"),
        (vec!["--window", "0"], "candidate window"),
    ];
    for (extra, needle) in cases {
        let mut args = vec!["simulate", "--data", data];
        args.extend(extra);
        let out = kace(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    let out = kace(&["simulate", "--data", "/nonexistent/kace"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("couldn't open /nonexistent/kace"), "{err}");
}

#[test]
#[ignore = "needs ../shared/data/kace-artifact"]
fn a_new_workloads_cost_is_in_the_json() {
    let dir = artifact();
    let data = dir.to_str().unwrap();
    let w = "whisper-large-v2_batch16-inf";
    let mut args = vec!["simulate", "--data", data, "--format", "json", "--policies", "kace"];
    args.extend(SMALL);
    args.extend(["--new-workload", w, "--first-jobs", "3"]);
    let out = kace(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    let n = &v["new_workload"][0];
    assert_eq!((n["workload"].as_str(), n["first_jobs"].as_u64()), (Some(w), Some(3)));
    for side in ["known", "new"] {
        for k in ["partners", "harmful_partners", "first_jobs_mean_jct_s", "sustained_work_per_s"] {
            assert!(n[side][k]["mean"].as_f64().is_some_and(|x| x >= 0.0), "{side}.{k}: {n}");
        }
    }
    // This workload runs at about 0.15 of its exclusive speed beside anyone: every pair with it
    // is harmful. Known, the model has learnt that and the gain rule gives it no partner; new,
    // it can only guess, and whatever it accepts is counted as harmful.
    let mean = |side: &str, k: &str| n[side][k]["mean"].as_f64().unwrap();
    assert_eq!((mean("known", "partners"), mean("known", "harmful_partners")), (0.0, 0.0), "{n}");
    assert_eq!(mean("new", "harmful_partners"), mean("new", "partners"), "{n}");
    assert!(n["new_over_known"]["sustained_work_per_s"]["mean"].as_f64().unwrap() > 0.0);
    assert_eq!(v["new_workload_summary"]["comparisons"].as_u64(), n["seeds"].as_u64());

    for (extra, needle) in [
        (["--new-workload", "gpt5"], "--new-workload gpt5: no such workload"),
        (["--first-jobs", "0"], "--first-jobs must be at least 1"),
    ] {
        let mut args = vec!["simulate", "--data", data];
        args.extend(extra);
        let out = kace(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains(needle), "{err}");
    }
}

#[test]
#[ignore = "needs ../shared/data/kace-artifact"]
fn kace_is_retrained_every_night_unless_never() {
    let dir = artifact();
    let data = dir.to_str().unwrap();
    // 8 GPUs, 1 000 jobs at load 2: arrivals over 31 h and a queue until about two days in.
    let base = ["simulate", "--data", data, "--format", "json", "--nodes", "4"];
    let long = ["--gpus-per-node", "2", "--jobs", "1000", "--seeds", "1,2"];
    let run = |extra: &[&str]| -> serde_json::Value {
        let out = kace(&[&base[..], &long[..], extra].concat());
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("valid JSON")
    };
    let nightly = run(&[]);
    assert_eq!(nightly["retrain"], "nightly", "the default");
    for p in ["kace", "kace-at-start"] {
        let r = &nightly["policies"][p]["retraining"];
        assert_eq!(r["mode"], "nightly");
        let per = |k: &str| -> Vec<u64> {
            r[k].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect()
        };
        let (nights, activated, refused) = (per("nights"), per("activated"), per("refused"));
        assert_eq!(nights.len(), 2, "{r}");
        for i in 0..2 {
            assert!(nights[i] >= 1, "{p}: {r}");
            assert_eq!(activated[i] + refused[i], nights[i], "{p}: {r}");
        }
        assert_eq!(r["refusals"][0].as_array().unwrap().len() as u64, refused[0]);
    }
    assert!(nightly["policies"]["oracle"].get("retraining").is_none(), "no model to retrain");
    let never = run(&["--retrain", "never"]);
    assert_eq!(never["retrain"], "never");
    assert_eq!(never["policies"]["kace"]["retraining"]["nights"], serde_json::json!([0, 0]));
    // Only kace's runs change.
    for p in ["exclusive", "memcap", "oracle"] {
        assert_eq!(never["policies"][p], nightly["policies"][p], "{p}");
    }
    let text = kace(&[&["simulate", "--data", data, "--nodes", "4"][..], &long[..]].concat());
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("kace retrained nightly") && text.contains("activated"), "{text}");
    // 300 jobs on 8 GPUs are done within a day: the table says no night came.
    let short = kace(&[&["simulate", "--data", data][..], &SMALL[..]].concat());
    let short = String::from_utf8_lossy(&short.stdout);
    assert!(short.contains("no run lasted until its first night"), "{short}");
    let bad = kace(&["simulate", "--data", data, "--retrain", "weekly"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("weekly"));
}
