//! kace's configuration file: a typed TOML document with documented defaults, where an unknown
//! key or a bad value is an error, never silently ignored.
//!
//! Lookup: an explicit path (e.g. `kace --config`), else `$KACE_CONFIG`, else
//! [`DEFAULT_PATH`]. A missing default file means "all defaults"; a missing file that was named
//! explicitly is an error, because the admin asked for that file.
//!
//! ```toml
//! # /etc/slurm/kace.conf
//! [database]
//! path = "/var/lib/kace/kace.db"
//!
//! [spool]
//! dir = "/var/spool/kace/observations"
//! quarantine = "/var/spool/kace/quarantine"
//!
//! [selection]
//! memory_margin = 0.05    # keep 5 % of GPU memory free
//! min_gain = 0.0          # predicted normalised progress must beat the GPU without a joiner by this fraction
//! objective = "throughput-sum"   # or "normalised-progress", or "energy" (work per joule)
//! max_jobs_per_gpu = 2    # kace jobs sharing one GPU (3-4 make sense on 80-141 GiB GPUs)
//! time_limit = "extend"   # lengthen time limits by sharing's predicted cost; "refuse"; "ignore"
//! time_limit_cap = 2.0    # at most this multiple of a job's own limit
//! priority_window = 4     # a joiner is chosen among the 4 held jobs first in Slurm's priority order
//! refill = true           # false: fill a GPU only at its lead's start (for comparison)
//! refuse_likely_harm = true   # a doubtful group needs a larger predicted gain
//! explore_pairs = 3       # a new workload may be paired 3 times beside its safest partner, to be learnt
//! explore_weight = 0.5    # ... when predicted to gain at least 0.5 × the model's doubt
//!
//! [mps]
//! multi_user = false      # true: one MPS server for all users (-M), jobs of different users share
//! server_user = ""        # with multi_user: the account the server runs as (no job's user)
//! memory_limit = true     # each kace job's tasks get CUDA_MPS_PINNED_DEVICE_MEM_LIMIT
//! memory_limit_margin = 0.1   # that limit is memcap × (1 + this)
//!
//! [profile]               # profiles kace measures itself from jobs that ran alone
//! min_alone_runs = 1      # observed alone runs before an unprofiled workload is a candidate (1-10)
//! min_samples = 10        # sampler readings an alone run needs to count
//!
//! [profiling]
//! warmup_steps = 10
//! sample_interval_ms = 1000
//!
//! [sampler]               # kace-sampler: GPU readings while kace jobs run
//! dir = "/run/kace/samples"
//! interval_ms = 1000
//! capacity = 86400        # readings kept per GPU (a day at 1 Hz)
//! progress_max_bytes = 8388608   # a running job's progress file is compacted past 8 MiB
//!
//! [training]
//! holdout_fraction = 0.2
//! seed = 30
//! model = "slowdown"      # or "linear" (the paper's regression)
//!
//! [node]
//! scontrol = "/usr/bin/scontrol"
//! squeue = "/usr/bin/squeue"
//! sinfo = "/usr/bin/sinfo"
//! mps_control = "/usr/bin/nvidia-cuda-mps-control"
//! command_timeout_ms = 2000
//! prolog_budget_ms = 5000
//! mps_root = "/run/kace/mps"
//! progress_root = "/var/spool/kace/progress"
//! state_dir = "/run/kace"
//! # gpu_memory_gib = 32.0  # when NVML cannot tell
//!
//! [dispatch]
//! max_hold_s = 600
//! lock = "/run/kace/dispatch.lock"
//! socket = "/run/kace/dispatch.sock"
//! submitted = "/run/kace/submitted"
//! state_dir = "/run/kace/decider"
//! backstop_s = 10
//! rpc_budget_per_min = 600
//!
//! [log]
//! syslog_socket = "/dev/log"   # "" logs to stderr only
//! ```

#![warn(missing_docs)]

use std::fmt;
use std::path::{Path, PathBuf};

pub use kace_selector::{ModelKind, Objective};
use serde::Deserialize;

/// Where the site configuration lives when nothing else is named (next to `slurm.conf`).
pub const DEFAULT_PATH: &str = "/etc/slurm/kace.conf";

/// Environment variable that names another configuration file.
pub const ENV_VAR: &str = "KACE_CONFIG";

/// The whole configuration.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// The SQLite database.
    pub database: Database,
    /// The observation spool.
    pub spool: Spool,
    /// Partner selection.
    pub selection: Selection,
    /// The MPS control daemons.
    pub mps: Mps,
    /// Profiles kace measures itself (the epilog, from the sampler's readings).
    pub profile: ProfileSection,
    /// `kace profile run`.
    pub profiling: Profiling,
    /// `kace train` / nightly retrain.
    pub training: Training,
    /// The node side: kace-prolog and kace-epilog.
    pub node: Node,
    /// `kace dispatch` on the controller.
    pub dispatch: Dispatch,
    /// `kace-sampler`, the node service that samples each GPU for system profiles.
    pub sampler: Sampler,
    /// `[log]`
    pub log: Log,
}

/// `[database]`
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Database {
    /// Path of the database file. Default `/var/lib/kace/kace.db`.
    pub path: PathBuf,
}

impl Default for Database {
    fn default() -> Self {
        Database { path: PathBuf::from("/var/lib/kace/kace.db") }
    }
}

/// `[spool]`
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Spool {
    /// Where the epilog writes observation files. Default `/var/spool/kace/observations`.
    pub dir: PathBuf,
    /// Where ingest moves files it cannot read. Default `/var/spool/kace/quarantine`.
    pub quarantine: PathBuf,
}

impl Default for Spool {
    fn default() -> Self {
        Spool {
            dir: PathBuf::from("/var/spool/kace/observations"),
            quarantine: PathBuf::from("/var/spool/kace/quarantine"),
        }
    }
}

/// `[selection]`
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Selection {
    /// Fraction of GPU memory kept free when adding memcaps: a pair fits when
    /// Σ memcap ≤ GPU memory × (1 − margin). Default 0.05.
    pub memory_margin: f64,
    /// A candidate is chosen only when the group's predicted normalised progress (Σ colocated /
    /// exclusive; one job alone is 1) beats the GPU's without it by more than this fraction
    /// (0.05 = 5 %), whatever the objective: steps per second of different jobs do not add up
    /// to "more work". A linear model, which predicts its objective only, compares that.
    /// Default 0.0.
    pub min_gain: f64,
    /// What a pairing is worth: `"throughput-sum"` (the paper's Σ steps/s, default),
    /// `"normalised-progress"` (Σ colocated/exclusive throughput per job, so one fast inference
    /// job cannot dominate the choice) or `"energy"` (normalised progress per unit of the GPU's
    /// modelled power, `kace_selector::energy`: a slowdown model only; models are trained for
    /// normalised progress).
    pub objective: Objective,
    /// At most this many kace jobs share one GPU: the lead's choice, an epilog's refill and
    /// dispatch fill a GPU up to it, and jobs released by `max_hold` never go onto a GPU at it.
    /// The memory check covers the whole group. Default 2; 3–4 make sense on 80–141 GiB GPUs.
    /// The GPU's shard count in gres.conf must be at least this.
    pub max_jobs_per_gpu: usize,
    /// Fill a GPU whenever it has room: when a partner leaves (the epilog's refill), when a
    /// joiner leaves room, and for jobs that arrive while it is open (dispatch). Default true.
    /// `false` fills a GPU only at its lead's start, as kace did before; it is there to
    /// measure the difference on a site's own workload.
    pub refill: bool,
    /// Refuse a group whose predicted normalised progress (Σ colocated/exclusive) does not beat
    /// running the jobs one after the other by the model's doubt about it (its residual spread
    /// for these workloads, scaled by a weight chosen by cross-validation at training so that
    /// at most 2 % of held-out groups are harmful). Default true: a pair slower together than
    /// one after the other costs both jobs; on the KACE artifact the rule cuts harmful pairs
    /// from about 10 % to 2–3 % and keeps as much of an oracle's gain (docs/models.md). false
    /// forms any pair predicted to beat the GPU without it.
    pub refuse_likely_harm: bool,
    /// What sharing does to time limits, which it must not make kill a job: `"extend"`
    /// (default) lengthens the joiner's and its GPU's jobs' limits by what sharing is
    /// predicted to cost them (the group's predicted normalised progress per member), and
    /// refuses a pair that would need more than `time_limit_cap` times a limit or more than
    /// its partition's MaxTime; `"refuse"` pairs only jobs without a time limit; `"ignore"`
    /// leaves limits alone (a shared job may be killed at its `--time`).
    pub time_limit: TimeLimit,
    /// The most a time limit is lengthened to, as a multiple of the job's own. Default 2.0;
    /// in [1, 10].
    pub time_limit_cap: f64,
    /// How far kace may reorder Slurm's priority order for throughput. Leads start in
    /// Slurm's order (multifactor priority: fair-share, QOS, partition, age); a joiner is
    /// chosen among the first `priority_window` held jobs of that order that may go to the
    /// GPU, and a held job passed over `priority_window` times by jobs of lower priority is
    /// the only candidate at its next chance. 1 keeps Slurm's order exactly. Default 4
    /// (chosen before any measurement: a GPU takes one joiner at a time, and four candidates
    /// give the decision a choice among the workloads a queue mixes); in [1, 64].
    pub priority_window: usize,
    /// Exploration of new workloads. A workload the active model never learnt from (no group
    /// with it observed yet) is paired only where the model is confident by its new-workload
    /// margin, so it is often left alone and stays unknown for days. With this above 0, when no
    /// candidate passes, a group with such a workload is formed anyway, at most this many times
    /// per workload (counted by the decider, `dispatch.state_dir`), beside the partner the model
    /// predicts safest (highest predicted progress minus its doubt), if it is predicted to gain
    /// at least `explore_weight` × the model's doubt. The epilog observes it and the nightly
    /// `kace retrain` learns the workload. Default 3 (chosen on the simulated site's
    /// development seeds, docs/models.md); in [0, 10]; 0 never explores.
    pub explore_pairs: u32,
    /// The doubts of predicted gain an exploratory group must show (the model's κ and κ_new,
    /// which refused it, are larger): no exploratory group is predicted harmful. Default 0.5; in
    /// [0, 5].
    pub explore_weight: f64,
}

/// `[selection] time_limit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TimeLimit {
    /// Lengthen limits by the predicted cost of sharing (within the cap), or do not pair.
    Extend,
    /// Pair only jobs without a time limit.
    Refuse,
    /// Leave limits alone.
    Ignore,
}

impl Default for Selection {
    fn default() -> Self {
        // The decision library's defaults, except that production refuses likely harm.
        let rules = kace_selector::SelectionRules::default();
        Selection {
            memory_margin: rules.memory_margin,
            min_gain: rules.min_gain,
            objective: rules.objective,
            max_jobs_per_gpu: kace_selector::decision::Policy::default().max_jobs_per_gpu,
            refill: true,
            refuse_likely_harm: true,
            time_limit: TimeLimit::Extend,
            time_limit_cap: 2.0,
            priority_window: 4,
            explore_pairs: kace_selector::selection::EXPLORE_PAIRS,
            explore_weight: kace_selector::selection::EXPLORE_WEIGHT,
        }
    }
}

/// `[mps]`
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Mps {
    /// Start each GPU's MPS control daemon in multi-user mode (`nvidia-cuda-mps-control -d
    /// -M`, Volta and newer): one server serves every user's jobs, so kace may pair jobs of
    /// different users. Off by default: in this mode nothing isolates one user's job from
    /// another's (memory faults and hangs reach all clients). Off, MPS time-slices clients of
    /// different users, so kace pairs only jobs of the same user.
    pub multi_user: bool,
    /// With `multi_user`: the account each GPU's MPS server runs as (`start_server -uid` of
    /// its uid), a service account no job runs as, so that no job's user owns the process
    /// serving another user's job (the re-audit's M3: the server was the lead's user's, who
    /// could kill or ptrace it). Required when `multi_user` is on; not `root`. Default "".
    pub server_user: String,
    /// Give each kace job's tasks `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` for its GPU (the memory
    /// guard), so that a job outgrowing its profile fails alone instead of ending its partner
    /// with an out-of-memory error. Default true; a workload without a memcap gets no limit.
    pub memory_limit: bool,
    /// The limit is memcap × (1 + this). Default 0.1; in [0, 10].
    pub memory_limit_margin: f64,
    /// Give a job kace adds beside one running kace job the `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`
    /// the active SM split chooser picks (`kace splits train`, trained on sweeps with the lead
    /// at 100 %; the lead keeps its share, MPS cannot change a running client's). Default
    /// false: off until a GPU run confirms the chooser's gains (docs/models.md, *The SM split*).
    pub sm_split: bool,
}

/// Whether `name` is a user name as `useradd` makes them (so that it names one account).
fn valid_account_name(name: &str) -> bool {
    let mut b = name.bytes();
    name.len() <= 32
        && b.next().is_some_and(|c| c.is_ascii_lowercase() || c == b'_')
        && b.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_' || c == b'-')
}

impl Default for Mps {
    fn default() -> Self {
        Mps {
            multi_user: false,
            server_user: String::new(),
            memory_limit: true,
            memory_limit_margin: 0.1,
            sm_split: false,
        }
    }
}

/// `[profile]`: the profiles kace measures itself. While kace jobs run, `kace-sampler` reads
/// each GPU; the epilog turns the readings of a job's alone intervals into a profile
/// measurement of source `observed` (and, with progress lines, its exclusive throughput).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProfileSection {
    /// Observed alone runs after which a workload no admin profiled becomes a candidate.
    /// Default 1; in [1, 10] (kace keeps a workload's newest 10 observed measurements).
    pub min_alone_runs: u32,
    /// Sampler readings (both utilizations known) an alone run needs before the epilog makes
    /// a measurement of it. Default 10 (10 s at the sampler's default 1 Hz); at least 1.
    pub min_samples: u32,
}

impl Default for ProfileSection {
    fn default() -> Self {
        ProfileSection {
            min_alone_runs: kace_selector::decision::Policy::default().min_alone_runs,
            min_samples: 10,
        }
    }
}

/// `[profiling]`
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Profiling {
    /// Progress lines dropped at the start of a profiling run (the artifact drops 10).
    pub warmup_steps: u64,
    /// NVML sampling period in milliseconds (the artifact used `nvidia-smi pmon`, 1 s).
    pub sample_interval_ms: u64,
}

impl Default for Profiling {
    fn default() -> Self {
        Profiling { warmup_steps: 10, sample_interval_ms: 1000 }
    }
}

/// `[sampler]`: `kace-sampler`, which reads every GPU's SM %, memory-bandwidth %, memory in
/// use, energy counter and power into a bounded ring per GPU, from which the epilog builds the
/// system profile of a job's alone intervals and each interval's energy.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Sampler {
    /// Directory of the per-GPU ring files. Default `/run/kace/samples`.
    pub dir: PathBuf,
    /// Time between readings, milliseconds. Default 1000.
    pub interval_ms: u64,
    /// Readings kept per GPU; the oldest are overwritten. Default 86400 (a day at 1 Hz,
    /// 4.0 MiB per GPU at 48 bytes a reading).
    pub capacity: u32,
    /// A running job's progress file (in `node.progress_root`) holding more than this many
    /// bytes is compacted in place at the next reading, to at most half of it, keeping the
    /// points the epilog measures throughput from. Default 8388608 (8 MiB: the Python helper
    /// caps itself at 1 MiB, a line per second for a month is about 60 MiB before compaction).
    /// Between 65536 and [`MAX_PROGRESS_MAX_BYTES`], so that whatever a job appends in one
    /// interval on top of it still fits in what the epilog reads.
    pub progress_max_bytes: u64,
}

/// The largest `sampler.progress_max_bytes`: half of the 16 MiB the epilog reads of a progress
/// file (`kace_profiling::progress::MAX_BYTES`), the rest being room for one interval's lines.
pub const MAX_PROGRESS_MAX_BYTES: u64 = 8 << 20;

impl Default for Sampler {
    fn default() -> Self {
        Sampler {
            dir: PathBuf::from("/run/kace/samples"),
            interval_ms: 1000,
            capacity: 86_400,
            progress_max_bytes: MAX_PROGRESS_MAX_BYTES,
        }
    }
}

/// `[training]`
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Training {
    /// Fraction of observed groups held out to compare a new model with the active one.
    /// Default 0.2.
    pub holdout_fraction: f64,
    /// Seed of the held-out split, so that a retrain on the same data gives the same model.
    pub seed: u64,
    /// Kind of model to train: `"slowdown"` (kace's per-job model, default; see
    /// `docs/models.md`) or `"linear"` (the paper's regression).
    pub model: ModelKind,
}

impl Default for Training {
    fn default() -> Self {
        use kace_selector::training::{DEFAULT_HOLDOUT_FRACTION, DEFAULT_SEED};
        Training {
            holdout_fraction: DEFAULT_HOLDOUT_FRACTION,
            seed: DEFAULT_SEED,
            model: ModelKind::Slowdown,
        }
    }
}

/// `[node]`: what kace-prolog and kace-epilog run and where they keep state. Slurm runs them
/// as root with no PATH, so every program is named by absolute path.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Node {
    /// `scontrol`, by absolute path. Default `/usr/bin/scontrol`.
    pub scontrol: PathBuf,
    /// `squeue`, by absolute path. Default `/usr/bin/squeue`.
    pub squeue: PathBuf,
    /// `sinfo`, by absolute path (used by `kace dispatch`). Default `/usr/bin/sinfo`.
    pub sinfo: PathBuf,
    /// NVIDIA's MPS control program. Default `/usr/bin/nvidia-cuda-mps-control`.
    pub mps_control: PathBuf,
    /// Each external command is killed after this many milliseconds. Default 2000.
    pub command_timeout_ms: u64,
    /// The prolog (and the epilog) gives up whatever it still has to do after this many
    /// milliseconds (its total, all commands included), so that it never holds a job or a
    /// node up for long. Default 5000.
    pub prolog_budget_ms: u64,
    /// Root of the per-GPU MPS directories; must equal the SPANK plugin's `mps_root`.
    pub mps_root: PathBuf,
    /// Directory of the per-job progress files; must equal the plugin's `progress_root`.
    pub progress_root: PathBuf,
    /// Node-local state: per-GPU lock files and the record of kace jobs on each GPU.
    /// Default `/run/kace` (a tmpfs: a reboot ends every job anyway).
    pub state_dir: PathBuf,
    /// GPU memory in GiB, used when NVML cannot tell (no driver); unset skips the memory
    /// filter in that case.
    pub gpu_memory_gib: Option<f64>,
}

impl Default for Node {
    fn default() -> Self {
        Node {
            scontrol: PathBuf::from("/usr/bin/scontrol"),
            squeue: PathBuf::from("/usr/bin/squeue"),
            sinfo: PathBuf::from("/usr/bin/sinfo"),
            mps_control: PathBuf::from("/usr/bin/nvidia-cuda-mps-control"),
            command_timeout_ms: 2000,
            prolog_budget_ms: 5000,
            mps_root: PathBuf::from(kace_layout::DEFAULT_MPS_ROOT),
            progress_root: PathBuf::from(kace_layout::DEFAULT_PROGRESS_ROOT),
            state_dir: PathBuf::from("/run/kace"),
            gpu_memory_gib: None,
        }
    }
}

/// `[dispatch]`: `kace dispatch`, run by `EpilogSlurmctld=` and a timer on the controller.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Dispatch {
    /// A kace job held longer than this many seconds is released wherever Slurm puts it, so
    /// that nothing waits forever for a partner. Default 600 (10 minutes).
    pub max_hold_s: u64,
    /// Lock file that keeps one decider at a time: the `kace dispatch --watch` service holds
    /// it for its life; a `kace dispatch` pass while no service runs holds it for the pass.
    /// Default `/run/kace/dispatch.lock`.
    pub lock: PathBuf,
    /// The root-only Unix socket the service listens on; `kace-dispatch` (PrologSlurmctld,
    /// EpilogSlurmctld) sends it a nudge and returns. Default `/run/kace/dispatch.sock`.
    pub socket: PathBuf,
    /// The file the gate (job_submit.lua) rewrites on each kace submission, so that the
    /// service passes at once without asking Slurm (it looks at the file's time ten times a
    /// second). It must be writable by SlurmUser (packaging/kace.tmpfiles). Default
    /// `/run/kace/submitted`.
    pub submitted: PathBuf,
    /// Where the decider keeps what it learnt and what it began: the GPUs of running kace
    /// jobs (read once per job) and releases begun but not finished. Default
    /// `/run/kace/decider`.
    pub state_dir: PathBuf,
    /// The service passes at least this often when nothing wakes it (lost nudges, a Slurm
    /// without the gate's file). At least 5. Default 10.
    pub backstop_s: u64,
    /// `kace doctor --controller` warns when kace ran more Slurm RPCs than this in a minute.
    /// Default 600.
    pub rpc_budget_per_min: u64,
}

impl Default for Dispatch {
    fn default() -> Self {
        Dispatch {
            max_hold_s: 600,
            lock: PathBuf::from("/run/kace/dispatch.lock"),
            socket: PathBuf::from("/run/kace/dispatch.sock"),
            submitted: PathBuf::from("/run/kace/submitted"),
            state_dir: PathBuf::from("/run/kace/decider"),
            backstop_s: 10,
            rpc_budget_per_min: 600,
        }
    }
}

/// `[log]`: where the node programs and `kace dispatch` send their lines besides stderr
/// (Slurm keeps neither a successful prolog's stderr nor EpilogSlurmctld's at default levels).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Log {
    /// The syslog socket (rsyslog or journald) lines are sent to, as ident `kace`, facility
    /// daemon. Default `/dev/log`; an empty string sends nothing to syslog.
    pub syslog_socket: PathBuf,
}

impl Default for Log {
    fn default() -> Self {
        Log { syslog_socket: PathBuf::from("/dev/log") }
    }
}

impl Log {
    /// The socket to send to, `None` when syslog is off.
    pub fn socket(&self) -> Option<&Path> {
        (!self.syslog_socket.as_os_str().is_empty()).then_some(self.syslog_socket.as_path())
    }
}

/// Why a configuration could not be loaded.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The file could not be read.
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The path is not a regular file (a FIFO, a device, a directory, a socket), or is larger
    /// than [`MAX_CONFIG_BYTES`]: reading it could block or never end (the re-audit's L5: a FIFO
    /// kace.conf hung `kace-dispatch`, `kace status` and `--watch`).
    NotRegular {
        /// The file.
        path: PathBuf,
        /// What it is instead.
        what: String,
    },
    /// The file is not valid TOML for kace (syntax, unknown key, wrong type).
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message, with line and column.
        message: String,
    },
    /// A value is out of its range.
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Read { path, source } => {
                write!(f, "couldn't read config {}: {source}", path.display())
            }
            Error::NotRegular { path, what } => {
                write!(f, "couldn't read config {}: {what}, not a regular file", path.display())
            }
            Error::Parse { path, message } => {
                write!(f, "couldn't parse config {}: {}", path.display(), message.trim_end())
            }
            Error::Invalid { path, reason } => {
                write!(f, "couldn't use config {}: {reason}", path.display())
            }
        }
    }
}

// Display already carries the cause, so no `source` (it would print twice in a chain).
impl std::error::Error for Error {}

/// Where the configuration came from.
#[derive(Debug, Clone, PartialEq)]
pub enum Origin {
    /// Read from this file.
    File(PathBuf),
    /// The default file does not exist: built-in defaults.
    Defaults,
}

impl Config {
    /// The rules of every decision ([`kace_selector::decision::decide`]) under this
    /// configuration; the GPU's memory comes from the GPU.
    pub fn policy(&self) -> kace_selector::decision::Policy {
        let s = &self.selection;
        kace_selector::decision::Policy {
            rules: kace_selector::SelectionRules {
                gpu_memory_gib: None,
                memory_margin: s.memory_margin,
                require_same_user: !self.mps.multi_user,
                min_gain: s.min_gain,
                objective: s.objective,
                refuse_likely_harm: s.refuse_likely_harm,
                explore_pairs: s.explore_pairs,
                explore_weight: s.explore_weight,
            },
            max_jobs_per_gpu: s.max_jobs_per_gpu,
            multi_user: self.mps.multi_user,
            min_alone_runs: self.profile.min_alone_runs,
        }
    }

    /// Parses a configuration document; `path` is only used in messages.
    pub fn parse(text: &str, path: &Path) -> Result<Config, Error> {
        let cfg: Config = toml::from_str(text)
            .map_err(|e| Error::Parse { path: path.to_path_buf(), message: e.to_string() })?;
        cfg.validate().map_err(|reason| Error::Invalid { path: path.to_path_buf(), reason })?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<(), String> {
        let s = &self.selection;
        if !(0.0..1.0).contains(&s.memory_margin) {
            return Err(format!(
                "selection.memory_margin = {}: must be in [0, 1)",
                s.memory_margin
            ));
        }
        if !(s.min_gain.is_finite() && s.min_gain > -1.0) {
            return Err(format!("selection.min_gain = {}: must be a number above -1", s.min_gain));
        }
        if s.objective == Objective::Energy && self.training.model == ModelKind::Linear {
            return Err("selection.objective = \"energy\" needs training.model = \"slowdown\": \
                        the energy objective is derived from each job's predicted slowdown, \
                        which a linear model does not predict"
                .into());
        }
        if !(1.0..=10.0).contains(&s.time_limit_cap) {
            return Err(format!(
                "selection.time_limit_cap = {}: must be in [1, 10]",
                s.time_limit_cap
            ));
        }
        if !(1..=64).contains(&s.priority_window) {
            return Err(format!(
                "selection.priority_window = {}: must be in [1, 64]",
                s.priority_window
            ));
        }
        if s.explore_pairs > 10 {
            return Err(format!(
                "selection.explore_pairs = {}: must be in [0, 10]",
                s.explore_pairs
            ));
        }
        if !(0.0..=5.0).contains(&s.explore_weight) {
            return Err(format!(
                "selection.explore_weight = {}: must be in [0, 5]",
                s.explore_weight
            ));
        }
        if !(2..=16).contains(&s.max_jobs_per_gpu) {
            return Err(format!(
                "selection.max_jobs_per_gpu = {}: must be between 2 and 16",
                s.max_jobs_per_gpu
            ));
        }
        let h = self.training.holdout_fraction;
        if !(h > 0.0 && h < 1.0) {
            return Err(format!("training.holdout_fraction = {h}: must be in (0, 1)"));
        }
        let pr = &self.profile;
        if !(1..=10).contains(&pr.min_alone_runs) {
            return Err(format!(
                "profile.min_alone_runs = {}: must be between 1 and 10",
                pr.min_alone_runs
            ));
        }
        if pr.min_samples == 0 {
            return Err("profile.min_samples must be at least 1".into());
        }
        let u = &self.mps.server_user;
        if self.mps.multi_user && u.is_empty() {
            return Err("mps.multi_user = true needs mps.server_user: the service account the \
                        shared MPS server runs as (no job's user may own it)"
                .into());
        }
        if !u.is_empty() && !valid_account_name(u) {
            return Err(format!(
                "mps.server_user = {u:?}: must be a user name ([a-z_][a-z0-9_-]*, at most 32)"
            ));
        }
        if u == "root" {
            return Err("mps.server_user = \"root\": the server runs its clients' GPU work; \
                        give it an account of its own"
                .into());
        }
        let m = self.mps.memory_limit_margin;
        if !(m.is_finite() && (0.0..=10.0).contains(&m)) {
            return Err(format!("mps.memory_limit_margin = {m}: must be in [0, 10]"));
        }
        if self.profiling.sample_interval_ms == 0 {
            return Err("profiling.sample_interval_ms must be at least 1".into());
        }
        let sp = &self.sampler;
        if !(100..=60_000).contains(&sp.interval_ms) {
            return Err(format!(
                "sampler.interval_ms = {}: must be in [100, 60000]",
                sp.interval_ms
            ));
        }
        if !(60..=10_000_000).contains(&sp.capacity) {
            return Err(format!("sampler.capacity = {}: must be in [60, 10000000]", sp.capacity));
        }
        if !(65_536..=MAX_PROGRESS_MAX_BYTES).contains(&sp.progress_max_bytes) {
            return Err(format!(
                "sampler.progress_max_bytes = {}: must be in [65536, {MAX_PROGRESS_MAX_BYTES}]",
                sp.progress_max_bytes
            ));
        }
        for (key, p) in [
            ("database.path", &self.database.path),
            ("spool.dir", &self.spool.dir),
            ("spool.quarantine", &self.spool.quarantine),
        ] {
            if p.as_os_str().is_empty() {
                return Err(format!("{key} is empty"));
            }
        }
        let n = &self.node;
        // Slurm runs the prolog and epilog with no PATH: a relative program name would be
        // resolved against whatever directory slurmd happens to be in, and a relative file
        // against whatever directory the command runs in (the re-audit's L10 found
        // database.path = "relative.db" accepted). A NUL cannot be in a path: it would only
        // fail later, in the middle of a job's prolog (L10: node.mps_root with a NUL).
        for (key, p) in [
            ("database.path", &self.database.path),
            ("spool.dir", &self.spool.dir),
            ("spool.quarantine", &self.spool.quarantine),
            ("sampler.dir", &self.sampler.dir),
            ("node.scontrol", &n.scontrol),
            ("node.squeue", &n.squeue),
            ("node.sinfo", &n.sinfo),
            ("node.mps_control", &n.mps_control),
            ("node.mps_root", &n.mps_root),
            ("node.progress_root", &n.progress_root),
            ("node.state_dir", &n.state_dir),
            ("dispatch.lock", &self.dispatch.lock),
            ("dispatch.socket", &self.dispatch.socket),
            ("dispatch.submitted", &self.dispatch.submitted),
            ("dispatch.state_dir", &self.dispatch.state_dir),
        ] {
            if !p.is_absolute() {
                return Err(format!("{key} = {:?}: must be an absolute path", p.display()));
            }
            if p.as_os_str().as_encoded_bytes().contains(&0) {
                return Err(format!("{key} = {:?}: a path cannot hold a NUL byte", p.display()));
            }
        }
        if n.mps_root.as_os_str().len() > kace_layout::MAX_MPS_ROOT_LEN {
            return Err(format!(
                "node.mps_root is longer than {} bytes (the MPS socket path must fit sun_path)",
                kace_layout::MAX_MPS_ROOT_LEN
            ));
        }
        if n.command_timeout_ms == 0 || n.prolog_budget_ms == 0 {
            return Err(
                "node.command_timeout_ms and node.prolog_budget_ms must be at least 1".into()
            );
        }
        if let Some(g) = n.gpu_memory_gib {
            if !(g.is_finite() && g > 0.0) {
                return Err(format!("node.gpu_memory_gib = {g}: must be a positive number"));
            }
        }
        if self.dispatch.max_hold_s == 0 {
            return Err("dispatch.max_hold_s must be at least 1".into());
        }
        if self.dispatch.backstop_s < 5 {
            return Err(format!(
                "dispatch.backstop_s = {}: must be at least 5 (nudges wake the decider; the \
                 backstop only covers lost ones)",
                self.dispatch.backstop_s
            ));
        }
        // sun_path holds 108 bytes with its terminating NUL.
        if self.dispatch.socket.as_os_str().len() > 100 {
            return Err(
                "dispatch.socket is longer than 100 bytes (a Unix socket path must fit sun_path)"
                    .into(),
            );
        }
        if self.dispatch.rpc_budget_per_min == 0 {
            return Err("dispatch.rpc_budget_per_min must be at least 1".into());
        }
        if let Some(s) = self.log.socket() {
            if !s.is_absolute() {
                return Err(format!(
                    "log.syslog_socket = {:?}: must be an absolute path (or \"\" for none)",
                    s.display()
                ));
            }
        }
        Ok(())
    }

    /// Loads the configuration: `explicit`, else `$KACE_CONFIG`, else [`DEFAULT_PATH`].
    pub fn load(explicit: Option<&Path>) -> Result<(Config, Origin), Error> {
        let env = std::env::var_os(ENV_VAR).filter(|v| !v.is_empty()).map(PathBuf::from);
        Config::load_from(explicit.map(Path::to_path_buf).or(env), Path::new(DEFAULT_PATH))
    }

    /// As [`Config::load`], with the environment already resolved (testable).
    pub fn load_from(named: Option<PathBuf>, default: &Path) -> Result<(Config, Origin), Error> {
        let (path, must_exist) = match named {
            Some(p) => (p, true),
            None => (default.to_path_buf(), false),
        };
        match read_regular(&path) {
            Ok(text) => Ok((Config::parse(&text, &path)?, Origin::File(path))),
            Err(Error::Read { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound && !must_exist =>
            {
                Ok((Config::default(), Origin::Defaults))
            }
            Err(e) => Err(e),
        }
    }
}

/// Largest configuration file read: a real kace.conf is a few KiB.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Reads `path` if it is a regular file: opened non-blocking (opening a FIFO with no writer
/// would otherwise wait for one), then checked on the open file, so that what is checked is
/// what is read.
fn read_regular(path: &Path) -> Result<String, Error> {
    use std::io::Read;
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let read_err = |source| Error::Read { path: path.to_path_buf(), source };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(read_err)?;
    let meta = file.metadata().map_err(read_err)?;
    let t = meta.file_type();
    let what = if t.is_file() {
        None
    } else if t.is_fifo() {
        Some("a FIFO")
    } else if t.is_dir() {
        Some("a directory")
    } else if t.is_char_device() || t.is_block_device() {
        Some("a device")
    } else if t.is_socket() {
        Some("a socket")
    } else {
        Some("not a file")
    };
    if let Some(what) = what {
        return Err(Error::NotRegular { path: path.to_path_buf(), what: what.to_string() });
    }
    if meta.len() > MAX_CONFIG_BYTES {
        return Err(Error::NotRegular {
            path: path.to_path_buf(),
            what: format!("{} bytes, more than {MAX_CONFIG_BYTES}", meta.len()),
        });
    }
    let mut text = String::new();
    file.take(MAX_CONFIG_BYTES).read_to_string(&mut text).map_err(read_err)?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The re-audit's L5: a FIFO kace.conf hung the controller and the CLI. It is refused at
    /// once, with what it is; so are a directory and a device.
    #[test]
    fn a_fifo_directory_or_device_config_is_refused_at_once() {
        let dir = std::env::temp_dir().join(format!("trust-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("kace.conf");
        let _ = std::fs::remove_file(&fifo);
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path; mkfifo touches nothing else.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let started = std::time::Instant::now();
        let e = Config::load_from(Some(fifo.clone()), Path::new("/nonexistent")).unwrap_err();
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
        assert!(e.to_string().ends_with("a FIFO, not a regular file"), "{e}");
        let e = Config::load_from(Some(dir.clone()), Path::new("/nonexistent")).unwrap_err();
        assert!(e.to_string().contains("a directory, not a regular file"), "{e}");
        let e = Config::load_from(Some("/dev/zero".into()), Path::new("/x")).unwrap_err();
        assert!(e.to_string().contains("a device, not a regular file"), "{e}");
        // A missing default is still the built-in defaults; a missing named file an error.
        let missing = dir.join("missing.conf");
        assert_eq!(Config::load_from(None, &missing).unwrap().1, Origin::Defaults);
        assert!(matches!(Config::load_from(Some(missing), &fifo), Err(Error::Read { .. })));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn p() -> &'static Path {
        Path::new("test.conf")
    }

    #[test]
    fn the_harm_rule_reaches_every_deciders_policy() {
        assert!(Config::default().policy().rules.refuse_likely_harm);
        let c = Config::parse("[selection]\nrefuse_likely_harm = false\n", p()).unwrap();
        assert!(!c.policy().rules.refuse_likely_harm);
    }

    #[test]
    fn empty_document_gives_defaults() {
        assert_eq!(Config::parse("", p()).unwrap(), Config::default());
    }

    #[test]
    fn documented_example_parses() {
        // The example in this crate's docs must stay valid.
        let doc = include_str!("lib.rs");
        let example: String = doc
            .lines()
            .skip_while(|l| !l.starts_with("//! ```toml"))
            .skip(1)
            .take_while(|l| !l.starts_with("//! ```"))
            .map(|l| l.trim_start_matches("//!").trim_start_matches(' '))
            .collect::<Vec<_>>()
            .join("\n");
        assert!(example.contains("[database]"));
        assert_eq!(Config::parse(&example, p()).unwrap(), Config::default());
    }

    #[test]
    fn packaged_example_holds_the_defaults() {
        // packaging/kace.conf documents every key with its default; it must stay in step.
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/kace.conf");
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(Config::parse(&text, &path).unwrap(), Config::default());
    }

    #[test]
    fn values_override_defaults() {
        let c = Config::parse(
            "[database]\npath = \"/tmp/x.db\"\n[selection]\nmemory_margin = 0.1\n",
            p(),
        )
        .unwrap();
        assert_eq!(c.database.path, PathBuf::from("/tmp/x.db"));
        assert_eq!(c.selection.memory_margin, 0.1);
        assert_eq!(c.selection.min_gain, 0.0);
    }

    #[test]
    fn unknown_keys_and_bad_values_are_errors() {
        let e = Config::parse("[database]\npaht = \"x\"\n", p()).unwrap_err();
        assert!(e.to_string().contains("paht"), "{e}");
        let e = Config::parse("[nope]\n", p()).unwrap_err();
        assert!(e.to_string().contains("nope"), "{e}");
        let e = Config::parse("[selection]\nmemory_margin = \"lots\"\n", p()).unwrap_err();
        assert!(matches!(e, Error::Parse { .. }));
        let e = Config::parse("[selection]\nmemory_margin = 1.5\n", p()).unwrap_err();
        assert!(matches!(e, Error::Invalid { .. }), "{e}");
        let e = Config::parse("[training]\nmodel = \"forest\"\n", p()).unwrap_err();
        assert!(e.to_string().contains("forest"), "{e}");
        let e = Config::parse("[selection]\nobjective = \"speed\"\n", p()).unwrap_err();
        assert!(e.to_string().contains("speed"), "{e}");
        let energy = Config::parse("[selection]\nobjective = \"energy\"\n", p()).unwrap();
        assert_eq!(energy.selection.objective, Objective::Energy);
        let e = Config::parse(
            "[selection]\nobjective = \"energy\"\n[training]\nmodel = \"linear\"\n",
            p(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("needs training.model"), "{e}");
        let e = Config::parse("[node]\nscontrol = \"scontrol\"\n", p()).unwrap_err();
        assert!(e.to_string().contains("absolute"), "{e}");
        let e = Config::parse("[log]\nsyslog_socket = \"dev/log\"\n", p()).unwrap_err();
        assert!(e.to_string().contains("log.syslog_socket"), "{e}");
        let off = Config::parse("[log]\nsyslog_socket = \"\"\n", p()).unwrap();
        assert_eq!(off.log.socket(), None);
        let e = Config::parse("[node]\ngpu_memory_gib = -1.0\n", p()).unwrap_err();
        assert!(matches!(e, Error::Invalid { .. }), "{e}");
        let e = Config::parse("[sampler]\nprogress_max_bytes = 100\n", p()).unwrap_err();
        assert!(e.to_string().contains("sampler.progress_max_bytes = 100"), "{e}");
        let e = Config::parse("[sampler]\nprogress_max_bytes = 16777216\n", p()).unwrap_err();
        assert!(matches!(e, Error::Invalid { .. }), "{e}");
        let e = Config::parse("[sampler]\nprogress_max_bytes = \"8M\"\n", p()).unwrap_err();
        assert!(matches!(e, Error::Parse { .. }), "{e}");
        let e = Config::parse("[sampler]\nprogress_cap = 1\n", p()).unwrap_err();
        assert!(e.to_string().contains("progress_cap"), "{e}");
        let c = Config::parse("[sampler]\nprogress_max_bytes = 65536\n", p()).unwrap();
        assert_eq!(c.sampler.progress_max_bytes, 65536);
        let e = Config::parse("[profile]\nmin_alone_runs = 0\n", p()).unwrap_err();
        assert!(e.to_string().contains("profile.min_alone_runs"), "{e}");
        let e = Config::parse("[profile]\nmin_alone_run = 2\n", p()).unwrap_err();
        assert!(e.to_string().contains("min_alone_run"), "{e}");
        let e = Config::parse("[database]\npath = \"relative.db\"\n", p()).unwrap_err();
        assert!(
            e.to_string().contains("database.path = \"relative.db\": must be an absolute"),
            "{e}"
        );
        let e = Config::parse("[node]\nmps_root = \"/run/x\\u0000y\"\n", p()).unwrap_err();
        assert!(e.to_string().contains("node.mps_root") && e.to_string().contains("NUL"), "{e}");
        let e = Config::parse("[mps]\nmulti_user = true\n", p()).unwrap_err();
        assert!(e.to_string().contains("needs mps.server_user"), "{e}");
        for bad in ["root", "Bob", "a b", "x;rm"] {
            let text = format!("[mps]\nmulti_user = true\nserver_user = {bad:?}\n");
            let e = Config::parse(&text, p()).unwrap_err();
            assert!(e.to_string().contains("mps.server_user"), "{bad}: {e}");
        }
        let ok = Config::parse("[mps]\nmulti_user = true\nserver_user = \"kace-mps\"\n", p());
        assert_eq!(ok.unwrap().mps.server_user, "kace-mps");
        let e = Config::parse("[mps]\nmemory_limit_margin = -0.1\n", p()).unwrap_err();
        assert!(e.to_string().contains("mps.memory_limit_margin"), "{e}");
        let c = Config::parse("[profile]\nmin_alone_runs = 3\n", p()).unwrap();
        assert_eq!(c.policy().min_alone_runs, 3);
        let e = Config::parse("this is = = not toml", p()).unwrap_err();
        assert!(e.to_string().starts_with("couldn't parse config test.conf"), "{e}");
    }

    #[test]
    fn missing_default_means_defaults_but_missing_named_file_is_an_error() {
        let nowhere = std::env::temp_dir().join("kace-config-test-does-not-exist.conf");
        let (c, o) = Config::load_from(None, &nowhere).unwrap();
        assert_eq!((c, o), (Config::default(), Origin::Defaults));
        assert!(matches!(
            Config::load_from(Some(nowhere.clone()), &nowhere),
            Err(Error::Read { .. })
        ));
    }
}
