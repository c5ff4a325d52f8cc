//! The attach/detach controller and a CSI driver's external attacher, as one: a pod bound to
//! a node that uses a claim bound to a persistent volume has that volume attached there (a
//! `VolumeAttachment` naming the volume and the node, `status.attached: true`), and the
//! kubelet starts the pod only once all its volumes are attached to its node. Once no pod
//! object bound to the node uses the volume any more (a pod being deleted still does), its
//! kubelet reports it unmounted [`UNMOUNT_REPORT_SECONDS`] later and the attachment is
//! deleted [`SimulationTimings::volume_detach_delay`] after that, as the driver's detach
//! takes time. When the node is gone or its kubelet dead before it reported the unmount,
//! nothing confirms it, and the attach/detach controller detaches only
//! [`MAX_WAIT_FOR_UNMOUNT_SECONDS`] after the pod left (its `maxWaitForUnmountDuration`),
//! unless the node is not Ready and carries the out-of-service taint: then at once.
//! Both constants are a real cluster's seconds, scaled like grace periods. A `ReadWriteOnce` volume (any
//! claim not asking for a shared mode) is attached to one node at a time: a pod on another
//! node waits until it is detached there (the "Multi-Attach error" of a real cluster).
//! Claims are not provisioned: a scenario creates each claim with its `spec.volumeName`.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::garbage_collector::out_of_service_taint;
use super::{Memory, Simulation, resource, spec_str};
use crate::kube::store::{Origin, State, meta_str};

/// The attacher named in the attachments (what the EBS CSI driver registers).
pub const ATTACHER: &str = "ebs.csi.aws.com";

/// How long the attach/detach controller waits for a node that cannot confirm an unmount
/// (gone, or its kubelet dead) before it detaches anyway: six minutes in Kubernetes.
pub const MAX_WAIT_FOR_UNMOUNT_SECONDS: f64 = 360.0;

/// How long after its last pod is gone a live kubelet reports the volume unmounted (its
/// node status, `volumesInUse`, is posted every 10 s).
pub const UNMOUNT_REPORT_SECONDS: f64 = 10.0;

impl Simulation {
    /// Attaches the volumes of bound pods and detaches those no pod on the node uses.
    pub(super) fn attach_detach(&self, state: &mut State, memory: &mut Memory, now: Instant) {
        let attachments = resource("storage.k8s.io", "volumeattachments");
        let claims = resource("", "persistentvolumeclaims");
        // Every tick over every pod only when volumes are in play at all.
        if state.iter(claims, None).next().is_none()
            && state.iter(attachments, None).next().is_none()
        {
            return;
        }
        let in_use = volumes_in_use(state);
        let attached: BTreeSet<(String, String)> = state
            .iter(attachments, None)
            .map(|a| (volume_of(a).to_owned(), spec_str(a, "nodeName").to_owned()))
            .collect();
        let shared = shared_volumes(state);
        for (volume, node) in in_use.difference(&attached) {
            let elsewhere = attached.iter().any(|(v, n)| v == volume && n != node);
            if elsewhere && !shared.contains(volume) {
                continue;
            }
            let attachment = json!({
                "apiVersion": "storage.k8s.io/v1",
                "kind": "VolumeAttachment",
                "metadata": {"name": attachment_name(volume, node)},
                "spec": {"attacher": ATTACHER, "nodeName": node, "source": {"persistentVolumeName": volume}},
                "status": {"attached": true},
            });
            if let Err(error) = state.create(attachments, "", attachment, Origin::Setup) {
                tracing::debug!(%error, "simulated attacher could not attach a volume");
            }
        }
        self.detach_unused(state, memory, now, &in_use);
    }

    /// Deletes the attachments whose volume has been unused on their node for the detach
    /// delay; an attachment used again is no longer on its way out.
    fn detach_unused(
        &self,
        state: &mut State,
        memory: &mut Memory,
        now: Instant,
        in_use: &BTreeSet<(String, String)>,
    ) {
        let attachments = resource("storage.k8s.io", "volumeattachments");
        let scaled =
            |seconds: f64| Duration::from_secs_f64(seconds * self.timings.grace_period_scale);
        let mut detaching = std::mem::take(&mut memory.detaching);
        let mut detached = Vec::new();
        let mut unused = BTreeSet::new();
        for attachment in state.iter(attachments, None) {
            let name = meta_str(attachment, "name").to_owned();
            let node = spec_str(attachment, "nodeName");
            if in_use.contains(&(volume_of(attachment).to_owned(), node.to_owned())) {
                continue;
            }
            unused.insert(name.clone());
            let node_object = state.get(resource("", "nodes"), "", node).ok();
            let node_answers = node_object.is_some() && !memory.dead_kubelets.contains(node);
            // Non-graceful shutdown: on a node not Ready with the out-of-service taint the
            // controller detaches without waiting for an unmount.
            let forced = node_object.as_ref().is_some_and(|n| {
                out_of_service_taint(n).is_some() && !super::condition_true(n, "Ready")
            });
            let detach = detaching.entry(name.clone()).or_insert(Detach {
                unused_since: now,
                unmounted_at: None,
            });
            let since = now.duration_since(detach.unused_since);
            let reported = node_answers && since >= scaled(UNMOUNT_REPORT_SECONDS);
            if detach.unmounted_at.is_none() && (reported || forced) {
                detach.unmounted_at = Some(now);
            }
            let done = match detach.unmounted_at {
                Some(at) => now.duration_since(at) >= self.timings.volume_detach_delay,
                None => since >= scaled(MAX_WAIT_FOR_UNMOUNT_SECONDS),
            };
            if done {
                detached.push(name);
            }
        }
        for name in &detached {
            state.remove(attachments, "", name);
        }
        detaching.retain(|name, _| unused.contains(name) && !detached.contains(name));
        memory.detaching = detaching;
    }
}

/// An attachment on its way out.
#[derive(Debug, Clone, Copy)]
pub(super) struct Detach {
    /// Since when no pod on the node uses the volume.
    unused_since: Instant,
    /// When the node's kubelet reported the volume unmounted: the detach starts then.
    unmounted_at: Option<Instant>,
}

/// Whether every claimed volume of `pod` is attached to its node (a pod without claims: yes).
pub(super) fn volumes_attached(state: &State, pod: &Value) -> bool {
    let namespace = meta_str(pod, "namespace");
    let node = spec_str(pod, "nodeName");
    let claims = resource("", "persistentvolumeclaims");
    let attachments = resource("storage.k8s.io", "volumeattachments");
    claim_names(pod).all(|claim| {
        let Ok(claim) = state.get(claims, namespace, claim) else {
            // A claim that does not exist keeps the pod from starting, as on a real node.
            return false;
        };
        let volume = spec_str(&claim, "volumeName");
        state
            .iter(attachments, None)
            .any(|a| volume_of(a) == volume && spec_str(a, "nodeName") == node)
    })
}

/// The volumes whose claim asks for a mode more than one node may attach.
fn shared_volumes(state: &State) -> BTreeSet<String> {
    state
        .iter(resource("", "persistentvolumeclaims"), None)
        .filter(|c| {
            c["spec"]["accessModes"].as_array().is_some_and(|modes| {
                modes
                    .iter()
                    .any(|m| m == "ReadWriteMany" || m == "ReadOnlyMany")
            })
        })
        .map(|c| spec_str(c, "volumeName").to_owned())
        .collect()
}

/// (volume, node) for every claim a pod bound to a node uses, through the claim's volume.
fn volumes_in_use(state: &State) -> BTreeSet<(String, String)> {
    let claims = resource("", "persistentvolumeclaims");
    let mut in_use = BTreeSet::new();
    for pod in state.iter(resource("", "pods"), None) {
        let node = spec_str(pod, "nodeName");
        if node.is_empty() {
            continue;
        }
        let namespace = meta_str(pod, "namespace");
        for claim in claim_names(pod) {
            let Ok(claim) = state.get(claims, namespace, claim) else {
                continue;
            };
            let volume = spec_str(&claim, "volumeName");
            if !volume.is_empty() {
                in_use.insert((volume.to_owned(), node.to_owned()));
            }
        }
    }
    in_use
}

fn claim_names(pod: &Value) -> impl Iterator<Item = &str> {
    pod["spec"]["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v["persistentVolumeClaim"]["claimName"].as_str())
}

fn volume_of(attachment: &Value) -> &str {
    attachment["spec"]["source"]["persistentVolumeName"]
        .as_str()
        .unwrap_or_default()
}

/// `csi-` and a digest of volume, attacher and node, as the CSI attacher names them.
fn attachment_name(volume: &str, node: &str) -> String {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (volume, ATTACHER, node).hash(&mut hasher);
    format!("csi-{:016x}", hasher.finish())
}
