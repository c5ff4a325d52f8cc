//! The HTTP front of the fake API server: request parsing (the apiserver's `RequestInfo`),
//! authentication, fault injection, authorization, the verbs, and one audit event per request.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use serde_json::{Value, json};

use super::audit::{AuditEvent, AuditLog, AuditUser, ObjectRef, ResponseStatus};
use super::authn::{Authenticator, UserInfo};
use super::authz::{RequestAttributes, authorize};
use super::discovery;
use super::disruption_log::{DisruptionLog, PendingDeletion, Requester};
use super::eviction_api;
use super::faults::{FaultAction, FaultTarget, Faults};
use super::fields::FieldQuery;
use super::patch::{self, PatchType};
use super::resources::{self, ResourceType};
use super::reviews;
use super::selectors::LabelQuery;
use super::status::ApiError;
use super::store::{DeleteOptions, Origin, Store, UpdateMode, new_uid};
use super::table;
use super::watch::{self, WatchRequest};

pub(crate) type ResponseBody = BoxBody<Bytes, Infallible>;

/// Makes hyper close the connection without a response (the "dropped connection" fault).
#[derive(Debug)]
pub(crate) struct DropConnection;

impl std::fmt::Display for DropConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connection dropped by fault injection")
    }
}

impl std::error::Error for DropConnection {}

/// Everything a request handler needs.
pub(crate) struct ServerState {
    pub store: Store,
    pub audit: AuditLog,
    pub disruptions: DisruptionLog,
    pub faults: Faults,
    pub authn: Authenticator,
    pub bookmark_interval: Duration,
    pub server_address: String,
    pub shutdown: tokio::sync::watch::Receiver<bool>,
}

/// What a request addresses.
#[derive(Debug, Clone)]
enum Target {
    Version,
    Health,
    CoreVersions,
    Groups,
    Group(String),
    ResourceList(String, String),
    Resource {
        resource: &'static ResourceType,
        /// The group/version of the URL (eviction accepts policy/v1beta1 bodies).
        namespace: String,
        name: String,
        subresource: String,
    },
    NotFound,
}

fn parse_path(path: &str) -> Target {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    match segments.as_slice() {
        ["version"] => Target::Version,
        ["healthz" | "livez" | "readyz", ..] => Target::Health,
        ["api"] => Target::CoreVersions,
        ["apis"] => Target::Groups,
        ["apis", group] => Target::Group((*group).to_owned()),
        ["api", version] => Target::ResourceList(String::new(), (*version).to_owned()),
        ["apis", group, version] => {
            Target::ResourceList((*group).to_owned(), (*version).to_owned())
        }
        ["api", version, rest @ ..] => resource_target("", version, rest),
        ["apis", group, version, rest @ ..] => resource_target(group, version, rest),
        _ => Target::NotFound,
    }
}

fn resource_target(group: &str, version: &str, rest: &[&str]) -> Target {
    let (namespace, rest) = match rest {
        ["namespaces", namespace, third, ..] if !matches!(*third, "status" | "finalize") => {
            (*namespace, &rest[2..])
        }
        _ => ("", rest),
    };
    let (plural, name, subresource) = match rest {
        [plural] => (*plural, "", ""),
        [plural, name] => (*plural, *name, ""),
        [plural, name, sub] => (*plural, *name, *sub),
        _ => return Target::NotFound,
    };
    let Some(resource) = resources::find(group, version, plural) else {
        return Target::NotFound;
    };
    if !resource.namespaced && !namespace.is_empty() {
        return Target::NotFound;
    }
    if resource.namespaced && namespace.is_empty() && !name.is_empty() {
        return Target::NotFound;
    }
    let subresource_ok = match subresource {
        "" => true,
        "status" => resource.has_status,
        "eviction" => resource.plural == "pods" && resource.group.is_empty(),
        _ => false,
    };
    if !subresource_ok {
        return Target::NotFound;
    }
    Target::Resource {
        resource,
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        subresource: subresource.to_owned(),
    }
}

/// The query parameters the server understands.
#[derive(Debug, Default)]
pub(crate) struct Query {
    pub label_selector: Option<String>,
    pub field_selector: Option<String>,
    pub limit: Option<usize>,
    pub continue_token: Option<String>,
    pub watch: bool,
    pub resource_version: Option<String>,
    pub timeout_seconds: Option<u64>,
    pub allow_watch_bookmarks: bool,
    pub grace_period_seconds: Option<i64>,
    pub dry_run: bool,
}

fn parse_query(query: Option<&str>) -> Query {
    let mut parsed = Query::default();
    for (key, value) in url::form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        match key.as_ref() {
            "labelSelector" => parsed.label_selector = Some(value.into_owned()),
            "fieldSelector" => parsed.field_selector = Some(value.into_owned()),
            "limit" => parsed.limit = value.parse().ok().filter(|l| *l > 0),
            "continue" => {
                parsed.continue_token = Some(value.into_owned()).filter(|c| !c.is_empty())
            }
            "watch" => parsed.watch = value == "true" || value == "1",
            "resourceVersion" => parsed.resource_version = Some(value.into_owned()),
            "timeoutSeconds" => parsed.timeout_seconds = value.parse().ok(),
            "allowWatchBookmarks" => parsed.allow_watch_bookmarks = value == "true",
            "gracePeriodSeconds" => parsed.grace_period_seconds = value.parse().ok(),
            "dryRun" => parsed.dry_run = !value.is_empty(),
            _ => {}
        }
    }
    parsed
}

fn verb_of(method: &Method, target: &Target, query: &Query) -> &'static str {
    let has_name = matches!(target, Target::Resource { name, .. } if !name.is_empty());
    match *method {
        Method::GET | Method::HEAD if has_name => "get",
        Method::GET | Method::HEAD if query.watch => "watch",
        Method::GET | Method::HEAD => match target {
            Target::Resource { .. } => "list",
            _ => "get",
        },
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if has_name => "delete",
        Method::DELETE => "deletecollection",
        _ => "unknown",
    }
}

pub(crate) fn full_body(bytes: impl Into<Bytes>) -> ResponseBody {
    Full::new(bytes.into()).boxed()
}

pub(crate) fn json_response(code: u16, value: &Value) -> Response<ResponseBody> {
    let body = serde_json::to_vec(value).unwrap_or_default();
    let mut response = Response::new(full_body(body));
    *response.status_mut() =
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

fn error_response(error: &ApiError) -> Response<ResponseBody> {
    let mut response = json_response(error.code, &error.to_status());
    if let Some(seconds) = error.retry_after
        && let Ok(value) = HeaderValue::from_str(&seconds.to_string())
    {
        response.headers_mut().insert(header::RETRY_AFTER, value);
    }
    response
}

/// The outcome of a handled request, before it becomes an HTTP response.
enum Outcome {
    Json(u16, Value),
    Stream(Response<ResponseBody>),
}

fn header_str<B>(request: &Request<B>, name: header::HeaderName) -> Option<&str> {
    request.headers().get(name).and_then(|v| v.to_str().ok())
}

/// Serves one request. Errors only to drop the connection.
pub(crate) async fn serve(
    state: Arc<ServerState>,
    request: Request<hyper::body::Incoming>,
    peer: SocketAddr,
) -> Result<Response<ResponseBody>, DropConnection> {
    let received = now_rfc3339_micros();
    let (parts, body) = request.into_parts();
    let request = Request::from_parts(parts, ());
    let path = request.uri().path().to_owned();
    let request_uri = request
        .uri()
        .path_and_query()
        .map_or_else(|| path.clone(), |pq| pq.as_str().to_owned());
    let query = parse_query(request.uri().query());
    let target = parse_path(&path);
    let verb = verb_of(request.method(), &target, &query);
    let user_agent = header_str(&request, header::USER_AGENT)
        .unwrap_or_default()
        .to_owned();
    let content_type = header_str(&request, header::CONTENT_TYPE)
        .unwrap_or_default()
        .to_owned();
    let accept = header_str(&request, header::ACCEPT)
        .unwrap_or_default()
        .to_owned();
    let body = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => return Err(DropConnection),
    };
    let request_object: Option<Value> = if body.is_empty() {
        None
    } else {
        serde_json::from_slice(&body).ok()
    };

    let mut object_ref = match &target {
        Target::Resource {
            resource,
            namespace,
            name,
            subresource,
        } => Some(ObjectRef {
            resource: resource.plural.to_owned(),
            subresource: subresource.clone(),
            namespace: namespace.clone(),
            name: name.clone(),
            api_group: resource.group.to_owned(),
            api_version: resource.version.to_owned(),
        }),
        _ => None,
    };
    if let (Some(object_ref), "create", Some(object)) = (object_ref.as_mut(), verb, &request_object)
        && object_ref.name.is_empty()
    {
        object_ref.name = object
            .get("metadata")
            .and_then(|m| m.get("name"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
    }
    let mut audit = AuditEvent {
        kind: "Event".into(),
        api_version: "audit.k8s.io/v1".into(),
        level: "RequestResponse".into(),
        audit_id: new_uid(),
        stage: "ResponseComplete".into(),
        request_uri,
        verb: verb.to_owned(),
        user: AuditUser::default(),
        source_ips: vec![peer.ip().to_string()],
        user_agent: user_agent.clone(),
        object_ref,
        response_status: ResponseStatus::default(),
        request_object: request_object.clone(),
        response_object: None,
        request_received_timestamp: received,
        stage_timestamp: String::new(),
        injected_fault: None,
    };

    let authorization = header_str(&request, header::AUTHORIZATION);
    let user = match state.authn.authenticate(authorization) {
        Ok(user) => user,
        Err(error) => {
            tracing::debug!(%error, "fake API server refused a request as unauthenticated");
            return Ok(finish(
                &state.audit,
                audit,
                error_response(&ApiError::unauthorized()),
                Some(ApiError::unauthorized().to_status()),
            ));
        }
    };
    audit.user = AuditUser {
        username: user.username.clone(),
        groups: user.groups.clone(),
    };

    let (resource_name, subresource_name, namespace_name, object_name) = match &target {
        Target::Resource {
            resource,
            namespace,
            name,
            subresource,
        } => (
            resource.plural,
            subresource.as_str(),
            namespace.as_str(),
            name.as_str(),
        ),
        _ => ("", "", "", ""),
    };
    let fault = state.faults.decide(&FaultTarget {
        verb,
        resource: resource_name,
        subresource: subresource_name,
        namespace: namespace_name,
        name: object_name,
        user_agent: &user_agent,
    });
    if let Some(action) = &fault {
        audit.injected_fault = Some(action.describe());
        let error = match action {
            FaultAction::Latency(delay) => {
                tokio::time::sleep(*delay).await;
                None
            }
            FaultAction::TooManyRequests {
                retry_after_seconds,
            } => {
                let mut error = ApiError::new(
                    429,
                    "TooManyRequests",
                    "Too many requests, please try again later.",
                )
                .with_details(json!({ "retryAfterSeconds": retry_after_seconds }));
                error.retry_after = Some(*retry_after_seconds);
                Some(error)
            }
            FaultAction::InternalError => Some(ApiError::internal(
                "Internal error occurred: injected fault",
            )),
            FaultAction::ServiceUnavailable => Some(ApiError::new(
                503,
                "ServiceUnavailable",
                "the server is currently unable to handle the request",
            )),
            FaultAction::Conflict => Some(ApiError::new(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {resource_name} \"{object_name}\": the object has been modified; please apply your changes to the latest version and try again"
                ),
            )),
            FaultAction::NamespaceTerminating => Some(
                ApiError::new(
                    403,
                    "Forbidden",
                    format!(
                        "{resource_name} \"{object_name}\" is forbidden: unable to create new content in namespace {namespace_name} because it is being terminated"
                    ),
                )
                .with_details(json!({
                    "causes": [{
                        "reason": "NamespaceTerminating",
                        "message": format!("namespace {namespace_name} is being terminated"),
                        "field": "metadata.namespace",
                    }]
                })),
            ),
            FaultAction::DropConnection => {
                audit.response_status.code = 0;
                audit.stage = "Panic".into();
                audit.stage_timestamp = now_rfc3339_micros();
                state.audit.record(audit);
                return Err(DropConnection);
            }
        };
        if let Some(error) = error {
            return Ok(finish(
                &state.audit,
                audit,
                error_response(&error),
                Some(error.to_status()),
            ));
        }
    }

    let attributes = match &target {
        Target::Resource {
            resource,
            namespace,
            name,
            subresource,
        } => {
            // For list/watch the real server takes the name from `metadata.name=<x>` so that
            // resourceNames rules can allow a single-object watch.
            let selected_name = query
                .field_selector
                .as_deref()
                .and_then(|s| {
                    s.split(',')
                        .find_map(|term| term.trim().strip_prefix("metadata.name="))
                })
                .filter(|_| name.is_empty() && matches!(verb, "list" | "watch"));
            let name = selected_name.map_or_else(|| name.clone(), str::to_owned);
            RequestAttributes {
                verb: verb.to_owned(),
                api_group: resource.group.to_owned(),
                resource: resource.plural.to_owned(),
                subresource: Some(subresource.clone()).filter(|s| !s.is_empty()),
                namespace: Some(namespace.clone()).filter(|s| !s.is_empty()),
                name: Some(name).filter(|s| !s.is_empty()),
                path: None,
            }
        }
        _ => RequestAttributes {
            verb: verb.to_owned(),
            path: Some(path.clone()),
            ..RequestAttributes::default()
        },
    };
    let self_review = matches!(&target, Target::Resource { resource, .. } if reviews::is_self_review(resource, verb));
    if let (false, Err(error)) = (self_review, authorize(&state.store, &user, &attributes)) {
        return Ok(finish(
            &state.audit,
            audit,
            error_response(&error),
            Some(error.to_status()),
        ));
    }

    let requester = Requester {
        username: user.username.clone(),
        groups: user.groups.clone(),
        user_agent: user_agent.clone(),
    };
    let outcome = handle(
        &state,
        &target,
        verb,
        &query,
        &body,
        &content_type,
        &accept,
        &user,
        &requester,
    );
    match outcome {
        Ok(Outcome::Json(code, value)) => {
            let response = json_response(code, &value);
            Ok(finish(&state.audit, audit, response, Some(value)))
        }
        Ok(Outcome::Stream(response)) => {
            audit.stage = "ResponseStarted".into();
            Ok(finish(&state.audit, audit, response, None))
        }
        Err(error) => Ok(finish(
            &state.audit,
            audit,
            error_response(&error),
            Some(error.to_status()),
        )),
    }
}

fn now_rfc3339_micros() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%S%.6fZ")
        .to_string()
}

fn finish(
    log: &AuditLog,
    mut audit: AuditEvent,
    response: Response<ResponseBody>,
    response_object: Option<Value>,
) -> Response<ResponseBody> {
    audit.response_status.code = response.status().as_u16();
    if let Some(object) = &response_object
        && object.get("kind").and_then(Value::as_str) == Some("Status")
    {
        audit.response_status.reason = object
            .get("reason")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        audit.response_status.message = object
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
    }
    if audit.response_status.code >= 400 && audit.response_status.reason.is_empty() {
        // Error bodies were built by error_response; keep their code only.
        audit.response_status.reason = StatusCode::from_u16(audit.response_status.code)
            .ok()
            .and_then(|c| c.canonical_reason())
            .unwrap_or_default()
            .to_owned();
    }
    // List/discovery responses can be large; the log keeps write responses only.
    if !matches!(audit.verb.as_str(), "get" | "list" | "watch") {
        audit.response_object = response_object;
    }
    audit.stage_timestamp = now_rfc3339_micros();
    log.record(audit);
    response
}

/// Core `pods` (the only resource whose deletion the disruption log keeps).
fn is_pods(resource: &ResourceType) -> bool {
    resource.group.is_empty() && resource.plural == "pods"
}

fn parse_body(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!(
            "the object provided is unrecognized or invalid JSON: {e}"
        ))
    })
}

fn label_query(query: &Query) -> Result<LabelQuery, ApiError> {
    LabelQuery::parse(query.label_selector.as_deref().unwrap_or_default())
        .map_err(|e| ApiError::bad_request(e.to_string()))
}

/// `dryRun=All` for update/patch: the conflict check, then the object as it would be
/// written; nothing is stored.
fn dry_run_write(
    resource: &ResourceType,
    name: &str,
    current: &Value,
    object: Value,
) -> Result<Outcome, ApiError> {
    let wanted = super::store::meta_str(&object, "resourceVersion");
    if !wanted.is_empty() && wanted != super::store::meta_str(current, "resourceVersion") {
        return Err(ApiError::conflict(resource, name));
    }
    Ok(Outcome::Json(200, object))
}

#[allow(clippy::too_many_arguments)]
fn handle(
    state: &ServerState,
    target: &Target,
    verb: &str,
    query: &Query,
    body: &[u8],
    content_type: &str,
    accept: &str,
    user: &UserInfo,
    requester: &Requester,
) -> Result<Outcome, ApiError> {
    let (resource, namespace, name, subresource) = match target {
        Target::Version => return Ok(Outcome::Json(200, discovery::version())),
        Target::Health => {
            let mut response = Response::new(full_body("ok"));
            response
                .headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
            return Ok(Outcome::Stream(response));
        }
        Target::CoreVersions => {
            return Ok(Outcome::Json(
                200,
                discovery::core_versions(&state.server_address),
            ));
        }
        Target::Groups => return Ok(Outcome::Json(200, discovery::groups())),
        Target::Group(group) => {
            return discovery::api_group(group)
                .map(|g| Outcome::Json(200, g))
                .ok_or_else(ApiError::path_not_found);
        }
        Target::ResourceList(group, version) => {
            return discovery::resource_list(group, version)
                .map(|l| Outcome::Json(200, l))
                .ok_or_else(ApiError::path_not_found);
        }
        Target::NotFound => return Err(ApiError::path_not_found()),
        Target::Resource {
            resource,
            namespace,
            name,
            subresource,
        } => (
            *resource,
            namespace.as_str(),
            name.as_str(),
            subresource.as_str(),
        ),
    };
    let store = &state.store;
    match verb {
        "get" => {
            let object = store.lock().get(resource, namespace, name)?;
            Ok(Outcome::Json(
                200,
                table::maybe_table(resource, accept, vec![object], None, false),
            ))
        }
        "list" => {
            let labels = label_query(query)?;
            let fields = FieldQuery::parse(
                query.field_selector.as_deref().unwrap_or_default(),
                resource,
            )?;
            let namespace = Some(namespace).filter(|ns| !ns.is_empty());
            let page = store.lock().list(
                resource,
                namespace,
                &labels,
                &fields,
                query.limit,
                query.continue_token.as_deref(),
            )?;
            if table::wants_table(accept) {
                return Ok(Outcome::Json(
                    200,
                    table::maybe_table(resource, accept, page.items.clone(), Some(&page), true),
                ));
            }
            let items: Vec<Value> = page
                .items
                .into_iter()
                .map(|mut item| {
                    if let Some(map) = item.as_object_mut() {
                        map.remove("kind");
                        map.remove("apiVersion");
                    }
                    item
                })
                .collect();
            let mut metadata = json!({ "resourceVersion": page.resource_version.to_string() });
            if let Some(token) = &page.continue_token {
                metadata["continue"] = json!(token);
            }
            if let Some(remaining) = page.remaining {
                metadata["remainingItemCount"] = json!(remaining);
            }
            Ok(Outcome::Json(
                200,
                json!({
                    "kind": resource.list_kind(),
                    "apiVersion": resource.api_version(),
                    "metadata": metadata,
                    "items": items,
                }),
            ))
        }
        "watch" => {
            let labels = label_query(query)?;
            let fields = FieldQuery::parse(
                query.field_selector.as_deref().unwrap_or_default(),
                resource,
            )?;
            let response = watch::start(
                state,
                WatchRequest {
                    resource,
                    namespace: Some(namespace.to_owned()).filter(|ns| !ns.is_empty()),
                    labels,
                    fields,
                    resource_version: query.resource_version.clone(),
                    timeout: Duration::from_secs(query.timeout_seconds.unwrap_or(1800)),
                    bookmarks: query.allow_watch_bookmarks,
                },
            )?;
            Ok(Outcome::Stream(response))
        }
        "create" if subresource == "eviction" => {
            let eviction = parse_body(body)?;
            let status = eviction_api::evict(
                store,
                &state.disruptions,
                requester,
                namespace,
                name,
                &eviction,
                query.dry_run,
            )?;
            Ok(Outcome::Json(201, status))
        }
        "create" if resource.storage == resources::REVIEW => {
            let review = reviews::answer(store, resource, user, parse_body(body)?)?;
            Ok(Outcome::Json(201, review))
        }
        "create" if subresource.is_empty() && name.is_empty() => {
            let object = parse_body(body)?;
            if query.dry_run {
                return Ok(Outcome::Json(201, object));
            }
            let created = store
                .lock()
                .create(resource, namespace, object, Origin::Client)?;
            Ok(Outcome::Json(201, created))
        }
        "update" => {
            let object = parse_body(body)?;
            let mode = if subresource == "status" {
                UpdateMode::Status
            } else {
                UpdateMode::Main
            };
            if query.dry_run {
                let current = store.lock().get(resource, namespace, name)?;
                return dry_run_write(resource, name, &current, object);
            }
            let updated = store
                .lock()
                .update(resource, namespace, name, object, mode)?;
            Ok(Outcome::Json(200, updated))
        }
        "patch" => {
            let patch_type = PatchType::from_content_type(content_type)?;
            let mode = if subresource == "status" {
                UpdateMode::Status
            } else {
                UpdateMode::Main
            };
            let mut guard = store.lock();
            let current = match guard.get(resource, namespace, name) {
                Ok(current) => current,
                Err(error) if error.code == 404 && patch_type == PatchType::Apply => {
                    let object = patch::parse_json_or_yaml(body, patch_type)?;
                    let created = guard.create(resource, namespace, object, Origin::Client)?;
                    return Ok(Outcome::Json(201, created));
                }
                Err(error) => return Err(error),
            };
            let patched = patch::apply(resource, patch_type, &current, body)?;
            if query.dry_run {
                return dry_run_write(resource, name, &current, patched);
            }
            let updated = guard.update(resource, namespace, name, patched, mode)?;
            Ok(Outcome::Json(200, updated))
        }
        "delete" => {
            let mut options = if body.is_empty() {
                DeleteOptions::default()
            } else {
                DeleteOptions::from_json(&parse_body(body)?)
            };
            if query.grace_period_seconds.is_some() {
                options.grace_period_seconds = query.grace_period_seconds;
            }
            let mut guard = store.lock();
            // A pod DELETE bypasses the eviction subresource and every PDB: the disruption
            // log keeps it, with the budgets' counts, under the lock of the delete.
            let pending = is_pods(resource).then(|| {
                PendingDeletion::before(
                    &guard,
                    namespace,
                    name,
                    requester,
                    false,
                    query.dry_run,
                    options.grace_period_seconds,
                )
            });
            let result = if query.dry_run {
                // `dryRun=All`: what exists is answered, nothing is deleted.
                guard.get(resource, namespace, name)
            } else {
                guard
                    .delete(resource, namespace, name, &options)
                    .map(|deleted| deleted.body().clone())
            };
            if let Some(pending) = pending {
                let code = result.as_ref().map_or_else(|error| error.code, |_| 200);
                pending.finish(&guard, code, &state.disruptions);
            }
            Ok(Outcome::Json(200, result?))
        }
        "deletecollection" => {
            let labels = label_query(query)?;
            let fields = FieldQuery::parse(
                query.field_selector.as_deref().unwrap_or_default(),
                resource,
            )?;
            let mut options = if body.is_empty() {
                DeleteOptions::default()
            } else {
                DeleteOptions::from_json(&parse_body(body)?)
            };
            if query.grace_period_seconds.is_some() {
                options.grace_period_seconds = query.grace_period_seconds;
            }
            let mut guard = store.lock();
            let namespace = Some(namespace).filter(|ns| !ns.is_empty());
            let page = guard.list(resource, namespace, &labels, &fields, None, None)?;
            let mut items = Vec::new();
            for item in page.items {
                let item_namespace = super::store::meta_str(&item, "namespace").to_owned();
                let item_name = super::store::meta_str(&item, "name").to_owned();
                let pending = is_pods(resource).then(|| {
                    PendingDeletion::before(
                        &guard,
                        &item_namespace,
                        &item_name,
                        requester,
                        true,
                        false,
                        options.grace_period_seconds,
                    )
                });
                let result = guard.delete(resource, &item_namespace, &item_name, &options);
                if let Some(pending) = pending {
                    let code = result.as_ref().map_or_else(|error| error.code, |_| 200);
                    pending.finish(&guard, code, &state.disruptions);
                }
                if let Ok(deleted) = result {
                    items.push(deleted.body().clone());
                }
            }
            Ok(Outcome::Json(
                200,
                json!({
                    "kind": resource.list_kind(),
                    "apiVersion": resource.api_version(),
                    "metadata": { "resourceVersion": guard.resource_version().to_string() },
                    "items": items,
                }),
            ))
        }
        _ => Err(ApiError::method_not_allowed()),
    }
}
