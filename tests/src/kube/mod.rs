//! kube
