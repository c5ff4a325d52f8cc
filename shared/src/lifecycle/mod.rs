//! Auto Scaling lifecycle notifications.
