//! Where a submitted experiment's jobs run from: what the spec and the submitting client say
//! of the working directory, the code and the Python environment, made one
//! [`Source`], or the field at fault. Pure: whether a named bundle is kept is the
//! handler's to ask the store.

use headroom_shared::api::SubmitRequest;
use headroom_shared::api::source::{self, EnvironmentFrom, Source};
use headroom_shared::spec::{
    CodeMode, EnvironmentKeyword, EnvironmentSpec, ExperimentSpec, SpecError,
};

/// The source of `spec` submitted with `req`.
pub fn resolve(spec: &ExperimentSpec, req: &SubmitRequest) -> Result<Source, SpecError> {
    source::check(
        req.workdir.as_deref(),
        req.git.as_ref(),
        req.snapshot.as_ref(),
        req.environment.as_ref(),
    )
    .map_err(|(field, message)| SpecError::new(field, message))?;
    let workdir = match (&req.workdir, &spec.workdir) {
        (Some(w), _) => Some(w.clone()),
        (None, Some(w)) if w.starts_with('/') => Some(w.clone()),
        (None, Some(w)) => {
            return Err(SpecError::new(
                "workdir",
                format!(
                    "`{w}` is relative to the spec file, which only a client can resolve: \
                     submit with the CLI or the Python client, or send an absolute `workdir`"
                ),
            ));
        }
        (None, None) => None,
    };
    match (spec.code, &req.snapshot) {
        // A dry run stores nothing and runs nothing: it needs no bundle.
        (CodeMode::Snapshot, None) if req.dry_run => {}
        (CodeMode::Snapshot, None) => {
            return Err(SpecError::new(
                "snapshot",
                "`code: snapshot` needs the bundle of the code: the CLI and the Python client \
                 make and upload it; over REST, `PUT /v1/bundles/{hash}` then name it in \
                 `snapshot.hash`",
            ));
        }
        (CodeMode::Checkout, Some(_)) => {
            return Err(SpecError::new(
                "snapshot",
                "a bundle is given but the spec says `code: checkout`: set `code: snapshot`",
            ));
        }
        _ => {}
    }
    if spec.code == CodeMode::Snapshot && workdir.is_none() {
        return Err(SpecError::new(
            "workdir",
            "`code: snapshot` needs the directory the bundle was taken from",
        ));
    }
    let (environment, environment_from) = match &spec.environment {
        Some(EnvironmentSpec::Keyword(EnvironmentKeyword::None)) => (None, None),
        Some(EnvironmentSpec::Given(given)) => {
            let env = req.environment.clone().unwrap_or_else(|| given.clone());
            if std::mem::discriminant(&env) != std::mem::discriminant(given) {
                return Err(SpecError::new(
                    "environment",
                    format!("the spec says {given} but the request says {env}"),
                ));
            }
            env.check()
                .map_err(|(field, message)| SpecError::new(field, message))?;
            (Some(env), Some(EnvironmentFrom::Spec))
        }
        Some(EnvironmentSpec::Keyword(EnvironmentKeyword::Inherit)) | None => {
            let from = req.environment.as_ref().map(|_| EnvironmentFrom::Submitter);
            (req.environment.clone(), from)
        }
    };
    Ok(Source {
        workdir,
        git: req.git.clone(),
        snapshot: req.snapshot.clone(),
        environment,
        environment_from,
    })
}

#[cfg(test)]
mod tests {
    use headroom_shared::api::source::{Environment, Snapshot};
    use serde_json::json;

    use super::*;

    fn spec(extra: serde_json::Value) -> ExperimentSpec {
        let mut v = json!({"name": "e", "command": ["python3", "train.py"]});
        if let (Some(o), Some(x)) = (v.as_object_mut(), extra.as_object()) {
            o.extend(x.clone());
        }
        ExperimentSpec::from_value(v).expect("spec")
    }

    fn field(r: Result<Source, SpecError>) -> String {
        r.expect_err("refused").field
    }

    #[test]
    fn the_request_s_workdir_wins_and_a_relative_one_is_refused() {
        let req = SubmitRequest {
            workdir: Some("/home/a/proj".into()),
            ..Default::default()
        };
        let s = resolve(&spec(json!({"workdir": "/elsewhere"})), &req).expect("ok");
        assert_eq!(s.workdir.as_deref(), Some("/home/a/proj"));
        let s = resolve(
            &spec(json!({"workdir": "/elsewhere"})),
            &SubmitRequest::default(),
        );
        assert_eq!(s.expect("ok").workdir.as_deref(), Some("/elsewhere"));
        let r = resolve(&spec(json!({"workdir": "sub"})), &SubmitRequest::default());
        assert_eq!(field(r), "workdir");
        let req = SubmitRequest {
            workdir: Some("rel".into()),
            ..Default::default()
        };
        assert_eq!(field(resolve(&spec(json!({})), &req)), "workdir");
    }

    #[test]
    fn a_snapshot_needs_its_bundle_and_the_spec_s_word() {
        let r = resolve(
            &spec(json!({"code": "snapshot"})),
            &SubmitRequest::default(),
        );
        assert_eq!(field(r), "snapshot");
        let req = SubmitRequest {
            workdir: Some("/p".into()),
            snapshot: Some(Snapshot {
                hash: "ab".repeat(32),
                subdir: String::new(),
                bytes: 0,
            }),
            ..Default::default()
        };
        assert_eq!(field(resolve(&spec(json!({})), &req)), "snapshot");
        let s = resolve(&spec(json!({"code": "snapshot"})), &req).expect("ok");
        assert!(s.snapshot.is_some());
    }

    #[test]
    fn the_environment_is_the_spec_s_or_else_the_submitter_s() {
        let shell = SubmitRequest {
            environment: Some(Environment::Venv("/p/.venv".into())),
            ..Default::default()
        };
        let s = resolve(&spec(json!({})), &shell).expect("ok");
        assert_eq!(s.environment_from, Some(EnvironmentFrom::Submitter));
        let s = resolve(&spec(json!({"environment": "none"})), &shell).expect("ok");
        assert_eq!(s.environment, None);
        let s = resolve(
            &spec(json!({"environment": {"conda": "torch"}})),
            &SubmitRequest::default(),
        )
        .expect("ok");
        assert_eq!(s.environment, Some(Environment::Conda("torch".into())));
        assert_eq!(s.environment_from, Some(EnvironmentFrom::Spec));
        // A relative venv only a client can resolve.
        let r = resolve(
            &spec(json!({"environment": {"venv": ".venv"}})),
            &SubmitRequest::default(),
        );
        assert_eq!(field(r), "environment.venv");
        let r = resolve(&spec(json!({"environment": {"conda": "torch"}})), &shell);
        assert_eq!(field(r), "environment");
    }
}
