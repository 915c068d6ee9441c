//! The fake GPUs' sizes as users write them (`4x24GiB`, `24GiB,12GiB`): parsed, checked,
//! and written back the same way (they travel so in a launch and in jobs' environment).

use std::fmt;
use std::str::FromStr;

use headroom_shared::MemSize;
use headroom_shared::size::SizeError;

/// More fake GPUs than any node has is a typo (`1000x24GiB`), not a wish.
const MAX_GPUS: usize = 256;

/// The simulated GPUs' sizes, as users write them: `4x24GiB`, `24GiB`, `24GiB,24GiB,12GiB`,
/// `2x24GiB,1x12GiB`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FakeGpuSpec {
    sizes: Vec<MemSize>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FakeSpecError {
    #[error("fake GPU list is empty: write e.g. `4x24GiB` or `24GiB,12GiB`")]
    Empty,
    #[error("fake GPU list `{spec}` has an empty entry (write e.g. `24GiB,12GiB`)")]
    EmptyPart { spec: String },
    #[error("`{part}`: `{count}` is not a GPU count (write e.g. `4x24GiB`)")]
    BadCount { part: String, count: String },
    #[error("`{part}`: {source}")]
    BadSize {
        part: String,
        #[source]
        source: SizeError,
    },
    #[error("`{part}`: a GPU needs some memory")]
    ZeroSize { part: String },
    #[error("fake GPU list `{spec}` has {count} GPUs; at most {MAX_GPUS}")]
    TooMany { spec: String, count: usize },
}

impl FakeGpuSpec {
    pub fn new(sizes: Vec<MemSize>) -> Result<Self, FakeSpecError> {
        if sizes.is_empty() {
            return Err(FakeSpecError::Empty);
        }
        if let Some(zero) = sizes.iter().find(|s| s.mib == 0) {
            return Err(FakeSpecError::ZeroSize {
                part: zero.to_string(),
            });
        }
        if sizes.len() > MAX_GPUS {
            return Err(FakeSpecError::TooMany {
                spec: format!("{} GPUs", sizes.len()),
                count: sizes.len(),
            });
        }
        Ok(Self { sizes })
    }

    /// Memory of each GPU, by index.
    pub fn sizes(&self) -> &[MemSize] {
        &self.sizes
    }

    pub fn gpu_count(&self) -> u32 {
        self.sizes.len() as u32
    }

    /// Total memory of GPU `index`, if there is one.
    pub fn total_mib(&self, index: u32) -> Option<u64> {
        self.sizes.get(index as usize).map(|s| s.mib)
    }
}

impl FromStr for FakeGpuSpec {
    type Err = FakeSpecError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.trim().is_empty() {
            return Err(FakeSpecError::Empty);
        }
        let mut sizes = Vec::new();
        for part in s.split(',').map(str::trim) {
            if part.is_empty() {
                return Err(FakeSpecError::EmptyPart {
                    spec: s.to_string(),
                });
            }
            let (count, size) = match part.split_once(['x', 'X']) {
                Some((count, size)) => {
                    let n = count
                        .trim()
                        .parse::<usize>()
                        .ok()
                        .filter(|&n| n > 0)
                        .ok_or_else(|| FakeSpecError::BadCount {
                            part: part.to_string(),
                            count: count.trim().to_string(),
                        })?;
                    (n, size)
                }
                None => (1, part),
            };
            let size = size
                .trim()
                .parse::<MemSize>()
                .map_err(|source| FakeSpecError::BadSize {
                    part: part.to_string(),
                    source,
                })?;
            if size.mib == 0 {
                return Err(FakeSpecError::ZeroSize {
                    part: part.to_string(),
                });
            }
            if sizes.len() + count > MAX_GPUS {
                return Err(FakeSpecError::TooMany {
                    spec: s.to_string(),
                    count: sizes.len().saturating_add(count),
                });
            }
            sizes.extend(std::iter::repeat_n(size, count));
        }
        Self::new(sizes)
    }
}

/// An exact size: `MemSize`'s own display rounds to a tenth of a GiB.
fn exact(size: MemSize) -> String {
    if size.mib.is_multiple_of(1024) {
        format!("{}GiB", size.mib / 1024)
    } else {
        format!("{}MiB", size.mib)
    }
}

// On the wire (the attempt supervisor's launch) as users write it.
impl serde::Serialize for FakeGpuSpec {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for FakeGpuSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse()
            .map_err(|e| serde::de::Error::custom(format!("fake GPUs `{text}`: {e}")))
    }
}

impl fmt::Display for FakeGpuSpec {
    /// Runs of equal sizes as `NxSIZE`, joined by commas; parses back to the same list.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for run in self.sizes.chunk_by(|a, b| a == b) {
            if !first {
                f.write_str(",")?;
            }
            first = false;
            match run.len() {
                1 => write!(f, "{}", exact(run[0]))?,
                n => write!(f, "{n}x{}", exact(run[0]))?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn spec(s: &str) -> FakeGpuSpec {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn mibs(s: &FakeGpuSpec) -> Vec<u64> {
        s.sizes().iter().map(|m| m.mib).collect()
    }

    #[test]
    fn parses_what_users_write() {
        assert_eq!(mibs(&spec("4x24GiB")), vec![24576; 4]);
        assert_eq!(mibs(&spec("24GiB")), vec![24576]);
        assert_eq!(mibs(&spec("24GiB,24GiB,12GiB")), vec![24576, 24576, 12288]);
        assert_eq!(mibs(&spec("2x24GiB,1x12GiB")), vec![24576, 24576, 12288]);
        assert_eq!(mibs(&spec(" 2 X 80GiB , 512MiB ")), vec![81920, 81920, 512]);
        assert_eq!(spec("2x24GiB,1x12GiB").to_string(), "2x24GiB,12GiB");
        assert_eq!(spec("24GiB,1536MiB,1536MiB").to_string(), "24GiB,2x1536MiB");
    }

    #[test]
    fn errors_name_the_bad_part() {
        let err = |s: &str| match s.parse::<FakeGpuSpec>() {
            Ok(v) => panic!("{s} parsed as {v}"),
            Err(e) => e,
        };
        assert_eq!(err(""), FakeSpecError::Empty);
        assert!(matches!(
            err("24GiB,,12GiB"),
            FakeSpecError::EmptyPart { .. }
        ));
        let e = err("24GiB,fourx24GiB");
        assert!(matches!(&e, FakeSpecError::BadCount { part, .. } if part == "fourx24GiB"));
        assert!(e.to_string().contains("`four`"), "{e}");
        assert!(matches!(err("0x24GiB"), FakeSpecError::BadCount { .. }));
        let e = err("4x24 gigs");
        assert!(e.to_string().starts_with("`4x24 gigs`"), "{e}");
        assert!(matches!(err("24"), FakeSpecError::BadSize { .. }));
        assert!(matches!(err("0MiB"), FakeSpecError::ZeroSize { .. }));
        assert!(matches!(
            err("1000x24GiB"),
            FakeSpecError::TooMany { count: 1000, .. }
        ));
    }

    proptest! {
        #[test]
        fn display_parses_back(sizes in proptest::collection::vec(
            prop_oneof![Just(512u64), Just(1536), Just(24576), Just(81920), 1u64..200_000],
            1..12,
        )) {
            let s = FakeGpuSpec::new(sizes.into_iter().map(MemSize::from_mib).collect())
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            let text = s.to_string();
            let back: FakeGpuSpec = text.parse().map_err(|e: FakeSpecError| TestCaseError::fail(format!("{text}: {e}")))?;
            prop_assert_eq!(back, s);
        }
    }
}
