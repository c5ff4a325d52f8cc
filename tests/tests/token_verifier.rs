//! The test kit's token verifier (aws-iam-authenticator + STS checks) against tokens from
//! `node_manager::cluster::token`: ours pass, each kind of tampering fails its own check.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, SystemTime};

use aws_credential_types::Credentials;
use base64::Engine as _;
use node_manager::cluster::token::sign_token;
use node_manager_testkit::account::{FakeAccount, FakeCredentials};
use node_manager_testkit::token_verifier::{TokenRejection, verify_token};

const CLUSTER: &str = "ironman-2022";

fn signed_at() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_000_000)
}

fn sdk_credentials(known: &FakeCredentials) -> Credentials {
    Credentials::new(
        &known.access_key_id,
        &known.secret_access_key,
        known.session_token.clone(),
        None,
        "test",
    )
}

struct Setup {
    account: FakeAccount,
    role: FakeCredentials,
    token: String,
}

fn setup() -> Setup {
    let account = FakeAccount::reference();
    let role = account.add_role_credentials("node-manager");
    let token = sign_token(&sdk_credentials(&role), "eu-west-1", CLUSTER, signed_at())
        .unwrap()
        .expose()
        .to_owned();
    Setup {
        account,
        role,
        token,
    }
}

fn url_of(token: &str) -> String {
    let encoded = token.strip_prefix("k8s-aws-v1.").unwrap();
    String::from_utf8(
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(encoded)
            .unwrap(),
    )
    .unwrap()
}

fn token_of(url: &str) -> String {
    format!(
        "k8s-aws-v1.{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(url)
    )
}

/// The token with `from` replaced by `to` in its URL (which must contain `from`).
fn tampered(token: &str, from: &str, to: &str) -> String {
    let url = url_of(token);
    assert!(url.contains(from), "{from} not in {url}");
    token_of(&url.replacen(from, to, 1))
}

fn rejection(result: Result<impl std::fmt::Debug, TokenRejection>) -> String {
    match result {
        Ok(caller) => panic!("accepted: {caller:?}"),
        Err(TokenRejection(reason)) => reason,
    }
}

fn assert_rejected(setup: &Setup, token: &str, at: SystemTime, expected: &str) {
    let reason = rejection(verify_token(token, CLUSTER, &setup.account, at));
    assert!(
        reason.contains(expected),
        "expected {expected:?} in {reason:?}"
    );
}

#[test]
fn accepts_tokens_from_the_signer_and_names_the_caller() {
    let s = setup();
    let caller = verify_token(&s.token, CLUSTER, &s.account, signed_at()).unwrap();
    assert_eq!(caller.principal_arn, s.account.role_arn("node-manager"));
    assert_eq!(caller.access_key_id, s.role.access_key_id);
    // Valid until 15 minutes after signing, inclusive.
    let last = signed_at() + Duration::from_secs(15 * 60);
    assert!(verify_token(&s.token, CLUSTER, &s.account, last).is_ok());
}

#[test]
fn accepts_long_term_credentials_and_other_partitions() {
    let account = FakeAccount::new("222222222222", "cn-north-1");
    let user = FakeCredentials {
        access_key_id: "AKIACNUSER0000000001".into(),
        secret_access_key: "cn-secret/key+0123".into(),
        session_token: None,
        principal_arn: "arn:aws-cn:iam::222222222222:user/ops".into(),
    };
    account.add_credentials(user.clone());
    let token = sign_token(&sdk_credentials(&user), "cn-north-1", CLUSTER, signed_at()).unwrap();
    let caller = verify_token(token.expose(), CLUSTER, &account, signed_at()).unwrap();
    assert_eq!(caller.principal_arn, user.principal_arn);

    // A token for the aws partition's STS is not one this partition's authenticator accepts.
    let aws_token = sign_token(&sdk_credentials(&user), "eu-west-1", CLUSTER, signed_at()).unwrap();
    let reason = rejection(verify_token(
        aws_token.expose(),
        CLUSTER,
        &account,
        signed_at(),
    ));
    assert!(reason.contains("hostname"), "{reason}");
}

#[test]
fn rejects_oversized_tokens() {
    let s = setup();
    let huge = format!("{}{}", s.token, "A".repeat(4097 - s.token.len()));
    assert_rejected(&s, &huge, signed_at(), "too large");
}

#[test]
fn rejects_a_wrong_prefix() {
    let s = setup();
    let token = s.token.replacen("k8s-aws-v1.", "k8s-aws-v2.", 1);
    assert_rejected(&s, &token, signed_at(), "prefix");
}

#[test]
fn rejects_padding_and_standard_base64() {
    let s = setup();
    let padded = format!(
        "k8s-aws-v1.{}",
        base64::engine::general_purpose::URL_SAFE.encode(url_of(&s.token))
    );
    if padded.ends_with('=') {
        assert_rejected(&s, &padded, signed_at(), "base64url");
    }
    assert_rejected(&s, &format!("{}=", s.token), signed_at(), "base64url");
    let mut plus = s.token.clone();
    plus.insert(20, '+');
    assert_rejected(&s, &plus, signed_at(), "base64url");
}

#[test]
fn rejects_plain_http() {
    let s = setup();
    let token = tampered(&s.token, "https://", "http://");
    assert_rejected(&s, &token, signed_at(), "scheme");
}

#[test]
fn rejects_hosts_other_than_sts_of_the_partition() {
    let s = setup();
    for host in [
        "sts.eu-west-1.amazonaws.com.evil.example",
        "evil.example",
        "sts.cn-north-1.amazonaws.com.cn",
        "sts.eu-west-1.amazonaws.com:8443",
    ] {
        let token = tampered(&s.token, "sts.eu-west-1.amazonaws.com", host);
        let reason = rejection(verify_token(&token, CLUSTER, &s.account, signed_at()));
        assert!(
            reason.contains("hostname") || reason.contains("port"),
            "{host}: {reason}"
        );
    }
    // Another region's STS host is an STS host, but not the one the token was signed for.
    let token = tampered(&s.token, "sts.eu-west-1.", "sts.us-west-2.");
    assert_rejected(&s, &token, signed_at(), "does not match the STS host");
}

#[test]
fn rejects_another_path() {
    let s = setup();
    let token = tampered(&s.token, ".com/?", ".com/other?");
    assert_rejected(&s, &token, signed_at(), "path");
}

#[test]
fn rejects_query_keys_outside_the_allow_list() {
    let s = setup();
    let token = tampered(
        &s.token,
        "&X-Amz-Signature=",
        "&X-Amz-Foo=1&X-Amz-Signature=",
    );
    assert_rejected(&s, &token, signed_at(), "non-whitelisted");
}

#[test]
fn rejects_repeated_query_keys() {
    let s = setup();
    let token = tampered(
        &s.token,
        "&X-Amz-Signature=",
        "&action=GetCallerIdentity&X-Amz-Signature=",
    );
    assert_rejected(&s, &token, signed_at(), "more than once");
}

#[test]
fn rejects_another_action() {
    let s = setup();
    let token = tampered(&s.token, "Action=GetCallerIdentity", "Action=AssumeRole");
    assert_rejected(&s, &token, signed_at(), "action");
}

#[test]
fn rejects_tokens_that_do_not_sign_the_cluster_header() {
    let s = setup();
    let token = tampered(
        &s.token,
        "X-Amz-SignedHeaders=host%3Bx-k8s-aws-id",
        "X-Amz-SignedHeaders=host",
    );
    assert_rejected(&s, &token, signed_at(), "x-k8s-aws-id");
}

#[test]
fn rejects_expires_outside_zero_to_nine_hundred() {
    let s = setup();
    for value in ["901", "-1", "soon"] {
        let token = tampered(
            &s.token,
            "X-Amz-Expires=60",
            &format!("X-Amz-Expires={value}"),
        );
        assert_rejected(&s, &token, signed_at(), "X-Amz-Expires");
    }
    // In range but not what was signed: STS's signature check catches it.
    let token = tampered(&s.token, "X-Amz-Expires=60", "X-Amz-Expires=900");
    assert_rejected(&s, &token, signed_at(), "signature does not match");
}

#[test]
fn rejects_missing_malformed_old_and_future_dates() {
    let s = setup();
    let url = url_of(&s.token);
    let date_param = url
        .split('&')
        .find(|p| p.starts_with("X-Amz-Date="))
        .unwrap()
        .to_owned();
    let token = tampered(&s.token, &format!("&{date_param}"), "");
    assert_rejected(&s, &token, signed_at(), "must be present");
    let token = tampered(&s.token, &date_param, "X-Amz-Date=2026-11-23T11:30:00Z");
    assert_rejected(&s, &token, signed_at(), "YYYYMMDDTHHMMSSZ");

    let expired = signed_at() + Duration::from_secs(15 * 60 + 1);
    assert_rejected(&s, &s.token, expired, "expired");
    let early = signed_at() - Duration::from_secs(6 * 60);
    assert_rejected(&s, &s.token, early, "future");
}

#[test]
fn rejects_a_token_for_another_cluster() {
    let s = setup();
    let reason = rejection(verify_token(
        &s.token,
        "other-cluster",
        &s.account,
        signed_at(),
    ));
    assert!(reason.contains("signature does not match"), "{reason}");
}

#[test]
fn rejects_unknown_keys_wrong_secrets_and_foreign_session_tokens() {
    let s = setup();
    let stranger = FakeCredentials {
        access_key_id: "AKIASTRANGER00000001".into(),
        secret_access_key: "nope".into(),
        session_token: None,
        principal_arn: "arn:aws:iam::999999999999:user/stranger".into(),
    };
    let token = sign_token(
        &sdk_credentials(&stranger),
        "eu-west-1",
        CLUSTER,
        signed_at(),
    )
    .unwrap();
    assert_rejected(&s, token.expose(), signed_at(), "does not exist");

    let wrong_secret = FakeCredentials {
        secret_access_key: "guessed".into(),
        ..s.role.clone()
    };
    let token = sign_token(
        &sdk_credentials(&wrong_secret),
        "eu-west-1",
        CLUSTER,
        signed_at(),
    )
    .unwrap();
    assert_rejected(&s, token.expose(), signed_at(), "signature does not match");

    let other_session = FakeCredentials {
        session_token: Some("someone-elses-session".into()),
        ..s.role.clone()
    };
    let token = sign_token(
        &sdk_credentials(&other_session),
        "eu-west-1",
        CLUSTER,
        signed_at(),
    )
    .unwrap();
    assert_rejected(&s, token.expose(), signed_at(), "security token");
}

#[test]
fn rejects_altered_signed_values() {
    let s = setup();
    let token = tampered(&s.token, "Version=2011-06-15", "Version=2011-06-16");
    assert_rejected(&s, &token, signed_at(), "signature does not match");

    let url = url_of(&s.token);
    let last = url.chars().last().unwrap();
    let flipped = if last == '0' { '1' } else { '0' };
    let token = token_of(&format!("{}{flipped}", &url[..url.len() - 1]));
    assert_rejected(&s, &token, signed_at(), "signature does not match");

    let token = tampered(
        &s.token,
        "X-Amz-Algorithm=AWS4-HMAC-SHA256",
        "X-Amz-Algorithm=AWS4-HMAC-SHA512",
    );
    assert_rejected(&s, &token, signed_at(), "X-Amz-Algorithm");
}
