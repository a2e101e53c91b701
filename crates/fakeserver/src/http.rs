//! The HTTP face of the server, one axum handler: it parses the path into a resource target (core and
//! grouped, namespaced and cluster-scoped, subresources), the query (tolerating kube's `?&`), headers and
//! body into store calls, encodes the answers, and turns errors into `metav1.Status` objects. Every request
//! passes the fault injector and is counted by [`crate::accounting`].
//!
//! The same router serves in-process clients (as a `tower::Service`) and sockets.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::header::{ACCEPT, CONTENT_TYPE, HOST, RETRY_AFTER, USER_AGENT};
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use serde_json::{Value, json};

use crate::accounting::{Journal, JournalEntry, ListenerName, RequestKey, RequestLog, Verb, client_label};
use crate::authz::rbac::{Attributes, UserInfo};
use crate::authz::request_info::request_info;
use crate::authz::{Authz, CreateOnApply, Escalation, RBAC_GROUP};
use crate::discovery;
use crate::encode::{self, Projection};
use crate::error::{ApiError, created_status, success_status};
use crate::faults::FaultInjector;
use crate::patch::{PatchType, parse_body};
use crate::protobuf;
use crate::registry::ResourceInfo;
use crate::selector::{FieldSelector, LabelSelector};
use crate::store::{
    DeleteOptions, Deleted, FieldValidation, ListQuery, Propagation, Store, VersionMatch, WatchQuery,
    WriteOptions,
};
use crate::watch::{self, WatchSpec};

/// The largest request body accepted, as the real API server's limit.
const BODY_LIMIT: usize = 3 * 1024 * 1024;

/// Everything the handler shares.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) store: Store,
    pub(crate) requests: RequestLog,
    pub(crate) journal: Journal,
    pub(crate) faults: FaultInjector,
    /// Bumped by [`crate::FakeServer::drop_watches`]: every open watch stream ends.
    pub(crate) watch_drops: tokio::sync::watch::Sender<u64>,
    pub(crate) bookmark_interval: Duration,
    pub(crate) watch_timeout: Duration,
    pub(crate) authz: Arc<Authz>,
    pub(crate) logs: crate::logs::ContainerLogs,
}

/// The router for all paths.
pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new().fallback(handle).with_state(shared)
}

/// Query parameters, in order, empty pairs dropped.
#[derive(Debug, Default)]
struct Params(Vec<(String, String)>);

impl Params {
    fn parse(query: Option<&str>) -> Self {
        Self(
            form_urlencoded::parse(query.unwrap_or_default().as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        )
    }

    /// The first value of `key`, as Go's `url.Values.Get` and the query conversions take it.
    fn get(&self, key: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    /// A boolean parameter as kube-apiserver converts one (`Convert_Slice_string_To_bool`): absent,
    /// `0` and `false` (any case) are false, anything else, the empty string included, is true.
    fn flag(&self, key: &str) -> bool {
        self.get(key)
            .is_some_and(|value| value != "0" && !value.eq_ignore_ascii_case("false"))
    }

    /// An integer parameter, refused as `strconv.ParseInt` refuses it (400 with Go's words).
    fn integer(&self, key: &str) -> Result<Option<i64>, ApiError> {
        match self.get(key) {
            None | Some("") => Ok(None),
            Some(text) => parse_int(text).map(Some),
        }
    }
}

/// `strconv.ParseInt(text, 10, 64)`, with its error messages.
fn parse_int(text: &str) -> Result<i64, ApiError> {
    text.parse::<i64>().map_err(|error| {
        let why = match error.kind() {
            std::num::IntErrorKind::PosOverflow | std::num::IntErrorKind::NegOverflow => "value out of range",
            _ => "invalid syntax",
        };
        ApiError::BadRequest(format!("strconv.ParseInt: parsing {text:?}: {why}"))
    })
}

/// What a path names.
#[derive(Debug)]
enum Route {
    Version,
    CoreVersions,
    Groups,
    Group(String),
    Resources { group: String, version: String },
    OpenApiRoot,
    OpenApi(String),
    Metrics,
    Health,
    Compact,
    AuthorizationReport,
    Resource(Target),
    Unknown,
}

/// A resource path: the resource, and the namespace, name and subresource it names.
#[derive(Debug)]
struct Target {
    info: Arc<ResourceInfo>,
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
}

fn percent_decode(segment: &str) -> String {
    if !segment.contains('%') {
        return segment.to_owned();
    }
    // Bytes, not string slices: a `%` may be followed by anything, a multi-byte character included.
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&byte) = bytes.get(i) {
        let escaped = match (byte, bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&high), Some(&low)) => hex_value(high).zip(hex_value(low)),
            _ => None,
        };
        if let Some((high, low)) = escaped {
            out.push(high << 4 | low);
            i += 3;
        } else {
            out.push(byte);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex_value(digit: u8) -> Option<u8> {
    char::from(digit).to_digit(16).and_then(|d| u8::try_from(d).ok())
}

fn route(store: &Store, path: &str) -> Route {
    let segments: Vec<String> = path
        .split('/')
        .filter(|s| !s.is_empty())
        .map(percent_decode)
        .collect();
    let segments: Vec<&str> = segments.iter().map(String::as_str).collect();
    let (group, version, rest) = match segments.as_slice() {
        ["version"] => return Route::Version,
        ["api"] => return Route::CoreVersions,
        ["apis"] => return Route::Groups,
        ["apis", group] => return Route::Group((*group).to_owned()),
        ["openapi", "v3"] => return Route::OpenApiRoot,
        ["openapi", "v3", rest @ ..] => return Route::OpenApi(rest.join("/")),
        ["metrics"] => return Route::Metrics,
        ["healthz" | "livez" | "readyz", ..] => return Route::Health,
        ["fakeserver", "compact"] => return Route::Compact,
        ["fake", "authorization"] => return Route::AuthorizationReport,
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return Route::Unknown,
    };
    let (namespace, plural, name, subresource) = match rest {
        [] => {
            return Route::Resources {
                group: group.to_owned(),
                version: version.to_owned(),
            };
        }
        ["namespaces", name, sub @ ("status" | "finalize")] if group.is_empty() => {
            (None, "namespaces", Some(*name), Some(*sub))
        }
        ["namespaces", namespace, plural] => (Some(*namespace), *plural, None, None),
        ["namespaces", namespace, plural, name] => (Some(*namespace), *plural, Some(*name), None),
        ["namespaces", namespace, plural, name, sub] => (Some(*namespace), *plural, Some(*name), Some(*sub)),
        [plural] => (None, *plural, None, None),
        [plural, name] => (None, *plural, Some(*name), None),
        [plural, name, sub] => (None, *plural, Some(*name), Some(*sub)),
        _ => return Route::Unknown,
    };
    let Some(info) = store.resolve(group, version, plural) else {
        return Route::Unknown;
    };
    // A namespaced object needs its namespace; a cluster-scoped one must not have one.
    if (info.namespaced && name.is_some() && namespace.is_none()) || (!info.namespaced && namespace.is_some())
    {
        return Route::Unknown;
    }
    Route::Resource(Target {
        info,
        namespace: namespace.map(str::to_owned),
        name: name.map(str::to_owned),
        subresource: subresource.map(str::to_owned),
    })
}

fn header(headers: &HeaderMap, name: http::header::HeaderName) -> Option<&str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

fn verb_of(method: &Method, target: &Target, params: &Params, headers: &HeaderMap) -> Verb {
    let watching = params.flag("watch");
    match *method {
        Method::GET if watching => Verb::Watch,
        Method::GET if target.name.is_none() => Verb::List,
        Method::POST => Verb::Create,
        Method::PUT => Verb::Update,
        Method::PATCH => match PatchType::from_content_type(header(headers, CONTENT_TYPE)) {
            Ok(PatchType::Apply) => Verb::Apply,
            _ => Verb::Patch,
        },
        Method::DELETE if target.name.is_none() => Verb::DeleteCollection,
        Method::DELETE => Verb::Delete,
        _ => Verb::Get,
    }
}

async fn handle(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let started = std::time::Instant::now();
    let (parts, body) = request.into_parts();
    let listener = parts
        .extensions
        .get::<ListenerName>()
        .map(|listener| listener.0.to_string())
        .unwrap_or_default();
    let mut object = (String::new(), String::new());
    let params = Params::parse(parts.uri.query());
    let client = client_label(header(&parts.headers, USER_AGENT));
    // Who is asking and whether they may: in rbac mode only, before routing, as the real server's filters.
    let admitted = if shared.authz.enforcing() {
        admit(&shared, &parts)
    } else {
        Ok(None)
    };
    let route = route(&shared.store, parts.uri.path());
    let mut key = RequestKey {
        verb: Verb::Get,
        group: String::new(),
        version: String::new(),
        resource: String::new(),
        subresource: String::new(),
        scope: String::new(),
        code: 0,
        client,
    };
    let response = match route {
        Route::Resource(target) => {
            if shared.journal.enabled() {
                object = (
                    target.namespace.clone().unwrap_or_default(),
                    target.name.clone().unwrap_or_default(),
                );
            }
            key.verb = verb_of(&parts.method, &target, &params, &parts.headers);
            key.group.clone_from(&target.info.group);
            key.version.clone_from(&target.info.version);
            key.resource.clone_from(&target.info.plural);
            key.subresource = target.subresource.clone().unwrap_or_default();
            key.scope = match (&target.name, &target.namespace) {
                (Some(_), _) => "resource",
                (None, Some(_)) => "namespace",
                (None, None) => "cluster",
            }
            .to_owned();
            let decision = shared
                .faults
                .decide(key.verb, &target.info.plural, &key.client, &listener);
            if !decision.latency.is_zero() && admitted.is_ok() {
                tokio::time::sleep(decision.latency).await;
            }
            if decision.hang && admitted.is_ok() {
                // Until the client gives up and the request is dropped: served, answered and counted never.
                std::future::pending::<()>().await;
            }
            match (admitted, decision.error) {
                (Err(refused), _) => error_response(&refused),
                (Ok(_), Some(error)) => {
                    let name = target.name.as_deref().unwrap_or_default();
                    error_response(&error.to_api_error(target.info.group_resource(), name))
                }
                (Ok(user), None) => {
                    let request = ResourceRequest {
                        shared: &shared,
                        target,
                        params,
                        headers: &parts.headers,
                        key: &key,
                        user: user.as_ref(),
                    };
                    match serve_resource(request, &parts.method, body).await {
                        Ok(response) => response,
                        Err(error) => error_response(&error),
                    }
                }
            }
        }
        other => {
            key.verb = if parts.method == Method::POST {
                Verb::Create
            } else {
                Verb::Get
            };
            match admitted {
                Err(refused) => error_response(&refused),
                Ok(user) => serve_other(&shared, other, &parts, user.as_ref()),
            }
        }
    };
    key.code = response.status().as_u16();
    if shared.journal.enabled() {
        let (namespace, name) = object;
        shared.journal.record(JournalEntry {
            started,
            finished: std::time::Instant::now(),
            key: key.clone(),
            namespace,
            name,
            listener,
        });
    }
    shared.requests.record(key);
    response
}

/// Authenticates and authorizes a request (rbac mode): the user, or the 401 or 403 to answer.
fn admit(shared: &Shared, parts: &http::request::Parts) -> Result<Option<UserInfo>, ApiError> {
    let path = parts.uri.path();
    let user = shared
        .authz
        .authenticate(&shared.store, &parts.headers, path)
        .ok_or(ApiError::Unauthorized)?;
    let user = shared.authz.impersonate(user, &parts.headers)?;
    let attrs = request_info(&parts.method, path, parts.uri.query());
    shared.authz.authorize(&user, &attrs)?;
    Ok(Some(user))
}

fn serve_other(
    shared: &Shared,
    route: Route,
    parts: &http::request::Parts,
    user: Option<&UserInfo>,
) -> Response {
    let method = &parts.method;
    let headers = &parts.headers;
    let get = |value: Option<Value>| match value {
        Some(value) if *method == Method::GET => json_response(StatusCode::OK, &value, &[]),
        Some(_) => error_response(&ApiError::MethodNotAllowed),
        None => error_response(&ApiError::NoSuchPath),
    };
    match route {
        Route::Version => get(Some(discovery::version())),
        Route::CoreVersions => get(Some(discovery::core_versions(
            header(headers, HOST).unwrap_or("127.0.0.1"),
        ))),
        Route::Groups => get(Some(discovery::groups(&shared.store.registry()))),
        Route::Group(group) => get(discovery::group(&shared.store.registry(), &group)),
        Route::Resources { group, version } => get(discovery::resource_list(
            &shared.store.registry(),
            &group,
            &version,
        )),
        Route::OpenApiRoot => get(Some(discovery::openapi_root(&shared.store.registry()))),
        Route::OpenApi(path) => get(discovery::openapi_group_version(&shared.store.registry(), &path)),
        Route::Metrics => {
            let mut text = shared.requests.snapshot().to_prometheus();
            text.push_str("# HELP apiserver_storage_objects Number of stored objects at the time of last check split by kind.\n");
            text.push_str("# TYPE apiserver_storage_objects gauge\n");
            for (key, count) in shared.store.counts() {
                let resource = if key.group.is_empty() {
                    key.plural
                } else {
                    format!("{}.{}", key.plural, key.group)
                };
                text.push_str(&format!(
                    "apiserver_storage_objects{{resource=\"{resource}\"}} {count}\n"
                ));
            }
            ([(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
        }
        Route::Health => ([(CONTENT_TYPE, "text/plain; charset=utf-8")], "ok").into_response(),
        Route::Compact if *method == Method::POST => {
            shared.store.compact();
            json_response(StatusCode::OK, &success_status(None), &[])
        }
        Route::Compact => error_response(&ApiError::MethodNotAllowed),
        Route::AuthorizationReport => {
            let attrs = request_info(method, parts.uri.path(), parts.uri.query());
            if let Err(refused) = shared.authz.masters_only(user, &attrs) {
                return error_response(&refused);
            }
            match *method {
                Method::GET => match serde_json::to_value(shared.authz.report()) {
                    Ok(report) => json_response(StatusCode::OK, &report, &[]),
                    Err(error) => error_response(&ApiError::Internal(error.to_string())),
                },
                Method::DELETE => {
                    shared.authz.reset_report();
                    json_response(StatusCode::OK, &success_status(None), &[])
                }
                _ => error_response(&ApiError::MethodNotAllowed),
            }
        }
        Route::Resource(_) | Route::Unknown => error_response(&ApiError::NoSuchPath),
    }
}

struct ResourceRequest<'a> {
    shared: &'a Shared,
    target: Target,
    params: Params,
    headers: &'a HeaderMap,
    key: &'a RequestKey,
    /// The authenticated user, in rbac mode.
    user: Option<&'a UserInfo>,
}

impl ResourceRequest<'_> {
    fn info(&self) -> &Arc<ResourceInfo> {
        &self.target.info
    }

    fn namespace(&self) -> &str {
        self.target.namespace.as_deref().unwrap_or_default()
    }

    fn name(&self) -> &str {
        self.target.name.as_deref().unwrap_or_default()
    }

    /// The form the client asked for; [`serve_resource`] has refused what cannot be given.
    fn projection(&self) -> Projection {
        self.asked_projection().unwrap_or_default()
    }

    fn asked_projection(&self) -> Result<Projection, ApiError> {
        Projection::from_request(
            header(self.headers, ACCEPT),
            self.params.get("includeObject"),
            self.shared.store.clock(),
        )
    }

    /// The `fieldManager`, else (except for apply, which must name one) the user agent's product.
    fn manager(&self, apply: bool) -> String {
        match self.params.get("fieldManager") {
            Some(manager) if !manager.is_empty() => manager.to_owned(),
            _ if apply => String::new(),
            _ => self.key.client.split('/').next().unwrap_or("unknown").to_owned(),
        }
    }

    /// The write's options, checked as `ValidateCreateOptions`, `ValidateUpdateOptions` and
    /// `ValidatePatchOptions` check them: every problem in one 422 on `CreateOptions.meta.k8s.io ""` (or
    /// `UpdateOptions`, `PatchOptions`).
    fn write_options(&self, status: bool, apply: bool) -> Result<WriteOptions, ApiError> {
        let patching = matches!(self.key.verb, Verb::Patch | Verb::Apply);
        let mut causes = Vec::new();
        let force = self.params.flag("force");
        // Any `force`, even false, is a `*bool` set on a patch that is not an apply.
        if patching && !apply && self.params.get("force").is_some() {
            causes.push(crate::causes::forbidden(
                "force",
                "may not be specified for non-apply patch",
            ));
        }
        let manager = self.manager(apply);
        if manager.len() > 128 {
            causes.push(crate::error::Cause {
                reason: "FieldValueTooLong".into(),
                message: "Too long: may not be more than 128 bytes".into(),
                field: "fieldManager".into(),
            });
        }
        if manager.chars().any(char::is_control) {
            causes.push(crate::causes::invalid(
                "fieldManager",
                &json!(manager),
                "must only contain printable characters",
            ));
        }
        let dry_run = match self.params.get("dryRun") {
            None | Some("") => false,
            Some("All") => true,
            Some(other) => {
                causes.push(crate::error::Cause {
                    reason: "FieldValueNotSupported".into(),
                    message: format!("Unsupported value: [{other:?}]: supported values: \"All\""),
                    field: "dryRun".into(),
                });
                false
            }
        };
        let validation = match self.params.get("fieldValidation") {
            None | Some("" | "Warn") => FieldValidation::Warn,
            Some("Ignore") => FieldValidation::Ignore,
            Some("Strict") => FieldValidation::Strict,
            Some(other) => {
                causes.push(crate::causes::unsupported(
                    "fieldValidation",
                    &json!(other),
                    &["", "Ignore", "Strict", "Warn"],
                ));
                FieldValidation::Warn
            }
        };
        if !causes.is_empty() {
            let kind = crate::error::GroupKind {
                group: "meta.k8s.io".into(),
                kind: match self.key.verb {
                    Verb::Create => "CreateOptions",
                    Verb::Update => "UpdateOptions",
                    _ => "PatchOptions",
                }
                .into(),
            };
            return Err(ApiError::invalid_causes(kind, "", causes));
        }
        Ok(WriteOptions {
            manager,
            dry_run,
            validation,
            status,
            force,
            keep_identity: false,
            duplicates: Vec::new(),
            escalation: self.escalation(),
            create_on_apply: if apply { self.create_on_apply() } else { None },
        })
    }

    /// For a server-side apply (rbac mode): the `create` authorization the API server also demands when
    /// the apply creates the object (its patch handler's create validation).
    fn create_on_apply(&self) -> Option<Arc<CreateOnApply>> {
        let user = self.user?;
        if user.is_master() {
            return None;
        }
        let info = self.info();
        let mut attrs =
            Attributes::resource("create", &info.group, &info.plural, self.namespace(), self.name());
        attrs.api_version.clone_from(&info.version);
        Some(Arc::new(CreateOnApply {
            authz: self.shared.authz.clone(),
            user: user.clone(),
            attrs,
        }))
    }

    /// The privilege-escalation check for a write of a Role or binding by someone outside
    /// `system:masters` (rbac mode only).
    fn escalation(&self) -> Option<Arc<Escalation>> {
        let user = self.user?;
        if self.info().group != RBAC_GROUP || user.is_master() {
            return None;
        }
        let mut attrs =
            Attributes::resource("", RBAC_GROUP, &self.info().plural, self.namespace(), self.name());
        attrs.verb = match self.key.verb {
            Verb::Create => "create",
            Verb::Update => "update",
            _ => "patch",
        }
        .to_owned();
        attrs.api_version.clone_from(&self.info().version);
        Some(Arc::new(Escalation {
            authz: self.shared.authz.clone(),
            user: user.clone(),
            attrs,
        }))
    }

    /// The list options in kube-apiserver's order of refusals: what does not parse (400), then
    /// `ListOptions` validation (422), then field labels the resource does not support (400).
    fn list_query(&self) -> Result<ListQuery, ApiError> {
        let labels = self.labels()?;
        let fields = self.field_selector()?;
        // A limit of zero or less lists everything, as the storage layer pages only when it is positive.
        let limit = self
            .params
            .integer("limit")?
            .and_then(|limit| usize::try_from(limit).ok())
            .filter(|limit| *limit > 0);
        let version_match = self.version_match(false)?;
        self.check_field_labels(&fields)?;
        Ok(ListQuery {
            labels,
            fields,
            limit,
            continue_token: self
                .params
                .get("continue")
                .filter(|c| !c.is_empty())
                .map(str::to_owned),
            resource_version: self.params.get("resourceVersion").map(str::to_owned),
            version_match,
        })
    }

    fn labels(&self) -> Result<LabelSelector, ApiError> {
        LabelSelector::parse(self.params.get("labelSelector").unwrap_or_default())
            .map_err(|e| ApiError::BadRequest(e.to_string()))
    }

    fn field_selector(&self) -> Result<FieldSelector, ApiError> {
        FieldSelector::parse(self.params.get("fieldSelector").unwrap_or_default())
            .map_err(|e| ApiError::BadRequest(e.to_string()))
    }

    fn check_field_labels(&self, fields: &FieldSelector) -> Result<(), ApiError> {
        match fields.fields().find(|f| self.info().field_label(f).is_none()) {
            Some(unsupported) => {
                let mut known: Vec<String> = self
                    .info()
                    .field_labels
                    .iter()
                    .map(|f| format!("{:?}", f.label))
                    .collect();
                known.sort();
                Err(ApiError::BadRequest(format!(
                    "{unsupported:?} is not a known field selector: only {}",
                    known.join(", ")
                )))
            }
            None => Ok(()),
        }
    }

    /// `resourceVersionMatch`, checked as `ValidateListOptions` checks it (422 on `ListOptions`): for a
    /// list it needs a `resourceVersion`, no `continue`, and `Exact` not `0`; a watch takes only
    /// `NotOlderThan`, and only with `sendInitialEvents`.
    fn version_match(&self, watching: bool) -> Result<Option<VersionMatch>, ApiError> {
        let text = self.params.get("resourceVersionMatch").unwrap_or_default();
        if text.is_empty() {
            return Ok(None);
        }
        let field = "resourceVersionMatch";
        let value = json!(text);
        let parsed = match text {
            "NotOlderThan" => Some(VersionMatch::NotOlderThan),
            "Exact" => Some(VersionMatch::Exact),
            _ => None,
        };
        let mut causes = Vec::new();
        if watching {
            if self.params.get("sendInitialEvents").is_none() {
                causes.push(crate::causes::forbidden(
                    field,
                    "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
                ));
            }
            if parsed != Some(VersionMatch::NotOlderThan) {
                causes.push(crate::causes::unsupported(field, &value, &["NotOlderThan"]));
            }
        } else {
            let version = self.params.get("resourceVersion").unwrap_or_default();
            if version.is_empty() {
                causes.push(crate::causes::forbidden(
                    field,
                    "resourceVersionMatch is forbidden unless resourceVersion is provided",
                ));
            }
            if self.params.get("continue").is_some_and(|c| !c.is_empty()) {
                causes.push(crate::causes::forbidden(
                    field,
                    "resourceVersionMatch is forbidden when continue is provided",
                ));
            }
            if parsed.is_none() {
                causes.push(crate::causes::unsupported(
                    field,
                    &value,
                    &["Exact", "NotOlderThan", ""],
                ));
            }
            if parsed == Some(VersionMatch::Exact) && version == "0" {
                causes.push(crate::causes::forbidden(
                    field,
                    "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
                ));
            }
        }
        if causes.is_empty() {
            Ok(parsed)
        } else {
            let kind = crate::error::GroupKind {
                group: "meta.k8s.io".into(),
                kind: "ListOptions".into(),
            };
            Err(ApiError::invalid_causes(kind, "", causes))
        }
    }

    fn object_response(
        &self,
        code: StatusCode,
        stored: &crate::object::Stored,
        warnings: &[String],
    ) -> Response {
        let body = encode::object(self.info(), stored, &self.projection());
        bytes_response(code, body, warnings)
    }
}

fn media_type(headers: &HeaderMap) -> &str {
    header(headers, CONTENT_TYPE)
        .and_then(|c| c.split(';').next())
        .unwrap_or_default()
        .trim()
}

/// A request body's bytes, refused past [`BODY_LIMIT`] as kube-apiserver refuses them.
async fn read_bytes(body: Body) -> Result<axum::body::Bytes, ApiError> {
    axum::body::to_bytes(body, BODY_LIMIT)
        .await
        .map_err(|_| ApiError::TooLarge(BODY_LIMIT))
}

async fn read_body(body: Body, headers: &HeaderMap) -> Result<Value, ApiError> {
    let bytes = read_bytes(body).await?;
    if bytes.is_empty() {
        return Ok(Value::Null);
    }
    if media_type(headers) == protobuf::MEDIA_TYPE {
        return protobuf::decode(&bytes);
    }
    parse_body(&bytes)
}

/// A create's or update's body, and the keys it gives twice.
async fn read_object_body(body: Body, headers: &HeaderMap) -> Result<(Value, Vec<String>), ApiError> {
    let bytes = read_bytes(body).await?;
    if bytes.is_empty() {
        return Ok((Value::Null, Vec::new()));
    }
    if media_type(headers) == protobuf::MEDIA_TYPE {
        return Ok((protobuf::decode(&bytes)?, Vec::new()));
    }
    let value = parse_body(&bytes)?;
    Ok((value, crate::patch::duplicate_fields(&bytes)))
}

/// A patch's body: an apply configuration in YAML or JSON; any other patch in JSON only, as kube-apiserver
/// decodes them.
async fn read_patch(body: Body, kind: PatchType) -> Result<Value, ApiError> {
    let bytes = read_bytes(body).await?;
    if bytes.is_empty() {
        return Ok(Value::Null);
    }
    if kind == PatchType::Apply {
        return parse_body(&bytes);
    }
    serde_json::from_slice(&bytes)
        .map_err(|error| ApiError::BadRequest(format!("error decoding patch: {error}")))
}

fn check_body_type(headers: &HeaderMap) -> Result<(), ApiError> {
    match media_type(headers) {
        "" | "application/json" | "application/yaml" | "*/*" | protobuf::MEDIA_TYPE => Ok(()),
        _ => Err(ApiError::UnsupportedMediaType {
            accepted: format!("application/json, application/yaml, {}", protobuf::MEDIA_TYPE),
        }),
    }
}

async fn serve_resource(
    request: ResourceRequest<'_>,
    method: &Method,
    body: Body,
) -> Result<Response, ApiError> {
    request.asked_projection()?;
    let target = &request.target;
    let subresource = target.subresource.as_deref();
    let info = request.info().clone();
    let watching = request.params.flag("watch");
    if info.create_only {
        return review(&request, method, body).await;
    }
    match (method.clone(), target.name.is_some(), subresource) {
        (Method::GET, _, None | Some("status")) if watching => watch(&request),
        (Method::GET, false, None) => list(&request),
        (Method::GET, true, None | Some("status")) => {
            let stored = request
                .shared
                .store
                .get(&info, request.namespace(), request.name())?;
            Ok(request.object_response(StatusCode::OK, &stored, &[]))
        }
        (Method::POST, false, None) => {
            check_body_type(request.headers)?;
            if info.namespaced && target.namespace.is_none() {
                return Err(ApiError::NoSuchPath);
            }
            let (body, duplicates) = read_object_body(body, request.headers).await?;
            let mut opts = request.write_options(false, false)?;
            opts.duplicates = duplicates;
            let written = request
                .shared
                .store
                .create(&info, target.namespace.as_deref(), body, &opts)?;
            Ok(request.object_response(StatusCode::CREATED, &written.object, &written.warnings))
        }
        (Method::GET, true, Some("log")) if info.is("", "Pod") => {
            let query = log_query(&request.params, request.name())?;
            let pod = request
                .shared
                .store
                .get(&info, request.namespace(), request.name())?
                .value();
            let log = crate::logs::pod_log(&pod, &query, &request.shared.logs)?;
            Ok((StatusCode::OK, [(CONTENT_TYPE, "text/plain")], log).into_response())
        }
        (Method::POST, true, Some("eviction")) if info.is("", "Pod") => {
            let eviction = read_body(body, request.headers).await?;
            let named = eviction
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or(request.name());
            if named != request.name() {
                return Err(ApiError::BadRequest(
                    "name in URL does not match name in Eviction object".into(),
                ));
            }
            request
                .shared
                .store
                .evict(request.namespace(), request.name(), &eviction)?;
            Ok(json_response(StatusCode::CREATED, &created_status(), &[]))
        }
        (Method::POST, true, Some("token")) if info.is("", "ServiceAccount") => {
            let token_request = read_body(body, request.headers).await?;
            let answer = request.shared.authz.token_request(
                &request.shared.store,
                request.namespace(),
                request.name(),
                &token_request,
            )?;
            Ok(json_response(StatusCode::CREATED, &answer, &[]))
        }
        (Method::POST, true, Some("binding")) if info.is("", "Pod") => {
            let binding = read_body(body, request.headers).await?;
            request.shared.store.bind(
                request.namespace(),
                request.name(),
                &binding,
                &request.manager(false),
            )?;
            Ok(json_response(StatusCode::CREATED, &created_status(), &[]))
        }
        (Method::PUT, true, None | Some("status")) => {
            check_body_type(request.headers)?;
            if subresource == Some("status") && !info.status_subresource {
                return Err(ApiError::NoSuchPath);
            }
            let (body, duplicates) = read_object_body(body, request.headers).await?;
            let mut opts = request.write_options(subresource == Some("status"), false)?;
            opts.duplicates = duplicates;
            let written =
                request
                    .shared
                    .store
                    .update(&info, request.namespace(), request.name(), body, &opts)?;
            Ok(request.object_response(StatusCode::OK, &written.object, &written.warnings))
        }
        (Method::PUT, true, Some("finalize")) if info.is("", "Namespace") => {
            let body = read_body(body, request.headers).await?;
            let stored =
                request
                    .shared
                    .store
                    .finalize_namespace(request.name(), &body, &request.manager(false))?;
            Ok(request.object_response(StatusCode::OK, &stored, &[]))
        }
        (Method::PATCH, true, None | Some("status")) => {
            if subresource == Some("status") && !info.status_subresource {
                return Err(ApiError::NoSuchPath);
            }
            let kind = PatchType::from_content_type(header(request.headers, CONTENT_TYPE))?;
            let patch = read_patch(body, kind).await?;
            let opts = request.write_options(subresource == Some("status"), kind == PatchType::Apply)?;
            let written = request.shared.store.patch(
                &info,
                request.namespace(),
                request.name(),
                kind,
                &patch,
                &opts,
            )?;
            let code = if written.created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            Ok(request.object_response(code, &written.object, &written.warnings))
        }
        (Method::DELETE, true, None) => {
            let body = read_body(body, request.headers).await?;
            let opts = delete_options(&request, &body)?;
            match request
                .shared
                .store
                .delete(&info, request.namespace(), request.name(), &opts)?
            {
                Deleted::Pending(stored) => Ok(request.object_response(StatusCode::OK, &stored, &[])),
                Deleted::Gone(stored)
                    if info.custom.is_some() || info.is("", "Pod") || info.is("", "Service") =>
                {
                    Ok(request.object_response(StatusCode::OK, &stored, &[]))
                }
                Deleted::Gone(stored) => {
                    let mut details =
                        json!({"name": stored.meta.name, "kind": info.plural, "uid": stored.meta.uid});
                    if !info.group.is_empty() {
                        details["group"] = json!(info.group);
                    }
                    Ok(json_response(StatusCode::OK, &success_status(Some(details)), &[]))
                }
            }
        }
        (Method::DELETE, false, None) => {
            let body = read_body(body, request.headers).await?;
            let opts = delete_options(&request, &body)?;
            let query = request.list_query()?;
            let deleted =
                request
                    .shared
                    .store
                    .delete_collection(&info, target.namespace.as_deref(), &query, &opts)?;
            let rv = request.shared.store.resource_version();
            let body = encode::list(&info, &deleted, rv, None, None, &request.projection());
            Ok(bytes_response(StatusCode::OK, body, &[]))
        }
        (_, _, Some(sub)) if !matches!(sub, "status" | "eviction" | "binding" | "finalize" | "token") => {
            Err(ApiError::NoSuchPath)
        }
        _ => Err(ApiError::MethodNotAllowed),
    }
}

/// Access reviews and `SelfSubjectReview`: answered on create from the authorizer, never stored.
async fn review(request: &ResourceRequest<'_>, method: &Method, body: Body) -> Result<Response, ApiError> {
    if *method != Method::POST || request.target.name.is_some() {
        return Err(ApiError::MethodNotAllowed);
    }
    let body = read_body(body, request.headers).await?;
    let authz = &request.shared.authz;
    let anonymous = UserInfo {
        name: "system:anonymous".into(),
        groups: vec!["system:unauthenticated".into()],
    };
    let user = request.user.unwrap_or(&anonymous);
    let answer = match request.info().kind.as_str() {
        "SelfSubjectAccessReview" => authz.review(Some(user), &body, "SelfSubjectAccessReview")?,
        "SubjectAccessReview" => authz.review(None, &body, "SubjectAccessReview")?,
        "SelfSubjectRulesReview" => authz.rules_review(user, &body),
        _ => json!({
            "kind": "SelfSubjectReview",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"creationTimestamp": null},
            "status": {"userInfo": {"username": user.name, "groups": user.groups}},
        }),
    };
    Ok(json_response(StatusCode::CREATED, &answer, &[]))
}

/// Delete options from the body, else the query, checked as `ValidateDeleteOptions` checks them (one 422
/// on `DeleteOptions.meta.k8s.io ""`).
fn delete_options(request: &ResourceRequest<'_>, body: &Value) -> Result<DeleteOptions, ApiError> {
    let mut causes = Vec::new();
    let text = |key: &str| {
        body.get(key)
            .and_then(Value::as_str)
            .map(str::to_owned)
            .or_else(|| request.params.get(key).map(str::to_owned))
    };
    let propagation = match text("propagationPolicy").as_deref() {
        None | Some("") => {
            let orphan = body.get("orphanDependents").and_then(Value::as_bool).or(
                match request.params.get("orphanDependents") {
                    Some("true") => Some(true),
                    Some("false") => Some(false),
                    _ => None,
                },
            );
            match orphan {
                Some(true) => Some(Propagation::Orphan),
                Some(false) => Some(Propagation::Background),
                None => None,
            }
        }
        Some("Orphan") => Some(Propagation::Orphan),
        Some("Background") => Some(Propagation::Background),
        Some("Foreground") => Some(Propagation::Foreground),
        Some(other) => {
            causes.push(crate::causes::unsupported(
                "propagationPolicy",
                &json!(other),
                &["Foreground", "Background", "Orphan", "nil"],
            ));
            None
        }
    };
    let grace = match body.get("gracePeriodSeconds").and_then(Value::as_i64) {
        Some(grace) => Some(grace),
        None => request.params.integer("gracePeriodSeconds")?,
    };
    let dry_run: Vec<String> = match body.get("dryRun").and_then(Value::as_array) {
        Some(values) => values
            .iter()
            .map(|v| v.as_str().unwrap_or_default().to_owned())
            .collect(),
        None => request
            .params
            .get("dryRun")
            .filter(|d| !d.is_empty())
            .map(str::to_owned)
            .into_iter()
            .collect(),
    };
    if dry_run.iter().any(|d| d != "All") {
        let values: Vec<String> = dry_run.iter().map(|d| format!("{d:?}")).collect();
        causes.push(crate::error::Cause {
            reason: "FieldValueNotSupported".into(),
            message: format!(
                "Unsupported value: [{}]: supported values: \"All\"",
                values.join(",")
            ),
            field: "dryRun".into(),
        });
    }
    if !causes.is_empty() {
        let kind = crate::error::GroupKind {
            group: "meta.k8s.io".into(),
            kind: "DeleteOptions".into(),
        };
        return Err(ApiError::invalid_causes(kind, "", causes));
    }
    let dry_run = !dry_run.is_empty();
    Ok(DeleteOptions {
        propagation,
        grace_period_seconds: grace,
        uid: body
            .pointer("/preconditions/uid")
            .and_then(Value::as_str)
            .map(str::to_owned),
        resource_version: body
            .pointer("/preconditions/resourceVersion")
            .and_then(Value::as_str)
            .map(str::to_owned),
        dry_run,
    })
}

fn list(request: &ResourceRequest<'_>) -> Result<Response, ApiError> {
    let query = request.list_query()?;
    let result = request
        .shared
        .store
        .list(request.info(), request.target.namespace.as_deref(), &query)?;
    let body = encode::list(
        request.info(),
        &result.items,
        result.resource_version,
        result.continue_token.as_deref(),
        result.remaining,
        &request.projection(),
    );
    Ok(bytes_response(StatusCode::OK, body, &[]))
}

/// `PodLogOptions` from the query, checked as `ValidatePodLogOptions` checks them (422 on the pod's name).
fn log_query(params: &Params, pod: &str) -> Result<crate::logs::LogQuery, ApiError> {
    let tail_lines = params.integer("tailLines")?;
    let limit_bytes = params.integer("limitBytes")?;
    let mut causes = Vec::new();
    if let Some(tail) = tail_lines.filter(|tail| *tail < 0) {
        causes.push(crate::causes::invalid(
            "tailLines",
            &json!(tail),
            "must be greater than or equal to 0",
        ));
    }
    if let Some(limit) = limit_bytes.filter(|limit| *limit < 1) {
        causes.push(crate::causes::invalid(
            "limitBytes",
            &json!(limit),
            "must be greater than 0",
        ));
    }
    if !causes.is_empty() {
        let kind = crate::error::GroupKind {
            group: String::new(),
            kind: "PodLogOptions".into(),
        };
        return Err(ApiError::invalid_causes(kind, pod, causes));
    }
    Ok(crate::logs::LogQuery {
        container: params.get("container").map(str::to_owned),
        previous: params.flag("previous"),
        tail_lines: tail_lines.and_then(|tail| u64::try_from(tail).ok()),
        limit_bytes: limit_bytes.and_then(|limit| u64::try_from(limit).ok()),
    })
}

fn watch(request: &ResourceRequest<'_>) -> Result<Response, ApiError> {
    let labels = request.labels()?;
    let mut fields = request.field_selector()?;
    let version_match = request.version_match(true)?;
    request.check_field_labels(&fields)?;
    if let Some(name) = request.target.name.as_deref() {
        // The legacy single-object watch: `.../pods/a?watch=true`.
        fields = FieldSelector::equals("metadata.name", name);
    }
    let query = WatchQuery {
        labels,
        fields: fields.clone(),
        resource_version: request.params.get("resourceVersion").map(str::to_owned),
        version_match,
        send_initial_events: request
            .params
            .get("sendInitialEvents")
            .map(|_| request.params.flag("sendInitialEvents")),
        bookmarks: request.params.flag("allowWatchBookmarks"),
    };
    let info = request.info().clone();
    // Read before the watch starts, so a bad value is a 400 and not a stream that never began.
    let timeout = match request.params.integer("timeoutSeconds")? {
        // kube-apiserver picks its own timeout for 0, and a negative one has passed already.
        None | Some(0) => request.shared.watch_timeout,
        Some(seconds) => Duration::from_secs(u64::try_from(seconds).unwrap_or(0)),
    };
    let start = request
        .shared
        .store
        .watch(&info, request.target.namespace.as_deref(), &query)?;
    let spec = WatchSpec {
        info,
        namespace: request.target.namespace.clone(),
        labels: query.labels,
        fields,
        bookmarks: query.bookmarks,
        bookmark_interval: request.shared.bookmark_interval,
        timeout,
        drop_after: request.shared.faults.drop_watches_after(),
        projection: request.projection(),
        committed: request.shared.store.committed(),
        delay: request.shared.faults.watch_delay(&request.info().plural),
        drops: request.shared.watch_drops.subscribe(),
    };
    let body = Body::from_stream(watch::stream(start, spec));
    let mut response = Response::new(body);
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Ok(response)
}

fn with_warnings(mut response: Response, warnings: &[String]) -> Response {
    for warning in warnings {
        let text = format!("299 - {}", Value::from(warning.as_str()));
        if let Ok(value) = HeaderValue::from_str(&text) {
            response.headers_mut().append("warning", value);
        }
    }
    response
}

fn bytes_response(code: StatusCode, body: Bytes, warnings: &[String]) -> Response {
    let response = (code, [(CONTENT_TYPE, "application/json")], body).into_response();
    with_warnings(response, warnings)
}

fn json_response(code: StatusCode, value: &Value, warnings: &[String]) -> Response {
    bytes_response(
        code,
        Bytes::from(serde_json::to_vec(value).unwrap_or_default()),
        warnings,
    )
}

fn error_response(error: &ApiError) -> Response {
    let code = StatusCode::from_u16(error.code()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = json_response(code, &error.status(), &[]);
    if let Some(seconds) = error.retry_after() {
        response
            .headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(seconds));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_escapes_decode_and_anything_else_is_kept() {
        assert_eq!(percent_decode("a%2Fb"), "a/b");
        assert_eq!(percent_decode("%C3%A9"), "\u{e9}");
        // A `%` before a multi-byte character, at the end, or before non-hex digits is data.
        assert_eq!(percent_decode("%\u{e9}"), "%\u{e9}");
        assert_eq!(percent_decode("a%"), "a%");
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
    }

    #[test]
    fn flags_and_integers_convert_as_kube_apiserver_converts_them() {
        let params = Params::parse(Some(
            "a=&b=0&c=FALSE&d=yes&n=12&n=13&bad=1x&big=9223372036854775808",
        ));
        assert!(params.flag("a"));
        assert!(!params.flag("b"));
        assert!(!params.flag("c"));
        assert!(params.flag("d"));
        assert!(!params.flag("absent"));
        assert_eq!(params.integer("n").ok(), Some(Some(12)));
        assert_eq!(
            params.integer("bad").map_err(|e| e.to_string()),
            Err(r#"strconv.ParseInt: parsing "1x": invalid syntax"#.to_owned())
        );
        assert_eq!(
            params.integer("big").map_err(|e| e.to_string()),
            Err(r#"strconv.ParseInt: parsing "9223372036854775808": value out of range"#.to_owned())
        );
    }
}
