//! What of the agent's environment reaches supervisors and jobs: nothing but a documented
//! pass-through list (and names the operator adds), never a `HEADROOM_*` variable, so that no
//! credential of headroom's (agent token, admin token, database URL) reaches user code
//! however the agent or `headroom up` was given it.

use std::collections::BTreeMap;
use std::ffi::OsString;

/// Passed to jobs from the agent's environment when set: what programs need to find their
/// tools, speak the user's language and place temporary files. `LC_*` too.
pub const PASS_THROUGH: &[&str] = &[
    "PATH",
    "LANG",
    "LANGUAGE",
    "TZ",
    "TERM",
    "TMPDIR",
    "LD_LIBRARY_PATH",
    "CUDA_HOME",
    "CUDA_PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
];

/// Variables of headroom's own that the supervisor process reads (none is a secret); jobs
/// never get them from the agent.
const SUPERVISOR_READS: &[&str] = &[
    crate::gpu::pidns::HOST_PROC_VAR,
    crate::outcomes::TEST_PAUSE_BEFORE_REPORT_VAR,
    "HEADROOM_LOG",
];

/// A name the operator asked to pass (`--pass-env`) that cannot be: headroom's own, or not a
/// variable name.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PassEnvError {
    #[error(
        "--pass-env `{0}`: HEADROOM_* variables are headroom's own (credentials among them) and \
         never reach jobs; put what a job needs in the spec's `env`"
    )]
    Reserved(String),
    #[error("--pass-env `{0}` is not a variable name (letters, digits and `_`, not first a digit)")]
    Invalid(String),
}

/// Checks the names an operator adds to the pass-through list.
pub fn check_extra(names: &[String]) -> Result<(), PassEnvError> {
    for name in names {
        let valid = !name.is_empty()
            && !name.starts_with(|c: char| c.is_ascii_digit())
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(PassEnvError::Invalid(name.clone()));
        }
        if reserved(name) {
            return Err(PassEnvError::Reserved(name.clone()));
        }
    }
    Ok(())
}

fn reserved(name: &str) -> bool {
    name.to_ascii_uppercase().starts_with("HEADROOM")
}

fn passes(name: &str, extra: &[String]) -> bool {
    !reserved(name)
        && (PASS_THROUGH.contains(&name)
            || name.starts_with("LC_")
            || extra.iter().any(|e| e == name))
}

/// The part of `vars` (an environment) that jobs start from.
pub fn for_jobs(
    vars: impl IntoIterator<Item = (OsString, OsString)>,
    extra: &[String],
) -> BTreeMap<String, String> {
    vars.into_iter()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .filter(|(k, _)| passes(k, extra))
        .collect()
}

/// The environment a supervisor process starts with: the jobs' pass-through part and the
/// few variables of headroom's that it reads itself.
pub fn for_supervisor(
    vars: impl IntoIterator<Item = (OsString, OsString)>,
) -> Vec<(OsString, OsString)> {
    vars.into_iter()
        .filter(|(k, _)| {
            k.to_str()
                .is_some_and(|k| SUPERVISOR_READS.contains(&k) || (!reserved(k) && passes(k, &[])))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        pairs
            .iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v)))
            .collect()
    }

    #[test]
    fn only_the_pass_through_list_reaches_jobs_and_never_a_headroom_variable() {
        let agent = env(&[
            ("PATH", "/usr/bin"),
            ("LC_ALL", "C.UTF-8"),
            ("HEADROOM_AGENT_TOKEN", "hr_x_secret"),
            ("HEADROOM_TOKEN", "t"),
            ("HEADROOM_ADMIN_TOKEN", "a"),
            ("HEADROOM_DATABASE_URL", "postgres://u:pw@db/h"),
            ("AWS_SECRET_ACCESS_KEY", "k"),
            ("WANDB_API_KEY", "w"),
        ]);
        let jobs = for_jobs(agent.clone(), &["WANDB_API_KEY".into()]);
        assert_eq!(
            jobs.keys().map(String::as_str).collect::<Vec<_>>(),
            ["LC_ALL", "PATH", "WANDB_API_KEY"]
        );
        let sup = for_supervisor(agent.into_iter().chain(env(&[("HEADROOM_LOG", "debug")])));
        let names: Vec<_> = sup.iter().filter_map(|(k, _)| k.to_str()).collect();
        assert_eq!(names, ["PATH", "LC_ALL", "HEADROOM_LOG"]);
    }

    #[test]
    fn headroom_names_and_non_names_cannot_be_passed() {
        assert_eq!(
            check_extra(&["headroom_agent_token".into()]),
            Err(PassEnvError::Reserved("headroom_agent_token".into()))
        );
        assert!(matches!(
            check_extra(&["A B".into()]),
            Err(PassEnvError::Invalid(_))
        ));
        assert!(matches!(
            check_extra(&["1X".into()]),
            Err(PassEnvError::Invalid(_))
        ));
        assert_eq!(
            check_extra(&["HF_HOME".into(), "WANDB_MODE".into()]),
            Ok(())
        );
    }
}
