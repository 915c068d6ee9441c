//! Alerts delivered: the outbox's due deliveries, each claimed by one replica at a time, sent
//! to a webhook (headroom's JSON or a Slack-compatible body, an `Idempotency-Key` header) or
//! by mail (SMTP through `lettre`, the key as `Message-ID`), and tried again with backoff
//! until delivered or, after `tries`, kept as a dead letter that `headroom alerts` shows.
//! Beside it, the sweep that takes the events no single transaction can tell.

use std::time::Duration;

use headroom_shared::api::alerts::{AlertPayload, AlertTarget, WebhookFormat};
use lettre::message::{Mailbox, header::ContentType};
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};
use tokio_util::sync::CancellationToken;

use crate::alert_settings::{AlertConfig, SmtpConfig};
use crate::api::AppState;
use crate::store::{AlertSweep, DeliveryOutcome, DeliveryRow, now_ms};

/// How long a claimed delivery is another replica's to leave alone: longer than one try can
/// take (a webhook's request, a mail's whole conversation, each bounded below).
const HOLD_MS: i64 = 120_000;
const WEBHOOK_TIMEOUT: Duration = Duration::from_secs(15);
/// Deliveries claimed at once: one, each just before it is tried, so that none waits out its
/// hold behind others.
const BATCH: u32 = 1;

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

/// What a failed try leads to: another after the backoff, or, its tries spent, a dead
/// letter.
fn after_failure(config: &AlertConfig, tries: u32, error: String) -> DeliveryOutcome {
    if tries >= config.tries {
        DeliveryOutcome::Dead {
            error: format!("given up after {tries} tries: {error}"),
        }
    } else {
        let wait = i64::try_from(config.backoff(tries).as_millis()).unwrap_or(i64::MAX);
        DeliveryOutcome::Retry {
            error,
            at: now_ms().saturating_add(wait),
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
        Err(e) => return after_failure(config, tries, format!("cannot read it: {e}")),
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
        Err(e) => after_failure(config, tries, e),
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

    #[test]
    fn a_failed_try_is_tried_again_until_its_tries_are_spent() {
        let c = AlertConfig {
            retry_first: Duration::from_secs(10),
            tries: 3,
            ..AlertConfig::default()
        };
        let before = now_ms();
        match after_failure(&c, 2, "refused".into()) {
            DeliveryOutcome::Retry { error, at } => {
                assert_eq!(error, "refused");
                assert!((before + 20_000..before + 21_000).contains(&at), "{at}");
            }
            other => panic!("{other:?}"),
        }
        let dead = after_failure(&c, 3, "refused".into());
        assert_eq!(
            dead,
            DeliveryOutcome::Dead {
                error: "given up after 3 tries: refused".into()
            }
        );
    }
}
