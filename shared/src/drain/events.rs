//! The Kubernetes Events a drain leaves on the Node (and on a Pod whose eviction is blocked):
//! what an operator sees in `kubectl describe node` / `kubectl get events` without reading
//! Lambda logs.
//!
//! Events are a report, not part of the drain: they are written in order by a background
//! task so no round trip of theirs delays an eviction or the completion, and
//! [`DrainEvents::flush`] waits (bounded) for the queue before the invocation returns, since
//! Lambda freezes the process after that. An Event that cannot be written (RBAC, API hiccup)
//! is logged and forgotten.
//!
//! Decision: no Event per evicted pod. It would double the drain's API requests (one create
//! per pod, on top of its eviction) for what the kubelet's own `Killing` Event on the pod and
//! the node's `Drained` Event (with the count) already say. Pods whose eviction is refused in
//! a way an owner must fix get one `EvictionBlocked` Warning each.

use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::plan::PodKey;
use crate::node_marks::events::truncate_note;

/// The `action` of every drain Event (events.k8s.io requires one).
const ACTION: &str = "Drain";

/// How long the end of an invocation waits for queued Events: long enough for a few round
/// trips to a slow API server, short enough that a hung one cannot hold the invocation.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// Reasons, as `kubectl get events` shows them.
pub mod reason {
    pub const DRAIN_STARTED: &str = "DrainStarted";
    pub const CORDONED: &str = "Cordoned";
    pub const DRAINED: &str = "Drained";
    pub const POD_EVICTION_FAILURE: &str = "PodEvictionFailure";
    pub const DRAIN_FORCED: &str = "DrainForced";
    pub const EVICTION_BLOCKED: &str = "EvictionBlocked";
    /// Pods whose deletion is overdue (or on a node not Ready): no longer waited for.
    pub const POD_DELETION_STUCK: &str = "PodDeletionStuck";
    pub const LIFECYCLE_ACTION_COMPLETED: &str = "LifecycleActionCompleted";
    /// Pods annotated `karpenter.sh/do-not-disrupt`: never evicted, they hold the drain.
    pub const DO_NOT_DISRUPT: &str = "DoNotDisrupt";
    /// A drain running longer than `DRAIN_BLOCKED_REPORT_SECONDS`: the pods it waits for.
    pub const DRAIN_BLOCKED: &str = "DrainBlocked";
    /// Volumes still attached to the node when the wait for them reached its bound.
    pub const VOLUMES_STILL_ATTACHED: &str = "VolumesStillAttached";
    /// Load balancers still routing to the instance when the wait for them reached its bound.
    pub const LOAD_BALANCERS_STILL_ROUTING: &str = "LoadBalancersStillRouting";
}

/// An Event waiting to be written.
struct Pending {
    regarding: ObjectReference,
    event: Event,
}

/// Queues the drain's Events for the background writer; [`DrainEvents::disabled`] (unit
/// tests, call counting) writes nothing.
pub struct DrainEvents {
    queue: Option<mpsc::UnboundedSender<Pending>>,
    writer: Option<JoinHandle<()>>,
}

impl DrainEvents {
    /// Starts the writer. Must be called inside a Tokio runtime.
    pub fn new(recorder: Recorder) -> Self {
        let (queue, pending) = mpsc::unbounded_channel();
        Self {
            queue: Some(queue),
            writer: Some(tokio::spawn(write_in_order(recorder, pending))),
        }
    }

    pub fn disabled() -> Self {
        Self {
            queue: None,
            writer: None,
        }
    }

    /// The reference Events about a Node carry.
    pub fn node_reference(name: &str, uid: Option<&str>) -> ObjectReference {
        crate::node_marks::events::node_reference(name, uid)
    }

    pub fn pod_reference(pod: &PodKey) -> ObjectReference {
        ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(pod.name.clone()),
            namespace: Some(pod.namespace.clone()),
            uid: Some(pod.uid.clone()),
            ..ObjectReference::default()
        }
    }

    pub fn normal(&self, regarding: &ObjectReference, reason: &str, note: String) {
        self.queue(regarding, EventType::Normal, reason, note);
    }

    pub fn warning(&self, regarding: &ObjectReference, reason: &str, note: String) {
        self.queue(regarding, EventType::Warning, reason, note);
    }

    fn queue(&self, regarding: &ObjectReference, type_: EventType, reason: &str, note: String) {
        let Some(queue) = &self.queue else {
            return;
        };
        let pending = Pending {
            regarding: regarding.clone(),
            event: Event {
                type_,
                reason: reason.to_owned(),
                note: Some(truncate_note(note)),
                action: ACTION.to_owned(),
                secondary: None,
            },
        };
        // Fails only when the writer is gone (its runtime is shutting down): nothing to do.
        let _ = queue.send(pending);
    }

    /// Waits until every queued Event was written (or failed), at most [`FLUSH_TIMEOUT`].
    pub async fn flush(mut self) {
        drop(self.queue.take());
        let Some(mut writer) = self.writer.take() else {
            return;
        };
        if tokio::time::timeout(FLUSH_TIMEOUT, &mut writer)
            .await
            .is_err()
        {
            writer.abort();
            tracing::warn!(
                timeout_seconds = FLUSH_TIMEOUT.as_secs(),
                "gave up writing the drain's remaining Kubernetes Events"
            );
        }
    }
}

/// The background writer: one Event at a time, in the order they were queued.
async fn write_in_order(recorder: Recorder, mut pending: mpsc::UnboundedReceiver<Pending>) {
    while let Some(Pending { regarding, event }) = pending.recv().await {
        if let Err(error) = recorder.publish(&event, &regarding).await {
            tracing::warn!(
                reason = event.reason,
                object = regarding.name.as_deref().unwrap_or_default(),
                %error,
                "could not record a Kubernetes Event (the drain goes on)"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_name_the_object() {
        let pod = PodKey {
            namespace: "default".into(),
            name: "nginx".into(),
            uid: "u".into(),
        };
        let r = DrainEvents::pod_reference(&pod);
        assert_eq!(r.namespace.as_deref(), Some("default"));
        assert_eq!(r.kind.as_deref(), Some("Pod"));
        assert_eq!(DrainEvents::node_reference("n", None).namespace, None);
    }
}
