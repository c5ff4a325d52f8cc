//! Serving a finished sandbox to a user: a kubeconfig that signs EKS tokens with the
//! `eks-token` exec plugin as an administrator, and what to export to reach the fakes.

use std::path::Path;

use k8s_openapi::api::core::v1::ConfigMap;

use super::SandboxError;
use super::world::{Sandbox, setup};
use crate::binaries;

impl Sandbox {
    /// What a user needs to point kubectl or `cargo lambda invoke` at the running fakes.
    pub fn describe_for_serving(&self, kubeconfig: &Path) -> String {
        let mut text = format!(
            "The sandbox keeps running (Ctrl-C stops it).\n\nkubectl:\n  export KUBECONFIG={}\n  kubectl get nodes,pods -A -o wide\n\nAWS (for a function run by hand, e.g. with its binary or cargo lambda):\n",
            kubeconfig.display()
        );
        text.push_str(&format!(
            "  export AWS_ENDPOINT_URL={}\n",
            self.aws.endpoint_url()
        ));
        text.push_str(&format!("  export AWS_REGION={}\n", self.scenario.region));
        text.push_str(&format!(
            "  export CLUSTER_NAME={}\n",
            self.scenario.cluster
        ));
        text.push_str(&format!(
            "  export CONTINUATION_TOPIC_ARN={}\n",
            self.topic_arn()
        ));
        text.push_str("  (credentials: the fake account accepts only keys it issued; see the function environments below)\n");
        for (name, function) in &self.functions {
            text.push_str(&format!(
                "  {name}: Lambda Runtime API at {}\n",
                function.runtime_api()
            ));
        }
        text
    }

    /// A kubeconfig whose user signs EKS tokens with the `eks-token` exec plugin, as an
    /// administrator mapped in `aws-auth` (or an access entry), written to `path`.
    pub fn write_kubeconfig(&self, path: &Path) -> Result<(), SandboxError> {
        let admin = self.account.add_role_credentials("sandbox-admin");
        if self.uses_config_map() {
            let _ = self
                .server
                .store()
                .modify::<ConfigMap>("kube-system", "aws-auth", |cm| {
                    let data = cm.data.get_or_insert_with(Default::default);
                    let roles = data.entry("mapRoles".to_owned()).or_default();
                    roles.push_str(&format!(
                    "- rolearn: {}\n  username: sandbox-admin\n  groups:\n    - system:masters\n",
                    admin.principal_arn
                ));
                });
        }
        if self.uses_access_entries() {
            let _ = self.aws.eks().add_access_entry(
                &self.scenario.cluster,
                &admin.principal_arn,
                "STANDARD",
                Some("sandbox-admin"),
                &["system:masters"],
            );
        }
        let eks_token =
            binaries::try_function_binary("eks-token").map_err(setup("eks-token binary"))?;
        let mut user = format!(
            "    exec:\n      apiVersion: client.authentication.k8s.io/v1beta1\n      command: {}\n      args: [\"--cluster-name\", \"{}\", \"--region\", \"{}\"]\n      interactiveMode: Never\n      env:\n",
            eks_token.display(),
            self.scenario.cluster,
            self.scenario.region
        );
        for (key, value) in self.aws.environment(&admin) {
            user.push_str(&format!(
                "      - name: {key}\n        value: \"{value}\"\n"
            ));
        }
        std::fs::write(path, self.server.kubeconfig_yaml_with_user(&user))
            .map_err(setup("kubeconfig"))
    }
}
