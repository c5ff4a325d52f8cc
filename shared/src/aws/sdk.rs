//! SDK adapters for the AWS traits.
