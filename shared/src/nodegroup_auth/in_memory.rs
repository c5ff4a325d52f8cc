//! An in-memory `aws-auth` that behaves like the API server where it matters: every write
//! bumps `resourceVersion`, a PUT with a stale one is a 409, a POST of an existing object is
//! AlreadyExists. Faults can be queued, and every call is counted, so the merge loop is
//! tested for races and retries without a cluster.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use k8s_openapi::api::core::v1::ConfigMap;

use super::aws_auth::{AwsAuthEvent, AwsAuthStore, StoreError};

#[derive(Debug, Default)]
struct State {
    object: Option<ConfigMap>,
    version: u64,
    replace_faults: VecDeque<StoreError>,
    create_faults: VecDeque<StoreError>,
    /// Stored just before the next write lands: a concurrent writer's change to lose to.
    before_next_write: Option<ConfigMap>,
    gets: usize,
    creates: usize,
    replaces: usize,
    events: Vec<AwsAuthEvent>,
}

/// `kube-system/aws-auth` in memory.
#[derive(Debug, Default, Clone)]
pub struct InMemoryAwsAuthStore {
    state: Arc<Mutex<State>>,
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl InMemoryAwsAuthStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts with `config_map` stored (its `resourceVersion` is assigned).
    pub fn with(config_map: ConfigMap) -> Self {
        let store = Self::new();
        store.put(config_map);
        store
    }

    /// Stores `config_map` as another writer would, bumping the version.
    pub fn put(&self, mut config_map: ConfigMap) {
        let mut state = lock(&self.state);
        state.version += 1;
        config_map.metadata.resource_version = Some(state.version.to_string());
        state.object = Some(config_map);
    }

    pub fn current(&self) -> Option<ConfigMap> {
        lock(&self.state).object.clone()
    }

    pub fn map_roles(&self) -> Option<String> {
        self.current()
            .and_then(|cm| cm.data)
            .and_then(|data| data.get("mapRoles").cloned())
    }

    pub fn resource_version(&self) -> Option<String> {
        self.current().and_then(|cm| cm.metadata.resource_version)
    }

    /// The next `times` PUTs fail with `error` before looking at the object.
    pub fn fail_replace(&self, error: StoreError, times: usize) {
        lock(&self.state)
            .replace_faults
            .extend(std::iter::repeat_n(error, times));
    }

    pub fn fail_create(&self, error: StoreError, times: usize) {
        lock(&self.state)
            .create_faults
            .extend(std::iter::repeat_n(error, times));
    }

    /// Between the next read and its write, another writer stores `config_map` (so the
    /// write is a real 409 or AlreadyExists, and the retry must merge into the other
    /// writer's content).
    pub fn race_next_write_with(&self, config_map: ConfigMap) {
        lock(&self.state).before_next_write = Some(config_map);
    }

    /// PUTs and POSTs that reached the store (whatever their result).
    pub fn writes(&self) -> usize {
        let state = lock(&self.state);
        state.creates + state.replaces
    }

    pub fn gets(&self) -> usize {
        lock(&self.state).gets
    }

    pub fn events(&self) -> Vec<AwsAuthEvent> {
        lock(&self.state).events.clone()
    }
}

impl AwsAuthStore for InMemoryAwsAuthStore {
    async fn get(&self) -> Result<Option<ConfigMap>, StoreError> {
        let object = {
            let mut state = lock(&self.state);
            state.gets += 1;
            state.object.clone()
        };
        // Let other tasks run between a read and its write, as the network would.
        tokio::task::yield_now().await;
        Ok(object)
    }

    async fn create(&self, config_map: &ConfigMap) -> Result<ConfigMap, StoreError> {
        tokio::task::yield_now().await;
        let mut state = lock(&self.state);
        state.creates += 1;
        if let Some(mut other) = state.before_next_write.take() {
            state.version += 1;
            other.metadata.resource_version = Some(state.version.to_string());
            state.object = Some(other);
        }
        if let Some(error) = state.create_faults.pop_front() {
            return Err(error);
        }
        if state.object.is_some() {
            return Err(StoreError::AlreadyExists);
        }
        state.version += 1;
        let mut created = config_map.clone();
        created.metadata.resource_version = Some(state.version.to_string());
        state.object = Some(created.clone());
        Ok(created)
    }

    async fn replace(&self, config_map: &ConfigMap) -> Result<ConfigMap, StoreError> {
        tokio::task::yield_now().await;
        let mut state = lock(&self.state);
        state.replaces += 1;
        if let Some(mut other) = state.before_next_write.take() {
            state.version += 1;
            other.metadata.resource_version = Some(state.version.to_string());
            state.object = Some(other);
        }
        if let Some(error) = state.replace_faults.pop_front() {
            return Err(error);
        }
        let Some(current) = state.object.as_ref() else {
            return Err(StoreError::NotFound);
        };
        if config_map.metadata.resource_version != current.metadata.resource_version {
            return Err(StoreError::Conflict);
        }
        state.version += 1;
        let mut replaced = config_map.clone();
        replaced.metadata.resource_version = Some(state.version.to_string());
        state.object = Some(replaced.clone());
        Ok(replaced)
    }

    async fn publish_event(
        &self,
        _config_map: &ConfigMap,
        event: &AwsAuthEvent,
    ) -> Result<(), StoreError> {
        lock(&self.state).events.push(event.clone());
        Ok(())
    }
}
