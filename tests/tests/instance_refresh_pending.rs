//! Issue #36, item 1, end to end in the sandbox (the built `instance-refresh`,
//! `terminating-hook` and `launching-hook` binaries against the fake Auto Scaling, whose
//! refresh runs the lifecycle hooks and emits the EventBridge events): a terminate-first
//! refresh of a group whose termination policy is `NewestInstance`, so Auto Scaling replaces
//! the newest instance first. That is the node the old rule kept schedulable as "room" (the
//! last one in `DescribeAutoScalingGroups`' order) while it cordoned the others: the first
//! evicted pod then had no node, stayed Pending, and its PodDisruptionBudget refused every
//! other eviction until the drain deadline. With the room rule no evicted pod waits for a
//! node anywhere near that deadline.
//!
//! Uses the binaries as built: run `cargo build --workspace --bins --tests` after changing them.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use node_manager_testkit::sandbox::scenario::InstanceRefreshStep;
use node_manager_testkit::sandbox::{Sandbox, Scenario};

/// The drain deadline of the scenario: a pod Pending for lack of a node waits about this long.
const DRAIN_TIMEOUT_SECONDS: f64 = 20.0;

fn scenario() -> Scenario {
    Scenario::from_yaml(&format!(
        "name: refresh-newest-first
timings: {{ settleSeconds: 0.2, drainTimeoutSeconds: {DRAIN_TIMEOUT_SECONDS}, launchTimeoutSeconds: 20, nodeRegisterSeconds: 0.3, nodeReadySeconds: 0.3, podStartSeconds: 0.3, gracePeriodScale: 0.01 }}
nodegroups:
  - {{ name: ng, autoScalingGroup: asg-newest-first, nodeRole: NodeRole, nodes: 3, terminationPolicies: [NewestInstance] }}
workloads:
  - {{ kind: DaemonSet, namespace: kube-system, name: aws-node }}
  - {{ kind: Deployment, namespace: app, name: web, replicas: 6, pdb: {{ maxUnavailable: 1 }} }}
steps: []
"
    ))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminate_first_with_the_newest_replaced_first_leaves_no_evicted_pod_pending() {
    let sandbox = Sandbox::start(scenario(), false).await.unwrap();
    let step = InstanceRefreshStep {
        nodegroup: "ng".to_owned(),
        min_healthy_percentage: 90,
        max_healthy_percentage: 100,
        // Auto Scaling waits this long after a replacement is in service before the next
        // batch: the time the refresh's plan has to use the new room.
        instance_warmup_seconds: 1.0,
        expect_status: "Successful".to_owned(),
        expect_no_pod_moved_twice: false,
    };
    let figures = sandbox.run_instance_refresh(&step).await;
    sandbox.shutdown().await;
    let figures = figures.unwrap();
    assert_eq!(figures.status.as_deref(), Some("Successful"), "{figures:?}");
    assert!(
        figures.longest_pending < Duration::from_secs_f64(DRAIN_TIMEOUT_SECONDS / 4.0),
        "an evicted pod waited {:?} for a node (drain deadline {DRAIN_TIMEOUT_SECONDS} s): {figures:?}",
        figures.longest_pending
    );
    assert_eq!(figures.pdb_violations, 0, "{figures:?}");
    assert!(figures.cordoned_left.is_empty(), "{figures:?}");
}
