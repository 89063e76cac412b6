//! How results are printed: the `--format` choice, small table helpers shared by subcommands,
//! untrusted text made safe for a terminal, and a closed stdout (`kace … | head`) ending the
//! command quietly with exit 0 instead of a panic.

use std::borrow::Cow;

use clap::ValueEnum;

/// Output format of a subcommand's result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum Format {
    /// Aligned text for people.
    #[default]
    Table,
    /// One JSON document for programs.
    Json,
}

/// Text that came from users (job comments, workload names, decision reasons, file names) made
/// safe to print to a terminal: control characters (a newline included, so that a value cannot
/// forge a line) and bidirectional overrides are shown escaped, as `\u{1b}`.
pub fn printable(s: &str) -> Cow<'_, str> {
    let unsafe_char =
        |c: char| c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
    if !s.chars().any(unsafe_char) {
        return Cow::Borrowed(s);
    }
    Cow::Owned(
        s.chars()
            .flat_map(|c| {
                let escaped: Vec<char> =
                    if unsafe_char(c) { c.escape_unicode().collect() } else { vec![c] };
                escaped
            })
            .collect(),
    )
}

/// Makes a closed stdout end the command quietly with exit status 0: `kace observations list |
/// head` must not panic (Rust ignores SIGPIPE, so `print!` fails with EPIPE and panics). The
/// panic hook checks that stdout's reader is really gone before exiting, so every other panic
/// still reports as before.
pub fn exit_quietly_when_stdout_closes() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if stdout_reader_gone() {
            std::process::exit(0);
        }
        default(info);
    }));
}

/// Whether stdout is a pipe or socket whose reading end has closed (poll reports POLLERR or
/// POLLHUP on the writing end then).
fn stdout_reader_gone() -> bool {
    let mut fd = libc::pollfd { fd: libc::STDOUT_FILENO, events: libc::POLLOUT, revents: 0 };
    // SAFETY: one valid pollfd, zero timeout.
    let n = unsafe { libc::poll(&mut fd, 1, 0) };
    n == 1 && fd.revents & (libc::POLLERR | libc::POLLHUP) != 0
}

/// Renders rows as left-aligned columns separated by two spaces, with a header. Cells are made
/// [`printable`].
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let rows: Vec<Vec<String>> =
        rows.iter().map(|r| r.iter().map(|c| printable(c).into_owned()).collect()).collect();
    let rows = &rows;
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let mut l = String::new();
        for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
            if i > 0 {
                l.push_str("  ");
            }
            l.push_str(c);
            l.extend(std::iter::repeat_n(' ', w - c.chars().count()));
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(header.to_vec());
    for r in rows {
        line(r.iter().map(String::as_str).collect());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align() {
        let t = table(&["a", "bb"], &[vec!["xyz".into(), "1".into()]]);
        assert_eq!(t, "a    bb\nxyz  1\n");
    }

    #[test]
    fn control_characters_and_bidi_overrides_are_escaped() {
        assert_eq!(printable("plain-name_1.0"), "plain-name_1.0");
        assert_eq!(printable("x\u{1b}]0;owned\u{7}\ny"), "x\\u{1b}]0;owned\\u{7}\\u{a}y");
        assert_eq!(printable("a\u{202e}b"), "a\\u{202e}b");
        let t = table(&["job"], &[vec!["\u{1b}[2J".into()]]);
        assert!(!t.contains('\u{1b}'), "{t:?}");
    }
}
