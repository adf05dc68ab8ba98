//! A private `nats-server` with JetStream and TLS, for the TLS tests of this crate and the
//! CLI's (feature `testkit`). It runs from the installed binary (`nats-server`, or the one
//! `WALSINK_NATS_SERVER` names) on a free loopback port, with its store, configuration and
//! log in a directory the test owns, and is killed when dropped. The shared server on
//! port 4222 is never touched.
//!
//! ```no_run
//! use walsink_kit::testkit::{TestCa, Validity};
//! use walsink_nats::testkit::{ServerTls, TlsServer};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let ca = TestCa::new(dir.path(), "ca").unwrap();
//! let cert = ca.server("nats", &["localhost", "127.0.0.1"], Validity::Current).unwrap();
//! let server = TlsServer::start(dir.path(), &ServerTls::new(&cert)).unwrap();
//! let url = format!("tls://127.0.0.1:{}/?stream=S&subject=s&ca_file={}",
//!     server.port(), ca.ca_file().display());
//! ```

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer};
use walsink_kit::testkit::Issued;
use walsink_kit::TlsOptions;

/// The `tls {}` block of the server's configuration.
#[derive(Debug, Clone)]
pub struct ServerTls {
    /// The server's certificate (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
    /// A CA to verify client certificates against; with it the server demands one
    /// (`verify: true`).
    pub client_ca: Option<PathBuf>,
    /// More of the server's configuration, appended as it is (an `authorization {}` block,
    /// say).
    pub extra: String,
    /// The user and password of [`ServerTls::user`], for [`TlsServer::client`].
    pub login: Option<(String, String)>,
}

impl ServerTls {
    /// The server presents `cert` and asks for no client certificate.
    pub fn new(cert: &Issued) -> ServerTls {
        ServerTls {
            cert: cert.cert.clone(),
            key: cert.key.clone(),
            client_ca: None,
            extra: String::new(),
            login: None,
        }
    }

    /// The server also demands a client certificate signed by the CA in `ca_file`.
    pub fn verify_clients(mut self, ca_file: &Path) -> ServerTls {
        self.client_ca = Some(ca_file.to_path_buf());
        self
    }

    /// The server also demands `user` with `password` (an `authorization {}` block).
    pub fn user(mut self, user: &str, password: &str) -> ServerTls {
        self.extra.push_str(&format!(
            "authorization {{\n  user: {user:?}\n  password: {password:?}\n}}\n"
        ));
        self.login = Some((user.to_string(), password.to_string()));
        self
    }
}

/// A running private server; killed (and waited for) on drop.
pub struct TlsServer {
    dir: PathBuf,
    port: u16,
    child: Option<Child>,
    login: Option<(String, String)>,
}

fn free_port() -> io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl TlsServer {
    /// Starts a server with JetStream and `tls` in `dir/nats` on a free port, and waits
    /// until it is ready (at most 20 s).
    pub fn start(dir: &Path, tls: &ServerTls) -> io::Result<TlsServer> {
        let dir = dir.join("nats");
        std::fs::create_dir_all(&dir)?;
        let mut s = TlsServer {
            dir,
            port: free_port()?,
            child: None,
            login: None,
        };
        s.launch(tls)?;
        Ok(s)
    }

    /// The port it listens on (loopback).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops the server and starts it again on the same port and store with `tls` (a
    /// renewed certificate, say); the streams and their messages stay.
    pub fn restart(&mut self, tls: &ServerTls) -> io::Result<()> {
        self.stop();
        self.launch(tls)
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn launch(&mut self, tls: &ServerTls) -> io::Result<()> {
        let q = |p: &Path| format!("{:?}", p.display().to_string());
        let mut block = format!(
            "tls {{\n  cert_file: {}\n  key_file: {}\n  timeout: 5\n",
            q(&tls.cert),
            q(&tls.key)
        );
        if let Some(ca) = &tls.client_ca {
            block.push_str(&format!("  ca_file: {}\n  verify: true\n", q(ca)));
        }
        block.push_str("}\n");
        block.push_str(&tls.extra);
        let conf = self.dir.join("nats.conf");
        std::fs::write(&conf, block)?;
        self.login = tls.login.clone();
        let log = self.dir.join("nats.log");
        let _ = std::fs::remove_file(&log);
        let bin = std::env::var("WALSINK_NATS_SERVER").unwrap_or_else(|_| "nats-server".into());
        let child = Command::new(&bin)
            .arg("-js")
            .arg("-sd")
            .arg(self.dir.join("store"))
            .args(["-a", "127.0.0.1", "-p", &self.port.to_string()])
            .arg("-c")
            .arg(&conf)
            .arg("-l")
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| io::Error::new(e.kind(), format!("cannot start {bin}: {e}")))?;
        self.child = Some(child);
        let t = Instant::now();
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains("Server is ready") {
                return Ok(());
            }
            if let Some(c) = self.child.as_mut() {
                if let Some(st) = c.try_wait()? {
                    self.child = None;
                    return Err(io::Error::other(format!(
                        "nats-server exited with {st}: {text}"
                    )));
                }
            }
            if t.elapsed() > Duration::from_secs(20) {
                self.stop();
                return Err(io::Error::other(format!(
                    "nats-server not ready within 20 s: {text}"
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A client over TLS with `tls` (which must satisfy the server), for the test's own
    /// stream set-up and reading back, logged in as the user of [`ServerTls::user`] if the
    /// server was last started with one.
    pub async fn client(&self, tls: &TlsOptions) -> Result<async_nats::Client, String> {
        let cfg = tls.client_config("nats").map_err(|e| e.to_string())?;
        let mut opts = async_nats::ConnectOptions::new();
        if let Some((u, p)) = &self.login {
            opts = opts.user_and_password(u.clone(), p.clone());
        }
        opts.require_tls(true)
            .tls_client_config(cfg)
            .connect(format!("127.0.0.1:{}", self.port))
            .await
            .map_err(|e| e.to_string())
    }

    /// Creates stream `name` capturing `subject`, through a client with `tls`.
    pub async fn create_stream(
        &self,
        tls: &TlsOptions,
        name: &str,
        subject: &str,
    ) -> Result<(), String> {
        let js = jetstream::new(self.client(tls).await?);
        js.create_stream(jetstream::stream::Config {
            name: name.into(),
            subjects: vec![subject.into()],
            ..Default::default()
        })
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
    }

    /// Every message of stream `name` in order: its `Nats-Msg-Id` and payload.
    pub async fn read_stream(
        &self,
        tls: &TlsOptions,
        name: &str,
    ) -> Result<Vec<(String, Vec<u8>)>, String> {
        use futures_util::StreamExt;
        let js = jetstream::new(self.client(tls).await?);
        let mut stream = js.get_stream(name).await.map_err(|e| e.to_string())?;
        let total = stream
            .info()
            .await
            .map_err(|e| e.to_string())?
            .state
            .messages;
        let mut out = Vec::new();
        if total == 0 {
            return Ok(out);
        }
        let c = stream
            .create_consumer(consumer::pull::OrderedConfig::default())
            .await
            .map_err(|e| e.to_string())?;
        let mut msgs = c.messages().await.map_err(|e| e.to_string())?;
        while (out.len() as u64) < total {
            let m = tokio::time::timeout(Duration::from_secs(30), msgs.next())
                .await
                .map_err(|_| "no message within 30 s".to_string())?
                .ok_or("the consumer ended")?
                .map_err(|e| e.to_string())?;
            let id = m
                .headers
                .as_ref()
                .and_then(|h| h.get("Nats-Msg-Id"))
                .map(|v| v.as_str().to_string())
                .unwrap_or_default();
            out.push((id, m.payload.to_vec()));
        }
        Ok(out)
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        self.stop();
    }
}
