//! The Kubernetes Events a drain leaves on the Node and on each evicted Pod: what an operator
//! sees in `kubectl describe node` / `kubectl get events` without reading Lambda logs.
//!
//! An Event that cannot be written (RBAC, API hiccup) is logged and forgotten: the drain
//! itself matters more than its report.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder};

use super::plan::PodKey;

/// The `action` of every drain Event (events.k8s.io requires one).
const ACTION: &str = "Drain";

/// An events.k8s.io `note` may hold at most 1 KiB.
const MAX_NOTE_BYTES: usize = 1024;

/// Reasons, as `kubectl get events` shows them.
pub mod reason {
    pub const DRAIN_STARTED: &str = "DrainStarted";
    pub const CORDONED: &str = "Cordoned";
    pub const DRAINED: &str = "Drained";
    pub const POD_EVICTION_FAILURE: &str = "PodEvictionFailure";
    pub const DRAIN_FORCED: &str = "DrainForced";
    pub const EVICTED: &str = "Evicted";
    pub const EVICTION_BLOCKED: &str = "EvictionBlocked";
    pub const LIFECYCLE_ACTION_COMPLETED: &str = "LifecycleActionCompleted";
}

/// Publishes the drain's Events; `None` recorder (unit tests) publishes nothing.
#[derive(Clone)]
pub struct DrainEvents {
    recorder: Option<Recorder>,
}

impl DrainEvents {
    pub fn new(recorder: Recorder) -> Self {
        Self {
            recorder: Some(recorder),
        }
    }

    pub fn disabled() -> Self {
        Self { recorder: None }
    }

    /// The reference Events about a Node carry.
    pub fn node_reference(name: &str, uid: Option<&str>) -> ObjectReference {
        ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(name.to_owned()),
            uid: uid.map(str::to_owned),
            ..ObjectReference::default()
        }
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

    pub async fn normal(&self, regarding: &ObjectReference, reason: &str, note: String) {
        self.publish(regarding, EventType::Normal, reason, note)
            .await;
    }

    pub async fn warning(&self, regarding: &ObjectReference, reason: &str, note: String) {
        self.publish(regarding, EventType::Warning, reason, note)
            .await;
    }

    async fn publish(
        &self,
        regarding: &ObjectReference,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let Some(recorder) = &self.recorder else {
            return;
        };
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(truncate_note(note)),
            action: ACTION.to_owned(),
            secondary: None,
        };
        if let Err(error) = recorder.publish(&event, regarding).await {
            tracing::warn!(
                reason,
                object = regarding.name.as_deref().unwrap_or_default(),
                %error,
                "could not record a Kubernetes Event (the drain goes on)"
            );
        }
    }
}

/// Cuts `note` to the 1 KiB events.k8s.io allows, on a character boundary.
pub fn truncate_note(note: String) -> String {
    if note.len() <= MAX_NOTE_BYTES {
        return note;
    }
    let suffix = " ...";
    let mut end = MAX_NOTE_BYTES - suffix.len();
    while !note.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{suffix}", &note[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_notes_are_cut_to_one_kib() {
        let long = "é".repeat(1000);
        let cut = truncate_note(long);
        assert!(cut.len() <= MAX_NOTE_BYTES);
        assert!(cut.ends_with(" ..."));
        assert_eq!(truncate_note("short".into()), "short");
    }

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
