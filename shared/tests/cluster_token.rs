//! The token signer against botocore's output (tests/golden, made by make_eks_tokens.py) and
//! its speed.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant, SystemTime};

use aws_credential_types::Credentials;
use node_manager::cluster::token::{TOKEN_PREFIX, sign_token};
use serde::Deserialize;

#[derive(Deserialize)]
struct Golden {
    vectors: Vec<Vector>,
}

#[derive(Deserialize)]
struct Vector {
    name: String,
    region: String,
    cluster_name: String,
    access_key_id: String,
    secret_access_key: String,
    session_token: Option<String>,
    signed_at: String,
    token: String,
    expiration_timestamp: String,
}

fn golden() -> Golden {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/golden/eks_tokens.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn instant(rfc3339: &str) -> SystemTime {
    SystemTime::from(rfc3339.parse::<jiff::Timestamp>().unwrap())
}

#[test]
fn tokens_equal_botocore_byte_for_byte() {
    let golden = golden();
    assert!(golden.vectors.len() >= 5);
    let regions: Vec<&str> = golden.vectors.iter().map(|v| v.region.as_str()).collect();
    assert!(
        regions.iter().any(|r| r.starts_with("cn-")),
        "a China region"
    );
    assert!(golden.vectors.iter().any(|v| v.session_token.is_some()));
    assert!(golden.vectors.iter().any(|v| v.session_token.is_none()));

    for vector in &golden.vectors {
        let credentials = Credentials::new(
            &vector.access_key_id,
            &vector.secret_access_key,
            vector.session_token.clone(),
            None,
            "golden",
        );
        let token = sign_token(
            &credentials,
            &vector.region,
            &vector.cluster_name,
            instant(&vector.signed_at),
        )
        .unwrap();
        assert!(token.expose().starts_with(TOKEN_PREFIX));
        assert_eq!(token.expose(), vector.token, "{}", vector.name);
        assert_eq!(
            token.expiration_timestamp(),
            vector.expiration_timestamp,
            "{}",
            vector.name
        );
    }
}

#[test]
fn another_instant_or_cluster_gives_another_token() {
    let vector = &golden().vectors[1];
    let credentials = Credentials::new(
        &vector.access_key_id,
        &vector.secret_access_key,
        vector.session_token.clone(),
        None,
        "golden",
    );
    let at = instant(&vector.signed_at);
    let later = sign_token(
        &credentials,
        &vector.region,
        &vector.cluster_name,
        at + Duration::from_secs(1),
    )
    .unwrap();
    let other = sign_token(&credentials, &vector.region, "other", at).unwrap();
    assert_ne!(later.expose(), vector.token);
    assert_ne!(other.expose(), vector.token);
}

/// Signing is on the request path once every 13 minutes; it must stay far below a
/// millisecond. The bound here is generous because test builds are unoptimised.
#[test]
fn signing_takes_well_under_a_millisecond() {
    let credentials = Credentials::new(
        "ASIAIOSFODNN7EXAMPLE",
        "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        Some("IQoJb3JpZ2luX2VjEJr//////////wEaCWV1LXdlc3QtMSJHMEUCIQD".repeat(8)),
        None,
        "bench",
    );
    let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let mut samples: Vec<Duration> = (0..1000u64)
        .map(|i| {
            let at = start + Duration::from_secs(i);
            let began = Instant::now();
            let token = sign_token(&credentials, "eu-west-1", "ironman-2022", at).unwrap();
            let took = began.elapsed();
            assert!(token.expose().len() > 100);
            took
        })
        .collect();
    samples.sort();
    let median = samples[samples.len() / 2];
    let p99 = samples[samples.len() * 99 / 100];
    println!("EKS token signing: median {median:?}, p99 {p99:?} over 1000 signings");
    assert!(median < Duration::from_millis(2), "median {median:?}");
}
