//! The plan as a table for people and as JSON (`-o json`) for scripts and tests.

use std::fmt::Write as _;

use crate::preview::{LeftReason, Preview, Tier};

/// The plan as pretty JSON, with a final newline.
pub fn json(preview: &Preview) -> String {
    let mut text = serde_json::to_string_pretty(preview).unwrap_or_else(|e| {
        // Serializing plain data cannot fail; say so rather than print nothing.
        format!("{{\"error\": \"cannot serialize the plan: {e}\"}}")
    });
    text.push('\n');
    text
}

/// Columns padded to their widest cell.
fn columns(rows: &[Vec<String>]) -> String {
    let widths: Vec<usize> = (0..rows.first().map_or(0, Vec::len))
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::from("  ");
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<width$}  ", width = widths[i]);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn tier(tier: Tier) -> &'static str {
    match tier {
        Tier::Ordinary => "ordinary",
        Tier::Critical => "critical",
    }
}

fn reason(reason: LeftReason) -> &'static str {
    match reason {
        LeftReason::DaemonSet => "DaemonSet pod",
        LeftReason::Mirror => "mirror (static) pod",
        LeftReason::ToleratesCordon => "came back after the cordon and tolerates it",
        LeftReason::StuckDeletion => "deletion stuck: no longer waited for",
    }
}

/// The plan as sections of aligned columns.
pub fn table(preview: &Preview) -> String {
    let mut out = String::new();
    node_line(&mut out, preview);
    evicted_section(&mut out, preview);
    waited_sections(&mut out, preview);
    left_section(&mut out, preview);
    volumes_section(&mut out, preview);
    load_balancers_section(&mut out, preview);
    budgets_section(&mut out, preview);
    estimate_section(&mut out, preview);
    out
}

fn node_line(out: &mut String, preview: &Preview) {
    let node = &preview.node;
    let _ = writeln!(
        out,
        "Node {} (instance {}, {}){}",
        node.name,
        node.instance_id.as_deref().unwrap_or("unknown"),
        if node.ready { "Ready" } else { "not Ready" },
        node.draining_since
            .map(|t| format!(", drain under way since {t}"))
            .unwrap_or_default()
    );
}

fn evicted_section(out: &mut String, preview: &Preview) {
    let _ = writeln!(out, "\nEvicted, in this order (critical last):");
    if preview.evict.is_empty() {
        out.push_str("  none\n");
        return;
    }
    let mut rows = vec![
        ["TIER", "POD", "BUDGETS", "GRACE", "NOTES"]
            .map(String::from)
            .to_vec(),
    ];
    for pod in &preview.evict {
        let mut notes = Vec::new();
        if pod.local_storage {
            notes.push("local storage (lost)");
        }
        if pod.no_controller {
            notes.push("no controller (not recreated)");
        }
        if preview.estimate.blocked.contains(&pod.pod) {
            notes.push("BLOCKED now");
        }
        rows.push(vec![
            tier(pod.tier).to_owned(),
            pod.pod.to_string(),
            if pod.budgets.is_empty() {
                "-".to_owned()
            } else {
                pod.budgets.join(",")
            },
            format!("{}s", pod.grace_period_seconds),
            notes.join("; "),
        ]);
    }
    out.push_str(&columns(&rows));
}

/// Pods the drain waits for without evicting them: already terminating, or held.
fn waited_sections(out: &mut String, preview: &Preview) {
    if !preview.terminating.is_empty() {
        let _ = writeln!(out, "\nAlready terminating (waited for):");
        for pod in &preview.terminating {
            let _ = writeln!(out, "  {pod}");
        }
    }
    if !preview.held.is_empty() {
        let _ = writeln!(
            out,
            "\nHeld, never evicted (karpenter.sh/do-not-disrupt): the drain waits for its deadline:"
        );
        for pod in &preview.held {
            let _ = writeln!(out, "  {pod}");
        }
    }
}

fn left_section(out: &mut String, preview: &Preview) {
    let _ = writeln!(out, "\nLeft on the node:");
    if preview.left.is_empty() {
        out.push_str("  none\n");
        return;
    }
    let mut rows = vec![vec!["POD".to_owned(), "WHY".to_owned()]];
    rows.extend(
        preview
            .left
            .iter()
            .map(|p| vec![p.pod.to_string(), reason(p.reason).to_owned()]),
    );
    out.push_str(&columns(&rows));
}

/// The volumes attached to the node, and those the drain waits for once the pods are gone.
fn volumes_section(out: &mut String, preview: &Preview) {
    let Some(volumes) = &preview.volumes else {
        let _ = writeln!(
            out,
            "\nVolumes: unknown (cannot list VolumeAttachments: grant list on volumeattachments.storage.k8s.io)"
        );
        return;
    };
    if volumes.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\nVolumes attached to the node (once the pods are gone, the drain waits up to {} s for those marked yes to detach):",
        preview.volume_detach_seconds
    );
    let mut rows = vec![["VOLUME", "PODS", "WAITED FOR"].map(String::from).to_vec()];
    for volume in volumes {
        let pods: Vec<String> = volume.pods.iter().map(ToString::to_string).collect();
        rows.push(vec![
            volume.volume.clone(),
            if pods.is_empty() {
                "-".to_owned()
            } else {
                pods.join(",")
            },
            if volume.waited_for {
                "yes"
            } else {
                "no: a pod that stays mounts it"
            }
            .to_owned(),
        ]);
    }
    out.push_str(&columns(&rows));
}

/// The load balancers routing to the instance, when asked.
fn load_balancers_section(out: &mut String, preview: &Preview) {
    let Some(routing) = &preview.load_balancers else {
        return;
    };
    if routing.is_empty() {
        let _ = writeln!(
            out,
            "\nNo load balancer of the cluster routes to the instance: no wait for load balancers."
        );
        return;
    }
    let _ = writeln!(
        out,
        "\nLoad balancers routing to the instance (once the pods are gone, the drain waits for each to let go):"
    );
    let mut rows = vec![
        ["LOAD BALANCER", "STATE", "DEREGISTRATION DELAY"]
            .map(String::from)
            .to_vec(),
    ];
    for lb in routing {
        rows.push(vec![
            lb.name.clone(),
            lb.state.to_owned(),
            format!("{}s", lb.deregistration_delay_seconds),
        ]);
    }
    out.push_str(&columns(&rows));
}

fn budgets_section(out: &mut String, preview: &Preview) {
    let _ = writeln!(out, "\nPodDisruptionBudgets:");
    if preview.budgets.is_empty() {
        out.push_str("  none selects a pod to evict\n");
        return;
    }
    let mut rows = vec![
        ["BUDGET", "ALLOWED", "PODS HERE", "WAVES", "NOW"]
            .map(String::from)
            .to_vec(),
    ];
    for b in &preview.budgets {
        rows.push(vec![
            format!("{}/{}", b.namespace, b.name),
            b.disruptions_allowed.to_string(),
            b.pods_to_evict.to_string(),
            b.waves.map_or("-".to_owned(), |w| w.to_string()),
            if b.blocks_now { "BLOCKS" } else { "allows" }.to_owned(),
        ]);
    }
    out.push_str(&columns(&rows));
}

fn estimate_section(out: &mut String, preview: &Preview) {
    let estimate = &preview.estimate;
    let _ = writeln!(out, "\nEstimate:");
    match (estimate.waves, estimate.seconds) {
        (Some(waves), Some(seconds)) => {
            let _ = writeln!(
                out,
                "  {waves} wave(s), about {seconds}s with the settle period (deadline in {}s)",
                estimate.deadline_seconds
            );
        }
        _ => {
            let blocked: Vec<String> = estimate.blocked.iter().map(ToString::to_string).collect();
            let _ = writeln!(
                out,
                "  blocked now: {} cannot be evicted (deadline in {}s)",
                blocked.join(", "),
                estimate.deadline_seconds
            );
        }
    }
    if estimate.reaches_deadline {
        let _ = writeln!(
            out,
            "  The drain would reach its deadline: {}.",
            estimate.at_deadline
        );
    } else {
        out.push_str("  The drain would finish before its deadline.\n");
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::time::Duration;

    use k8s_openapi::api::core::v1::{Node, Pod};
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    use node_manager::lifecycle::settings::DrainSettings;
    use serde_json::{Value, json};

    use super::*;
    use crate::preview::preview;
    use crate::snapshot::{NodeVolumes, Snapshot};

    fn settings(extra: &[(&str, &str)]) -> DrainSettings {
        let mut env = vec![("CLUSTER_NAME", "test")];
        env.extend_from_slice(extra);
        DrainSettings::from_source(env.as_slice()).unwrap()
    }

    fn node() -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": "ip-10-0-1-1.eu-west-1.compute.internal"},
            "spec": {"providerID": "aws:///eu-west-1a/i-0123456789abcdef0"},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }))
        .unwrap()
    }

    fn pod(namespace: &str, name: &str, extra: Value) -> Pod {
        let mut value = json!({
            "metadata": {
                "namespace": namespace, "name": name, "uid": format!("uid-{name}"),
                "labels": {"app": name.split('-').next().unwrap()},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "rs", "controller": true}],
            },
            "spec": {"nodeName": "ip-10-0-1-1.eu-west-1.compute.internal", "containers": []},
        });
        merge(&mut value, extra);
        serde_json::from_value(value).unwrap()
    }

    fn merge(base: &mut Value, extra: Value) {
        match (base, extra) {
            (Value::Object(b), Value::Object(e)) => {
                for (k, v) in e {
                    merge(b.entry(k).or_insert(Value::Null), v);
                }
            }
            (b, e) => *b = e,
        }
    }

    fn budget(name: &str, app: &str, allowed: i32) -> PodDisruptionBudget {
        serde_json::from_value(json!({
            "metadata": {"namespace": "default", "name": name},
            "spec": {"selector": {"matchLabels": {"app": app}}, "maxUnavailable": 1},
            "status": {"disruptionsAllowed": allowed, "currentHealthy": 3, "desiredHealthy": 2, "expectedPods": 3},
        }))
        .unwrap()
    }

    /// web (3 pods, a budget allowing 1), a bare pod with scratch space, coredns (critical), a
    /// DaemonSet pod and a mirror pod.
    fn snapshot(web_allowed: i32) -> Snapshot {
        Snapshot {
            node: node(),
            pods: vec![
                pod(
                    "default",
                    "web-1",
                    json!({"spec": {"terminationGracePeriodSeconds": 20}}),
                ),
                pod(
                    "default",
                    "web-2",
                    json!({"spec": {"terminationGracePeriodSeconds": 20}}),
                ),
                pod(
                    "default",
                    "web-3",
                    json!({"spec": {"terminationGracePeriodSeconds": 20}}),
                ),
                pod(
                    "default",
                    "scratch",
                    json!({
                        "metadata": {"ownerReferences": []},
                        "spec": {"volumes": [{"name": "tmp", "emptyDir": {}}], "terminationGracePeriodSeconds": 5},
                    }),
                ),
                pod(
                    "kube-system",
                    "coredns-1",
                    json!({"spec": {"priorityClassName": "system-cluster-critical", "terminationGracePeriodSeconds": 10}}),
                ),
                pod(
                    "kube-system",
                    "aws-node-x",
                    json!({"metadata": {"ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "aws-node", "uid": "ds", "controller": true}]}}),
                ),
                pod(
                    "kube-system",
                    "etcd-static",
                    json!({"metadata": {"annotations": {"kubernetes.io/config.mirror": "x"}}}),
                ),
            ],
            budgets: vec![
                budget("web", "web", web_allowed),
                budget("unrelated", "other", 0),
            ],
            volumes: None,
            load_balancers: None,
        }
    }

    fn now() -> jiff::Timestamp {
        jiff::Timestamp::from_second(1_700_000_000).unwrap()
    }

    #[test]
    fn json_lists_tiers_left_pods_budgets_and_the_estimate() {
        let preview = preview(&snapshot(1), &settings(&[]), now());
        let doc: Value = serde_json::from_str(&json(&preview)).unwrap();
        assert_eq!(doc["node"]["instanceId"], "i-0123456789abcdef0");
        assert_eq!(doc["node"]["ready"], true);
        let evicted: Vec<(&str, &str)> = doc["evict"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (p["name"].as_str().unwrap(), p["tier"].as_str().unwrap()))
            .collect();
        assert_eq!(
            evicted,
            [
                ("scratch", "ordinary"),
                ("web-1", "ordinary"),
                ("web-2", "ordinary"),
                ("web-3", "ordinary"),
                ("coredns-1", "critical"),
            ]
        );
        let scratch = &doc["evict"][0];
        assert_eq!(scratch["localStorage"], true);
        assert_eq!(scratch["noController"], true);
        assert_eq!(scratch["budgets"], json!([]));
        assert_eq!(doc["evict"][1]["budgets"], json!(["web"]));
        assert_eq!(doc["evict"][1]["noController"], false);
        assert_eq!(
            doc["left"],
            json!([
                {"namespace": "kube-system", "name": "aws-node-x", "reason": "DaemonSet"},
                {"namespace": "kube-system", "name": "etcd-static", "reason": "Mirror"},
            ])
        );
        // Only the budget that selects a pod to evict.
        assert_eq!(
            doc["budgets"],
            json!([{"namespace": "default", "name": "web", "disruptionsAllowed": 1, "podsToEvict": 3, "blocksNow": false, "waves": 3}])
        );
        // Ordinary: 3 waves (web, one at a time) of 20 s; critical: 1 wave of 10 s; settle 60 s.
        let estimate = &doc["estimate"];
        assert_eq!(estimate["waves"], 4);
        assert_eq!(estimate["seconds"], 3 * 20 + 10 + 60);
        assert_eq!(estimate["deadlineSeconds"], 900);
        assert_eq!(estimate["reachesDeadline"], false);
        assert_eq!(estimate["blocked"], json!([]));
    }

    #[test]
    fn a_budget_allowing_nothing_blocks_and_the_deadline_is_reached() {
        let preview = preview(
            &snapshot(0),
            &settings(&[("DRAIN_TIMEOUT_SECONDS", "120")]),
            now(),
        );
        let doc: Value = serde_json::from_str(&json(&preview)).unwrap();
        assert_eq!(doc["budgets"][0]["blocksNow"], true);
        assert_eq!(doc["budgets"][0]["waves"], Value::Null);
        let estimate = &doc["estimate"];
        assert_eq!(estimate["reachesDeadline"], true);
        assert_eq!(estimate["waves"], Value::Null);
        assert_eq!(estimate["deadlineSeconds"], 120);
        let blocked: Vec<&str> = estimate["blocked"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap())
            .collect();
        assert_eq!(blocked, ["web-1", "web-2", "web-3"]);
        assert!(
            estimate["atDeadline"]
                .as_str()
                .unwrap()
                .contains("CONTINUE")
        );
        let forced = preview_with_force();
        assert!(forced.estimate.at_deadline.contains("DRAIN_FORCE"));
    }

    fn preview_with_force() -> Preview {
        preview(&snapshot(0), &settings(&[("DRAIN_FORCE", "true")]), now())
    }

    #[test]
    fn a_long_estimate_reaches_the_deadline_without_a_blocking_budget() {
        let preview = preview(
            &snapshot(1),
            &settings(&[("DRAIN_TIMEOUT_SECONDS", "100")]),
            now(),
        );
        assert_eq!(preview.estimate.seconds, Some(130));
        assert!(preview.estimate.reaches_deadline);
        assert!(preview.estimate.blocked.is_empty());
        // POD_GRACE_PERIOD_SECONDS overrides every pod's own grace period.
        let short = preview_with(&[("POD_GRACE_PERIOD_SECONDS", "1"), ("SETTLE_SECONDS", "0")]);
        assert_eq!(short.estimate.seconds, Some(4));
        assert_eq!(
            short.estimate.deadline_seconds,
            Duration::from_secs(900).as_secs()
        );
    }

    #[test]
    fn a_do_not_disrupt_pod_is_held_and_the_drain_reaches_its_deadline() {
        let mut snapshot = snapshot(1);
        let batch = pod(
            "default",
            "batch-1",
            json!({"metadata": {"annotations": {"karpenter.sh/do-not-disrupt": "true"}}}),
        );
        snapshot.pods.push(batch);
        let preview = preview(
            &snapshot,
            &settings(&[("DRAIN_TIMEOUT_RESULT", "RETAIN")]),
            now(),
        );
        let doc: Value = serde_json::from_str(&json(&preview)).unwrap();
        assert_eq!(
            doc["held"],
            json!([{"namespace": "default", "name": "batch-1"}])
        );
        assert!(
            doc["evict"]
                .as_array()
                .unwrap()
                .iter()
                .all(|p| p["name"] != "batch-1")
        );
        let estimate = &doc["estimate"];
        assert_eq!(estimate["reachesDeadline"], true);
        assert_eq!(
            estimate["blocked"],
            json!([{"namespace": "default", "name": "batch-1"}])
        );
        assert!(
            estimate["atDeadline"]
                .as_str()
                .unwrap()
                .contains("ABANDON if the group retains"),
            "{estimate}"
        );
        let text = table(&preview);
        assert!(
            text.contains(
                "Held, never evicted (karpenter.sh/do-not-disrupt): the drain waits for its deadline:\n  default/batch-1\n"
            ),
            "{text}"
        );
    }

    fn preview_with(extra: &[(&str, &str)]) -> Preview {
        preview(&snapshot(1), &settings(extra), now())
    }

    #[test]
    fn the_table_shows_each_section_with_its_pods() {
        let text = table(&preview(&snapshot(0), &settings(&[]), now()));
        let expected_lines = [
            "Node ip-10-0-1-1.eu-west-1.compute.internal (instance i-0123456789abcdef0, Ready)",
            "Evicted, in this order (critical last):",
            "  TIER      POD                    BUDGETS  GRACE  NOTES",
            "  ordinary  default/scratch        -        5s     local storage (lost); no controller (not recreated)",
            "  ordinary  default/web-1          web      20s    BLOCKED now",
            "  critical  kube-system/coredns-1  -        10s",
            "Left on the node:",
            "  kube-system/aws-node-x   DaemonSet pod",
            "  kube-system/etcd-static  mirror (static) pod",
            "PodDisruptionBudgets:",
            "  BUDGET       ALLOWED  PODS HERE  WAVES  NOW",
            "  default/web  0        3          -      BLOCKS",
            "  blocked now: default/web-1, default/web-2, default/web-3 cannot be evicted (deadline in 900s)",
            "  The drain would reach its deadline: the lifecycle action completes with CONTINUE and the pods still there go with the instance (PodEvictionFailure).",
        ];
        for line in expected_lines {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in:\n{text}"
            );
        }
        // Sections in order, critical after ordinary.
        let at = |s: &str| text.find(s).unwrap();
        assert!(at("Evicted") < at("Left on") && at("Left on") < at("PodDisruptionBudgets"));
        assert!(at("default/web-3") < at("kube-system/coredns-1"));
        let fine = table(&preview(&snapshot(1), &settings(&[]), now()));
        assert!(
            fine.contains("  4 wave(s), about 130s with the settle period (deadline in 900s)\n"),
            "{fine}"
        );
        assert!(fine.contains("The drain would finish before its deadline."));
        assert!(
            fine.contains("  default/web  1        3          3      allows"),
            "{fine}"
        );
    }

    fn attachment(volume: &str) -> k8s_openapi::api::storage::v1::VolumeAttachment {
        serde_json::from_value(json!({
            "metadata": {"name": format!("csi-{volume}")},
            "spec": {"attacher": "ebs.csi.aws.com", "nodeName": "ip-10-0-1-1.eu-west-1.compute.internal",
                     "source": {"persistentVolumeName": volume}},
        }))
        .unwrap()
    }

    #[test]
    fn the_volumes_the_drain_waits_for_are_those_no_staying_pod_mounts() {
        let mut with_volumes = snapshot(1);
        let claim = |pod: &mut Pod, name: &str| {
            pod.spec.as_mut().unwrap().volumes = Some(vec![
                serde_json::from_value(
                    json!({"name": "data", "persistentVolumeClaim": {"claimName": name}}),
                )
                .unwrap(),
            ]);
        };
        claim(&mut with_volumes.pods[0], "data-web-1");
        claim(&mut with_volumes.pods[5], "logs");
        with_volumes.volumes = Some(NodeVolumes {
            attachments: vec![attachment("pv-web-1"), attachment("pv-logs")],
            claims: [
                (
                    ("default".to_owned(), "data-web-1".to_owned()),
                    "pv-web-1".to_owned(),
                ),
                (
                    ("kube-system".to_owned(), "logs".to_owned()),
                    "pv-logs".to_owned(),
                ),
            ]
            .into(),
        });
        let text = table(&preview(&with_volumes, &settings(&[]), now()));
        for line in [
            "Volumes attached to the node (once the pods are gone, the drain waits up to 300 s for those marked yes to detach):",
            "  VOLUME    PODS                    WAITED FOR",
            "  pv-web-1  default/web-1           yes",
            "  pv-logs   kube-system/aws-node-x  no: a pod that stays mounts it",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in:\n{text}"
            );
        }
        let doc: Value =
            serde_json::from_str(&json(&preview(&with_volumes, &settings(&[]), now()))).unwrap();
        assert_eq!(doc["volumes"][0]["volume"], "pv-web-1");
        assert_eq!(doc["volumes"][0]["waitedFor"], true);
        assert_eq!(doc["volumes"][1]["waitedFor"], false);
        let unknown = table(&preview(&snapshot(1), &settings(&[]), now()));
        assert!(
            unknown.contains("Volumes: unknown (cannot list VolumeAttachments"),
            "{unknown}"
        );
    }
}
