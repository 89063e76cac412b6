//! `kace splits train|list|off` through the built binary: a chooser trained on sweeps with the
//! lead at 100 % is stored and made active; sweeps without such a split are refused with why;
//! `off` leaves none active.

use std::fmt::Write;

mod common;
use common::Env;

/// 12 workloads' system profiles (the artifact's baseline_labels.csv form) and a sweep with
/// the lead at 100 % and the joiner at 30, 50, 70 and 100: the pair does best with the joiner
/// at `1 − its SM % / 150` of the SMs.
fn data(e: &Env) -> (String, String) {
    let mut profiles = String::from("Type,Exclusive100,sm%,mem%,memcap\n");
    let ws: Vec<(String, f64, f64)> =
        (0..12).map(|i| (format!("w{i}"), 5.0 + 3.0 * i as f64, 10.0 + 7.5 * i as f64)).collect();
    for (w, excl, sm) in &ws {
        writeln!(profiles, "{w},{excl},{sm},{},{}", sm / 3.0, 1.0 + sm / 20.0).unwrap();
    }
    let shares = [30u8, 50, 70, 100];
    let mut sweep = String::from("workload1,workload2");
    for p in shares {
        write!(sweep, ",\"(LS100, BE{p})\"").unwrap();
    }
    sweep.push('\n');
    for (a, ea, _) in &ws {
        for (b, eb, sm) in &ws {
            if a == b {
                continue;
            }
            write!(sweep, "{a},{b}").unwrap();
            for p in shares {
                let d = f64::from(p) / 100.0 - (1.0 - sm / 150.0);
                let n = 1.2 - 1.5 * d * d;
                write!(sweep, ",\"({}, {})\"", ea * n / 2.0, eb * n / 2.0).unwrap();
            }
            sweep.push('\n');
        }
    }
    let (p, s) = (e.dir.join("profiles.csv"), e.dir.join("sweeps.csv"));
    std::fs::write(&p, profiles).unwrap();
    std::fs::write(&s, sweep).unwrap();
    (p.display().to_string(), s.display().to_string())
}

#[test]
fn a_chooser_trained_on_lead_at_100_sweeps_is_stored_active_and_can_be_turned_off() {
    let e = Env::new("splits-train", true);
    e.ok(&["db", "init"]);
    let (profiles, sweeps) = data(&e);
    let out = e.ok(&[
        "--format",
        "json",
        "splits",
        "train",
        "--sweeps",
        &sweeps,
        "--profiles",
        &profiles,
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["version"], 1, "{v}");
    assert_eq!(v["metrics"]["pairs"], 132, "{v}");
    assert_eq!(v["metrics"]["joiner_shares"], serde_json::json!([30, 50, 70]), "{v}");
    assert!(v["metrics"]["cv_worst_vs_default"].as_f64().unwrap() >= 0.99, "{v}");
    let out = e.ok(&["splits", "list"]);
    assert!(out.contains("mps.sm_split = false: the decider sets no share"), "{out}");
    let listed: serde_json::Value =
        serde_json::from_str(&e.ok(&["--format", "json", "splits"])).unwrap();
    assert_eq!(listed["choosers"][0]["active"], true, "{listed}");
    let db = kace_sql::Db::open_read_only(&e.dir.join("kace.db")).unwrap();
    assert!(db.active_split_model().unwrap().is_some());
    drop(db);
    assert!(e.ok(&["splits", "off"]).contains("no split chooser is active"));
    let db = kace_sql::Db::open_read_only(&e.dir.join("kace.db")).unwrap();
    assert!(db.active_split_model().unwrap().is_none());
}

#[test]
fn sweeps_without_a_joiner_only_split_are_refused_with_why() {
    let e = Env::new("splits-refused", true);
    e.ok(&["db", "init"]);
    let (profiles, _) = data(&e);
    let sweeps = e.dir.join("complementary.csv");
    std::fs::write(
        &sweeps,
        "workload1,workload2,\"(LS30, BE70)\",\"(LS100, BE100)\"\nw1,w2,\"(1, 2)\",\"(2, 3)\"\n",
    )
    .unwrap();
    let out = e.run(&[
        "splits",
        "train",
        "--sweeps",
        &sweeps.display().to_string(),
        "--profiles",
        &profiles,
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("lead at 100 %"), "{err}");
    let db = kace_sql::Db::open_read_only(&e.dir.join("kace.db")).unwrap();
    assert!(db.split_models(false).unwrap().is_empty());
}
