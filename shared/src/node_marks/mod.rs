//! What our functions leave on a Node and read back, shared by the three that touch nodes:
//! the drain takes a node out of service and records what it did in its checkpoint
//! ([`checkpoint`]); exactly that is undone when the record ends, always through the
//! reconciler's writer ([`crate::reconcile::converge`]); node repair sees a drain at work by
//! it. Also the pieces every Event about a Node shares
//! ([`events`]), every mark of ours one node carries read at once ([`marks`]), and the rule
//! for writing a Node against concurrent changes.

pub mod checkpoint;
pub mod events;
pub mod maintenance;
pub mod marks;
pub mod out_of_service;
pub mod refresh;
pub mod shutdown;

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use serde_json::Value;

/// The label every mark of ours comes with (value `true`), whatever the mark: the reconciler
/// ([`crate::reconcile`]) lists the nodes to look at by it alone. It carries no meaning of its
/// own: the marks' records do. The reconciler removes it from a node that carries none of
/// them any more.
pub const MARKED_LABEL: &str = "open-node-manager.io/marked";

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
/// (the drain's checkpoint, the warm-pool undo, an instance refresh's marks). Node objects change often (kubelet status),
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

/// How a Node is read again after a write lost to a concurrent change: by name (`get`), or,
/// for a function that holds only `list` on nodes, by a list with `metadata.name`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reread {
    Get,
    List,
}

/// What a patch computed from a Node as read comes to.
pub(crate) enum PatchStep<T, S> {
    /// Write this merge patch (conditional on the node's `resourceVersion`); `T` is what it
    /// changes.
    Write(Value, T),
    /// Nothing to write: `S` says why.
    Stop(S),
}

/// What [`patch_recomputing`] ended with.
pub(crate) enum Patched<T, S> {
    /// Written: the node as written, and what the patch changed.
    Written(Box<Node>, T),
    Stopped(S),
    NodeGone,
}

/// Writes a merge patch `compute`d from `node`; on a conflict (the kubelet updates nodes
/// often) reads the node again (`reread`) and recomputes, at most [`CONFLICT_ATTEMPTS`]
/// times. `changing` says what the write does, for the error when every attempt lost.
pub(crate) async fn patch_recomputing<T, S>(
    nodes: &Api<Node>,
    mut node: Node,
    reread: Reread,
    changing: &str,
    compute: impl Fn(&Node) -> PatchStep<T, S>,
) -> Result<Patched<T, S>, kube::Error> {
    let name = node.metadata.name.clone().unwrap_or_default();
    for _ in 0..CONFLICT_ATTEMPTS {
        let (patch, outcome) = match compute(&node) {
            PatchStep::Write(patch, outcome) => (patch, outcome),
            PatchStep::Stop(why) => return Ok(Patched::Stopped(why)),
        };
        match nodes
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(written) => return Ok(Patched::Written(Box::new(written), outcome)),
            Err(kube::Error::Api(status)) if status.is_conflict() => {
                let fresh = match reread {
                    Reread::Get => nodes.get_opt(&name).await?,
                    Reread::List => {
                        let fields = format!("metadata.name={name}");
                        let listed = nodes.list(&ListParams::default().fields(&fields)).await?;
                        listed.items.into_iter().next()
                    }
                };
                match fresh {
                    Some(fresh) => node = fresh,
                    None => return Ok(Patched::NodeGone),
                }
            }
            Err(kube::Error::Api(status)) if status.is_not_found() => {
                return Ok(Patched::NodeGone);
            }
            Err(error) => return Err(error),
        }
    }
    Err(conflicts_exhausted(format!(
        "node {name} changed {CONFLICT_ATTEMPTS} times while {changing}"
    )))
}
