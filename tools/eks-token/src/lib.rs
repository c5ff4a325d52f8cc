//! The `eks-token` command: what `aws eks get-token` does, without Python.
//!
//! kubectl runs it as an exec credential plugin; it signs an EKS token with the standard AWS
//! credential chain (optionally after assuming a role) and prints an `ExecCredential` in the
//! same shape and formatting as the AWS CLI, so it can replace `aws eks get-token` in a
//! kubeconfig unchanged.

use std::time::SystemTime;

use aws_config::BehaviorVersion;
use aws_credential_types::provider::{ProvideCredentials as _, SharedCredentialsProvider};
use aws_types::region::Region;
use node_manager::cluster::error::error_chain;
use node_manager::cluster::token::{EksToken, TokenError, sign_token};
use serde::Serialize;

/// The role session name `aws eks get-token --role-arn` uses.
pub const ROLE_SESSION_NAME: &str = "EKSGetTokenAuth";
/// The API version printed when kubectl does not say which it wants.
pub const DEFAULT_API_VERSION: &str = "client.authentication.k8s.io/v1beta1";
const SUPPORTED_API_VERSIONS: [&str; 2] = [
    "client.authentication.k8s.io/v1",
    "client.authentication.k8s.io/v1beta1",
];
const DEPRECATED_API_VERSION: &str = "client.authentication.k8s.io/v1alpha1";

/// Command-line arguments.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "eks-token",
    version,
    about = "Print an EKS bearer token as a kubectl ExecCredential (like `aws eks get-token`)"
)]
pub struct Args {
    /// Name of the EKS cluster the token is for.
    #[arg(long)]
    pub cluster_name: String,
    /// Region of the cluster (default: the AWS configuration's region, e.g. AWS_REGION).
    #[arg(long)]
    pub region: Option<String>,
    /// Assume this role (session name EKSGetTokenAuth) and sign with its credentials.
    #[arg(long)]
    pub role_arn: Option<String>,
}

/// Why no token was printed.
#[derive(Debug, thiserror::Error)]
pub enum EksTokenError {
    #[error("no region: pass --region or set AWS_REGION / a profile region")]
    MissingRegion,
    #[error(
        "no AWS credentials found: configure a profile, environment variables or an instance role"
    )]
    NoCredentialsProvider,
    #[error("cannot load AWS credentials{}: {reason}", role_arn.as_deref().map(|r| format!(" (assuming {r})")).unwrap_or_default())]
    Credentials {
        role_arn: Option<String>,
        reason: String,
    },
    #[error(transparent)]
    Token(#[from] TokenError),
    #[error("cannot write the ExecCredential: {0}")]
    Output(#[from] serde_json::Error),
}

/// `client.authentication.k8s.io` `ExecCredential`, fields in the AWS CLI's order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ExecCredential {
    pub kind: String,
    #[serde(rename = "apiVersion")]
    pub api_version: String,
    pub spec: serde_json::Map<String, serde_json::Value>,
    pub status: ExecCredentialStatus,
}

#[derive(Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ExecCredentialStatus {
    #[serde(rename = "expirationTimestamp")]
    pub expiration_timestamp: String,
    pub token: String,
}

impl std::fmt::Debug for ExecCredentialStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecCredentialStatus")
            .field("expiration_timestamp", &self.expiration_timestamp)
            .field("token", &"** redacted **")
            .finish()
    }
}

impl ExecCredential {
    pub fn new(api_version: &str, token: &EksToken) -> Self {
        Self {
            kind: "ExecCredential".to_owned(),
            api_version: api_version.to_owned(),
            spec: serde_json::Map::new(),
            status: ExecCredentialStatus {
                expiration_timestamp: token.expiration_timestamp(),
                token: token.expose().to_owned(),
            },
        }
    }

    /// As the AWS CLI prints it: JSON indented by four spaces, then a blank line.
    pub fn render(&self) -> Result<String, serde_json::Error> {
        let mut out = Vec::new();
        let formatter = serde_json::ser::PrettyFormatter::with_indent(b"    ");
        let mut serializer = serde_json::Serializer::with_formatter(&mut out, formatter);
        self.serialize(&mut serializer)?;
        let mut text = String::from_utf8_lossy(&out).into_owned();
        text.push_str("\n\n");
        Ok(text)
    }
}

/// The API version to answer with, from `KUBERNETES_EXEC_INFO`, and a message for stderr
/// when the variable is unusable or names a deprecated version (as the AWS CLI does).
pub fn api_version(exec_info: Option<&str>) -> (String, Option<String>) {
    let fallback = DEFAULT_API_VERSION.to_owned();
    let Some(raw) = exec_info.filter(|raw| !raw.is_empty()) else {
        return (fallback, None);
    };
    let parsed: serde_json::Value = match serde_json::from_str(raw) {
        Ok(value) => value,
        Err(_) => {
            return (
                fallback,
                Some(format!(
                    "Error parsing KUBERNETES_EXEC_INFO, defaulting to {DEFAULT_API_VERSION}. This is likely a bug in your Kubernetes client. Please update your Kubernetes client."
                )),
            );
        }
    };
    match parsed.get("apiVersion").and_then(|v| v.as_str()) {
        Some(version) if SUPPORTED_API_VERSIONS.contains(&version) => (version.to_owned(), None),
        Some(version) if version == DEPRECATED_API_VERSION => (
            version.to_owned(),
            Some(format!(
                "Kubeconfig user entry is using deprecated API version {version}. Update it to client.authentication.k8s.io/v1beta1 or v1."
            )),
        ),
        _ => (
            fallback,
            Some(format!(
                "Unrecognized API version in KUBERNETES_EXEC_INFO, defaulting to {DEFAULT_API_VERSION}."
            )),
        ),
    }
}

/// What the command prints.
#[derive(Debug)]
pub struct Output {
    pub stdout: String,
    pub warnings: Vec<String>,
}

/// Loads the AWS configuration, assumes the role if asked, signs and renders the token.
pub async fn run(args: &Args) -> Result<Output, EksTokenError> {
    let mut loader = aws_config::defaults(BehaviorVersion::latest())
        .http_client(node_manager::aws::http_client::https_client());
    if let Some(region) = &args.region {
        loader = loader.region(Region::new(region.clone()));
    }
    let sdk_config = loader.load().await;
    let region = sdk_config
        .region()
        .map(|r| r.as_ref().to_owned())
        .ok_or(EksTokenError::MissingRegion)?;
    let base = sdk_config
        .credentials_provider()
        .ok_or(EksTokenError::NoCredentialsProvider)?;
    let provider = match &args.role_arn {
        None => base,
        Some(role_arn) => SharedCredentialsProvider::new(
            aws_config::sts::AssumeRoleProvider::builder(role_arn)
                .session_name(ROLE_SESSION_NAME)
                .configure(&sdk_config)
                .build()
                .await,
        ),
    };
    let credentials =
        provider
            .provide_credentials()
            .await
            .map_err(|e| EksTokenError::Credentials {
                role_arn: args.role_arn.clone(),
                reason: error_chain(&e),
            })?;
    let token = sign_token(&credentials, &region, &args.cluster_name, SystemTime::now())?;
    let exec_info = std::env::var("KUBERNETES_EXEC_INFO").ok();
    let (api_version, warning) = api_version(exec_info.as_deref());
    Ok(Output {
        stdout: ExecCredential::new(&api_version, &token).render()?,
        warnings: warning.into_iter().collect(),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use aws_credential_types::Credentials;
    use std::time::Duration;

    #[test]
    fn api_version_follows_kubernetes_exec_info() {
        assert_eq!(api_version(None), (DEFAULT_API_VERSION.to_owned(), None));
        let v1 = r#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","spec":{"interactive":false}}"#;
        assert_eq!(api_version(Some(v1)).0, "client.authentication.k8s.io/v1");
        let (version, warning) = api_version(Some("{not json"));
        assert_eq!(version, DEFAULT_API_VERSION);
        assert!(warning.unwrap().contains("Error parsing"));
        let (version, warning) =
            api_version(Some(r#"{"apiVersion":"client.authentication.k8s.io/v2"}"#));
        assert_eq!(version, DEFAULT_API_VERSION);
        assert!(warning.unwrap().contains("Unrecognized"));
        let (version, warning) = api_version(Some(
            r#"{"apiVersion":"client.authentication.k8s.io/v1alpha1"}"#,
        ));
        assert_eq!(version, DEPRECATED_API_VERSION);
        assert!(warning.unwrap().contains("deprecated"));
    }

    #[test]
    fn renders_like_the_aws_cli() {
        let credentials = Credentials::new("AKID", "secret", None, None, "test");
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let token = sign_token(&credentials, "eu-west-1", "c", at).unwrap();
        let text = ExecCredential::new(DEFAULT_API_VERSION, &token)
            .render()
            .unwrap();
        let expected = format!(
            "{{\n    \"kind\": \"ExecCredential\",\n    \"apiVersion\": \"client.authentication.k8s.io/v1beta1\",\n    \"spec\": {{}},\n    \"status\": {{\n        \"expirationTimestamp\": \"2023-11-14T22:27:20Z\",\n        \"token\": \"{}\"\n    }}\n}}\n\n",
            token.expose()
        );
        assert_eq!(text, expected);
    }
}
