//! `kace status` and `kace explain` on a real cluster mid-run (two nodes with one fake GPU
//! each, the demo's profiles and model): one GPU shared by a lead and the partner its prolog
//! chose, one GPU open (a lead no held job fits beside), and two jobs still held. Both commands
//! are read as text and as JSON.

mod common;

use std::time::Duration;

use common::{decision, field, json, kace, worker};
use kace_e2e::{kace as setup, Cluster, NodeSpec};

/// Long enough that nothing is released by max_hold while the test looks.
const MAX_HOLD_S: u64 = 600;

fn demo(f: &str) -> String {
    kace_e2e::demo::data_dir().join(f).display().to_string()
}

#[test]
#[ignore = "needs root and Slurm"]
fn status_and_explain_show_a_shared_gpu_an_open_gpu_and_held_jobs() {
    let test = "status_and_explain_show_a_shared_gpu_an_open_gpu_and_held_jobs";
    kace_e2e::require_e2e(test);
    let c = Cluster::builder()
        .nodes(vec![NodeSpec::new("n1", 1), NodeSpec::new("n2", 1)])
        .prolog(setup::hook("kace-prolog", "").unwrap())
        .epilog(setup::hook("kace-epilog", "").unwrap())
        .prolog_slurmctld(setup::hook("kace-dispatch", "").unwrap())
        .epilog_slurmctld(setup::hook("kace-dispatch", "").unwrap())
        .start()
        .unwrap();
    let dir = c.dir().to_path_buf();
    std::fs::write(dir.join("etc/kace.conf"), setup::conf(&dir, MAX_HOLD_S)).unwrap();
    let fake = dir.join("fake-mps");
    std::fs::write(&fake, setup::fake_mps_script(&dir)).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    kace(&c, &["db", "init"]);
    kace(&c, &["profile", "import", &demo("profiles.csv")]);
    kace(&c, &["observations", "import", &demo("pairs.csv")]);
    kace(&c, &["train"]);

    let submit = |w: &str| {
        let opt = format!("--kace-colocate={w}");
        c.sbatch(&[&opt, "--gres=shard:1", "--wrap", &worker(90, 2)]).unwrap()
    };
    // A lead and the partner its prolog will choose (as in the demo: bert-infer beside
    // resnet50-train). n2 is drained meanwhile: dispatch releases one lead per free GPU.
    let node_state = |n: &str, st: &str| {
        let mut args = vec!["update".to_string(), format!("nodename={n}"), format!("state={st}")];
        if st == "drain" {
            args.push("reason=observe-test".into());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        c.run_ok("scontrol", &args).unwrap();
    };
    node_state("n2", "drain");
    let lead = submit("resnet50-train");
    let partner = submit("bert-infer");
    let out = kace(&c, &["dispatch"]);
    assert!(out.contains(&format!("released job {lead} as a lead")), "{out}");
    let running = |id: u32| {
        c.wait_job(id, "running", Duration::from_secs(30), |j| field(j, "JobState") == "RUNNING")
            .unwrap()
    };
    let lead_info = running(lead);
    let partner_info = running(partner);
    assert_eq!(field(&lead_info, "NodeList"), "n1");
    assert_eq!(field(&partner_info, "NodeList"), "n1");
    node_state("n2", "resume");
    // A lead nothing fits beside (24 GiB; the others need 12 and 9 of the 32), then two held.
    let big = submit("gpt2-finetune");
    let vit = submit("vit-train");
    let resnet = submit("resnet50-train");
    // The timer's dispatch, until Slurm shows n2 usable again.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let out = kace(&c, &["dispatch"]);
        if out.contains(&format!("released job {big} as a lead")) {
            break;
        }
        assert!(out.is_empty(), "dispatch released something else: {out}");
        let nodes = c.run_ok("sinfo", &["-h", "-N", "-O", "NodeList:|,StateLong:|"]).unwrap();
        assert!(std::time::Instant::now() < deadline, "n2 never took a lead: {nodes}");
        std::thread::sleep(Duration::from_millis(500));
    }
    let big_info = running(big);
    assert_ne!(field(&big_info, "NodeList"), field(&lead_info, "NodeList"));
    // Let the progress files gather a few lines.
    std::thread::sleep(Duration::from_secs(3));

    let text = kace(&c, &["status"]);
    eprintln!("$ kace status\n{text}");
    let s = json(&c, &["status"]);
    eprintln!("$ kace --format json status\n{}", serde_json::to_string_pretty(&s).unwrap());
    let gpus = s["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 2, "{s}");
    let on = |node: &str| gpus.iter().find(|g| g["node"] == node).unwrap();
    let shared = on(field(&lead_info, "NodeList"));
    assert_eq!(shared["state"], "full", "{shared}");
    let ids: Vec<u64> =
        shared["jobs"].as_array().unwrap().iter().map(|j| j["job"].as_u64().unwrap()).collect();
    assert_eq!(ids, vec![u64::from(lead), u64::from(partner)], "{shared}");
    assert_eq!(shared["jobs"][0]["with"][0], partner, "{shared}");
    assert_eq!(shared["jobs"][0]["workload"], "resnet50-train");
    assert!(shared["jobs"][0]["user"].as_str().is_some_and(|u| !u.is_empty()), "{shared}");
    assert!(shared["jobs"][0]["since"].as_f64().is_some(), "{shared}");
    // The slowdown model predicts each member; the progress files say what they do so far
    // (the worker writes 2 steps every 0.2 s: 10 steps/s).
    assert!(shared["predicted"].as_f64().is_some_and(|p| p > 0.0), "{shared}");
    for j in shared["jobs"].as_array().unwrap() {
        assert!(j["predicted_throughput"].as_f64().is_some_and(|p| p > 0.0), "{j}");
        let obs = j["observed_throughput"].as_f64().expect("observed so far");
        assert!((5.0..=12.0).contains(&obs), "{j}");
    }
    let open = on(field(&big_info, "NodeList"));
    assert_eq!(open["state"], "open", "{open}");
    assert_eq!(open["jobs"][0]["job"], big);
    assert!(open["jobs"][0]["with"].as_array().unwrap().is_empty());

    let held = s["held"].as_array().unwrap();
    let held_ids: Vec<u64> = held.iter().map(|h| h["job"].as_u64().unwrap()).collect();
    assert_eq!(held_ids, vec![u64::from(vit), u64::from(resnet)], "{s}");
    for h in held {
        let (sub, at) = (h["submitted"].as_f64().unwrap(), h["max_hold_at"].as_f64().unwrap());
        assert_eq!(at - sub, MAX_HOLD_S as f64);
        assert!(h["waited_s"].as_f64().is_some_and(|w| (0.0..120.0).contains(&w)), "{h}");
    }
    // vit-train and resnet50-train fit together (12 + 9 GiB): each held job's would-be partner
    // is the prolog's decision function's choice with the other as the only candidate.
    let db = kace_sql::Db::open_read_only(&dir.join("kace.db")).unwrap();
    let mut paired = 0;
    for (h, (me, other, other_id)) in held.iter().zip([
        ("vit-train", "resnet50-train".to_string(), resnet),
        ("resnet50-train", "vit-train".to_string(), vit),
    ]) {
        let d = decision(&db, me, &[&other]);
        let v = &d.selection.verdicts[0];
        match d.selection.chosen {
            Some(0) => {
                paired += 1;
                assert_eq!(h["would_pair_with"]["job"], other_id, "{h}");
                let p = h["would_pair_with"]["predicted"].as_f64().unwrap();
                assert!((p - v.prediction.unwrap()).abs() < 1e-9, "{h}");
                assert!(text.contains(&format!("job {other_id} ({other}), predicted")), "{text}");
            }
            _ => {
                assert!(h["would_pair_with"].is_null(), "{h}");
                let why = h["no_partner"].as_str().unwrap();
                let rejection = v.rejection.as_ref().map(|r| r.to_string()).unwrap_or_default();
                assert_eq!(why, format!("{other_id}: {rejection}"), "{h}");
                assert!(text.contains(&format!("none: {other_id}: ")), "{text}");
            }
        }
    }
    assert!(paired > 0, "neither held job would pair with the other: {s}");
    assert_eq!(s["model"]["version"], 1, "{s}");
    assert!(s["problems"].as_array().unwrap().is_empty(), "{s}");
    // The text says the same.
    assert!(text.contains("model: version 1 (slowdown"), "{text}");
    assert!(text.contains("), trained 20"), "{text}");
    assert!(
        text.contains("GPUs: 1 shared or full, 1 open, 0 free, 0 held by other jobs, 0 unusable"),
        "{text}"
    );
    assert!(text.contains("held kace jobs: 2"), "{text}");
    assert!(text.contains(" UTC ("), "dates in the text: {text}");

    // --user: someone else sees none of these jobs.
    let other = json(&c, &["status", "--user", "nobody-here"]);
    assert!(other["held"].as_array().unwrap().is_empty(), "{other}");
    assert!(other["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .all(|g| g["jobs"].as_array().unwrap().is_empty()));
    assert_eq!(on(field(&lead_info, "NodeList"))["jobs"].as_array().unwrap().len(), 2);

    // The metrics file, mid-run: the held jobs come from Slurm, the rest from the database.
    let textfile = dir.join("textfile");
    std::fs::create_dir_all(&textfile).unwrap();
    kace(&c, &["metrics", "--textfile", textfile.to_str().unwrap()]);
    let prom = std::fs::read_to_string(textfile.join("kace.prom")).unwrap();
    assert!(prom.contains("\nkace_held_jobs 2\n"), "{prom}");
    let oldest: f64 = prom
        .lines()
        .find_map(|l| l.strip_prefix("kace_oldest_hold_seconds "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no kace_oldest_hold_seconds: {prom}"));
    assert!((0.0..120.0).contains(&oldest), "{prom}");
    assert!(prom.contains("\nkace_model_version 1\n"), "{prom}");

    // explain asks Slurm: the partner was held briefly and released by the lead's choice.
    let e = kace(&c, &["explain", &partner.to_string()]);
    eprintln!("$ kace explain {partner}\n{e}");
    assert!(e.contains(&format!("job {partner} (kace job, workload bert-infer, user ")), "{e}");
    assert!(e.contains("RUNNING on n"), "{e}");
    assert!(e.contains(&format!("as the partner chosen by job {lead}")), "{e}");
    assert!(e.contains("submitted 20"), "{e}");
    let ej = json(&c, &["explain", &partner.to_string()]);
    eprintln!(
        "$ kace --format json explain {partner}\n{}",
        serde_json::to_string_pretty(&ej).unwrap()
    );
    let st = &ej["story"];
    assert_eq!(st["released"]["by"], "partner", "{ej}");
    assert_eq!(st["released"]["lead_job"], lead.to_string(), "{ej}");
    let (sub, start) =
        (st["slurm"]["submitted"].as_f64().unwrap(), st["slurm"]["started"].as_f64().unwrap());
    assert!(sub > 1.7e9 && start >= sub, "epoch seconds in JSON: {st}");
    assert!(st["held_s"].as_f64().is_some_and(|h| h < 60.0), "{st}");
    // A job still held: held so far, not released.
    let h = json(&c, &["explain", &vit.to_string()]);
    assert_eq!(h["story"]["slurm"]["state"], "PENDING", "{h}");
    assert!(h["story"]["released"].is_null(), "{h}");
    assert!(h["story"]["held_s"].as_f64().is_some(), "{h}");
    let ht = kace(&c, &["explain", &vit.to_string()]);
    assert!(ht.contains("PENDING") && ht.contains("held "), "{ht}");

    for id in [lead, partner, big, vit, resnet] {
        let _ = c.run("scancel", &[&id.to_string()]);
    }
}
