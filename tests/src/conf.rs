//! The test cluster's configuration files, rendered from a [`Layout`]. Pure: no I/O, so the
//! rendering is unit-tested without Slurm.

use std::fmt::Write as _;
use std::path::PathBuf;

/// One slurmd "node" (all run on this host, `slurmd -N <name>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSpec {
    /// Node name, e.g. `n1`.
    pub name: String,
    /// Fake GPUs (character devices), each exposed as `gpu` and as `shard`s.
    pub gpus: u32,
    /// Shards per GPU.
    pub shards_per_gpu: u32,
    /// CPUs advertised (`SlurmdParameters=config_overrides` lets this exceed the real cores).
    pub cpus: u32,
    /// Its features (`Feature=` in slurm.conf; `--constraint` matches them), none by default.
    pub features: Vec<String>,
}

impl NodeSpec {
    /// A node with `gpus` fake GPUs of 4 shards each and 4 CPUs.
    pub fn new(name: &str, gpus: u32) -> NodeSpec {
        NodeSpec { name: name.to_string(), gpus, shards_per_gpu: 4, cpus: 4, features: Vec::new() }
    }

    /// `n` shards per GPU instead of 4.
    pub fn shards_per_gpu(mut self, n: u32) -> NodeSpec {
        self.shards_per_gpu = n;
        self
    }

    /// These features.
    pub fn features(mut self, features: &[&str]) -> NodeSpec {
        self.features = features.iter().map(|f| f.to_string()).collect();
        self
    }
}

/// Prolog/Epilog-type hooks, as absolute paths of executables.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hooks {
    /// slurmd's `Prolog=`.
    pub prolog: Option<PathBuf>,
    /// slurmd's `Epilog=`.
    pub epilog: Option<PathBuf>,
    /// `PrologSlurmctld=`.
    pub prolog_slurmctld: Option<PathBuf>,
    /// `EpilogSlurmctld=`.
    pub epilog_slurmctld: Option<PathBuf>,
}

/// Everything the files depend on.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The cluster's root directory (etc/, spool/, log/, run/, dev/ below it).
    pub dir: PathBuf,
    /// This host's short name: slurmctld acts as controller only under it.
    pub hostname: String,
    /// `PluginDir=` (a Slurm installed under a prefix); `None` keeps the build's default.
    pub plugin_dir: Option<PathBuf>,
    /// slurmctld's port.
    pub ctld_port: u16,
    /// Nodes with their slurmd ports.
    pub nodes: Vec<(NodeSpec, u16)>,
    /// Typed GPUs and shards (`gpu:g0:1,shard:g0:4,...`), which Slurm needs to place a partner
    /// on a given GPU of a multi-GPU node (see shared/reference/slurm-lab-2.md §2).
    pub typed: bool,
    /// The Prolog/Epilog-type hooks.
    pub hooks: Hooks,
    /// `JobSubmitPlugins=lua` (the gate must then be at `etc/job_submit.lua`).
    pub gate: bool,
    /// `PlugStackConfig=etc/plugstack.conf`.
    pub plugstack: bool,
    /// Extra slurm.conf lines, appended verbatim.
    pub extra: Vec<String>,
    /// Accounting through slurmdbd on these ports (`None`: `accounting_storage/none`).
    pub accounting: Option<crate::accounting::AccountingPorts>,
}

impl Layout {
    /// The device file of the cluster's `i`-th GPU, numbered across all nodes.
    pub fn gpu_device(&self, i: u32) -> PathBuf {
        self.dir.join(format!("dev/gpu{i}"))
    }

    /// (node, local index, global index) of every GPU, in order.
    pub fn gpus(&self) -> Vec<(&NodeSpec, u32, u32)> {
        let mut out = Vec::new();
        let mut global = 0;
        for (node, _) in &self.nodes {
            for local in 0..node.gpus {
                out.push((node, local, global));
                global += 1;
            }
        }
        out
    }

    /// The text of `slurm.conf`.
    pub fn slurm_conf(&self) -> String {
        let d = self.dir.display();
        let mut s = String::new();
        let _ = writeln!(
            s,
            "# kace e2e test cluster (generated)\n\
             ClusterName=kacee2e\n\
             SlurmctldHost={host}\n\
             SlurmctldPort={port}\n\
             SlurmUser=root\n\
             SlurmdUser=root\n\
             AuthType=auth/none\n\
             CredType=cred/none\n\
             StateSaveLocation={d}/spool/ctld\n\
             SlurmdSpoolDir={d}/spool/%n\n\
             SlurmctldPidFile={d}/run/slurmctld.pid\n\
             SlurmdPidFile={d}/run/slurmd-%n.pid\n\
             SlurmctldLogFile={d}/log/slurmctld.log\n\
             SlurmdLogFile={d}/log/slurmd-%n.log\n\
             SlurmctldDebug=verbose\n\
             SlurmdDebug=verbose\n\
             ProctrackType=proctrack/linuxproc\n\
             TaskPlugin=task/none\n\
             JobAcctGatherType=jobacct_gather/none\n\
             JobCompType=jobcomp/none\n\
             SelectType=select/cons_tres\n\
             SelectTypeParameters=CR_Core\n\
             SchedulerType=sched/backfill\n\
             SchedulerParameters=batch_sched_delay=0,sched_min_interval=0\n\
             SlurmdParameters=config_overrides\n\
             ReturnToService=2\n\
             MpiDefault=none\n\
             MailProg=/bin/true\n\
             PrologFlags=Alloc\n\
             GresTypes=gpu,shard",
            host = self.hostname,
            port = self.ctld_port,
        );
        match &self.accounting {
            None => {
                let _ = writeln!(s, "AccountingStorageType=accounting_storage/none");
            }
            Some(ports) => {
                for line in crate::accounting::slurm_conf_lines(ports) {
                    let _ = writeln!(s, "{line}");
                }
            }
        }
        if let Some(p) = &self.plugin_dir {
            let _ = writeln!(s, "PluginDir={}", p.display());
        }
        if self.plugstack {
            let _ = writeln!(s, "PlugStackConfig={d}/etc/plugstack.conf");
        }
        if self.gate {
            let _ = writeln!(s, "JobSubmitPlugins=lua");
        }
        let hooks = [
            ("Prolog", &self.hooks.prolog),
            ("Epilog", &self.hooks.epilog),
            ("PrologSlurmctld", &self.hooks.prolog_slurmctld),
            ("EpilogSlurmctld", &self.hooks.epilog_slurmctld),
        ];
        for (key, path) in hooks {
            if let Some(p) = path {
                let _ = writeln!(s, "{key}={}", p.display());
            }
        }
        for line in &self.extra {
            let _ = writeln!(s, "{line}");
        }
        // Each node is its own NodeHostname: a Slurm built without --enable-multiple-slurmd
        // refuses two nodes on one hostname ("Duplicated NodeHostName"), and with it (Debian's
        // build) this works as well; NodeAddr is where slurmctld reaches them.
        for (node, port) in &self.nodes {
            let _ = writeln!(
                s,
                "NodeName={} NodeHostname={} NodeAddr=127.0.0.1 Port={port} CPUs={} \
                 RealMemory=4000 Gres={}{} State=UNKNOWN",
                node.name,
                node.name,
                node.cpus,
                self.node_gres(node),
                if node.features.is_empty() {
                    String::new()
                } else {
                    format!(" Feature={}", node.features.join(","))
                }
            );
        }
        let _ = writeln!(s, "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP");
        s
    }

    fn node_gres(&self, node: &NodeSpec) -> String {
        if node.gpus == 0 {
            return "(null)".to_string();
        }
        if self.typed {
            let gpus = (0..node.gpus).map(|i| format!("gpu:g{i}:1"));
            let shards = (0..node.gpus).map(|i| format!("shard:g{i}:{}", node.shards_per_gpu));
            gpus.chain(shards).collect::<Vec<_>>().join(",")
        } else {
            format!("gpu:{},shard:{}", node.gpus, node.gpus * node.shards_per_gpu)
        }
    }

    /// The text of `gres.conf` (the fake GPUs and their shards).
    pub fn gres_conf(&self) -> String {
        let mut s = String::new();
        for (node, local, global) in self.gpus() {
            let file = self.gpu_device(global);
            let file = file.display();
            let ty = if self.typed { format!(" Type=g{local}") } else { String::new() };
            let _ = writeln!(s, "NodeName={} Name=gpu{ty} File={file}", node.name);
            let _ = writeln!(
                s,
                "NodeName={} Name=shard{ty} Count={} File={file}",
                node.name, node.shards_per_gpu
            );
        }
        s
    }
}

/// A plugstack.conf loading one plugin with its arguments.
pub fn plugstack_conf(plugin: &std::path::Path, args: &str) -> String {
    format!("required {} {args}\n", plugin.display())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(typed: bool) -> Layout {
        Layout {
            dir: PathBuf::from("/tmp/c"),
            hostname: "vm".into(),
            plugin_dir: None,
            ctld_port: 7000,
            nodes: vec![(NodeSpec::new("n1", 2), 7001), (NodeSpec::new("n2", 1), 7002)],
            typed,
            hooks: Hooks { prolog: Some("/tmp/c/hooks/prolog".into()), ..Hooks::default() },
            gate: true,
            plugstack: true,
            extra: vec![],
            accounting: None,
        }
    }

    #[test]
    fn untyped_gres_counts_shards_per_node_and_numbers_devices_across_nodes() {
        let l = layout(false);
        let conf = l.slurm_conf();
        assert!(conf.contains("NodeName=n1 NodeHostname=n1 NodeAddr=127.0.0.1 Port=7001 CPUs=4 RealMemory=4000 Gres=gpu:2,shard:8 "));
        assert!(conf.contains("Port=7002 CPUs=4 RealMemory=4000 Gres=gpu:1,shard:4 "));
        assert_eq!(
            l.gres_conf(),
            "NodeName=n1 Name=gpu File=/tmp/c/dev/gpu0\n\
             NodeName=n1 Name=shard Count=4 File=/tmp/c/dev/gpu0\n\
             NodeName=n1 Name=gpu File=/tmp/c/dev/gpu1\n\
             NodeName=n1 Name=shard Count=4 File=/tmp/c/dev/gpu1\n\
             NodeName=n2 Name=gpu File=/tmp/c/dev/gpu2\n\
             NodeName=n2 Name=shard Count=4 File=/tmp/c/dev/gpu2\n"
        );
    }

    #[test]
    fn typed_gres_types_both_gpus_and_shards() {
        let l = layout(true);
        assert!(l.slurm_conf().contains("Gres=gpu:g0:1,gpu:g1:1,shard:g0:4,shard:g1:4 "));
        assert!(l
            .gres_conf()
            .contains("NodeName=n1 Name=shard Type=g1 Count=4 File=/tmp/c/dev/gpu1\n"));
        assert!(l.gres_conf().contains("NodeName=n2 Name=gpu Type=g0 File=/tmp/c/dev/gpu2\n"));
    }

    #[test]
    fn hooks_gate_and_plugstack_appear_only_when_set() {
        let mut l = layout(false);
        let conf = l.slurm_conf();
        assert!(conf.contains("Prolog=/tmp/c/hooks/prolog\n"));
        assert!(!conf.contains("EpilogSlurmctld="));
        assert!(conf.contains("AccountingStorageType=accounting_storage/none\n"));
        assert!(conf.contains("JobSubmitPlugins=lua\n"));
        assert!(conf.contains("PlugStackConfig=/tmp/c/etc/plugstack.conf\n"));
        assert!(!conf.contains("PluginDir="));
        l.gate = false;
        l.plugstack = false;
        l.plugin_dir = Some("/opt/kace-slurm/26.05.3/lib/slurm".into());
        assert!(l.slurm_conf().contains("PluginDir=/opt/kace-slurm/26.05.3/lib/slurm\n"));
        let conf = l.slurm_conf();
        assert!(!conf.contains("JobSubmitPlugins") && !conf.contains("PlugStackConfig"));
    }
}
