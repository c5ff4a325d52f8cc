//! Authorization of a parsed request: the attributes RBAC decides on, as the real API server
//! derives them from its `RequestInfo`.

use super::request::{ParsedRequest, Target};
use crate::kube::authn::UserInfo;
use crate::kube::authz::{RequestAttributes, authorize};
use crate::kube::reviews;
use crate::kube::status::ApiError;
use crate::kube::store::Store;

/// Refuses a request its user may not make. Self reviews are allowed to everyone, as the
/// real server's `system:basic-user` binding allows them (the fake does not store it).
pub(super) fn authorize_request(
    store: &Store,
    request: &ParsedRequest,
    user: &UserInfo,
) -> Result<(), ApiError> {
    let attributes = attributes(request);
    let self_review = matches!(&request.target, Target::Resource { resource, .. } if reviews::is_self_review(resource, request.verb));
    match (self_review, authorize(store, user, &attributes)) {
        (false, Err(error)) => Err(error),
        _ => Ok(()),
    }
}

fn attributes(request: &ParsedRequest) -> RequestAttributes {
    let verb = request.verb;
    match &request.target {
        Target::Resource {
            resource,
            namespace,
            name,
            subresource,
        } => {
            // For list/watch the real server takes the name from `metadata.name=<x>` so that
            // resourceNames rules can allow a single-object watch.
            let selected_name = request
                .query
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
            path: Some(request.path.clone()),
            ..RequestAttributes::default()
        },
    }
}
