//! Tests of the store through its public API: opening, migrations, each table, the spool.

use std::fs;

use kace_sql::spool::{
    ingest, ingest_decisions, ingest_profiles, profile_key, record_file_name, spooled_decisions,
    write_decision, write_profile, write_record, SpooledDecision, PROFILES_DIR,
};
use kace_sql::{
    Db, DecisionCandidate, Error, NewDecision, NewModel, NewProfile, Observation, ObservedProfile,
    Partner, CURRENT_VERSION, FEATURE_COUNT, OBSERVED_SOURCE, OOM_SOURCE,
};
use kace_test_support::TempDir;

fn obs(key: &str, job: &str, wl: &str, partner: Option<(&str, &str)>, thr: f64) -> Observation {
    Observation {
        key: key.into(),
        job: job.into(),
        workload: wl.into(),
        partners: partner
            .map(|(j, w)| vec![Partner { job: j.into(), workload: w.into() }])
            .unwrap_or_default(),
        node: "n1".into(),
        gpu: "0".into(),
        mps_share: Some(100.0),
        start: 100.0,
        end: 200.0,
        steps: Some(thr * 100.0),
        throughput: thr,
        user: None,
        account: None,
        gpu_sm_pct: None,
        gpu_energy_j: None,
    }
}

fn model(kind: &str) -> NewModel {
    NewModel {
        kind: kind.into(),
        features: vec!["a".into(), "b".into()],
        normalisation: serde_json::json!({"mean": [0.0, 1.0]}),
        coefficients: serde_json::json!([0.0, 1.0, 2.0]),
        body: serde_json::json!({"any": "thing"}),
        metrics: serde_json::json!({"mse": 0.1}),
        training_digest: "abc".into(),
        training_size: 3,
    }
}

#[test]
fn init_is_idempotent_and_read_only_open_works() {
    let dir = TempDir::new("init");
    let path = dir.path().join("kace.db");
    let (_, m) = Db::create(&path).unwrap();
    assert_eq!((m.from, m.to), (0, CURRENT_VERSION));
    let (db, m) = Db::create(&path).unwrap();
    assert_eq!((m.from, m.to), (CURRENT_VERSION, CURRENT_VERSION));
    let report = db.check().unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    drop(db);
    let ro = Db::open_read_only(&path).unwrap();
    assert!(ro.is_read_only());
    assert!(ro.workloads().unwrap().is_empty());
    // The journal mode is the rollback journal, never WAL.
    assert!(!dir.path().join("kace.db-wal").exists());
}

#[test]
fn missing_corrupt_and_foreign_files_are_clear_errors() {
    let dir = TempDir::new("bad");
    let missing = dir.path().join("nope.db");
    assert!(matches!(Db::open_read_only(&missing), Err(Error::Missing { .. })));
    assert!(matches!(Db::open(&missing), Err(Error::Missing { .. })));

    let junk = dir.path().join("junk.db");
    fs::write(&junk, vec![0x5a; 8192]).unwrap();
    let err = Db::open_read_only(&junk).unwrap_err();
    assert!(matches!(err, Error::Corrupt { .. }), "{err:?}");
    assert!(err.to_string().contains("not a valid kace database"), "{err}");
    assert!(matches!(Db::open(&junk), Err(Error::Corrupt { .. })));

    // A real SQLite file truncated in the middle of its pages.
    let good = dir.path().join("good.db");
    let (mut db, _) = Db::create(&good).unwrap();
    let many: Vec<_> =
        (0..500).map(|i| obs(&format!("k{i}"), &i.to_string(), "w", None, 1.0)).collect();
    db.insert_observations(&many).unwrap();
    drop(db);
    let bytes = fs::read(&good).unwrap();
    let cut = dir.path().join("cut.db");
    let mut damaged = bytes[..bytes.len() / 2].to_vec();
    // Overwrite a page in the middle with garbage so the B-tree is inconsistent.
    let mid = damaged.len() / 2;
    for b in &mut damaged[mid..mid + 1024] {
        *b = 0xff;
    }
    fs::write(&cut, damaged).unwrap();
    // Opening may succeed (the header is intact), but check must report damage or an error.
    match Db::open_any_version(&cut) {
        Err(e) => assert!(matches!(e, Error::Corrupt { .. }), "{e:?}"),
        Ok(db) => match db.check() {
            Err(e) => assert!(matches!(e, Error::Corrupt { .. }), "{e:?}"),
            Ok(r) => assert!(!r.problems.is_empty(), "damage not reported"),
        },
    }

    // An uninitialised (empty) database.
    let empty = dir.path().join("empty.db");
    fs::write(&empty, b"").unwrap();
    assert!(matches!(Db::open_read_only(&empty), Err(Error::NotInitialised { .. })));
}

#[test]
fn profiles_are_read_by_any_names_and_any_number_of_them() {
    let dir = TempDir::new("prof-names");
    let (mut db, _) = Db::create(&dir.path().join("k.db")).unwrap();
    // More names than SQLite once allowed bound variables in one statement (999).
    let names: Vec<String> =
        ["a.b_c+d-e".to_string()].into_iter().chain((0..1500).map(|i| format!("w{i}"))).collect();
    let rows: Vec<NewProfile> = names
        .iter()
        .enumerate()
        .map(|(i, w)| NewProfile {
            workload: w.clone(),
            gpu_model: "H200".into(),
            source: "manual".into(),
            values: std::array::from_fn(|f| Some(if f == 0 { i as f64 + 1.0 } else { 1.0 })),
        })
        .collect();
    db.insert_profiles(&rows).unwrap();
    // Asked for with names no workload may have (a user's text reaches here unchecked): quotes,
    // a comma, SQL, JSON escapes, non-ASCII: none matches, and none breaks the query.
    let odd = ["a\"b", "w1,w2", "w1') OR 1=1; --", "w1\\", "w1\t", "]", "réseau-日本", ""];
    let mut asked: Vec<&str> = names.iter().map(String::as_str).collect();
    asked.extend(odd);
    let got = db.profiles(&asked, None).unwrap();
    assert_eq!(got.len(), names.len());
    for (i, w) in names.iter().enumerate() {
        assert_eq!(got[w.as_str()].complete().unwrap()[0], i as f64 + 1.0, "{w}");
    }
    assert!(db.profiles(&odd, None).unwrap().is_empty());
    assert!(db.profiles(&[], None).unwrap().is_empty());
}

#[test]
fn profiles_merge_newest_value_per_feature() {
    let dir = TempDir::new("prof");
    let (mut db, _) = Db::create(&dir.path().join("k.db")).unwrap();
    let mut kernel = [None; FEATURE_COUNT];
    for (i, v) in kernel.iter_mut().enumerate().take(6) {
        *v = Some(i as f64 + 1.0);
    }
    let mut system = [None; FEATURE_COUNT];
    for (i, v) in system.iter_mut().enumerate().skip(6) {
        *v = Some(i as f64 * 10.0);
    }
    let p = |values, source: &str| NewProfile {
        workload: "w1".into(),
        gpu_model: "V100".into(),
        source: source.into(),
        values,
    };
    db.insert_profiles(&[p(kernel, "ncu")]).unwrap();
    let got = db.profiles(&["w1", "unknown"], None).unwrap();
    assert_eq!(got.len(), 1);
    assert!(got["w1"].complete().is_none());
    assert_eq!(got["w1"].missing().len(), 4);
    db.insert_profiles(&[p(system, "nvml")]).unwrap();
    let got = db.profiles(&["w1"], None).unwrap();
    let full = got["w1"].complete().expect("merged profile complete");
    assert_eq!(full[0], 1.0);
    assert_eq!(full[9], 90.0);
    // A newer measurement of one feature replaces only that feature.
    let mut memcap = [None; FEATURE_COUNT];
    memcap[9] = Some(5.5);
    db.insert_profiles(&[p(memcap, "manual")]).unwrap();
    let got = db.profiles(&["w1"], Some("V100")).unwrap();
    assert_eq!(got["w1"].complete().unwrap()[9], 5.5);
    assert_eq!(got["w1"].complete().unwrap()[6], 60.0);
    assert!(db.profiles(&["w1"], Some("A100")).unwrap().is_empty());
    // Bad values are refused and nothing of the batch is stored.
    let mut bad = kernel;
    bad[1] = Some(f64::NAN);
    let before = db.all_profiles(None).unwrap();
    assert!(db.insert_profiles(&[p(memcap, "x"), p(bad, "x")]).is_err());
    assert_eq!(db.all_profiles(None).unwrap(), before);
}

#[test]
fn observations_are_stored_once_and_pairs_match() {
    let dir = TempDir::new("obs");
    let (mut db, _) = Db::create(&dir.path().join("k.db")).unwrap();
    // The GPU's energy over the interval is stored and read back with the rest.
    let a = Observation {
        gpu_energy_j: Some(25_000.5),
        ..obs("c/1/0", "1", "wa", Some(("2", "wb")), 3.0)
    };
    let b = obs("c/2/0", "2", "wb", Some(("1", "wa")), 4.0);
    let alone = obs("c/3/0", "3", "wc", None, 9.0);
    let one_sided = obs("c/4/0", "4", "wc", Some(("5", "wd")), 1.0);
    let n = db.insert_observations(&[a.clone(), b.clone(), alone, one_sided]).unwrap();
    assert_eq!((n.inserted, n.duplicates), (4, 0));
    let n = db.insert_observations(std::slice::from_ref(&a)).unwrap();
    assert_eq!((n.inserted, n.duplicates), (0, 1));
    assert_eq!(db.observation_count().unwrap(), 4);
    let stored = db.observations().unwrap();
    assert_eq!(stored[0], a);
    let groups = db.observed_groups().unwrap();
    assert_eq!(groups.len(), 1);
    let g = &groups[0];
    let got: Vec<(&str, f64)> =
        g.members.iter().map(|m| (m.workload.as_str(), m.throughput)).collect();
    assert_eq!(got, [("wa", 3.0), ("wb", 4.0)]);
    // Non-overlapping intervals are not a pair.
    let mut c = obs("c/6/0", "6", "wa", Some(("7", "wb")), 1.0);
    let mut d = obs("c/7/0", "7", "wb", Some(("6", "wa")), 1.0);
    c.end = 150.0;
    d.start = 160.0;
    db.insert_observations(&[c, d]).unwrap();
    assert_eq!(db.observed_groups().unwrap().len(), 1);
}

/// An observation naming several partners.
fn obs_in(key: &str, job: &str, wl: &str, partners: &[(&str, &str)], thr: f64) -> Observation {
    let mut o = obs(key, job, wl, None, thr);
    o.partners =
        partners.iter().map(|(j, w)| Partner { job: (*j).into(), workload: (*w).into() }).collect();
    o
}

#[test]
fn groups_of_three_match_when_every_member_agrees() {
    let dir = TempDir::new("groups");
    let (mut db, _) = Db::create(&dir.path().join("k.db")).unwrap();
    let mut trio = vec![
        obs_in("t/1", "1", "wa", &[("2", "wb"), ("3", "wc")], 1.0),
        obs_in("t/2", "2", "wb", &[("3", "wc"), ("1", "wa")], 2.0),
        obs_in("t/3", "3", "wc", &[("1", "wa"), ("2", "wb")], 3.0),
    ];
    // Their common stretch is 150..160: still one group.
    trio[1].start = 150.0;
    trio[2].end = 160.0;
    // A trio whose third member saw a different partner workload, and one whose third member
    // ran after the first had ended: neither is a group; nor is a member with a missing peer.
    let disagree = [
        obs_in("d/1", "11", "wa", &[("12", "wb"), ("13", "wc")], 1.0),
        obs_in("d/2", "12", "wb", &[("11", "wa"), ("13", "wc")], 1.0),
        obs_in("d/3", "13", "wc", &[("11", "wa"), ("12", "wz")], 1.0),
    ];
    let mut apart = [
        obs_in("a/1", "21", "wa", &[("22", "wb"), ("23", "wc")], 1.0),
        obs_in("a/2", "22", "wb", &[("21", "wa"), ("23", "wc")], 1.0),
        obs_in("a/3", "23", "wc", &[("21", "wa"), ("22", "wb")], 1.0),
    ];
    apart[0].end = 120.0;
    apart[2].start = 130.0;
    let lonely = obs_in("l/1", "31", "wa", &[("32", "wb"), ("33", "wc")], 1.0);
    db.insert_observations(&trio).unwrap();
    db.insert_observations(&disagree).unwrap();
    db.insert_observations(&apart).unwrap();
    db.insert_observations(&[lonely]).unwrap();
    let groups = db.observed_groups().unwrap();
    assert_eq!(groups.len(), 1, "{groups:?}");
    let g = &groups[0];
    assert_eq!(g.k(), 3);
    let got: Vec<(&str, f64, &str)> =
        g.members.iter().map(|m| (m.workload.as_str(), m.throughput, m.key.as_str())).collect();
    assert_eq!(got, [("wa", 1.0, "t/1"), ("wb", 2.0, "t/2"), ("wc", 3.0, "t/3")]);
}

#[test]
fn one_active_model_at_a_time() {
    let dir = TempDir::new("model");
    let (mut db, _) = Db::create(&dir.path().join("k.db")).unwrap();
    assert!(db.active_model_record().unwrap().is_none());
    let v1 = db.insert_model(&model("linear")).unwrap();
    let v2 = db.insert_model(&model("linear")).unwrap();
    assert_eq!((v1, v2), (1, 2));
    assert!(db.check().unwrap().problems.iter().any(|p| p.contains("none is active")));
    db.activate_model(v1).unwrap();
    db.activate_model(v2).unwrap();
    let active = db.active_model_record().unwrap().unwrap();
    assert_eq!(active.version, 2);
    assert_eq!(active.model, model("linear"));
    assert_eq!(db.models().unwrap().iter().filter(|m| m.active).count(), 1);
    assert!(matches!(db.activate_model(9), Err(Error::NoSuchModel { version: 9 })));
    assert_eq!(db.active_model_record().unwrap().unwrap().version, 2);
    // The active model must be one the prolog can use.
    let problems = db.check().unwrap().problems;
    assert!(problems.iter().any(|p| p.contains("unknown kind")), "{problems:?}");
    assert!(matches!(
        kace_sql::convert::load_active_model(&db),
        Err(Error::BadModel { version: 2, .. })
    ));
    let rows: Vec<[f64; 10]> =
        (0..20).map(|i| std::array::from_fn(|j| ((i * (j + 3)) % 7) as f64 + j as f64)).collect();
    let y: Vec<f64> = rows.iter().map(|r| r[6] * 2.0 + r[9]).collect();
    let lm = kace_selector::Model::Linear {
        objective: kace_selector::Objective::ThroughputSum,
        model: kace_selector::LinearModel::fit(&rows, &y).unwrap(),
    };
    let rec =
        kace_sql::convert::model_to_new_model(&lm, serde_json::json!({}), "d".into(), 20).unwrap();
    let v3 = db.insert_model(&rec).unwrap();
    db.activate_model(v3).unwrap();
    assert!(db.check().unwrap().problems.is_empty());
    let (v, back) = kace_sql::convert::load_active_model(&db).unwrap();
    assert_eq!((v, back), (3, lm));
}

#[test]
fn decisions_round_trip() {
    let dir = TempDir::new("dec");
    let (mut db, _) = Db::create(&dir.path().join("k.db")).unwrap();
    let d = NewDecision {
        lead_job: Some("10".into()),
        lead_workload: "wa".into(),
        chosen_workload: Some("wb".into()),
        chosen_job: Some("11".into()),
        model_version: Some(1),
        candidates: vec![
            DecisionCandidate {
                job: Some("11".into()),
                workload: "wb".into(),
                prediction: Some(7.5),
                rejected: None,
                held_s: None,
                priority: None,
                time_limits: Vec::new(),
                explores: Vec::new(),
                thread_pct: None,
            },
            DecisionCandidate {
                job: None,
                workload: "wc".into(),
                prediction: None,
                rejected: Some("unknown profile".into()),
                held_s: None,
                priority: None,
                time_limits: Vec::new(),
                explores: Vec::new(),
                thread_pct: None,
            },
        ],
    };
    db.insert_decision(&d).unwrap();
    let got = db.decisions(10).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].decision, d);

    // Spooled by a prolog, then ingested twice: stored once, with its own time.
    let spool = dir.path().join("spool");
    let quarantine = dir.path().join("q");
    fs::create_dir_all(&spool).unwrap();
    let rec = SpooledDecision { key: "c/10/decision".into(), created_at: 1234.5, decision: d };
    write_decision(&spool, &rec).unwrap();
    fs::write(spool.join("decisions/garbage.json"), b"{").unwrap();
    let listed = spooled_decisions(&spool).unwrap();
    assert_eq!(listed.len(), 2);
    assert_eq!(listed.iter().filter(|(_, r)| r.as_ref() == Ok(&rec)).count(), 1);
    let r = ingest_decisions(&mut db, &spool, &quarantine).unwrap();
    assert_eq!((r.inserted, r.duplicates, r.quarantined.len()), (1, 0, 1));
    write_decision(&spool, &rec).unwrap();
    let r = ingest_decisions(&mut db, &spool, &quarantine).unwrap();
    assert_eq!((r.inserted, r.duplicates), (0, 1));
    let got = db.decisions(10).unwrap();
    assert_eq!(got.len(), 2);
    assert_eq!((got[0].created_at, &got[0].decision), (1234.5, &rec.decision));
    assert!(spooled_decisions(&spool).unwrap().is_empty());
}

#[test]
fn spool_ingest_is_exactly_once_and_quarantines_bad_files() {
    let dir = TempDir::new("spool");
    let spool = dir.path().join("spool");
    let quarantine = dir.path().join("quarantine");
    fs::create_dir_all(&spool).unwrap();
    let (mut db, _) = Db::create(&dir.path().join("k.db")).unwrap();
    for i in 0..10 {
        write_record(&spool, &obs(&format!("c/{i}/0"), &i.to_string(), "w", None, 1.0)).unwrap();
    }
    // A truncated record, a record with a bad value, a stray file and a write in progress.
    let full = serde_json::to_string(&obs("c/99/0", "99", "w", None, 1.0)).unwrap();
    fs::write(spool.join(record_file_name("c/99/0")), &full[..full.len() / 2]).unwrap();
    let mut neg = obs("c/98/0", "98", "w", None, 1.0);
    neg.throughput = -1.0;
    fs::write(spool.join("neg.json"), serde_json::to_string(&neg).unwrap()).unwrap();
    fs::write(spool.join("notes.txt"), "hello").unwrap();
    fs::write(spool.join(".tmp.1.partial.json"), "{").unwrap();
    std::os::unix::fs::symlink("/etc/hostname", spool.join("link.json")).unwrap();

    let r = ingest(&mut db, &spool, &quarantine).unwrap();
    assert_eq!(r.inserted, 10);
    assert_eq!(r.quarantined.len(), 4, "{:?}", r.quarantined);
    assert!(r.stale_temp_files.is_empty());
    let reason = fs::read_to_string(quarantine.join("link.json.reason")).unwrap();
    assert!(reason.contains("not a regular file"), "{reason}");
    assert_eq!(db.observation_count().unwrap(), 10);
    let truncated = record_file_name("c/99/0");
    assert!(quarantine.join(&truncated).exists());
    let reason = fs::read_to_string(quarantine.join(format!("{truncated}.reason"))).unwrap();
    assert!(reason.contains("not a valid observation record"), "{reason}");
    let reason = fs::read_to_string(quarantine.join("neg.json.reason")).unwrap();
    assert!(reason.contains("throughput"), "{reason}");
    // Only the write in progress is left in the spool.
    let left: Vec<_> = fs::read_dir(&spool).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, vec![std::ffi::OsString::from(".tmp.1.partial.json")]);

    // An abandoned write (older than an hour) is reported, not touched.
    let old = spool.join(".tmp.9.old.json");
    let f = fs::File::create(&old).unwrap();
    f.set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(7200)).unwrap();
    drop(f);
    let r = ingest(&mut db, &spool, &quarantine).unwrap();
    assert_eq!(r.stale_temp_files, vec![old.clone()]);
    fs::remove_file(&old).unwrap();

    // Re-running changes nothing; a record re-delivered after a crash is a duplicate.
    let r = ingest(&mut db, &spool, &quarantine).unwrap();
    assert_eq!((r.inserted, r.duplicates, r.quarantined.len()), (0, 0, 0));
    write_record(&spool, &obs("c/3/0", "3", "w", None, 1.0)).unwrap();
    let r = ingest(&mut db, &spool, &quarantine).unwrap();
    assert_eq!((r.inserted, r.duplicates), (0, 1));
    assert_eq!(db.observation_count().unwrap(), 10);
}

#[test]
fn two_concurrent_ingests_store_each_record_once() {
    let dir = TempDir::new("conc");
    let spool = dir.path().join("spool");
    let quarantine = dir.path().join("quarantine");
    fs::create_dir_all(&spool).unwrap();
    let path = dir.path().join("k.db");
    Db::create(&path).unwrap();
    let n = 600;
    for i in 0..n {
        write_record(&spool, &obs(&format!("c/{i}/0"), &i.to_string(), "w", None, 1.0)).unwrap();
    }
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let (path, spool, quarantine) = (path.clone(), spool.clone(), quarantine.clone());
            std::thread::spawn(move || {
                let mut db = Db::open(&path).unwrap();
                ingest(&mut db, &spool, &quarantine).unwrap()
            })
        })
        .collect();
    let reports: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let inserted: usize = reports.iter().map(|r| r.inserted).sum();
    assert_eq!(inserted, n);
    let db = Db::open(&path).unwrap();
    assert_eq!(db.observation_count().unwrap(), n as i64);
    assert_eq!(fs::read_dir(&spool).unwrap().count(), 0);
    assert!(!quarantine.exists() || fs::read_dir(&quarantine).unwrap().count() == 0);
}

#[test]
fn schema_versions_are_enforced() {
    let dir = TempDir::new("ver");
    let path = dir.path().join("k.db");
    Db::create(&path).unwrap();
    // A database from a newer kace.
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.pragma_update(None, "user_version", CURRENT_VERSION + 1).unwrap();
    drop(conn);
    assert!(matches!(Db::open_read_only(&path), Err(Error::SchemaTooNew { .. })));
    assert!(matches!(Db::open(&path), Err(Error::SchemaTooNew { .. })));
    let mut any = Db::open_any_version(&path).unwrap();
    assert!(matches!(any.migrate(), Err(Error::SchemaTooNew { .. })));
    assert!(!any.check().unwrap().problems.is_empty());
    // Someone else's SQLite file is not initialised over.
    let foreign = dir.path().join("foreign.db");
    let conn = rusqlite::Connection::open(&foreign).unwrap();
    conn.execute_batch("CREATE TABLE t (x INTEGER);").unwrap();
    drop(conn);
    assert!(matches!(Db::create(&foreign), Err(Error::Invalid { .. })));
}

#[test]
fn read_only_handles_cannot_write() {
    let dir = TempDir::new("ro");
    let path = dir.path().join("k.db");
    Db::create(&path).unwrap();
    let mut ro = Db::open_read_only(&path).unwrap();
    let err = ro.insert_observations(&[obs("k", "1", "w", None, 1.0)]).unwrap_err();
    assert!(err.to_string().contains("readonly") || err.to_string().contains("read-only"), "{err}");
    assert_eq!(Db::open(&path).unwrap().observation_count().unwrap(), 0);
}

fn observed(
    key: &str,
    job: &str,
    wl: &str,
    at: f64,
    sys: [f64; 4],
    oom: Option<u64>,
) -> ObservedProfile {
    let mut values = [None; FEATURE_COUNT];
    for (i, v) in sys.into_iter().enumerate() {
        values[6 + i] = (v >= 0.0).then_some(v);
    }
    ObservedProfile {
        key: key.into(),
        job: job.into(),
        created_at: at,
        profile: NewProfile {
            workload: wl.into(),
            gpu_model: "V100".into(),
            source: if oom.is_some() { OOM_SOURCE } else { OBSERVED_SOURCE }.into(),
            values,
        },
        samples: 30,
        alone_seconds: 30.0,
        oom_limit_mib: oom,
        user: None,
    }
}

/// kace's own measurements make a profile of their own, count the alone runs, and give way to
/// an admin's values, except a memcap they measured above the admin's.
#[test]
fn observed_profiles_count_runs_and_admin_values_win() {
    let dir = TempDir::new("observed-prof");
    let (mut db, _) = Db::create(&dir.path().join("k.db")).unwrap();
    assert!(db
        .insert_observed_profile(&observed(
            "c/1/1/n1/profile",
            "1",
            "new",
            10.0,
            [5.0, 40.0, 20.0, 3.0],
            None
        ))
        .unwrap());
    // The same key again (a second ingest) is stored once.
    assert!(!db
        .insert_observed_profile(&observed(
            "c/1/1/n1/profile",
            "1",
            "new",
            10.0,
            [5.0, 40.0, 20.0, 3.0],
            None
        ))
        .unwrap());
    let p = &db.profiles(&["new"], None).unwrap()["new"];
    assert_eq!((p.observed_runs, p.observed_samples), (1, 30));
    assert!(!p.has_admin_values());
    assert!(p.usable(1) && !p.usable(2));
    assert_eq!(p.values[7], Some(40.0));
    assert_eq!(p.sources[7].as_deref(), Some(OBSERVED_SOURCE));
    assert_eq!(p.sources[0], None);
    // A second alone run: its newer values win, two runs counted.
    db.insert_observed_profile(&observed(
        "c/2/1/n1/profile",
        "2",
        "new",
        20.0,
        [6.0, 50.0, 30.0, 2.0],
        None,
    ))
    .unwrap();
    let p = &db.profiles(&["new"], None).unwrap()["new"];
    assert_eq!((p.observed_runs, p.values[7], p.values[9]), (2, Some(50.0), Some(2.0)));
    // An admin's `kace profile run` wins over newer observations...
    let mut admin = [None; FEATURE_COUNT];
    admin[7] = Some(70.0);
    admin[9] = Some(4.0);
    db.insert_profiles(&[NewProfile {
        workload: "new".into(),
        gpu_model: "V100".into(),
        source: "nvml".into(),
        values: admin,
    }])
    .unwrap();
    db.insert_observed_profile(&observed(
        "c/3/1/n1/profile",
        "3",
        "new",
        1e12,
        [7.0, 60.0, 35.0, 3.5],
        None,
    ))
    .unwrap();
    let p = &db.profiles(&["new"], None).unwrap()["new"];
    assert!(p.has_admin_values() && p.usable(99));
    // The admin's file imported again after kace's observation changes nothing.
    let again = NewProfile {
        workload: "new".into(),
        gpu_model: "V100".into(),
        source: "nvml".into(),
        values: admin,
    };
    assert_eq!(db.insert_profiles(&[again]).unwrap().duplicates, 1);
    assert_eq!((p.values[7], p.sources[7].as_deref()), (Some(70.0), Some("nvml")));
    assert_eq!((p.values[6], p.sources[6].as_deref()), (Some(7.0), Some(OBSERVED_SOURCE)));
    assert_eq!((p.values[9], p.sources[9].as_deref()), (Some(4.0), Some("nvml")));
    // ...except that a job that ran out of memory at its limit raises memcap above the admin's.
    db.insert_observed_profile(&observed(
        "c/4/1/n1/profile",
        "4",
        "new",
        2e12,
        [-1.0, -1.0, -1.0, 4.4],
        Some(4505),
    ))
    .unwrap();
    let p = &db.profiles(&["new"], None).unwrap()["new"];
    assert_eq!((p.values[9], p.sources[9].as_deref()), (Some(4.4), Some(OOM_SOURCE)));
    assert_eq!(p.observed_runs, 3, "an out-of-memory record is no alone run");
    let of_job = db.observed_profiles_of_job("4").unwrap();
    assert_eq!(of_job.len(), 1);
    assert_eq!((of_job[0].oom_limit_mib, of_job[0].alone_seconds), (Some(4505), 30.0));
    // However often it runs, only the newest measurements are kept (and counted).
    for i in 0..25 {
        let key = format!("c/{}/1/n1/profile", 100 + i);
        let at = 3e12 + f64::from(i);
        let rec = observed(&key, "100", "new", at, [5.0, 40.0 + f64::from(i), 20.0, 3.0], None);
        assert!(db.insert_observed_profile(&rec).unwrap());
    }
    let p = &db.profiles(&["new"], None).unwrap()["new"];
    assert_eq!(p.observed_runs as usize, kace_sql::OBSERVED_KEPT);
    assert_eq!(p.values[6], Some(5.0));
    assert_eq!(p.values[8], Some(20.0));
    assert_eq!(db.observed_profiles_of_job("4").unwrap().len(), 1, "another source's rows stay");
    // A record that claims an admin's source, or an OOM without its limit, is refused.
    let mut forged = observed("c/5/1/n1/profile", "5", "new", 1.0, [1.0, 1.0, 1.0, 1.0], None);
    forged.profile.source = "nvml".into();
    assert!(db.insert_observed_profile(&forged).is_err());
    let mut no_limit = observed("c/6/1/n1/profile", "6", "new", 1.0, [1.0, 1.0, 1.0, 1.0], None);
    no_limit.profile.source = OOM_SOURCE.into();
    assert!(db.insert_observed_profile(&no_limit).is_err());
}

#[test]
fn spooled_profiles_are_ingested_once_and_bad_ones_quarantined() {
    let dir = TempDir::new("profile-spool");
    let (mut db, _) = Db::create(&dir.path().join("k.db")).unwrap();
    let spool = dir.path().join("spool");
    let quarantine = dir.path().join("quarantine");
    fs::create_dir_all(&spool).unwrap();
    let rec = observed(
        &profile_key("c", "7", "n1", 100.0),
        "7",
        "new",
        100.0,
        [5.0, 40.0, 20.0, 3.0],
        None,
    );
    let path = write_profile(&spool, &rec).unwrap();
    assert!(path.starts_with(spool.join(PROFILES_DIR)));
    fs::write(spool.join(PROFILES_DIR).join("junk.json"), b"{\"key\": 1}").unwrap();
    let r = ingest_profiles(&mut db, &spool, &quarantine).unwrap();
    assert_eq!((r.inserted, r.quarantined.len()), (1, 1));
    assert!(r.quarantined[0].1.starts_with("not a valid profile record"), "{:?}", r.quarantined);
    assert!(!path.exists());
    // Written again (an epilog re-run) and ingested again: stored once.
    write_profile(&spool, &rec).unwrap();
    let r = ingest_profiles(&mut db, &spool, &quarantine).unwrap();
    assert_eq!((r.inserted, r.duplicates), (0, 1));
    assert_eq!(db.profiles(&["new"], None).unwrap()["new"].observed_runs, 1);
    // A bad record is refused at the writer too.
    let mut bad = rec.clone();
    bad.profile.values[7] = Some(f64::NAN);
    assert!(write_profile(&spool, &bad).is_err());
}

/// The trusted reference (issue 31): an admin's import is trusted, the spool's records are not,
/// `trust_observations` marks more, a group is trusted when all its members are, and the
/// migration marks the pair-table imports stored before it.
#[test]
fn admin_imports_are_trusted_and_spooled_records_are_not() {
    let dir = TempDir::new("trusted");
    let path = dir.path().join("k.db");
    let (mut db, _) = Db::create(&path).unwrap();
    let a = obs("import/t:r0:w1", "t:r0:w1", "wa", Some(("t:r0:w2", "wb")), 3.0);
    let b = obs("import/t:r0:w2", "t:r0:w2", "wb", Some(("t:r0:w1", "wa")), 4.0);
    db.insert_admin_observations(&[a, b]).unwrap();
    let c = obs("c/1/0", "1", "wa", Some(("2", "wb")), 3.0);
    let d = obs("c/2/0", "2", "wb", Some(("1", "wa")), 4.0);
    db.insert_observations(&[c, d]).unwrap();
    let trusted = |db: &Db| -> Vec<bool> {
        db.observed_groups().unwrap().iter().map(|g| g.trusted).collect()
    };
    assert_eq!(trusted(&db), [false, true], "spooled c/… first in key order, then import/…");
    // Half a group trusted is not a trusted group.
    let one = kace_sql::ObservationFilter { key: Some("c/1/0".into()), job: None, node: None };
    assert_eq!(db.trust_observations(&one).unwrap(), 1);
    assert_eq!(trusted(&db), [false, true]);
    let other = kace_sql::ObservationFilter { job: Some("2".into()), key: None, node: None };
    assert_eq!(db.trust_observations(&other).unwrap(), 1);
    assert_eq!(trusted(&db), [true, true]);
    drop(db);

    // A version-3 database: the imported rows of a pair table become trusted by migrating.
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(
        "UPDATE observations SET node = 'imported' WHERE key LIKE 'import/%'; \
         ALTER TABLE observations DROP COLUMN trusted; ALTER TABLE observations DROP COLUMN user; \
         ALTER TABLE profiles DROP COLUMN user; ALTER TABLE observations DROP COLUMN account; \
         DROP TABLE gpu_failures; DROP TABLE pair_clearances; DROP TABLE split_models; \
         ALTER TABLE observations DROP COLUMN gpu_energy_j; PRAGMA user_version = 3;",
    )
    .unwrap();
    drop(conn);
    let mut old = Db::open_any_version(&path).unwrap();
    assert_eq!(old.migrate().unwrap().to, CURRENT_VERSION);
    assert_eq!(trusted(&old), [false, true]);
}

/// The re-audit's H1(b) and M1 at the store: the plausibility bound is the admin's exclusive
/// throughput, never one a user's alone run set; a self-measured exclusive throughput far off
/// the admin's is refused; an out-of-memory raise needs sampler readings and comes once a day.
#[test]
fn bounds_come_from_the_admin_and_memcap_raises_are_backed_and_rationed() {
    let dir = TempDir::new("bounds");
    let (mut db, _) = Db::create(&dir.path().join("k.db")).unwrap();
    let mut admin = [None; FEATURE_COUNT];
    admin[6] = Some(12.0);
    admin[9] = Some(24.0);
    let admin = NewProfile {
        workload: "resnet".into(),
        gpu_model: "V100".into(),
        source: "file:profiles.csv".into(),
        values: admin,
    };
    db.insert_profiles(&[admin]).unwrap();
    // One alone run at 9e8 steps/s (under the 1e9 cap for unknown workloads) is refused...
    let fast = observed("c/35/1/n1/profile", "35", "resnet", 10.0, [9e8, 40.0, 20.0, 3.0], None);
    let e = db.insert_observed_profile(&fast).unwrap_err().to_string();
    assert!(e.contains("more than 4 times off resnet's admin-measured 12"), "{e}");
    // ...and so is a slow one that would move the bound down; one within 4× is stored.
    let slow = observed("c/36/1/n1/profile", "36", "resnet", 11.0, [2.0, 40.0, 20.0, 3.0], None);
    assert!(db.insert_observed_profile(&slow).is_err());
    let fair = observed("c/37/1/n1/profile", "37", "resnet", 12.0, [40.0, 40.0, 20.0, 3.0], None);
    assert!(db.insert_observed_profile(&fair).unwrap());
    // The bound stays the admin's 12 although kace's newest measurement says 40.
    assert_eq!(db.exclusive_throughputs().unwrap().get("resnet"), Some(&12.0));
    let forged = obs("c/38/0", "38", "resnet", Some(("39", "bert")), 3.5e9);
    assert!(db.implausible(&forged).unwrap().is_some());
    assert!(db
        .implausible(&obs("c/38/0", "38", "resnet", Some(("39", "b")), 46.0))
        .unwrap()
        .is_none());
    // A workload only kace measured: one user's alone run bounds nothing (the 1e9 cap
    // applies), whoever came first; what two users agree on bounds it for everyone.
    let by = |key: &str, job: &str, x: f64, user: &str| {
        let mut o = observed(key, job, "evilnew", 13.0, [x, 40.0, 20.0, 3.0], None);
        o.user = Some(user.into());
        o
    };
    assert!(db.insert_observed_profile(&by("c/40/1/n1/profile", "40", 9e8, "mallory")).unwrap());
    assert_eq!(db.exclusive_throughputs().unwrap().get("evilnew"), None);
    assert_eq!(db.exclusive_bounds().unwrap().get("evilnew"), None, "one user bounds nothing");
    assert!(db
        .implausible(&obs("c/41/0", "41", "evilnew", Some(("42", "b")), 3.5e9))
        .unwrap()
        .is_some());
    // An honest second user is not refused for disagreeing with the first...
    assert!(db.insert_observed_profile(&by("c/43/1/n1/profile", "43", 10.0, "alice")).unwrap());
    assert_eq!(db.exclusive_bounds().unwrap().get("evilnew"), None, "two who disagree: none");
    // ...and once two users agree, their value bounds every user's claims.
    assert!(db.insert_observed_profile(&by("c/44/1/n1/profile", "44", 14.0, "bob")).unwrap());
    let bound = db.exclusive_bounds().unwrap()["evilnew"];
    assert!((bound - (10.0f64 * 14.0).sqrt()).abs() < 1e-9, "{bound}");
    assert!(db
        .implausible(&obs("c/45/0", "45", "evilnew", Some(("46", "b")), 9e7))
        .unwrap()
        .is_some());
    assert!(db
        .implausible(&obs("c/47/0", "47", "evilnew", Some(("48", "b")), 30.0))
        .unwrap()
        .is_none());
    // A third user's (or mallory's own next) alone run far off what the others agree on is
    // refused; one within 4x is stored.
    let e = db
        .insert_observed_profile(&by("c/49/1/n1/profile", "49", 8e8, "mallory"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("other users' alone runs of evilnew agree on"), "{e}");
    assert!(db.insert_observed_profile(&by("c/59/1/n1/profile", "59", 20.0, "carol")).unwrap());
    assert_eq!(db.observed_exclusive_by_user("evilnew").unwrap().len(), 4);

    // Out of memory: no sampler reading backs it, refused.
    let mut unbacked =
        observed("c/50/1/n1/profile", "50", "resnet", 1e5, [-1.0, -1.0, -1.0, 26.4], Some(27034));
    unbacked.samples = 0;
    let e = db.insert_observed_profile(&unbacked).unwrap_err().to_string();
    assert!(e.contains("no sampler reading backs"), "{e}");
    // Backed: the first raise is stored, the next within a day refused, one a day later stored.
    let oom = |job: u32, at: f64, gib: f64| {
        let key = format!("c/{job}/1/n1/profile-oom");
        observed(&key, &job.to_string(), "resnet", at, [-1.0, -1.0, -1.0, gib], Some(27034))
    };
    let now =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    let day = 86_400.0;
    let t0 = now - 2.0 * day;
    assert!(db.insert_observed_profile(&oom(51, t0, 26.4)).unwrap());
    let e = db.insert_observed_profile(&oom(52, t0 + 5.0, 29.0)).unwrap_err().to_string();
    assert!(e.contains("one raise a day"), "{e}");
    assert!(!db.insert_observed_profile(&oom(51, t0, 26.4)).unwrap(), "a re-ingest is a duplicate");
    assert!(db.insert_observed_profile(&oom(53, now - 60.0, 29.0)).unwrap());
    let memcap = |db: &Db| db.profiles(&["resnet"], None).unwrap()["resnet"].values[9].unwrap();
    // A minute old: the raise over the admin's 24 GiB is whole (within the minute's fading).
    assert!((memcap(&db) - 29.0).abs() < 1e-3, "{}", memcap(&db));

    // The raise fades back to the admin's value: its excess halves each week.
    let fading = observed(
        "c/60/1/n1/profile-oom",
        "60",
        "vit",
        now - 7.0 * day,
        [-1.0, -1.0, -1.0, 28.0],
        Some(27034),
    );
    let mut admin_vit = [None; FEATURE_COUNT];
    admin_vit[9] = Some(20.0);
    db.insert_profiles(&[NewProfile {
        workload: "vit".into(),
        gpu_model: "V100".into(),
        source: "file:profiles.csv".into(),
        values: admin_vit,
    }])
    .unwrap();
    assert!(db.insert_observed_profile(&fading).unwrap());
    let vit = db.profiles(&["vit"], None).unwrap()["vit"].values[9].unwrap();
    assert!((vit - 24.0).abs() < 0.01, "a week old, half of the 8 GiB raise is left: {vit}");
    let old = observed(
        "c/61/1/n1/profile-oom",
        "61",
        "bert",
        now - 70.0 * day,
        [-1.0, -1.0, -1.0, 28.0],
        Some(27034),
    );
    let mut admin_bert = admin_vit;
    admin_bert[9] = Some(20.0);
    db.insert_profiles(&[NewProfile {
        workload: "bert".into(),
        gpu_model: "V100".into(),
        source: "file:profiles.csv".into(),
        values: admin_bert,
    }])
    .unwrap();
    assert!(db.insert_observed_profile(&old).unwrap());
    let bert = db.profiles(&["bert"], None).unwrap()["bert"].values[9].unwrap();
    assert!((bert - 20.0).abs() < 0.01, "ten weeks old, the admin's value is back: {bert}");
}

/// The re-audit's M2 at ingest: an observation that ends in the future is a clock step on its
/// node; it is quarantined with a reason that says so.
#[test]
fn an_observation_ending_in_the_future_is_refused_naming_the_clock() {
    let dir = TempDir::new("future");
    let (mut db, _) = Db::create(&dir.path().join("k.db")).unwrap();
    let spool = dir.path().join("spool");
    let q = dir.path().join("q");
    fs::create_dir_all(&spool).unwrap();
    let now =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    let mut ahead = obs("c/682/0", "682", "wa", None, 3.0);
    (ahead.start, ahead.end) = (now - 10.0, now + 86_400.0);
    let mut fine = obs("c/683/0", "683", "wa", None, 3.0);
    (fine.start, fine.end) = (now - 10.0, now);
    write_record(&spool, &ahead).unwrap();
    write_record(&spool, &fine).unwrap();
    let r = ingest(&mut db, &spool, &q).unwrap();
    assert_eq!((r.inserted, r.quarantined.len()), (1, 1));
    let reason = &r.quarantined[0].1;
    assert!(reason.contains("s after this host's clock"), "{reason}");
    assert!(reason.contains("clock of node \"n1\" was ahead"), "{reason}");
    // The re-audit's L10: a hidden file was never ingested and never reported. It is
    // reported at each ingest and left where it is (it may be NFS's or an admin's).
    fs::write(spool.join(".hidden.json"), "{}").unwrap();
    let r = ingest(&mut db, &spool, &q).unwrap();
    assert!(r.quarantined.is_empty(), "{r:?}");
    assert_eq!(r.hidden, vec![spool.join(".hidden.json")], "{r:?}");
    assert!(spool.join(".hidden.json").exists());
}

/// The re-audit's L9: the database was world-readable (0644), so any user read every decision
/// with sqlite3. `Db::create` makes it 0640; an existing file keeps its mode.
#[test]
fn a_new_database_is_not_world_readable() {
    use std::os::unix::fs::PermissionsExt;
    let dir = TempDir::new("mode");
    let path = dir.path().join("k.db");
    Db::create(&path).unwrap();
    let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode & 0o007, 0, "{mode:o}");
    assert_eq!(mode & 0o600, 0o600, "{mode:o}");
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
    Db::create(&path).unwrap();
    assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
}

/// Issue 33 item 3: a stored split chooser reads back whole; storing one makes it the only
/// active one; `deactivate_split_models` leaves none.
#[test]
fn split_choosers_are_stored_one_active_at_a_time() {
    use kace_selector::dataset::ThreadSplit;
    use kace_selector::splits::{FeatureSet, SplitModel};
    let t = TempDir::new("sql-split-models");
    let (mut db, _) = Db::create(&t.path().join("kace.db")).unwrap();
    assert_eq!(db.active_split_model().unwrap(), None);
    let model = SplitModel {
        candidates: vec![ThreadSplit { first: 100, second: 40 }, ThreadSplit::DEFAULT],
        features: FeatureSet::System,
        terms: vec![None, None],
        alpha: 1.0,
        margin: None,
        doubt_weight: 0.5,
    };
    let v1 = db.insert_split_model(&model, &serde_json::json!({"pairs": 3})).unwrap();
    let v2 = db
        .insert_split_model(&SplitModel { alpha: 3.0, ..model.clone() }, &serde_json::json!({}))
        .unwrap();
    let all = db.split_models(false).unwrap();
    assert_eq!(
        all.iter().map(|m| (m.version, m.active)).collect::<Vec<_>>(),
        [(v1, false), (v2, true)]
    );
    assert_eq!(all[0].model, model);
    assert_eq!(all[0].metrics["pairs"], 3);
    assert_eq!(db.active_split_model().unwrap().unwrap().model.alpha, 3.0);
    assert!(db.deactivate_split_models().unwrap());
    assert!(!db.deactivate_split_models().unwrap());
    assert_eq!(db.active_split_model().unwrap(), None);
}
