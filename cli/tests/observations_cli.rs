//! `kace observations`, `kace retrain` and `kace db check` against poisoned and repeated data,
//! through the built binary on the demo's synthetic data (packaging/demo): implausible imports
//! are refused with the reason, bad observations can be quarantined or removed, and a retrain
//! on unchanged data stores no new model version.

use std::fs;
use std::path::PathBuf;

mod common;
use common::Env;

fn env(tag: &str) -> Env {
    Env::new(&format!("obs-cli-{tag}"), false)
}

impl Env {
    /// A database with the demo's profiles and pairs, and model version 1 trained on them.
    fn demo(&self) {
        let demo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../packaging/demo");
        self.ok(&["db", "init"]);
        self.ok(&["profile", "import", demo.join("profiles.csv").to_str().unwrap()]);
        self.ok(&["observations", "import", demo.join("pairs.csv").to_str().unwrap()]);
        self.ok(&["train"]);
    }

    fn model_count(&self) -> usize {
        let v: serde_json::Value =
            serde_json::from_str(&self.ok(&["--format", "json", "model", "list"])).unwrap();
        v.as_array().unwrap().len()
    }
}

fn pair(key: &str, job: &str, partner: &str, thr: f64) -> serde_json::Value {
    serde_json::json!({
        "key": key, "job": job, "workload": "resnet50-train",
        "partners": [{"job": partner, "workload": "resnet50-train"}],
        "node": "n9", "gpu": "0", "start": 1000.0, "end": 1010.0, "throughput": thr,
    })
}

/// The audit's 20 pairs at 1e308 through `observations import`: stored, then a retrain
/// activated a model with held-out MSE inf.
#[test]
fn poisoned_imports_are_refused_and_stored_ones_can_be_taken_out() {
    let e = env("poison");
    e.demo();
    let poison = e.dir.join("poison.json");
    let items: Vec<_> = (0..20)
        .flat_map(|i| {
            let (a, b) = (format!("p{i}a"), format!("p{i}b"));
            [pair(&format!("x/{a}"), &a, &b, 1e308), pair(&format!("x/{b}"), &b, &a, 1e308)]
        })
        .collect();
    fs::write(&poison, serde_json::to_vec(&items).unwrap()).unwrap();
    let out = e.run(&["observations", "import", poison.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("more than 4 times resnet50-train's exclusive throughput"), "{err}");

    // A plausible pair from node n9 is stored; an admin takes it out again by node, then by job.
    let fine = e.dir.join("fine.json");
    let items = vec![pair("y/1", "j1", "j2", 6.0), pair("y/2", "j2", "j1", 6.5)];
    fs::write(&fine, serde_json::to_vec(&items).unwrap()).unwrap();
    e.ok(&["observations", "import", fine.to_str().unwrap()]);
    let before = e.ok(&["observations", "list", "--limit", "0"]);
    assert!(before.contains("; 0 quarantined"), "{before}");
    let out = e.ok(&["observations", "quarantine", "--node", "n9", "--reason", "suspect"]);
    assert_eq!(out.trim(), "quarantined 2 observation(s)");
    let after = e.ok(&["observations", "list", "--limit", "0"]);
    assert!(after.contains("; 2 quarantined"), "{after}");
    assert_eq!(e.ok(&["observations", "remove", "--job", "j1"]).trim(), "removed 1 observation(s)");
    // Naming nothing is a usage error, not "remove everything".
    assert_eq!(e.run(&["observations", "remove"]).status.code(), Some(2));
    e.ok(&["db", "check"]);
}

#[test]
fn retrain_on_unchanged_data_stores_no_new_version() {
    let e = env("unchanged");
    e.demo();
    assert_eq!(e.model_count(), 1);
    let out = e.ok(&["retrain"]);
    assert!(
        out.contains("model unchanged: the training data are unchanged since model version 1"),
        "{out}"
    );
    let out = e.ok(&["train"]);
    assert!(out.contains("model unchanged"), "{out}");
    assert_eq!(e.model_count(), 1);
    // New data: a new version.
    let more = e.dir.join("more.json");
    let items = vec![pair("z/1", "k1", "k2", 6.1), pair("z/2", "k2", "k1", 6.3)];
    fs::write(&more, serde_json::to_vec(&items).unwrap()).unwrap();
    e.ok(&["observations", "import", more.to_str().unwrap()]);
    e.ok(&["retrain"]);
    assert_eq!(e.model_count(), 2);
}

/// Importing the same profile file twice changes nothing, like `observations import`; a bad
/// file names itself, the line and the column, and stores nothing.
#[test]
fn profile_import_is_idempotent_and_names_file_line_and_column() {
    let e = env("profiles");
    e.ok(&["db", "init"]);
    let demo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../packaging/demo/profiles.csv");
    let first: serde_json::Value = serde_json::from_str(&e.ok(&[
        "--format",
        "json",
        "profile",
        "import",
        demo.to_str().unwrap(),
    ]))
    .unwrap();
    let again: serde_json::Value = serde_json::from_str(&e.ok(&[
        "--format",
        "json",
        "profile",
        "import",
        demo.to_str().unwrap(),
    ]))
    .unwrap();
    assert_eq!(first["already_stored"], 0);
    assert_eq!(again["stored"], 0, "{again}");
    assert_eq!(again["already_stored"], first["stored"], "{again}");

    let bad = e.dir.join("absurd.csv");
    fs::write(&bad, "workload,threads,sm_pct\nzz-fine,1000,10\nabsurd,1e308,10\n").unwrap();
    let out = e.run(&["profile", "import", bad.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("absurd.csv") && err.contains("line 3, column 2 (threads)"), "{err}");
    let listed = e.ok(&["profile", "list"]);
    assert!(!listed.contains("zz-fine"), "{listed}");
}

/// Two records with one key and different content in one import: the second was dropped
/// silently as "already stored".
#[test]
fn conflicting_duplicate_observations_are_refused() {
    let e = env("dup-obs");
    e.ok(&["db", "init"]);
    let f = e.dir.join("dup.json");
    let items = vec![pair("d/1", "a", "b", 5.0), pair("d/1", "a", "b", 7.0)];
    fs::write(&f, serde_json::to_vec(&items).unwrap()).unwrap();
    let out = e.run(&["observations", "import", f.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("observation key d/1 given twice, differently"), "{err}");
}

/// A colocation table cut off inside a quoted field imported its last row with a wrong value.
#[test]
fn a_cut_off_colocation_table_is_refused() {
    let e = env("cut-table");
    e.ok(&["db", "init"]);
    let demo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../packaging/demo/pairs.csv");
    let text = fs::read_to_string(demo).unwrap();
    let cut = e.dir.join("cut.csv");
    // Two rows, then a third cut off inside a quoted value.
    let mut body: String = text.lines().take(3).map(|l| format!("{l}\n")).collect();
    body.push_str("resnet50-train,vit-train,\"7.06");
    fs::write(&cut, body).unwrap();
    let out = e.run(&["observations", "import", cut.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("line 4, column 26: a quoted field is never closed"), "{err}");
}
