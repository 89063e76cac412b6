//! `kace generate-man DIR` (hidden): writes the man pages, `kace.1` and one page per subcommand
//! (`kace-retrain.1`, `kace-profile-import.1`, …), from the same clap definitions that parse the
//! command line, so the pages cannot drift from `--help`. Packaging runs it; nothing else does,
//! which keeps page generation out of the normal build.

use std::fs;
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

/// Writes every page and lists them on stdout, one path a line.
pub fn run(args: GenerateManArgs) -> Result<()> {
    fs::create_dir_all(&args.out)
        .with_context(|| format!("couldn't create {}", args.out.display()))?;
    // clap_mangen skips hidden subcommands, so this command documents everything but itself.
    clap_mangen::generate_to(crate::Cli::command(), &args.out)
        .with_context(|| format!("couldn't write man pages to {}", args.out.display()))?;
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
