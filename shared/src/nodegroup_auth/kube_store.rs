//! [`AwsAuthStore`] against the cluster's API server.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Client, Resource};

use super::aws_auth::{AWS_AUTH_NAME, AWS_AUTH_NAMESPACE, AwsAuthEvent, AwsAuthStore, StoreError};

/// The name Events are reported under (`reportingController`).
pub const REPORTING_CONTROLLER: &str = "node-manager/nodegroup-auth";

/// `kube-system/aws-auth` through a `kube::Client`.
#[derive(Clone)]
pub struct KubeAwsAuthStore {
    api: Api<ConfigMap>,
    recorder: Recorder,
}

impl KubeAwsAuthStore {
    pub fn new(client: Client) -> Self {
        let reporter = Reporter {
            controller: REPORTING_CONTROLLER.to_owned(),
            // The log stream names the Lambda execution environment, like a pod name would.
            instance: std::env::var("AWS_LAMBDA_LOG_STREAM_NAME").ok(),
        };
        Self {
            api: Api::namespaced(client.clone(), AWS_AUTH_NAMESPACE),
            recorder: Recorder::new(client, reporter),
        }
    }
}

fn store_error(verb: &str, err: kube::Error) -> StoreError {
    match &err {
        kube::Error::Api(status) if status.is_already_exists() => StoreError::AlreadyExists,
        kube::Error::Api(status) if status.is_conflict() => StoreError::Conflict,
        kube::Error::Api(status) if status.is_not_found() => StoreError::NotFound,
        kube::Error::Api(status) if status.is_forbidden() => StoreError::Forbidden(format!(
            "{verb} configmaps/{AWS_AUTH_NAME} in {AWS_AUTH_NAMESPACE}"
        )),
        _ => StoreError::Api(format!(
            "{verb} {AWS_AUTH_NAMESPACE}/{AWS_AUTH_NAME}: {err}"
        )),
    }
}

impl AwsAuthStore for KubeAwsAuthStore {
    async fn get(&self) -> Result<Option<ConfigMap>, StoreError> {
        self.api
            .get_opt(AWS_AUTH_NAME)
            .await
            .map_err(|err| store_error("get", err))
    }

    async fn create(&self, config_map: &ConfigMap) -> Result<ConfigMap, StoreError> {
        self.api
            .create(&PostParams::default(), config_map)
            .await
            .map_err(|err| store_error("create", err))
    }

    async fn replace(&self, config_map: &ConfigMap) -> Result<ConfigMap, StoreError> {
        self.api
            .replace(AWS_AUTH_NAME, &PostParams::default(), config_map)
            .await
            .map_err(|err| store_error("update", err))
    }

    async fn publish_event(
        &self,
        config_map: &ConfigMap,
        event: &AwsAuthEvent,
    ) -> Result<(), StoreError> {
        let reference = config_map.object_ref(&());
        let event = Event {
            type_: if event.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: event.reason.to_owned(),
            note: Some(event.note.chars().take(1000).collect()),
            action: event.action.to_owned(),
            secondary: None,
        };
        self.recorder
            .publish(&event, &reference)
            .await
            .map_err(|err| store_error("create events", err))
    }
}

/// [`AwsAuthAccess`] through the cluster access of `node_manager::cluster`: the client is
/// built (and its token signed) only when an invocation needs `aws-auth`.
pub struct ClusterAwsAuth<E> {
    pub access: crate::cluster::ClusterAccess,
    pub eks: E,
}

impl<E: crate::aws::Eks> super::handler::AwsAuthAccess for ClusterAwsAuth<E> {
    type Store = KubeAwsAuthStore;
    type Error = crate::cluster::ClusterAccessError;

    async fn aws_auth(&self) -> Result<KubeAwsAuthStore, Self::Error> {
        Ok(KubeAwsAuthStore::new(self.access.client(&self.eks).await?))
    }
}

/// A store built from an existing client is its own access (tests, local runs).
impl super::handler::AwsAuthAccess for KubeAwsAuthStore {
    type Store = KubeAwsAuthStore;
    type Error = std::convert::Infallible;

    async fn aws_auth(&self) -> Result<KubeAwsAuthStore, Self::Error> {
        Ok(self.clone())
    }
}
