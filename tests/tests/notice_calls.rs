//! An instance notice costs the same at any cluster size: one `DescribeInstances`, at most one
//! `DescribeAutoScalingGroups` a minute per group, one node GET for a node named after its
//! instance's DNS name; a node named otherwise or no node at all costs one scan of the nodes
//! per minute, not one per notice (the built `terminating-hook` binary, see
//! `node_manager_testkit::bench::notice_calls`, which BENCHMARKS.md runs at 100, 1,000 and
//! 5,000 nodes).
//!
//! Uses the binary as built: run `cargo build --workspace --bins --tests` after changing it.

#![allow(clippy::unwrap_used)]

use node_manager_testkit::bench::notice_calls;

/// Pages of 500 nodes one scan of `nodes` nodes reads (the seeded ones included).
fn pages(nodes: usize) -> f64 {
    (nodes + 10).div_ceil(500) as f64
}

#[tokio::test]
async fn calls_per_notice_do_not_grow_with_the_cluster() {
    let small = notice_calls(100).await.unwrap();
    let large = notice_calls(1000).await.unwrap();
    for (f, size) in [(&small, 100), (&large, 1000)] {
        assert_eq!(f.named.outcome, "CordonedOnly", "{size}: {f:?}");
        assert_eq!(f.renamed.outcome, "CordonedOnly", "{size}: {f:?}");
        assert_eq!(f.nodeless.outcome, "NoNode", "{size}: {f:?}");
        for cost in [&f.named, &f.renamed, &f.nodeless] {
            assert_eq!(cost.describe_instances, 1.0, "{size}: {f:?}");
            assert!(cost.describe_groups <= 0.34, "{size}: {f:?}");
        }
        assert_eq!(f.named.node_lists, 0.0, "{size}: {f:?}");
        // The six notices for nodes not under their DNS name share one scan.
        let lists = (f.renamed.node_lists + f.nodeless.node_lists) * 3.0;
        assert!(lists <= pages(size), "{size}: {lists} lists: {f:?}");
    }
    assert_eq!(small.named.kube_requests, large.named.kube_requests);
    for (a, b) in [
        (&small.renamed, &large.renamed),
        (&small.nodeless, &large.nodeless),
    ] {
        let (a, b) = (
            a.kube_requests - a.node_lists,
            b.kube_requests - b.node_lists,
        );
        assert!((a - b).abs() < 1e-9, "{small:?} vs {large:?}");
    }
}
