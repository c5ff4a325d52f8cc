//! The kubelets of a real control plane: kwok ([`super::kwok`]) serves the nodes and their
//! pods (Ready, Leases, pods started and Ready, graceful deletions finished at the end of
//! their grace period); the test kit does what kwok does not, as the node agent here:
//! registering a node (a kubelet's first request), the images a node pulled listed in its
//! `status.images` (which kube-scheduler's ImageLocality score reads), and, with the plane's
//! attach/detach controller, the volume reports and the CSI driver's attacher
//! ([`super::attacher`]). A kubelet's death is the node leaving kwok.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::ControlPlaneError;
use crate::kube::REPORTED_IMAGE_BYTES;

/// How often the node agent looks at the pods.
const POLL: Duration = Duration::from_millis(250);
/// The node agent's user name (`--token-auth-file`).
pub const NODE_AGENT: &str = "test-kit-kubelets";
/// What the node agent does, as RBAC: registering and removing nodes and posting their
/// images, volumes in use and death; reading pods and volumes; the CSI attacher's writes.
const NODE_AGENT_RULES: &str = r#"[
  {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "create", "delete", "patch"]},
  {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
  {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
  {"apiGroups": [""], "resources": ["persistentvolumeclaims", "persistentvolumes"], "verbs": ["list"]},
  {"apiGroups": ["storage.k8s.io"], "resources": ["volumeattachments"], "verbs": ["list", "patch"]},
  {"apiGroups": ["storage.k8s.io"], "resources": ["volumeattachments/status"], "verbs": ["patch"]}
]"#;

/// Gives the node agent its role (as `admin`, before it starts).
pub async fn grant(admin: &kube::Client) -> Result<(), ControlPlaneError> {
    super::grant_cluster_role(admin, NODE_AGENT, NODE_AGENT_RULES).await
}

/// How long kwok may take to serve a registered node.
const REGISTRATION: Duration = Duration::from_secs(20);

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
    /// Creates node `name` (4 CPUs, 16 GiB and 110 pods allocatable; zone `zone`), hands it
    /// to kwok and returns once kwok made it Ready. `unschedulable` creates it cordoned.
    pub async fn register_node(
        &self,
        name: &str,
        provider_id: &str,
        zone: &str,
        unschedulable: bool,
    ) -> Result<(), ControlPlaneError> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let (kwok_key, kwok_value) = super::kwok::MANAGED_LABEL;
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": name,
                "annotations": {super::attacher::CONTROLLER_MANAGED: "true"},
                "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "topology.kubernetes.io/zone": zone,
                kwok_key: kwok_value,
            }},
            "spec": {"providerID": provider_id, "unschedulable": unschedulable},
        }))
        .map_err(|e| setup(name, e))?;
        nodes
            .create(&PostParams::default(), &node)
            .await
            .map_err(|e| setup(name, e))?;
        nodes
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(&node_status(name)),
            )
            .await
            .map_err(|e| setup(name, e))?;
        wait_until_ready(&nodes, name).await?;
        // The TaintNodesByCondition admission plugin creates every node with the
        // `node.kubernetes.io/not-ready:NoSchedule` taint; the node-lifecycle controller (not
        // run here) removes it once the node is Ready, so the node agent does.
        nodes
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {"taints": null}})),
            )
            .await
            .map_err(|e| setup(name, e))?;
        self.nodes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_owned());
        Ok(())
    }
}

/// What a kubelet posts about its machine when it registers (kwok adds the conditions).
fn node_status(name: &str) -> serde_json::Value {
    let resources = json!({"cpu": "4", "memory": "16Gi", "pods": "110"});
    json!({"status": {
        "capacity": resources,
        "allocatable": resources,
        "addresses": [{"type": "Hostname", "address": name}],
        "nodeInfo": {
            "kubeletVersion": super::KUBERNETES_VERSION, "kubeProxyVersion": "",
            "architecture": "amd64", "operatingSystem": "linux",
            "containerRuntimeVersion": "containerd://2.0.0", "kernelVersion": "6.1.0",
            "osImage": "test kit", "machineID": "", "systemUUID": "", "bootID": "",
        },
    }})
}

/// Waits until kwok reports node `name` Ready.
async fn wait_until_ready(nodes: &Api<Node>, name: &str) -> Result<(), ControlPlaneError> {
    let started = Instant::now();
    loop {
        let node = nodes.get(name).await.map_err(|e| setup(name, e))?;
        if node_manager::lifecycle::node::is_ready(&node) {
            return Ok(());
        }
        if started.elapsed() > REGISTRATION {
            return Err(setup(
                name,
                format!("kwok did not make it Ready within {REGISTRATION:?} (see kwok.log)"),
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
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

    /// The kubelet of `node` dies: the node leaves kwok (its pods are no longer served, an
    /// evicted pod stays `Terminating`; its Lease is no longer renewed) and turns
    /// `Ready=Unknown` as the node lifecycle controller (not run here) would show it.
    pub async fn kill(&self, node: &str) -> Result<(), ControlPlaneError> {
        self.nodes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(node);
        let nodes: Api<Node> = Api::all(self.client.clone());
        let unmanaged = json!({"metadata": {"labels": {super::kwok::MANAGED_LABEL.0: null}}});
        nodes
            .patch(node, &PatchParams::default(), &Patch::Merge(&unmanaged))
            .await
            .map_err(|e| setup(node, e))?;
        let now = jiff::Timestamp::now().to_string();
        let status = json!({"status": {"conditions": [{
            "type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
            "message": "Kubelet stopped posting node status.",
            "lastHeartbeatTime": now, "lastTransitionTime": now,
        }]}});
        nodes
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

/// The node agent's loop: the pods come from a watch (a reflector's store), so its cost does
/// not grow with each look at a big cluster.
async fn run(client: kube::Client, nodes: Arc<Mutex<BTreeSet<String>>>) {
    use futures::StreamExt as _;
    use kube::runtime::{WatchStreamExt as _, reflector, watcher};
    let (pods, writer) = reflector::store::<Pod>();
    let stream = watcher(Api::<Pod>::all(client.clone()), watcher::Config::default());
    let reflect = reflector(writer, stream.default_backoff());
    let _watching = AbortOnDrop(tokio::spawn(reflect.for_each(|_| std::future::ready(()))));
    let mut images = NodeImages::default();
    let mut attacher = super::attacher::Attacher::default();
    loop {
        tokio::time::sleep(POLL).await;
        let served = nodes.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let state = pods.state();
        for pod in &state {
            let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
            if let Some(node) = node.filter(|node| served.contains(*node)) {
                images.pulled(node, pod);
            }
        }
        images.report(&client).await;
        attacher.round(&client, &state, &served).await;
    }
}

/// Aborts the reflector's task when the node agent's loop ends (its task is aborted when
/// [`FakeKubelets`] is dropped, which drops this guard).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
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
