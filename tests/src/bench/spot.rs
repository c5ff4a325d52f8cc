//! The Spot interruption benchmark: one node with N pods gets EC2's two-minute warning; how
//! long until the node is empty, and how many pods ended before the instance did, with their
//! own grace period or one cut to fit.
//!
//! Grace periods run in real time here (the emulation's scale is 1), because the function
//! cuts them against the real clock: a full run lasts as long as a real interruption.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;

use super::Mode;
use super::drain::start;
use crate::aws::SpotInterruptionAction;
use crate::fixtures;

/// How long EC2 gives a Spot instance after its warning.
const NOTICE: Duration = Duration::from_secs(120);

/// One run's figures.
#[derive(Debug, Clone)]
pub struct SpotFigures {
    pub pods: usize,
    /// Warning put on the bus → no evictable pod left on the node.
    pub notice_to_empty: Option<Duration>,
    /// Warning → first eviction request at the API server.
    pub notice_to_first_eviction: Option<Duration>,
    /// Pods gone before the instance's end (warning + 120 s).
    pub ended_before_end: usize,
    /// Of those, evicted with their own grace period.
    pub with_own_grace: usize,
    /// Of those, evicted with a grace period cut to fit (the smallest cut one, seconds).
    pub with_cut_grace: usize,
    pub smallest_cut_grace: Option<i64>,
    /// Critical pods, and when the last of them was gone (after the warning).
    pub critical_pods: usize,
    pub critical_gone_at: Option<Duration>,
    /// The function's outcome for the warning.
    pub outcome: String,
}

/// The pods' grace periods, by share of the node: most of them short, some longer than the
/// notice allows. `Quick` scales them down so that CI runs in seconds.
fn grace_mix(mode: Mode) -> [(&'static str, usize, i64); 4] {
    // (kind, percent of the pods, grace seconds)
    match mode {
        Mode::Full => [
            ("web", 60, 30),
            ("worker", 20, 60),
            ("batch", 10, 300),
            ("critical", 10, 30),
        ],
        Mode::Quick => [
            ("web", 60, 1),
            ("worker", 20, 2),
            ("batch", 10, 3),
            ("critical", 10, 1),
        ],
    }
}

/// The bench delivers the warning to the function itself and times that invocation: the
/// sandbox's own delivery of the bus's events (a second invocation for the same warning,
/// which would find the drain taken) is off.
fn scenario(pods: usize) -> String {
    format!(
        "name: spot-{pods}\n\
         description: one Spot node with {pods} pods gets the interruption warning\n\
         instanceNoticeEvents: false\n\
         timings: {{ settleSeconds: 0, drainTimeoutSeconds: 600, podStartSeconds: 0.05, gracePeriodScale: 1, functionTimeoutSeconds: 900, deregistrationDelaySeconds: 0 }}\n\
         nodegroups:\n  - {{ name: ng, autoScalingGroup: asg-spot, nodeRole: spot-node-role, nodes: 3, selfManaged: true }}\n\
         workloads:\n  - {{ kind: DaemonSet, namespace: kube-system, name: kube-proxy }}\n\
         steps: []\n"
    )
}

/// One interruption of a node with `pods` pods.
pub async fn spot_interruption(pods: usize, mode: Mode) -> Result<SpotFigures, String> {
    let sandbox = start(&scenario(pods)).await?;
    let (node, instance) = sandbox.seeded_node("ng", 0).ok_or("no node")?;
    let store = sandbox.server().store();
    let mut grace_of = BTreeMap::new();
    let mut critical = Vec::new();
    let mut made = 0;
    for (kind, percent, grace) in grace_mix(mode) {
        let count = (pods * percent).div_ceil(100).min(pods - made);
        for i in 0..count {
            let name = format!("{kind}-{i}");
            let mut pod = fixtures::running_pod("default", &name, &node, &[("app", kind)]);
            if let Some(spec) = pod.spec.as_mut() {
                spec.termination_grace_period_seconds = Some(grace);
                if kind == "critical" {
                    spec.priority_class_name = Some("system-cluster-critical".to_owned());
                    critical.push(name.clone());
                }
            }
            store.create(&pod).map_err(|e| e.to_string())?;
            grace_of.insert(name, grace);
        }
        made += count;
    }

    // The instance is a Spot instance; EC2 marks its request and sends the warning, which
    // the stack's rule delivers to the terminating hook.
    let ec2 = sandbox.aws().ec2();
    let seeded = ec2.instance(&instance).ok_or("no EC2 instance")?;
    ec2.add_instance(seeded.spot());
    let hook = sandbox
        .function("terminating-hook")
        .ok_or("no terminating-hook")?;
    let warned_at = Instant::now();
    let warned_wall = jiff::Timestamp::now();
    let warning = sandbox
        .aws()
        .interruptions()
        .spot_interruption(&instance, SpotInterruptionAction::Terminate)
        .map_err(|e| e.to_string())?;
    let invocation = hook.invoke(&warning, NOTICE * 2);

    // Watch the node meanwhile: when each pod is gone.
    let watch = async {
        let mut gone_at: BTreeMap<String, Duration> = BTreeMap::new();
        let mut empty_at = None;
        while warned_at.elapsed() < NOTICE + Duration::from_secs(10) {
            let on_node: Vec<String> = store
                .list::<Pod>()
                .into_iter()
                .filter(|p| {
                    p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node.as_str())
                })
                .filter_map(|p| p.metadata.name)
                .filter(|n| grace_of.contains_key(n))
                .collect();
            for name in grace_of.keys() {
                if !on_node.contains(name) {
                    gone_at.entry(name.clone()).or_insert(warned_at.elapsed());
                }
            }
            if on_node.is_empty() {
                empty_at = Some(warned_at.elapsed());
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        (gone_at, empty_at)
    };
    let (invoked, (gone_at, empty_at)) = tokio::join!(invocation, watch);
    let outcome = match invoked {
        Ok(crate::lambda_api::InvocationOutcome::Response(answer)) => {
            answer["instances"][0]["outcome"]
                .as_str()
                .unwrap_or("?")
                .to_owned()
        }
        other => format!("{other:?}"),
    };

    // What each eviction asked for, from the API server's audit log.
    let mut sent: BTreeMap<String, i64> = BTreeMap::new();
    let mut first_eviction = None;
    for e in sandbox
        .server()
        .audit()
        .subresource_requests("pods", "eviction")
    {
        if let Ok(at) = e.request_received_timestamp.parse::<jiff::Timestamp>() {
            let after = Duration::try_from(at.duration_since(warned_wall)).unwrap_or_default();
            first_eviction = Some(first_eviction.map_or(after, |f: Duration| f.min(after)));
        }
        if let Some(grace) = e
            .request_object
            .as_ref()
            .and_then(|b| b["deleteOptions"]["gracePeriodSeconds"].as_i64())
        {
            sent.entry(e.name().to_owned()).or_insert(grace);
        }
    }
    let ended: Vec<&String> = gone_at
        .iter()
        .filter(|(_, at)| **at < NOTICE)
        .map(|(name, _)| name)
        .collect();
    let cut: Vec<i64> = ended
        .iter()
        .filter_map(|name| Some((sent.get(*name)?, grace_of.get(*name)?)))
        .filter(|(sent, own)| sent < own)
        .map(|(sent, _)| *sent)
        .collect();
    Ok(SpotFigures {
        pods,
        notice_to_empty: empty_at,
        notice_to_first_eviction: first_eviction,
        ended_before_end: ended.len(),
        with_own_grace: ended.len() - cut.len(),
        with_cut_grace: cut.len(),
        smallest_cut_grace: cut.iter().copied().min(),
        critical_pods: critical.len(),
        critical_gone_at: critical
            .iter()
            .map(|name| gone_at.get(name).copied())
            .collect::<Option<Vec<_>>>()
            .and_then(|times| times.into_iter().max()),
        outcome,
    })
}
