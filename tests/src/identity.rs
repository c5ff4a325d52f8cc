//! A function's identity on the fake API server, for handlers run in process: a client
//! signed in with a static token as the function's Kubernetes user and groups (the ones
//! `infra/rbac.yaml` grants), without kube's own retries so the code under test retries.

pub use crate::e2e::function_group;
use crate::kube::{FakeApiServer, FakeApiServerError};

/// A client configuration signed in as `user` with `groups` (kube's retries off).
pub async fn config_as(
    server: &FakeApiServer,
    user: &str,
    groups: &[&str],
) -> Result<kube::Config, FakeApiServerError> {
    let token = server.add_static_token(user, groups);
    let mut config = server.config_with_token(&token).await?;
    config.default_retry = false;
    Ok(config)
}

/// A client signed in as `user` with `groups` (kube's retries off).
pub async fn client_as(
    server: &FakeApiServer,
    user: &str,
    groups: &[&str],
) -> Result<kube::Client, FakeApiServerError> {
    let config = config_as(server, user, groups).await?;
    kube::Client::try_from(config).map_err(|e| FakeApiServerError::Client(e.to_string()))
}

/// A client signed in as `function` (its user name) in its own group only.
pub async fn function_client(
    server: &FakeApiServer,
    function: &str,
) -> Result<kube::Client, FakeApiServerError> {
    client_as(server, function, &[function_group(function).as_str()]).await
}
