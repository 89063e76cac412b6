//! The automatic progress hook against the real PyTorch, Hugging Face transformers and Lightning
//! (from PyPI, in the venv `.ci/install-deps` makes), read back the way the epilog reads it:
//! `kace_profiling::progress::read`, then the exclusive throughput of one alone interval
//! (`kace_node::measure::alone_run`, what an observed profile stores). Each scenario is an
//! unmodified user script in `python/tests/real_libs/` that also times its own steps
//! (`own_timing.py`); the reader's rate must match the script's over the same steps.
//!
//! `cargo test -p kace-node --test real_libraries -- --ignored --nocapture` prints the table of
//! library × scenario → lines written, reader's and script's rates.

use std::path::{Path, PathBuf};
use std::process::Command;

use kace_node::epilog::{throughput_within, Segment};
use kace_node::measure::alone_run;
use kace_profiling::progress::{self, Progress};
use kace_test_support::{real_python, TempDir};

/// Warm-up steps dropped, as `profiling.warmup_steps` by default.
const WARMUP: u64 = 10;

/// The hook's interval between lines. Short enough that the quickest scenario (4 000 forwards of
/// a small encoder, under 3 s on the CI VM) writes tens of lines on a machine several times
/// faster: at 0.2 s a 400-forward run wrote 3 lines here and 2 on CI, too few to measure.
const INTERVAL_S: &str = "0.05";

/// Lines past the warm-up a run must write for its rate to mean something.
const MIN_STEADY_LINES: usize = 4;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize().unwrap()
}

/// What one run of a scenario left.
struct Run {
    progress: Progress,
    /// The script's own step times, one list per process that stepped.
    own: Vec<Vec<f64>>,
    status: Option<i32>,
    stderr: String,
}

/// Runs `script args` as a kace job's task would run it: the hook first on `PYTHONPATH`, the
/// progress file made beforehand (as the prolog does), rank 0 of a batch step.
fn run(dir: &Path, name: &str, args: &[&str], extra_env: &[(&str, &str)], times: u32) -> Run {
    let root = repo();
    let file = dir.join(format!("{name}.progress"));
    let own = dir.join(format!("{name}.own.json"));
    std::fs::write(&file, "").unwrap();
    let mut status = None;
    let mut stderr = String::new();
    for _ in 0..times {
        let out = Command::new(real_python())
            .arg(root.join("python/tests/real_libs").join(format!("{}.py", args[0])))
            .args(&args[1..])
            .env("KACE_PROGRESS_FILE", &file)
            .env("KACE_PROGRESS_INTERVAL", INTERVAL_S)
            .env("KACE_TEST_OWN_TIMES", &own)
            .env(
                "PYTHONPATH",
                format!(
                    "{}:{}",
                    root.join("python/autohook").display(),
                    root.join("python/tests/real_libs").display()
                ),
            )
            .env("SLURM_PROCID", "0")
            .env("HF_HUB_OFFLINE", "1")
            .env("TOKENIZERS_PARALLELISM", "false")
            .envs(extra_env.iter().copied())
            .env_remove("RANK")
            .env_remove("LOCAL_RANK")
            .output()
            .unwrap();
        status = out.status.code();
        stderr.push_str(&String::from_utf8_lossy(&out.stderr));
    }
    let own = std::fs::read_to_string(&own)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["times"].as_array().unwrap().iter().map(|t| t.as_f64().unwrap()).collect()
        })
        .collect();
    Run { progress: progress::read(&file).unwrap(), own, status, stderr }
}

/// The exclusive throughput the epilog would store for a job alone over the whole run.
fn epilog_rate(p: &Progress) -> f64 {
    let (first, last) = (p.points.first().unwrap(), p.points.last().unwrap());
    let seg = Segment { start: first.time, end: last.time, partners: Vec::new() };
    alone_run(&[seg], &[], &p.points, WARMUP, 1).throughput.expect("no throughput")
}

/// The script's own rate over the same steps as the reader's window (its first point past the
/// warm-up to its last point): step `k` ended at `own[k - 1]`.
fn own_rate(p: &Progress, own: &[f64]) -> f64 {
    let w = p.throughput(WARMUP).unwrap();
    let at = |steps: f64| own[steps as usize - 1];
    (w.to.steps - w.from.steps) / (at(w.to.steps) - at(w.from.steps))
}

/// Checks the run, adds its table row and returns the reader's rate against the script's.
fn check(rows: &mut Vec<String>, library: &str, scenario: &str, r: &Run) -> f64 {
    assert!(!r.stderr.contains("kace: progress"), "{scenario}: the hook complained: {}", r.stderr);
    assert_eq!(r.progress.skipped, 0, "{scenario}: lines refused");
    let steps: usize = r.own.iter().map(Vec::len).sum();
    assert_eq!(r.progress.points.last().unwrap().steps as usize, steps, "{scenario}");
    let steady = r.progress.points.iter().filter(|p| p.steps >= WARMUP as f64).count();
    assert!(
        steady >= MIN_STEADY_LINES,
        "{scenario}: {steady} lines past the warm-up at a {INTERVAL_S} s interval: the run is too \
         short to measure on this machine; give the scenario more steps"
    );
    let (reader, own) = (epilog_rate(&r.progress), own_rate(&r.progress, &r.own.concat()));
    rows.push(format!(
        "| {library} | {scenario} | {} | {reader:.1} | {own:.1} | {:+.2} % |",
        r.progress.points.len(),
        (reader / own - 1.0) * 100.0
    ));
    reader / own
}

fn versions() -> String {
    let out = Command::new(real_python())
        .args([
            "-c",
            "import sys, torch, transformers, lightning; print('Python', sys.version.split()[0], \
             '| torch', torch.__version__, '| transformers', transformers.__version__, \
             '| lightning', lightning.__version__)",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
#[ignore = "needs torch, transformers and lightning from PyPI (the venv .ci/install-deps makes; KACE_REAL_PYTHON)"]
fn the_hook_reports_real_pytorch_hugging_face_and_lightning_jobs() {
    let dir = TempDir::new("real-libs");
    let mut rows = vec![
        "| library | scenario | lines | reader steps/s | script's own steps/s | reader vs own |"
            .to_string(),
        "|---|---|---|---|---|---|".to_string(),
    ];
    // Over the same steps, the two clocks differ by the microseconds between the hook and the
    // script's own time.time(): 2 % is room for a loaded machine, not for a wrong count.
    let close = |ratio: f64, what: &str| {
        assert!((ratio - 1.0).abs() < 0.02, "{what}: reader / own = {ratio}");
    };
    let r = run(&dir, "plain", &["plain", "4000"], &[], 1);
    close(check(&mut rows, "torch", "plain loop, Adam", &r), "plain");

    // Work after the last step (here 3 s) is not counted as slow steps.
    let r = run(&dir, "tail", &["plain", "4000", "3"], &[], 1);
    close(check(&mut rows, "torch", "plain loop, then 3 s of other work", &r), "tail");

    // Two trainings in one job: the second continues the count.
    let r = run(&dir, "twice", &["plain", "4000"], &[], 2);
    assert_eq!(r.own.len(), 2);
    check(
        &mut rows,
        "torch",
        "two processes one after the other (whole run, the gap between them included)",
        &r,
    );
    for (i, own) in r.own.iter().enumerate() {
        let (a, b) = (own[0], own[own.len() - 1]);
        let (rate, _) = throughput_within(&r.progress.points, a, b, WARMUP).unwrap();
        let inside: Vec<_> =
            r.progress.points.iter().filter(|p| p.time >= a && p.time <= b).collect();
        let (s0, s1) = (inside[0].steps, inside[inside.len() - 1].steps);
        let base = if i == 0 { 0.0 } else { r.own[0].len() as f64 };
        let at = |s: f64| own[(s - base) as usize - 1];
        close(rate / ((s1 - s0) / (at(s1) - at(s0))), "each of two processes");
    }

    let r = run(&dir, "infer", &["infer", "4000"], &[("KACE_PROGRESS_AUTO", "forward")], 1);
    close(check(&mut rows, "torch", "inference, KACE_PROGRESS_AUTO=forward", &r), "infer");
    // Without the opt-in, an inference loop reports nothing (only optimizer steps count).
    let r = run(&dir, "infer-off", &["infer", "50"], &[], 1);
    assert!(r.progress.points.is_empty(), "{:?}", r.progress);

    let r = run(&dir, "spawn", &["spawn", "500"], &[], 1);
    assert_eq!(r.status, Some(0), "{}", r.stderr);
    assert_eq!(r.progress.skipped, 0, "two ranks wrote at once");
    let last = r.progress.points.last().unwrap().steps;
    // One rank writes; when it ends first, the other takes over and continues its count.
    assert!((500.0..=1000.0).contains(&last), "{last}");
    rows.push(format!(
        "| torch | mp.spawn, 2 ranks of 500 steps, no RANK | {} | one writer, last count {last} | | |",
        r.progress.points.len()
    ));

    let r = run(&dir, "oom", &["oom", "50"], &[], 1);
    assert_eq!(r.status, Some(1), "{}", r.stderr);
    assert!(r.stderr.contains("OutOfMemoryError"), "{}", r.stderr);
    assert!(r.progress.oom_at.is_some(), "no oom line: {:?}", r.progress);
    assert_eq!(r.progress.points.last().unwrap().steps, 50.0);
    rows.push(format!(
        "| torch | uncaught torch.OutOfMemoryError after 50 steps | {} + oom | exit 1 kept | | |",
        r.progress.points.len()
    ));

    let r = run(&dir, "hf", &["hf", "200"], &[], 1);
    close(check(&mut rows, "transformers", "Trainer.train", &r), "hf");
    let r = run(&dir, "hf-after", &["hf", "200", "after"], &[], 1);
    close(check(&mut rows, "transformers", "Trainer.train, save_model, evaluate", &r), "hf-after");

    let r = run(&dir, "lit", &["lit", "1000"], &[], 1);
    close(check(&mut rows, "lightning", "Trainer.fit", &r), "lit");

    eprintln!("{}\n{}", versions(), rows.join("\n"));
}
