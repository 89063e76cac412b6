//! The re-audit's attacks that live on a node, end to end on a real Slurm cluster with the real
//! plugin, prolog, epilog and `kace-sampler` (issue "trust only what kace can check"):
//!
//! - M4: a job hard-links its progress file into a directory it may write and appends through
//!   the link; the sampler, running without NVML as on a node whose driver it cannot read,
//!   still caps the file its prolog created (by the inode the prolog recorded).

mod common;

use std::process::{Child, Command};
use std::time::Duration;

use common::{field, kace};
use kace_e2e::{kace as setup, Cluster, NodeSpec};

/// `kace-sampler`, stopped when dropped.
struct Sampler(Child);

impl Drop for Sampler {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Appends progress lines to the file named by its argument as fast as it can for 6 s (about
/// 20 MB here; the re-audit wrote 40 MB/s), then prints how many.
const APPEND: &str = "import sys, time\n\
f = open(sys.argv[1], 'a')\n\
t0 = time.time()\n\
n = 0\n\
while time.time() - t0 < 6:\n    \
f.write(''.join(f'{time.time():.6f} {n + i}\\n' for i in range(2000)))\n    \
f.flush()\n    \
n += 2000\n    \
time.sleep(0.01)\n\
print('LINES', n)\n";

/// The cap in these tests: the smallest `sampler.progress_max_bytes` allows.
const CAP: u64 = 65_536;

#[test]
#[ignore = "needs root and Slurm"]
fn a_hard_linked_progress_file_is_capped_by_a_sampler_without_nvml() {
    kace_e2e::require_e2e("a_hard_linked_progress_file_is_capped_by_a_sampler_without_nvml");
    let c = Cluster::builder()
        .nodes(vec![NodeSpec::new("n1", 1)])
        .plugin_args("mps_root={dir}/mps progress_root={dir}/progress")
        .prolog(setup::hook("kace-prolog", "").unwrap())
        .epilog(setup::hook("kace-epilog", "").unwrap())
        .prolog_slurmctld(setup::hook("kace-dispatch", "").unwrap())
        .epilog_slurmctld(setup::hook("kace-dispatch", "").unwrap())
        .start()
        .unwrap();
    let dir = c.dir().to_path_buf();
    common::prepare(&c, 1);
    let conf = dir.join("etc/kace.conf");
    let mut text = std::fs::read_to_string(&conf).unwrap();
    text.push_str(&format!(
        "[sampler]\ndir = \"{}/samples\"\ninterval_ms = 200\ncapacity = 100\n\
         progress_max_bytes = {CAP}\n",
        dir.display()
    ));
    std::fs::write(&conf, text).unwrap();
    // A directory anyone may write, on the progress root's file system (as /tmp is on many
    // nodes): where the job puts its second link.
    let public = dir.join("public");
    std::fs::create_dir_all(&public).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&public, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let log = dir.join("log/kace-sampler.log");
    // No KACE_FAKE_NVML: this machine has no NVML, so the sampler only caps.
    let _sampler = Sampler(
        Command::new(setup::bin_dir().unwrap().join("kace-sampler"))
            .args(["--config", conf.to_str().unwrap()])
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );

    let (lead_w, _) = common::lead_with_candidates(&dir.join("kace.db"), 1);
    // Appends through the link ([`APPEND`]; the rate only changes how far past the cap one
    // interval's lines go), then reports the file's disk use and links as the job sees them.
    let script = format!(
        "ln \"$KACE_PROGRESS_FILE\" {pub}/link-$SLURM_JOB_ID || exit 3\n\
         python3 - {pub}/link-$SLURM_JOB_ID <<'EOF'\n{APPEND}EOF\n\
         sleep 1\n\
         echo LINKS=$(stat -c %h \"$KACE_PROGRESS_FILE\") BLOCKS=$(stat -c %b \"$KACE_PROGRESS_FILE\")\n",
        pub = public.display()
    );
    let opt = format!("--kace-colocate={lead_w}");
    let id = c.sbatch(&[&opt, "--gres=shard:1", "--wrap", &script]).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        let j = c.job(id).unwrap();
        if !matches!(field(&j, "JobState"), "PENDING" | "RUNNING" | "CONFIGURING" | "COMPLETING") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "job {id} did not end");
        kace(&c, &["dispatch"]);
        std::thread::sleep(Duration::from_millis(500));
    }
    let out = c.job_output(id);
    assert_eq!(field(&c.job(id).unwrap(), "JobState"), "COMPLETED", "{out}");
    let lines: u64 = out
        .lines()
        .find_map(|l| l.strip_prefix("LINES "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no line count: {out}"));
    let blocks: u64 = out
        .lines()
        .find_map(|l| l.split("BLOCKS=").nth(1))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no block count: {out}"));
    assert!(out.contains("LINKS=2"), "the job's link was made: {out}");
    // The job wrote at least 20 bytes a line; what stays on disk (512-byte blocks, which a
    // punched hole frees on file systems that cannot collapse) is the cap plus what the
    // last interval appended, far below what was written.
    let written = lines * 20;
    let on_disk = blocks * 512;
    assert!(written > 4 << 20, "the job wrote too little to test the cap: {written}");
    assert!(on_disk < 1 << 20, "{on_disk} bytes on disk after {written} written: {out}");
    let sampler_log = std::fs::read_to_string(&log).unwrap();
    assert!(sampler_log.contains("capping progress files only"), "{sampler_log}");
    assert!(sampler_log.contains(&format!("job {id}: compacted")), "{sampler_log}");
    assert!(!sampler_log.contains("couldn't cap"), "{sampler_log}");
    // The epilog removed the file and its recorded identity; the job's own link remains
    // (the user's, in the user's directory).
    assert!(!dir.join(format!("progress/{id}.progress")).exists());
    assert!(!dir.join(format!("progress/{id}.progress.id")).exists());
    assert!(public.join(format!("link-{id}")).exists());
}
