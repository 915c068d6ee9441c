//! Fair share's ledger and the usage report: ended runs charged to their users' ledgers (a
//! coordinator task, so an attempt's end never locks a ledger), and what each user or
//! experiment used over a window with every user's standing now.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use headroom_shared::api::usage::{ShareStanding, UsageBy, UsageReport, UsageRow};

use super::tx::{Tx, UsageAttempt};
use super::{Millis, Result};
use crate::changes::Change;
use crate::fair::{self, Held, Ledger};

const MIB_MS_PER_GIB_H: f64 = 1024.0 * 3_600_000.0;
const MS_PER_H: f64 = 3_600_000.0;

/// Charges up to `limit` ended runs to their users' ledgers; how many it charged.
pub(super) async fn charge(
    tx: &mut dyn Tx,
    half_life_ms: u64,
    limit: u32,
) -> Result<(usize, Change)> {
    let runs = tx.lock_uncharged_ended(limit).await?;
    if runs.is_empty() {
        return Ok((0, Change::None));
    }
    let now = tx.clock().await?;
    // Ledgers in name order (`SharesTx`'s lock order).
    let mut costs: BTreeMap<&str, f64> = BTreeMap::new();
    for (_, r) in &runs {
        *costs.entry(&r.user).or_default() += r.cost(now, half_life_ms);
    }
    for (user, cost) in costs {
        let ledger = tx.lock_ledger(user, now).await?;
        let charged = Ledger::charged(Some(ledger), cost, now, half_life_ms);
        tx.set_ledger(user, charged).await?;
    }
    let ids: Vec<String> = runs.iter().map(|(id, _)| id.clone()).collect();
    tx.mark_charged(&ids).await?;
    Ok((ids.len(), Change::None))
}

/// The usage report over `[from, now)`, grouped `by`, with every user's standing now.
pub(super) async fn report(
    tx: &mut dyn Tx,
    from: Millis,
    by: UsageBy,
    half_life_ms: u64,
) -> Result<UsageReport> {
    let now = tx.clock().await?;
    let attempts = tx.usage_attempts(from, now).await?;
    let ended = tx.ended_jobs(from, now).await?;
    let mut rows: BTreeMap<String, UsageRow> = BTreeMap::new();
    let key = |user: &str, exp: &str| match by {
        UsageBy::User => user.to_string(),
        UsageBy::Experiment => exp.to_string(),
    };
    for a in &attempts {
        let row = rows.entry(key(&a.user, &a.experiment)).or_default();
        add_attempt(row, a, from, now);
        if by == UsageBy::Experiment {
            row.name = Some(a.experiment_name.clone());
        }
    }
    for (user, exp, name, state) in ended {
        let row = rows.entry(key(&user, &exp)).or_default();
        *row.jobs.entry(state.as_str().to_string()).or_default() += 1;
        if by == UsageBy::Experiment {
            row.name = Some(name);
        }
    }
    let rows = rows
        .into_iter()
        .map(|(key, row)| UsageRow { key, ..row })
        .collect();
    Ok(UsageReport {
        since: super::rows::ts(from),
        until: super::rows::ts(now),
        by,
        half_life_s: half_life_ms / 1000,
        rows,
        shares: standings(tx, now, half_life_ms).await?,
    })
}

/// Adds the part of `a`'s run inside `[from, to)` to `row`.
fn add_attempt(row: &mut UsageRow, a: &UsageAttempt, from: Millis, to: Millis) {
    row.attempts += 1;
    let Some(started) = a.started else {
        return;
    };
    let run_ms = (a.ended.unwrap_or(to).min(to) - started.max(from)).max(0) as f64;
    row.gpu_hours += f64::from(a.gpus) * run_ms / MS_PER_H;
    row.gib_hours += a.reserved_mib.unwrap_or(0) as f64 * run_ms / MIB_MS_PER_GIB_H;
    if let Some(mj) = a.energy_mj {
        let kwh = mj as f64 / 3.6e9;
        row.energy_kwh += kwh;
        if !a.contaminated {
            row.clean_energy_kwh += kwh;
        }
    }
}

/// Every user's fair-share standing now (users with a ledger, a run or a share set), lowest
/// first, with what their runs hold.
pub(super) async fn standings(
    tx: &mut dyn Tx,
    now: Millis,
    half_life_ms: u64,
) -> Result<Vec<ShareStanding>> {
    let limits: HashMap<String, u32> = tx
        .user_limits()
        .await?
        .into_iter()
        .map(|(n, l)| (n, l.share))
        .collect();
    let ledgers: HashMap<String, Ledger> = tx.ledgers().await?.into_iter().collect();
    let runs = tx.uncharged_runs().await?;
    let names: BTreeSet<&String> = limits
        .keys()
        .chain(ledgers.keys())
        .chain(runs.iter().map(|r| &r.user))
        .collect();
    let users: Vec<(String, u32)> = names
        .into_iter()
        .map(|n| (n.clone(), limits.get(n).copied().unwrap_or(1)))
        .collect();
    let standings = fair::standings(&users, &ledgers, &runs, now, half_life_ms);
    let order = fair::order(standings, &HashMap::new());
    Ok(order
        .standings()
        .iter()
        .map(|s| {
            let held = Held::of(runs.iter().filter(|r| r.user == s.user));
            ShareStanding {
                user: s.user.clone(),
                share: s.share,
                used_gib_hours: s.used_mib_ms / MIB_MS_PER_GIB_H,
                normalized: s.normalized() / MIB_MS_PER_GIB_H,
                running_jobs: held.jobs,
                running_gpus: held.gpus,
                running_mib: held.mib,
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_counts_only_inside_the_window() {
        let a = UsageAttempt {
            user: "u".into(),
            experiment: "e".into(),
            experiment_name: "e".into(),
            gpus: 2,
            reserved_mib: Some(2048),
            started: Some(0),
            ended: Some(4 * 3_600_000),
            energy_mj: Some(3_600_000_000),
            contaminated: false,
        };
        let mut row = UsageRow::default();
        // The window takes the run's last two of four hours.
        add_attempt(&mut row, &a, 2 * 3_600_000, 10 * 3_600_000);
        assert_eq!((row.gpu_hours, row.gib_hours), (4.0, 4.0));
        assert_eq!((row.energy_kwh, row.clean_energy_kwh), (1.0, 1.0));
        let dirty = UsageAttempt {
            contaminated: true,
            ..a
        };
        add_attempt(&mut row, &dirty, 0, 10 * 3_600_000);
        assert_eq!((row.energy_kwh, row.clean_energy_kwh), (2.0, 1.0));
        assert_eq!(row.attempts, 2);
    }
}
