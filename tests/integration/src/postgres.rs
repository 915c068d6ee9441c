//! A throwaway PostgreSQL 15 cluster of a test's own.

use std::process::Command;

use anyhow::{Context, Result, bail};

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
                 -c fsync={} -c max_connections=200 {}\" -l {d}/log -w -m fast {what} >/dev/null",
                self.port,
                if self.fsync { "on" } else { "off" },
                // Every statement's time, for the benches (the durable clusters are theirs)
                // that say where the database's went.
                if self.fsync {
                    "-c shared_preload_libraries=pg_stat_statements"
                } else {
                    ""
                }
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

    /// The statements that took most of the database's time since the last
    /// [`Postgres::reset_statements`], `n` of them: calls, total and mean ms, the WAL each
    /// call wrote (bytes) and the statement (a durable cluster's; `pg_stat_statements`), and a
    /// last line of every statement's together.
    pub fn top_statements(&self, n: usize) -> Result<String> {
        self.psql(&format!(
            "(SELECT calls, round(total_exec_time) AS total_ms, \
             round(mean_exec_time::numeric, 3) AS mean_ms, \
             round(wal_bytes / greatest(calls, 1)) AS wal_bytes_each, \
             left(regexp_replace(query, '\\s+', ' ', 'g'), 200) AS statement \
             FROM pg_stat_statements ORDER BY total_exec_time DESC LIMIT {n}) \
             UNION ALL SELECT sum(calls), round(sum(total_exec_time)), \
             round((sum(total_exec_time) / greatest(sum(calls), 1))::numeric, 3), \
             round(sum(wal_bytes) / greatest(sum(calls), 1)), \
             '(all statements)' FROM pg_stat_statements"
        ))
    }

    /// Starts counting [`Postgres::top_statements`] afresh.
    pub fn reset_statements(&self) -> Result<()> {
        self.psql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")?;
        self.psql("SELECT pg_stat_statements_reset()").map(drop)
    }

    fn psql(&self, sql: &str) -> Result<String> {
        let out = Command::new(format!("{PG_BIN}/psql"))
            .args([&self.url(), "-X", "-q", "-A", "-F", " | ", "-c", sql])
            .output()
            .with_context(|| format!("running {PG_BIN}/psql"))?;
        if !out.status.success() {
            bail!("psql: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The server's main process (its `postmaster.pid`), whose children are its backends.
    pub fn postmaster_pid(&self) -> Option<u32> {
        let pid = std::fs::read_to_string(self.dir.path().join("data/postmaster.pid")).ok()?;
        pid.lines().next()?.trim().parse().ok()
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
