//! A node with two typed fake GPUs (slurm-lab-2's setup for placing a partner on a given GPU):
//! the harness brings it up, and a kace job on the second GPU gets that GPU's MPS directories.

use std::time::Duration;

use kace_e2e::{Cluster, NodeSpec};

#[test]
#[ignore = "needs root and Slurm"]
fn kace_job_on_the_second_gpu_gets_its_mps_directories() {
    let test = "kace_job_on_the_second_gpu_gets_its_mps_directories";
    kace_e2e::require_e2e(test);
    let c = Cluster::builder()
        .nodes(vec![NodeSpec::new("n1", 2).shards_per_gpu(2), NodeSpec::new("n2", 1)])
        .typed_gpus(true)
        .start()
        .unwrap();
    let gres = c.run_ok("sinfo", &["-h", "-N", "-n", "n1", "-o", "%G"]).unwrap();
    assert_eq!(gres.trim(), "gpu:g0:1,gpu:g1:1,shard:g0:2,shard:g1:2");

    let script = "echo PIPE=$CUDA_MPS_PIPE_DIRECTORY; echo GPUS=$SLURM_JOB_GPUS";
    let args = ["--kace-colocate=bert", "--gres=shard:g1:1", "-w", "n1", "--wrap", script];
    let id = c.sbatch(&args).unwrap();
    c.run_ok("scontrol", &["release", &id.to_string()]).unwrap();
    let job = c.wait_done(id, Duration::from_secs(30)).unwrap();
    assert_eq!(job.get("JobState").map(String::as_str), Some("COMPLETED"), "{job:?}");
    let out = c.job_output(id);
    assert!(out.contains("GPUS=1\n"), "{out}");
    assert!(out.contains(&format!("PIPE={}/mps/1/pipe\n", c.dir().display())), "{out}");
}
