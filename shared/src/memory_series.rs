//! A run's GPU memory over time as its supervisor measured it, and the phases fitted to it
//! (steady use, and where its peak fell): what placement learns for the next runs of the
//! same configuration when they declared no `resources.memory_phases`.

use serde::{Deserialize, Serialize};

use crate::phases::Phases;

/// Stretches a series keeps at most: a run of any length is summarised in this many, each
/// the most its processes held at once in its stretch of time.
pub const STRETCHES: usize = 256;

/// The first stretches' length; doubled (two merged into one) each time the run outgrows
/// [`STRETCHES`] of them.
const FIRST_STRETCH_MS: u64 = 100;

/// Fewest looks a fit is made from: a run seen a handful of times says nothing of its
/// shape.
pub const FEWEST_LOOKS: u32 = 10;

/// A peak a fit reports is at least this much (in thousandths) above the steady use, and
/// its window at most half the run: less is no shape worth placing by.
const LEAST_RISE_PERMILLE: u64 = 1100;

/// What a run's processes held on its GPUs over time, in stretches of equal length.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MemorySeries {
    stretch_ms: u64,
    /// The most seen in each stretch; `None` where no look fell.
    most: Vec<Option<u64>>,
    looks: u32,
    /// A look could not tell the run's memory: no shape is fitted.
    unknown: bool,
}

impl MemorySeries {
    /// What a look `at_ms` into the run saw its processes hold together.
    pub fn record(&mut self, at_ms: u64, mib: u64) {
        if self.stretch_ms == 0 {
            self.stretch_ms = FIRST_STRETCH_MS;
        }
        while at_ms / self.stretch_ms >= STRETCHES as u64 {
            self.most = self
                .most
                .chunks(2)
                .map(|pair| pair.iter().flatten().copied().max())
                .collect();
            self.stretch_ms = self.stretch_ms.saturating_mul(2);
        }
        let i = (at_ms / self.stretch_ms) as usize;
        if self.most.len() <= i {
            self.most.resize(i + 1, None);
        }
        self.most[i] = self.most[i].max(Some(mib));
        self.looks = self.looks.saturating_add(1);
    }

    /// A look saw the run's processes but could not tell their memory.
    pub fn mark_unknown(&mut self) {
        self.unknown = true;
    }

    /// The phases that cover every look of a run of `run_ms` with the least memory-time: a
    /// steady use and one window at the run's peak. `None` where the series cannot tell
    /// (too few looks, a look that could not tell) or the run has no peak worth placing by
    /// (one barely above its steady use, or lasting more than half the run).
    pub fn fit(&self, run_ms: u64) -> Option<Phases> {
        if self.unknown || self.looks < FEWEST_LOOKS || run_ms == 0 || self.stretch_ms == 0 {
            return None;
        }
        // Up to the run's end: after the last look it held what that look saw.
        let stretches = usize::try_from(run_ms.div_ceil(self.stretch_ms)).unwrap_or(usize::MAX);
        let held = self.held(stretches.clamp(self.most.len(), 2 * STRETCHES));
        let n = held.len();
        let peak = held.iter().copied().max()?;
        // Most held before stretch i, and from stretch j on.
        let mut before = vec![0u64; n + 1];
        for i in 0..n {
            before[i + 1] = before[i].max(held[i]);
        }
        let mut after = vec![0u64; n + 1];
        for j in (0..n).rev() {
            after[j] = after[j + 1].max(held[j]);
        }
        let cost = |i: usize, j: usize| {
            let steady = before[i].max(after[j]);
            (
                steady,
                steady * (n - (j - i)) as u64 + peak * (j - i) as u64,
            )
        };
        let (i, j, steady) = (0..n)
            .flat_map(|i| (i + 1..=n).map(move |j| (i, j)))
            .map(|(i, j)| {
                let (steady, c) = cost(i, j);
                (c, j - i, i, j, steady)
            })
            .min_by_key(|&(c, len, ..)| (c, len))
            .map(|(_, _, i, j, steady)| (i, j, steady))?;
        if steady.saturating_mul(LEAST_RISE_PERMILLE) > peak.saturating_mul(1000) || 2 * (j - i) > n
        {
            return None;
        }
        let share = |stretch: usize| {
            ((stretch as u64).saturating_mul(self.stretch_ms) as f64 / run_ms as f64).min(1.0)
        };
        let (from, until) = (share(i), share(j));
        (from < until).then_some(Phases {
            steady_mib: steady.max(1),
            peak_from: from,
            peak_until: until,
            expected_ms: run_ms,
            margin_permille: crate::phases::DECLARED_MARGIN_PERMILLE,
        })
    }

    /// What each of the first `n` stretches is taken to hold: the most seen in it, or where
    /// no look fell, the more of the looks on either side (memory between two looks is not
    /// known).
    fn held(&self, n: usize) -> Vec<u64> {
        let mut most = self.most.clone();
        most.resize(n, None);
        let mut prev = vec![None; n];
        let mut last = None;
        for (i, m) in most.iter().enumerate() {
            last = m.or(last);
            prev[i] = last;
        }
        let mut next = None;
        let mut held = vec![0; n];
        for i in (0..n).rev() {
            next = most[i].or(next);
            held[i] = most[i].unwrap_or_else(|| prev[i].max(next).unwrap_or(0));
        }
        held
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Looks every `every_ms` over a run of `run_ms` holding `steady`, `peak` in
    /// `[from, until)` of it.
    fn run(
        run_ms: u64,
        every_ms: u64,
        steady: u64,
        peak: u64,
        from: f64,
        until: f64,
    ) -> MemorySeries {
        let mut s = MemorySeries::default();
        for at in (0..run_ms).step_by(every_ms as usize) {
            let share = at as f64 / run_ms as f64;
            s.record(
                at,
                if share >= from && share < until {
                    peak
                } else {
                    steady
                },
            );
        }
        s
    }

    #[test]
    fn a_run_s_evaluation_peak_is_found_where_it_fell() {
        // 100 s at 1 Hz, 2,000 MiB, 2,600 in its last tenth.
        let p = run(100_000, 1000, 2000, 2600, 0.9, 1.0)
            .fit(100_000)
            .expect("a shape");
        assert_eq!(p.steady_mib, 2000);
        assert_eq!(p.expected_ms, 100_000);
        assert!((0.88..=0.9).contains(&p.peak_from), "{p:?}");
        assert!((p.peak_until - 1.0).abs() < 1e-9, "{p:?}");
        // A twentieth in the middle of a long run (merged stretches), seen every 5 s.
        let p = run(3_600_000, 5000, 9000, 15000, 0.5, 0.55)
            .fit(3_600_000)
            .expect("a shape");
        assert_eq!(p.steady_mib, 9000);
        assert!(p.peak_from <= 0.5 && p.peak_from > 0.48, "{p:?}");
        assert!(p.peak_until >= 0.55 && p.peak_until < 0.57, "{p:?}");
    }

    #[test]
    fn every_look_is_covered_by_the_fitted_phases() {
        let s = run(60_000, 700, 3000, 7000, 0.3, 0.45);
        let p = s.fit(60_000).expect("a shape");
        for at in (0..60_000u64).step_by(700) {
            let share = at as f64 / 60_000.0;
            let held = if (0.3..0.45).contains(&share) {
                7000
            } else {
                3000
            };
            let counted = if share >= p.peak_from && share < p.peak_until {
                7000
            } else {
                p.steady_mib
            };
            assert!(
                counted >= held,
                "{at} ms: {held} held, {counted} counted ({p:?})"
            );
        }
    }

    #[test]
    fn no_shape_is_told_where_the_series_cannot_tell_one() {
        // Flat, or a rise of under a tenth: nothing to place by.
        assert_eq!(run(100_000, 1000, 2000, 2000, 0.9, 1.0).fit(100_000), None);
        assert_eq!(run(100_000, 1000, 2000, 2150, 0.9, 1.0).fit(100_000), None);
        // A peak over most of the run (memory a caching allocator kept after its rise).
        assert_eq!(run(100_000, 1000, 2000, 5000, 0.3, 1.0).fit(100_000), None);
        // Too few looks.
        assert_eq!(run(5_000, 1000, 2000, 5000, 0.8, 1.0).fit(5_000), None);
        // A look that could not tell the run's memory.
        let mut s = run(100_000, 1000, 2000, 2600, 0.9, 1.0);
        s.mark_unknown();
        assert_eq!(s.fit(100_000), None);
    }

    #[test]
    fn a_long_run_is_kept_in_a_bounded_series() {
        let s = run(7 * 24 * 3_600_000, 1000, 1000, 4000, 0.9, 1.0);
        assert!(s.most.len() <= STRETCHES, "{}", s.most.len());
        let p = s.fit(7 * 24 * 3_600_000).expect("a shape");
        assert!(p.peak_from <= 0.9 && p.peak_from > 0.88, "{p:?}");
    }
}
