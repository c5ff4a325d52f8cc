//! The CloudTrail-via-EventBridge / direct-request parser of nodegroup-auth
//! (`node_manager::nodegroup_auth::event::Invocation::parse`) on arbitrary JSON: never a
//! panic, and whatever it accepts names a cluster this function serves.
#![no_main]

use libfuzzer_sys::fuzz_target;
use node_manager::nodegroup_auth::event::{Invocation, Origin};
use node_manager::settings::ClusterScope;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let Ok(payload) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let origin = Origin {
        account_id: "111111111111".to_owned(),
        region: "eu-west-1".to_owned(),
    };
    let scope = ClusterScope {
        cluster_name: "ironman-2022".to_owned(),
        additional_cluster_names: vec!["second".to_owned()],
    };
    match Invocation::parse(&payload, &origin, &scope) {
        Ok(Invocation::Grant { cluster, .. })
        | Ok(Invocation::Revoke { cluster, .. })
        | Ok(Invocation::GrantAll { cluster }) => {
            // nodegroup-auth serves CLUSTER_NAME only, never an additional name.
            assert!(
                cluster == scope.cluster_name,
                "accepted a foreign cluster {cluster:?}"
            );
        }
        Ok(Invocation::Ignore { .. } | Invocation::OtherCluster { .. }) | Err(_) => {}
    }
});
