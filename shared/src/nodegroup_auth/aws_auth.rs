//! The `kube-system/aws-auth` ConfigMap: read, merge, write, with optimistic concurrency.
//!
//! Every write is a PUT carrying the `resourceVersion` that was read, so a concurrent writer
//! (another invocation, eksctl, Terraform, EKS itself) makes it fail with 409 instead of
//! being overwritten; the edit is then recomputed from a fresh read, a bounded number of
//! times with jittered backoff ([`RetryPolicy::AWS_AUTH_WRITE`]). The ConfigMap is created only when it is absent, and a lost
//! creation race reads the winner's object and merges into it. It is never deleted.

use std::collections::BTreeMap;
use std::future::Future;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ObjectMeta;
use sha2::{Digest, Sha256};

use crate::retry::RetryPolicy;

use super::role_mapping::{
    GrantDecision, MapRoles, MapRolesError, MappingChange, MappingConflict, RevokeDecision,
};

pub const AWS_AUTH_NAME: &str = "aws-auth";
pub const AWS_AUTH_NAMESPACE: &str = "kube-system";
pub(crate) const MAP_ROLES_KEY: &str = "mapRoles";

/// A failed call to the store, by what the caller does about it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// 409 on a PUT: somebody wrote since we read. Re-read and merge again.
    #[error("aws-auth was changed by another writer (409 Conflict)")]
    Conflict,
    /// 409 AlreadyExists on a POST: somebody created it first. Re-read and merge into it.
    #[error("aws-auth was created by another writer (AlreadyExists)")]
    AlreadyExists,
    /// 404 on a PUT: it was deleted since we read.
    #[error("aws-auth disappeared while being updated")]
    NotFound,
    #[error(
        "not allowed to {0}; apply the shipped RBAC (infra/rbac.yaml) and map the function's role"
    )]
    Forbidden(String),
    #[error("Kubernetes API call failed: {0}")]
    Api(String),
    /// The cluster's API could not be reached at all (discovery, credentials, token): the
    /// connection's own words, which the handler reports as a cluster-access failure.
    #[error("{0}")]
    Unreachable(String),
}

/// Access to the one ConfigMap, so the merge logic runs against the API server
/// ([`super::kube_store::KubeAwsAuthStore`]) or in memory (`InMemoryAwsAuthStore`, with the
/// `fakes` feature).
pub trait AwsAuthStore: Send + Sync {
    /// `None` when `aws-auth` does not exist.
    fn get(&self) -> impl Future<Output = Result<Option<ConfigMap>, StoreError>> + Send;

    /// POST; [`StoreError::AlreadyExists`] when it exists.
    fn create(
        &self,
        config_map: &ConfigMap,
    ) -> impl Future<Output = Result<ConfigMap, StoreError>> + Send;

    /// PUT with `metadata.resourceVersion` as read; [`StoreError::Conflict`] when stale.
    fn replace(
        &self,
        config_map: &ConfigMap,
    ) -> impl Future<Output = Result<ConfigMap, StoreError>> + Send;

    /// Records a Kubernetes Event regarding the ConfigMap.
    fn publish_event(
        &self,
        config_map: &ConfigMap,
        event: &AwsAuthEvent,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// A borrowed store is a store: the handler keeps its store and lends it to each edit.
impl<S: AwsAuthStore> AwsAuthStore for &S {
    fn get(&self) -> impl Future<Output = Result<Option<ConfigMap>, StoreError>> + Send {
        (**self).get()
    }

    fn create(
        &self,
        config_map: &ConfigMap,
    ) -> impl Future<Output = Result<ConfigMap, StoreError>> + Send {
        (**self).create(config_map)
    }

    fn replace(
        &self,
        config_map: &ConfigMap,
    ) -> impl Future<Output = Result<ConfigMap, StoreError>> + Send {
        (**self).replace(config_map)
    }

    fn publish_event(
        &self,
        config_map: &ConfigMap,
        event: &AwsAuthEvent,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).publish_event(config_map, event)
    }
}

/// A Kubernetes Event about `aws-auth`, as `kubectl describe configmap aws-auth` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AwsAuthEvent {
    pub warning: bool,
    /// `NodeRoleMapped`, `NodeRoleUnmapped`, `NodeRoleMappingConflict`.
    pub reason: &'static str,
    /// `Grant` or `Revoke`.
    pub action: &'static str,
    pub note: String,
}

/// Why `aws-auth` could not be brought to the intended state.
#[derive(Debug, thiserror::Error)]
pub enum AwsAuthError {
    #[error(transparent)]
    MapRoles(#[from] MapRolesError),
    #[error(transparent)]
    Store(StoreError),
    #[error(
        "aws-auth kept changing under us: gave up after {attempts} attempts (nothing of ours was written); the event will be retried"
    )]
    RetriesExhausted { attempts: u32 },
    #[error(
        "aws-auth is immutable; it cannot be updated in place: recreate it without `immutable: true`"
    )]
    Immutable,
}

/// What an edit did.
#[derive(Debug, Clone, PartialEq)]
pub enum EditOutcome {
    /// Nothing to write: the mapping is there already (grant) or absent (revoke).
    Unchanged,
    Written(Box<WrittenChange>),
    /// An entry for the role exists that this function must not touch.
    Conflict(MappingConflict),
}

/// A write that went through.
#[derive(Debug, Clone, PartialEq)]
pub struct WrittenChange {
    pub change: MappingChange,
    /// `true` when the ConfigMap was created.
    pub created: bool,
    /// sha256 of `mapRoles` before and after (hex), for the log line.
    pub old_sha256: String,
    pub new_sha256: String,
    pub resource_version: Option<String>,
    /// 409s (and lost creation races) that were retried.
    pub conflicts_retried: u32,
    /// The ConfigMap as written (the object Events are about).
    pub object: ConfigMap,
}

/// The read-merge-write loop over a store.
#[derive(Debug, Clone)]
pub struct AwsAuthEditor<S> {
    store: S,
    retry: RetryPolicy,
}

enum Plan {
    Unchanged,
    Change(MappingChange),
    Conflict(MappingConflict),
}

impl<S: AwsAuthStore> AwsAuthEditor<S> {
    pub fn new(store: S, retry: RetryPolicy) -> Self {
        Self { store, retry }
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    /// Makes `role_arn` (path stripped) map to the node user with `groups`.
    pub async fn grant(
        &self,
        role_arn: &str,
        groups: &[&str],
    ) -> Result<EditOutcome, AwsAuthError> {
        self.edit(true, |map| match map.grant(role_arn, groups) {
            GrantDecision::AlreadyGranted => Plan::Unchanged,
            GrantDecision::Change(change) => Plan::Change(change),
            GrantDecision::Conflict(conflict) => Plan::Conflict(conflict),
        })
        .await
    }

    /// Removes `role_arn`'s node mapping (all of its node-shaped entries).
    pub async fn revoke(&self, role_arn: &str) -> Result<EditOutcome, AwsAuthError> {
        self.edit(false, |map| match map.revoke(role_arn) {
            RevokeDecision::NotPresent => Plan::Unchanged,
            RevokeDecision::Change(change) => Plan::Change(change),
            RevokeDecision::Conflict(conflict) => Plan::Conflict(conflict),
        })
        .await
    }

    async fn edit(
        &self,
        create_if_absent: bool,
        plan: impl Fn(&MapRoles) -> Plan,
    ) -> Result<EditOutcome, AwsAuthError> {
        let mut conflicts = 0;
        for attempt in 0..self.retry.max_attempts {
            if attempt > 0 {
                tokio::time::sleep(self.retry.delay(attempt - 1)).await;
            }
            let current = self.store.get().await.map_err(AwsAuthError::Store)?;
            if current.as_ref().and_then(|cm| cm.immutable) == Some(true) {
                return Err(AwsAuthError::Immutable);
            }
            let old_text = current
                .as_ref()
                .and_then(|cm| cm.data.as_ref())
                .and_then(|data| data.get(MAP_ROLES_KEY))
                .cloned();
            let map = MapRoles::parse(old_text.as_deref())?;
            let change = match plan(&map) {
                Plan::Unchanged => return Ok(EditOutcome::Unchanged),
                Plan::Conflict(conflict) => return Ok(EditOutcome::Conflict(conflict)),
                Plan::Change(change) => change,
            };
            if current.is_none() && !create_if_absent {
                return Ok(EditOutcome::Unchanged);
            }
            let new_text = map.render(&change)?;
            let created = current.is_none();
            let written = match current {
                None => self.store.create(&new_config_map(&new_text)).await,
                Some(mut config_map) => {
                    config_map
                        .data
                        .get_or_insert_with(BTreeMap::new)
                        .insert(MAP_ROLES_KEY.to_owned(), new_text.clone());
                    self.store.replace(&config_map).await
                }
            };
            match written {
                Ok(config_map) => {
                    return Ok(EditOutcome::Written(Box::new(WrittenChange {
                        change,
                        created,
                        old_sha256: sha256_hex(old_text.as_deref().unwrap_or_default()),
                        new_sha256: sha256_hex(&new_text),
                        resource_version: config_map.metadata.resource_version.clone(),
                        conflicts_retried: conflicts,
                        object: config_map,
                    })));
                }
                Err(StoreError::Conflict | StoreError::AlreadyExists | StoreError::NotFound) => {
                    conflicts += 1;
                    tracing::debug!(attempt, "aws-auth changed under us; re-reading");
                }
                Err(err) => return Err(AwsAuthError::Store(err)),
            }
        }
        Err(AwsAuthError::RetriesExhausted {
            attempts: self.retry.max_attempts,
        })
    }
}

/// A new `aws-auth` with just `mapRoles`.
fn new_config_map(map_roles: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(AWS_AUTH_NAME.to_owned()),
            namespace: Some(AWS_AUTH_NAMESPACE.to_owned()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            MAP_ROLES_KEY.to_owned(),
            map_roles.to_owned(),
        )])),
        ..ConfigMap::default()
    }
}

pub fn sha256_hex(text: &str) -> String {
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
