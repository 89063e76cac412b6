//! Profile tables in: the KACE artifact's files and kace's own CSV/JSON format, parsed into
//! [`NewProfile`]s (the caller reads the file; this module only parses text).
//!
//! kace's own format is a CSV (or a JSON array of objects) with a `workload` column, an
//! optional `gpu_model` column, and any of the ten feature columns named as in the database:
//! `threads, sm_throughput, dram_throughput, memory_throughput, registers,
//! static_shared_memory, exclusive_throughput, sm_pct, mem_pct, memcap_gib`. The artifact's
//! spellings are accepted too (`Type`, `Threads`, `Compute (SM) Throughput`, …, `Exclusive100`,
//! `sm%`, `mem%`, `memcap`), so `derived_workload_profiles.csv`, `baseline_labels.csv` and the
//! `kernel_total_*/*.csv` files import as they are. Empty cells are "not measured". Any other
//! column is an error (a misspelt feature must not vanish silently), except the artifact's
//! known extras.

use crate::error::{Error, Result};
use crate::types::{NewProfile, FEATURE_COLUMNS, FEATURE_COUNT};

fn invalid(reason: String) -> Error {
    Error::Invalid { reason }
}

/// Prefixes an error's message with where it happened.
fn at(place: String) -> impl FnOnce(Error) -> Error {
    move |e| invalid(format!("{place}: {e}"))
}

/// Column names that mean the workload name.
const NAME_COLUMNS: [&str; 2] = ["workload", "Type"];

/// Artifact columns that are not features and are ignored.
const IGNORED: [&str; 5] = ["in_181_pair_set", "Exclusive50", "AvgCPU", "AvgMem", ""];

/// The artifact's spelling of each feature, in feature order.
const ARTIFACT_NAMES: [&str; FEATURE_COUNT] = [
    "Threads",
    "Compute (SM) Throughput",
    "DRAM Throughput",
    "Memory Throughput",
    "Registers",
    "Static Shared Memory",
    "Exclusive100",
    "sm%",
    "mem%",
    "memcap",
];

/// What a column holds.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Column {
    Name,
    Gpu,
    Feature(usize),
    Ignored,
}

fn classify(header: &str) -> Option<Column> {
    let h = header.trim();
    if NAME_COLUMNS.contains(&h) {
        return Some(Column::Name);
    }
    if h == "gpu_model" {
        return Some(Column::Gpu);
    }
    if IGNORED.contains(&h) {
        return Some(Column::Ignored);
    }
    FEATURE_COLUMNS
        .iter()
        .position(|c| *c == h)
        .or_else(|| ARTIFACT_NAMES.iter().position(|c| *c == h))
        .or_else(|| (h == "exclusive_throughput").then_some(6))
        .map(Column::Feature)
}

fn parse_value(text: &str) -> Result<Option<f64>> {
    let t = text.trim();
    if t.is_empty() {
        return Ok(None);
    }
    let v: f64 = t.parse().map_err(|_| invalid(format!("{t:?} is not a number")))?;
    if !v.is_finite() {
        return Err(invalid(format!("{t:?} is not a finite number")));
    }
    Ok(Some(v))
}

/// Reads a profile CSV.
pub fn read_csv(text: &str, gpu_model: &str, source: &str) -> Result<Vec<NewProfile>> {
    let mut rdr = csv::ReaderBuilder::new().flexible(false).from_reader(text.as_bytes());
    let header =
        rdr.headers().map_err(|e| invalid(format!("couldn't read the CSV header: {e}")))?.clone();
    let mut cols = Vec::with_capacity(header.len());
    for h in header.iter() {
        cols.push(classify(h).ok_or_else(|| {
            invalid(format!(
                "unknown column {h:?} (expected workload, gpu_model or one of: {})",
                FEATURE_COLUMNS.join(", ")
            ))
        })?);
    }
    if !cols.contains(&Column::Name) {
        return Err(invalid("no workload column (named \"workload\" or \"Type\")".into()));
    }
    if !cols.iter().any(|c| matches!(c, Column::Feature(_))) {
        return Err(invalid("no feature columns".into()));
    }
    let mut out = Vec::new();
    for (i, rec) in rdr.records().enumerate() {
        let line = i + 2;
        let rec = rec.map_err(|e| invalid(format!("line {line}: malformed CSV: {e}")))?;
        let mut p = NewProfile {
            workload: String::new(),
            gpu_model: gpu_model.to_string(),
            source: source.to_string(),
            values: [None; FEATURE_COUNT],
        };
        for (col, cell) in cols.iter().zip(rec.iter()) {
            match col {
                Column::Name => p.workload = cell.trim().to_string(),
                Column::Gpu if !cell.trim().is_empty() => p.gpu_model = cell.trim().to_string(),
                Column::Feature(f) => {
                    p.values[*f] = parse_value(cell)
                        .map_err(at(format!("line {line}: column {}", FEATURE_COLUMNS[*f])))?;
                }
                _ => {}
            }
        }
        p.validate().map_err(at(format!("line {line}")))?;
        out.push(p);
    }
    if out.is_empty() {
        return Err(invalid("no data rows".into()));
    }
    Ok(out)
}

/// Reads kace's JSON profile format: an array of objects with the CSV's column names as keys.
pub fn read_json(text: &str, gpu_model: &str, source: &str) -> Result<Vec<NewProfile>> {
    let doc: serde_json::Value = serde_json::from_str(text)
        .map_err(|source| Error::Json { what: "profile list".into(), source })?;
    let items =
        doc.as_array().ok_or_else(|| invalid("expected a JSON array of profiles".into()))?;
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let obj = item.as_object().ok_or_else(|| invalid(format!("item {i}: not an object")))?;
        let mut p = NewProfile {
            workload: String::new(),
            gpu_model: gpu_model.to_string(),
            source: source.to_string(),
            values: [None; FEATURE_COUNT],
        };
        for (k, v) in obj {
            let text_of = |v: &serde_json::Value| v.as_str().map(str::to_string);
            match classify(k) {
                Some(Column::Name) => {
                    p.workload = text_of(v)
                        .ok_or_else(|| invalid(format!("item {i}: {k} must be a string")))?
                }
                Some(Column::Gpu) => {
                    p.gpu_model = text_of(v)
                        .ok_or_else(|| invalid(format!("item {i}: {k} must be a string")))?
                }
                Some(Column::Feature(f)) if v.is_null() => p.values[f] = None,
                Some(Column::Feature(f)) => {
                    p.values[f] = Some(
                        v.as_f64()
                            .ok_or_else(|| invalid(format!("item {i}: {k} must be a number")))?,
                    )
                }
                Some(Column::Ignored) => {}
                None => return Err(invalid(format!("item {i}: unknown key {k:?}"))),
            }
        }
        p.validate().map_err(at(format!("item {i}")))?;
        out.push(p);
    }
    if out.is_empty() {
        return Err(invalid("no profiles".into()));
    }
    Ok(out)
}

/// Parses a profile table: JSON when `json`, else CSV.
pub fn parse(text: &str, json: bool, gpu_model: &str, source: &str) -> Result<Vec<NewProfile>> {
    if json {
        read_json(text, gpu_model, source)
    } else {
        read_csv(text, gpu_model, source)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kace_csv_with_partial_features() {
        let p = read_csv("workload,sm_pct,memcap_gib\nw1,40,2.5\nw2,,3\n", "g", "s").unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].values[7], Some(40.0));
        assert_eq!(p[1].values[7], None);
        assert_eq!(p[1].values[9], Some(3.0));
    }

    #[test]
    fn artifact_spellings_are_accepted() {
        let csv = "Threads,Compute (SM) Throughput,DRAM Throughput,Memory Throughput,Registers,\
                   Static Shared Memory,Type\n1,2,3,4,5,6,bert_batch2-inf\n";
        let p = read_csv(csv, "g", "s").unwrap();
        assert_eq!(p[0].workload, "bert_batch2-inf");
        assert_eq!(
            p[0].values[..6],
            [Some(1.0), Some(2.0), Some(3.0), Some(4.0), Some(5.0), Some(6.0)]
        );
        assert_eq!(p[0].values[6..], [None; 4]);
    }

    #[test]
    fn bad_tables_are_errors() {
        assert!(read_csv("workload,sm_pcnt\nw,1\n", "g", "s")
            .unwrap_err()
            .to_string()
            .contains("sm_pcnt"));
        assert!(read_csv("name,sm_pct\nw,1\n", "g", "s").is_err());
        assert!(read_csv("workload,sm_pct\nw,abc\n", "g", "s").is_err());
        assert!(read_csv("workload,sm_pct\nw,-1\n", "g", "s").is_err());
        assert!(read_csv("workload,sm_pct\nw;rm,1\n", "g", "s").is_err());
        assert!(read_csv("workload,sm_pct\n", "g", "s").is_err());
        assert!(read_csv("workload,sm_pct\nw,1,2\n", "g", "s").is_err());
    }

    #[test]
    fn json_profiles() {
        let p = read_json(
            r#"[{"workload":"w","gpu_model":"H200","sm_pct":1.5,"memcap":null}]"#,
            "g",
            "s",
        )
        .unwrap();
        assert_eq!(p[0].gpu_model, "H200");
        assert_eq!(p[0].values[7], Some(1.5));
        assert!(read_json(r#"[{"workload":"w","sm_pcnt":1}]"#, "g", "s").is_err());
        assert!(read_json(r#"{"workload":"w"}"#, "g", "s").is_err());
        assert!(read_json("[", "g", "s").is_err());
    }
}
