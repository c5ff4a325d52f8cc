//! The last resort when the drain deadline passes with `DRAIN_FORCE=true`: delete the pods
//! eviction could not move. A DELETE bypasses PodDisruptionBudgets, which is the point: the
//! operator chose that the instance goes on time over what the budgets ask.

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, Preconditions};

use super::plan::PodKey;

/// What happened to one forced deletion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ForcedDeletion {
    Deleted,
    /// Gone already, or replaced by another pod with the name (UID precondition).
    AlreadyGone,
    Failed(String),
}

/// Deletes `pod` (this UID only), with `grace_period_seconds` or the pod's own.
pub async fn delete_pod(
    client: &kube::Client,
    pod: &PodKey,
    grace_period_seconds: Option<i64>,
) -> ForcedDeletion {
    let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace);
    let params = DeleteParams {
        grace_period_seconds: grace_period_seconds.and_then(|g| u32::try_from(g).ok()),
        preconditions: Some(Preconditions {
            uid: Some(pod.uid.clone()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(&pod.name, &params).await {
        Ok(_) => ForcedDeletion::Deleted,
        Err(kube::Error::Api(status)) if status.is_not_found() || status.is_conflict() => {
            ForcedDeletion::AlreadyGone
        }
        Err(error) => ForcedDeletion::Failed(error.to_string()),
    }
}
