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
//!
//! kube-apiserver doubles the `Retry-After` of a priority level that keeps dropping requests
//! (1, 2, 4, 8 s, up to 32), so a request can spend its whole time bound
//! ([`super::client::REQUEST_TIME_BOUND`]) being told to wait. Such a request ends with a
//! [`Throttled`] error, not a bare time-out: the server answered, it only asked for time.
//! A step of a longer piece of work (a drain) tries it again, within that work's own deadline,
//! with [`ThrottledRetries`]; a request that got a real answer is never tried again here.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{HeaderMap, Request, Response, StatusCode};
use kube::client::Body;
use tokio::time::Instant;
use tower::BoxError;
use tower::retry::Policy;

use crate::retry::{RetryPolicy, backoff_delay};

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
        request: &mut Request<Body>,
        result: &mut Result<Response<Res>, BoxError>,
    ) -> Option<Self::Future> {
        let response = result.as_ref().ok()?;
        if !asks_to_retry(response.status()) || self.retries + 1 >= API_SERVER.max_attempts {
            return None;
        }
        let delay = delay_before_retry(self.retries, retry_after(response.headers()));
        if let Some(record) = request.extensions().get::<ThrottleRecord>() {
            record.asked_to_wait(Instant::now() + delay);
        }
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

/// What the server asked of one request while it kept asking to be tried again, shared by
/// the request's copies (it travels in their extensions) and read when the request's time
/// bound ends.
#[derive(Debug, Clone, Default)]
pub(crate) struct ThrottleRecord(Arc<Mutex<Option<Asked>>>);

#[derive(Debug, Clone, Copy)]
struct Asked {
    answers: u32,
    /// When the last answer allowed the next try (its `Retry-After` and the jitter).
    not_before: Instant,
}

impl ThrottleRecord {
    fn asked_to_wait(&self, not_before: Instant) {
        let mut asked = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let answers = asked.map_or(0, |a| a.answers) + 1;
        *asked = Some(Asked {
            answers,
            not_before,
        });
    }

    /// The error of a request whose time bound (`bound`) ended while the server kept asking
    /// it to wait; `None` when the server never did (it did not answer at all).
    pub(crate) fn throttled(&self, bound: Duration) -> Option<Throttled> {
        let asked = (*self.0.lock().unwrap_or_else(|e| e.into_inner()))?;
        Some(Throttled {
            answers: asked.answers,
            not_before: asked.not_before,
            bound,
        })
    }
}

/// A request whose time bound ended while the API server kept answering "try again later"
/// (429, 503, 504): the server is throttling, not gone, and the request did nothing.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "the API server kept asking to try again later (429/503/504, {answers} time(s)) until the request's {} s time bound ended",
    bound.as_secs_f64()
)]
pub struct Throttled {
    answers: u32,
    not_before: Instant,
    bound: Duration,
}

/// When a call that failed only because the API server throttled it may be tried again;
/// `None` for any other failure (a real answer, no connection, no answer at all). Not for
/// evictions: their 429 is a PodDisruptionBudget's refusal, which the drain's eviction code
/// reads itself.
fn throttled_until(error: &kube::Error) -> Option<Instant> {
    match error {
        kube::Error::Api(status) => StatusCode::from_u16(status.code)
            .ok()
            .filter(|code| asks_to_retry(*code))
            .map(|_| Instant::now() + API_SERVER.delay(0)),
        kube::Error::Service(source) => source
            .downcast_ref::<Throttled>()
            .map(|throttled| throttled.not_before),
        _ => None,
    }
}

/// Whether `error` is the API server throttling the call (see [`Throttled`]).
pub fn is_throttled(error: &kube::Error) -> bool {
    throttled_until(error).is_some()
}

/// What to do with a step that failed, as [`ThrottledRetries::after`] decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterFailure {
    /// The server throttled it, and it was waited for: try the step again.
    TryAgain,
    /// The server throttled it, and the next try would start past the deadline: stop the
    /// work in time (hand it over).
    OutOfTime,
    /// Not throttling: the caller handles the error as before.
    NotThrottled,
}

/// The retries of one step the API server keeps throttling, until a deadline (an
/// invocation's hand-over time): each try waits what the server last asked, plus a jittered
/// backoff that grows with the tries. A step retried must be safe to repeat (a read, or a
/// write guarded by `resourceVersion` or idempotent).
#[derive(Debug, Clone)]
pub struct ThrottledRetries {
    until: Instant,
    retries: u32,
}

/// The jittered backoff between tries of a throttled step, on top of the server's own ask:
/// from this step ...
const STEP_BACKOFF_BASE: Duration = Duration::from_millis(200);
/// ... up to this one.
const STEP_BACKOFF_CAP: Duration = Duration::from_secs(2);

impl ThrottledRetries {
    pub fn until(until: Instant) -> Self {
        Self { until, retries: 0 }
    }

    /// Runs `step` until it succeeds (`Some`), fails for another reason than throttling
    /// (`Err`), or the next try would start past the deadline (`None`).
    pub async fn retry<T>(
        &mut self,
        mut step: impl AsyncFnMut() -> Result<T, kube::Error>,
    ) -> Result<Option<T>, kube::Error> {
        loop {
            let error = match step().await {
                Ok(done) => return Ok(Some(done)),
                Err(error) => error,
            };
            match self.after(&error).await {
                AfterFailure::TryAgain => {}
                AfterFailure::OutOfTime => return Ok(None),
                AfterFailure::NotThrottled => return Err(error),
            }
        }
    }

    /// After the step failed with `error`: waits and answers [`AfterFailure::TryAgain`] when
    /// the server throttled it and the next try starts before the deadline.
    pub async fn after(&mut self, error: &kube::Error) -> AfterFailure {
        let Some(not_before) = throttled_until(error) else {
            return AfterFailure::NotThrottled;
        };
        let next_try = not_before.max(Instant::now())
            + backoff_delay(self.retries, STEP_BACKOFF_BASE, STEP_BACKOFF_CAP);
        if next_try >= self.until {
            tracing::warn!(%error, retries = self.retries, "the API server kept throttling a step until the invocation's hand-over time");
            return AfterFailure::OutOfTime;
        }
        tracing::warn!(%error, retries = self.retries, retry_in_ms = u64::try_from(next_try.saturating_duration_since(Instant::now()).as_millis()).unwrap_or(u64::MAX), "the API server throttled a step; trying it again within the invocation");
        self.retries = self.retries.saturating_add(1);
        tokio::time::sleep_until(next_try).await;
        AfterFailure::TryAgain
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
