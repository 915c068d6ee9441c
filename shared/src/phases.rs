//! A run's GPU memory over time as a spec declares it (`resources.memory_phases`): what it
//! holds outside its peak, and where in its run the peak falls. With the run's length
//! (`expected_duration`) placement can let runs share a GPU whose peaks fall apart in time.

use serde::{Deserialize, Serialize};

use crate::field::SpecError;
use crate::size::MemSize;

/// `resources.memory_phases`: `{steady: 2GiB, peak: [0.9, 1.0]}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct MemoryPhases {
    /// What a run holds outside its peak (per GPU); `resources.memory` is its peak.
    pub steady: MemSize,
    /// Where the peak begins and ends, as fractions of the run: `[0.9, 1.0]` is its last
    /// tenth (an evaluation at the end), `[0.5, 0.55]` a twentieth in its middle.
    pub peak: [f64; 2],
}

/// Share of a run's expected length (in thousandths) by which its peak is taken to come
/// early or end late, and its run to end late, when its phases were declared: runs up to a
/// tenth faster or slower than declared still never meet a neighbour's peak.
pub const DECLARED_MARGIN_PERMILLE: u64 = 100;

fn declared_margin() -> u64 {
    DECLARED_MARGIN_PERMILLE
}

/// A job's memory over time as placement reads it: steady use, the peak's window as
/// fractions of the run, the run's expected length, and by how much its timing may be off.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Phases {
    pub steady_mib: u64,
    pub peak_from: f64,
    pub peak_until: f64,
    pub expected_ms: u64,
    /// How much earlier its peak may begin, and later its peak and its run may end, than
    /// placed, in thousandths of `expected_ms`: [`DECLARED_MARGIN_PERMILLE`] for declared
    /// phases (and a run's shape as told); learned ones take their taught runs' spread.
    #[serde(default = "declared_margin")]
    pub margin_permille: u64,
}

impl MemoryPhases {
    /// Checked against the spec's peak (`resources.memory`) and run length
    /// (`expected_duration`), which it needs: errors name `resources.memory_phases`.
    pub fn check(
        &self,
        memory: Option<MemSize>,
        expected: Option<std::time::Duration>,
    ) -> Result<Phases, SpecError> {
        let bad =
            |field: &str, m: String| SpecError::new(format!("resources.memory_phases{field}"), m);
        let Some(peak) = memory else {
            return Err(bad(
                "",
                "needs `resources.memory` (the run's peak) beside it".into(),
            ));
        };
        let Some(expected) = expected else {
            return Err(bad(
                "",
                "needs `expected_duration` (how long a run takes): a peak's place in time is a \
                 fraction of it"
                    .into(),
            ));
        };
        if self.steady.mib == 0 || self.steady > peak {
            return Err(bad(
                ".steady",
                format!(
                    "must be more than 0 and at most `resources.memory` ({} MiB), got {} MiB",
                    peak.mib, self.steady.mib
                ),
            ));
        }
        let [from, until] = self.peak;
        if !(from.is_finite() && until.is_finite() && 0.0 <= from && from < until && until <= 1.0) {
            return Err(bad(
                ".peak",
                format!(
                    "must be [from, until] with 0 <= from < until <= 1 (fractions of the run), \
                     got [{from}, {until}]"
                ),
            ));
        }
        Ok(Phases {
            steady_mib: self.steady.mib,
            peak_from: from,
            peak_until: until,
            expected_ms: u64::try_from(expected.as_millis()).unwrap_or(u64::MAX),
            margin_permille: DECLARED_MARGIN_PERMILLE,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn phases(steady: u64, peak: [f64; 2]) -> MemoryPhases {
        MemoryPhases {
            steady: MemSize::from_mib(steady),
            peak,
        }
    }

    #[test]
    fn a_declared_peak_window_is_kept_with_the_run_s_length() {
        let p = phases(2000, [0.9, 1.0])
            .check(
                Some(MemSize::from_mib(2600)),
                Some(Duration::from_secs(750)),
            )
            .expect("valid");
        assert_eq!(
            p,
            Phases {
                steady_mib: 2000,
                peak_from: 0.9,
                peak_until: 1.0,
                expected_ms: 750_000,
                margin_permille: DECLARED_MARGIN_PERMILLE,
            }
        );
    }

    #[test]
    fn each_refusal_names_its_field() {
        let mem = Some(MemSize::from_mib(2600));
        let len = Some(Duration::from_secs(60));
        let cases = [
            (2000, [0.9, 1.0], None, len, ""),
            (2000, [0.9, 1.0], mem, None, ""),
            (3000, [0.9, 1.0], mem, len, ".steady"),
            (0, [0.9, 1.0], mem, len, ".steady"),
            (2000, [0.9, 0.9], mem, len, ".peak"),
            (2000, [0.5, 1.2], mem, len, ".peak"),
            (2000, [-0.1, 0.5], mem, len, ".peak"),
            (2000, [f64::NAN, 1.0], mem, len, ".peak"),
        ];
        for (steady, peak, mem, len, field) in cases {
            let refused = phases(steady, peak).check(mem, len).expect_err("refused");
            assert_eq!(
                refused.field,
                format!("resources.memory_phases{field}"),
                "{steady} {peak:?}"
            );
        }
    }
}
