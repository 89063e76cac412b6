//! Reading Slurm's JSON job records (`scontrol --json show job`, `squeue --json`), the
//! structured interface kace takes job details from: every field is its own JSON value, so no text a user puts in a job name,
//! comment or command line (all printed by `scontrol show job` beside the admin fields) can
//! be taken for a field kace reads.
//!
//! The schema differs by release; these readers accept each:
//! - 22.05 (openapi v0.0.38): `squeue --json` only (scontrol has no `--json`), `job_state` a
//!   string, numbers plain, `-j`/`-t` ignored (every job is listed, so callers always filter);
//! - 25.11 and 26.05 (data_parser v0.0.44/45): `job_state` an array of flags, numbers wrapped as
//!   `{"set": …, "infinite": …, "number": …}`.
//!
//! The GRES allocation is still Slurm's text (`gres_detail`), read by [`crate::gres`].

use serde_json::Value;

use crate::error::{short, Error, Result};
use crate::gres::{self, GresAlloc};

/// One job as kace needs it from a JSON record.
#[derive(Debug, Clone, PartialEq)]
pub struct JsonJob {
    /// Job id.
    pub id: u32,
    /// The base state (`PENDING`, `RUNNING`, `CONFIGURING`, …).
    pub state: String,
    /// `state_reason` (`JobHeldUser`, `None`, …).
    pub reason: String,
    /// `admin_comment` (empty when unset).
    pub admin_comment: String,
    /// `nodes` (the allocation; empty while pending).
    pub nodes: String,
    /// The allocation on the job's first node (`gres_detail[0]`).
    pub gres: Vec<GresAlloc>,
    /// Part of a job array (`array_job_id` set and not zero).
    pub array: bool,
    /// Part of a heterogeneous job (`het_job_id` set and not zero).
    pub het: bool,
    /// `user_name`.
    pub user: String,
    /// `submit_time`, Unix seconds.
    pub submitted: Option<f64>,
    /// `start_time` once the job has started (a pending job's is Slurm's forecast: `None`).
    pub started: Option<f64>,
    /// `end_time` once the job has ended (a running job's is its time limit: `None`).
    pub ended: Option<f64>,
    /// Every entry of `job_state`: the base state, then flags such as `COMPLETING` (22.05: the
    /// one string, a flag's name when one is set).
    pub flags: Vec<String>,
    /// `required_nodes` (empty when not pinned).
    pub req_nodes: String,
    /// `tres_per_node` (its GRES request: `gres/shard:1`, `gres:shard:g1:1`, or empty).
    pub tres_per_node: String,
    /// `dependency`, as `squeue` prints it (`afterok:12(unfulfilled)`), empty when none.
    pub dependency: String,
    /// `eligible_time` when set (`--begin`), Unix seconds.
    pub eligible: Option<f64>,
    /// `partition`: the partitions it may run in (`pa,pb`).
    pub partition: String,
    /// `resv_name`: the reservation it asked for (empty when none).
    pub reservation: String,
    /// `features`: its constraint (empty when none).
    pub features: String,
    /// `restart_cnt`.
    pub restarts: u32,
    /// `time_limit` (minutes in the record), seconds; `None` when unlimited or unset.
    pub time_limit_s: Option<f64>,
    /// `account` (empty when unset).
    pub account: String,
    /// `qos` (empty when unset).
    pub qos: String,
    /// `nice` (22.05 writes `null` for none: 0).
    pub nice: i64,
}

impl JsonJob {
    /// The node-local indices of the GPUs its allocation holds shards (or GPUs) of, sorted.
    pub fn gpus(&self) -> Vec<u32> {
        let mut gpus: Vec<u32> = self
            .gres
            .iter()
            .filter(|g| g.count > 0)
            .flat_map(|g| g.indices.iter().copied())
            .collect();
        gpus.sort_unstable();
        gpus.dedup();
        gpus
    }
}

/// A number, plain (22.05) or wrapped (`{"set": true, "number": 7}`, 23.02 on); `None` when
/// unset, infinite or not a number.
pub fn number(v: &Value) -> Option<u64> {
    match v {
        Value::Number(n) => n.as_u64(),
        Value::Object(o) => {
            let set = o.get("set").and_then(Value::as_bool).unwrap_or(false);
            let infinite = o.get("infinite").and_then(Value::as_bool).unwrap_or(false);
            if set && !infinite {
                o.get("number").and_then(Value::as_u64)
            } else {
                None
            }
        }
        _ => None,
    }
}

/// A job's base state: the string (22.05) or the first entry of the flag array (23.02 on; the
/// base state comes first, flags such as `COMPLETING` after it).
pub fn base_state(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Array(a) => a.first().and_then(Value::as_str).map(str::to_string),
        _ => None,
    }
}

fn text(job: &Value, key: &str) -> String {
    job.get(key).and_then(Value::as_str).unwrap_or("").to_string()
}

/// One job record; `None` when it has no readable id or state (an unknown schema is not
/// guessed at).
pub fn job(record: &Value) -> Option<JsonJob> {
    let id = u32::try_from(number(record.get("job_id")?)?).ok()?;
    let state = base_state(record.get("job_state")?)?;
    let gres = record
        .get("gres_detail")
        .and_then(Value::as_array)
        .and_then(|a| a.first())
        .and_then(Value::as_str)
        .map(gres::parse_alloc)
        .unwrap_or_default();
    let nonzero = |key: &str| record.get(key).and_then(number).is_some_and(|n| n != 0);
    let time = |key: &str| record.get(key).and_then(number).filter(|t| *t > 0).map(|t| t as f64);
    let pending = state == "PENDING";
    let unfinished = matches!(state.as_str(), "PENDING" | "RUNNING" | "CONFIGURING" | "SUSPENDED");
    Some(JsonJob {
        id,
        state,
        reason: text(record, "state_reason"),
        admin_comment: text(record, "admin_comment"),
        nodes: text(record, "nodes"),
        gres,
        array: nonzero("array_job_id"),
        het: nonzero("het_job_id"),
        user: text(record, "user_name"),
        submitted: time("submit_time"),
        started: time("start_time").filter(|_| !pending),
        ended: time("end_time").filter(|_| !unfinished),
        flags: match record.get("job_state") {
            Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).map(String::from).collect(),
            Some(Value::String(s)) => vec![s.clone()],
            _ => Vec::new(),
        },
        req_nodes: text(record, "required_nodes"),
        tres_per_node: text(record, "tres_per_node"),
        dependency: text(record, "dependency"),
        eligible: time("eligible_time"),
        partition: text(record, "partition"),
        reservation: text(record, "resv_name"),
        features: text(record, "features"),
        restarts: record.get("restart_cnt").and_then(number).unwrap_or(0).min(u32::MAX as u64)
            as u32,
        time_limit_s: record.get("time_limit").and_then(number).map(|m| m as f64 * 60.0),
        account: text(record, "account"),
        qos: text(record, "qos"),
        nice: record.get("nice").and_then(Value::as_i64).unwrap_or(0),
    })
}

/// Every readable job of a `squeue --json` document. A document with no `jobs` array is an
/// error; a record that does not read is skipped and counted in the second value.
pub fn jobs(doc: &str) -> Result<(Vec<JsonJob>, usize)> {
    let parsed: Value = serde_json::from_str(doc)
        .map_err(|e| Error::Parse { what: format!("squeue's JSON ({e})"), text: short(doc) })?;
    let Some(records) = parsed.get("jobs").and_then(Value::as_array) else {
        return Err(Error::Parse {
            what: "squeue's JSON (no \"jobs\" list)".into(),
            text: short(doc),
        });
    };
    let read: Vec<JsonJob> = records.iter().filter_map(job).collect();
    let skipped = records.len() - read.len();
    Ok((read, skipped))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn numbers_and_states_of_each_schema() {
        assert_eq!(number(&json!(7)), Some(7));
        assert_eq!(number(&json!({"set": true, "infinite": false, "number": 7})), Some(7));
        assert_eq!(number(&json!({"set": false, "infinite": false, "number": 0})), None);
        assert_eq!(number(&json!({"set": true, "infinite": true, "number": 0})), None);
        assert_eq!(number(&json!("7")), None);
        assert_eq!(base_state(&json!("PENDING")).as_deref(), Some("PENDING"));
        assert_eq!(base_state(&json!(["RUNNING", "COMPLETING"])).as_deref(), Some("RUNNING"));
        assert_eq!(base_state(&json!([])), None);
    }

    #[test]
    fn records_without_id_or_state_are_skipped_and_a_non_document_is_an_error() {
        let doc = r#"{"jobs": [{"job_id": 3, "job_state": "PENDING"}, {"job_state": "PENDING"},
                     {"job_id": {"set": true, "infinite": false, "number": 4}, "job_state": ["RUNNING"],
                      "array_job_id": {"set": true, "infinite": false, "number": 4}}]}"#;
        let (jobs, skipped) = jobs(doc).unwrap();
        assert_eq!((jobs.len(), skipped), (2, 1));
        assert!(!jobs[0].array && jobs[1].array);
        assert!(super::jobs("squeue: error: Invalid job id").is_err());
        assert!(super::jobs("{\"errors\": []}").is_err());
    }

    #[test]
    fn user_and_times_of_each_schema() {
        let doc = r#"{"jobs": [
            {"job_id": 5, "job_state": "COMPLETED", "user_name": "alice", "submit_time": 100,
             "start_time": 110, "end_time": 170},
            {"job_id": 6, "job_state": ["RUNNING"], "user_name": "bob",
             "submit_time": {"set": true, "infinite": false, "number": 200},
             "start_time": {"set": true, "infinite": false, "number": 210},
             "end_time": {"set": true, "infinite": false, "number": 3810}},
            {"job_id": 7, "job_state": "PENDING", "submit_time": 300, "start_time": 400,
             "end_time": 0}]}"#;
        let (j, _) = jobs(doc).unwrap();
        assert_eq!(j[0].user, "alice");
        assert_eq!(
            (j[0].submitted, j[0].started, j[0].ended),
            (Some(100.0), Some(110.0), Some(170.0))
        );
        assert_eq!((j[1].submitted, j[1].started, j[1].ended), (Some(200.0), Some(210.0), None));
        // A pending job's start is a forecast and a running job's end its limit.
        assert_eq!((j[2].user.as_str(), j[2].started, j[2].ended), ("", None, None));
    }
}
