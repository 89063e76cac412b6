//! The `--kace-colocate[=WORKLOAD]` value: what the option's raw argument means, and the rule a
//! workload name must follow (kace_layout::workload_name, which the gate mirrors).

pub use kace_layout::workload_name::{WorkloadNameError as WorkloadError, MAX_LEN, RULE};

/// Longest part of a rejected value quoted back in a message, in bytes.
const PREVIEW_LEN: usize = 40;

/// A validated workload name: 1..=[`MAX_LEN`] bytes of `[A-Za-z0-9._+-]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload(String);

impl Workload {
    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// What the user asked for with the option.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Bare `--kace-colocate` (or an empty value): the workload is the job's name. The plugin
    /// cannot see the final job name in sbatch (`-J`, `#SBATCH -J` and the script-name default
    /// are resolved later), so the gate resolves it from `job_desc.name`.
    FromJobName,
    /// `--kace-colocate=NAME`.
    Named(Workload),
}

impl Request {
    /// The value put in the job-control environment (`KACE_COLOCATE`, which the prolog and
    /// epilog see as `SPANK_KACE_COLOCATE`): the name, or empty for [`Request::FromJobName`].
    pub fn env_value(&self) -> &str {
        match self {
            Request::FromJobName => "",
            Request::Named(w) => w.as_str(),
        }
    }
}

/// Checks `raw` against the workload rule. Looks at no more than `MAX_LEN + 1` bytes before
/// deciding, so a hostile megabyte-long value costs nothing.
pub fn validate(raw: &[u8]) -> Result<Workload, WorkloadError> {
    kace_layout::workload_name::check(raw)?;
    // Every allowed byte is ASCII, so this is valid UTF-8.
    Ok(Workload(raw.iter().map(|&b| b as char).collect()))
}

/// Interprets the option's raw argument as Slurm delivers it.
///
/// The bare option arrives differently per context: as NULL in sbatch/srun (allocator, local),
/// as `""` in slurmstepd (remote), and as the literal `"(null)"` from `spank_option_getopt` in
/// the prolog/epilog (job_script). All three mean [`Request::FromJobName`]. `(null)` cannot be a
/// workload name anyway (parentheses are not allowed), so reading it as "bare" loses nothing.
pub fn parse_option(raw: Option<&[u8]>) -> Result<Request, WorkloadError> {
    match raw {
        None | Some(b"") | Some(b"(null)") => Ok(Request::FromJobName),
        Some(v) => validate(v).map(Request::Named),
    }
}

/// A short, printable rendering of an untrusted value for log and user messages: control and
/// non-ASCII bytes escaped, cut after `PREVIEW_LEN` bytes with the total length noted.
pub fn quote(raw: &[u8]) -> String {
    let shown = &raw[..raw.len().min(PREVIEW_LEN)];
    let mut out = String::with_capacity(shown.len() + 16);
    out.push('"');
    out.extend(shown.escape_ascii().map(char::from));
    out.push('"');
    if raw.len() > PREVIEW_LEN {
        out.push_str(&format!("... ({} bytes)", raw.len()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_every_allowed_character() {
        let w = validate(b"resnet50_v1.5+amp-B").unwrap();
        assert_eq!(w.as_str(), "resnet50_v1.5+amp-B");
    }

    #[test]
    fn accepts_exactly_max_len_and_refuses_one_more() {
        assert!(validate(&[b'a'; MAX_LEN]).is_ok());
        assert_eq!(validate(&[b'a'; MAX_LEN + 1]), Err(WorkloadError::TooLong { len: 129 }));
    }

    #[test]
    fn refuses_a_very_long_value_by_length() {
        let long = vec![b'x'; 1 << 20];
        assert_eq!(validate(&long), Err(WorkloadError::TooLong { len: 1 << 20 }));
    }

    #[test]
    fn refuses_control_characters_and_names_the_offset() {
        assert_eq!(validate(b"ab\ncd"), Err(WorkloadError::BadByte { byte: b'\n', at: 2 }));
        assert_eq!(validate(b"\x01"), Err(WorkloadError::BadByte { byte: 1, at: 0 }));
        assert_eq!(validate(b"a\x7f"), Err(WorkloadError::BadByte { byte: 0x7f, at: 1 }));
    }

    #[test]
    fn refuses_shell_and_path_characters() {
        for bad in [&b"a b"[..], b"a/b", b"../x", b"$(id)", b"a;b", b"a=b", b"\xc3\xa9"] {
            assert!(matches!(validate(bad), Err(WorkloadError::BadByte { .. })), "{bad:?}");
        }
    }

    #[test]
    fn refuses_empty_when_a_name_is_required() {
        assert_eq!(validate(b""), Err(WorkloadError::Empty));
    }

    #[test]
    fn bare_option_in_every_context_means_the_job_name() {
        assert_eq!(parse_option(None), Ok(Request::FromJobName));
        assert_eq!(parse_option(Some(b"")), Ok(Request::FromJobName));
        assert_eq!(parse_option(Some(b"(null)")), Ok(Request::FromJobName));
        assert_eq!(Request::FromJobName.env_value(), "");
    }

    #[test]
    fn a_value_is_validated() {
        let r = parse_option(Some(b"bert")).unwrap();
        assert_eq!(r.env_value(), "bert");
        assert!(parse_option(Some(b"(nul)")).is_err());
    }

    #[test]
    fn message_says_what_is_allowed() {
        let msg = validate(b"a b").unwrap_err().to_string();
        assert_eq!(msg, format!("byte 1 is \" \"; {RULE}"));
        let msg = validate(&[b'a'; 200]).unwrap_err().to_string();
        assert!(msg.starts_with("it is 200 bytes long; "), "{msg}");
    }

    #[test]
    fn quote_escapes_and_truncates() {
        assert_eq!(quote(b"a\nb\x01"), r#""a\nb\x01""#);
        let q = quote(&[b'z'; 100]);
        assert_eq!(q, format!("\"{}\"... (100 bytes)", "z".repeat(40)));
    }
}
