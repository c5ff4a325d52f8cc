//! Cluster access: discovery, EKS bearer tokens and a self-refreshing `kube::Client`.
