//! What an injected fault does to a request: a delay, an error the real API server sends
//! under load or contention, or a dropped connection.

use super::request::{ParsedRequest, Target};
use crate::kube::faults::{FaultAction, FaultTarget};
use crate::kube::status::ApiError;

/// What is left of a request once its fault has acted.
pub(super) enum Injected {
    /// The request goes on (after a delay, for latency).
    Nothing,
    /// The request is answered with this error instead of being served.
    Error(ApiError),
    /// API Priority and Fairness sheds the request: 429 with `Retry-After` and a plain-text
    /// body (not a `Status`: kube-apiserver's filter answers before any API machinery).
    Shed { retry_after_seconds: u64 },
    /// The connection closes without an answer.
    DropConnection,
}

/// What fault rules match a request on.
pub(super) fn fault_target(request: &ParsedRequest) -> FaultTarget<'_> {
    let (resource, subresource, namespace, name) = target_names(&request.target);
    FaultTarget {
        verb: request.verb,
        resource,
        subresource,
        namespace,
        name,
        user_agent: &request.user_agent,
    }
}

/// Resource plural, subresource, namespace and name; empty for a non-resource path.
fn target_names(target: &Target) -> (&str, &str, &str, &str) {
    match target {
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
    }
}

pub(super) async fn inject(action: &FaultAction, request: &ParsedRequest) -> Injected {
    let (resource_name, _, namespace_name, object_name) = target_names(&request.target);
    match action {
        FaultAction::Latency(delay) => {
            tokio::time::sleep(*delay).await;
            Injected::Nothing
        }
        FaultAction::TooManyRequests {
            retry_after_seconds,
        } => Injected::Shed {
            retry_after_seconds: *retry_after_seconds,
        },
        FaultAction::InternalError => Injected::Error(ApiError::internal(
            "Internal error occurred: injected fault",
        )),
        FaultAction::ServiceUnavailable => Injected::Error(ApiError::new(
            503,
            "ServiceUnavailable",
            "the server is currently unable to handle the request",
        )),
        FaultAction::Conflict => Injected::Error(ApiError::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {resource_name} \"{object_name}\": the object has been modified; please apply your changes to the latest version and try again"
            ),
        )),
        FaultAction::NamespaceTerminating => Injected::Error(ApiError::namespace_terminating(
            resource_name,
            object_name,
            namespace_name,
        )),
        FaultAction::DropConnection => Injected::DropConnection,
    }
}
