//! What an attempt measured: where its peak and energy figures come from, its energy, power,
//! temperature and throttling, its counters, and its sharing of GPUs with other attempts.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::str::FromStr;

use crate::ids::AttemptId;

/// Where an attempt's peak memory figure comes from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum PeakSource {
    /// The sum of the attempt's processes' memory as the driver reports it per process.
    #[default]
    Processes,
    /// The driver gives no per-process memory: the growth of the device's used memory over
    /// its reading when the attempt started (counts anything else that grew meanwhile).
    DeviceDelta,
}

impl PeakSource {
    pub fn as_str(self) -> &'static str {
        match self {
            PeakSource::Processes => "processes",
            PeakSource::DeviceDelta => "device_delta",
        }
    }

    /// How people read it, after the figure: "peak 5.1GiB (GPU used-memory growth)".
    pub fn describe(self) -> &'static str {
        match self {
            PeakSource::Processes => "per process",
            PeakSource::DeviceDelta => "GPU used-memory growth",
        }
    }
}

impl FromStr for PeakSource {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "processes" => Ok(PeakSource::Processes),
            "device_delta" => Ok(PeakSource::DeviceDelta),
            other => Err(format!("unknown peak source `{other}`")),
        }
    }
}

/// How an attempt's `energy_j` was measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum EnergySource {
    /// The difference of the GPUs' total-energy counter (NVML, millijoules since the driver
    /// loaded) between the readings at the attempt's start and end.
    Counter,
    /// Power readings integrated over the run (trapezoid), on a GPU without the counter;
    /// only as fine as the sampling interval.
    Integrated,
}

impl EnergySource {
    pub fn as_str(self) -> &'static str {
        match self {
            EnergySource::Counter => "counter",
            EnergySource::Integrated => "integrated",
        }
    }
}

impl FromStr for EnergySource {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "counter" => Ok(EnergySource::Counter),
            "integrated" => Ok(EnergySource::Integrated),
            other => Err(format!("unknown energy source `{other}`")),
        }
    }
}

/// One figure of [`Measurements`] (an `Option<f64>` a run is compared by): declared once in
/// `measurements!` below, it is the API's field, the store's column (milli-units, the
/// migration adds it), the export's column with its unit and meaning, and the range a report
/// of it must fall in.
pub struct Figure {
    /// The field's name, and the export's column.
    pub name: &'static str,
    /// The store's column, in thousandths of `unit`.
    pub column: &'static str,
    pub unit: &'static str,
    pub about: &'static str,
    /// What a report may say (outside: refused, naming the field).
    pub min: f64,
    pub max: f64,
    pub get: fn(&Measurements) -> Option<f64>,
    pub set: fn(&mut Measurements, Option<f64>),
}

/// Declares `Measurements`: its figures (each one line of the table `FIGURES`) and its other
/// fields (flags, sources, texts), so that a new figure is one entry here and a migration.
macro_rules! measurements {
    (
        $(#[$meta:meta])*
        pub struct Measurements {
            figures {
                $( $fname:ident: $column:literal, $unit:literal, $min:literal ..= $max:literal,
                   $about:literal; )*
            }
            $( $(#[$fmeta:meta])* pub $name:ident: $ty:ty, )*
        }
    ) => {
        $(#[$meta])*
        pub struct Measurements {
            $(
                #[doc = $about]
                #[serde(default)]
                pub $fname: Option<f64>,
            )*
            $( $(#[$fmeta])* pub $name: $ty, )*
        }

        /// Every figure of [`Measurements`], in declaration order.
        pub const FIGURES: &[Figure] = &[$(
            Figure {
                name: stringify!($fname),
                column: $column,
                unit: $unit,
                about: $about,
                min: $min,
                max: $max,
                get: |m| m.$fname,
                set: |m, v| m.$fname = v,
            },
        )*];
    };
}

measurements! {
    /// What an attempt's supervisor measured on the attempt's GPUs over its run (from the
    /// job's start to its end), and who contaminated it. Every figure is `None` when it could
    /// not be measured (a reading failed, the GPU does not support it, the attempt never
    /// started), never 0; figures over several GPUs are summed (energy, power) or the hottest
    /// (temperature).
    #[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
    #[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
    pub struct Measurements {
        figures {
            energy_j: "energy_mj", "J", 0.0 ..= 1e15,
                "Energy the attempt's GPUs used over the run, joules (how: `energy_source`)";
            mean_power_w: "mean_power_mw", "W", 0.0 ..= 1e9,
                "Mean board power over the run (time-weighted over the readings), watts";
            max_power_w: "max_power_mw", "W", 0.0 ..= 1e9,
                "Highest board power sampled during the run, watts";
            max_temp_c: "max_temp_mdeg", "°C", -273.15 ..= 1000.0,
                "Highest GPU temperature sampled during the run, °C";
            start_temp_c: "start_temp_mdeg", "°C", -273.15 ..= 1000.0,
                "The GPU temperature at the first reading after the job started, °C";
            mean_util_pct: "mean_util_mpct", "%", 0.0 ..= 100.0,
                "Mean GPU utilization over the run (time-weighted), percent";
        }
        #[serde(default)]
        pub energy_source: Option<EnergySource>,
        /// The GPU slowed its clocks for temperature during the run (NVML clock event reasons
        /// `sw_thermal_slowdown`, `hw_thermal_slowdown` or `hw_slowdown`); `None`: the reasons
        /// could not be read.
        #[serde(default)]
        pub throttled_thermal: Option<bool>,
        /// The GPU slowed its clocks for power during the run (`sw_power_cap`,
        /// `hw_power_brake_slowdown` or `hw_slowdown`); `None`: the reasons could not be read.
        #[serde(default)]
        pub throttled_power: Option<bool>,
        /// Every clock event reason seen during the run, e.g. `sw_power_cap`.
        #[serde(default)]
        pub throttle_reasons: Option<Vec<String>>,
        /// Why the attempt is `contaminated`: the first offender, e.g. "foreign process held
        /// 2048 MiB on GPU 0".
        #[serde(default)]
        pub contamination_reason: Option<String>,
        /// The offending process.
        #[serde(default)]
        pub contamination_pid: Option<u32>,
        /// Its user and command line, as `/proc` told when it was seen (`alice: python x.py`).
        #[serde(default)]
        pub contamination_command: Option<String>,
        /// How long after the job's exec its figures begin, milliseconds: 0 when the first
        /// reading was taken before the exec (the figures cover the run from its first
        /// instruction). `None`: no figure is known.
        #[serde(default)]
        pub first_reading_ms: Option<u64>,
        /// The figures cover the job's whole run: read before its exec and after its end.
        /// `false`: they begin late, or could not be read (left out of `--clean-only`);
        /// `None`: the job never ran.
        #[serde(default)]
        pub covers_run: Option<bool>,
        /// Each GPU's total-energy counter at the run's first and last readings, with the
        /// readings' times: what a shared GPU's energy is apportioned from.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pub counters: Vec<CounterWindow>,
        /// The most memory, MiB, on one of its GPUs during the run that no listed process
        /// accounted for, beyond what was unattributed before it started (and beyond the noise
        /// of [`ghost_tolerance_mib`](super::ghost_tolerance_mib)): someone the driver does not list used its GPU. `0`:
        /// none; `None`: it could not be told (not clean).
        #[serde(default)]
        pub ghost_mib: Option<u64>,
        /// The run's GPU memory over time fitted as phases: its steady use, where its peak
        /// fell (shares of the run) and its length. Told only of a run measured per process
        /// whose peak stood out (a tenth above its steady use, at most half the run); the
        /// next runs of its configuration that declare no `resources.memory_phases` are
        /// placed by it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub memory_profile: Option<crate::phases::Phases>,
    }
}

/// One GPU's total-energy counter at an attempt's first and last readings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CounterWindow {
    pub gpu: u32,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    /// The counter at `from` and at `to`, joules.
    pub from_j: f64,
    pub to_j: f64,
    /// The attempt's processes' mean share of the GPU's SM time while they were on it,
    /// percent (NVML's per-process utilization); `None` where the driver does not give it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub util_pct: Option<f64>,
}

/// An attempt that ran beside other attempts on one of its GPUs: its `energy_j` is its
/// GPUs' energy over its run, theirs included; `energy_share_j` apportions it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Sharing {
    /// The part of its run (0 to 1) during which another attempt ran on one of its GPUs.
    pub overlap: f64,
    /// The attempts it shared its GPUs with.
    pub with: Vec<AttemptId>,
    /// Its apportioned share of its GPUs' energy over its run, joules: an estimate by
    /// `share_method`, never a measurement. `None` where the GPUs' counters are unknown.
    pub energy_share_j: Option<f64>,
    pub share_method: ShareMethod,
}

/// How a shared GPU's energy is apportioned among the attempts on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ShareMethod {
    /// Each stretch of time between two counter readings is split equally among the
    /// attempts that ran through it: the shares of a GPU's attempts add up to its counter's
    /// delta over their runs together.
    TimeWeighted,
    /// The same stretches, split by each attempt's processes' mean share of the GPU's SM
    /// time (per-process utilization), where every attempt in a stretch has one.
    UtilizationWeighted,
}

impl ShareMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            ShareMethod::TimeWeighted => "time_weighted",
            ShareMethod::UtilizationWeighted => "utilization_weighted",
        }
    }
}

impl Measurements {
    /// Throttled for temperature or power during the run.
    pub fn throttled(&self) -> bool {
        self.throttled_thermal == Some(true) || self.throttled_power == Some(true)
    }
}
