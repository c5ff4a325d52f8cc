//! The fake cluster's certificate authority and serving certificate.
//!
//! Generated per server, like an EKS cluster's own CA: clients must trust exactly this CA
//! (through `certificateAuthority.data` / `CLUSTER_CA_DATA`), so the CA plumbing of the code
//! under test is exercised rather than bypassed with "insecure" TLS.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// Why the certificates or the TLS configuration could not be made.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("generating the fake cluster's certificates failed: {0}")]
    Certificate(#[from] rcgen::Error),
    #[error("building the TLS server configuration failed: {0}")]
    Rustls(#[from] rustls::Error),
}

/// A CA and a serving certificate for `localhost`, `127.0.0.1`, `::1` and `kubernetes`.
pub struct ClusterCertificates {
    pub ca_pem: String,
    pub server_config: Arc<rustls::ServerConfig>,
}

impl ClusterCertificates {
    pub fn generate() -> Result<Self, TlsError> {
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "kubernetes");
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let issuer = Issuer::from_params(&ca_params, &ca_key);

        let server_key = KeyPair::generate()?;
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
        params
            .subject_alt_names
            .push(SanType::IpAddress(IpAddr::V6(Ipv6Addr::LOCALHOST)));
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        let server_cert = params.signed_by(&server_key, &issuer)?;

        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(
                vec![
                    CertificateDer::from(server_cert.der().to_vec()),
                    CertificateDer::from(ca_cert.der().to_vec()),
                ],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(server_key.serialize_der())),
            )?;
        // As kube-apiserver: HTTP/2 for clients that offer it, HTTP/1.1 for the rest.
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Self {
            ca_pem: ca_cert.pem(),
            server_config: Arc::new(config),
        })
    }
}
