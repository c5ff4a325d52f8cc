//! The object store behind the fake API server: JSON objects keyed by resource, namespace and
//! name, one global `resourceVersion`, and a history of changes for watches.
//!
//! Every verb's semantics (conflicts, graceful deletion, preconditions, generation, status
//! subresource) live here, so the HTTP layer and the in-process [`Store`] API behave alike.
//! All writes happen under one lock: two racing requests are serialized exactly as etcd's
//! compare-and-swap would order them.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use rand::Rng as _;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::sync::broadcast;

use super::event_views;
use super::fields::FieldQuery;
use super::paging::{AtRevision, ContinueFrom, Key, continue_token, parse_continue};
use super::resources::{self, ResourceType};
use super::selectors::LabelQuery;
use super::status::ApiError;

/// How many changes are kept for watches that resume from a `resourceVersion`; older ones
/// get `410 Gone`, as after an etcd compaction.
const HISTORY_LIMIT: usize = 20_000;

/// What a change did to an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeType {
    Added,
    Modified,
    Deleted,
}

impl ChangeType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One committed change, as watches see it.
#[derive(Debug, Clone)]
pub struct Change {
    pub resource_version: u64,
    pub resource: &'static ResourceType,
    pub change: ChangeType,
    /// The object after the change (for deletions: its last state, with the deletion's
    /// resourceVersion).
    pub object: Value,
    /// The object before the change, so a filtered watch can tell "stopped matching".
    pub previous: Option<Value>,
}

/// Options of a delete (`DeleteOptions` body and query parameters).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeleteOptions {
    pub grace_period_seconds: Option<i64>,
    pub precondition_uid: Option<String>,
    pub precondition_resource_version: Option<String>,
}

impl DeleteOptions {
    /// Reads a `DeleteOptions` JSON object (missing fields stay unset).
    pub fn from_json(body: &Value) -> Self {
        let preconditions = body.get("preconditions");
        Self {
            grace_period_seconds: body.get("gracePeriodSeconds").and_then(Value::as_i64),
            precondition_uid: preconditions
                .and_then(|p| p.get("uid"))
                .and_then(Value::as_str)
                .map(str::to_owned),
            precondition_resource_version: preconditions
                .and_then(|p| p.get("resourceVersion"))
                .and_then(Value::as_str)
                .map(str::to_owned),
        }
    }
}

/// What a delete answers: the object (pods, and objects left in place pending graceful
/// deletion or finalizers) or a `Status` of success.
#[derive(Debug, Clone, PartialEq)]
pub enum Deleted {
    /// Still there with a `deletionTimestamp`.
    Pending(Value),
    /// Gone; the body answered is the last state (what the server returns for pods).
    GoneWithObject(Value),
    /// Gone; the body answered is a `Status` with `status: Success`.
    GoneWithStatus(Value),
}

impl Deleted {
    pub fn body(&self) -> &Value {
        match self {
            Self::Pending(v) | Self::GoneWithObject(v) | Self::GoneWithStatus(v) => v,
        }
    }
}

/// Which parts of an object a write may change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateMode {
    /// PUT/PATCH of the main resource: the stored status is kept.
    Main,
    /// PUT/PATCH of `/status`: only the status (and metadata labels/annotations) change.
    Status,
    /// In-process test setup: everything the caller sends is stored.
    Full,
}

/// Who creates an object: HTTP clients get the server's create-time defaults (a pod's status
/// is reset to `Pending`); in-process test setup stores what it is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Client,
    Setup,
}

/// A list page.
#[derive(Debug, Clone)]
pub struct ListPage {
    pub items: Vec<Value>,
    pub resource_version: u64,
    pub continue_token: Option<String>,
    pub remaining: Option<usize>,
}

/// The backlog of a watch and the receiver of the changes after it.
pub(crate) type WatchStart = (Vec<Arc<Change>>, broadcast::Receiver<Arc<Change>>);

/// Everything the store holds, guarded by one lock.
pub(crate) struct State {
    rv: u64,
    objects: HashMap<&'static str, BTreeMap<Key, Value>>,
    history: VecDeque<Arc<Change>>,
    changes: broadcast::Sender<Arc<Change>>,
    /// When the "kubelet" may remove a gracefully deleted pod (by uid).
    pub(crate) deletion_deadlines: HashMap<String, Instant>,
    /// Real seconds of a grace period are multiplied by this (tests scale time down).
    pub(crate) grace_scale: f64,
    /// The revision of the last compaction: `continue` tokens of earlier ones are expired.
    compacted: u64,
    /// The revision at the API server's last restart: its new watch cache reaches back no
    /// further, so a watch from an earlier one is `410 Expired`.
    watch_floor: u64,
    /// Counts restarts; every open watch ends at one.
    restarts: tokio::sync::watch::Sender<u64>,
}

/// RFC 3339 with second precision, as `metav1.Time` serializes.
pub(crate) fn now_rfc3339() -> String {
    rfc3339(jiff::Timestamp::now())
}

pub(crate) fn rfc3339(ts: jiff::Timestamp) -> String {
    ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// A random RFC 4122 version-4 UID.
pub(crate) fn new_uid() -> String {
    let bytes: [u8; 16] = rand::rng().random();
    let hex = hex::encode(bytes);
    format!(
        "{}-{}-4{}-a{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[13..16],
        &hex[17..20],
        &hex[20..32]
    )
}

/// The 5-character suffix `generateName` gets (the apiserver's alphabet avoids vowels).
pub(crate) fn name_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::rng();
    (0..5)
        .map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]))
        .collect()
}

/// The resource whose shape an object is stored in (`events.k8s.io` Events are stored as
/// core/v1 Events).
/// The taint every new node carries until the node lifecycle controller sees it Ready.
pub(crate) const NOT_READY_TAINT: &str = "node.kubernetes.io/not-ready";

/// What kube-apiserver's `TaintNodesByCondition` admission plugin does to a node created
/// through the API: adds `node.kubernetes.io/not-ready:NoSchedule` (once), so nothing is
/// scheduled there before the node is seen Ready.
pub(crate) fn add_not_ready_taint(node: &mut Value) {
    let taints = &mut node["spec"]["taints"];
    if !taints.is_array() {
        *taints = json!([]);
    }
    if let Some(list) = taints.as_array_mut()
        && !list
            .iter()
            .any(|t| t["key"] == NOT_READY_TAINT && t["effect"] == "NoSchedule")
    {
        list.push(json!({"key": NOT_READY_TAINT, "effect": "NoSchedule"}));
    }
}

fn storage_resource(resource: &'static ResourceType) -> &'static ResourceType {
    if resource.group == "events.k8s.io" {
        resources::find("", "v1", "events").unwrap_or(resource)
    } else {
        resource
    }
}

/// A stored object as `resource` shows it.
pub(crate) fn view(resource: &ResourceType, object: Value) -> Value {
    if resource.group == "events.k8s.io" {
        event_views::core_to_v1(object)
    } else {
        object
    }
}

/// An object sent for `resource`, in its stored shape.
fn stored(resource: &ResourceType, object: Value) -> Value {
    if resource.group == "events.k8s.io" {
        event_views::v1_to_core(object)
    } else {
        object
    }
}

pub(crate) fn meta_str<'a>(object: &'a Value, field: &str) -> &'a str {
    object
        .get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn metadata_mut(object: &mut Value) -> &mut serde_json::Map<String, Value> {
    if !object.get("metadata").is_some_and(Value::is_object) {
        object["metadata"] = json!({});
    }
    match object.get_mut("metadata") {
        Some(Value::Object(map)) => map,
        _ => unreachable!("metadata was just made an object"),
    }
}

/// The labels of a JSON object.
pub(crate) fn labels_of(object: &Value) -> BTreeMap<String, String> {
    object
        .get("metadata")
        .and_then(|m| m.get("labels"))
        .and_then(Value::as_object)
        .map(|labels| {
            labels
                .iter()
                .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}

/// Everything but metadata and status: a change here bumps `metadata.generation`.
fn spec_part(object: &Value) -> Value {
    let mut copy = object.clone();
    if let Some(map) = copy.as_object_mut() {
        map.remove("metadata");
        map.remove("status");
    }
    copy
}

impl State {
    fn new() -> Self {
        let (changes, _) = broadcast::channel(4096);
        Self {
            rv: 1,
            objects: HashMap::new(),
            history: VecDeque::new(),
            changes,
            deletion_deadlines: HashMap::new(),
            grace_scale: 1.0,
            compacted: 0,
            watch_floor: 0,
            restarts: tokio::sync::watch::Sender::new(0),
        }
    }

    pub(crate) fn resource_version(&self) -> u64 {
        self.rv
    }

    fn bucket(&self, resource: &ResourceType) -> Option<&BTreeMap<Key, Value>> {
        self.objects.get(resource.storage)
    }

    fn key(resource: &ResourceType, namespace: &str, name: &str) -> Key {
        let namespace = if resource.namespaced { namespace } else { "" };
        (namespace.to_owned(), name.to_owned())
    }

    /// Stores `object` (or removes the key when `None`) and records the change.
    fn commit(
        &mut self,
        resource: &'static ResourceType,
        key: Key,
        mut object: Value,
        change: ChangeType,
    ) -> Value {
        self.rv += 1;
        let rv = self.rv;
        metadata_mut(&mut object).insert("resourceVersion".into(), json!(rv.to_string()));
        let bucket = self.objects.entry(resource.storage).or_default();
        let previous = if change == ChangeType::Deleted {
            bucket.remove(&key)
        } else {
            bucket.insert(key, object.clone())
        };
        let record = Arc::new(Change {
            resource_version: rv,
            resource,
            change,
            object: object.clone(),
            previous,
        });
        if self.history.len() >= HISTORY_LIMIT {
            self.history.pop_front();
        }
        self.history.push_back(record.clone());
        // No receiver is fine: nobody watches.
        let _ = self.changes.send(record);
        object
    }

    pub(crate) fn get(
        &self,
        resource: &'static ResourceType,
        namespace: &str,
        name: &str,
    ) -> Result<Value, ApiError> {
        self.bucket(resource)
            .and_then(|b| b.get(&Self::key(resource, namespace, name)))
            .map(|object| view(resource, object.clone()))
            .ok_or_else(|| ApiError::not_found(resource, name))
    }

    /// Objects of a resource, optionally in one namespace, in key order.
    pub(crate) fn iter(
        &self,
        resource: &ResourceType,
        namespace: Option<&str>,
    ) -> impl Iterator<Item = &Value> {
        let namespace = namespace.filter(|_| resource.namespaced).map(str::to_owned);
        self.bucket(resource)
            .into_iter()
            .flat_map(|b| b.iter())
            .filter(move |((ns, _), _)| namespace.as_ref().is_none_or(|wanted| wanted == ns))
            .map(|(_, v)| v)
    }

    /// Objects of a resource as it shows them (converted where two shapes share a storage).
    pub(crate) fn iter_view(&self, resource: &ResourceType, namespace: Option<&str>) -> Vec<Value> {
        self.iter(resource, namespace)
            .map(|object| view(resource, object.clone()))
            .collect()
    }

    pub(crate) fn list(
        &self,
        resource: &'static ResourceType,
        namespace: Option<&str>,
        labels: &LabelQuery,
        fields: &FieldQuery,
        limit: Option<usize>,
        continue_from: Option<&str>,
    ) -> Result<ListPage, ApiError> {
        let start = continue_from.map(parse_continue).transpose()?;
        let at = self.list_revision(start.as_ref())?;
        let namespace = namespace.filter(|_| resource.namespaced);
        let empty = BTreeMap::new();
        let bucket = self.bucket(resource).unwrap_or(&empty);
        // Read from the continue key on, as etcd does: a page costs its own items, not the
        // whole collection (a 150,000-pod list in pages of 500 must not scan it 300 times).
        let (after, mut past) = match &start {
            Some(from) => (
                bucket.range((Bound::Excluded(from.key.clone()), Bound::Unbounded)),
                self.changed_since(resource, at),
            ),
            None => (bucket.range::<Key, _>(..), BTreeMap::new()),
        };
        if let Some(from) = &start {
            past = past.split_off(&from.key);
            past.remove(&from.key);
        }
        let mut in_scope =
            AtRevision::new(after, past).filter(|(key, _)| namespace.is_none_or(|ns| ns == key.0));
        let mut items = Vec::new();
        let mut last_key = None;
        for (key, object) in in_scope.by_ref() {
            let object = view(resource, object.into_owned());
            if !labels.matches(&labels_of(&object)) || !fields.matches(resource, &object) {
                continue;
            }
            last_key = Some(key.into_owned());
            items.push(object);
            if limit.is_some_and(|l| items.len() >= l) {
                break;
            }
        }
        // As kube-apiserver: a full page with keys after it gets a continue token, whether
        // or not they match (the next page may come back empty); `remainingItemCount` is
        // given only without selectors, since counting matches would mean reading them all.
        let selected = labels != &LabelQuery::everything() || !fields.is_empty();
        let (more, remaining) = match limit.filter(|l| items.len() >= *l) {
            None => (false, None),
            Some(_) if selected => (in_scope.next().is_some(), None),
            Some(_) => {
                let left = in_scope.count();
                (left > 0, Some(left))
            }
        };
        let continue_token = if more {
            last_key.map(|k| continue_token(Some(at), &k))
        } else {
            None
        };
        Ok(ListPage {
            items,
            resource_version: at,
            remaining: remaining.filter(|_| continue_token.is_some()),
            continue_token,
        })
    }

    /// The revision a page is read at: the latest for a first page (or a token for the rest
    /// at the latest state), else the first page's. A token whose revision was compacted, or
    /// lies beyond the history kept, has expired.
    fn list_revision(&self, start: Option<&ContinueFrom>) -> Result<u64, ApiError> {
        match start {
            Some(ContinueFrom { rv: Some(rv), key })
                if *rv < self.compacted || self.changes_since(*rv).is_none() =>
            {
                Err(ApiError::continue_expired(continue_token(None, key)))
            }
            Some(ContinueFrom { rv: Some(rv), .. }) => Ok((*rv).min(self.rv)),
            _ => Ok(self.rv),
        }
    }

    /// For each key of `resource`'s storage changed after `rv`, its value before the first
    /// such change (`None`: created since).
    fn changed_since(&self, resource: &ResourceType, rv: u64) -> BTreeMap<Key, Option<Value>> {
        let mut past = BTreeMap::new();
        let since = self.history.iter().rev();
        for change in since.take_while(|c| c.resource_version > rv) {
            if change.resource.storage == resource.storage {
                let key = Self::key(
                    change.resource,
                    meta_str(&change.object, "namespace"),
                    meta_str(&change.object, "name"),
                );
                // Newest first: the earliest change's value is written last.
                past.insert(key, change.previous.clone());
            }
        }
        past
    }

    /// A receiver that changes when the API server restarts (its open watches end then).
    pub(crate) fn restarts(&self) -> tokio::sync::watch::Receiver<u64> {
        self.restarts.subscribe()
    }

    /// What a restart of kube-apiserver does to watches: every open one ends, and the new
    /// watch cache starts from a list at the current revision, so a watch resuming from an
    /// earlier one is `410 Expired` ("too old resource version") and its client lists again.
    /// Lists and their `continue` tokens are read from storage and are not affected.
    pub(crate) fn restart_watch_cache(&mut self) {
        self.watch_floor = self.rv;
        self.restarts.send_modify(|count| *count += 1);
    }

    /// Compacts the history as etcd does when kube-apiserver compacts it: `continue` tokens of
    /// earlier revisions expire. Watches are served from the history, as from kube-apiserver's
    /// watch cache, which a compaction leaves alone.
    pub(crate) fn compact(&mut self) {
        self.compacted = self.rv;
    }

    fn namespace(&self, namespace: &str) -> Option<&Value> {
        self.objects
            .get("namespaces")?
            .get(&(String::new(), namespace.to_owned()))
    }

    fn namespace_exists(&self, namespace: &str) -> bool {
        self.namespace(namespace).is_some()
    }

    /// Whether `namespace` is being deleted (its content goes first, and nothing new may be
    /// created in it: the NamespaceLifecycle admission plugin).
    pub(crate) fn namespace_terminating(&self, namespace: &str) -> bool {
        self.namespace(namespace)
            .is_some_and(|object| object["metadata"].get("deletionTimestamp").is_some())
    }

    pub(crate) fn create(
        &mut self,
        requested: &'static ResourceType,
        namespace: &str,
        object: Value,
        origin: Origin,
    ) -> Result<Value, ApiError> {
        let resource = storage_resource(requested);
        let mut object = stored(requested, object);
        if !object.is_object() {
            return Err(ApiError::bad_request(
                "the body of the request is not a JSON object",
            ));
        }
        let body_namespace = meta_str(&object, "namespace").to_owned();
        let namespace = if resource.namespaced {
            if !namespace.is_empty() && !body_namespace.is_empty() && namespace != body_namespace {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            if namespace.is_empty() {
                body_namespace
            } else {
                namespace.to_owned()
            }
        } else {
            String::new()
        };
        let mut name = meta_str(&object, "name").to_owned();
        if name.is_empty() {
            let generate = meta_str(&object, "generateName");
            if generate.is_empty() {
                return Err(ApiError::invalid(
                    resource,
                    "",
                    "metadata.name: Required value: name or generateName is required",
                ));
            }
            name = format!("{generate}{}", name_suffix());
        }
        if resource.namespaced {
            if namespace.is_empty() {
                return Err(ApiError::bad_request(
                    "the server could not find the requested resource: namespace required",
                ));
            }
            if !self.namespace_exists(&namespace) {
                return Err(ApiError::namespace_not_found(&namespace));
            }
            if self.namespace_terminating(&namespace) {
                return Err(ApiError::namespace_terminating(
                    resource.plural,
                    &name,
                    &namespace,
                ));
            }
        }
        let key = Self::key(resource, &namespace, &name);
        if self.bucket(resource).is_some_and(|b| b.contains_key(&key)) {
            return Err(ApiError::already_exists(resource, &name));
        }
        object["apiVersion"] = json!(resource.api_version());
        object["kind"] = json!(resource.kind);
        let metadata = metadata_mut(&mut object);
        metadata.insert("name".into(), json!(name));
        if resource.namespaced {
            metadata.insert("namespace".into(), json!(namespace));
        } else {
            metadata.remove("namespace");
        }
        metadata.insert("uid".into(), json!(new_uid()));
        metadata.insert("creationTimestamp".into(), json!(now_rfc3339()));
        metadata.insert("generation".into(), json!(1));
        metadata.remove("deletionTimestamp");
        metadata.remove("deletionGracePeriodSeconds");
        self.admit(resource, &namespace, &name, &mut object, origin)?;
        let created = view(
            requested,
            self.commit(resource, key, object, ChangeType::Added),
        );
        if resource.plural == "namespaces" {
            self.create_default_service_account(&name);
        }
        Ok(created)
    }

    /// What the API server does to a new object before storing it: the status a client
    /// cannot set, and the admission plugins the fake has (`ServiceAccount` for pods,
    /// `TaintNodesByCondition` for nodes). Objects seeded by the tests keep what they say.
    fn admit(
        &self,
        resource: &ResourceType,
        namespace: &str,
        name: &str,
        object: &mut Value,
        origin: Origin,
    ) -> Result<(), ApiError> {
        if origin != Origin::Client {
            if resource.plural == "namespaces" && object.get("status").is_none() {
                object["status"] = json!({ "phase": "Active" });
            }
            return Ok(());
        }
        match resource.plural {
            "pods" => {
                self.admit_service_account(namespace, name, object)?;
                object["status"] = json!({ "phase": "Pending", "qosClass": "BestEffort" })
            }
            "namespaces" => object["status"] = json!({ "phase": "Active" }),
            "nodes" => add_not_ready_taint(object),
            _ if resource.has_status => object["status"] = json!({}),
            _ => {}
        }
        Ok(())
    }

    /// The service account controller's part: every namespace gets its `default`
    /// ServiceAccount. On a real cluster it comes a moment after the namespace; here at once.
    fn create_default_service_account(&mut self, namespace: &str) {
        let Some(accounts) = resources::find("", "v1", "serviceaccounts") else {
            return;
        };
        let _ = self.create(
            accounts,
            namespace,
            json!({ "metadata": { "name": "default" } }),
            Origin::Setup,
        );
    }

    /// kube-apiserver's `ServiceAccount` admission plugin: a pod runs as a service account of
    /// its namespace (`default` when it names none), which must exist.
    fn admit_service_account(
        &self,
        namespace: &str,
        name: &str,
        pod: &mut Value,
    ) -> Result<(), ApiError> {
        let account = pod["spec"]["serviceAccountName"]
            .as_str()
            .filter(|a| !a.is_empty())
            .unwrap_or("default")
            .to_owned();
        let exists = self
            .objects
            .get("serviceaccounts")
            .is_some_and(|b| b.contains_key(&(namespace.to_owned(), account.clone())));
        if !exists {
            return Err(ApiError::new(
                403,
                "Forbidden",
                format!(
                    "pods \"{name}\" is forbidden: error looking up service account {namespace}/{account}: serviceaccount \"{account}\" not found"
                ),
            ));
        }
        if pod["spec"].is_object() {
            pod["spec"]["serviceAccountName"] = json!(account);
        }
        Ok(())
    }

    /// Replaces an object; a non-empty `metadata.resourceVersion` must be the current one.
    pub(crate) fn update(
        &mut self,
        requested: &'static ResourceType,
        namespace: &str,
        name: &str,
        object: Value,
        mode: UpdateMode,
    ) -> Result<Value, ApiError> {
        if !object.is_object() {
            return Err(ApiError::bad_request(
                "the body of the request is not a JSON object",
            ));
        }
        let resource = storage_resource(requested);
        let mut object = stored(requested, object);
        let current = self.get(resource, namespace, name)?;
        let body_name = meta_str(&object, "name");
        if !body_name.is_empty() && body_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        let body_namespace = meta_str(&object, "namespace");
        if resource.namespaced && !body_namespace.is_empty() && body_namespace != namespace {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        let wanted_rv = meta_str(&object, "resourceVersion");
        if !wanted_rv.is_empty() && wanted_rv != meta_str(&current, "resourceVersion") {
            return Err(ApiError::conflict(resource, name));
        }
        let uid = meta_str(&object, "uid");
        if !uid.is_empty() && uid != meta_str(&current, "uid") {
            return Err(ApiError::conflict_because(
                resource,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    meta_str(&current, "uid")
                ),
            ));
        }
        match mode {
            UpdateMode::Main if resource.has_status => {
                object["status"] = current.get("status").cloned().unwrap_or(Value::Null);
                if object["status"].is_null()
                    && let Some(map) = object.as_object_mut()
                {
                    map.remove("status");
                }
            }
            UpdateMode::Status => {
                let status = object.get("status").cloned();
                let labels = object
                    .get("metadata")
                    .and_then(|m| m.get("labels"))
                    .cloned();
                let annotations = object
                    .get("metadata")
                    .and_then(|m| m.get("annotations"))
                    .cloned();
                let mut merged = current.clone();
                match status {
                    Some(status) => merged["status"] = status,
                    None => {
                        if let Some(map) = merged.as_object_mut() {
                            map.remove("status");
                        }
                    }
                }
                let metadata = metadata_mut(&mut merged);
                for (field, value) in [("labels", labels), ("annotations", annotations)] {
                    match value {
                        Some(value) => metadata.insert(field.into(), value),
                        None => metadata.remove(field),
                    };
                }
                object = merged;
            }
            _ => {}
        }
        // Server-owned metadata cannot be changed by a write.
        object["apiVersion"] = json!(resource.api_version());
        object["kind"] = json!(resource.kind);
        let generation = current
            .get("metadata")
            .and_then(|m| m.get("generation"))
            .and_then(Value::as_i64)
            .unwrap_or(1);
        let generation = if spec_part(&object) != spec_part(&current) {
            generation + 1
        } else {
            generation
        };
        let current_meta = current.get("metadata").cloned().unwrap_or_default();
        let metadata = metadata_mut(&mut object);
        for field in [
            "name",
            "namespace",
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
        ] {
            match current_meta.get(field) {
                Some(value) => metadata.insert(field.into(), value.clone()),
                None => metadata.remove(field),
            };
        }
        metadata.insert("generation".into(), json!(generation));
        let key = Self::key(resource, namespace, name);
        let finalized = metadata.contains_key("deletionTimestamp")
            && metadata
                .get("finalizers")
                .and_then(Value::as_array)
                .is_none_or(Vec::is_empty);
        if finalized && resource.plural != "pods" {
            // The last finalizer is gone from an object being deleted: it goes now.
            return Ok(view(
                requested,
                self.commit(resource, key, object, ChangeType::Deleted),
            ));
        }
        Ok(view(
            requested,
            self.commit(resource, key, object, ChangeType::Modified),
        ))
    }

    /// Deletes like the API server: preconditions, graceful deletion for scheduled pods,
    /// finalizers keep an object until they are removed, namespaces take their content.
    pub(crate) fn delete(
        &mut self,
        requested: &'static ResourceType,
        namespace: &str,
        name: &str,
        options: &DeleteOptions,
    ) -> Result<Deleted, ApiError> {
        let resource = storage_resource(requested);
        let deleted = self.delete_stored(resource, namespace, name, options)?;
        Ok(match deleted {
            Deleted::Pending(object) => Deleted::Pending(view(requested, object)),
            Deleted::GoneWithObject(object) => Deleted::GoneWithObject(view(requested, object)),
            status @ Deleted::GoneWithStatus(_) => status,
        })
    }

    fn delete_stored(
        &mut self,
        resource: &'static ResourceType,
        namespace: &str,
        name: &str,
        options: &DeleteOptions,
    ) -> Result<Deleted, ApiError> {
        let current = self.get(resource, namespace, name)?;
        if let Some(uid) = &options.precondition_uid {
            let actual = meta_str(&current, "uid");
            if uid != actual {
                return Err(ApiError::conflict_because(
                    resource,
                    name,
                    &format!(
                        "Precondition failed: UID in precondition: {uid}, UID in object meta: {actual}"
                    ),
                ));
            }
        }
        if let Some(rv) = &options.precondition_resource_version {
            let actual = meta_str(&current, "resourceVersion");
            if rv != actual {
                return Err(ApiError::conflict_because(
                    resource,
                    name,
                    &format!(
                        "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {actual}"
                    ),
                ));
            }
        }
        let key = Self::key(resource, namespace, name);
        if resource.plural == "namespaces" {
            return Ok(self.begin_namespace_termination(resource, key, current));
        }
        let has_finalizers = current
            .get("metadata")
            .and_then(|m| m.get("finalizers"))
            .and_then(Value::as_array)
            .is_some_and(|f| !f.is_empty());
        if resource.plural == "pods" && resource.group.is_empty() {
            let phase = current
                .get("status")
                .and_then(|s| s.get("phase"))
                .and_then(Value::as_str)
                .unwrap_or_default();
            let scheduled = !current
                .get("spec")
                .and_then(|s| s.get("nodeName"))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .is_empty();
            let mut grace = options
                .grace_period_seconds
                .or_else(|| {
                    current
                        .get("spec")
                        .and_then(|s| s.get("terminationGracePeriodSeconds"))
                        .and_then(Value::as_i64)
                })
                .unwrap_or(30)
                .max(0);
            if !scheduled || phase == "Succeeded" || phase == "Failed" {
                grace = 0;
            }
            let existing_grace = current
                .get("metadata")
                .and_then(|m| m.get("deletionGracePeriodSeconds"))
                .and_then(Value::as_i64);
            if grace == 0 && !has_finalizers {
                let uid = meta_str(&current, "uid").to_owned();
                self.deletion_deadlines.remove(&uid);
                let object = self.commit(resource, key, current, ChangeType::Deleted);
                return Ok(Deleted::GoneWithObject(object));
            }
            if existing_grace.is_some_and(|existing| existing <= grace) {
                // Already being deleted at least as fast: nothing changes.
                return Ok(Deleted::Pending(current));
            }
            let mut object = current;
            let deadline = jiff::Timestamp::now()
                .checked_add(jiff::SignedDuration::from_secs(grace))
                .unwrap_or_else(|_| jiff::Timestamp::now());
            let metadata = metadata_mut(&mut object);
            metadata.insert("deletionTimestamp".into(), json!(rfc3339(deadline)));
            metadata.insert("deletionGracePeriodSeconds".into(), json!(grace));
            let uid = meta_str(&object, "uid").to_owned();
            let scaled = Duration::from_secs_f64((grace as f64 * self.grace_scale).max(0.0));
            self.deletion_deadlines.insert(uid, Instant::now() + scaled);
            let object = self.commit(resource, key, object, ChangeType::Modified);
            return Ok(Deleted::Pending(object));
        }
        if has_finalizers {
            if current
                .get("metadata")
                .and_then(|m| m.get("deletionTimestamp"))
                .is_some()
            {
                return Ok(Deleted::Pending(current));
            }
            let mut object = current;
            let metadata = metadata_mut(&mut object);
            metadata.insert("deletionTimestamp".into(), json!(now_rfc3339()));
            metadata.insert("deletionGracePeriodSeconds".into(), json!(0));
            let object = self.commit(resource, key, object, ChangeType::Modified);
            return Ok(Deleted::Pending(object));
        }
        let uid = meta_str(&current, "uid").to_owned();
        self.commit(resource, key, current, ChangeType::Deleted);
        let mut details = json!({ "name": name, "kind": resource.plural, "uid": uid });
        if !resource.group.is_empty() {
            details["group"] = json!(resource.group);
        }
        Ok(Deleted::GoneWithStatus(json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": details,
        })))
    }

    /// A deleted namespace is not removed at once: it turns `Terminating` and stays until the
    /// namespace controller (the simulation's) has deleted its content, pods gracefully.
    fn begin_namespace_termination(
        &mut self,
        resource: &'static ResourceType,
        key: Key,
        current: Value,
    ) -> Deleted {
        if current["metadata"].get("deletionTimestamp").is_some() {
            return Deleted::Pending(current);
        }
        let mut object = current;
        let metadata = metadata_mut(&mut object);
        metadata.insert("deletionTimestamp".into(), json!(now_rfc3339()));
        metadata.insert("deletionGracePeriodSeconds".into(), json!(0));
        object["status"] = json!({"phase": "Terminating"});
        Deleted::Pending(self.commit(resource, key, object, ChangeType::Modified))
    }

    fn remove_key(&mut self, resource: &'static ResourceType, key: Key) -> Option<Value> {
        let object = self.bucket(resource)?.get(&key)?.clone();
        self.deletion_deadlines.remove(meta_str(&object, "uid"));
        Some(self.commit(resource, key, object, ChangeType::Deleted))
    }

    /// Removes an object at once, whatever its grace period or finalizers (the kubelet's
    /// final delete, or test setup).
    pub(crate) fn remove(
        &mut self,
        resource: &'static ResourceType,
        namespace: &str,
        name: &str,
    ) -> Option<Value> {
        let stored_as = storage_resource(resource);
        self.remove_key(stored_as, Self::key(stored_as, namespace, name))
            .map(|object| view(resource, object))
    }

    /// Deletions committed after `resource_version` (for the garbage collector).
    pub(crate) fn deletions_since(&self, resource_version: u64) -> Vec<Arc<Change>> {
        self.history
            .iter()
            .rev()
            .take_while(|c| c.resource_version > resource_version)
            .filter(|c| c.change == ChangeType::Deleted)
            .cloned()
            .collect()
    }

    /// Every change committed after `resource_version`, or `None` when the history no
    /// longer reaches back that far.
    pub(crate) fn changes_since(&self, resource_version: u64) -> Option<Vec<Arc<Change>>> {
        let oldest = self.history.front().map_or(self.rv, |c| c.resource_version);
        (resource_version + 1 >= oldest).then(|| {
            self.history
                .iter()
                .rev()
                .take_while(|c| c.resource_version > resource_version)
                .cloned()
                .collect()
        })
    }

    /// Changes since `resource_version` for a watch, and a receiver for the ones to come,
    /// taken under the same lock so that no change is missed or seen twice.
    pub(crate) fn watch_from(&self, resource_version: u64) -> Result<WatchStart, ApiError> {
        let oldest = self.history.front().map_or(self.rv, |c| c.resource_version);
        let oldest = oldest.max(self.watch_floor + 1);
        if resource_version + 1 < oldest {
            return Err(ApiError::gone(format!(
                "too old resource version: {resource_version} ({})",
                oldest - 1
            )));
        }
        let backlog = self
            .history
            .iter()
            .filter(|c| c.resource_version > resource_version)
            .cloned()
            .collect();
        Ok((backlog, self.changes.subscribe()))
    }
}

/// Types that can be stored through the typed in-process API: every k8s-openapi resource.
pub trait StoredKind:
    k8s_openapi::Resource + k8s_openapi::Metadata<Ty = ObjectMeta> + Serialize + DeserializeOwned
{
}

impl<K> StoredKind for K where
    K: k8s_openapi::Resource
        + k8s_openapi::Metadata<Ty = ObjectMeta>
        + Serialize
        + DeserializeOwned
{
}

/// Errors of the in-process API that are not API errors.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    Api(#[from] ApiError),
    #[error("the fake API server does not serve {api_version} {kind}; add it to kube/resources.rs")]
    UnknownKind { api_version: String, kind: String },
    #[error("object does not (de)serialize as {kind}: {source}")]
    Serde {
        kind: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("manifest is not valid YAML: {0}")]
    Yaml(String),
}

/// The fake cluster's objects, shared by the HTTP server, the simulation and tests.
#[derive(Clone)]
pub struct Store {
    state: Arc<Mutex<State>>,
}

impl Default for Store {
    fn default() -> Self {
        Self::new()
    }
}

fn resource_of<K: StoredKind>() -> Result<&'static ResourceType, StoreError> {
    resources::find_kind(K::API_VERSION, K::KIND).ok_or_else(|| StoreError::UnknownKind {
        api_version: K::API_VERSION.to_owned(),
        kind: K::KIND.to_owned(),
    })
}

fn to_value<K: StoredKind>(object: &K) -> Result<Value, StoreError> {
    serde_json::to_value(object).map_err(|source| StoreError::Serde {
        kind: K::KIND.to_owned(),
        source,
    })
}

fn from_value<K: StoredKind>(value: Value) -> Result<K, StoreError> {
    serde_json::from_value(value).map_err(|source| StoreError::Serde {
        kind: K::KIND.to_owned(),
        source,
    })
}

impl Store {
    /// A store holding the namespaces every cluster has (`default`, `kube-system`,
    /// `kube-public`, `kube-node-lease`).
    pub fn new() -> Self {
        let store = Self {
            state: Arc::new(Mutex::new(State::new())),
        };
        if let Some(namespaces) = resources::find("", "v1", "namespaces") {
            let mut state = store.lock();
            for name in ["default", "kube-system", "kube-public", "kube-node-lease"] {
                let _ = state.create(
                    namespaces,
                    "",
                    json!({ "metadata": { "name": name } }),
                    Origin::Setup,
                );
            }
        }
        store
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The current (latest) resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.lock().resource_version()
    }

    /// Compacts the history (etcd's compaction by kube-apiserver): `continue` tokens of
    /// earlier revisions expire with `410 Expired` and a token for the rest of their list.
    pub fn compact(&self) {
        self.lock().compact();
    }

    /// Restarts the API server's watch cache (see [`State::restart_watch_cache`]).
    pub fn restart_watch_cache(&self) {
        self.lock().restart_watch_cache();
    }

    pub(crate) fn set_grace_scale(&self, scale: f64) {
        self.lock().grace_scale = scale;
    }

    /// Creates an object as given (status included; server-owned metadata is set).
    pub fn create<K: StoredKind>(&self, object: &K) -> Result<K, StoreError> {
        let resource = resource_of::<K>()?;
        let namespace = object
            .metadata()
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let created = self
            .lock()
            .create(resource, &namespace, to_value(object)?, Origin::Setup)?;
        from_value(created)
    }

    /// Gets an object; `namespace` is ignored for cluster-scoped kinds.
    pub fn get<K: StoredKind>(&self, namespace: &str, name: &str) -> Result<K, StoreError> {
        let resource = resource_of::<K>()?;
        let value = self.lock().get(resource, namespace, name)?;
        from_value(value)
    }

    /// Like [`Store::get`], `None` when absent.
    pub fn find<K: StoredKind>(&self, namespace: &str, name: &str) -> Option<K> {
        self.get(namespace, name).ok()
    }

    /// Every object of a kind, across namespaces.
    pub fn list<K: StoredKind>(&self) -> Vec<K> {
        let Ok(resource) = resource_of::<K>() else {
            return Vec::new();
        };
        let values = self.lock().iter_view(resource, None);
        values
            .into_iter()
            .filter_map(|v| from_value(v).ok())
            .collect()
    }

    /// Every object of a kind in one namespace.
    pub fn list_in<K: StoredKind>(&self, namespace: &str) -> Vec<K> {
        let Ok(resource) = resource_of::<K>() else {
            return Vec::new();
        };
        let values = self.lock().iter_view(resource, Some(namespace));
        values
            .into_iter()
            .filter_map(|v| from_value(v).ok())
            .collect()
    }

    /// The `events.k8s.io` Events with `reason`, in every namespace.
    pub fn events_with_reason(&self, reason: &str) -> Vec<k8s_openapi::api::events::v1::Event> {
        self.list::<k8s_openapi::api::events::v1::Event>()
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .collect()
    }

    /// Replaces an object, status included (a set `resourceVersion` must be current).
    pub fn update<K: StoredKind>(&self, object: &K) -> Result<K, StoreError> {
        let resource = resource_of::<K>()?;
        let namespace = object.metadata().namespace.clone().unwrap_or_default();
        let name = object.metadata().name.clone().unwrap_or_default();
        let updated = self.lock().update(
            resource,
            &namespace,
            &name,
            to_value(object)?,
            UpdateMode::Full,
        )?;
        from_value(updated)
    }

    /// Reads, changes and writes back an object under the store lock (no conflict possible).
    pub fn modify<K: StoredKind>(
        &self,
        namespace: &str,
        name: &str,
        change: impl FnOnce(&mut K),
    ) -> Result<K, StoreError> {
        let resource = resource_of::<K>()?;
        let mut state = self.lock();
        let mut object: K = from_value(state.get(resource, namespace, name)?)?;
        change(&mut object);
        let mut value = to_value(&object)?;
        metadata_mut(&mut value).remove("resourceVersion");
        let updated = state.update(resource, namespace, name, value, UpdateMode::Full)?;
        drop(state);
        from_value(updated)
    }

    /// Deletes like a client's DELETE with default options (pods are deleted gracefully).
    pub fn delete<K: StoredKind>(&self, namespace: &str, name: &str) -> Result<(), StoreError> {
        let resource = resource_of::<K>()?;
        self.lock()
            .delete(resource, namespace, name, &DeleteOptions::default())?;
        Ok(())
    }

    /// Removes an object at once (no grace period, finalizers ignored); returns it if it was
    /// there.
    pub fn remove<K: StoredKind>(&self, namespace: &str, name: &str) -> Option<K> {
        let resource = resource_of::<K>().ok()?;
        let removed = self.lock().remove(resource, namespace, name)?;
        from_value(removed).ok()
    }

    /// Creates or replaces (status included) every object of a multi-document YAML
    /// manifest; objects without a namespace go to `default`. Returns how many were applied.
    pub fn apply_yaml(&self, yaml: &str) -> Result<usize, StoreError> {
        let documents: Vec<Value> =
            serde_saphyr::from_multiple(yaml).map_err(|e| StoreError::Yaml(e.to_string()))?;
        let mut applied = 0;
        for document in documents.into_iter().filter(Value::is_object) {
            let items = if document
                .get("kind")
                .and_then(Value::as_str)
                .is_some_and(|k| k == "List" || k.ends_with("List"))
            {
                document
                    .get("items")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default()
            } else {
                vec![document]
            };
            for item in items {
                self.apply_value(item)?;
                applied += 1;
            }
        }
        Ok(applied)
    }

    /// Creates or replaces (status included) one object given as JSON with its
    /// `apiVersion` and `kind`.
    pub fn apply_value(&self, object: Value) -> Result<Value, StoreError> {
        let api_version = object
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let kind = object
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let resource =
            resources::find_kind(api_version, kind).ok_or_else(|| StoreError::UnknownKind {
                api_version: api_version.to_owned(),
                kind: kind.to_owned(),
            })?;
        let namespace = match meta_str(&object, "namespace") {
            "" => "default".to_owned(),
            ns => ns.to_owned(),
        };
        let name = meta_str(&object, "name").to_owned();
        let mut state = self.lock();
        if state.get(resource, &namespace, &name).is_ok() {
            let mut object = object;
            metadata_mut(&mut object).remove("resourceVersion");
            Ok(state.update(resource, &namespace, &name, object, UpdateMode::Full)?)
        } else {
            Ok(state.create(resource, &namespace, object, Origin::Setup)?)
        }
    }

    /// The raw JSON of an object (what a GET would answer).
    pub fn get_value(
        &self,
        api_version: &str,
        kind: &str,
        namespace: &str,
        name: &str,
    ) -> Result<Value, StoreError> {
        let resource =
            resources::find_kind(api_version, kind).ok_or_else(|| StoreError::UnknownKind {
                api_version: api_version.to_owned(),
                kind: kind.to_owned(),
            })?;
        Ok(self.lock().get(resource, namespace, name)?)
    }
}
