//! The database commands end to end through the built `kace` binary on temporary databases:
//! init → import the artifact's profiles and pairs → train → select (checked against the
//! selector in memory), ingest (re-run, two at once, quarantine), import-ncu on real exports,
//! profile run with the fake NVML backend, and clear errors on corrupt databases and configs.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kace_selector::dataset::read_colocations;
use kace_selector::{select, Candidate, LinearModel, Member, Model, Profile, SelectionRules};
use kace_sql::spool::{record_file_name, write_record};
use kace_sql::{Observation, Partner};
use kace_test_support::{artifact, shared_file, TempDir};

/// A temporary directory with an empty config file and a database path, removed on drop.
struct Env {
    dir: TempDir,
}

impl Env {
    fn new(tag: &str) -> Env {
        let dir = TempDir::new(&format!("db-cli-{tag}"));
        fs::write(dir.join("kace.conf"), "").unwrap();
        Env { dir }
    }

    fn db(&self) -> PathBuf {
        self.dir.join("kace.db")
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_kace"));
        c.env("KACE_CONFIG", self.dir.join("kace.conf"))
            .env_remove("KACE_FAKE_NVML")
            .arg("--db")
            .arg(self.db())
            .args(args);
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().expect("kace runs")
    }

    /// Runs and requires success, returning stdout.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "kace {args:?} failed ({:?}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut all = args.to_vec();
        all.extend(["--format", "json"]);
        serde_json::from_str(&self.ok(&all)).expect("valid JSON")
    }
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

const PAIRS: &str = "pairs/MPS100_kernel_labels_targetMPS100.csv";

/// Profiles read straight from the artifact's derived table, independently of kace-sql.
fn artifact_profiles(dir: &Path) -> HashMap<String, Profile> {
    let mut rdr =
        csv::Reader::from_path(dir.join("workload_profiles/derived_workload_profiles.csv"))
            .unwrap();
    let h = rdr.headers().unwrap().clone();
    let col = |n: &str| h.iter().position(|c| c == n).unwrap();
    let cols = [
        "Threads",
        "Compute (SM) Throughput",
        "DRAM Throughput",
        "Memory Throughput",
        "Registers",
        "Static Shared Memory",
        "Exclusive100",
        "sm%",
        "mem%",
        "memcap",
    ]
    .map(col);
    // Rows with empty cells (workloads without system metrics) have no complete profile.
    rdr.records()
        .filter_map(|r| {
            let r = r.unwrap();
            let f: Vec<f64> = cols.iter().filter_map(|&c| r[c].parse::<f64>().ok()).collect();
            let f: [f64; 10] = f.try_into().ok()?;
            Some((r[col("workload")].to_string(), Profile::new(f)))
        })
        .collect()
}

#[test]
#[ignore = "needs ../shared/data/kace-artifact"]
fn init_import_train_select_agrees_with_the_selector_in_memory() {
    let art = artifact();
    let env = Env::new("pipeline");
    env.ok(&["db", "init"]);
    let p = art.join("workload_profiles/derived_workload_profiles.csv");
    let imported = env.json(&["profile", "import", p.to_str().unwrap()]);
    assert_eq!(imported["stored"], 30);
    let pairs = art.join(PAIRS);
    let first = env.json(&["observations", "import", pairs.to_str().unwrap()]);
    assert_eq!((first["inserted"].as_u64(), first["duplicates"].as_u64()), (Some(362), Some(0)));
    let again = env.json(&["observations", "import", pairs.to_str().unwrap()]);
    assert_eq!((again["inserted"].as_u64(), again["duplicates"].as_u64()), (Some(0), Some(362)));

    let trained = env.json(&["train", "--kind", "linear"]);
    assert_eq!(trained["version"], 1);
    assert_eq!(trained["activated"], true);
    let m = &trained["metrics"];
    // Stored: refitted on all 181; validated: fitted on the rest of a held-out fifth.
    assert_eq!(m["fit_groups"].as_u64(), Some(181), "{m}");
    assert_eq!(m["validation_fit_groups"].as_u64(), Some(181 - 37), "{m}");
    assert_eq!(m["holdout_groups"].as_u64(), Some(37), "{m}");
    assert!(m["holdout_r2"].as_f64().unwrap() > 0.5, "{m}");

    // The stored model equals an in-memory fit on all the pairs.
    let table = read_colocations("pairs", fs::File::open(&pairs).unwrap()).unwrap();
    let stem = Path::new(PAIRS).file_stem().unwrap().to_string_lossy().into_owned();
    let mut order: Vec<usize> = (0..table.groups.len()).collect();
    order.sort_by_key(|r| format!("import/{stem}:r{r}:w1"));
    let x: Vec<[f64; 10]> = order.iter().map(|&i| table.groups[i].features()).collect();
    let y: Vec<f64> = order.iter().map(|&i| table.groups[i].total_throughput()).collect();
    let reference = LinearModel::fit(&x, &y).unwrap();
    let shown = env.json(&["model", "show"]);
    let stored: Model = serde_json::from_value(shown["body"].clone()).unwrap();
    let Model::Linear { model: ref stored_lr, .. } = stored else { panic!("a linear model") };
    for (a, b) in stored_lr.coefficients.iter().zip(&reference.coefficients) {
        assert!((a - b).abs() <= 1e-9 * b.abs().max(1.0), "{a} vs {b}");
    }

    // Every workload as lead, every other as candidate (plus an unknown one): the CLI's choice
    // and predictions equal the selector's on independently read profiles.
    let profiles = artifact_profiles(&art);
    let mut names: Vec<&String> = profiles.keys().collect();
    names.sort();
    let rules = SelectionRules { gpu_memory_gib: Some(32.0), ..SelectionRules::default() };
    let mut chosen_somewhere = 0;
    for lead in &names {
        let mut cands: Vec<&str> =
            names.iter().filter(|n| n != &lead).map(|s| s.as_str()).collect();
        cands.push("not-profiled");
        let out = env.json(&[
            "select",
            "--dry-run",
            "--lead",
            lead,
            "--candidates",
            &cands.join(","),
            "--gpu-memory",
            "32",
        ]);
        let in_mem: Vec<Candidate<'_>> = cands
            .iter()
            .map(|c| Candidate {
                profile: profiles.get(*c),
                workload: Some(c),
                same_user: true,
                may_explore: true,
            })
            .collect();
        let running = [Member { profile: &profiles[*lead], workload: Some(lead.as_str()) }];
        let expect = select(&running, &in_mem, &stored, &rules);
        let want = expect.chosen.map(|i| cands[i]);
        assert_eq!(out["chosen"].as_str(), want, "lead {lead}");
        let items = out["candidates"].as_array().unwrap();
        assert_eq!(items.len(), cands.len());
        for (item, v) in items.iter().zip(&expect.verdicts) {
            match v.prediction {
                // Bit-identical: profiles and model round-trip exactly through SQLite and JSON.
                Some(p) => assert_eq!(item["prediction"].as_f64().unwrap(), p),
                None => assert!(item["prediction"].is_null()),
            }
            assert_eq!(item["rejected"].is_null(), v.rejection.is_none());
        }
        assert_eq!(
            items.last().unwrap()["rejected"],
            "unknown profile (observed alone in 0 of the 1 runs needed)"
        );
        chosen_somewhere += usize::from(want.is_some());
    }
    assert!(chosen_somewhere > 0, "no lead got a partner");

    // Training again on the same data stores nothing (a nightly retrain would otherwise add a
    // version a night); --activate forces a new version; model activate switches back.
    let again = env.json(&["train", "--kind", "linear"]);
    assert_eq!(
        (again["version"].clone(), again["unchanged_since"].clone()),
        (serde_json::json!(null), serde_json::json!(1))
    );
    assert_eq!(env.json(&["train", "--kind", "linear", "--activate"])["activated"], true);
    env.ok(&["model", "activate", "1"]);
    assert_eq!(env.json(&["model", "show"])["version"], 1);
    let list = env.json(&["model", "list"]);
    assert_eq!(list.as_array().unwrap().len(), 2);
    let bad = env.run(&["model", "activate", "7"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(stderr(&bad).contains("couldn't find model version 7"), "{}", stderr(&bad));
    env.ok(&["db", "check"]);

    // The nightly retrain on an empty spool: nothing ingested, a third version trained on the
    // same data, not worse than the active one, so activated.
    let spool = env.dir.join("spool");
    fs::create_dir_all(&spool).unwrap();
    let q = env.dir.join("q");
    let out = env.ok(&[
        "retrain",
        "--spool",
        spool.to_str().unwrap(),
        "--quarantine",
        q.to_str().unwrap(),
    ]);
    assert!(out.contains("ingested 0 new observation(s)"), "{out}");
    assert!(out.contains("model version 3"), "{out}");
    assert_eq!(env.json(&["model", "show"])["version"], 3);
}

/// The default model kind (kace's slowdown model) through the whole database path: the
/// stored model predicts exactly what the in-memory one does, and `select --dry-run` chooses
/// what the selector chooses with it.
#[test]
#[ignore = "needs ../shared/data/kace-artifact"]
fn default_slowdown_model_trains_stores_and_selects() {
    let art = artifact();
    let env = Env::new("slowdown");
    env.ok(&["db", "init"]);
    let p = art.join("workload_profiles/derived_workload_profiles.csv");
    env.ok(&["profile", "import", p.to_str().unwrap()]);
    env.ok(&["observations", "import", art.join(PAIRS).to_str().unwrap()]);
    let trained = env.json(&["train"]);
    assert_eq!(trained["metrics"]["kind"], "slowdown");
    assert!(trained["metrics"]["holdout_r2"].as_f64().unwrap() > 0.5, "{trained}");
    let shown = env.json(&["model", "show"]);
    let stored: Model = serde_json::from_value(shown["body"].clone()).unwrap();
    let Model::Slowdown(ref sm) = stored else { panic!("a slowdown model: {shown}") };
    assert!(shown["kind"].as_str().unwrap().starts_with("slowdown/"), "{shown}");
    // The artifact's wav2vec2 batch-2 inference ran faster beside partners than its measured
    // exclusive throughput (ratios up to 2.6): its ceiling says so; most workloads' is 1.
    let w2v = "wav2vec2-base-960h_batch2-inf";
    assert!(sm.ceiling_of(Some(w2v)) > 2.0, "{:?}", sm.ceiling);
    assert_eq!(sm.ceiling_of(Some("albert-base-v2_batch2-train")), 1.0);
    // The table shows every workload's terms and ceiling, and each profile weight by role.
    let text = env.ok(&["model", "show"]);
    let row = text.lines().find(|l| l.starts_with(w2v)).unwrap_or_else(|| panic!("{text}"));
    assert_eq!(row.split_whitespace().count(), 4, "{row}");
    assert!(text.contains("own × partners") && text.contains("ceiling"), "{text}");
    assert_eq!(text.lines().filter(|l| l.starts_with("exclusive_throughput")).count(), 1);
    let shown_weight = text
        .lines()
        .find_map(|l| l.strip_prefix("new-workload weight (margin = weight × doubt): "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or_else(|| panic!("{text}"));
    assert!((shown_weight - sm.new_workload_weight).abs() < 1e-3, "{text}");

    let profiles = artifact_profiles(&art);
    let rules = SelectionRules { gpu_memory_gib: Some(32.0), ..SelectionRules::default() };
    let lead = "bert-base-cased_batch8-inf";
    let cands = [
        "vit-base-patch16-224_batch8-inf",
        "whisper-large-v2_batch2-inf",
        "albert-base-v2_batch8-train",
        "wav2vec2-base-960h_batch2-inf",
    ];
    let out = env.json(&[
        "select",
        "--dry-run",
        "--lead",
        lead,
        "--candidates",
        &cands.join(","),
        "--gpu-memory",
        "32",
    ]);
    let in_mem: Vec<Candidate<'_>> = cands
        .iter()
        .map(|c| Candidate {
            profile: profiles.get(*c),
            workload: Some(c),
            same_user: true,
            may_explore: true,
        })
        .collect();
    let running = [Member { profile: &profiles[lead], workload: Some(lead) }];
    let expect = select(&running, &in_mem, &stored, &rules);
    assert_eq!(out["chosen"].as_str(), expect.chosen.map(|i| cands[i]));
    for (item, v) in out["candidates"].as_array().unwrap().iter().zip(&expect.verdicts) {
        assert_eq!(item["prediction"].as_f64(), v.prediction);
    }

    // The chosen pair's jobs fail together on one server (issue 33 item 2): after ingest the
    // pair is blocked, the next choice is another candidate, `kace explain` tells each job's
    // user, and `kace pairs clear` pairs them again.
    let chosen = expect.chosen.map(|i| cands[i]).expect("a partner for bert");
    let select_args = [
        "select",
        "--dry-run",
        "--lead",
        lead,
        "--candidates",
        &cands.join(","),
        "--gpu-memory",
        "32",
    ];
    let spool = env.dir.join("spool");
    for (job, workload, other, other_w, end) in
        [("7", lead, "8", chosen, 1000.0), ("8", chosen, "7", lead, 1004.0)]
    {
        let f = kace_sql::failures::GpuFailure {
            key: kace_sql::spool::failure_key("c", job, "n1", 900.0),
            job: job.into(),
            workload: workload.into(),
            user: Some("ann".into()),
            node: "n1".into(),
            gpu: "0".into(),
            end,
            exit: "1:0".into(),
            partners: vec![kace_sql::Partner { job: other.into(), workload: other_w.into() }],
            // Job 8's epilog found the server's fault line in its log.
            mps_fatal_at: (job == "8").then_some(1003.5),
        };
        kace_sql::spool::write_failure(&spool, &f).unwrap();
    }
    let spool_arg = spool.to_str().unwrap();
    let ingested = env.json(&["ingest", "--spool", spool_arg, "--quarantine", spool_arg]);
    assert_eq!(ingested["failures"]["inserted"], 2, "{ingested}");
    let pairs = env.json(&["pairs"]);
    assert_eq!(pairs.as_array().map(Vec::len), Some(1), "{pairs}");
    let blocked = env.json(&select_args);
    assert_ne!(blocked["chosen"].as_str(), Some(chosen), "{blocked}");
    let refused = blocked["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["workload"] == chosen)
        .unwrap_or_else(|| panic!("{blocked}"));
    assert!(
        refused["rejected"].as_str().unwrap_or("").starts_with("failed together before"),
        "{refused}"
    );
    let told = env.ok(&["explain", "8"]);
    assert!(told.contains("job 7 failed with it") && told.contains("kace pairs clear"), "{told}");
    assert!(told.contains("the GPU's MPS server logged a fatal GPU error at"), "{told}");
    let told = env.ok(&["explain", "7"]);
    assert!(!told.contains("logged a fatal GPU error"), "only job 8's record saw it: {told}");
    let cleared = env.json(&["pairs", "clear", chosen, lead]);
    assert_eq!(cleared["was_blocked"], true, "{cleared}");
    assert_eq!(env.json(&["pairs"]), serde_json::json!([]));
    assert_eq!(env.json(&select_args)["chosen"].as_str(), Some(chosen));
}

/// Imported 3-way colocations train the slowdown model beside the pairs; the linear model,
/// whose summed features describe a pair, leaves them out and says so.
#[test]
#[ignore = "needs ../shared/data/kace-artifact"]
fn triples_train_the_slowdown_model_and_not_the_linear_one() {
    let art = artifact();
    let env = Env::new("triples");
    env.ok(&["db", "init"]);
    let p = art.join("workload_profiles/derived_workload_profiles.csv");
    env.ok(&["profile", "import", p.to_str().unwrap()]);
    env.ok(&["observations", "import", art.join(PAIRS).to_str().unwrap()]);
    let triples = art.join("multiinstance/total_labels_batch2-8_targetMPS100.csv");
    env.ok(&["observations", "import", triples.to_str().unwrap()]);
    let rows = fs::read_to_string(&triples).unwrap().lines().count() - 1;

    let m = &env.json(&["train"])["metrics"];
    assert_eq!(m["group_sizes"], serde_json::json!({"2": 181, "3": rows}), "{m}");
    let used = m["validation_fit_groups"].as_u64().unwrap() + m["holdout_groups"].as_u64().unwrap();
    assert_eq!(m["fit_groups"].as_u64(), Some(used), "{m}");
    assert_eq!((used, m["unused_groups"].as_u64()), (181 + rows as u64, Some(0)));
    assert!(m["holdout_r2"].as_f64().unwrap() > 0.5, "{m}");
    let Model::Slowdown(sm) =
        serde_json::from_value(env.json(&["model", "show"])["body"].clone()).unwrap()
    else {
        panic!("a slowdown model")
    };
    // A predicted triple stays within its members' ceilings.
    let profiles = artifact_profiles(&art);
    let names = [
        "bert-base-cased_batch2-inf",
        "vit-base-patch16-224_batch8-inf",
        "albert-base-v2_batch8-train",
    ];
    let members: Vec<Member<'_>> =
        names.iter().map(|n| Member { profile: &profiles[*n], workload: Some(n) }).collect();
    for (s, n) in sm.slowdowns(&members).iter().zip(names) {
        assert!(*s > 0.0 && *s <= sm.ceiling_of(Some(n)), "{n}: {s}");
    }

    let m = &env.json(&["train", "--kind", "linear"])["metrics"];
    assert_eq!(m["group_sizes"], serde_json::json!({"2": 181}), "{m}");
    assert_eq!(m["unused_groups"].as_u64(), Some(rows as u64), "{m}");
    let used = m["validation_fit_groups"].as_u64().unwrap() + m["holdout_groups"].as_u64().unwrap();
    assert_eq!((m["fit_groups"].as_u64(), used), (Some(181), 181));
}

#[test]
#[ignore = "needs ../shared/data/kace-artifact"]
fn baseline_labels_and_kernel_totals_merge_into_the_derived_profiles() {
    let art = artifact();
    let env = Env::new("merge");
    env.ok(&["db", "init"]);
    let wp = art.join("workload_profiles");
    // The kernel metrics (one file per workload) and the system metrics (one table) arrive
    // separately, as they would from ncu and from `kace profile run`.
    env.ok(&["profile", "import", wp.join("kernel_total_KACE").to_str().unwrap()]);
    env.ok(&["profile", "import", wp.join("baseline_labels.csv").to_str().unwrap()]);
    let list = env.json(&["profile", "list"]);
    let by_name: HashMap<String, &serde_json::Value> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["workload"].as_str().unwrap().to_string(), p))
        .collect();
    let derived = artifact_profiles(&art);
    assert!(derived.len() >= 21);
    let keys = [
        "threads",
        "sm_throughput",
        "dram_throughput",
        "memory_throughput",
        "registers",
        "static_shared_memory",
        "exclusive_throughput",
        "sm_pct",
        "mem_pct",
        "memcap_gib",
    ];
    for (name, p) in &derived {
        let got = by_name.get(name).unwrap_or_else(|| panic!("{name} not imported"));
        assert_eq!(got["complete"], true, "{name}");
        for (k, want) in keys.iter().zip(p.features) {
            let v = got["values"][k].as_f64().unwrap();
            assert!((v - want).abs() <= 1e-12 * want.abs().max(1.0), "{name} {k}: {v} vs {want}");
        }
    }
}

fn obs(i: usize) -> Observation {
    Observation {
        key: format!("cluster/{i}/0"),
        job: i.to_string(),
        workload: "wa".into(),
        partners: vec![Partner { job: format!("{}", i + 100_000), workload: "wb".into() }],
        node: "n1".into(),
        gpu: "0".into(),
        mps_share: None,
        start: 1.0,
        end: 2.0,
        steps: Some(10.0),
        throughput: 10.0,
        user: None,
        account: None,
        gpu_sm_pct: None,
        gpu_energy_j: None,
    }
}

fn count_observations(env: &Env) -> usize {
    env.json(&["observations", "list", "--limit", "0"])["total"].as_u64().unwrap() as usize
}

#[test]
fn ingest_is_idempotent_and_quarantines_a_truncated_file() {
    let env = Env::new("ingest");
    env.ok(&["db", "init"]);
    let m = env.json(&["db", "migrate"]);
    assert_eq!(m["from_version"], m["to_version"]);
    let spool = env.dir.join("spool");
    let quarantine = env.dir.join("quarantine");
    fs::create_dir_all(&spool).unwrap();
    for i in 0..20 {
        write_record(&spool, &obs(i)).unwrap();
    }
    let full = serde_json::to_string(&obs(99)).unwrap();
    let truncated = record_file_name("cluster/99/0");
    fs::write(spool.join(&truncated), &full[..full.len() - 20]).unwrap();
    let args = [
        "ingest",
        "--spool",
        spool.to_str().unwrap(),
        "--quarantine",
        quarantine.to_str().unwrap(),
    ];
    let r = env.json(&args);
    assert_eq!(r["inserted"], 20);
    assert_eq!(r["quarantined"].as_array().unwrap().len(), 1);
    assert!(quarantine.join(&truncated).exists());
    let reason = fs::read_to_string(quarantine.join(format!("{truncated}.reason"))).unwrap();
    assert!(reason.contains("not a valid observation record"), "{reason}");
    let r = env.json(&args);
    assert_eq!((r["inserted"].as_u64(), r["duplicates"].as_u64()), (Some(0), Some(0)));
    assert_eq!(count_observations(&env), 20);
    // A record delivered again (epilog retry after a crash) changes nothing.
    write_record(&spool, &obs(3)).unwrap();
    let r = env.json(&args);
    assert_eq!((r["inserted"].as_u64(), r["duplicates"].as_u64()), (Some(0), Some(1)));
    assert_eq!(count_observations(&env), 20);
    env.ok(&["db", "check"]);
}

#[test]
fn two_concurrent_ingests_store_every_record_once() {
    let env = Env::new("ingest2");
    env.ok(&["db", "init"]);
    let spool = env.dir.join("spool");
    let quarantine = env.dir.join("quarantine");
    fs::create_dir_all(&spool).unwrap();
    let n = 400;
    for i in 0..n {
        write_record(&spool, &obs(i)).unwrap();
    }
    let args = [
        "ingest",
        "--spool",
        spool.to_str().unwrap(),
        "--quarantine",
        quarantine.to_str().unwrap(),
        "--format",
        "json",
    ];
    let children: Vec<_> = (0..2)
        .map(|_| {
            env.cmd(&args)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut inserted = 0;
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        inserted += v["inserted"].as_u64().unwrap() as usize;
    }
    assert_eq!(inserted, n);
    assert_eq!(count_observations(&env), n);
    assert_eq!(fs::read_dir(&spool).unwrap().count(), 0);
}

#[test]
fn corrupt_missing_and_uninitialised_databases_are_clear_errors() {
    let env = Env::new("corrupt");
    // Missing.
    let out = env.run(&["select", "--dry-run", "--lead", "a", "--candidates", "b"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("kace db init"), "{}", stderr(&out));
    // An empty workload name is a usage error (the re-audit's L10), before the database.
    let out = env.run(&["select", "--dry-run", "--lead", "a", "--candidates", ","]);
    assert_ne!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("--candidates \",\": an empty workload name"),
        "{}",
        stderr(&out)
    );
    // Junk bytes where the database should be.
    fs::write(env.db(), vec![0x42u8; 4096]).unwrap();
    for args in [
        &["select", "--dry-run", "--lead", "a", "--candidates", "b"][..],
        &["db", "check"],
        &["ingest", "--spool", "/nonexistent"],
        &["profile", "list"],
        &["train"],
    ] {
        let out = env.run(args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(3), "{args:?}: {err}");
        assert!(err.starts_with("kace: "), "{err}");
        assert!(err.contains("not a valid kace database"), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    // A real database cut in half: check reports it (exit 3 or 4), never a panic.
    fs::remove_file(env.db()).unwrap();
    env.ok(&["db", "init"]);
    let spool = env.dir.join("spool");
    fs::create_dir_all(&spool).unwrap();
    for i in 0..300 {
        write_record(&spool, &obs(i)).unwrap();
    }
    env.ok(&[
        "ingest",
        "--spool",
        spool.to_str().unwrap(),
        "--quarantine",
        env.dir.join("q").to_str().unwrap(),
    ]);
    let mut bytes = fs::read(env.db()).unwrap();
    let mid = bytes.len() / 2;
    bytes.truncate(mid + 100);
    for b in &mut bytes[mid - 2048..mid] {
        *b = 0xee;
    }
    fs::write(env.db(), bytes).unwrap();
    let out = env.run(&["db", "check"]);
    assert!(matches!(out.status.code(), Some(3) | Some(4)), "{:?} {}", out.status, stderr(&out));
    assert!(!stderr(&out).contains("panicked"));
}

#[test]
fn bad_config_is_a_clear_error() {
    let env = Env::new("config");
    fs::write(env.dir.join("kace.conf"), "[database]\npth = \"x\"\n").unwrap();
    let out = env.run(&["db", "init"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.starts_with("kace: config: couldn't parse config"), "{err}");
    assert!(err.contains("pth"), "{err}");
    // The configured path is used when --db is absent.
    let env = Env::new("config2");
    let db = env.dir.join("from-config.db");
    fs::write(
        env.dir.join("kace.conf"),
        format!("[database]\npath = {:?}\n", db.to_str().unwrap()),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kace"))
        .env("KACE_CONFIG", env.dir.join("kace.conf"))
        .args(["db", "init"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(db.exists());
}

#[test]
#[ignore = "needs ../shared/data/ncu-samples"]
fn import_ncu_stores_kernel_metrics_and_names_missing_ones() {
    let env = Env::new("ncu");
    env.ok(&["db", "init"]);
    let f =
        shared_file("ncu-samples/ai4materials_cgcnn-torch_ncu2020.2_details_cmdline-metrics.csv");
    let v = env.json(&["profile", "import-ncu", "--workload", "cgcnn-inf", f.to_str().unwrap()]);
    assert_eq!(v["kernels"], 14);
    let shown = env.json(&["profile", "show", "cgcnn-inf"]);
    let sm = shown["values"]["sm_throughput"].as_f64().unwrap();
    assert!((sm - 16.247097).abs() < 1e-5, "{sm}");
    assert_eq!(shown["complete"], false);
    assert!(shown["values"]["memcap_gib"].is_null());

    let f = shared_file("ncu-samples/leleucas_bert-mha-torch_ncu2021.2_details_launchstats.csv");
    let out = env.run(&["profile", "import-ncu", "--workload", "bert-mha", f.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.starts_with("kace: profile: couldn't compute kernel metrics from"), "{err}");
    assert!(err.contains("\"DRAM Throughput\""), "{err}");
    // Only the one good import was stored.
    assert_eq!(env.json(&["profile", "list"]).as_array().unwrap().len(), 1);
}

#[test]
fn import_ncu_refuses_what_is_not_an_export() {
    let env = Env::new("ncu-bad");
    env.ok(&["db", "init"]);
    let bad = env.dir.join("bad.csv");
    fs::write(&bad, "this is not,an ncu export\n1,2\n").unwrap();
    let out = env.run(&["profile", "import-ncu", "--workload", "x", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("no CSV header starting with \"ID\""), "{}", stderr(&out));
    let out = env.run(&["profile", "import-ncu", "--workload", "bad name", bad.to_str().unwrap()]);
    assert!(stderr(&out).contains("invalid workload name"), "{}", stderr(&out));
    assert_eq!(env.json(&["profile", "list"]).as_array().unwrap().len(), 0);
}

/// A fake workload: writes progress lines quickly (no GPU), like a training loop would.
fn fake_workload(dir: &Path) -> PathBuf {
    let script = dir.join("fake-workload.sh");
    fs::write(
        &script,
        "#!/bin/sh\n\
         # Writes \"<unix-seconds> <steps-done>\" lines, 10 steps every 50 ms.\n\
         i=0\n\
         while [ $i -le 30 ]; do\n\
           echo \"$(date +%s.%N) $((i * 10))\" >> \"$KACE_PROGRESS_FILE\"\n\
           i=$((i + 1))\n\
           sleep 0.05\n\
         done\n",
    )
    .unwrap();
    script
}

/// The audit's F3: `kace profile run -- python train.py` measured nothing for an unmodified
/// PyTorch script, since the hook was not on its PYTHONPATH. The stand-in `torch`
/// (python/tests/stand_in) does what real PyTorch does where the hook touches it; the real one
/// is tested in node/tests/real_libraries.rs.
#[test]
fn profile_run_gives_an_unmodified_pytorch_script_the_progress_hook() {
    let env = Env::new("run-hook");
    env.ok(&["db", "init"]);
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let train = env.dir.path().join("train.py");
    fs::write(
        &train,
        "import time\nimport torch\nopt = torch.optim.Optimizer()\n\
         for _ in range(60):\n    time.sleep(0.01)\n    opt.step()\n",
    )
    .unwrap();
    let hook = repo.join("python/autohook");
    let profile = |extra: &[&str], workload: &str| {
        let mut args = vec!["-v", "profile", "run", "--workload", workload, "--warmup-steps", "5"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--interval-ms", "5", "--format", "json", "--"]);
        args.extend_from_slice(&["python3", train.to_str().unwrap()]);
        env.cmd(&args)
            .env("KACE_FAKE_NVML", "gpu=Fake V100;total_mib=32768;samples=40,20,2048")
            .env("KACE_PROGRESS_INTERVAL", "0.05")
            .env("PYTHONPATH", repo.join("python/tests/stand_in"))
            .output()
            .unwrap()
    };
    let out = profile(&["--python-hook", hook.to_str().unwrap()], "hooked");
    assert!(out.status.success(), "{}", stderr(&out));
    let shown = format!("progress hook {} on PYTHONPATH", hook.display());
    assert!(stderr(&out).contains(&shown), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // 60 steps 10 ms apart, plus Python's own time per step: below 100, well above 20 steps/s.
    let thr = v["exclusive_throughput"].as_f64().unwrap();
    assert!(thr > 20.0 && thr < 100.0, "{thr}");
    assert_eq!(v["progress_lines_skipped"], 0);

    // Without the hook the same script reports nothing, and that is what the error says.
    let out = profile(&["--no-python-hook"], "unhooked");
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("valid progress lines"), "{}", stderr(&out));
    // A hook directory without the hook is refused before anything runs.
    let out = profile(&["--python-hook", env.dir.path().to_str().unwrap()], "nohook");
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("no sitecustomize.py there"), "{}", stderr(&out));
}

#[test]
fn profile_run_with_the_fake_nvml_stores_system_metrics() {
    let env = Env::new("run");
    env.ok(&["db", "init"]);
    let script = fake_workload(env.dir.path());
    let out = env
        .cmd(&[
            "profile",
            "run",
            "--workload",
            "fake-train",
            "--warmup-steps",
            "10",
            "--interval-ms",
            "10",
            "--format",
            "json",
            "--",
            "sh",
            script.to_str().unwrap(),
        ])
        .env("KACE_FAKE_NVML", "gpu=Fake V100;total_mib=32768;samples=40,20,2048")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["gpu_model"], "Fake V100");
    assert_eq!(v["sm_pct"], 40.0);
    assert_eq!(v["mem_pct"], 20.0);
    assert_eq!(v["memcap_gib"], 2.0);
    // 10 steps per ~50 ms plus the time `date` and `sh` take: well above 50, below 200 steps/s.
    let thr = v["exclusive_throughput"].as_f64().unwrap();
    assert!(thr > 50.0 && thr < 200.0, "{thr}");
    let shown = env.json(&["profile", "show", "fake-train"]);
    assert_eq!(shown["gpu_model"], "Fake V100");
    assert_eq!(shown["values"]["sm_pct"], 40.0);

    // A GPU already in use is refused: the run would not be exclusive.
    let out = env
        .cmd(&["profile", "run", "--workload", "w2", "--", "sh", script.to_str().unwrap()])
        .env("KACE_FAKE_NVML", "busy=2;samples=1,1,1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("the GPU is not idle (2 compute process(es) running)"),
        "{}",
        stderr(&out)
    );

    // A workload that fails stores nothing and says so.
    let out = env
        .cmd(&["profile", "run", "--workload", "broken", "--", "sh", "-c", "exit 3"])
        .env("KACE_FAKE_NVML", "samples=1,1,1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("the workload failed"), "{}", stderr(&out));
    // A workload that never reports progress.
    let out = env
        .cmd(&[
            "profile",
            "run",
            "--workload",
            "silent",
            "--interval-ms",
            "5",
            "--",
            "sh",
            "-c",
            "sleep 0.1",
        ])
        .env("KACE_FAKE_NVML", "samples=1,1,1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("KACE_PROGRESS_FILE"), "{}", stderr(&out));
    // A launcher script that outlives --timeout-s: it and what it started are ended.
    let pid_file = env.dir.join("grandchild.pid");
    let launcher = format!("sleep 300 & echo $! > {}; wait", pid_file.display());
    let out = env
        .cmd(&["profile", "run", "--workload", "slow", "--timeout-s", "1", "--", "sh", "-c"])
        .arg(&launcher)
        .env("KACE_FAKE_NVML", "samples=1,1,1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("ran longer than"), "{}", stderr(&out));
    let pid = fs::read_to_string(&pid_file).unwrap().trim().to_string();
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat.rsplit(')').next().and_then(|r| r.split_whitespace().next());
    assert!(matches!(state, None | Some("Z") | Some("X")), "sleep {pid} still runs: {stat}");
    assert_eq!(env.json(&["profile", "list"]).as_array().unwrap().len(), 1);
}

#[test]
fn profile_run_with_the_real_backend_fails_clearly_without_a_driver() {
    let env = Env::new("nvml");
    env.ok(&["db", "init"]);
    let script = fake_workload(env.dir.path());
    let out = env.run(&["profile", "run", "--workload", "w", "--", "sh", script.to_str().unwrap()]);
    if out.status.success() {
        eprintln!("NVML is present here: the real backend ran");
        return;
    }
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        err.contains("couldn't initialise NVML") || err.contains("couldn't open the GPU"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn retrain_on_a_young_installation_succeeds_with_one_summary_line() {
    let env = Env::new("retrain");
    let spool = env.dir.join("spool");
    let q = env.dir.join("q");
    let args = ["retrain", "--spool", spool.to_str().unwrap(), "--quarantine", q.to_str().unwrap()];
    // No database: a real failure, with the database exit code.
    fs::create_dir_all(&spool).unwrap();
    assert_eq!(env.run(&args).status.code(), Some(3));

    env.ok(&["db", "init"]);
    for i in 0..3 {
        write_record(&spool, &obs(i)).unwrap();
    }
    // An abandoned write from long ago is pruned; a quarantined file from today is kept.
    let tmp = spool.join(".tmp.1.old.json");
    fs::write(&tmp, "{").unwrap();
    let long_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(40 * 86_400);
    fs::File::options().write(true).open(&tmp).unwrap().set_modified(long_ago).unwrap();
    fs::create_dir_all(&q).unwrap();
    fs::write(q.join("recent.json"), "x").unwrap();

    // Too few pairs to train is a normal night: exit 0, the reason in the one line.
    let out = env.ok(&args);
    assert_eq!(out.lines().count(), 1, "{out}");
    assert!(out.starts_with("retrain: ingested 3 new observation(s)"), "{out}");
    assert!(out.contains("model unchanged: 0 usable observed group(s)"), "{out}");
    assert!(out.contains("pruned 1 file(s) older than 30 days"), "{out}");
    assert!(!tmp.exists());
    assert!(q.join("recent.json").exists());
    assert_eq!(count_observations(&env), 3);

    let mut json_args = vec!["--format", "json"];
    json_args.extend(args);
    let out = env.ok(&json_args);
    assert_eq!(out.trim_end().lines().count(), 1, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["ingest"]["duplicates"], 0);
    assert_eq!(v["model"]["activated"], false);
    assert_eq!(v["model"]["needed_pairs"], 13);
    assert_eq!(v["pruned"], 0);
}

/// `kace profile show` tells where each value came from: kace's own observation of a job that
/// ran alone (spooled by the epilog, stored by `kace ingest`) or an admin's import, which wins.
#[test]
fn profile_show_names_each_values_source_and_admin_values_win() {
    let env = Env::new("sources");
    env.ok(&["db", "init"]);
    let spool = env.dir.join("spool");
    fs::create_dir_all(&spool).unwrap();
    let mut values = [None; kace_sql::FEATURE_COUNT];
    values[6..].copy_from_slice(&[Some(4.0), Some(40.0), Some(20.0), Some(3.0)]);
    let rec = kace_sql::ObservedProfile {
        key: kace_sql::spool::profile_key("c", "20", "n1", 2000.0),
        job: "20".into(),
        created_at: 2030.0,
        profile: kace_sql::NewProfile {
            workload: "onboarded".into(),
            gpu_model: "Fake".into(),
            source: kace_sql::OBSERVED_SOURCE.into(),
            values,
        },
        samples: 29,
        alone_seconds: 28.0,
        oom_limit_mib: None,
        user: None,
    };
    kace_sql::spool::write_profile(&spool, &rec).unwrap();
    let (s, q) = (spool.to_str().unwrap(), env.dir.join("q"));
    let out = env.ok(&["ingest", "--spool", s, "--quarantine", q.to_str().unwrap()]);
    assert!(out.contains("ingested 1 new profile measurement(s)"), "{out}");
    let shown = env.json(&["profile", "show", "onboarded"]);
    assert_eq!(shown["sources"]["sm_pct"], "observed");
    assert_eq!(shown["sources"]["threads"], serde_json::Value::Null);
    assert_eq!(shown["observed_alone_runs"], 1);
    assert_eq!(shown["observed_samples"], 29);
    let csv = env.dir.join("admin.csv");
    fs::write(&csv, "workload,sm_pct\nonboarded,55\n").unwrap();
    env.ok(&["profile", "import", csv.to_str().unwrap()]);
    let shown = env.json(&["profile", "show", "onboarded"]);
    assert_eq!(shown["values"]["sm_pct"], 55.0);
    assert_ne!(shown["sources"]["sm_pct"], "observed");
    assert_eq!(shown["sources"]["mem_pct"], "observed");
    let text = env.ok(&["profile", "show", "onboarded"]);
    assert!(text.contains("observed alone in 1 run(s) by kace"), "{text}");
    assert!(text.contains("source"), "{text}");
}

/// The stored model is refitted on every group it saw, so a later training compares it only on
/// the held-out groups observed since (`observations_upto`): none when nothing new came, some
/// after a second night's observations, and the summary line says which.
#[test]
fn retraining_compares_with_the_active_model_only_on_groups_it_has_not_seen() {
    let env = Env::new("fair-activation");
    let demo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../packaging/demo");
    env.ok(&["db", "init"]);
    env.ok(&["profile", "import", demo.join("profiles.csv").to_str().unwrap()]);
    env.ok(&["observations", "import", demo.join("pairs.csv").to_str().unwrap()]);
    let first = env.json(&["train"]);
    assert_eq!(first["activated"], true, "{first}");
    let m = &first["metrics"];
    // 28 pairs, two observations each; no active model to compare with.
    assert_eq!(m["observations_upto"], 56, "{first}");
    assert_eq!((m["compared_groups"].as_u64(), m["active_compared_mse"].as_f64()), (Some(0), None));

    // Forced again on the same data: the active model has seen every held-out group.
    let again = env.json(&["train", "--activate"]);
    assert_eq!(again["metrics"]["compared_groups"], 0, "{again}");
    let text = env.ok(&["train", "--activate"]);
    assert!(text.contains("had seen every held-out group: nothing to compare"), "{text}");

    // A second night: the same pairs observed again (new jobs, new keys). Repeats are merged
    // into their pair (issue 34): still 28 groups, each of which the active model has seen, so
    // they are compared in-sample with the stored model, not with the validation fit.
    let night = env.dir.join("night2.csv");
    fs::copy(demo.join("pairs.csv"), &night).unwrap();
    env.ok(&["observations", "import", night.to_str().unwrap()]);
    let next = env.json(&["train"]);
    let m = &next["metrics"];
    assert_eq!(m["observations_upto"], 112, "{next}");
    assert_eq!((m["observations"].as_u64(), m["distinct_groups"].as_u64()), (Some(56), Some(28)));
    assert!(m["train_wall_s"].as_f64().is_some_and(|s| s > 0.0), "{next}");
    let held = m["holdout_groups"].as_u64().unwrap();
    assert_eq!(m["compared_groups"], 0, "{next}");
    assert_eq!(m["seen_compared_groups"].as_u64(), Some(held), "{next}");
    // Every pair was imported twice: a trusted correction each.
    assert_eq!(m["corrections"]["corrected"], 28, "{next}");
    // Both nights are the admin's imports: all 56 groups are the trusted reference, and the
    // model is activated exactly when no rule refused it.
    assert_eq!(m["trusted_groups"], 56, "{next}");
    assert!(m["reference_mse"].as_f64().is_some(), "{next}");
    assert_eq!(next["activated"], m["refusal"].is_null(), "{next}");
}

/// The re-audit's H1 through the CLI: 20 forged pairs inside the 4× bound, spooled as the
/// epilog writes them by one (unknown) user. The store keeps 5 of them; since issue 34 they are
/// merged into one group apart from the admin's import of the same pair, get no correction
/// (one user), and the robust fit weighs them once: the retrained model is no worse on the
/// trusted reference, which is what the rule guards (before, 5 independent forged groups made
/// it 85× worse and it was refused).
#[test]
fn forged_spooled_pairs_do_not_move_the_model_on_the_trusted_reference() {
    let env = Env::new("poisoning");
    let demo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../packaging/demo");
    env.ok(&["db", "init"]);
    env.ok(&["profile", "import", demo.join("profiles.csv").to_str().unwrap()]);
    env.ok(&["observations", "import", demo.join("pairs.csv").to_str().unwrap()]);
    assert_eq!(env.json(&["train"])["activated"], true);
    let spool = env.dir.join("spool");
    fs::create_dir_all(&spool).unwrap();
    for i in 0..20 {
        // resnet50-train (exclusive 12) and unet-infer (20), each at 3.9× its exclusive.
        let (a, b) = (format!("{}", 100 + 2 * i), format!("{}", 101 + 2 * i));
        for (job, w, other, ow, thr) in [
            (&a, "resnet50-train", &b, "unet-infer", 46.8),
            (&b, "unet-infer", &a, "resnet50-train", 78.0),
        ] {
            let o = kace_sql::Observation {
                key: format!("c/{job}/1000/0"),
                job: job.clone(),
                workload: w.into(),
                partners: vec![kace_sql::Partner { job: other.clone(), workload: ow.into() }],
                node: "n1".into(),
                gpu: "0".into(),
                mps_share: None,
                start: 1000.0,
                end: 1100.0,
                steps: Some(thr * 100.0),
                throughput: thr,
                user: None,
                account: None,
                gpu_sm_pct: None,
                gpu_energy_j: None,
            };
            kace_sql::spool::write_record(&spool, &o).unwrap();
        }
    }
    let (s, q) = (spool.to_str().unwrap(), env.dir.join("q"));
    let out = env.ok(&["retrain", "--spool", s, "--quarantine", q.to_str().unwrap()]);
    assert!(out.contains("ingested 40 new observation(s)"), "{out}");
    assert!(out.contains("28 trusted group(s)"), "{out}");
    let models = env.json(&["model", "list"]);
    let newest = models.as_array().unwrap().iter().max_by_key(|m| m["version"].as_i64()).unwrap();
    let shown = env.json(&["model", "show", &newest["version"].to_string()]);
    let m = &shown["metrics"];
    assert_eq!((m["observations"].as_u64(), m["distinct_groups"].as_u64()), (Some(33), Some(29)));
    assert_eq!(m["capped_groups"], 15, "{shown}");
    assert_eq!(m["corrections"]["uncorroborated"], 1, "{shown}");
    let (new, old) =
        (m["reference_mse"].as_f64().unwrap(), m["active_reference_mse"].as_f64().unwrap());
    assert!(new <= old * 1.25, "trusted reference: {new} (new) vs {old} (active): {shown}");
}
