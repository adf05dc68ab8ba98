//! A private MariaDB server for tests that need settings the shared server does not have (a
//! small `max_allowed_packet`) or that stop the server (feature `testkit`).
//!
//! [`Server::start`] runs `mariadb-install-db` and `mariadbd` from the installed binaries in a
//! temporary directory, listening on 127.0.0.1 on a free port (no unix socket outside the
//! directory, no networking beyond loopback), with `root` and no password and a database
//! `test`, and the settings given. Dropping the [`Server`] kills it and removes the
//! directory, also when the test panics.
//!
//! ```no_run
//! # fn main() -> std::io::Result<()> {
//! let db = walsink_mysql::testkit::Server::start(&[("max_allowed_packet", "1M")])?;
//! let url = db.url(); // mysql://root@127.0.0.1:PORT/test
//! # Ok(()) }
//! ```

use std::io;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running private server; killed and removed on drop.
#[derive(Debug)]
pub struct Server {
    dir: tempfile::TempDir,
    child: Child,
    port: u16,
}

fn free_port() -> io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn failed(what: &str, out: &std::process::Output) -> io::Error {
    io::Error::other(format!(
        "{what} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    ))
}

impl Server {
    /// Creates and starts a server with `settings` (`name`, `value` pairs passed to
    /// `mariadbd` as `--name=value`, for example `("max_allowed_packet", "1M")`, or
    /// `("ssl-cert", PATH)`, `("ssl-key", PATH)`, `("ssl-ca", PATH)` for TLS).
    ///
    /// # Errors
    ///
    /// The binaries are missing, or the server did not start within 60 s (with its log).
    pub fn start(settings: &[(&str, &str)]) -> io::Result<Server> {
        let dir = tempfile::Builder::new()
            .prefix("walsink-mariadb-")
            .tempdir()?;
        let data = dir.path().join("data");
        // Each server's own temporary directory: two bootstraps sharing /tmp collide on the
        // names of their temporary tables (`Unknown table 'mysql.tmp_user_sys'`).
        let tmp = dir.path().join("tmp");
        std::fs::create_dir(&tmp)?;
        let out = Command::new("mariadb-install-db")
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .arg(format!("--tmpdir={}", tmp.display()))
            .arg("--user=root")
            .arg("--auth-root-authentication-method=normal")
            .arg("--skip-test-db")
            .output()?;
        if !out.status.success() {
            return Err(failed("mariadb-install-db", &out));
        }
        let port = free_port()?;
        let log = std::fs::File::create(dir.path().join("server.log"))?;
        let mut cmd = Command::new("mariadbd");
        cmd.arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .arg(format!("--socket={}", dir.path().join("sock").display()))
            .arg(format!("--pid-file={}", dir.path().join("pid").display()))
            .arg(format!("--tmpdir={}", tmp.display()))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--port={port}"))
            .arg("--user=root")
            .arg("--skip-log-bin")
            .arg("--innodb-buffer-pool-size=64M")
            .arg("--innodb-log-file-size=16M");
        for (k, v) in settings {
            cmd.arg(format!("--{k}={v}"));
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        let mut server = Server { dir, child, port };
        server.wait_ready(Duration::from_secs(60))?;
        let out = server.sql("CREATE DATABASE IF NOT EXISTS test")?;
        if !out.status.success() {
            return Err(failed("CREATE DATABASE test", &out));
        }
        Ok(server)
    }

    /// Runs `sql` as `root` with the `mariadb` client (plain text, over TCP).
    ///
    /// # Errors
    ///
    /// The client cannot run, or the statement failed (with the client's output).
    pub fn execute(&self, sql: &str) -> io::Result<()> {
        let out = self.sql(sql)?;
        if !out.status.success() {
            return Err(failed("mariadb -e", &out));
        }
        Ok(())
    }

    fn sql(&self, sql: &str) -> io::Result<std::process::Output> {
        Command::new("mariadb")
            .arg("--no-defaults")
            .arg("-h127.0.0.1")
            .arg(format!("-P{}", self.port))
            .arg("-uroot")
            .arg("-e")
            .arg(sql)
            .output()
    }

    fn wait_ready(&mut self, limit: Duration) -> io::Result<()> {
        let start = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait()? {
                return Err(io::Error::other(format!(
                    "mariadbd exited with {st}: {}",
                    self.log()
                )));
            }
            if self.sql("SELECT 1").is_ok_and(|o| o.status.success()) {
                return Ok(());
            }
            if start.elapsed() > limit {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("mariadbd did not answer within {limit:?}: {}", self.log()),
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `mysql://root@127.0.0.1:PORT/test`.
    pub fn url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}/test", self.port)
    }

    /// The temporary directory holding the data directory and the log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
