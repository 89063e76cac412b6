//! The kace SPANK plugin and the gate on a real Slurm cluster: the option, holds and marks, the
//! environment of prologs and tasks, hostile values, and daemon health after each case.
//!
//! All cases share one cluster (started by the first test, ~2 s). Jobs with valid input run on
//! n1, whose slurmd log must then hold no kace error; forged hostile values go to n2.

use std::process::Output;
use std::sync::Arc;
use std::time::Duration;

use kace_e2e::{Cluster, Hook};

const WAIT: Duration = Duration::from_secs(30);
/// The rule as the plugin and the gate state it.
const RULE: &str = "1 to 128 of A-Z a-z 0-9 . _ + -";

/// A hook script that records its environment in `<dir>/hooks/<jobid>.<name>.env`.
fn recorder(name: &str) -> Hook {
    Hook::Script(format!("/usr/bin/env > {{dir}}/hooks/$SLURM_JOB_ID.{name}.env\nexit 0"))
}

fn cluster(test: &str) -> Arc<Cluster> {
    kace_e2e::shared(test, || {
        Cluster::builder()
            .prolog(recorder("prolog"))
            .epilog(recorder("epilog"))
            .epilog_slurmctld(recorder("epilog_slurmctld"))
    })
}

/// The environment a recording hook saw for job `id`, waiting for it (EpilogSlurmctld runs
/// after the job is already reported complete).
fn hook_env(c: &Cluster, id: u32, hook: &str) -> String {
    let path = c.dir().join(format!("hooks/{id}.{hook}.env"));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match std::fs::read_to_string(&path) {
            Ok(text) if !text.is_empty() => return text,
            _ if std::time::Instant::now() >= deadline => {
                panic!("no {hook} environment for job {id} at {}", path.display())
            }
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// A batch script printing the variables the plugin sets for tasks.
const PRINT_ENV: &str = "echo PIPE=$CUDA_MPS_PIPE_DIRECTORY; echo LOG=$CUDA_MPS_LOG_DIRECTORY; \
                         echo PROGRESS=$KACE_PROGRESS_FILE; echo GPUS=$SLURM_JOB_GPUS";

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn field<'a>(job: &'a kace_e2e::JobInfo, key: &str) -> &'a str {
    job.get(key).map(String::as_str).unwrap_or("")
}

fn assert_daemons_up(c: &Cluster) {
    assert!(c.slurmctld_running(), "slurmctld died; log:\n{}", c.slurmctld_log());
    for n in ["n1", "n2"] {
        assert!(c.slurmd_running(n), "slurmd {n} died; log:\n{}", c.slurmd_log(n));
    }
}

/// `error:` lines mentioning kace in n1's slurmd log (which includes its slurmstepds).
fn kace_errors_on_n1(c: &Cluster) -> Vec<String> {
    c.slurmd_log("n1")
        .lines()
        .filter(|l| l.contains("error") && l.contains("kace:"))
        .map(str::to_string)
        .collect()
}

#[test]
#[ignore = "needs root and Slurm"]
fn sbatch_help_lists_the_option() {
    let c = cluster("sbatch_help_lists_the_option");
    let out = c.run_ok("sbatch", &["--help"]).unwrap();
    let line = out.lines().find(|l| l.contains("--kace-colocate")).unwrap_or_else(|| {
        panic!("sbatch --help has no --kace-colocate:\n{out}");
    });
    assert!(line.contains("[WORKLOAD]"), "{line}");
    let text = out.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(text.contains("WORKLOAD defaults to the job name"), "{out}");
}

#[test]
#[ignore = "needs root and Slurm"]
fn slurmd_logs_the_plugin_and_its_slurm_version_once() {
    let c = cluster("slurmd_logs_the_plugin_and_its_slurm_version_once");
    // "slurm 22.05.8"
    let version = c.run_ok("scontrol", &["-V"]).unwrap();
    let version = version.split_whitespace().nth(1).unwrap().to_string();
    for node in ["n1", "n2"] {
        let log = c.slurmd_log(node);
        let expected = format!(
            "kace: slurmd: plugin {} for Slurm {version}, mps_root=",
            env!("CARGO_PKG_VERSION")
        );
        assert_eq!(log.matches(&expected).count(), 1, "{node}: {expected:?} not once in:\n{log}");
    }
}

#[test]
#[ignore = "needs root and Slurm"]
fn valued_and_bare_forms_are_held_and_marked() {
    let c = cluster("valued_and_bare_forms_are_held_and_marked");
    let cases: [(&[&str], &str); 4] = [
        (&["--kace-colocate=bert-large_v1.5+amp"], "kace:bert-large_v1.5+amp"),
        (&["--kace-colocate", "-J", "resnet50"], "kace:resnet50"),
        // An empty value is the bare form.
        (&["--kace-colocate=", "-J", "lstm"], "kace:lstm"),
        // `--wrap` jobs are named "wrap".
        (&["--kace-colocate"], "kace:wrap"),
    ];
    for (args, mark) in cases {
        let mut full = args.to_vec();
        full.extend(["--gres=shard:1", "-w", "n1", "--wrap", "true"]);
        let id = c.sbatch(&full).unwrap_or_else(|e| panic!("{args:?}: {e}"));
        let job = c.job(id).unwrap();
        assert_eq!(field(&job, "JobState"), "PENDING", "{args:?}: {job:?}");
        assert_eq!(field(&job, "Reason"), "JobHeldUser", "{args:?}: {job:?}");
        assert_eq!(field(&job, "Priority"), "0", "{args:?}: {job:?}");
        assert_eq!(field(&job, "AdminComment"), mark, "{args:?}: {job:?}");
        c.run_ok("scancel", &[&id.to_string()]).unwrap();
    }
    assert_daemons_up(&c);
}

#[test]
#[ignore = "needs root and Slurm"]
fn a_plain_job_is_neither_held_nor_marked() {
    let c = cluster("a_plain_job_is_neither_held_nor_marked");
    let id = c.sbatch(&["--gres=shard:1", "-w", "n1", "--wrap", PRINT_ENV]).unwrap();
    let job = c.wait_done(id, WAIT).unwrap();
    assert_eq!(field(&job, "JobState"), "COMPLETED", "{job:?}");
    assert!(!field(&job, "AdminComment").starts_with("kace:"), "{job:?}");
    // Not a kace job: the plugin leaves its tasks alone.
    let out = c.job_output(id);
    assert!(out.contains("PIPE=\n") && out.contains("PROGRESS=\n"), "{out}");
    assert_daemons_up(&c);
}

#[test]
#[ignore = "needs root and Slurm"]
fn invalid_values_are_refused_with_the_rule() {
    let c = cluster("invalid_values_are_refused_with_the_rule");
    let long = format!("--kace-colocate={}", "x".repeat(129));
    let huge = format!("--kace-colocate={}", "y".repeat(100_000));
    let bad = [
        "--kace-colocate=a b",
        "--kace-colocate=../../etc/passwd",
        "--kace-colocate=$(id)",
        "--kace-colocate=a\nb",
        "--kace-colocate=\x01\x1b[31m",
        "--kace-colocate=caf\u{e9}",
        long.as_str(),
        huge.as_str(),
    ];
    for arg in bad {
        let out = c.run("sbatch", &[arg, "--gres=shard:1", "--wrap", "true"]).unwrap();
        let err = stderr(&out);
        assert!(!out.status.success(), "{arg:?} was accepted: {err}");
        assert!(err.contains("kace: option: couldn't accept workload"), "{arg:?}: {err}");
        assert!(err.contains(RULE), "{arg:?}: {err}");
        // sbatch itself echoes the raw argument ("Invalid --kace-colocate argument"); the
        // plugin's own message must not.
        let ours = err.lines().find(|l| l.contains("kace: option:")).unwrap_or_default();
        assert!(
            !ours.chars().any(char::is_control),
            "{arg:?}: control characters echoed: {ours:?}"
        );
    }
    // srun (local context) refuses too, before asking for an allocation.
    let out = c.run("srun", &["--kace-colocate=a;b", "true"]).unwrap();
    assert!(!out.status.success(), "srun accepted a bad value");
    assert!(
        stderr(&out).contains("kace: option: couldn't accept workload \"a;b\""),
        "{}",
        stderr(&out)
    );
    // The bare form with a job name that is no workload name: the gate refuses it.
    let out = c.run("sbatch", &["--kace-colocate", "-J", "my job", "--wrap", "true"]).unwrap();
    let err = stderr(&out);
    assert!(!out.status.success(), "accepted: {err}");
    assert!(err.contains("couldn't accept workload \"my job\" (the job name)"), "{err}");
    assert!(err.contains(RULE), "{err}");
    // Slurm's own job-name sanitising aside, nothing was queued.
    let queue = c.run_ok("squeue", &["-h", "-n", "my job", "-o", "%i"]).unwrap();
    assert!(queue.trim().is_empty(), "{queue}");
    assert_daemons_up(&c);
}

#[test]
#[ignore = "needs root and Slurm"]
fn null_literal_is_the_bare_form() {
    let c = cluster("null_literal_is_the_bare_form");
    let args = ["--kace-colocate=(null)", "-J", "nulljob", "--gres=shard:1", "--wrap", "true"];
    let id = c.sbatch(&args).unwrap();
    let job = c.job(id).unwrap();
    assert_eq!(field(&job, "AdminComment"), "kace:nulljob", "{job:?}");
    c.run_ok("scancel", &[&id.to_string()]).unwrap();
    assert_daemons_up(&c);
}

/// A kace job released by root runs; its Prolog, Epilog and EpilogSlurmctld see
/// SPANK_KACE_COLOCATE (empty for the bare form: the gate resolved the job name into
/// AdminComment), its tasks the MPS and progress variables; n1's slurmd log has no kace error.
#[test]
#[ignore = "needs root and Slurm"]
fn released_kace_job_gets_prolog_and_task_environment() {
    let c = cluster("released_kace_job_gets_prolog_and_task_environment");
    let dir = c.dir().display().to_string();
    for (option, spank_value) in [("--kace-colocate=bert", "bert"), ("--kace-colocate", "")] {
        let args = [option, "-J", "envjob", "--gres=shard:1", "-w", "n1", "--wrap", PRINT_ENV];
        let id = c.sbatch(&args).unwrap();
        c.run_ok("scontrol", &["release", &id.to_string()]).unwrap();
        let job = c.wait_done(id, WAIT).unwrap();
        assert_eq!(field(&job, "JobState"), "COMPLETED", "{option}: {job:?}");

        let line = format!("SPANK_KACE_COLOCATE={spank_value}\n");
        for hook in ["prolog", "epilog", "epilog_slurmctld"] {
            let env = hook_env(&c, id, hook);
            assert!(env.contains(&line), "{option}: {hook} env lacks {line:?}:\n{env}");
        }

        let out = c.job_output(id);
        assert!(out.contains(&format!("PIPE={dir}/mps/0/pipe\n")), "{option}: {out}");
        assert!(out.contains(&format!("LOG={dir}/mps/0/log\n")), "{option}: {out}");
        assert!(
            out.contains(&format!("PROGRESS={dir}/progress/{id}.progress\n")),
            "{option}: {out}"
        );
    }
    assert_daemons_up(&c);
    let errors = kace_errors_on_n1(&c);
    assert!(errors.is_empty(), "kace errors in n1's slurmd log: {errors:#?}");
}

/// The memory guard's limit is the job's: the batch step (one task) gets the whole limit the
/// prolog wrote, a step of two tasks half each, so two processes on the GPU stay within it
/// (`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` bounds each process; layout::memory_limit). The SM share
/// the decider chose (`mps.sm_split`) reaches every task unchanged (a fraction per client, not
/// divided; layout::thread_share); another job's malformed share file is refused and that job
/// runs without one. Here the test writes the files itself, as kace's prolog would (this
/// suite's prolog records only).
#[test]
#[ignore = "needs root and Slurm"]
fn the_memory_limit_and_the_sm_share_reach_the_tasks_of_a_step() {
    let c = cluster("the_memory_limit_and_the_sm_share_reach_the_tasks_of_a_step");
    let script = "echo BATCH=$CUDA_MPS_PINNED_DEVICE_MEM_LIMIT SM=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE\n\
                  srun -n 2 bash -c 'echo TASK$SLURM_LOCALID=$CUDA_MPS_PINNED_DEVICE_MEM_LIMIT SM=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE'\n\
                  srun -n 1 bash -c 'echo ONE=$CUDA_MPS_PINNED_DEVICE_MEM_LIMIT'";
    let args = ["--kace-colocate=bert", "-n", "2", "--gres=shard:1", "-w", "n1", "--wrap", script];
    let id = c.sbatch(&args).unwrap();
    let file = c.dir().join(format!("progress/{id}.memlimit"));
    std::fs::write(&file, "0=3381M\n").unwrap();
    let share = c.dir().join(format!("progress/{id}.smshare"));
    std::fs::write(&share, "40\n").unwrap();
    let unshared_script = "echo SM=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE";
    let args = ["--kace-colocate=bert", "--gres=shard:1", "-w", "n1", "--wrap", unshared_script];
    let unshared = c.sbatch(&args).unwrap();
    let bad = c.dir().join(format!("progress/{unshared}.smshare"));
    std::fs::write(&bad, "100\n").unwrap();
    for j in [id, unshared] {
        c.run_ok("scontrol", &["release", &j.to_string()]).unwrap();
    }
    let job = c.wait_done(id, WAIT).unwrap();
    let out = c.job_output(id);
    assert_eq!(field(&job, "JobState"), "COMPLETED", "{job:?}\n{out}");
    // 3381 / 2 = 1690.5, rounded down: the two shares add up to no more than the job's limit.
    for line in
        ["BATCH=0=3381M SM=40\n", "TASK0=0=1690M SM=40\n", "TASK1=0=1690M SM=40\n", "ONE=0=3381M\n"]
    {
        assert!(out.contains(line), "no {line:?} in the job's output:\n{out}");
    }
    let job = c.wait_done(unshared, WAIT).unwrap();
    let out = c.job_output(unshared);
    assert_eq!(field(&job, "JobState"), "COMPLETED", "{job:?}\n{out}");
    assert!(out.contains("SM=\n"), "{out}");
    assert!(out.contains("couldn't read the SM share"), "{out}");
    for f in [&file, &share, &bad] {
        let _ = std::fs::remove_file(f);
    }
    assert_daemons_up(&c);
    let errors: Vec<String> = kace_errors_on_n1(&c)
        .into_iter()
        .filter(|e| !e.contains("couldn't read the SM share"))
        .collect();
    assert!(errors.is_empty(), "kace errors in n1's slurmd log: {errors:#?}");
}

/// Values that bypass sbatch's check (a forged option variable in the job environment) reach the
/// plugin in slurmstepd: it logs them escaped and runs the job as a plain one; slurmd lives on.
#[test]
#[ignore = "needs root and Slurm"]
fn forged_hostile_values_in_slurmstepd_are_survived() {
    let c = cluster("forged_hostile_values_in_slurmstepd_are_survived");
    let dir = c.dir().display().to_string();
    let long = "z".repeat(100_000);
    // (value, whether slurmstepd takes it as the bare form and sets the task variables)
    let cases = [("\x02\x1b[2Jctl", false), (long.as_str(), false), ("", true), ("(null)", true)];
    for (value, bare) in cases {
        // slurmstepd reads a batch job's options from this variable of the job environment.
        let export = format!("--export=ALL,_SLURM_SPANK_OPTION_kace_kace_colocate={value}");
        let id = c.sbatch(&[&export, "--gres=shard:1", "-w", "n2", "--wrap", PRINT_ENV]).unwrap();
        let job = c.wait_done(id, WAIT).unwrap();
        let shown: String = value.chars().take(12).collect();
        assert_eq!(field(&job, "JobState"), "COMPLETED", "{shown:?}: {job:?}");
        let out = c.job_output(id);
        let pipe = if bare { format!("PIPE={dir}/mps/0/pipe\n") } else { "PIPE=\n".into() };
        assert!(out.contains(&pipe), "{shown:?}: {out}");
        assert_daemons_up(&c);
    }
    let log = c.slurmd_log("n2");
    assert!(
        log.contains(r#"couldn't accept workload "\x02\x1b[2Jctl": byte 0 is "\x02""#),
        "{log}"
    );
    assert!(log.contains("... (100000 bytes): it is 100000 bytes long"), "{log}");
    assert!(!log.contains("\x1b"), "a control character reached the log");
}

/// The gate's modify hook: the submitting user cannot release a kace hold; root can.
#[test]
#[ignore = "needs root and Slurm"]
fn only_root_releases_a_kace_job() {
    let c = cluster("only_root_releases_a_kace_job");
    const NOBODY: u32 = 65534;
    let as_nobody = |program: &str, args: &[&str]| {
        use std::os::unix::process::CommandExt;
        let mut cmd = c.command(program);
        cmd.uid(NOBODY).gid(NOBODY).env("HOME", "/nonexistent").args(args);
        cmd.output().unwrap()
    };
    let out_opt = format!("--output={}/out/%j.out", c.dir().display());
    let chdir = format!("--chdir={}/work", c.dir().display());
    let args = [
        "--parsable",
        &out_opt,
        &chdir,
        "--kace-colocate=userjob",
        "--gres=shard:1",
        "--wrap",
        "true",
    ];
    let sub = as_nobody("sbatch", &args);
    assert!(sub.status.success(), "nobody's sbatch failed: {}", stderr(&sub));
    let id = kace_e2e::parse_job_id(&String::from_utf8_lossy(&sub.stdout)).unwrap();
    let job = c.job(id).unwrap();
    assert_eq!(field(&job, "AdminComment"), "kace:userjob", "{job:?}");
    assert_eq!(field(&job, "Reason"), "JobHeldUser", "{job:?}");

    let rel = as_nobody("scontrol", &["release", &id.to_string()]);
    assert!(!rel.status.success(), "nobody released a kace job");
    assert!(stderr(&rel).contains("Access/permission denied"), "{}", stderr(&rel));
    let upd = as_nobody("scontrol", &["update", &format!("jobid={id}"), "AdminComment=kace:other"]);
    assert!(!upd.status.success(), "nobody changed the admin comment");
    // The user's own hold would look like the gate's (priority 0), which kace releases: refused.
    let hold = as_nobody("scontrol", &["hold", &id.to_string()]);
    assert!(!hold.status.success(), "nobody held a kace job");
    assert_eq!(field(&c.job(id).unwrap(), "Reason"), "JobHeldUser");
    // Updates kace could not honour: dropping the shard, excluding nodes.
    let job_arg = format!("jobid={id}");
    let refusals = [
        ("Gres=gpu:1", "must ask for a shard", format!("dropping the shard of kace job {id}")),
        ("ExcNodeList=n1", "--exclude", format!("excluding nodes from kace job {id}")),
    ];
    for (update, said, logged) in refusals {
        let upd = as_nobody("scontrol", &["update", &job_arg, update]);
        assert!(!upd.status.success(), "nobody's {update} was taken");
        // The user sees the gate's line where Slurm passes job_modify's log.user on (not
        // 22.05); the refusal is in slurmctld's log on every release.
        let seen = stderr(&upd).contains(said) || c.slurmctld_log().contains(&logged);
        assert!(seen, "{update}: {}", stderr(&upd));
    }
    let tres = field(&c.job(id).unwrap(), "TresPerNode").to_string();
    assert!(tres.contains("shard"), "{tres}");

    c.run_ok("scontrol", &["release", &id.to_string()]).unwrap();
    let job = c.wait_done(id, WAIT).unwrap();
    assert_eq!(field(&job, "JobState"), "COMPLETED", "{job:?}");
    assert_daemons_up(&c);
}

/// What kace cannot pair is refused at submission with a one-line reason, and nothing is queued:
/// a job array, a heterogeneous job, a job without a shard or with `shard:0`, and the user's own
/// `--hold`.
#[test]
#[ignore = "needs root and Slurm"]
fn the_gate_refuses_what_kace_cannot_pair() {
    let c = cluster("the_gate_refuses_what_kace_cannot_pair");
    let het = c.dir().join("work/het.sh");
    std::fs::write(&het, "#!/bin/bash\ntrue\n").unwrap();
    let het = het.display().to_string();
    let cases: [(&[&str], &str); 5] = [
        (
            &["--kace-colocate=bert", "--gres=shard:1", "--array=1-2", "--wrap", "true"],
            "couldn't accept --kace-colocate on a job array",
        ),
        (
            &["--kace-colocate=bert", "--gres=shard:1", ":", "--gres=shard:1", &het],
            "couldn't accept --kace-colocate on a heterogeneous job",
        ),
        (
            &["--kace-colocate=bert", "--wrap", "true"],
            "couldn't accept --kace-colocate without a shard",
        ),
        (
            &["--kace-colocate=bert", "--gres=shard:1", "--hold", "--wrap", "true"],
            "couldn't accept --hold with --kace-colocate",
        ),
        // The re-audit's L3: shard:0 was accepted, and dispatch "released" it onto a GPU.
        (
            &["--kace-colocate=bert", "--gres=shard:0", "--wrap", "true"],
            "couldn't accept --kace-colocate with --gres=shard:0",
        ),
    ];
    for (i, (args, reason)) in cases.into_iter().enumerate() {
        // Other tests share the cluster: look for this submission by its own name.
        let name = format!("refused-{i}");
        let mut full = vec!["-J", name.as_str()];
        full.extend_from_slice(args);
        let out = c.run("sbatch", &full).unwrap();
        let err = stderr(&out);
        assert!(!out.status.success(), "{args:?} was accepted: {err}");
        assert!(err.contains(reason), "{args:?}: {err}");
        let kace_lines: Vec<&str> = err.lines().filter(|l| l.contains("kace:")).collect();
        assert_eq!(kace_lines.len(), 1, "{args:?}: one line of reason: {err}");
        let queued = c.run_ok("squeue", &["-h", "-n", &name, "-o", "%i"]).unwrap();
        assert!(queued.trim().is_empty(), "{args:?} queued {queued}");
    }
    // The same shapes without --kace-colocate are Slurm's business, not kace's.
    let id = c.sbatch(&["--array=1-2", "--wrap", "true"]).unwrap();
    c.run_ok("scancel", &[&id.to_string()]).unwrap();
    assert_daemons_up(&c);
}
