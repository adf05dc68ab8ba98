//! A private `redis-server` for tests that need settings the shared server does not have: a
//! password, TLS, a client certificate, or connections a test may kill at will (feature
//! `testkit`).
//!
//! [`Server::start`] runs the installed `redis-server` (`WALSINK_REDIS_SERVER` overrides the
//! binary) in a temporary directory, without persistence, listening on 127.0.0.1 and ::1 on
//! a free plain port and, with [`ServerTls`], on a free TLS port too. The plain port is for
//! the test's own checks and administration (`CONFIG SET tls-cert-file …`, `CLIENT KILL`);
//! the sink under test connects to the TLS port. Dropping the [`Server`] kills the server
//! and removes the directory, also when the test panics.
//!
//! ```no_run
//! # fn main() -> std::io::Result<()> {
//! use walsink_redis::testkit::{Server, ServerTls};
//! # let (cert, key, ca) = (std::path::PathBuf::new(), std::path::PathBuf::new(), std::path::PathBuf::new());
//! let tls = ServerTls { cert, key, ca, auth_clients: false };
//! let server = Server::start(Some(&tls), &["--requirepass", "s3cret"])?;
//! let url = server.tls_url("localhost"); // rediss://localhost:PORT/0
//! # Ok(()) }
//! ```

use std::io::{self, Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The TLS settings of a private server.
#[derive(Debug, Clone)]
pub struct ServerTls {
    /// The server's certificate (PEM).
    pub cert: PathBuf,
    /// The server certificate's key (PEM).
    pub key: PathBuf,
    /// The CA whose client certificates the server accepts (PEM).
    pub ca: PathBuf,
    /// Whether the server requires a client certificate (`--tls-auth-clients yes`).
    pub auth_clients: bool,
}

/// A running private `redis-server`; killed and removed on drop.
#[derive(Debug)]
pub struct Server {
    dir: tempfile::TempDir,
    child: Child,
    port: u16,
    tls_port: Option<u16>,
    password: Option<String>,
}

fn free_port() -> io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl Server {
    /// Starts a server, with a TLS port when `tls` is given, passing `args` on (for example
    /// `["--requirepass", "PASSWORD"]`; a `--requirepass` is used by [`Server::command`]).
    /// Waits until it answers `PING` on its plain port.
    pub fn start(tls: Option<&ServerTls>, args: &[&str]) -> io::Result<Server> {
        let dir = tempfile::Builder::new()
            .prefix("walsink-redis-")
            .tempdir()?;
        let bin = std::env::var("WALSINK_REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
        let port = free_port()?;
        let log = dir.path().join("redis.log");
        let mut cmd = Command::new(&bin);
        cmd.arg("--port")
            .arg(port.to_string())
            .args(["--bind", "127.0.0.1", "-::1"])
            .arg("--dir")
            .arg(dir.path())
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--logfile")
            .arg(&log);
        let mut tls_port = None;
        if let Some(t) = tls {
            let p = free_port()?;
            tls_port = Some(p);
            cmd.arg("--tls-port")
                .arg(p.to_string())
                .arg("--tls-cert-file")
                .arg(&t.cert)
                .arg("--tls-key-file")
                .arg(&t.key)
                .arg("--tls-ca-cert-file")
                .arg(&t.ca)
                .arg("--tls-auth-clients")
                .arg(if t.auth_clients { "yes" } else { "no" });
        }
        cmd.args(args);
        let password = args
            .iter()
            .position(|a| *a == "--requirepass")
            .and_then(|i| args.get(i + 1))
            .map(|p| p.to_string());
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| io::Error::new(e.kind(), format!("cannot run {bin}: {e}")))?;
        let mut s = Server {
            dir,
            child,
            port,
            tls_port,
            password,
        };
        let t = Instant::now();
        loop {
            if let Some(st) = s.child.try_wait()? {
                let log = std::fs::read_to_string(&log).unwrap_or_default();
                return Err(io::Error::other(format!(
                    "{bin} ended ({st}) before answering; its log:\n{log}"
                )));
            }
            if s.command(&["PING"]).is_ok_and(|r| r == "+PONG") {
                return Ok(s);
            }
            if t.elapsed() > Duration::from_secs(20) {
                return Err(io::Error::other(format!(
                    "{bin} did not answer on port {port} within 20 s"
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The plain port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The TLS port, if the server has one.
    pub fn tls_port(&self) -> Option<u16> {
        self.tls_port
    }

    /// `redis://127.0.0.1:PORT/0` (the plain port, no password).
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// `rediss://HOST:TLS_PORT/0`; panics when the server has no TLS port.
    pub fn tls_url(&self, host: &str) -> String {
        let p = self.tls_port.expect("the server was started without TLS");
        format!("rediss://{host}:{p}/0")
    }

    /// The server's directory (its log is `redis.log` there).
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Sends one command on the plain port (after `AUTH` when the server was started with
    /// `--requirepass`) and returns its first reply line (`+OK`, `:3`, `-ERR …`), for
    /// administration such as `CONFIG SET tls-cert-file PATH`.
    pub fn command(&self, args: &[&str]) -> io::Result<String> {
        let mut c = std::net::TcpStream::connect(("127.0.0.1", self.port))?;
        c.set_read_timeout(Some(Duration::from_secs(10)))?;
        let encode = |args: &[&str]| {
            let mut out = format!("*{}\r\n", args.len()).into_bytes();
            for a in args {
                out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
                out.extend_from_slice(a.as_bytes());
                out.extend_from_slice(b"\r\n");
            }
            out
        };
        let mut reply = |args: &[&str]| -> io::Result<String> {
            c.write_all(&encode(args))?;
            let mut line = Vec::new();
            let mut b = [0u8; 1];
            while !line.ends_with(b"\r\n") {
                if c.read(&mut b)? == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the server closed the connection",
                    ));
                }
                line.push(b[0]);
            }
            line.truncate(line.len() - 2);
            Ok(String::from_utf8_lossy(&line).into_owned())
        };
        if let Some(p) = &self.password {
            let r = reply(&["AUTH", p])?;
            if r != "+OK" {
                return Err(io::Error::other(format!("AUTH: {r}")));
            }
        }
        reply(args)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
