//! The accounting side of a test cluster: a private MariaDB (its own datadir, socket and
//! port under the cluster directory; Debian's service is left alone) and slurmdbd on it, so
//! fair-share, QOS and association limits are enforced as at a site. Pure rendering of
//! `slurmdbd.conf` is unit-tested; starting the daemons needs root and MariaDB.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// MariaDB's programs, as Debian 12's `mariadb-server` installs them.
pub const MARIADB_INSTALL_DB: &str = "/usr/bin/mariadb-install-db";
/// The server.
pub const MARIADBD: &str = "/usr/sbin/mariadbd";
/// The client the harness creates slurmdbd's database user with.
pub const MARIADB: &str = "/usr/bin/mariadb";

/// The database user slurmdbd connects as, and its password (a throwaway database).
pub const STORAGE_USER: &str = "slurm";
/// Its password.
pub const STORAGE_PASS: &str = "kace-e2e";

/// Where the accounting daemons listen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccountingPorts {
    /// MariaDB's TCP port (127.0.0.1 only).
    pub mariadb: u16,
    /// slurmdbd's port.
    pub slurmdbd: u16,
}

/// The paths of the private MariaDB under the cluster directory `dir`.
#[derive(Debug, Clone)]
pub struct MariaDbPaths {
    /// Its datadir.
    pub datadir: PathBuf,
    /// Its Unix socket (the harness's own client uses it as root).
    pub socket: PathBuf,
    /// Its error log.
    pub log: PathBuf,
    /// Its pid file.
    pub pid: PathBuf,
}

impl MariaDbPaths {
    /// Below `dir`.
    pub fn under(dir: &Path) -> MariaDbPaths {
        MariaDbPaths {
            datadir: dir.join("db"),
            socket: dir.join("run/mariadb.sock"),
            log: dir.join("log/mariadb.log"),
            pid: dir.join("run/mariadb.pid"),
        }
    }

    /// `mariadbd`'s arguments: no option files (the system's my.cnf is not ours), TCP on
    /// 127.0.0.1 only, and the settings slurmdbd's documentation asks for
    /// (`innodb_lock_wait_timeout`, a buffer pool above the default; Slurm's
    /// accounting.shtml, "MySQL Configuration").
    pub fn server_args(&self, port: u16) -> Vec<String> {
        vec![
            "--no-defaults".into(),
            format!("--datadir={}", self.datadir.display()),
            format!("--socket={}", self.socket.display()),
            format!("--pid-file={}", self.pid.display()),
            format!("--log-error={}", self.log.display()),
            format!("--port={port}"),
            "--bind-address=127.0.0.1".into(),
            "--user=root".into(),
            "--skip-log-bin".into(),
            "--innodb-buffer-pool-size=128M".into(),
            "--innodb-lock-wait-timeout=900".into(),
        ]
    }
}

/// The SQL that gives slurmdbd its database user (over TCP from 127.0.0.1, which MariaDB may
/// see as `localhost` or as `127.0.0.1`).
pub fn storage_user_sql() -> String {
    let mut s = String::new();
    for host in ["127.0.0.1", "localhost"] {
        let _ = write!(
            s,
            "CREATE USER IF NOT EXISTS '{STORAGE_USER}'@'{host}' IDENTIFIED BY '{STORAGE_PASS}'; \
             GRANT ALL ON *.* TO '{STORAGE_USER}'@'{host}'; "
        );
    }
    s.push_str("FLUSH PRIVILEGES;");
    s
}

/// The text of `slurmdbd.conf` (slurmdbd reads it from slurm.conf's directory, and only when
/// its mode is 0600).
pub fn slurmdbd_conf(dir: &Path, ports: &AccountingPorts, plugin_dir: Option<&Path>) -> String {
    let d = dir.display();
    let mut s = format!(
        "# kace e2e test cluster's slurmdbd (generated)\n\
         AuthType=auth/none\n\
         DbdHost=localhost\n\
         DbdPort={dbd}\n\
         SlurmUser=root\n\
         DebugLevel=verbose\n\
         LogFile={d}/log/slurmdbd.log\n\
         PidFile={d}/run/slurmdbd.pid\n\
         StorageType=accounting_storage/mysql\n\
         StorageHost=127.0.0.1\n\
         StoragePort={db}\n\
         StorageUser={STORAGE_USER}\n\
         StoragePass={STORAGE_PASS}\n\
         StorageLoc=kace_e2e_acct\n",
        dbd = ports.slurmdbd,
        db = ports.mariadb,
    );
    if let Some(p) = plugin_dir {
        let _ = writeln!(s, "PluginDir={}", p.display());
    }
    s
}

/// The slurm.conf lines that send accounting to that slurmdbd and enforce associations,
/// limits and QOS (what a site with fair-share runs).
pub fn slurm_conf_lines(ports: &AccountingPorts) -> Vec<String> {
    vec![
        "AccountingStorageType=accounting_storage/slurmdbd".into(),
        "AccountingStorageHost=localhost".into(),
        format!("AccountingStoragePort={}", ports.slurmdbd),
        "AccountingStorageEnforce=associations,limits,qos".into(),
        "AccountingStorageTRES=gres/gpu,gres/shard".into(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurmdbd_conf_points_at_the_private_database() {
        let ports = AccountingPorts { mariadb: 7100, slurmdbd: 7101 };
        let conf = slurmdbd_conf(Path::new("/tmp/c"), &ports, Some(Path::new("/opt/s/lib/slurm")));
        assert!(conf.contains("DbdPort=7101\n"));
        assert!(conf.contains("StorageHost=127.0.0.1\nStoragePort=7100\n"));
        assert!(conf.contains("LogFile=/tmp/c/log/slurmdbd.log\n"));
        assert!(conf.contains("PluginDir=/opt/s/lib/slurm\n"));
        assert!(!slurmdbd_conf(Path::new("/tmp/c"), &ports, None).contains("PluginDir"));
        let lines = slurm_conf_lines(&ports);
        assert!(lines.contains(&"AccountingStoragePort=7101".to_string()));
        assert!(lines.iter().any(|l| l.starts_with("AccountingStorageEnforce=")));
    }

    #[test]
    fn the_server_reads_no_option_file_and_listens_on_loopback_only() {
        let args = MariaDbPaths::under(Path::new("/tmp/c")).server_args(7100);
        assert_eq!(args[0], "--no-defaults");
        assert!(args.contains(&"--bind-address=127.0.0.1".to_string()));
        assert!(args.contains(&"--socket=/tmp/c/run/mariadb.sock".to_string()));
        assert!(storage_user_sql().contains("'slurm'@'127.0.0.1'"));
    }
}
