//! `headroom alerts`: subscriptions to alerts (add, list, remove) and what became of their
//! deliveries, dead letters first.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Subcommand;
use headroom_shared::api::alerts::{
    AlertKind, AlertTarget, AlertsView, DeliveryState, NewSubscription, WebhookFormat,
};

use crate::client::Api;
use crate::output::{self, Format};

#[derive(Subcommand, Debug)]
pub enum AlertsCommand {
    /// Subscribe to events of your jobs (every user's with `--lab-wide`, admins) and of the
    /// lab's machines: `headroom alerts add --on experiment-ended,gpu-quarantined
    /// --webhook-file ~/.slack-hook --slack`.
    Add {
        /// Comma-separated: experiment-ended, failures-in-a-row, gpu-quarantined, node-lost,
        /// job-pending, job-pruned, job-preempted.
        #[arg(long, value_delimiter = ',', required = true, value_parser = kind)]
        on: Vec<AlertKind>,
        /// POST each alert to this URL (its host one the coordinator allows). A URL that is
        /// itself a secret (Slack's) is better given with `--webhook-file`: an argument is
        /// seen by every user of the machine.
        #[arg(long, conflicts_with_all = ["webhook_file", "email"])]
        webhook: Option<String>,
        /// A file holding the webhook's URL (one line).
        #[arg(long, conflicts_with = "email")]
        webhook_file: Option<PathBuf>,
        /// Send `{"text": ...}`, as Slack's and Mattermost's incoming webhooks take, instead
        /// of headroom's JSON.
        #[arg(long)]
        slack: bool,
        /// Mail each alert here (through the coordinator's SMTP server).
        #[arg(long)]
        email: Option<String>,
        /// Every user's jobs' events, not only yours (admins).
        #[arg(long)]
        lab_wide: bool,
        #[arg(long, value_enum, default_value_t)]
        output: Format,
    },
    /// List subscriptions and their newest deliveries, dead letters first.
    Ls {
        #[arg(long, value_enum, default_value_t)]
        output: Format,
    },
    /// Remove a subscription (yours, or any for an admin) with its deliveries.
    Rm { id: String },
}

fn kind(s: &str) -> Result<AlertKind, String> {
    s.parse()
}

/// Runs an `alerts` command (`None`: `ls`).
pub async fn run(api: &Api, command: Option<AlertsCommand>) -> Result<()> {
    match command.unwrap_or(AlertsCommand::Ls {
        output: Format::Table,
    }) {
        AlertsCommand::Add {
            on,
            webhook,
            webhook_file,
            slack,
            email,
            lab_wide,
            output: format,
        } => {
            let format_of = if slack {
                WebhookFormat::Slack
            } else {
                WebhookFormat::Json
            };
            let target = match (webhook, webhook_file, email) {
                (Some(url), None, None) => AlertTarget::Webhook {
                    url,
                    format: format_of,
                },
                (None, Some(path), None) => {
                    let url = std::fs::read_to_string(&path)
                        .with_context(|| format!("--webhook-file {}", path.display()))?
                        .trim()
                        .to_string();
                    if url.is_empty() {
                        bail!("--webhook-file {}: the file is empty", path.display());
                    }
                    AlertTarget::Webhook {
                        url,
                        format: format_of,
                    }
                }
                (None, None, Some(to)) if !slack => AlertTarget::Email { to },
                (None, None, Some(_)) => bail!("--slack: a webhook's format, not a mail's"),
                _ => bail!(
                    "say where alerts go: --webhook URL, --webhook-file FILE or --email ADDRESS"
                ),
            };
            let sub = api
                .subscribe(&NewSubscription {
                    on,
                    target,
                    lab_wide,
                })
                .await?;
            match format {
                Format::Json => output::json(&sub)?,
                Format::Table => outln!(
                    "subscription {}: {} to {}{}",
                    sub.id,
                    names(&sub.on),
                    sub.target,
                    if sub.lab_wide { " (lab-wide)" } else { "" }
                ),
            }
        }
        AlertsCommand::Ls { output: format } => {
            let view = api.alerts().await?;
            match format {
                Format::Json => output::json(&view)?,
                Format::Table => table(&view),
            }
        }
        AlertsCommand::Rm { id } => {
            let sub = api.unsubscribe(&id).await?;
            outln!("subscription {} removed ({})", sub.id, sub.target);
        }
    }
    Ok(())
}

fn names(kinds: &[AlertKind]) -> String {
    kinds
        .iter()
        .map(|k| k.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

fn table(view: &AlertsView) {
    if view.subscriptions.is_empty() {
        outln!(
            "no subscriptions: `headroom alerts add --on experiment-ended --webhook URL` makes one"
        );
    } else {
        outln!(
            "{:<36}  {:<12}  {:<40}  TARGET",
            "SUBSCRIPTION",
            "OWNER",
            "ON"
        );
        for s in &view.subscriptions {
            let on = if s.lab_wide {
                format!("{} (lab-wide)", names(&s.on))
            } else {
                names(&s.on)
            };
            outln!("{:<36}  {:<12}  {:<40}  {}", s.id, s.owner, on, s.target);
        }
    }
    if view.deliveries.is_empty() {
        return;
    }
    let dead = view
        .deliveries
        .iter()
        .filter(|d| d.state == DeliveryState::Dead)
        .count();
    outln!();
    if dead > 0 {
        outln!("{dead} dead letter(s): given up after their tries, shown first");
    }
    outln!(
        "{:<9}  {:<17}  {:<5}  {:<19}  SUMMARY",
        "STATE",
        "EVENT",
        "TRIES",
        "AT"
    );
    for d in &view.deliveries {
        outln!(
            "{:<9}  {:<17}  {:<5}  {:<19}  {}",
            d.state.as_str(),
            d.kind.as_str(),
            d.tries,
            d.event_at.format("%Y-%m-%d %H:%M:%S"),
            d.summary
        );
        if d.state != DeliveryState::Delivered
            && let Some(e) = &d.last_error
        {
            let next = d
                .next_try_at
                .map(|t| format!(" (next try {})", t.format("%H:%M:%S")))
                .unwrap_or_default();
            outln!("{:<9}  last error: {e}{next}", "");
        }
    }
}
