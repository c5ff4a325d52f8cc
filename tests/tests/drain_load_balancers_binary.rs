//! The built `terminating-hook` binary waits, once the node is empty, until no load balancer
//! of the cluster routes to the instance (`LOAD_BALANCER_WAIT`), through the unmodified
//! Elastic Load Balancing SDK clients against the fake AWS's target groups and classic load
//! balancers; the test plays the service controller, which deregisters the instance from the
//! cluster's load balancers once the drain labels the node out of them.
//!
//! Uses the binary as built: run `cargo build --workspace --bins --tests` after changing the function.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use node_manager_testkit::aws::{FakeElb, FakeLoadBalancer, FakeTargetGroup};
use node_manager_testkit::e2e::{CLUSTER, FunctionWorld, Target};
use node_manager_testkit::service_controller::ServiceController;

const INSTANCE: &str = "i-0a1b2c3d4e5f60718";

/// The load balancers around the instance.
struct Balancers {
    /// An instance-mode target group of the cluster (AWS Load Balancer Controller).
    web: FakeLoadBalancer,
    /// A classic load balancer of the cluster (service controller).
    legacy: FakeLoadBalancer,
    /// A target group nobody tagged for the cluster that also has the instance: not the
    /// cluster's controllers' to deregister, not waited for.
    unrelated: FakeLoadBalancer,
}

async fn world(settings: &[(&str, &str)]) -> FunctionWorld {
    let mut builder = FunctionWorld::builder()
        .functions(&[Target::TerminatingHook])
        .instance(INSTANCE)
        .env("SETTLE_SECONDS", "1")
        .env("EVICTION_BACKOFF_SECONDS", "0.05")
        .env("DRAIN_TIMEOUT_SECONDS", "30")
        .env("HAND_OVER_MARGIN_SECONDS", "5")
        .log_level("info")
        .json_logs();
    for (key, value) in settings {
        builder = builder.env(key, value);
    }
    let w = builder.start().await;
    w.add_room_node();
    w
}

/// Seeds the load balancers, the instance registered with the unrelated one only (the service
/// controller, or the test, registers it with the cluster's).
fn seed(elb: &FakeElb, web_delay: Duration, legacy_draining: Duration) -> Balancers {
    let web = FakeLoadBalancer::TargetGroup(
        elb.add_target_group(FakeTargetGroup::of_cluster("k8s-shop-web", CLUSTER).delay(web_delay)),
    );
    elb.add_target_group(FakeTargetGroup::of_cluster("k8s-shop-api", CLUSTER).ip_targets());
    elb.add_classic("a1b2c3d4legacy", CLUSTER, Some(legacy_draining));
    let legacy = FakeLoadBalancer::Classic("a1b2c3d4legacy".to_owned());
    let unrelated = FakeLoadBalancer::TargetGroup(elb.add_target_group(FakeTargetGroup {
        tags: vec![("team".to_owned(), "payments".to_owned())],
        ..FakeTargetGroup::of_cluster("hand-made", CLUSTER)
    }));
    elb.register(&unrelated, INSTANCE);
    Balancers {
        web,
        legacy,
        unrelated,
    }
}

/// The service controller for the cluster's load balancers; returns once it registered the
/// instance with them.
async fn service_controller(w: &FunctionWorld, balancers: &Balancers) -> ServiceController {
    let elb = w.aws.elb();
    let cluster_lbs = vec![balancers.web.clone(), balancers.legacy.clone()];
    let controller = ServiceController::start(w.server.store().clone(), elb.clone(), cluster_lbs);
    let registered = Instant::now();
    while !(elb.routes_to(&balancers.web, INSTANCE) && elb.routes_to(&balancers.legacy, INSTANCE)) {
        assert!(
            registered.elapsed() < Duration::from_secs(5),
            "the instance was never registered"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    controller
}

#[tokio::test]
async fn the_action_waits_until_the_clusters_load_balancers_no_longer_route_to_the_instance() {
    let w = world(&[]).await;
    // The target group drains longest, so a wait that misread it (a target asked about
    // without its node port is "not registered") ends with the classic one, too soon.
    let balancers = seed(&w.aws.elb(), Duration::from_secs(5), Duration::from_secs(3));
    let _controller = service_controller(&w, &balancers).await;
    let (answer, took) = w.terminate_timed().await;
    assert_eq!(answer["records"][0]["outcome"], "Completed", "{answer}");
    let elb = w.aws.elb();
    // Completed only once both had let go (the settle period alone is 1 s).
    assert!(!elb.routes_to(&balancers.web, INSTANCE), "took {took:?}");
    assert!(!elb.routes_to(&balancers.legacy, INSTANCE), "took {took:?}");
    assert!(took >= Duration::from_secs(4), "took {took:?}");
    // Not waited for: it is not the cluster's (it would take 300 s).
    assert!(elb.routes_to(&balancers.unrelated, INSTANCE));
    assert!(took < Duration::from_secs(20), "took {took:?}");
    let output = w.function(Target::TerminatingHook).runtime.output();
    assert!(output.contains("\"awaiting_load_balancers\""), "{output}");
    assert!(
        output.contains("\"load_balancers_deregistered\""),
        "{output}"
    );
    assert!(w.event_notes("LoadBalancersStillRouting").is_empty());
    // Asked about the instance only where it may be routed: the cluster's instance-mode
    // target group and classic load balancer, never the IP-mode or untagged one.
    let health = w.aws.requests_for("DescribeTargetHealth");
    assert!(
        health
            .iter()
            .all(|r| r.params["TargetGroupArn"].contains("k8s-shop-web")),
        "{health:?}"
    );
    assert!(!w.aws.requests_for("DescribeInstanceHealth").is_empty());
}

#[tokio::test]
async fn a_node_no_load_balancer_routes_to_does_not_wait_the_settle_period() {
    let settle = [("SETTLE_SECONDS", "8")];
    let w = world(&settle).await;
    seed(
        &w.aws.elb(),
        Duration::from_secs(300),
        Duration::from_secs(300),
    );
    let (answer, took) = w.terminate_timed().await;
    assert_eq!(answer["records"][0]["outcome"], "Completed", "{answer}");
    assert!(
        took < Duration::from_secs(6),
        "took {took:?}: waited the settle period"
    );

    // Turned off, the same drain waits SETTLE_SECONDS and asks no load balancer.
    let w = world(&[settle[0], ("LOAD_BALANCER_WAIT", "false")]).await;
    seed(
        &w.aws.elb(),
        Duration::from_secs(300),
        Duration::from_secs(300),
    );
    let (answer, took) = w.terminate_timed().await;
    assert_eq!(answer["records"][0]["outcome"], "Completed", "{answer}");
    assert!(took >= Duration::from_secs(8), "took {took:?}");
    assert!(w.aws.requests_for("DescribeTargetGroups").is_empty());
}

#[tokio::test]
async fn load_balancers_still_routing_at_the_bound_are_named_and_the_action_completed() {
    // Nobody deregisters the instance: waited for 1 s settle + 2 s delay, then named; while it
    // waits, the drain says what for.
    let w = world(&[("DRAIN_BLOCKED_REPORT_SECONDS", "1")]).await;
    let balancers = seed(&w.aws.elb(), Duration::from_secs(2), Duration::from_secs(2));
    w.aws.elb().register(&balancers.web, INSTANCE);
    w.aws.elb().register(&balancers.legacy, INSTANCE);
    let (answer, took) = w.terminate_timed().await;
    assert_eq!(answer["records"][0]["outcome"], "Completed", "{answer}");
    assert!(
        (Duration::from_secs(3)..Duration::from_secs(15)).contains(&took),
        "took {took:?}"
    );
    assert!(w.aws.elb().routes_to(&balancers.web, INSTANCE));
    let notes = w.event_notes("LoadBalancersStillRouting");
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(notes[0].contains("targetgroup/k8s-shop-web/"), "{notes:?}");
    assert!(
        notes[0].contains("classic load balancer a1b2c3d4legacy"),
        "{notes:?}"
    );
    assert!(!notes[0].contains("hand-made"), "{notes:?}");
    let blocked = w.event_notes("DrainBlocked");
    assert!(
        blocked.iter().any(|n| n.contains("its pods are gone")
            && n.contains("load balancer(s) still routing to the instance")
            && n.contains("targetgroup/k8s-shop-web/")),
        "{blocked:?}"
    );
}

#[tokio::test]
async fn load_balancers_that_cannot_be_read_leave_the_settle_period_as_the_wait() {
    use node_manager_testkit::aws::{AwsFault, Service};
    let w = world(&[("SETTLE_SECONDS", "3")]).await;
    let balancers = seed(
        &w.aws.elb(),
        Duration::from_secs(300),
        Duration::from_secs(300),
    );
    w.aws.elb().register(&balancers.web, INSTANCE);
    w.aws
        .faults()
        .inject(AwsFault::unavailable().on_service(Service::LoadBalancing));
    let (answer, took) = w.terminate_timed().await;
    assert_eq!(answer["records"][0]["outcome"], "Completed", "{answer}");
    assert!(
        (Duration::from_secs(3)..Duration::from_secs(12)).contains(&took),
        "took {took:?}"
    );
    assert!(w.aws.faults().injected() > 0);
}
