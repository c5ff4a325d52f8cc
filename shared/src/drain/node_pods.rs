//! The pods on the node being drained, kept current by ONE watch.
//!
//! The watcher lists the node's pods across all namespaces (field selector
//! `spec.nodeName=<node>`, in pages) and then watches them, so the drain learns that a pod is
//! gone — deleted, or replaced by a pod of the same name with a new UID — from one stream
//! instead of polling each pod. The watcher re-lists by itself after an expired watch.

use std::collections::BTreeMap;
use std::pin::Pin;

use futures::{FutureExt, Stream, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};

/// Pages of the initial list: big enough for any node (kubelet caps pods per node at a few
/// hundred), small enough to keep each answer modest.
const LIST_PAGE_SIZE: u32 = 250;

type PodEvents = Pin<Box<dyn Stream<Item = Result<watcher::Event<Pod>, watcher::Error>> + Send>>;

/// The node's pods as last seen, keyed by namespace and name.
pub struct NodePods {
    events: PodEvents,
    pods: BTreeMap<(String, String), Pod>,
    /// Pods of a re-list in progress; swapped in when the list is complete.
    listing: Option<BTreeMap<(String, String), Pod>>,
    synced: bool,
    generation: u64,
    /// The last error of the list/watch, for the report when the pods never become known.
    last_error: Option<String>,
}

impl NodePods {
    pub fn watch(client: &kube::Client, node_name: &str) -> Self {
        let api: Api<Pod> = Api::all(client.clone());
        let config = watcher::Config::default()
            .fields(&format!("spec.nodeName={node_name}"))
            .page_size(LIST_PAGE_SIZE);
        let events = watcher(api, config).default_backoff().boxed();
        Self {
            events,
            pods: BTreeMap::new(),
            listing: None,
            synced: false,
            generation: 0,
            last_error: None,
        }
    }

    /// Waits until the view is complete and something changed. Watch errors are logged and
    /// retried by the watcher's own backoff; `Err` only when the stream ends (it does not,
    /// in practice). Cancel-safe: the state lives in `self`, so it can sit in a `select!`.
    ///
    /// Every event that has already arrived is applied before returning, so a burst of
    /// deletions (a whole eviction wave) costs the caller one look, not one per pod.
    pub async fn changed(&mut self) -> Result<(), NodePodsError> {
        loop {
            let mut changed = match self.events.next().await {
                Some(event) => self.apply(event),
                None => return Err(NodePodsError::WatchEnded),
            };
            while let Some(next) = self.events.next().now_or_never() {
                match next {
                    Some(event) => changed |= self.apply(event),
                    None => return Err(NodePodsError::WatchEnded),
                }
            }
            if changed {
                return Ok(());
            }
        }
    }

    /// Applies one watcher event; `true` when the complete view changed.
    fn apply(&mut self, event: Result<watcher::Event<Pod>, watcher::Error>) -> bool {
        let event = match event {
            Ok(event) => event,
            Err(error) => {
                tracing::warn!(%error, "watch of the node's pods failed; retrying");
                self.last_error = Some(error.to_string());
                return false;
            }
        };
        match event {
            watcher::Event::Init => {
                self.listing = Some(BTreeMap::new());
                false
            }
            watcher::Event::InitApply(pod) => {
                if let Some(listing) = self.listing.as_mut()
                    && let Some(key) = key(&pod)
                {
                    listing.insert(key, pod);
                }
                false
            }
            watcher::Event::InitDone => {
                if let Some(listing) = self.listing.take() {
                    self.pods = listing;
                }
                self.synced = true;
                self.generation += 1;
                true
            }
            watcher::Event::Apply(pod) => {
                if let Some(key) = key(&pod) {
                    self.pods.insert(key, pod);
                    self.generation += 1;
                }
                self.synced
            }
            watcher::Event::Delete(pod) => {
                if let Some(key) = key(&pod) {
                    // Only if it is the same pod: a replacement may already be there.
                    if self.pods.get(&key).map(|p| &p.metadata.uid) == Some(&pod.metadata.uid) {
                        self.pods.remove(&key);
                        self.generation += 1;
                    }
                }
                self.synced
            }
        }
    }

    /// Counts changes of the view: equal generations mean the same pods.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The last error of the list or watch, if any happened.
    pub fn last_error(&self) -> Option<&str> {
        self.last_error.as_deref()
    }

    /// Whether the first complete list has arrived.
    pub fn is_synced(&self) -> bool {
        self.synced
    }

    pub fn pods(&self) -> impl Iterator<Item = &Pod> {
        self.pods.values()
    }

    /// Whether the pod with this namespace, name and UID is still on the node.
    pub fn contains(&self, namespace: &str, name: &str, uid: &str) -> bool {
        self.pods
            .get(&(namespace.to_owned(), name.to_owned()))
            .is_some_and(|p| p.metadata.uid.as_deref() == Some(uid))
    }
}

fn key(pod: &Pod) -> Option<(String, String)> {
    Some((pod.metadata.namespace.clone()?, pod.metadata.name.clone()?))
}

#[derive(Debug, thiserror::Error)]
pub enum NodePodsError {
    #[error("the watch of the node's pods ended unexpectedly")]
    WatchEnded,
}

/// The watch of the node's pods, started in the background so its first list overlaps the
/// claim; stopped when the drain does not start.
pub(super) struct PrefetchedPods {
    task: tokio::task::JoinHandle<NodePods>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl PrefetchedPods {
    pub(super) fn start(client: &kube::Client, node_name: &str) -> Self {
        let mut pods = NodePods::watch(client, node_name);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            // Until the list is complete or the session wants the watch (listed or not:
            // `changed` is cancel-safe and the list in progress lives in the stream).
            let listed = async {
                while !pods.is_synced() {
                    if pods.changed().await.is_err() {
                        break;
                    }
                }
            };
            tokio::select! {
                _ = listed => {}
                _ = stopped => {}
            }
            pods
        });
        Self {
            task,
            stop: Some(stop),
        }
    }

    /// The watch, at once; `None` if its task failed (the session starts its own).
    pub(super) async fn take(mut self) -> Option<NodePods> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        (&mut self.task).await.ok()
    }
}

impl Drop for PrefetchedPods {
    fn drop(&mut self) {
        self.task.abort();
    }
}
