//! The `kube::Client` for a cluster: its CA only, the function's user agent, EKS tokens.

use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;
use http::header::USER_AGENT;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client as PooledClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::ConfigExt;
use tower::ServiceBuilder;
use tower::retry::RetryLayer;

use super::bearer::{BearerAuth, TokenSource};
use super::discovery::ClusterInfo;
use super::error::ClusterAccessError;
use super::server_retry::{ServerRetry, ThrottleRecord};

/// `open-node-manager/<version> (<function>)`: how the API server's audit log names us.
pub fn user_agent(function_name: &str) -> String {
    let function: String = function_name
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() && !matches!(c, '(' | ')') {
                c
            } else {
                '-'
            }
        })
        .collect();
    format!(
        "open-node-manager/{} ({function})",
        env!("CARGO_PKG_VERSION")
    )
}

/// `POST .../pods/<name>/eviction`: the one request whose 429 carries meaning.
fn is_eviction(uri: &http::Uri) -> bool {
    uri.path().ends_with("/eviction")
}

/// The longest one request may take, the retries of 429/503/504 included
/// ([`ServerRetry`]), unless it is a watch. Without it a brownout, or a
/// connection that stops answering (kube sets no read timeout), holds a call for minutes and
/// the caller's own deadlines (lease renewal, hand-over) cannot be kept; with it the caller
/// gets an error it already knows how to handle (transient: retried or handed over). A
/// request the server kept throttling until then fails as throttled, which a drain tries
/// again within its invocation ([`super::ThrottledRetries`]).
pub(crate) const REQUEST_TIME_BOUND: Duration = Duration::from_secs(10);

/// `?watch=true` (or `1`): a long-running request by design, bounded by its own
/// `timeoutSeconds` and by the caller.
fn is_watch(uri: &http::Uri) -> bool {
    uri.query().is_some_and(|query| {
        query
            .split('&')
            .any(|pair| pair == "watch=true" || pair == "watch=1")
    })
}

/// The connections to the API server: TLS with the cluster's CA only, HTTP/2 when the server
/// offers it over ALPN (kube-apiserver does), so every request and every watch of an
/// invocation share one connection instead of holding a TLS connection each; HTTP/1.1
/// otherwise.
fn connection_pool(
    config: &kube::Config,
) -> Result<PooledClient<HttpsConnector<HttpConnector>, kube::client::Body>, ClusterAccessError> {
    // The connector offers `h2` and `http/1.1` over ALPN itself (it refuses a config that
    // names protocols already).
    let tls = config
        .rustls_client_config()
        .map_err(ClusterAccessError::Client)?;
    let mut tcp = HttpConnector::new();
    tcp.enforce_http(false);
    tcp.set_nodelay(true);
    tcp.set_connect_timeout(config.connect_timeout);
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .wrap_connector(tcp);
    // A silent HTTP/2 connection (an API server replaced behind the endpoint) is found by its
    // missed pings within half a minute, not left to hold every watch of the invocation.
    Ok(PooledClient::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .http2_keep_alive_interval(Duration::from_secs(20))
        .http2_keep_alive_timeout(Duration::from_secs(10))
        .build(connector))
}

/// A `kube::Client` over `pool`: the cluster's base URI, the function's headers and, with
/// `retry`, the retry of 429/503/504 ([`ServerRetry`]: `Retry-After` as the floor, jitter
/// on top).
fn stack(
    config: &kube::Config,
    pool: PooledClient<HttpsConnector<HttpConnector>, kube::client::Body>,
    retry: bool,
) -> Result<kube::Client, ClusterAccessError> {
    let retry = retry.then(|| RetryLayer::new(ServerRetry::default()));
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(retry)
        .layer(
            config
                .extra_headers_layer()
                .map_err(ClusterAccessError::Client)?,
        )
        .map_err(tower::BoxError::from)
        .service(pool);
    Ok(kube::Client::new(service, "default"))
}

/// `request` with the empty query parts kube's request builder leaves (`…/nodes/n?`,
/// `…?&limit=500`) taken out, so the API server's audit log and access logs show the request
/// as written.
fn without_empty_query_parts<B>(mut request: http::Request<B>) -> http::Request<B> {
    let uri = request.uri();
    let Some(query) = uri.query() else {
        return request;
    };
    let tidy = query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .collect::<Vec<_>>()
        .join("&");
    let raw_has_question_mark = uri
        .path_and_query()
        .is_some_and(|pq| pq.as_str().contains('?'));
    if tidy == query && !(tidy.is_empty() && raw_has_question_mark) {
        return request;
    }
    let path_and_query = if tidy.is_empty() {
        uri.path().to_owned()
    } else {
        format!("{}?{tidy}", uri.path())
    };
    let mut parts = uri.clone().into_parts();
    match path_and_query.parse() {
        Ok(tidied) => parts.path_and_query = Some(tidied),
        Err(_) => return request,
    }
    if let Ok(tidied) = http::Uri::from_parts(parts) {
        *request.uri_mut() = tidied;
    }
    request
}

/// Sends every request over `transport` (with the retry of 429/503/504), evictions over
/// `eviction_transport` (without it), and ends every request but a watch after `bound`
/// ([`REQUEST_TIME_BOUND`]): with a [`Throttled`](super::server_retry::Throttled) error when the server kept asking it to try
/// again later until then, with a plain "no answer" otherwise.
fn bounded_send(
    transport: kube::Client,
    eviction_transport: kube::Client,
    bound: Duration,
) -> impl tower::Service<
    http::Request<kube::client::Body>,
    Response = http::Response<kube::client::Body>,
    Error = kube::Error,
    Future = impl std::future::Future<Output = Result<http::Response<kube::client::Body>, kube::Error>>
             + Send,
> + Clone
+ Send
+ 'static {
    tower::service_fn(move |request: http::Request<kube::client::Body>| {
        let mut request = without_empty_query_parts(request);
        let transport = if is_eviction(request.uri()) {
            eviction_transport.clone()
        } else {
            transport.clone()
        };
        let bounded = !is_watch(request.uri());
        let record = ThrottleRecord::default();
        request.extensions_mut().insert(record.clone());
        async move {
            if !bounded {
                return transport.send(request).await;
            }
            match tokio::time::timeout(bound, transport.send(request)).await {
                Ok(answer) => answer,
                Err(_) => Err(match record.throttled(bound) {
                    Some(throttled) => kube::Error::Service(Box::new(throttled)),
                    None => kube::Error::Service(
                        format!(
                            "no answer from the API server within {} s (its retries included)",
                            bound.as_secs_f64()
                        )
                        .into(),
                    ),
                }),
            }
        }
    })
}

/// Builds a client for `cluster` that authenticates with tokens from `tokens`.
///
/// Needs a Tokio runtime (the client's request queue runs on it).
pub(crate) fn build_client(
    cluster: &ClusterInfo,
    function_name: &str,
    tokens: Arc<TokenSource>,
) -> Result<kube::Client, ClusterAccessError> {
    let uri = cluster.endpoint_uri()?;
    let ca = cluster.ca_certificates()?;
    if uri.scheme_str() == Some("https") && ca.is_empty() {
        return Err(ClusterAccessError::InvalidCertificateAuthority {
            reason: "an https:// endpoint needs the cluster's CA".to_owned(),
        });
    }
    // kube builds its rustls config with the process-wide provider; ring is the one this
    // workspace compiles. Installing fails only when one is installed already: fine.
    let _ = rustls::crypto::ring::default_provider().install_default();

    let mut config = kube::Config::new(uri);
    // Only the cluster CA is trusted: the system roots are never consulted.
    config.root_cert = (!ca.is_empty()).then_some(ca);
    config.connect_timeout = Some(Duration::from_secs(10));
    let agent = HeaderValue::try_from(user_agent(function_name))
        .map_err(|e| ClusterAccessError::Client(kube::Error::Service(Box::new(e))))?;
    config.headers.push((USER_AGENT, agent));

    // One pool of connections to the API server, shared by two unauthenticated stacks (base
    // URI, user agent): one with the retry of 429/503/504, and one without it for
    // evictions, whose 429 is a PodDisruptionBudget refusal the drain must see, count, back
    // off from with jitter and name in its report, not a throttle to be hidden inside one call
    // for up to 10 attempts. Each stack is a `kube::Client`: its request queue makes it cheap to
    // clone, which the 401 retry needs.
    let pool = connection_pool(&config)?;
    let transport = stack(&config, pool.clone(), true)?;
    let eviction_transport = stack(&config, pool, false)?;
    let send = bounded_send(transport, eviction_transport, REQUEST_TIME_BOUND);
    Ok(kube::Client::new(BearerAuth::new(send, tokens), "default"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn only_watches_escape_the_request_time_bound() {
        let uri = |s: &str| s.parse::<http::Uri>().unwrap();
        assert!(is_watch(&uri(
            "https://k/api/v1/pods?fieldSelector=spec.nodeName%3Dn&watch=true&timeoutSeconds=290"
        )));
        assert!(is_watch(&uri("https://k/api/v1/nodes?watch=1")));
        assert!(!is_watch(&uri("https://k/api/v1/nodes?limit=500")));
        assert!(!is_watch(&uri("https://k/api/v1/nodes/n")));
        assert!(!is_watch(&uri("https://k/api/v1/pods?watch=false")));
    }

    #[test]
    fn empty_query_parts_are_taken_out() {
        let tidied = |s: &str| {
            let request = http::Request::get(s).body(()).unwrap();
            without_empty_query_parts(request).uri().to_string()
        };
        assert_eq!(
            tidied("https://k/api/v1/nodes/n?"),
            "https://k/api/v1/nodes/n"
        );
        assert_eq!(
            tidied("https://k/api/v1/pods?&limit=500&&labelSelector=a%3Db"),
            "https://k/api/v1/pods?limit=500&labelSelector=a%3Db"
        );
        assert_eq!(tidied("/api/v1/nodes?&"), "/api/v1/nodes");
        assert_eq!(
            tidied("https://k/api/v1/nodes?limit=500"),
            "https://k/api/v1/nodes?limit=500"
        );
        assert_eq!(tidied("https://k/api/v1/nodes"), "https://k/api/v1/nodes");
    }
}

/// The request time bound and the retry of "try again later" over an in-memory API server,
/// with a bound of 2.5 s instead of 10 (`Retry-After` counts whole seconds).
#[cfg(test)]
mod throttling_tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::{Arc, Mutex};

    use k8s_openapi::api::core::v1::Node;
    use kube::Api;
    use tokio::time::Instant;
    use tower::BoxError;
    use tower::retry::Retry;

    use super::*;
    use crate::cluster::{AfterFailure, ThrottledRetries, is_throttled};

    /// An API server that answers GETs of node `n` with `answers` in turn (a status and its
    /// `Retry-After`), then with the node; `None` never answers.
    fn server(answers: Vec<Option<(u16, u64)>>) -> (kube::Client, Arc<Mutex<Vec<Instant>>>) {
        let answers = Arc::new(Mutex::new(answers.into_iter()));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let fake = tower::service_fn({
            let seen = seen.clone();
            move |_request: http::Request<kube::client::Body>| {
                seen.lock().unwrap().push(Instant::now());
                let next = answers.lock().unwrap().next();
                async move {
                    let response = match next {
                        Some(None) => std::future::pending().await,
                        Some(Some((code, retry_after))) => http::Response::builder()
                            .status(code)
                            .header("Retry-After", retry_after.to_string())
                            .body(format!(
                                r#"{{"kind":"Status","apiVersion":"v1","status":"Failure","message":"too many requests","reason":"TooManyRequests","code":{code}}}"#
                            )),
                        None => http::Response::builder().status(200).body(
                            r#"{"kind":"Node","apiVersion":"v1","metadata":{"name":"n"}}"#
                                .to_owned(),
                        ),
                    };
                    Ok::<_, BoxError>(response.unwrap())
                }
            }
        });
        let transport = kube::Client::new(Retry::new(ServerRetry::default(), fake), "default");
        let send = bounded_send(transport.clone(), transport, BOUND);
        (kube::Client::new(send, "default"), seen)
    }

    const BOUND: Duration = Duration::from_millis(2500);

    /// kube-apiserver's answer to a priority level that keeps dropping requests: 429 with a
    /// `Retry-After` that doubles, past the request's bound.
    fn doubling_retry_after() -> Vec<Option<(u16, u64)>> {
        [1, 2, 4, 8, 16].map(|s| Some((429, s))).to_vec()
    }

    #[tokio::test]
    async fn a_request_throttled_past_its_bound_fails_as_throttled() {
        let (client, seen) = server(doubling_retry_after());
        let started = Instant::now();
        let error = Api::<Node>::all(client).get("n").await.unwrap_err();
        assert!(started.elapsed() >= BOUND, "{:?}", started.elapsed());
        assert!(is_throttled(&error), "{error}");
        assert!(error.to_string().contains("try again later"), "{error}");
        assert_eq!(seen.lock().unwrap().len(), 2, "1 s of wait, then 2 s");
    }

    #[tokio::test]
    async fn a_request_without_any_answer_is_not_throttled() {
        let (client, _) = server(vec![None]);
        let error = Api::<Node>::all(client).get("n").await.unwrap_err();
        assert!(!is_throttled(&error), "{error}");
        assert!(error.to_string().contains("no answer"), "{error}");
    }

    #[tokio::test]
    async fn a_real_answer_is_not_throttled() {
        let (client, _) = server(vec![Some((404, 0))]);
        let error = Api::<Node>::all(client).get("n").await.unwrap_err();
        assert!(!is_throttled(&error), "{error}");
        let mut retries = ThrottledRetries::until(Instant::now() + Duration::from_secs(60));
        assert_eq!(retries.after(&error).await, AfterFailure::NotThrottled);
        // Tried once, its answer returned.
        let (client, seen) = server(vec![Some((403, 0))]);
        let nodes = Api::<Node>::all(client);
        let tried = retries.retry(async || nodes.get("n").await).await;
        assert!(
            matches!(tried, Err(kube::Error::Api(ref s)) if s.code == 403),
            "{tried:?}"
        );
        assert_eq!(seen.lock().unwrap().len(), 1);
    }

    /// A step retried within its deadline gets through once the server lets it, never
    /// sooner than the server asked.
    #[tokio::test]
    async fn a_throttled_step_is_tried_again_within_its_deadline() {
        let (client, seen) = server(doubling_retry_after()[..2].to_vec());
        let nodes = Api::<Node>::all(client);
        let started = Instant::now();
        let mut retries = ThrottledRetries::until(started + Duration::from_secs(60));
        let node = retries.retry(async || nodes.get("n").await).await.unwrap();
        assert_eq!(node.unwrap().metadata.name.as_deref(), Some("n"));
        let seen = seen.lock().unwrap();
        // The second answer asked for 2 s, 1 s in, past the bound: the third try waits it out.
        assert_eq!(seen.len(), 3, "{seen:?}");
        assert!(seen[2] - seen[1] >= Duration::from_secs(2), "{seen:?}");
        assert!(
            started.elapsed() < Duration::from_secs(6),
            "{:?}",
            started.elapsed()
        );
    }

    /// When the next try would start past the deadline, the step stops at once.
    #[tokio::test]
    async fn a_throttled_step_stops_at_its_deadline() {
        let (client, _) = server(doubling_retry_after());
        let started = Instant::now();
        let mut retries = ThrottledRetries::until(started + Duration::from_secs(3));
        let nodes = Api::<Node>::all(client);
        let tried = retries.retry(async || nodes.get("n").await).await;
        assert!(matches!(tried, Ok(None)), "{tried:?}");
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "no wait when out of time"
        );
    }
}
