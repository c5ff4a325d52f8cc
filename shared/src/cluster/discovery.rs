//! Finding the cluster's API server: `DescribeCluster`, or the environment for local runs.

use base64::Engine as _;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject as _;

use crate::aws::{AuthenticationMode, ClusterDescription, Eks};
use crate::settings::{SettingsError, SettingsSource};

use super::error::ClusterAccessError;

/// `CLUSTER_ENDPOINT`: the API server URL, used instead of `DescribeCluster`.
pub const CLUSTER_ENDPOINT: &str = "CLUSTER_ENDPOINT";
/// `CLUSTER_CA_DATA`: base64 of the PEM CA bundle, as `DescribeCluster` returns it.
pub const CLUSTER_CA_DATA: &str = "CLUSTER_CA_DATA";
/// `CLUSTER_AUTHENTICATION_MODE`: `CONFIG_MAP` (default), `API_AND_CONFIG_MAP` or `API`.
pub(crate) const CLUSTER_AUTHENTICATION_MODE: &str = "CLUSTER_AUTHENTICATION_MODE";

/// What a function needs to know to talk to the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterInfo {
    pub name: String,
    /// `https://...` (or `http://...` for a local API server given in `CLUSTER_ENDPOINT`).
    pub endpoint: String,
    /// Base64 of the PEM CA bundle, as EKS returns it. Empty only for `http://` endpoints.
    pub certificate_authority_data: String,
    pub authentication_mode: AuthenticationMode,
}

impl ClusterInfo {
    /// The parsed endpoint; refuses anything but an absolute `https://` or `http://` URL.
    pub fn endpoint_uri(&self) -> Result<http::Uri, ClusterAccessError> {
        let invalid = |reason: &str| ClusterAccessError::InvalidEndpoint {
            endpoint: self.endpoint.clone(),
            reason: reason.to_owned(),
        };
        if self.endpoint.is_empty() {
            return Err(invalid(
                "the cluster has no endpoint yet (is it still being created?)",
            ));
        }
        let uri: http::Uri = self
            .endpoint
            .parse()
            .map_err(|e: http::uri::InvalidUri| invalid(&e.to_string()))?;
        match uri.scheme_str() {
            Some("https") | Some("http") => {}
            _ => {
                return Err(invalid(
                    "expected an https:// (or for local runs http://) URL",
                ));
            }
        }
        if uri.host().is_none_or(str::is_empty) {
            return Err(invalid("the URL has no host"));
        }
        Ok(uri)
    }

    /// The CA certificates (DER) the API server's certificate must chain to. Empty for an
    /// `http://` endpoint without CA data.
    pub fn ca_certificates(&self) -> Result<Vec<Vec<u8>>, ClusterAccessError> {
        let invalid = |reason: String| ClusterAccessError::InvalidCertificateAuthority { reason };
        let data = self.certificate_authority_data.trim();
        if data.is_empty() {
            return Ok(Vec::new());
        }
        let pem = base64::engine::general_purpose::STANDARD
            .decode(data)
            .map_err(|e| invalid(format!("not base64: {e}")))?;
        let certs = CertificateDer::pem_slice_iter(&pem)
            .map(|cert| cert.map(|c| c.as_ref().to_vec()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| invalid(format!("not a PEM certificate bundle: {e}")))?;
        if certs.is_empty() {
            return Err(invalid("the PEM bundle holds no certificate".to_owned()));
        }
        Ok(certs)
    }

    /// Checks endpoint and CA together: an `https://` endpoint needs a CA.
    pub(crate) fn validate(&self) -> Result<(), ClusterAccessError> {
        let uri = self.endpoint_uri()?;
        let certs = self.ca_certificates()?;
        if uri.scheme_str() == Some("https") && certs.is_empty() {
            return Err(ClusterAccessError::InvalidCertificateAuthority {
                reason: "an https:// endpoint needs the cluster's CA".to_owned(),
            });
        }
        Ok(())
    }
}

impl From<ClusterDescription> for ClusterInfo {
    fn from(description: ClusterDescription) -> Self {
        Self {
            name: description.name,
            endpoint: description.endpoint,
            certificate_authority_data: description.certificate_authority_data,
            authentication_mode: description.authentication_mode,
        }
    }
}

/// The cluster given in the environment instead of looked up (local runs, tests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterOverride {
    pub endpoint: String,
    pub certificate_authority_data: String,
    pub authentication_mode: AuthenticationMode,
}

impl ClusterOverride {
    /// Reads `CLUSTER_ENDPOINT`, `CLUSTER_CA_DATA` and `CLUSTER_AUTHENTICATION_MODE`.
    ///
    /// `None` when `CLUSTER_ENDPOINT` is unset. `CLUSTER_CA_DATA` is required with an
    /// `https://` endpoint and may be left out for `http://`.
    pub fn from_settings(
        source: &(impl SettingsSource + ?Sized),
    ) -> Result<Option<Self>, SettingsError> {
        let endpoint = source.value(CLUSTER_ENDPOINT);
        let ca = source.value(CLUSTER_CA_DATA);
        let Some(endpoint) = endpoint else {
            if ca.is_some() {
                return Err(SettingsError::Missing {
                    name: CLUSTER_ENDPOINT,
                    hint: "CLUSTER_CA_DATA is set: set CLUSTER_ENDPOINT to the API server URL too, or unset both to use DescribeCluster",
                });
            }
            return Ok(None);
        };
        let certificate_authority_data = match ca {
            Some(ca) => ca,
            None if endpoint.starts_with("http://") => String::new(),
            None => {
                return Err(SettingsError::Missing {
                    name: CLUSTER_CA_DATA,
                    hint: "CLUSTER_ENDPOINT is https://: set CLUSTER_CA_DATA to the base64 PEM CA bundle (as DescribeCluster returns it)",
                });
            }
        };
        let authentication_mode = match source.value(CLUSTER_AUTHENTICATION_MODE) {
            None => AuthenticationMode::ConfigMap,
            Some(value) => AuthenticationMode::parse(&value).ok_or(SettingsError::Invalid {
                name: CLUSTER_AUTHENTICATION_MODE,
                value,
                expected: "CONFIG_MAP, API_AND_CONFIG_MAP or API",
            })?,
        };
        Ok(Some(Self {
            endpoint,
            certificate_authority_data,
            authentication_mode,
        }))
    }

    pub fn into_cluster_info(self, cluster_name: &str) -> ClusterInfo {
        ClusterInfo {
            name: cluster_name.to_owned(),
            endpoint: self.endpoint,
            certificate_authority_data: self.certificate_authority_data,
            authentication_mode: self.authentication_mode,
        }
    }
}

/// Looks the cluster up with `DescribeCluster` and checks that it can be used.
pub async fn describe_cluster(
    eks: &impl Eks,
    cluster_name: &str,
    region: &str,
) -> Result<ClusterInfo, ClusterAccessError> {
    let description = eks
        .describe_cluster(cluster_name)
        .await
        .map_err(|e| ClusterAccessError::from_describe(cluster_name, region, e))?
        .ok_or_else(|| ClusterAccessError::ClusterNotFound {
            cluster_name: cluster_name.to_owned(),
            region: region.to_owned(),
        })?;
    let info = ClusterInfo::from(description);
    info.validate()?;
    Ok(info)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn override_needs_both_halves_for_https() {
        let env: &[(&str, &str)] = &[("CLUSTER_ENDPOINT", "https://k8s.example")];
        let err = ClusterOverride::from_settings(env).unwrap_err();
        assert!(err.to_string().contains("CLUSTER_CA_DATA"), "{err}");

        let env: &[(&str, &str)] = &[("CLUSTER_CA_DATA", "abc")];
        let err = ClusterOverride::from_settings(env).unwrap_err();
        assert!(err.to_string().contains("CLUSTER_ENDPOINT"), "{err}");

        let env: &[(&str, &str)] = &[];
        assert_eq!(ClusterOverride::from_settings(env).unwrap(), None);
    }

    #[test]
    fn override_reads_mode_and_allows_plain_http() {
        let env: &[(&str, &str)] = &[
            ("CLUSTER_ENDPOINT", "http://127.0.0.1:8080"),
            ("CLUSTER_AUTHENTICATION_MODE", "API_AND_CONFIG_MAP"),
        ];
        let found = ClusterOverride::from_settings(env).unwrap().unwrap();
        assert_eq!(
            found.authentication_mode,
            AuthenticationMode::ApiAndConfigMap
        );
        let info = found.into_cluster_info("local");
        info.validate().unwrap();

        let env: &[(&str, &str)] = &[
            ("CLUSTER_ENDPOINT", "http://127.0.0.1:8080"),
            ("CLUSTER_AUTHENTICATION_MODE", "sometimes"),
        ];
        let err = ClusterOverride::from_settings(env).unwrap_err();
        assert!(
            err.to_string().contains("CLUSTER_AUTHENTICATION_MODE"),
            "{err}"
        );
    }

    #[test]
    fn unusable_endpoints_and_cas_are_refused() {
        let info = |endpoint: &str, ca: &str| ClusterInfo {
            name: "c".into(),
            endpoint: endpoint.into(),
            certificate_authority_data: ca.into(),
            authentication_mode: AuthenticationMode::ConfigMap,
        };
        assert!(matches!(
            info("", "").validate(),
            Err(ClusterAccessError::InvalidEndpoint { .. })
        ));
        assert!(matches!(
            info("ftp://x", "").validate(),
            Err(ClusterAccessError::InvalidEndpoint { .. })
        ));
        assert!(matches!(
            info("https://x", "").validate(),
            Err(ClusterAccessError::InvalidCertificateAuthority { .. })
        ));
        assert!(matches!(
            info("https://x", "!!!").validate(),
            Err(ClusterAccessError::InvalidCertificateAuthority { .. })
        ));
        let not_pem = base64::engine::general_purpose::STANDARD.encode("hello");
        assert!(matches!(
            info("https://x", &not_pem).validate(),
            Err(ClusterAccessError::InvalidCertificateAuthority { .. })
        ));
    }
}
