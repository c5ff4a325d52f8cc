//! Create-only review APIs answered from the request, never stored:
//! `SelfSubjectReview` (`kubectl auth whoami`) and `SelfSubjectAccessReview`
//! (`kubectl auth can-i`), so a scenario can ask the fake what the shipped RBAC allows.

use serde_json::{Value, json};

use super::authn::UserInfo;
use super::authz::{RequestAttributes, authorize};
use super::resources::ResourceType;
use super::status::ApiError;
use super::store::Store;

/// Whether every authenticated user may create this review (the default
/// `system:basic-user` binding of a real cluster).
pub fn is_self_review(resource: &ResourceType, verb: &str) -> bool {
    verb == "create"
        && matches!(
            resource.plural,
            "selfsubjectreviews" | "selfsubjectaccessreviews"
        )
}

fn text(value: Option<&Value>, field: &str) -> String {
    value
        .and_then(|v| v.get(field))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

/// The review with its `status` filled in.
pub fn answer(
    store: &Store,
    resource: &ResourceType,
    user: &UserInfo,
    mut review: Value,
) -> Result<Value, ApiError> {
    if !review.is_object() {
        return Err(ApiError::bad_request(
            "the body of the request is not a JSON object",
        ));
    }
    review["apiVersion"] = json!(resource.api_version());
    review["kind"] = json!(resource.kind);
    match resource.plural {
        "selfsubjectreviews" => {
            let mut user_info = json!({ "username": user.username, "groups": user.groups });
            if let Some(arn) = &user.principal_arn {
                user_info["extra"] = json!({ "arn": [arn] });
            }
            review["status"] = json!({ "userInfo": user_info });
        }
        _ => {
            let spec = review.get("spec");
            let attributes = match spec.and_then(|s| s.get("nonResourceAttributes")) {
                Some(non_resource) => RequestAttributes {
                    verb: text(Some(non_resource), "verb"),
                    path: Some(text(Some(non_resource), "path")),
                    ..RequestAttributes::default()
                },
                None => {
                    let attributes = spec.and_then(|s| s.get("resourceAttributes"));
                    let optional =
                        |field: &str| Some(text(attributes, field)).filter(|s| !s.is_empty());
                    RequestAttributes {
                        verb: text(attributes, "verb"),
                        api_group: text(attributes, "group"),
                        resource: text(attributes, "resource"),
                        subresource: optional("subresource"),
                        namespace: optional("namespace"),
                        name: optional("name"),
                        path: None,
                    }
                }
            };
            review["status"] = match authorize(store, user, &attributes) {
                Ok(()) => json!({ "allowed": true }),
                Err(denied) => json!({ "allowed": false, "reason": denied.message }),
            };
        }
    }
    Ok(review)
}
