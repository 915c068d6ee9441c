//! GPU memory over time: a run that declared its phases (`resources.memory_phases` with
//! `expected_duration`) holds its steady use outside its peak, so placement may put a run
//! beside it whose peak falls elsewhere in time. The most a GPU's runs would hold together,
//! at any instant from now on, is what a new run must fit beside.

use headroom_shared::phases::Phases;

/// Milliseconds since the Unix epoch: the one time unit the rules, placement and the stores
/// use.
pub type Millis = i64;

/// A run whose memory over time is known, as placement counts it: its peak (the estimate it
/// is placed by) over its peak's window widened by the margin, its steady use outside it
/// until it is due, in the store's milliseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TimedRun {
    pub peak_mib: u64,
    steady_mib: u64,
    started_ms: Millis,
    /// `[from, until)` of its widened peak.
    peak_ms: (Millis, Millis),
    due_ms: Millis,
}

impl TimedRun {
    /// A run of `phases` placed by `peak_mib`, leased at `started_ms`.
    pub fn new(peak_mib: u64, phases: Phases, started_ms: Millis) -> Self {
        let into_run = |fraction: f64| (fraction * phases.expected_ms as f64).round() as Millis;
        // Runs up to the margin faster or slower than placed never meet a neighbour's peak.
        let margin =
            Millis::try_from(phases.expected_ms.saturating_mul(phases.margin_permille) / 1000)
                .unwrap_or(Millis::MAX);
        let at = |fraction: f64| started_ms.saturating_add(into_run(fraction));
        Self {
            peak_mib,
            steady_mib: phases.steady_mib.min(peak_mib),
            started_ms,
            peak_ms: (
                at(phases.peak_from).saturating_sub(margin),
                at(phases.peak_until).saturating_add(margin),
            ),
            due_ms: at(1.0).saturating_add(margin),
        }
    }

    /// When it ends at the latest the margin allows; past it the run is overdue.
    pub fn due_ms(&self) -> Millis {
        self.due_ms
    }

    /// What it holds at `t` (at or after `now`): its peak inside its peak window; its
    /// steady use before its due time; nothing after. An overdue run is where nothing
    /// said it would be: it holds its peak until it ends.
    pub fn held_at(&self, t: Millis, now: Millis) -> u64 {
        if now >= self.due_ms {
            self.peak_mib
        } else if t >= self.due_ms {
            0
        } else if t >= self.peak_ms.0 && t < self.peak_ms.1 {
            self.peak_mib
        } else {
            self.steady_mib
        }
    }

    /// The instants at which what it holds may change.
    fn edges(&self) -> [Millis; 3] {
        [self.peak_ms.0, self.peak_ms.1, self.due_ms]
    }
}

/// The runs on one GPU whose memory over time is known, as of `now_ms`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Timeline {
    pub now_ms: Millis,
    pub runs: Vec<TimedRun>,
}

/// A run to be placed: one that holds its estimate throughout, or one with phases.
#[derive(Clone, Copy, Debug)]
pub enum NewRun {
    Flat(u64),
    Timed(TimedRun),
}

impl NewRun {
    /// A run of `estimate` leased now, with `phases` when it declared them.
    pub fn of(estimate: u64, phases: Option<Phases>, now: Millis) -> Self {
        match phases {
            Some(phases) => Self::Timed(TimedRun::new(estimate, phases, now)),
            None => Self::Flat(estimate),
        }
    }

    fn held_at(&self, t: Millis, now: Millis) -> u64 {
        match self {
            Self::Flat(e) => *e,
            Self::Timed(r) => r.held_at(t, now),
        }
    }

    /// What it holds the moment it starts: what free memory must hold now.
    pub fn held_first(&self) -> u64 {
        match self {
            Self::Flat(e) => *e,
            Self::Timed(r) => r.held_at(r.started_ms, r.started_ms),
        }
    }
}

impl Timeline {
    /// The peaks of its runs, as counted among a GPU's estimates.
    pub fn peaks(&self) -> u64 {
        self.runs.iter().map(|r| r.peak_mib).sum()
    }

    /// The most these runs and `new` would hold together at any instant from now on (while
    /// `new` runs): a use only changes at a window's edge, so those are the instants checked.
    pub fn most_held_with(&self, new: &NewRun) -> u64 {
        let now = self.now_ms;
        let until = match new {
            NewRun::Flat(_) => Millis::MAX,
            NewRun::Timed(r) => r.due_ms(),
        };
        let own = match new {
            NewRun::Timed(r) => Some(r.edges()),
            NewRun::Flat(_) => None,
        };
        let edges = self.runs.iter().map(TimedRun::edges).chain(own).flatten();
        std::iter::once(now)
            .chain(edges.filter(|t| *t > now && *t < until))
            .map(|t| {
                let others: u64 = self.runs.iter().map(|r| r.held_at(t, now)).sum();
                others + new.held_at(t, now)
            })
            .max()
            .unwrap_or(0)
    }

    /// The instants after now, in order, at which whether `new` fits may change though
    /// nothing else happens: one of the runs' use changes, or `new`, started then, would
    /// have one of its own edges (its peak's, its due time) on one of theirs.
    pub fn changes_for(&self, new: &NewRun) -> Vec<Millis> {
        let now = self.now_ms;
        // A new run starts now: its edges less now are where they fall in its run.
        let offsets: Vec<Millis> = match new {
            NewRun::Timed(r) => r.edges().iter().map(|e| e.saturating_sub(now)).collect(),
            NewRun::Flat(_) => Vec::new(),
        };
        let mut at: Vec<Millis> = self
            .runs
            .iter()
            .flat_map(TimedRun::edges)
            .flat_map(|e| {
                std::iter::once(e).chain(offsets.iter().map(move |o| e.saturating_sub(*o)))
            })
            .filter(|t| *t > now)
            .collect();
        at.sort_unstable();
        at.dedup();
        at
    }

    pub fn add(&mut self, new: &NewRun) {
        if let NewRun::Timed(r) = new {
            self.runs.push(*r);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run of 100 s holding 2,000 MiB, 2,600 at its peak in `[from, until)`.
    fn phases(from: f64, until: f64) -> Phases {
        Phases {
            steady_mib: 2000,
            peak_from: from,
            peak_until: until,
            expected_ms: 100_000,
            margin_permille: headroom_shared::phases::DECLARED_MARGIN_PERMILLE,
        }
    }

    fn run(started_ms: Millis, from: f64, until: f64) -> TimedRun {
        TimedRun::new(2600, phases(from, until), started_ms)
    }

    #[test]
    fn a_run_holds_its_peak_in_its_widened_window_and_nothing_once_due() {
        let r = run(0, 0.5, 0.6);
        // Peak from 40 s (50 less the 10 s margin) until 70 s; due at 110 s.
        assert_eq!(r.held_at(39_999, 0), 2000);
        assert_eq!(r.held_at(40_000, 0), 2600);
        assert_eq!(r.held_at(69_999, 0), 2600);
        assert_eq!(r.held_at(70_000, 0), 2000);
        assert_eq!(r.held_at(110_000, 0), 0);
        // Learned phases of runs that agreed: a 3 % margin, peak from 47 s until 63 s, due
        // at 103 s.
        let learned = TimedRun::new(
            2600,
            Phases {
                margin_permille: 30,
                ..phases(0.5, 0.6)
            },
            0,
        );
        assert_eq!(learned.held_at(46_999, 0), 2000);
        assert_eq!(learned.held_at(47_000, 0), 2600);
        assert_eq!(learned.held_at(63_000, 0), 2000);
        assert_eq!(learned.due_ms(), 103_000);
    }

    #[test]
    fn an_overdue_run_holds_its_peak_whatever_its_phases_said() {
        let r = run(0, 0.5, 0.6);
        assert_eq!(r.held_at(200_000, 110_000), 2600);
        assert_eq!(r.held_at(80_000, 110_000), 2600);
    }

    #[test]
    fn two_peaks_that_meet_count_both_and_two_apart_count_one() {
        // Both peak in their last tenth: started together, their peaks meet.
        let t = Timeline {
            now_ms: 0,
            runs: vec![run(0, 0.9, 1.0)],
        };
        let same = NewRun::of(2600, Some(phases(0.9, 1.0)), 0);
        assert_eq!(t.most_held_with(&same), 5200);
        // Started 50 s into the first run: its peak (widened: 130-160 s) comes after the
        // first is due (110 s), so the most held is one peak beside one steady use.
        let t = Timeline {
            now_ms: 50_000,
            runs: vec![run(0, 0.9, 1.0)],
        };
        let later = NewRun::of(2600, Some(phases(0.9, 1.0)), 50_000);
        assert_eq!(t.most_held_with(&later), 4600);
        // A run with no phases holds its estimate beside the first run's peak.
        assert_eq!(t.most_held_with(&NewRun::Flat(1000)), 3600);
        assert_eq!(later.held_first(), 2000);
    }

    /// A run declared to take longer than time can count is due at the end of time, and a
    /// new run whose widened peak opens before now is looked at without overflowing.
    #[test]
    fn lengths_past_the_clock_saturate() {
        let huge = TimedRun::new(
            2600,
            Phases {
                expected_ms: u64::MAX,
                ..phases(0.9, 1.0)
            },
            0,
        );
        assert_eq!(huge.due_ms(), Millis::MAX);
        let t = Timeline {
            now_ms: 1_000,
            runs: vec![huge],
        };
        let early = NewRun::of(2600, Some(phases(0.0, 0.5)), 1_000);
        assert!(t.changes_for(&early).iter().all(|at| *at > 1_000));
        // The long run is steady for as long as anything here can tell; the new one peaks now.
        assert_eq!(t.most_held_with(&early), 2000 + 2600);
    }

    #[test]
    fn the_next_change_is_the_nearest_edge_still_ahead_of_theirs_or_of_its_own() {
        let t = Timeline {
            now_ms: 50_000,
            runs: vec![run(0, 0.9, 1.0), run(45_000, 0.5, 0.6)],
        };
        // The first's peak window opens at 80 s (the second's at 85 s, ends at 115 s, the
        // second is due at 155 s).
        assert_eq!(
            t.changes_for(&NewRun::Flat(1000)),
            vec![80_000, 85_000, 110_000, 115_000, 155_000]
        );
        // A run peaking 80 s into its run (widened), started at 75 s, would open its peak
        // window as the second run is due.
        let new = NewRun::of(2600, Some(phases(0.9, 1.0)), 50_000);
        assert_eq!(t.changes_for(&new).first(), Some(&75_000));
        assert!(Timeline::default().changes_for(&new).is_empty());
    }
}
