//! The retry of the API server's "try again later" answers (429, 503, 504) under every
//! request but evictions and watches.
//!
//! kube's own policy waits exactly the `Retry-After` the server names. Under API Priority
//! and Fairness every client rejected in the same instant is told the same seconds, so
//! twenty drains that met one 429 together came back together, were rejected together, and
//! ran out of their time bound in lockstep (seen on a real kube-apiserver 1.36 with a 3-seat
//! priority level). Here the server's `Retry-After` is the floor, and the crate's one
//! jittered backoff ([`crate::retry::backoff_delay`]) is added on top, so callers spread out
//! and none retries before the server asked.

use std::time::Duration;

use http::{HeaderMap, Request, Response, StatusCode};
use kube::client::Body;
use tower::BoxError;
use tower::retry::Policy;

use crate::retry::RetryPolicy;

/// Ten tries within the request's time bound ([`super::client::REQUEST_TIME_BOUND`] ends
/// them sooner under a long brownout).
const API_SERVER: RetryPolicy = RetryPolicy {
    max_attempts: 10,
    base_delay: Duration::from_millis(100),
    max_delay: Duration::from_secs(2),
};

/// A server's `Retry-After` beyond this is read as this: the time bound ends the request
/// long before anyway.
const LONGEST_RETRY_AFTER: Duration = Duration::from_secs(30);

/// One request's retries (tower clones the policy for each request).
#[derive(Debug, Clone, Default)]
pub(crate) struct ServerRetry {
    retries: u32,
}

/// 429 Too Many Requests, 503 Service Unavailable, 504 Gateway Timeout: the server asks to
/// be tried again.
fn asks_to_retry(status: StatusCode) -> bool {
    matches!(
        status,
        StatusCode::TOO_MANY_REQUESTS
            | StatusCode::SERVICE_UNAVAILABLE
            | StatusCode::GATEWAY_TIMEOUT
    )
}

/// `Retry-After` in seconds (the form kube-apiserver sends); a date or garbage is no floor.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let seconds: u64 = headers
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(seconds).min(LONGEST_RETRY_AFTER))
}

/// The wait before retry number `retries` (0 for the first): the server's floor plus the
/// jittered backoff.
pub(crate) fn delay_before_retry(retries: u32, floor: Option<Duration>) -> Duration {
    floor.unwrap_or_default() + API_SERVER.delay(retries)
}

impl<Res> Policy<Request<Body>, Response<Res>, BoxError> for ServerRetry {
    type Future = tokio::time::Sleep;

    fn retry(
        &mut self,
        _request: &mut Request<Body>,
        result: &mut Result<Response<Res>, BoxError>,
    ) -> Option<Self::Future> {
        let response = result.as_ref().ok()?;
        if !asks_to_retry(response.status()) || self.retries + 1 >= API_SERVER.max_attempts {
            return None;
        }
        let delay = delay_before_retry(self.retries, retry_after(response.headers()));
        self.retries += 1;
        Some(tokio::time::sleep(delay))
    }

    fn clone_request(&mut self, request: &Request<Body>) -> Option<Request<Body>> {
        // A streamed body cannot be sent twice: such a request is not retried.
        let body = request.body().try_clone()?;
        let mut copy = Request::builder()
            .method(request.method().clone())
            .uri(request.uri().clone())
            .version(request.version())
            .body(body)
            .ok()?;
        *copy.headers_mut() = request.headers().clone();
        *copy.extensions_mut() = request.extensions().clone();
        Some(copy)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::collections::BTreeSet;

    use super::*;

    fn answer(status: u16, retry_after: Option<&str>) -> Result<Response<()>, BoxError> {
        let mut response = Response::builder().status(status);
        if let Some(value) = retry_after {
            response = response.header("Retry-After", value);
        }
        Ok(response.body(()).unwrap())
    }

    fn request() -> Request<Body> {
        Request::get("/api/v1/nodes/a").body(Body::empty()).unwrap()
    }

    #[tokio::test]
    async fn retries_what_the_server_asks_to_and_nothing_else() {
        for (status, retried) in [
            (429, true),
            (503, true),
            (504, true),
            (500, false),
            (409, false),
            (200, false),
        ] {
            let mut policy = ServerRetry::default();
            let decided = policy.retry(&mut request(), &mut answer(status, None));
            assert_eq!(decided.is_some(), retried, "status {status}");
        }
        let mut gone: Result<Response<()>, BoxError> = Err("connection reset".into());
        assert!(
            ServerRetry::default()
                .retry(&mut request(), &mut gone)
                .is_none()
        );
    }

    #[tokio::test]
    async fn stops_after_its_attempts() {
        let mut policy = ServerRetry::default();
        let mut retries = 0;
        while policy
            .retry(&mut request(), &mut answer(429, Some("1")))
            .is_some()
        {
            retries += 1;
            assert!(retries < 100, "never stops");
        }
        assert_eq!(retries, API_SERVER.max_attempts - 1);
    }

    #[test]
    fn never_earlier_than_the_server_asked_and_spread_beyond_it() {
        let floor = retry_after(&answer(429, Some("1")).unwrap().headers().clone());
        assert_eq!(floor, Some(Duration::from_secs(1)));
        // Twenty clients told "1 s" at the same instant.
        let delays: Vec<Duration> = (0..20).map(|_| delay_before_retry(0, floor)).collect();
        assert!(
            delays.iter().all(|d| *d >= Duration::from_secs(1)),
            "{delays:?}"
        );
        assert!(
            delays
                .iter()
                .all(|d| *d <= Duration::from_secs(1) + API_SERVER.base_delay),
            "{delays:?}"
        );
        let distinct: BTreeSet<Duration> = delays.into_iter().collect();
        assert!(
            distinct.len() > 10,
            "twenty clients retry in lockstep: {distinct:?}"
        );
    }

    #[test]
    fn a_bad_or_huge_retry_after_is_no_floor_or_a_bounded_one() {
        let floor = |value| retry_after(&answer(429, Some(value)).unwrap().headers().clone());
        assert_eq!(floor("Wed, 21 Oct 2026 07:28:00 GMT"), None);
        assert_eq!(floor("-1"), None);
        assert_eq!(floor("86400"), Some(LONGEST_RETRY_AFTER));
    }

    #[test]
    fn a_retried_request_keeps_its_method_uri_headers_and_body() {
        let original = Request::post("/api/v1/namespaces/a/pods")
            .header("content-type", "application/json")
            .body(Body::from(b"{}".to_vec()))
            .unwrap();
        let copy = Policy::<Request<Body>, Response<()>, BoxError>::clone_request(
            &mut ServerRetry::default(),
            &original,
        )
        .unwrap();
        assert_eq!(copy.method(), original.method());
        assert_eq!(copy.uri(), original.uri());
        assert_eq!(copy.headers(), original.headers());
    }
}
