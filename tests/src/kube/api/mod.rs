//! The HTTP front of the fake API server: request parsing (the apiserver's `RequestInfo`),
//! authentication, fault injection, authorization, the verbs, and one audit event per request.
//!
//! [`serve`] runs those steps in the apiserver's order; each step lives in its own module:
//! - `request`: the path, query and headers parsed into what a request addresses and its verb;
//! - `audit_entry`: the audit event each request leaves, begun on arrival, finished with the
//!   response;
//! - `fault_injection`: what an injected fault does to a request;
//! - `access`: the attributes RBAC decides on;
//! - `dispatch`: discovery and health, and the verb routing of resource requests to
//!   `reads` (get, list, watch), `writes` (create, update, patch, and the eviction and review
//!   POSTs) and `deletes` (delete, deletecollection);
//! - `response`: response bodies and the `Status` of an error.

mod access;
mod audit_entry;
mod deletes;
mod dispatch;
mod fault_injection;
mod reads;
mod request;
mod response;
mod writes;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};

use self::fault_injection::Injected;
use self::request::ParsedRequest;
use super::audit::{AuditLog, AuditUser};
use super::authn::Authenticator;
use super::disruption_log::{DisruptionLog, Requester};
use super::faults::Faults;
use super::status::ApiError;
use super::store::Store;

pub(crate) use self::response::ResponseBody;

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

/// Serves one request. Errors only to drop the connection.
pub(crate) async fn serve(
    state: Arc<ServerState>,
    request: Request<hyper::body::Incoming>,
    peer: SocketAddr,
) -> Result<Response<ResponseBody>, DropConnection> {
    let received = audit_entry::now_rfc3339_micros();
    let request = ParsedRequest::read(request).await?;
    let mut audit = audit_entry::begin(&request, peer, received);

    let user = match state.authn.authenticate(request.authorization.as_deref()) {
        Ok(user) => user,
        Err(error) => {
            tracing::debug!(%error, "fake API server refused a request as unauthenticated");
            return Ok(audit_entry::finish_with_error(
                &state.audit,
                audit,
                &ApiError::unauthorized(),
            ));
        }
    };
    audit.user = AuditUser {
        username: user.username.clone(),
        groups: user.groups.clone(),
    };

    if let Some(action) = state
        .faults
        .decide(&fault_injection::fault_target(&request))
    {
        audit.injected_fault = Some(action.describe());
        match fault_injection::inject(&action, &request).await {
            Injected::Nothing => {}
            Injected::Error(error) => {
                return Ok(audit_entry::finish_with_error(&state.audit, audit, &error));
            }
            Injected::Shed {
                retry_after_seconds,
            } => {
                let response = audit_entry::finish_shed(&state.audit, audit, retry_after_seconds);
                return Ok(response);
            }
            Injected::DropConnection => {
                audit_entry::record_dropped(&state.audit, audit);
                return Err(DropConnection);
            }
        }
    }

    if let Err(error) = access::authorize_request(&state.store, &request, &user) {
        return Ok(audit_entry::finish_with_error(&state.audit, audit, &error));
    }

    let requester = Requester {
        username: user.username.clone(),
        groups: user.groups.clone(),
        user_agent: request.user_agent.clone(),
    };
    let outcome = dispatch::handle(&state, &request, &user, &requester);
    Ok(audit_entry::finish_outcome(&state.audit, audit, outcome))
}
