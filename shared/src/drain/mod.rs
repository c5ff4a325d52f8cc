//! Draining the node of a terminating instance.
