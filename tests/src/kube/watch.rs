//! Watches: a stream of `{"type": ..., "object": ...}` JSON lines from a resourceVersion on.
//!
//! Like the real server: a watch without a resourceVersion (or `0`) starts with synthetic
//! `ADDED` events for what exists; a watch from a version older than the kept history gets an
//! `ERROR` event with `410 Expired` ("too old resource version"); with a selector, an object
//! that stops matching is sent as `DELETED` and one that starts matching as `ADDED`;
//! `allowWatchBookmarks` adds periodic `BOOKMARK` events carrying the latest version.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Response, header};
use http_body_util::{BodyExt as _, StreamBody};
use hyper::body::{Bytes, Frame};
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};

use super::api::{ResponseBody, ServerState};
use super::fields::FieldQuery;
use super::resources::ResourceType;
use super::selectors::LabelQuery;
use super::status::ApiError;
use super::store::{Change, ChangeType, labels_of, meta_str, view};

pub(crate) struct WatchRequest {
    pub resource: &'static ResourceType,
    pub namespace: Option<String>,
    pub labels: LabelQuery,
    pub fields: FieldQuery,
    pub resource_version: Option<String>,
    pub timeout: Duration,
    pub bookmarks: bool,
}

impl WatchRequest {
    fn selects(&self, object: &Value) -> bool {
        self.namespace
            .as_deref()
            .is_none_or(|ns| meta_str(object, "namespace") == ns)
            && self.labels.matches(&labels_of(object))
            && self.fields.matches(self.resource, object)
    }

    /// The event a change produces for this watch, if any.
    fn event_for(&self, change: &Change) -> Option<Value> {
        if change.resource.storage != self.resource.storage {
            return None;
        }
        let object = view(self.resource, change.object.clone());
        let previous = change.previous.clone().map(|p| view(self.resource, p));
        let now = self.selects(&object);
        let before = previous.as_ref().is_some_and(|p| self.selects(p));
        let kind = match (change.change, before, now) {
            (ChangeType::Added, _, true) => "ADDED",
            (ChangeType::Deleted, true, _) => "DELETED",
            (ChangeType::Modified, true, true) => "MODIFIED",
            (ChangeType::Modified, false, true) => "ADDED",
            (ChangeType::Modified, true, false) => "DELETED",
            _ => return None,
        };
        Some(json!({ "type": kind, "object": object }))
    }
}

fn line(event: &Value) -> Bytes {
    let mut bytes = serde_json::to_vec(event).unwrap_or_default();
    bytes.push(b'\n');
    Bytes::from(bytes)
}

fn expired(message: String) -> Value {
    json!({ "type": "ERROR", "object": ApiError::gone(message).to_status() })
}

/// Starts a watch; the response streams until the timeout, the client leaves or the server
/// stops.
pub(crate) fn start(
    state: &ServerState,
    request: WatchRequest,
) -> Result<Response<ResponseBody>, ApiError> {
    let requested = match request.resource_version.as_deref() {
        None | Some("") | Some("0") => None,
        Some(rv) => Some(
            rv.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid resource version: {rv:?}")))?,
        ),
    };
    let (sender, receiver) = mpsc::channel::<Bytes>(256);
    let mut initial = Vec::new();
    let (last_rv, changes) = {
        let store = state.store.lock();
        match requested {
            None => {
                let current = store.resource_version();
                for object in store.iter_view(request.resource, request.namespace.as_deref()) {
                    if request.selects(&object) {
                        initial.push(line(&json!({ "type": "ADDED", "object": object })));
                    }
                }
                let (_, changes) = store.watch_from(current)?;
                (current, Some(changes))
            }
            Some(rv) => match store.watch_from(rv) {
                Ok((backlog, changes)) => {
                    for change in &backlog {
                        if let Some(event) = request.event_for(change) {
                            initial.push(line(&event));
                        }
                    }
                    let last = backlog.last().map_or(rv, |c| c.resource_version);
                    (last, Some(changes))
                }
                Err(error) => {
                    initial.push(line(&expired(error.message)));
                    (rv, None)
                }
            },
        }
    };
    let shutdown = state.shutdown.clone();
    let bookmark_interval = state.bookmark_interval;
    tokio::spawn(stream_events(
        request,
        initial,
        last_rv,
        changes,
        sender,
        shutdown,
        bookmark_interval,
    ));
    let body = StreamBody::new(futures::stream::unfold(
        receiver,
        |mut receiver| async move {
            receiver
                .recv()
                .await
                .map(|bytes| (Ok::<_, Infallible>(Frame::data(bytes)), receiver))
        },
    ));
    let mut response = Response::new(body.boxed());
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response.headers_mut().insert(
        header::TRANSFER_ENCODING,
        HeaderValue::from_static("chunked"),
    );
    Ok(response)
}

async fn stream_events(
    request: WatchRequest,
    initial: Vec<Bytes>,
    mut last_rv: u64,
    changes: Option<broadcast::Receiver<Arc<Change>>>,
    sender: mpsc::Sender<Bytes>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
    bookmark_interval: Duration,
) {
    for bytes in initial {
        if sender.send(bytes).await.is_err() {
            return;
        }
    }
    let Some(mut changes) = changes else {
        return;
    };
    let deadline = tokio::time::sleep(request.timeout);
    tokio::pin!(deadline);
    let mut bookmarks = tokio::time::interval(bookmark_interval);
    bookmarks.tick().await;
    loop {
        tokio::select! {
            () = &mut deadline => return,
            _ = shutdown.changed() => return,
            () = sender.closed() => return,
            _ = bookmarks.tick(), if request.bookmarks => {
                let bookmark = json!({
                    "type": "BOOKMARK",
                    "object": {
                        "kind": request.resource.kind,
                        "apiVersion": request.resource.api_version(),
                        "metadata": { "resourceVersion": last_rv.to_string() },
                    },
                });
                if sender.send(line(&bookmark)).await.is_err() {
                    return;
                }
            }
            received = changes.recv() => match received {
                Ok(change) => {
                    if change.resource_version <= last_rv {
                        continue;
                    }
                    last_rv = change.resource_version;
                    if let Some(event) = request.event_for(&change)
                        && sender.send(line(&event)).await.is_err()
                    {
                        return;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    let _ = sender
                        .send(line(&expired(format!("too old resource version: {last_rv}"))))
                        .await;
                    return;
                }
                Err(broadcast::error::RecvError::Closed) => return,
            },
        }
    }
}
