//! What kace asks of Slurm, behind the [`Slurm`] trait: list pending kace jobs (one `squeue`),
//! read one job's allocation (`scontrol -o show job -d`), pin a held job to a node and GPU, and
//! release it. [`Commands`] runs the real programs by absolute path with a timeout each; the
//! parsers are pure and tested on the text Slurm 22.05 prints.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::error::{short, Error, Result};
use crate::exec::{self, Invocation};

/// `admin_comment` prefix the gate (job_submit.lua) gives kace jobs; only root can set it.
pub const MARK: &str = "kace:";

/// The `squeue -O` format kace reads its jobs with (8–14 ms for 1 000 pending jobs).
pub const QUEUE_FORMAT: &str = "JobID:|,admin_comment:|,UserName:|,Reason:|,tres-per-node:|,\
                                SubmitTime:|,ReqNodes:|,StateCompact:|";

/// The states kace lists: pending (candidates, released partners), starting (other leads
/// whose prolog runs now; Slurm shows them configuring, or running with reason `Prolog`) and
/// completing (their epilog may be refilling their GPU now).
pub const QUEUE_STATES: &str = "PD,CF,R,CG";

/// One kace job in the queue (pending or starting), as `squeue` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct QueuedJob {
    /// Job id.
    pub id: u32,
    /// The workload the gate recorded (`admin_comment=kace:<workload>`).
    pub workload: String,
    /// The submitting user's name.
    pub user: String,
    /// Slurm's pending reason (`JobHeldUser`, `Resources`, …).
    pub reason: String,
    /// Its GRES request (`gres:shard:1`, `gres:shard:g1:1`, or empty).
    pub tres_per_node: String,
    /// Submission time, Unix seconds (`None` when unreadable).
    pub submitted: Option<f64>,
    /// Nodes it was pinned to (empty when none).
    pub req_nodes: String,
    /// Compact state: `PD`, `CF`, `R`.
    pub state: String,
}

impl QueuedJob {
    /// Whether it is pending.
    pub fn pending(&self) -> bool {
        self.state == "PD"
    }

    /// Whether it is still held (by the gate or by an admin), i.e. waiting for kace.
    pub fn held(&self) -> bool {
        self.pending() && self.reason.starts_with("JobHeld")
    }

    /// Whether it is starting: allocated, its prolog not finished.
    pub fn starting(&self) -> bool {
        self.state == "CF" || (self.state == "R" && self.reason == "Prolog")
    }

    /// Whether it is completing: its epilog may be refilling its GPU.
    pub fn completing(&self) -> bool {
        self.state == "CG"
    }

    /// Whether its prolog or epilog may be choosing a joiner now.
    pub fn deciding(&self) -> bool {
        self.starting() || self.completing()
    }

    /// The number of shards it asks for, when it asks for shards.
    pub fn shards(&self) -> Option<u32> {
        gres_request_count(&self.tres_per_node, "shard")
    }
}

/// One allocated GRES entry of a running job (`shard:g1:1(IDX:1)`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GresAlloc {
    /// `gpu`, `shard`, `mps`.
    pub name: String,
    /// The GPU type when the node's GPUs are typed (`g1`).
    pub kind: Option<String>,
    /// How many.
    pub count: u32,
    /// Node-global index of the first GPU it is on.
    pub index: Option<u32>,
}

/// What `scontrol -o show job -d` says about one job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobDetail {
    /// Job id.
    pub id: u32,
    /// `JobState`.
    pub state: String,
    /// `Reason` (`JobHeldUser` while held).
    pub reason: String,
    /// `AdminComment` (empty when unset).
    pub admin_comment: String,
    /// `NodeList`.
    pub nodes: String,
    /// The allocated GRES (running jobs only).
    pub gres: Vec<GresAlloc>,
}

impl JobDetail {
    /// Whether it is pending and held (waiting for kace).
    pub fn held(&self) -> bool {
        self.state == "PENDING" && self.reason.starts_with("JobHeld")
    }

    /// The kace workload, when the gate marked this job.
    pub fn workload(&self) -> Option<&str> {
        self.admin_comment.strip_prefix(MARK).filter(|w| !w.is_empty())
    }

    /// The allocation on `gpu`: the shard (or gpu) entry whose index is that GPU.
    pub fn on_gpu(&self, gpu: u32) -> Option<&GresAlloc> {
        self.gres.iter().find(|g| g.count > 0 && g.index == Some(gpu))
    }
}

/// A node and its GPUs, for `kace dispatch`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeGpus {
    /// Node name.
    pub name: String,
    /// GPU types in index order (`None` entries when untyped).
    pub gpus: Vec<Option<String>>,
    /// Whether Slurm may start jobs there (not down, drained or draining).
    pub usable: bool,
}

/// A running, configuring or completing kace job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningJob {
    /// Job id.
    pub id: u32,
    /// Its node.
    pub node: String,
    /// Compact state: `R`, `CF` or `CG` (its epilog runs: it may be refilling its GPU).
    pub state: String,
}

/// Where to pin a job: a node and, on a node with typed GPUs, the type of the GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Node name.
    pub node: String,
    /// The GPU type, for `Gres=shard:<type>:<n>` (only typed GPUs can be chosen by Slurm).
    pub kind: Option<String>,
}

/// What kace needs from Slurm.
pub trait Slurm {
    /// Every pending or starting job the gate marked as a kace job, oldest first (one
    /// `squeue`).
    fn kace_queue(&self) -> Result<Vec<QueuedJob>>;
    /// One job's details and allocation.
    fn job(&self, id: u32) -> Result<JobDetail>;
    /// Ids of the jobs Slurm has on `node` (any state but pending).
    fn jobs_on_node(&self, node: &str) -> Result<Vec<u32>>;
    /// Pins a pending job to `target`, asking for `shards` shards of its GPU when typed.
    fn pin(&self, id: u32, target: &Target, shards: u32) -> Result<()>;
    /// Releases a held job.
    fn release(&self, id: u32) -> Result<()>;
    /// Running, configuring or completing kace jobs (for dispatch).
    fn running_kace_jobs(&self) -> Result<Vec<RunningJob>>;
    /// The cluster's nodes and their GPUs (for dispatch).
    fn nodes(&self) -> Result<Vec<NodeGpus>>;
}

/// The real Slurm commands, each with its own timeout and all within an optional deadline.
#[derive(Debug, Clone)]
pub struct Commands {
    /// `scontrol`.
    pub scontrol: PathBuf,
    /// `squeue`.
    pub squeue: PathBuf,
    /// `sinfo`.
    pub sinfo: PathBuf,
    /// Per-command timeout.
    pub timeout: Duration,
    /// No command starts after this, and none runs past it.
    pub deadline: Option<Instant>,
}

impl Commands {
    fn call(&self, program: &std::path::Path, args: &[&str]) -> Result<String> {
        let mut timeout = self.timeout;
        if let Some(d) = self.deadline {
            let left = d.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Budget {
                    step: format!("{} {}", program.display(), args.join(" ")),
                });
            }
            timeout = timeout.min(left);
        }
        // UTC so that times parse without a time-zone database.
        let inv = Invocation::new(program, args.iter().copied()).env("TZ", "UTC");
        Ok(exec::run_ok(&inv, timeout)?)
    }

    fn scontrol(&self, args: &[&str]) -> Result<String> {
        self.call(&self.scontrol, args)
    }
}

impl Slurm for Commands {
    fn kace_queue(&self) -> Result<Vec<QueuedJob>> {
        let out = self.call(&self.squeue, &["-h", "-t", QUEUE_STATES, "-O", QUEUE_FORMAT])?;
        parse_queue(&out)
    }

    fn job(&self, id: u32) -> Result<JobDetail> {
        let out = self.scontrol(&["-o", "-d", "show", "job", &id.to_string()])?;
        parse_job(&out)
    }

    fn jobs_on_node(&self, node: &str) -> Result<Vec<u32>> {
        let out = self.call(&self.squeue, &["-h", "-w", node, "-o", "%i"])?;
        out.split_whitespace()
            .map(|w| {
                w.parse().map_err(|_| Error::Parse { what: "job ids".into(), text: short(&out) })
            })
            .collect()
    }

    fn pin(&self, id: u32, target: &Target, shards: u32) -> Result<()> {
        let job = format!("jobid={id}");
        let nodes = format!("NodeList={}", target.node);
        match &target.kind {
            // Slurm refuses a direct untyped→typed GRES change; clearing TresPerNode first
            // works (shared/reference/slurm-lab-2.md §2).
            Some(kind) => {
                self.scontrol(&["update", &job, "TresPerNode="])?;
                let gres = format!("Gres=shard:{kind}:{shards}");
                self.scontrol(&["update", &job, &gres, &nodes])?;
            }
            None => {
                self.scontrol(&["update", &job, &nodes])?;
            }
        }
        Ok(())
    }

    fn release(&self, id: u32) -> Result<()> {
        self.scontrol(&["release", &id.to_string()]).map(drop)
    }

    fn running_kace_jobs(&self) -> Result<Vec<RunningJob>> {
        let out = self.call(
            &self.squeue,
            &["-h", "-t", "R,CF,CG", "-O", "JobID:|,admin_comment:|,NodeList:|,StateCompact:|"],
        )?;
        Ok(parse_running(&out))
    }

    fn nodes(&self) -> Result<Vec<NodeGpus>> {
        let out = self.call(&self.sinfo, &["-h", "-N", "-O", "NodeList:|,Gres:|,StateLong:|"])?;
        Ok(parse_nodes(&out))
    }
}

fn fields(line: &str) -> Vec<&str> {
    line.split('|').map(str::trim).collect()
}

/// Parses `squeue -h -O` [`QUEUE_FORMAT`] output, keeping kace jobs, oldest first.
pub fn parse_queue(out: &str) -> Result<Vec<QueuedJob>> {
    let mut jobs = Vec::new();
    for line in out.lines().filter(|l| !l.trim().is_empty()) {
        let f = fields(line);
        if f.len() < 8 {
            return Err(Error::Parse { what: "squeue's pending jobs".into(), text: short(line) });
        }
        let Some(workload) = f[1].strip_prefix(MARK) else { continue };
        // Array and het jobs print ids like 12_3 or 12+1: kace never marks those as workloads
        // it can move, so they are skipped rather than misread.
        let Ok(id) = f[0].parse::<u32>() else { continue };
        jobs.push(QueuedJob {
            id,
            workload: workload.to_string(),
            user: f[2].to_string(),
            reason: f[3].to_string(),
            tres_per_node: if f[4] == "N/A" { String::new() } else { f[4].to_string() },
            submitted: parse_utc(f[5]),
            req_nodes: if f[6] == "(null)" { String::new() } else { f[6].to_string() },
            state: f[7].to_string(),
        });
    }
    jobs.sort_by_key(|j| j.id);
    Ok(jobs)
}

/// Parses `squeue -O JobID:|,admin_comment:|,NodeList:|,StateCompact:|`, keeping kace jobs.
pub fn parse_running(out: &str) -> Vec<RunningJob> {
    out.lines()
        .filter_map(|line| {
            let f = fields(line);
            if f.len() < 3 || !f[1].starts_with(MARK) {
                return None;
            }
            let state = f.get(3).copied().unwrap_or("R").to_string();
            Some(RunningJob { id: f[0].parse().ok()?, node: f[2].to_string(), state })
        })
        .collect()
}

/// Parses `sinfo -h -N -O NodeList:|,Gres:|,StateLong:|`.
pub fn parse_nodes(out: &str) -> Vec<NodeGpus> {
    let mut nodes: BTreeMap<String, NodeGpus> = BTreeMap::new();
    for line in out.lines() {
        let f = fields(line);
        if f.len() < 3 || f[0].is_empty() {
            continue;
        }
        let state = f[2].to_ascii_lowercase();
        let usable = !["down", "drain", "fail", "maint", "reserved", "not_responding"]
            .iter()
            .any(|s| state.contains(s))
            && !state.ends_with('*');
        let mut gpus = Vec::new();
        for entry in split_gres(f[1]) {
            let spec = entry.split('(').next().unwrap_or("");
            let parts: Vec<&str> = spec.split(':').collect();
            match parts.as_slice() {
                ["gpu", n] => gpus.extend((0..n.parse::<u32>().unwrap_or(0)).map(|_| None)),
                ["gpu", kind, n] => {
                    gpus.extend((0..n.parse::<u32>().unwrap_or(0)).map(|_| Some(kind.to_string())))
                }
                _ => {}
            }
        }
        nodes.insert(f[0].to_string(), NodeGpus { name: f[0].to_string(), gpus, usable });
    }
    nodes.into_values().collect()
}

/// Splits a GRES list at the commas that are not inside parentheses (`gpu:2(IDX:0,1),shard:4`).
fn split_gres(s: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth <= 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out.into_iter().map(str::trim).filter(|e| !e.is_empty() && *e != "(null)").collect()
}

/// The count of `name` in a request like `gres:shard:2` or `gres:shard:g1:1`.
pub fn gres_request_count(tres_per_node: &str, name: &str) -> Option<u32> {
    split_gres(tres_per_node).into_iter().find_map(|e| {
        let e = e.strip_prefix("gres:").unwrap_or(e);
        let parts: Vec<&str> = e.split(':').collect();
        match parts.as_slice() {
            [n, c] if *n == name => c.parse().ok(),
            [n, _, c] if *n == name => c.parse().ok(),
            [n] if *n == name => Some(1),
            _ => None,
        }
    })
}

/// Parses one `GRES=` entry list of `scontrol -d` (`shard:g0:0(IDX:),shard:g1:1(IDX:1)`).
pub fn parse_gres_alloc(s: &str) -> Vec<GresAlloc> {
    split_gres(s)
        .into_iter()
        .filter_map(|e| {
            let (spec, rest) = e.split_once('(').unwrap_or((e, ""));
            let parts: Vec<&str> = spec.split(':').collect();
            let (name, kind, count) = match parts.as_slice() {
                [n, c] => (*n, None, c.parse().ok()?),
                [n, k, c] => (*n, Some(k.to_string()), c.parse().ok()?),
                _ => return None,
            };
            let index = rest
                .strip_prefix("IDX:")
                .map(|r| r.trim_end_matches(')'))
                .and_then(|r| r.split([',', '-']).next())
                .and_then(|i| i.parse().ok());
            Some(GresAlloc { name: name.to_string(), kind, count, index })
        })
        .collect()
}

/// Parses `scontrol -o -d show job <id>` (one line of `Key=Value` words).
pub fn parse_job(out: &str) -> Result<JobDetail> {
    let line = out.lines().find(|l| l.contains("JobId=")).unwrap_or("");
    let mut id = None;
    let (mut state, mut admin_comment, mut nodes) = (String::new(), String::new(), String::new());
    let mut reason = String::new();
    let mut gres = Vec::new();
    for word in line.split_whitespace() {
        let Some((k, v)) = word.split_once('=') else { continue };
        match k {
            "JobId" => id = v.parse().ok(),
            "JobState" => state = v.to_string(),
            "Reason" => reason = v.to_string(),
            "AdminComment" => admin_comment = v.to_string(),
            "NodeList" => nodes = v.to_string(),
            // Per-node detail lines (`-d`); `JOB_GRES=` is the request, not the placement.
            "GRES" => gres.extend(parse_gres_alloc(v)),
            _ => {}
        }
    }
    let id = id.ok_or_else(|| Error::Parse { what: "scontrol's job".into(), text: short(out) })?;
    if admin_comment == "(null)" {
        admin_comment.clear();
    }
    Ok(JobDetail { id, state, reason, admin_comment, nodes, gres })
}

/// Parses Slurm's `YYYY-MM-DDTHH:MM:SS` (printed in UTC: kace runs Slurm commands with TZ=UTC).
pub fn parse_utc(s: &str) -> Option<f64> {
    let (date, time) = s.split_once('T')?;
    let d: Vec<i64> = date.split('-').map(|x| x.parse().ok()).collect::<Option<_>>()?;
    let t: Vec<i64> = time.split(':').map(|x| x.parse().ok()).collect::<Option<_>>()?;
    let ([y, m, day], [hh, mm, ss]) = (d.as_slice(), t.as_slice()) else { return None };
    if !(1..=12).contains(m) || !(1..=31).contains(day) {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm), valid for the Gregorian calendar.
    let y = if *m <= 2 { y - 1 } else { *y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some((days * 86_400 + hh * 3600 + mm * 60 + ss) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_kace_jobs_are_read_and_others_skipped() {
        let out = "12|kace:bert|alice|JobHeldUser|gres:shard:1|2026-11-29T06:58:46|(null)|PD|\n\
                   11|(null)|bob|Resources|N/A|2026-11-29T06:58:40||PD|\n\
                   10|kace:lstm|alice|None|gres:shard:g1:2|2026-11-29T06:58:00|n1|PD|\n\
                   14|kace:wav|alice|Prolog|gres:shard:1|2026-11-29T06:58:00|n2|R|\n\
                   13_2|kace:x|alice|JobHeldUser|gres:shard:1|2026-11-29T06:58:00||PD|\n";
        let jobs = parse_queue(out).unwrap();
        assert_eq!(jobs.len(), 3);
        assert!(jobs[2].starting() && !jobs[2].pending());
        assert_eq!((jobs[0].id, jobs[0].workload.as_str(), jobs[0].held()), (10, "lstm", false));
        assert_eq!((jobs[0].req_nodes.as_str(), jobs[0].shards()), ("n1", Some(2)));
        assert_eq!((jobs[1].id, jobs[1].held(), jobs[1].shards()), (12, true, Some(1)));
        assert_eq!(jobs[1].submitted, Some(1_795_935_526.0));
        assert!(parse_queue("garbage line\n").is_err());
    }

    #[test]
    fn job_detail_gives_the_gpu_of_typed_and_untyped_shards() {
        let typed = "JobId=7 JobName=wrap UserId=root(0) JobState=RUNNING Reason=None \
                     AdminComment=kace:bert NodeList=n1 JOB_GRES=shard:g1:1 \
                     Nodes=n1 CPU_IDs=0 Mem=0 GRES=shard:g0:0(IDX:),shard:g1:1(IDX:1)\n";
        let j = parse_job(typed).unwrap();
        assert_eq!((j.id, j.workload(), j.nodes.as_str()), (7, Some("bert"), "n1"));
        assert!(!j.held());
        let on = j.on_gpu(1).unwrap();
        assert_eq!((on.kind.as_deref(), on.count), (Some("g1"), 1));
        assert!(j.on_gpu(0).is_none());
        let plain = "JobId=8 JobState=RUNNING AdminComment=(null) NodeList=n2 \
                     Nodes=n2 CPU_IDs=0 Mem=0 GRES=shard:1(IDX:0)";
        let j = parse_job(plain).unwrap();
        assert_eq!((j.workload(), j.on_gpu(0).map(|g| g.kind.clone())), (None, Some(None)));
        assert!(parse_job("slurm_load_jobs error: Invalid job id specified").is_err());
    }

    #[test]
    fn gres_requests_and_lists() {
        assert_eq!(gres_request_count("gres:shard:3", "shard"), Some(3));
        assert_eq!(gres_request_count("gres:shard:g0:1", "shard"), Some(1));
        assert_eq!(gres_request_count("gres:gpu:1", "shard"), None);
        assert_eq!(gres_request_count("", "shard"), None);
        let a = parse_gres_alloc("gpu:2(IDX:0-1),shard:1(IDX:3)");
        assert_eq!((a[0].index, a[1].index), (Some(0), Some(3)));
    }

    #[test]
    fn nodes_and_their_gpus() {
        let out = "n1|gpu:g0:1,gpu:g1:1,shard:g0:2,shard:g1:2|idle|\n\
                   n2|gpu:1,shard:4|mixed|\nn3|gpu:2(S:0),shard:8|drained|\nn4|(null)|idle|\n";
        let n = parse_nodes(out);
        assert_eq!(n[0].gpus, vec![Some("g0".to_string()), Some("g1".to_string())]);
        assert_eq!((n[1].gpus.len(), n[1].usable), (1, true));
        assert_eq!((n[2].gpus.len(), n[2].usable), (2, false));
        assert!(n[3].gpus.is_empty());
    }

    #[test]
    fn utc_times() {
        assert_eq!(parse_utc("1970-01-01T00:00:00"), Some(0.0));
        assert_eq!(parse_utc("2000-03-01T12:30:05"), Some(951_913_805.0));
        assert_eq!(parse_utc("Unknown"), None);
        assert_eq!(parse_utc("2026-13-01T00:00:00"), None);
    }
}
