//! Colocation datasets in the artifact's `wN_` column scheme (any group size k), and the
//! artifact's split files. Parsing reads from any `Read`; opening files is the caller's job.

use std::collections::HashMap;
use std::io::Read;

use crate::error::DataError;
use crate::features::{combine, Feature, Profile, FEATURE_COUNT};

/// One measured colocation: k workloads that ran together, their profiles, and what each
/// achieved while colocated.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    /// Workload names, in slot order (`workload1`, `workload2`, …).
    pub workloads: Vec<String>,
    /// Each member's profile (measured alone).
    pub profiles: Vec<Profile>,
    /// Each member's throughput while colocated (steps per second).
    pub throughputs: Vec<f64>,
}

impl Group {
    /// Its jobs as a model sees them: each member's profile and workload name.
    pub fn members(&self) -> Vec<crate::slowdown::Member<'_>> {
        self.profiles
            .iter()
            .zip(&self.workloads)
            .map(|(p, w)| crate::slowdown::Member { profile: p, workload: Some(w.as_str()) })
            .collect()
    }

    /// Group size k.
    pub fn k(&self) -> usize {
        self.workloads.len()
    }

    /// The paper's objective: the members' colocated throughputs summed.
    pub fn total_throughput(&self) -> f64 {
        self.throughputs.iter().sum()
    }

    /// Normalised progress: each member's colocated throughput over its exclusive one, summed.
    pub fn normalised_progress(&self) -> f64 {
        self.throughputs.iter().zip(&self.profiles).map(|(t, p)| t / p.exclusive_throughput()).sum()
    }

    /// The group's combined feature vector.
    pub fn features(&self) -> [f64; FEATURE_COUNT] {
        combine(self.profiles.iter())
    }

    /// Whether every member is the same workload (a self group).
    pub fn is_self_group(&self) -> bool {
        self.workloads.windows(2).all(|w| w[0] == w[1])
    }

    /// Whether `name` is one of the members.
    pub fn contains(&self, name: &str) -> bool {
        self.workloads.iter().any(|w| w == name)
    }

    /// Whether a member's name starts with `prefix` (the artifact's candidate rule).
    pub fn has_member_starting_with(&self, prefix: &str) -> bool {
        self.workloads.iter().any(|w| w.starts_with(prefix))
    }
}

/// A set of colocation groups of one size k.
#[derive(Debug, Clone, PartialEq)]
pub struct ColocationData {
    /// Group size.
    pub k: usize,
    /// The groups, in file order.
    pub groups: Vec<Group>,
}

impl ColocationData {
    /// Every workload named in the data, sorted.
    pub fn workloads(&self) -> Vec<String> {
        let mut names: Vec<String> =
            self.groups.iter().flat_map(|g| g.workloads.iter().cloned()).collect();
        names.sort();
        names.dedup();
        names
    }

    /// The first group whose members are exactly `names` in that order.
    pub fn find(&self, names: &[&str]) -> Option<usize> {
        self.groups.iter().position(|g| {
            g.workloads.len() == names.len() && g.workloads.iter().zip(names).all(|(a, b)| a == b)
        })
    }

    /// Each workload's profile as it appears in the data (first occurrence).
    pub fn profiles(&self) -> HashMap<String, Profile> {
        let mut out = HashMap::new();
        for g in &self.groups {
            for (w, p) in g.workloads.iter().zip(&g.profiles) {
                out.entry(w.clone()).or_insert(*p);
            }
        }
        out
    }
}

/// The column name of `feature` for slot `i` (1-based): `w{i}` followed by the artifact name.
pub fn feature_column(slot: usize, feature: Feature) -> String {
    format!("w{slot}{}", feature.artifact_name())
}

struct Table {
    source: String,
    header: Vec<String>,
    records: Vec<(u64, csv::StringRecord)>,
}

impl Table {
    fn read<R: Read>(source: &str, reader: R) -> Result<Table, DataError> {
        Table::read_with(source, reader, false)
    }

    /// With `flexible`, rows may have fewer or more fields than the header (the caller decides
    /// what such a row means).
    fn read_with<R: Read>(source: &str, reader: R, flexible: bool) -> Result<Table, DataError> {
        let mut rdr =
            csv::ReaderBuilder::new().has_headers(true).flexible(flexible).from_reader(reader);
        let header: Vec<String> = rdr
            .headers()
            .map_err(|e| csv_error(source, e))?
            .iter()
            .map(|h| h.trim().to_string())
            .collect();
        let mut records = Vec::new();
        for rec in rdr.records() {
            let rec = rec.map_err(|e| csv_error(source, e))?;
            let line = rec.position().map(|p| p.line()).unwrap_or(0);
            records.push((line, rec));
        }
        Ok(Table { source: source.to_string(), header, records })
    }

    fn column(&self, name: &str) -> Result<usize, DataError> {
        self.header.iter().position(|h| h == name).ok_or_else(|| {
            DataError::new(&self.source, Some(1), Some(name), "missing column".into())
        })
    }

    fn has(&self, name: &str) -> bool {
        self.header.iter().any(|h| h == name)
    }

    fn text<'a>(&'a self, rec: &'a (u64, csv::StringRecord), col: usize) -> &'a str {
        rec.1.get(col).unwrap_or("").trim()
    }

    fn number(&self, rec: &(u64, csv::StringRecord), col: usize) -> Result<f64, DataError> {
        let raw = self.text(rec, col);
        match raw.parse::<f64>() {
            Ok(v) if v.is_finite() => Ok(v),
            _ => Err(DataError::new(
                &self.source,
                Some(rec.0),
                Some(&self.header[col]),
                format!("expected a finite number, found '{}'", truncate(raw)),
            )),
        }
    }

    fn name(&self, rec: &(u64, csv::StringRecord), col: usize) -> Result<String, DataError> {
        let raw = self.text(rec, col);
        if raw.is_empty() {
            return Err(DataError::new(
                &self.source,
                Some(rec.0),
                Some(&self.header[col]),
                "empty workload name".into(),
            ));
        }
        Ok(raw.to_string())
    }

    fn integer(&self, rec: &(u64, csv::StringRecord), col: usize) -> Result<i64, DataError> {
        let raw = self.text(rec, col);
        raw.parse::<i64>().map_err(|_| {
            DataError::new(
                &self.source,
                Some(rec.0),
                Some(&self.header[col]),
                format!("expected an integer, found '{}'", truncate(raw)),
            )
        })
    }
}

fn truncate(s: &str) -> String {
    if s.chars().count() > 40 {
        format!("{}…", s.chars().take(40).collect::<String>())
    } else {
        s.to_string()
    }
}

fn csv_error(source: &str, e: csv::Error) -> DataError {
    let line = e.position().map(|p| p.line());
    DataError::new(source, line, None, format!("malformed CSV: {e}"))
}

/// Reads a colocation table in the `wN_` scheme. The group size k is the number of
/// `workload1…workloadK` columns; every `wI` feature column and `wIthroughput` must be present.
/// Columns are found by name, so their order does not matter and extra columns are ignored.
pub fn read_colocations<R: Read>(source: &str, reader: R) -> Result<ColocationData, DataError> {
    let t = Table::read(source, reader)?;
    let mut k = 0;
    while t.has(&format!("workload{}", k + 1)) {
        k += 1;
    }
    if k == 0 {
        return Err(DataError::new(source, Some(1), Some("workload1"), "missing column".into()));
    }
    struct Slot {
        name: usize,
        features: [usize; FEATURE_COUNT],
        throughput: usize,
    }
    let mut slots = Vec::with_capacity(k);
    for i in 1..=k {
        let mut features = [0; FEATURE_COUNT];
        for f in Feature::ALL {
            features[f.index()] = t.column(&feature_column(i, f))?;
        }
        slots.push(Slot {
            name: t.column(&format!("workload{i}"))?,
            features,
            throughput: t.column(&format!("w{i}throughput"))?,
        });
    }
    let mut groups = Vec::with_capacity(t.records.len());
    for rec in &t.records {
        let mut g = Group {
            workloads: Vec::with_capacity(k),
            profiles: Vec::with_capacity(k),
            throughputs: Vec::with_capacity(k),
        };
        for s in &slots {
            g.workloads.push(t.name(rec, s.name)?);
            let mut values = [0.0; FEATURE_COUNT];
            for (v, &col) in values.iter_mut().zip(&s.features) {
                *v = t.number(rec, col)?;
            }
            g.profiles.push(Profile::new(values));
            g.throughputs.push(t.number(rec, s.throughput)?);
        }
        groups.push(g);
    }
    if groups.is_empty() {
        return Err(DataError::new(source, None, None, "no data rows".into()));
    }
    Ok(ColocationData { k, groups })
}

/// One row of `splits/n_occur_splits.csv`.
#[derive(Debug, Clone, PartialEq)]
pub struct SplitRow {
    /// The n_occur setting.
    pub n_occur: u32,
    /// The shuffle seed.
    pub seed: u32,
    /// Whether the row is in the training file (else the test file).
    pub train: bool,
    /// Position in its file (orders candidates, which breaks ties).
    pub row_in_file: usize,
    /// The two workloads, in the pair table's order.
    pub workloads: [String; 2],
    /// For training rows: whether the trainer's inner 80 % split fitted on it.
    pub in_fit_subset: bool,
}

/// Reads `splits/n_occur_splits.csv`.
pub fn read_n_occur_splits<R: Read>(source: &str, reader: R) -> Result<Vec<SplitRow>, DataError> {
    let t = Table::read(source, reader)?;
    let (cn, cs, csp, cr, c1, c2, cf) = (
        t.column("n_occur")?,
        t.column("seed")?,
        t.column("split")?,
        t.column("row_in_file")?,
        t.column("workload1")?,
        t.column("workload2")?,
        t.column("in_fit_subset")?,
    );
    let mut out = Vec::with_capacity(t.records.len());
    for rec in &t.records {
        let train = split_kind(&t, rec, csp)?;
        let fit = t.text(rec, cf);
        let in_fit_subset = match (train, fit) {
            (true, "1") => true,
            (true, "0") | (false, "") | (false, "0") => false,
            _ => {
                return Err(DataError::new(
                    source,
                    Some(rec.0),
                    Some("in_fit_subset"),
                    format!("expected 0 or 1 for a training row, empty otherwise, found '{fit}'"),
                ))
            }
        };
        out.push(SplitRow {
            n_occur: nonneg(&t, rec, cn)?,
            seed: nonneg(&t, rec, cs)?,
            train,
            row_in_file: nonneg(&t, rec, cr)? as usize,
            workloads: [t.name(rec, c1)?, t.name(rec, c2)?],
            in_fit_subset,
        });
    }
    Ok(out)
}

/// One row of `splits/unseen_workload_splits.csv`.
#[derive(Debug, Clone, PartialEq)]
pub struct UnseenSplitRow {
    /// The workload held out of training.
    pub heldout: String,
    /// Whether the row is in the training file.
    pub train: bool,
    /// Position in its file.
    pub row_in_file: usize,
    /// The two workloads.
    pub workloads: [String; 2],
}

/// Reads `splits/unseen_workload_splits.csv`.
pub fn read_unseen_splits<R: Read>(
    source: &str,
    reader: R,
) -> Result<Vec<UnseenSplitRow>, DataError> {
    let t = Table::read(source, reader)?;
    let (ch, csp, cr, c1, c2) = (
        t.column("heldout_workload")?,
        t.column("split")?,
        t.column("row_in_file")?,
        t.column("workload1")?,
        t.column("workload2")?,
    );
    let mut out = Vec::with_capacity(t.records.len());
    for rec in &t.records {
        out.push(UnseenSplitRow {
            heldout: t.name(rec, ch)?,
            train: split_kind(&t, rec, csp)?,
            row_in_file: nonneg(&t, rec, cr)? as usize,
            workloads: [t.name(rec, c1)?, t.name(rec, c2)?],
        });
    }
    Ok(out)
}

/// A `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` setting for the two members of a pair: the first
/// (the artifact's "LS", latency-sensitive, slot `workload1`) and the second ("BE", best
/// effort, `workload2`). The default, no percentage set, is 100/100.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct ThreadSplit {
    /// The first member's active-thread percentage (1…100).
    pub first: u8,
    /// The second member's.
    pub second: u8,
}

impl ThreadSplit {
    /// 100/100: no percentage set, what MPS does by default.
    pub const DEFAULT: ThreadSplit = ThreadSplit { first: 100, second: 100 };

    /// Whether this is [`ThreadSplit::DEFAULT`].
    pub fn is_default(self) -> bool {
        self == ThreadSplit::DEFAULT
    }

    /// Parses the artifact's column name, `(LS10, BE90)`.
    pub fn from_column(name: &str) -> Option<ThreadSplit> {
        let inner = name.trim().strip_prefix('(')?.strip_suffix(')')?;
        let (ls, be) = inner.split_once(',')?;
        let pct = |v: &str, prefix: &str| -> Option<u8> {
            let n: u8 = v.trim().strip_prefix(prefix)?.parse().ok()?;
            (1..=100).contains(&n).then_some(n)
        };
        Some(ThreadSplit { first: pct(ls, "LS")?, second: pct(be, "BE")? })
    }
}

impl std::fmt::Display for ThreadSplit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.first, self.second)
    }
}

/// One row of a raw MPS sweep (`raw_mps_sweeps/*.csv`, 2-way): a pair of workloads and what
/// each achieved at every split measured.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepRow {
    /// The two workloads: the first gets [`ThreadSplit::first`], the second
    /// [`ThreadSplit::second`].
    pub workloads: [String; 2],
    /// Per split, in column order: the two throughputs (steps/s), or `None` where the cell is
    /// `(None, None)` or empty (a run the artifact did not make or that failed).
    pub cells: Vec<(ThreadSplit, Option<[f64; 2]>)>,
}

impl SweepRow {
    /// The throughputs at `split`, when measured.
    pub fn at(&self, split: ThreadSplit) -> Option<[f64; 2]> {
        self.cells.iter().find(|(s, _)| *s == split).and_then(|(_, v)| *v)
    }
}

/// Reads a 2-way raw MPS sweep: columns `workload1`, `workload2` and one `(LSa, BEb)` column per
/// split (found by name; other columns are ignored). A cell is the tuple string `(thr1, thr2)`,
/// or `(None, None)` / empty for a run that is missing; anything else is an error naming the
/// line and column.
pub fn read_mps_sweeps<R: Read>(source: &str, reader: R) -> Result<Vec<SweepRow>, DataError> {
    let t = Table::read(source, reader)?;
    let (c1, c2) = (t.column("workload1")?, t.column("workload2")?);
    let splits: Vec<(usize, ThreadSplit)> = t
        .header
        .iter()
        .enumerate()
        .filter_map(|(i, h)| ThreadSplit::from_column(h).map(|s| (i, s)))
        .collect();
    if splits.is_empty() {
        return Err(DataError::new(
            source,
            Some(1),
            None,
            "no split columns such as '(LS10, BE90)'".into(),
        ));
    }
    let mut out = Vec::with_capacity(t.records.len());
    for rec in &t.records {
        let mut cells = Vec::with_capacity(splits.len());
        for &(col, split) in &splits {
            cells.push((split, sweep_cell(&t, rec, col)?));
        }
        out.push(SweepRow { workloads: [t.name(rec, c1)?, t.name(rec, c2)?], cells });
    }
    Ok(out)
}

fn sweep_cell(
    t: &Table,
    rec: &(u64, csv::StringRecord),
    col: usize,
) -> Result<Option<[f64; 2]>, DataError> {
    let raw = t.text(rec, col);
    let bad = || {
        DataError::new(
            &t.source,
            Some(rec.0),
            Some(&t.header[col]),
            format!("expected '(thr1, thr2)' or '(None, None)', found '{}'", truncate(raw)),
        )
    };
    if raw.is_empty() {
        return Ok(None);
    }
    let inner = raw.strip_prefix('(').and_then(|r| r.strip_suffix(')')).ok_or_else(bad)?;
    let (a, b) = inner.split_once(',').ok_or_else(bad)?;
    let (a, b) = (a.trim(), b.trim());
    if a == "None" || b == "None" {
        return Ok(None);
    }
    match (a.parse::<f64>(), b.parse::<f64>()) {
        (Ok(x), Ok(y)) if x.is_finite() && y.is_finite() && x >= 0.0 && y >= 0.0 => {
            Ok(Some([x, y]))
        }
        _ => Err(bad()),
    }
}

/// Reads per-workload system profiles from the artifact's `baseline_labels.csv` scheme: the
/// workload in `Type` (or `workload`), and `Exclusive100`, `sm%`, `mem%`, `memcap`. The result
/// has no kernel metrics ([`Profile::has_kernel_metrics`] false): what an exclusive run sampled
/// by NVML gives, which is all the split model uses. A workload listed twice keeps its first row.
pub fn read_system_profiles<R: Read>(
    source: &str,
    reader: R,
) -> Result<HashMap<String, Profile>, DataError> {
    let t = Table::read(source, reader)?;
    let name = if t.has("Type") { t.column("Type")? } else { t.column("workload")? };
    let cols = [
        (Feature::ExclusiveThroughput, t.column("Exclusive100")?),
        (Feature::SmUtil, t.column("sm%")?),
        (Feature::MemUtil, t.column("mem%")?),
        (Feature::Memcap, t.column("memcap")?),
    ];
    let mut out = HashMap::new();
    for rec in &t.records {
        let mut values = [None; FEATURE_COUNT];
        for (f, c) in cols {
            values[f.index()] = Some(t.number(rec, c)?);
        }
        if let Some(p) = Profile::from_measured(values) {
            out.entry(t.name(rec, name)?).or_insert(p);
        }
    }
    Ok(out)
}

/// Reads an exclusive MPS sweep (`raw_mps_sweeps/baseline_steps_stage2.csv`): a `workload`
/// column and one column per `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` (`10`, `20`, …, `100`), each
/// the workload's throughput running alone at that percentage (steps/s). Empty cells are runs
/// not made and are left out; a workload listed twice keeps its first row. A row with fewer
/// fields than the header (the artifact's file has three, `workload,value`) cannot say which
/// percentage its values belong to, so it is skipped rather than guessed.
pub fn read_exclusive_sweeps<R: Read>(
    source: &str,
    reader: R,
) -> Result<HashMap<String, HashMap<u8, f64>>, DataError> {
    let t = Table::read_with(source, reader, true)?;
    let name = t.column("workload")?;
    let cols: Vec<(usize, u8)> = t
        .header
        .iter()
        .enumerate()
        .filter_map(|(i, h)| h.parse::<u8>().ok().filter(|p| (1..=100).contains(p)).map(|p| (i, p)))
        .collect();
    if !cols.iter().any(|(_, p)| *p == 100) {
        return Err(DataError::new(source, Some(1), Some("100"), "missing column".into()));
    }
    let mut out = HashMap::new();
    for rec in t.records.iter().filter(|r| r.1.len() == t.header.len()) {
        let mut sweep = HashMap::new();
        for &(c, p) in &cols {
            if !t.text(rec, c).is_empty() {
                sweep.insert(p, t.number(rec, c)?);
            }
        }
        out.entry(t.name(rec, name)?).or_insert(sweep);
    }
    Ok(out)
}

fn split_kind(t: &Table, rec: &(u64, csv::StringRecord), col: usize) -> Result<bool, DataError> {
    match t.text(rec, col) {
        "train" => Ok(true),
        "test" => Ok(false),
        other => Err(DataError::new(
            &t.source,
            Some(rec.0),
            Some("split"),
            format!("expected 'train' or 'test', found '{}'", truncate(other)),
        )),
    }
}

fn nonneg(t: &Table, rec: &(u64, csv::StringRecord), col: usize) -> Result<u32, DataError> {
    let v = t.integer(rec, col)?;
    u32::try_from(v).map_err(|_| {
        DataError::new(
            &t.source,
            Some(rec.0),
            Some(&t.header[col]),
            format!("expected a non-negative integer, found {v}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(k: usize) -> String {
        let mut cols = Vec::new();
        for i in 1..=k {
            cols.push(format!("workload{i}"));
            for f in Feature::ALL {
                cols.push(feature_column(i, f));
            }
            cols.push(format!("w{i}throughput"));
        }
        cols.join(",")
    }

    fn row(names: &[&str], base: f64) -> String {
        let mut cells = Vec::new();
        for (i, n) in names.iter().enumerate() {
            cells.push(n.to_string());
            for j in 0..FEATURE_COUNT {
                cells.push(format!("{}", base + (i * 10 + j) as f64));
            }
            cells.push(format!("{}", 5.0 + i as f64));
        }
        cells.join(",")
    }

    #[test]
    fn reads_two_and_three_way_tables_by_name() {
        let text = format!("{}\n{}\n{}\n", header(2), row(&["a", "b"], 1.0), row(&["a", "a"], 2.0));
        let d = read_colocations("t.csv", text.as_bytes()).unwrap();
        assert_eq!(d.k, 2);
        assert_eq!(d.groups.len(), 2);
        assert_eq!(d.groups[0].workloads, vec!["a", "b"]);
        assert_eq!(d.groups[0].profiles[1].get(Feature::Threads), 11.0);
        assert_eq!(d.groups[0].total_throughput(), 11.0);
        assert!(d.groups[1].is_self_group());
        assert_eq!(d.find(&["a", "b"]), Some(0));

        let text = format!("{}\n{}\n", header(3), row(&["a", "b", "c"], 1.0));
        let d = read_colocations("t3.csv", text.as_bytes()).unwrap();
        assert_eq!(d.k, 3);
        assert_eq!(d.groups[0].throughputs, vec![5.0, 6.0, 7.0]);
    }

    #[test]
    fn column_order_does_not_matter() {
        let h = header(2);
        let r = row(&["x", "y"], 3.0);
        let mut hc: Vec<&str> = h.split(',').collect();
        let mut rc: Vec<&str> = r.split(',').collect();
        hc.reverse();
        rc.reverse();
        let text = format!("{}\n{}\n", hc.join(","), rc.join(","));
        let d = read_colocations("rev.csv", text.as_bytes()).unwrap();
        let e = read_colocations("fwd.csv", format!("{h}\n{r}\n").as_bytes()).unwrap();
        assert_eq!(d, e);
    }

    #[test]
    fn malformed_rows_name_file_line_and_column() {
        let mut bad = row(&["a", "b"], 1.0);
        bad = bad.replacen("4", "four", 1);
        let text = format!("{}\n{}\n{}\n", header(2), row(&["a", "b"], 1.0), bad);
        let err = read_colocations("pairs.csv", text.as_bytes()).unwrap_err();
        assert_eq!(err.source, "pairs.csv");
        assert_eq!(err.line, Some(3));
        assert!(err.column.is_some(), "{err}");
        assert!(err.to_string().contains("pairs.csv, line 3, column"), "{err}");

        let missing = header(2).replace("w2memcap", "w2memory");
        let err = read_colocations("p.csv", format!("{missing}\n").as_bytes()).unwrap_err();
        assert_eq!(err.column.as_deref(), Some("w2memcap"));

        let err = read_colocations("p.csv", "a,b\n1,2\n".as_bytes()).unwrap_err();
        assert_eq!(err.column.as_deref(), Some("workload1"));

        let ragged = format!("{}\n1,2\n", header(2));
        let err = read_colocations("r.csv", ragged.as_bytes()).unwrap_err();
        assert!(err.message.contains("malformed CSV"), "{err}");

        let nan = format!("{}\n{}\n", header(2), row(&["a", "b"], 1.0).replacen("1", "NaN", 1));
        assert!(read_colocations("n.csv", nan.as_bytes()).is_err());
    }

    #[test]
    fn reads_split_files() {
        let text = "n_occur,seed,split,row_in_file,workload1,workload2,in_fit_subset\n\
                    3,10,train,0,a,b,1\n3,10,test,0,a,a,\n";
        let rows = read_n_occur_splits("s.csv", text.as_bytes()).unwrap();
        assert_eq!(rows.len(), 2);
        assert!(rows[0].train && rows[0].in_fit_subset);
        assert!(!rows[1].train);
        let bad = text.replace("train,0,a,b,1", "training,0,a,b,1");
        let err = read_n_occur_splits("s.csv", bad.as_bytes()).unwrap_err();
        assert_eq!((err.line, err.column.as_deref()), (Some(2), Some("split")));

        let text = "heldout_workload,split,row_in_file,workload1,workload2\nx,test,0,a,x\n";
        let rows = read_unseen_splits("u.csv", text.as_bytes()).unwrap();
        assert_eq!(rows[0].heldout, "x");
    }

    #[test]
    fn reads_mps_sweeps_and_system_profiles() {
        let text = "workload1,workload2,\"(LS10, BE90)\",\"(LS100, BE100)\"\n\
                    a,b,\"(1.5, 2.5)\",\"(None, None)\"\n\
                    b,a,,\"(3, 4)\"\n";
        let rows = read_mps_sweeps("s.csv", text.as_bytes()).unwrap();
        assert_eq!(rows.len(), 2);
        let s10 = ThreadSplit { first: 10, second: 90 };
        assert_eq!(rows[0].cells[0], (s10, Some([1.5, 2.5])));
        assert_eq!(rows[0].at(ThreadSplit::DEFAULT), None);
        assert_eq!(rows[1].at(s10), None);
        assert_eq!(rows[1].at(ThreadSplit::DEFAULT), Some([3.0, 4.0]));
        assert!(ThreadSplit::DEFAULT.is_default() && !s10.is_default());
        assert_eq!(ThreadSplit::from_column("(LS0, BE90)"), None);
        assert_eq!(s10.to_string(), "10/90");
        let bad = text.replace("(1.5, 2.5)", "(1.5; 2.5)");
        let err = read_mps_sweeps("s.csv", bad.as_bytes()).unwrap_err();
        assert_eq!((err.line, err.column.as_deref()), (Some(2), Some("(LS10, BE90)")));
        assert!(read_mps_sweeps("s.csv", "workload1,workload2\na,b\n".as_bytes()).is_err());

        let text =
            "Type,Exclusive100,sm%,mem%,memcap,Exclusive50\nx,10,50,20,3.5,6\nx,11,1,1,1,1\n";
        let p = read_system_profiles("b.csv", text.as_bytes()).unwrap();
        assert_eq!(p.len(), 1);
        assert!(!p["x"].has_kernel_metrics);
        assert_eq!((p["x"].exclusive_throughput(), p["x"].memcap()), (10.0, 3.5));
        let err = read_system_profiles("b.csv", "Type,sm%\nx,1\n".as_bytes()).unwrap_err();
        assert_eq!(err.column.as_deref(), Some("Exclusive100"));

        let text = "workload,10,50,100\nx,1.5,,4\ny,3\n";
        let s = read_exclusive_sweeps("e.csv", text.as_bytes()).unwrap();
        assert_eq!(s["x"], [(10, 1.5), (100, 4.0)].into());
        assert!(!s.contains_key("y"), "a short row is skipped, not guessed");
        let err = read_exclusive_sweeps("e.csv", "workload,10\nx,1\n".as_bytes()).unwrap_err();
        assert_eq!(err.column.as_deref(), Some("100"));
        assert!(read_exclusive_sweeps("e.csv", "workload,100\nx,fast\n".as_bytes()).is_err());
    }
}
