//! Logs never carry a token, a secret key or a session token: everything the token signer
//! and the cluster client log at every level (dependencies included) is captured while they
//! sign, send, get refused and retry, then searched.
#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use aws_credential_types::Credentials;
use aws_credential_types::provider::SharedCredentialsProvider;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use node_manager::aws::in_memory::InMemoryEks;
use node_manager::cluster::{ClusterAccess, sign_token};
use node_manager_testkit::account::{FakeAccount, FakeCredentials};
use node_manager_testkit::token_verifier::verify_token;

const CLUSTER: &str = "ironman-2022";
const SECRET: &str = "very/secret+key=0123456789abcdefABCDEF";
const SESSION: &str = "session/token+with=odd&chars";

#[derive(Clone, Default)]
struct CapturedLogs(Arc<Mutex<Vec<u8>>>);

impl Write for CapturedLogs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl CapturedLogs {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

fn percent_encoded(value: &str) -> String {
    value
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

// One thread, so every task the client spawns logs to this test's subscriber.
#[tokio::test(flavor = "current_thread")]
async fn logs_hold_no_token_secret_key_or_session_token() {
    let logs = CapturedLogs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let account = FakeAccount::reference();
    let known = FakeCredentials {
        access_key_id: "ASIASECRETSTEST00001".into(),
        secret_access_key: SECRET.into(),
        session_token: Some(SESSION.into()),
        principal_arn: account.role_arn("node-manager"),
    };
    account.add_credentials(known.clone());
    let credentials = Credentials::new(
        &known.access_key_id,
        SECRET,
        Some(SESSION.to_owned()),
        None,
        "test",
    );

    // Signing on its own.
    let token = sign_token(&credentials, "eu-west-1", CLUSTER, SystemTime::now()).unwrap();
    tracing::info!(?token, "signed (Debug)");
    tracing::info!(%token, "signed (Display)");

    // A client that is refused once (401), retries, and succeeds.
    let refused = Arc::new(Mutex::new(false));
    let verifier_account = account.clone();
    let app = axum::Router::new().fallback(move |headers: HeaderMap| {
        let refused = refused.clone();
        let account = verifier_account.clone();
        async move {
            let token = headers
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .unwrap_or_default()
                .to_owned();
            let first = !std::mem::replace(&mut *refused.lock().unwrap(), true);
            if first || verify_token(&token, CLUSTER, &account, SystemTime::now()).is_err() {
                return StatusCode::UNAUTHORIZED.into_response();
            }
            axum::Json(serde_json::json!({
                "major": "1", "minor": "33", "gitVersion": "v1.33.0", "gitCommit": "0",
                "gitTreeState": "clean", "buildDate": "", "goVersion": "", "compiler": "",
                "platform": ""
            }))
            .into_response()
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });

    let sdk_config = aws_types::SdkConfig::builder()
        .region(aws_types::region::Region::new("eu-west-1"))
        .credentials_provider(SharedCredentialsProvider::new(credentials))
        .build();
    let access = ClusterAccess::new(&sdk_config, CLUSTER, "secrets-test")
        .with_settings(&[("CLUSTER_ENDPOINT", url.as_str())][..]);
    tracing::info!(?access, "cluster access");
    let client = access.client(&InMemoryEks::default()).await.unwrap();
    let version = client.apiserver_version().await.unwrap();
    assert_eq!(version.git_version, "v1.33.0");
    drop(client);

    let text = logs.text();
    assert!(
        text.contains("signed a new EKS token"),
        "capture works: {text}"
    );
    assert!(text.contains("retrying once"), "the 401 path ran: {text}");
    for secret in [
        "k8s-aws-v1.".to_owned(),
        token.expose()[11..60].to_owned(),
        SECRET.to_owned(),
        percent_encoded(SECRET),
        SESSION.to_owned(),
        percent_encoded(SESSION),
    ] {
        assert!(!text.contains(&secret), "logs contain {secret:?}:\n{text}");
    }
}
