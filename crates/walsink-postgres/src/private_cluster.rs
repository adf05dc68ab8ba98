//! A private, throwaway PostgreSQL cluster (feature `private-cluster`; also as `testkit`): for
//! the CLI's `demo cdc`, and for tests that need settings a shared server does not have
//! (`max_prepared_transactions > 0`, `wal_level = logical`) or that stop and restart the
//! server.
//!
//! [`Cluster::start`] runs `initdb` and `pg_ctl` from the installed PostgreSQL binaries as the
//! `postgres` OS user (through `runuser` when the test runs as root), in a temporary
//! directory, listening on 127.0.0.1 on a free port, with trust authentication and the
//! settings given. Dropping the [`Cluster`] stops the server (immediate mode) and removes the
//! directory, also when the test panics.
//!
//! ```no_run
//! # fn main() -> std::io::Result<()> {
//! let pg = walsink_postgres::private_cluster::Cluster::start(&[("max_prepared_transactions", "10")])?;
//! let url = pg.url("postgres"); // postgres://postgres@127.0.0.1:PORT/postgres
//! # Ok(()) }
//! ```
//!
//! [`Cluster::start_with`] also serves TLS (`ssl = on` with a given certificate and key, and
//! optionally a CA for client certificates), sets the `postgres` user's password and writes
//! the `pg_hba.conf` lines given ([`Setup`]).

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

/// Where the PostgreSQL binaries are looked for, newest first (`WALSINK_PG_BIN` overrides).
const BIN_DIRS: &[&str] = &[
    "/usr/lib/postgresql/17/bin",
    "/usr/lib/postgresql/16/bin",
    "/usr/lib/postgresql/15/bin",
    "/usr/lib/postgresql/14/bin",
];

/// A running private cluster; stopped and removed on drop.
#[derive(Debug)]
pub struct Cluster {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
    as_postgres: bool,
}

fn bin_dir() -> io::Result<PathBuf> {
    if let Ok(p) = std::env::var("WALSINK_PG_BIN") {
        return Ok(PathBuf::from(p));
    }
    BIN_DIRS
        .iter()
        .map(PathBuf::from)
        .find(|d| d.join("initdb").exists())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("no PostgreSQL binaries (initdb) in {BIN_DIRS:?}; set WALSINK_PG_BIN"),
            )
        })
}

fn free_port() -> io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn is_root() -> bool {
    // The uid of this process, without a libc dependency.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

/// What [`Cluster::start_with`] sets up beyond the settings.
#[derive(Debug, Clone, Default)]
pub struct Setup {
    /// A server certificate and its key (PEM files): the server serves TLS (`ssl = on`) with
    /// copies of them in its data directory (the key owned by the server's user, mode 0600).
    pub tls: Option<(PathBuf, PathBuf)>,
    /// A CA certificate (PEM) the server verifies client certificates against
    /// (`ssl_ca_file`), for `clientcert=verify-full` lines.
    pub client_ca: Option<PathBuf>,
    /// The password of the `postgres` user (set by `initdb --pwfile`).
    pub password: Option<String>,
    /// `pg_hba.conf` lines for TCP connections, replacing the default `host all all
    /// 127.0.0.1/32 trust` (a `local all all trust` line stays first for the tools).
    pub hba: Option<Vec<String>>,
}

impl Cluster {
    /// Creates and starts a cluster with `settings` (`name`, `value` pairs passed to the
    /// server as `-c name=value`, for example `("max_prepared_transactions", "10")` or
    /// `("wal_level", "logical")`).
    pub fn start(settings: &[(&str, &str)]) -> io::Result<Cluster> {
        Cluster::start_with(settings, &Setup::default())
    }

    /// [`Cluster::start`] with TLS, a password or authentication lines ([`Setup`]).
    pub fn start_with(settings: &[(&str, &str)], setup: &Setup) -> io::Result<Cluster> {
        let bin = bin_dir()?;
        let as_postgres = is_root();
        let dir = tempfile::Builder::new()
            .prefix("walsink-pg-")
            .tempdir_in(std::env::temp_dir())?;
        if as_postgres {
            run_checked(Command::new("chown").arg("postgres:").arg(dir.path()))?;
        }
        let mut c = Cluster {
            dir,
            bin,
            port: 0,
            as_postgres,
        };
        let data = c.data_dir();
        let mut initdb = vec![
            "-D".to_string(),
            path_str(&data)?.to_string(),
            "-A".into(),
            "trust".into(),
            "-U".into(),
            "postgres".into(),
            "--no-sync".into(),
            "-E".into(),
            "UTF8".into(),
            "--locale=C".into(),
        ];
        if let Some(pw) = &setup.password {
            let f = c.dir.path().join("pwfile");
            c.private_copy_text(&f, pw)?;
            initdb.push(format!("--pwfile={}", path_str(&f)?));
        }
        let args: Vec<&str> = initdb.iter().map(String::as_str).collect();
        c.run("initdb", &args)?;
        let _ = std::fs::remove_file(c.dir.path().join("pwfile"));
        // Settings go into postgresql.auto.conf so a restart keeps them.
        let mut conf = String::from("listen_addresses = '127.0.0.1'\n");
        conf.push_str(&format!(
            "unix_socket_directories = '{}'\nfsync = on\n",
            c.dir.path().display()
        ));
        if let Some((cert, key)) = &setup.tls {
            c.install_tls(cert, key)?;
            conf.push_str("ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n");
        }
        if let Some(ca) = &setup.client_ca {
            c.private_copy_text(&data.join("client_ca.crt"), &std::fs::read_to_string(ca)?)?;
            conf.push_str("ssl_ca_file = 'client_ca.crt'\n");
        }
        if let Some(lines) = &setup.hba {
            let mut hba = String::from("local all all trust\n");
            for l in lines {
                hba.push_str(l);
                hba.push('\n');
            }
            c.private_copy_text(&data.join("pg_hba.conf"), &hba)?;
        }
        for (k, v) in settings {
            conf.push_str(&format!("{k} = '{}'\n", v.replace('\'', "''")));
        }
        let auto = data.join("postgresql.auto.conf");
        let mut existing = std::fs::read_to_string(&auto).unwrap_or_default();
        existing.push_str(&conf);
        std::fs::write(&auto, existing)?;
        // A port picked free can be taken before the server binds it: try a few.
        let mut last = None;
        for _ in 0..5 {
            c.port = free_port()?;
            match c.pg_ctl_start() {
                Ok(()) => return Ok(c),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("could not start the cluster")))
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Writes `text` to `path`, owned by the server's user and readable by it only.
    fn private_copy_text(&self, path: &Path, text: &str) -> io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::remove_file(path);
        std::fs::write(path, text)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        if self.as_postgres {
            run_checked(Command::new("chown").arg("postgres:").arg(path))?;
        }
        Ok(())
    }

    fn install_tls(&self, cert: &Path, key: &Path) -> io::Result<()> {
        let data = self.data_dir();
        self.private_copy_text(&data.join("server.crt"), &std::fs::read_to_string(cert)?)?;
        self.private_copy_text(&data.join("server.key"), &std::fs::read_to_string(key)?)
    }

    /// Serves TLS with another certificate and key from now on: installs copies of them and
    /// restarts the server (fast), so that the next connection sees the new certificate.
    /// The cluster must have been started with [`Setup::tls`].
    pub fn replace_tls(&self, cert: &Path, key: &Path) -> io::Result<()> {
        self.stop(StopMode::Fast)?;
        self.install_tls(cert, key)?;
        self.start_again()
    }

    fn pg_ctl_start(&self) -> io::Result<()> {
        let data = self.data_dir();
        let log = self.dir.path().join("server.log");
        let opts = format!("-p {}", self.port);
        self.run(
            "pg_ctl",
            &[
                "-D",
                path_str(&data)?,
                "-l",
                path_str(&log)?,
                "-o",
                &opts,
                "-w",
                "-t",
                "60",
                "start",
            ],
        )
        .map(|_| ())
    }

    fn run(&self, tool: &str, args: &[&str]) -> io::Result<Output> {
        let exe = self.bin.join(tool);
        let mut cmd = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&exe);
            c
        } else {
            Command::new(&exe)
        };
        cmd.args(args).current_dir(self.dir.path());
        run_checked(&mut cmd)
    }

    /// The port the server listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A connection URL for `db` as user `postgres` (trust authentication, no password).
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// The cluster's directory (data directory in `data/`, server log in `server.log`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The server log so far, for failure messages.
    pub fn server_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    /// Stops the server: `fast` waits for sessions to be terminated cleanly (they see 57P01),
    /// `immediate` is a crash (no shutdown checkpoint; recovery on the next start).
    pub fn stop(&self, mode: StopMode) -> io::Result<()> {
        let data = self.data_dir();
        let m = match mode {
            StopMode::Fast => "fast",
            StopMode::Immediate => "immediate",
        };
        self.run(
            "pg_ctl",
            &["-D", path_str(&data)?, "-m", m, "-w", "-t", "60", "stop"],
        )
        .map(|_| ())
    }

    /// Starts the server again on the same port after [`Cluster::stop`].
    pub fn start_again(&self) -> io::Result<()> {
        let mut last = None;
        for _ in 0..20 {
            match self.pg_ctl_start() {
                Ok(()) => return Ok(()),
                Err(e) => {
                    last = Some(e);
                    std::thread::sleep(Duration::from_millis(250));
                }
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("could not restart the cluster")))
    }

    /// Stops and starts the server (`mode` as in [`Cluster::stop`]).
    pub fn restart(&self, mode: StopMode) -> io::Result<()> {
        self.stop(mode)?;
        self.start_again()
    }
}

/// How [`Cluster::stop`] stops the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopMode {
    /// Terminate sessions, shutdown checkpoint.
    Fast,
    /// Crash: kill every server process, recover on the next start.
    Immediate,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.port != 0 {
            let _ = self.stop(StopMode::Immediate);
        }
        // The TempDir removes the directory after this.
    }
}

fn path_str(p: &Path) -> io::Result<&str> {
    p.to_str()
        .ok_or_else(|| io::Error::other(format!("path {} is not UTF-8", p.display())))
}

fn run_checked(cmd: &mut Command) -> io::Result<Output> {
    let out = cmd.output()?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(io::Error::other(format!(
            "{:?} failed ({}): {}{}",
            cmd,
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )))
    }
}
