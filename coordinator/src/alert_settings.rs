//! What alerts may be sent to, and how hard they are tried: the webhook hosts an admin
//! allows, the mail server (its URL, password file and sender, checked as the coordinator
//! starts), the backoff between tries and when a delivery is given up; and the check of a
//! target, made when it is subscribed and at every try.

use std::time::Duration;

use headroom_shared::api::alerts::AlertTarget;
use lettre::message::Mailbox;
use lettre::transport::smtp::authentication::Credentials;
use lettre::{AsyncSmtpTransport, Tokio1Executor};

/// The longest a mail's server may take to answer one command.
const SMTP_TIMEOUT: Duration = Duration::from_secs(30);
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

    pub(crate) fn transport(&self) -> Result<AsyncSmtpTransport<Tokio1Executor>, AlertConfigError> {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use headroom_shared::api::alerts::WebhookFormat;

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
    fn tries_back_off_doubling_to_an_hour() {
        let c = AlertConfig {
            retry_first: Duration::from_secs(10),
            tries: 3,
            ..AlertConfig::default()
        };
        assert_eq!(c.backoff(1), Duration::from_secs(10));
        assert_eq!(c.backoff(2), Duration::from_secs(20));
        assert_eq!(c.backoff(30), MAX_BACKOFF);
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
