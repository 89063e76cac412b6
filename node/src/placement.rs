//! Where the site's Slurm policies let a kace job run, as the decider checks them before it
//! pins a job: its partitions, its user's own `-w`, its constraint, the GPU type it asks for,
//! and the node's state. What kace cannot place within them is handed back to Slurm, which then
//! places the job itself ([`HandBack`]); Slurm's reasons for keeping a released job pending
//! that mean "not there" or "not now" ([`policy_reason`]) make the decider hold it again.

use crate::slurm::{split_words, NodeGpus, QueuedJob};

/// Where one held job may go, read from the listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wants {
    /// Its partitions (any, when Slurm lists none).
    pub partitions: Vec<String>,
    /// The one node its user named with `-w`, when they did.
    pub node: Option<String>,
    /// The GPU type its request names (`shard:g1:1`), when it does.
    pub kind: Option<String>,
    /// Its constraint as alternatives of features that must all be present (`a&b|c` is
    /// `[[a, b], [c]]`); empty when it has none.
    pub features: Vec<Vec<String>>,
}

/// Why kace hands a job back to Slurm rather than placing it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandBack {
    /// Its user's `-w` names several nodes: a job that must span them is not one kace places.
    SeveralNodes(String),
    /// It asks for a reservation: Slurm alone knows the reservation's nodes and times.
    Reservation(String),
    /// Its constraint uses more than `&` and `|` of plain features (counts, brackets).
    Constraint(String),
    /// No GPU node of its partitions (and its `-w`, constraint and type) exists, in any state.
    NoGpuNode,
    /// It was held longer than `max_hold` and no GPU takes it.
    MaxHold,
    /// It asks for no shard (its user changed its request): nothing kace can pair.
    NoShard,
}

impl HandBack {
    /// Its name in records and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            HandBack::SeveralNodes(_) => "several_nodes",
            HandBack::Reservation(_) => "reservation",
            HandBack::Constraint(_) => "constraint",
            HandBack::NoGpuNode => "no_gpu_node",
            HandBack::MaxHold => "max_hold",
            HandBack::NoShard => "no_shard",
        }
    }
}

impl std::fmt::Display for HandBack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HandBack::SeveralNodes(n) => write!(f, "its -w names several nodes ({n})"),
            HandBack::Reservation(r) => write!(f, "it asks for reservation {r}"),
            HandBack::Constraint(c) => write!(f, "kace cannot read its constraint {c:?}"),
            HandBack::NoGpuNode => {
                f.write_str("no GPU node its partitions, -w, constraint and GPU type allow exists")
            }
            HandBack::MaxHold => {
                f.write_str("it was held longer than max_hold and no GPU takes it")
            }
            HandBack::NoShard => f.write_str("it asks for no shard of a GPU"),
        }
    }
}

/// What `job` (held, so any node it names is its user's) allows, or why kace hands it back.
pub fn wants(job: &QueuedJob) -> Result<Wants, HandBack> {
    if job.shards().is_none() {
        return Err(HandBack::NoShard);
    }
    if !job.reservation.is_empty() {
        return Err(HandBack::Reservation(job.reservation.clone()));
    }
    let node = match job.req_nodes.trim() {
        "" => None,
        n if n.contains([',', '[', ' ']) => return Err(HandBack::SeveralNodes(n.to_string())),
        n => Some(n.to_string()),
    };
    let features =
        constraint(&job.features).ok_or_else(|| HandBack::Constraint(job.features.clone()))?;
    Ok(Wants {
        partitions: split_words(&job.partition),
        node,
        kind: crate::gres::request_kind(&job.tres_per_node, "shard"),
        features,
    })
}

/// A constraint as alternatives of conjunctions; `None` when it is more than `&`/`|` of plain
/// feature names (Slurm's counts `a*2`, brackets `[a|b]`, parentheses, `!`).
fn constraint(text: &str) -> Option<Vec<Vec<String>>> {
    let text = text.trim();
    if text.is_empty() || text == "(null)" {
        return Some(Vec::new());
    }
    let word = |w: &str| {
        !w.is_empty() && w.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.:".contains(&b))
    };
    text.split('|')
        .map(|alt| {
            let all: Vec<String> = alt.split('&').map(|f| f.trim().to_string()).collect();
            all.iter().all(|f| word(f)).then_some(all)
        })
        .collect()
}

/// Whether Slurm would start a job that `w` describes on `node`'s GPU of type `kind`, its
/// state aside: the node is in one of its partitions, is its `-w` node if it named one, has
/// every feature of one alternative of its constraint, and the GPU is of the type it asks for.
pub fn allows(w: &Wants, node: &NodeGpus, kind: Option<&str>) -> bool {
    let partition =
        w.partitions.is_empty() || w.partitions.iter().any(|p| node.partitions.contains(p));
    let named = w.node.as_deref().is_none_or(|n| n == node.name);
    let features = w.features.is_empty()
        || w.features.iter().any(|all| all.iter().all(|f| node.features.contains(f)));
    let typed = w.kind.as_deref().is_none_or(|k| kind == Some(k));
    partition && named && features && typed && node.shards_per_gpu > 0
}

/// The time limit, seconds, a job needs when it runs the rest of its time beside others at
/// `speed` (its predicted shared rate over its alone rate, in (0, 1]): what it has run, plus
/// what remains of `limit_s` stretched by 1 / speed, in whole minutes (Slurm's unit), rounded
/// up. `Ok(None)` when no change is needed; `Err` when that is more than `cap` × `own_s` (the
/// job's limit before kace lengthened it) or more than `max_s` (its partition's MaxTime): then
/// the pair would risk killing it, and is not formed.
pub fn shared_limit(
    limit_s: f64,
    own_s: f64,
    elapsed_s: f64,
    speed: f64,
    cap: f64,
    max_s: Option<f64>,
) -> Result<Option<f64>, String> {
    let speed = if speed.is_finite() { speed.clamp(0.01, 1.0) } else { 0.01 };
    if speed >= 0.999 {
        return Ok(None);
    }
    let elapsed = elapsed_s.clamp(0.0, limit_s);
    let needed = ((elapsed + (limit_s - elapsed) / speed) / 60.0).ceil() * 60.0;
    if needed <= limit_s {
        return Ok(None);
    }
    let mins = |s: f64| s / 60.0;
    if needed > cap * own_s {
        return Err(format!(
            "sharing at {:.0} % of its speed needs a {:.0} min time limit, more than {cap} × its own {:.0} min",
            speed * 100.0,
            mins(needed),
            mins(own_s)
        ));
    }
    if let Some(max) = max_s.filter(|m| needed > *m) {
        return Err(format!(
            "sharing at {:.0} % of its speed needs a {:.0} min time limit, past its partition's MaxTime ({:.0} min)",
            speed * 100.0,
            mins(needed),
            mins(max)
        ));
    }
    Ok(Some(needed))
}

/// The MaxTime of a job's partition on `node` (the longest of its partitions there), seconds;
/// `None` when unlimited or unknown.
pub fn max_time(partitions: &[String], node: &NodeGpus) -> Option<f64> {
    let limits: Vec<Option<f64>> = node
        .partitions
        .iter()
        .zip(&node.max_time_s)
        .filter(|(p, _)| partitions.is_empty() || partitions.contains(p))
        .map(|(_, t)| *t)
        .collect();
    if limits.iter().any(Option::is_none) {
        return None;
    }
    limits.into_iter().flatten().max_by(f64::total_cmp)
}

/// Whether Slurm's reason for keeping a job pending means that where or when kace released it
/// is not allowed (so it must be held again, unpinned, and its GPU freed), rather than that it
/// waits for its GPU (`Resources`, `Priority`, `None`). The names are Slurm's
/// (src/common/slurm_protocol_defs.c, job_state_reason_string).
pub fn policy_reason(reason: &str) -> bool {
    // Slurm says so of a node backfill plans for another job, and of a busy node it holds
    // for one (src/slurmctld/node_scheduler.c): the job waits for its GPU, as with Resources.
    if reason.contains("May be reserved for other job") {
        return false;
    }
    const PREFIXES: [&str; 10] = [
        "ReqNodeNotAvail",
        "Nodes required for job are DOWN",
        "BadConstraints",
        "Partition",
        "QOS",
        "Assoc",
        "MaxCpuPerAccount",
        "Reservation",
        "InvalidQOS",
        "InvalidAccount",
    ];
    PREFIXES.iter().any(|p| reason.starts_with(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, partitions: &[&str], features: &[&str]) -> NodeGpus {
        NodeGpus {
            name: name.into(),
            gpus: vec![Some("g0".into()), Some("g1".into())],
            shards_per_gpu: 4,
            usable: true,
            partitions: partitions.iter().map(|p| p.to_string()).collect(),
            max_time_s: partitions.iter().map(|_| None).collect(),
            features: features.iter().map(|p| p.to_string()).collect(),
            busy_gpus: Vec::new(),
        }
    }

    fn job(partition: &str, req_nodes: &str, features: &str, tres: &str) -> QueuedJob {
        QueuedJob {
            partition: partition.into(),
            req_nodes: req_nodes.into(),
            features: features.into(),
            tres_per_node: tres.into(),
            ..QueuedJob::default()
        }
    }

    #[test]
    fn partitions_nodes_features_and_types_are_honoured() {
        let (n1, n2) = (node("n1", &["pa"], &["a100", "nvl"]), node("n2", &["pb"], &["h100"]));
        let w = wants(&job("pa", "", "", "gres/shard:1")).unwrap();
        assert!(allows(&w, &n1, Some("g0")) && !allows(&w, &n2, Some("g0")));
        let w = wants(&job("pa,pb", "n2", "", "gres/shard:1")).unwrap();
        assert!(!allows(&w, &n1, Some("g0")) && allows(&w, &n2, Some("g0")));
        let w = wants(&job("pa,pb", "", "a100&nvl|h100", "gres/shard:1")).unwrap();
        assert!(allows(&w, &n1, None) && allows(&w, &n2, None));
        let w = wants(&job("pa,pb", "", "a100&h100", "gres/shard:1")).unwrap();
        assert!(!allows(&w, &n1, None) && !allows(&w, &n2, None));
        let w = wants(&job("", "", "", "gres:shard:g1:1")).unwrap();
        assert!(allows(&w, &n1, Some("g1")) && !allows(&w, &n1, Some("g0")));
        // A node without shards takes no kace job.
        let bare = NodeGpus { shards_per_gpu: 0, ..node("n3", &["pa"], &[]) };
        assert!(!allows(&wants(&job("pa", "", "", "gres/shard:1")).unwrap(), &bare, None));
    }

    #[test]
    fn what_kace_cannot_place_is_handed_back() {
        let back = |j: QueuedJob| wants(&j).unwrap_err();
        assert_eq!(
            back(job("pa", "n[1-2]", "", "gres/shard:1")),
            HandBack::SeveralNodes("n[1-2]".into())
        );
        assert_eq!(
            back(job("pa", "n1,n2", "", "gres/shard:1")),
            HandBack::SeveralNodes("n1,n2".into())
        );
        assert!(matches!(back(job("pa", "", "a*2", "gres/shard:1")), HandBack::Constraint(_)));
        assert!(matches!(back(job("pa", "", "[a|b]", "gres/shard:1")), HandBack::Constraint(_)));
        let r = QueuedJob { reservation: "maint".into(), ..job("pa", "", "", "gres/shard:1") };
        assert_eq!(back(r), HandBack::Reservation("maint".into()));
        assert_eq!(back(job("pa", "", "", "gres/gpu:1")), HandBack::NoShard);
    }

    #[test]
    fn sharing_lengthens_time_limits_within_the_cap_and_maxtime() {
        // A 60 min job, 20 min in, sharing at half speed: 20 + 40 × 2 = 100 min.
        assert_eq!(shared_limit(3600.0, 3600.0, 1200.0, 0.5, 2.0, None), Ok(Some(6000.0)));
        // A joiner (nothing run yet) at 70 %: 60 / 0.7 = 85.7 → 86 min.
        assert_eq!(shared_limit(3600.0, 3600.0, 0.0, 0.7, 2.0, None), Ok(Some(5160.0)));
        // Alone speed, or an already long enough limit: nothing.
        assert_eq!(shared_limit(3600.0, 3600.0, 0.0, 1.0, 2.0, None), Ok(None));
        // Past the cap of the job's own limit, or the partition's MaxTime: refused.
        assert!(shared_limit(3600.0, 3600.0, 0.0, 0.4, 2.0, None).is_err());
        assert!(shared_limit(5160.0, 3600.0, 0.0, 0.5, 2.0, None).is_err());
        assert!(shared_limit(3600.0, 3600.0, 0.0, 0.7, 2.0, Some(4000.0))
            .unwrap_err()
            .contains("MaxTime"));
        assert!(shared_limit(3600.0, 3600.0, 0.0, f64::NAN, 2.0, None).is_err());
    }

    #[test]
    fn policy_reasons_are_told_from_waiting_ones() {
        for r in [
            "ReqNodeNotAvail, UnavailableNodes:n1",
            "BadConstraints",
            "PartitionNodeLimit",
            "QOSMaxJobsPerUserLimit",
            "AssocGrpGRES",
            "Nodes required for job are DOWN, DRAINED or reserved for jobs in higher priority partitions",
        ] {
            assert!(policy_reason(r), "{r}");
        }
        for r in [
            "Resources",
            "Priority",
            "None",
            "JobHeldUser",
            "BeginTime",
            "Dependency",
            "ReqNodeNotAvail, May be reserved for other job",
        ] {
            assert!(!policy_reason(r), "{r}");
        }
    }
}
