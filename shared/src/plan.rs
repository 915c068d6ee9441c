//! Concurrency plans: slots per GPU index, written exactly as users write them (`"2,2,1"`).

use std::fmt;

use serde::{Deserialize, Serialize};

/// Most slots one GPU may have; more is almost surely a typo (`22` for `2,2`).
pub const MAX_SLOTS_PER_GPU: u32 = 64;

/// Slots per GPU, indexed like the node's GPUs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Plan(Vec<u32>);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlanError {
    #[error("the plan is empty: write slots per GPU, e.g. \"2,2,1\"")]
    Empty,
    #[error("entry {position} (GPU {gpu}) is empty")]
    EmptyEntry { position: usize, gpu: usize },
    #[error("entry {position} (GPU {gpu}) `{entry}` is not a whole number of slots")]
    NotAnInteger {
        position: usize,
        gpu: usize,
        entry: String,
    },
    #[error("entry {position} (GPU {gpu}) is negative: slots are 0 or more")]
    Negative { position: usize, gpu: usize },
    #[error("entry {position} (GPU {gpu}) has {slots} slots, more than {MAX_SLOTS_PER_GPU}")]
    TooMany {
        position: usize,
        gpu: usize,
        slots: u64,
    },
    #[error("whitespace is allowed only around commas (at character {column})")]
    Whitespace { column: usize },
    #[error("every entry is 0: the plan would run nothing")]
    AllZero,
    #[error("the plan has {entries} entries but the node has {gpus} GPUs: give one entry per GPU")]
    WrongLength { entries: usize, gpus: usize },
}

impl Plan {
    /// Parses a plan without knowing the node (shape checks only).
    pub fn parse(s: &str) -> Result<Self, PlanError> {
        if s.trim().is_empty() {
            return Err(PlanError::Empty);
        }
        check_whitespace(s)?;
        let mut slots = Vec::new();
        for (i, raw) in s.split(',').enumerate() {
            let (position, gpu) = (i + 1, i);
            let entry = raw.trim();
            if entry.is_empty() {
                return Err(PlanError::EmptyEntry { position, gpu });
            }
            if let Some(rest) = entry.strip_prefix('-')
                && !rest.is_empty()
                && rest.chars().all(|c| c.is_ascii_digit())
            {
                return Err(PlanError::Negative { position, gpu });
            }
            if !entry.chars().all(|c| c.is_ascii_digit()) {
                return Err(PlanError::NotAnInteger {
                    position,
                    gpu,
                    entry: entry.to_string(),
                });
            }
            let n: u64 = entry.parse().unwrap_or(u64::MAX);
            if n > u64::from(MAX_SLOTS_PER_GPU) {
                return Err(PlanError::TooMany {
                    position,
                    gpu,
                    slots: n,
                });
            }
            slots.push(n as u32);
        }
        if slots.iter().all(|&n| n == 0) {
            return Err(PlanError::AllZero);
        }
        Ok(Self(slots))
    }

    /// Parses a plan for a node with `gpus` GPUs.
    pub fn parse_for(s: &str, gpus: usize) -> Result<Self, PlanError> {
        let plan = Self::parse(s)?;
        plan.check_gpus(gpus)?;
        Ok(plan)
    }

    pub fn check_gpus(&self, gpus: usize) -> Result<(), PlanError> {
        if self.0.len() != gpus {
            return Err(PlanError::WrongLength {
                entries: self.0.len(),
                gpus,
            });
        }
        Ok(())
    }

    /// The default: one slot per GPU.
    pub fn one_per_gpu(gpus: usize) -> Self {
        Self(vec![1; gpus])
    }

    pub fn slots(&self, gpu: usize) -> u32 {
        self.0.get(gpu).copied().unwrap_or(0)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn total_slots(&self) -> u32 {
        self.0.iter().sum()
    }
}

/// Spaces next to a comma are fine; a space anywhere else (`"2 2"`, `" 2,2"`), or any other
/// white space (a tab), is noise that more likely hides a typo than intent. As
/// `api::bounds::PLAN` says it in the API's document.
fn check_whitespace(s: &str) -> Result<(), PlanError> {
    let chars: Vec<char> = s.chars().collect();
    for (i, c) in chars.iter().enumerate() {
        if !c.is_whitespace() {
            continue;
        }
        if *c != ' ' {
            return Err(PlanError::Whitespace { column: i + 1 });
        }
        let before = chars[..i].iter().rev().find(|c| !c.is_whitespace());
        let after = chars[i + 1..].iter().find(|c| !c.is_whitespace());
        if before != Some(&',') && after != Some(&',') {
            return Err(PlanError::Whitespace { column: i + 1 });
        }
    }
    Ok(())
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(u32::to_string).collect();
        f.write_str(&parts.join(","))
    }
}

impl std::str::FromStr for Plan {
    type Err = PlanError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl TryFrom<String> for Plan {
    type Error = PlanError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::parse(&s)
    }
}

impl From<Plan> for String {
    fn from(p: Plan) -> String {
        p.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_the_seeds_plans() {
        let p = Plan::parse_for("2,2,2,2,1,1,1", 7).expect("valid plan");
        assert_eq!(p.slots(0), 2);
        assert_eq!(p.slots(6), 1);
        assert_eq!(p.total_slots(), 11);
        assert_eq!(p.to_string(), "2,2,2,2,1,1,1");
        assert_eq!(
            Plan::parse("2 , 2, 1").map(|p| p.to_string()),
            Ok("2,2,1".into())
        );
        assert_eq!(Plan::parse("0,1").map(|p| p.slots(0)), Ok(0));
    }

    #[test]
    fn refusals_name_the_position() {
        assert_eq!(Plan::parse(""), Err(PlanError::Empty));
        assert_eq!(Plan::parse("   "), Err(PlanError::Empty));
        assert_eq!(
            Plan::parse("2,x,1"),
            Err(PlanError::NotAnInteger {
                position: 2,
                gpu: 1,
                entry: "x".into()
            })
        );
        assert_eq!(
            Plan::parse("2,1.5"),
            Err(PlanError::NotAnInteger {
                position: 2,
                gpu: 1,
                entry: "1.5".into()
            })
        );
        assert_eq!(
            Plan::parse("2,2,-1"),
            Err(PlanError::Negative {
                position: 3,
                gpu: 2
            })
        );
        assert_eq!(Plan::parse("0,0,0"), Err(PlanError::AllZero));
        assert_eq!(
            Plan::parse("2,,1"),
            Err(PlanError::EmptyEntry {
                position: 2,
                gpu: 1
            })
        );
        assert_eq!(
            Plan::parse_for("2,2", 3),
            Err(PlanError::WrongLength {
                entries: 2,
                gpus: 3
            })
        );
        assert_eq!(
            Plan::parse_for("1,1,1,1", 3),
            Err(PlanError::WrongLength {
                entries: 4,
                gpus: 3
            })
        );
        assert!(matches!(
            Plan::parse("2 2"),
            Err(PlanError::Whitespace { .. })
        ));
        assert!(matches!(
            Plan::parse(" 2,2"),
            Err(PlanError::Whitespace { .. })
        ));
        assert!(matches!(
            Plan::parse("2,2\n"),
            Err(PlanError::Whitespace { .. })
        ));
        assert!(matches!(Plan::parse("99"), Err(PlanError::TooMany { .. })));
        assert!(matches!(
            Plan::parse("99999999999999999999999"),
            Err(PlanError::TooMany { .. })
        ));
    }

    proptest! {
        #[test]
        fn written_plans_round_trip(slots in prop::collection::vec(0u32..=MAX_SLOTS_PER_GPU, 1..16),
                                    spaces in prop::collection::vec((0usize..3, 0usize..3), 16)) {
            prop_assume!(slots.iter().any(|&n| n > 0));
            // Users may put spaces on either side of a comma.
            let mut text = String::new();
            for (i, n) in slots.iter().enumerate() {
                if i > 0 {
                    let (b, a) = spaces[i];
                    text.push_str(&" ".repeat(b));
                    text.push(',');
                    text.push_str(&" ".repeat(a));
                }
                text.push_str(&n.to_string());
            }
            let plan = Plan::parse_for(&text, slots.len()).map_err(|e| TestCaseError::fail(e.to_string()))?;
            for (i, n) in slots.iter().enumerate() {
                prop_assert_eq!(plan.slots(i), *n);
            }
            prop_assert_eq!(Plan::parse(&plan.to_string()), Ok(plan));
        }

        #[test]
        fn never_panics_and_accepted_plans_are_sane(input in "[0-9, \\-a.]{0,24}") {
            if let Ok(plan) = Plan::parse(&input) {
                prop_assert!(plan.total_slots() > 0);
                prop_assert!(!input.starts_with(' ') && !input.ends_with(' '));
            }
        }
    }
}
