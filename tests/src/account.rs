//! The fake AWS account: who exists, with which credentials.
//!
//! Shared by the fake AWS endpoints and the fake API server's EKS authentication, so a token
//! signed with an account's credentials is traced back to the same IAM principal.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use sha2::Digest;

/// One set of credentials and the IAM principal it belongs to.
#[derive(Clone, PartialEq, Eq)]
pub struct FakeCredentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
    /// Canonical principal ARN: `arn:aws:iam::<account>:role/<name>` for roles (what the
    /// authenticator maps after stripping the assumed-role session), or a user ARN.
    pub principal_arn: String,
}

impl std::fmt::Debug for FakeCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeCredentials")
            .field("access_key_id", &self.access_key_id)
            .field("principal_arn", &self.principal_arn)
            .finish_non_exhaustive()
    }
}

/// The account the fakes simulate.
#[derive(Debug, Clone)]
pub struct FakeAccount {
    pub account_id: String,
    pub region: String,
    /// `aws`, `aws-cn` or `aws-us-gov`.
    pub partition: String,
    credentials: Arc<RwLock<BTreeMap<String, FakeCredentials>>>,
    /// Role session names by access key id, where a test named one (STS's
    /// `assumed-role/<role>/<session>`; EC2 names an instance profile's sessions after the
    /// instance id).
    sessions: Arc<RwLock<BTreeMap<String, String>>>,
}

impl FakeAccount {
    pub fn new(account_id: &str, region: &str) -> Self {
        let partition = if region.starts_with("cn-") {
            "aws-cn"
        } else if region.starts_with("us-gov-") {
            "aws-us-gov"
        } else {
            "aws"
        };
        Self {
            account_id: account_id.to_owned(),
            region: region.to_owned(),
            partition: partition.to_owned(),
            credentials: Arc::default(),
            sessions: Arc::default(),
        }
    }

    /// The reference account of the fixtures: `111111111111` in `eu-west-1`.
    pub fn reference() -> Self {
        Self::new("111111111111", "eu-west-1")
    }

    /// `arn:<partition>:iam::<account>:role/<name>`.
    pub fn role_arn(&self, role_name: &str) -> String {
        format!(
            "arn:{}:iam::{}:role/{role_name}",
            self.partition, self.account_id
        )
    }

    /// Creates credentials for a role of this account (deterministic from the role name, so
    /// scenarios are reproducible) and registers them.
    pub fn add_role_credentials(&self, role_name: &str) -> FakeCredentials {
        // Distinct roles must get distinct keys, whatever their common prefix.
        let digest = sha2::Sha256::digest(role_name.as_bytes());
        let id: String = digest
            .iter()
            .take(16)
            .map(|b| char::from(b'A' + b % 26))
            .collect();
        let credentials = FakeCredentials {
            access_key_id: format!("ASIA{id}"),
            secret_access_key: format!("fake-secret-{role_name}-0123456789abcdef"),
            session_token: Some(format!("fake-session-{role_name}")),
            principal_arn: self.role_arn(role_name),
        };
        self.add_credentials(credentials.clone());
        credentials
    }

    pub fn add_credentials(&self, credentials: FakeCredentials) {
        self.credentials
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(credentials.access_key_id.clone(), credentials);
    }

    /// Names the role session the credentials `access_key_id` belong to (e.g. an instance id,
    /// as EC2 names the sessions of an instance profile's role).
    pub fn name_session(&self, access_key_id: &str, session_name: &str) {
        self.sessions
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(access_key_id.to_owned(), session_name.to_owned());
    }

    /// The session name STS reports for these credentials (the last part of
    /// `arn:aws:sts::<account>:assumed-role/<role>/<session>`): the one named through
    /// [`FakeAccount::name_session`], else the role's name (as a Lambda function's session
    /// is named after the function). Empty for IAM users, which have no session.
    pub fn session_name(&self, credentials: &FakeCredentials) -> String {
        if let Some(name) = self
            .sessions
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&credentials.access_key_id)
        {
            return name.clone();
        }
        match credentials.principal_arn.split_once(":role/") {
            Some((_, path_and_name)) => path_and_name
                .rsplit('/')
                .next()
                .unwrap_or_default()
                .to_owned(),
            None => String::new(),
        }
    }

    /// The credentials with this access key id, if the account issued them.
    pub fn credentials(&self, access_key_id: &str) -> Option<FakeCredentials> {
        self.credentials
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(access_key_id)
            .cloned()
    }
}

/// The Kubernetes identity an IAM principal maps to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubernetesIdentity {
    pub username: String,
    pub groups: Vec<String>,
}

/// Maps a principal through EKS access entries (implemented by the fake EKS), consulted by the
/// fake API server's authenticator before the `aws-auth` ConfigMap, as EKS does.
pub trait AccessEntryLookup: Send + Sync {
    fn kubernetes_identity(
        &self,
        cluster_name: &str,
        principal_arn: &str,
    ) -> Option<KubernetesIdentity>;
}
