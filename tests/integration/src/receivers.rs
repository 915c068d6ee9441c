//! Where alerts land in tests: a webhook receiver on loopback (HTTP/1.1, each POST kept with
//! its headers; it can be stopped and started again on its port, as a receiver that goes
//! down), and a real SMTP server (Python's `aiosmtpd`, from the test tools) writing each
//! mail into a maildir.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::process::KillOnDrop;

/// One request a receiver took.
#[derive(Clone, Debug)]
pub struct Received {
    pub path: String,
    /// Header names in lowercase.
    pub headers: BTreeMap<String, String>,
    pub body: String,
    pub at: Instant,
    /// When it came, by the wall clock (to set beside an event's own time).
    pub wall: std::time::SystemTime,
}

impl Received {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

/// A webhook receiver: answers 200 to each request and keeps it.
pub struct WebhookReceiver {
    pub port: u16,
    received: Arc<Mutex<Vec<Received>>>,
    running: Option<Arc<AtomicBool>>,
}

impl WebhookReceiver {
    /// Listening on a free port.
    pub fn start() -> Result<Self> {
        let mut r = Self {
            port: crate::free_port()?,
            received: Arc::default(),
            running: None,
        };
        r.listen()?;
        Ok(r)
    }

    /// A receiver on a free port that is down: nothing listens until [`Self::listen`].
    pub fn down() -> Result<Self> {
        Ok(Self {
            port: crate::free_port()?,
            received: Arc::default(),
            running: None,
        })
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// Listens on its port (again).
    pub fn listen(&mut self) -> Result<()> {
        if self.running.is_some() {
            return Ok(());
        }
        let listener = TcpListener::bind(("127.0.0.1", self.port))
            .with_context(|| format!("binding 127.0.0.1:{}", self.port))?;
        listener.set_nonblocking(true)?;
        let running = Arc::new(AtomicBool::new(true));
        let (flag, received) = (running.clone(), self.received.clone());
        std::thread::spawn(move || {
            while flag.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let received = received.clone();
                        std::thread::spawn(move || serve(stream, &received));
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(10))
                    }
                    Err(_) => return,
                }
            }
        });
        self.running = Some(running);
        Ok(())
    }

    /// Stops listening: connections are refused until it listens again.
    pub fn stop(&mut self) {
        if let Some(r) = self.running.take() {
            r.store(false, Ordering::SeqCst);
            // The accept loop sees the flag within its sleep.
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn received(&self) -> Vec<Received> {
        self.received.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

impl Drop for WebhookReceiver {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Reads requests off one connection until it closes, answering each 200.
fn serve(stream: TcpStream, received: &Mutex<Vec<Received>>) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let Ok(mut out) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let path = line
            .split_whitespace()
            .nth(1)
            .unwrap_or_default()
            .to_string();
        let mut headers = BTreeMap::new();
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
            }
        }
        let len: usize = headers
            .get("content-length")
            .and_then(|l| l.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0; len];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        if let Ok(mut r) = received.lock() {
            r.push(Received {
                path,
                headers,
                body: String::from_utf8_lossy(&body).into_owned(),
                at: Instant::now(),
                wall: std::time::SystemTime::now(),
            });
        }
        if out
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
            .is_err()
        {
            return;
        }
    }
}

/// A real SMTP server on loopback (`python -m aiosmtpd`), each mail a file of its maildir.
pub struct SmtpServer {
    pub port: u16,
    maildir: PathBuf,
    _process: KillOnDrop,
}

impl SmtpServer {
    pub fn start(dir: &Path) -> Result<Self> {
        let port = crate::free_port()?;
        let maildir = dir.join("maildir");
        let log = std::fs::File::create(dir.join("smtp.log"))?;
        let child = std::process::Command::new(crate::prom::python())
            .args(["-m", "aiosmtpd", "-n", "-l"])
            .arg(format!("127.0.0.1:{port}"))
            .args(["-c", "aiosmtpd.handlers.Mailbox"])
            .arg(&maildir)
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting aiosmtpd (pip install aiosmtpd, from the test tools)")?;
        let process = KillOnDrop(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                bail!(
                    "aiosmtpd did not listen on {port}: {}",
                    std::fs::read_to_string(dir.join("smtp.log")).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(Self {
            port,
            maildir,
            _process: process,
        })
    }

    /// Every mail received, as its text.
    pub fn mails(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(self.maildir.join("new")) else {
            return vec![];
        };
        entries
            .filter_map(|e| e.ok())
            .filter_map(|e| std::fs::read_to_string(e.path()).ok())
            .collect()
    }
}
