//! `node_manager::cluster::ClusterAccess` end to end: discovery (cached), the kube client's
//! token refresh and 401 retry against a server that verifies tokens like EKS, the user
//! agent, and TLS that trusts only the cluster CA.
#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use aws_credential_types::Credentials;
use aws_credential_types::provider::SharedCredentialsProvider;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use node_manager::aws::in_memory::InMemoryEks;
use node_manager::aws::{AuthenticationMode, AwsErrorKind, ClusterDescription};
use node_manager::cluster::{Clock as _, ClusterAccess, ClusterAccessError, ManualClock};
use node_manager_testkit::account::{FakeAccount, FakeCredentials};
use node_manager_testkit::token_verifier::verify_token;

const CLUSTER: &str = "ironman-2022";
const FUNCTION: &str = "terminating-hook";

fn sdk_config(credentials: &FakeCredentials, region: &str) -> aws_types::SdkConfig {
    aws_types::SdkConfig::builder()
        .region(aws_types::region::Region::new(region.to_owned()))
        .credentials_provider(SharedCredentialsProvider::new(Credentials::new(
            &credentials.access_key_id,
            &credentials.secret_access_key,
            credentials.session_token.clone(),
            None,
            "test",
        )))
        .build()
}

/// One request as the test API server saw it.
#[derive(Debug, Clone)]
struct Seen {
    token: String,
    user_agent: String,
    accepted: bool,
}

/// A tiny API server that authenticates like EKS (at the test clock's time) and answers
/// `/version`; it can be told to refuse the next requests with 401.
#[derive(Clone)]
struct TokenCheckingServer {
    account: FakeAccount,
    clock: ManualClock,
    seen: Arc<Mutex<Vec<Seen>>>,
    refuse_next: Arc<Mutex<usize>>,
}

async fn serve_version(
    State(server): State<TokenCheckingServer>,
    headers: HeaderMap,
) -> axum::response::Response {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let token = header("authorization")
        .strip_prefix("Bearer ")
        .unwrap_or_default()
        .to_owned();
    let verified = verify_token(&token, CLUSTER, &server.account, server.clock.now()).is_ok();
    let refuse = {
        let mut left = server.refuse_next.lock().unwrap();
        let refuse = *left > 0;
        *left = left.saturating_sub(1);
        refuse
    };
    let accepted = verified && !refuse;
    server.seen.lock().unwrap().push(Seen {
        token,
        user_agent: header("user-agent"),
        accepted,
    });
    if !accepted {
        // Time passes before the client tries again.
        server.clock.advance(Duration::from_secs(1));
        let status = serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "Unauthorized", "reason": "Unauthorized", "code": 401
        });
        return (StatusCode::UNAUTHORIZED, axum::Json(status)).into_response();
    }
    axum::Json(serde_json::json!({
        "major": "1", "minor": "33", "gitVersion": "v1.33.0-eks", "gitCommit": "0",
        "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24",
        "compiler": "gc", "platform": "linux/amd64"
    }))
    .into_response()
}

impl TokenCheckingServer {
    async fn start(account: FakeAccount, clock: ManualClock) -> (Self, String) {
        let server = Self {
            account,
            clock,
            seen: Arc::default(),
            refuse_next: Arc::default(),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let app = axum::Router::new()
            .fallback(serve_version)
            .with_state(server.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (server, url)
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

struct Harness {
    access: ClusterAccess,
    server: TokenCheckingServer,
    clock: ManualClock,
    eks: InMemoryEks,
}

async fn harness() -> Harness {
    let account = FakeAccount::reference();
    let role = account.add_role_credentials("node-manager");
    let clock = ManualClock::new(SystemTime::now());
    let (server, url) = TokenCheckingServer::start(account, clock.clone()).await;
    let access = ClusterAccess::new(&sdk_config(&role, "eu-west-1"), CLUSTER, FUNCTION)
        .with_settings(&[("CLUSTER_ENDPOINT", url.as_str())][..])
        .with_clock(Arc::new(clock.clone()));
    Harness {
        access,
        server,
        clock,
        eks: InMemoryEks::default(),
    }
}

#[tokio::test]
async fn a_client_used_for_twenty_minutes_sends_fresh_tokens_the_server_accepts() {
    let h = harness().await;
    for _ in 0..=20 {
        let client = h.access.client(&h.eks).await.unwrap();
        let version = client.apiserver_version().await.unwrap();
        assert_eq!(version.git_version, "v1.33.0-eks");
        h.clock.advance(Duration::from_secs(60));
    }
    let seen = h.server.seen();
    assert_eq!(seen.len(), 21, "no retries were needed");
    assert!(seen.iter().all(|s| s.accepted), "every token verified");
    let mut distinct: Vec<&str> = seen.iter().map(|s| s.token.as_str()).collect();
    distinct.dedup();
    assert!(distinct.len() >= 2, "{} distinct tokens", distinct.len());
    assert!(
        distinct.len() <= 3,
        "tokens are reused, not signed per request"
    );
    // The override means no DescribeCluster at all.
    assert!(h.eks.calls().is_empty(), "{:?}", h.eks.calls());
}

#[tokio::test]
async fn requests_name_the_project_and_the_function() {
    let h = harness().await;
    let client = h.access.client(&h.eks).await.unwrap();
    client.apiserver_version().await.unwrap();
    let expected = format!(
        "open-node-manager/{} ({FUNCTION})",
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(h.server.seen()[0].user_agent, expected);
}

#[tokio::test]
async fn a_401_is_retried_exactly_once_with_a_new_token() {
    let h = harness().await;
    *h.server.refuse_next.lock().unwrap() = 1;
    let client = h.access.client(&h.eks).await.unwrap();
    client.apiserver_version().await.unwrap();
    let seen = h.server.seen();
    assert_eq!(seen.len(), 2);
    assert!(!seen[0].accepted && seen[1].accepted);
    assert_ne!(seen[0].token, seen[1].token);
}

#[tokio::test]
async fn a_persistent_401_is_reported_as_unauthorized_after_one_retry() {
    let h = harness().await;
    *h.server.refuse_next.lock().unwrap() = usize::MAX;
    let client = h.access.client(&h.eks).await.unwrap();
    let error = client.apiserver_version().await.unwrap_err();
    assert_eq!(h.server.seen().len(), 2);
    let problem = h.access.access_problem(&error).unwrap();
    assert!(
        matches!(problem, ClusterAccessError::Unauthorized { .. }),
        "{problem}"
    );
    assert!(problem.to_string().contains("aws-auth"), "{problem}");
}

fn described(endpoint: &str, ca_data: &str) -> ClusterDescription {
    ClusterDescription {
        name: CLUSTER.into(),
        arn: format!("arn:aws:eks:eu-west-1:111111111111:cluster/{CLUSTER}"),
        endpoint: endpoint.into(),
        certificate_authority_data: ca_data.into(),
        authentication_mode: AuthenticationMode::ApiAndConfigMap,
    }
}

fn access_without_override() -> ClusterAccess {
    let account = FakeAccount::reference();
    let role = account.add_role_credentials("node-manager");
    ClusterAccess::new(&sdk_config(&role, "eu-west-1"), CLUSTER, FUNCTION)
        .with_settings(&[][..] as &[(&str, &str)])
}

#[tokio::test]
async fn discovery_calls_describe_cluster_once_per_environment() {
    let certs = node_manager_testkit::kube::tls::ClusterCertificates::generate().unwrap();
    let ca_data = base64_of(&certs.ca_pem);
    let eks = InMemoryEks::default();
    eks.add_cluster(described(
        "https://ABCDEF.gr7.eu-west-1.eks.amazonaws.com",
        &ca_data,
    ));
    let access = access_without_override();

    let info = access.cluster(&eks).await.unwrap();
    assert_eq!(
        info.endpoint,
        "https://ABCDEF.gr7.eu-west-1.eks.amazonaws.com"
    );
    assert_eq!(
        info.authentication_mode,
        AuthenticationMode::ApiAndConfigMap
    );
    access.cluster(&eks).await.unwrap();
    access.client(&eks).await.unwrap();
    access.client(&eks).await.unwrap();
    assert_eq!(eks.calls(), vec!["DescribeCluster"]);
}

#[tokio::test]
async fn discovery_failures_say_what_to_fix_and_are_not_cached() {
    let eks = InMemoryEks::default();
    let access = access_without_override();
    let error = access.cluster(&eks).await.unwrap_err();
    assert!(
        matches!(error, ClusterAccessError::ClusterNotFound { .. }),
        "{error}"
    );
    assert!(error.to_string().contains("CLUSTER_NAME"), "{error}");

    eks.add_cluster(described("http://127.0.0.1:1", ""));
    eks.faults
        .fail("DescribeCluster", AwsErrorKind::AccessDenied, 1);
    let error = access.cluster(&eks).await.unwrap_err();
    assert!(
        matches!(error, ClusterAccessError::AccessDenied { .. }),
        "{error}"
    );
    assert!(error.to_string().contains("eks:DescribeCluster"), "{error}");

    eks.faults
        .fail("DescribeCluster", AwsErrorKind::Transient, 1);
    let error = access.cluster(&eks).await.unwrap_err();
    assert!(error.is_retryable(), "{error}");

    assert_eq!(
        access.cluster(&eks).await.unwrap().endpoint,
        "http://127.0.0.1:1"
    );
}

#[tokio::test]
async fn a_missing_region_is_named() {
    let config = aws_types::SdkConfig::builder()
        .credentials_provider(SharedCredentialsProvider::new(Credentials::for_tests()))
        .build();
    let access = ClusterAccess::new(&config, CLUSTER, FUNCTION)
        .with_settings(&[("CLUSTER_ENDPOINT", "http://127.0.0.1:1")][..]);
    let Err(error) = access.client(&InMemoryEks::default()).await else {
        panic!("a client without a region");
    };
    assert!(
        matches!(error, ClusterAccessError::MissingRegion),
        "{error}"
    );
    assert!(error.to_string().contains("AWS_REGION"));
}

fn base64_of(text: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(text)
}

/// Over TLS to the test kit's fake API server: the client trusts the cluster CA it was
/// given (and nothing else), authenticates with an EKS token, and the audit log shows the
/// function's user agent.
#[tokio::test]
async fn reaches_the_fake_api_server_over_tls_with_only_the_cluster_ca() {
    let account = FakeAccount::reference();
    let role = account.add_role_credentials("node-manager");
    let server = node_manager_testkit::kube::FakeApiServer::builder()
        .cluster_name(CLUSTER)
        .account(account.clone())
        .start()
        .await
        .unwrap();
    // Map the role, as the cluster's aws-auth would.
    let admin = server.admin_client().await.unwrap();
    let config_maps: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(admin, "kube-system");
    let aws_auth: k8s_openapi::api::core::v1::ConfigMap =
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "aws-auth", "namespace": "kube-system"},
            "data": {"mapRoles": format!(
                "- rolearn: {}\n  username: node-manager\n  groups:\n  - system:masters\n",
                account.role_arn("node-manager")
            )}
        }))
        .unwrap();
    config_maps
        .create(&kube::api::PostParams::default(), &aws_auth)
        .await
        .unwrap();

    let access = ClusterAccess::new(&sdk_config(&role, "eu-west-1"), CLUSTER, FUNCTION)
        .with_settings(
            &[
                ("CLUSTER_ENDPOINT", server.url()),
                ("CLUSTER_CA_DATA", server.ca_data().as_str()),
            ][..],
        );
    let client = access.client(&InMemoryEks::default()).await.unwrap();
    client.apiserver_version().await.unwrap();
    let agent = format!(
        "open-node-manager/{} ({FUNCTION})",
        env!("CARGO_PKG_VERSION")
    );
    assert!(
        server
            .audit()
            .events()
            .iter()
            .any(|e| e.user_agent == agent),
        "{:?}",
        server.audit().events()
    );

    // Another CA: the server's certificate is not trusted, whatever the system trusts.
    let other = node_manager_testkit::kube::tls::ClusterCertificates::generate().unwrap();
    let distrusting = ClusterAccess::new(&sdk_config(&role, "eu-west-1"), CLUSTER, FUNCTION)
        .with_settings(
            &[
                ("CLUSTER_ENDPOINT", server.url()),
                ("CLUSTER_CA_DATA", base64_of(&other.ca_pem).as_str()),
            ][..],
        );
    let client = distrusting.client(&InMemoryEks::default()).await.unwrap();
    let error = client.apiserver_version().await.unwrap_err();
    let problem = distrusting.access_problem(&error).unwrap();
    assert!(
        matches!(problem, ClusterAccessError::Unreachable { .. }),
        "{problem}"
    );
}

#[tokio::test]
async fn an_unreachable_api_server_is_named_with_what_to_check() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let account = FakeAccount::reference();
    let role = account.add_role_credentials("node-manager");
    let access = ClusterAccess::new(&sdk_config(&role, "eu-west-1"), CLUSTER, FUNCTION)
        .with_settings(&[("CLUSTER_ENDPOINT", closed.as_str())][..]);
    let client = access.client(&InMemoryEks::default()).await.unwrap();
    let error = client.apiserver_version().await.unwrap_err();
    let problem = access.access_problem(&error).unwrap();
    assert!(
        matches!(problem, ClusterAccessError::Unreachable { .. }),
        "{problem}"
    );
    assert!(problem.to_string().contains("security groups"), "{problem}");
    assert!(problem.is_retryable());
}
