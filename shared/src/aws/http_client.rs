//! The one HTTPS stack the AWS SDK clients use, and the `SdkConfig` every function loads.
//!
//! rustls with ring, the same TLS library and crypto provider kube uses, so a function binary
//! carries one TLS stack and no aws-lc. The system roots are read when the first request
//! needs a connection, not at start-up: cold start is paid on every scale event.
//!
//! Endpoints, region and credentials come from the standard `aws-config` chain, so
//! `AWS_ENDPOINT_URL` (and `AWS_ENDPOINT_URL_<SERVICE>`) point the functions at a local
//! endpoint without any code path of their own.

use aws_config::BehaviorVersion;
use aws_smithy_http_client::tls::{self, rustls_provider::CryptoMode};
use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::connector_metadata::ConnectorMetadata;
use aws_smithy_runtime_api::client::http::{
    HttpClient, HttpConnectorSettings, SharedHttpClient, SharedHttpConnector,
};
use aws_smithy_runtime_api::client::runtime_components::{
    RuntimeComponents, RuntimeComponentsBuilder,
};
use aws_smithy_types::config_bag::ConfigBag;
use aws_types::SdkConfig;

/// An HTTP client for the AWS SDK that speaks HTTPS (rustls + ring) and plain HTTP.
///
/// Its connector (and with it the system root store) is built on the first request, not
/// when an SDK client is constructed.
pub fn https_client() -> SharedHttpClient {
    SharedHttpClient::new(ConnectOnFirstUse(
        aws_smithy_http_client::Builder::new()
            .tls_provider(tls::Provider::Rustls(CryptoMode::Ring))
            .build_https(),
    ))
}

/// Delegates to the SDK's HTTPS client but skips its eager start-up check.
///
/// The smithy client builds a whole TLS connector in `validate_base_client_config`, i.e. in
/// every `Client::new`: it reads and parses every system root certificate and builds a root
/// store, once per SDK client (four per function) before the function can take its first
/// event. The check only moves a certificate-loading failure from the first request to
/// start-up; the connector the first request builds is the same either way, so skipping it
/// changes no behaviour except when that cost is paid (once, and only if a call is made).
#[derive(Debug)]
struct ConnectOnFirstUse(SharedHttpClient);

impl HttpClient for ConnectOnFirstUse {
    fn http_connector(
        &self,
        settings: &HttpConnectorSettings,
        components: &RuntimeComponents,
    ) -> SharedHttpConnector {
        self.0.http_connector(settings, components)
    }

    fn validate_base_client_config(
        &self,
        _: &RuntimeComponentsBuilder,
        _: &ConfigBag,
    ) -> Result<(), BoxError> {
        Ok(())
    }

    fn validate_final_config(
        &self,
        runtime_components: &RuntimeComponents,
        cfg: &ConfigBag,
    ) -> Result<(), BoxError> {
        self.0.validate_final_config(runtime_components, cfg)
    }

    fn connector_metadata(&self) -> Option<ConnectorMetadata> {
        self.0.connector_metadata()
    }
}

/// Loads the shared AWS configuration from the environment, with [`https_client`].
///
/// Lambda puts the function's credentials and region in environment variables, which the
/// default credentials and region chains look at first. When they are there, naming the
/// environment providers gives the same credentials and region without building the rest of
/// each chain (profile files, web identity, container and instance metadata clients): about
/// half a millisecond of every cold start. Anywhere else the default chains apply.
pub async fn load_sdk_config() -> SdkConfig {
    let loader = aws_config::defaults(BehaviorVersion::latest()).http_client(https_client());
    let loader = if credentials_and_region_in_environment(|name| std::env::var_os(name).is_some()) {
        loader
            .credentials_provider(
                aws_config::environment::EnvironmentVariableCredentialsProvider::new(),
            )
            .region(aws_config::environment::EnvironmentVariableRegionProvider::new())
    } else {
        loader
    };
    loader.load().await
}

/// Whether the environment (`is_set` says which variables are set) holds static credentials
/// and a region, as Lambda's does.
fn credentials_and_region_in_environment(is_set: impl Fn(&str) -> bool) -> bool {
    is_set("AWS_ACCESS_KEY_ID")
        && is_set("AWS_SECRET_ACCESS_KEY")
        && (is_set("AWS_REGION") || is_set("AWS_DEFAULT_REGION"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lambdas_environment_names_its_own_providers_and_anything_less_the_default_chains() {
        let lambda = ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"];
        assert!(credentials_and_region_in_environment(
            |n| lambda.contains(&n)
        ));
        let default_region = [
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_DEFAULT_REGION",
        ];
        assert!(credentials_and_region_in_environment(
            |n| default_region.contains(&n)
        ));
        for missing in lambda {
            assert!(!credentials_and_region_in_environment(|n| lambda
                .contains(&n)
                && n != missing));
        }
    }
}
