//! SigV4 verification of a request's `Authorization` header: the signature is recomputed
//! with the secret key the account issued, over the headers the client says it signed, so a
//! request signed with another secret, or altered after signing, is refused as AWS would.

use std::time::SystemTime;

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
use aws_sigv4::sign::v4;

use super::SigV4Scope;
use crate::account::FakeCredentials;

/// `SignedHeaders=a;b;c` and `Signature=...` of an `Authorization` header.
fn signed_headers_and_signature(authorization: &str) -> Option<(Vec<String>, String)> {
    let mut headers = None;
    let mut signature = None;
    for part in authorization
        .trim()
        .strip_prefix("AWS4-HMAC-SHA256")?
        .split(',')
        .map(str::trim)
    {
        if let Some(list) = part.strip_prefix("SignedHeaders=") {
            headers = Some(list.split(';').map(str::to_owned).collect());
        } else if let Some(value) = part.strip_prefix("Signature=") {
            signature = Some(value.to_owned());
        }
    }
    Some((headers?, signature?))
}

fn parse_amz_date(date: &str) -> Option<SystemTime> {
    let parsed = jiff::civil::DateTime::strptime("%Y%m%dT%H%M%SZ", date).ok()?;
    let timestamp = parsed.to_zoned(jiff::tz::TimeZone::UTC).ok()?.timestamp();
    Some(SystemTime::from(timestamp))
}

/// Whether the request's signature is the one `credentials` produce.
pub(crate) fn matches(
    credentials: &FakeCredentials,
    scope: &SigV4Scope,
    parts: &axum::http::request::Parts,
    body: &[u8],
) -> bool {
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .and_then(|value| value.to_str().ok())
    };
    let Some((signed_headers, presented)) =
        header("authorization").and_then(signed_headers_and_signature)
    else {
        return false;
    };
    let Some(signed_at) = header("x-amz-date").and_then(parse_amz_date) else {
        return false;
    };
    let mut headers = Vec::with_capacity(signed_headers.len());
    for name in &signed_headers {
        match header(name) {
            Some(value) => headers.push((name.as_str(), value)),
            None => return false,
        }
    }
    let host = header("host").unwrap_or("localhost");
    let path_and_query = parts
        .uri
        .path_and_query()
        .map(|pq| pq.as_str())
        .unwrap_or("/");
    let uri = format!("http://{host}{path_and_query}");
    let identity = Credentials::new(
        credentials.access_key_id.clone(),
        credentials.secret_access_key.clone(),
        credentials.session_token.clone(),
        None,
        "fake-account",
    )
    .into();
    let Ok(params) = v4::SigningParams::builder()
        .identity(&identity)
        .region(&scope.region)
        .name(&scope.service)
        .time(signed_at)
        .settings(SigningSettings::default())
        .build()
    else {
        return false;
    };
    let params = params.into();
    let Ok(request) = SignableRequest::new(
        parts.method.as_str(),
        uri,
        headers.into_iter(),
        SignableBody::Bytes(body),
    ) else {
        return false;
    };
    // Keep the session token (a signed header) out of trace logs.
    let signed =
        tracing::dispatcher::with_default(&tracing::Dispatch::none(), || sign(request, &params));
    signed.is_ok_and(|output| output.signature() == presented)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_authorization_header_names_signed_headers_and_signature() {
        let header = "AWS4-HMAC-SHA256 Credential=A/20240101/eu-west-1/eks/aws4_request, SignedHeaders=host;x-amz-date, Signature=abc123";
        assert_eq!(
            signed_headers_and_signature(header),
            Some((
                vec!["host".to_owned(), "x-amz-date".to_owned()],
                "abc123".to_owned()
            ))
        );
        assert_eq!(signed_headers_and_signature("Bearer x"), None);
    }

    #[test]
    fn amz_dates_are_utc() {
        let at = parse_amz_date("20240102T030405Z").expect("date");
        let expected: jiff::Timestamp = "2024-01-02T03:04:05Z".parse().expect("timestamp");
        assert_eq!(at, SystemTime::from(expected));
    }
}
