//! A local Lambda Runtime API.
