//! slurmd context: check the plugstack.conf arguments once at daemon start, where an admin reads
//! the log, and record which plugin and Slurm version are in use.

use std::ffi::c_int;

use crate::config;
use crate::slurm::{log, Level};
use crate::SLURM_VERSION_NUMBER;

/// Returns -1 on a bad argument: with `required` in plugstack.conf, slurmd then refuses to start
/// rather than run jobs with a configuration the admin did not mean.
pub fn check_config(args: &[&[u8]]) -> c_int {
    match config::parse(args.iter().copied()) {
        Ok(c) => {
            let v = SLURM_VERSION_NUMBER;
            let msg = format!(
                "kace: slurmd: plugin {} for Slurm {}.{:02}.{}, mps_root={} progress_root={}",
                env!("CARGO_PKG_VERSION"),
                v >> 16,
                (v >> 8) & 0xff,
                v & 0xff,
                c.mps_root.display(),
                c.progress_root.display()
            );
            log(Level::Info, &msg);
            0
        }
        Err(e) => {
            log(Level::Error, &format!("kace: slurmd: couldn't parse plugin arguments: {e}"));
            -1
        }
    }
}
