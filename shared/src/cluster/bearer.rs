//! The `Authorization: Bearer` of every Kubernetes request: a cached EKS token that is
//! re-signed before it expires, and once more when the API server answers 401.
//!
//! kube's own auth layer only knows static tokens, files and exec plugins; signing in
//! process avoids a subprocess per refresh and keeps credentials in memory.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use http::{HeaderValue, Request, Response, StatusCode, header::AUTHORIZATION};
use kube::client::Body;
use tower::{BoxError, Service, ServiceExt as _};

use super::clock::Clock;
use super::error::ClusterAccessError;
use super::error::error_chain;
use super::token::{EksToken, sign_token};

/// A token is replaced this long before its 14-minute expiry, so a request never leaves
/// with a token about to lapse.
pub(crate) const REFRESH_MARGIN: Duration = Duration::from_secs(60);

/// Signs EKS tokens for one cluster and hands out the current one.
pub struct TokenSource {
    cluster_name: String,
    region: String,
    credentials: SharedCredentialsProvider,
    clock: Arc<dyn Clock>,
    current: tokio::sync::Mutex<Option<SignedHeader>>,
}

#[derive(Clone)]
struct SignedHeader {
    token: EksToken,
    header: HeaderValue,
}

impl std::fmt::Debug for TokenSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenSource")
            .field("cluster_name", &self.cluster_name)
            .field("region", &self.region)
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

impl TokenSource {
    pub fn new(
        cluster_name: impl Into<String>,
        region: impl Into<String>,
        credentials: SharedCredentialsProvider,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self {
            cluster_name: cluster_name.into(),
            region: region.into(),
            credentials,
            clock,
            current: tokio::sync::Mutex::new(None),
        }
    }

    /// The current token, signing a new one when there is none or it is within
    /// [`REFRESH_MARGIN`] of expiring.
    pub async fn token(&self) -> Result<EksToken, ClusterAccessError> {
        Ok(self.header().await?.token)
    }

    async fn header(&self) -> Result<SignedHeader, ClusterAccessError> {
        let mut current = self.current.lock().await;
        let now = self.clock.now();
        if let Some(signed) = current.as_ref() {
            let fresh = now + REFRESH_MARGIN < signed.token.expires_at()
                // A clock that went backwards would otherwise keep a token STS refuses.
                && now + REFRESH_MARGIN >= signed.token.signed_at();
            if fresh {
                return Ok(signed.clone());
            }
        }
        let signed = self.sign().await?;
        *current = Some(signed.clone());
        Ok(signed)
    }

    /// After the API server refused `rejected`: a freshly signed token (fresh credentials,
    /// current time), unless another request already replaced it.
    async fn after_rejection(
        &self,
        rejected: &HeaderValue,
    ) -> Result<SignedHeader, ClusterAccessError> {
        let mut current = self.current.lock().await;
        if let Some(signed) = current.as_ref()
            && signed.header != rejected
        {
            return Ok(signed.clone());
        }
        let signed = self.sign().await?;
        *current = Some(signed.clone());
        Ok(signed)
    }

    async fn sign(&self) -> Result<SignedHeader, ClusterAccessError> {
        let credentials = self.credentials.provide_credentials().await.map_err(|e| {
            ClusterAccessError::NoCredentials {
                reason: error_chain(&e),
            }
        })?;
        let token = sign_token(
            &credentials,
            &self.region,
            &self.cluster_name,
            self.clock.now(),
        )?;
        let mut header = HeaderValue::try_from(format!("Bearer {}", token.expose()))
            .map_err(|e| super::token::TokenError::Signing(e.to_string()))?;
        header.set_sensitive(true);
        tracing::debug!(
            cluster = %self.cluster_name,
            access_key_id = %credentials.access_key_id(),
            expires_at = %token.expiration_timestamp(),
            "signed a new EKS token"
        );
        Ok(SignedHeader { token, header })
    }
}

/// Adds the bearer token to each request and retries a 401 once with a new token.
#[derive(Clone)]
pub struct BearerAuth<S> {
    inner: S,
    tokens: Arc<TokenSource>,
}

impl<S> BearerAuth<S> {
    pub fn new(inner: S, tokens: Arc<TokenSource>) -> Self {
        Self { inner, tokens }
    }
}

type ResponseFuture<B> = Pin<Box<dyn Future<Output = Result<Response<B>, BoxError>> + Send>>;

impl<S, B> Service<Request<Body>> for BearerAuth<S>
where
    S: Service<Request<Body>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Send + 'static,
{
    type Response = Response<B>;
    type Error = BoxError;
    type Future = ResponseFuture<B>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Readiness of the inner service is awaited in `call`, on the clone that is used.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let tokens = self.tokens.clone();
        Box::pin(async move {
            let signed = tokens.header().await.map_err(BoxError::from)?;
            let retry = try_clone(&request);
            let response = send(&mut inner, with_token(request, &signed.header)).await?;
            if response.status() != StatusCode::UNAUTHORIZED {
                return Ok(response);
            }
            let Some(retry) = retry else {
                return Ok(response);
            };
            tracing::warn!(
                cluster = %tokens.cluster_name,
                "the API server refused the EKS token (401); retrying once with a newly signed token"
            );
            let fresh = tokens
                .after_rejection(&signed.header)
                .await
                .map_err(BoxError::from)?;
            drop(response);
            send(&mut inner, with_token(retry, &fresh.header)).await
        })
    }
}

async fn send<S, B>(inner: &mut S, request: Request<Body>) -> Result<Response<B>, BoxError>
where
    S: Service<Request<Body>, Response = Response<B>>,
    S::Error: Into<BoxError>,
{
    inner
        .ready()
        .await
        .map_err(Into::into)?
        .call(request)
        .await
        .map_err(Into::into)
}

fn with_token(mut request: Request<Body>, header: &HeaderValue) -> Request<Body> {
    request.headers_mut().insert(AUTHORIZATION, header.clone());
    request
}

/// A copy to resend; `None` for streaming bodies, which are sent once and not retried.
fn try_clone(request: &Request<Body>) -> Option<Request<Body>> {
    let body = request.body().try_clone()?;
    let mut copy = Request::new(body);
    *copy.method_mut() = request.method().clone();
    *copy.uri_mut() = request.uri().clone();
    *copy.version_mut() = request.version();
    *copy.headers_mut() = request.headers().clone();
    *copy.extensions_mut() = request.extensions().clone();
    Some(copy)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::Mutex;
    use std::time::SystemTime;

    use aws_credential_types::Credentials;

    use super::*;
    use crate::cluster::clock::ManualClock;

    /// What the fake API server saw: the Authorization header of each request.
    #[derive(Clone, Default)]
    struct Seen(Arc<Mutex<Vec<HeaderValue>>>);

    impl Seen {
        fn tokens(&self) -> Vec<HeaderValue> {
            self.0.lock().unwrap().clone()
        }
    }

    fn source(clock: &ManualClock) -> Arc<TokenSource> {
        let credentials = Credentials::new("AKIDTEST", "secret", Some("session".into()), None, "t");
        Arc::new(TokenSource::new(
            "ironman-2022",
            "eu-west-1",
            SharedCredentialsProvider::new(credentials),
            Arc::new(clock.clone()),
        ))
    }

    /// A service answering 401 to the first `rejections` requests (moving the clock a
    /// second, as time passes in reality) and 200 after.
    fn server(
        seen: Seen,
        clock: ManualClock,
        rejections: usize,
    ) -> impl Service<
        Request<Body>,
        Response = Response<String>,
        Error = BoxError,
        Future = impl Future<Output = Result<Response<String>, BoxError>> + Send,
    > + Clone
    + Send
    + 'static {
        tower::service_fn(move |request: Request<Body>| {
            let seen = seen.clone();
            let clock = clock.clone();
            async move {
                let header = request.headers().get(AUTHORIZATION).unwrap().clone();
                let count = {
                    let mut all = seen.0.lock().unwrap();
                    all.push(header);
                    all.len()
                };
                let status = if count <= rejections {
                    clock.advance(Duration::from_secs(1));
                    StatusCode::UNAUTHORIZED
                } else {
                    StatusCode::OK
                };
                let mut response = Response::new(String::new());
                *response.status_mut() = status;
                Ok::<_, BoxError>(response)
            }
        })
    }

    fn get() -> Request<Body> {
        Request::get("/version").body(Body::empty()).unwrap()
    }

    #[tokio::test]
    async fn adds_a_sensitive_bearer_header() {
        let clock = ManualClock::new(SystemTime::now());
        let seen = Seen::default();
        let mut auth = BearerAuth::new(server(seen.clone(), clock.clone(), 0), source(&clock));
        let response = auth.call(get()).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let header = &seen.tokens()[0];
        assert!(header.is_sensitive());
        assert!(header.to_str().unwrap().starts_with("Bearer k8s-aws-v1."));
        assert!(!format!("{header:?}").contains("k8s-aws-v1."));
    }

    #[tokio::test]
    async fn keeps_a_token_until_a_minute_before_expiry_then_signs_anew() {
        let clock = ManualClock::new(SystemTime::now());
        let seen = Seen::default();
        let mut auth = BearerAuth::new(server(seen.clone(), clock.clone(), 0), source(&clock));
        for _ in 0..=20 {
            auth.call(get()).await.unwrap();
            clock.advance(Duration::from_secs(60));
        }
        let tokens = seen.tokens();
        // Minutes 0..=12 share the first token; minute 13 is within the refresh margin.
        assert!(tokens[..13].iter().all(|t| *t == tokens[0]));
        assert_ne!(tokens[13], tokens[0]);
        assert!(tokens[13..].iter().all(|t| *t == tokens[13]));
    }

    #[tokio::test]
    async fn retries_a_401_once_with_a_new_token() {
        let clock = ManualClock::new(SystemTime::now());
        let seen = Seen::default();
        let mut auth = BearerAuth::new(server(seen.clone(), clock.clone(), 1), source(&clock));
        let response = auth.call(get()).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let tokens = seen.tokens();
        assert_eq!(tokens.len(), 2);
        assert_ne!(tokens[0], tokens[1]);
        // The new token is kept for later requests.
        auth.call(get()).await.unwrap();
        assert_eq!(seen.tokens()[2], tokens[1]);
    }

    #[tokio::test]
    async fn gives_up_after_one_retry() {
        let clock = ManualClock::new(SystemTime::now());
        let seen = Seen::default();
        let mut auth = BearerAuth::new(
            server(seen.clone(), clock.clone(), usize::MAX),
            source(&clock),
        );
        let response = auth.call(get()).await.unwrap();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(seen.tokens().len(), 2);
    }

    #[tokio::test]
    async fn missing_credentials_fail_the_request_with_an_operator_message() {
        let clock = ManualClock::new(SystemTime::now());
        let seen = Seen::default();
        let tokens = Arc::new(TokenSource::new(
            "c",
            "eu-west-1",
            SharedCredentialsProvider::new(NoCredentials),
            Arc::new(clock.clone()),
        ));
        let mut auth = BearerAuth::new(server(seen.clone(), clock.clone(), 0), tokens);
        let error = auth.call(get()).await.unwrap_err();
        let error = error.downcast::<ClusterAccessError>().unwrap();
        assert!(
            matches!(*error, ClusterAccessError::NoCredentials { .. }),
            "{error}"
        );
        assert!(seen.tokens().is_empty());
    }

    #[derive(Debug)]
    struct NoCredentials;

    impl ProvideCredentials for NoCredentials {
        fn provide_credentials<'a>(
            &'a self,
        ) -> aws_credential_types::provider::future::ProvideCredentials<'a>
        where
            Self: 'a,
        {
            aws_credential_types::provider::future::ProvideCredentials::ready(Err(
                aws_credential_types::provider::error::CredentialsError::not_loaded(
                    "no credentials in the chain",
                ),
            ))
        }
    }
}
