//! The messages Auto Scaling publishes to a hook's target: the lifecycle notification and
//! the test notification sent when a hook is created.

use std::collections::BTreeMap;

use super::{FakeAutoScaling, FakeLifecycleHook, Route};
use crate::aws::protocol;
use crate::aws::{FakeAwsError, Shared};

impl FakeAutoScaling {
    /// Sends the `autoscaling:TEST_NOTIFICATION` Auto Scaling sends to a hook's target when
    /// the hook is created, and returns its message.
    pub fn send_test_notification(
        &self,
        group_name: &str,
        hook_name: &str,
    ) -> Result<String, FakeAwsError> {
        let (arn, target) = {
            let state = self.state();
            let record = state
                .groups
                .get(group_name)
                .ok_or_else(|| FakeAwsError::UnknownGroup(group_name.to_owned()))?;
            let target = record
                .hooks
                .get(hook_name)
                .and_then(|hook| hook.notification_target_arn.clone());
            (record.arn.clone(), target)
        };
        let account = &self.shared.account;
        let message = format!(
            "{{\"AccountId\":{},\"RequestId\":{},\"AutoScalingGroupARN\":{},\"AutoScalingGroupName\":{},\"Service\":\"AWS Auto Scaling\",\"Event\":\"autoscaling:TEST_NOTIFICATION\",\"Time\":{}}}",
            json_string(&account.account_id),
            json_string(&protocol::uuid_v4()),
            json_string(&arn),
            json_string(group_name),
            json_string(&protocol::timestamp_millis(jiff::Timestamp::now())),
        );
        if let Some(topic) = target {
            let subject = format!("Auto Scaling: test notification for group \"{group_name}\"");
            crate::aws::sns::deliver(
                &self.shared,
                &topic,
                Some(&subject),
                &message,
                BTreeMap::new(),
                crate::aws::sns::PublishSource::AutoScaling,
            )?;
        }
        Ok(message)
    }
}

fn json_string(value: &str) -> String {
    serde_json::Value::from(value).to_string()
}

/// The notification in Auto Scaling's field order.
pub(super) fn lifecycle_message(
    shared: &Shared,
    group_name: &str,
    hook: &FakeLifecycleHook,
    instance_id: &str,
    token: &str,
    route: Route,
) -> String {
    let (origin, destination) = (route.origin, route.destination);
    let mut message = format!(
        "{{\"Origin\":{},\"Destination\":{},\"Service\":\"AWS Auto Scaling\",\"Time\":{},\"AccountId\":{},\"LifecycleTransition\":{},\"RequestId\":{},\"LifecycleActionToken\":{},\"EC2InstanceId\":{},\"LifecycleHookName\":{},\"AutoScalingGroupName\":{}",
        json_string(origin),
        json_string(destination),
        json_string(&protocol::timestamp_millis(jiff::Timestamp::now())),
        json_string(&shared.account.account_id),
        json_string(hook.transition.as_str()),
        json_string(&protocol::uuid_v4()),
        json_string(token),
        json_string(instance_id),
        json_string(&hook.name),
        json_string(group_name),
    );
    if let Some(metadata) = &hook.notification_metadata {
        message.push_str(",\"NotificationMetadata\":");
        message.push_str(&json_string(metadata));
    }
    message.push('}');
    message
}
