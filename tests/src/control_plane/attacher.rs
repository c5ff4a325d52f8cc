//! The attach/detach controller and a CSI driver's external attacher of a real control plane,
//! played by the test kit as one (the plane's own attach/detach controller leaves the kit's
//! nodes alone: they do not ask for controller-managed attachment): a pod bound to a served
//! node that uses a claim naming a volume (`spec.volumeName`) has that volume attached there,
//! a `VolumeAttachment` with `status.attached: true`; [`DETACH_DELAY`] after no pod object on
//! the node uses the volume any more (a pod still `Terminating` does), the attachment is
//! deleted. The fake API server's emulation follows the same rule and models more (a pod
//! starts only once its volumes are attached, a `ReadWriteOnce` volume is attached to one
//! node at a time, a gone node's volumes wait out the unmount timeout), which the real-plane
//! scenario does not need.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

/// How long a detach takes (the EBS CSI driver's takes seconds).
pub const DETACH_DELAY: Duration = Duration::from_secs(3);
/// How often the attachments are reconciled.
const EVERY: Duration = Duration::from_millis(500);
/// The attacher named in the attachments.
const ATTACHER: &str = "ebs.csi.aws.com";

/// The attacher's memory between rounds.
#[derive(Default)]
pub struct Attacher {
    last_round: Option<Instant>,
    unused_since: BTreeMap<String, Instant>,
}

impl Attacher {
    /// One round over `pods` (every pod of the cluster) on the `served` nodes, when due;
    /// errors are retried on the next round.
    pub async fn round(&mut self, client: &kube::Client, pods: &[Pod], served: &BTreeSet<String>) {
        if self.last_round.is_some_and(|at| at.elapsed() < EVERY) {
            return;
        }
        self.last_round = Some(Instant::now());
        let claims: Api<PersistentVolumeClaim> = Api::all(client.clone());
        let Ok(claims) = claims.list(&ListParams::default()).await else {
            return;
        };
        let attachments: Api<VolumeAttachment> = Api::all(client.clone());
        let Ok(attached) = attachments.list(&ListParams::default()).await else {
            return;
        };
        if claims.items.is_empty() && attached.items.is_empty() {
            return;
        }
        let in_use = volumes_in_use(pods, &claims.items, served);
        let present: BTreeSet<(String, String)> =
            attached.items.iter().map(volume_and_node).collect();
        for (volume, node) in in_use.difference(&present) {
            let _ = attach(&attachments, volume, node).await;
        }
        let now = Instant::now();
        let unused: Vec<String> = attached
            .items
            .iter()
            .filter(|a| served.contains(&a.spec.node_name) && !in_use.contains(&volume_and_node(a)))
            .filter_map(|a| a.metadata.name.clone())
            .collect();
        self.unused_since.retain(|name, _| unused.contains(name));
        for name in unused {
            let since = *self.unused_since.entry(name.clone()).or_insert(now);
            if now.duration_since(since) >= DETACH_DELAY {
                let _ = attachments.delete(&name, &DeleteParams::default()).await;
            }
        }
    }
}

fn volume_and_node(attachment: &VolumeAttachment) -> (String, String) {
    (
        attachment
            .spec
            .source
            .persistent_volume_name
            .clone()
            .unwrap_or_default(),
        attachment.spec.node_name.clone(),
    )
}

/// (volume, node) for every claim a pod bound to a served node uses.
fn volumes_in_use(
    pods: &[Pod],
    claims: &[PersistentVolumeClaim],
    served: &BTreeSet<String>,
) -> BTreeSet<(String, String)> {
    let volume_of = |namespace: &str, claim: &str| {
        claims
            .iter()
            .find(|c| {
                c.metadata.namespace.as_deref() == Some(namespace)
                    && c.metadata.name.as_deref() == Some(claim)
            })
            .and_then(|c| c.spec.as_ref()?.volume_name.clone())
    };
    let mut in_use = BTreeSet::new();
    for pod in pods {
        let Some(spec) = &pod.spec else { continue };
        let Some(node) = spec.node_name.as_ref().filter(|n| served.contains(*n)) else {
            continue;
        };
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        for claim in spec
            .volumes
            .iter()
            .flatten()
            .filter_map(|v| v.persistent_volume_claim.as_ref())
        {
            if let Some(volume) = volume_of(namespace, &claim.claim_name) {
                in_use.insert((volume, node.clone()));
            }
        }
    }
    in_use
}

/// Creates the attachment of `volume` to `node` and reports it attached.
async fn attach(api: &Api<VolumeAttachment>, volume: &str, node: &str) -> Result<(), kube::Error> {
    let name = format!("csi-{}", sha256_hex(&format!("{volume}{ATTACHER}{node}")));
    let attachment: VolumeAttachment = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"attacher": ATTACHER, "nodeName": node, "source": {"persistentVolumeName": volume}},
    }))
    .map_err(kube::Error::SerdeError)?;
    api.create(&PostParams::default(), &attachment).await?;
    let status = json!({"status": {"attached": true}});
    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(())
}

fn sha256_hex(text: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(text.as_bytes()))
}
