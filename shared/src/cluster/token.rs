//! EKS bearer tokens: a presigned STS `GetCallerIdentity` URL, as `aws eks get-token` makes.
//!
//! The API server (aws-iam-authenticator on EKS) never sees a credential: it forwards the
//! presigned request to STS, and STS answers with the caller's ARN. The token therefore has
//! to be the URL STS expects, signed for the `x-k8s-aws-id` header carrying the cluster name
//! (so a token for one cluster cannot be replayed against another).
//!
//! The URL is byte-for-byte what botocore produces for the same credentials, region, cluster
//! and instant: the operation parameters first, then the SigV4 query parameters in botocore's
//! order, with `X-Amz-Security-Token` before `X-Amz-Signature` (aws-sigv4 emits it last, so
//! the URL is assembled here from the values it computes).

use std::fmt;
use std::time::{Duration, SystemTime};

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{
    SignableBody, SignableRequest, SignatureLocation, SigningSettings, sign,
};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;
use base64::Engine as _;

/// Every EKS token starts with this.
pub const TOKEN_PREFIX: &str = "k8s-aws-v1.";
/// aws-iam-authenticator refuses longer tokens.
pub const MAX_TOKEN_BYTES: usize = 4096;
/// The header that binds a token to one cluster.
pub const CLUSTER_ID_HEADER: &str = "x-k8s-aws-id";
/// `X-Amz-Expires`: STS ignores it for `GetCallerIdentity` (a presigned URL is valid for 15
/// minutes after `X-Amz-Date`), but authenticators up to 0.3.0 required 0..=60, so every
/// client sends 60.
pub(crate) const PRESIGN_EXPIRES: Duration = Duration::from_secs(60);
/// STS accepts a presigned `GetCallerIdentity` for 15 minutes after signing.
pub(crate) const STS_VALIDITY: Duration = Duration::from_secs(15 * 60);
/// When a token is treated as expired: one minute before STS would refuse it, as
/// `aws eks get-token` reports in `expirationTimestamp`.
pub(crate) const TOKEN_LIFETIME: Duration = Duration::from_secs(STS_VALIDITY.as_secs() - 60);

const STS_QUERY: &str = "Action=GetCallerIdentity&Version=2011-06-15";

/// The SigV4 query parameters in the order botocore writes them.
const BOTOCORE_PARAM_ORDER: [&str; 7] = [
    "X-Amz-Algorithm",
    "X-Amz-Credential",
    "X-Amz-Date",
    "X-Amz-Expires",
    "X-Amz-SignedHeaders",
    "X-Amz-Security-Token",
    "X-Amz-Signature",
];

pub use crate::aws::partition::{Partition, sts_host};

/// A signed EKS bearer token.
///
/// Its value is a credential for 15 minutes: it is only reachable through
/// [`EksToken::expose`], and `Debug`/`Display` never show it.
#[derive(Clone, PartialEq, Eq)]
pub struct EksToken {
    value: String,
    signed_at: SystemTime,
}

impl EksToken {
    /// The bearer token (`k8s-aws-v1.…`). Handle with care: never log it.
    pub fn expose(&self) -> &str {
        &self.value
    }

    /// The signing instant (`X-Amz-Date`).
    pub fn signed_at(&self) -> SystemTime {
        self.signed_at
    }

    /// Signing time + 14 minutes: when a client should have replaced it.
    pub fn expires_at(&self) -> SystemTime {
        self.signed_at + TOKEN_LIFETIME
    }

    /// [`EksToken::expires_at`] as `aws eks get-token` prints it: `%Y-%m-%dT%H:%M:%SZ`.
    pub fn expiration_timestamp(&self) -> String {
        format_utc_seconds(self.expires_at())
    }
}

impl fmt::Debug for EksToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EksToken")
            .field("value", &"** redacted **")
            .field("signed_at", &format_utc_seconds(self.signed_at))
            .field("expires_at", &format_utc_seconds(self.expires_at()))
            .finish()
    }
}

impl fmt::Display for EksToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "EKS token (redacted, expires {})",
            format_utc_seconds(self.expires_at())
        )
    }
}

/// `%Y-%m-%dT%H:%M:%SZ` in UTC, whole seconds.
pub(crate) fn format_utc_seconds(time: SystemTime) -> String {
    match jiff::Timestamp::try_from(time) {
        Ok(ts) => ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
        Err(_) => "(out of range)".to_owned(),
    }
}

/// Why no token could be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error(
        "cluster name {0:?} cannot be signed into a token: use the EKS cluster name (letters, digits, '-', '_')"
    )]
    InvalidClusterName(String),
    #[error(
        "region {0:?} is not an AWS region name: set AWS_REGION (or --region) to e.g. eu-west-1"
    )]
    InvalidRegion(String),
    #[error(
        "the token would be {0} bytes, over the {MAX_TOKEN_BYTES}-byte limit of the API server's authenticator (is the session token unusually long?)"
    )]
    TooLarge(usize),
    #[error("SigV4 signing failed: {0}")]
    Signing(String),
}

/// Signs an EKS token for `cluster_name` with `credentials` at `signed_at`.
///
/// Pure and fast (no I/O): callers fetch credentials first. The result is identical to
/// `aws eks get-token --cluster-name <cluster_name> --region <region>` at that instant.
pub fn sign_token(
    credentials: &Credentials,
    region: &str,
    cluster_name: &str,
    signed_at: SystemTime,
) -> Result<EksToken, TokenError> {
    if !is_region_name(region) {
        return Err(TokenError::InvalidRegion(region.to_owned()));
    }
    if !is_cluster_id(cluster_name) {
        return Err(TokenError::InvalidClusterName(cluster_name.to_owned()));
    }
    let url = presigned_url(credentials, region, cluster_name, signed_at)?;
    let encoded = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(url.as_bytes());
    let value = format!("{TOKEN_PREFIX}{encoded}");
    if value.len() > MAX_TOKEN_BYTES {
        return Err(TokenError::TooLarge(value.len()));
    }
    Ok(EksToken { value, signed_at })
}

fn presigned_url(
    credentials: &Credentials,
    region: &str,
    cluster_name: &str,
    signed_at: SystemTime,
) -> Result<String, TokenError> {
    let host = sts_host(region);
    let base = format!("https://{host}/?{STS_QUERY}");

    let identity: Identity = credentials.clone().into();
    let mut settings = SigningSettings::default();
    settings.signature_location = SignatureLocation::QueryParams;
    settings.expires_in = Some(PRESIGN_EXPIRES);
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name("sts")
        .time(signed_at)
        .settings(settings)
        .build()
        .map_err(|e| TokenError::Signing(e.to_string()))?
        .into();
    let request = SignableRequest::new(
        "GET",
        base.as_str(),
        std::iter::once((CLUSTER_ID_HEADER, cluster_name)),
        SignableBody::Bytes(&[]),
    )
    .map_err(|e| TokenError::Signing(e.to_string()))?;

    // aws-sigv4 traces the canonical request, whose query string holds the session token
    // when presigning: sign with no subscriber so that never reaches a log.
    let output =
        tracing::dispatcher::with_default(&tracing::Dispatch::none(), || sign(request, &params))
            .map_err(|e| TokenError::Signing(e.to_string()))?;
    let (instructions, _signature) = output.into_parts();
    let (_headers, query) = instructions.into_parts();

    let mut url = base;
    url.reserve(1024);
    for name in BOTOCORE_PARAM_ORDER {
        if let Some((_, value)) = query.iter().find(|(key, _)| *key == name) {
            url.push('&');
            url.push_str(name);
            url.push('=');
            percent_encode_into(value, &mut url);
        }
    }
    if let Some((unexpected, _)) = query
        .iter()
        .find(|(key, _)| !BOTOCORE_PARAM_ORDER.contains(key))
    {
        return Err(TokenError::Signing(format!(
            "unexpected presign parameter {unexpected}"
        )));
    }
    Ok(url)
}

/// Percent-encodes everything but RFC 3986 unreserved characters, with upper-case hex, as
/// botocore's `percent_encode` does. Also the form encoding of the hand-signed IAM Query call
/// (`aws::iam`).
pub(crate) fn percent_encode_into(value: &str, out: &mut String) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(byte >> 4)]));
            out.push(char::from(HEX[usize::from(byte & 0x0f)]));
        }
    }
}

fn is_region_name(region: &str) -> bool {
    !region.is_empty()
        && region.len() <= 64
        && region
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !region.starts_with('-')
}

/// EKS cluster names (and Outposts cluster ids): what may go into the signed header.
fn is_cluster_id(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 100
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn credentials(session_token: Option<&str>) -> Credentials {
        Credentials::new(
            "AKIDEXAMPLE",
            "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
            session_token.map(str::to_owned),
            None,
            "test",
        )
    }

    fn at(seconds: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(seconds)
    }

    fn decoded_url(token: &EksToken) -> String {
        let encoded = token.expose().strip_prefix(TOKEN_PREFIX).unwrap();
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(encoded)
            .unwrap();
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn partitions_pick_their_dns_suffix() {
        assert_eq!(sts_host("eu-west-1"), "sts.eu-west-1.amazonaws.com");
        assert_eq!(sts_host("cn-north-1"), "sts.cn-north-1.amazonaws.com.cn");
        assert_eq!(sts_host("us-gov-west-1"), "sts.us-gov-west-1.amazonaws.com");
        assert_eq!(Partition::of_region("us-gov-east-1").id(), "aws-us-gov");
        assert_eq!(Partition::of_region("cn-northwest-1").id(), "aws-cn");
        assert_eq!(Partition::of_region("us-isob-east-1").id(), "aws-iso-b");
        assert_eq!(Partition::of_region("ap-southeast-7").id(), "aws");
    }

    #[test]
    fn an_eu_sovereign_token_is_addressed_to_the_eusc_sts_host() {
        let token = sign_token(&credentials(None), "eusc-de-east-1", "c", at(0)).unwrap();
        let url = decoded_url(&token);
        assert!(
            url.starts_with("https://sts.eusc-de-east-1.amazonaws.eu/?"),
            "{url}"
        );
    }

    #[test]
    fn security_token_sits_between_signed_headers_and_signature() {
        let token = sign_token(
            &credentials(Some("tok/en+=")),
            "eu-west-1",
            "c",
            at(1_700_000_000),
        )
        .unwrap();
        let url = decoded_url(&token);
        let signed_headers = url
            .find("&X-Amz-SignedHeaders=host%3Bx-k8s-aws-id")
            .unwrap();
        let session = url.find("&X-Amz-Security-Token=tok%2Fen%2B%3D").unwrap();
        let signature = url.find("&X-Amz-Signature=").unwrap();
        assert!(signed_headers < session && session < signature, "{url}");
        assert!(url.starts_with(
            "https://sts.eu-west-1.amazonaws.com/?Action=GetCallerIdentity&Version=2011-06-15&X-Amz-Algorithm="
        ));
        assert!(url.contains("&X-Amz-Expires=60&"));
    }

    #[test]
    fn long_term_credentials_carry_no_security_token() {
        let token = sign_token(&credentials(None), "us-west-2", "c", at(0)).unwrap();
        assert!(!decoded_url(&token).contains("X-Amz-Security-Token"));
    }

    #[test]
    fn expiry_is_fourteen_minutes_after_signing() {
        let token = sign_token(&credentials(None), "us-west-2", "c", at(1_700_000_000)).unwrap();
        assert_eq!(token.signed_at(), at(1_700_000_000));
        assert_eq!(token.expires_at(), at(1_700_000_000 + 14 * 60));
        assert_eq!(token.expiration_timestamp(), "2023-11-14T22:27:20Z");
    }

    #[test]
    fn debug_and_display_hide_the_value() {
        let token = sign_token(&credentials(Some("session")), "eu-west-1", "c", at(0)).unwrap();
        for shown in [
            format!("{token:?}"),
            format!("{token}"),
            format!("{token:#?}"),
        ] {
            assert!(!shown.contains(TOKEN_PREFIX), "{shown}");
            assert!(!shown.contains(&token.expose()[20..40]), "{shown}");
        }
    }

    #[test]
    fn oversized_tokens_are_refused() {
        let huge = "x".repeat(3000);
        let err = sign_token(&credentials(Some(&huge)), "eu-west-1", "c", at(0)).unwrap_err();
        assert!(
            matches!(err, TokenError::TooLarge(n) if n > MAX_TOKEN_BYTES),
            "{err}"
        );
    }

    #[test]
    fn bad_inputs_are_named() {
        let creds = credentials(None);
        assert_eq!(
            sign_token(&creds, "", "c", at(0)),
            Err(TokenError::InvalidRegion(String::new()))
        );
        assert_eq!(
            sign_token(&creds, "eu-west-1", "a b", at(0)),
            Err(TokenError::InvalidClusterName("a b".into()))
        );
        assert!(sign_token(&creds, "EU/west", "c", at(0)).is_err());
    }
}
