//! The reliability and security suite's machinery: the secrets scanner for captured logs
//! ([`secrets`]), the bad-input corpus ([`corpus`]), the seeded fault soak ([`scenario`]), the
//! seeded event soak ([`events`]) and the node-repair soak ([`repair`]).
//! The tests that use them are `tests/tests/reliability_*.rs` and `tests/tests/security_*.rs`;
//! `RELIABILITY.md` at the repository root says what they promise and how to run them.

pub mod corpus;
pub mod events;
pub mod repair;
pub mod scenario;
pub mod secrets;
