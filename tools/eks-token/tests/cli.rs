//! Runs the built `eks-token` binary as kubectl would and reads what it prints.
#![allow(clippy::unwrap_used)]

use std::process::{Command, Output};
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use eks_token::ExecCredential;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const ACCESS_KEY_ID: &str = "ASIAEKSTOKENCLITEST1";
const SECRET_ACCESS_KEY: &str = "cli/secret+key0123456789abcdefghijklmnop";
const SESSION_TOKEN: &str = "cli-session/token+value==";

/// The binary with static credentials and nothing from the machine's AWS configuration.
fn eks_token() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_eks-token"));
    for (name, _) in std::env::vars() {
        if name.starts_with("AWS_") || name == "KUBERNETES_EXEC_INFO" {
            command.env_remove(name);
        }
    }
    command
        .env("AWS_ACCESS_KEY_ID", ACCESS_KEY_ID)
        .env("AWS_SECRET_ACCESS_KEY", SECRET_ACCESS_KEY)
        .env("AWS_SESSION_TOKEN", SESSION_TOKEN)
        .env("AWS_REGION", "eu-west-1")
        .env("AWS_CONFIG_FILE", "/dev/null")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
        .env("AWS_EC2_METADATA_DISABLED", "true");
    command
}

fn presigned_url(credential: &ExecCredential) -> String {
    let encoded = credential
        .status
        .token
        .strip_prefix("k8s-aws-v1.")
        .expect("token prefix");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(encoded)
        .unwrap();
    String::from_utf8(bytes).unwrap()
}

fn parse(output: &Output) -> ExecCredential {
    assert!(
        output.status.success(),
        "eks-token failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8(output.stdout.clone()).unwrap();
    assert!(
        stdout.starts_with("{\n    \"kind\": \"ExecCredential\",\n"),
        "{stdout}"
    );
    assert!(stdout.ends_with("}\n\n"), "{stdout:?}");
    serde_json::from_str(&stdout).unwrap()
}

fn expiration(credential: &ExecCredential) -> SystemTime {
    SystemTime::from(
        credential
            .status
            .expiration_timestamp
            .parse::<jiff::Timestamp>()
            .unwrap(),
    )
}

#[test]
fn prints_an_exec_credential_like_aws_eks_get_token() {
    let before = SystemTime::now();
    let output = eks_token()
        .args(["--cluster-name", "ironman-2022"])
        .output()
        .unwrap();
    let after = SystemTime::now();
    let credential = parse(&output);

    assert_eq!(credential.kind, "ExecCredential");
    assert_eq!(
        credential.api_version,
        "client.authentication.k8s.io/v1beta1"
    );
    assert!(credential.spec.is_empty());
    let expires = expiration(&credential);
    let fourteen = Duration::from_secs(14 * 60);
    assert!(
        expires + Duration::from_secs(1) >= before + fourteen,
        "{expires:?}"
    );
    assert!(expires <= after + fourteen, "{expires:?}");

    let url = presigned_url(&credential);
    assert!(
        url.starts_with(
            "https://sts.eu-west-1.amazonaws.com/?Action=GetCallerIdentity&Version=2011-06-15&"
        ),
        "{url}"
    );
    assert!(url.contains(&format!("X-Amz-Credential={ACCESS_KEY_ID}%2F")));
    assert!(
        url.contains("&X-Amz-Security-Token=cli-session%2Ftoken%2Bvalue%3D%3D&X-Amz-Signature=")
    );
    assert!(!url.contains(SECRET_ACCESS_KEY) && !url.contains("cli%2Fsecret"));
}

#[test]
fn answers_in_the_api_version_kubectl_asks_for_and_the_region_given() {
    let output = eks_token()
        .args(["--cluster-name", "beijing", "--region", "cn-north-1"])
        .env(
            "KUBERNETES_EXEC_INFO",
            r#"{"kind":"ExecCredential","apiVersion":"client.authentication.k8s.io/v1","spec":{"interactive":false}}"#,
        )
        .output()
        .unwrap();
    let credential = parse(&output);
    assert_eq!(credential.api_version, "client.authentication.k8s.io/v1");
    assert!(
        presigned_url(&credential).starts_with("https://sts.cn-north-1.amazonaws.com.cn/?"),
        "{}",
        presigned_url(&credential)
    );
}

#[test]
fn fails_with_a_clear_message_without_a_region() {
    let output = eks_token()
        .env_remove("AWS_REGION")
        .args(["--cluster-name", "c"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(output.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--region"), "{stderr}");
}

/// `--role-arn` assumes the role (session name `EKSGetTokenAuth`) through STS and signs with
/// the role's credentials. STS here is a one-shot local HTTP server.
#[tokio::test(flavor = "multi_thread")]
async fn role_arn_signs_with_the_assumed_role() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let sts = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut request = Vec::new();
        let mut buffer = [0u8; 4096];
        loop {
            let n = socket.read(&mut buffer).await.unwrap();
            request.extend_from_slice(&buffer[..n]);
            let text = String::from_utf8_lossy(&request).to_string();
            if let Some(end) = text.find("\r\n\r\n") {
                let length: usize = text[..end]
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().parse().unwrap())
                    })
                    .unwrap_or(0);
                if request.len() >= end + 4 + length {
                    break;
                }
            }
            assert!(n > 0, "connection closed early");
        }
        let body = r#"<AssumeRoleResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <AssumeRoleResult>
    <AssumedRoleUser>
      <AssumedRoleId>AROAEXAMPLE:EKSGetTokenAuth</AssumedRoleId>
      <Arn>arn:aws:sts::111111111111:assumed-role/admin/EKSGetTokenAuth</Arn>
    </AssumedRoleUser>
    <Credentials>
      <AccessKeyId>ASIAASSUMEDROLEKEY01</AccessKeyId>
      <SecretAccessKey>assumedSecret</SecretAccessKey>
      <SessionToken>assumed-session</SessionToken>
      <Expiration>2099-01-01T00:00:00Z</Expiration>
    </Credentials>
  </AssumeRoleResult>
  <ResponseMetadata><RequestId>1</RequestId></ResponseMetadata>
</AssumeRoleResponse>"#;
        let response = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/xml\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        socket.write_all(response.as_bytes()).await.unwrap();
        String::from_utf8_lossy(&request).to_string()
    });

    let output = tokio::task::spawn_blocking(move || {
        eks_token()
            .env("AWS_ENDPOINT_URL_STS", endpoint)
            .args([
                "--cluster-name",
                "ironman-2022",
                "--role-arn",
                "arn:aws:iam::111111111111:role/admin",
            ])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let request = sts.await.unwrap();
    assert!(request.contains("Action=AssumeRole"), "{request}");
    assert!(
        request.contains("RoleSessionName=EKSGetTokenAuth"),
        "{request}"
    );
    assert!(
        request.contains("RoleArn=arn%3Aaws%3Aiam%3A%3A111111111111%3Arole%2Fadmin"),
        "{request}"
    );

    let url = presigned_url(&parse(&output));
    // The token still names the real regional STS host, not the local endpoint.
    assert!(
        url.starts_with("https://sts.eu-west-1.amazonaws.com/?"),
        "{url}"
    );
    assert!(
        url.contains("X-Amz-Credential=ASIAASSUMEDROLEKEY01%2F"),
        "{url}"
    );
    assert!(
        url.contains("X-Amz-Security-Token=assumed-session&"),
        "{url}"
    );
}
