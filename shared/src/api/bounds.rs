//! What the API accepts in a field: the patterns and numeric ranges its handlers validate
//! with, declared once here. The coordinator checks input with these rules and writes the
//! same rules into its OpenAPI document (`APPLIED`), so the document and the server cannot
//! disagree about a field. Patterns use ASCII classes only: they read the same in Rust's
//! `regex` and in the ECMA-262 dialect JSON Schema validators use.

use std::sync::OnceLock;

use regex::Regex;

/// A text field's rule: the whole value matches `pattern`.
pub struct TextRule {
    pub pattern: &'static str,
    /// What the value must be, in words (for error messages).
    pub says: &'static str,
    compiled: OnceLock<Option<Regex>>,
}

impl TextRule {
    const fn new(pattern: &'static str, says: &'static str) -> Self {
        Self {
            pattern,
            says,
            compiled: OnceLock::new(),
        }
    }

    /// Whether `value` is accepted (a pattern that does not compile accepts nothing: a test
    /// below compiles every one).
    pub fn accepts(&self, value: &str) -> bool {
        self.compiled
            .get_or_init(|| Regex::new(self.pattern).ok())
            .as_ref()
            .is_some_and(|r| r.is_match(value))
    }

    /// `Ok`, or the message naming the value and what it must be.
    pub fn check(&self, value: &str) -> Result<(), String> {
        if self.accepts(value) {
            Ok(())
        } else {
            Err(format!("`{value}` {}", self.says))
        }
    }
}

/// A number field's rule: `min..=max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Range {
    pub min: u64,
    pub max: u64,
}

impl Range {
    /// `Ok`, or the message naming the value and the bound it crosses.
    pub fn check(&self, value: u64) -> Result<(), String> {
        if value < self.min {
            Err(format!("{value}: must be at least {}", self.min))
        } else if value > self.max {
            Err(format!("{value}: must be at most {}", self.max))
        } else {
            Ok(())
        }
    }
}

/// A token holder's name (`alice`, `gpu-node-3`).
pub static TOKEN_NAME: TextRule = TextRule::new(
    "^[A-Za-z0-9_.@-]{1,64}$",
    "must be 1 to 64 letters, digits, `_`, `-`, `.` or `@`",
);

/// The Unix user a person's jobs run as (whether it exists is the nodes' to say).
pub static UNIX_USER: TextRule = TextRule::new(
    "^[A-Za-z0-9_.][A-Za-z0-9_.-]{0,31}$",
    "is not a Unix user name (1 to 32 letters, digits, `_`, `.`, `-`, not starting with `-`)",
);

/// The start of a job id, as git takes a short id.
pub static ID_PREFIX: TextRule = TextRule::new(
    "^[0-9a-f-]{1,36}$",
    "is not the start of a job id (1 to 36 of 0-9, a-f and -)",
);

/// A concurrency plan: slots per GPU (0 to `plan::MAX_SLOTS_PER_GPU`), comma-separated,
/// spaces allowed around the commas only.
pub static PLAN: TextRule = TextRule::new(
    "^0*([0-9]|[1-5][0-9]|6[0-4])( *, *0*([0-9]|[1-5][0-9]|6[0-4]))*$",
    "is not a plan: slots per GPU (0 to 64), comma-separated, e.g. \"2,2,1\"",
);

/// A SHA-256 digest in lowercase hex (a code bundle, an uncommitted diff).
pub static SHA256: TextRule = TextRule::new("^[0-9a-f]{64}$", "is not a SHA-256 in lowercase hex");

/// A git commit id (SHA-1 or SHA-256, lowercase hex).
pub static GIT_COMMIT: TextRule = TextRule::new(
    "^([0-9a-f]{40}|[0-9a-f]{64})$",
    "is not a git commit id (40 or 64 lowercase hex digits)",
);

/// A conda environment's name (its prefix is an absolute path instead).
pub static CONDA_NAME: TextRule = TextRule::new(
    "^[A-Za-z0-9_.+-]{1,128}$",
    "is not a conda environment's name (letters, digits, `_`, `.`, `+`, `-`) nor an \
     absolute prefix",
);

/// Samples per GPU one telemetry answer carries (`limit`).
pub const SAMPLES: Range = Range {
    min: 1,
    max: 100_000,
};

/// Jobs one listing carries (`limit`).
pub const JOBS: Range = Range {
    min: 1,
    max: 1_000_000,
};

/// Rows one JSON export page carries (`limit`).
pub const EXPORT_ROWS: Range = Range {
    min: 1,
    max: 10_000,
};

/// A count a spec gives (`mutations`, `runs_per_config`).
pub const COUNT: Range = Range {
    min: 1,
    max: u32::MAX as u64,
};

/// How long a long-poll may be asked to hold (ms): the server holds at most its own
/// `--long-poll` within this.
pub const WAIT_MS: Range = Range {
    min: 0,
    max: 3_600_000,
};

/// A rule of a field.
#[derive(Clone, Copy)]
pub enum Rule {
    Text(&'static TextRule),
    Number(Range),
    /// A list whose first item is a non-empty text (a command's program; its arguments may
    /// be empty).
    FirstItemNotEmpty,
}

/// Where a rule applies in the document: a component schema's property, or a query
/// parameter of every operation that has one of that name in that query type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Site {
    /// `components.schemas[.0].properties[.1]`.
    Property(&'static str, &'static str),
    /// A query parameter `.1` of the operation `.0` (its `operationId`).
    Query(&'static str, &'static str),
    /// An operation itself (its `operationId`): where cross-field rules are listed.
    Operation(&'static str),
}

/// Every rule with the fields it governs: the document is patched from this table, and
/// each handler named in a comment checks its field with the same rule.
pub const APPLIED: &[(Site, Rule)] = &[
    // tokens::create, auth::check_name
    (
        Site::Property("CreateTokenRequest", "name"),
        Rule::Text(&TOKEN_NAME),
    ),
    // tokens::put_user, auth::check_unix_user
    (
        Site::Property("PutUserRequest", "unix_user"),
        Rule::Text(&UNIX_USER),
    ),
    // plan::Plan::parse (the store parses what nodes::set_plan is given)
    (Site::Property("SetPlanRequest", "plan"), Rule::Text(&PLAN)),
    // jobs::list
    (Site::Query("listJobs", "id_prefix"), Rule::Text(&ID_PREFIX)),
    (Site::Query("listJobs", "limit"), Rule::Number(JOBS)),
    // telemetry::gpu, telemetry::attempt
    (Site::Query("gpuTelemetry", "limit"), Rule::Number(SAMPLES)),
    (
        Site::Query("attemptTelemetry", "limit"),
        Rule::Number(SAMPLES),
    ),
    // experiments::export
    (
        Site::Query("exportAttempts", "limit"),
        Rule::Number(EXPORT_ROWS),
    ),
    // experiments::progress, jobs::read_log, agents::claim
    (Site::Query("progress", "timeout_ms"), Rule::Number(WAIT_MS)),
    (Site::Query("readLog", "wait_ms"), Rule::Number(WAIT_MS)),
    (
        Site::Property("ClaimRequest", "wait_ms"),
        Rule::Number(WAIT_MS),
    ),
    // experiments::submit, spec::validate
    (
        Site::Property("ExperimentSpec", "command"),
        Rule::FirstItemNotEmpty,
    ),
    (
        Site::Property("ExperimentSpec", "mutations"),
        Rule::Number(COUNT),
    ),
    (
        Site::Property("ExperimentSpec", "runs_per_config"),
        Rule::Number(COUNT),
    ),
    // experiments::submit, source::check
    (Site::Property("Snapshot", "hash"), Rule::Text(&SHA256)),
    (
        Site::Property("GitState", "commit"),
        Rule::Text(&GIT_COMMIT),
    ),
    (Site::Property("GitState", "diff_hash"), Rule::Text(&SHA256)),
];

/// Rules that tie fields together, which a schema of each field cannot state: the operations
/// that check them answer 422 naming the field, and the document lists them on the
/// operation (`x-cross-field-rules`).
pub const CROSS_FIELD: &[(&str, &[&str])] = &[
    (
        "submitExperiment",
        &[
            "every `{placeholder}` of `command` and `env` names a parameter (a grid or \
             mutate axis, or a built-in), and each parameter is named once",
            "`mutations` above 1 needs `mutate` axes",
            "a job fits the largest GPU and asks for no more GPUs than a node has",
            "`workdir` is absolute; a spec's relative `workdir` needs the request's",
            "`code: snapshot` needs `snapshot` naming a bundle kept here (`PUT \
             /v1/bundles/{hash}`), and `snapshot` needs `code: snapshot`",
            "a spec's `environment` and the request's are of one kind (venv or conda)",
        ],
    ),
    (
        "createToken",
        &["`nodes` is given for role `join` only, and required there"],
    ),
    ("putUser", &["`unix_user` `root` needs `allow_root`"]),
    ("gpuTelemetry", &["`since` is not after `until`"]),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pattern_compiles_and_says_what_it_takes() {
        for (site, rule) in APPLIED {
            if let Rule::Text(t) = rule {
                assert!(Regex::new(t.pattern).is_ok(), "{site:?}");
            }
        }
        assert!(TOKEN_NAME.accepts("gpu-node-3@lab.org"));
        assert!(!TOKEN_NAME.accepts(""));
        assert!(!TOKEN_NAME.accepts(&"a".repeat(65)));
        assert!(UNIX_USER.accepts("alice") && !UNIX_USER.accepts("-rf") && !UNIX_USER.accepts(""));
        assert!(ID_PREFIX.accepts("0193ab7c") && !ID_PREFIX.accepts("XYZ"));
        for ok in ["2,2,1", "1", "0,64", "2 , 3", "02,1"] {
            assert!(PLAN.accepts(ok), "{ok}");
        }
        for bad in ["", "65", "2,,1", " 2", "2 ", "2\t,1", "-1", "2,x", "1 2"] {
            assert!(!PLAN.accepts(bad), "{bad}");
        }
    }

    /// The plan rule and the plan parser agree on what they take (the parser says why).
    #[test]
    fn the_plan_rule_accepts_what_the_parser_parses() {
        for text in [
            "2,2,1", "1", "0,64", "2 , 3", "02,1", "65", "2,,1", " 2", "2\t,1", "-1", "x",
        ] {
            let parsed = crate::plan::Plan::parse(text).is_ok();
            assert_eq!(PLAN.accepts(text), parsed, "{text:?}");
        }
    }

    #[test]
    fn ranges_name_the_value_and_the_bounds() {
        assert!(SAMPLES.check(1).is_ok() && SAMPLES.check(100_000).is_ok());
        assert_eq!(SAMPLES.check(0).expect_err("0"), "0: must be at least 1");
        assert_eq!(
            SAMPLES.check(100_001).expect_err("over"),
            "100001: must be at most 100000"
        );
        assert!(WAIT_MS.check(3_600_001).is_err());
    }
}
