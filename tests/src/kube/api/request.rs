//! Request parsing, the fake's `RequestInfo`: what a path addresses, the query parameters the
//! server understands, the verb, and the headers and body the later steps read.

use http::{Method, Request, header};
use http_body_util::BodyExt as _;
use hyper::body::Bytes;
use serde_json::Value;

use super::DropConnection;
use crate::kube::resources::{self, ResourceType};
use crate::kube::status::ApiError;

/// What a request addresses.
#[derive(Debug, Clone)]
pub(super) enum Target {
    Version,
    Health,
    CoreVersions,
    Groups,
    Group(String),
    ResourceList(String, String),
    Resource {
        /// Found by the group/version of the URL (eviction accepts policy/v1beta1 bodies).
        resource: &'static ResourceType,
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
pub(super) struct Query {
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

/// A request with its body read and everything the later steps look at parsed once.
pub(super) struct ParsedRequest {
    pub path: String,
    /// Path and query as sent (the audit event's `requestURI`).
    pub request_uri: String,
    pub query: Query,
    pub target: Target,
    pub verb: &'static str,
    pub user_agent: String,
    pub content_type: String,
    pub accept: String,
    pub authorization: Option<String>,
    pub body: Bytes,
    /// The body when it is JSON, for the audit log (handlers parse `body` themselves, so a
    /// malformed body is still theirs to refuse).
    pub request_object: Option<Value>,
}

impl ParsedRequest {
    /// Reads the whole body; a body that cannot be read drops the connection.
    pub async fn read(request: Request<hyper::body::Incoming>) -> Result<Self, DropConnection> {
        let (parts, body) = request.into_parts();
        let header = |name: header::HeaderName| {
            parts
                .headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let path = parts.uri.path().to_owned();
        let request_uri = parts
            .uri
            .path_and_query()
            .map_or_else(|| path.clone(), |pq| pq.as_str().to_owned());
        let query = parse_query(parts.uri.query());
        let target = parse_path(&path);
        let verb = verb_of(&parts.method, &target, &query);
        let user_agent = header(header::USER_AGENT).unwrap_or_default();
        let content_type = header(header::CONTENT_TYPE).unwrap_or_default();
        let accept = header(header::ACCEPT).unwrap_or_default();
        let authorization = header(header::AUTHORIZATION);
        let body = match body.collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(_) => return Err(DropConnection),
        };
        let request_object: Option<Value> = if body.is_empty() {
            None
        } else {
            serde_json::from_slice(&body).ok()
        };
        Ok(Self {
            path,
            request_uri,
            query,
            target,
            verb,
            user_agent,
            content_type,
            accept,
            authorization,
            body,
            request_object,
        })
    }
}

/// The body of a write as JSON, refused the way the real server refuses it.
pub(super) fn parse_body(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!(
            "the object provided is unrecognized or invalid JSON: {e}"
        ))
    })
}
