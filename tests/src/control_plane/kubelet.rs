//! The kubelets of a real control plane, played by the test kit: nodes registered Ready with
//! room for pods, their Leases heartbeated, pods bound to them (by kube-scheduler) made
//! Running and Ready through `pods/status`, graceful deletions finished with grace 0 once the
//! deletion's grace period (the eviction's, or the pod's own) has passed (on a real cluster
//! nothing else removes an evicted pod: it stays `Terminating` until its kubelet deletes it,
//! after its containers stopped, at the latest at the end of that period; these containers
//! take all of it, the slowest a drain meets), and the images a node pulled listed in its `status.images` (which
//! kube-scheduler's ImageLocality score reads). The plane's attach/detach controller attaches
//! and detaches their pods' volumes; the kubelets' volume reports and the CSI driver's
//! attacher are [`super::attacher`].

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use serde_json::json;

use super::ControlPlaneError;
use crate::kube::REPORTED_IMAGE_BYTES;

/// How often the emulation looks at the pods.
const POLL: Duration = Duration::from_millis(100);
/// How often node Leases are renewed (a kubelet renews every 10 s by default).
const LEASE_RENEWAL: Duration = Duration::from_secs(10);
const MANAGER: &str = "test-kit-kubelet";

/// The emulation's task and the nodes it serves. Dropping it stops the task.
pub struct FakeKubelets {
    handle: KubeletHandle,
    task: tokio::task::JoinHandle<()>,
}

/// What registers and removes nodes of a running emulation, cheap to clone into the fake
/// Auto Scaling's launch and termination callbacks (the emulation keeps serving only while
/// its [`FakeKubelets`] lives).
#[derive(Clone)]
pub struct KubeletHandle {
    client: kube::Client,
    nodes: Arc<Mutex<BTreeSet<String>>>,
}

impl std::ops::Deref for FakeKubelets {
    type Target = KubeletHandle;

    fn deref(&self) -> &KubeletHandle {
        &self.handle
    }
}

impl FakeKubelets {
    /// Starts serving (the nodes registered through [`KubeletHandle::register_node`]).
    pub fn start(client: kube::Client) -> Self {
        let nodes: Arc<Mutex<BTreeSet<String>>> = Arc::default();
        let task = tokio::spawn(run(client.clone(), nodes.clone()));
        Self {
            handle: KubeletHandle { client, nodes },
            task,
        }
    }

    /// A handle on the emulation, for callbacks.
    pub fn handle(&self) -> KubeletHandle {
        self.handle.clone()
    }
}

impl KubeletHandle {
    /// Creates node `name` (Ready; 4 CPUs, 16 GiB and 110 pods allocatable; zone `zone`) and
    /// serves its pods from now on. `unschedulable` creates it cordoned.
    pub async fn register_node(
        &self,
        name: &str,
        provider_id: &str,
        zone: &str,
        unschedulable: bool,
    ) -> Result<(), ControlPlaneError> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": name,
                "annotations": {super::attacher::CONTROLLER_MANAGED: "true"},
                "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "topology.kubernetes.io/zone": zone,
            }},
            "spec": {"providerID": provider_id, "unschedulable": unschedulable},
        }))
        .map_err(|e| setup(name, e))?;
        nodes
            .create(&PostParams::default(), &node)
            .await
            .map_err(|e| setup(name, e))?;
        let resources = json!({"cpu": "4", "memory": "16Gi", "pods": "110"});
        let now = jiff::Timestamp::now().to_string();
        let condition = |type_: &str, status: &str, reason: &str| {
            json!({"type": type_, "status": status, "reason": reason,
                   "lastHeartbeatTime": now, "lastTransitionTime": now})
        };
        let status = json!({"status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID"),
                condition("Ready", "True", "KubeletReady"),
            ],
            "addresses": [{"type": "Hostname", "address": name}],
            "nodeInfo": {
                "kubeletVersion": super::KUBERNETES_VERSION, "kubeProxyVersion": "",
                "architecture": "amd64", "operatingSystem": "linux",
                "containerRuntimeVersion": "containerd://2.0.0", "kernelVersion": "6.1.0",
                "osImage": "test kit", "machineID": "", "systemUUID": "", "bootID": "",
            },
        }});
        nodes
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .map_err(|e| setup(name, e))?;
        // The TaintNodesByCondition admission plugin creates every node with the
        // `node.kubernetes.io/not-ready:NoSchedule` taint; the node-lifecycle controller (not
        // run here) removes it once the node is Ready, so the emulation does.
        nodes
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {"taints": null}})),
            )
            .await
            .map_err(|e| setup(name, e))?;
        renew_lease(&self.client, name)
            .await
            .map_err(|e| setup(name, e))?;
        self.nodes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_owned());
        Ok(())
    }
}

impl KubeletHandle {
    /// The instance of `node` is gone: its kubelet stops and the Node is deleted, as the
    /// cloud node lifecycle controller deletes the Node of a terminated instance. (A pod
    /// still bound to it is then removed by the pod garbage collector, without an eviction.)
    pub async fn remove_node(&self, node: &str) -> Result<(), ControlPlaneError> {
        self.nodes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(node);
        match Api::<Node>::all(self.client.clone())
            .delete(node, &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(error) => Err(setup(node, error)),
        }
    }

    /// The kubelet of `node` dies: its pods are no longer served (an evicted pod stays
    /// `Terminating`), its Lease is no longer renewed, and the node turns `Ready=Unknown` as
    /// the node lifecycle controller (not run here) would show it.
    pub async fn kill(&self, node: &str) -> Result<(), ControlPlaneError> {
        self.nodes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(node);
        let now = jiff::Timestamp::now().to_string();
        let status = json!({"status": {"conditions": [{
            "type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
            "message": "Kubelet stopped posting node status.",
            "lastHeartbeatTime": now, "lastTransitionTime": now,
        }]}});
        Api::<Node>::all(self.client.clone())
            .patch_status(node, &PatchParams::default(), &Patch::Strategic(&status))
            .await
            .map_err(|e| setup(node, e))?;
        Ok(())
    }
}

impl Drop for FakeKubelets {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn setup(node: &str, error: impl std::fmt::Display) -> ControlPlaneError {
    ControlPlaneError::Setup {
        what: format!("registering node {node}"),
        detail: error.to_string(),
    }
}

async fn run(client: kube::Client, nodes: Arc<Mutex<BTreeSet<String>>>) {
    let pods: Api<Pod> = Api::all(client.clone());
    let mut last_renewal = Instant::now();
    let mut images = NodeImages::default();
    let mut attacher = super::attacher::Attacher::default();
    loop {
        tokio::time::sleep(POLL).await;
        let served = nodes.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if last_renewal.elapsed() >= LEASE_RENEWAL {
            last_renewal = Instant::now();
            for node in &served {
                let _ = renew_lease(&client, node).await;
            }
        }
        let Ok(list) = pods.list(&ListParams::default()).await else {
            continue;
        };
        for pod in &list.items {
            let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
                continue;
            };
            if !served.contains(&node) {
                continue;
            }
            images.pulled(&node, pod);
            // Errors (a conflict, a pod already gone) are retried on the next round.
            let _ = serve_pod(&client, pod).await;
        }
        images.report(&client).await;
        attacher.round(&client, &list.items, &served).await;
    }
}

/// The images each node has pulled, reported in its `status.images` as a kubelet reports the
/// images on its node: kube-scheduler's ImageLocality score prefers nodes that already hold
/// a pod's images (the nodes that ran it before), as on a real cluster.
#[derive(Default)]
struct NodeImages {
    pulled: std::collections::BTreeMap<String, BTreeSet<String>>,
    unreported: BTreeSet<String>,
}

impl NodeImages {
    fn pulled(&mut self, node: &str, pod: &Pod) {
        let containers = pod.spec.as_ref().map(|s| s.containers.as_slice());
        for image in containers
            .unwrap_or_default()
            .iter()
            .filter_map(|c| c.image.clone())
        {
            if self
                .pulled
                .entry(node.to_owned())
                .or_default()
                .insert(image)
            {
                self.unreported.insert(node.to_owned());
            }
        }
    }

    /// Posts the image list of every node that pulled a new one (retried next round on an
    /// error).
    async fn report(&mut self, client: &kube::Client) {
        let nodes: Api<Node> = Api::all(client.clone());
        for node in std::mem::take(&mut self.unreported) {
            let images: Vec<_> = self.pulled[&node]
                .iter()
                .map(|image| json!({"names": [image], "sizeBytes": REPORTED_IMAGE_BYTES}))
                .collect();
            let status = json!({"status": {"images": images}});
            let patched = nodes
                .patch_status(&node, &PatchParams::default(), &Patch::Merge(&status))
                .await;
            let gone = matches!(&patched, Err(kube::Error::Api(s)) if s.code == 404);
            if patched.is_err() && !gone {
                self.unreported.insert(node);
            }
        }
    }
}

/// One step of a kubelet for `pod`: finish its deletion, or start it.
async fn serve_pod(client: &kube::Client, pod: &Pod) -> Result<(), kube::Error> {
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let api: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    if let Some(deleted_at) = &pod.metadata.deletion_timestamp {
        // The API server sets the deletion timestamp to the request's time plus its grace
        // period: until then the containers are still stopping.
        if jiff::Timestamp::now() < deleted_at.0 {
            return Ok(());
        }
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: pod.metadata.uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        api.delete(&name, &params).await?;
        return Ok(());
    }
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Running" | "Succeeded" | "Failed")) {
        return Ok(());
    }
    let now = jiff::Timestamp::now().to_string();
    let containers: Vec<_> = pod
        .spec
        .as_ref()
        .map(|s| s.containers.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|c| {
            json!({"name": c.name, "image": c.image.unwrap_or_default(), "imageID": "",
                   "ready": true, "started": true, "restartCount": 0,
                   "state": {"running": {"startedAt": now}}})
        })
        .collect();
    let condition =
        |type_: &str| json!({"type": type_, "status": "True", "lastTransitionTime": now});
    let status = json!({"status": {
        "phase": "Running",
        "startTime": now,
        "hostIP": "10.0.0.10",
        "podIP": "10.1.0.10",
        "conditions": [condition("PodReadyToStartContainers"), condition("Initialized"),
                       condition("Ready"), condition("ContainersReady"), condition("PodScheduled")],
        "containerStatuses": containers,
    }});
    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(())
}

async fn renew_lease(client: &kube::Client, node: &str) -> Result<(), kube::Error> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let now = jiff::Timestamp::now();
    // A MicroTime: exactly six fractional digits.
    let renew_time = format!(
        "{}.{:06}Z",
        now.strftime("%Y-%m-%dT%H:%M:%S"),
        now.subsec_microsecond()
    );
    let lease = json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": node, "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": node, "leaseDurationSeconds": 40,
                 "renewTime": renew_time},
    });
    leases
        .patch(
            node,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&lease),
        )
        .await?;
    Ok(())
}
