//! What the `kace` CLI tests share: a scratch directory holding a kace.conf that points the
//! database, spool and quarantine into it (and, when asked, Slurm's commands at nothing), and
//! running the built `kace` with that configuration.

use std::fs;
use std::process::{Command, Output};

use kace_test_support::TempDir;

/// A scratch kace installation: its directory holds `kace.conf`, the database and the spool.
pub struct Env {
    pub dir: TempDir,
}

impl Env {
    /// A fresh directory named after `tag`, whose kace.conf keeps the database (`kace.db`), the
    /// spool (`spool/`, created) and the quarantine (`q/`) inside it. With `no_slurm`, Slurm's
    /// commands and the dispatch lock point into it too, so nothing reaches a real cluster.
    pub fn new(tag: &str, no_slurm: bool) -> Env {
        let dir = TempDir::new(tag);
        let d = dir.display();
        let mut conf = format!(
            "[database]\npath = \"{d}/kace.db\"\n[spool]\ndir = \"{d}/spool\"\n\
             quarantine = \"{d}/q\"\n"
        );
        if no_slurm {
            conf.push_str(&format!(
                "[node]\nscontrol = \"{d}/none\"\nsqueue = \"{d}/none\"\nsinfo = \"{d}/none\"\n\
                 [dispatch]\nlock = \"{d}/dispatch.lock\"\n"
            ));
        }
        fs::write(dir.join("kace.conf"), conf).unwrap();
        fs::create_dir_all(dir.join("spool")).unwrap();
        Env { dir }
    }

    /// Runs `kace args` with this configuration.
    pub fn run(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_kace"))
            .env("KACE_CONFIG", self.dir.join("kace.conf"))
            .args(args)
            .output()
            .unwrap()
    }

    /// Runs `kace args`, requiring success; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}
