//! Watches: a stream of `{"type": ..., "object": ...}` JSON lines from a resourceVersion on.
//!
//! Like the real server: a watch without a resourceVersion (or `0`) starts with synthetic
//! `ADDED` events for what exists; a watch from a version older than the kept history gets an
//! `ERROR` event with `410 Expired` ("too old resource version"); with a selector, an object
//! that stops matching is sent as `DELETED` and one that starts matching as `ADDED`;
//! `allowWatchBookmarks` adds `BOOKMARK` events carrying the latest version, as the watch cache
//! sends them: every minute and two seconds before the watch's deadline.

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

/// When a watch's next `BOOKMARK` is due, as kube-apiserver's watch cache schedules them:
/// every `interval` (a minute by default) and two seconds before the watch's deadline, so the
/// client resumes from a recent version; `None` once that moment has passed (a watch of two
/// seconds or less gets none).
fn next_bookmark_time(
    now: tokio::time::Instant,
    deadline: tokio::time::Instant,
    interval: Duration,
) -> Option<tokio::time::Instant> {
    let heartbeat = (now + interval).min(deadline.checked_sub(Duration::from_secs(2))?);
    (heartbeat >= now).then_some(heartbeat)
}

/// A `BOOKMARK` event at `version`.
fn bookmark(request: &WatchRequest, version: u64) -> Bytes {
    line(&json!({
        "type": "BOOKMARK",
        "object": {
            "kind": request.resource.kind,
            "apiVersion": request.resource.api_version(),
            "metadata": { "resourceVersion": version.to_string() },
        },
    }))
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
    let (
        Opening {
            initial,
            position,
            changes,
        },
        restarted,
    ) = {
        let store = state.store.lock();
        (open(&store, &request, requested)?, store.restarts())
    };
    let ends = Ends {
        shutdown: state.shutdown.clone(),
        restarted,
    };
    let bookmark_interval = state.bookmark_interval;
    tokio::spawn(stream_events(
        request,
        initial,
        position,
        changes,
        sender,
        ends,
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

/// What a watch starts with: the events it is sent first, where it stands, and the changes to
/// come (`None` when it ends at once: it resumed from a version no longer kept).
struct Opening {
    initial: Vec<Bytes>,
    position: Position,
    changes: Option<broadcast::Receiver<Arc<Change>>>,
}

/// Opens a watch from `requested` (`None`: the current state as `ADDED` events first), under
/// the store's lock so that no change is missed or sent twice.
fn open(
    store: &super::store::State,
    request: &WatchRequest,
    requested: Option<u64>,
) -> Result<Opening, ApiError> {
    let Some(rv) = requested else {
        let current = store.resource_version();
        let initial = store
            .iter_view(request.resource, request.namespace.as_deref())
            .into_iter()
            .filter(|object| request.selects(object))
            .map(|object| line(&json!({ "type": "ADDED", "object": object })))
            .collect();
        let (_, changes) = store.watch_from(current)?;
        let position = Position {
            seen: current,
            progressed: None,
        };
        return Ok(Opening {
            initial,
            position,
            changes: Some(changes),
        });
    };
    let (backlog, changes) = match store.watch_from(rv) {
        Ok(started) => started,
        Err(error) => {
            let position = Position {
                seen: rv,
                progressed: None,
            };
            let initial = vec![line(&expired(error.message))];
            return Ok(Opening {
                initial,
                position,
                changes: None,
            });
        }
    };
    let initial = backlog
        .iter()
        .filter_map(|change| request.event_for(change))
        .map(|event| line(&event))
        .collect();
    let position = Position {
        seen: backlog.last().map_or(rv, |c| c.resource_version),
        progressed: backlog
            .iter()
            .filter(|c| c.resource.storage == request.resource.storage)
            .map(|c| c.resource_version)
            .next_back(),
    };
    Ok(Opening {
        initial,
        position,
        changes: Some(changes),
    })
}

/// Where a watch stands.
struct Position {
    /// The version of the last change looked at (sent or not).
    seen: u64,
    /// The version of the last change of the watch's resource since it started: what the
    /// watch cache of that resource has processed. A bookmark carries it, and none is sent
    /// before the resource changed: kube-apiserver sends only bookmarks newer than the
    /// version a watch started from.
    progressed: Option<u64>,
}

/// What ends every open watch: the server stopping or restarting.
struct Ends {
    shutdown: tokio::sync::watch::Receiver<bool>,
    restarted: tokio::sync::watch::Receiver<u64>,
}

async fn stream_events(
    request: WatchRequest,
    initial: Vec<Bytes>,
    mut position: Position,
    changes: Option<broadcast::Receiver<Arc<Change>>>,
    sender: mpsc::Sender<Bytes>,
    mut ends: Ends,
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
    let ends_at = tokio::time::Instant::now() + request.timeout;
    let deadline = tokio::time::sleep_until(ends_at);
    tokio::pin!(deadline);
    let mut next_bookmark =
        next_bookmark_time(tokio::time::Instant::now(), ends_at, bookmark_interval)
            .filter(|_| request.bookmarks);
    loop {
        let bookmark_due = async {
            match next_bookmark {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = &mut deadline => return,
            _ = ends.shutdown.changed() => return,
            _ = ends.restarted.changed() => return,
            () = sender.closed() => return,
            () = bookmark_due => {
                next_bookmark = next_bookmark_time(tokio::time::Instant::now(), ends_at, bookmark_interval);
                let Some(progressed) = position.progressed else {
                    continue;
                };
                if sender.send(bookmark(&request, progressed)).await.is_err() {
                    return;
                }
            }
            received = changes.recv() => match received {
                Ok(change) => {
                    if change.resource_version <= position.seen {
                        continue;
                    }
                    position.seen = change.resource_version;
                    if change.resource.storage == request.resource.storage {
                        position.progressed = Some(change.resource_version);
                    }
                    if let Some(event) = request.event_for(&change)
                        && sender.send(line(&event)).await.is_err()
                    {
                        return;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    let _ = sender
                        .send(line(&expired(format!(
                            "too old resource version: {}",
                            position.seen
                        ))))
                        .await;
                    return;
                }
                Err(broadcast::error::RecvError::Closed) => return,
            },
        }
    }
}
