//! Reading a small file one of kace's root programs left for another ([`crate::memory_limit`],
//! [`crate::release_ticket`]): the reader believes what it says, so it takes only a plain file
//! (no link) of an owner it trusts, and the very file it inspected, not one swapped in between.

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
