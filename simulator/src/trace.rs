//! Job traces: what a job is, a seeded generator (Poisson arrivals, heavy-tailed lengths,
//! workloads drawn from the world), and the CSV trace format, parsed from any `Read`.

use std::io::Read;

use kace_selector::DataError;

use crate::error::SimError;
use crate::rng::{BoundedPareto, SplitMix64};
use crate::world::{WorkloadId, World};

/// One job of a trace.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Job {
    /// Submission time, seconds from the start of the trace.
    pub submit: f64,
    /// Its workload.
    pub workload: WorkloadId,
    /// Its length in steps (training or inference batches); it ends when they are done.
    pub steps: f64,
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
    /// RNG seed.
    pub seed: u64,
}

impl TraceSpec {
    /// A spec with the defaults `kace simulate` uses: 30 min mean, α = 1.5, lengths spanning
    /// a factor of 100, every workload.
    pub fn new(jobs: usize, load: f64, gpus: usize, seed: u64) -> Self {
        TraceSpec {
            jobs,
            load,
            gpus,
            mean_exclusive_s: 1800.0,
            tail_alpha: 1.5,
            length_ratio: 100.0,
            workloads: Vec::new(),
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
    let lengths =
        BoundedPareto::with_mean(spec.tail_alpha, spec.length_ratio, spec.mean_exclusive_s);
    let rate = spec.load * spec.gpus as f64 / spec.mean_exclusive_s;
    let mut rng = SplitMix64::new(spec.seed);
    let mut t = 0.0;
    let mut jobs = Vec::with_capacity(spec.jobs);
    for _ in 0..spec.jobs {
        t += rng.exponential(rate);
        let workload = pool[rng.below(pool.len())];
        let seconds = lengths.sample(&mut rng);
        let steps = (seconds * world.exclusive(workload)).round().max(1.0);
        jobs.push(Job { submit: t, workload, steps });
    }
    Ok(jobs)
}

/// Reads a CSV trace with the columns `submit_s`, `workload`, `steps` (found by name; others
/// ignored). Times are seconds ≥ 0, steps > 0, workloads must be in `world`. Jobs are returned
/// sorted by submission time (stable, so equal times keep file order).
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
        jobs.push(Job { submit, workload, steps });
    }
    if jobs.is_empty() {
        return Err(err(None, None, "the trace has no jobs".into()));
    }
    jobs.sort_by(|a, b| a.submit.total_cmp(&b.submit));
    Ok(jobs)
}

/// Writes a trace in the format [`read_trace`] reads.
pub fn write_trace(world: &World, jobs: &[Job]) -> String {
    let mut s = String::from("submit_s,workload,steps\n");
    for j in jobs {
        s.push_str(&format!("{},{},{}\n", j.submit, world.name(j.workload), j.steps));
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
        assert_eq!(jobs[0], Job { submit: 0.0, workload: w.id("a").unwrap(), steps: 20.0 });
        assert_eq!(jobs[1].submit, 5.0);
        let again = read_trace("t2.csv", write_trace(&w, &jobs).as_bytes(), &w).unwrap();
        assert_eq!(again, jobs);
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
