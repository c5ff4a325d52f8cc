//! Response bodies: JSON, plain text, and the `Status` of an error.

use std::convert::Infallible;

use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use serde_json::Value;

use crate::kube::status::ApiError;

pub(crate) type ResponseBody = BoxBody<Bytes, Infallible>;

/// The outcome of a handled request, before it becomes an HTTP response.
pub(super) enum Outcome {
    Json(u16, Value),
    Stream(Response<ResponseBody>),
}

fn full_body(bytes: impl Into<Bytes>) -> ResponseBody {
    Full::new(bytes.into()).boxed()
}

pub(super) fn json_response(code: u16, value: &Value) -> Response<ResponseBody> {
    let body = serde_json::to_vec(value).unwrap_or_default();
    let mut response = Response::new(full_body(body));
    *response.status_mut() =
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// `ok` in plain text, as the real server answers its health endpoints.
pub(super) fn health_response() -> Response<ResponseBody> {
    let mut response = Response::new(full_body("ok"));
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    response
}

/// API Priority and Fairness shedding a request, as kube-apiserver's filter answers it
/// (`http.Error`): 429, `Retry-After` in seconds, and a line of plain text.
pub(super) fn shed_response(retry_after_seconds: u64) -> Response<ResponseBody> {
    let mut response = Response::new(full_body("Too many requests, please try again later.\n"));
    *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::RETRY_AFTER, HeaderValue::from(retry_after_seconds));
    response
}

/// The error's `Status`, with `Retry-After` when the error asks the client to wait.
pub(super) fn error_response(error: &ApiError) -> Response<ResponseBody> {
    let mut response = json_response(error.code, &error.to_status());
    if let Some(seconds) = error.retry_after
        && let Ok(value) = HeaderValue::from_str(&seconds.to_string())
    {
        response.headers_mut().insert(header::RETRY_AFTER, value);
    }
    response
}
