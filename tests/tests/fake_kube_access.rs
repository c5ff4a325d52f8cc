//! Authentication, RBAC authorization, the audit log and fault injection of the fake API server.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams};
use node_manager_testkit::fixtures;
use node_manager_testkit::kube::{FakeApiServer, FaultAction, FaultRule, SimulationTimings};
use serde_json::json;

fn status_of(error: kube::Error) -> kube::core::Status {
    match error {
        kube::Error::Api(status) => *status,
        other => panic!("expected an API error, got {other:?}"),
    }
}

async fn server() -> FakeApiServer {
    let server = FakeApiServer::builder()
        .simulation(SimulationTimings::disabled())
        .start()
        .await
        .unwrap();
    server.store().create(&fixtures::ready_node("n1")).unwrap();
    server
}

const NODE_READER: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: node-reader
rules:
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["get", "list", "watch"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: node-reader
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: node-reader
subjects:
- kind: Group
  name: readers
  apiGroup: rbac.authorization.k8s.io
"#;

#[tokio::test]
async fn unknown_tokens_get_401() {
    let server = server().await;
    let client = server.client_with_token("k8s-aws-v1.bogus").await.unwrap();
    let nodes: Api<Node> = Api::all(client);
    let error = status_of(nodes.list(&ListParams::default()).await.unwrap_err());
    assert_eq!(error.code, 401);
    assert_eq!(error.reason, "Unauthorized");
    assert_eq!(error.message, "Unauthorized");
    let audited = server.audit().filter(|e| e.code() == 401);
    assert_eq!(audited.len(), 1);
    assert_eq!(audited[0].verb, "list");
}

#[tokio::test]
async fn rbac_from_the_store_allows_and_forbids_with_the_real_message() {
    let server = server().await;
    server.store().apply_yaml(NODE_READER).unwrap();
    let token = server.add_static_token("alice", &["readers"]);
    let client = server.client_with_token(&token).await.unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    assert_eq!(
        nodes
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    let refused = status_of(
        nodes
            .patch(
                "n1",
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": { "unschedulable": true } })),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(refused.code, 403);
    assert_eq!(refused.reason, "Forbidden");
    assert_eq!(
        refused.message,
        "nodes \"n1\" is forbidden: User \"alice\" cannot patch resource \"nodes\" in API group \"\" at the cluster scope"
    );
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let evict = status_of(pods.evict("x", &Default::default()).await.unwrap_err());
    assert_eq!(
        evict.message,
        "pods \"x\" is forbidden: User \"alice\" cannot create resource \"pods/eviction\" in API group \"\" in the namespace \"default\""
    );
}

#[tokio::test]
async fn audit_log_records_user_verb_object_and_code() {
    let server = server().await;
    let client = server.admin_client().await.unwrap();
    let maps: Api<ConfigMap> = Api::namespaced(client, "kube-system");
    let cm: ConfigMap = serde_json::from_value(
        json!({ "metadata": { "name": "aws-auth" }, "data": { "mapRoles": "[]" } }),
    )
    .unwrap();
    maps.create(&Default::default(), &cm).await.unwrap();
    let _ = maps.get("missing").await;
    let creates = server.audit().requests("create", "configmaps");
    assert_eq!(creates.len(), 1);
    let create = &creates[0];
    assert_eq!(create.user.username, "kubernetes-admin");
    assert!(create.user.groups.iter().any(|g| g == "system:masters"));
    assert_eq!(create.code(), 201);
    assert_eq!(create.namespace(), "kube-system");
    assert_eq!(create.name(), "aws-auth");
    assert_eq!(
        create.request_object.as_ref().unwrap()["data"]["mapRoles"],
        "[]"
    );
    assert!(!create.audit_id.is_empty());
    let miss = server
        .audit()
        .filter(|e| e.verb == "get" && e.name() == "missing");
    assert_eq!(miss[0].code(), 404);
    // The JSON form uses the audit log's field names.
    let line: serde_json::Value =
        serde_json::from_str(server.audit().json_lines().lines().next().unwrap()).unwrap();
    for field in [
        "auditID",
        "stage",
        "verb",
        "user",
        "userAgent",
        "objectRef",
        "responseStatus",
        "requestReceivedTimestamp",
    ] {
        assert!(line.get(field).is_some(), "{field} missing from {line}");
    }
    assert!(
        server
            .audit()
            .lines()
            .iter()
            .any(|l| l.contains("create configmaps kube-system/aws-auth"))
    );
}

#[tokio::test]
async fn faults_throttle_fail_and_delay_targeted_requests() {
    let server = server().await;
    let client = server.admin_client().await.unwrap();
    let nodes: Api<Node> = Api::all(client);
    server.faults().add(
        FaultRule::new(FaultAction::TooManyRequests {
            retry_after_seconds: 1,
        })
        .verb("get")
        .resource("nodes")
        .name("n1")
        .times(1),
    );
    // kube::Client retries 429/503/504 itself (honouring Retry-After): the GET succeeds on
    // its second attempt, and the log shows both.
    nodes.get("n1").await.unwrap();
    let codes: Vec<u16> = server
        .audit()
        .filter(|e| e.verb == "get" && e.name() == "n1")
        .iter()
        .map(|e| e.code())
        .collect();
    assert_eq!(codes, [429, 200]);

    let id = server.faults().add(
        FaultRule::new(FaultAction::InternalError)
            .verb("list")
            .resource("nodes"),
    );
    let failed = status_of(nodes.list(&ListParams::default()).await.unwrap_err());
    assert_eq!(failed.code, 500);
    assert_eq!(failed.reason, "InternalError");
    server.faults().remove(id);
    assert!(nodes.list(&ListParams::default()).await.is_ok());

    server.faults().add(
        FaultRule::new(FaultAction::Latency(Duration::from_millis(200)))
            .verb("get")
            .times(1),
    );
    let started = std::time::Instant::now();
    nodes.get("n1").await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(200));

    // hyper's pool transparently retries a request whose reused connection closes, so the
    // drop rule must hit every attempt for the client to see the failure.
    let drop = server
        .faults()
        .add(FaultRule::new(FaultAction::DropConnection).verb("get"));
    assert!(nodes.get("n1").await.is_err());
    server.faults().remove(drop);
    assert!(nodes.get("n1").await.is_ok());
    let faulted = server.audit().filter(|e| e.injected_fault.is_some());
    assert!(faulted.len() >= 4, "{faulted:?}");
    assert!(
        faulted
            .iter()
            .any(|e| e.injected_fault.as_deref() == Some("dropped connection"))
    );
}

#[tokio::test]
async fn faults_are_deterministic_under_a_seed() {
    let outcomes = |seed: u64| async move {
        let server = FakeApiServer::builder()
            .simulation(SimulationTimings::disabled())
            .fault_seed(seed)
            .start()
            .await
            .unwrap();
        server.store().create(&fixtures::ready_node("n1")).unwrap();
        server.faults().add(
            FaultRule::new(FaultAction::InternalError)
                .resource("nodes")
                .probability(0.5),
        );
        let nodes: Api<Node> = Api::all(server.admin_client().await.unwrap());
        let mut outcomes = Vec::new();
        for _ in 0..20 {
            outcomes.push(nodes.get("n1").await.is_ok());
        }
        outcomes
    };
    let first = outcomes(7).await;
    assert_eq!(first, outcomes(7).await);
    assert!(
        first.iter().any(|ok| *ok) && first.iter().any(|ok| !*ok),
        "{first:?}"
    );
}

mod eks_tokens {
    use std::sync::Arc;
    use std::time::SystemTime;

    use aws_credential_types::Credentials;
    use k8s_openapi::api::core::v1::{ConfigMap, Node};
    use kube::api::{Api, ListParams};
    use node_manager::cluster::sign_token;
    use node_manager_testkit::account::{AccessEntryLookup, KubernetesIdentity};
    use node_manager_testkit::kube::FakeApiServer;
    use serde_json::json;

    use super::{NODE_READER, server, status_of};

    fn token_for(server: &FakeApiServer, role: &str) -> String {
        let issued = server.account().add_role_credentials(role);
        let credentials = Credentials::new(
            issued.access_key_id,
            issued.secret_access_key,
            issued.session_token,
            None,
            "fake-account",
        );
        sign_token(
            &credentials,
            &server.account().region,
            server.cluster_name(),
            SystemTime::now(),
        )
        .unwrap()
        .expose()
        .to_owned()
    }

    #[tokio::test]
    async fn eks_token_maps_through_aws_auth_or_is_401() {
        let server = server().await;
        server.store().apply_yaml(NODE_READER).unwrap();
        let token = token_for(&server, "functions");
        let nodes: Api<Node> = Api::all(server.client_with_token(&token).await.unwrap());
        // Valid token, but the role is mapped nowhere: 401.
        assert_eq!(
            status_of(nodes.list(&ListParams::default()).await.unwrap_err()).code,
            401
        );

        // Field names and ARNs compare case-insensitively; the last duplicate wins.
        let role_arn = server.account().role_arn("functions").to_uppercase();
        let map_roles = format!(
            "- rolearn: {role_arn}\n  username: first\n  groups: [nobody]\n- RoleARN: {role_arn}\n  UserName: fn-{{{{AccountID}}}}\n  groups:\n  - readers\n"
        );
        let aws_auth: ConfigMap = serde_json::from_value(json!({
            "metadata": { "name": "aws-auth", "namespace": "kube-system" },
            "data": { "mapRoles": map_roles },
        }))
        .unwrap();
        server.store().create(&aws_auth).unwrap();
        assert_eq!(
            nodes
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .len(),
            1
        );
        let user = server
            .audit()
            .requests("list", "nodes")
            .last()
            .unwrap()
            .user
            .clone();
        assert_eq!(user.username, "fn-111111111111");
        assert!(user.groups.iter().any(|g| g == "readers"));
        assert!(user.groups.iter().any(|g| g == "system:authenticated"));
    }

    struct OneEntry(String);

    impl AccessEntryLookup for OneEntry {
        fn kubernetes_identity(
            &self,
            cluster: &str,
            principal_arn: &str,
        ) -> Option<KubernetesIdentity> {
            (cluster == "ironman-2022" && principal_arn == self.0).then(|| KubernetesIdentity {
                username: "entry-user".into(),
                groups: vec!["readers".into()],
            })
        }
    }

    #[tokio::test]
    async fn access_entries_are_consulted_before_aws_auth() {
        let account = node_manager_testkit::account::FakeAccount::reference();
        let server = FakeApiServer::builder()
            .account(account.clone())
            .access_entries(Arc::new(OneEntry(account.role_arn("functions"))))
            .start()
            .await
            .unwrap();
        server.store().apply_yaml(NODE_READER).unwrap();
        let token = token_for(&server, "functions");
        let nodes: Api<Node> = Api::all(server.client_with_token(&token).await.unwrap());
        nodes.list(&ListParams::default()).await.unwrap();
        assert_eq!(
            server.audit().requests("list", "nodes")[0].user.username,
            "entry-user"
        );
    }
}

#[tokio::test]
async fn access_reviews_answer_what_the_shipped_rbac_allows() {
    use k8s_openapi::api::authorization::v1::SelfSubjectAccessReview;
    let server = server().await;
    let rbac = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../infra/rbac.yaml"));
    assert!(server.apply_manifest_file(rbac).unwrap() > 0);
    let token =
        server.add_static_token("terminating-hook", &["open-node-manager:terminating-hook"]);
    let client = server.client_with_token(&token).await.unwrap();
    let reviews: Api<SelfSubjectAccessReview> = Api::all(client);
    let can = |verb: &str, resource: &str, subresource: Option<&str>| {
        let review: SelfSubjectAccessReview = serde_json::from_value(json!({
            "spec": { "resourceAttributes": {
                "verb": verb, "resource": resource, "subresource": subresource, "namespace": "default",
            } },
        }))
        .unwrap();
        let reviews = reviews.clone();
        async move {
            let answered = reviews.create(&Default::default(), &review).await.unwrap();
            answered.status.unwrap().allowed
        }
    };
    assert!(can("create", "pods", Some("eviction")).await);
    assert!(can("patch", "nodes", None).await);
    assert!(!can("update", "nodes", None).await);
    assert!(!can("delete", "pods", None).await);
}
