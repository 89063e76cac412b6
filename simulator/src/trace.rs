//! Job traces: what a job is, a seeded generator (Poisson arrivals, heavy-tailed lengths,
//! users skewed as on a shared cluster, each drawing from its own few workloads), and the CSV
//! trace format, parsed from any `Read`.

use std::io::Read;

use kace_selector::DataError;

use crate::error::SimError;
use crate::rng::{BoundedPareto, SplitMix64, Zipf};
use crate::world::{WorkloadId, World};

/// A user's index in a trace (0 for traces without users).
pub type UserId = u16;

/// One job of a trace.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Job {
    /// Submission time, seconds from the start of the trace.
    pub submit: f64,
    /// Its workload.
    pub workload: WorkloadId,
    /// Its length in steps (training or inference batches); it ends when they are done.
    pub steps: f64,
    /// Who submitted it: MPS shares a GPU spatially only among one user's jobs, unless the
    /// site runs it multi-user.
    pub user: UserId,
}

/// Who submits a generated trace's jobs.
#[derive(Debug, Clone, PartialEq)]
pub struct UserMix {
    /// Number of users (1: every job is one user's).
    pub users: usize,
    /// Zipf exponent of how many jobs each submits (0: all alike; 1: the busiest user submits
    /// a quarter of 30 users' jobs, the three busiest almost half).
    pub skew: f64,
    /// How many distinct workloads each user runs (drawn at random per user); 0: any of the
    /// trace's workloads.
    pub workloads_per_user: usize,
}

impl UserMix {
    /// One user running every workload: no job is kept from sharing by the same-user rule.
    pub fn single() -> Self {
        UserMix { users: 1, skew: 0.0, workloads_per_user: 0 }
    }

    /// The mix `kace simulate` uses by default: 30 users, Zipf 1.0, 4 workloads each.
    pub fn shared_cluster() -> Self {
        UserMix { users: 30, skew: 1.0, workloads_per_user: 4 }
    }
}

/// How to generate a trace.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceSpec {
    /// Number of jobs.
    pub jobs: usize,
    /// Offered load relative to the cluster's exclusive capacity: 1.0 submits, on average,
    /// exactly the GPU-seconds the GPUs can run alone; above 1 the queue grows without end
    /// unless sharing adds capacity.
    pub load: f64,
    /// GPUs of the cluster the load refers to.
    pub gpus: usize,
    /// Mean length of a job run alone, in seconds.
    pub mean_exclusive_s: f64,
    /// Tail index of the (bounded Pareto) length distribution.
    pub tail_alpha: f64,
    /// Longest over shortest job length.
    pub length_ratio: f64,
    /// The workloads to draw from (uniformly); empty means every workload of the world.
    pub workloads: Vec<WorkloadId>,
    /// Who submits the jobs.
    pub users: UserMix,
    /// RNG seed.
    pub seed: u64,
}

impl TraceSpec {
    /// A spec with the defaults `kace simulate` uses: 30 min mean, α = 1.5, lengths spanning
    /// a factor of 100, every workload, one user (`kace simulate` sets its user mix).
    pub fn new(jobs: usize, load: f64, gpus: usize, seed: u64) -> Self {
        TraceSpec {
            jobs,
            load,
            gpus,
            mean_exclusive_s: 1800.0,
            tail_alpha: 1.5,
            length_ratio: 100.0,
            workloads: Vec::new(),
            users: UserMix::single(),
            seed,
        }
    }
}

/// Generates a trace. Each job's length is drawn as a duration alone (bounded Pareto) and
/// turned into steps at its workload's exclusive throughput, so that slow and fast workloads
/// ask for comparable GPU time; arrivals are Poisson at `load × gpus / mean` jobs per second.
pub fn generate(world: &World, spec: &TraceSpec) -> Result<Vec<Job>, SimError> {
    if spec.gpus == 0 {
        return Err(SimError::Config("the cluster has zero GPUs".into()));
    }
    let positive = |v: f64| v.is_finite() && v > 0.0;
    if !positive(spec.load) {
        return Err(SimError::Config(format!("load must be positive, not {}", spec.load)));
    }
    if !positive(spec.mean_exclusive_s) {
        return Err(SimError::Config(format!(
            "mean job length must be positive, not {}",
            spec.mean_exclusive_s
        )));
    }
    if !positive(spec.tail_alpha) || (spec.tail_alpha - 1.0).abs() < 1e-9 {
        return Err(SimError::Config(format!(
            "tail index must be positive and not 1, not {}",
            spec.tail_alpha
        )));
    }
    if !(spec.length_ratio.is_finite() && spec.length_ratio > 1.0) {
        return Err(SimError::Config(format!(
            "length ratio must be above 1, not {}",
            spec.length_ratio
        )));
    }
    let pool: Vec<WorkloadId> = if spec.workloads.is_empty() {
        (0..world.len()).map(|i| i as WorkloadId).collect()
    } else {
        if let Some(&w) = spec.workloads.iter().find(|&&w| usize::from(w) >= world.len()) {
            return Err(SimError::Config(format!("workload id {w} is not in the world")));
        }
        spec.workloads.clone()
    };
    let mix = &spec.users;
    if mix.users == 0 || mix.users > usize::from(UserId::MAX) {
        return Err(SimError::Config(format!(
            "users must be 1 to {}, not {}",
            UserId::MAX,
            mix.users
        )));
    }
    if !(mix.skew.is_finite() && mix.skew >= 0.0) {
        return Err(SimError::Config(format!("user skew must be ≥ 0, not {}", mix.skew)));
    }
    let lengths =
        BoundedPareto::with_mean(spec.tail_alpha, spec.length_ratio, spec.mean_exclusive_s);
    let rate = spec.load * spec.gpus as f64 / spec.mean_exclusive_s;
    let mut rng = SplitMix64::new(spec.seed);
    // Users come from a stream of their own, so a one-user trace is the trace it always was.
    let mut user_rng = SplitMix64::new(spec.seed ^ 0x5553_4552_5355_5345);
    let who = Zipf::new(mix.users, mix.skew);
    let pools: Vec<Vec<WorkloadId>> = (0..mix.users)
        .map(|_| {
            let k = mix.workloads_per_user;
            if k == 0 || k >= pool.len() {
                return pool.clone();
            }
            // The first k of a partial Fisher–Yates shuffle.
            let mut p = pool.clone();
            for i in 0..k {
                let j = i + user_rng.below(p.len() - i);
                p.swap(i, j);
            }
            p.truncate(k);
            p
        })
        .collect();
    let mut t = 0.0;
    let mut jobs = Vec::with_capacity(spec.jobs);
    for _ in 0..spec.jobs {
        t += rng.exponential(rate);
        let user = if mix.users == 1 { 0 } else { who.sample(&mut user_rng) };
        let mine = &pools[user];
        let workload = mine[rng.below(mine.len())];
        let seconds = lengths.sample(&mut rng);
        let steps = (seconds * world.exclusive(workload)).round().max(1.0);
        jobs.push(Job { submit: t, workload, steps, user: user as UserId });
    }
    Ok(jobs)
}

/// Reads a CSV trace with the columns `submit_s`, `workload`, `steps` and, optionally, `user`
/// (found by name; others ignored). Times are seconds ≥ 0, steps > 0, workloads must be in
/// `world`; users are any names, numbered in order of first appearance (without the column,
/// every job is one user's). Jobs are returned sorted by submission time (stable, so equal
/// times keep file order).
pub fn read_trace<R: Read>(source: &str, reader: R, world: &World) -> Result<Vec<Job>, SimError> {
    let err = |line: Option<u64>, column: Option<&str>, message: String| {
        SimError::Trace(DataError {
            source: source.to_string(),
            line,
            column: column.map(str::to_string),
            message,
        })
    };
    let mut rdr = csv::ReaderBuilder::new().has_headers(true).flexible(false).from_reader(reader);
    let header: Vec<String> = rdr
        .headers()
        .map_err(|e| err(e.position().map(|p| p.line()), None, format!("malformed CSV: {e}")))?
        .iter()
        .map(|h| h.trim().to_string())
        .collect();
    let col = |name: &str| {
        header
            .iter()
            .position(|h| h == name)
            .ok_or_else(|| err(Some(1), Some(name), "missing column".into()))
    };
    let (cs, cw, cn) = (col("submit_s")?, col("workload")?, col("steps")?);
    let cu = header.iter().position(|h| h == "user");
    let mut users: std::collections::HashMap<String, UserId> = std::collections::HashMap::new();
    let mut jobs = Vec::new();
    for rec in rdr.records() {
        let rec = rec.map_err(|e| {
            err(e.position().map(|p| p.line()), None, format!("malformed CSV: {e}"))
        })?;
        let line = rec.position().map(|p| p.line());
        let cell = |c: usize| rec.get(c).unwrap_or("").trim();
        let number = |c: usize, min_exclusive: bool| {
            let raw = cell(c);
            match raw.parse::<f64>() {
                Ok(v) if v.is_finite() && (v > 0.0 || (!min_exclusive && v == 0.0)) => Ok(v),
                _ => Err(err(
                    line,
                    Some(&header[c]),
                    format!(
                        "expected a {} number, found '{}'",
                        if min_exclusive { "positive" } else { "non-negative" },
                        raw.chars().take(40).collect::<String>()
                    ),
                )),
            }
        };
        let submit = number(cs, false)?;
        let steps = number(cn, true)?;
        let name = cell(cw);
        let workload = world.id(name).ok_or_else(|| {
            err(
                line,
                Some("workload"),
                format!("unknown workload '{}'", name.chars().take(80).collect::<String>()),
            )
        })?;
        let user = match cu {
            None => 0,
            Some(c) => {
                let name = cell(c);
                if name.is_empty() {
                    return Err(err(line, Some("user"), "empty user".into()));
                }
                let next = users.len();
                match users.get(name) {
                    Some(&u) => u,
                    None if next < usize::from(UserId::MAX) => {
                        users.insert(name.to_string(), next as UserId);
                        next as UserId
                    }
                    None => {
                        return Err(err(
                            line,
                            Some("user"),
                            format!("more than {} users", UserId::MAX),
                        ))
                    }
                }
            }
        };
        jobs.push(Job { submit, workload, steps, user });
    }
    if jobs.is_empty() {
        return Err(err(None, None, "the trace has no jobs".into()));
    }
    jobs.sort_by(|a, b| a.submit.total_cmp(&b.submit));
    Ok(jobs)
}

/// Writes a trace in the format [`read_trace`] reads.
pub fn write_trace(world: &World, jobs: &[Job]) -> String {
    let mut s = String::from("submit_s,workload,steps,user\n");
    for j in jobs {
        s.push_str(&format!("{},{},{},u{}\n", j.submit, world.name(j.workload), j.steps, j.user));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::world::tests_support::tiny_world;

    #[test]
    fn generated_traces_are_seeded_sorted_and_sized_to_the_load() {
        let w = tiny_world();
        let spec = TraceSpec::new(20_000, 0.8, 10, 3);
        let a = generate(&w, &spec).unwrap();
        assert_eq!(a, generate(&w, &spec).unwrap());
        assert_ne!(a, generate(&w, &TraceSpec { seed: 4, ..spec.clone() }).unwrap());
        assert!(a.windows(2).all(|p| p[0].submit <= p[1].submit));
        // Offered GPU-seconds over elapsed time ≈ load × GPUs.
        let work: f64 = a.iter().map(|j| j.steps / w.exclusive(j.workload)).sum();
        let offered = work / a.last().unwrap().submit / 10.0;
        assert!((offered - 0.8).abs() < 0.08, "{offered}");
        assert!(a.iter().all(|j| j.steps >= 1.0));
    }

    #[test]
    fn bad_specs_are_errors() {
        let w = tiny_world();
        for spec in [
            TraceSpec::new(10, 1.0, 0, 1),
            TraceSpec::new(10, 0.0, 4, 1),
            TraceSpec { tail_alpha: 1.0, ..TraceSpec::new(10, 1.0, 4, 1) },
            TraceSpec { length_ratio: 1.0, ..TraceSpec::new(10, 1.0, 4, 1) },
            TraceSpec { workloads: vec![99], ..TraceSpec::new(10, 1.0, 4, 1) },
        ] {
            assert!(matches!(generate(&w, &spec), Err(SimError::Config(_))), "{spec:?}");
        }
    }

    #[test]
    fn csv_traces_round_trip_and_sort() {
        let w = tiny_world();
        let text = "steps,workload,submit_s\n100,b,5\n20,a,0\n";
        let jobs = read_trace("t.csv", text.as_bytes(), &w).unwrap();
        assert_eq!(
            jobs[0],
            Job { submit: 0.0, workload: w.id("a").unwrap(), steps: 20.0, user: 0 }
        );
        assert_eq!(jobs[1].submit, 5.0);
        let again = read_trace("t2.csv", write_trace(&w, &jobs).as_bytes(), &w).unwrap();
        assert_eq!(again, jobs);
        // Users by name, numbered in order of appearance.
        let text = "submit_s,workload,steps,user\n0,a,1,bob\n1,b,1,ann\n2,a,1,bob\n";
        let jobs = read_trace("u.csv", text.as_bytes(), &w).unwrap();
        assert_eq!(jobs.iter().map(|j| j.user).collect::<Vec<_>>(), [0, 1, 0]);
        let again = read_trace("u2.csv", write_trace(&w, &jobs).as_bytes(), &w).unwrap();
        assert_eq!(again, jobs);
        let bad = read_trace("e.csv", "submit_s,workload,steps,user\n0,a,1,\n".as_bytes(), &w);
        assert!(matches!(bad, Err(SimError::Trace(e)) if e.column.as_deref() == Some("user")));
    }

    #[test]
    fn users_are_skewed_and_keep_to_their_workloads() {
        let w = tiny_world();
        let one = TraceSpec::new(2_000, 1.0, 4, 5);
        let mixed = TraceSpec {
            users: UserMix { users: 10, skew: 1.0, workloads_per_user: 1 },
            ..one.clone()
        };
        let a = generate(&w, &one).unwrap();
        assert!(a.iter().all(|j| j.user == 0));
        let b = generate(&w, &mixed).unwrap();
        // The busiest user submits about 1 / H(10) = 34 % of the jobs, the lightest 3 %.
        let share = |u: UserId| b.iter().filter(|j| j.user == u).count() as f64 / b.len() as f64;
        assert!((share(0) - 0.341).abs() < 0.04, "{}", share(0));
        assert!(share(9) < 0.07, "{}", share(9));
        // One workload each.
        for u in 0..10 {
            let mut ws: Vec<_> = b.iter().filter(|j| j.user == u).map(|j| j.workload).collect();
            ws.dedup();
            ws.sort_unstable();
            ws.dedup();
            assert!(ws.len() <= 1, "user {u}: {ws:?}");
        }
        // Arrivals do not depend on users.
        assert!(a.iter().zip(&b).all(|(x, y)| x.submit == y.submit));
        let bad = TraceSpec { users: UserMix { users: 0, ..UserMix::single() }, ..one };
        assert!(matches!(generate(&w, &bad), Err(SimError::Config(_))));
    }

    #[test]
    fn malformed_traces_name_file_line_and_column() {
        let w = tiny_world();
        let cases = [
            ("submit_s,workload\n0,a\n", Some(1), Some("steps"), "missing column"),
            ("submit_s,workload,steps\n0,a,1\n1,zz,3\n", Some(3), Some("workload"), "unknown"),
            ("submit_s,workload,steps\n-1,a,1\n", Some(2), Some("submit_s"), "non-negative"),
            ("submit_s,workload,steps\n0,a,0\n", Some(2), Some("steps"), "positive"),
            ("submit_s,workload,steps\n0,a,x\n", Some(2), Some("steps"), "'x'"),
            ("submit_s,workload,steps\n0,a\n", Some(2), None, "malformed CSV"),
            ("submit_s,workload,steps\n", None, None, "no jobs"),
        ];
        for (text, line, column, needle) in cases {
            let Err(SimError::Trace(e)) = read_trace("trace.csv", text.as_bytes(), &w) else {
                panic!("{text:?} was accepted");
            };
            assert_eq!(e.source, "trace.csv");
            assert_eq!((e.line, e.column.as_deref()), (line, column), "{text:?}: {e}");
            assert!(e.to_string().contains(needle), "{text:?}: {e}");
        }
    }
}
