//! The launching hook selects the launching instance's node by name (issue #24 item 8): a
//! launch must not list or watch every node of the cluster when the node's name is known
//! (the instance's private DNS name), and a node named otherwise is still found (the paged
//! providerID scan). Also prints what one launch costs the API server:
//!
//! ```sh
//! LAUNCH_BENCH_NODES=3000 cargo test -p node-manager-testkit --test launch_node_selection -- --nocapture
//! ```
#![allow(clippy::unwrap_used)]

use node_manager_testkit::bench::launch_lookup::{NodeNaming, measure_launch};

fn bench_nodes() -> usize {
    std::env::var("LAUNCH_BENCH_NODES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300)
}

#[tokio::test]
async fn a_launch_never_lists_or_watches_every_node_when_the_name_is_known() {
    let cost = measure_launch(bench_nodes(), NodeNaming::DnsName).await;
    println!("launch, node under its DNS name: {}", cost.line());
    assert_eq!(cost.outcome, "Completed", "{cost:?}");
    assert_eq!(cost.cluster_wide, 0, "{cost:?}");
    assert!(
        cost.node_watches >= 1,
        "the wait watches the node: {cost:?}"
    );
}

#[tokio::test]
async fn without_the_dns_name_the_wait_falls_back_to_every_node() {
    let cost = measure_launch(bench_nodes(), NodeNaming::DnsNameUnknown).await;
    println!(
        "launch, DNS name unknown (the old behaviour): {}",
        cost.line()
    );
    assert_eq!(cost.outcome, "Completed", "{cost:?}");
    assert!(cost.cluster_wide >= 1, "{cost:?}");
}

#[tokio::test]
async fn a_node_named_otherwise_is_found_by_its_provider_id() {
    let cost = measure_launch(bench_nodes(), NodeNaming::Other).await;
    println!("launch, node under another name: {}", cost.line());
    assert_eq!(cost.outcome, "Completed", "{cost:?}");
}
