//! What a lab's users use and may use: each user's fair-share weight and caps, and the usage
//! report (`headroom usage`, `GET /v1/usage`).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

pub(crate) fn default_share() -> u32 {
    1
}

/// A user's weight in fair share and what they may hold at once (`None`: no cap).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UserLimits {
    #[serde(default = "default_share")]
    pub share: u32,
    #[serde(default)]
    pub max_jobs: Option<u32>,
    #[serde(default)]
    pub max_gpus: Option<u32>,
    /// MiB of GPU memory their jobs reserve at once.
    #[serde(default)]
    pub max_gpu_mib: Option<u64>,
}

impl UserLimits {
    /// Some cap holds their jobs.
    pub fn is_capped(&self) -> bool {
        self.max_jobs.is_some() || self.max_gpus.is_some() || self.max_gpu_mib.is_some()
    }
}

/// How a usage report groups its rows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "settings", derive(clap::ValueEnum))]
pub enum UsageBy {
    #[default]
    User,
    Experiment,
}

/// `GET /v1/usage?since=30d&by=user`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[serde(deny_unknown_fields)]
pub struct UsageQuery {
    /// How far back: `30d`, `12h` (default 30 days).
    #[serde(default)]
    pub since: Option<String>,
    #[serde(default)]
    pub by: UsageBy,
}

/// What the runs of one user (or experiment) used since the report's start: the part of each
/// attempt's run inside the window.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UsageRow {
    /// The user's name, or the experiment's id.
    pub key: String,
    /// The experiment's name (`by=experiment`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// GPUs held x hours.
    pub gpu_hours: f64,
    /// GiB of GPU memory reserved x hours: what fair share charges.
    pub gib_hours: f64,
    /// Energy of the attempts that reported one, in kWh; `clean`: of runs that had their GPUs
    /// to themselves (not contaminated, not shared).
    pub energy_kwh: f64,
    pub clean_energy_kwh: f64,
    pub attempts: u64,
    /// Jobs that ended in the window, by end state (`succeeded`, `failed`, `cancelled`).
    pub jobs: std::collections::BTreeMap<String, u64>,
}

/// A user's standing in fair share now.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ShareStanding {
    pub user: String,
    pub share: u32,
    /// Decayed usage in GiB-hours of reserved GPU memory, running attempts included.
    pub used_gib_hours: f64,
    /// `used_gib_hours / share`: the lower, the sooner their jobs go.
    pub normalized: f64,
    /// Their jobs leased or running now, the GPUs and the memory (MiB) those hold.
    pub running_jobs: u64,
    pub running_gpus: u64,
    pub running_mib: u64,
}

/// The usage report: rows for the window, and every user's fair-share standing now.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UsageReport {
    pub since: DateTime<Utc>,
    pub until: DateTime<Utc>,
    pub by: UsageBy,
    /// The coordinator's fair-share half-life, in seconds.
    pub half_life_s: u64,
    pub rows: Vec<UsageRow>,
    pub shares: Vec<ShareStanding>,
}
