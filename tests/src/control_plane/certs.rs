//! The real control plane's key material, generated per plane: a CA, kube-apiserver's serving
//! certificate (for 127.0.0.1 and the in-cluster names) and the service-account signing key.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

use super::ControlPlaneError;

/// The files the control plane's flags name, written into the plane's directory.
pub struct PlaneCertificates {
    pub ca_pem: String,
    pub ca_file: PathBuf,
    pub serving_cert_file: PathBuf,
    pub serving_key_file: PathBuf,
    /// PKCS#8 private key that signs service-account tokens (apiserver, controller-manager).
    pub service_account_key_file: PathBuf,
    /// Its public key, which the apiserver verifies tokens with.
    pub service_account_public_file: PathBuf,
}

impl PlaneCertificates {
    pub fn generate(dir: &Path) -> Result<Self, ControlPlaneError> {
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "open-node-manager-test-ca");
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let issuer = Issuer::from_params(&ca_params, &ca_key);

        let serving_key = KeyPair::generate()?;
        let mut params = CertificateParams::new(vec![
            "localhost".to_owned(),
            "kubernetes".to_owned(),
            "kubernetes.default".to_owned(),
            "kubernetes.default.svc".to_owned(),
        ])?;
        params
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        params
            .subject_alt_names
            .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        // The first address of --service-cluster-ip-range: the `kubernetes` Service.
        params
            .subject_alt_names
            .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1))));
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        let serving_cert = params.signed_by(&serving_key, &issuer)?;
        let service_account_key = KeyPair::generate()?;

        let write = |name: &str, contents: &str| -> Result<PathBuf, ControlPlaneError> {
            let path = dir.join(name);
            std::fs::write(&path, contents).map_err(|source| ControlPlaneError::Io {
                what: format!("writing {}", path.display()),
                source,
            })?;
            Ok(path)
        };
        Ok(Self {
            ca_pem: ca_cert.pem(),
            ca_file: write("ca.crt", &ca_cert.pem())?,
            serving_cert_file: write("apiserver.crt", &serving_cert.pem())?,
            serving_key_file: write("apiserver.key", &serving_key.serialize_pem())?,
            service_account_key_file: write("sa.key", &service_account_key.serialize_pem())?,
            service_account_public_file: write("sa.pub", &service_account_key.public_key_pem())?,
        })
    }
}
