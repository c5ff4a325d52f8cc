//! The replacement loop of an instance refresh: a tokio task that launches and terminates
//! batch by batch, polls the state for the instances it waits for (never holding the lock
//! across an await), and records the end with its EventBridge event. As Auto Scaling does,
//! it puts `EC2 Instance Launch Successful` on the bus once a new instance is in service
//! (after its launching hook) and `EC2 Instance Terminate Successful` once an outdated one
//! has left the group.

use std::sync::{Arc, Weak};
use std::time::Duration;

use jiff::Timestamp;
use serde_json::json;

use super::launch::{launch_new_instance, terminate_at_once};
use super::refresh::{InstanceRefreshStatus, RefreshRecord};
use super::{AsgState, FakeAutoScaling, FakeLaunchTemplate, LifecycleTransition, RETAINED};
use crate::aws::{Shared, lock};

/// How often the loop looks at the instances it waits for.
pub(super) const POLL: Duration = Duration::from_millis(10);

/// How long after reporting the refresh started (`InProgress`, the Started event) the loop
/// begins its first batch. On AWS the first replacement activity comes seconds after the
/// start; without a pause here, the first termination would always begin before a
/// subscriber of the Started event could act on it.
const FIRST_BATCH_AFTER: Duration = Duration::from_millis(300);

/// What the loop works from, fixed at the start.
pub(super) struct Plan {
    pub(super) id: String,
    pub(super) group_name: String,
    /// Outdated instances, oldest first.
    pub(super) outdated: Vec<String>,
    pub(super) launch_first: bool,
    pub(super) batch_size: usize,
    /// Scaled.
    pub(super) warmup: Duration,
    pub(super) launch_template: Option<FakeLaunchTemplate>,
}

fn record_mut<'a>(state: &'a mut AsgState, id: &str) -> Option<&'a mut RefreshRecord> {
    state.refreshes.iter_mut().find(|r| r.view.id == id)
}

/// The loop of one refresh. Gives up quietly once the fake is gone.
pub(super) async fn run(shared: Weak<Shared>, plan: Plan) {
    if !set_in_progress(&shared, &plan) {
        return;
    }
    tokio::time::sleep(FIRST_BATCH_AFTER).await;
    let mut queue = plan.outdated.iter();
    let end = loop {
        if cancelling(&shared, &plan.id) {
            break (InstanceRefreshStatus::Cancelled, None);
        }
        if rolling_back(&shared, &plan.id) {
            break match roll_back(&shared, &plan).await {
                Ok(()) => (InstanceRefreshStatus::RollbackSuccessful, None),
                Err(Some(reason)) => (InstanceRefreshStatus::RollbackFailed, Some(reason)),
                Err(None) => return,
            };
        }
        // Instances that already left (scale-in, another termination) need no replacing.
        let batch: Vec<String> = queue
            .by_ref()
            .filter(|id| {
                lifecycle_state(&shared, &plan.group_name, id).as_deref() == Some("InService")
            })
            .take(plan.batch_size)
            .cloned()
            .collect();
        if batch.is_empty() {
            break (InstanceRefreshStatus::Successful, None);
        }
        let step = if plan.launch_first {
            match launch(&shared, &plan, batch.len(), plan.launch_template.clone()).await {
                // A cancel leaves the new instances in service and the old ones running.
                Ok(()) if cancelling(&shared, &plan.id) => Ok(()),
                Ok(()) => terminate(&shared, &plan, &batch).await,
                Err(reason) => Err(reason),
            }
        } else {
            // The replacements of a terminated batch launch even when cancelling, so the
            // group gets its capacity back.
            match terminate(&shared, &plan, &batch).await {
                Ok(()) => launch(&shared, &plan, batch.len(), plan.launch_template.clone()).await,
                Err(reason) => Err(reason),
            }
        };
        match step {
            Ok(()) => {}
            Err(Some(reason)) => break (InstanceRefreshStatus::Failed, Some(reason)),
            Err(None) => return,
        }
    };
    finish(&shared, &plan, end.0, end.1);
}

/// A step's failure: the reason, or `None` when the fake is gone.
type StepResult = Result<(), Option<String>>;

fn lifecycle_state(shared: &Weak<Shared>, group_name: &str, instance_id: &str) -> Option<String> {
    let shared = shared.upgrade()?;
    FakeAutoScaling::new(shared).instance_state(group_name, instance_id)
}

fn cancelling(shared: &Weak<Shared>, id: &str) -> bool {
    shared.upgrade().is_some_and(|shared| {
        record_mut(&mut lock(&shared.autoscaling.state), id)
            .is_some_and(|r| r.view.status == InstanceRefreshStatus::Cancelling)
    })
}

fn rolling_back(shared: &Weak<Shared>, id: &str) -> bool {
    shared.upgrade().is_some_and(|shared| {
        record_mut(&mut lock(&shared.autoscaling.state), id)
            .is_some_and(|r| r.view.status == InstanceRefreshStatus::RollbackInProgress)
    })
}

/// A rollback (`RollbackInstanceRefresh`): each instance the refresh launched is replaced,
/// one at a time and launch first, by one of the configuration the group had before the
/// refresh (the group's own, which only a successful refresh changes); the outdated
/// instances the refresh had not reached stay as they are.
async fn roll_back(shared: &Weak<Shared>, plan: &Plan) -> StepResult {
    let launched = {
        let shared = shared.upgrade().ok_or(None)?;
        let mut state = lock(&shared.autoscaling.state);
        record_mut(&mut state, &plan.id)
            .map(|r| r.view.launched_instance_ids.clone())
            .unwrap_or_default()
    };
    for instance_id in launched {
        if lifecycle_state(shared, &plan.group_name, &instance_id).as_deref() != Some("InService") {
            continue;
        }
        launch(shared, plan, 1, None).await?;
        terminate(shared, plan, std::slice::from_ref(&instance_id)).await?;
    }
    Ok(())
}

fn set_in_progress(shared: &Weak<Shared>, plan: &Plan) -> bool {
    let Some(shared) = shared.upgrade() else {
        return false;
    };
    if let Some(record) = record_mut(&mut lock(&shared.autoscaling.state), &plan.id)
        && record.view.status == InstanceRefreshStatus::Pending
    {
        record.view.status = InstanceRefreshStatus::InProgress;
    }
    emit(&shared, plan, "EC2 Auto Scaling Instance Refresh Started");
    true
}

/// Launches `count` instances of `template` (the group's own when `None`) and waits until
/// each is in service, then the warmup.
async fn launch(
    shared: &Weak<Shared>,
    plan: &Plan,
    count: usize,
    template: Option<FakeLaunchTemplate>,
) -> StepResult {
    let mut launched = Vec::with_capacity(count);
    {
        let shared = shared.upgrade().ok_or(None)?;
        for _ in 0..count {
            let instance = launch_new_instance(&shared, &plan.group_name, None, template.clone())
                .map_err(|e| Some(e.to_string()))?;
            if let Some(record) = record_mut(&mut lock(&shared.autoscaling.state), &plan.id) {
                record
                    .view
                    .launched_instance_ids
                    .push(instance.instance_id.clone());
            }
            launched.push(instance.instance_id);
        }
    }
    for instance_id in &launched {
        loop {
            match lifecycle_state(shared, &plan.group_name, instance_id).as_deref() {
                Some("InService") => {
                    let shared = shared.upgrade().ok_or(None)?;
                    emit_instance(&shared, plan, instance_id, LAUNCH_SUCCESSFUL);
                    break;
                }
                Some(_) => tokio::time::sleep(POLL).await,
                None if shared.upgrade().is_none() => return Err(None),
                None => {
                    return Err(Some(format!(
                        "instance {instance_id} failed to launch: its launching lifecycle action was abandoned"
                    )));
                }
            }
        }
    }
    tokio::time::sleep(plan.warmup).await;
    Ok(())
}

/// Terminates `batch` and waits until each instance has left `Terminating:Wait`.
async fn terminate(shared: &Weak<Shared>, plan: &Plan, batch: &[String]) -> StepResult {
    {
        let shared = shared.upgrade().ok_or(None)?;
        let has_hook = lock(&shared.autoscaling.state)
            .has_hook(&plan.group_name, LifecycleTransition::Terminating);
        for instance_id in batch {
            if has_hook {
                FakeAutoScaling::new(Arc::clone(&shared))
                    .terminate_instance(&plan.group_name, instance_id)
                    .map_err(|e| Some(e.to_string()))?;
            } else {
                terminate_at_once(&shared, &plan.group_name, instance_id);
            }
        }
    }
    let mut retained = None;
    for instance_id in batch {
        loop {
            match lifecycle_state(shared, &plan.group_name, instance_id).as_deref() {
                Some("Terminating:Wait") => tokio::time::sleep(POLL).await,
                Some(RETAINED) => {
                    retained.get_or_insert_with(|| instance_id.clone());
                    break;
                }
                _ => {
                    let shared = shared.upgrade().ok_or(None)?;
                    record_replaced(&shared, plan, instance_id);
                    emit_instance(&shared, plan, instance_id, TERMINATE_SUCCESSFUL);
                    break;
                }
            }
        }
    }
    match retained {
        Some(instance_id) => Err(Some(format!(
            "instance {instance_id} was retained: its terminating lifecycle action was abandoned"
        ))),
        None => Ok(()),
    }
}

fn record_replaced(shared: &Shared, plan: &Plan, instance_id: &str) {
    let mut state = lock(&shared.autoscaling.state);
    if let Some(record) = record_mut(&mut state, &plan.id) {
        record
            .view
            .replaced_instance_ids
            .push(instance_id.to_owned());
        let done = record.view.replaced_instance_ids.len() * 100;
        let total = usize::try_from(record.view.instances_to_update).unwrap_or(1);
        record.view.percentage_complete = u32::try_from(done / total.max(1)).unwrap_or(100);
    }
}

/// Records the end and puts its event on the bus. A successful refresh with a desired
/// template leaves the group launching that template.
fn finish(
    shared: &Weak<Shared>,
    plan: &Plan,
    status: InstanceRefreshStatus,
    reason: Option<String>,
) {
    let Some(shared) = shared.upgrade() else {
        return;
    };
    {
        let mut state = lock(&shared.autoscaling.state);
        if let Some(record) = record_mut(&mut state, &plan.id) {
            record.view.status = status;
            record.view.status_reason = reason;
            record.end_time = Some(Timestamp::now());
            if status == InstanceRefreshStatus::Successful {
                record.view.percentage_complete = 100;
            }
        }
        if status == InstanceRefreshStatus::Successful
            && let Some(group) = state.groups.get_mut(&plan.group_name)
            && plan.launch_template.is_some()
        {
            group.group.launch_template = plan.launch_template.clone();
        }
    }
    let detail_type = match status {
        InstanceRefreshStatus::Successful => "EC2 Auto Scaling Instance Refresh Succeeded",
        InstanceRefreshStatus::Cancelled => "EC2 Auto Scaling Instance Refresh Cancelled",
        InstanceRefreshStatus::RollbackSuccessful => {
            "EC2 Auto Scaling Instance Refresh Rollback Succeeded"
        }
        InstanceRefreshStatus::RollbackFailed => {
            "EC2 Auto Scaling Instance Refresh Rollback Failed"
        }
        _ => "EC2 Auto Scaling Instance Refresh Failed",
    };
    emit(&shared, plan, detail_type);
}

const LAUNCH_SUCCESSFUL: &str = "EC2 Instance Launch Successful";
const TERMINATE_SUCCESSFUL: &str = "EC2 Instance Terminate Successful";

fn group_arn(shared: &Shared, plan: &Plan) -> String {
    lock(&shared.autoscaling.state)
        .groups
        .get(&plan.group_name)
        .map(|record| record.arn.clone())
        .unwrap_or_default()
}

/// An instance event as Auto Scaling sends it: the group's and the instance's ARNs, the
/// group and instance in the detail (no refresh id), and the activity's fields.
fn emit_instance(shared: &Shared, plan: &Plan, instance_id: &str, detail_type: &str) {
    let instance_arn = format!(
        "arn:aws:ec2:{}:{}:instance/{instance_id}",
        shared.account.region, shared.account.account_id
    );
    let now = Timestamp::now().to_string();
    let description = if detail_type == LAUNCH_SUCCESSFUL {
        format!("Launching a new EC2 instance: {instance_id}")
    } else {
        format!("Terminating EC2 instance: {instance_id}")
    };
    crate::aws::eventbridge::emit(
        shared,
        "aws.autoscaling",
        detail_type,
        vec![group_arn(shared, plan), instance_arn],
        json!({
            "StatusCode": "InProgress",
            "Description": description,
            "AutoScalingGroupName": plan.group_name,
            "ActivityId": crate::aws::uuid_v4(),
            "Details": {},
            "RequestId": crate::aws::uuid_v4(),
            "StatusMessage": "",
            "EndTime": now,
            "EC2InstanceId": instance_id,
            "StartTime": now,
            "Cause": format!("An instance refresh {} is replacing instances", plan.id),
        }),
    );
}

fn emit(shared: &Shared, plan: &Plan, detail_type: &str) {
    let arn = group_arn(shared, plan);
    crate::aws::eventbridge::emit(
        shared,
        "aws.autoscaling",
        detail_type,
        vec![arn],
        json!({"InstanceRefreshId": plan.id, "AutoScalingGroupName": plan.group_name}),
    );
}
