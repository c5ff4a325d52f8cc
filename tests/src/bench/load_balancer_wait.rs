//! What the wait for load balancers costs one drain as the account's load balancers grow:
//! the drain's own wait ([`node_manager::drain::load_balancers`]) through the SDK adapter
//! ([`SdkLoadBalancers`]) against the fake Elastic Load Balancing, in an account with N target
//! groups (a quarter instance-mode of the cluster, a quarter instance-mode of other clusters,
//! half IP-mode) and N / 10 classic load balancers (half the cluster's). The instance is
//! registered with every one of the cluster's, which deregister it when the wait starts (the
//! controllers acted at the cordon) and let it drain for [`DELAY`].
//!
//! Counted per drain: each Elastic Load Balancing request the fake received, the time to find
//! the load balancers routing to the instance, and the whole wait.

use std::collections::BTreeMap;
use std::time::Duration;

use node_manager::aws::load_balancing::SdkLoadBalancers;
use node_manager::drain::load_balancers::{LoadBalancerTarget, LoadBalancerWait};
use tokio::time::Instant;

use super::Mode;
use crate::account::FakeAccount;
use crate::aws::{FakeAws, FakeLoadBalancer, FakeTargetGroup};

const CLUSTER: &str = "bench";
const INSTANCE: &str = "i-0b1e2c3d4e5f60718";
/// Every load balancer's deregistration delay (connection draining timeout).
pub const DELAY: Duration = Duration::from_secs(3);
/// `SETTLE_SECONDS` of the measured drains.
pub const SETTLE: Duration = Duration::from_secs(1);

/// One account size's figures.
#[derive(Debug, Clone)]
pub struct LoadBalancerWaitRow {
    pub target_groups: usize,
    pub classics: usize,
    /// Of them, the cluster's routing to the instance.
    pub routing: usize,
    /// Requests per operation.
    pub requests: BTreeMap<String, usize>,
    pub found_after: Duration,
    pub waited: Duration,
}

pub fn sizes(mode: Mode) -> &'static [usize] {
    match mode {
        Mode::Quick => &[40],
        Mode::Full => &[40, 400, 1000],
    }
}

pub async fn load_balancer_wait(mode: Mode) -> Result<Vec<LoadBalancerWaitRow>, String> {
    let mut rows = Vec::new();
    for &size in sizes(mode) {
        rows.push(one_account(size).await?);
    }
    Ok(rows)
}

async fn one_account(target_groups: usize) -> Result<LoadBalancerWaitRow, String> {
    let account = FakeAccount::reference();
    let credentials = account.add_role_credentials("open-node-manager-terminating-hook");
    let aws = FakeAws::start(account).await.map_err(|e| e.to_string())?;
    let routing = seed(&aws, target_groups);
    let client = SdkLoadBalancers::new(&aws.sdk_config(&credentials).await);
    let target = LoadBalancerTarget {
        client: &client,
        cluster: CLUSTER,
        instance_id: INSTANCE,
    };
    let started = Instant::now();
    let mut wait = LoadBalancerWait::new(Some(target), started, SETTLE, started + SETTLE);
    let deadline = started + Duration::from_secs(3600);
    wait.check_if_due("bench-node", deadline).await;
    let found_after = started.elapsed();
    if !wait.routing() {
        return Err(format!("{target_groups} target groups: none found routing"));
    }
    while let Some(wake) = wait.next_wake(Instant::now()) {
        tokio::time::sleep_until(wake).await;
        wait.check_if_due("bench-node", deadline).await;
    }
    let waited = started.elapsed();
    if routing.iter().any(|lb| aws.elb().routes_to(lb, INSTANCE)) {
        return Err(format!(
            "{target_groups} target groups: the wait ended with load balancers still routing"
        ));
    }
    let mut requests = BTreeMap::new();
    for request in aws.requests() {
        *requests.entry(request.operation).or_default() += 1;
    }
    Ok(LoadBalancerWaitRow {
        target_groups,
        classics: target_groups / 10,
        routing: routing.len(),
        requests,
        found_after,
        waited,
    })
}

/// Seeds the account; returns the cluster's load balancers routing to the instance, already
/// deregistering it.
fn seed(aws: &FakeAws, target_groups: usize) -> Vec<FakeLoadBalancer> {
    let elb = aws.elb();
    let mut routing = Vec::new();
    for i in 0..target_groups {
        let name = format!("k8s-tg-{i:04}");
        let group = match i % 4 {
            0 => FakeTargetGroup::of_cluster(&name, CLUSTER),
            1 => FakeTargetGroup::of_cluster(&name, "another-cluster"),
            _ => FakeTargetGroup::of_cluster(&name, CLUSTER).ip_targets(),
        };
        let arn = elb.add_target_group(group.delay(DELAY));
        if i % 4 == 0 {
            routing.push(FakeLoadBalancer::TargetGroup(arn));
        }
    }
    for i in 0..target_groups / 10 {
        let name = format!("a{i:04}classic");
        let cluster = if i % 2 == 0 {
            CLUSTER
        } else {
            "another-cluster"
        };
        elb.add_classic(&name, cluster, Some(DELAY));
        if i % 2 == 0 {
            routing.push(FakeLoadBalancer::Classic(name));
        }
    }
    for lb in &routing {
        elb.register(lb, INSTANCE);
        elb.deregister(lb, INSTANCE);
    }
    routing
}
