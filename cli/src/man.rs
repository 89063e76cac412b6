//! `kace generate-man DIR` (hidden): writes the man pages, `kace.1` and one page per subcommand
//! (`kace-retrain.1`, `kace-profile-import.1`, …), from the same clap definitions that parse the
//! command line, so the pages cannot drift from `--help`. Packaging runs it; nothing else does,
//! which keeps page generation out of the normal build. `kace.1` also gets the sections clap
//! has no place for: files, exit status, see also.

use std::fs;
use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, CommandFactory};

/// `kace generate-man`
#[derive(Debug, Args)]
pub struct GenerateManArgs {
    /// Directory to write the pages into (created if missing).
    #[arg(value_name = "DIR")]
    out: PathBuf,
}

/// Sections of `kace.1` after the subcommands. Keep in step with `main.rs` (exit codes) and
/// `kace-config` (paths).
const TOP_EXTRA: &str = r#".SH FILES
.TP
\fI/etc/slurm/kace.conf\fR
Site configuration (TOML). \fB--config\fR or \fB$KACE_CONFIG\fR name another file; without
one, the built-in defaults apply.
.TP
\fI/var/lib/kace/kace.db\fR
The database (\fBdatabase.path\fR): profiles, observations, model versions, decisions.
.TP
\fI/var/spool/kace/observations\fR, \fI/var/spool/kace/quarantine\fR
The epilog's observation spool and the files \fBkace ingest\fR could not read.
.SH EXIT STATUS
0 success; 1 failure; 2 bad usage; 3 the database is missing, damaged or of the wrong schema
version; 4 \fBkace db check\fR found problems.
.SH SEE ALSO
\fBkace-retrain\fR(1), \fBkace-profile\fR(1), \fBkace-db\fR(1),
\fI/usr/share/doc/kace/admin-guide.md\fR
"#;

/// `kace.1`: clap_mangen's sections in its order, with [`TOP_EXTRA`] before the version.
fn top_page() -> Result<Vec<u8>> {
    let mut cmd = crate::Cli::command().disable_help_subcommand(true);
    cmd.build();
    let man = clap_mangen::Man::new(cmd);
    let mut page = Vec::new();
    man.render_title(&mut page)?;
    man.render_name_section(&mut page)?;
    man.render_synopsis_section(&mut page)?;
    man.render_description_section(&mut page)?;
    man.render_options_section(&mut page)?;
    man.render_subcommands_section(&mut page)?;
    page.write_all(TOP_EXTRA.as_bytes())?;
    man.render_version_section(&mut page)?;
    Ok(page)
}

/// Writes every page and lists them on stdout, one path a line.
pub fn run(args: GenerateManArgs) -> Result<()> {
    fs::create_dir_all(&args.out)
        .with_context(|| format!("couldn't create {}", args.out.display()))?;
    // clap_mangen skips hidden subcommands, so this command documents everything but itself.
    clap_mangen::generate_to(crate::Cli::command(), &args.out)
        .with_context(|| format!("couldn't write man pages to {}", args.out.display()))?;
    let top = args.out.join("kace.1");
    fs::write(&top, top_page()?).with_context(|| format!("couldn't write {}", top.display()))?;
    let mut pages: Vec<PathBuf> = fs::read_dir(&args.out)
        .with_context(|| format!("couldn't list {}", args.out.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "1"))
        .collect();
    pages.sort();
    for p in pages {
        println!("{}", p.display());
    }
    Ok(())
}
