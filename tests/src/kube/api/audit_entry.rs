//! The audit event of one request: begun when the request has been read, finished with the
//! response (or with the dropped connection) and recorded in the [`AuditLog`].

use std::net::SocketAddr;

use http::{Response, StatusCode};
use serde_json::Value;

use super::ResponseBody;
use super::request::{ParsedRequest, Target};
use super::response::{Outcome, error_response, json_response};
use crate::kube::audit::{AuditEvent, AuditLog, AuditUser, ObjectRef, ResponseStatus};
use crate::kube::status::ApiError;
use crate::kube::store::new_uid;

pub(super) fn now_rfc3339_micros() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%S%.6fZ")
        .to_string()
}

/// The event as it stands before authentication: no user, no response yet.
pub(super) fn begin(request: &ParsedRequest, peer: SocketAddr, received: String) -> AuditEvent {
    AuditEvent {
        kind: "Event".into(),
        api_version: "audit.k8s.io/v1".into(),
        level: "RequestResponse".into(),
        audit_id: new_uid(),
        stage: "ResponseComplete".into(),
        request_uri: request.request_uri.clone(),
        verb: request.verb.to_owned(),
        user: AuditUser::default(),
        source_ips: vec![peer.ip().to_string()],
        user_agent: request.user_agent.clone(),
        object_ref: object_ref(request),
        response_status: ResponseStatus::default(),
        request_object: request.request_object.clone(),
        response_object: None,
        request_received_timestamp: received,
        stage_timestamp: String::new(),
        injected_fault: None,
    }
}

/// The object a resource request addresses; a create names it in its body, not its path.
fn object_ref(request: &ParsedRequest) -> Option<ObjectRef> {
    let Target::Resource {
        resource,
        namespace,
        name,
        subresource,
    } = &request.target
    else {
        return None;
    };
    let mut object_ref = ObjectRef {
        resource: resource.plural.to_owned(),
        subresource: subresource.clone(),
        namespace: namespace.clone(),
        name: name.clone(),
        api_group: resource.group.to_owned(),
        api_version: resource.version.to_owned(),
    };
    if let ("create", Some(object)) = (request.verb, &request.request_object)
        && object_ref.name.is_empty()
    {
        object_ref.name = object
            .get("metadata")
            .and_then(|m| m.get("name"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
    }
    Some(object_ref)
}

/// Records what a handler answered and returns its response.
pub(super) fn finish_outcome(
    log: &AuditLog,
    mut audit: AuditEvent,
    outcome: Result<Outcome, ApiError>,
) -> Response<ResponseBody> {
    match outcome {
        Ok(Outcome::Json(code, value)) => {
            let response = json_response(code, &value);
            finish(log, audit, response, Some(value))
        }
        Ok(Outcome::Stream(response)) => {
            audit.stage = "ResponseStarted".into();
            finish(log, audit, response, None)
        }
        Err(error) => finish_with_error(log, audit, &error),
    }
}

/// Records a refused request and returns the error's `Status` response.
pub(super) fn finish_with_error(
    log: &AuditLog,
    audit: AuditEvent,
    error: &ApiError,
) -> Response<ResponseBody> {
    finish(log, audit, error_response(error), Some(error.to_status()))
}

/// A request API Priority and Fairness shed (see [`super::response::shed_response`]).
pub(super) fn finish_shed(
    log: &AuditLog,
    audit: AuditEvent,
    retry_after_seconds: u64,
) -> Response<ResponseBody> {
    finish(
        log,
        audit,
        super::response::shed_response(retry_after_seconds),
        None,
    )
}

/// Records a request whose connection an injected fault drops: no response, as the real
/// server's audit log shows a handler that panicked.
pub(super) fn record_dropped(log: &AuditLog, mut audit: AuditEvent) {
    audit.response_status.code = 0;
    audit.stage = "Panic".into();
    audit.stage_timestamp = now_rfc3339_micros();
    log.record(audit);
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
