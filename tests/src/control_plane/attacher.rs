//! What a real cluster's nodes and CSI driver do for volumes, played by the test kit beside the
//! plane's own attach/detach controller (in kube-controller-manager), which decides what is
//! attached where, as on EKS:
//! - the kubelets ask for controller-managed attachment (the node annotation, set when they
//!   register) and report in `status.volumesInUse` the volumes their pods use (a pod still
//!   `Terminating` does); a dead kubelet's report stays as it last was, so the controller
//!   waits for an unmount nobody reports (six minutes) unless the node carries the
//!   out-of-service taint;
//! - the EBS CSI driver's external attacher: a `VolumeAttachment` the controller creates for
//!   [`ATTACHER`] gets the attacher's finalizer and `status.attached: true`; one the
//!   controller deletes loses the finalizer [`DETACH_DELAY`] later (the driver's detach),
//!   and only then is gone.
//!
//! The fake API server's emulation models the same rules in one place (and a pod that waits
//! for its volumes, which the real-plane scenarios do not need).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

/// How long a detach takes (the EBS CSI driver's takes seconds).
pub const DETACH_DELAY: Duration = Duration::from_secs(3);
/// How often the volumes are looked at.
const EVERY: Duration = Duration::from_millis(500);
/// The CSI driver the scenarios' volumes name.
pub const ATTACHER: &str = "ebs.csi.aws.com";
/// The finalizer the external attacher puts on the attachments it handles.
const FINALIZER: &str = "external-attacher/ebs-csi-aws-com";
/// The node annotation with which a kubelet leaves attaching to the controller.
pub const CONTROLLER_MANAGED: &str = "volumes.kubernetes.io/controller-managed-attach-detach";

/// The attacher's and the kubelets' memory between rounds.
#[derive(Default)]
pub struct Attacher {
    last_round: Option<Instant>,
    deleting_since: BTreeMap<String, Instant>,
    reported: BTreeMap<String, Vec<String>>,
}

impl Attacher {
    /// One round over `pods` (every pod of the cluster) on the `served` nodes (those whose
    /// kubelet runs), when due; errors are retried on the next round.
    pub async fn round(
        &mut self,
        client: &kube::Client,
        pods: &[Arc<Pod>],
        served: &BTreeSet<String>,
    ) {
        if self.last_round.is_some_and(|at| at.elapsed() < EVERY) {
            return;
        }
        self.last_round = Some(Instant::now());
        let (Ok(claims), Ok(volumes), Ok(attachments)) = (
            Api::<PersistentVolumeClaim>::all(client.clone())
                .list(&ListParams::default())
                .await,
            Api::<PersistentVolume>::all(client.clone())
                .list(&ListParams::default())
                .await,
            Api::<VolumeAttachment>::all(client.clone())
                .list(&ListParams::default())
                .await,
        ) else {
            return;
        };
        if claims.items.is_empty() && attachments.items.is_empty() {
            return;
        }
        self.report_volumes_in_use(client, pods, &claims.items, &volumes.items, served)
            .await;
        self.attach_and_detach(client, &attachments.items).await;
    }

    /// Each served node's kubelet posts the volumes its pods use, when that changed.
    async fn report_volumes_in_use(
        &mut self,
        client: &kube::Client,
        pods: &[Arc<Pod>],
        claims: &[PersistentVolumeClaim],
        volumes: &[PersistentVolume],
        served: &BTreeSet<String>,
    ) {
        let nodes: Api<Node> = Api::all(client.clone());
        let in_use = volumes_in_use(pods, claims, volumes);
        self.reported.retain(|node, _| served.contains(node));
        for node in served {
            let now: Vec<String> = in_use.get(node).cloned().unwrap_or_default();
            if self.reported.get(node) == Some(&now) {
                continue;
            }
            let status = json!({"status": {"volumesInUse": now}});
            let patched = nodes
                .patch_status(node, &PatchParams::default(), &Patch::Merge(&status))
                .await;
            if patched.is_ok() {
                self.reported.insert(node.clone(), now);
            }
        }
    }

    /// The external attacher: attaches what the controller asks for, detaches what it
    /// deleted once the driver's detach is done.
    async fn attach_and_detach(&mut self, client: &kube::Client, attachments: &[VolumeAttachment]) {
        let api: Api<VolumeAttachment> = Api::all(client.clone());
        let now = Instant::now();
        let ours = attachments.iter().filter(|a| a.spec.attacher == ATTACHER);
        let mut deleting = BTreeSet::new();
        for attachment in ours {
            let Some(name) = attachment.metadata.name.clone() else {
                continue;
            };
            if attachment.metadata.deletion_timestamp.is_some() {
                deleting.insert(name.clone());
                let since = *self.deleting_since.entry(name.clone()).or_insert(now);
                if now.duration_since(since) >= DETACH_DELAY {
                    let release = json!({"metadata": {"finalizers": null}});
                    let _ = api
                        .patch(&name, &PatchParams::default(), &Patch::Merge(&release))
                        .await;
                }
                continue;
            }
            let attached = attachment.status.as_ref().is_some_and(|s| s.attached);
            if !attached {
                let _ = attach(&api, &name).await;
            }
        }
        self.deleting_since
            .retain(|name, _| deleting.contains(name));
    }
}

/// Puts the attacher's finalizer on the attachment and reports it attached.
async fn attach(api: &Api<VolumeAttachment>, name: &str) -> Result<(), kube::Error> {
    let claim = json!({"metadata": {"finalizers": [FINALIZER]}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&claim))
        .await?;
    let status = json!({"status": {"attached": true}});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(())
}

/// Per node, the unique names (`kubernetes.io/csi/<driver>^<handle>`, as the attach/detach
/// controller names them) of the CSI volumes its pods use through their claims.
fn volumes_in_use(
    pods: &[Arc<Pod>],
    claims: &[PersistentVolumeClaim],
    volumes: &[PersistentVolume],
) -> BTreeMap<String, Vec<String>> {
    let unique_name = |namespace: &str, claim: &str| {
        let volume = claims
            .iter()
            .find(|c| {
                c.metadata.namespace.as_deref() == Some(namespace)
                    && c.metadata.name.as_deref() == Some(claim)
            })
            .and_then(|c| c.spec.as_ref()?.volume_name.clone())?;
        let csi = volumes
            .iter()
            .find(|v| v.metadata.name.as_deref() == Some(volume.as_str()))?
            .spec
            .as_ref()?
            .csi
            .as_ref()?;
        Some(format!(
            "kubernetes.io/csi/{}^{}",
            csi.driver, csi.volume_handle
        ))
    };
    let mut in_use: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for pod in pods {
        let Some(spec) = &pod.spec else { continue };
        let Some(node) = &spec.node_name else {
            continue;
        };
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        for claim in spec
            .volumes
            .iter()
            .flatten()
            .filter_map(|v| v.persistent_volume_claim.as_ref())
        {
            if let Some(name) = unique_name(namespace, &claim.claim_name) {
                in_use.entry(node.clone()).or_default().insert(name);
            }
        }
    }
    in_use
        .into_iter()
        .map(|(node, names)| (node, names.into_iter().collect()))
        .collect()
}
