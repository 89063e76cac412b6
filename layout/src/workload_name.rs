//! The workload-name rule, in one place: the SPANK plugin, the database and the node programs all
//! call [`check`], and the gate (`packaging/job_submit.lua`) mirrors it (`tests/tests/gate.rs`
//! checks that the two agree on a list of hostile names).
//!
//! Names come from users (`--kace-colocate`, job names) and end up in file names, log lines and
//! command arguments run as root, hence the narrow alphabet; a leading `.` or `-` would make a
//! hidden file or look like an option.

use std::fmt;

/// Longest workload name accepted, in bytes.
pub const MAX_LEN: usize = 128;

/// The rule, as users are told it.
pub const RULE: &str =
    "a workload name is 1 to 128 of A-Z a-z 0-9 . _ + -, not starting with . or -";

/// Why a value is not a workload name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkloadNameError {
    /// Empty.
    Empty,
    /// Longer than [`MAX_LEN`] bytes; `len` is its length.
    TooLong {
        /// The name's length in bytes.
        len: usize,
    },
    /// Contains `byte` (at byte offset `at`), which is outside `[A-Za-z0-9._+-]`.
    BadByte {
        /// The byte refused.
        byte: u8,
        /// Its offset in the name.
        at: usize,
    },
    /// Starts with `byte`, a `.` or a `-`.
    BadStart {
        /// The first byte.
        byte: u8,
    },
}

impl fmt::Display for WorkloadNameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WorkloadNameError::Empty => write!(f, "it is empty; {RULE}"),
            WorkloadNameError::TooLong { len } => write!(f, "it is {len} bytes long; {RULE}"),
            WorkloadNameError::BadByte { byte, at } => {
                let shown: String =
                    std::slice::from_ref(byte).escape_ascii().map(char::from).collect();
                write!(f, "byte {at} is \"{shown}\"; {RULE}")
            }
            WorkloadNameError::BadStart { byte } => {
                write!(f, "it starts with \"{}\"; {RULE}", char::from(*byte))
            }
        }
    }
}

impl std::error::Error for WorkloadNameError {}

/// Checks `raw` against the rule. Looks at no more than `MAX_LEN + 1` bytes before deciding, so
/// a hostile megabyte-long value costs nothing. Every allowed byte is ASCII, so a name that
/// passes is valid UTF-8.
pub fn check(raw: &[u8]) -> Result<(), WorkloadNameError> {
    if raw.is_empty() {
        return Err(WorkloadNameError::Empty);
    }
    if raw.len() > MAX_LEN {
        return Err(WorkloadNameError::TooLong { len: raw.len() });
    }
    if let Some(at) = raw.iter().position(|b| !is_allowed(*b)) {
        return Err(WorkloadNameError::BadByte { byte: raw[at], at });
    }
    if matches!(raw[0], b'.' | b'-') {
        return Err(WorkloadNameError::BadStart { byte: raw[0] });
    }
    Ok(())
}

fn is_allowed(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'+' | b'-')
}

/// Names the gate test submits to the Lua gate, expecting the same verdict as [`check`].
pub const HOSTILE_SAMPLES: &[&str] = &[
    "resnet50_v1.5+amp-B",
    ".hidden",
    "-rf",
    "..",
    "a/b",
    "../etc",
    "a b",
    "a;b",
    "$(id)",
    "a=b",
    "x-",
    "x.",
    "+x",
    "_x",
    "9",
    "caf\u{e9}",
    "a\u{202e}b",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_every_allowed_character_and_exactly_max_len() {
        assert_eq!(check(b"resnet50_v1.5+amp-B"), Ok(()));
        assert_eq!(check(&[b'a'; MAX_LEN]), Ok(()));
        assert_eq!(check(&[b'a'; MAX_LEN + 1]), Err(WorkloadNameError::TooLong { len: 129 }));
    }

    #[test]
    fn refuses_a_leading_dot_or_dash() {
        assert_eq!(check(b".hidden"), Err(WorkloadNameError::BadStart { byte: b'.' }));
        assert_eq!(check(b"-rf"), Err(WorkloadNameError::BadStart { byte: b'-' }));
        assert_eq!(check(b"x.-"), Ok(()));
    }

    #[test]
    fn refuses_control_shell_and_path_characters_naming_the_offset() {
        assert_eq!(check(b"ab\ncd"), Err(WorkloadNameError::BadByte { byte: b'\n', at: 2 }));
        for bad in [&b"a b"[..], b"a/b", b"../x", b"$(id)", b"a;b", b"a=b", b"\xc3\xa9"] {
            assert!(matches!(check(bad), Err(WorkloadNameError::BadByte { .. })), "{bad:?}");
        }
        assert_eq!(check(b""), Err(WorkloadNameError::Empty));
    }

    #[test]
    fn messages_say_what_is_allowed() {
        let msg = check(b"a b").unwrap_err().to_string();
        assert_eq!(msg, format!("byte 1 is \" \"; {RULE}"));
        assert_eq!(check(b".x").unwrap_err().to_string(), format!("it starts with \".\"; {RULE}"));
    }
}
