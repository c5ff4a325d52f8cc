//! Who the real API server takes a client for, and EKS tokens of fake roles: what the
//! authentication scenarios ask and sign.

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use kube::api::{Api, PostParams};

use node_manager::cluster::token::EksToken;

use crate::account::FakeCredentials;
use crate::control_plane::ControlPlaneError;

/// The user the real API server sees for `client` (a `SelfSubjectReview`): its name and
/// groups, or the error.
pub async fn whoami(client: &kube::Client) -> Result<(String, Vec<String>), kube::Error> {
    let review = SelfSubjectReview {
        metadata: Default::default(),
        status: None,
    };
    let answer = Api::<SelfSubjectReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await?;
    let user = answer.status.and_then(|s| s.user_info).unwrap_or_default();
    Ok((
        user.username.unwrap_or_default(),
        user.groups.unwrap_or_default(),
    ))
}

/// The HTTP status of an API error.
pub fn status_code(error: &kube::Error) -> Option<u16> {
    match error {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

/// An EKS token (as `aws eks get-token` makes) for `cluster`, signed with `role`'s
/// credentials now.
pub fn eks_token(role: &FakeCredentials, cluster: &str) -> Result<EksToken, ControlPlaneError> {
    let credentials = aws_credential_types::Credentials::new(
        &role.access_key_id,
        &role.secret_access_key,
        role.session_token.clone(),
        None,
        "test",
    );
    node_manager::cluster::token::sign_token(
        &credentials,
        "eu-west-1",
        cluster,
        std::time::SystemTime::now(),
    )
    .map_err(|e| ControlPlaneError::setup("signing an EKS token", e))
}
