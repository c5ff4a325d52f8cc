//! The audit log: one event per request, with the field names of the Kubernetes audit log
//! (`audit.k8s.io/v1` `Event`), so a scenario reads like a real cluster's audit trail.

use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::broadcast;

/// The authenticated user of a request (`userInfo`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditUser {
    pub username: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
}

/// What the request was about (`objectRef`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub resource: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub subresource: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default)]
    pub api_group: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_version: String,
}

/// `responseStatus`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResponseStatus {
    pub code: u16,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// One request, as `audit.k8s.io/v1` `Event` at level `RequestResponse`, stage
/// `ResponseComplete` (for watches: `ResponseStarted`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditEvent {
    pub kind: String,
    pub api_version: String,
    pub level: String,
    #[serde(rename = "auditID")]
    pub audit_id: String,
    pub stage: String,
    #[serde(rename = "requestURI")]
    pub request_uri: String,
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, ...
    pub verb: String,
    pub user: AuditUser,
    #[serde(rename = "sourceIPs", default)]
    pub source_ips: Vec<String>,
    #[serde(default)]
    pub user_agent: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_ref: Option<ObjectRef>,
    pub response_status: ResponseStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_object: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_object: Option<Value>,
    pub request_received_timestamp: String,
    pub stage_timestamp: String,
    /// Not in the real log: the fault injected into this request, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub injected_fault: Option<String>,
}

impl AuditEvent {
    pub fn resource(&self) -> &str {
        self.object_ref.as_ref().map_or("", |o| o.resource.as_str())
    }

    pub fn subresource(&self) -> &str {
        self.object_ref
            .as_ref()
            .map_or("", |o| o.subresource.as_str())
    }

    pub fn name(&self) -> &str {
        self.object_ref.as_ref().map_or("", |o| o.name.as_str())
    }

    pub fn namespace(&self) -> &str {
        self.object_ref
            .as_ref()
            .map_or("", |o| o.namespace.as_str())
    }

    pub fn code(&self) -> u16 {
        self.response_status.code
    }

    /// One line for a human: time, code, user, verb, resource/subresource, namespace/name,
    /// user agent.
    pub fn line(&self) -> String {
        let resource = match self.subresource() {
            "" => self.resource().to_owned(),
            sub => format!("{}/{sub}", self.resource()),
        };
        let target = match (self.namespace(), self.name()) {
            ("", "") => String::new(),
            ("", name) => name.to_owned(),
            (ns, "") => format!("{ns}/"),
            (ns, name) => format!("{ns}/{name}"),
        };
        let fault = self
            .injected_fault
            .as_deref()
            .map(|f| format!(" [fault: {f}]"))
            .unwrap_or_default();
        format!(
            "{} {} {} {} {} {} ua={:?}{}",
            self.request_received_timestamp,
            self.response_status.code,
            self.user.username,
            self.verb,
            if resource.is_empty() {
                self.request_uri.as_str()
            } else {
                resource.as_str()
            },
            target,
            self.user_agent,
            fault
        )
    }
}

/// The server's audit log; clones share it.
#[derive(Clone)]
pub struct AuditLog {
    events: Arc<Mutex<Vec<AuditEvent>>>,
    live: broadcast::Sender<AuditEvent>,
}

impl Default for AuditLog {
    fn default() -> Self {
        Self {
            events: Arc::default(),
            live: broadcast::channel(1024).0,
        }
    }
}

impl AuditLog {
    pub(crate) fn record(&self, event: AuditEvent) {
        if self.live.receiver_count() > 0 {
            let _ = self.live.send(event.clone());
        }
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(event);
    }

    /// Every event so far, in order.
    pub fn events(&self) -> Vec<AuditEvent> {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The events `keep` selects.
    pub fn filter(&self, keep: impl Fn(&AuditEvent) -> bool) -> Vec<AuditEvent> {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|e| keep(e))
            .cloned()
            .collect()
    }

    /// Events with this verb on this resource (`""` matches any resource), e.g.
    /// `("create", "pods")` with subresource `eviction` via [`AuditLog::filter`].
    pub fn requests(&self, verb: &str, resource: &str) -> Vec<AuditEvent> {
        self.filter(|e| e.verb == verb && (resource.is_empty() || e.resource() == resource))
    }

    /// Events on a subresource (`eviction`, `status`).
    pub fn subresource_requests(&self, resource: &str, subresource: &str) -> Vec<AuditEvent> {
        self.filter(|e| e.resource() == resource && e.subresource() == subresource)
    }

    /// Events by one user.
    pub fn by_user(&self, username: &str) -> Vec<AuditEvent> {
        self.filter(|e| e.user.username == username)
    }

    pub fn clear(&self) {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// The log, one line per request (see [`AuditEvent::line`]).
    pub fn lines(&self) -> Vec<String> {
        self.events().iter().map(AuditEvent::line).collect()
    }

    /// The log as JSON lines, as the API server's log backend writes it.
    pub fn json_lines(&self) -> String {
        self.events()
            .iter()
            .filter_map(|e| serde_json::to_string(e).ok())
            .map(|l| l + "\n")
            .collect()
    }

    /// Events as they happen (for a sandbox that prints the log live).
    pub fn subscribe(&self) -> broadcast::Receiver<AuditEvent> {
        self.live.subscribe()
    }
}
