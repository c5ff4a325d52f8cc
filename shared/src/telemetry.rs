//! Logging set-up.
