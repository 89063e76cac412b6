//! A real Slurm cluster on localhost for one test binary: slurmctld plus one `slurmd -N <node>`
//! per node, in a fresh directory, with fake GPUs, the kace plugin and gate. It starts and stops
//! only its own daemons, and removes its directory when dropped.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::thread::sleep;
use std::time::{Duration, Instant};

use crate::accounting::{self, AccountingPorts, MariaDbPaths};
use crate::conf::{self, Hooks, Layout, NodeSpec};
use crate::{plugin, sys, HarnessError, SlurmInstall};

const POLL: Duration = Duration::from_millis(50);

/// A prolog/epilog-type hook.
#[derive(Debug, Clone)]
pub enum Hook {
    /// An existing executable (e.g. a kace binary).
    Path(PathBuf),
    /// A bash script body, written into the cluster directory; `{dir}` in it is replaced by the
    /// cluster directory. It runs as root with no PATH and must exit 0 (else Slurm drains the node).
    Script(String),
}

/// Builds a [`Cluster`]; see [`Cluster::builder`].
#[derive(Debug, Clone)]
pub struct ClusterBuilder {
    nodes: Vec<NodeSpec>,
    typed: bool,
    plugin: bool,
    plugin_args: Option<String>,
    gate: Option<PathBuf>,
    prolog: Option<Hook>,
    epilog: Option<Hook>,
    prolog_slurmctld: Option<Hook>,
    epilog_slurmctld: Option<Hook>,
    extra: Vec<String>,
    accounting: Option<Vec<String>>,
}

impl ClusterBuilder {
    /// Replaces the nodes (default: `n1` and `n2`, one GPU with 4 shards each).
    pub fn nodes(mut self, nodes: Vec<NodeSpec>) -> Self {
        self.nodes = nodes;
        self
    }

    /// Typed GPUs and shards (`g0`, `g1`, ... per node), for placement on a given GPU.
    pub fn typed_gpus(mut self, typed: bool) -> Self {
        self.typed = typed;
        self
    }

    /// Load the kace SPANK plugin (default: yes).
    pub fn plugin(mut self, on: bool) -> Self {
        self.plugin = on;
        self
    }

    /// The plugin's plugstack.conf arguments (default: `mps_root=<dir>/mps
    /// progress_root=<dir>/progress`; `{dir}` is replaced by the cluster directory).
    pub fn plugin_args(mut self, args: &str) -> Self {
        self.plugin_args = Some(args.to_string());
        self
    }

    /// The job_submit.lua to use (default: the repository's `packaging/job_submit.lua`);
    /// `None` runs without a gate.
    pub fn gate(mut self, lua: Option<PathBuf>) -> Self {
        self.gate = lua;
        self
    }

    /// The slurmd `Prolog=`.
    pub fn prolog(mut self, hook: Hook) -> Self {
        self.prolog = Some(hook);
        self
    }

    /// The slurmd `Epilog=`.
    pub fn epilog(mut self, hook: Hook) -> Self {
        self.epilog = Some(hook);
        self
    }

    /// slurmctld's `PrologSlurmctld=`.
    pub fn prolog_slurmctld(mut self, hook: Hook) -> Self {
        self.prolog_slurmctld = Some(hook);
        self
    }

    /// slurmctld's `EpilogSlurmctld=`.
    pub fn epilog_slurmctld(mut self, hook: Hook) -> Self {
        self.epilog_slurmctld = Some(hook);
        self
    }

    /// An extra slurm.conf line.
    pub fn slurm_conf_line(mut self, line: &str) -> Self {
        self.extra.push(line.to_string());
        self
    }

    /// Accounting as a site runs it: a private MariaDB and slurmdbd, enforcing associations,
    /// limits and QOS ([`crate::accounting`]). `setup` are `sacctmgr -i` commands (one string
    /// each, words split on whitespace: `add account heavy Fairshare=1`) run after the cluster
    /// is registered and before slurmctld starts; every job's user needs an association.
    pub fn accounting(mut self, setup: &[&str]) -> Self {
        self.accounting = Some(setup.iter().map(|c| c.to_string()).collect());
        self
    }

    /// Writes the configuration, starts the daemons and waits until every node is idle.
    pub fn start(self) -> Result<Cluster, HarnessError> {
        let started = Instant::now();
        let dir = new_dir()?;
        // From here on, an error drops `cluster`, which stops what was started and removes `dir`.
        let mut cluster = Cluster {
            conf: dir.join("etc/slurm.conf"),
            dir,
            slurm: SlurmInstall::from_env(),
            nodes: Vec::new(),
            ctld: None,
            slurmds: Vec::new(),
            mariadb: None,
            slurmdbd: None,
            keep: std::env::var_os("KACE_E2E_KEEP").is_some(),
        };
        let dir = cluster.dir.clone();
        for sub in ["etc", "spool/ctld", "log", "run", "dev", "out", "hooks", "mps", "progress"] {
            mkdir(&dir.join(sub))?;
        }
        // Jobs of unprivileged users write their output and work here.
        for sub in ["out", "work"] {
            let p = dir.join(sub);
            mkdir(&p)?;
            fs::set_permissions(&p, fs::Permissions::from_mode(0o1777)).map_err(io_err(&p))?;
        }

        let hook = |name: &str, h: &Option<Hook>| -> Result<Option<PathBuf>, HarnessError> {
            match h {
                None => Ok(None),
                Some(Hook::Path(p)) => Ok(Some(p.clone())),
                Some(Hook::Script(body)) => {
                    let p = dir.join("hooks").join(name);
                    let text = format!(
                        "#!/bin/bash\n{}\n",
                        body.replace("{dir}", &dir.display().to_string())
                    );
                    write(&p, &text)?;
                    fs::set_permissions(&p, fs::Permissions::from_mode(0o755))
                        .map_err(io_err(&p))?;
                    Ok(Some(p))
                }
            }
        };
        let hooks = Hooks {
            prolog: hook("prolog", &self.prolog)?,
            epilog: hook("epilog", &self.epilog)?,
            prolog_slurmctld: hook("prolog_slurmctld", &self.prolog_slurmctld)?,
            epilog_slurmctld: hook("epilog_slurmctld", &self.epilog_slurmctld)?,
        };

        let mut nodes = Vec::new();
        for n in &self.nodes {
            nodes.push((n.clone(), free_port()?));
        }
        let accounting = match self.accounting {
            Some(_) => Some(AccountingPorts { mariadb: free_port()?, slurmdbd: free_port()? }),
            None => None,
        };
        let layout = Layout {
            dir: dir.clone(),
            hostname: short_hostname()?,
            plugin_dir: cluster.slurm.plugin_dir(),
            ctld_port: free_port()?,
            nodes,
            typed: self.typed,
            hooks,
            gate: self.gate.is_some(),
            plugstack: self.plugin,
            extra: self.extra.clone(),
            accounting: accounting.clone(),
        };

        for (_, _, global) in layout.gpus() {
            // Fake GPUs: Slurm accepts only character or block devices in gres.conf.
            let dev = layout.gpu_device(global);
            run_checked(Command::new("mknod").arg(&dev).args(["c", "195", &global.to_string()]))?;
        }
        write(&cluster.conf, &layout.slurm_conf())?;
        write(&dir.join("etc/gres.conf"), &layout.gres_conf())?;
        if self.plugin {
            // A private copy: a rebuild during the run must not swap the .so under the daemons.
            let so = dir.join("etc/libkace_spank.so");
            let built = plugin::plugin_path()?;
            fs::copy(&built, &so).map_err(io_err(&built))?;
            let default_args = "mps_root={dir}/mps progress_root={dir}/progress".to_string();
            let args = self.plugin_args.clone().unwrap_or(default_args);
            let args = args.replace("{dir}", &dir.display().to_string());
            write(&dir.join("etc/plugstack.conf"), &conf::plugstack_conf(&so, &args))?;
        }
        if let Some(lua) = &self.gate {
            // The gate wakes this cluster's decider through the file its kace.conf names
            // (`dispatch.submitted`, tests/src/kace.rs), not the system's.
            let text = fs::read_to_string(lua).map_err(io_err(lua))?;
            let ours = format!("local SUBMITTED = \"{}/run/submitted\"", dir.display());
            let text = text.replace("local SUBMITTED = \"/run/kace/submitted\"", &ours);
            write(&dir.join("etc/job_submit.lua"), &text)?;
        }
        cluster.nodes = layout.nodes.iter().map(|(n, _)| n.clone()).collect();
        for node in &cluster.nodes {
            mkdir(&dir.join("spool").join(&node.name))?;
        }

        if let (Some(ports), Some(setup)) = (&accounting, &self.accounting) {
            cluster.start_accounting(ports, setup, layout.plugin_dir.as_deref())?;
        }
        cluster.ctld = Some(cluster.spawn("slurmctld", &["-D"], "slurmctld")?);
        for node in cluster.nodes.clone() {
            let d = cluster.spawn(
                "slurmd",
                &["-D", "-N", &node.name],
                &format!("slurmd-{}", node.name),
            )?;
            cluster.slurmds.push((node.name.clone(), d));
        }
        cluster.wait_idle(Duration::from_secs(60))?;
        eprintln!("kace-e2e: cluster {} up in {:.1?}", dir.display(), started.elapsed());
        Ok(cluster)
    }
}

/// One daemon the harness started, in foreground mode (`-D`), so it is our child.
#[derive(Debug)]
struct Daemon {
    name: String,
    child: Mutex<Child>,
}

impl Daemon {
    fn running(&self) -> bool {
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        matches!(child.try_wait(), Ok(None))
    }

    fn stop(&self) {
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        if !matches!(child.try_wait(), Ok(None)) {
            return;
        }
        sys::signal(child.id(), sys::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if !matches!(child.try_wait(), Ok(None)) {
                return;
            }
            sleep(POLL);
        }
        eprintln!("kace-e2e: {} ignored SIGTERM for 10 s; killing it", self.name);
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// A running test cluster. Dropping it cancels its jobs, stops its daemons (and any process
/// still running on their behalf) and removes its directory (kept when `KACE_E2E_KEEP` is set).
#[derive(Debug)]
pub struct Cluster {
    dir: PathBuf,
    conf: PathBuf,
    nodes: Vec<NodeSpec>,
    ctld: Option<Daemon>,
    slurmds: Vec<(String, Daemon)>,
    /// The private MariaDB and slurmdbd of an accounting cluster.
    mariadb: Option<Daemon>,
    slurmdbd: Option<Daemon>,
    keep: bool,
    /// The Slurm whose daemons and commands this cluster runs.
    slurm: SlurmInstall,
}

/// `scontrol show job` fields of one job.
pub type JobInfo = BTreeMap<String, String>;

impl Cluster {
    /// Defaults: nodes `n1`, `n2` with one untyped GPU (4 shards) each, the kace plugin, the
    /// repository's gate, no hooks.
    pub fn builder() -> ClusterBuilder {
        ClusterBuilder {
            nodes: vec![NodeSpec::new("n1", 1), NodeSpec::new("n2", 1)],
            typed: false,
            plugin: true,
            plugin_args: None,
            gate: Some(Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/job_submit.lua")),
            prolog: None,
            epilog: None,
            prolog_slurmctld: None,
            epilog_slurmctld: None,
            extra: Vec::new(),
            accounting: None,
        }
    }

    /// The cluster's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Its slurm.conf (what `SLURM_CONF` points to in every command).
    pub fn conf(&self) -> &Path {
        &self.conf
    }

    /// The cluster's nodes.
    pub fn nodes(&self) -> &[NodeSpec] {
        &self.nodes
    }

    /// The Slurm this cluster runs.
    pub fn slurm(&self) -> &SlurmInstall {
        &self.slurm
    }

    /// A Slurm command set up for this cluster (the install's program, `SLURM_CONF`, a PATH,
    /// `TZ=UTC` as kace runs them, cwd = the cluster dir).
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new(self.slurm.program(program));
        c.env("SLURM_CONF", &self.conf)
            .env("PATH", self.slurm.path_var())
            .env_remove("SLURM_TIME_FORMAT")
            .current_dir(&self.dir);
        c
    }

    /// Runs `program args` and returns its output, whatever its exit status.
    pub fn run(&self, program: &str, args: &[&str]) -> Result<Output, HarnessError> {
        let mut c = self.command(program);
        c.args(args).stdin(Stdio::null());
        c.output().map_err(|e| HarnessError::Io {
            what: format!("couldn't run {program}"),
            source: e.to_string(),
        })
    }

    /// Runs `program args`, failing unless it exits 0; returns stdout.
    pub fn run_ok(&self, program: &str, args: &[&str]) -> Result<String, HarnessError> {
        let mut c = self.command(program);
        c.args(args);
        run_checked(&mut c)
    }

    /// `sbatch --parsable` with output to `out/<jobid>.out`; returns the job id. `args` come
    /// after the harness's own options, so they can override them.
    pub fn sbatch(&self, args: &[&str]) -> Result<u32, HarnessError> {
        let out_pattern = format!("--output={}/out/%j.out", self.dir.display());
        let chdir = format!("--chdir={}/work", self.dir.display());
        let mut full = vec!["--parsable", out_pattern.as_str(), chdir.as_str()];
        full.extend_from_slice(args);
        let out = self.run_ok("sbatch", &full)?;
        parse_job_id(&out)
    }

    /// `n` jobs of `sbatch {args} -o /dev/null`, eight sbatch at a time (quick enough for
    /// tens of thousands of jobs); `args` is shell text.
    pub fn submit_many(&self, n: usize, args: &str) -> Result<(), HarnessError> {
        if n == 0 {
            return Ok(());
        }
        let sbatch = self.slurm().program("sbatch");
        let cmd = format!(
            "seq {n} | xargs -P 8 -I{{}} {} {args} -o /dev/null >/dev/null",
            sbatch.display()
        );
        let mut c = Command::new("bash");
        c.args(["-c", &cmd]).env("SLURM_CONF", self.conf());
        run_checked(&mut c).map(drop)
    }

    /// The fields of `scontrol -o show job <id>`.
    pub fn job(&self, id: u32) -> Result<JobInfo, HarnessError> {
        let out = self.run_ok("scontrol", &["-o", "show", "job", &id.to_string()])?;
        Ok(parse_fields(&out))
    }

    /// Polls the job until `pred` holds, for at most `timeout`.
    pub fn wait_job(
        &self,
        id: u32,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&JobInfo) -> bool,
    ) -> Result<JobInfo, HarnessError> {
        let deadline = Instant::now() + timeout;
        loop {
            let info = self.job(id)?;
            if pred(&info) {
                return Ok(info);
            }
            if Instant::now() >= deadline {
                return Err(HarnessError::Timeout {
                    what: format!("job {id} to be {what}"),
                    waited: timeout,
                    detail: format!("{info:?}"),
                });
            }
            sleep(POLL);
        }
    }

    /// Waits until the job has ended (any final state) and returns its fields.
    pub fn wait_done(&self, id: u32, timeout: Duration) -> Result<JobInfo, HarnessError> {
        self.wait_job(id, "finished", timeout, |j| {
            let s = j.get("JobState").map(String::as_str).unwrap_or("");
            !matches!(s, "PENDING" | "RUNNING" | "CONFIGURING" | "COMPLETING" | "SUSPENDED" | "")
        })
    }

    /// The job's output file (`out/<jobid>.out`), or "" if it has none yet.
    pub fn job_output(&self, id: u32) -> String {
        fs::read_to_string(self.dir.join(format!("out/{id}.out"))).unwrap_or_default()
    }

    /// slurmctld's RPC counts by message type since the last [`Cluster::reset_rpc_counts`]
    /// (sdiag's "statistics by message type"), without sdiag's own `REQUEST_STATS_INFO`.
    pub fn rpc_counts(&self) -> Result<BTreeMap<String, u64>, HarnessError> {
        let out = self.run_ok("sdiag", &[])?;
        let mut in_types = false;
        let mut kinds = BTreeMap::new();
        for line in out.lines() {
            if line.starts_with("Remote Procedure Call statistics by message type") {
                in_types = true;
                continue;
            }
            if line.starts_with("Remote Procedure Call statistics by user") {
                break;
            }
            if !in_types || line.contains("REQUEST_STATS_INFO") {
                continue;
            }
            let mut words = line.split_whitespace();
            let kind = words.next().unwrap_or("?").to_string();
            if let Some(n) =
                words.find_map(|w| w.strip_prefix("count:")).and_then(|n| n.parse::<u64>().ok())
            {
                *kinds.entry(kind).or_default() += n;
            }
        }
        Ok(kinds)
    }

    /// Zeroes slurmctld's RPC counts (`sdiag -r`).
    pub fn reset_rpc_counts(&self) -> Result<(), HarnessError> {
        self.run_ok("sdiag", &["-r"]).map(drop)
    }

    /// Whether this node's slurmd is still running.
    pub fn slurmd_running(&self, node: &str) -> bool {
        self.slurmds.iter().any(|(n, d)| n == node && d.running())
    }

    /// Whether the cluster's slurmctld still runs.
    pub fn slurmctld_running(&self) -> bool {
        self.ctld.as_ref().is_some_and(Daemon::running)
    }

    /// The node's slurmd log so far.
    pub fn slurmd_log(&self, node: &str) -> String {
        fs::read_to_string(self.dir.join(format!("log/slurmd-{node}.log"))).unwrap_or_default()
    }

    /// slurmctld's log so far.
    pub fn slurmctld_log(&self) -> String {
        fs::read_to_string(self.dir.join("log/slurmctld.log")).unwrap_or_default()
    }

    /// Stops slurmctld (SIGTERM, as systemd does) and starts it again from its saved state, the
    /// jobs running on; returns once it answers again.
    pub fn restart_slurmctld(&mut self) -> Result<(), HarnessError> {
        if let Some(c) = self.ctld.take() {
            c.stop();
        }
        self.ctld = Some(self.spawn("slurmctld", &["-D"], "slurmctld-restarted")?);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match self.run("scontrol", &["ping"]) {
                Ok(o)
                    if o.status.success() && String::from_utf8_lossy(&o.stdout).contains("UP") =>
                {
                    return Ok(())
                }
                _ if Instant::now() >= deadline => {
                    return Err(HarnessError::Timeout {
                        what: "slurmctld to answer after its restart".into(),
                        waited: Duration::from_secs(60),
                        detail: tail(&self.slurmctld_log(), 30),
                    })
                }
                _ => sleep(POLL),
            }
        }
    }

    /// Kills a node's slurmd with SIGKILL, as a crash would (its jobs' slurmstepd live on).
    pub fn kill_slurmd(&mut self, node: &str) {
        for (_, d) in self.slurmds.iter().filter(|(n, _)| n == node) {
            let mut child = d.child.lock().unwrap_or_else(|e| e.into_inner());
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts a node's slurmd again (after [`Cluster::kill_slurmd`]).
    pub fn start_slurmd(&mut self, node: &str) -> Result<(), HarnessError> {
        let d = self.spawn("slurmd", &["-D", "-N", node], &format!("slurmd-{node}-restarted"))?;
        match self.slurmds.iter_mut().find(|(n, _)| n == node) {
            Some(slot) => slot.1 = d,
            None => self.slurmds.push((node.to_string(), d)),
        }
        Ok(())
    }

    fn spawn(&self, program: &str, args: &[&str], log: &str) -> Result<Daemon, HarnessError> {
        let mut c = self.command(program);
        c.args(args);
        self.spawn_command(c, program, log)
    }

    fn spawn_command(
        &self,
        mut c: Command,
        program: &str,
        log: &str,
    ) -> Result<Daemon, HarnessError> {
        let out_path = self.dir.join(format!("log/{log}.out"));
        let out = fs::File::create(&out_path).map_err(io_err(&out_path))?;
        let err = out.try_clone().map_err(io_err(&out_path))?;
        let child = c.stdin(Stdio::null()).stdout(out).stderr(err).spawn().map_err(|e| {
            HarnessError::Io { what: format!("couldn't start {program}"), source: e.to_string() }
        })?;
        Ok(Daemon { name: log.to_string(), child: Mutex::new(child) })
    }

    /// Starts MariaDB (a fresh datadir), gives slurmdbd its database user, starts slurmdbd,
    /// registers the cluster and runs the test's `sacctmgr` setup.
    fn start_accounting(
        &mut self,
        ports: &AccountingPorts,
        setup: &[String],
        plugin_dir: Option<&Path>,
    ) -> Result<(), HarnessError> {
        let started = Instant::now();
        let db = MariaDbPaths::under(&self.dir);
        mkdir(&db.datadir)?;
        run_checked(Command::new(accounting::MARIADB_INSTALL_DB).args([
            "--no-defaults",
            &format!("--datadir={}", db.datadir.display()),
            "--user=root",
            "--auth-root-authentication-method=socket",
            "--skip-test-db",
        ]))?;
        let mut server = Command::new(accounting::MARIADBD);
        server.args(db.server_args(ports.mariadb));
        self.mariadb = Some(self.spawn_command(server, "mariadbd", "mariadbd")?);
        let sql = accounting::storage_user_sql();
        let socket = format!("--socket={}", db.socket.display());
        self.wait_for("MariaDB to answer", Duration::from_secs(60), "mariadbd", || {
            let mut c = Command::new(accounting::MARIADB);
            c.args(["--no-defaults", &socket, "-u", "root", "-e", &sql]);
            run_checked(&mut c).is_ok()
        })?;

        let conf = self.dir.join("etc/slurmdbd.conf");
        write(&conf, &accounting::slurmdbd_conf(&self.dir, ports, plugin_dir))?;
        fs::set_permissions(&conf, fs::Permissions::from_mode(0o600)).map_err(io_err(&conf))?;
        self.slurmdbd = Some(self.spawn("slurmdbd", &["-D"], "slurmdbd")?);
        self.wait_for("slurmdbd to answer", Duration::from_secs(60), "slurmdbd", || {
            self.run_ok("sacctmgr", &["-n", "-P", "list", "cluster"]).is_ok()
        })?;
        self.run_ok("sacctmgr", &["-i", "add", "cluster", "kacee2e"])?;
        for command in setup {
            let mut args = vec!["-i"];
            args.extend(command.split_whitespace());
            self.run_ok("sacctmgr", &args)?;
        }
        eprintln!("kace-e2e: MariaDB and slurmdbd up in {:.1?}", started.elapsed());
        Ok(())
    }

    /// Polls `ready` until it holds, failing early when the daemon logged as `log` exits.
    fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        log: &str,
        ready: impl Fn() -> bool,
    ) -> Result<(), HarnessError> {
        let deadline = Instant::now() + timeout;
        loop {
            if ready() {
                return Ok(());
            }
            let out =
                fs::read_to_string(self.dir.join(format!("log/{log}.out"))).unwrap_or_default();
            let daemon = self.mariadb.iter().chain(&self.slurmdbd).find(|d| d.name == log);
            if daemon.is_some_and(|d| !d.running()) {
                return Err(HarnessError::DaemonExited {
                    daemon: log.to_string(),
                    log: format!("{}\n{}", tail(&out, 40), self.log_tails()),
                });
            }
            if Instant::now() >= deadline {
                return Err(HarnessError::Timeout {
                    what: what.to_string(),
                    waited: timeout,
                    detail: self.log_tails(),
                });
            }
            sleep(Duration::from_millis(200));
        }
    }

    fn wait_idle(&self, timeout: Duration) -> Result<(), HarnessError> {
        let deadline = Instant::now() + timeout;
        let mut last = String::new();
        loop {
            let ctld = self.ctld.iter().map(|d| ("slurmctld".to_string(), d, self.slurmctld_log()));
            let slurmds =
                self.slurmds.iter().map(|(n, d)| (format!("slurmd -N {n}"), d, self.slurmd_log(n)));
            if let Some((daemon, _, log)) = ctld.chain(slurmds).find(|(_, d, _)| !d.running()) {
                return Err(HarnessError::DaemonExited { daemon, log: tail(&log, 40) });
            }
            if let Ok(out) = self.run("sinfo", &["-h", "-N", "-o", "%N %t"]) {
                last = String::from_utf8_lossy(&out.stdout).into_owned();
                let states: BTreeMap<&str, &str> =
                    last.lines().filter_map(|l| l.split_once(' ')).collect();
                if self.nodes.iter().all(|n| states.get(n.name.as_str()) == Some(&"idle")) {
                    return Ok(());
                }
            }
            if Instant::now() >= deadline {
                return Err(HarnessError::Timeout {
                    what: "all nodes to be idle".into(),
                    waited: timeout,
                    detail: format!("sinfo: {last}\n{}", self.log_tails()),
                });
            }
            sleep(POLL);
        }
    }

    fn log_tails(&self) -> String {
        let mut s = String::new();
        if let Ok(entries) = fs::read_dir(self.dir.join("log")) {
            for e in entries.flatten() {
                let text = fs::read_to_string(e.path()).unwrap_or_default();
                s.push_str(&format!("--- {}\n{}", e.path().display(), tail(&text, 15)));
            }
        }
        s
    }

    /// Cancels every job and waits (briefly) for the queue to drain, so no slurmstepd outlives
    /// the slurmds.
    fn cancel_all(&self) {
        let Ok(out) = self.run("squeue", &["-h", "-o", "%i"]) else { return };
        let ids: Vec<String> =
            String::from_utf8_lossy(&out.stdout).split_whitespace().map(str::to_string).collect();
        if ids.is_empty() {
            return;
        }
        let mut args = vec!["--quiet"];
        args.extend(ids.iter().map(String::as_str));
        let _ = self.run("scancel", &args);
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            match self.run("squeue", &["-h", "-o", "%i"]) {
                Ok(o) if o.stdout.iter().all(u8::is_ascii_whitespace) => return,
                Ok(_) => sleep(POLL),
                Err(_) => return,
            }
        }
    }

    /// Processes started on behalf of this cluster that are still alive: anything whose
    /// environment carries this cluster's `SLURM_CONF` (slurmstepd, job tasks, hooks).
    fn stragglers(&self) -> Vec<u32> {
        let needle = format!("SLURM_CONF={}", self.conf.display()).into_bytes();
        let me = std::process::id();
        let Ok(entries) = fs::read_dir("/proc") else { return Vec::new() };
        entries
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|&pid| pid != me)
            .filter(|pid| {
                fs::read(format!("/proc/{pid}/environ"))
                    .map(|env| env.split(|&b| b == 0).any(|kv| kv == needle.as_slice()))
                    .unwrap_or(false)
            })
            .collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.slurmctld_running() {
            self.cancel_all();
        }
        for (_, d) in &self.slurmds {
            d.stop();
        }
        if let Some(c) = &self.ctld {
            c.stop();
        }
        // slurmctld sends its last records to slurmdbd, which writes them to MariaDB.
        for d in self.slurmdbd.iter().chain(&self.mariadb) {
            d.stop();
        }
        for pid in self.stragglers() {
            eprintln!("kace-e2e: killing leftover process {pid} of {}", self.dir.display());
            sys::signal(pid, sys::SIGKILL);
        }
        if self.keep {
            eprintln!("kace-e2e: KACE_E2E_KEEP is set; leaving {}", self.dir.display());
        } else if let Err(e) = fs::remove_dir_all(&self.dir) {
            eprintln!("kace-e2e: couldn't remove {}: {e}", self.dir.display());
        }
    }
}

/// Splits `scontrol -o show job` output into its `Key=Value` fields.
pub fn parse_fields(line: &str) -> JobInfo {
    line.split_whitespace()
        .filter_map(|w| w.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The job id in `sbatch --parsable` output (`<id>` or `<id>;<cluster>`).
pub fn parse_job_id(out: &str) -> Result<u32, HarnessError> {
    let first = out.trim().split(';').next().unwrap_or("");
    first
        .parse()
        .map_err(|_| HarnessError::Unexpected(format!("sbatch --parsable printed {out:?}")))
}

/// The last `n` lines of `text`.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].iter().map(|l| format!("{l}\n")).collect()
}

fn new_dir() -> Result<PathBuf, HarnessError> {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    loop {
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("kace-e2e-{}-{n}", std::process::id()));
        match fs::create_dir(&p) {
            Ok(()) => {
                // Unprivileged job users must reach the plugin copy and out/, work/.
                fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).map_err(io_err(&p))?;
                return Ok(p);
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io_err(&p)(e)),
        }
    }
}

fn free_port() -> Result<u16, HarnessError> {
    // Bind-then-release: another process could take the port before Slurm does, but the window is
    // milliseconds and a collision fails loudly at start.
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| HarnessError::Io {
        what: "couldn't find a free port".into(),
        source: e.to_string(),
    })?;
    l.local_addr().map(|a| a.port()).map_err(|e| HarnessError::Io {
        what: "couldn't find a free port".into(),
        source: e.to_string(),
    })
}

fn short_hostname() -> Result<String, HarnessError> {
    let out = run_checked(Command::new("hostname").arg("-s"))?;
    Ok(out.trim().to_string())
}

fn mkdir(p: &Path) -> Result<(), HarnessError> {
    fs::create_dir_all(p).map_err(io_err(p))
}

fn write(p: &Path, text: &str) -> Result<(), HarnessError> {
    fs::write(p, text).map_err(io_err(p))
}

fn io_err(p: &Path) -> impl Fn(io::Error) -> HarnessError + '_ {
    move |e| HarnessError::Io {
        what: format!("couldn't use {}", p.display()),
        source: e.to_string(),
    }
}

fn run_checked(c: &mut Command) -> Result<String, HarnessError> {
    let shown = format!("{c:?}");
    let out = c.stdin(Stdio::null()).output().map_err(|e| HarnessError::Io {
        what: format!("couldn't run {shown}"),
        source: e.to_string(),
    })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(HarnessError::Command {
            command: shown,
            status: out.status.code(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_fields_are_split_on_the_first_equals() {
        let f = parse_fields("JobId=7 JobName=wrap AdminComment=kace:a=b Priority=0\n");
        assert_eq!(f["JobId"], "7");
        assert_eq!(f["AdminComment"], "kace:a=b");
        assert_eq!(f["Priority"], "0");
    }

    #[test]
    fn parsable_job_id_with_and_without_cluster() {
        assert_eq!(parse_job_id("42\n").unwrap(), 42);
        assert_eq!(parse_job_id("43;kacee2e\n").unwrap(), 43);
        assert!(parse_job_id("Submitted batch job 4").is_err());
    }
}
