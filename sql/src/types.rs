//! The records the store reads and writes, and the validation rules every writer shares.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Number of profile features, in the KACE artifact's order.
pub const FEATURE_COUNT: usize = 10;

/// SQL column names of the ten profile features, in the KACE artifact's feature order:
/// `_Threads, _Compute (SM) Throughput, _DRAM Throughput, _Memory Throughput, _Registers,
/// _Static Shared Memory, exclusive_throughput, sm%, mem%, memcap`.
pub const FEATURE_COLUMNS: [&str; FEATURE_COUNT] = [
    "threads",
    "sm_throughput",
    "dram_throughput",
    "memory_throughput",
    "registers",
    "static_shared_memory",
    "exclusive_throughput",
    "sm_pct",
    "mem_pct",
    "memcap_gib",
];

/// Index of the first system metric (`exclusive_throughput`); the six before it come from ncu.
pub const FIRST_SYSTEM_FEATURE: usize = 6;

/// Index of `memcap` (peak GPU memory, GiB) in the feature order.
pub const MEMCAP: usize = 9;

/// Index of `exclusive_throughput` in [`FEATURE_COLUMNS`].
pub const EXCLUSIVE: usize = 6;

/// Index of `sm_pct` (SM utilization alone, %) among the features.
pub const SM_PCT: usize = 7;

/// Longest workload name accepted (names come from users through `--kace-colocate`).
pub const MAX_NAME_LEN: usize = kace_layout::workload_name::MAX_LEN;

/// Checks a workload name against kace's one rule ([`kace_layout::workload_name`]): 1–128
/// characters from `[A-Za-z0-9._+-]`, not starting with `.` or `-`.
///
/// The same rule is enforced at the SPANK option and the gate; checking it here keeps junk out
/// of the DB whatever path a name arrives by (spool files are written by root, but from user
/// input).
pub fn validate_workload_name(name: &str) -> Result<()> {
    kace_layout::workload_name::check(name.as_bytes()).map_err(|e| Error::Invalid {
        reason: format!("invalid workload name {}: {e}", quote_untrusted(name)),
    })
}

/// An untrusted value made printable and short for a message: control and non-ASCII characters
/// escaped, cut after 40 characters with the length noted.
pub fn quote_untrusted(s: &str) -> String {
    let shown: String = s.chars().take(40).flat_map(char::escape_debug).collect();
    if s.chars().count() > 40 {
        format!("\"{shown}\"... ({} bytes)", s.len())
    } else {
        format!("\"{shown}\"")
    }
}

/// One measurement of a workload's profile. Any feature may be absent: ncu gives the six kernel
/// metrics, a `kace profile run` gives the four system metrics, and the store merges them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewProfile {
    /// Workload name.
    pub workload: String,
    /// GPU model the profile was measured on (e.g. `Tesla V100-SXM2-32GB`).
    pub gpu_model: String,
    /// Where the numbers came from (`artifact`, `ncu:FILE`, `nvml`, `csv:FILE`, …).
    pub source: String,
    /// Feature values in [`FEATURE_COLUMNS`] order; `None` where this source did not measure it.
    pub values: [Option<f64>; FEATURE_COUNT],
}

impl NewProfile {
    /// Checks the name and that every present value is finite and in its range.
    pub fn validate(&self) -> Result<()> {
        validate_workload_name(&self.workload)?;
        if self.gpu_model.trim().is_empty() || self.source.trim().is_empty() {
            return Err(Error::Invalid {
                reason: format!("profile of {}: empty GPU model or source", self.workload),
            });
        }
        if self.gpu_model.len() > MAX_KEY_LEN
            || self.gpu_model.chars().any(char::is_control)
            || self.source.chars().any(char::is_control)
        {
            return Err(Error::Invalid {
                reason: format!(
                    "profile of {}: GPU model {} is too long or has control characters",
                    self.workload,
                    quote_untrusted(&self.gpu_model)
                ),
            });
        }
        if self.values.iter().all(Option::is_none) {
            return Err(Error::Invalid {
                reason: format!("profile of {}: no feature values", self.workload),
            });
        }
        for (i, v) in self.values.iter().enumerate() {
            if let Some(v) = v {
                if let Some(why) = feature_value_problem(i, *v) {
                    return Err(Error::Invalid {
                        reason: format!(
                            "profile of {}: {} = {}: {why}",
                            self.workload,
                            FEATURE_COLUMNS[i],
                            if v.abs() < 1e15 { v.to_string() } else { format!("{v:e}") }
                        ),
                    });
                }
            }
        }
        Ok(())
    }
}

/// Says what is wrong with a value for feature `i`, if anything. Percentages may exceed 100 a
/// little in real ncu output (rounding), so only clearly impossible values are refused.
pub(crate) fn feature_value_problem(i: usize, v: f64) -> Option<&'static str> {
    if !v.is_finite() {
        return Some("not a finite number");
    }
    if v < 0.0 {
        return Some("negative");
    }
    let is_pct = matches!(i, 1..=3 | 7 | 8);
    if is_pct && v > 200.0 {
        return Some("a percentage above 200");
    }
    // Far above anything measured (the artifact's largest: 1.2e7 threads, 2e8 registers, 74 KB
    // of static shared memory, 430 steps/s, 21.5 GiB), so that an absurd value — which made
    // its workload win every selection — is refused, not stored.
    match i {
        0 | 4 if v > 1e12 => Some("more than 1e12"),
        5 if v > 1e9 => Some("more than 1e9 bytes"),
        6 if v < 1e-9 => Some("an exclusive throughput must be above 0"),
        6 if v > MAX_UNPROFILED_THROUGHPUT => Some("more than 1e9 steps per second"),
        9 if v > 1e4 => Some("more than 10 000 GiB"),
        _ => None,
    }
}

/// Source of a profile measurement kace made itself, from the sampler's readings of one job's
/// alone intervals (and its progress lines): see `kace-epilog`.
pub const OBSERVED_SOURCE: &str = "observed";

/// Measurements kace keeps per workload, GPU model and observed source (the newest): what a
/// decision reads stays a few rows however often a workload runs. `profile.min_alone_runs` is at
/// most this.
pub const OBSERVED_KEPT: usize = 10;

/// Source of a memcap kace raised because a job ran out of memory at its limit (the memory
/// guard): the job needed more than the limit, so the limit is a lower bound of its memcap.
pub const OOM_SOURCE: &str = "observed-oom";

/// Seconds between two out-of-memory raises of one workload's memcap: each raises it by the
/// memory guard's margin (10 % by default) at most, so a workload's memcap grows at most that
/// much a day however many of its jobs fail.
pub const OOM_RAISE_INTERVAL_S: f64 = 86_400.0;

/// How fast an out-of-memory raise of a memcap fades back to the admin's value: its excess over
/// that value halves every this many seconds (a week), so that one raise, however it came about,
/// does not keep a workload unpaired for ever. Where no admin measured the memcap it does not
/// fade (there is nothing to fade to).
pub const OOM_RAISE_HALF_LIFE_S: f64 = 7.0 * 86_400.0;

/// Whether a measurement of this source was made by kace from jobs' runs (not by an admin's
/// `kace profile run`, `import` or `import-ncu`).
pub fn is_observed_source(source: &str) -> bool {
    source == OBSERVED_SOURCE || source == OOM_SOURCE
}

/// A workload's current profile. Per feature, the newest value an admin measured (`kace
/// profile run`, `import`, `import-ncu`) wins; without one, the newest value kace observed.
/// Memcap is the exception: a newer observed peak above the admin's figure raises it, because
/// a job limited to a memcap it outgrew fails (the memory guard).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    /// Workload name.
    pub workload: String,
    /// GPU model of the newest contributing measurement.
    pub gpu_model: String,
    /// Feature values in [`FEATURE_COLUMNS`] order.
    pub values: [Option<f64>; FEATURE_COUNT],
    /// Unix time of the newest contributing measurement.
    pub updated_at: f64,
    /// Per feature, the source of the value in `values` (`None` where there is no value).
    #[serde(default)]
    pub sources: [Option<std::sync::Arc<str>>; FEATURE_COUNT],
    /// Alone runs kace observed (measurements of source [`OBSERVED_SOURCE`]; at most
    /// [`OBSERVED_KEPT`] per GPU model are kept).
    #[serde(default)]
    pub observed_runs: u32,
    /// Readings behind the newest observed measurement (0: none).
    #[serde(default)]
    pub observed_samples: u64,
}

impl Profile {
    /// All ten features, when every one is known.
    pub fn complete(&self) -> Option<[f64; FEATURE_COUNT]> {
        let mut out = [0.0; FEATURE_COUNT];
        for (o, v) in out.iter_mut().zip(self.values) {
            *o = v?;
        }
        Some(out)
    }

    /// Whether any value came from an admin's measurement rather than kace's observations.
    pub fn has_admin_values(&self) -> bool {
        self.sources.iter().flatten().any(|s| !is_observed_source(s))
    }

    /// Whether this profile may stand for its workload in a decision: an admin measured part
    /// of its system metrics (exclusive throughput, SM %, memory %, memcap), or kace observed
    /// the workload alone at least `min_alone_runs` times. Kernel metrics alone (an ncu import)
    /// do not lift the rule: the system part is then still kace's observation.
    pub fn usable(&self, min_alone_runs: u32) -> bool {
        self.vouched() || self.observed_runs >= min_alone_runs
    }

    /// Whether an admin measured or imported any of its system features (`kace profile run`,
    /// `import`, `import-ncu`): its profile is not only kace's observations of users' runs.
    pub fn vouched(&self) -> bool {
        self.sources[FIRST_SYSTEM_FEATURE..].iter().flatten().any(|s| !is_observed_source(s))
    }

    /// Names of the features that are still unknown.
    pub fn missing(&self) -> Vec<&'static str> {
        FEATURE_COLUMNS
            .iter()
            .zip(self.values)
            .filter(|(_, v)| v.is_none())
            .map(|(n, _)| *n)
            .collect()
    }
}

/// A profile measurement the epilog made from one job's run: the sampler's readings of its
/// alone intervals (source [`OBSERVED_SOURCE`]), or a memcap raised after the job ran out of
/// memory at its limit (source [`OOM_SOURCE`]). Spooled, then stored once per key at ingest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObservedProfile {
    /// Unique key (`<cluster>/<job>/<run>/profile`).
    pub key: String,
    /// The job it was measured on.
    pub job: String,
    /// Unix seconds when it was measured (the job's end).
    pub created_at: f64,
    /// The measurement; its source is [`OBSERVED_SOURCE`] or [`OOM_SOURCE`].
    pub profile: NewProfile,
    /// Readings of the sampler it rests on (0 for an out-of-memory record without readings).
    pub samples: u64,
    /// Seconds the job ran alone (what the readings cover).
    pub alone_seconds: f64,
    /// Set when the job ran out of memory at its memory-guard limit: that limit, MiB.
    #[serde(default)]
    pub oom_limit_mib: Option<u64>,
    /// The job's user (`SLURM_JOB_USER`), when the epilog knew it: what one user alone
    /// measured does not bound a workload for everyone ([`corroborated`]).
    #[serde(default)]
    pub user: Option<String>,
}

/// The exclusive throughput several users' alone runs agree on, from each user's newest
/// measurement of a workload no admin profiled: the median of those within
/// [`MAX_RATIO_TO_EXCLUSIVE`] of the median of all, when at least two users are among them;
/// `None` otherwise (one user alone, or users who disagree, bound nothing: whoever came first
/// cannot lock out the honest).
pub fn corroborated(per_user: &[f64]) -> Option<f64> {
    let median = |v: &mut Vec<f64>| -> Option<f64> {
        v.retain(|x| x.is_finite() && *x > 0.0);
        v.sort_by(f64::total_cmp);
        let n = v.len();
        match n {
            0 => None,
            _ if n % 2 == 1 => Some(v[n / 2]),
            _ => Some((v[n / 2 - 1] * v[n / 2]).sqrt()),
        }
    };
    let mut all = per_user.to_vec();
    let m = median(&mut all)?;
    let mut agree: Vec<f64> = all
        .into_iter()
        .filter(|x| *x <= MAX_RATIO_TO_EXCLUSIVE * m && x * MAX_RATIO_TO_EXCLUSIVE >= m)
        .collect();
    if agree.len() < 2 {
        return None;
    }
    median(&mut agree)
}

impl ObservedProfile {
    /// Checks what ingest checks: the profile, an observed source, the key and the numbers.
    pub fn validate(&self) -> Result<()> {
        self.profile.validate()?;
        let bad = |why: &str| {
            Err(Error::Invalid {
                reason: format!("observed profile {}: {why}", quote_untrusted(&self.key)),
            })
        };
        if !is_observed_source(&self.profile.source) {
            return bad("its source is not an observed one");
        }
        if self.key.is_empty()
            || self.key.len() > MAX_KEY_LEN
            || self.key.chars().any(char::is_control)
        {
            return bad("bad key");
        }
        if self.job.is_empty() || self.job.len() > MAX_KEY_LEN {
            return bad("bad job id");
        }
        if !(self.created_at.is_finite()
            && self.alone_seconds.is_finite()
            && self.alone_seconds >= 0.0)
        {
            return bad("bad time");
        }
        if (self.profile.source == OOM_SOURCE) != self.oom_limit_mib.is_some() {
            return bad("an out-of-memory record needs its limit, and only it has one");
        }
        // A job's own `oom` line is a claim; the epilog keeps it only when the sampler's
        // readings back it, and says how many in `samples`.
        if self.profile.source == OOM_SOURCE && self.samples == 0 {
            return bad("an out-of-memory record that no sampler reading backs raises nothing");
        }
        Ok(())
    }
}

/// A job that shared the GPU with the observed job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Partner {
    /// The partner's job id.
    pub job: String,
    /// The partner's workload name.
    pub workload: String,
}

/// What one job achieved over one interval: alone (`partners` empty) or sharing the GPU.
/// This is also the spool file format (JSON), written by the epilog.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Observation {
    /// Unique key of this observation (`<cluster>/<job>/<segment>`); ingest stores each key once.
    pub key: String,
    /// Slurm job id.
    pub job: String,
    /// Workload name.
    pub workload: String,
    /// The jobs it shared the GPU with during the interval; empty when it ran alone.
    #[serde(default)]
    pub partners: Vec<Partner>,
    /// Node name.
    pub node: String,
    /// GPU (index or UUID) on the node.
    pub gpu: String,
    /// `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` the job ran with, when set.
    #[serde(default)]
    pub mps_share: Option<f64>,
    /// Interval start, Unix seconds.
    pub start: f64,
    /// Interval end, Unix seconds.
    pub end: f64,
    /// Steps done in the interval, when the job reported progress.
    #[serde(default)]
    pub steps: Option<f64>,
    /// Steps per second over the interval.
    pub throughput: f64,
    /// The job's user, as the epilog knows it (`None`: an import, or a record from before kace
    /// recorded it). What one user alone claims is limited in training (see
    /// [`MAX_GROUPS_PER_LONE_USER`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// The Slurm account the job was charged to (`SLURM_JOB_ACCOUNT`; `kace report --by
    /// account`), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    /// The GPU's mean SM utilization (%) over the interval, as `kace-sampler` (root) read it,
    /// when it did: what the job's claimed progress is checked against at ingest
    /// ([`implausibility`]). Not stored: it only decides whether the observation is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_sm_pct: Option<f64>,
    /// The GPU's energy over the interval, joules, from `kace-sampler`'s readings of its
    /// energy counter (root's, as `gpu_sm_pct`): the whole GPU's, which the job and its partners
    /// shared ([`Observation::energy_share_j`]). `None`: no sampler, or a GPU without the counter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_energy_j: Option<f64>,
}

/// Highest mean power an observation's energy may imply, W: no GPU draws this much, so a
/// record that claims more is refused rather than counted.
pub const MAX_OBSERVED_POWER_W: f64 = 10_000.0;

/// How far (percentage points) the SM activity a claimed rate implies may exceed what the
/// sampler measured on the GPU before the observation is refused: NVML's utilization is
/// sampled and averaged, and a profile's SM % was measured on another run.
pub const SM_ACTIVITY_SLACK_PCT: f64 = 15.0;

/// What kace knows of a workload to judge a job's claimed throughput by: its exclusive
/// throughput (the bound, [`crate::Db::exclusive_bounds`]) and its SM utilization alone (%).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Bound {
    /// Exclusive throughput, steps/s.
    pub exclusive: Option<f64>,
    /// SM utilization when it runs alone, %.
    pub sm_pct: Option<f64>,
}

/// Most untrusted groups of one workload combination that training takes from one user (an
/// unknown user counts as one): one user's 20 forged pairs (the re-audit's H1) weigh as 5,
/// however many they write; other users' groups of the combination count on their own. An
/// honest user's repeats beyond 5 add little: they re-measure the same pair. Trusted groups (an
/// admin's import or marks) are neither counted nor capped.
pub const MAX_GROUPS_PER_LONE_USER: usize = 5;

/// Longest observation key and job id accepted.
pub const MAX_KEY_LEN: usize = 256;

/// Most partners one observation may name: far more jobs than MPS lets share one GPU.
pub const MAX_PARTNERS: usize = 63;

/// Latest interval end accepted, Unix seconds (the year 2286): a time beyond it is garbage.
pub const MAX_TIME: f64 = 1e10;

/// How many times its exclusive throughput (the profile's `exclusive_throughput`) an observed
/// throughput may be. Sharing a GPU should only slow a job down, but measured profiles are not
/// that exact: the KACE artifact's own pairs hold jobs at up to 2.6 times the exclusive
/// throughput measured for them (wav2vec2-base-960h_batch2-inf, whisper-large-v2_batch2-inf:
/// small inference batches whose "exclusive" run was slowed by launch overhead). 4 keeps every
/// real measurement seen so far. Above it an observation is implausible: a progress file that
/// lies (the audit's 1.5e308 steps/s) or another workload's numbers, and it is kept out of
/// training.
pub const MAX_RATIO_TO_EXCLUSIVE: f64 = 4.0;

/// Largest throughput accepted for a workload whose exclusive throughput is not known yet.
pub const MAX_UNPROFILED_THROUGHPUT: f64 = 1e9;

/// Why an observation is implausible for a workload whose exclusive throughput is `exclusive`
/// (when known), or `None` when it is plausible. [`Observation::validate`] checks what an
/// observation must be on its own; this checks it against what kace knows of the workload.
pub fn implausibility(o: &Observation, bound: Bound) -> Option<String> {
    let exclusive = bound.exclusive.filter(|e| e.is_finite() && *e > 0.0);
    // Work needs the GPU: a job progressing at `np` times its alone rate keeps its kernels busy
    // about `np` times as long as alone (sharing never speeds a kernel up), and the GPU's SM
    // activity, which root measured, covers every job's kernels. A claim of 3.9 times the
    // alone rate at 50 % SM alone would need 195 % (the re-audit's H1: forged rates within
    // the 4x bound).
    if let (Some(e), Some(alone), Some(gpu)) = (exclusive, bound.sm_pct, o.gpu_sm_pct) {
        let busy = o.throughput / e * alone;
        if alone > 0.0 && busy > gpu + SM_ACTIVITY_SLACK_PCT {
            return Some(format!(
                "observation {}: throughput {} is {:.2} times {}'s exclusive {e}, which would \
                 keep the GPU's SMs busy {busy:.0} % of the time (alone: {alone:.0} %), but \
                 the sampler measured {gpu:.0} %",
                o.key,
                o.throughput,
                o.throughput / e,
                o.workload
            ));
        }
    }
    match exclusive {
        Some(e) if o.throughput > MAX_RATIO_TO_EXCLUSIVE * e => Some(format!(
            "observation {}: throughput {} is more than {MAX_RATIO_TO_EXCLUSIVE} times {}'s \
             exclusive throughput {e}",
            o.key, o.throughput, o.workload
        )),
        None if o.throughput > MAX_UNPROFILED_THROUGHPUT => Some(format!(
            "observation {}: throughput {} is above {MAX_UNPROFILED_THROUGHPUT}, and {} has no \
             exclusive throughput to compare with",
            o.key, o.throughput, o.workload
        )),
        _ => None,
    }
}

impl Observation {
    /// Whether the job ran alone.
    pub fn exclusive(&self) -> bool {
        self.partners.is_empty()
    }

    /// The job's share of the GPU's energy over the interval, joules: the GPU's divided equally
    /// among the kace jobs on it (the job and its partners). Each partner's observation of the
    /// same interval takes its own share, so summing shares over observations counts the GPU's
    /// energy once. Equal shares, not shares by work: one job's epilog knows only its own
    /// progress.
    pub fn energy_share_j(&self) -> Option<f64> {
        self.gpu_energy_j.map(|j| j / (1 + self.partners.len()) as f64)
    }

    /// Checks every field; the reason names the field so a quarantine note is useful.
    pub fn validate(&self) -> Result<()> {
        let bad = |reason: String| Err(Error::Invalid { reason });
        // Bidirectional overrides are refused with the control characters: they make a
        // listing lie about what it shows.
        let hostile = |c: char| {
            c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
        };
        let printable =
            |s: &str| !s.is_empty() && s.len() <= MAX_KEY_LEN && !s.chars().any(hostile);
        if !printable(&self.key) {
            return bad(format!(
                "observation key {:?} is empty, too long or has control characters",
                self.key
            ));
        }
        if !printable(&self.job) || !printable(&self.node) || !printable(&self.gpu) {
            return bad(format!("observation {}: empty or bad job, node or gpu", self.key));
        }
        if self.user.as_deref().is_some_and(|u| !printable(u)) {
            return bad(format!("observation {}: empty or bad user", self.key));
        }
        validate_workload_name(&self.workload)?;
        if self.partners.len() > MAX_PARTNERS {
            return bad(format!(
                "observation {}: {} partners (at most {MAX_PARTNERS})",
                self.key,
                self.partners.len()
            ));
        }
        for (i, p) in self.partners.iter().enumerate() {
            validate_workload_name(&p.workload)?;
            if !printable(&p.job) {
                return bad(format!("observation {}: bad partner job id", self.key));
            }
            if p.job == self.job || self.partners[..i].iter().any(|q| q.job == p.job) {
                return bad(format!(
                    "observation {}: partner job {} is the job itself or named twice",
                    self.key, p.job
                ));
            }
        }
        let time_ok = |t: f64| (0.0..=MAX_TIME).contains(&t);
        if !(time_ok(self.start) && time_ok(self.end) && self.end >= self.start) {
            return bad(format!(
                "observation {}: start and end must be Unix times (0 to {MAX_TIME}), end not \
                 before start",
                self.key
            ));
        }
        // A throughput is measured over an interval: one of no length measured nothing (the
        // re-audit's L10 stored one). Start and end both 0 say "when is not known", as a
        // colocation table's rows are imported.
        if self.end == self.start && self.start != 0.0 {
            return bad(format!(
                "observation {}: start = end = {}: an interval of no length measures no \
                 throughput",
                self.key, self.start
            ));
        }
        if !(self.throughput.is_finite() && self.throughput >= 0.0) {
            return bad(format!("observation {}: throughput must be a number ≥ 0", self.key));
        }
        if let Some(s) = self.steps {
            if !(s.is_finite() && s >= 0.0) {
                return bad(format!("observation {}: steps must be a number ≥ 0", self.key));
            }
        }
        if let Some(m) = self.mps_share {
            if !(m.is_finite() && m > 0.0 && m <= 100.0) {
                return bad(format!("observation {}: mps_share must be in (0, 100]", self.key));
            }
        }
        if let Some(sm) = self.gpu_sm_pct {
            // A NaN would make the SM check pass every claim.
            if !(sm.is_finite() && (0.0..=100.0).contains(&sm)) {
                return bad(format!("observation {}: gpu_sm_pct must be in [0, 100]", self.key));
            }
        }
        if let Some(j) = self.gpu_energy_j {
            if !(j.is_finite() && j >= 0.0 && j <= MAX_OBSERVED_POWER_W * (self.end - self.start)) {
                return bad(format!(
                    "observation {}: gpu_energy_j must be a number of joules ≥ 0 and at most \
                     {MAX_OBSERVED_POWER_W} W over the interval",
                    self.key
                ));
            }
        }
        Ok(())
    }
}

/// Which stored observations `kace observations remove|quarantine` applies to: every field given
/// must match, and at least one must be given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObservationFilter {
    /// The observation's key.
    pub key: Option<String>,
    /// The Slurm job id.
    pub job: Option<String>,
    /// The node it was measured on (its source: the epilog of that node, or `imported`).
    pub node: Option<String>,
}

/// Observations of k ≥ 2 jobs that ran together, each naming all the others (and only them) as
/// its partners, over a common interval: one training example.
#[derive(Debug, Clone, PartialEq)]
pub struct ObservedGroup {
    /// The members, the first-stored observation first.
    pub members: Vec<ObservedMember>,
    /// Whether every member's observation is trusted (an admin imported it or marked it): the
    /// group is then part of the reference a new model is checked on.
    pub trusted: bool,
}

/// One job of an [`ObservedGroup`].
#[derive(Debug, Clone, PartialEq)]
pub struct ObservedMember {
    /// Its workload.
    pub workload: String,
    /// Its throughput while in the group.
    pub throughput: f64,
    /// Key of its observation, for a stable training-set digest.
    pub key: String,
    /// Row id of its observation: ids grow as observations are stored, so a model that records
    /// the newest id it was trained on tells which groups it has seen.
    pub id: i64,
    /// The job's user, when recorded.
    pub user: Option<String>,
    /// End of its interval, Unix seconds (0: not known, an imported table's row).
    pub end: f64,
}

impl ObservedGroup {
    /// Number of jobs in the group.
    pub fn k(&self) -> usize {
        self.members.len()
    }

    /// The day (since the Unix epoch) its newest interval ended, when known: training ages
    /// out what lies far before the newest day (`kace_selector::training::repeats`).
    pub fn day(&self) -> Option<i64> {
        let end = self.members.iter().map(|m| m.end).fold(0.0, f64::max);
        (end > 0.0).then(|| (end / 86_400.0).floor() as i64)
    }

    /// The row id of its newest observation.
    pub fn newest(&self) -> i64 {
        self.members.iter().map(|m| m.id).max().unwrap_or(0)
    }
}

/// A model to store. The store treats the model's content as opaque JSON: the selector owns its
/// meaning, the store owns versions and the active flag.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewModel {
    /// Model kind (`linear`, …).
    pub kind: String,
    /// Feature names, in the order the coefficients use.
    pub features: Vec<String>,
    /// Normalisation parameters (means and standard deviations).
    pub normalisation: serde_json::Value,
    /// Coefficients (intercept and weights).
    pub coefficients: serde_json::Value,
    /// The whole serialized model, as the selector reads it back.
    pub body: serde_json::Value,
    /// Metrics measured at training time (held-out MSE, R², sizes, …).
    pub metrics: serde_json::Value,
    /// Digest of the training set (so two trainings on the same data can be recognised).
    pub training_digest: String,
    /// Number of training examples.
    pub training_size: usize,
}

/// A stored model version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelRecord {
    /// Version number, increasing from 1.
    pub version: i64,
    /// Everything that was stored.
    #[serde(flatten)]
    pub model: NewModel,
    /// Unix time of storage.
    pub created_at: f64,
    /// Whether the prolog uses this version.
    pub active: bool,
}

/// One candidate as a decision saw it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecisionCandidate {
    /// Candidate job id, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    /// Candidate workload.
    pub workload: String,
    /// Predicted throughput sum, when the candidate passed the filters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prediction: Option<f64>,
    /// Why it was rejected, when it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rejected: Option<String>,
    /// How long it had been held when the decision was made, seconds (from its submission or
    /// `--begin` time); `None` in records from before it was kept. The released job's value is
    /// its hold time (`kace metrics`' histogram).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_s: Option<f64>,
    /// The priority Slurm would have given it (kace's estimate of the multifactor sum; kace
    /// holds it with priority 0); `None` without priority/multifactor and in older records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<f64>,
    /// On the released job's own entry: the time limits its release lengthened so that
    /// sharing kills no job (its own before the release, the GPU's other jobs' after it);
    /// empty elsewhere and in older records.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub time_limits: Vec<TimeLimitChange>,
    /// On a candidate chosen to explore (`selection.explore_pairs`): the new workloads its
    /// group was formed to measure, though the model doubted it; empty elsewhere and in older
    /// records.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub explores: Vec<String>,
    /// On the released job's own entry: the SM share kace gave it beside the GPU's running
    /// job (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`, `mps.sm_split`); `None` when none was set and
    /// in older records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_pct: Option<u8>,
}

/// A time limit kace lengthened for sharing (`selection.time_limit = extend`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimeLimitChange {
    /// The job.
    pub job: String,
    /// Its limit before, seconds.
    pub from_s: f64,
    /// Its limit after, seconds.
    pub to_s: f64,
}

/// A partner choice to record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewDecision {
    /// Lead job id, when known (`None` for `kace select --dry-run`).
    pub lead_job: Option<String>,
    /// Lead workload.
    pub lead_workload: String,
    /// Chosen candidate's workload, if any.
    pub chosen_workload: Option<String>,
    /// Chosen candidate's job id, if any.
    pub chosen_job: Option<String>,
    /// Model version used.
    pub model_version: Option<i64>,
    /// Every candidate with its prediction or rejection reason.
    pub candidates: Vec<DecisionCandidate>,
}

/// A stored decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecisionRecord {
    /// Row id.
    pub id: i64,
    /// What was decided.
    #[serde(flatten)]
    pub decision: NewDecision,
    /// Unix time.
    pub created_at: f64,
    /// The spool key it was ingested under (`<cluster>/<job>/decision` from a prolog,
    /// `…/refill` from an epilog); `None` for rows from before schema version 2.
    #[serde(default)]
    pub key: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The selector refuses to activate a model predicting beyond the bound an observation
    /// must meet here: one number, kept in two crates (the selector knows nothing of the store).
    #[test]
    fn the_selectors_range_bound_is_the_stores() {
        assert_eq!(MAX_RATIO_TO_EXCLUSIVE, kace_selector::training::MAX_RATIO_TO_EXCLUSIVE);
    }

    #[test]
    fn workload_names() {
        assert!(validate_workload_name("bert-base-cased_batch2-inf").is_ok());
        assert!(validate_workload_name("a+b.c").is_ok());
        for bad in ["", "-x", ".x", "a b", "a/b", "a;b", &"x".repeat(129)] {
            assert!(validate_workload_name(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn observation_rules() {
        let mut o = Observation {
            key: "c/1/0".into(),
            job: "1".into(),
            workload: "w".into(),
            partners: vec![],
            node: "n1".into(),
            gpu: "0".into(),
            mps_share: None,
            start: 10.0,
            end: 20.0,
            steps: Some(5.0),
            throughput: 0.5,
            user: None,
            account: None,
            gpu_sm_pct: None,
            gpu_energy_j: Some(2_000.0),
        };
        assert!(o.validate().is_ok());
        assert!(o.exclusive());
        assert_eq!(o.energy_share_j(), Some(2_000.0));
        for bad in [f64::NAN, -1.0, 10_000.0 * 10.0 + 1.0] {
            let e = Observation { gpu_energy_j: Some(bad), ..o.clone() }.validate().unwrap_err();
            assert!(e.to_string().contains("gpu_energy_j"), "{e}");
        }
        let shared = Observation {
            partners: vec![Partner { job: "2".into(), workload: "v".into() }],
            ..o.clone()
        };
        assert_eq!(shared.energy_share_j(), Some(1_000.0));
        o.gpu_energy_j = None;
        o.end = 5.0;
        assert!(o.validate().is_err());
        o.end = 10.0;
        let e = o.validate().unwrap_err().to_string();
        assert!(e.contains("an interval of no length"), "{e}");
        (o.start, o.end) = (0.0, 0.0);
        assert!(o.validate().is_ok(), "an imported row: when is not known");
        (o.start, o.end) = (10.0, 20.0);
        // Work needs the GPU (issue 31 item 4): 3.9 times the alone rate at 50 % SM alone
        // would keep the SMs busy 195 % of the time; the sampler measured 60 %.
        let b = Bound { exclusive: Some(1.0), sm_pct: Some(50.0) };
        (o.throughput, o.gpu_sm_pct) = (3.9, Some(60.0));
        let why = implausibility(&o, b).unwrap();
        assert!(why.contains("busy 195 % of the time") && why.contains("measured 60 %"), "{why}");
        o.throughput = 1.4;
        assert_eq!(implausibility(&o, b), None, "70 % implied, 60 % measured: within the slack");
        (o.throughput, o.gpu_sm_pct) = (3.9, None);
        assert_eq!(implausibility(&o, b), None, "no sampler: only the 4x bound");
        o.throughput = 0.5;
        o.throughput = f64::NAN;
        assert!(o.validate().is_err());
        o.throughput = 1.0;
        o.mps_share = Some(150.0);
        assert!(o.validate().is_err());
        o.mps_share = None;
        o.gpu_sm_pct = Some(f64::NAN);
        assert!(o.validate().unwrap_err().to_string().contains("gpu_sm_pct"));
    }

    #[test]
    fn a_groups_day_is_its_newest_end() {
        let m = |end: f64| ObservedMember {
            workload: "w".into(),
            throughput: 1.0,
            key: "k".into(),
            id: 1,
            user: None,
            end,
        };
        let g = |ends: &[f64]| ObservedGroup {
            members: ends.iter().map(|e| m(*e)).collect(),
            trusted: false,
        };
        assert_eq!(g(&[0.0, 0.0]).day(), None, "an imported row: when is not known");
        assert_eq!(g(&[86_399.0, 2.0 * 86_400.0 + 5.0]).day(), Some(2));
    }

    #[test]
    fn profile_complete_and_missing() {
        let mut p = Profile {
            workload: "w".into(),
            gpu_model: "g".into(),
            values: [Some(1.0); FEATURE_COUNT],
            updated_at: 0.0,
            sources: Default::default(),
            observed_runs: 0,
            observed_samples: 0,
        };
        assert_eq!(p.complete(), Some([1.0; FEATURE_COUNT]));
        p.values[MEMCAP] = None;
        assert_eq!(p.complete(), None);
        assert_eq!(p.missing(), vec!["memcap_gib"]);
    }
}
