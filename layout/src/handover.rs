//! A small file one of kace's root programs leaves for another ([`crate::memory_limit`],
//! [`crate::thread_share`], [`crate::release_ticket`]): written whole or not at all, and read
//! believing what it says, so the reader takes only a plain file (no link) of an owner it
//! trusts, and the very file it inspected, not one swapped in between.

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// The text of `path`, at most `max_bytes` of it, if it is a plain file whose owner
/// `owner_ok` accepts (`owners` names them in the error). `Ok(None)`: there is no such file;
/// `Err`: one that is not to be believed or not readable, with why.
pub fn read(
    path: &Path,
    max_bytes: u64,
    owner_ok: impl Fn(u32) -> bool,
    owners: &str,
) -> Result<Option<String>, String> {
    let shown = path.display();
    let link = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{shown}: {e}")),
    };
    if !link.file_type().is_file() || !owner_ok(link.uid()) || link.len() > max_bytes {
        return Err(format!(
            "{shown} is not a plain file of {owners} of at most {max_bytes} bytes; ignored"
        ));
    }
    let f = std::fs::File::open(path).map_err(|e| format!("{shown}: {e}"))?;
    let opened = f.metadata().map_err(|e| format!("{shown}: {e}"))?;
    if (opened.dev(), opened.ino()) != (link.dev(), link.ino()) {
        return Err(format!("{shown} changed while it was opened; ignored"));
    }
    let mut text = String::new();
    f.take(max_bytes).read_to_string(&mut text).map_err(|e| format!("{shown}: {e}"))?;
    Ok(Some(text))
}

/// What `parse` makes of the text of `path`, read as [`read`] does from a file of uid `owner`
/// only: `Ok(None)` when there is none; `Err` when it is not to be believed, or `parse` finds
/// it not of the form `form` names.
pub fn read_parsed<T>(
    path: &Path,
    max_bytes: u64,
    owner: u32,
    parse: impl Fn(&str) -> Option<T>,
    form: &str,
) -> Result<Option<T>, String> {
    let owners = format!("uid {owner}");
    let Some(text) = read(path, max_bytes, |uid| uid == owner, &owners)? else {
        return Ok(None);
    };
    parse(&text)
        .map(Some)
        .ok_or_else(|| format!("{} does not hold {form}; ignored", path.display()))
}

/// Writes `text` to `path` atomically (a temporary file beside it, created new so a link
/// planted at its name is never followed, then renamed over `path`) with `mode`; with `None`,
/// removes `path` (none there is fine). Not fsynced: each hand-over is an optimisation or is
/// written again before it matters.
pub fn write(path: &Path, text: Option<&str>, mode: u32) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let Some(text) = text else {
        return match std::fs::remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        };
    };
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} names no file in a directory", path.display()),
        ));
    };
    let tmp = dir.join(format!(".{}.tmp", name.to_string_lossy()));
    let _ = std::fs::remove_file(&tmp);
    let result = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .and_then(|()| std::fs::rename(&tmp, path));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
