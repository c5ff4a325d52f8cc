//! The last resort when the drain deadline passes with `DRAIN_FORCE=true`: delete the pods
//! eviction could not move. A DELETE bypasses PodDisruptionBudgets, which is the point: the
//! operator chose that the instance goes on time over what the budgets ask.

use std::time::Duration;

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
    /// Refused for good (e.g. 403: the role lacks the force-delete group): an operator must
    /// act; retrying changes nothing.
    Refused(String),
    /// Still failing after [`DELETE_ATTEMPTS`] tries (connection errors, 429, 5xx).
    Failed(String),
}

/// Tries per pod before a transient failure is given up on within this invocation.
pub(crate) const DELETE_ATTEMPTS: u32 = 5;

/// The pause before the first retry; doubled for each later one (0.1 + 0.2 + 0.4 + 0.8 s).
const FIRST_RETRY_DELAY: Duration = Duration::from_millis(100);

/// [`delete_pod`], retrying transient failures: a dropped connection or a throttled request
/// must not turn a forced drain into a completed one with the pod still running.
pub(crate) async fn delete_pod_with_retries(
    client: &kube::Client,
    pod: &PodKey,
    grace_period_seconds: Option<i64>,
) -> ForcedDeletion {
    let mut delay = FIRST_RETRY_DELAY;
    let mut attempt = 1;
    loop {
        match delete_pod(client, pod, grace_period_seconds).await {
            ForcedDeletion::Failed(error) if attempt < DELETE_ATTEMPTS => {
                tracing::info!(pod = %pod, attempt, %error, "forced deletion failed; retrying");
                tokio::time::sleep(delay).await;
                delay *= 2;
                attempt += 1;
            }
            done => return done,
        }
    }
}

/// Deletes `pod` (this UID only), with `grace_period_seconds` or the pod's own.
pub(crate) async fn delete_pod(
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
        Err(kube::Error::Api(status)) if status.code != 429 && status.code < 500 => {
            ForcedDeletion::Refused(status.to_string())
        }
        Err(error) => ForcedDeletion::Failed(error.to_string()),
    }
}
