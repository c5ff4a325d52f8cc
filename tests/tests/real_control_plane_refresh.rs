//! An instance refresh on the real control plane (kube-apiserver, etcd,
//! kube-controller-manager, kube-scheduler; built by `scripts/control-plane.sh build`): a node
//! group of four nodes runs Deployments behind PodDisruptionBudgets; the fake Auto Scaling
//! replaces every instance, batch by batch, through the group's lifecycle hooks; replacements
//! register as Ready nodes served by kwok; the built `launching-hook`
//! completes each new node, the built `terminating-hook` drains each replaced one, and the
//! built `instance-refresh` gets the refresh's and the instances' EventBridge events as the
//! stack's rule routes them. kube-scheduler places every evicted pod's replacement.
//!
//! What a user sees is asserted: the refresh ends `Successful`, every pod of an outdated node
//! was evicted (none deleted without an eviction), no budget was broken, no mark is left, and
//! the evictions per pod (from the plane's audit log) are no more than the same refresh gives
//! without `instance-refresh`, which runs beside it for the comparison. The scenario lives in
//! the test kit (`control_plane::scenarios::refresh`), where `sandbox --real-control-plane`
//! plays it too.
//!
//! The `measured_*` tests (`#[ignore]`d: skipped unless run with `--run-ignored`) add launch
//! before terminate and a 10-node group, each printing its rows of BENCHMARKS.md §12.
//!
//! Skipped with a printed line when `SKIP_REAL_CONTROL_PLANE_TESTS=1` and the plane is not
//! built.
#![allow(clippy::unwrap_used)]

use node_manager_testkit::control_plane::binaries_or_skip;
use node_manager_testkit::control_plane::scenarios::refresh::{
    LARGE, Run, SMALL, Shape, Strategy, compare, refresh_on_the_real_plane,
};
use node_manager_testkit::control_plane::scenarios::{RealScenario, play_as_test};

/// Terminate first on four nodes, with and without `instance-refresh` (what CI runs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_refresh_moves_pods_no_more_often_with_the_function_on_a_real_cluster() {
    play_as_test(
        "an_instance_refresh_moves_pods_no_more_often_with_the_function_on_a_real_cluster",
        RealScenario::Refresh,
    )
    .await;
}

/// The measured variants, one test each to stay within the test timeout: `#[ignore]`d (a
/// normal run counts them as skipped), run with `--run-ignored`.
async fn measured(test: &str, shape: Shape, strategy: Strategy) {
    let Some(bin) = binaries_or_skip(test) else {
        return;
    };
    compare(&bin, shape, strategy)
        .await
        .unwrap()
        .assert_held(test);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measures BENCHMARKS.md §12 (minutes): run with --run-ignored"]
async fn measured_refresh_launch_first_4_nodes() {
    measured(
        "measured_refresh_launch_first_4_nodes",
        SMALL,
        Strategy::LaunchFirst,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measures BENCHMARKS.md §12 (minutes): run with --run-ignored"]
async fn measured_refresh_launch_first_10_nodes() {
    measured(
        "measured_refresh_launch_first_10_nodes",
        LARGE,
        Strategy::LaunchFirst,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measures BENCHMARKS.md §12 (minutes): run with --run-ignored"]
async fn measured_refresh_terminate_first_10_nodes() {
    measured(
        "measured_refresh_terminate_first_10_nodes",
        LARGE,
        Strategy::TerminateFirst,
    )
    .await;
}

/// The checks can fail: a pod deleted (not evicted) as the refresh starts is reported as a pod
/// of an outdated node that was never evicted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_deleted_without_an_eviction_during_a_refresh_is_caught_on_a_real_cluster() {
    let Some(bin) = binaries_or_skip(
        "a_pod_deleted_without_an_eviction_during_a_refresh_is_caught_on_a_real_cluster",
    ) else {
        return;
    };
    let run = Run {
        shape: SMALL,
        strategy: Strategy::LaunchFirst,
        with_function: true,
        plant_deletion: true,
    };
    let figures = refresh_on_the_real_plane(&bin, run).await.unwrap();
    assert_eq!(figures.status.as_deref(), Some("Successful"), "{figures:?}");
    assert_eq!(figures.not_evicted.len(), 1, "{figures:?}");
    let faults = figures.violations();
    assert_eq!(faults.len(), 1, "{faults:#?}");
    assert!(faults[0].contains("without an eviction"), "{faults:#?}");
}
