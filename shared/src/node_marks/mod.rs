//! What our functions leave on a Node and read back, shared by the three that touch nodes:
//! the drain takes a node out of service and records what it did in its checkpoint
//! ([`checkpoint`]); the launching hook undoes exactly that on a node back from a warm pool;
//! node repair sees a drain at work by it. Also the pieces every Event about a Node shares
//! ([`events`]) and the rule for writing a Node against concurrent changes.

pub mod checkpoint;
pub mod events;
pub mod out_of_service;
pub mod refresh;

use k8s_openapi::api::core::v1::Node;

/// The well-known label that makes the service controller drop the node from external load
/// balancers.
pub const EXCLUDE_FROM_LOAD_BALANCERS_LABEL: &str =
    "node.kubernetes.io/exclude-from-external-load-balancers";

/// Whether `node` carries `node.kubernetes.io/exclude-from-external-load-balancers=true`.
pub(crate) fn excluded_from_load_balancers(node: &Node) -> bool {
    node.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(EXCLUDE_FROM_LOAD_BALANCERS_LABEL))
        .is_some_and(|v| v == "true")
}

/// How many times a write to a Node lost to a concurrent change is recomputed and retried
/// (the drain's checkpoint, the warm-pool undo). Node objects change often (kubelet status),
/// so a conflict is normal, not an error.
pub(crate) const CONFLICT_ATTEMPTS: u32 = 8;

/// The 409 a write to a Node ends with when it lost [`CONFLICT_ATTEMPTS`] times in a row.
pub(crate) fn conflicts_exhausted(message: String) -> kube::Error {
    kube::Error::Api(
        kube::core::Status::failure(&message, "Conflict")
            .with_code(409)
            .boxed(),
    )
}
