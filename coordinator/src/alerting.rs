//! Alerts delivered: the outbox's due deliveries, each claimed by one replica at a time, sent
//! to a webhook (headroom's JSON or a Slack-compatible body, an `Idempotency-Key` header) or
//! by mail (SMTP through `lettre`, the key as `Message-ID`), and tried again with backoff
//! until delivered or, after `tries`, kept as a dead letter that `headroom alerts` shows.
//! Beside it, the sweep that takes the events no single transaction can tell.

use std::time::Duration;

use headroom_shared::api::alerts::{AlertPayload, AlertTarget, WebhookFormat};
use lettre::message::{Mailbox, header::ContentType};
use lettre::transport::smtp::authentication::Credentials;
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};
use tokio_util::sync::CancellationToken;

use crate::api::AppState;
use crate::store::{AlertSweep, DeliveryOutcome, DeliveryRow, now_ms};

/// How long a claimed delivery is another replica's to leave alone: longer than one try can
/// take (a webhook's request, a mail's whole conversation, each bounded below).
const HOLD_MS: i64 = 120_000;
const WEBHOOK_TIMEOUT: Duration = Duration::from_secs(15);
const SMTP_TIMEOUT: Duration = Duration::from_secs(30);
/// Deliveries claimed at once: one, each just before it is tried, so that none waits out its
/// hold behind others.
const BATCH: u32 = 1;
/// The longest wait between two tries.
const MAX_BACKOFF: Duration = Duration::from_secs(3600);

/// What alerts may send to, and how hard they try.
#[derive(Clone, Debug)]
pub struct AlertConfig {
    /// Hosts (`host` or `host:port`) webhooks may be sent to; none: no webhook.
    pub webhook_hosts: Vec<String>,
    pub smtp: Option<SmtpConfig>,
    /// The wait after a delivery's first failed try; it doubles with each (to an hour).
    pub retry_first: Duration,
    /// Tries before a delivery is a dead letter.
    pub tries: u32,
    /// A job queued this long raises `job-pending` (`None`: never).
    pub pending_after: Option<Duration>,
    /// A GPU quarantined this long raises `gpu-quarantined` again (`None`: never).
    pub quarantine_after: Option<Duration>,
    /// A GPU's drift that lasts this long raises `gpu-drift` (`None`: drift not looked at).
    pub drift_after: Option<Duration>,
    /// Failed jobs of one experiment in a row that raise `failures-in-a-row`.
    pub failure_streak: u32,
    /// How long settled deliveries (and dead letters) are kept.
    pub keep: Duration,
    /// How often due deliveries are looked for.
    pub poll: Duration,
    /// How often each GPU's drift is looked at.
    pub drift_every: Duration,
}

impl Default for AlertConfig {
    fn default() -> Self {
        Self {
            webhook_hosts: Vec::new(),
            smtp: None,
            retry_first: Duration::from_secs(10),
            tries: 10,
            pending_after: Some(Duration::from_secs(3600)),
            quarantine_after: Some(Duration::from_secs(3600)),
            drift_after: Some(Duration::from_secs(600)),
            failure_streak: 3,
            keep: Duration::from_secs(30 * 24 * 3600),
            poll: Duration::from_secs(1),
            drift_every: Duration::from_secs(10),
        }
    }
}

/// The mail server alerts go through.
#[derive(Clone)]
pub struct SmtpConfig {
    /// `smtp://host:587?tls=required` (STARTTLS), `smtps://host:465` (TLS) or `smtp://host:25`
    /// (plain, loopback relays only); a user name may come in it, its password never.
    pub url: String,
    /// From a file (`--smtp-password-file`).
    pub password: Option<String>,
    pub from: String,
}

impl std::fmt::Debug for SmtpConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmtpConfig")
            .field("url", &self.url)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("from", &self.from)
            .finish()
    }
}

/// Why the alert settings cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum AlertConfigError {
    #[error("--smtp-url: {0}")]
    SmtpUrl(String),
    #[error("--alert-from: `{from}` is not a mail address: {why}")]
    From { from: String, why: String },
}

impl SmtpConfig {
    /// Checks the URL and the sender as the coordinator starts, not at the first alert.
    pub fn check(&self) -> Result<(), AlertConfigError> {
        let url = reqwest::Url::parse(&self.url)
            .map_err(|e| AlertConfigError::SmtpUrl(format!("`{}`: {e}", self.url)))?;
        if !matches!(url.scheme(), "smtp" | "smtps") {
            return Err(AlertConfigError::SmtpUrl(format!(
                "`{}` is not smtp:// or smtps://",
                url.scheme()
            )));
        }
        if url.password().is_some() {
            return Err(AlertConfigError::SmtpUrl(
                "holds a password: give it in a file (--smtp-password-file) instead".to_string(),
            ));
        }
        // A password goes in the clear over plain SMTP (or STARTTLS that may be skipped):
        // only to a relay on this machine.
        let tls_required = url.scheme() == "smtps"
            || url
                .query_pairs()
                .any(|(k, v)| k == "tls" && v == "required");
        let host = url.host_str().unwrap_or_default();
        let loopback = host == "localhost"
            || host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback());
        if self.password.is_some() && !tls_required && !loopback {
            return Err(AlertConfigError::SmtpUrl(format!(
                "`{}` would send the password in the clear: use smtps://, or \
                 ?tls=required for STARTTLS",
                self.url
            )));
        }
        self.from
            .parse::<Mailbox>()
            .map_err(|e| AlertConfigError::From {
                from: self.from.clone(),
                why: e.to_string(),
            })?;
        self.transport().map(drop)
    }

    fn transport(&self) -> Result<AsyncSmtpTransport<Tokio1Executor>, AlertConfigError> {
        let mut builder = AsyncSmtpTransport::<Tokio1Executor>::from_url(&self.url)
            .map_err(|e| AlertConfigError::SmtpUrl(e.to_string()))?
            .timeout(Some(SMTP_TIMEOUT));
        let user = reqwest::Url::parse(&self.url)
            .map(|u| u.username().to_string())
            .unwrap_or_default();
        if let Some(password) = &self.password {
            builder = builder.credentials(Credentials::new(user, password.clone()));
        }
        Ok(builder.build())
    }
}

impl AlertConfig {
    /// Whether alerts may be sent to `target` from here: (the field, why not).
    pub fn check_target(&self, target: &AlertTarget) -> Result<(), (&'static str, String)> {
        match target {
            AlertTarget::Webhook { url, .. } => {
                let field = "target.webhook.url";
                let parsed =
                    reqwest::Url::parse(url).map_err(|e| (field, format!("not a URL: {e}")))?;
                if !matches!(parsed.scheme(), "http" | "https") {
                    return Err((field, "must be an http:// or https:// URL".to_string()));
                }
                let host = parsed.host_str().unwrap_or_default();
                let port = parsed.port_or_known_default().unwrap_or_default();
                let allowed = self.webhook_hosts.iter().any(|h| {
                    h.eq_ignore_ascii_case(host)
                        || h.eq_ignore_ascii_case(&format!("{host}:{port}"))
                });
                if allowed {
                    Ok(())
                } else {
                    Err((
                        field,
                        format!(
                            "{host}:{port} is not a host this coordinator sends alerts to (an \
                             admin lists them with --alert-webhook-hosts)"
                        ),
                    ))
                }
            }
            AlertTarget::Email { to } => {
                let field = "target.email.to";
                if self.smtp.is_none() {
                    return Err((
                        field,
                        "this coordinator sends no mail (an admin gives it --smtp-url)".to_string(),
                    ));
                }
                to.parse::<Mailbox>()
                    .map(drop)
                    .map_err(|e| (field, format!("`{to}` is not a mail address: {e}")))
            }
        }
    }

    /// The wait after `tries` failed tries: `retry_first`, doubling, at most an hour.
    pub fn backoff(&self, tries: u32) -> Duration {
        let doublings = tries.saturating_sub(1).min(20);
        self.retry_first
            .saturating_mul(1u32 << doublings)
            .min(MAX_BACKOFF)
    }

    /// What a failed try leads to.
    fn after_failure(&self, tries: u32, error: String) -> DeliveryOutcome {
        if tries >= self.tries {
            DeliveryOutcome::Dead {
                error: format!("given up after {tries} tries: {error}"),
            }
        } else {
            let wait = i64::try_from(self.backoff(tries).as_millis()).unwrap_or(i64::MAX);
            DeliveryOutcome::Retry {
                error,
                at: now_ms().saturating_add(wait),
            }
        }
    }
}

/// Sends due deliveries and runs the sweep until `shutdown`.
pub async fn run(state: AppState, shutdown: CancellationToken) {
    let config = state.config.alerts.clone();
    // No redirect is followed: only an allowed host is ever sent to. Without a client,
    // webhooks' tries fail (and are tried again) while mail and the sweep go on.
    let http = match headroom_shared::client::http_builder()
        .connect_timeout(Duration::from_secs(5))
        .timeout(WEBHOOK_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .build()
    {
        Ok(c) => Some(c),
        Err(e) => {
            tracing::error!("no HTTP client for alerts' webhooks: {e}");
            None
        }
    };
    let mailer = match config.smtp.as_ref().map(SmtpConfig::transport).transpose() {
        Ok(m) => m,
        Err(e) => {
            tracing::error!("alerts send no mail: {e}");
            None
        }
    };
    let mut sweep = AlertSweep {
        lost_after_ms: u64::try_from(state.config.lease_ttl.as_millis()).unwrap_or(u64::MAX),
        pending_after_ms: config
            .pending_after
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        quarantine_after_ms: config
            .quarantine_after
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        drift_after_ms: config
            .drift_after
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        check_drift: false,
        failure_streak: config.failure_streak,
        keep_ms: u64::try_from(config.keep.as_millis()).unwrap_or(u64::MAX),
    };
    let mut tick = tokio::time::interval(config.poll);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_drift: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        // Drift reads every node: every `drift_every`, not every tick.
        sweep.check_drift = last_drift.is_none_or(|t| t.elapsed() >= config.drift_every);
        if sweep.check_drift {
            last_drift = Some(tokio::time::Instant::now());
        }
        if let Err(e) = state.store.alert_sweep(sweep).await {
            tracing::warn!("alerts sweep: {e}");
        }
        loop {
            let due = match state.store.claim_deliveries(HOLD_MS, BATCH).await {
                Ok(d) => d,
                Err(e) => {
                    tracing::warn!("alerts outbox: {e}");
                    break;
                }
            };
            if due.is_empty() {
                break;
            }
            for (id, tries) in due {
                let outcome = tokio::select! {
                    // Left claimed: another replica (or this one, restarted) takes it once
                    // its hold runs out.
                    _ = shutdown.cancelled() => return,
                    o = deliver(&state, &config, http.as_ref(), mailer.as_ref(), &id, tries) => o,
                };
                match &outcome {
                    DeliveryOutcome::Delivered => {
                        tracing::info!(delivery = %id, tries, "alert delivered")
                    }
                    DeliveryOutcome::Retry { error, .. } => {
                        tracing::warn!(delivery = %id, tries, "alert not delivered, trying again: {error}")
                    }
                    DeliveryOutcome::Dead { error } => {
                        tracing::warn!(delivery = %id, tries, "alert given up: {error}")
                    }
                }
                state.metrics.alert_delivery(&outcome);
                match state
                    .store
                    .settle_delivery(id.clone(), tries, outcome)
                    .await
                {
                    Ok(true) => {}
                    Ok(false) => tracing::warn!(
                        delivery = %id,
                        tries,
                        "this try outlasted its claim: another claim has the delivery"
                    ),
                    Err(e) => tracing::warn!(delivery = %id, "cannot record the delivery: {e}"),
                }
            }
        }
    }
}

async fn deliver(
    state: &AppState,
    config: &AlertConfig,
    http: Option<&reqwest::Client>,
    mailer: Option<&AsyncSmtpTransport<Tokio1Executor>>,
    id: &str,
    tries: u32,
) -> DeliveryOutcome {
    let row = match state.store.delivery(id.to_string()).await {
        Ok(r) => r,
        Err(crate::store::StoreError::NotFound { .. }) => {
            return DeliveryOutcome::Dead {
                error: "its subscription was removed".to_string(),
            };
        }
        Err(e) => return config.after_failure(tries, format!("cannot read it: {e}")),
    };
    // What was allowed when it was subscribed may not be now (the admin's list changed, or
    // this replica's differs): checked at every try.
    if let Err((field, why)) = config.check_target(&row.target) {
        return DeliveryOutcome::Dead {
            error: format!("{field}: {why}"),
        };
    }
    let sent = match (&row.target, http) {
        (AlertTarget::Webhook { url, format }, Some(http)) => post(http, url, *format, &row).await,
        (AlertTarget::Webhook { .. }, None) => {
            Err("this coordinator has no HTTP client for webhooks (see its log)".to_string())
        }
        (AlertTarget::Email { to }, _) => match mailer {
            Some(m) => mail(m, config, to, &row).await,
            None => Err("this coordinator sends no mail (no --smtp-url)".to_string()),
        },
    };
    match sent {
        Ok(()) => DeliveryOutcome::Delivered,
        Err(e) => config.after_failure(tries, e),
    }
}

/// What the receiver is told: the event's facts and the delivery's key.
pub fn payload(row: &DeliveryRow) -> AlertPayload {
    AlertPayload {
        id: row.id.clone(),
        event: row.event,
        kind: row.kind,
        at: crate::store::rows::ts(row.at),
        summary: row.summary.clone(),
        details: row.details.clone(),
    }
}

async fn post(
    http: &reqwest::Client,
    url: &str,
    format: WebhookFormat,
    row: &DeliveryRow,
) -> Result<(), String> {
    let body = match format {
        WebhookFormat::Json => serde_json::to_value(payload(row)).map_err(|e| e.to_string())?,
        WebhookFormat::Slack => serde_json::json!({"text": format!("headroom: {}", row.summary)}),
    };
    let shown = headroom_shared::api::alerts::redact_url(url);
    let answer = http
        .post(url)
        .header("Idempotency-Key", &row.id)
        .header(
            reqwest::header::USER_AGENT,
            concat!("headroom/", env!("CARGO_PKG_VERSION")),
        )
        .json(&body)
        .send()
        .await
        // reqwest's error names the URL: the redacted one is said instead.
        .map_err(|e| format!("cannot reach {shown}: {}", e.without_url()))?;
    let status = answer.status();
    if status.is_success() {
        Ok(())
    } else {
        Err(format!("{shown} answered {status}"))
    }
}

async fn mail(
    mailer: &AsyncSmtpTransport<Tokio1Executor>,
    config: &AlertConfig,
    to: &str,
    row: &DeliveryRow,
) -> Result<(), String> {
    let Some(smtp) = &config.smtp else {
        return Err("this coordinator sends no mail (no --smtp-url)".to_string());
    };
    let from: Mailbox = smtp
        .from
        .parse()
        .map_err(|e| format!("--alert-from: {e}"))?;
    let to: Mailbox = to.parse().map_err(|e| format!("`{to}`: {e}"))?;
    let mut subject: String = row.summary.chars().take(150).collect();
    if subject.len() < row.summary.len() {
        subject.push('…');
    }
    let details = serde_json::to_string_pretty(&row.details).unwrap_or_default();
    let body = format!(
        "{}\n\nWhat happened ({}, {}):\n{details}\n\nDelivery {} (the same on every try).\n",
        row.summary,
        row.kind,
        crate::store::rows::ts(row.at).to_rfc3339(),
        row.id
    );
    let message = Message::builder()
        .from(from)
        .to(to)
        .subject(format!("[headroom] {subject}"))
        .message_id(Some(format!("<{}@headroom>", row.id)))
        .header(ContentType::TEXT_PLAIN)
        .body(body)
        .map_err(|e| format!("cannot write the mail: {e}"))?;
    mailer
        .send(message)
        .await
        .map(drop)
        .map_err(|e| format!("SMTP: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(hosts: &[&str]) -> AlertConfig {
        AlertConfig {
            webhook_hosts: hosts.iter().map(|h| h.to_string()).collect(),
            ..AlertConfig::default()
        }
    }

    fn hook(url: &str) -> AlertTarget {
        AlertTarget::Webhook {
            url: url.to_string(),
            format: WebhookFormat::Json,
        }
    }

    #[test]
    fn webhooks_go_only_to_hosts_an_admin_listed() {
        let c = config(&["hooks.slack.com", "127.0.0.1:9000"]);
        assert!(
            c.check_target(&hook("https://hooks.slack.com/services/x"))
                .is_ok()
        );
        assert!(c.check_target(&hook("http://127.0.0.1:9000/hook")).is_ok());
        let (field, why) = c
            .check_target(&hook("http://127.0.0.1:9001/hook"))
            .expect_err("another port");
        assert_eq!(field, "target.webhook.url");
        assert!(why.contains("--alert-webhook-hosts"), "{why}");
        assert!(c.check_target(&hook("file:///etc/passwd")).is_err());
        assert!(
            config(&[])
                .check_target(&hook("https://hooks.slack.com/x"))
                .is_err()
        );
    }

    #[test]
    fn mail_needs_a_server_and_an_address() {
        let to = |a: &str| AlertTarget::Email { to: a.to_string() };
        let (field, why) = config(&[])
            .check_target(&to("ada@lab.org"))
            .expect_err("no SMTP");
        assert_eq!(field, "target.email.to");
        assert!(why.contains("--smtp-url"), "{why}");
        let with = AlertConfig {
            smtp: Some(SmtpConfig {
                url: "smtp://127.0.0.1:2525".into(),
                password: None,
                from: "headroom@lab.org".into(),
            }),
            ..config(&[])
        };
        assert!(with.check_target(&to("ada@lab.org")).is_ok());
        assert!(with.check_target(&to("not an address")).is_err());
    }

    #[test]
    fn tries_back_off_doubling_then_die() {
        let c = AlertConfig {
            retry_first: Duration::from_secs(10),
            tries: 3,
            ..AlertConfig::default()
        };
        assert_eq!(c.backoff(1), Duration::from_secs(10));
        assert_eq!(c.backoff(2), Duration::from_secs(20));
        assert_eq!(c.backoff(30), MAX_BACKOFF);
        assert!(matches!(
            c.after_failure(2, "x".into()),
            DeliveryOutcome::Retry { .. }
        ));
        assert!(matches!(
            c.after_failure(3, "x".into()),
            DeliveryOutcome::Dead { .. }
        ));
    }

    #[test]
    fn an_smtp_password_comes_from_a_file_not_the_url() {
        let smtp = |url: &str| SmtpConfig {
            url: url.to_string(),
            password: Some("pw".into()),
            from: "headroom@lab.org".into(),
        };
        assert!(smtp("smtp://relay@127.0.0.1:2525").check().is_ok());
        assert!(
            smtp("smtp://relay@mail.lab.org:587?tls=required")
                .check()
                .is_ok()
        );
        assert!(smtp("smtps://relay@mail.lab.org:465").check().is_ok());
        let clear = smtp("smtp://relay@mail.lab.org:587")
            .check()
            .expect_err("in the clear");
        assert!(clear.to_string().contains("tls=required"), "{clear}");
        let e = smtp("smtp://relay:secret@127.0.0.1:2525")
            .check()
            .expect_err("a password");
        assert!(e.to_string().contains("--smtp-password-file"), "{e}");
        assert!(!format!("{:?}", smtp("smtp://h")).contains("pw\""));
        assert!(smtp("http://127.0.0.1").check().is_err());
    }
}
