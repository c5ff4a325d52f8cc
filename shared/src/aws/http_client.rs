//! The one HTTPS stack the AWS SDK clients use, and the `SdkConfig` every function loads.
//!
//! rustls with ring, the same TLS library and crypto provider kube uses, so a function binary
//! carries one TLS stack and no aws-lc. The system roots are read lazily by the SDK when a
//! client first needs them, not at start-up: cold start is paid on every scale event.
//!
//! Endpoints, region and credentials come from the standard `aws-config` chain, so
//! `AWS_ENDPOINT_URL` (and `AWS_ENDPOINT_URL_<SERVICE>`) point the functions at a local
//! endpoint without any code path of their own.

use aws_config::BehaviorVersion;
use aws_smithy_http_client::tls::{self, rustls_provider::CryptoMode};
use aws_smithy_runtime_api::client::http::SharedHttpClient;
use aws_types::SdkConfig;

/// An HTTP client for the AWS SDK that speaks HTTPS (rustls + ring) and plain HTTP.
pub fn https_client() -> SharedHttpClient {
    aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(CryptoMode::Ring))
        .build_https()
}

/// Loads the shared AWS configuration from the environment, with [`https_client`].
pub async fn load_sdk_config() -> SdkConfig {
    aws_config::defaults(BehaviorVersion::latest())
        .http_client(https_client())
        .load()
        .await
}
