//! Verifies EKS bearer tokens the way aws-iam-authenticator and STS do.
//!
//! The authenticator's server-side checks come first, in its order (size, prefix, base64url
//! without padding, `https`, an STS host of the partition, path `/`, only allow-listed query
//! keys each once, `Action=GetCallerIdentity`, `x-k8s-aws-id` among the signed headers,
//! `X-Amz-Expires` in 0..=900, `X-Amz-Date` present, well-formed and at most 15 minutes old).
//! Where the real authenticator then forwards the URL to STS with its own `x-k8s-aws-id`
//! header, this verifier plays STS: it finds the credentials by access key id in the
//! [`FakeAccount`], checks the session token and scope, and recomputes the SigV4 signature
//! with the verifier's cluster name in `x-k8s-aws-id` — so a token for another cluster, by
//! other credentials or altered in any signed part is refused.
//!
//! Written independently of the signer in `node_manager::cluster::token` (it only shares
//! aws-sigv4), so the two check each other.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{
    SignableBody, SignableRequest, SignatureLocation, SigningSettings, sign,
};
use aws_sigv4::sign::v4;
use base64::Engine as _;

use crate::account::{FakeAccount, FakeCredentials};

const PREFIX: &str = "k8s-aws-v1.";
const MAX_TOKEN_BYTES: usize = 4096;
const CLUSTER_ID_HEADER: &str = "x-k8s-aws-id";
/// A presigned `GetCallerIdentity` is valid this long after `X-Amz-Date`.
pub const PRESIGNED_URL_VALIDITY: Duration = Duration::from_secs(15 * 60);
/// How far in the future `X-Amz-Date` may be (clock skew STS tolerates).
pub const MAX_CLOCK_SKEW: Duration = Duration::from_secs(5 * 60);

/// The query keys aws-iam-authenticator accepts (compared lower-case).
const ALLOWED_QUERY_KEYS: [&str; 9] = [
    "action",
    "version",
    "x-amz-algorithm",
    "x-amz-credential",
    "x-amz-date",
    "x-amz-expires",
    "x-amz-security-token",
    "x-amz-signature",
    "x-amz-signedheaders",
];

/// The caller a valid token proves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedCaller {
    /// Canonical principal ARN (role ARN for role sessions).
    pub principal_arn: String,
    pub access_key_id: String,
    /// The role session's name (`{{SessionName}}`; empty for an IAM user).
    pub session_name: String,
}

/// Why a token was refused; the message says which check failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("token rejected: {0}")]
pub struct TokenRejection(pub String);

fn reject<T>(reason: impl Into<String>) -> Result<T, TokenRejection> {
    Err(TokenRejection(reason.into()))
}

/// Checks `token` for `cluster_name` at `now` against the account's credentials.
pub fn verify_token(
    token: &str,
    cluster_name: &str,
    account: &FakeAccount,
    now: SystemTime,
) -> Result<VerifiedCaller, TokenRejection> {
    if token.len() > MAX_TOKEN_BYTES {
        return reject("token is too large");
    }
    let Some(encoded) = token.strip_prefix(PREFIX) else {
        return reject(format!("token is missing the {PREFIX:?} prefix"));
    };
    let decoded = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(encoded)
        .or_else(|e| reject(format!("token is not base64url without padding: {e}")))?;
    let text = String::from_utf8(decoded).or_else(|_| reject("token URL is not UTF-8"))?;
    let url = url::Url::parse(&text).or_else(|e| reject(format!("token URL: {e}")))?;

    if url.scheme() != "https" {
        return reject(format!(
            "unexpected scheme {:?} in pre-signed URL",
            url.scheme()
        ));
    }
    if !url.username().is_empty() || url.password().is_some() || url.port().is_some() {
        return reject("unexpected user info or port in pre-signed URL");
    }
    let host = url.host_str().unwrap_or_default();
    let Some(host_region) = sts_host_region(host, &account.partition) else {
        return reject(format!(
            "unexpected hostname {host:?} in pre-signed URL (partition {})",
            account.partition
        ));
    };
    if url.path() != "/" {
        return reject("unexpected path in pre-signed URL");
    }
    if url.fragment().is_some() {
        return reject("unexpected fragment in pre-signed URL");
    }

    // Key (lower-case) -> value; the original pairs keep their order for re-signing.
    let pairs: Vec<(String, String)> = url.query_pairs().into_owned().collect();
    let mut query: BTreeMap<String, String> = BTreeMap::new();
    for (key, value) in &pairs {
        let lower = key.to_ascii_lowercase();
        if !ALLOWED_QUERY_KEYS.contains(&lower.as_str()) {
            return reject(format!("non-whitelisted query parameter {key:?}"));
        }
        if query.insert(lower, value.clone()).is_some() {
            return reject(format!("query parameter {key:?} appears more than once"));
        }
    }
    let get = |key: &str| query.get(key).map(String::as_str).unwrap_or_default();

    if get("action") != "GetCallerIdentity" {
        return reject("unexpected action parameter in pre-signed URL");
    }
    let signed_headers: Vec<String> = get("x-amz-signedheaders")
        .split(';')
        .map(str::to_ascii_lowercase)
        .collect();
    if !signed_headers.iter().any(|h| h == CLUSTER_ID_HEADER) {
        return reject(format!(
            "client did not sign the {CLUSTER_ID_HEADER} header in the pre-signed URL"
        ));
    }
    let expires: u64 = match get("x-amz-expires").parse() {
        Ok(seconds) if seconds <= 900 => seconds,
        _ => {
            return reject(format!(
                "invalid X-Amz-Expires parameter in pre-signed URL: {:?}",
                get("x-amz-expires")
            ));
        }
    };
    let date = get("x-amz-date");
    if date.is_empty() {
        return reject("X-Amz-Date parameter must be present in pre-signed URL");
    }
    let signed_at = parse_amz_date(date)
        .ok_or_else(|| TokenRejection(format!("X-Amz-Date {date:?} is not YYYYMMDDTHHMMSSZ")))?;
    if now > signed_at + PRESIGNED_URL_VALIDITY {
        return reject("X-Amz-Date parameter is expired (15 minute expiration)");
    }
    if signed_at > now + MAX_CLOCK_SKEW {
        return reject("X-Amz-Date parameter is in the future");
    }

    // From here on: what STS checks.
    if get("x-amz-algorithm") != "AWS4-HMAC-SHA256" {
        return reject("X-Amz-Algorithm must be AWS4-HMAC-SHA256");
    }
    let credential = get("x-amz-credential");
    let scope: Vec<&str> = credential.split('/').collect();
    let [
        access_key_id,
        scope_date,
        scope_region,
        "sts",
        "aws4_request",
    ] = scope[..]
    else {
        return reject("X-Amz-Credential is not <key>/<date>/<region>/sts/aws4_request");
    };
    if !date.starts_with(scope_date) || scope_date.len() != 8 {
        return reject("X-Amz-Credential date does not match X-Amz-Date");
    }
    if scope_region != host_region {
        return reject(format!(
            "credential scope region {scope_region:?} does not match the STS host {host:?}"
        ));
    }
    let Some(known) = account.credentials(access_key_id) else {
        return reject(format!("the access key {access_key_id:?} does not exist"));
    };
    let presented_session = query.get("x-amz-security-token");
    if presented_session != known.session_token.as_ref() {
        return reject("the security token does not belong to the access key");
    }
    if signed_headers
        .iter()
        .any(|h| h != "host" && h != CLUSTER_ID_HEADER)
    {
        return reject("signed headers other than host and x-k8s-aws-id cannot be verified");
    }

    let expected = presign(
        &known,
        host,
        scope_region,
        &pairs,
        cluster_name,
        signed_at,
        expires,
    )?;
    for (name, value) in &expected {
        let presented = get(&name.to_ascii_lowercase());
        if presented != value.as_ref() {
            return reject(if *name == "X-Amz-Signature" {
                "signature does not match: signed for another cluster, by other credentials, or altered".to_owned()
            } else {
                format!("{name} does not match what was signed")
            });
        }
    }

    Ok(VerifiedCaller {
        principal_arn: known.principal_arn.clone(),
        access_key_id: known.access_key_id.clone(),
        session_name: account.session_name(&known),
    })
}

/// The region of an STS host in `partition`: `sts.<region>.<suffix>`, or the global
/// `sts.amazonaws.com` (us-east-1) of the `aws` partition.
fn sts_host_region(host: &str, partition: &str) -> Option<String> {
    let suffix = match partition {
        "aws-cn" => ".amazonaws.com.cn",
        "aws" | "aws-us-gov" => ".amazonaws.com",
        _ => return None,
    };
    if partition == "aws" && host == "sts.amazonaws.com" {
        return Some("us-east-1".to_owned());
    }
    let region = host.strip_prefix("sts.")?.strip_suffix(suffix)?;
    let valid = !region.is_empty()
        && region
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    let in_partition = match partition {
        "aws-cn" => region.starts_with("cn-"),
        "aws-us-gov" => region.starts_with("us-gov-"),
        _ => !region.starts_with("cn-") && !region.starts_with("us-gov-"),
    };
    (valid && in_partition).then(|| region.to_owned())
}

fn parse_amz_date(date: &str) -> Option<SystemTime> {
    let parsed = jiff::civil::DateTime::strptime("%Y%m%dT%H%M%SZ", date).ok()?;
    let timestamp = parsed.to_zoned(jiff::tz::TimeZone::UTC).ok()?.timestamp();
    Some(SystemTime::from(timestamp))
}

/// The presign parameters the known credentials produce for this request.
fn presign(
    known: &FakeCredentials,
    host: &str,
    region: &str,
    pairs: &[(String, String)],
    cluster_name: &str,
    signed_at: SystemTime,
    expires: u64,
) -> Result<Vec<(&'static str, Cow<'static, str>)>, TokenRejection> {
    let operation: Vec<String> = pairs
        .iter()
        .filter(|(key, _)| !key.to_ascii_lowercase().starts_with("x-amz-"))
        .map(|(key, value)| format!("{}={}", encode(key), encode(value)))
        .collect();
    let uri = format!("https://{host}/?{}", operation.join("&"));
    let identity = Credentials::new(
        known.access_key_id.clone(),
        known.secret_access_key.clone(),
        known.session_token.clone(),
        None,
        "fake-account",
    )
    .into();
    let mut settings = SigningSettings::default();
    settings.signature_location = SignatureLocation::QueryParams;
    settings.expires_in = Some(Duration::from_secs(expires));
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name("sts")
        .time(signed_at)
        .settings(settings)
        .build()
        .or_else(|e| reject(format!("cannot re-sign: {e}")))?
        .into();
    let request = SignableRequest::new(
        "GET",
        uri,
        std::iter::once((CLUSTER_ID_HEADER, cluster_name)),
        SignableBody::Bytes(&[]),
    )
    .or_else(|e| reject(format!("cannot re-sign: {e}")))?;
    // Keep the session token (in the canonical query) out of trace logs.
    let signed =
        tracing::dispatcher::with_default(&tracing::Dispatch::none(), || sign(request, &params))
            .or_else(|e| reject(format!("cannot re-sign: {e}")))?;
    let (instructions, _) = signed.into_parts();
    Ok(instructions.into_parts().1)
}

fn encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}
