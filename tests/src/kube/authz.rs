//! Authorization: RBAC (`kube::rbac`) evaluated over the Roles and Bindings in the store,
//! with the `system:masters` bypass of the real API server and its `403 Forbidden` shape.

use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};

use super::authn::UserInfo;
use super::rbac::{self, Authorizer};
use super::status::ApiError;
use super::store::Store;

pub use super::rbac::RequestAttributes;

/// Paths every authenticated user may read (the default `system:discovery`,
/// `system:public-info-viewer` and `system:basic-user` bindings of a real cluster, which the
/// fake does not store).
fn is_discovery_path(path: &str) -> bool {
    path == "/api"
        || path == "/apis"
        || path.starts_with("/api/")
        || path.starts_with("/apis/")
        || path == "/version"
        || path.starts_with("/healthz")
        || path.starts_with("/livez")
        || path.starts_with("/readyz")
        || path.starts_with("/openapi")
}

/// Allows or refuses a request.
pub fn authorize(
    store: &Store,
    user: &UserInfo,
    attributes: &RequestAttributes,
) -> Result<(), ApiError> {
    let user = rbac::UserInfo {
        username: user.username.clone(),
        groups: user.groups.clone(),
    };
    if rbac::is_superuser(&user) {
        return Ok(());
    }
    if let Some(path) = &attributes.path
        && is_discovery_path(path)
        && attributes.verb == "get"
    {
        return Ok(());
    }
    // A fresh snapshot per request: RBAC objects are few, and a scenario may change them
    // between two requests.
    let authorizer = Authorizer::from_objects(
        &store.list::<ClusterRole>(),
        &store.list::<ClusterRoleBinding>(),
        &store.list::<Role>(),
        &store.list::<RoleBinding>(),
    );
    match authorizer.authorize(&user, attributes) {
        Ok(_) => Ok(()),
        Err(denial) => {
            let status = serde_json::to_value(denial.to_status()).unwrap_or_default();
            Err(ApiError::new(403, "Forbidden", denial.message.clone())
                .with_details(status.get("details").cloned().unwrap_or_default()))
        }
    }
}
