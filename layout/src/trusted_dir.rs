//! Whether a directory is safe for root to write into: kace's root hooks create, chown and
//! rename files in `progress_root`, `mps_root`, `state_dir` and the spool directories, and if a
//! user could replace an entry there (a symlink swapped in between two calls), root would act
//! on a file the user chose.

use std::fmt;
use std::fs;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

/// Mode of a directory [`ensure_trusted_dir`] creates.
pub const DIR_MODE: u32 = 0o755;

/// Why a directory is not trusted.
#[derive(Debug)]
pub enum UntrustedDir {
    /// `path` (the directory or one above it) is not owned by root.
    NotRootOwned {
        /// The path found not root's.
        path: PathBuf,
        /// Its owner.
        uid: u32,
    },
    /// `path` is writable by its group or by everyone (and, above the directory itself, not
    /// sticky, which would stop users from replacing root's entries).
    Writable {
        /// The path found writable.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// `path` is a symlink not owned by root.
    UserSymlink {
        /// The symlink.
        path: PathBuf,
    },
    /// `path` is not a directory.
    NotADirectory {
        /// What is there instead.
        path: PathBuf,
    },
    /// `path` could not be inspected or created.
    Io {
        /// The path the operation was on.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
}

impl fmt::Display for UntrustedDir {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UntrustedDir::NotRootOwned { path, uid } => {
                write!(f, "{} is owned by uid {uid}, not root", path.display())
            }
            UntrustedDir::Writable { path, mode } => write!(
                f,
                "{} is writable by its group or everyone (mode {:o}); make it 0755 or stricter",
                path.display(),
                mode & 0o7777
            ),
            UntrustedDir::UserSymlink { path } => {
                write!(f, "{} is a symlink not owned by root", path.display())
            }
            UntrustedDir::NotADirectory { path } => {
                write!(f, "{} is not a directory", path.display())
            }
            UntrustedDir::Io { path, source } => write!(f, "{}: {source}", path.display()),
        }
    }
}

impl std::error::Error for UntrustedDir {}

/// Whether this process runs as root: only then can a user-controlled directory turn kace's
/// writes against the system (a process without root cannot chown, and writes as itself).
pub fn running_as_root() -> bool {
    fs::metadata("/proc/self").map(|m| m.uid() == 0).unwrap_or(false)
}

/// Creates `dir` (and missing parents, [`DIR_MODE`]) when it does not exist, then checks that
/// it is trusted ([`check_trusted_dir`]). Does nothing but create when not running as root.
pub fn ensure_trusted_dir(dir: &Path) -> Result<(), UntrustedDir> {
    if !dir.exists() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(DIR_MODE)
            .create(dir)
            .map_err(|source| UntrustedDir::Io { path: dir.to_path_buf(), source })?;
    }
    if running_as_root() {
        check_trusted_dir(dir)?;
    }
    Ok(())
}

/// Checks `dir` and every directory above it, both as written and after resolving symlinks:
/// each is owned by root and not writable by group or others, except that a directory above
/// `dir` may be world-writable when sticky (as `/tmp`); a symlink on the way must be root's.
pub fn check_trusted_dir(dir: &Path) -> Result<(), UntrustedDir> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| UntrustedDir::Io { path, source }
    };
    let dir = if dir.is_absolute() {
        dir.to_path_buf()
    } else {
        std::env::current_dir().map_err(io(dir))?.join(dir)
    };
    let real = fs::canonicalize(&dir).map_err(io(&dir))?;
    for path in [&dir, &real] {
        for p in path.ancestors() {
            let meta = fs::symlink_metadata(p).map_err(io(p))?;
            let ft = meta.file_type();
            if ft.is_symlink() {
                if meta.uid() != 0 {
                    return Err(UntrustedDir::UserSymlink { path: p.to_path_buf() });
                }
                continue;
            }
            if !ft.is_dir() {
                return Err(UntrustedDir::NotADirectory { path: p.to_path_buf() });
            }
            if meta.uid() != 0 {
                return Err(UntrustedDir::NotRootOwned { path: p.to_path_buf(), uid: meta.uid() });
            }
            let mode = meta.mode();
            let sticky_above = mode & 0o1000 != 0 && p != path.as_path();
            if mode & 0o022 != 0 && !sticky_above {
                return Err(UntrustedDir::Writable { path: p.to_path_buf(), mode });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("kace-trusted-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::DirBuilder::new().mode(0o755).create(&d).unwrap();
        fs::set_permissions(&d, fs::Permissions::from_mode(0o755)).unwrap();
        d
    }

    #[test]
    fn group_or_world_writable_or_user_owned_directories_are_refused() {
        let d = scratch("modes");
        let root = running_as_root();
        // As root, a root-owned 0755 directory under the sticky /tmp is trusted; as anyone
        // else, their own directory is refused for not being root's.
        assert_eq!(check_trusted_dir(&d).is_ok(), root, "{:?}", check_trusted_dir(&d));
        for mode in [0o775, 0o777, 0o757] {
            fs::set_permissions(&d, fs::Permissions::from_mode(mode)).unwrap();
            assert!(check_trusted_dir(&d).is_err(), "{mode:o} accepted");
            // A trusted directory below a writable one is not trusted either.
            let below = d.join("below");
            fs::DirBuilder::new().mode(0o755).create(&below).unwrap();
            assert!(check_trusted_dir(&below).is_err(), "below {mode:o} accepted");
            fs::remove_dir(&below).unwrap();
        }
        fs::set_permissions(&d, fs::Permissions::from_mode(0o755)).unwrap();
        if root {
            std::os::unix::fs::chown(&d, Some(65534), None).unwrap();
            let err = check_trusted_dir(&d).unwrap_err();
            assert!(matches!(err, UntrustedDir::NotRootOwned { uid: 65534, .. }), "{err}");
            std::os::unix::fs::chown(&d, Some(0), None).unwrap();
            // A symlink to the trusted directory is fine when root made it; the check follows
            // it to where it leads.
            let link =
                std::env::temp_dir().join(format!("kace-trusted-link-{}", std::process::id()));
            let _ = fs::remove_file(&link);
            std::os::unix::fs::symlink(&d, &link).unwrap();
            assert!(check_trusted_dir(&link).is_ok());
            std::os::unix::fs::lchown(&link, Some(65534), None).unwrap();
            assert!(matches!(check_trusted_dir(&link), Err(UntrustedDir::UserSymlink { .. })));
            fs::remove_file(&link).unwrap();
        }
        let file = d.join("f");
        fs::write(&file, "").unwrap();
        assert!(check_trusted_dir(&file).is_err());
        fs::remove_dir_all(&d).unwrap();
    }
}
