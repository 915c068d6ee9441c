//! Memory sizes as users write them (`3.5GiB`, `500MiB`, `24GiB`), kept as whole MiB.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

const MIB: u64 = 1024 * 1024;

/// A memory amount in MiB (NVML and the fake backend both count in MiB).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct MemSize {
    pub mib: u64,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("`{input}` is not a memory size (write e.g. `3.5GiB`, `500MiB`, `24GB`)")]
pub struct SizeError {
    pub input: String,
}

impl MemSize {
    pub const fn from_mib(mib: u64) -> Self {
        Self { mib }
    }

    pub const fn from_gib(gib: u64) -> Self {
        Self { mib: gib * 1024 }
    }
}

impl FromStr for MemSize {
    type Err = SizeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || SizeError {
            input: s.to_string(),
        };
        let t = s.trim();
        // A bare number would be ambiguous (bytes? MiB?): demand a unit.
        if t.is_empty() || !t.chars().any(|c| c.is_ascii_alphabetic()) || t.starts_with('-') {
            return Err(err());
        }
        let bytes = t.parse::<bytesize::ByteSize>().map_err(|_| err())?.as_u64();
        // Round up: an estimate must never shrink below what the user wrote.
        Ok(Self {
            mib: bytes.div_ceil(MIB),
        })
    }
}

impl fmt::Display for MemSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.mib >= 1024 && self.mib.is_multiple_of(1024) {
            write!(f, "{}GiB", self.mib / 1024)
        } else if self.mib >= 1024 {
            write!(f, "{:.1}GiB", self.mib as f64 / 1024.0)
        } else {
            write!(f, "{}MiB", self.mib)
        }
    }
}

impl Serialize for MemSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for MemSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// In the OpenAPI document: a string with a unit, as users write it.
#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for MemSize {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .description(Some(
                "A memory size with a unit: `3.5GiB`, `500MiB`, `24GB` (a bare number is refused)",
            ))
            .examples([serde_json::json!("3.5GiB")])
            .into()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for MemSize {}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_what_users_write() {
        assert_eq!("3.5GiB".parse(), Ok(MemSize::from_mib(3584)));
        assert_eq!("24GiB".parse(), Ok(MemSize::from_gib(24)));
        assert_eq!("500MiB".parse(), Ok(MemSize::from_mib(500)));
        assert_eq!("500 MiB".parse(), Ok(MemSize::from_mib(500)));
        assert_eq!("1GB".parse(), Ok(MemSize::from_mib(954)));
    }

    #[test]
    fn refuses_what_is_not_a_size() {
        for bad in ["", "abc", "12", "-1GiB", "GiB", "3.5 parsecs", "1.2.3GiB"] {
            assert!(bad.parse::<MemSize>().is_err(), "{bad:?} should be refused");
        }
    }

    proptest! {
        #[test]
        fn display_parses_back(mib in 0u64..10_000_000) {
            let s = MemSize::from_mib(mib);
            let back: MemSize = s.to_string().parse().map_err(|e: SizeError| TestCaseError::fail(e.to_string()))?;
            // One decimal of GiB loses at most 0.05 GiB, rounded up.
            prop_assert!(back.mib.abs_diff(mib) <= 52, "{} -> {} -> {}", mib, s, back.mib);
        }

        #[test]
        fn never_panics(input in ".{0,20}") {
            let _ = input.parse::<MemSize>();
        }
    }
}
