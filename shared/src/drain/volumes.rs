//! Waiting for the node's volumes to detach before the instance goes.
//!
//! A CSI volume stays attached to a node until the attach/detach controller sees that no pod
//! on the node uses it any more and the driver's attacher has detached it; its
//! `VolumeAttachment` (which names the node) is deleted then. When the instance terminates
//! first, the attach/detach controller only learns that the volume is free after the Node
//! is gone, and the replacement pod on another node waits for EBS's multi-attach timeout
//! (about six minutes) before it can start. So once the node is empty the drain waits,
//! alongside the settle period and bounded by `VOLUME_DETACH_SECONDS` (counted from when the
//! node was drained, cut at an instance notice's end), until no `VolumeAttachment` names the
//! node, except those of volumes a pod staying on the node uses (a DaemonSet's or static
//! pod's claim), which only the instance's end detaches (Karpenter leaves them out the same
//! way).
//!
//! The attachments are polled, not watched: a list from the API server's watch cache
//! (`resourceVersion=0`) every [`POLL_INTERVAL`] costs one cheap request, where a watch
//! would stream every attachment of the cluster to every drain. Without the grant (an
//! operator who kept an older RBAC manifest) or where the API is not served, the drain does
//! not wait for volumes and says so once.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::Api;
use kube::api::ListParams;
use tokio::time::Instant;

use super::plan::{PlanContext, PodDisposition};

/// How often the attachments are listed while some remain (shorter when the bound is short,
/// so scaled-down tests poll at the same rate relative to their bound).
pub const POLL_INTERVAL: Duration = Duration::from_secs(2);

/// How long one check (a list, and the claims of staying pods) may take before it counts as
/// failed and is tried again at the next poll.
const CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the wait for the node's volumes stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolumesState {
    /// Not checked yet (or the last check failed and is tried again).
    Unchecked,
    /// These persistent volumes (or attachment names, for inline volumes) are still attached.
    Attached(Vec<String>),
    /// Nothing that has to detach is attached.
    Detached,
    /// The attachments cannot be read (forbidden, not served): not waited for.
    Unreadable,
}

/// One drain's wait for its node's volumes.
#[derive(Debug, Clone)]
pub struct VolumeWait {
    /// When the wait gives up.
    pub bound_at: Instant,
    poll: Duration,
    next_check: Instant,
    pub state: VolumesState,
    /// When the wait started, for the log line saying how long it took.
    started: Instant,
    /// Volumes of pods that stay on the node, found at the first check.
    staying: Option<BTreeSet<String>>,
}

impl VolumeWait {
    /// A wait that ends at `bound_at` at the latest; a bound already passed waits for nothing.
    pub fn until(bound_at: Instant, bound: Duration) -> Self {
        let now = Instant::now();
        Self {
            bound_at,
            poll: (bound / 20).clamp(Duration::from_millis(10), POLL_INTERVAL),
            next_check: now,
            state: VolumesState::Unchecked,
            started: now,
            staying: None,
        }
    }

    /// Whether the drain still waits for volumes at `now`.
    pub fn waiting(&self, now: Instant) -> bool {
        now < self.bound_at
            && matches!(
                self.state,
                VolumesState::Unchecked | VolumesState::Attached(_)
            )
    }

    /// Whether the last check found volumes that have to detach.
    pub fn attached(&self) -> bool {
        matches!(self.state, VolumesState::Attached(_))
    }

    /// The volumes the last check found attached that have to detach.
    pub fn still_attached(&self) -> &[String] {
        match &self.state {
            VolumesState::Attached(left) => left,
            _ => &[],
        }
    }

    /// When the next check is due, while the drain waits.
    pub fn next_wake(&self, now: Instant) -> Option<Instant> {
        self.waiting(now)
            .then(|| self.next_check.max(now).min(self.bound_at))
    }

    /// Volumes still attached when the wait ended at its bound.
    pub fn left_at_bound(&self, now: Instant) -> Option<&[String]> {
        match &self.state {
            VolumesState::Attached(left) if now >= self.bound_at => Some(left),
            _ => None,
        }
    }

    /// Checks the node's attachments when a check is due, giving up on it at `deadline`
    /// (the invocation's hand-over) at the latest; a failed check is logged and tried again
    /// at the next poll.
    pub async fn check_if_due(
        &mut self,
        client: &kube::Client,
        node: &str,
        plan: &PlanContext,
        deadline: Instant,
    ) {
        let now = Instant::now();
        if !self.waiting(now) || now < self.next_check || now >= deadline {
            return;
        }
        self.next_check = now + self.poll;
        let give_up_at = deadline.min(now + CHECK_TIMEOUT);
        let checked = tokio::time::timeout_at(give_up_at, self.check(client, node, plan)).await;
        let next = match checked {
            Ok(Ok(left)) if left.is_empty() => VolumesState::Detached,
            Ok(Ok(left)) => VolumesState::Attached(left),
            Ok(Err(error)) if is_unreadable(&error) => {
                tracing::warn!(node, %error, "cannot read the node's VolumeAttachments: not waiting for its volumes to detach (grant list on volumeattachments.storage.k8s.io)");
                VolumesState::Unreadable
            }
            Ok(Err(error)) => {
                tracing::warn!(node, %error, "could not check the node's volumes; trying again");
                self.state.clone()
            }
            Err(_) => {
                tracing::warn!(
                    node,
                    timeout_seconds = CHECK_TIMEOUT.as_secs(),
                    "checking the node's volumes took too long; trying again"
                );
                self.state.clone()
            }
        };
        self.log_change(node, &next);
        self.state = next;
    }

    fn log_change(&self, node: &str, next: &VolumesState) {
        match (&self.state, next) {
            (VolumesState::Attached(_), VolumesState::Detached) => {
                tracing::info!(
                    step = "volumes_detached",
                    node,
                    waited_seconds = self.started.elapsed().as_secs_f64(),
                    "the node's volumes are detached"
                );
            }
            (VolumesState::Unchecked, VolumesState::Attached(left)) => {
                tracing::info!(step = "awaiting_volumes", node, volumes = ?left, "waiting for the node's volumes to detach before the instance goes");
            }
            _ => {}
        }
    }

    /// What is still attached to `node` that has to detach: one list of the attachments, and
    /// (once) the claims of the pods that stay on the node.
    async fn check(
        &mut self,
        client: &kube::Client,
        node: &str,
        plan: &PlanContext,
    ) -> Result<Vec<String>, kube::Error> {
        let attachments: Api<VolumeAttachment> = Api::all(client.clone());
        let listed = attachments.list(&ListParams::default().match_any()).await?;
        let on_node: Vec<VolumeAttachment> = listed
            .items
            .into_iter()
            .filter(|a| a.spec.node_name == node)
            .collect();
        if on_node.is_empty() {
            return Ok(Vec::new());
        }
        if self.staying.is_none() {
            self.staying = Some(staying_volumes(client, node, plan).await?);
        }
        Ok(to_detach(&on_node, self.staying.as_ref()))
    }
}

/// Refusals that will not go away by asking again.
fn is_unreadable(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 403 || status.code == 404)
}

/// The volumes of `attachments` that have to detach: all but those in `staying`, named by
/// their persistent volume (or, for an inline volume, by the attachment).
pub fn to_detach(
    attachments: &[VolumeAttachment],
    staying: Option<&BTreeSet<String>>,
) -> Vec<String> {
    attachments
        .iter()
        .filter_map(|a| match &a.spec.source.persistent_volume_name {
            Some(volume) if staying.is_some_and(|s| s.contains(volume)) => None,
            Some(volume) => Some(volume.clone()),
            None => Some(a.metadata.name.clone().unwrap_or_default()),
        })
        .collect()
}

/// The persistent volumes claimed by pods that stay on the node (DaemonSet and static pods,
/// latecomers tolerating the cordon): the drain does not move them, so their volumes stay.
async fn staying_volumes(
    client: &kube::Client,
    node: &str,
    plan: &PlanContext,
) -> Result<BTreeSet<String>, kube::Error> {
    let pods: Api<Pod> = Api::all(client.clone());
    let on_node = pods
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await?;
    let mut volumes = BTreeSet::new();
    for (namespace, claim) in staying_claims(&on_node.items, plan) {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &namespace);
        if let Some(volume) = claims
            .get_opt(&claim)
            .await?
            .and_then(|c| c.spec)
            .and_then(|s| s.volume_name)
        {
            volumes.insert(volume);
        }
    }
    Ok(volumes)
}

/// The claims (namespace, name) of the pods in `pods` that the drain leaves on the node.
pub fn staying_claims(pods: &[Pod], plan: &PlanContext) -> BTreeSet<(String, String)> {
    pod_claims(pods.iter().filter(|pod| {
        matches!(
            PodDisposition::in_context(pod, plan),
            PodDisposition::SkipMirror
                | PodDisposition::SkipDaemonSet
                | PodDisposition::SkipToleratesCordon
        )
    }))
}

/// Every (namespace, claim) a pod of `pods` mounts.
pub fn pod_claims<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> BTreeSet<(String, String)> {
    pods.into_iter()
        .flat_map(|pod| {
            let namespace = pod.metadata.namespace.clone().unwrap_or_default();
            pod.spec
                .iter()
                .flat_map(|s| s.volumes.iter().flatten())
                .filter_map(|v| v.persistent_volume_claim.as_ref())
                .map(move |c| (namespace.clone(), c.claim_name.clone()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use serde_json::json;

    fn attachment(name: &str, node: &str, volume: Option<&str>) -> VolumeAttachment {
        let source = match volume {
            Some(v) => json!({"persistentVolumeName": v}),
            None => {
                json!({"inlineVolumeSpec": {"csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-1"}}})
            }
        };
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"attacher": "ebs.csi.aws.com", "nodeName": node, "source": source},
        }))
        .unwrap()
    }

    fn pod(name: &str, owner: Option<&str>, claim: &str) -> Pod {
        let owners = owner.map(|kind| {
            json!([{"apiVersion": "apps/v1", "kind": kind, "name": "x", "uid": "u", "controller": true}])
        });
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "shop", "uid": name, "ownerReferences": owners},
            "spec": {"nodeName": "n", "containers": [], "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": claim}},
                {"name": "tmp", "emptyDir": {}},
            ]},
        }))
        .unwrap()
    }

    #[test]
    fn volumes_of_staying_pods_do_not_have_to_detach() {
        let attachments = [
            attachment("csi-a", "n", Some("pv-db")),
            attachment("csi-b", "n", Some("pv-logs")),
            attachment("csi-c", "n", None),
        ];
        let staying = BTreeSet::from(["pv-logs".to_owned()]);
        assert_eq!(to_detach(&attachments, Some(&staying)), ["pv-db", "csi-c"]);
        assert_eq!(to_detach(&attachments, None), ["pv-db", "pv-logs", "csi-c"]);
    }

    #[test]
    fn only_pods_the_drain_leaves_keep_their_claims() {
        let pods = [
            pod("collector", Some("DaemonSet"), "logs"),
            pod("db-0", Some("StatefulSet"), "data-db-0"),
        ];
        let claims = staying_claims(&pods, &PlanContext::default());
        assert_eq!(
            claims,
            BTreeSet::from([("shop".to_owned(), "logs".to_owned())])
        );
    }

    #[test]
    fn the_wait_ends_at_its_bound_or_when_nothing_is_attached() {
        let now = Instant::now();
        let mut wait = VolumeWait::until(now + Duration::from_secs(300), Duration::from_secs(300));
        assert!(wait.waiting(now));
        // The first check is due at once.
        assert!(wait.next_wake(now).is_some_and(|at| at <= Instant::now()));
        wait.state = VolumesState::Attached(vec!["pv-db".into()]);
        assert!(wait.waiting(now));
        let later = now + Duration::from_secs(301);
        assert!(!wait.waiting(later));
        assert_eq!(wait.left_at_bound(later), Some(&["pv-db".to_owned()][..]));
        wait.state = VolumesState::Detached;
        assert!(!wait.waiting(now));
        assert_eq!(wait.left_at_bound(later), None);
        let passed = VolumeWait::until(now, Duration::ZERO);
        assert!(!passed.waiting(now));
    }
}
