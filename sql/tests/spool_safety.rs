//! The spool's hardening against the reliability audit: file modes, poison-pill decisions,
//! recurring job ids, oversized decisions, half-copied files and concurrent ingests.

use std::fs;
use std::os::unix::fs::PermissionsExt;

use kace_sql::spool::{ingest, ingest_decisions, write_decision, write_record, SpooledDecision};
use kace_sql::{Db, DecisionCandidate, NewDecision, Observation};
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
