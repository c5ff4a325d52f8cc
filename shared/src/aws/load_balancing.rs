//! [`LoadBalancers`] through `aws-sdk-elasticloadbalancingv2` (target groups) and
//! `aws-sdk-elasticloadbalancing` (classic load balancers).
//!
//! Finding the cluster's load balancers costs one `DescribeTargetGroups` per 400 target groups
//! of the account and region, one `DescribeTags` per 20 target groups with instance targets,
//! and the same for classic load balancers (`DescribeLoadBalancers`, `DescribeTags`); asking one
//! of them about the instance costs one `DescribeTargetHealth` (all its targets: see
//! `target_routing`) or `DescribeInstanceHealth`.
//! None of these calls supports resource-level permissions.

use std::time::Duration;

use aws_sdk_elasticloadbalancing as classic;
use aws_sdk_elasticloadbalancingv2 as elbv2;
use aws_smithy_types::error::metadata::ProvideErrorMetadata;
use aws_types::SdkConfig;
use elbv2::types::{TargetHealthStateEnum, TargetTypeEnum};

use super::sdk::{OnFirstUse, classify};
use super::*;

/// How many resources one `DescribeTags` call takes (both APIs' limit).
const TAGS_BATCH: usize = 20;
/// The largest page `DescribeTargetGroups` and classic `DescribeLoadBalancers` return.
const PAGE_SIZE: i32 = 400;
/// The target group attribute holding its deregistration delay.
const DEREGISTRATION_DELAY: &str = "deregistration_delay.timeout_seconds";

/// Both Elastic Load Balancing APIs, each client built on its first call.
#[derive(Debug, Clone)]
pub struct SdkLoadBalancers {
    target_groups: OnFirstUse<elbv2::Client>,
    classic: OnFirstUse<classic::Client>,
}

impl SdkLoadBalancers {
    pub fn new(config: &SdkConfig) -> Self {
        Self {
            target_groups: OnFirstUse::new(config, elbv2::Client::new),
            classic: OnFirstUse::new(config, classic::Client::new),
        }
    }

    /// The ARNs of the account's target groups with instance targets (all pages).
    async fn instance_target_groups(&self) -> Result<Vec<String>, AwsError> {
        let mut pages = self
            .target_groups
            .get()
            .describe_target_groups()
            .page_size(PAGE_SIZE)
            .into_paginator()
            .send();
        let mut arns = Vec::new();
        while let Some(page) = pages
            .next()
            .await
            .transpose()
            .map_err(|e| classify("DescribeTargetGroups", e))?
        {
            arns.extend(
                page.target_groups()
                    .iter()
                    .filter(|group| group.target_type() == Some(&TargetTypeEnum::Instance))
                    .filter_map(|group| group.target_group_arn().map(str::to_owned)),
            );
        }
        Ok(arns)
    }

    /// Those of `arns` tagged for `cluster`.
    async fn cluster_target_groups(
        &self,
        cluster: &str,
        arns: Vec<String>,
    ) -> Result<Vec<LoadBalancerRef>, AwsError> {
        let mut out = Vec::new();
        for batch in arns.chunks(TAGS_BATCH) {
            let tagged = self
                .target_groups
                .get()
                .describe_tags()
                .set_resource_arns(Some(batch.to_vec()))
                .send()
                .await
                .map_err(|e| classify("DescribeTags", e))?;
            out.extend(tagged.tag_descriptions().iter().filter_map(|description| {
                let tags = description
                    .tags()
                    .iter()
                    .filter_map(|tag| Some((tag.key()?, tag.value().unwrap_or_default())));
                tagged_for_cluster(cluster, tags)
                    .then(|| description.resource_arn())
                    .flatten()
                    .map(|arn| LoadBalancerRef::TargetGroup(arn.to_owned()))
            }));
        }
        Ok(out)
    }

    /// The names of the account's classic load balancers (all pages).
    async fn classic_names(&self) -> Result<Vec<String>, AwsError> {
        let mut pages = self
            .classic
            .get()
            .describe_load_balancers()
            .page_size(PAGE_SIZE)
            .into_paginator()
            .send();
        let mut names = Vec::new();
        while let Some(page) = pages
            .next()
            .await
            .transpose()
            .map_err(|e| classify("DescribeLoadBalancers", e))?
        {
            names.extend(
                page.load_balancer_descriptions()
                    .iter()
                    .filter_map(|lb| lb.load_balancer_name().map(str::to_owned)),
            );
        }
        Ok(names)
    }

    /// Those of `names` tagged for `cluster`.
    async fn cluster_classics(
        &self,
        cluster: &str,
        names: Vec<String>,
    ) -> Result<Vec<LoadBalancerRef>, AwsError> {
        let mut out = Vec::new();
        for batch in names.chunks(TAGS_BATCH) {
            let tagged = self
                .classic
                .get()
                .describe_tags()
                .set_load_balancer_names(Some(batch.to_vec()))
                .send()
                .await
                .map_err(|e| classify("DescribeTags", e))?;
            out.extend(tagged.tag_descriptions().iter().filter_map(|description| {
                let tags = description
                    .tags()
                    .iter()
                    .map(|tag| (tag.key(), tag.value().unwrap_or_default()));
                tagged_for_cluster(cluster, tags)
                    .then(|| description.load_balancer_name())
                    .flatten()
                    .map(|name| LoadBalancerRef::Classic(name.to_owned()))
            }));
        }
        Ok(out)
    }

    /// How the target group stands towards the instance, over every port it is registered
    /// on. All the group's targets are listed, not only the instance: a target named without
    /// its port is looked up on the group's own port, and the controllers register instances
    /// on the Service's node port, so a filtered query would answer "not registered".
    async fn target_routing(
        &self,
        arn: &str,
        instance_id: &str,
    ) -> Result<InstanceRouting, AwsError> {
        let health = self
            .target_groups
            .get()
            .describe_target_health()
            .target_group_arn(arn)
            .send()
            .await;
        match health {
            Ok(output) => Ok(output
                .target_health_descriptions()
                .iter()
                .filter(|d| d.target().and_then(|t| t.id()) == Some(instance_id))
                .filter_map(|d| d.target_health()?.state())
                .map(routing_of_target_state)
                .max_by_key(|routing| routing_rank(*routing))
                .unwrap_or(InstanceRouting::NotRouted)),
            Err(error) if gone(error.code()) => Ok(InstanceRouting::NotRouted),
            Err(error) => Err(classify("DescribeTargetHealth", error)),
        }
    }

    async fn classic_routing(
        &self,
        name: &str,
        instance_id: &str,
    ) -> Result<InstanceRouting, AwsError> {
        let instance = classic::types::Instance::builder()
            .instance_id(instance_id)
            .build();
        let health = self
            .classic
            .get()
            .describe_instance_health()
            .load_balancer_name(name)
            .instances(instance)
            .send()
            .await;
        match health {
            Ok(output) => Ok(output
                .instance_states()
                .iter()
                .map(|state| routing_of_classic_state(state.state(), state.description()))
                .max_by_key(|routing| routing_rank(*routing))
                .unwrap_or(InstanceRouting::NotRouted)),
            Err(error) if gone(error.code()) => Ok(InstanceRouting::NotRouted),
            Err(error) => Err(classify("DescribeInstanceHealth", error)),
        }
    }

    async fn target_group_delay(&self, arn: &str) -> Result<Duration, AwsError> {
        let attributes = self
            .target_groups
            .get()
            .describe_target_group_attributes()
            .target_group_arn(arn)
            .send()
            .await
            .map_err(|e| classify("DescribeTargetGroupAttributes", e))?;
        let seconds = attributes
            .attributes()
            .iter()
            .find(|a| a.key() == Some(DEREGISTRATION_DELAY))
            .and_then(|a| a.value()?.parse::<u64>().ok())
            // AWS's default, when the attribute is not listed.
            .unwrap_or(300);
        Ok(Duration::from_secs(seconds))
    }

    async fn classic_delay(&self, name: &str) -> Result<Duration, AwsError> {
        let attributes = self
            .classic
            .get()
            .describe_load_balancer_attributes()
            .load_balancer_name(name)
            .send()
            .await
            .map_err(|e| classify("DescribeLoadBalancerAttributes", e))?;
        let draining = attributes
            .load_balancer_attributes()
            .and_then(|a| a.connection_draining());
        Ok(match draining {
            Some(draining) if draining.enabled() => Duration::from_secs(
                draining
                    .timeout()
                    .unwrap_or(300)
                    .max(0)
                    .unsigned_abs()
                    .into(),
            ),
            _ => Duration::ZERO,
        })
    }
}

/// The error codes that say the load balancer, target group or registration is gone.
fn gone(code: Option<&str>) -> bool {
    matches!(
        code,
        Some("TargetGroupNotFound" | "LoadBalancerNotFound" | "InvalidTarget" | "InvalidInstance")
    )
}

/// What a target's health state says about traffic (AWS's documented states).
fn routing_of_target_state(state: &TargetHealthStateEnum) -> InstanceRouting {
    match state {
        TargetHealthStateEnum::Unused => InstanceRouting::NotRouted,
        TargetHealthStateEnum::Draining | TargetHealthStateEnum::UnhealthyDraining => {
            InstanceRouting::Draining
        }
        // healthy, initial, unhealthy, unavailable, and states added later: still registered.
        _ => InstanceRouting::Registered,
    }
}

/// What a classic load balancer's instance state says: `InService` with "Instance
/// deregistration currently in progress" while connections drain, `OutOfService` once the
/// instance is not registered (or fails its health check, which takes it out of rotation).
fn routing_of_classic_state(state: Option<&str>, description: Option<&str>) -> InstanceRouting {
    let deregistering =
        description.is_some_and(|d| d.contains("deregistration currently in progress"));
    match state {
        Some("OutOfService") => InstanceRouting::NotRouted,
        _ if deregistering => InstanceRouting::Draining,
        _ => InstanceRouting::Registered,
    }
}

/// The more traffic a state may still carry, the higher (several answers: the worst counts).
fn routing_rank(routing: InstanceRouting) -> u8 {
    match routing {
        InstanceRouting::NotRouted => 0,
        InstanceRouting::Draining => 1,
        InstanceRouting::Registered => 2,
    }
}

impl LoadBalancers for SdkLoadBalancers {
    fn cluster_load_balancers<'a>(
        &'a self,
        cluster_name: &'a str,
    ) -> AwsFuture<'a, Vec<LoadBalancerRef>> {
        Box::pin(async move {
            let arns = self.instance_target_groups().await?;
            let mut found = self.cluster_target_groups(cluster_name, arns).await?;
            let names = self.classic_names().await?;
            found.extend(self.cluster_classics(cluster_name, names).await?);
            Ok(found)
        })
    }

    fn routing<'a>(
        &'a self,
        load_balancer: &'a LoadBalancerRef,
        instance_id: &'a str,
    ) -> AwsFuture<'a, InstanceRouting> {
        Box::pin(async move {
            match load_balancer {
                LoadBalancerRef::TargetGroup(arn) => self.target_routing(arn, instance_id).await,
                LoadBalancerRef::Classic(name) => self.classic_routing(name, instance_id).await,
            }
        })
    }

    fn deregistration_delay<'a>(
        &'a self,
        load_balancer: &'a LoadBalancerRef,
    ) -> AwsFuture<'a, Duration> {
        Box::pin(async move {
            match load_balancer {
                LoadBalancerRef::TargetGroup(arn) => self.target_group_delay(arn).await,
                LoadBalancerRef::Classic(name) => self.classic_delay(name).await,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unused_targets_take_no_traffic_and_draining_ones_still_finish_connections() {
        assert_eq!(
            routing_of_target_state(&TargetHealthStateEnum::Unused),
            InstanceRouting::NotRouted
        );
        for state in [
            TargetHealthStateEnum::Draining,
            TargetHealthStateEnum::UnhealthyDraining,
        ] {
            assert_eq!(routing_of_target_state(&state), InstanceRouting::Draining);
        }
        for state in [
            "healthy",
            "initial",
            "unhealthy",
            "unavailable",
            "a-future-state",
        ] {
            assert_eq!(
                routing_of_target_state(&TargetHealthStateEnum::from(state)),
                InstanceRouting::Registered,
                "{state}"
            );
        }
    }

    #[test]
    fn a_classic_instance_drains_while_in_service_with_deregistration_in_progress() {
        assert_eq!(
            routing_of_classic_state(
                Some("InService"),
                Some("Instance deregistration currently in progress.")
            ),
            InstanceRouting::Draining
        );
        assert_eq!(
            routing_of_classic_state(Some("InService"), Some("N/A")),
            InstanceRouting::Registered
        );
        assert_eq!(
            routing_of_classic_state(
                Some("OutOfService"),
                Some("Instance is not currently registered with the LoadBalancer.")
            ),
            InstanceRouting::NotRouted
        );
        assert!(gone(Some("InvalidInstance")) && !gone(Some("Throttling")));
    }
}
