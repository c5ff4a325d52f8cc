//! API errors as the real API server reports them: a `Status` object whose `reason`, `code`,
//! `message` and `details` clients branch on (kube-rs `ErrorResponse`, kubectl's
//! `apierrors.IsConflict`, `IsTooManyRequests`, ...).

use serde_json::{Value, json};

use super::resources::ResourceType;

/// A failed request, rendered as a `metav1.Status`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    pub code: u16,
    /// `NotFound`, `AlreadyExists`, `Conflict`, `BadRequest`, `Forbidden`, ...
    pub reason: &'static str,
    pub message: String,
    /// Boxed to keep `Result<_, ApiError>` small.
    pub details: Option<Box<Value>>,
    /// Seconds for a `Retry-After` header (429 and some 5xx).
    pub retry_after: Option<u64>,
    /// A `continue` token in the status's list metadata (an expired one's replacement).
    pub continue_token: Option<String>,
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
            retry_after: None,
            continue_token: None,
        }
    }

    pub fn with_details(mut self, details: Value) -> Self {
        self.details = Some(Box::new(details));
        self
    }

    fn resource_details(resource: &ResourceType, name: &str) -> Value {
        let mut details = json!({ "name": name, "kind": resource.plural });
        if !resource.group.is_empty() {
            details["group"] = json!(resource.group);
        }
        details
    }

    pub fn not_found(resource: &ResourceType, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", resource.qualified()),
        )
        .with_details(Self::resource_details(resource, name))
    }

    /// The namespace of a create does not exist.
    pub fn namespace_not_found(namespace: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("namespaces \"{namespace}\" not found"),
        )
        .with_details(json!({ "name": namespace, "kind": "namespaces" }))
    }

    /// The NamespaceLifecycle admission plugin's `403` for a create (an eviction included)
    /// in a namespace being deleted, with the cause clients check for.
    pub fn namespace_terminating(resource: &str, name: &str, namespace: &str) -> Self {
        Self::new(
            403,
            "Forbidden",
            format!(
                "{resource} \"{name}\" is forbidden: unable to create new content in namespace {namespace} because it is being terminated"
            ),
        )
        .with_details(json!({
            "name": name,
            "kind": resource,
            "causes": [{
                "reason": "NamespaceTerminating",
                "message": format!("namespace {namespace} is being terminated"),
                "field": "metadata.namespace",
            }]
        }))
    }

    pub fn already_exists(resource: &ResourceType, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", resource.qualified()),
        )
        .with_details(Self::resource_details(resource, name))
    }

    /// A stale `resourceVersion` on update or patch.
    pub fn conflict(resource: &ResourceType, name: &str) -> Self {
        Self::conflict_because(
            resource,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    pub fn conflict_because(resource: &ResourceType, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                resource.qualified()
            ),
        )
        .with_details(Self::resource_details(resource, name))
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub fn invalid(resource: &ResourceType, name: &str, message: impl Into<String>) -> Self {
        let message = message.into();
        Self::new(
            422,
            "Invalid",
            format!("{} \"{name}\" is invalid: {message}", resource.qualified()),
        )
        .with_details(Self::resource_details(resource, name))
    }

    pub fn method_not_allowed() -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
    }

    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json (got {content_type:?})"
            ),
        )
    }

    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    /// A 404 for a path the server does not serve at all.
    pub fn path_not_found() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
        .with_details(json!({}))
    }

    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// A list's `continue` token whose revision was compacted, as kube-apiserver's etcd3 store
    /// answers it: `410 Expired`, and in the list metadata a token for the rest of the list at
    /// its latest state (`rest`).
    pub fn continue_expired(rest: String) -> Self {
        let mut error = Self::gone(
            "The provided continue parameter is too old to display a consistent list result. \
             You can start a new list without the continue parameter, or use the continue token \
             in this response to retrieve the remainder of the results. Continuing with the \
             provided token results in an inconsistent list - objects that were created, \
             modified, or deleted between the time the first chunk was returned and now may show \
             up in the list.",
        );
        error.continue_token = Some(rest);
        error
    }

    /// The `Status` object sent as the body.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(details) = &self.details {
            status["details"] = (**details).clone();
        }
        if let Some(token) = &self.continue_token {
            status["metadata"] = json!({ "continue": token });
        }
        if self.reason.is_empty()
            && let Some(map) = status.as_object_mut()
        {
            map.remove("reason");
        }
        status
    }
}
