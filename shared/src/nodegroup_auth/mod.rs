//! The node role's `aws-auth` mapping or access entry.
