//! Coordinator settings: what people set (`CoordinatorSettings`, the same for
//! `headroom-coordinator` and `headroom up`, from flags, `HEADROOM_*` variables or the config
//! file) and the resolved configuration the application runs with.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use headroom_shared::secret::{self, SecretSource};
use headroom_shared::settings::duration;

use crate::auth::{self, ConfigToken, TokenConfigError};
use headroom_shared::MemSize;
use headroom_shared::spec::DEFAULT_MAX_JOBS;

/// The coordinator's settings, as flags (config-file keys are the same names).
#[derive(clap::Args, Clone, Debug)]
#[command(next_help_heading = "Coordinator")]
pub struct CoordinatorSettings {
    /// Address the REST API listens on.
    #[arg(long, env = "HEADROOM_LISTEN", default_value = "127.0.0.1:7420")]
    pub listen: SocketAddr,
    /// Attempt logs live here, and the embedded store (unless a database URL is given):
    /// `.headroom` in the working directory for `headroom up`; for `headroom-coordinator`,
    /// `/var/lib/headroom` as root, else `.headroom`.
    #[arg(long, env = "HEADROOM_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// An agent silent this long loses its leases.
    #[arg(long, env = "HEADROOM_LEASE_TTL", default_value = "30s", value_parser = duration)]
    pub lease_ttl: Duration,
    /// Most jobs one spec may expand into.
    #[arg(long, env = "HEADROOM_MAX_JOBS", default_value_t = DEFAULT_MAX_JOBS)]
    pub max_jobs: u64,
    /// Most the jobs of one spec may take once expanded (each carries the spec's `env`,
    /// command and ladder beside its own parameters), e.g. `64MiB`.
    #[arg(long, env = "HEADROOM_MAX_SUBMIT_SIZE", default_value = "64MiB")]
    pub max_submit_size: MemSize,
    /// Most of an attempt's output its log keeps here (past it, a line saying so; the node
    /// keeps the whole log), e.g. `64MiB`.
    #[arg(long, env = "HEADROOM_MAX_LOG_SIZE", default_value = "64MiB")]
    pub max_log_size: MemSize,
    /// Largest code bundle (`code: snapshot`, compressed) this coordinator keeps, e.g.
    /// `100MiB`. Bundles live in the database.
    #[arg(long, env = "HEADROOM_MAX_BUNDLE_SIZE", default_value = "100MiB")]
    pub max_bundle_size: MemSize,
    /// Longest a claim, progress or log read is held open waiting for a change.
    #[arg(long, env = "HEADROOM_LONG_POLL", default_value = "25s", value_parser = duration)]
    pub long_poll: Duration,
    /// Most claims that read the store at once on this replica; the others wait their turn
    /// in order (up to 10 s, then 503 `busy`), so heartbeats and reports always find a
    /// database connection (PostgreSQL's pool holds 16). `0`: no bound.
    #[arg(long, env = "HEADROOM_MAX_CLAIMS", default_value_t = crate::admission::DEFAULT_CLAIMS)]
    pub max_claims: usize,
    /// GPU telemetry older than this is deleted.
    #[arg(long, env = "HEADROOM_TELEMETRY_RETENTION", default_value = "24h", value_parser = duration)]
    pub telemetry_retention: Duration,
    /// Most telemetry samples kept per GPU (the oldest go first).
    #[arg(
        long,
        env = "HEADROOM_TELEMETRY_MAX_SAMPLES",
        default_value_t = 100_000
    )]
    pub telemetry_max_samples: u64,
    /// Every user sees every job's `env` values and logs (a lab that shares them); by
    /// default a user sees those of their own jobs only (others' read `<redacted>` and 403).
    #[arg(long, env = "HEADROOM_SHARED_VISIBILITY")]
    pub shared_visibility: bool,
    /// The MLflow tracking servers experiments may send their runs to (`tracking: {mlflow:
    /// URL}`), comma-separated base URLs. None by default: the coordinator sends requests to
    /// no server a user names unless an admin allowed it.
    #[arg(long, env = "HEADROOM_MLFLOW_SERVERS")]
    pub mlflow_servers: Option<String>,
    /// Fair share's half-life: GPU memory-time used this long ago counts half when ordering
    /// users' waiting jobs (`0s`: only what runs now counts).
    #[arg(
        long,
        env = "HEADROOM_FAIR_SHARE_HALF_LIFE",
        default_value = "7d",
        value_parser = duration
    )]
    pub fair_share_half_life: Duration,
    /// A job of a `preemptible` experiment that was preempted is not preempted again for
    /// this long.
    #[arg(
        long,
        env = "HEADROOM_PREEMPT_INTERVAL",
        default_value = "10m",
        value_parser = duration
    )]
    pub preempt_interval: Duration,
    /// Hosts alerts' webhooks may be sent to, comma-separated (`hooks.slack.com`,
    /// `10.0.0.5:8080`). None by default: the coordinator sends requests to no host a user
    /// names unless an admin allowed it.
    #[arg(long, env = "HEADROOM_ALERT_WEBHOOK_HOSTS")]
    pub alert_webhook_hosts: Option<String>,
    /// The mail server alerts are sent through: `smtp://host:587?tls=required` (STARTTLS),
    /// `smtps://host:465` (TLS), `smtp://127.0.0.1:25` (plain, a local relay); a user name
    /// may be given in it (`smtp://alerts@host...`), its password only in a file.
    #[arg(long, env = "HEADROOM_SMTP_URL")]
    pub smtp_url: Option<String>,
    /// A file holding the SMTP password (one line).
    #[arg(long, env = "HEADROOM_SMTP_PASSWORD_FILE")]
    pub smtp_password_file: Option<PathBuf>,
    /// The sender of alerts' mail.
    #[arg(
        long,
        env = "HEADROOM_ALERT_FROM",
        default_value = "headroom@localhost"
    )]
    pub alert_from: String,
    /// The wait after an alert's first failed delivery; it doubles with each (to an hour).
    #[arg(long, env = "HEADROOM_ALERT_RETRY", default_value = "10s", value_parser = duration)]
    pub alert_retry: Duration,
    /// Tries before an alert's delivery is given up and kept as a dead letter.
    #[arg(long, env = "HEADROOM_ALERT_TRIES", default_value_t = 10)]
    pub alert_tries: u32,
    /// A job queued this long raises `job-pending` (`0s`: never).
    #[arg(long, env = "HEADROOM_ALERT_PENDING_AFTER", default_value = "1h", value_parser = duration)]
    pub alert_pending_after: Duration,
    /// A GPU quarantined this long raises `gpu-quarantined` again, once (`0s`: never): the
    /// ghost memory of an orphan nobody looked at.
    #[arg(long, env = "HEADROOM_ALERT_QUARANTINE_AFTER", default_value = "1h", value_parser = duration)]
    pub alert_quarantine_after: Duration,
    /// A GPU whose use and the estimates placed on it stay apart this long raises
    /// `gpu-drift` and counts in `headroom_gpus_drifting` (`0s`: drift is not looked at).
    #[arg(long, env = "HEADROOM_ALERT_DRIFT_AFTER", default_value = "10m", value_parser = duration)]
    pub alert_drift_after: Duration,
    /// Failed jobs of one experiment in a row that raise `failures-in-a-row`.
    #[arg(long, env = "HEADROOM_ALERT_FAILURES_IN_A_ROW", default_value_t = 3)]
    pub alert_failures_in_a_row: u32,
    /// Bootstrap admin token (at least 32 characters). With it, or a tokens file, every
    /// request needs a token; without either the coordinator listens on loopback only.
    #[arg(long, env = "HEADROOM_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<SecretArg>,
    /// A file holding the bootstrap admin token (one line, mode 0600), kept out of `ps` and
    /// of the environment; systemd's `LoadCredential=admin-token` is read when neither is
    /// given.
    #[arg(long, env = "HEADROOM_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// TOML file of `[[tokens]]` with `name`, `role` (admin, user, agent) and `token_hash`
    /// (from `headroom token hash`).
    #[arg(long, env = "HEADROOM_TOKENS_FILE")]
    pub tokens_file: Option<PathBuf>,
    /// A file holding a join token in the clear (at least 32 characters, one line), as the
    /// bootstrap admin token is given: the one that a Helm chart generates for its agents,
    /// which may only exchange it for each new node's own credential.
    #[arg(long, env = "HEADROOM_BOOTSTRAP_JOIN_TOKEN_FILE")]
    pub bootstrap_join_token_file: Option<PathBuf>,
    /// The nodes the bootstrap join token may make, required with it: names and patterns,
    /// comma-separated (`gpu-*,dgx-a`; `*` any run of characters, `?` one).
    #[arg(long, env = "HEADROOM_BOOTSTRAP_JOIN_NODES")]
    pub bootstrap_join_nodes: Option<String>,
    /// When the bootstrap join token stops working (RFC 3339, `2026-12-31T00:00:00Z`), and
    /// with it the credentials it made; never when left out.
    #[arg(long, env = "HEADROOM_BOOTSTRAP_JOIN_EXPIRES_AT")]
    pub bootstrap_join_expires_at: Option<String>,
}

/// A duration setting where `0s` turns its feature off.
fn nonzero(d: Duration) -> Option<Duration> {
    (!d.is_zero()).then_some(d)
}

/// A secret given on the command line or in the environment: never shown by `Debug`.
#[derive(Clone)]
pub struct SecretArg(pub String);

impl std::fmt::Debug for SecretArg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl std::str::FromStr for SecretArg {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Self(s.to_string()))
    }
}

impl CoordinatorSettings {
    /// The configuration to run with; `data_dir` is the settings' directory, resolved.
    pub fn config(&self, data_dir: PathBuf) -> Result<CoordinatorConfig, TokenConfigError> {
        Ok(CoordinatorConfig {
            lease_ttl: self.lease_ttl,
            max_jobs: self.max_jobs,
            max_submit_bytes: self.max_submit_size.mib.saturating_mul(1024 * 1024),
            max_log_bytes: self.max_log_size.mib.saturating_mul(1024 * 1024),
            max_bundle_bytes: self.max_bundle_size.mib.saturating_mul(1024 * 1024),
            long_poll: self.long_poll,
            max_claims: self.max_claims,
            half_life: self.fair_share_half_life,
            preempt_interval: self.preempt_interval,
            telemetry_retention: self.telemetry_retention,
            telemetry_max_samples: self.telemetry_max_samples,
            shared_visibility: self.shared_visibility,
            mlflow_servers: self
                .mlflow_servers
                .as_deref()
                .map(allowed_servers)
                .unwrap_or_default(),
            tokens: self.tokens()?,
            alerts: self.alerts()?,
            ..CoordinatorConfig::new(self.listen, data_dir)
        })
    }

    /// What alerts may send to and how hard they try; the SMTP password read from its file.
    pub fn alerts(&self) -> Result<crate::alert_settings::AlertConfig, TokenConfigError> {
        let smtp = match &self.smtp_url {
            None => None,
            Some(url) => {
                let password = self
                    .smtp_password_file
                    .as_deref()
                    .map(|p| secret::read_file(p, "--smtp-password-file"))
                    .transpose()?;
                let smtp = crate::alert_settings::SmtpConfig {
                    url: url.trim().to_string(),
                    password,
                    from: self.alert_from.trim().to_string(),
                };
                smtp.check()?;
                Some(smtp)
            }
        };
        Ok(crate::alert_settings::AlertConfig {
            webhook_hosts: self
                .alert_webhook_hosts
                .as_deref()
                .map(allowed_servers)
                .unwrap_or_default(),
            smtp,
            retry_first: self.alert_retry.max(Duration::from_millis(10)),
            tries: self.alert_tries.max(1),
            pending_after: nonzero(self.alert_pending_after),
            quarantine_after: nonzero(self.alert_quarantine_after),
            drift_after: nonzero(self.alert_drift_after),
            // Looked at as often as it is told, at most every 10 s.
            drift_every: self
                .alert_drift_after
                .clamp(Duration::from_secs(1), Duration::from_secs(10)),
            failure_streak: self.alert_failures_in_a_row.max(1),
            ..crate::alert_settings::AlertConfig::default()
        })
    }

    /// The bootstrap admin token: from its file, its value or systemd's credential.
    pub fn admin_secret(&self) -> Result<Option<String>, TokenConfigError> {
        let src = SecretSource {
            flag: "--admin-token",
            file_flag: "--admin-token-file",
            credential: "admin-token",
        };
        let value = self.admin_token.as_ref().map(|s| s.0.as_str());
        Ok(secret::resolve(
            src,
            value,
            self.admin_token_file.as_deref(),
        )?)
    }

    /// The configured tokens: the bootstrap admin and join tokens, then the tokens file's.
    pub fn tokens(&self) -> Result<Vec<ConfigToken>, TokenConfigError> {
        let mut tokens = Vec::new();
        if let Some(secret) = self.admin_secret()? {
            tokens.push(auth::admin_token(&secret)?);
        }
        if let Some(path) = &self.bootstrap_join_token_file {
            let secret = secret::read_file(path, "--bootstrap-join-token-file")?;
            let nodes = self
                .bootstrap_join_nodes
                .as_deref()
                .map(crate::joins::parse_list)
                .unwrap_or_default();
            let expires_at = self
                .bootstrap_join_expires_at
                .as_deref()
                .map(|t| {
                    chrono::DateTime::parse_from_rfc3339(t.trim())
                        .map(|d| d.timestamp_millis())
                        .map_err(|e| {
                            TokenConfigError::JoinExpiry(format!(
                                "`{t}` is not an RFC 3339 time like 2026-12-31T00:00:00Z: {e}"
                            ))
                        })
                })
                .transpose()?;
            tokens.push(auth::join_token(&secret, nodes, expires_at)?);
        } else if self.bootstrap_join_nodes.is_some() || self.bootstrap_join_expires_at.is_some() {
            return Err(TokenConfigError::JoinNodes(
                "given without --bootstrap-join-token-file".to_string(),
            ));
        }
        if let Some(path) = &self.tokens_file {
            tokens.extend(auth::read_tokens_file(path)?);
        }
        Ok(tokens)
    }
}

#[derive(Clone, Debug)]
pub struct CoordinatorConfig {
    pub listen: SocketAddr,
    /// Where attempt logs (and the SQLite file, for the embedded store) live.
    pub data_dir: PathBuf,
    /// An agent silent this long loses its leases.
    pub lease_ttl: Duration,
    /// Longest a claim, progress or log read is held open waiting for a change.
    pub long_poll: Duration,
    /// Most claims that read the store at once (`crate::admission`); 0: no bound.
    pub max_claims: usize,
    /// Longest a claim waits for its turn before it is answered busy.
    pub claim_turn_wait: Duration,
    /// Most jobs one spec may expand into.
    pub max_jobs: u64,
    /// Most bytes the jobs of one spec may take once expanded.
    pub max_submit_bytes: u64,
    /// Most bytes of an attempt's output its log keeps here.
    pub max_log_bytes: u64,
    /// Largest code bundle kept.
    pub max_bundle_bytes: u64,
    /// A job waiting longer than this holds GPUs for itself instead of being overtaken.
    pub reserve_after: Duration,
    /// Fair share's half-life.
    pub half_life: Duration,
    /// A preempted job is not preempted again for this long.
    pub preempt_interval: Duration,
    /// How long a stop signal waits for requests in flight before dropping them (under
    /// Kubernetes' default 30 s grace before SIGKILL).
    pub drain_timeout: Duration,
    /// GPU telemetry older than this is deleted.
    pub telemetry_retention: Duration,
    /// Most telemetry samples kept per GPU.
    pub telemetry_max_samples: u64,
    /// How often retention is applied.
    pub telemetry_prune_every: Duration,
    /// Configured tokens; none: every request is the anonymous admin (loopback only).
    pub tokens: Vec<ConfigToken>,
    /// Users see other users' `env` values and logs.
    pub shared_visibility: bool,
    /// What one client may hold of the server (header and body deadlines, connections).
    pub http: crate::serve::Limits,
    /// Where every job runs as one account (a `headroom up` not run as root): the user
    /// that account is. Tokens are then made for this user, agents and joins only: another
    /// user's jobs would run as this account and could read its files, its admin token
    /// among them.
    pub single_user: Option<String>,
    /// MLflow servers runs may be written to (base URLs, no trailing `/`).
    pub mlflow_servers: Vec<String>,
    /// What alerts may send to, and how hard they try.
    pub alerts: crate::alert_settings::AlertConfig,
}

/// The base URLs of a comma-separated list, without trailing `/`.
pub fn allowed_servers(list: &str) -> Vec<String> {
    list.split(',')
        .map(|u| u.trim().trim_end_matches('/').to_string())
        .filter(|u| !u.is_empty())
        .collect()
}

impl CoordinatorConfig {
    /// Whether runs may be written to the tracking server at `url`: one the admin listed.
    pub fn mlflow_allowed(&self, url: &str) -> bool {
        let url = url.trim_end_matches('/');
        self.mlflow_servers.iter().any(|s| s == url)
    }

    pub fn new(listen: SocketAddr, data_dir: PathBuf) -> Self {
        Self {
            listen,
            data_dir,
            lease_ttl: Duration::from_secs(30),
            long_poll: Duration::from_secs(25),
            max_claims: crate::admission::DEFAULT_CLAIMS,
            claim_turn_wait: crate::admission::DEFAULT_WAIT,
            max_jobs: DEFAULT_MAX_JOBS,
            max_submit_bytes: headroom_shared::expand::DEFAULT_MAX_EXPANDED_BYTES,
            max_log_bytes: crate::store::logs::DEFAULT_MAX_LOG_BYTES,
            max_bundle_bytes: 100 * 1024 * 1024,
            reserve_after: Duration::from_secs(600),
            half_life: Duration::from_millis(crate::fair::DEFAULT_HALF_LIFE_MS),
            preempt_interval: Duration::from_secs(600),
            drain_timeout: Duration::from_secs(20),
            telemetry_retention: Duration::from_secs(24 * 3600),
            telemetry_max_samples: 100_000,
            telemetry_prune_every: Duration::from_secs(60),
            tokens: Vec::new(),
            shared_visibility: false,
            http: crate::serve::Limits::default(),
            single_user: None,
            mlflow_servers: Vec::new(),
            alerts: crate::alert_settings::AlertConfig::default(),
        }
    }
}

#[cfg(test)]
mod mlflow_tests {
    use super::*;

    #[test]
    fn only_the_tracking_servers_an_admin_listed_are_written_to() {
        let mut c = CoordinatorConfig::new(
            "127.0.0.1:7420".parse().expect("addr"),
            PathBuf::from("/tmp"),
        );
        assert!(
            !c.mlflow_allowed("http://mlflow.lab:5000"),
            "none by default"
        );
        c.mlflow_servers = allowed_servers(" http://mlflow.lab:5000/ ,https://m.example.org,");
        assert_eq!(
            c.mlflow_servers,
            ["http://mlflow.lab:5000", "https://m.example.org"]
        );
        assert!(c.mlflow_allowed("http://mlflow.lab:5000"));
        assert!(c.mlflow_allowed("http://mlflow.lab:5000/"));
        assert!(!c.mlflow_allowed("http://mlflow.lab:5001"));
        assert!(!c.mlflow_allowed("http://169.254.169.254"));
    }
}
