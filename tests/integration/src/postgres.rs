//! A throwaway PostgreSQL 15 cluster of a test's own.

use std::process::Command;

use anyhow::{Result, bail};

use crate::free_port;

/// A throwaway PostgreSQL 15 cluster of the test's own (the server refuses to run as root,
/// so it runs as `postgres`), stopped and removed when dropped.
pub struct Postgres {
    dir: tempfile::TempDir,
    pub port: u16,
    /// Tests need no durability; benches compare durable stores.
    fsync: bool,
}

const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

impl Postgres {
    pub fn start() -> Result<Self> {
        Self::start_with(false)
    }

    /// A cluster that flushes every commit to disk (PostgreSQL's default), for benches.
    pub fn start_durable() -> Result<Self> {
        Self::start_with(true)
    }

    fn start_with(fsync: bool) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("hr-pg")
            .tempdir_in("/tmp")?;
        let port = free_port()?;
        let d = dir.path().display().to_string();
        run_as_postgres(&format!("chown postgres {d}"), false)?;
        run_as_postgres(
            &format!("{PG_BIN}/initdb -D {d}/data -U postgres --auth=trust -E UTF8 >/dev/null"),
            true,
        )?;
        let pg = Self { dir, port, fsync };
        pg.ctl("start")?;
        Ok(pg)
    }

    fn ctl(&self, what: &str) -> Result<()> {
        let d = self.dir.path().display();
        run_as_postgres(
            &format!(
                "{PG_BIN}/pg_ctl -D {d}/data -o \"-p {} -k {d} -c listen_addresses=127.0.0.1 \
                 -c fsync={} -c max_connections=200\" -l {d}/log -w -m fast {what} >/dev/null",
                self.port,
                if self.fsync { "on" } else { "off" }
            ),
            true,
        )
    }

    /// `pg_ctl restart`: every connection drops, the server comes back on the same port.
    pub fn restart(&self) -> Result<()> {
        self.ctl("restart")
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = self.ctl("stop");
    }
}

fn run_as_postgres(cmd: &str, as_postgres: bool) -> Result<()> {
    let status = if as_postgres {
        Command::new("su").args(["postgres", "-c", cmd]).status()?
    } else {
        Command::new("sh").args(["-c", cmd]).status()?
    };
    if !status.success() {
        bail!("`{cmd}` failed ({status})");
    }
    Ok(())
}
