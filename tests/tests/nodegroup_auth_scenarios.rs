//! The node group auth function against the test kit's fake API server: real HTTPS, EKS
//! token authentication, the shipped `infra/rbac.yaml`, and the real authenticator
//! semantics of `aws-auth` (a node role can log in once it is mapped). EKS is the shared
//! crate's in-memory fake.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aws_credential_types::Credentials;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use node_manager::aws::in_memory::{InMemoryEks, InMemoryInstanceProfiles, InMemoryInstances};
use node_manager::aws::{AuthenticationMode, ClusterDescription, NodegroupDescription};
use node_manager::cluster::token::sign_token;
use node_manager::nodegroup_auth::handler::{NodegroupAuth, Outcome};
use node_manager::nodegroup_auth::kube_store::KubeAwsAuthStore;
use node_manager::nodegroup_auth::role_mapping::MapRoles;
use node_manager::nodegroup_auth::settings::NodegroupAuthSettings;
use node_manager::retry::RetryPolicy;
use node_manager::settings::ClusterScope;
use node_manager_testkit::account::{AccessEntryLookup, KubernetesIdentity};
use node_manager_testkit::aws::FakeAws;
use node_manager_testkit::kube::FakeApiServer;
use serde_json::{Value, json};

const CLUSTER: &str = "ironman-2022";
const FUNCTION_ARN: &str = "arn:aws:lambda:eu-west-1:111111111111:function:nodegroup-auth";
const NODE_ROLE_NAME: &str = "eksctl-ironman-2022-nodegroup-demo-ng-NodeInstanceRole-454Q2XHJ5LZ0";
const RBAC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../infra/rbac.yaml");
const MAP_USERS: &str = "- userarn: arn:aws:iam::111111111111:user/cli\n  username: cli   # admin\n  groups:\n    - system:masters\n";

fn fixture(name: &str) -> Value {
    let path = format!("{}/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The function's identity through an access entry, so `aws-auth` can be absent.
struct FunctionAccessEntry {
    principal: String,
}

impl AccessEntryLookup for FunctionAccessEntry {
    fn kubernetes_identity(
        &self,
        _cluster: &str,
        principal_arn: &str,
    ) -> Option<KubernetesIdentity> {
        principal_arn
            .eq_ignore_ascii_case(&self.principal)
            .then(|| KubernetesIdentity {
                username: "nodegroup-auth".into(),
                groups: vec!["open-node-manager:nodegroup-auth".into()],
            })
    }
}

struct Scenario {
    server: FakeApiServer,
    /// Its EC2 holds the node's instance, for `{{EC2PrivateDNSName}}`.
    _aws: FakeAws,
    eks: InMemoryEks,
    function:
        NodegroupAuth<InMemoryEks, KubeAwsAuthStore, InMemoryInstanceProfiles, InMemoryInstances>,
    admin: kube::Client,
}

fn credentials_for(server: &FakeApiServer, role: &str) -> Credentials {
    let creds = server.account().add_role_credentials(role);
    Credentials::new(
        &creds.access_key_id,
        &creds.secret_access_key,
        creds.session_token.clone(),
        None,
        "test",
    )
}

async fn client_as(server: &FakeApiServer, role: &str) -> kube::Client {
    let token = sign_token(
        &credentials_for(server, role),
        &server.account().region,
        CLUSTER,
        SystemTime::now(),
    )
    .unwrap();
    server.client_with_token(token.expose()).await.unwrap()
}

impl Scenario {
    /// `aws_auth`: the initial `aws-auth` data (`None`: absent).
    async fn start(aws_auth: Option<&str>) -> Self {
        let account = node_manager_testkit::account::FakeAccount::reference();
        let aws = FakeAws::start(account.clone()).await.unwrap();
        aws.ec2().add_running_instance(NODE_INSTANCE);
        let server = FakeApiServer::builder()
            .cluster_name(CLUSTER)
            .account(account.clone())
            .ec2(aws.ec2())
            .access_entries(Arc::new(FunctionAccessEntry {
                principal: account.role_arn("nodegroup-auth"),
            }))
            .start()
            .await
            .unwrap();
        server
            .apply_manifest_file(std::path::Path::new(RBAC))
            .unwrap();
        if let Some(data) = aws_auth {
            server
                .store()
                .apply_yaml(&format!(
                    "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: aws-auth\n  namespace: kube-system\n  labels:\n    owner: platform\n{data}"
                ))
                .unwrap();
        }
        let function_client = client_as(&server, "nodegroup-auth").await;
        let eks = InMemoryEks::default();
        eks.add_cluster(ClusterDescription {
            name: CLUSTER.into(),
            arn: format!("arn:aws:eks:eu-west-1:111111111111:cluster/{CLUSTER}"),
            endpoint: server.url().to_owned(),
            certificate_authority_data: server.ca_data(),
            authentication_mode: AuthenticationMode::ConfigMap,
        });
        let settings = NodegroupAuthSettings {
            scope: ClusterScope {
                cluster_name: CLUSTER.into(),
                additional_cluster_names: vec![],
            },
            region: "eu-west-1".into(),
            account_id: None,
            aws_auth_with_access_entries: false,
            retry: RetryPolicy {
                max_attempts: 40,
                base_delay: Duration::from_millis(5),
                max_delay: Duration::from_millis(100),
            },
            delete_wait: Duration::from_secs(2),
            delete_poll_interval: Duration::from_millis(10),
        };
        let function = NodegroupAuth::new(
            eks.clone(),
            KubeAwsAuthStore::new(function_client),
            InMemoryInstanceProfiles::default(),
            InMemoryInstances::default(),
            settings,
        );
        let admin = server.admin_client().await.unwrap();
        Self {
            server,
            _aws: aws,
            eks,
            function,
            admin,
        }
    }

    fn nodegroup(&self, name: &str, role_name: &str, ami_type: &str) -> String {
        let role = self.server.account().role_arn(role_name);
        self.eks.add_nodegroup(NodegroupDescription {
            cluster_name: CLUSTER.into(),
            nodegroup_name: name.into(),
            node_role: role.clone(),
            ami_type: ami_type.into(),
            status: "ACTIVE".into(),
        });
        role
    }

    /// Marks a node group of `NODE_ROLE_NAME` DELETING, as DeleteNodegroup does.
    fn deleting(&self, name: &str) {
        self.eks.add_nodegroup(NodegroupDescription {
            cluster_name: CLUSTER.into(),
            nodegroup_name: name.into(),
            node_role: self.server.account().role_arn(NODE_ROLE_NAME),
            ami_type: "AL2_x86_64".into(),
            status: "DELETING".into(),
        });
    }

    async fn aws_auth(&self) -> Option<ConfigMap> {
        Api::<ConfigMap>::namespaced(self.admin.clone(), "kube-system")
            .get_opt("aws-auth")
            .await
            .unwrap()
    }

    async fn map_roles(&self) -> MapRoles {
        let cm = self.aws_auth().await.unwrap();
        MapRoles::parse(
            cm.data
                .as_ref()
                .and_then(|d| d.get("mapRoles"))
                .map(String::as_str),
        )
        .unwrap()
    }

    fn writes(&self) -> usize {
        self.server
            .audit()
            .filter(|e| {
                e.resource() == "configmaps"
                    && matches!(e.verb.as_str(), "create" | "update" | "patch" | "delete")
                    && e.user.username == "nodegroup-auth"
            })
            .len()
    }

    fn forbidden(&self) -> usize {
        self.server
            .audit()
            .filter(|e| e.code() == 403 && e.user.username == "nodegroup-auth")
            .len()
    }
}

/// Whether a node of `role_name` gets past authentication (RBAC may still say no).
/// The instance the node runs on: EC2 names its role's sessions after it, which is how
/// `{{EC2PrivateDNSName}}` is resolved.
const NODE_INSTANCE: &str = "i-0a1b2c3d4e5f60718";

async fn node_can_authenticate(server: &FakeApiServer, role_name: &str) -> bool {
    let key = server
        .account()
        .add_role_credentials(role_name)
        .access_key_id;
    server.account().name_session(&key, NODE_INSTANCE);
    let client = client_as(server, role_name).await;
    match Api::<Node>::all(client).list(&Default::default()).await {
        Ok(_) => true,
        Err(kube::Error::Api(status)) => status.code != 401,
        Err(other) => panic!("unexpected error {other}"),
    }
}

#[tokio::test]
async fn create_event_maps_the_role_so_its_nodes_can_join() {
    let s = Scenario::start(Some(&format!(
        "data:\n  mapUsers: |\n{}  mapAccounts: \"\"\n",
        MAP_USERS
            .lines()
            .map(|l| format!("    {l}\n"))
            .collect::<String>()
    )))
    .await;
    s.nodegroup("demo-ng", NODE_ROLE_NAME, "AL2_x86_64");
    assert!(!node_can_authenticate(&s.server, NODE_ROLE_NAME).await);

    let report = s
        .function
        .handle(&fixture("eventbridge-create-nodegroup.json"), FUNCTION_ARN)
        .await
        .unwrap();
    assert_eq!(report.nodegroups[0].aws_auth, Some(Outcome::Mapped));
    assert!(node_can_authenticate(&s.server, NODE_ROLE_NAME).await);

    let cm = s.aws_auth().await.unwrap();
    let data = cm.data.clone().unwrap();
    assert_eq!(data["mapUsers"], MAP_USERS, "byte-identical");
    assert_eq!(data["mapAccounts"], "");
    assert_eq!(cm.metadata.labels.unwrap()["owner"], "platform");
    assert_eq!(s.writes(), 1);
    assert_eq!(s.forbidden(), 0, "the shipped RBAC is enough");
    let updates = s.server.audit().requests("update", "configmaps");
    assert_eq!(updates.len(), 1);
    assert_eq!(updates[0].code(), 200);

    // An Event on the ConfigMap.
    let events = Api::<Event>::namespaced(s.admin.clone(), "kube-system")
        .list(&Default::default())
        .await
        .unwrap();
    let event = events
        .items
        .iter()
        .find(|e| e.reason.as_deref() == Some("NodeRoleMapped"))
        .expect("a NodeRoleMapped event");
    assert_eq!(
        event.regarding.as_ref().unwrap().name.as_deref(),
        Some("aws-auth")
    );

    // Second delivery: no write, same resourceVersion.
    let version = s.aws_auth().await.unwrap().metadata.resource_version;
    let report = s
        .function
        .handle(&fixture("eventbridge-create-nodegroup.json"), FUNCTION_ARN)
        .await
        .unwrap();
    assert_eq!(report.nodegroups[0].aws_auth, Some(Outcome::AlreadyMapped));
    assert_eq!(s.writes(), 1, "no PUT");
    assert_eq!(
        s.aws_auth().await.unwrap().metadata.resource_version,
        version
    );
}

#[tokio::test]
async fn creates_aws_auth_when_it_is_absent() {
    let s = Scenario::start(None).await;
    s.nodegroup("demo-ng", NODE_ROLE_NAME, "AL2_x86_64");
    s.function
        .handle(
            &json!({"clusterName": CLUSTER, "nodegroupName": "demo-ng"}),
            FUNCTION_ARN,
        )
        .await
        .unwrap();
    assert_eq!(s.server.audit().requests("create", "configmaps").len(), 1);
    assert!(node_can_authenticate(&s.server, NODE_ROLE_NAME).await);
    assert_eq!(s.forbidden(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_concurrent_create_events_all_land_once() {
    // Absent at first: one creation wins, the others lose the race and merge.
    let s = Scenario::start(None).await;
    let roles: Vec<String> = (0..20)
        .map(|i| s.nodegroup(&format!("ng-{i}"), &format!("node-role-{i}"), "AL2_x86_64"))
        .collect();
    let function = Arc::new(s.function);
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let function = function.clone();
            tokio::spawn(async move {
                let mut event = fixture("eventbridge-create-nodegroup.json");
                event["detail"]["responseElements"]["nodegroup"]["nodegroupName"] =
                    json!(format!("ng-{i}"));
                event["detail"]["requestParameters"]["nodegroupName"] = json!(format!("ng-{i}"));
                function.handle(&event, FUNCTION_ARN).await
            })
        })
        .collect();
    for task in tasks {
        let report = task.await.unwrap().unwrap();
        assert_eq!(report.nodegroups[0].aws_auth, Some(Outcome::Mapped));
    }
    let cm = Api::<ConfigMap>::namespaced(s.admin.clone(), "kube-system")
        .get("aws-auth")
        .await
        .unwrap();
    let map = MapRoles::parse(
        cm.data
            .as_ref()
            .and_then(|d| d.get("mapRoles"))
            .map(String::as_str),
    )
    .unwrap();
    assert_eq!(map.mappings().len(), 20);
    for role in &roles {
        assert_eq!(
            map.mappings()
                .iter()
                .filter(|m| &m.role_arn == role)
                .count(),
            1,
            "{role}"
        );
    }
    let audit = s.server.audit();
    let conflicts = audit.filter(|e| e.code() == 409).len();
    assert!(conflicts > 0, "the race was real");
    assert_eq!(
        audit
            .filter(|e| e.code() == 403 && e.user.username == "nodegroup-auth")
            .len(),
        0
    );
}

#[tokio::test]
async fn delete_keeps_a_shared_role_and_removes_the_last_user() {
    let s = Scenario::start(Some("data:\n  mapRoles: |\n    - rolearn: arn:aws:iam::111111111111:role/other\n      username: other\n      groups: [team]\n")).await;
    s.nodegroup("demo-ng", NODE_ROLE_NAME, "AL2_x86_64");
    s.nodegroup("second-ng", NODE_ROLE_NAME, "AL2_x86_64");
    s.function
        .handle(
            &json!({"clusterName": CLUSTER, "reconcile": "all"}),
            FUNCTION_ARN,
        )
        .await
        .unwrap();
    assert_eq!(
        s.map_roles().await.mappings().len(),
        2,
        "one entry for the shared role"
    );

    // Deletes arrive while the node group is DELETING (EKS takes minutes to delete one).
    s.deleting("demo-ng");
    let report = s
        .function
        .handle(&fixture("eventbridge-delete-nodegroup.json"), FUNCTION_ARN)
        .await
        .unwrap();
    assert_eq!(report.nodegroups[0].aws_auth, Some(Outcome::KeptInUse));
    assert!(node_can_authenticate(&s.server, NODE_ROLE_NAME).await);

    s.eks.remove_nodegroup(CLUSTER, "demo-ng");
    s.deleting("second-ng");
    let eks = s.eks.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        eks.remove_nodegroup(CLUSTER, "second-ng");
    });
    let mut event = fixture("eventbridge-delete-nodegroup.json");
    event["detail"]["responseElements"]["nodegroup"]["nodegroupName"] = json!("second-ng");
    event["detail"]["requestParameters"]["nodegroupName"] = json!("second-ng");
    let report = s.function.handle(&event, FUNCTION_ARN).await.unwrap();
    assert_eq!(report.nodegroups[0].aws_auth, Some(Outcome::Unmapped));
    assert!(!node_can_authenticate(&s.server, NODE_ROLE_NAME).await);
    let map = s.map_roles().await;
    assert_eq!(map.mappings().len(), 1);
    assert_eq!(
        map.mappings()[0].role_arn,
        "arn:aws:iam::111111111111:role/other"
    );
    assert_eq!(s.forbidden(), 0);
}

#[tokio::test]
async fn malformed_aws_auth_is_not_written() {
    let broken = "data:\n  mapRoles: |\n    - rolearn: arn:aws:iam::111111111111:role/other\n      username: other\n     groups: [team]\n";
    let s = Scenario::start(Some(broken)).await;
    s.nodegroup("demo-ng", NODE_ROLE_NAME, "AL2_x86_64");
    let before = s.aws_auth().await.unwrap();
    let err = s
        .function
        .handle(&fixture("eventbridge-create-nodegroup.json"), FUNCTION_ARN)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("nothing was written"), "{err}");
    assert_eq!(s.writes(), 0);
    assert_eq!(s.aws_auth().await.unwrap(), before);
}

#[tokio::test]
async fn an_equivalent_entry_in_json_style_means_no_write() {
    let role = reference_role_arn(NODE_ROLE_NAME);
    let s = Scenario::start(Some(&format!(
        "data:\n  mapRoles: '[{{\"RoleArn\":\"{}\",\"UserName\":\"system:node:{{{{EC2PrivateDNSName}}}}\",\"Groups\":[\"system:nodes\",\"system:bootstrappers\"]}}]'\n",
        role.to_uppercase().replace("ARN:AWS:IAM", "arn:aws:iam")
    )))
    .await;
    s.nodegroup("demo-ng", NODE_ROLE_NAME, "AL2_x86_64");
    assert!(
        node_can_authenticate(&s.server, NODE_ROLE_NAME).await,
        "the authenticator reads it"
    );
    let report = s
        .function
        .handle(&fixture("eventbridge-create-nodegroup.json"), FUNCTION_ARN)
        .await
        .unwrap();
    assert_eq!(report.nodegroups[0].aws_auth, Some(Outcome::AlreadyMapped));
    assert_eq!(s.writes(), 0);
}

#[tokio::test]
async fn a_privileged_entry_is_left_alone_with_a_warning_event() {
    let role = reference_role_arn(NODE_ROLE_NAME);
    let s = Scenario::start(Some(&format!(
        "data:\n  mapRoles: |\n    - rolearn: {role}\n      username: admin\n      groups:\n        - system:masters\n"
    )))
    .await;
    s.nodegroup("demo-ng", NODE_ROLE_NAME, "AL2_x86_64");
    let before = s.aws_auth().await.unwrap();
    let report = s
        .function
        .handle(&fixture("eventbridge-create-nodegroup.json"), FUNCTION_ARN)
        .await
        .unwrap();
    assert_eq!(report.nodegroups[0].aws_auth, Some(Outcome::Conflict));
    assert_eq!(s.writes(), 0);
    assert_eq!(s.aws_auth().await.unwrap(), before);
    let events = Api::<Event>::namespaced(s.admin.clone(), "kube-system")
        .list(&Default::default())
        .await
        .unwrap();
    let warning = events
        .items
        .iter()
        .find(|e| e.reason.as_deref() == Some("NodeRoleMappingConflict"))
        .expect("a warning event");
    assert_eq!(warning.type_.as_deref(), Some("Warning"));
    assert!(warning.note.as_deref().unwrap().contains("admin"));
}

/// A role ARN of the reference account.
fn reference_role_arn(name: &str) -> String {
    node_manager_testkit::account::FakeAccount::reference().role_arn(name)
}
