//! The plugin's arguments from its plugstack.conf line (`required /path/libkace_spank.so
//! mps_root=/run/kace/mps progress_root=/var/spool/kace/progress`), parsed into [`Config`].
//! Pure; unknown keys and bad values are errors, never silently ignored.

use std::fmt;
use std::path::{Component, Path, PathBuf};

pub use kace_layout::{DEFAULT_MPS_ROOT, DEFAULT_PROGRESS_ROOT, MAX_MPS_ROOT_LEN};
/// Longest `progress_root` accepted, in bytes.
pub const MAX_PROGRESS_ROOT_LEN: usize = 512;
pub use kace_layout::DEFAULT_PYTHON_HOOK;
/// Longest `python_hook` accepted, in bytes.
pub const MAX_PYTHON_HOOK_LEN: usize = 512;
const KNOWN_KEYS: &str = "mps_root, progress_root, python_hook";

/// The plugin's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Root of the per-GPU MPS directories; see [`crate::layout::mps_dirs`].
    pub mps_root: PathBuf,
    /// Directory of the per-job progress files; see [`crate::layout::progress_file`].
    pub progress_root: PathBuf,
    /// Directory put first on a kace job's `PYTHONPATH` so that its `sitecustomize.py` reports
    /// PyTorch progress with no change to the job; nothing is set when it does not exist.
    pub python_hook: PathBuf,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            mps_root: PathBuf::from(DEFAULT_MPS_ROOT),
            progress_root: PathBuf::from(DEFAULT_PROGRESS_ROOT),
            python_hook: PathBuf::from(DEFAULT_PYTHON_HOOK),
        }
    }
}

/// Why the plugstack.conf arguments were refused. Each names the offending argument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigError {
    /// An argument that is not `key=value`.
    NotKeyValue(String),
    /// A key the plugin does not know.
    UnknownKey(String),
    /// A key given twice.
    Duplicate(String),
    /// A path value that is not usable; `why` says what is wrong.
    BadPath {
        /// The argument's key.
        key: String,
        /// Its value.
        value: String,
        /// What is wrong with it.
        why: &'static str,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::NotKeyValue(a) => {
                write!(f, "argument {a} is not key=value (known keys: {KNOWN_KEYS})")
            }
            ConfigError::UnknownKey(k) => {
                write!(f, "unknown key {k} (known keys: {KNOWN_KEYS})")
            }
            ConfigError::Duplicate(k) => write!(f, "key {k} is given twice"),
            ConfigError::BadPath { key, value, why } => write!(f, "{key}={value}: {why}"),
        }
    }
}

impl std::error::Error for ConfigError {}

/// Parses the arguments Slurm passes to `slurm_spank_init` (`argv[0..argc]`). Missing keys keep
/// their defaults.
pub fn parse<'a, I>(args: I) -> Result<Config, ConfigError>
where
    I: IntoIterator<Item = &'a [u8]>,
{
    let mut config = Config::default();
    let (mut seen_mps, mut seen_progress, mut seen_hook) = (false, false, false);
    for raw in args {
        let arg = crate::workload::quote(raw);
        let text = std::str::from_utf8(raw).map_err(|_| ConfigError::NotKeyValue(arg.clone()))?;
        let (key, value) = text.split_once('=').ok_or(ConfigError::NotKeyValue(arg))?;
        let (slot, seen, max) = match key {
            "mps_root" => (&mut config.mps_root, &mut seen_mps, MAX_MPS_ROOT_LEN),
            "progress_root" => {
                (&mut config.progress_root, &mut seen_progress, MAX_PROGRESS_ROOT_LEN)
            }
            "python_hook" => (&mut config.python_hook, &mut seen_hook, MAX_PYTHON_HOOK_LEN),
            _ => return Err(ConfigError::UnknownKey(crate::workload::quote(key.as_bytes()))),
        };
        if std::mem::replace(seen, true) {
            return Err(ConfigError::Duplicate(key.to_string()));
        }
        *slot = check_dir(key, value, max)?;
    }
    Ok(config)
}

fn check_dir(key: &str, value: &str, max: usize) -> Result<PathBuf, ConfigError> {
    let bad = |why| ConfigError::BadPath {
        key: key.to_string(),
        value: crate::workload::quote(value.as_bytes()),
        why,
    };
    if value.len() > max {
        return Err(bad("too long"));
    }
    if value.bytes().any(|b| b.is_ascii_control()) {
        return Err(bad("contains a control character"));
    }
    let path = Path::new(value);
    if !path.is_absolute() {
        return Err(bad("must be an absolute path"));
    }
    if path.components().any(|c| matches!(c, Component::ParentDir)) {
        return Err(bad("must not contain .."));
    }
    if path.parent().is_none() {
        return Err(bad("must not be /"));
    }
    // Normalise away "//", "/./" and a trailing "/" so the prolog and the plugin agree on paths.
    Ok(path.components().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_strs(args: &[&str]) -> Result<Config, ConfigError> {
        parse(args.iter().map(|a| a.as_bytes()))
    }

    #[test]
    fn no_arguments_give_the_documented_defaults() {
        let c = parse_strs(&[]).unwrap();
        assert_eq!(c.mps_root, Path::new("/run/kace/mps"));
        assert_eq!(c.progress_root, Path::new("/var/spool/kace/progress"));
        assert_eq!(c.python_hook, Path::new("/usr/share/kace/python/autohook"));
    }

    #[test]
    fn python_hook_is_a_checked_directory() {
        let c = parse_strs(&["python_hook=/opt/kace//hook/"]).unwrap();
        assert_eq!(c.python_hook, Path::new("/opt/kace/hook"));
        assert!(matches!(parse_strs(&["python_hook=hook"]), Err(ConfigError::BadPath { .. })));
    }

    #[test]
    fn both_keys_are_read_and_normalised() {
        let c = parse_strs(&["progress_root=/tmp/p/", "mps_root=/tmp//m/./x"]).unwrap();
        assert_eq!(c.mps_root, Path::new("/tmp/m/x"));
        assert_eq!(c.progress_root, Path::new("/tmp/p"));
    }

    #[test]
    fn unknown_key_is_an_error() {
        let e = parse_strs(&["mps_rot=/x"]).unwrap_err();
        assert_eq!(e, ConfigError::UnknownKey("\"mps_rot\"".into()));
        assert!(e.to_string().contains("known keys: mps_root, progress_root, python_hook"));
    }

    #[test]
    fn bare_word_and_duplicate_are_errors() {
        assert!(matches!(parse_strs(&["verbose"]), Err(ConfigError::NotKeyValue(_))));
        let e = parse_strs(&["mps_root=/a", "mps_root=/b"]).unwrap_err();
        assert_eq!(e, ConfigError::Duplicate("mps_root".into()));
    }

    #[test]
    fn bad_paths_are_refused_with_a_reason() {
        let why = |arg: &str| match parse_strs(&[arg]) {
            Err(ConfigError::BadPath { why, .. }) => why,
            other => panic!("{arg}: {other:?}"),
        };
        assert_eq!(why("mps_root=run/kace"), "must be an absolute path");
        assert_eq!(why("mps_root="), "must be an absolute path");
        assert_eq!(why("progress_root=/a/../etc"), "must not contain ..");
        assert_eq!(why("progress_root=/"), "must not be /");
        assert_eq!(why("mps_root=/a\x1bb"), "contains a control character");
        assert_eq!(why(&format!("mps_root=/{}", "m".repeat(64))), "too long");
    }

    #[test]
    fn non_utf8_argument_is_refused() {
        let e = parse([&b"mps_root=/\xff"[..]]).unwrap_err();
        assert!(matches!(e, ConfigError::NotKeyValue(_)));
    }
}
