//! The `aws-auth` read-merge-write loop against the in-memory store: creation, races,
//! retries, preservation of everything that is not ours.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::ObjectMeta;
use node_manager::nodegroup_auth::aws_auth::*;
use node_manager::nodegroup_auth::in_memory::InMemoryAwsAuthStore;
use node_manager::nodegroup_auth::role_mapping::{MapRoles, NODE_USERNAME, NodeOs};
use node_manager::retry::RetryPolicy;

const ROLE: &str = "arn:aws:iam::111111111111:role/node";

fn fast() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 8,
        base_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(5),
    }
}

fn aws_auth(data: &[(&str, &str)]) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(AWS_AUTH_NAME.into()),
            namespace: Some(AWS_AUTH_NAMESPACE.into()),
            ..ObjectMeta::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
        ),
        ..ConfigMap::default()
    }
}

fn mappings(store: &InMemoryAwsAuthStore) -> MapRoles {
    MapRoles::parse(store.map_roles().as_deref()).unwrap()
}

fn count_for(store: &InMemoryAwsAuthStore, role: &str) -> usize {
    mappings(store)
        .mappings()
        .iter()
        .filter(|m| m.role_arn.eq_ignore_ascii_case(role))
        .count()
}

#[tokio::test]
async fn creates_the_config_map_when_absent() {
    let store = InMemoryAwsAuthStore::new();
    let editor = AwsAuthEditor::new(store.clone(), fast());
    let EditOutcome::Written(written) = editor
        .grant(ROLE, NodeOs::Linux.required_groups())
        .await
        .unwrap()
    else {
        panic!("expected a write");
    };
    assert!(written.created);
    let cm = store.current().unwrap();
    assert_eq!(cm.metadata.name.as_deref(), Some("aws-auth"));
    assert_eq!(cm.metadata.namespace.as_deref(), Some("kube-system"));
    let (_, m) = mappings(&store)
        .effective(ROLE)
        .map(|(i, m)| (i, m.clone()))
        .unwrap();
    assert_eq!(m.username, NODE_USERNAME);
    assert_eq!(m.groups, ["system:bootstrappers", "system:nodes"]);
    assert_eq!(written.new_sha256, sha256_hex(&store.map_roles().unwrap()));
}

#[tokio::test]
async fn losing_the_creation_race_merges_into_the_winner() {
    let store = InMemoryAwsAuthStore::new();
    let other =
        "- rolearn: arn:aws:iam::111111111111:role/other\n  username: other\n  groups: [team]\n";
    store.race_next_write_with(aws_auth(&[("mapRoles", other), ("mapUsers", "[]")]));
    let editor = AwsAuthEditor::new(store.clone(), fast());
    let EditOutcome::Written(written) = editor
        .grant(ROLE, NodeOs::Linux.required_groups())
        .await
        .unwrap()
    else {
        panic!("expected a write");
    };
    assert!(!written.created, "the retry updates the winner's object");
    assert_eq!(written.conflicts_retried, 1);
    let text = store.map_roles().unwrap();
    assert!(text.starts_with(other), "{text}");
    assert_eq!(count_for(&store, ROLE), 1);
    assert_eq!(store.current().unwrap().data.unwrap()["mapUsers"], "[]");
}

#[tokio::test]
async fn no_map_roles_key_and_every_other_key_byte_identical() {
    let map_users = "- userarn: arn:aws:iam::111111111111:user/alice\n  username: alice   # the admin\n  groups:\n    - system:masters\n";
    let map_accounts = "  - \"111111111111\"\n";
    let mut cm = aws_auth(&[
        ("mapUsers", map_users),
        ("mapAccounts", map_accounts),
        ("other", "x: {y: 1}"),
    ]);
    cm.metadata.labels = Some(BTreeMap::from([(
        "app.kubernetes.io/managed-by".into(),
        "eksctl".into(),
    )]));
    cm.metadata.annotations = Some(BTreeMap::from([("note".into(), "keep me".into())]));
    cm.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "Namespace".into(),
        name: "kube-system".into(),
        uid: "1234".into(),
        ..OwnerReference::default()
    }]);
    let before = cm.clone();
    let store = InMemoryAwsAuthStore::with(cm);
    let editor = AwsAuthEditor::new(store.clone(), fast());
    assert!(matches!(
        editor
            .grant(ROLE, NodeOs::Linux.required_groups())
            .await
            .unwrap(),
        EditOutcome::Written(_)
    ));
    let after = store.current().unwrap();
    let data = after.data.clone().unwrap();
    assert_eq!(data["mapUsers"], map_users);
    assert_eq!(data["mapAccounts"], map_accounts);
    assert_eq!(data["other"], "x: {y: 1}");
    assert_eq!(data.len(), 4);
    assert_eq!(after.metadata.labels, before.metadata.labels);
    assert_eq!(after.metadata.annotations, before.metadata.annotations);
    assert_eq!(
        after.metadata.owner_references,
        before.metadata.owner_references
    );
    assert_eq!(count_for(&store, ROLE), 1);
}

#[tokio::test]
async fn second_delivery_is_a_no_op() {
    let store = InMemoryAwsAuthStore::new();
    let editor = AwsAuthEditor::new(store.clone(), fast());
    editor
        .grant(ROLE, NodeOs::Linux.required_groups())
        .await
        .unwrap();
    let version = store.resource_version();
    let writes = store.writes();
    assert_eq!(
        editor
            .grant(ROLE, NodeOs::Linux.required_groups())
            .await
            .unwrap(),
        EditOutcome::Unchanged
    );
    assert_eq!(store.writes(), writes, "no PUT");
    assert_eq!(store.resource_version(), version);
}

#[tokio::test]
async fn malformed_map_roles_writes_nothing() {
    let broken = "- rolearn: arn:aws:iam::111111111111:role/a\n  username: a\n groups: [team]\n";
    let store = InMemoryAwsAuthStore::with(aws_auth(&[("mapRoles", broken)]));
    let editor = AwsAuthEditor::new(store.clone(), fast());
    let err = editor
        .grant(ROLE, NodeOs::Linux.required_groups())
        .await
        .unwrap_err();
    assert!(matches!(err, AwsAuthError::MapRoles(_)), "{err}");
    assert!(err.to_string().contains("nothing was written"));
    assert_eq!(store.writes(), 0);
    assert_eq!(store.map_roles().unwrap(), broken);
}

#[tokio::test]
async fn conflicts_on_write_are_retried_with_a_fresh_read() {
    let store = InMemoryAwsAuthStore::with(aws_auth(&[("mapRoles", "")]));
    store.fail_replace(StoreError::Conflict, 2);
    let editor = AwsAuthEditor::new(store.clone(), fast());
    let EditOutcome::Written(written) = editor
        .grant(ROLE, NodeOs::Linux.required_groups())
        .await
        .unwrap()
    else {
        panic!("expected a write");
    };
    assert_eq!(written.conflicts_retried, 2);
    assert_eq!(store.gets(), 3, "one read per attempt");
    assert_eq!(count_for(&store, ROLE), 1);
}

#[tokio::test]
async fn a_real_concurrent_write_is_merged_not_overwritten() {
    let store = InMemoryAwsAuthStore::with(aws_auth(&[("mapRoles", "")]));
    let theirs =
        "- rolearn: arn:aws:iam::111111111111:role/theirs\n  username: theirs\n  groups: [team]\n";
    store.race_next_write_with(aws_auth(&[("mapRoles", theirs)]));
    let editor = AwsAuthEditor::new(store.clone(), fast());
    editor
        .grant(ROLE, NodeOs::Linux.required_groups())
        .await
        .unwrap();
    assert_eq!(
        count_for(&store, "arn:aws:iam::111111111111:role/theirs"),
        1
    );
    assert_eq!(count_for(&store, ROLE), 1);
}

#[tokio::test]
async fn retries_exhausted_is_an_error_and_leaves_no_partial_state() {
    let original = "- rolearn: arn:aws:iam::111111111111:role/a\n  username: a\n  groups: [team]\n";
    let store = InMemoryAwsAuthStore::with(aws_auth(&[("mapRoles", original)]));
    store.fail_replace(StoreError::Conflict, 100);
    let editor = AwsAuthEditor::new(
        store.clone(),
        RetryPolicy {
            max_attempts: 3,
            ..fast()
        },
    );
    let err = editor
        .grant(ROLE, NodeOs::Linux.required_groups())
        .await
        .unwrap_err();
    assert!(
        matches!(err, AwsAuthError::RetriesExhausted { attempts: 3 }),
        "{err}"
    );
    assert_eq!(store.map_roles().unwrap(), original);
    assert_eq!(store.resource_version().as_deref(), Some("1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_concurrent_creates_for_different_roles_all_land_once() {
    let store = InMemoryAwsAuthStore::new();
    // On top of the real races between the twenty writers.
    store.fail_replace(StoreError::Conflict, 5);
    store.fail_create(StoreError::AlreadyExists, 1);
    let policy = RetryPolicy {
        max_attempts: 60,
        base_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(20),
    };
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let editor = AwsAuthEditor::new(store.clone(), policy);
            tokio::spawn(async move {
                let role = format!("arn:aws:iam::111111111111:role/node-{i}");
                editor.grant(&role, NodeOs::Linux.required_groups()).await
            })
        })
        .collect();
    let mut retried = 0;
    for task in tasks {
        match task.await.unwrap().unwrap() {
            EditOutcome::Written(w) => retried += w.conflicts_retried,
            other => panic!("expected a write, got {other:?}"),
        }
    }
    for i in 0..20 {
        assert_eq!(
            count_for(&store, &format!("arn:aws:iam::111111111111:role/node-{i}")),
            1,
            "node-{i}"
        );
    }
    assert_eq!(mappings(&store).mappings().len(), 20);
    assert!(retried >= 6, "injected faults were retried ({retried})");
}

#[tokio::test]
async fn immutable_config_map_is_an_error() {
    let mut cm = aws_auth(&[("mapRoles", "")]);
    cm.immutable = Some(true);
    let store = InMemoryAwsAuthStore::with(cm);
    let editor = AwsAuthEditor::new(store.clone(), fast());
    assert!(matches!(
        editor.grant(ROLE, NodeOs::Linux.required_groups()).await,
        Err(AwsAuthError::Immutable)
    ));
    assert_eq!(store.writes(), 0);
}

#[tokio::test]
async fn revoke_never_creates_and_removes_only_ours() {
    let store = InMemoryAwsAuthStore::new();
    let editor = AwsAuthEditor::new(store.clone(), fast());
    assert_eq!(editor.revoke(ROLE).await.unwrap(), EditOutcome::Unchanged);
    assert!(store.current().is_none());

    let text = "- rolearn: arn:aws:iam::111111111111:role/a\n  username: a\n  groups: [team]\n- rolearn: arn:aws:iam::111111111111:role/node\n  username: system:node:{{EC2PrivateDNSName}}\n  groups: [system:bootstrappers, system:nodes]\n";
    store.put(aws_auth(&[("mapRoles", text)]));
    assert!(matches!(
        editor.revoke(ROLE).await.unwrap(),
        EditOutcome::Written(_)
    ));
    assert_eq!(count_for(&store, ROLE), 0);
    assert_eq!(count_for(&store, "arn:aws:iam::111111111111:role/a"), 1);
}

#[tokio::test]
async fn a_conflicting_entry_is_reported_and_not_written() {
    let text = "- rolearn: arn:aws:iam::111111111111:role/node\n  username: admin\n  groups: [system:masters]\n";
    let store = InMemoryAwsAuthStore::with(aws_auth(&[("mapRoles", text)]));
    let editor = AwsAuthEditor::new(store.clone(), fast());
    assert!(matches!(
        editor
            .grant(ROLE, NodeOs::Linux.required_groups())
            .await
            .unwrap(),
        EditOutcome::Conflict(_)
    ));
    assert_eq!(store.writes(), 0);
    assert_eq!(store.map_roles().unwrap(), text);
}
