//! Typed identifiers: a `JobId` can never be passed where an `AttemptId` is expected.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

macro_rules! typed_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
        #[serde(transparent)]
        pub struct $name(pub Uuid);

        impl $name {
            /// A fresh id; v7 so ids sort by creation time.
            pub fn new() -> Self {
                Self(Uuid::now_v7())
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }

        impl FromStr for $name {
            type Err = uuid::Error;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Uuid::parse_str(s).map(Self)
            }
        }
    };
}

typed_id!(
    /// One expanded run of an experiment.
    JobId
);
typed_id!(
    /// One execution of a job; every retry is a new attempt.
    AttemptId
);
typed_id!(
    /// A submitted spec and the jobs it expanded into.
    ExperimentId
);
typed_id!(
    /// Experiments submitted together from one study spec (`experiments:`).
    StudyId
);
typed_id!(
    /// One incarnation of an agent: a restarted agent registers under a new id.
    AgentId
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_through_strings_and_json() {
        let id = JobId::new();
        assert_eq!(id.to_string().parse::<JobId>().ok(), Some(id));
        let json = serde_json::to_string(&id).ok();
        assert_eq!(json, Some(format!("\"{id}\"")));
    }
}
