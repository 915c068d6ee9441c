//! Studies: one spec file whose `experiments:` list holds variants (each with its own
//! command, axes and resources) over shared defaults at the top, and the dependencies between
//! them (`after:`). Each variant becomes an experiment of its own, named `STUDY.VARIANT`.
//!
//! Merging: a variant's key replaces the default of that name; where both are mappings
//! (`grid`, `mutate`, `env`, `resources`, `retry`, `metrics`, ...), the variant's entries
//! are added to the default's, each replacing the entry of its name whole, and an entry set
//! to `null` removes the default's.
//!
//! Queueing: a study's variants are queued by their expected run lengths, longest first
//! ([`queue_order`]).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::field::SpecError;
use crate::spec::{ExperimentSpec, validate_name};

/// The order a study's variants are queued in, from each one's expected run length: those
/// with one longest first, then those without; ties keep the file's order. A queue that
/// starts the longest runs last ends when they do: on the seeds' 160-run matrix, 1710 s in
/// the bench's order against 1440 s longest first (`headroom-bench-simulate`).
pub fn queue_order(expected: &[Option<u64>]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..expected.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(expected[i]));
    order
}

/// The key that makes a spec a study.
pub const VARIANTS_KEY: &str = "experiments";
/// Most variants one study holds.
pub const MAX_VARIANTS: usize = 256;

/// A study spec, merged and checked: its variants in the file's order.
#[derive(Clone, Debug, PartialEq)]
pub struct StudySpec {
    pub name: String,
    /// The top's `seed`: the study's, and each variant's unless it sets its own.
    pub seed: Option<u64>,
    pub variants: Vec<Variant>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Variant {
    /// Its name in the study (`train`); `after` names variants by it.
    pub name: String,
    /// Its spec, the defaults merged in, named `STUDY.VARIANT`.
    pub spec: ExperimentSpec,
    pub after: Vec<After>,
    /// Its position in `experiments` and the keys it set itself, to name a refused field
    /// where it was written.
    pub position: usize,
    pub set: BTreeSet<String>,
}

impl Variant {
    /// A refusal of this variant's merged spec: at `experiments[i].FIELD` where the variant
    /// set the field, else at the default's field, naming the variant.
    pub fn refusal(&self, e: SpecError) -> SpecError {
        in_variant(e, self.position, &self.name, &self.set)
    }
}

/// `after: [{experiment: train, when: succeeded, match: [model, lr]}]`: a job of this
/// variant starts once every job of `experiment` with the same values of `match` has ended
/// as `when` asks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct After {
    /// The variant waited for (its name in the study).
    pub experiment: String,
    #[serde(default)]
    pub when: AfterWhen,
    /// Parameters whose values pair a job with the jobs it waits for; none: it waits for
    /// every job of `experiment`.
    #[serde(default, rename = "match", skip_serializing_if = "Vec::is_empty")]
    pub matching: Vec<String>,
    /// What a job does when a job it waits for ends otherwise than `when` asks: `cancel`
    /// (default) or `wait` (it stays queued until that job is retried and succeeds).
    #[serde(default)]
    pub on_failure: OnDependencyFailure,
}

/// `after[].when`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum AfterWhen {
    /// The jobs waited for succeeded.
    #[default]
    Succeeded,
    /// The jobs waited for ended, whatever their end.
    Ended,
}

/// `after[].on_failure`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum OnDependencyFailure {
    #[default]
    Cancel,
    Wait,
}

impl AfterWhen {
    pub fn as_str(self) -> &'static str {
        match self {
            AfterWhen::Succeeded => "succeeded",
            AfterWhen::Ended => "ended",
        }
    }
}

impl OnDependencyFailure {
    pub fn as_str(self) -> &'static str {
        match self {
            OnDependencyFailure::Cancel => "cancel",
            OnDependencyFailure::Wait => "wait",
        }
    }
}

impl std::str::FromStr for AfterWhen {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [AfterWhen::Succeeded, AfterWhen::Ended]
            .into_iter()
            .find(|w| w.as_str() == s)
            .ok_or_else(|| format!("unknown `when` `{s}`"))
    }
}

impl std::str::FromStr for OnDependencyFailure {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [OnDependencyFailure::Cancel, OnDependencyFailure::Wait]
            .into_iter()
            .find(|w| w.as_str() == s)
            .ok_or_else(|| format!("unknown `on_failure` `{s}`"))
    }
}

/// A study's defaults: its top level less `name` and `experiments`.
pub fn defaults(top: &Map<String, Value>) -> Map<String, Value> {
    let mut defaults = top.clone();
    defaults.remove("name");
    defaults.remove(VARIANTS_KEY);
    defaults
}

/// A variant's spec: the defaults (the study's top level less `name` and `experiments`) with
/// the variant's keys (less `name` and `after`) merged over them.
pub fn merged(defaults: &Map<String, Value>, variant: &Map<String, Value>) -> Map<String, Value> {
    let mut out = defaults.clone();
    for (k, v) in variant {
        match (out.get_mut(k), v) {
            (Some(Value::Object(base)), Value::Object(over)) => {
                for (ek, ev) in over {
                    if ev.is_null() {
                        base.remove(ek);
                    } else {
                        base.insert(ek.clone(), ev.clone());
                    }
                }
            }
            (_, Value::Null) => {
                out.remove(k);
            }
            _ => {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    out
}

/// The study `spec` describes, or `None` where it is a plain experiment spec. Every refusal
/// names its field (`experiments[2].name`, `experiments[1].after[0].match`).
pub fn parse(spec: &Value) -> Result<Option<StudySpec>, SpecError> {
    let Some(list) = spec.get(VARIANTS_KEY) else {
        return Ok(None);
    };
    let Some(top) = spec.as_object() else {
        return Err(SpecError::new("spec", "must be a mapping"));
    };
    let name = match top.get("name") {
        Some(Value::String(n)) => n.clone(),
        _ => {
            return Err(SpecError::new(
                "name",
                "a study needs a name (its experiments are named STUDY.VARIANT)",
            ));
        }
    };
    validate_name(&name)?;
    if top.contains_key("after") {
        return Err(SpecError::new(
            "after",
            "belongs to a variant of `experiments`, naming another variant",
        ));
    }
    let defaults = defaults(top);
    check_defaults(&defaults)?;
    let Some(list) = list.as_array().filter(|l| !l.is_empty()) else {
        return Err(SpecError::new(
            VARIANTS_KEY,
            "must be a list of at least one variant, each a mapping with its `name`",
        ));
    };
    if list.len() > MAX_VARIANTS {
        return Err(SpecError::new(
            VARIANTS_KEY,
            format!("holds {} variants; at most {MAX_VARIANTS}", list.len()),
        ));
    }
    let mut variants = Vec::with_capacity(list.len());
    let mut seen = BTreeSet::new();
    for (i, v) in list.iter().enumerate() {
        let at = |field: &str| format!("{VARIANTS_KEY}[{i}].{field}");
        let Some(v) = v.as_object() else {
            return Err(SpecError::new(
                format!("{VARIANTS_KEY}[{i}]"),
                "must be a mapping with at least `name`",
            ));
        };
        let vname = match v.get("name") {
            Some(Value::String(n)) => n.clone(),
            _ => return Err(SpecError::new(at("name"), "every variant needs a name")),
        };
        validate_name(&vname).map_err(|e| SpecError::new(at("name"), e.message))?;
        if !seen.insert(vname.clone()) {
            return Err(SpecError::new(
                at("name"),
                format!("`{vname}` names two variants; each needs a name of its own"),
            ));
        }
        let after: Vec<After> = match v.get("after") {
            None | Some(Value::Null) => vec![],
            Some(a) => serde_path_to_error::deserialize(a.clone()).map_err(|e| {
                let path = e.path().to_string();
                let field = if path == "." {
                    at("after")
                } else {
                    at(&format!("after{}", dotted(&path)))
                };
                SpecError::new(field, e.into_inner().to_string())
            })?,
        };
        let mut over = v.clone();
        over.remove("name");
        over.remove("after");
        let set: BTreeSet<String> = over.keys().cloned().collect();
        let mut spec = merged(&defaults, &over);
        let experiment = format!("{name}.{vname}");
        spec.insert("name".into(), Value::String(experiment));
        let spec = ExperimentSpec::from_value(Value::Object(spec))
            .map_err(|e| in_variant(e, i, &vname, &set))?;
        variants.push(Variant {
            name: vname,
            spec,
            after,
            position: i,
            set,
        });
    }
    check_after(&variants)?;
    let seed = defaults.get("seed").and_then(Value::as_u64);
    Ok(Some(StudySpec {
        name,
        seed,
        variants,
    }))
}

/// A serde path (`[0].match`) as it follows a field name.
fn dotted(path: &str) -> String {
    if path.starts_with('[') {
        path.to_string()
    } else {
        format!(".{path}")
    }
}

/// See [`Variant::refusal`]; a refusal of the whole spec (an unknown key) is the variant's:
/// the defaults were checked alone first.
fn in_variant(e: SpecError, i: usize, name: &str, set: &BTreeSet<String>) -> SpecError {
    if e.field == "spec" {
        return SpecError::new(format!("{VARIANTS_KEY}[{i}]"), e.message);
    }
    let head = e
        .field
        .split(['.', '['])
        .next()
        .unwrap_or_default()
        .to_string();
    if set.contains(&head) {
        SpecError::new(format!("{VARIANTS_KEY}[{i}].{}", e.field), e.message)
    } else {
        SpecError::new(e.field, format!("{} (in variant `{name}`)", e.message))
    }
}

/// The defaults parse as the keys of an experiment spec (each variant is checked whole once
/// merged): an unknown or malformed key is refused at the top, where it was written.
fn check_defaults(defaults: &Map<String, Value>) -> Result<(), SpecError> {
    let mut probe = defaults.clone();
    probe.insert("name".into(), Value::String("defaults".into()));
    probe
        .entry("command")
        .or_insert_with(|| Value::Array(vec![Value::String("true".into())]));
    ExperimentSpec::from_value(Value::Object(probe)).map(|_| ())
}

/// `after` names a variant of the study (not its own), its `match` parameters belong to both,
/// and no variant waits on itself through others.
fn check_after(variants: &[Variant]) -> Result<(), SpecError> {
    let index: BTreeMap<&str, usize> = variants
        .iter()
        .enumerate()
        .map(|(i, v)| (v.name.as_str(), i))
        .collect();
    let mut edges: Vec<Vec<usize>> = vec![vec![]; variants.len()];
    for (i, v) in variants.iter().enumerate() {
        for (k, a) in v.after.iter().enumerate() {
            let at = |f: &str| format!("{VARIANTS_KEY}[{i}].after[{k}].{f}");
            let Some(&j) = index.get(a.experiment.as_str()) else {
                return Err(SpecError::new(
                    at("experiment"),
                    format!(
                        "no variant `{}` in this study (it has: {})",
                        a.experiment,
                        variants
                            .iter()
                            .map(|v| v.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ));
            };
            if j == i {
                return Err(SpecError::new(
                    at("experiment"),
                    "a variant cannot wait for itself",
                ));
            }
            let mine = v.spec.parameter_names();
            let theirs = variants[j].spec.parameter_names();
            for m in &a.matching {
                if !mine.contains(m.as_str()) || !theirs.contains(m.as_str()) {
                    return Err(SpecError::new(
                        at("match"),
                        format!(
                            "`{m}` must be a parameter of both `{}` and `{}`",
                            v.name, a.experiment
                        ),
                    ));
                }
            }
            edges[i].push(j);
        }
    }
    if let Some(cycle) = find_cycle(&edges) {
        let names: Vec<&str> = cycle.iter().map(|&i| variants[i].name.as_str()).collect();
        return Err(SpecError::new(
            format!("{VARIANTS_KEY}[{}].after", cycle[0]),
            format!(
                "variants wait for each other in a circle: {}",
                names.join(" → ")
            ),
        ));
    }
    Ok(())
}

/// A cycle of `edges` (waits-for), as the variants along it back to the first, if any.
fn find_cycle(edges: &[Vec<usize>]) -> Option<Vec<usize>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        Open,
        Done,
    }
    fn visit(i: usize, edges: &[Vec<usize>], marks: &mut [Mark], path: &mut Vec<usize>) -> bool {
        marks[i] = Mark::Open;
        path.push(i);
        for &j in &edges[i] {
            let mark = marks[j];
            if mark == Mark::Open {
                let start = path.iter().position(|&p| p == j).unwrap_or(0);
                path.drain(..start);
                path.push(j);
                return true;
            }
            if mark == Mark::New && visit(j, edges, marks, path) {
                return true;
            }
        }
        path.pop();
        marks[i] = Mark::Done;
        false
    }
    let mut marks = vec![Mark::New; edges.len()];
    for i in 0..edges.len() {
        let mut path = vec![];
        if marks[i] == Mark::New && visit(i, edges, &mut marks, &mut path) {
            return Some(path);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn declared_lengths_go_longest_first_and_the_rest_keep_the_file_order() {
        let m = |n: u64| Some(60_000 * n);
        assert_eq!(
            queue_order(&[None, m(5), None, m(40), m(5), m(10)]),
            vec![3, 5, 1, 4, 0, 2]
        );
        assert_eq!(queue_order(&[None, None]), vec![0, 1]);
        assert_eq!(queue_order(&[]), Vec::<usize>::new());
    }

    fn study(v: Value) -> Result<StudySpec, SpecError> {
        parse(&v).map(|s| s.expect("a study"))
    }

    #[test]
    fn variants_merge_over_the_defaults_mapping_by_mapping() {
        let s = study(json!({
            "name": "lab",
            "command": ["python", "main.py", "--lr", "{lr}"],
            "grid": {"seed": [1, 2]},
            "mutate": {"lr": {"uniform": [0.1, 0.2]}},
            "resources": {"gpus": 1, "memory": "2GiB"},
            "env": {"A": "1", "B": "2"},
            "runs_per_config": 2,
            "experiments": [
                {"name": "small"},
                {"name": "big", "resources": {"memory": "8GiB"},
                 "mutate": {"lr": {"log_uniform": [0.001, 0.1]}},
                 "env": {"B": null, "C": "3"}, "grid": {"bs": [32, 64]}, "runs_per_config": 1},
            ],
        }))
        .expect("study");
        assert_eq!(s.name, "lab");
        let [small, big] = &s.variants[..] else {
            panic!("two variants")
        };
        assert_eq!(small.spec.name, "lab.small");
        assert_eq!(small.spec.runs_per_config, 2);
        assert_eq!(big.spec.name, "lab.big");
        assert_eq!(big.spec.runs_per_config, 1);
        assert_eq!(big.spec.resources.gpus, 1, "the default's gpus kept");
        assert_eq!(big.spec.resources.memory.map(|m| m.mib), Some(8192));
        assert_eq!(
            big.spec.grid.keys().collect::<Vec<_>>(),
            ["bs", "seed"],
            "grid axes added"
        );
        assert_eq!(
            serde_json::to_value(&big.spec.mutate["lr"]).expect("json"),
            json!({"log_uniform": [0.001, 0.1]}),
            "an entry is replaced whole, not merged"
        );
        assert_eq!(
            big.spec.env.iter().collect::<Vec<_>>(),
            [
                (&"A".to_string(), &"1".to_string()),
                (&"C".into(), &"3".into())
            ]
        );
    }

    #[test]
    fn a_plain_spec_is_not_a_study() {
        assert_eq!(parse(&json!({"name": "x", "command": ["true"]})), Ok(None));
    }

    #[test]
    fn bad_studies_are_refused_naming_the_field() {
        let base = |variants: Value| {
            json!({"name": "lab", "command": ["run", "{model}"], "grid": {"model": ["a", "b"]},
                   "experiments": variants})
        };
        let field = |v: Value| study(v).expect_err("refused").field;
        assert_eq!(field(base(json!([]))), "experiments");
        assert_eq!(
            field(base(json!([{"command": ["x"]}]))),
            "experiments[0].name"
        );
        assert_eq!(
            field(base(json!([{"name": "a"}, {"name": "a"}]))),
            "experiments[1].name"
        );
        assert_eq!(
            field(base(json!([{"name": "a", "colour": "red"}]))),
            "experiments[0].colour",
            "an unknown variant key"
        );
        assert_eq!(
            field(base(json!([{"name": "a", "resources": {"gpus": "x"}}]))),
            "experiments[0].resources.gpus"
        );
        let mut top = base(json!([{"name": "a"}]));
        top["colour"] = json!("red");
        assert_eq!(
            field(top),
            "colour",
            "an unknown default key is refused at the top"
        );
        assert_eq!(
            field(base(
                json!([{"name": "a", "after": [{"experiment": "zz"}]}])
            )),
            "experiments[0].after[0].experiment"
        );
        assert_eq!(
            field(base(json!([{"name": "a"},
                {"name": "b", "after": [{"experiment": "a", "match": ["lr"]}]}]))),
            "experiments[1].after[0].match"
        );
        assert_eq!(
            field(base(json!([{"name": "a", "after": [{"experiment": "a"}]}]))),
            "experiments[0].after[0].experiment"
        );
        assert_eq!(
            field(base(
                json!([{"name": "a", "after": [{"experiment": "b", "when": "soon"}]},
                {"name": "b"}])
            )),
            "experiments[0].after[0].when"
        );
        let e = study(base(json!([
            {"name": "a", "after": [{"experiment": "c"}]},
            {"name": "b", "after": [{"experiment": "a"}]},
            {"name": "c", "after": [{"experiment": "b"}]},
        ])))
        .expect_err("a cycle");
        assert_eq!(e.field, "experiments[0].after");
        assert!(e.message.contains("a → c → b → a"), "{}", e.message);
    }

    #[test]
    fn dependencies_parse_with_their_defaults() {
        let s = study(json!({
            "name": "lab", "command": ["run", "{model}", "{lr}"],
            "grid": {"model": ["a", "b"], "lr": [0.1, 0.2]},
            "experiments": [
                {"name": "train"},
                {"name": "eval", "after": [{"experiment": "train", "match": ["model", "lr"]}]},
            ],
        }))
        .expect("study");
        assert_eq!(
            s.variants[1].after,
            [After {
                experiment: "train".into(),
                when: AfterWhen::Succeeded,
                matching: vec!["model".into(), "lr".into()],
                on_failure: OnDependencyFailure::Cancel,
            }]
        );
    }
}
