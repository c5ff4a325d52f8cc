//! The one HTTPS stack the AWS SDK clients use: rustls with ring, the same as kube's.
