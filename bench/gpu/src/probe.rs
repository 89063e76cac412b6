//! Whether the MPS control program starts a daemon and a server through kace's own
//! [`kace_node::mps::NvidiaMps`], answers, and quits: what the prolog and epilog rely on.

use kace_layout::{mps_dirs, GpuIndex};
use kace_node::mps::{MpsControl, NvidiaMps};
use serde_json::{json, Value};

/// Starts the daemon of `gpu` under `mps_root` with a server for `uid`, checks that it answers,
/// and quits it. Every step's outcome is in the returned JSON; nothing here fails the run.
pub fn run(mps: &NvidiaMps, mps_root: &std::path::Path, gpu: GpuIndex, uid: u32) -> Value {
    let dirs = mps_dirs(mps_root, gpu);
    let before = mps.running(&dirs);
    // One user, as a single-user MPS daemon serves (mps.multi_user off, the default).
    let start = mps.start(&dirs, gpu, uid, false);
    let up = mps.running(&dirs);
    let quit = if up { Some(mps.quit(&dirs)) } else { None };
    let after = mps.running(&dirs);
    json!({
        "program": mps.program.display().to_string(),
        "gpu": gpu.0,
        "running_before": before,
        "start": start.as_ref().map(|_| "ok".to_string()).unwrap_or_else(|e| e.to_string()),
        "running_after_start": up,
        "quit": quit.map(|q| q.map(|_| "ok".to_string()).unwrap_or_else(|e| e.to_string())),
        "running_after_quit": after,
        "ok": start.is_ok() && up && !after,
    })
}
