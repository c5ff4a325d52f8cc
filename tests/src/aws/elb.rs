//! Fake Elastic Load Balancing: target groups (v2, `2015-12-01`) and classic load balancers
//! (`2012-06-01`), with the read calls the terminating hook makes, in `awsQuery`.
//!
//! Registration follows AWS's documented states: a deregistered instance target is
//! `draining` (reason `Target.DeregistrationInProgress`) for the target group's deregistration
//! delay, then `unused` (`Target.NotRegistered`); on a classic load balancer with connection
//! draining it stays `InService` ("Instance deregistration currently in progress") for the
//! draining timeout, then `OutOfService` ("Instance is not currently registered with the
//! LoadBalancer"); an instance a classic load balancer never had is `InvalidInstance`. Target
//! groups listen on port 80 and their instances are registered on a node port
//! ([`NODE_PORT`]), as the controllers register them: a `DescribeTargetHealth` naming a target
//! without its port asks about the group's port, where the instance is not registered. Who
//! registers and deregisters is up to the test (the service controller's part:
//! [`crate::service_controller`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::protocol::{ApiError, QueryParams, Reply, element, query_list};
use super::{Shared, lock};

/// The API version of classic load balancers; v2 is `2015-12-01`.
pub(crate) const CLASSIC_VERSION: &str = "2012-06-01";
const DELAY_ATTRIBUTE: &str = "deregistration_delay.timeout_seconds";
/// The port every target group listens on.
const GROUP_PORT: &str = "80";
/// The port instances are registered on (a Service's node port).
pub const NODE_PORT: &str = "30080";

/// Where an instance stands with one load balancer.
#[derive(Debug, Clone, Copy)]
enum Registration {
    Registered,
    /// Deregistered; connections drain until then.
    Draining(Instant),
    /// Deregistered and drained.
    Gone,
}

impl Registration {
    fn now(self) -> Self {
        match self {
            Self::Draining(until) if Instant::now() >= until => Self::Gone,
            other => other,
        }
    }
}

struct TargetGroup {
    arn: String,
    name: String,
    target_type: String,
    tags: Vec<(String, String)>,
    delay: Duration,
    targets: BTreeMap<String, Registration>,
}

struct ClassicLoadBalancer {
    tags: Vec<(String, String)>,
    /// The connection draining timeout; `None`: draining off.
    draining: Option<Duration>,
    instances: BTreeMap<String, Registration>,
}

#[derive(Default)]
pub(crate) struct ElbState {
    /// By ARN, in creation order of their names (ARNs sort by name here).
    target_groups: BTreeMap<String, TargetGroup>,
    classics: BTreeMap<String, ClassicLoadBalancer>,
}

/// A target group to add.
#[derive(Debug, Clone)]
pub struct FakeTargetGroup {
    pub name: String,
    /// `instance` or `ip`.
    pub target_type: String,
    pub tags: Vec<(String, String)>,
    pub deregistration_delay: Duration,
}

impl FakeTargetGroup {
    /// An instance-mode target group of `cluster` as the AWS Load Balancer Controller tags it,
    /// with AWS's default deregistration delay (300 s).
    pub fn of_cluster(name: &str, cluster: &str) -> Self {
        Self {
            name: name.to_owned(),
            target_type: "instance".to_owned(),
            tags: vec![("elbv2.k8s.aws/cluster".to_owned(), cluster.to_owned())],
            deregistration_delay: Duration::from_secs(300),
        }
    }

    pub fn delay(mut self, delay: Duration) -> Self {
        self.deregistration_delay = delay;
        self
    }

    pub fn ip_targets(mut self) -> Self {
        self.target_type = "ip".to_owned();
        self
    }
}

/// Handle on the fake Elastic Load Balancing.
#[derive(Clone)]
pub struct FakeElb {
    shared: Arc<Shared>,
}

/// A load balancer a test names: a target group's ARN or a classic load balancer's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FakeLoadBalancer {
    TargetGroup(String),
    Classic(String),
}

impl FakeElb {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    /// Adds a target group; returns its ARN.
    pub fn add_target_group(&self, group: FakeTargetGroup) -> String {
        let account = &self.shared.account;
        let arn = format!(
            "arn:aws:elasticloadbalancing:{}:{}:targetgroup/{}/{:016x}",
            account.region,
            account.account_id,
            group.name,
            fnv(&group.name)
        );
        lock(&self.shared.elb).target_groups.insert(
            arn.clone(),
            TargetGroup {
                arn: arn.clone(),
                name: group.name,
                target_type: group.target_type,
                tags: group.tags,
                delay: group.deregistration_delay,
                targets: BTreeMap::new(),
            },
        );
        arn
    }

    /// Adds a classic load balancer tagged `kubernetes.io/cluster/<cluster>` = `owned`, as the
    /// service controller creates it, with connection draining of `draining` (`None`: off).
    pub fn add_classic(&self, name: &str, cluster: &str, draining: Option<Duration>) {
        lock(&self.shared.elb).classics.insert(
            name.to_owned(),
            ClassicLoadBalancer {
                tags: vec![(
                    format!("kubernetes.io/cluster/{cluster}"),
                    "owned".to_owned(),
                )],
                draining,
                instances: BTreeMap::new(),
            },
        );
    }

    pub fn register(&self, load_balancer: &FakeLoadBalancer, instance_id: &str) {
        self.set(load_balancer, instance_id, |_| Registration::Registered);
    }

    /// Deregisters the instance: it drains for the load balancer's delay, then is gone.
    pub fn deregister(&self, load_balancer: &FakeLoadBalancer, instance_id: &str) {
        let mut state = lock(&self.shared.elb);
        let (registrations, delay) = match load_balancer {
            FakeLoadBalancer::TargetGroup(arn) => match state.target_groups.get_mut(arn) {
                Some(group) => (&mut group.targets, group.delay),
                None => return,
            },
            FakeLoadBalancer::Classic(name) => match state.classics.get_mut(name) {
                Some(lb) => (&mut lb.instances, lb.draining.unwrap_or_default()),
                None => return,
            },
        };
        if let Some(registration) = registrations.get_mut(instance_id)
            && matches!(registration, Registration::Registered)
        {
            *registration = Registration::Draining(Instant::now() + delay);
        }
    }

    /// Whether `load_balancer` still routes to the instance (registered or draining).
    pub fn routes_to(&self, load_balancer: &FakeLoadBalancer, instance_id: &str) -> bool {
        let state = lock(&self.shared.elb);
        let registration = match load_balancer {
            FakeLoadBalancer::TargetGroup(arn) => state
                .target_groups
                .get(arn)
                .and_then(|g| g.targets.get(instance_id)),
            FakeLoadBalancer::Classic(name) => state
                .classics
                .get(name)
                .and_then(|lb| lb.instances.get(instance_id)),
        };
        registration.is_some_and(|r| !matches!(r.now(), Registration::Gone))
    }

    fn set(
        &self,
        load_balancer: &FakeLoadBalancer,
        instance_id: &str,
        to: impl Fn(Option<Registration>) -> Registration,
    ) {
        let mut state = lock(&self.shared.elb);
        let registrations = match load_balancer {
            FakeLoadBalancer::TargetGroup(arn) => {
                state.target_groups.get_mut(arn).map(|g| &mut g.targets)
            }
            FakeLoadBalancer::Classic(name) => {
                state.classics.get_mut(name).map(|lb| &mut lb.instances)
            }
        };
        if let Some(registrations) = registrations {
            let next = to(registrations.get(instance_id).copied());
            registrations.insert(instance_id.to_owned(), next);
        }
    }
}

/// A stable 64-bit hash for the ARN's id part.
fn fnv(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

pub(crate) fn dispatch(
    shared: &Shared,
    operation: &str,
    params: &QueryParams,
) -> Result<Reply, ApiError> {
    let classic = params.get("Version").map(String::as_str) == Some(CLASSIC_VERSION);
    let state = lock(&shared.elb);
    match (classic, operation) {
        (false, "DescribeTargetGroups") => Ok(describe_target_groups(&state, params)),
        (false, "DescribeTags") => Ok(describe_target_group_tags(&state, params)),
        (false, "DescribeTargetHealth") => describe_target_health(&state, params),
        (false, "DescribeTargetGroupAttributes") => {
            describe_target_group_attributes(&state, params)
        }
        (true, "DescribeLoadBalancers") => Ok(describe_load_balancers(&state, params)),
        (true, "DescribeTags") => Ok(describe_classic_tags(&state, params)),
        (true, "DescribeInstanceHealth") => describe_instance_health(&state, params),
        (true, "DescribeLoadBalancerAttributes") => {
            describe_load_balancer_attributes(&state, params)
        }
        (_, other) => Err(ApiError::new(
            400,
            "InvalidAction",
            format!("Could not find operation {other}"),
        )),
    }
}

/// One page of `items` from `Marker` (an index here) with `PageSize` (at most 400).
fn page<T>(items: Vec<T>, params: &QueryParams) -> (Vec<T>, Option<String>) {
    let start: usize = params
        .get("Marker")
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    let size: usize = params
        .get("PageSize")
        .and_then(|s| s.parse().ok())
        .unwrap_or(400)
        .clamp(1, 400);
    let total = items.len();
    let page: Vec<T> = items.into_iter().skip(start).take(size).collect();
    let next = (start + size < total).then(|| (start + size).to_string());
    (page, next)
}

fn tags_xml(tags: &[(String, String)]) -> String {
    let members: String = tags
        .iter()
        .map(|(k, v)| {
            format!(
                "<member>{}{}</member>",
                element("Key", k),
                element("Value", v)
            )
        })
        .collect();
    format!("<Tags>{members}</Tags>")
}

fn next_marker(next: Option<String>) -> String {
    next.map(|m| element("NextMarker", &m)).unwrap_or_default()
}

fn describe_target_groups(state: &ElbState, params: &QueryParams) -> Reply {
    let (groups, next) = page(state.target_groups.values().collect(), params);
    let members: String = groups
        .iter()
        .map(|g| {
            format!(
                "<member>{}{}{}<Protocol>TCP</Protocol><Port>{GROUP_PORT}</Port></member>",
                element("TargetGroupArn", &g.arn),
                element("TargetGroupName", &g.name),
                element("TargetType", &g.target_type)
            )
        })
        .collect();
    Reply::Xml(format!(
        "<TargetGroups>{members}</TargetGroups>{}",
        next_marker(next)
    ))
}

fn describe_target_group_tags(state: &ElbState, params: &QueryParams) -> Reply {
    let members: String = query_list(params, "ResourceArns")
        .iter()
        .filter_map(|arn| state.target_groups.get(arn))
        .map(|g| {
            format!(
                "<member>{}{}</member>",
                element("ResourceArn", &g.arn),
                tags_xml(&g.tags)
            )
        })
        .collect();
    Reply::Xml(format!("<TagDescriptions>{members}</TagDescriptions>"))
}

fn target_group<'a>(
    state: &'a ElbState,
    params: &QueryParams,
) -> Result<&'a TargetGroup, ApiError> {
    let arn = params.get("TargetGroupArn").cloned().unwrap_or_default();
    state.target_groups.get(&arn).ok_or_else(|| {
        ApiError::new(
            400,
            "TargetGroupNotFound",
            format!("Target groups '{arn}' not found"),
        )
    })
}

fn describe_target_health(state: &ElbState, params: &QueryParams) -> Result<Reply, ApiError> {
    let group = target_group(state, params)?;
    // Targets asked for: (id, port), a missing port meaning the group's own.
    let asked: Vec<(String, String)> = params
        .iter()
        .filter_map(|(key, id)| {
            let index = key.strip_prefix("Targets.member.")?.strip_suffix(".Id")?;
            let port = params
                .get(&format!("Targets.member.{index}.Port"))
                .cloned()
                .unwrap_or_else(|| GROUP_PORT.to_owned());
            Some((id.clone(), port))
        })
        .collect();
    let listing = asked.is_empty();
    let ids: Vec<(String, String)> = if listing {
        group
            .targets
            .iter()
            .filter(|(_, r)| !matches!(r.now(), Registration::Gone))
            .map(|(id, _)| (id.clone(), NODE_PORT.to_owned()))
            .collect()
    } else {
        asked
    };
    let members: String = ids
        .iter()
        .map(|(id, port)| {
            let registration = (port == NODE_PORT)
                .then(|| group.targets.get(id).map(|r| r.now()))
                .flatten();
            let (state, reason) = match registration {
                Some(Registration::Registered) => ("healthy", None),
                Some(Registration::Draining(_)) => {
                    ("draining", Some("Target.DeregistrationInProgress"))
                }
                Some(Registration::Gone) | None => ("unused", Some("Target.NotRegistered")),
            };
            format!(
                "<member><Target>{}{}</Target><TargetHealth>{}{}</TargetHealth></member>",
                element("Id", id),
                element("Port", port),
                element("State", state),
                reason.map(|r| element("Reason", r)).unwrap_or_default()
            )
        })
        .collect();
    Ok(Reply::Xml(format!(
        "<TargetHealthDescriptions>{members}</TargetHealthDescriptions>"
    )))
}

fn describe_target_group_attributes(
    state: &ElbState,
    params: &QueryParams,
) -> Result<Reply, ApiError> {
    let group = target_group(state, params)?;
    Ok(Reply::Xml(format!(
        "<Attributes><member>{}{}</member></Attributes>",
        element("Key", DELAY_ATTRIBUTE),
        element("Value", &group.delay.as_secs().to_string())
    )))
}

fn describe_load_balancers(state: &ElbState, params: &QueryParams) -> Reply {
    let (lbs, next) = page(state.classics.iter().collect(), params);
    let members: String = lbs
        .iter()
        .map(|(name, lb)| {
            let instances: String = lb
                .instances
                .iter()
                .filter(|(_, r)| matches!(r, Registration::Registered))
                .map(|(id, _)| format!("<member>{}</member>", element("InstanceId", id)))
                .collect();
            format!(
                "<member>{}<Instances>{instances}</Instances></member>",
                element("LoadBalancerName", name)
            )
        })
        .collect();
    Reply::Xml(format!(
        "<LoadBalancerDescriptions>{members}</LoadBalancerDescriptions>{}",
        next_marker(next)
    ))
}

fn describe_classic_tags(state: &ElbState, params: &QueryParams) -> Reply {
    let members: String = query_list(params, "LoadBalancerNames")
        .iter()
        .filter_map(|name| Some((name, state.classics.get(name)?)))
        .map(|(name, lb)| {
            format!(
                "<member>{}{}</member>",
                element("LoadBalancerName", name),
                tags_xml(&lb.tags)
            )
        })
        .collect();
    Reply::Xml(format!("<TagDescriptions>{members}</TagDescriptions>"))
}

fn classic<'a>(
    state: &'a ElbState,
    params: &QueryParams,
) -> Result<&'a ClassicLoadBalancer, ApiError> {
    let name = params.get("LoadBalancerName").cloned().unwrap_or_default();
    state.classics.get(&name).ok_or_else(|| {
        ApiError::new(
            400,
            "LoadBalancerNotFound",
            format!("There is no ACTIVE Load Balancer named '{name}'"),
        )
    })
}

fn describe_instance_health(state: &ElbState, params: &QueryParams) -> Result<Reply, ApiError> {
    let lb = classic(state, params)?;
    let asked: Vec<String> = params
        .iter()
        .filter(|(k, _)| k.starts_with("Instances.member.") && k.ends_with(".InstanceId"))
        .map(|(_, v)| v.clone())
        .collect();
    let mut members = String::new();
    for id in &asked {
        let (state, description) = match lb.instances.get(id).map(|r| r.now()) {
            Some(Registration::Registered) => ("InService", "N/A"),
            Some(Registration::Draining(_)) => (
                "InService",
                "Instance deregistration currently in progress.",
            ),
            Some(Registration::Gone) => (
                "OutOfService",
                "Instance is not currently registered with the LoadBalancer.",
            ),
            None => {
                return Err(ApiError::new(
                    400,
                    "InvalidInstance",
                    format!("Could not find EC2 instance {id}."),
                ));
            }
        };
        members.push_str(&format!(
            "<member>{}{}<ReasonCode>N/A</ReasonCode>{}</member>",
            element("InstanceId", id),
            element("State", state),
            element("Description", description)
        ));
    }
    Ok(Reply::Xml(format!(
        "<InstanceStates>{members}</InstanceStates>"
    )))
}

fn describe_load_balancer_attributes(
    state: &ElbState,
    params: &QueryParams,
) -> Result<Reply, ApiError> {
    let lb = classic(state, params)?;
    let (enabled, timeout) = match lb.draining {
        Some(timeout) => (true, timeout.as_secs()),
        None => (false, 300),
    };
    Ok(Reply::Xml(format!(
        "<LoadBalancerAttributes><ConnectionDraining><Enabled>{enabled}</Enabled><Timeout>{timeout}</Timeout></ConnectionDraining></LoadBalancerAttributes>"
    )))
}
