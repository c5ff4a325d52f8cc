//! [`AwsAuthStore`] against the cluster's API server.
//!
//! The store holds a [`KubeConnection`], not a client: the cluster is reached only when an
//! invocation needs `aws-auth`, so an `API`-mode cluster is never contacted.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Resource;
use kube::api::{Api, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

use crate::cluster::connection::KubeConnection;

use super::aws_auth::{AWS_AUTH_NAME, AWS_AUTH_NAMESPACE, AwsAuthEvent, AwsAuthStore, StoreError};

/// The name Events are reported under (`reportingController`).
pub(crate) const REPORTING_CONTROLLER: &str = "node-manager/nodegroup-auth";

/// `kube-system/aws-auth` through the cluster's API: the function's [`EksConnection`]
/// (discovered on first use), or a ready `kube::Client` (tests, local runs).
///
/// [`EksConnection`]: crate::cluster::connection::EksConnection
#[derive(Clone)]
pub struct KubeAwsAuthStore<K = kube::Client> {
    connection: K,
    reporter: Reporter,
}

impl<K: KubeConnection> KubeAwsAuthStore<K> {
    pub fn new(connection: K) -> Self {
        Self {
            connection,
            reporter: Reporter {
                controller: REPORTING_CONTROLLER.to_owned(),
                // The log stream names the Lambda execution environment, like a pod name would.
                instance: std::env::var("AWS_LAMBDA_LOG_STREAM_NAME").ok(),
            },
        }
    }

    async fn client(&self) -> Result<kube::Client, StoreError> {
        self.connection
            .client()
            .await
            .map_err(|err| StoreError::Unreachable(err.to_string()))
    }

    async fn api(&self) -> Result<Api<ConfigMap>, StoreError> {
        Ok(Api::namespaced(self.client().await?, AWS_AUTH_NAMESPACE))
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

impl<K: KubeConnection> AwsAuthStore for KubeAwsAuthStore<K> {
    async fn get(&self) -> Result<Option<ConfigMap>, StoreError> {
        self.api()
            .await?
            .get_opt(AWS_AUTH_NAME)
            .await
            .map_err(|err| store_error("get", err))
    }

    async fn create(&self, config_map: &ConfigMap) -> Result<ConfigMap, StoreError> {
        self.api()
            .await?
            .create(&PostParams::default(), config_map)
            .await
            .map_err(|err| store_error("create", err))
    }

    async fn replace(&self, config_map: &ConfigMap) -> Result<ConfigMap, StoreError> {
        self.api()
            .await?
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
        Recorder::new(self.client().await?, self.reporter.clone())
            .publish(&event, &reference)
            .await
            .map_err(|err| store_error("create events", err))
    }
}
