//! The spool's hardening against the reliability audit: file modes, poison-pill decisions,
//! recurring job ids, oversized decisions, half-copied files and concurrent ingests.

use std::fs;
use std::os::unix::fs::PermissionsExt;

use kace_sql::spool::{
    decision_key, ingest, ingest_decisions, observation_key, record_file_name, write_decision,
    write_record, SpooledDecision, DECISIONS_DIR,
};
use kace_sql::{
    Db, DecisionCandidate, NewDecision, NewModel, NewProfile, Observation, ObservationFilter,
    Partner, FEATURE_COUNT,
};
use kace_test_support::TempDir;

fn obs(key: &str, job: &str, thr: f64) -> Observation {
    Observation {
        key: key.into(),
        job: job.into(),
        workload: "w".into(),
        partners: vec![],
        node: "n1".into(),
        gpu: "0".into(),
        mps_share: None,
        start: 100.0,
        end: 110.0,
        steps: Some(10.0 * thr),
        throughput: thr,
        user: None,
        account: None,
        gpu_sm_pct: None,
        gpu_energy_j: None,
    }
}

fn decision(key: &str, lead: &str, at: f64, candidates: usize) -> SpooledDecision {
    SpooledDecision {
        key: key.into(),
        created_at: at,
        decision: NewDecision {
            lead_job: Some(lead.into()),
            lead_workload: "bert".into(),
            chosen_workload: None,
            chosen_job: None,
            model_version: Some(1),
            candidates: (0..candidates)
                .map(|i| DecisionCandidate {
                    job: Some(format!("{}", 1000 + i)),
                    workload: "resnet50-train".into(),
                    prediction: None,
                    rejected: Some("memory does not fit (40.0 GiB > 30.4 GiB)".into()),
                    held_s: None,
                    priority: None,
                    time_limits: Vec::new(),
                    explores: Vec::new(),
                    thread_pct: None,
                })
                .collect(),
        },
    }
}

#[test]
fn spool_and_quarantine_files_are_not_world_readable() {
    let dir = TempDir::new("spool-modes");
    let spool = dir.join("spool");
    fs::create_dir_all(&spool).unwrap();
    let p = write_record(&spool, &obs("c/1/0", "1", 1.0)).unwrap();
    let d = write_decision(&spool, &decision("c/1/decision", "1", 1.0, 1)).unwrap();
    for f in [&p, &d, &spool.join("decisions")] {
        let mode = fs::metadata(f).unwrap().permissions().mode();
        assert_eq!(mode & 0o007, 0, "{} is {mode:o}", f.display());
    }
    fs::write(spool.join("junk.json"), "{").unwrap();
    let (mut db, _) = Db::create(&dir.join("k.db")).unwrap();
    let q = dir.join("q");
    ingest(&mut db, &spool, &q).unwrap();
    for f in [q.clone(), q.join("junk.json.reason")] {
        let mode = fs::metadata(&f).unwrap().permissions().mode();
        assert_eq!(mode & 0o007, 0, "{} is {mode:o}", f.display());
    }
}

fn profile(workload: &str, exclusive: f64) -> NewProfile {
    let mut values = [None; FEATURE_COUNT];
    values[6] = Some(exclusive);
    NewProfile {
        workload: workload.into(),
        gpu_model: "V100".into(),
        source: "test".into(),
        values,
    }
}

/// The audit's poison pill: a decision that parses but fails validation aborted every later
/// ingest (and retrain). It is quarantined, and the decisions after it are stored.
#[test]
fn a_decision_that_fails_validation_is_quarantined_not_fatal() {
    let dir = TempDir::new("poison-decision");
    let spool = dir.join("spool");
    let q = dir.join("q");
    let (mut db, _) = Db::create(&dir.join("k.db")).unwrap();
    write_decision(&spool, &decision("c/2/1/n1/decision", "2", 2.0, 1)).unwrap();
    let mut bad = decision("c/1/1/n1/decision", "1", 1.0, 1);
    bad.decision.lead_workload = "bad name".into();
    // Written by hand (write_decision refuses it), sorting before the good one.
    fs::write(spool.join(DECISIONS_DIR).join("a-bad.json"), serde_json::to_vec(&bad).unwrap())
        .unwrap();
    let r = ingest_decisions(&mut db, &spool, &q).unwrap();
    assert_eq!((r.inserted, r.quarantined.len()), (1, 1), "{r:?}");
    assert!(r.quarantined[0].1.contains("invalid workload name"), "{r:?}");
    assert!(q.join("a-bad.json").is_file());
    assert_eq!(db.decisions(10).unwrap().len(), 1);
}

/// Two ingests at once stored 3 012 rows for 3 000 decisions (check-then-insert): the key is
/// UNIQUE now.
#[test]
fn two_concurrent_decision_ingests_store_each_once() {
    let dir = TempDir::new("conc-decisions");
    let spool = dir.join("spool");
    let q = dir.join("q");
    let path = dir.join("k.db");
    Db::create(&path).unwrap();
    let n = 300;
    for i in 0..n {
        let job = i.to_string();
        write_decision(&spool, &decision(&decision_key("c", &job, "n1", 1.0), &job, 1.0, 2))
            .unwrap();
    }
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let (path, spool, q) = (path.clone(), spool.clone(), q.clone());
            std::thread::spawn(move || {
                let mut db = Db::open(&path).unwrap();
                ingest_decisions(&mut db, &spool, &q).unwrap()
            })
        })
        .collect();
    let inserted: usize = threads.into_iter().map(|t| t.join().unwrap().inserted).sum();
    assert_eq!(inserted, n);
    assert_eq!(Db::open(&path).unwrap().decisions(10 * n).unwrap().len(), n);
}

/// A requeued job (same id, a later run) kept only one run's observation and decision.
#[test]
fn a_recurring_job_id_keeps_every_run() {
    let dir = TempDir::new("requeue");
    let spool = dir.join("spool");
    fs::create_dir_all(&spool).unwrap();
    let (mut db, _) = Db::create(&dir.join("k.db")).unwrap();
    let (first, second) = (1_700_000_000.25, 1_700_000_100.5);
    assert_ne!(observation_key("c", "100", first, 0), observation_key("c", "100", second, 0));
    write_record(&spool, &obs(&observation_key("c", "100", first, 0), "100", 10.0)).unwrap();
    write_record(&spool, &obs(&observation_key("c", "100", second, 0), "100", 1.0)).unwrap();
    for (t, lead) in [(first, "100"), (second, "100")] {
        write_decision(&spool, &decision(&decision_key("c", lead, "n1", t), lead, t, 1)).unwrap();
    }
    // A multi-node lead decides on each node: both decisions are kept too.
    write_decision(&spool, &decision(&decision_key("c", "100", "n2", first), "100", first, 1))
        .unwrap();
    let q = dir.join("q");
    assert_eq!(ingest(&mut db, &spool, &q).unwrap().inserted, 2);
    assert_eq!(ingest_decisions(&mut db, &spool, &q).unwrap().inserted, 3);
    // A third run after the ingest is stored too.
    let third = 1_700_000_200.0;
    write_record(&spool, &obs(&observation_key("c", "100", third, 0), "100", 100.0)).unwrap();
    assert_eq!(ingest(&mut db, &spool, &q).unwrap().inserted, 1);
    assert_eq!(db.observation_count().unwrap(), 3);
}

/// A lead with ≳455 held candidates wrote a decision over the 64 KiB limit, which ingest then
/// quarantined. Decisions are compact with a larger limit, and compacted when even that is
/// exceeded, keeping the chosen candidate.
#[test]
fn large_decisions_are_stored_compacted_not_lost() {
    let dir = TempDir::new("big-decision");
    let spool = dir.join("spool");
    let q = dir.join("q");
    let (mut db, _) = Db::create(&dir.join("k.db")).unwrap();
    write_decision(&spool, &decision("c/1/1/n1/decision", "1", 1.0, 1000)).unwrap();
    let mut huge = decision("c/2/1/n1/decision", "2", 2.0, 30_000);
    huge.decision.chosen_job = Some("29999".into());
    huge.decision.chosen_workload = Some("resnet50-train".into());
    huge.decision.candidates[29_999].rejected = None;
    huge.decision.candidates[29_999].prediction = Some(9.0);
    write_decision(&spool, &huge).unwrap();
    let r = ingest_decisions(&mut db, &spool, &q).unwrap();
    assert_eq!((r.inserted, r.quarantined.len()), (2, 0), "{r:?}");
    let stored = db.decisions(10).unwrap();
    let small = stored.iter().find(|d| d.decision.lead_job.as_deref() == Some("1")).unwrap();
    assert_eq!(small.decision.candidates.len(), 1000);
    let big = stored.iter().find(|d| d.decision.lead_job.as_deref() == Some("2")).unwrap();
    assert!(big.decision.candidates.len() < 30_000);
    assert!(big.decision.candidates.iter().any(|c| c.job.as_deref() == Some("29999")));
}

/// The admin guide's "copy the files in first": a half-copied file is quarantined, completes in
/// the quarantine, and was never ingested. Now the next ingest takes it back.
#[test]
fn a_half_copied_file_is_ingested_once_complete() {
    let dir = TempDir::new("half-copied");
    let spool = dir.join("spool");
    let q = dir.join("q");
    fs::create_dir_all(&spool).unwrap();
    let (mut db, _) = Db::create(&dir.join("k.db")).unwrap();
    let o = obs("node7/555/0", "555", 3.0);
    let full = serde_json::to_vec(&o).unwrap();
    let name = record_file_name(&o.key);
    fs::write(spool.join(&name), &full[..40]).unwrap();
    let r = ingest(&mut db, &spool, &q).unwrap();
    assert_eq!((r.inserted, r.quarantined.len()), (0, 1));
    // The copy completes, through the same file (now in the quarantine).
    fs::write(q.join(&name), &full).unwrap();
    let r = ingest(&mut db, &spool, &q).unwrap();
    assert_eq!((r.inserted, r.requeued.len()), (1, 1), "{r:?}");
    assert!(db.has_observation("node7/555/0").unwrap());
    assert!(!q.join(&name).exists() && !q.join(format!("{name}.reason")).exists());
    // A record quarantined for what it says (not for being cut off) stays there.
    let mut neg = obs("node7/556/0", "556", 1.0);
    neg.throughput = -1.0;
    fs::write(spool.join("neg.json"), serde_json::to_vec(&neg).unwrap()).unwrap();
    ingest(&mut db, &spool, &q).unwrap();
    let r = ingest(&mut db, &spool, &q).unwrap();
    assert!(r.requeued.is_empty());
    assert!(q.join("neg.json").exists());
}

/// The audit's poisoned progress file: 1.5e308 steps/s passed every check and went into the
/// retrained model. Observations far above the workload's exclusive throughput are quarantined
/// at ingest and refused at import; `db check` reports any already stored; an admin can
/// quarantine or remove them.
#[test]
fn implausible_observations_never_reach_training() {
    let dir = TempDir::new("poison");
    let spool = dir.join("spool");
    let q = dir.join("q");
    fs::create_dir_all(&spool).unwrap();
    let (mut db, _) = Db::create(&dir.join("k.db")).unwrap();
    db.insert_profiles(&[profile("w", 10.0)]).unwrap();
    let mut poisoned = obs("c/1/1/0", "1", 1.5e308);
    poisoned.steps = Some(1.5e308);
    write_record(&spool, &poisoned).unwrap();
    write_record(&spool, &obs("c/2/1/0", "2", 15.0)).unwrap();
    let r = ingest(&mut db, &spool, &q).unwrap();
    assert_eq!((r.inserted, r.quarantined.len()), (1, 1), "{r:?}");
    assert!(r.quarantined[0].1.contains("more than 4 times"), "{r:?}");
    // The import path refuses it, storing nothing of the file.
    let err = db.insert_observations(&[obs("i/1", "i1", 5.0), obs("i/2", "i2", 1e30)]).unwrap_err();
    assert!(err.to_string().contains("more than 4 times"), "{err}");
    assert!(!db.has_observation("i/1").unwrap());
    // Without a profile, only an absolute bound applies.
    let mut unprofiled = obs("i/3", "i3", 1e12);
    unprofiled.workload = "new-workload".into();
    assert!(db.insert_observations(&[unprofiled]).is_err());

    // Stored before its workload was profiled (or before this check existed): db check says so.
    let mut early = obs("c/3/1/0", "3", 500.0);
    early.workload = "late".into();
    db.insert_observations(std::slice::from_ref(&early)).unwrap();
    assert!(db.check().unwrap().problems.is_empty());
    db.insert_profiles(&[profile("late", 20.0)]).unwrap();
    let problems = db.check().unwrap().problems;
    assert!(problems.iter().any(|p| p.contains("c/3/1/0") && p.contains("more than 4 times")));
    // Quarantined by job: out of training and listings, and db check is clean.
    let by_job = ObservationFilter { job: Some("3".into()), ..Default::default() };
    assert_eq!(db.quarantine_observations(&by_job, "poisoned").unwrap(), 1);
    assert!(db.check().unwrap().problems.is_empty(), "{:?}", db.check().unwrap().problems);
    assert!(db.observations().unwrap().iter().all(|o| o.key != "c/3/1/0"));
    assert_eq!(db.quarantined_observations().unwrap(), vec![("c/3/1/0".into(), "poisoned".into())]);
    // Removed by node: gone for good.
    let by_node = ObservationFilter { node: Some("n1".into()), ..Default::default() };
    assert_eq!(db.remove_observations(&by_node).unwrap(), 2);
    assert_eq!(db.observation_count().unwrap(), 0);
    assert!(db.remove_observations(&ObservationFilter::default()).is_err());
}

#[test]
fn observations_that_name_themselves_or_absurd_times_are_invalid() {
    let mut o = obs("k", "1", 1.0);
    o.partners = vec![Partner { job: "1".into(), workload: "w".into() }];
    assert!(o.validate().is_err());
    o.partners = vec![
        Partner { job: "2".into(), workload: "w".into() },
        Partner { job: "2".into(), workload: "w".into() },
    ];
    assert!(o.validate().is_err());
    o.partners = (0..100).map(|i| Partner { job: format!("p{i}"), workload: "w".into() }).collect();
    assert!(o.validate().is_err());
    let mut o = obs("k", "1", 1.0);
    (o.start, o.end) = (-1e308, 1e308);
    assert!(o.validate().is_err());
    let mut o = obs("k", "1", 1.0);
    o.node = "n\u{153}ud\u{202e}".into();
    assert!(o.validate().is_err());
}

#[test]
fn db_check_reports_a_model_with_a_non_finite_held_out_error() {
    let dir = TempDir::new("inf-model");
    let (mut db, _) = Db::create(&dir.join("k.db")).unwrap();
    let m = NewModel {
        kind: "linear".into(),
        features: vec!["threads".into()],
        normalisation: serde_json::json!({}),
        coefficients: serde_json::json!({}),
        body: serde_json::json!({}),
        // serde_json writes inf as null.
        metrics: serde_json::json!({ "holdout_mse": f64::INFINITY }),
        training_digest: "d".into(),
        training_size: 1,
    };
    db.insert_model(&m).unwrap();
    let problems = db.check().unwrap().problems;
    assert!(
        problems.iter().any(|p| p.contains("held-out MSE is not a finite number")),
        "{problems:?}"
    );
}

/// Root writes, renames and removes files in the spool: a directory others can change is
/// refused (a user could plant a symlink named like the next `.reason` file).
#[test]
fn root_refuses_a_spool_others_can_write() {
    if !kace_layout::trusted_dir::running_as_root() {
        return; // Only root's writes can be turned against the system; CI runs as root.
    }
    let dir = TempDir::new("open-spool");
    let spool = dir.join("spool");
    fs::create_dir_all(&spool).unwrap();
    fs::set_permissions(&spool, fs::Permissions::from_mode(0o777)).unwrap();
    let err = write_record(&spool, &obs("c/1/1/0", "1", 1.0)).unwrap_err();
    assert!(err.to_string().contains("writable by its group or everyone"), "{err}");
    let (mut db, _) = Db::create(&dir.join("k.db")).unwrap();
    assert!(ingest(&mut db, &spool, &dir.join("q")).is_err());
    fs::set_permissions(&spool, fs::Permissions::from_mode(0o755)).unwrap();
    write_record(&spool, &obs("c/1/1/0", "1", 1.0)).unwrap();
}

/// Abandoned decision writes were neither reported nor pruned.
#[test]
fn abandoned_decision_writes_are_reported() {
    let dir = TempDir::new("stale-decision");
    let spool = dir.join("spool");
    let decisions = spool.join(DECISIONS_DIR);
    fs::create_dir_all(&decisions).unwrap();
    let old = decisions.join(".tmp.9.c_1_decision.json");
    let f = fs::File::create(&old).unwrap();
    f.set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(7200)).unwrap();
    drop(f);
    let (mut db, _) = Db::create(&dir.join("k.db")).unwrap();
    let r = ingest_decisions(&mut db, &spool, &dir.join("q")).unwrap();
    assert_eq!(r.stale_temp_files, vec![old]);
}
