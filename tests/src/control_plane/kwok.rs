//! kwok (`sigs.k8s.io/kwok`, built by `scripts/control-plane.sh build`) as the real plane's
//! kubelets: one process serves every node the kit registers with [`MANAGED_LABEL`], through
//! the stages in `kwok-stages.yaml` (node Ready and its Lease renewed; a pod started after its
//! start delay, Ready after its readiness delay; a deleted pod kept `Terminating` until its
//! grace period is over, then deleted). It runs as its own user, [`USER`], with only the
//! grants [`grant`] gives it (no `system:masters`), so kube-apiserver authorizes its traffic
//! as it would a kubelet's.
//!
//! What kwok does not do is the kit's, in [`super::kubelet`]: registering a node (a kubelet's
//! first request; kwok serves Nodes that exist), the images a node pulled, the volumes in use
//! and the CSI driver's attacher.

use super::ControlPlaneError;

/// The kwok release `scripts/control-plane.sh` builds (checked against the script).
pub const KWOK_VERSION: &str = "v0.8.0";
/// The label that hands a node to kwok: removing it is the kubelet's death.
pub const MANAGED_LABEL: (&str, &str) = ("kwok.x-k8s.io/node", "fake");
/// kwok's user name (`--token-auth-file`), bound to the role [`grant`] creates.
pub const USER: &str = "kwok-kubelets";
/// What kwok does to nodes and pods, and when.
const STAGES: &str = include_str!("kwok-stages.yaml");
/// How long a node Lease lasts (a kubelet's default).
const LEASE_SECONDS: u32 = 40;

/// kwok's configuration file: its options, then the stages.
pub fn configuration() -> String {
    let (key, value) = MANAGED_LABEL;
    format!(
        "apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  manageNodesWithLabelSelector: {key}={value}
  nodeLeaseDurationSeconds: {LEASE_SECONDS}
  nodeLeaseParallelism: 4
  nodePlayStageParallelism: 4
  podPlayStageParallelism: 8
  podsOnNodeSyncParallelism: 4
  cidr: 10.64.0.0/10
  nodeIP: 10.0.0.10
---
{STAGES}"
    )
}

/// The arguments kwok runs with, its configuration and kubeconfig in the plane's folder.
pub fn args(configuration: &str, kubeconfig: &str) -> Vec<String> {
    vec![
        format!("--config={configuration}"),
        format!("--kubeconfig={kubeconfig}"),
    ]
}

/// What a kubelet does, as RBAC: nodes and their status, the pods bound to them and their
/// status (and their final delete), node Leases, Events.
const RULES: &str = r#"[
  {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch", "update"]},
  {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["get", "patch", "update"]},
  {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch", "update", "delete"]},
  {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["get", "patch", "update"]},
  {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "list", "watch", "create", "update", "patch"]},
  {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch", "update"]}
]"#;

/// Gives [`USER`] its role (as `admin`, before kwok starts).
pub async fn grant(admin: &kube::Client) -> Result<(), ControlPlaneError> {
    super::grant_cluster_role(admin, USER, RULES).await
}
