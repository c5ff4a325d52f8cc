//! The deployable templates (`infra/template.yaml`, `infra/lifecycle-hooks.yaml`) checked
//! against the workspace and against the promises of the operator's guide: the binaries SAM
//! builds are the workspace's functions, every setting is a parameter the code reads, the
//! hooks reach the right function, failures land in queues, and IAM stays scoped.
//!
//! cfn-lint (`scripts/check-infra.sh`) checks the templates against CloudFormation's schema;
//! these tests check what a schema cannot: that the pieces are wired to each other.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value, json};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the test kit sits in the repository root")
        .to_path_buf()
}

// ------------------------------------------------------------------ template loading

/// A template value with CloudFormation's short-form tags (`!Ref X`, `!GetAtt A.B`, `!Sub s`,
/// `!If [...]`) turned into their long form (`{"Ref": "X"}`, `{"Fn::GetAtt": ["A", "B"]}`, ...),
/// so that tests compare one spelling whatever the template uses.
struct Cfn(Value);

/// A YAML node without its tag; its children are [`Cfn`] values.
struct Untagged(Value);

impl<'de> Deserialize<'de> for Untagged {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct NodeVisitor;
        impl<'de> Visitor<'de> for NodeVisitor {
            type Value = Untagged;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a YAML value")
            }
            fn visit_bool<E>(self, v: bool) -> Result<Untagged, E> {
                Ok(Untagged(Value::Bool(v)))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Untagged, E> {
                Ok(Untagged(v.into()))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Untagged, E> {
                Ok(Untagged(v.into()))
            }
            fn visit_f64<E>(self, v: f64) -> Result<Untagged, E> {
                Ok(Untagged(v.into()))
            }
            fn visit_str<E>(self, v: &str) -> Result<Untagged, E> {
                Ok(Untagged(v.into()))
            }
            fn visit_string<E>(self, v: String) -> Result<Untagged, E> {
                Ok(Untagged(v.into()))
            }
            fn visit_unit<E>(self) -> Result<Untagged, E> {
                Ok(Untagged(Value::Null))
            }
            fn visit_none<E>(self) -> Result<Untagged, E> {
                Ok(Untagged(Value::Null))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Untagged, A::Error> {
                let mut items = Vec::new();
                while let Some(Cfn(item)) = seq.next_element()? {
                    items.push(item);
                }
                Ok(Untagged(Value::Array(items)))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Untagged, A::Error> {
                let mut entries = Map::new();
                while let Some(key) = map.next_key::<String>()? {
                    let Cfn(value) = map.next_value()?;
                    entries.insert(key, value);
                }
                Ok(Untagged(Value::Object(entries)))
            }
        }
        deserializer.deserialize_any(NodeVisitor)
    }
}

impl<'de> Deserialize<'de> for Cfn {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let serde_saphyr::Tagged(Untagged(value), tag) =
            serde_saphyr::Tagged::<Untagged>::deserialize(deserializer)?;
        let Some(tag) = tag else {
            return Ok(Cfn(value));
        };
        let name = tag.trim_start_matches('!');
        Ok(Cfn(match (name, value) {
            ("Ref", value) => json!({ "Ref": value }),
            ("GetAtt", Value::String(dotted)) => {
                let (resource, attribute) = dotted.split_once('.').unwrap_or((&dotted, ""));
                json!({ "Fn::GetAtt": [resource, attribute] })
            }
            (name, value) => json!({ format!("Fn::{name}"): value }),
        }))
    }
}

fn load_template(relative: &str) -> Value {
    let path = repo_root().join(relative);
    let text = std::fs::read_to_string(&path).expect("template is readable");
    let Cfn(template) = serde_saphyr::from_str(&text).expect("template is YAML");
    template
}

fn main_template() -> Value {
    load_template("infra/template.yaml")
}

fn resources_of_type<'a>(template: &'a Value, kind: &str) -> BTreeMap<&'a str, &'a Value> {
    template["Resources"]
        .as_object()
        .expect("Resources")
        .iter()
        .filter(|(_, r)| r["Type"] == kind)
        .map(|(id, r)| (id.as_str(), r))
        .collect()
}

fn reference(id: &str) -> Value {
    json!({ "Ref": id })
}

fn attribute(id: &str, name: &str) -> Value {
    json!({ "Fn::GetAtt": [id, name] })
}

/// The resource a `Ref`/`GetAtt` points at.
fn target<'a>(template: &'a Value, value: &Value) -> Option<&'a Value> {
    let id = value
        .get("Ref")
        .and_then(Value::as_str)
        .or_else(|| value.get("Fn::GetAtt").and_then(|a| a[0].as_str()))?;
    template["Resources"].get(id)
}

// ------------------------------------------------------------------ workspace reading

/// `key = "value"` entries of each `[section]` / `[[section]]` of a Cargo manifest; enough for
/// the package and binary names this test needs, without a TOML parser dependency.
fn manifest_sections(text: &str) -> Vec<(String, BTreeMap<String, String>)> {
    let mut sections: Vec<(String, BTreeMap<String, String>)> =
        vec![(String::new(), BTreeMap::new())];
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            let name = line
                .trim_matches(|c| c == '[' || c == ']')
                .trim()
                .to_owned();
            sections.push((name, BTreeMap::new()));
        } else if let Some((key, value)) = line.split_once('=') {
            let value = value.trim();
            if let Some(string) = value.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
                let section = sections.last_mut().expect("at least one section");
                section.1.insert(key.trim().to_owned(), string.to_owned());
            }
        }
    }
    sections
}

/// The binaries of the function crates under `functions/`: a `[[bin]]` name, else the
/// package name (Cargo's default for `src/main.rs`).
fn workspace_function_binaries() -> BTreeSet<String> {
    let mut binaries = BTreeSet::new();
    for entry in std::fs::read_dir(repo_root().join("functions")).expect("functions/") {
        let manifest = entry.expect("dir entry").path().join("Cargo.toml");
        let Ok(text) = std::fs::read_to_string(&manifest) else {
            continue;
        };
        let sections = manifest_sections(&text);
        let bins: Vec<String> = sections
            .iter()
            .filter(|(name, _)| name == "bin")
            .filter_map(|(_, keys)| keys.get("name").cloned())
            .collect();
        if bins.is_empty() {
            let package = sections
                .iter()
                .find(|(name, _)| name == "package")
                .and_then(|(_, keys)| keys.get("name").cloned())
                .expect("function crate has a package name");
            binaries.insert(package);
        } else {
            binaries.extend(bins);
        }
    }
    binaries
}

/// The quoted entries of the root manifest's `default-members = [...]`.
fn default_members() -> BTreeSet<String> {
    let text = std::fs::read_to_string(repo_root().join("Cargo.toml")).expect("root Cargo.toml");
    let start = text
        .find("default-members")
        .expect("default-members is set");
    let list = &text[start..];
    let list = &list[list.find('[').expect("[")..=list.find(']').expect("]")];
    list.split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// Every Rust source file of the given directories.
/// The dimension names of the metric lines of each Rust file under `dir` that writes some
/// (`Function` included: every line has it).
fn dimension_sets(dir: &Path) -> BTreeSet<BTreeSet<String>> {
    let mut sets = BTreeSet::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
                continue;
            }
            let source = std::fs::read_to_string(&path).unwrap_or_default();
            if path.extension().is_some_and(|e| e == "rs") && source.contains(".metric(") {
                let mut set = literal_arguments(&source, ".dimension(");
                set.insert("Function".to_owned());
                sets.insert(set);
            }
        }
    }
    sets
}

fn rust_sources(dirs: &[PathBuf]) -> String {
    let mut text = String::new();
    let mut pending: Vec<PathBuf> = dirs.to_vec();
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                text.push_str(&std::fs::read_to_string(&path).unwrap_or_default());
            }
        }
    }
    text
}

// ------------------------------------------------------------------ tests: build

#[test]
fn template_builds_exactly_the_workspace_functions_with_cargo_lambda() {
    let template = main_template();
    assert_eq!(template["Transform"], "AWS::Serverless-2016-10-31");
    let functions = resources_of_type(&template, "AWS::Serverless::Function");
    let mut built = BTreeSet::new();
    for (id, function) in &functions {
        assert_eq!(
            function["Metadata"]["BuildMethod"], "rust-cargolambda",
            "{id}"
        );
        let binary = function["Metadata"]["BuildProperties"]["Binary"]
            .as_str()
            .unwrap_or_else(|| panic!("{id} names its binary"));
        assert!(built.insert(binary.to_owned()), "{binary} built twice");
        let properties = &function["Properties"];
        assert_eq!(properties["Runtime"], "provided.al2023", "{id}");
        assert_eq!(properties["Architectures"], json!(["arm64"]), "{id}");
        assert_eq!(properties["Handler"], "bootstrap", "{id}");
        // CodeUri is the workspace root, relative to the template.
        let code_uri = properties["CodeUri"].as_str().expect("CodeUri");
        let workspace = repo_root().join("infra").join(code_uri);
        assert!(
            workspace.join("Cargo.toml").is_file() && workspace.join("functions").is_dir(),
            "{id}: CodeUri {code_uri} is not the workspace root"
        );
    }
    assert_eq!(built, workspace_function_binaries());
    let members: BTreeSet<String> = default_members()
        .into_iter()
        .map(|m| m.trim_start_matches("functions/").to_owned())
        .collect();
    assert_eq!(built, members, "default-members are exactly the functions");
}

#[test]
fn cargo_manifest_reader_finds_bin_names() {
    let text = "[package]\nname = \"pkg\"\n\n[[bin]]\nname = \"one\"\npath = \"src/a.rs\"\n\
                [[bin]]\nname = \"two\"\n[dependencies]\nname = \"not-a-bin\"\n";
    let sections = manifest_sections(text);
    let bins: Vec<&str> = sections
        .iter()
        .filter(|(n, _)| n == "bin")
        .filter_map(|(_, k)| k.get("name").map(String::as_str))
        .collect();
    assert_eq!(bins, ["one", "two"]);
}

#[test]
fn short_form_tags_read_as_long_form_intrinsics() {
    let yaml = "a: !Ref X\nb: !GetAtt Y.Arn\nc: !If [C, {d: !Sub 'x-${X}'}, !Ref AWS::NoValue]\n";
    let Cfn(value) = serde_saphyr::from_str(yaml).unwrap();
    assert_eq!(
        value,
        json!({
            "a": {"Ref": "X"},
            "b": {"Fn::GetAtt": ["Y", "Arn"]},
            "c": {"Fn::If": ["C", {"d": {"Fn::Sub": "x-${X}"}}, {"Ref": "AWS::NoValue"}]},
        })
    );
}

// ------------------------------------------------------------------ tests: functions

#[test]
fn functions_log_json_to_their_own_group_with_the_retention_parameter() {
    let template = main_template();
    let mut groups = BTreeSet::new();
    for (id, function) in resources_of_type(&template, "AWS::Serverless::Function") {
        let logging = &function["Properties"]["LoggingConfig"];
        assert_eq!(logging["LogFormat"], "JSON", "{id}");
        assert_eq!(
            logging["ApplicationLogLevel"],
            reference("ApplicationLogLevel")
        );
        let group = target(&template, &logging["LogGroup"]).expect("log group resource");
        assert_eq!(group["Type"], "AWS::Logs::LogGroup", "{id}");
        assert_eq!(
            group["Properties"]["RetentionInDays"],
            reference("LogRetentionInDays")
        );
        assert!(
            groups.insert(logging["LogGroup"].to_string()),
            "{id} shares a group"
        );
    }
}

#[test]
fn timeouts_suit_each_function() {
    let template = main_template();
    let timeout = |id: &str| {
        template["Resources"][id]["Properties"]["Timeout"]
            .as_u64()
            .expect("Timeout")
    };
    // The drain runs as long as Lambda allows and hands over before the end.
    assert_eq!(timeout("TerminatingHookFunction"), 900);
    assert!((300..=900).contains(&timeout("LaunchingHookFunction")));
    // A DeleteNodegroup waits (DELETE_WAIT_SECONDS) for the node group to be gone.
    let delete_wait = &template["Parameters"]["DeleteWaitSeconds"];
    let longest_wait = delete_wait["MaxValue"].as_u64().expect("bounded wait");
    assert!(delete_wait["Default"].as_u64().expect("default") <= longest_wait);
    assert!(longest_wait + 30 <= timeout("NodegroupAuthFunction"));
    assert!(timeout("NodegroupAuthFunction") <= 900);
    let margin = template["Parameters"]["HandOverMarginSeconds"]["Default"]
        .as_u64()
        .expect("margin default");
    assert!(margin > 0 && margin * 10 < timeout("LaunchingHookFunction"));
}

#[test]
fn the_functions_that_hand_over_through_their_own_topic_allow_the_loop() {
    // A drain or launch wait longer than about 16 hand-overs would otherwise be stopped by
    // Lambda's recursive loop detection (SNS -> Lambda -> SNS with the same trace header).
    let template = main_template();
    for id in ["TerminatingHookFunction", "LaunchingHookFunction"] {
        assert_eq!(
            template["Resources"][id]["Properties"]["RecursiveLoop"], "Allow",
            "{id}"
        );
    }
}

#[test]
fn every_function_setting_is_a_parameter_the_code_reads() {
    let template = main_template();
    let parameters = template["Parameters"].as_object().expect("Parameters");
    let code = rust_sources(&[
        repo_root().join("shared/src"),
        repo_root().join("functions"),
    ]);
    let mut unread = Vec::new();
    for (id, function) in resources_of_type(&template, "AWS::Serverless::Function") {
        let variables = function["Properties"]["Environment"]["Variables"]
            .as_object()
            .unwrap_or_else(|| panic!("{id} has settings"));
        assert_eq!(variables["CLUSTER_NAME"], reference("ClusterName"), "{id}");
        for (name, value) in variables {
            let source = value["Ref"]
                .as_str()
                .unwrap_or_else(|| panic!("{id} {name}"));
            assert!(
                parameters.contains_key(source) || template["Resources"].get(source).is_some(),
                "{id} {name} = Ref {source}, which is neither a parameter nor a resource"
            );
            if !code.contains(&format!("\"{name}\"")) {
                unread.push(format!("{id}: {name}"));
            }
        }
    }
    assert!(unread.is_empty(), "settings no code reads: {unread:?}");
}

#[test]
fn every_parameter_is_used() {
    let template = main_template();
    let text = std::fs::read_to_string(repo_root().join("infra/template.yaml")).unwrap();
    for name in template["Parameters"]
        .as_object()
        .expect("Parameters")
        .keys()
    {
        let used = text.contains(&format!("!Ref {name}"))
            || text.contains(&format!("${{{name}}}"))
            || text.contains(&format!("Ref: {name}"));
        assert!(used, "parameter {name} is never used");
    }
}

#[test]
fn asynchronous_failures_land_in_sqs() {
    let template = main_template();
    for (id, function) in resources_of_type(&template, "AWS::Serverless::Function") {
        let config = &function["Properties"]["EventInvokeConfig"];
        assert!(config["MaximumRetryAttempts"].as_u64().is_some(), "{id}");
        let on_failure = &config["DestinationConfig"]["OnFailure"];
        assert_eq!(on_failure["Type"], "SQS", "{id}");
        let queue = target(&template, &on_failure["Destination"]).expect("queue resource");
        assert_eq!(queue["Type"], "AWS::SQS::Queue", "{id}");
    }
    // The functions may send to that queue.
    let access = template["Resources"]["ClusterAccessPolicy"].to_string();
    assert!(access.contains("sqs:SendMessage") && access.contains("FailedInvocationsQueue"));
}

#[test]
fn vpc_settings_are_optional_and_the_same_for_every_function() {
    let template = main_template();
    let condition = &template["Conditions"]["HasVpcConfig"];
    assert!(condition.to_string().contains("SubnetIds"), "{condition}");
    for (id, function) in resources_of_type(&template, "AWS::Serverless::Function") {
        assert_eq!(
            function["Properties"]["VpcConfig"],
            json!({"Fn::If": [
                "HasVpcConfig",
                {"SubnetIds": {"Ref": "SubnetIds"}, "SecurityGroupIds": {"Ref": "SecurityGroupIds"}},
                {"Ref": "AWS::NoValue"},
            ]}),
            "{id}"
        );
        let role = target(&template, &function["Properties"]["Role"]).expect("role");
        let policies = role["Properties"]["ManagedPolicyArns"]["Fn::If"].to_string();
        assert!(
            policies.starts_with("[\"HasVpcConfig\"")
                && policies.contains("AWSLambdaVPCAccessExecutionRole"),
            "{id}: VPC access only with VPC settings: {policies}"
        );
    }
}

// ------------------------------------------------------------------ tests: wiring

/// SNS message-body filtering for the policy features the template uses: top-level keys
/// with lists of exact strings (all keys must match) and `$or` of such policies.
fn filter_matches(policy: &Value, message: &Value) -> bool {
    let Some(keys) = policy.as_object() else {
        return false;
    };
    keys.iter().all(|(key, expected)| match key.as_str() {
        "$or" => expected
            .as_array()
            .is_some_and(|alternatives| alternatives.iter().any(|p| filter_matches(p, message))),
        _ => expected
            .as_array()
            .is_some_and(|values| message.get(key).is_some_and(|v| values.contains(v))),
    })
}

/// The Auto Scaling message inside an SNS fixture.
fn fixture_message(name: &str) -> Value {
    let path = repo_root().join("tests/fixtures").join(name);
    let event: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("fixture")).expect("JSON");
    let message = event["Records"][0]["Sns"]["Message"]
        .as_str()
        .expect("SNS message");
    serde_json::from_str(message).expect("message is JSON")
}

#[test]
fn each_hook_function_receives_only_its_transition_from_the_topic() {
    let template = main_template();
    let subscriptions = resources_of_type(&template, "AWS::SNS::Subscription");
    assert_eq!(subscriptions.len(), 2);
    let mut endpoints = Vec::new();
    for (id, subscription) in &subscriptions {
        let properties = &subscription["Properties"];
        assert_eq!(properties["TopicArn"], reference("LifecycleTopic"), "{id}");
        assert_eq!(properties["Protocol"], "lambda", "{id}");
        assert_eq!(properties["FilterPolicyScope"], "MessageBody", "{id}");
        let function = properties["Endpoint"]["Fn::GetAtt"][0]
            .as_str()
            .expect("endpoint");
        endpoints.push((function.to_owned(), properties["FilterPolicy"].clone()));
    }
    let receivers = |fixture: &str| -> Vec<String> {
        let message = fixture_message(fixture);
        endpoints
            .iter()
            .filter(|(_, policy)| filter_matches(policy, &message))
            .map(|(function, _)| function.clone())
            .collect()
    };
    assert_eq!(
        receivers("sns-lifecycle-terminating.json"),
        ["TerminatingHookFunction"]
    );
    assert_eq!(
        receivers("sns-lifecycle-launching.json"),
        ["LaunchingHookFunction"]
    );
    // Exactly one function logs the test notification of a new hook.
    assert_eq!(
        receivers("sns-test-notification.json"),
        ["TerminatingHookFunction"]
    );
    // SNS may invoke each of them, from this topic only.
    let permissions = resources_of_type(&template, "AWS::Lambda::Permission");
    for (function, _) in &endpoints {
        assert!(
            permissions.values().any(|p| {
                p["Properties"]["FunctionName"] == reference(function)
                    && p["Properties"]["Principal"] == "sns.amazonaws.com"
                    && p["Properties"]["SourceArn"] == reference("LifecycleTopic")
            }),
            "no SNS permission for {function}"
        );
    }
}

#[test]
fn the_filter_matcher_requires_every_key() {
    let policy = json!({"a": ["x"], "$or": [{"b": ["y"]}, {"c": ["z"]}]});
    assert!(filter_matches(&policy, &json!({"a": "x", "c": "z"})));
    assert!(!filter_matches(&policy, &json!({"a": "x"})));
    assert!(!filter_matches(&policy, &json!({"a": "w", "b": "y"})));
}

#[test]
fn auto_scaling_publishes_with_a_role_limited_to_the_topic() {
    let template = main_template();
    let role = &template["Resources"]["LifecycleHookRole"]["Properties"];
    assert_eq!(
        role["AssumeRolePolicyDocument"]["Statement"][0]["Principal"]["Service"],
        "autoscaling.amazonaws.com"
    );
    let statements = &role["Policies"][0]["PolicyDocument"]["Statement"];
    assert_eq!(
        statements,
        &json!([{"Effect": "Allow", "Action": "sns:Publish", "Resource": {"Ref": "LifecycleTopic"}}])
    );
}

#[test]
fn node_group_calls_reach_the_auth_function_with_retries_and_a_dead_letter_queue() {
    let template = main_template();
    let rule = &template["Resources"]["NodegroupEventsRule"]["Properties"];
    let pattern = &rule["EventPattern"];
    assert_eq!(pattern["source"], json!(["aws.eks"]));
    assert_eq!(
        pattern["detail-type"],
        json!(["AWS API Call via CloudTrail"])
    );
    assert_eq!(
        pattern["detail"]["eventName"],
        json!(["CreateNodegroup", "DeleteNodegroup"])
    );
    let targets = rule["Targets"].as_array().expect("Targets");
    assert_eq!(targets.len(), 1);
    let target_def = &targets[0];
    assert_eq!(target_def["Arn"], attribute("NodegroupAuthFunction", "Arn"));
    assert!(
        target_def["RetryPolicy"]["MaximumRetryAttempts"]
            .as_u64()
            .unwrap_or(0)
            > 0
    );
    let dlq = target(&template, &target_def["DeadLetterConfig"]["Arn"]).expect("DLQ");
    assert_eq!(dlq["Type"], "AWS::SQS::Queue");
    // EventBridge may write to it, for this rule only.
    let queue_policies = resources_of_type(&template, "AWS::SQS::QueuePolicy");
    assert!(queue_policies.values().any(|p| {
        let statement = &p["Properties"]["PolicyDocument"]["Statement"][0];
        statement["Principal"]["Service"] == "events.amazonaws.com"
            && statement["Condition"]["ArnEquals"]["aws:SourceArn"]
                == attribute("NodegroupEventsRule", "Arn")
    }));
    // And invoke the function, from this rule only.
    let permissions = resources_of_type(&template, "AWS::Lambda::Permission");
    assert!(permissions.values().any(|p| {
        p["Properties"]["FunctionName"] == reference("NodegroupAuthFunction")
            && p["Properties"]["SourceArn"] == attribute("NodegroupEventsRule", "Arn")
    }));
}

/// The instance refresh rule forwards every refresh event and the instance events that
/// re-plan a refresh in progress, and the function reads each of them.
#[test]
fn instance_refresh_events_and_instance_launches_reach_the_refresh_function() {
    let template = main_template();
    let rule = &template["Resources"]["InstanceRefreshEventsRule"]["Properties"];
    assert_eq!(rule["EventPattern"]["source"], json!(["aws.autoscaling"]));
    let detail_types: Vec<&str> = rule["EventPattern"]["detail-type"]
        .as_array()
        .expect("detail-type")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for wanted in [
        "EC2 Auto Scaling Instance Refresh Started",
        "EC2 Instance Launch Successful",
        "EC2 Instance Terminate Successful",
    ] {
        assert!(detail_types.contains(&wanted), "{wanted}: {detail_types:?}");
    }
    for detail_type in detail_types {
        let event = json!({
            "version": "0", "id": "e", "detail-type": detail_type, "source": "aws.autoscaling",
            "account": "123456789012", "time": "2026-11-28T08:00:00Z", "region": "eu-west-1",
            "resources": [], "detail": {"AutoScalingGroupName": "ng",
                "InstanceRefreshId": "c613620e-07e2-4ed2-a9e2-ef8258911ade",
                "EC2InstanceId": "i-1234567890abcdef0"},
        });
        assert!(
            node_manager::instance_refresh::event::RefreshEvent::parse(&event).is_ok(),
            "{detail_type}"
        );
    }
    assert_eq!(
        rule["Targets"][0]["Arn"],
        attribute("InstanceRefreshFunction", "Arn")
    );
}

#[test]
fn the_fixture_events_match_the_rule_pattern() {
    let template = main_template();
    let pattern = &rule_pattern_for(&template, "ironman-2022");
    for fixture in [
        "eventbridge-create-nodegroup.json",
        "eventbridge-delete-nodegroup.json",
    ] {
        let path = repo_root().join("tests/fixtures").join(fixture);
        let text = std::fs::read_to_string(&path).expect("fixture is readable");
        let event: Value = serde_json::from_str(&text).expect("fixture is JSON");
        assert!(
            pattern_matches(pattern, &event),
            "{fixture} does not match {pattern}"
        );
        let mut failed = event.clone();
        failed["detail"]["errorCode"] = json!("AccessDenied");
        assert!(
            !pattern_matches(pattern, &failed),
            "failed calls are filtered out"
        );
    }
}

/// The rule's pattern as deployed for `cluster` (its `!Ref ClusterName` resolved).
fn rule_pattern_for(template: &Value, cluster: &str) -> Value {
    let text = template["Resources"]["NodegroupEventsRule"]["Properties"]["EventPattern"]
        .to_string()
        .replace(
            &reference("ClusterName").to_string(),
            &json!(cluster).to_string(),
        );
    serde_json::from_str(&text).expect("pattern")
}

/// EventBridge matching for the pattern features the template uses: lists of exact values,
/// `{"exists": bool}` and `$or`.
fn pattern_matches(pattern: &Value, event: &Value) -> bool {
    let Some(fields) = pattern.as_object() else {
        return false;
    };
    fields.iter().all(|(key, expected)| {
        if key == "$or" {
            return expected
                .as_array()
                .is_some_and(|branches| branches.iter().any(|b| pattern_matches(b, event)));
        }
        let actual = event.get(key);
        match expected {
            Value::Object(_) => actual.is_some_and(|a| pattern_matches(expected, a)),
            Value::Array(options) => options.iter().any(|option| match option {
                Value::Object(test) if test.contains_key("exists") => {
                    test["exists"].as_bool() == Some(actual.is_some_and(|a| !a.is_null()))
                }
                value => actual == Some(value),
            }),
            _ => false,
        }
    })
}

/// A rule's pattern from the template (no intrinsics in it).
fn rule_pattern(template: &Value, rule: &str) -> Value {
    template["Resources"][rule]["Properties"]["EventPattern"].clone()
}

#[test]
fn instance_notice_rules_forward_what_the_terminating_hook_acts_on_and_nothing_else() {
    let template = main_template();
    let ec2 = rule_pattern(&template, "InstanceNoticeEventsRule");
    let health = rule_pattern(&template, "ScheduledMaintenanceEventsRule");
    let event = |source: &str, detail_type: &str, detail: Value| json!({"source": source, "detail-type": detail_type, "detail": detail});
    let forwarded = [
        event(
            "aws.ec2",
            "EC2 Spot Instance Interruption Warning",
            json!({"instance-id": "i-0a1b2c3d", "instance-action": "terminate"}),
        ),
        event(
            "aws.ec2",
            "EC2 Instance Rebalance Recommendation",
            json!({"instance-id": "i-0a1b2c3d"}),
        ),
        event(
            "aws.ec2",
            "EC2 Instance State-change Notification",
            json!({"instance-id": "i-0a1b2c3d", "state": "shutting-down"}),
        ),
        event(
            "aws.ec2",
            "EC2 Instance State-change Notification",
            json!({"instance-id": "i-0a1b2c3d", "state": "stopping"}),
        ),
    ];
    for e in &forwarded {
        assert!(pattern_matches(&ec2, e), "{e}");
        assert!(
            node_manager::instance_notice::event::is_notice_event(e),
            "{e}"
        );
    }
    let dropped = [
        event(
            "aws.ec2",
            "EC2 Instance State-change Notification",
            json!({"instance-id": "i-0a1b2c3d", "state": "running"}),
        ),
        event(
            "aws.ec2",
            "EC2 Instance State-change Notification",
            json!({"instance-id": "i-0a1b2c3d", "state": "terminated"}),
        ),
        event("aws.ec2", "EBS Volume Notification", json!({})),
    ];
    for e in &dropped {
        assert!(!pattern_matches(&ec2, e), "{e}");
    }
    let scheduled = event(
        "aws.health",
        "AWS Health Event",
        json!({"service": "EC2", "eventTypeCategory": "scheduledChange"}),
    );
    assert!(pattern_matches(&health, &scheduled));
    for (service, category) in [("RDS", "scheduledChange"), ("EC2", "issue")] {
        let other = event(
            "aws.health",
            "AWS Health Event",
            json!({"service": service, "eventTypeCategory": category}),
        );
        assert!(!pattern_matches(&health, &other), "{other}");
    }
    // Both deliver to the terminating hook, whose sweep runs on a schedule.
    for rule in ["InstanceNoticeEventsRule", "ScheduledMaintenanceEventsRule"] {
        let targets = &template["Resources"][rule]["Properties"]["Targets"];
        assert_eq!(
            targets[0]["Arn"],
            attribute("TerminatingHookFunction", "Arn")
        );
    }
    let sweep = &template["Resources"]["TerminatingHookFunction"]["Properties"]["Events"]["InstanceNoticeSweep"];
    assert_eq!(sweep["Type"], "Schedule");
    assert_eq!(sweep["Properties"]["Schedule"], "rate(5 minutes)");
}

#[test]
fn outputs_give_the_operator_everything_the_next_steps_need() {
    let template = main_template();
    let outputs = &template["Outputs"];
    assert_eq!(
        outputs["LifecycleTopicArn"]["Value"],
        reference("LifecycleTopic")
    );
    assert_eq!(
        outputs["LifecycleHookRoleArn"]["Value"],
        attribute("LifecycleHookRole", "Arn")
    );
    for (output, role) in [
        ("TerminatingHookRoleArn", "TerminatingHookRole"),
        ("LaunchingHookRoleArn", "LaunchingHookRole"),
        ("NodegroupAuthRoleArn", "NodegroupAuthRole"),
        ("NodeRepairRoleArn", "NodeRepairRole"),
    ] {
        assert_eq!(outputs[output]["Value"], attribute(role, "Arn"), "{output}");
    }
    assert_eq!(
        outputs["NodegroupAuthFunctionName"]["Value"],
        reference("NodegroupAuthFunction")
    );
}

// ------------------------------------------------------------------ tests: IAM

/// Every statement of every IAM policy in the template, with the resource that holds it.
fn policy_statements(template: &Value) -> Vec<(String, Value)> {
    let mut statements = Vec::new();
    let mut push = |owner: &str, document: &Value| {
        for statement in document["Statement"].as_array().into_iter().flatten() {
            statements.push((owner.to_owned(), statement.clone()));
        }
    };
    for (id, resource) in template["Resources"].as_object().expect("Resources") {
        let properties = &resource["Properties"];
        match resource["Type"].as_str() {
            Some("AWS::IAM::ManagedPolicy" | "AWS::IAM::Policy") => {
                push(id, &properties["PolicyDocument"]);
            }
            Some("AWS::IAM::Role") => {
                for policy in properties["Policies"].as_array().into_iter().flatten() {
                    push(id, &policy["PolicyDocument"]);
                }
            }
            _ => {}
        }
    }
    statements
}

fn as_list(value: &Value) -> Vec<Value> {
    match value {
        Value::Array(items) => items.clone(),
        Value::Null => Vec::new(),
        other => vec![other.clone()],
    }
}

#[test]
fn iam_grants_no_wildcard_action_and_resource_star_only_for_reads_without_resource_scope() {
    // Calls that support no resource-level permission (AWS service authorization reference).
    let unscoped_reads = [
        "autoscaling:DescribeAutoScalingGroups",
        "autoscaling:DescribeLifecycleHooks",
        "autoscaling:DescribeAutoScalingInstances",
        "ec2:DescribeInstances",
        "autoscaling:DescribeInstanceRefreshes",
        "autoscaling:DescribeWarmPool",
        "ec2:DescribeSpotInstanceRequests",
        "ec2:DescribeInstanceStatus",
        "ec2:DescribeLaunchTemplates",
        "elasticloadbalancing:DescribeTargetGroups",
        "elasticloadbalancing:DescribeLoadBalancers",
        "elasticloadbalancing:DescribeTags",
        "elasticloadbalancing:DescribeTargetHealth",
        "elasticloadbalancing:DescribeInstanceHealth",
        "elasticloadbalancing:DescribeTargetGroupAttributes",
        "elasticloadbalancing:DescribeLoadBalancerAttributes",
    ];
    for template in [main_template(), load_template("infra/lifecycle-hooks.yaml")] {
        for (owner, statement) in policy_statements(&template) {
            assert_eq!(statement["Effect"], "Allow", "{owner}");
            let actions = as_list(&statement["Action"]);
            for action in &actions {
                let action = action.as_str().expect("action");
                assert!(!action.contains('*'), "{owner}: {action}");
            }
            if as_list(&statement["Resource"]).contains(&json!("*")) {
                for action in &actions {
                    assert!(
                        unscoped_reads.contains(&action.as_str().unwrap_or_default()),
                        "{owner}: {action} on *"
                    );
                }
            }
        }
    }
}

#[test]
fn lifecycle_actions_only_on_groups_of_this_cluster() {
    for template in [main_template(), load_template("infra/lifecycle-hooks.yaml")] {
        let mut seen = 0;
        for (owner, statement) in policy_statements(&template) {
            let actions = as_list(&statement["Action"]);
            if !actions.contains(&json!("autoscaling:CompleteLifecycleAction")) {
                continue;
            }
            seen += 1;
            assert!(actions.contains(&json!("autoscaling:RecordLifecycleActionHeartbeat")));
            let resource = statement["Resource"]["Fn::Sub"].as_str().expect("ASG ARN");
            assert!(
                resource
                    .contains(":autoscaling:${AWS::Region}:${AWS::AccountId}:autoScalingGroup:")
            );
            // Either by cluster tag, or exactly one named group.
            let tag_condition = statement["Condition"]["StringEquals"]
                .as_object()
                .map(|c| {
                    c.iter().all(|(k, v)| {
                        k.starts_with("aws:ResourceTag/") && *v == reference("ClusterName")
                    })
                })
                .unwrap_or(false);
            let named_group = resource.ends_with("autoScalingGroupName/${AutoScalingGroupName}");
            assert!(tag_condition || named_group, "{owner}: {statement}");
        }
        assert!(seen > 0);
    }
}

#[test]
fn eks_calls_are_limited_to_this_cluster() {
    let template = main_template();
    let mut seen = BTreeSet::new();
    for (owner, statement) in policy_statements(&template) {
        for action in as_list(&statement["Action"]) {
            let action = action.as_str().expect("action").to_owned();
            if !action.starts_with("eks:") {
                continue;
            }
            for resource in as_list(&statement["Resource"]) {
                let arn = resource["Fn::Sub"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{owner} {action}"));
                assert!(
                    arn.contains(":cluster/${ClusterName}")
                        || arn.contains(":nodegroup/${ClusterName}/")
                        || arn.contains(":access-entry/${ClusterName}/"),
                    "{owner}: {action} on {arn}"
                );
            }
            seen.insert(action);
        }
    }
    for needed in [
        "eks:DescribeCluster",
        "eks:DescribeNodegroup",
        "eks:ListNodegroups",
        "eks:CreateAccessEntry",
        "eks:DeleteAccessEntry",
    ] {
        assert!(seen.contains(needed), "{needed} is not granted");
    }
}

/// Actions granted that no Rust code of ours calls, each with who uses it instead.
const GRANTED_FOR_AWS_SERVICES: &[(&str, &str)] = &[
    (
        "logs:CreateLogStream",
        "the Lambda service writes the function's logs with its role",
    ),
    (
        "logs:PutLogEvents",
        "the Lambda service writes the function's logs with its role",
    ),
    (
        "sqs:SendMessage",
        "the Lambda service sends failed asynchronous invocations to the failure queue with the function's role",
    ),
    (
        "iam:PassRole",
        "EKS checks that the caller of CreateAccessEntry may pass the EC2 node role it names",
    ),
];

/// `eks:DescribeAccessEntry` -> `describe_access_entry`, the SDK's fluent method name.
fn sdk_method(operation: &str) -> String {
    let mut method = String::new();
    for (i, c) in operation.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                method.push('_');
            }
            method.push(c.to_ascii_lowercase());
        } else {
            method.push(c);
        }
    }
    method
}

#[test]
fn every_granted_action_is_called_by_the_code_or_named_with_its_user() {
    let sources = rust_sources(&[
        repo_root().join("shared/src"),
        repo_root().join("functions"),
    ]);
    let mut unused = Vec::new();
    let mut granted = BTreeSet::new();
    for template in [main_template(), load_template("infra/lifecycle-hooks.yaml")] {
        for (owner, statement) in policy_statements(&template) {
            for action in as_list(&statement["Action"]) {
                let action = action.as_str().expect("action").to_owned();
                granted.insert(action.clone());
                if GRANTED_FOR_AWS_SERVICES.iter().any(|(a, _)| *a == action) {
                    continue;
                }
                let operation = action.split_once(':').expect("service:Operation").1;
                let call = format!(".{}()", sdk_method(operation));
                // A Query-protocol call signed by hand (IAM, see shared/src/aws/iam.rs).
                let query_action = format!("Action={operation}&");
                if !sources.contains(&call) && !sources.contains(&query_action) {
                    unused.push(format!(
                        "{owner}: {action} (no {call} in shared/src or functions/)"
                    ));
                }
            }
        }
    }
    assert!(
        unused.is_empty(),
        "granted but never called (remove it, or name who uses it in GRANTED_FOR_AWS_SERVICES):\n{}",
        unused.join("\n")
    );
    for (action, _) in GRANTED_FOR_AWS_SERVICES {
        assert!(
            granted.contains(*action),
            "{action} is listed but not granted any more"
        );
    }
    assert_eq!(sdk_method("ListAccessEntries"), "list_access_entries");
}

#[test]
fn node_access_entries_are_ec2_only_and_limited_to_node_role_entries() {
    let template = main_template();
    let parameter = &template["Parameters"]["NodeRoleNamePattern"];
    assert!(
        parameter.get("Default").is_none(),
        "NodeRoleNamePattern is required"
    );
    let mut seen = BTreeSet::new();
    for (owner, statement) in policy_statements(&template) {
        for action in as_list(&statement["Action"]) {
            let action = action.as_str().expect("action");
            if !action.contains("AccessEntr") {
                continue;
            }
            seen.insert(action.to_owned());
            assert_ne!(action, "eks:ListAccessEntries", "{owner}: never called");
            if action == "eks:CreateAccessEntry" {
                assert_eq!(
                    statement["Condition"]["StringEquals"]["eks:accessEntryType"],
                    json!(["EC2_LINUX", "EC2_WINDOWS"]),
                    "{owner}"
                );
            }
            for resource in as_list(&statement["Resource"]) {
                let arn = resource["Fn::Sub"].as_str().expect("ARN");
                if arn.contains(":access-entry/") {
                    assert!(
                        arn.ends_with(
                            ":access-entry/${ClusterName}/role/${AWS::AccountId}/${NodeRoleNamePattern}/*"
                        ),
                        "{owner}: {action} on {arn}"
                    );
                } else {
                    assert_eq!(
                        action, "eks:CreateAccessEntry",
                        "{owner}: {action} on {arn}"
                    );
                }
            }
        }
    }
    assert_eq!(
        seen,
        [
            "eks:CreateAccessEntry",
            "eks:DeleteAccessEntry",
            "eks:DescribeAccessEntry"
        ]
        .map(str::to_owned)
        .into()
    );
}

#[test]
fn the_rule_forwards_only_this_clusters_node_group_calls() {
    let template = main_template();
    let pattern = &template["Resources"]["NodegroupEventsRule"]["Properties"]["EventPattern"];
    assert_eq!(
        pattern["detail"]["requestParameters"]["name"],
        json!([reference("ClusterName")])
    );
    let event = |cluster: &str| {
        json!({
            "source": "aws.eks",
            "detail-type": "AWS API Call via CloudTrail",
            "detail": {
                "eventSource": "eks.amazonaws.com",
                "eventName": "DeleteNodegroup",
                "requestParameters": {"name": cluster, "nodegroupName": "ng"}
            }
        })
    };
    // The function serves exactly one cluster and refuses ADDITIONAL_CLUSTER_NAMES at start-up.
    let variables =
        &template["Resources"]["NodegroupAuthFunction"]["Properties"]["Environment"]["Variables"];
    assert!(variables.get("CLUSTER_NAME").is_some());
    assert!(variables.get("ADDITIONAL_CLUSTER_NAMES").is_none());
    let deployed = rule_pattern_for(&template, "blue");
    assert!(pattern_matches(&deployed, &event("blue")));
    assert!(!pattern_matches(&deployed, &event("green")));
}

#[test]
fn publishing_and_passing_roles_are_scoped() {
    let template = main_template();
    for (owner, statement) in policy_statements(&template) {
        let actions = as_list(&statement["Action"]);
        if actions.contains(&json!("sns:Publish")) {
            assert_eq!(
                statement["Resource"],
                reference("LifecycleTopic"),
                "{owner}"
            );
        }
        if actions.contains(&json!("iam:PassRole")) {
            assert_eq!(
                statement["Condition"]["StringEquals"]["iam:PassedToService"], "eks.amazonaws.com",
                "{owner}"
            );
        }
    }
}

// ------------------------------------------------------------------ tests: hooks template

/// A terminating hook that times out (the function failed) keeps the promise of
/// `DRAIN_TIMEOUT_RESULT=RETAIN`: its default result ABANDON retains the instance where the
/// group retains abandoned instances, and terminates it elsewhere (the fake Auto Scaling's
/// retention tests show both); the description says so instead of "terminates either way".
#[test]
fn the_terminate_hook_defaults_to_the_result_retention_keeps() {
    let template = load_template("infra/lifecycle-hooks.yaml");
    let parameter = &template["Parameters"]["TerminateDefaultResult"];
    assert_eq!(parameter["Default"], "ABANDON");
    let description = parameter["Description"].as_str().unwrap();
    assert!(!description.contains("either way"), "{description}");
    assert!(
        description.contains("Terminating:Retained")
            && description.contains("TerminateHookAbandon"),
        "{description}"
    );
}

#[test]
fn hooks_template_attaches_both_hooks_to_the_topic_with_parameters() {
    let template = load_template("infra/lifecycle-hooks.yaml");
    let hooks = resources_of_type(&template, "AWS::AutoScaling::LifecycleHook");
    let by_name: BTreeMap<&str, &Value> = hooks
        .values()
        .map(|h| {
            (
                h["Properties"]["LifecycleHookName"].as_str().expect("name"),
                &h["Properties"],
            )
        })
        .collect();
    assert_eq!(
        by_name.keys().copied().collect::<Vec<_>>(),
        ["Launch-LC-Hook", "Terminate-LC-Hook"]
    );
    for (name, transition, heartbeat, result) in [
        (
            "Launch-LC-Hook",
            "autoscaling:EC2_INSTANCE_LAUNCHING",
            "LaunchHeartbeatTimeout",
            "LaunchDefaultResult",
        ),
        (
            "Terminate-LC-Hook",
            "autoscaling:EC2_INSTANCE_TERMINATING",
            "TerminateHeartbeatTimeout",
            "TerminateDefaultResult",
        ),
    ] {
        let hook = by_name[name];
        assert_eq!(hook["LifecycleTransition"], transition);
        assert_eq!(hook["HeartbeatTimeout"], reference(heartbeat));
        assert_eq!(hook["DefaultResult"], reference(result));
        assert_eq!(
            hook["AutoScalingGroupName"],
            reference("AutoScalingGroupName")
        );
        assert_eq!(
            hook["NotificationTargetARN"],
            reference("LifecycleTopicArn")
        );
        assert_eq!(hook["RoleARN"], reference("LifecycleHookRoleArn"));
        let parameters = &template["Parameters"];
        assert!(parameters[heartbeat]["Default"].as_u64().is_some());
        assert_eq!(
            parameters[result]["AllowedValues"],
            json!(["CONTINUE", "ABANDON"])
        );
    }
}

// ------------------------------------------------------------------ tests: documentation

/// The operator's documentation: `infra/README.md` and every page under `docs/`.
fn operator_docs() -> String {
    let mut text = std::fs::read_to_string(repo_root().join("infra/README.md")).unwrap_or_default();
    let mut pages: Vec<PathBuf> = std::fs::read_dir(repo_root().join("docs"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    pages.sort();
    for page in pages {
        text.push_str(&std::fs::read_to_string(page).unwrap_or_default());
    }
    assert!(!text.is_empty(), "no operator documentation found");
    text
}

#[test]
fn the_operators_guide_documents_every_setting_and_parameter() {
    let template = main_template();
    let guide = operator_docs();
    let mut undocumented = Vec::new();
    for name in template["Parameters"]
        .as_object()
        .expect("Parameters")
        .keys()
    {
        if !guide.contains(&format!("`{name}`")) {
            undocumented.push(format!("parameter {name}"));
        }
    }
    for (_, function) in resources_of_type(&template, "AWS::Serverless::Function") {
        let variables = function["Properties"]["Environment"]["Variables"]
            .as_object()
            .expect("Variables");
        for name in variables.keys() {
            if !guide.contains(&format!("`{name}`")) {
                undocumented.push(format!("environment variable {name}"));
            }
        }
    }
    assert!(
        undocumented.is_empty(),
        "missing from infra/README.md and docs/: {undocumented:?}"
    );
}

/// nodegroup-auth checks that no live instance runs with a node role before unmapping it:
/// `iam:ListInstanceProfilesForRole` on the node roles only, `ec2:DescribeInstances`.
#[test]
fn nodegroup_auth_reads_instance_profiles_of_node_roles_only() {
    let template = main_template();
    let mut granted = BTreeSet::new();
    for (owner, statement) in policy_statements(&template) {
        for action in as_list(&statement["Action"]) {
            let action = action.as_str().expect("action");
            if action == "iam:ListInstanceProfilesForRole" {
                assert_eq!(
                    owner, "NodegroupAuthRole",
                    "only nodegroup-auth lists profiles"
                );
                assert_eq!(
                    statement["Resource"]["Fn::Sub"],
                    json!(
                        "arn:${AWS::Partition}:iam::${AWS::AccountId}:role/${NodeRoleNamePattern}"
                    )
                );
            }
            if owner == "NodegroupAuthRole" {
                granted.insert(action.to_owned());
            }
        }
    }
    assert!(granted.contains("iam:ListInstanceProfilesForRole"));
    assert!(granted.contains("ec2:DescribeInstances"));
}

#[test]
fn node_repair_replaces_and_reboots_only_what_carries_this_clusters_tag_on_a_schedule() {
    let template = main_template();
    let mut seen = 0;
    for (owner, statement) in policy_statements(&template) {
        let actions = as_list(&statement["Action"]);
        let acts = actions.contains(&json!("autoscaling:SetInstanceHealth"))
            || actions.contains(&json!("ec2:RebootInstances"));
        if !acts {
            continue;
        }
        seen += 1;
        assert_eq!(
            owner, "NodeRepairRole",
            "only node repair may act on instance health"
        );
        let condition = statement["Condition"]["StringEquals"].to_string();
        assert!(
            condition.contains("aws:ResourceTag/eks:cluster-name")
                || condition.contains("aws:ResourceTag/alpha.eksctl.io/cluster-name"),
            "{statement}"
        );
        assert!(condition.contains("ClusterName"), "{statement}");
        assert!(
            !as_list(&statement["Resource"]).contains(&json!("*")),
            "{statement}"
        );
    }
    assert_eq!(
        seen, 4,
        "SetInstanceHealth and RebootInstances, per cluster tag"
    );
    let function = &template["Resources"]["NodeRepairFunction"];
    let schedule = &function["Properties"]["Events"]["Schedule"];
    assert_eq!(schedule["Type"], "ScheduleV2");
    assert!(
        schedule.to_string().contains("NodeRepairSchedule"),
        "{schedule}"
    );
    assert_eq!(
        template["Parameters"]["NodeRepairSchedule"]["Default"],
        "rate(1 minute)"
    );
    assert_eq!(
        function["Properties"]["Role"],
        attribute("NodeRepairRole", "Arn")
    );
}

// ------------------------------------------------------------------ tests: alarms and dashboard

/// What the code emits as CloudWatch metrics, read from its source so that a renamed metric,
/// dimension or function fails the tests below.
struct EmittedMetrics {
    /// `METRIC_NAMESPACE` of `telemetry.rs`.
    namespace: String,
    /// Per function (its `FUNCTION_NAME`): the metric names and the dimension sets of its
    /// metric lines (`Function` included), one per source file that writes metric lines.
    functions: BTreeMap<String, (BTreeSet<String>, BTreeSet<BTreeSet<String>>)>,
    /// Every string literal of the emitting modules (outcome labels are built elsewhere).
    literals: BTreeSet<String>,
}

/// The first string literal after each occurrence of `call` (e.g. `.metric(`), wherever
/// rustfmt put it; calls with a variable first argument are skipped.
fn literal_arguments(source: &str, call: &str) -> BTreeSet<String> {
    source
        .match_indices(call)
        .filter_map(|(at, _)| {
            let rest = source[at + call.len()..].trim_start();
            let rest = rest.strip_prefix('"')?;
            Some(rest[..rest.find('"')?].to_owned())
        })
        .collect()
}

fn string_literals(source: &str) -> BTreeSet<String> {
    source
        .split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

fn emitted_metrics() -> EmittedMetrics {
    let shared = repo_root().join("shared/src");
    let telemetry = std::fs::read_to_string(shared.join("telemetry.rs")).unwrap();
    let namespace = literal_arguments(&telemetry, "METRIC_NAMESPACE: &str =")
        .into_iter()
        .next()
        .expect("telemetry.rs names the namespace");
    let mut functions = BTreeMap::new();
    let mut literals = BTreeSet::new();
    // The feature modules, each the home of one function's FUNCTION_NAME and metric lines.
    for module in ["drain", "launch", "node_repair", "nodegroup_auth"] {
        let source = rust_sources(&[shared.join(module)]);
        let name = literal_arguments(&source, "pub const FUNCTION_NAME: &str =")
            .into_iter()
            .next()
            .unwrap_or_else(|| panic!("{module} names its function"));
        let metrics = literal_arguments(&source, ".metric(");
        let dimensions = dimension_sets(&shared.join(module));
        assert!(!metrics.is_empty(), "{module} emits metrics");
        literals.extend(string_literals(&source));
        functions.insert(name, (metrics, dimensions));
    }
    EmittedMetrics {
        namespace,
        functions,
        literals,
    }
}

/// `key = 'value'` (Metrics Insights) or `key="value"` (SEARCH) pairs of a query.
fn query_filters(text: &str) -> Vec<(String, String)> {
    let mut filters = Vec::new();
    let mut rest = text;
    while let Some(eq) = rest.find('=') {
        let key: String = rest[..eq]
            .trim_end()
            .chars()
            .rev()
            .take_while(|c| c.is_ascii_alphanumeric())
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        let value_part = rest[eq + 1..].trim_start();
        let Some(quote) = value_part
            .chars()
            .next()
            .filter(|c| *c == '\'' || *c == '"')
        else {
            rest = &rest[eq + 1..];
            continue;
        };
        let value_part = &value_part[1..];
        let end = value_part.find(quote).expect("closed quote");
        filters.push((key, value_part[..end].to_owned()));
        rest = &value_part[end + 1..];
    }
    filters
}

/// One use of an emitted metric by an alarm or the dashboard.
#[derive(Debug)]
struct MetricUse {
    namespace: String,
    /// The exact dimension set (`SCHEMA(...)` / `{namespace, ...}`).
    dimensions: BTreeSet<String>,
    /// `None`: every metric of that schema (a SEARCH without `MetricName`).
    metric: Option<String>,
    filters: Vec<(String, String)>,
}

/// `SELECT FN(Metric) FROM SCHEMA("Namespace", Dim, ...) WHERE ...`.
fn parse_insights_query(query: &str) -> MetricUse {
    let metric = query
        .split_once('(')
        .and_then(|(_, r)| r.split_once(')'))
        .map(|(m, _)| m.trim().to_owned())
        .expect("SELECT FN(metric)");
    let schema = query
        .split_once("SCHEMA(")
        .and_then(|(_, r)| r.split_once(')'))
        .map(|(s, _)| s)
        .expect("FROM SCHEMA(...)");
    let mut parts = schema
        .split(',')
        .map(|p| p.trim().trim_matches('"').to_owned());
    let namespace = parts.next().expect("namespace");
    let filters = query
        .split_once("WHERE")
        .map(|(_, w)| query_filters(w))
        .unwrap_or_default();
    MetricUse {
        namespace,
        dimensions: parts.collect(),
        metric: Some(metric),
        filters,
    }
}

/// `SEARCH('{Namespace,Dim,...} Key="value" ...', 'Stat', period)`.
fn parse_search(expression: &str) -> MetricUse {
    let inner = expression
        .split_once("SEARCH('")
        .and_then(|(_, r)| r.split_once('\''))
        .map(|(i, _)| i)
        .expect("SEARCH('...')");
    let (schema, terms) = inner
        .strip_prefix('{')
        .and_then(|r| r.split_once('}'))
        .expect("{schema}");
    let mut parts = schema.split(',').map(|p| p.trim().to_owned());
    let namespace = parts.next().expect("namespace");
    let mut filters = query_filters(terms);
    let metric = filters
        .iter()
        .position(|(k, _)| k == "MetricName")
        .map(|i| filters.remove(i).1);
    MetricUse {
        namespace,
        dimensions: parts.collect(),
        metric,
        filters,
    }
}

/// Checks that `usage` names a metric the code emits, with the dimension set the code gives
/// it, for the function it filters on.
fn assert_emitted(emitted: &EmittedMetrics, usage: &MetricUse, context: &str) {
    assert_eq!(usage.namespace, emitted.namespace, "{context}");
    let function = usage
        .filters
        .iter()
        .find(|(k, _)| k == "Function")
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("{context}: filters on one function"));
    let (metrics, dimension_sets) = emitted
        .functions
        .get(function)
        .unwrap_or_else(|| panic!("{context}: no function {function} emits metrics"));
    assert!(
        dimension_sets.contains(&usage.dimensions),
        "{context}: {:?} is not the dimension set of any of {function}'s metric lines {dimension_sets:?}",
        usage.dimensions
    );
    if let Some(metric) = &usage.metric {
        assert!(
            metrics.contains(metric),
            "{context}: {function} emits no metric {metric} (it emits {metrics:?})"
        );
    }
    for (key, value) in &usage.filters {
        assert!(usage.dimensions.contains(key), "{context}: dimension {key}");
        assert!(
            emitted.literals.contains(value),
            "{context}: {key} = {value} is no value the code writes"
        );
    }
}

fn alarms(template: &Value) -> BTreeMap<&str, &Value> {
    resources_of_type(template, "AWS::CloudWatch::Alarm")
}

/// The Metrics Insights query an alarm watches, if it watches one.
fn alarm_query(alarm: &Value) -> Option<&str> {
    let metrics = alarm["Properties"]["Metrics"].as_array()?;
    assert_eq!(metrics.len(), 1, "one query");
    assert_eq!(metrics[0]["ReturnData"], true);
    metrics[0]["Expression"].as_str()
}

#[test]
fn the_metric_readers_of_these_tests_read_queries_and_sources() {
    let usage = parse_insights_query(
        r#"SELECT MAX(X) FROM SCHEMA("NS", A, B) WHERE A = 'a' AND (B = 'b' OR B = 'c')"#,
    );
    assert_eq!(usage.namespace, "NS");
    assert_eq!(usage.metric.as_deref(), Some("X"));
    assert_eq!(usage.dimensions, ["A".to_owned(), "B".to_owned()].into());
    let filters: Vec<(&str, &str)> = usage
        .filters
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(filters, [("A", "a"), ("B", "b"), ("B", "c")]);
    let search = parse_search(r#"SEARCH('{NS,A,B} A="a" MetricName="X"', 'Sum', 300)"#);
    assert_eq!(search.metric.as_deref(), Some("X"));
    assert_eq!(search.filters, [("A".to_owned(), "a".to_owned())]);
    let code = "x.metric(\n    \"Spread\",\n    1.0)\n.metric(name, 1.0).metric(\"One\", 2.0)";
    assert_eq!(
        literal_arguments(code, ".metric("),
        ["One".to_owned(), "Spread".to_owned()].into()
    );
}

#[test]
fn alarms_are_optional_and_notify_the_given_topic_or_one_the_stack_creates() {
    let template = main_template();
    let parameters = &template["Parameters"];
    assert_eq!(parameters["EnableAlarms"]["Default"], "false");
    assert_eq!(parameters["AlarmTopicArn"]["Default"], "");
    assert_eq!(
        template["Conditions"]["AlarmsEnabled"],
        json!({"Fn::Equals": [reference("EnableAlarms"), "true"]})
    );
    assert_eq!(
        template["Conditions"]["HasAlarmTopicArn"],
        json!({"Fn::Not": [{"Fn::Equals": [reference("AlarmTopicArn"), ""]}]})
    );
    let topic = &template["Resources"]["AlarmTopic"];
    assert_eq!(topic["Type"], "AWS::SNS::Topic");
    assert_eq!(topic["Condition"], "CreateAlarmTopic");
    let notify = json!([{"Fn::If": ["HasAlarmTopicArn", reference("AlarmTopicArn"), reference("AlarmTopic")]}]);
    let alarms = alarms(&template);
    assert!(alarms.len() >= 14, "{:?}", alarms.keys());
    let mut names = BTreeSet::new();
    for (id, alarm) in &alarms {
        assert_eq!(alarm["Condition"], "AlarmsEnabled", "{id}");
        let properties = &alarm["Properties"];
        assert_eq!(properties["AlarmActions"], notify, "{id}");
        assert_eq!(properties["OKActions"], notify, "{id}");
        // No data (nothing happened) is not a breach.
        assert_eq!(properties["TreatMissingData"], "notBreaching", "{id}");
        assert_eq!(
            properties["ComparisonOperator"], "GreaterThanThreshold",
            "{id}"
        );
        let name = properties["AlarmName"]["Fn::Sub"]
            .as_str()
            .unwrap_or_else(|| panic!("{id} is named after the stack"));
        assert!(name.starts_with("${AWS::StackName}-"), "{id}: {name}");
        assert!(names.insert(name), "{id}: {name} twice");
    }
}

#[test]
fn every_dead_letter_queue_and_every_function_has_its_alarms() {
    let template = main_template();
    let alarms = alarms(&template);
    let watched = |namespace: &str, metric: &str, dimension: &str, value: &Value| {
        alarms.values().any(|a| {
            let p = &a["Properties"];
            p["Namespace"] == namespace
                && p["MetricName"] == metric
                && p["Dimensions"] == json!([{"Name": dimension, "Value": value}])
                && p["Threshold"] == 0
                && p["EvaluationPeriods"] == 1
        })
    };
    // Every queue failures land in: Lambda's on-failure destinations and EventBridge's
    // dead-letter queues.
    let mut queues = BTreeSet::new();
    for (_, function) in resources_of_type(&template, "AWS::Serverless::Function") {
        let destination =
            &function["Properties"]["EventInvokeConfig"]["DestinationConfig"]["OnFailure"];
        if let Some(queue) = destination["Destination"]["Fn::GetAtt"][0].as_str() {
            queues.insert(queue.to_owned());
        }
    }
    for (_, rule) in resources_of_type(&template, "AWS::Events::Rule") {
        for target in rule["Properties"]["Targets"].as_array().unwrap() {
            if let Some(queue) = target["DeadLetterConfig"]["Arn"]["Fn::GetAtt"][0].as_str() {
                queues.insert(queue.to_owned());
            }
        }
    }
    assert_eq!(queues.len(), 4, "{queues:?}");
    for queue in &queues {
        assert!(
            watched(
                "AWS/SQS",
                "ApproximateNumberOfMessagesVisible",
                "QueueName",
                &attribute(queue, "QueueName")
            ),
            "no depth > 0 alarm on {queue}"
        );
    }
    let functions = resources_of_type(&template, "AWS::Serverless::Function");
    assert_eq!(functions.len(), 5);
    for id in functions.keys() {
        for metric in ["Errors", "Throttles"] {
            assert!(
                watched("AWS/Lambda", metric, "FunctionName", &reference(id)),
                "no {metric} alarm on {id}"
            );
        }
    }
}

#[test]
fn the_drain_deadline_paused_repairs_and_long_hand_over_chains_alarm_on_emitted_metrics() {
    let template = main_template();
    let emitted = emitted_metrics();
    let alarms = alarms(&template);
    let mut seen = BTreeMap::new();
    for (id, alarm) in &alarms {
        let Some(query) = alarm_query(alarm) else {
            continue;
        };
        let usage = parse_insights_query(query);
        assert_emitted(&emitted, &usage, id);
        let function = usage.filters[0].1.clone();
        let outcomes: BTreeSet<&str> = usage
            .filters
            .iter()
            .filter(|(k, _)| k == "Outcome")
            .map(|(_, v)| v.as_str())
            .collect();
        let threshold = alarm["Properties"]["Threshold"].clone();
        let statistic = query.split('(').next().unwrap().trim().to_owned();
        seen.insert(
            (function, usage.metric.clone().unwrap()),
            (
                statistic,
                outcomes.into_iter().map(str::to_owned).collect::<Vec<_>>(),
                threshold,
                *id,
            ),
        );
    }
    let expect = |function: &str, metric: &str| {
        seen.get(&(function.to_owned(), metric.to_owned()))
            .unwrap_or_else(|| panic!("no alarm on {function} {metric}: {seen:?}"))
    };
    // The drain reached its deadline: one completion line per drain, with the outcome.
    let (statistic, outcomes, threshold, _) = expect("terminating-hook", "DrainDuration");
    assert_eq!(statistic, "SELECT COUNT");
    assert_eq!(outcomes, &["Forced", "PodEvictionFailure"]);
    assert_eq!(threshold, &json!(0));
    // A repair paused in any group.
    let (statistic, outcomes, threshold, _) = expect("node-repair", "RepairsPaused");
    assert_eq!(statistic, "SELECT MAX");
    assert!(outcomes.is_empty());
    assert_eq!(threshold, &json!(0));
    // Hand-over chains longer than the parameter allows, for both waits that hand over.
    for (function, metric) in [
        ("terminating-hook", "HandOvers"),
        ("launching-hook", "Continuations"),
    ] {
        let (statistic, _, threshold, id) = expect(function, metric);
        assert_eq!(statistic, "SELECT MAX", "{id}");
        assert_eq!(threshold, &reference("HandOverChainThreshold"), "{id}");
    }
    // With the default settings a drain needs at most two hand-overs: the threshold default
    // leaves room for them and no more than one extra.
    let per_invocation = 900
        - template["Parameters"]["HandOverMarginSeconds"]["Default"]
            .as_u64()
            .unwrap();
    let drain = template["Parameters"]["DrainTimeoutSeconds"]["Default"]
        .as_u64()
        .unwrap()
        + template["Parameters"]["SettleSeconds"]["Default"]
            .as_u64()
            .unwrap();
    let needed = drain.div_ceil(per_invocation);
    let threshold = template["Parameters"]["HandOverChainThreshold"]["Default"]
        .as_u64()
        .unwrap();
    assert!(
        needed <= threshold && threshold <= needed + 1,
        "{needed} {threshold}"
    );
}

/// The dashboard body with its `${...}` substitutions kept as placeholders.
fn dashboard_body(template: &Value) -> Value {
    let dashboard = &template["Resources"]["Dashboard"];
    assert_eq!(dashboard["Type"], "AWS::CloudWatch::Dashboard");
    assert_eq!(dashboard["Condition"], "DashboardEnabled");
    let body = dashboard["Properties"]["DashboardBody"]["Fn::Sub"]
        .as_str()
        .expect("a !Sub body");
    serde_json::from_str(body).expect("the dashboard body is JSON")
}

#[test]
fn the_dashboard_shows_drains_evictions_waves_repairs_and_errors_from_emitted_metrics() {
    let template = main_template();
    let emitted = emitted_metrics();
    let body = dashboard_body(&template);
    let resources = template["Resources"].as_object().unwrap();
    let mut shown: BTreeSet<(String, String)> = BTreeSet::new();
    for widget in body["widgets"].as_array().expect("widgets") {
        let properties = &widget["properties"];
        let title = properties["title"].as_str().expect("a title");
        assert_eq!(properties["region"], "${AWS::Region}", "{title}");
        for line in properties["metrics"].as_array().expect("metrics") {
            let line = line.as_array().expect("a metric line");
            if let Some(expression) = line[0]["expression"].as_str() {
                let usage = parse_search(expression);
                assert_emitted(&emitted, &usage, title);
                let function = &usage.filters[0].1;
                shown.insert((
                    function.clone(),
                    usage.metric.clone().unwrap_or_else(|| "*".to_owned()),
                ));
                continue;
            }
            // [namespace, metric, dimension, "${Resource}" or "${Resource.Attribute}", {..}]
            let namespace = line[0].as_str().unwrap();
            let metric = line[1].as_str().unwrap();
            let value = line[3].as_str().unwrap();
            let resource = value
                .strip_prefix("${")
                .and_then(|v| v.strip_suffix('}'))
                .map(|v| v.split('.').next().unwrap())
                .unwrap_or_else(|| panic!("{title}: {value} is not a resource of the stack"));
            let kind = resources[resource]["Type"].as_str().unwrap();
            match (namespace, line[2].as_str().unwrap()) {
                ("AWS/Lambda", "FunctionName") => assert_eq!(kind, "AWS::Serverless::Function"),
                ("AWS/SQS", "QueueName") => assert_eq!(kind, "AWS::SQS::Queue"),
                other => panic!("{title}: unexpected {other:?}"),
            }
            shown.insert((resource.to_owned(), metric.to_owned()));
        }
    }
    let must_show = [
        ("terminating-hook", "DrainDuration"),
        ("terminating-hook", "PodsEvicted"),
        // A refused eviction retried when its budget allows: the drain's waves.
        ("terminating-hook", "EvictionRetries"),
        ("terminating-hook", "HandOvers"),
        ("node-repair", "RepairsStarted"),
        ("node-repair", "RepairsPaused"),
        ("node-repair", "UnhealthyNodes"),
        (
            "FailedInvocationsQueue",
            "ApproximateNumberOfMessagesVisible",
        ),
        (
            "NodegroupEventsDeadLetterQueue",
            "ApproximateNumberOfMessagesVisible",
        ),
    ];
    for (what, metric) in must_show {
        assert!(
            shown.contains(&(what.to_owned(), metric.to_owned())),
            "the dashboard does not show {what} {metric}"
        );
    }
    for id in resources_of_type(&template, "AWS::Serverless::Function").keys() {
        for metric in ["Errors", "Throttles"] {
            assert!(
                shown.contains(&((*id).to_owned(), metric.to_owned())),
                "the dashboard does not show {metric} of {id}"
            );
        }
    }
}

#[test]
fn each_alarm_links_the_section_of_the_operating_guide_that_says_what_to_do() {
    let template = main_template();
    let guide =
        std::fs::read_to_string(repo_root().join("docs/operating.md")).expect("docs/operating.md");
    // GitHub's anchors: lower case, spaces to hyphens, punctuation dropped.
    let anchors: BTreeSet<String> = guide
        .lines()
        .filter_map(|l| l.strip_prefix("## ").or_else(|| l.strip_prefix("### ")))
        .map(|heading| {
            heading
                .trim()
                .to_lowercase()
                .chars()
                .filter_map(|c| match c {
                    ' ' => Some('-'),
                    c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                    _ => None,
                })
                .collect()
        })
        .collect();
    for (id, alarm) in alarms(&template) {
        let description = alarm["Properties"]["AlarmDescription"]["Fn::Sub"]
            .as_str()
            .unwrap_or_else(|| panic!("{id} has a description"));
        let anchor = description
            .split_once("docs/operating.md#")
            .map(|(_, a)| a.trim())
            .unwrap_or_else(|| panic!("{id} links docs/operating.md"));
        assert!(
            anchors.contains(anchor),
            "{id}: docs/operating.md has no section #{anchor} ({anchors:?})"
        );
    }
}
