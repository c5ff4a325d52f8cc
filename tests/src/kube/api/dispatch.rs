//! Routing an authorized request: discovery and health answered here, resource requests
//! handed to the module of their verb.

use super::request::{ParsedRequest, Query, Target};
use super::response::{Outcome, health_response};
use super::{ServerState, deletes, reads, writes};
use crate::kube::authn::UserInfo;
use crate::kube::discovery;
use crate::kube::disruption_log::Requester;
use crate::kube::resources::{self, ResourceType};
use crate::kube::status::ApiError;

/// A request for a resource (or one of its subresources), with what its verb handler needs.
pub(super) struct ResourceCall<'a> {
    pub state: &'a ServerState,
    pub resource: &'static ResourceType,
    pub namespace: &'a str,
    pub name: &'a str,
    pub subresource: &'a str,
    pub query: &'a Query,
    pub body: &'a [u8],
    pub content_type: &'a str,
    pub accept: &'a str,
    pub user: &'a UserInfo,
    pub requester: &'a Requester,
}

impl ResourceCall<'_> {
    /// The namespace a list, watch or deletecollection is limited to; none for all.
    pub fn namespace_scope(&self) -> Option<&str> {
        Some(self.namespace).filter(|ns| !ns.is_empty())
    }
}

pub(super) fn handle(
    state: &ServerState,
    request: &ParsedRequest,
    user: &UserInfo,
    requester: &Requester,
) -> Result<Outcome, ApiError> {
    match &request.target {
        Target::Version => Ok(Outcome::Json(200, discovery::version())),
        Target::Health => Ok(Outcome::Stream(health_response())),
        Target::CoreVersions => Ok(Outcome::Json(
            200,
            discovery::core_versions(&state.server_address),
        )),
        Target::Groups => Ok(Outcome::Json(200, discovery::groups())),
        Target::Group(group) => discovery::api_group(group)
            .map(|g| Outcome::Json(200, g))
            .ok_or_else(ApiError::path_not_found),
        Target::ResourceList(group, version) => discovery::resource_list(group, version)
            .map(|l| Outcome::Json(200, l))
            .ok_or_else(ApiError::path_not_found),
        Target::NotFound => Err(ApiError::path_not_found()),
        Target::Resource {
            resource,
            namespace,
            name,
            subresource,
        } => serve_resource(
            request.verb,
            &ResourceCall {
                state,
                resource,
                namespace,
                name,
                subresource,
                query: &request.query,
                body: &request.body,
                content_type: &request.content_type,
                accept: &request.accept,
                user,
                requester,
            },
        ),
    }
}

fn serve_resource(verb: &str, call: &ResourceCall<'_>) -> Result<Outcome, ApiError> {
    match verb {
        "get" => reads::get(call),
        "list" => reads::list(call),
        "watch" => reads::watch(call),
        "create" if call.subresource == "eviction" => writes::evict(call),
        "create" if call.resource.storage == resources::REVIEW => writes::review(call),
        "create" if call.subresource.is_empty() && call.name.is_empty() => writes::create(call),
        "update" => writes::update(call),
        "patch" => writes::patch(call),
        "delete" => deletes::delete(call),
        "deletecollection" => deletes::delete_collection(call),
        _ => Err(ApiError::method_not_allowed()),
    }
}
