//! The wire protocols the fake speaks, so the real SDK clients parse every answer as they
//! would AWS's: `awsQuery` (Auto Scaling, SNS), `ec2Query` (EC2) and `restJson1` (EKS).
//!
//! Handlers produce a [`Reply`] or an [`ApiError`]; this module turns either into the HTTP
//! response of the service's protocol, error envelopes included.

use std::collections::BTreeMap;

use axum::body::Body;
use axum::http::{HeaderValue, Response, StatusCode};

use super::Service;

/// What a handler answers on success.
pub(crate) enum Reply {
    /// The content of `<{Action}Result>` (query) or the elements after `<requestId>` (EC2).
    Xml(String),
    /// A restJson1 body with its status code.
    Json(u16, serde_json::Value),
}

/// An AWS error, rendered in the envelope of the protocol it is returned on.
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    pub status: u16,
    pub code: String,
    pub message: String,
    /// `Sender` or `Receiver` (query protocols only).
    pub fault: &'static str,
    /// Extra members of a restJson1 error body (e.g. `clusterName`).
    pub fields: Vec<(String, serde_json::Value)>,
}

impl ApiError {
    pub fn new(status: u16, code: &str, message: impl Into<String>) -> Self {
        Self {
            status,
            code: code.to_owned(),
            message: message.into(),
            fault: if status >= 500 { "Receiver" } else { "Sender" },
            fields: Vec::new(),
        }
    }

    /// The query protocols' catch-all for a bad request (`ValidationError`, 400).
    pub fn validation(message: impl Into<String>) -> Self {
        Self::new(400, "ValidationError", message)
    }

    pub fn with_field(mut self, name: &str, value: impl Into<serde_json::Value>) -> Self {
        self.fields.push((name.to_owned(), value.into()));
        self
    }
}

/// XML text escaping for element content.
pub(crate) fn xml_escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\r' => out.push_str("&#xD;"),
            _ => out.push(c),
        }
    }
    out
}

/// `<name>escaped value</name>`.
pub(crate) fn element(name: &str, value: &str) -> String {
    format!("<{name}>{}</{name}>", xml_escape(value))
}

/// Decodes `%XX` escapes (path segments: `+` stays a plus).
pub(crate) fn percent_decode(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Some(byte) = std::str::from_utf8(&bytes[i + 1..i + 3])
                .ok()
                .and_then(|hex| u8::from_str_radix(hex, 16).ok())
        {
            out.push(byte);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The parameters of a form-encoded query request (`Action`, `Version` included).
pub(crate) type QueryParams = BTreeMap<String, String>;

pub(crate) fn parse_form(body: &[u8]) -> QueryParams {
    url::form_urlencoded::parse(body).into_owned().collect()
}

/// The members of a query list: `{prefix}.member.1`, `{prefix}.member.2`, ... (Auto Scaling,
/// SNS) or `{prefix}.1`, `{prefix}.2`, ... (EC2), in order.
pub(crate) fn query_list(params: &QueryParams, prefix: &str) -> Vec<String> {
    let mut items: Vec<(u32, String)> = params
        .iter()
        .filter_map(|(key, value)| {
            let rest = key.strip_prefix(prefix)?.strip_prefix('.')?;
            let rest = rest.strip_prefix("member.").unwrap_or(rest);
            rest.parse::<u32>().ok().map(|index| (index, value.clone()))
        })
        .collect();
    items.sort_by_key(|(index, _)| *index);
    items.into_iter().map(|(_, value)| value).collect()
}

/// A fresh request id (a random UUID, as AWS sends).
pub(crate) fn request_id() -> String {
    uuid_v4()
}

/// A random version-4 UUID string.
pub(crate) fn uuid_v4() -> String {
    let bytes: [u8; 16] = rand::random();
    let hex = hex::encode(bytes);
    format!(
        "{}-{}-4{}-{}{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[13..16],
        ["8", "9", "a", "b"][usize::from(bytes[8] & 3)],
        &hex[17..20],
        &hex[20..32]
    )
}

/// RFC 3339 UTC with milliseconds, the form AWS uses in XML and notifications.
pub(crate) fn timestamp_millis(at: jiff::Timestamp) -> String {
    at.strftime("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
}

const AUTOSCALING_XMLNS: &str = "http://autoscaling.amazonaws.com/doc/2011-01-01/";
const SNS_XMLNS: &str = "http://sns.amazonaws.com/doc/2010-03-31/";
const IAM_XMLNS: &str = "https://iam.amazonaws.com/doc/2010-05-08/";
const ELB_XMLNS: &str = "http://elasticloadbalancing.amazonaws.com/doc/2015-12-01/";
const CLASSIC_ELB_XMLNS: &str = "http://elasticloadbalancing.amazonaws.com/doc/2012-06-01/";

/// The XML namespace of a query service's answers.
fn query_xmlns(service: Service) -> &'static str {
    match service {
        Service::Sns => SNS_XMLNS,
        Service::Iam => IAM_XMLNS,
        Service::LoadBalancing => ELB_XMLNS,
        Service::ClassicLoadBalancing => CLASSIC_ELB_XMLNS,
        _ => AUTOSCALING_XMLNS,
    }
}
const EC2_XMLNS: &str = "http://ec2.amazonaws.com/doc/2016-11-15/";

fn with_request_id(mut response: Response<Body>, request_id: &str) -> Response<Body> {
    if let Ok(value) = HeaderValue::from_str(request_id) {
        response.headers_mut().insert("x-amzn-RequestId", value);
    }
    response
}

fn build(status: u16, content_type: &str, body: String) -> Response<Body> {
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
    response.headers_mut().insert(
        "content-type",
        HeaderValue::from_str(content_type)
            .unwrap_or_else(|_| HeaderValue::from_static("text/xml")),
    );
    response
}

/// Renders a successful answer of `operation` on `service`.
pub(crate) fn render_reply(
    service: Service,
    operation: &str,
    reply: Reply,
    request_id: &str,
) -> Response<Body> {
    let response = match (service, reply) {
        (Service::Ec2, Reply::Xml(inner)) => build(
            200,
            "text/xml;charset=UTF-8",
            format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<{operation}Response xmlns=\"{EC2_XMLNS}\"><requestId>{request_id}</requestId>{inner}</{operation}Response>"
            ),
        ),
        (_, Reply::Xml(inner)) => {
            let xmlns = query_xmlns(service);
            let result = if inner.is_empty() {
                format!("<{operation}Result/>")
            } else {
                format!("<{operation}Result>{inner}</{operation}Result>")
            };
            build(
                200,
                "text/xml",
                format!(
                    "<{operation}Response xmlns=\"{xmlns}\">{result}<ResponseMetadata><RequestId>{request_id}</RequestId></ResponseMetadata></{operation}Response>"
                ),
            )
        }
        (_, Reply::Json(status, value)) => build(status, "application/json", value.to_string()),
    };
    with_request_id(response, request_id)
}

/// Renders `error` in the error envelope of `service`'s protocol.
pub(crate) fn render_error(service: Service, error: &ApiError, request_id: &str) -> Response<Body> {
    let response = match service {
        Service::Ec2 => build(
            error.status,
            "text/xml;charset=UTF-8",
            format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error>{}{}</Error></Errors><RequestID>{request_id}</RequestID></Response>",
                element("Code", &error.code),
                element("Message", &error.message)
            ),
        ),
        Service::Eks => {
            let mut body: serde_json::Map<String, serde_json::Value> =
                error.fields.iter().cloned().collect();
            body.insert("message".to_owned(), error.message.clone().into());
            let mut response = build(
                error.status,
                "application/json",
                serde_json::Value::Object(body).to_string(),
            );
            if let Ok(value) = HeaderValue::from_str(&error.code) {
                response.headers_mut().insert("x-amzn-ErrorType", value);
            }
            response
        }
        _ => {
            let xmlns = query_xmlns(service);
            build(
                error.status,
                "text/xml",
                format!(
                    "<ErrorResponse xmlns=\"{xmlns}\"><Error>{}{}{}</Error><RequestId>{request_id}</RequestId></ErrorResponse>",
                    element("Type", error.fault),
                    element("Code", &error.code),
                    element("Message", &error.message)
                ),
            )
        }
    };
    with_request_id(response, request_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_lists_are_read_in_index_order() {
        let params = parse_form(b"A.member.2=b&A.member.1=a&B.1=x&B.10=z&B.2=y&Other=1");
        assert_eq!(query_list(&params, "A"), ["a", "b"]);
        assert_eq!(query_list(&params, "B"), ["x", "y", "z"]);
        assert!(query_list(&params, "C").is_empty());
    }

    #[test]
    fn percent_decoding_keeps_plus_and_decodes_escapes() {
        assert_eq!(
            percent_decode("arn%3Aaws%3Aiam%3A%3A1%3Arole%2Fa+b"),
            "arn:aws:iam::1:role/a+b"
        );
        assert_eq!(percent_decode("100%"), "100%");
    }

    #[test]
    fn uuids_have_the_version_4_shape() {
        let id = uuid_v4();
        assert_eq!(id.len(), 36);
        assert_eq!(&id[14..15], "4");
        assert_ne!(id, uuid_v4());
    }

    #[test]
    fn timestamps_have_millisecond_precision() {
        let at: jiff::Timestamp = "2022-09-25T13:58:42.123456Z".parse().expect("timestamp");
        assert_eq!(timestamp_millis(at), "2022-09-25T13:58:42.123Z");
    }
}
