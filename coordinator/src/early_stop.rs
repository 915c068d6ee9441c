//! Early stopping's rule, pure: asynchronous successive halving as Optuna's
//! `SuccessiveHalvingPruner` decides it. At each rung an attempt's value is compared with the
//! values the experiment's other attempts had there (recorded whatever was decided for them):
//! it goes on only if it is among the best `1/reduction_factor` of them, its own included; of
//! fewer than `reduction_factor` values it must be the best.

use headroom_shared::results::{EarlyStop, Mode, RungDecision, RungValue};

/// The decision at `at` for an attempt, with `others`: every other attempt's value at that
/// rung.
pub fn decide(rule: &EarlyStop, at: RungValue, others: &[f64]) -> RungDecision {
    let mut competing: Vec<f64> = others.to_vec();
    competing.push(at.value);
    let competitors = u32::try_from(competing.len()).unwrap_or(u32::MAX);
    let decision = |cutoff: Option<f64>, pruned: bool| RungDecision {
        rung: at.rung,
        step: at.step,
        value: at.value,
        cutoff,
        competitors,
        pruned,
    };
    if competing.len() <= rule.bootstrap_count as usize {
        return decision(None, true);
    }
    let rf = usize::try_from(rule.reduction_factor)
        .unwrap_or(usize::MAX)
        .max(1);
    // The index of the last promoted value, best first (at least the best).
    let promotable = (competing.len() / rf).saturating_sub(1);
    competing.sort_by(f64::total_cmp);
    let cutoff = match rule.mode {
        Mode::Max => competing[competing.len() - 1 - promotable],
        Mode::Min => competing[promotable],
    };
    let promoted = match rule.mode {
        Mode::Max => at.value >= cutoff,
        Mode::Min => at.value <= cutoff,
    };
    decision(Some(cutoff), !promoted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use headroom_shared::results::Rule;

    fn rule(mode: Mode, rf: u64, bootstrap: u32) -> EarlyStop {
        EarlyStop {
            metric: "m".into(),
            mode,
            rule: Rule::Asha,
            grace_steps: 1,
            reduction_factor: rf,
            min_early_stopping_rate: 0,
            bootstrap_count: bootstrap,
        }
    }

    fn at(value: f64) -> RungValue {
        RungValue {
            rung: 0,
            step: 1,
            value,
        }
    }

    #[test]
    fn the_first_attempt_at_a_rung_goes_on_and_later_ones_must_be_best_until_there_are_rf() {
        let r = rule(Mode::Max, 3, 0);
        assert!(!decide(&r, at(0.1), &[]).pruned, "alone it is the best");
        assert!(
            decide(&r, at(0.1), &[0.5]).pruned,
            "of 2 < rf, only the best"
        );
        assert!(
            !decide(&r, at(0.5), &[0.5]).pruned,
            "a tie with the best goes on"
        );
        // 3 values: the top 1; 6 values: the top 2.
        let d = decide(&r, at(0.7), &[0.9, 0.8, 0.1, 0.2, 0.3]);
        assert_eq!((d.cutoff, d.pruned, d.competitors), (Some(0.8), true, 6));
        assert!(!decide(&r, at(0.85), &[0.9, 0.8, 0.1, 0.2, 0.3]).pruned);
    }

    #[test]
    fn min_mode_keeps_the_lowest() {
        let r = rule(Mode::Min, 2, 0);
        let d = decide(&r, at(0.3), &[0.1, 0.2, 0.4]);
        // 4 values, rf 2: the best 2 (0.1, 0.2).
        assert_eq!((d.cutoff, d.pruned), (Some(0.2), true));
        assert!(!decide(&r, at(0.15), &[0.1, 0.2, 0.4]).pruned);
    }

    #[test]
    fn bootstrap_stops_until_more_attempts_reached_the_rung() {
        let r = rule(Mode::Max, 2, 2);
        let d = decide(&r, at(1.0), &[0.5]);
        assert_eq!((d.cutoff, d.pruned), (None, true));
        assert!(!decide(&r, at(1.0), &[0.5, 0.2]).pruned);
    }
}
