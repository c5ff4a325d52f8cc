//! IAM `ListInstanceProfilesForRole`, signed with SigV4 by hand.
//!
//! The one IAM call the functions make does not justify `aws-sdk-iam` (a large crate to build
//! and to load at cold start): this sends the Query-protocol request itself, with the same
//! credentials provider, HTTPS stack and endpoint overrides (`AWS_ENDPOINT_URL_IAM`,
//! `AWS_ENDPOINT_URL`) the SDK clients use. IAM is global: one endpoint per partition
//! ([`iam_endpoint`]), signed for the partition's home region.

use std::time::SystemTime;

use aws_credential_types::Credentials;
use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::http::HttpConnector;
use aws_smithy_runtime_api::client::identity::Identity;
use aws_smithy_runtime_api::client::orchestrator::HttpRequest;
use aws_smithy_types::body::SdkBody;
use aws_smithy_types::byte_stream::ByteStream;

// Form values for the Query API are encoded exactly as the token's query string is.
use crate::cluster::token::percent_encode_into;
use aws_types::SdkConfig;
use aws_types::service_config::ServiceConfigKey;

use super::partition::iam_endpoint;
use super::sdk::kind_of;
use super::{AwsError, AwsErrorKind, InstanceProfiles};
use crate::retry::{RetryPolicy, with_retries};

const OPERATION: &str = "ListInstanceProfilesForRole";
/// At most this many pages are read (1000 profiles each is far beyond any role).
const MAX_PAGES: usize = 20;
/// Throttling, 5xx and transport errors are tried again as the SDK's standard retry mode
/// does for the SDK clients (three attempts in all).
const RETRY: RetryPolicy = RetryPolicy {
    max_attempts: 3,
    base_delay: std::time::Duration::from_millis(200),
    max_delay: std::time::Duration::from_secs(2),
};

/// IAM over a hand-signed Query-protocol request.
#[derive(Clone)]
pub struct SigV4Iam {
    credentials: Option<SharedCredentialsProvider>,
    /// `https://iam.amazonaws.com` or the configured override, without a trailing `/`.
    endpoint: String,
    signing_region: &'static str,
}

impl std::fmt::Debug for SigV4Iam {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigV4Iam")
            .field("endpoint", &self.endpoint)
            .field("signing_region", &self.signing_region)
            .finish_non_exhaustive()
    }
}

impl SigV4Iam {
    /// From the shared configuration: its credentials provider, its region's partition, and
    /// the endpoint override the SDK would use for IAM (`AWS_ENDPOINT_URL_IAM` or the
    /// `endpoint_url` of the profile's `iam` section, then `AWS_ENDPOINT_URL`).
    pub fn new(config: &SdkConfig) -> Self {
        let region = config.region().map_or("us-east-1", |r| r.as_ref());
        let (host, signing_region) = iam_endpoint(region);
        let service_override = config.service_config().and_then(|loader| {
            let key = ServiceConfigKey::builder()
                .service_id("IAM")
                .env("AWS_ENDPOINT_URL_IAM")
                .profile("endpoint_url")
                .build()
                .ok()?;
            loader.load_config(key)
        });
        let endpoint = service_override
            .or_else(|| config.endpoint_url().map(str::to_owned))
            .unwrap_or_else(|| format!("https://{host}"));
        Self {
            credentials: config.credentials_provider(),
            endpoint: endpoint.trim_end_matches('/').to_owned(),
            signing_region,
        }
    }

    async fn page(&self, role_name: &str, marker: Option<&str>) -> Result<Page, AwsError> {
        let provider = self.credentials.as_ref().ok_or_else(|| {
            AwsError::new(
                OPERATION,
                AwsErrorKind::AccessDenied,
                "no AWS credentials provider",
            )
        })?;
        let credentials = provider.provide_credentials().await.map_err(|e| {
            AwsError::new(
                OPERATION,
                AwsErrorKind::AccessDenied,
                format!("no credentials: {e}"),
            )
        })?;
        let body = query_body(role_name, marker);
        let url = format!("{}/", self.endpoint);
        let request = signed_request(
            &credentials,
            &url,
            self.signing_region,
            &body,
            SystemTime::now(),
        )?;
        let connector = aws_smithy_http_client::Connector::builder()
            .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
                aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
            ))
            .build();
        let response = connector
            .call(request)
            .await
            .map_err(|e| AwsError::new(OPERATION, AwsErrorKind::Transport, format!("{e:?}")))?;
        let status = response.status().as_u16();
        let bytes = ByteStream::new(response.into_body())
            .collect()
            .await
            .map_err(|e| AwsError::new(OPERATION, AwsErrorKind::Transport, e.to_string()))?
            .into_bytes();
        let text = String::from_utf8_lossy(&bytes);
        if (200..300).contains(&status) {
            parse_page(&text)
                .ok_or_else(|| AwsError::new(OPERATION, AwsErrorKind::Other, "unreadable answer"))
        } else {
            Err(parse_error(status, &text))
        }
    }
}

impl InstanceProfiles for SigV4Iam {
    async fn instance_profiles_for_role(&self, role_name: &str) -> Result<Vec<String>, AwsError> {
        let mut arns = Vec::new();
        let mut marker: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let page = match with_retries(&RETRY, || self.page(role_name, marker.as_deref())).await
            {
                Ok(page) => page,
                // The role is gone: no instance can take its credentials any more.
                Err(err) if err.kind == AwsErrorKind::NotFound => return Ok(Vec::new()),
                Err(err) => return Err(err),
            };
            arns.extend(page.instance_profile_arns);
            match page.marker {
                Some(next) => marker = Some(next),
                None => return Ok(arns),
            }
        }
        Err(AwsError::new(
            OPERATION,
            AwsErrorKind::Other,
            format!("more than {MAX_PAGES} pages of instance profiles"),
        ))
    }
}

/// The form-encoded Query-protocol body.
pub(crate) fn query_body(role_name: &str, marker: Option<&str>) -> String {
    // The action spelled out: the template test finds granted actions by it.
    let mut body = String::from("Action=ListInstanceProfilesForRole&Version=2010-05-08&RoleName=");
    percent_encode_into(role_name, &mut body);
    if let Some(marker) = marker {
        body.push_str("&Marker=");
        percent_encode_into(marker, &mut body);
    }
    body
}

/// A `POST` of `body` to `url`, signed (SigV4, headers) for service `iam` in `region`.
pub(crate) fn signed_request(
    credentials: &Credentials,
    url: &str,
    region: &str,
    body: &str,
    signed_at: SystemTime,
) -> Result<HttpRequest, AwsError> {
    let signing_error = |e: &dyn std::fmt::Display| {
        AwsError::new(OPERATION, AwsErrorKind::Invalid, format!("signing: {e}"))
    };
    let identity: Identity = credentials.clone().into();
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name("iam")
        .time(signed_at)
        .settings(SigningSettings::default())
        .build()
        .map_err(|e| signing_error(&e))?
        .into();
    const CONTENT_TYPE: &str = "application/x-www-form-urlencoded; charset=utf-8";
    let signable = SignableRequest::new(
        "POST",
        url,
        std::iter::once(("content-type", CONTENT_TYPE)),
        SignableBody::Bytes(body.as_bytes()),
    )
    .map_err(|e| signing_error(&e))?;
    // aws-sigv4 traces the canonical request (with the session token header): sign with no
    // subscriber so it never reaches a log.
    let output =
        tracing::dispatcher::with_default(&tracing::Dispatch::none(), || sign(signable, &params))
            .map_err(|e| signing_error(&e))?;
    let (instructions, _signature) = output.into_parts();
    let mut request = http::Request::builder()
        .method("POST")
        .uri(url)
        .header("content-type", CONTENT_TYPE)
        .body(SdkBody::from(body.to_owned()))
        .map_err(|e| signing_error(&e))?;
    instructions.apply_to_request_http1x(&mut request);
    HttpRequest::try_from(request).map_err(|e| signing_error(&e))
}

/// One page of `ListInstanceProfilesForRoleResult`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    pub instance_profile_arns: Vec<String>,
    /// Set when `IsTruncated` is true.
    pub marker: Option<String>,
}

/// Reads a `ListInstanceProfilesForRoleResponse`: the `Arn` of each instance profile (the
/// profiles' `Roles` carry role `Arn`s too; only `:instance-profile/` ones are kept), and
/// the `Marker` when `IsTruncated` is true. `None` when it is not that response.
pub(crate) fn parse_page(xml: &str) -> Option<Page> {
    let result = element(xml, "ListInstanceProfilesForRoleResult")?;
    let profiles = element(result, "InstanceProfiles").unwrap_or_default();
    let instance_profile_arns = elements(profiles, "Arn")
        .map(unescape)
        .filter(|arn| arn.starts_with("arn:") && arn.contains(":instance-profile/"))
        .collect();
    let truncated = element(result, "IsTruncated").is_some_and(|t| t.trim() == "true");
    let marker = if truncated {
        Some(unescape(element(result, "Marker")?)).filter(|m| !m.is_empty())
    } else {
        None
    };
    if truncated && marker.is_none() {
        return None;
    }
    Some(Page {
        instance_profile_arns,
        marker,
    })
}

/// An IAM `ErrorResponse` as an [`AwsError`] (the code classified as every SDK error is).
pub(crate) fn parse_error(status: u16, xml: &str) -> AwsError {
    let code = element(xml, "Code").map(unescape);
    let message = element(xml, "Message")
        .map(unescape)
        .unwrap_or_else(|| format!("HTTP {status}"));
    let error = AwsError::new(OPERATION, kind_of(code.as_deref(), status), message);
    match code {
        Some(code) => error.with_code(code),
        None => error,
    }
}

/// The text of the first `<name>...</name>` in `xml`.
fn element<'a>(xml: &'a str, name: &str) -> Option<&'a str> {
    elements(xml, name).next()
}

/// The texts of every `<name>...</name>` in `xml`, in order (no nesting of the same name).
fn elements<'a>(xml: &'a str, name: &str) -> impl Iterator<Item = &'a str> {
    let open = format!("<{name}>");
    let close = format!("</{name}>");
    let mut rest = xml;
    std::iter::from_fn(move || {
        let start = rest.find(&open)? + open.len();
        let len = rest[start..].find(&close)?;
        let text = &rest[start..start + len];
        rest = &rest[start + len + close.len()..];
        Some(text)
    })
}

fn unescape(text: &str) -> String {
    text.trim()
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&amp;", "&")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const PAGE: &str = r#"<ListInstanceProfilesForRoleResponse xmlns="https://iam.amazonaws.com/doc/2010-05-08/">
  <ListInstanceProfilesForRoleResult>
    <IsTruncated>true</IsTruncated>
    <Marker>next&amp;page</Marker>
    <InstanceProfiles>
      <member>
        <InstanceProfileId>AIPAEXAMPLE</InstanceProfileId>
        <Roles>
          <member>
            <Path>/</Path>
            <Arn>arn:aws:iam::111122223333:role/nodes</Arn>
            <RoleName>nodes</RoleName>
          </member>
        </Roles>
        <InstanceProfileName>nodes-profile</InstanceProfileName>
        <Path>/eks/</Path>
        <Arn>arn:aws:iam::111122223333:instance-profile/eks/nodes-profile</Arn>
      </member>
      <member>
        <Roles/>
        <Arn>arn:aws:iam::111122223333:instance-profile/karpenter</Arn>
      </member>
    </InstanceProfiles>
  </ListInstanceProfilesForRoleResult>
</ListInstanceProfilesForRoleResponse>"#;

    #[test]
    fn a_page_yields_the_profile_arns_not_the_role_arns_and_the_marker() {
        let page = parse_page(PAGE).unwrap();
        assert_eq!(
            page.instance_profile_arns,
            [
                "arn:aws:iam::111122223333:instance-profile/eks/nodes-profile",
                "arn:aws:iam::111122223333:instance-profile/karpenter"
            ]
        );
        assert_eq!(page.marker.as_deref(), Some("next&page"));
    }

    #[test]
    fn a_last_page_has_no_marker_and_a_truncated_one_without_marker_is_refused() {
        let last = PAGE.replace(
            "<IsTruncated>true</IsTruncated>",
            "<IsTruncated>false</IsTruncated>",
        );
        assert_eq!(parse_page(&last).unwrap().marker, None);
        let broken = PAGE.replace("<Marker>next&amp;page</Marker>", "");
        assert_eq!(parse_page(&broken), None);
        assert_eq!(parse_page("<html>proxy error</html>"), None);
    }

    #[test]
    fn errors_are_classified_like_sdk_errors() {
        let xml = "<ErrorResponse><Error><Type>Sender</Type><Code>NoSuchEntity</Code><Message>The role with name nodes cannot be found.</Message></Error></ErrorResponse>";
        let error = parse_error(404, xml);
        assert_eq!(error.kind, AwsErrorKind::NotFound);
        assert_eq!(error.code.as_deref(), Some("NoSuchEntity"));
        let denied = parse_error(
            403,
            "<ErrorResponse><Error><Code>AccessDenied</Code><Message>no</Message></Error></ErrorResponse>",
        );
        assert_eq!(denied.kind, AwsErrorKind::AccessDenied);
        let throttled = parse_error(
            400,
            "<ErrorResponse><Error><Code>Throttling</Code></Error></ErrorResponse>",
        );
        assert!(throttled.is_retryable());
        assert_eq!(parse_error(503, "").kind, AwsErrorKind::Transient);
    }

    #[test]
    fn the_body_is_form_encoded() {
        assert_eq!(
            query_body("my role+x", Some("a/b=")),
            "Action=ListInstanceProfilesForRole&Version=2010-05-08&RoleName=my%20role%2Bx&Marker=a%2Fb%3D"
        );
    }

    #[test]
    fn the_request_is_signed_for_iam_in_the_signing_region_with_the_session_token() {
        let credentials = Credentials::new(
            "AKIDEXAMPLE",
            "secret",
            Some("session".into()),
            None,
            "test",
        );
        let at = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
        let request = signed_request(
            &credentials,
            "https://iam.amazonaws.com/",
            "us-east-1",
            &query_body("nodes", None),
            at,
        )
        .unwrap();
        let authorization = request.headers().get("authorization").unwrap();
        assert!(
            authorization.starts_with(
                "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20231114/us-east-1/iam/aws4_request"
            ),
            "{authorization}"
        );
        assert!(authorization.contains("SignedHeaders=content-type;host;x-amz-date"));
        assert_eq!(
            request.headers().get("x-amz-security-token"),
            Some("session")
        );
        assert_eq!(
            request.headers().get("x-amz-date"),
            Some("20231114T221320Z")
        );
        assert_eq!(request.method(), "POST");
        // The signature depends on the body: another role signs differently.
        let other = signed_request(
            &credentials,
            "https://iam.amazonaws.com/",
            "us-east-1",
            &query_body("other", None),
            at,
        )
        .unwrap();
        assert_ne!(other.headers().get("authorization"), Some(authorization));
    }
}
