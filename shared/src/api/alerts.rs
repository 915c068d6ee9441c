//! Alerts: what a user or the lab is told of, and where (`headroom alerts`,
//! `/v1/alerts`): subscriptions, the events they match, and each delivery's fate.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What happened, as subscriptions name it (`--on experiment-ended,gpu-quarantined`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "kebab-case")]
pub enum AlertKind {
    /// Every job of an experiment ended; with its counts.
    ExperimentEnded,
    /// Jobs of one experiment failed several times in a row (`FAILURE_STREAK`).
    FailuresInARow,
    /// A GPU was quarantined: something of an ended attempt stayed on it.
    GpuQuarantined,
    /// A GPU's use and the estimates placed on it stayed apart past the coordinator's
    /// `--alert-drift-after`.
    GpuDrift,
    /// A node's agent went silent past its lease TTL.
    NodeLost,
    /// A job waited in the queue longer than the coordinator's `--alert-pending-after`.
    JobPending,
    /// Early stopping stopped a job's attempt.
    JobPruned,
    /// A preemptible job was stopped and requeued for another user's.
    JobPreempted,
}

impl AlertKind {
    pub const ALL: [AlertKind; 8] = [
        AlertKind::ExperimentEnded,
        AlertKind::FailuresInARow,
        AlertKind::GpuQuarantined,
        AlertKind::GpuDrift,
        AlertKind::NodeLost,
        AlertKind::JobPending,
        AlertKind::JobPruned,
        AlertKind::JobPreempted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AlertKind::ExperimentEnded => "experiment-ended",
            AlertKind::FailuresInARow => "failures-in-a-row",
            AlertKind::GpuQuarantined => "gpu-quarantined",
            AlertKind::GpuDrift => "gpu-drift",
            AlertKind::NodeLost => "node-lost",
            AlertKind::JobPending => "job-pending",
            AlertKind::JobPruned => "job-pruned",
            AlertKind::JobPreempted => "job-preempted",
        }
    }

    /// About the lab's machines rather than one user's jobs: every subscriber who asks for
    /// it hears of it.
    pub fn is_lab_wide(self) -> bool {
        matches!(
            self,
            AlertKind::GpuQuarantined | AlertKind::GpuDrift | AlertKind::NodeLost
        )
    }
}

impl fmt::Display for AlertKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for AlertKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        AlertKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = AlertKind::ALL.iter().map(|k| k.as_str()).collect();
                format!("`{s}` is not an alert (one of: {})", names.join(", "))
            })
    }
}

/// The body a webhook is sent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum WebhookFormat {
    /// headroom's JSON ([`AlertPayload`]).
    #[default]
    Json,
    /// `{"text": ...}`, as Slack's (and Mattermost's) incoming webhooks take.
    Slack,
}

/// Where a subscription's alerts go.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum AlertTarget {
    /// An HTTP(S) URL, POSTed to. Views show its scheme and host only: a webhook's URL is
    /// often its secret.
    Webhook {
        url: String,
        #[serde(default)]
        format: WebhookFormat,
    },
    /// A mailbox, mailed through the coordinator's SMTP server.
    Email { to: String },
}

impl AlertTarget {
    /// What views show: a webhook's scheme and host, never its path or query.
    pub fn redacted(&self) -> AlertTarget {
        match self {
            AlertTarget::Webhook { url, format } => AlertTarget::Webhook {
                url: redact_url(url),
                format: *format,
            },
            AlertTarget::Email { to } => AlertTarget::Email { to: to.clone() },
        }
    }
}

impl fmt::Display for AlertTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AlertTarget::Webhook { url, format } => match format {
                WebhookFormat::Json => write!(f, "webhook {url}"),
                WebhookFormat::Slack => write!(f, "webhook {url} (slack)"),
            },
            AlertTarget::Email { to } => write!(f, "mail to {to}"),
        }
    }
}

/// `scheme://host[:port]/…`: what may be shown of a URL whose path may be a secret.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "<redacted>".to_string();
    };
    let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
    // Userinfo (`user:password@`) is a secret too.
    let host = host.rsplit('@').next().unwrap_or_default();
    if rest.len() > host.len() {
        format!("{scheme}://{host}/…")
    } else {
        format!("{scheme}://{host}")
    }
}

/// `POST /v1/alerts`: a subscription.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NewSubscription {
    /// What to be told of (at least one).
    pub on: Vec<AlertKind>,
    pub target: AlertTarget,
    /// Every user's events, not only the subscriber's own (admins only).
    #[serde(default)]
    pub lab_wide: bool,
}

/// A subscription as kept (its webhook's URL redacted).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SubscriptionView {
    pub id: String,
    /// Who made it: their jobs' events reach it.
    pub owner: String,
    pub on: Vec<AlertKind>,
    pub target: AlertTarget,
    pub lab_wide: bool,
    pub created_at: DateTime<Utc>,
}

impl SubscriptionView {
    /// Whether an event of `kind` about `subject`'s jobs (`None`: the lab's machines) is
    /// sent here: one it asks for, about its owner's jobs, or any where it is lab-wide or
    /// the event is about the machines everyone shares.
    pub fn wants(&self, kind: AlertKind, subject: Option<&str>) -> bool {
        self.on.contains(&kind)
            && (self.lab_wide || kind.is_lab_wide() || subject == Some(self.owner.as_str()))
    }
}

/// Where one delivery of an event stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum DeliveryState {
    /// Not yet taken by its receiver: tried again with backoff.
    Pending,
    Delivered,
    /// Given up after the coordinator's `--alert-tries`: a dead letter.
    Dead,
}

impl DeliveryState {
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryState::Pending => "pending",
            DeliveryState::Delivered => "delivered",
            DeliveryState::Dead => "dead",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [
            DeliveryState::Pending,
            DeliveryState::Delivered,
            DeliveryState::Dead,
        ]
        .into_iter()
        .find(|d| d.as_str() == s)
    }
}

/// One event sent to one subscription.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DeliveryView {
    /// The idempotency key the receiver is given with every try.
    pub id: String,
    pub subscription: String,
    pub kind: AlertKind,
    pub summary: String,
    pub state: DeliveryState,
    pub tries: u32,
    /// Why the last try failed.
    #[serde(default)]
    pub last_error: Option<String>,
    pub event_at: DateTime<Utc>,
    #[serde(default)]
    pub delivered_at: Option<DateTime<Utc>>,
    /// When it is tried next (pending only).
    #[serde(default)]
    pub next_try_at: Option<DateTime<Utc>>,
}

/// `GET /v1/alerts`: the caller's subscriptions (every one, for an admin) and their recent
/// deliveries, dead letters first.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AlertsView {
    pub subscriptions: Vec<SubscriptionView>,
    pub deliveries: Vec<DeliveryView>,
}

/// What a webhook is POSTed (JSON format) and what a mail says, beside its summary. It names
/// ids, nodes, GPUs and counts: never a token, a command line or an environment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AlertPayload {
    /// The idempotency key: the same on every try of this delivery (also the
    /// `Idempotency-Key` header, and the mail's `Message-ID`).
    pub id: String,
    /// The event's number: the same for every subscription told of it.
    pub event: i64,
    pub kind: AlertKind,
    pub at: DateTime<Utc>,
    /// One line a person reads.
    pub summary: String,
    /// The event's facts, by kind.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub details: Value,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_webhook_url_is_shown_by_its_scheme_and_host_only() {
        assert_eq!(
            redact_url("https://hooks.slack.com/services/T0/B0/secret"),
            "https://hooks.slack.com/…"
        );
        assert_eq!(
            redact_url("http://user:pw@127.0.0.1:9000/x?k=v"),
            "http://127.0.0.1:9000/…"
        );
        assert_eq!(redact_url("http://example.org"), "http://example.org");
        assert_eq!(redact_url("no scheme/secret"), "<redacted>");
    }

    #[test]
    fn a_subscription_hears_of_its_owner_s_jobs_and_of_the_lab_s_machines() {
        let sub = |owner: &str, lab_wide| SubscriptionView {
            id: "s".into(),
            owner: owner.into(),
            on: vec![AlertKind::ExperimentEnded, AlertKind::GpuQuarantined],
            target: AlertTarget::Email { to: "a@b".into() },
            lab_wide,
            created_at: DateTime::<Utc>::default(),
        };
        let ada = sub("ada", false);
        assert!(ada.wants(AlertKind::ExperimentEnded, Some("ada")));
        assert!(!ada.wants(AlertKind::ExperimentEnded, Some("bob")));
        assert!(ada.wants(AlertKind::GpuQuarantined, None));
        assert!(!ada.wants(AlertKind::NodeLost, None), "not asked for");
        assert!(sub("root", true).wants(AlertKind::ExperimentEnded, Some("bob")));
    }

    #[test]
    fn kinds_read_as_their_names_and_say_the_known_ones() {
        for k in AlertKind::ALL {
            assert_eq!(k.as_str().parse::<AlertKind>(), Ok(k));
            assert_eq!(
                serde_json::to_value(k).expect("a kind serializes"),
                Value::String(k.as_str().to_string())
            );
        }
        let e = "gpu-lost".parse::<AlertKind>().expect_err("no such kind");
        assert!(e.contains("gpu-quarantined"), "{e}");
    }
}
