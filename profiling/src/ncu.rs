//! Aggregation of a Nsight Compute CSV export into KACE's six kernel metrics.
//!
//! KACE (`process_ncu.py` in the artifact, described in `shared/data/ncu-samples/README.md`)
//! computes, over every profiled kernel launch, the **duration-weighted mean** of:
//! `Threads` (grid × block), `Compute (SM) Throughput`, `DRAM Throughput`, `Memory Throughput`
//! (all in %), `Registers` (threads × registers per thread) and `Static Shared Memory`
//! (grid size × static shared memory per block, bytes).
//!
//! Two export layouts are read:
//! - `--page details` (the default, "long"): one row per kernel × metric, with `Section Name`,
//!   `Metric Name`, `Metric Unit` and `Metric Value` columns;
//! - `--page raw` ("wide"): one row per kernel, one column per raw metric name, and a second
//!   header row with the units.
//!
//! Unlike the artifact's script, kernels are keyed by the `ID` column (names repeat), units are
//! normalised before weighting (durations to ns, shared memory to bytes), and each metric is
//! accepted under its human name (SOL / Launch Statistics sections) or its raw name.

use std::collections::HashMap;
use std::fmt;

/// The nine per-kernel inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Input {
    /// Kernel duration (normalised to ns).
    Duration,
    /// `Compute (SM) Throughput`, %.
    Compute,
    /// `DRAM Throughput`, %.
    Dram,
    /// `Memory Throughput` (the SOL one), %.
    Memory,
    /// Threads per block.
    BlockSize,
    /// Blocks per grid.
    GridSize,
    /// Threads per launch (grid × block).
    Threads,
    /// Registers per thread.
    RegistersPerThread,
    /// Static shared memory per block (normalised to bytes).
    StaticSmemPerBlock,
}

impl Input {
    /// The human name ncu prints in the details page, then the raw metric names.
    pub fn names(self) -> &'static [&'static str] {
        match self {
            Input::Duration => &["Duration", "gpu__time_duration.sum"],
            Input::Compute => {
                &["Compute (SM) Throughput", "sm__throughput.avg.pct_of_peak_sustained_elapsed"]
            }
            Input::Dram => &[
                "DRAM Throughput",
                "dram__throughput.avg.pct_of_peak_sustained_elapsed",
                "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
            ],
            Input::Memory => &[
                "Memory Throughput",
                "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
            ],
            Input::BlockSize => &["Block Size", "launch__block_size"],
            Input::GridSize => &["Grid Size", "launch__grid_size"],
            Input::Threads => &["Threads", "launch__thread_count"],
            Input::RegistersPerThread => &["Registers Per Thread", "launch__registers_per_thread"],
            Input::StaticSmemPerBlock => {
                &["Static Shared Memory Per Block", "launch__shared_mem_per_block_static"]
            }
        }
    }

    const ALL: [Input; 9] = [
        Input::Duration,
        Input::Compute,
        Input::Dram,
        Input::Memory,
        Input::BlockSize,
        Input::GridSize,
        Input::Threads,
        Input::RegistersPerThread,
        Input::StaticSmemPerBlock,
    ];

    /// Which details-page section a human name must come from. `Memory Throughput` also names
    /// a Gbyte/s row in Memory Workload Analysis, so the section is what tells them apart.
    fn human_section_ok(self, section: &str) -> bool {
        match self {
            Input::Duration | Input::Compute | Input::Dram | Input::Memory => {
                section.starts_with("GPU Speed Of Light")
            }
            _ => section == "Launch Statistics",
        }
    }

    /// Recognises a metric by name (and, for human names, section).
    fn from_metric(section: &str, name: &str) -> Option<(Input, bool)> {
        for input in Input::ALL {
            let names = input.names();
            if names[0] == name && input.human_section_ok(section) {
                return Some((input, true));
            }
            if names[1..].contains(&name) {
                return Some((input, false));
            }
        }
        // ncu 2019/2020 SOL names.
        match (section.starts_with("GPU Speed Of Light"), name) {
            (true, "SM [%]") => Some((Input::Compute, true)),
            (true, "Memory [%]") => Some((Input::Memory, true)),
            _ => None,
        }
    }
}

/// The six kernel metrics of one workload.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelMetrics {
    /// Duration-weighted mean threads per launch.
    pub threads: f64,
    /// Duration-weighted mean `Compute (SM) Throughput`, %.
    pub sm_throughput: f64,
    /// Duration-weighted mean `DRAM Throughput`, %.
    pub dram_throughput: f64,
    /// Duration-weighted mean `Memory Throughput`, %.
    pub memory_throughput: f64,
    /// Duration-weighted mean of threads × registers per thread.
    pub registers: f64,
    /// Duration-weighted mean of grid size × static shared memory per block, bytes.
    pub static_shared_memory: f64,
    /// Kernel launches aggregated.
    pub kernels: usize,
    /// Sum of kernel durations, ns.
    pub total_duration_ns: f64,
    /// Layout the file was read as.
    pub layout: Layout,
}

impl KernelMetrics {
    /// The six values in the KACE feature order.
    pub fn values(&self) -> [f64; 6] {
        [
            self.threads,
            self.sm_throughput,
            self.dram_throughput,
            self.memory_throughput,
            self.registers,
            self.static_shared_memory,
        ]
    }
}

/// Export layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// `--page details`: one row per kernel × metric.
    Details,
    /// `--page raw`: one row per kernel, a units row under the header.
    Raw,
}

/// Why an export could not be aggregated.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum NcuError {
    /// No `"ID",…` header line was found.
    NoHeader,
    /// The header lacks a column the layout needs.
    MissingColumn(&'static str),
    /// The CSV itself is broken.
    Csv(String),
    /// The header was found but no kernel rows follow.
    NoKernels,
    /// A needed metric is absent for some kernels.
    MissingMetric {
        /// The metric's names (human first, then raw).
        names: Vec<&'static str>,
        /// Kernels lacking it.
        kernels_missing: usize,
        /// All kernels.
        kernels: usize,
        /// ID of the first kernel lacking it.
        first_id: String,
    },
    /// A value could not be read as a number, or its unit is unknown.
    BadValue {
        /// Kernel ID.
        id: String,
        /// Metric name.
        metric: String,
        /// The text found.
        value: String,
        /// Why.
        why: &'static str,
    },
    /// All kernel durations are zero, so no weighted mean exists.
    ZeroDuration,
    /// The raw layout has two rows (two launches) with one kernel ID.
    DuplicateId(String),
    /// The last kernel has fewer rows than the first: the export ends in its middle.
    CutOff {
        /// The last kernel's ID.
        id: String,
        /// Its rows.
        rows: usize,
        /// The first kernel's rows.
        expected: usize,
    },
}

impl fmt::Display for NcuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NcuError::NoHeader => {
                write!(f, "no CSV header starting with \"ID\" (is this an `ncu --csv` export?)")
            }
            NcuError::MissingColumn(c) => write!(f, "the CSV header has no {c:?} column"),
            NcuError::Csv(e) => write!(f, "malformed CSV: {e}"),
            NcuError::NoKernels => write!(f, "the export holds no kernel rows"),
            NcuError::MissingMetric { names, kernels_missing, kernels, first_id } => write!(
                f,
                "metric {:?} (raw name {}) is missing for {kernels_missing} of {kernels} \
                 kernels (first: ID {first_id}); profile with the section or metric that \
                 provides it",
                names[0],
                names[1..].iter().map(|n| format!("{n:?}")).collect::<Vec<_>>().join(" or ")
            ),
            NcuError::BadValue { id, metric, value, why } => {
                write!(f, "kernel ID {id}: {metric} = {value:?}: {why}")
            }
            NcuError::ZeroDuration => write!(f, "every kernel has zero duration"),
            NcuError::DuplicateId(id) => {
                write!(f, "kernel ID {id} appears on two rows (two launches with one ID?)")
            }
            NcuError::CutOff { id, rows, expected } => write!(
                f,
                "the export ends inside kernel ID {id} ({rows} of {expected} rows): is it cut off?"
            ),
        }
    }
}

impl std::error::Error for NcuError {}

/// Parses a number as ncu prints it: thousands separators, `n/a` or empty for missing.
/// Separators must group the integer part by three (`1,234,567.5`): `1,2,3,4` is no number.
fn number(text: &str) -> Option<f64> {
    let t = text.trim();
    if t.is_empty() || t.eq_ignore_ascii_case("n/a") {
        return None;
    }
    if t.contains(',') {
        let int = t.split(['.', 'e', 'E']).next().unwrap_or("");
        let int = int.strip_prefix(['-', '+']).unwrap_or(int);
        let mut groups = int.split(',');
        let first_ok = groups.next().is_some_and(|g| (1..=3).contains(&g.len()));
        if !first_ok || !groups.all(|g| g.len() == 3) || t[int.len()..].contains(',') {
            return None;
        }
    }
    t.replace(',', "").parse::<f64>().ok().filter(|v| v.is_finite())
}

/// Parses `(x, y, z)` and multiplies it out; a plain number is returned as is. Every dimension
/// must be a whole number ≥ 1 (a grid of 0.001 blocks is no launch).
fn dims_product(text: &str) -> Option<f64> {
    let t = text.trim();
    let dim = |v: f64| (v >= 1.0 && v.fract() == 0.0).then_some(v);
    if let Some(inner) = t.strip_prefix('(').and_then(|s| s.strip_suffix(')')) {
        let mut prod = 1.0;
        for part in inner.split(',') {
            prod *= dim(part.trim().parse::<f64>().ok()?)?;
        }
        return Some(prod);
    }
    number(t).and_then(dim)
}

/// Scale that converts a value in `unit` to the input's base unit (ns, bytes, %, count).
fn unit_scale(input: Input, unit: &str) -> Option<f64> {
    let u = unit.trim();
    match input {
        Input::Duration => match u {
            "nsecond" | "ns" => Some(1.0),
            "usecond" | "us" => Some(1e3),
            "msecond" | "ms" => Some(1e6),
            "second" | "s" => Some(1e9),
            _ => None,
        },
        Input::StaticSmemPerBlock => match u.strip_suffix("/block").unwrap_or(u) {
            "byte" | "" => Some(1.0),
            "Kbyte" | "KB" => Some(1e3),
            "Mbyte" | "MB" => Some(1e6),
            "Kibyte" | "KiB" => Some(1024.0),
            "Mibyte" | "MiB" => Some(1024.0 * 1024.0),
            _ => None,
        },
        // A throughput under a non-% unit is a different quantity (e.g. Gbyte/s).
        Input::Compute | Input::Dram | Input::Memory => (u == "%" || u.is_empty()).then_some(1.0),
        _ => Some(1.0),
    }
}

#[derive(Debug, Default)]
struct Kernel {
    id: String,
    /// Values under human names (preferred) and raw names, after unit normalisation.
    human: HashMap<Input, f64>,
    raw: HashMap<Input, f64>,
    /// `Block Size` / `Grid Size` tuple columns of newer ncu versions.
    block_col: Option<f64>,
    grid_col: Option<f64>,
    /// `sm__cycles_elapsed.avg` and `.per_second`, for the duration fallback.
    cycles: Option<f64>,
    cycle_rate: Option<f64>,
}

impl Kernel {
    fn get(&self, input: Input) -> Option<f64> {
        self.human.get(&input).or_else(|| self.raw.get(&input)).copied()
    }

    /// Records a value; the same metric again with a different value is an error (rows of two
    /// launches sharing one ID would otherwise be merged silently).
    fn set(&mut self, input: Input, human: bool, value: f64) -> Result<(), &'static str> {
        let map = if human { &mut self.human } else { &mut self.raw };
        match map.insert(input, value) {
            Some(old) if (old - value).abs() > 1e-9 * old.abs().max(value.abs()) => {
                Err("given twice for one kernel ID with different values (IDs repeated?)")
            }
            _ => Ok(()),
        }
    }

    /// Duration in ns; when absent, elapsed SM cycles ÷ cycles per second (what ncu would
    /// report as the duration, to within clock variation).
    fn duration(&self) -> Option<f64> {
        self.get(Input::Duration).or_else(|| match (self.cycles, self.cycle_rate) {
            (Some(c), Some(r)) if r > 0.0 => Some(c / r * 1e9),
            _ => None,
        })
    }

    fn block(&self) -> Option<f64> {
        self.get(Input::BlockSize).or(self.block_col)
    }

    fn grid(&self) -> Option<f64> {
        self.get(Input::GridSize).or(self.grid_col)
    }

    fn threads(&self) -> Option<f64> {
        self.get(Input::Threads).or_else(|| Some(self.block()? * self.grid()?))
    }
}

/// Reads a whole `ncu --csv` export and aggregates it.
pub fn aggregate(text: &str) -> Result<KernelMetrics, NcuError> {
    let (layout, kernels) = parse_kernels(text)?;
    weigh(layout, &kernels)
}

fn header_and_body(text: &str) -> Result<String, NcuError> {
    // Program output and `==PROF==` lines may precede the header (and ncu may interleave
    // `==PROF==`/`==WARNING==` lines); kernel names never start a line with "==".
    let mut lines =
        text.lines().skip_while(|l| !(l.starts_with("\"ID\",") || l.starts_with("ID,")));
    let header = lines.next().ok_or(NcuError::NoHeader)?;
    let mut out = String::with_capacity(text.len());
    out.push_str(header);
    out.push('\n');
    for l in lines.filter(|l| !l.starts_with("==")) {
        out.push_str(l);
        out.push('\n');
    }
    Ok(out)
}

fn parse_kernels(text: &str) -> Result<(Layout, Vec<Kernel>), NcuError> {
    let body = header_and_body(text)?;
    let mut rdr =
        csv::ReaderBuilder::new().has_headers(false).flexible(true).from_reader(body.as_bytes());
    let mut records = rdr.records();
    let header = match records.next() {
        Some(r) => r.map_err(|e| NcuError::Csv(e.to_string()))?,
        None => return Err(NcuError::NoHeader),
    };
    let col = |name: &str| header.iter().position(|h| h == name);
    if col("Metric Name").is_some() {
        details(&header, records).map(|k| (Layout::Details, k))
    } else {
        raw(&header, records).map(|k| (Layout::Raw, k))
    }
}

type Records<'a> = csv::StringRecordsIter<'a, &'a [u8]>;

fn kernel_slot<'k>(
    kernels: &'k mut Vec<Kernel>,
    index: &mut HashMap<String, usize>,
    id: &str,
) -> &'k mut Kernel {
    let i = *index.entry(id.to_string()).or_insert_with(|| {
        kernels.push(Kernel { id: id.to_string(), ..Kernel::default() });
        kernels.len() - 1
    });
    &mut kernels[i]
}

fn details(header: &csv::StringRecord, records: Records<'_>) -> Result<Vec<Kernel>, NcuError> {
    let col = |name: &'static str| {
        header.iter().position(|h| h == name).ok_or(NcuError::MissingColumn(name))
    };
    let (c_id, c_sec, c_name, c_unit, c_val) = (
        col("ID")?,
        col("Section Name")?,
        col("Metric Name")?,
        col("Metric Unit")?,
        col("Metric Value")?,
    );
    let c_block = header.iter().position(|h| h == "Block Size");
    let c_grid = header.iter().position(|h| h == "Grid Size");
    let mut kernels: Vec<Kernel> = Vec::new();
    let mut index = HashMap::new();
    // Rows per kernel ID: every launch of one export has the same rows, so a last kernel with
    // fewer rows than the first is an export cut off in the middle.
    let mut rows: HashMap<String, usize> = HashMap::new();
    let mut last_id = String::new();
    for rec in records {
        let rec = rec.map_err(|e| NcuError::Csv(e.to_string()))?;
        let field = |i: usize| rec.get(i).unwrap_or("");
        let id = field(c_id).trim();
        if id.is_empty() {
            continue;
        }
        let name = field(c_name);
        *rows.entry(id.to_string()).or_insert(0usize) += 1;
        last_id = id.to_string();
        let k = kernel_slot(&mut kernels, &mut index, id);
        let tuple = |c: Option<usize>| c.and_then(|c| rec.get(c)).and_then(dims_product);
        if k.block_col.is_none() {
            k.block_col = tuple(c_block);
        }
        if k.grid_col.is_none() {
            k.grid_col = tuple(c_grid);
        }
        // Rule rows (empty metric name) carry advice text, not values.
        if name.is_empty() {
            continue;
        }
        record_metric(k, field(c_sec), name, field(c_unit), field(c_val))?;
    }
    if let (Some(first), Some(&last)) = (kernels.first(), rows.get(&last_id)) {
        let expected = rows.get(&first.id).copied().unwrap_or(0);
        if last < expected {
            return Err(NcuError::CutOff { id: last_id, rows: last, expected });
        }
    }
    Ok(kernels)
}

fn record_metric(
    k: &mut Kernel,
    section: &str,
    name: &str,
    unit: &str,
    value: &str,
) -> Result<(), NcuError> {
    match name {
        "sm__cycles_elapsed.avg" => k.cycles = number(value),
        "sm__cycles_elapsed.avg.per_second" => {
            // ncu may scale the rate (cycle/nsecond, cycle/usecond); convert to per second.
            let per = match unit.trim() {
                "cycle/second" | "" => Some(1.0),
                "cycle/msecond" => Some(1e3),
                "cycle/usecond" => Some(1e6),
                "cycle/nsecond" => Some(1e9),
                _ => None,
            };
            k.cycle_rate = number(value).zip(per).map(|(v, p)| v * p);
        }
        _ => {}
    }
    let Some((input, human)) = Input::from_metric(section, name) else {
        return Ok(());
    };
    let Some(v) = number(value) else {
        // `n/a` or empty: missing, reported later only if the kernel needs it.
        return Ok(());
    };
    let Some(scale) = unit_scale(input, unit) else {
        if matches!(input, Input::Compute | Input::Dram | Input::Memory) {
            return Ok(()); // same name, different quantity (e.g. Gbyte/s)
        }
        return Err(NcuError::BadValue {
            id: k.id.clone(),
            metric: name.to_string(),
            value: format!("{value} {unit}"),
            why: "unknown unit",
        });
    };
    if v < 0.0 {
        return Err(NcuError::BadValue {
            id: k.id.clone(),
            metric: name.to_string(),
            value: value.to_string(),
            why: "negative",
        });
    }
    if matches!(input, Input::BlockSize | Input::GridSize) && !(v >= 1.0 && v.fract() == 0.0) {
        return Err(NcuError::BadValue {
            id: k.id.clone(),
            metric: name.to_string(),
            value: value.to_string(),
            why: "a launch dimension must be a whole number of at least 1",
        });
    }
    k.set(input, human, v * scale).map_err(|why| NcuError::BadValue {
        id: k.id.clone(),
        metric: name.to_string(),
        value: value.to_string(),
        why,
    })
}

fn raw(header: &csv::StringRecord, mut records: Records<'_>) -> Result<Vec<Kernel>, NcuError> {
    let c_id = header.iter().position(|h| h == "ID").ok_or(NcuError::MissingColumn("ID"))?;
    // The units row follows the header; its ID cell is empty.
    let units = match records.next() {
        Some(r) => r.map_err(|e| NcuError::Csv(e.to_string()))?,
        None => return Err(NcuError::NoKernels),
    };
    let units_row = units.get(c_id).is_none_or(|s| s.trim().is_empty());
    let mut kernels = Vec::new();
    let mut index = HashMap::new();
    let mut handle =
        |rec: &csv::StringRecord, units: Option<&csv::StringRecord>| -> Result<(), NcuError> {
            let id = rec.get(c_id).unwrap_or("").trim();
            if id.is_empty() {
                return Ok(());
            }
            // In the raw layout a row is a whole kernel launch: one ID twice is two launches
            // that would be merged into one.
            if index.contains_key(id) {
                return Err(NcuError::DuplicateId(id.to_string()));
            }
            let k = kernel_slot(&mut kernels, &mut index, id);
            for (i, name) in header.iter().enumerate() {
                let value = rec.get(i).unwrap_or("");
                let unit = units.and_then(|u| u.get(i)).unwrap_or("");
                match name {
                    "Block Size" => k.block_col = dims_product(value),
                    "Grid Size" => k.grid_col = dims_product(value),
                    // Raw pages name metrics by their raw names; section does not apply.
                    _ => record_metric(k, "", name, unit, value)?,
                }
            }
            Ok(())
        };
    let units_ref = if units_row { Some(units.clone()) } else { None };
    if !units_row {
        handle(&units, None)?;
    }
    for rec in records {
        let rec = rec.map_err(|e| NcuError::Csv(e.to_string()))?;
        handle(&rec, units_ref.as_ref())?;
    }
    Ok(kernels)
}

fn weigh(layout: Layout, kernels: &[Kernel]) -> Result<KernelMetrics, NcuError> {
    if kernels.is_empty() {
        return Err(NcuError::NoKernels);
    }
    // Check every needed input first so the error names what is missing, not a symptom.
    type Getter = fn(&Kernel) -> Option<f64>;
    let checks: [(Input, Getter); 8] = [
        (Input::Duration, Kernel::duration),
        (Input::Threads, Kernel::threads),
        (Input::Compute, |k| k.get(Input::Compute)),
        (Input::Dram, |k| k.get(Input::Dram)),
        (Input::Memory, |k| k.get(Input::Memory)),
        (Input::RegistersPerThread, |k| k.get(Input::RegistersPerThread)),
        (Input::StaticSmemPerBlock, |k| k.get(Input::StaticSmemPerBlock)),
        (Input::GridSize, Kernel::grid),
    ];
    for (input, get) in checks {
        let missing: Vec<&Kernel> = kernels.iter().filter(|k| get(k).is_none()).collect();
        if let Some(first) = missing.first() {
            // Threads is derivable from block × grid: name what is really absent.
            let input = match input {
                Input::Threads if first.block().is_none() => Input::BlockSize,
                Input::Threads => Input::GridSize,
                other => other,
            };
            return Err(NcuError::MissingMetric {
                names: input.names().to_vec(),
                kernels_missing: missing.len(),
                kernels: kernels.len(),
                first_id: first.id.clone(),
            });
        }
    }
    let mut sums = [0.0f64; 6];
    let mut total = 0.0;
    for k in kernels {
        // Unwraps are checked above; `unwrap_or` keeps this panic-free regardless.
        let d = k.duration().unwrap_or(0.0);
        let threads = k.threads().unwrap_or(0.0);
        let per_kernel = [
            threads,
            k.get(Input::Compute).unwrap_or(0.0),
            k.get(Input::Dram).unwrap_or(0.0),
            k.get(Input::Memory).unwrap_or(0.0),
            // KACE floors registers per thread (they are integers in ncu anyway).
            threads * k.get(Input::RegistersPerThread).unwrap_or(0.0).floor(),
            k.grid().unwrap_or(0.0) * k.get(Input::StaticSmemPerBlock).unwrap_or(0.0),
        ];
        for (s, v) in sums.iter_mut().zip(per_kernel) {
            *s += v * d;
        }
        total += d;
    }
    if total <= 0.0 {
        return Err(NcuError::ZeroDuration);
    }
    let m = sums.map(|s| s / total);
    Ok(KernelMetrics {
        threads: m[0],
        sm_throughput: m[1],
        dram_throughput: m[2],
        memory_throughput: m[3],
        registers: m[4],
        static_shared_memory: m[5],
        kernels: kernels.len(),
        total_duration_ns: total,
        layout,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_tuples() {
        assert_eq!(number("\"32,768\"".trim_matches('"')), Some(32768.0));
        assert_eq!(number("n/a"), None);
        assert_eq!(number(""), None);
        assert_eq!(dims_product("(4, 12, 54)"), Some(2592.0));
        assert_eq!(dims_product("(32, 4, 1)"), Some(128.0));
        assert_eq!(dims_product("(a, 1)"), None);
    }

    #[test]
    fn units_normalise() {
        assert_eq!(unit_scale(Input::Duration, "usecond"), Some(1e3));
        assert_eq!(unit_scale(Input::Duration, "furlong"), None);
        assert_eq!(unit_scale(Input::StaticSmemPerBlock, "Kbyte/block"), Some(1e3));
        assert_eq!(unit_scale(Input::Memory, "Gbyte/s"), None);
    }

    #[test]
    fn memory_throughput_is_section_qualified() {
        assert_eq!(
            Input::from_metric("GPU Speed Of Light Throughput", "Memory Throughput"),
            Some((Input::Memory, true))
        );
        assert_eq!(Input::from_metric("Memory Workload Analysis", "Memory Throughput"), None);
    }
}
