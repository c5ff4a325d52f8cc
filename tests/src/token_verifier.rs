//! Verifies EKS bearer tokens the way aws-iam-authenticator and STS do.
//!
//! (Stub: interface only; the implementation is being written.)

use std::time::SystemTime;

use crate::account::FakeAccount;

/// The caller a valid token proves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedCaller {
    /// Canonical principal ARN (role ARN for role sessions).
    pub principal_arn: String,
    pub access_key_id: String,
}

/// Why a token was refused; the message says which check failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("token rejected: {0}")]
pub struct TokenRejection(pub String);

/// Checks `token` for `cluster_name` at `now` against the account's credentials.
pub fn verify_token(
    token: &str,
    cluster_name: &str,
    account: &FakeAccount,
    now: SystemTime,
) -> Result<VerifiedCaller, TokenRejection> {
    let _ = (token, cluster_name, account, now);
    Err(TokenRejection("verifier not implemented yet".into()))
}
