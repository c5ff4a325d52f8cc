//! Authentication like EKS: a `k8s-aws-v1.` bearer token is verified (aws-iam-authenticator's
//! checks and the SigV4 signature against the fake account), then the principal is mapped to
//! a Kubernetes user through an EKS access entry or, failing that, the `kube-system/aws-auth`
//! ConfigMap in the store. Anything else is `401 Unauthorized`.
//!
//! The `aws-auth` parsing here is written independently of the production code on purpose:
//! the fake must not share the bugs of the code it checks.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use serde_json::Value;

use super::store::Store;
use crate::account::{AccessEntryLookup, FakeAccount, KubernetesIdentity};
use crate::aws::FakeEc2;
use crate::token_verifier::{VerifiedCaller, verify_token};

/// The user a request runs as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserInfo {
    pub username: String,
    pub groups: Vec<String>,
    /// The IAM principal behind an EKS token (none for the admin token).
    pub principal_arn: Option<String>,
}

impl UserInfo {
    pub fn is_master(&self) -> bool {
        self.groups.iter().any(|g| g == "system:masters")
    }
}

/// Why a request was not authenticated (kept for the server log; clients only see 401).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthnError {
    #[error("no bearer token in the Authorization header")]
    NoToken,
    #[error("{0}")]
    Token(String),
    #[error("principal {0} is mapped neither by an access entry nor by the aws-auth ConfigMap")]
    Unmapped(String),
}

/// Turns bearer tokens into users.
pub struct Authenticator {
    pub cluster_name: String,
    pub account: FakeAccount,
    pub access_entries: Option<Arc<dyn AccessEntryLookup>>,
    pub admin_token: String,
    pub store: Store,
    /// Static bearer tokens (like kube-apiserver's `--token-auth-file`), for tests that need
    /// a non-admin identity without an EKS token.
    pub static_tokens: Arc<RwLock<HashMap<String, UserInfo>>>,
    /// The principal that created the cluster: EKS maps it to `system:masters` without any
    /// visible access entry or aws-auth entry (`bootstrapClusterCreatorAdminPermissions`).
    pub cluster_creator_arn: Option<String>,
    /// The fake EC2, which resolves `{{EC2PrivateDNSName}}` (none: such a mapping is refused).
    pub ec2: Option<FakeEc2>,
}

/// The username and groups for the admin token.
pub const ADMIN_USER: &str = "kubernetes-admin";

impl Authenticator {
    pub fn authenticate(&self, authorization: Option<&str>) -> Result<UserInfo, AuthnError> {
        let token = authorization
            .and_then(|h| {
                h.strip_prefix("Bearer ")
                    .or_else(|| h.strip_prefix("bearer "))
            })
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or(AuthnError::NoToken)?;
        if token == self.admin_token {
            return Ok(UserInfo {
                username: ADMIN_USER.to_owned(),
                groups: vec!["system:masters".into(), "system:authenticated".into()],
                principal_arn: None,
            });
        }
        if let Some(user) = self
            .static_tokens
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(token)
        {
            return Ok(user.clone());
        }
        let caller = verify_token(token, &self.cluster_name, &self.account, SystemTime::now())
            .map_err(|e| AuthnError::Token(e.to_string()))?;
        if self
            .cluster_creator_arn
            .as_ref()
            .is_some_and(|arn| arn.eq_ignore_ascii_case(&caller.principal_arn))
        {
            return Ok(UserInfo {
                username: ADMIN_USER.to_owned(),
                groups: vec!["system:masters".into(), "system:authenticated".into()],
                principal_arn: Some(caller.principal_arn),
            });
        }
        let identity = self
            .access_entries
            .as_ref()
            .and_then(|lookup| {
                lookup.kubernetes_identity(&self.cluster_name, &caller.principal_arn)
            })
            .or_else(|| self.aws_auth_identity(&caller))
            .ok_or_else(|| AuthnError::Unmapped(caller.principal_arn.clone()))?;
        let identity = resolve_session_templates(identity, &caller, self.ec2.as_ref())
            .map_err(AuthnError::Token)?;
        let mut groups = identity.groups;
        if !groups.iter().any(|g| g == "system:authenticated") {
            groups.push("system:authenticated".into());
        }
        Ok(UserInfo {
            username: identity.username,
            groups,
            principal_arn: Some(caller.principal_arn),
        })
    }

    fn aws_auth_identity(&self, caller: &VerifiedCaller) -> Option<KubernetesIdentity> {
        let config_map = self
            .store
            .get_value("v1", "ConfigMap", "kube-system", "aws-auth")
            .ok()?;
        aws_auth_identity(config_map.get("data")?, caller, &self.account.account_id)
    }
}

/// Fills in the templates that name the caller's session, as aws-iam-authenticator does for
/// access entries and `aws-auth` alike: `{{SessionName}}` is the role session's name and
/// `{{EC2PrivateDNSName}}` the private DNS name of the instance the session is named after (an
/// instance profile's sessions carry the instance id); an unknown instance is refused.
/// Shared with the real control plane's token webhook, so both servers map a caller alike.
pub fn resolve_session_templates(
    identity: KubernetesIdentity,
    caller: &VerifiedCaller,
    ec2: Option<&FakeEc2>,
) -> Result<KubernetesIdentity, String> {
    const DNS_NAME: &str = "{{EC2PrivateDNSName}}";
    let templated = identity.username.contains(DNS_NAME)
        || identity.groups.iter().any(|g| g.contains(DNS_NAME));
    let dns_name = if templated {
        ec2.and_then(|ec2| ec2.instance(&caller.session_name))
            .map(|instance| instance.private_dns_name)
            .filter(|name| !name.is_empty())
            .ok_or_else(|| format!("no EC2 instance {:?} for {DNS_NAME}", caller.session_name))?
    } else {
        String::new()
    };
    let resolve = |text: &str| {
        text.replace("{{SessionName}}", &caller.session_name)
            .replace(DNS_NAME, &dns_name)
    };
    Ok(KubernetesIdentity {
        username: resolve(&identity.username),
        groups: identity.groups.iter().map(|g| resolve(g)).collect(),
    })
}

/// The identity the `data` of a `kube-system/aws-auth` ConfigMap maps `caller` to, as
/// aws-iam-authenticator maps it (also used by the real control plane's token webhook);
/// `{{EC2PrivateDNSName}}` is left for [`resolve_session_templates`].
pub fn aws_auth_identity(
    data: &Value,
    caller: &VerifiedCaller,
    account_id: &str,
) -> Option<KubernetesIdentity> {
    let session_name = caller.session_name.as_str();
    let substitute = |template: &str| {
        template
            .replace("{{AccountID}}", account_id)
            .replace("{{SessionName}}", session_name)
            .replace("{{SessionNameRaw}}", session_name)
            .replace("{{AccessKeyID}}", &caller.access_key_id)
    };
    let is_role = caller.principal_arn.contains(":role/");
    let (key, arn_field) = if is_role {
        ("mapRoles", "rolearn")
    } else {
        ("mapUsers", "userarn")
    };
    let entries = parse_mappings(data.get(key)?.as_str()?);
    // The authenticator builds a map from the list: the last entry for an ARN wins.
    let entry = entries.iter().rev().find(|entry| {
        field(entry, arn_field)
            .and_then(Value::as_str)
            .is_some_and(|arn| arn.eq_ignore_ascii_case(&caller.principal_arn))
    })?;
    let username = field(entry, "username")
        .and_then(Value::as_str)
        .map(substitute)
        .unwrap_or_default();
    if username.is_empty() {
        return None;
    }
    let groups = field(entry, "groups")
        .and_then(Value::as_array)
        .map(|groups| {
            groups
                .iter()
                .filter_map(Value::as_str)
                .map(substitute)
                .collect()
        })
        .unwrap_or_default();
    Some(KubernetesIdentity { username, groups })
}

/// A field of a mapping entry, its name compared case-insensitively (sigs.k8s.io/yaml turns
/// YAML into JSON and Go's JSON decoding matches field names without regard to case).
fn field<'a>(entry: &'a Value, name: &str) -> Option<&'a Value> {
    entry
        .as_object()?
        .iter()
        .find(|(key, _)| key.eq_ignore_ascii_case(name))
        .map(|(_, value)| value)
}

/// The entries of a `mapRoles`/`mapUsers` YAML list; an unparsable document maps nobody.
fn parse_mappings(yaml: &str) -> Vec<Value> {
    match serde_saphyr::from_str::<Value>(yaml) {
        Ok(Value::Array(entries)) => entries,
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn mapping_fields_are_case_insensitive_and_last_duplicate_wins() {
        let entries = parse_mappings(
            "- rolearn: arn:aws:iam::1:role/A\n  username: first\n- RoleARN: ARN:AWS:IAM::1:ROLE/A\n  UserName: second\n  groups: [g]\n",
        );
        assert_eq!(entries.len(), 2);
        let found = entries
            .iter()
            .rev()
            .find(|e| {
                field(e, "rolearn")
                    .and_then(Value::as_str)
                    .is_some_and(|a| a.eq_ignore_ascii_case("arn:aws:iam::1:role/a"))
            })
            .unwrap();
        assert_eq!(field(found, "username").unwrap(), "second");
    }
}
