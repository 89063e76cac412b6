//! Which Slurm the end-to-end tests run: the system's (Debian's packages under /usr) or the one
//! installed under `$KACE_SLURM_PREFIX` (e.g. `/opt/kace-slurm/26.05.3`, built by
//! `.ci/slurm-from-source`). Everything Slurm-specific the harness touches comes from here: the
//! daemons and client commands, PATH, PluginDir, the headers the plugin is built against, and
//! the command paths written into the test kace.conf.

use std::path::{Path, PathBuf};

/// The variable naming a Slurm install prefix; unset or empty means the system's Slurm.
pub const PREFIX_VAR: &str = "KACE_SLURM_PREFIX";

/// The Slurm the tests use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlurmInstall {
    /// `None` for the system's Slurm (programs in /usr/sbin and /usr/bin, headers in
    /// /usr/include, Debian's compiled-in PluginDir).
    pub prefix: Option<PathBuf>,
}

impl SlurmInstall {
    /// The install `$KACE_SLURM_PREFIX` names, or the system's.
    pub fn from_env() -> SlurmInstall {
        let prefix = std::env::var_os(PREFIX_VAR).filter(|p| !p.is_empty()).map(PathBuf::from);
        SlurmInstall { prefix }
    }

    /// The absolute path of a Slurm program: daemons from `sbin`, commands from `bin`.
    pub fn program(&self, name: &str) -> PathBuf {
        let dir = if name.starts_with("slurmctld") || name.starts_with("slurmd") {
            "sbin"
        } else {
            "bin"
        };
        match &self.prefix {
            Some(p) => p.join(dir).join(name),
            None => Path::new("/usr").join(dir).join(name),
        }
    }

    /// PATH for every command the harness runs (Slurm's hooks get none of their own).
    pub fn path_var(&self) -> String {
        let system = "/usr/sbin:/usr/bin:/sbin:/bin";
        match &self.prefix {
            Some(p) => format!("{}/sbin:{}/bin:{system}", p.display(), p.display()),
            None => system.to_string(),
        }
    }

    /// `PluginDir=` for slurm.conf; `None` for the system's (its compiled-in default).
    pub fn plugin_dir(&self) -> Option<PathBuf> {
        self.prefix.as_ref().map(|p| p.join("lib/slurm"))
    }

    /// The directory holding `slurm/slurm_version.h` and `slurm/spank.h`, for the plugin build.
    pub fn include_dir(&self) -> PathBuf {
        match &self.prefix {
            Some(p) => p.join("include"),
            None => PathBuf::from("/usr/include"),
        }
    }

    /// `SLURM_VERSION_NUMBER` of the headers (`0x1a0503` for 26.05.3), when readable.
    pub fn version_number(&self) -> Option<u32> {
        let header = self.include_dir().join("slurm/slurm_version.h");
        let text = std::fs::read_to_string(header).ok()?;
        text.lines().find_map(|l| {
            let hex = l.strip_prefix("#define SLURM_VERSION_NUMBER")?.trim();
            u32::from_str_radix(hex.trim_start_matches("0x"), 16).ok()
        })
    }

    /// A short label for logs and directory names: `system` or the prefix's last component.
    pub fn label(&self) -> String {
        match &self.prefix {
            Some(p) => p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
            None => "system".to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_and_prefixed_installs() {
        let sys = SlurmInstall { prefix: None };
        assert_eq!(sys.program("slurmctld"), PathBuf::from("/usr/sbin/slurmctld"));
        assert_eq!(sys.program("scontrol"), PathBuf::from("/usr/bin/scontrol"));
        assert_eq!(sys.plugin_dir(), None);
        assert_eq!(sys.label(), "system");
        let p = SlurmInstall { prefix: Some(PathBuf::from("/opt/kace-slurm/26.05.3")) };
        assert_eq!(p.program("slurmd"), PathBuf::from("/opt/kace-slurm/26.05.3/sbin/slurmd"));
        assert_eq!(p.program("squeue"), PathBuf::from("/opt/kace-slurm/26.05.3/bin/squeue"));
        assert!(p
            .path_var()
            .starts_with("/opt/kace-slurm/26.05.3/sbin:/opt/kace-slurm/26.05.3/bin:"));
        assert_eq!(p.plugin_dir(), Some(PathBuf::from("/opt/kace-slurm/26.05.3/lib/slurm")));
        assert_eq!(p.include_dir(), PathBuf::from("/opt/kace-slurm/26.05.3/include"));
        assert_eq!(p.label(), "26.05.3");
    }
}
