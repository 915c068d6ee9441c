//! The OpenAPI 3.1 document served at `/openapi.json`, written from the endpoints' own
//! declarations (`routes`: paths, methods, who may call, operation ids, and the types of
//! each body, query and answer) and the field rules of `api::bounds`, so the document
//! follows the code.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use headroom_shared::api::ErrorBody;
use headroom_shared::api::bounds::{self, Rule, Site};
use headroom_shared::routes::{self, Access, Method, Route};
use serde_json::Value;
use utoipa::openapi::path::{
    HttpMethod, OperationBuilder, Parameter, ParameterBuilder, ParameterIn,
};
use utoipa::openapi::request_body::RequestBodyBuilder;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{
    ArrayBuilder, ComponentsBuilder, ContentBuilder, Header, InfoBuilder, KnownFormat,
    LicenseBuilder, Object, ObjectBuilder, OpenApi, OpenApiBuilder, PathItem, PathsBuilder, Ref,
    RefOr, Required, ResponseBuilder, Schema, SchemaFormat, SecurityRequirement, Type,
};
use utoipa::{IntoParams, ToSchema};

/// Name of the bearer-token security scheme in the document.
pub const BEARER: &str = "bearer";

/// Schemas collected while the operations are described, by component name.
#[derive(Default)]
struct Schemas(BTreeMap<String, RefOr<Schema>>);

impl Schemas {
    /// Registers `T` (and every type it refers to) and returns a reference to it.
    fn of<T: ToSchema>(&mut self) -> RefOr<Schema> {
        let name = T::name().to_string();
        if !self.0.contains_key(&name) {
            self.0.insert(name.clone(), T::schema());
            let mut nested = Vec::new();
            T::schemas(&mut nested);
            for (n, s) in nested {
                self.0.entry(n).or_insert(s);
            }
        }
        Ref::from_schema_name(name).into()
    }
}

type SchemaFn = fn(&mut Schemas) -> RefOr<Schema>;

fn one<T: ToSchema>(s: &mut Schemas) -> RefOr<Schema> {
    s.of::<T>()
}

fn list<T: ToSchema>(s: &mut Schemas) -> RefOr<Schema> {
    ArrayBuilder::new().items(s.of::<T>()).build().into()
}

fn query<T: IntoParams>() -> Vec<Parameter> {
    T::into_params(|| Some(ParameterIn::Query))
}

/// What a route takes besides its path.
#[derive(Clone, Copy)]
enum Body {
    None,
    Json(SchemaFn),
    /// Raw bytes (`application/octet-stream`).
    Bytes,
}

/// What a route answers with on success.
#[derive(Clone, Copy)]
enum Answer {
    Json(SchemaFn),
    /// CSV text, or with `format=json` this JSON page.
    Export(SchemaFn),
    /// Log bytes with the `x-log-offset` and `x-attempt-ended` headers.
    LogBytes,
    /// Raw bytes.
    OctetStream,
}

/// One route's documentation beyond what `routes::Route` says.
#[derive(Clone, Copy)]
struct RouteDoc {
    operation_id: &'static str,
    tag: &'static str,
    body: Body,
    query: Option<fn() -> Vec<Parameter>>,
    answer: Answer,
    /// The route can refuse because of state: a stale fence, an unknown agent, a job in the
    /// wrong state (409).
    conflicts: bool,
}

/// How each body marker of `routes` is documented.
trait BodyDoc {
    const BODY: Body;
}

impl BodyDoc for routes::NoBody {
    const BODY: Body = Body::None;
}

impl BodyDoc for routes::RawBytes {
    const BODY: Body = Body::Bytes;
}

impl<T: ToSchema> BodyDoc for routes::Json<T> {
    const BODY: Body = Body::Json(one::<T>);
}

/// How each query marker is documented.
trait QueryDoc {
    const QUERY: Option<fn() -> Vec<Parameter>>;
}

impl QueryDoc for routes::NoQuery {
    const QUERY: Option<fn() -> Vec<Parameter>> = None;
}

impl<Q: IntoParams> QueryDoc for routes::Query<Q> {
    const QUERY: Option<fn() -> Vec<Parameter>> = Some(query::<Q>);
}

/// How each answer marker is documented.
trait AnswerDoc {
    const ANSWER: Answer;
}

impl<T: ToSchema> AnswerDoc for routes::Json<T> {
    const ANSWER: Answer = Answer::Json(one::<T>);
}

impl<T: ToSchema> AnswerDoc for routes::JsonList<T> {
    const ANSWER: Answer = Answer::Json(list::<T>);
}

impl<T: ToSchema> AnswerDoc for routes::Export<T> {
    const ANSWER: Answer = Answer::Export(one::<T>);
}

impl AnswerDoc for routes::LogBytes {
    const ANSWER: Answer = Answer::LogBytes;
}

impl AnswerDoc for routes::OctetStream {
    const ANSWER: Answer = Answer::OctetStream;
}

/// An endpoint's documentation, from its declaration (types included).
fn doc_of<B: BodyDoc, Q: QueryDoc, A: AnswerDoc>(
    e: routes::Endpoint<B, Q, A>,
) -> (Route, RouteDoc) {
    (
        e.route,
        RouteDoc {
            operation_id: e.operation_id,
            tag: e.tag,
            body: B::BODY,
            query: Q::QUERY,
            answer: A::ANSWER,
            conflicts: e.conflicts,
        },
    )
}

macro_rules! documented {
    ($($endpoint:path,)*) => {
        vec![$(doc_of($endpoint)),*]
    };
}

/// Every route's documentation, from the endpoints' declarations.
fn table() -> Vec<(Route, RouteDoc)> {
    headroom_shared::for_each_endpoint!(documented)
}

/// The error answers, each with the one error shape (`ErrorBody`), as reusable responses.
const ERRORS: &[(u16, &str, &str)] = &[
    (
        400,
        "BadRequest",
        "Malformed request: not JSON, a bad id or query string (`bad_request`)",
    ),
    (
        401,
        "Unauthorized",
        "No token, or a wrong, revoked or expired one (`unauthenticated`)",
    ),
    (
        403,
        "Forbidden",
        "The token's role may not do this; the message names the role needed (`forbidden`)",
    ),
    (
        404,
        "NotFound",
        "No such experiment, job, attempt, agent or node (`not_found`)",
    ),
    (
        409,
        "Conflict",
        "Refused by state: a stale fencing token (`stale_fence`), an agent the coordinator no longer knows (`unknown_agent`), a job in the wrong state or tokens asked of a coordinator that runs without any (`conflict`)",
    ),
    (413, "PayloadTooLarge", "The body is too large"),
    (
        415,
        "UnsupportedMediaType",
        "The body is not `application/json`",
    ),
    (
        422,
        "Invalid",
        "A field is wrong; `field` names it (`invalid`)",
    ),
    (500, "Internal", "A bug or a corrupt row (`internal`)"),
    (
        503,
        "StoreUnavailable",
        "The store cannot be reached; try again (`store_unavailable`)",
    ),
];

fn error_ref(status: u16) -> RefOr<utoipa::openapi::Response> {
    let name = ERRORS
        .iter()
        .find(|(s, _, _)| *s == status)
        .map_or("Internal", |(_, n, _)| n);
    Ref::new(format!("#/components/responses/{name}")).into()
}

/// The role a route needs, as the operation's description says it.
fn role_text(access: Access) -> &'static str {
    match access {
        Access::Public => "No token needed.",
        Access::User => "Needs a `user` or `admin` token.",
        Access::Owner => "Needs a `user` token of the user who submitted it, or an `admin` token.",
        Access::Admin => "Needs an `admin` token.",
        Access::Agent => "Needs an `agent` token.",
        Access::Join => "Needs a `join` token.",
        Access::Attempt => {
            "Needs the key issued with this attempt's lease (its supervisor's; no token of any \
             role)."
        }
    }
}

/// Security and the 401/403 answers of a route, from its `access`: the one place the
/// document learns who may call what.
fn secure(access: Access, op: OperationBuilder) -> OperationBuilder {
    if access == Access::Public {
        return op;
    }
    op.security(SecurityRequirement::new(BEARER, Vec::<String>::new()))
        .response("401", error_ref(401))
        .response("403", error_ref(403))
}

/// A `{...}` path segment's parameter: ids are UUIDs, `gpu` an index, `name` a node name.
fn path_param(route: &Route, name: &str) -> Parameter {
    let (schema, description): (Object, String) = match name {
        "gpu" => (
            ObjectBuilder::new()
                .schema_type(Type::Integer)
                .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int32)))
                .minimum(Some(0))
                .maximum(Some(u32::MAX))
                .build(),
            "GPU index on the node".into(),
        ),
        "name" => (
            ObjectBuilder::new().schema_type(Type::String).build(),
            "Node name".into(),
        ),
        "hash" => (
            ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some(headroom_shared::api::bounds::SHA256.pattern))
                .build(),
            "The SHA-256 of the bundle's bytes, in lowercase hex".into(),
        ),
        _ => {
            let kind = route
                .path
                .split('/')
                .take_while(|s| !s.starts_with('{'))
                .last()
                .unwrap_or("")
                .trim_end_matches('s');
            (
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .format(Some(SchemaFormat::KnownFormat(KnownFormat::Uuid)))
                    .build(),
                format!("The {kind}'s id (a UUID)"),
            )
        }
    };
    ParameterBuilder::new()
        .name(name)
        .parameter_in(ParameterIn::Path)
        .required(Required::True)
        .description(Some(description))
        .schema(Some(schema))
        .build()
}

fn operation(route: &Route, doc: Option<RouteDoc>, schemas: &mut Schemas) -> PathItem {
    let mut description = String::from(role_text(route.access));
    let mut op = OperationBuilder::new().summary(Some(route.summary));
    let mut params: Vec<Parameter> = route.params().map(|p| path_param(route, p)).collect();
    let mut errors: Vec<u16> = vec![500, 503];
    if !params.is_empty() {
        errors.extend([400, 404]);
    }
    match doc {
        Some(d) => {
            op = op.operation_id(Some(d.operation_id)).tag(d.tag);
            if let Some(q) = d.query {
                params.extend(q());
                errors.extend([400, 422]);
            }
            match d.body {
                Body::None => {}
                Body::Json(schema) => {
                    op = op.request_body(Some(
                        RequestBodyBuilder::new()
                            .required(Some(Required::True))
                            .content(
                                "application/json",
                                ContentBuilder::new().schema(Some(schema(schemas))).build(),
                            )
                            .build(),
                    ));
                    errors.extend([400, 413, 415, 422]);
                }
                Body::Bytes => {
                    op = op.request_body(Some(
                        RequestBodyBuilder::new()
                            .required(Some(Required::True))
                            .content(
                                "application/octet-stream",
                                ContentBuilder::new().schema(Some(binary())).build(),
                            )
                            .build(),
                    ));
                    // Over the route's bound; bytes refused for what they hold, naming it.
                    errors.extend([413, 422]);
                }
            }
            if d.conflicts || route.access == Access::Owner {
                errors.push(409);
            }
            let ok = match d.answer {
                Answer::Json(schema) => ResponseBuilder::new().description("Success").content(
                    "application/json",
                    ContentBuilder::new().schema(Some(schema(schemas))).build(),
                ),
                Answer::Export(page) => ResponseBuilder::new()
                    .description("One row per attempt: CSV with a header row, or a JSON page")
                    .content(
                        "text/csv",
                        ContentBuilder::new()
                            .schema(Some(ObjectBuilder::new().schema_type(Type::String)))
                            .build(),
                    )
                    .content(
                        "application/json",
                        ContentBuilder::new().schema(Some(page(schemas))).build(),
                    ),
                Answer::OctetStream => ResponseBuilder::new().description("The bytes").content(
                    "application/octet-stream",
                    ContentBuilder::new().schema(Some(binary())).build(),
                ),
                Answer::LogBytes => ResponseBuilder::new()
                    .description("Log bytes from `offset` (empty when none came within `wait_ms`)")
                    .content(
                        "application/octet-stream",
                        ContentBuilder::new().schema(Some(binary())).build(),
                    )
                    .header(
                        routes::LOG_OFFSET_HEADER,
                        header(Type::Integer, "Where the next read starts"),
                    )
                    .header(
                        routes::ATTEMPT_ENDED_HEADER,
                        header(
                            Type::String,
                            "`true` once the attempt has ended: no more bytes will come",
                        ),
                    ),
            };
            op = op.response("200", ok.build());
        }
        None => {
            description.push_str(" (Request and answer not described.)");
        }
    }
    errors.sort_unstable();
    errors.dedup();
    for status in errors {
        op = op.response(status.to_string(), error_ref(status));
    }
    op = secure(route.access, op.description(Some(description))).parameters(Some(params));
    let method = match route.method {
        Method::Get => HttpMethod::Get,
        Method::Post => HttpMethod::Post,
        Method::Put => HttpMethod::Put,
    };
    PathItem::new(method, op.build())
}

fn binary() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .content_media_type("application/octet-stream")
        .build()
}

fn header(ty: Type, description: &str) -> Header {
    utoipa::openapi::HeaderBuilder::new()
        .schema(Some(ObjectBuilder::new().schema_type(ty)))
        .description(Some(description))
        .build()
}

/// Builds the document for `routes`.
fn build(all: &[Route]) -> OpenApi {
    let docs = table();
    let mut schemas = Schemas::default();
    let error_schema = schemas.of::<ErrorBody>();
    let mut paths = PathsBuilder::new().build();
    for route in all {
        let d = docs.iter().find(|(r, _)| r == route).map(|(_, d)| *d);
        let item = operation(route, d, &mut schemas);
        paths
            .paths
            .entry(route.path.to_string())
            .or_default()
            .merge_operations(item);
    }
    let mut components = ComponentsBuilder::new().security_scheme(
        BEARER,
        SecurityScheme::Http(
            HttpBuilder::new()
                .scheme(HttpAuthScheme::Bearer)
                .description(Some(
                    "A token given by the coordinator's configuration or `headroom token create`; roles `admin`, `user`, `agent`",
                ))
                .build(),
        ),
    );
    for (_, name, text) in ERRORS {
        components = components.response(
            *name,
            ResponseBuilder::new().description(*text).content(
                "application/json",
                ContentBuilder::new()
                    .schema(Some(error_schema.clone()))
                    .build(),
            ),
        );
    }
    let components = components.schemas_from_iter(schemas.0).build();
    OpenApiBuilder::new()
        .info(
            InfoBuilder::new()
                .title("headroom")
                .version(env!("CARGO_PKG_VERSION"))
                .description(Some(
                    "Distributed multi-GPU job scheduler. Every error answers `{\"error\": {\"code\", \"message\", \"field\"?}}`.",
                ))
                .license(Some(
                    LicenseBuilder::new()
                        .name("Apache-2.0")
                        .identifier(Some("Apache-2.0"))
                        .build(),
                )),
        )
        .paths(paths)
        .components(Some(components))
        .build()
}

/// The document as served: built from the route tables, then each field's rule written in
/// from `bounds::APPLIED`, the rules the handlers check with.
pub fn document() -> &'static Value {
    static DOC: OnceLock<Value> = OnceLock::new();
    DOC.get_or_init(|| {
        let mut doc = serde_json::to_value(build(routes::ALL)).unwrap_or_default();
        // A site missing from the document is a mistake of the table: the test below says
        // which; serving the rest is better than serving nothing.
        let _ = apply_bounds(&mut doc);
        unsigned_integers(&mut doc);
        doc
    })
}

/// Where the spec's JSON Schema is served, for editors (`# yaml-language-server: $schema=`).
pub const SPEC_SCHEMA_PATH: &str = "/spec.schema.json";

/// The experiment spec as a JSON Schema (draft 2020-12), from the same types the coordinator
/// parses specs with: every type it names under `$defs`.
pub fn spec_schema() -> &'static Value {
    static SCHEMA: OnceLock<Value> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        let mut s = Schemas::default();
        s.of::<headroom_shared::spec::ExperimentSpec>();
        s.of::<headroom_shared::study::After>();
        let mut defs = serde_json::to_value(&s.0).unwrap_or_default();
        refs_to_defs(&mut defs);
        unsigned_integers(&mut defs);
        // A spec file may name its rows' CSV file instead (the client reads it at submit).
        if let Some(rows) = defs.pointer_mut("/ExperimentSpec/properties/rows") {
            let inline = rows.take();
            *rows = serde_json::json!({"oneOf": [
                inline,
                {"type": "string", "description": "a CSV file beside the spec (a header of \
                 parameter names, one configuration a line), read by the client at submit"},
            ]});
        }
        study_schemas(&mut defs);
        // A file with `experiments:` is a study; any other an experiment spec.
        let mut root = serde_json::json!({
            "if": {"type": "object", "required": ["experiments"]},
            "then": {"$ref": "#/$defs/StudySpec"},
            "else": {"$ref": "#/$defs/ExperimentSpec"},
        });
        if let Value::Object(m) = &mut root {
            m.insert(
                "$schema".into(),
                "https://json-schema.org/draft/2020-12/schema".into(),
            );
            m.insert("$id".into(), "https://headroom.dev/spec.schema.json".into());
            m.insert("title".into(), "headroom experiment spec".into());
            m.insert("$defs".into(), defs);
        }
        root
    })
}

/// A study (`StudySpec`: the experiment spec's keys as defaults, its `name` and
/// `experiments`) and its variants (`StudyVariant`: the same keys, `name` and `after`), from
/// the experiment spec's schema: no key is required but the names.
fn study_schemas(defs: &mut Value) {
    let Some(exp) = defs.get("ExperimentSpec").cloned() else {
        return;
    };
    let with = |extra: Value, description: &str, required: Value| {
        let mut s = exp.clone();
        if let Some(Value::Object(props)) = s.get_mut("properties")
            && let Value::Object(extra) = extra
        {
            props.extend(extra);
        }
        if let Value::Object(m) = &mut s {
            m.insert("required".into(), required);
            m.insert("description".into(), description.into());
        }
        s
    };
    let variant = with(
        serde_json::json!({"after": {
            "type": "array",
            "items": {"$ref": "#/$defs/After"},
            "description": "the variants this one's jobs wait for",
        }}),
        "A variant of a study: its own keys over the study's defaults; its experiment is \
         named STUDY.VARIANT.",
        serde_json::json!(["name"]),
    );
    let study = with(
        serde_json::json!({"experiments": {
            "type": "array",
            "minItems": 1,
            "items": {"$ref": "#/$defs/StudyVariant"},
            "description": "the study's variants, each an experiment of its own",
        }}),
        "A study: its keys are defaults every variant of `experiments` starts from (a \
         variant's mapping adds to the default's, entry by entry).",
        serde_json::json!(["name", "experiments"]),
    );
    if let Value::Object(d) = defs {
        d.insert("StudyVariant".into(), variant);
        d.insert("StudySpec".into(), study);
    }
}

/// `#/components/schemas/X` (OpenAPI's place for a type) becomes `#/$defs/X`.
fn refs_to_defs(v: &mut Value) {
    match v {
        Value::Object(m) => {
            if let Some(Value::String(r)) = m.get_mut("$ref")
                && let Some(name) = r.strip_prefix("#/components/schemas/")
            {
                *r = format!("#/$defs/{name}");
            }
            m.values_mut().for_each(refs_to_defs);
        }
        Value::Array(a) => a.iter_mut().for_each(refs_to_defs),
        _ => {}
    }
}

/// utoipa writes `u32` and `u64` as `int32` and `int64` (signed) with `minimum: 0`: the
/// server takes every value of the unsigned type, so the document says that range.
fn unsigned_integers(v: &mut Value) {
    match v {
        Value::Object(m) => {
            let integer = match m.get("type") {
                Some(Value::String(t)) => t == "integer",
                Some(Value::Array(ts)) => ts.iter().any(|t| t == "integer"),
                _ => false,
            };
            let unsigned = m
                .get("minimum")
                .and_then(Value::as_u64)
                .is_some_and(|n| n <= 1);
            if integer && unsigned {
                let max = match m.get("format").and_then(Value::as_str) {
                    Some("int32") => Some(u64::from(u32::MAX)),
                    Some("int64") => Some(u64::MAX),
                    _ => None,
                };
                if let Some(max) = max {
                    m.insert(
                        "format".into(),
                        if max == u64::MAX { "uint64" } else { "uint32" }.into(),
                    );
                    m.entry("maximum").or_insert(max.into());
                }
            }
            m.values_mut().for_each(unsigned_integers);
        }
        Value::Array(items) => items.iter_mut().for_each(unsigned_integers),
        _ => {}
    }
}

/// Writes each rule of `bounds::APPLIED` into the schema of the field it governs; the
/// sites it could not find.
fn apply_bounds(doc: &mut Value) -> Vec<Site> {
    let mut missing = Vec::new();
    for (site, rule) in bounds::APPLIED {
        match field_schema(doc, *site) {
            Some(schema) => write_rule(schema, *rule),
            None => missing.push(*site),
        }
    }
    for (operation, rules) in bounds::CROSS_FIELD {
        match operation_mut(doc, operation) {
            Some(op) => {
                op.insert("x-cross-field-rules".into(), (*rules).into());
            }
            None => missing.push(Site::Operation(operation)),
        }
    }
    missing
}

fn operation_mut<'a>(
    doc: &'a mut Value,
    operation: &str,
) -> Option<&'a mut serde_json::Map<String, Value>> {
    doc.get_mut("paths")?
        .as_object_mut()?
        .values_mut()
        .flat_map(|item| {
            item.as_object_mut()
                .into_iter()
                .flat_map(|m| m.values_mut())
        })
        .find(|op| op["operationId"] == operation)?
        .as_object_mut()
}

fn field_schema(doc: &mut Value, site: Site) -> Option<&mut serde_json::Map<String, Value>> {
    let schema = match site {
        Site::Property(component, field) => doc.pointer_mut(&format!(
            "/components/schemas/{component}/properties/{field}"
        ))?,
        Site::Query(operation, param) => {
            let op = operation_mut(doc, operation)?;
            op.get_mut("parameters")?
                .as_array_mut()?
                .iter_mut()
                .find(|p| p["name"] == param && p["in"] == "query")?
                .get_mut("schema")?
        }
        // A field rule has a field: the cross-field rules go on the operation itself.
        Site::Operation(_) => return None,
    };
    schema.as_object_mut()
}

fn write_rule(schema: &mut serde_json::Map<String, Value>, rule: Rule) {
    match rule {
        Rule::Text(t) => {
            schema.insert("pattern".into(), t.pattern.into());
        }
        Rule::Number(r) => {
            schema.insert("minimum".into(), r.min.into());
            schema.insert("maximum".into(), r.max.into());
        }
        Rule::FirstItemNotEmpty => {
            schema.insert(
                "prefixItems".into(),
                serde_json::json!([{"type": "string", "minLength": 1}]),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The schema kept in the repository (`docs/spec.schema.json`, for editors that read
    /// files) is the one served; `HEADROOM_WRITE_SCHEMA=1` writes it anew.
    #[test]
    fn the_spec_schema_in_the_repository_is_the_one_served() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/spec.schema.json");
        let want = serde_json::to_string_pretty(spec_schema()).expect("json") + "\n";
        if std::env::var_os("HEADROOM_WRITE_SCHEMA").is_some() {
            std::fs::write(path, &want).expect("writing the schema");
        }
        let have = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            have == want,
            "docs/spec.schema.json is not the served schema: run \
             `HEADROOM_WRITE_SCHEMA=1 cargo test -p headroom-coordinator --lib spec_schema`"
        );
        // Every field of a spec, and no other (`deny_unknown_fields`).
        let exp = &spec_schema()["$defs"]["ExperimentSpec"];
        let props = exp["properties"].as_object().expect("properties");
        for field in [
            "name",
            "command",
            "grid",
            "zip",
            "rows",
            "metrics",
            "early_stop",
            "tracking",
        ] {
            assert!(props.contains_key(field), "{field}");
        }
        assert_eq!(exp["additionalProperties"], Value::Bool(false));
        // A study takes the same keys as defaults, its variants `after` too; neither any other.
        let defs = &spec_schema()["$defs"];
        for (def, own) in [("StudySpec", "experiments"), ("StudyVariant", "after")] {
            let props = defs[def]["properties"].as_object().expect("properties");
            assert!(
                props.contains_key(own) && props.contains_key("grid"),
                "{def}"
            );
            assert_eq!(
                defs[def]["additionalProperties"],
                Value::Bool(false),
                "{def}"
            );
        }
        assert_eq!(spec_schema()["then"]["$ref"], "#/$defs/StudySpec");
    }

    #[test]
    fn every_operation_has_its_own_id_and_every_route_its_own_path() {
        let docs = table();
        assert_eq!(docs.len(), routes::ALL.len());
        for (i, (r, d)) in docs.iter().enumerate() {
            assert!(
                !d.operation_id.is_empty(),
                "{} {} has no operation id",
                r.method,
                r.path
            );
            assert!(!d.tag.is_empty(), "{} {} has no tag", r.method, r.path);
            for (o, od) in &docs[..i] {
                assert_ne!(od.operation_id, d.operation_id, "{} {}", r.method, r.path);
                assert!(
                    !(o.method == r.method && o.path == r.path),
                    "{} {} is declared twice",
                    r.method,
                    r.path
                );
            }
        }
    }

    fn json() -> serde_json::Value {
        document().clone()
    }

    /// Every rule of the shared table lands on a field of the document (a renamed field or
    /// operation would otherwise leave the document without it).
    #[test]
    fn every_field_rule_is_in_the_document() {
        let mut doc = serde_json::to_value(build(routes::ALL)).expect("serializes");
        assert_eq!(apply_bounds(&mut doc), Vec::<Site>::new());
        let name = doc.pointer("/components/schemas/CreateTokenRequest/properties/name/pattern");
        assert_eq!(name, Some(&Value::from(bounds::TOKEN_NAME.pattern)));
        let jobs = &doc["paths"]["/v1/jobs"]["get"]["parameters"];
        let limit = jobs
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["name"] == "limit")
            .expect("limit");
        assert_eq!(limit["schema"]["minimum"], bounds::JOBS.min);
        assert_eq!(limit["schema"]["maximum"], bounds::JOBS.max);
    }

    #[test]
    fn every_operation_has_an_answer_errors_and_security_by_its_access() {
        let doc = json();
        for route in routes::ALL {
            let method = route.method.to_string().to_lowercase();
            let op = &doc["paths"][route.path][&method];
            assert!(op.is_object(), "{} {} missing", route.method, route.path);
            assert!(
                op["responses"]["200"].is_object(),
                "{} {}",
                route.method,
                route.path
            );
            assert!(op["responses"]["500"]["$ref"].is_string());
            let secured = op["security"][0].get(BEARER).is_some();
            assert_eq!(
                secured,
                route.access != Access::Public,
                "{} {}",
                route.method,
                route.path
            );
            assert_eq!(op["responses"]["401"].is_object(), secured);
            assert_eq!(op["responses"]["403"].is_object(), secured);
            for p in route.params() {
                let found = op["parameters"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|q| q["name"] == p && q["in"] == "path");
                assert!(
                    found,
                    "{} {} lacks path parameter {p}",
                    route.method, route.path
                );
            }
        }
    }

    #[test]
    fn the_document_names_real_fields_enums_and_query_parameters() {
        let doc = json();
        let schemas = &doc["components"]["schemas"];
        // Every `$ref` resolves.
        let text = doc.to_string();
        for piece in text.split("\"$ref\":\"#/components/schemas/").skip(1) {
            let name = piece.split('"').next().unwrap_or_default();
            assert!(schemas[name].is_object(), "dangling $ref to {name}");
        }
        assert_eq!(schemas["JobId"]["format"], "uuid");
        let states: Vec<&str> = schemas["JobState"]["enum"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str())
            .collect();
        assert_eq!(states.len(), headroom_shared::JobState::ALL.len());
        for s in headroom_shared::JobState::ALL {
            assert!(states.contains(&s.as_str()), "{s}");
        }
        let detail = &schemas["ErrorDetail"];
        assert_eq!(detail["required"], serde_json::json!(["code", "message"]));
        let progress = &doc["paths"]["/v1/progress"]["get"]["parameters"];
        for q in ["experiment", "after", "timeout_ms"] {
            assert!(
                progress
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|p| p["name"] == q && p["in"] == "query"),
                "progress lacks `{q}`"
            );
        }
        let submit = &schemas["SubmitRequest"];
        assert_eq!(submit["required"], serde_json::json!(["spec"]));
        assert_eq!(
            submit["properties"]["spec"]["$ref"],
            "#/components/schemas/ExperimentSpec"
        );
    }
}
