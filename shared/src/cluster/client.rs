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
use super::server_retry::ServerRetry;

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
/// gets an error it already knows how to handle (transient: retried or handed over).
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
    let send = tower::service_fn(move |request: http::Request<kube::client::Body>| {
        let request = without_empty_query_parts(request);
        let transport = if is_eviction(request.uri()) {
            eviction_transport.clone()
        } else {
            transport.clone()
        };
        let bounded = !is_watch(request.uri());
        async move {
            if !bounded {
                return transport.send(request).await;
            }
            match tokio::time::timeout(REQUEST_TIME_BOUND, transport.send(request)).await {
                Ok(answer) => answer,
                Err(_) => Err(kube::Error::Service(
                    format!(
                        "no answer from the API server within {} s (its retries included)",
                        REQUEST_TIME_BOUND.as_secs()
                    )
                    .into(),
                )),
            }
        }
    });
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
