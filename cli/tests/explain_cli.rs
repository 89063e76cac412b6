//! `kace explain` and `kace dispatch` through the built binary, without a cluster: explain reads
//! a decision from the spool, then from the database after `kace ingest`; dispatch with Slurm's
//! commands missing fails with a message, and a second dispatch defers to the running one.

use std::process::Command;

use kace_sql::spool::{write_decision, SpooledDecision};
use kace_sql::{DecisionCandidate, NewDecision, TimeLimitChange};

mod common;
use common::Env;

fn env(tag: &str) -> Env {
    Env::new(&format!("explain-{tag}"), true)
}

fn cand(job: &str, w: &str, p: Option<f64>, r: Option<&str>) -> DecisionCandidate {
    DecisionCandidate {
        job: Some(job.into()),
        workload: w.into(),
        prediction: p,
        rejected: r.map(str::to_string),
        held_s: None,
        priority: None,
        time_limits: Vec::new(),
        explores: Vec::new(),
        thread_pct: None,
    }
}

#[test]
fn explain_reads_the_spool_then_the_database() {
    let e = env("spool");
    e.ok(&["db", "init"]);
    let d = SpooledDecision {
        key: "c/10/decision".into(),
        created_at: 1000.0,
        decision: NewDecision {
            lead_job: Some("10".into()),
            lead_workload: "bert".into(),
            chosen_workload: Some("vit".into()),
            chosen_job: Some("12".into()),
            model_version: Some(1),
            candidates: vec![
                DecisionCandidate {
                    priority: Some(75_006.0),
                    time_limits: Vec::new(),
                    ..cand("11", "lstm", Some(3.0), None)
                },
                DecisionCandidate { thread_pct: Some(40), ..cand("12", "vit", Some(4.5), None) },
                cand("13", "huge", None, Some("memory does not fit (40.0 GiB > 30.4 GiB)")),
            ],
        },
    };
    write_decision(&e.dir.join("spool"), &d).unwrap();
    let check = |source: &str| {
        let out = e.ok(&["explain", "10"]);
        assert!(out.contains("job 10 (bert) led its GPU and chose job 12 (vit)"), "{out}");
        assert!(out.contains(&format!("[{source}]")), "{out}");
        // The priority Slurm would have given each candidate, where the record has it.
        assert!(out.contains("priority") && out.contains("75006"), "{out}");
        let out = e.ok(&["explain", "11"]);
        assert!(out.contains("not chosen: predicted 3.000, the chosen one 4.500"), "{out}");
        let out = e.ok(&["explain", "12"]);
        assert!(out.contains("chosen (predicted 4.500), with 40 % of the GPU's SMs"), "{out}");
        let out = e.ok(&["explain", "13"]);
        assert!(out.contains("rejected: memory does not fit"), "{out}");
    };
    check("spool");
    let ingested = e.ok(&["ingest"]);
    assert!(ingested.contains("ingested 1 new decision(s)"), "{ingested}");
    check("database");
    let out = e.ok(&["explain", "99"]);
    assert!(out.contains("appears in no kace decision"), "{out}");
    let v: serde_json::Value =
        serde_json::from_str(&e.ok(&["--format", "json", "explain", "12"])).unwrap();
    let verdict = v["candidate_in"][0]["verdict"].as_str().unwrap();
    assert!(verdict.starts_with("chosen (predicted 4.500), with 40 %"), "{verdict}");
    // The share survives the spool and the database.
    assert_eq!(v["candidate_in"][0]["candidate"]["thread_pct"], 40);
}

/// A partner the decider released to explore a new workload (`selection.explore_pairs`) is
/// told so: the model had not learnt it, and the pair was formed to measure it.
#[test]
fn explain_tells_a_release_that_explored_a_new_workload() {
    let e = env("explore");
    e.ok(&["db", "init"]);
    let d = SpooledDecision {
        key: "c/30/decision".into(),
        created_at: 1000.0,
        decision: NewDecision {
            lead_job: Some("30".into()),
            lead_workload: "bert".into(),
            chosen_workload: Some("fresh".into()),
            chosen_job: Some("31".into()),
            model_version: Some(1),
            candidates: vec![DecisionCandidate {
                explores: vec!["fresh".into()],
                ..cand("31", "fresh", Some(1.2), None)
            }],
        },
    };
    write_decision(&e.dir.join("spool"), &d).unwrap();
    let out = e.ok(&["explain", "31"]);
    assert!(
        out.contains(
            "chosen (predicted 1.200), to explore new workload fresh (the model had not learnt it"
        ),
        "{out}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&e.ok(&["--format", "json", "explain", "31"])).unwrap();
    assert_eq!(v["candidate_in"][0]["candidate"]["explores"][0], "fresh");
}

/// Dispatch's records say how a job left the hold: a late arrival on an open GPU, max_hold onto
/// a free one; they are releases, not a lead's choice ("led its GPU" is not said of them).
#[test]
fn explain_tells_late_arrivals_and_max_hold_releases_from_dispatchs_records() {
    let e = env("dispatch");
    e.ok(&["db", "init"]);
    let spool = e.dir.join("spool");
    let rec = |key: &str, lead: &str, chosen: Option<&str>, held: f64| SpooledDecision {
        key: key.into(),
        created_at: 2000.0,
        decision: NewDecision {
            lead_job: Some(lead.into()),
            lead_workload: "bert".into(),
            chosen_workload: chosen.map(|_| "vit".into()),
            chosen_job: chosen.map(str::to_string),
            model_version: chosen.map(|_| 1),
            candidates: vec![DecisionCandidate {
                held_s: Some(held),
                priority: None,
                // Joining job 20 lengthened both jobs' limits.
                time_limits: match chosen {
                    Some(c) => vec![
                        TimeLimitChange { job: c.into(), from_s: 3600.0, to_s: 5400.0 },
                        TimeLimitChange { job: lead.into(), from_s: 1800.0, to_s: 2700.0 },
                    ],
                    None => Vec::new(),
                },
                ..cand(chosen.unwrap_or(lead), "vit", chosen.map(|_| 4.0), None)
            }],
        },
    };
    write_decision(&spool, &rec("c/21/2000000/n1/join", "20", Some("21"), 7.0)).unwrap();
    write_decision(&spool, &rec("c/22/2000000/n1/max_hold", "22", None, 601.0)).unwrap();
    let json = |job: &str| -> serde_json::Value {
        serde_json::from_str(&e.ok(&["--format", "json", "explain", job])).unwrap()
    };
    let v = json("21");
    let r = &v["story"]["released"];
    assert_eq!((r["by"].as_str(), r["place"].as_str()), (Some("late_arrival"), Some("open_gpu")));
    assert_eq!(r["lead_job"], "20");
    assert_eq!(v["candidate_in"][0]["verdict"], "chosen (predicted 4.000)");
    let v = json("22");
    let r = &v["story"]["released"];
    assert_eq!((r["by"].as_str(), r["place"].as_str()), (Some("max_hold"), Some("free_gpu")));
    assert_eq!(v["led"].as_array().map(Vec::len), Some(0), "{v}");
    let out = e.ok(&["explain", "21"]);
    assert!(out.contains("kace dispatch offered held jobs to the open GPU of job 20"), "{out}");
    assert!(
        out.contains(
            "job 21's time limit was lengthened from 1h 00m to 1h 30m for sharing at its release"
        ),
        "{out}"
    );
    let out = e.ok(&["explain", "20"]);
    assert!(
        out.contains("job 20's time limit was lengthened from 30m 00s to 45m 00s for sharing when job 21 joined its GPU"),
        "{out}"
    );
    assert_eq!(json("20")["time_limits"][0]["to_s"], 2700.0);
}

/// What the epilog measured of a job: an out-of-memory exit under the memory guard, and a
/// profile from its alone run, read from the spool and, after ingest, from the database.
#[test]
fn explain_says_a_job_ran_out_of_memory_under_its_limit_and_what_its_alone_run_measured() {
    let e = env("measured");
    e.ok(&["db", "init"]);
    let mut memcap = [None; kace_sql::FEATURE_COUNT];
    memcap[kace_sql::MEMCAP] = Some(5.5);
    let oom = kace_sql::ObservedProfile {
        key: "c/21/1/n1/profile-oom".into(),
        job: "21".into(),
        created_at: 1000.0,
        profile: kace_sql::NewProfile {
            workload: "beta".into(),
            gpu_model: "Fake".into(),
            source: kace_sql::OOM_SOURCE.into(),
            values: memcap,
        },
        samples: 11,
        alone_seconds: 0.0,
        oom_limit_mib: Some(5632),
        user: None,
    };
    let mut alone = oom.clone();
    alone.key = "c/22/1/n1/profile".into();
    alone.job = "22".into();
    alone.profile.source = kace_sql::OBSERVED_SOURCE.into();
    alone.profile.values[7] = Some(40.0);
    (alone.samples, alone.alone_seconds, alone.oom_limit_mib) = (29, 28.0, None);
    for r in [&oom, &alone] {
        kace_sql::spool::write_profile(&e.dir.join("spool"), r).unwrap();
    }
    for source in ["spool", "database"] {
        if source == "database" {
            let out = e.ok(&["ingest"]);
            assert!(out.contains("ingested 2 new profile measurement(s)"), "{out}");
        }
        let out = e.ok(&["explain", "21"]);
        assert!(
            out.contains("job 21 (beta) ran out of GPU memory under its memory limit of 5632 MiB"),
            "{out}"
        );
        assert!(out.contains("memcap is now at least 5.500 GiB"), "{out}");
        assert!(out.contains(&format!("[{source}]")), "{out}");
        let out = e.ok(&["explain", "22"]);
        assert!(out.contains("job 22 (beta) ran alone for 28 s"), "{out}");
        assert!(out.contains("from 29 sampler reading(s): sm_pct 40.000"), "{out}");
    }
}

#[test]
fn dispatch_without_slurm_fails_clearly_and_one_runs_at_a_time() {
    let e = env("dispatch");
    let out = e.run(&["dispatch"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("kace: dispatch: couldn't start") && err.contains("/none"), "{err}");
    // Someone else holds the lock: this run does nothing, successfully.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let lock = kace_node::state::lock_file(&e.dir.join("dispatch.lock"), deadline).unwrap();
    let out = e.run(&["dispatch"]);
    drop(lock);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("another decider holds"));
}

/// The audit's terminal-escape injection: a user's `--comment` reached a decision's rejection
/// reason, and `kace explain` printed it raw to the admin's terminal.
#[test]
fn explain_escapes_control_characters_from_decisions() {
    let e = env("escapes");
    let evil = "chosen, but no longer held (\u{1b}]0;owned-title\u{7}\u{1b}[2J\nforged line)";
    let d = SpooledDecision {
        key: "c/20/decision".into(),
        created_at: 1000.0,
        decision: NewDecision {
            lead_job: Some("20".into()),
            lead_workload: "bert".into(),
            chosen_workload: None,
            chosen_job: None,
            model_version: None,
            candidates: vec![cand("21", "lstm", None, Some(evil))],
        },
    };
    write_decision(&e.dir.join("spool"), &d).unwrap();
    for job in ["20", "21"] {
        let out = e.ok(&["explain", job]);
        assert!(!out.contains('\u{1b}') && !out.contains('\u{7}'), "{out:?}");
        assert!(!out.contains("\nforged line"), "{out:?}");
    }
    let out = e.ok(&["explain", "21"]);
    assert!(out.contains("\\u{1b}]0;owned-title\\u{7}"), "{out}");
}

/// `kace … | head`: once the reader has gone, kace stops quietly with exit 0 (it was a
/// broken-pipe panic, exit 101).
#[test]
fn a_closed_stdout_ends_the_command_quietly() {
    let e = env("pipe");
    e.ok(&["db", "init"]);
    for args in [&["db", "check"][..], &["explain", "1"], &["model", "list"]] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kace"))
            .env("KACE_CONFIG", e.dir.join("kace.conf"))
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // The reader goes away before kace writes anything.
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}
