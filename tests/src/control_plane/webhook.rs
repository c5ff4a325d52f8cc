//! The TokenReview webhook that authenticates EKS tokens for the real kube-apiserver, as
//! aws-iam-authenticator does on EKS: the `k8s-aws-v1.` token is verified against the fake
//! account (the test kit plays STS, [`crate::token_verifier`]), then its principal is mapped by
//! an EKS access entry or, failing that, by `kube-system/aws-auth` as the real API server
//! holds it now (read on every review, so a mapping counts at once; the apiserver runs with
//! `--authentication-token-webhook-cache-ttl=0s`).
//!
//! kube-apiserver calls it over HTTPS (`authentication.k8s.io/v1` `TokenReview`, the
//! default of `--authentication-token-webhook-version`). Tokens are never logged.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use super::ControlPlaneError;
use crate::account::{AccessEntryLookup, FakeAccount, KubernetesIdentity};
use crate::aws::FakeEc2;
use crate::kube::authn::{aws_auth_identity, resolve_session_templates};
use crate::kube::tls::ClusterCertificates;
use crate::token_verifier::{VerifiedCaller, verify_token};

/// Who the webhook authenticates for and where it finds the mappings.
#[derive(Clone)]
pub struct WebhookSettings {
    pub cluster_name: String,
    pub account: FakeAccount,
    /// The fake EKS's access entries (consulted before `aws-auth`, as EKS does).
    pub access_entries: Option<Arc<dyn AccessEntryLookup>>,
    /// The fake EC2, which resolves `{{EC2PrivateDNSName}}` from the session name (an
    /// instance's role session is named after the instance id).
    pub ec2: Option<FakeEc2>,
}

/// One review the webhook answered (no token in it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Review {
    Authenticated {
        principal_arn: String,
        username: String,
        groups: Vec<String>,
    },
    Refused {
        reason: String,
    },
}

struct State {
    settings: WebhookSettings,
    /// An admin client of the real API server, to read `aws-auth`.
    client: kube::Client,
    reviews: Mutex<Vec<Review>>,
}

/// The running webhook. Dropping it stops serving.
pub struct TokenWebhook {
    url: String,
    ca_pem: String,
    state: Arc<State>,
    shutdown: tokio::sync::watch::Sender<bool>,
}

impl TokenWebhook {
    /// Serves on 127.0.0.1 (a free port); `client` reads `aws-auth` from the real server.
    pub async fn start(
        settings: WebhookSettings,
        client: kube::Client,
    ) -> Result<Self, ControlPlaneError> {
        let certificates =
            ClusterCertificates::generate().map_err(|e| ControlPlaneError::Setup {
                what: "the token webhook's certificate".into(),
                detail: e.to_string(),
            })?;
        let listener =
            TcpListener::bind("127.0.0.1:0")
                .await
                .map_err(|source| ControlPlaneError::Io {
                    what: "binding the token webhook".into(),
                    source,
                })?;
        let address = listener
            .local_addr()
            .map_err(|source| ControlPlaneError::Io {
                what: "binding the token webhook".into(),
                source,
            })?;
        let state = Arc::new(State {
            settings,
            client,
            reviews: Mutex::default(),
        });
        let (shutdown, receiver) = tokio::sync::watch::channel(false);
        let acceptor = tokio_rustls::TlsAcceptor::from(certificates.server_config.clone());
        tokio::spawn(accept_loop(listener, acceptor, state.clone(), receiver));
        Ok(Self {
            url: format!("https://{address}/authenticate"),
            ca_pem: certificates.ca_pem,
            state,
            shutdown,
        })
    }

    /// The kubeconfig file kube-apiserver's `--authentication-token-webhook-config-file` reads.
    pub fn kubeconfig_yaml(&self) -> String {
        use base64::Engine as _;
        let ca = base64::engine::general_purpose::STANDARD.encode(self.ca_pem.as_bytes());
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: token-webhook\n  cluster:\n    server: {}\n    certificate-authority-data: {ca}\nusers:\n- name: kube-apiserver\ncontexts:\n- name: webhook\n  context:\n    cluster: token-webhook\n    user: kube-apiserver\ncurrent-context: webhook\n",
            self.url
        )
    }

    /// Every review answered so far, oldest first.
    pub fn reviews(&self) -> Vec<Review> {
        self.state
            .reviews
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl Drop for TokenWebhook {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
    }
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    state: Arc<State>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        let (stream, _peer): (_, SocketAddr) = tokio::select! {
            _ = shutdown.changed() => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(_) => continue,
            },
        };
        let acceptor = acceptor.clone();
        let state = state.clone();
        tokio::spawn(async move {
            let Ok(stream) = acceptor.accept(stream).await else {
                return;
            };
            let service = service_fn(move |request| serve(state.clone(), request));
            // The certificates' TLS config offers HTTP/2 as kube-apiserver does, and
            // kube-apiserver's webhook client takes it: serve whichever was negotiated.
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn serve(
    state: Arc<State>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let body = match request.into_body().collect().await {
        Ok(body) => body.to_bytes(),
        Err(_) => return Ok(respond(StatusCode::BAD_REQUEST, json!({}))),
    };
    let Ok(review) = serde_json::from_slice::<Value>(&body) else {
        return Ok(respond(
            StatusCode::BAD_REQUEST,
            json!({"error": "not JSON"}),
        ));
    };
    let token = review["spec"]["token"].as_str().unwrap_or_default();
    let decision = state.review(token).await;
    let status = match &decision {
        Review::Authenticated {
            username, groups, ..
        } => json!({
            "authenticated": true,
            "user": {"username": username, "uid": uid(&state, token), "groups": groups},
        }),
        Review::Refused { reason } => json!({"authenticated": false, "error": reason}),
    };
    state
        .reviews
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(decision);
    Ok(respond(
        StatusCode::OK,
        json!({
            "apiVersion": review["apiVersion"].as_str().unwrap_or("authentication.k8s.io/v1"),
            "kind": "TokenReview",
            "status": status,
        }),
    ))
}

/// aws-iam-authenticator's uid: `aws-iam-authenticator:<account>:<user id>` (the access key
/// id stands in for the STS user id here).
fn uid(state: &State, token: &str) -> String {
    let key = verify_token(
        token,
        &state.settings.cluster_name,
        &state.settings.account,
        SystemTime::now(),
    )
    .map(|caller| caller.access_key_id)
    .unwrap_or_default();
    format!(
        "aws-iam-authenticator:{}:{key}",
        state.settings.account.account_id
    )
}

fn respond(status: StatusCode, body: Value) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

impl State {
    async fn review(&self, token: &str) -> Review {
        let settings = &self.settings;
        let caller = match verify_token(
            token,
            &settings.cluster_name,
            &settings.account,
            SystemTime::now(),
        ) {
            Ok(caller) => caller,
            Err(rejection) => {
                return Review::Refused {
                    reason: rejection.to_string(),
                };
            }
        };
        let identity = match settings.access_entries.as_ref().and_then(|lookup| {
            lookup.kubernetes_identity(&settings.cluster_name, &caller.principal_arn)
        }) {
            Some(identity) => Some(identity),
            None => self.aws_auth_identity(&caller).await,
        };
        let Some(identity) = identity else {
            return Review::Refused {
                reason: format!(
                    "principal {} is mapped neither by an access entry nor by aws-auth",
                    caller.principal_arn
                ),
            };
        };
        match resolve_session_templates(identity, &caller, settings.ec2.as_ref()) {
            Ok(KubernetesIdentity { username, groups }) => Review::Authenticated {
                principal_arn: caller.principal_arn,
                username,
                groups,
            },
            Err(reason) => Review::Refused { reason },
        }
    }

    async fn aws_auth_identity(&self, caller: &VerifiedCaller) -> Option<KubernetesIdentity> {
        let config_maps: kube::Api<ConfigMap> =
            kube::Api::namespaced(self.client.clone(), "kube-system");
        let config_map = config_maps.get_opt("aws-auth").await.ok()??;
        let data = serde_json::to_value(config_map.data?).ok()?;
        aws_auth_identity(&data, caller, &self.settings.account.account_id)
    }
}
