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
use crate::types::{feature_value_problem, NewProfile, FEATURE_COLUMNS, FEATURE_COUNT};

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
    let shown = || crate::types::quote_untrusted(t);
    let v: f64 = t.parse().map_err(|_| invalid(format!("{} is not a number", shown())))?;
    if !v.is_finite() {
        return Err(invalid(format!("{} is not a finite number", shown())));
    }
    Ok(Some(v))
}

/// Where a quoted field that never closes starts (1-based line and column), if one does. The
/// csv crate takes such a field, cut off by the end of the file, as complete: a truncated file
/// would import its last row with a wrong value.
pub fn unterminated_quote(text: &str) -> Option<(usize, usize)> {
    /// Where the scan is; a quoted field carries where it opened.
    enum State {
        FieldStart,
        Unquoted,
        Quoted((usize, usize)),
        /// Just after a quote inside a quoted field: its end, or half of a doubled quote.
        AfterQuote((usize, usize)),
    }
    let (mut line, mut col) = (1, 0);
    let mut state = State::FieldStart;
    for c in text.chars() {
        col += 1;
        let ends_field = matches!(c, ',' | '\n');
        state = match state {
            State::FieldStart if c == '"' => State::Quoted((line, col)),
            State::Quoted(start) if c == '"' => State::AfterQuote(start),
            State::Quoted(start) => State::Quoted(start),
            State::AfterQuote(start) if c == '"' => State::Quoted(start),
            // Text after a closing quote is kept by the csv crate as it is.
            State::FieldStart | State::Unquoted | State::AfterQuote(_) if ends_field => {
                State::FieldStart
            }
            State::FieldStart | State::Unquoted | State::AfterQuote(_) => State::Unquoted,
        };
        if c == '\n' {
            line += 1;
            col = 0;
        }
    }
    match state {
        State::Quoted(start) => Some(start),
        _ => None,
    }
}

/// Columns that name the same thing twice: the later one would silently win.
fn duplicate_column(cols: &[Column], header: &csv::StringRecord) -> Result<()> {
    for (i, c) in cols.iter().enumerate() {
        if *c == Column::Ignored {
            continue;
        }
        if let Some(j) = cols[..i].iter().position(|d| d == c) {
            return Err(invalid(format!(
                "line 1, column {}: {} repeats column {} ({})",
                i + 1,
                crate::types::quote_untrusted(&header[i]),
                j + 1,
                crate::types::quote_untrusted(&header[j])
            )));
        }
    }
    Ok(())
}

/// Reads a profile CSV.
pub fn read_csv(text: &str, gpu_model: &str, source: &str) -> Result<Vec<NewProfile>> {
    if let Some((line, col)) = unterminated_quote(text) {
        return Err(invalid(format!(
            "line {line}, column {col}: a quoted field is never closed (is the file cut off?)"
        )));
    }
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
    duplicate_column(&cols, &header)?;
    if !cols.contains(&Column::Name) {
        return Err(invalid("no workload column (named \"workload\" or \"Type\")".into()));
    }
    if !cols.iter().any(|c| matches!(c, Column::Feature(_))) {
        return Err(invalid("no feature columns".into()));
    }
    let mut out = Vec::new();
    // The line each profile in `out` came from.
    let mut lines: Vec<u64> = Vec::new();
    for (i, rec) in rdr.records().enumerate() {
        let rec = rec.map_err(|e| invalid(format!("line {}: malformed CSV: {e}", i + 2)))?;
        let line = rec.position().map_or(i as u64 + 2, |p| p.line());
        let mut p = NewProfile {
            workload: String::new(),
            gpu_model: gpu_model.to_string(),
            source: source.to_string(),
            values: [None; FEATURE_COUNT],
        };
        for (i, (col, cell)) in cols.iter().zip(rec.iter()).enumerate() {
            match col {
                Column::Name => p.workload = cell.trim().to_string(),
                Column::Gpu if !cell.trim().is_empty() => p.gpu_model = cell.trim().to_string(),
                Column::Feature(f) => {
                    let place =
                        || format!("line {line}, column {} ({})", i + 1, FEATURE_COLUMNS[*f]);
                    p.values[*f] = parse_value(cell).map_err(at(place()))?;
                    if let Some(why) = p.values[*f].and_then(|v| feature_value_problem(*f, v)) {
                        let shown = crate::types::quote_untrusted(cell.trim());
                        return Err(invalid(format!("{}: {shown}: {why}", place())));
                    }
                }
                _ => {}
            }
        }
        p.validate().map_err(at(format!("line {line}")))?;
        if let Some(first) = out
            .iter()
            .position(|q: &NewProfile| q.workload == p.workload && q.gpu_model == p.gpu_model)
        {
            return Err(invalid(format!(
                "line {line}: workload {} is already on line {} (one row per workload and GPU)",
                p.workload, lines[first]
            )));
        }
        lines.push(line);
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
        if let Some(first) = out
            .iter()
            .position(|q: &NewProfile| q.workload == p.workload && q.gpu_model == p.gpu_model)
        {
            return Err(invalid(format!(
                "item {i}: workload {} is already item {first} (one per workload and GPU)",
                p.workload
            )));
        }
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

    /// The audit's silent acceptances (§B.1): each is now refused, saying where.
    #[test]
    fn nonsense_tables_are_refused_with_line_and_column() {
        let err = |text: &str| read_csv(text, "g", "s").unwrap_err().to_string();
        // Truncated inside a quoted field at the end of the file.
        let e = err("workload,sm_pct\nw1,10\nw2,\"20");
        assert!(e.contains("line 3, column 4: a quoted field is never closed"), "{e}");
        // The same column twice (and twice under its two spellings).
        let e = err("workload,sm_pct,sm_pct\nw,10,90\n");
        assert!(e.contains("line 1, column 3: \"sm_pct\" repeats column 2"), "{e}");
        let e = err("workload,memcap_gib,memcap\nw,1,2\n");
        assert!(e.contains("repeats column 2"), "{e}");
        // The same workload twice.
        let e = err("workload,sm_pct\nw,10\nv,20\nw,30\n");
        assert!(e.contains("line 4: workload w is already on line 2"), "{e}");
        // Absurd values.
        for (col, v) in [
            ("threads", "1e308"),
            ("memcap_gib", "1e308"),
            ("exclusive_throughput", "0"),
            ("exclusive_throughput", "1e-310"),
            ("registers", "1e300"),
        ] {
            let e = err(&format!("workload,{col}\nw,{v}\n"));
            assert!(e.contains(&format!("line 2, column 2 ({col})")), "{col}={v}: {e}");
        }
        // A GPU model with a newline.
        let e = err("workload,gpu_model,sm_pct\nw,\"a\nb\",10\n");
        assert!(e.contains("control characters"), "{e}");
        // A huge cell is not echoed whole.
        let e = err(&format!("workload,sm_pct\nw,{}\n", "9x".repeat(100_000)));
        assert!(e.len() < 300, "{} bytes", e.len());
        // Quoted fields that do close, with doubled quotes, are fine.
        let p = read_csv("workload,\"sm_pct\"\n\"w\",\"10\"\n", "g", "s").unwrap();
        assert_eq!(p[0].values[7], Some(10.0));
        assert_eq!(unterminated_quote("a,\"x\"\"y\",b\n"), None);
        assert_eq!(unterminated_quote("a,b\"c,d\n"), None);
    }

    #[test]
    fn json_tables_refuse_a_workload_twice() {
        let e = read_json(r#"[{"workload":"w","sm_pct":1},{"workload":"w","sm_pct":2}]"#, "g", "s")
            .unwrap_err()
            .to_string();
        assert!(e.contains("item 1: workload w is already item 0"), "{e}");
    }
}
