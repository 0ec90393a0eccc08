//! A test CA and a server certificate signed by it, with the matching client configuration.

use std::sync::Arc;

/// A test CA and a server certificate for the given names.
#[derive(Debug)]
pub struct Pki {
    /// The CA's certificate, for clients to trust.
    pub ca_der: rustls::pki_types::CertificateDer<'static>,
    /// A server configuration with the leaf certificate (and the CA) for upstreams.
    pub server: Arc<rustls::ServerConfig>,
}

/// The crypto provider of every test configuration (ring, as the workspace's rustls features say).
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl Pki {
    /// A fresh CA and a leaf certificate for `names`, signed by it.
    pub fn new(names: &[&str]) -> Pki {
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "agent-sandbox test CA");
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).unwrap();
        let leaf_key = rcgen::KeyPair::generate().unwrap();
        let leaf_params = rcgen::CertificateParams::new(
            names.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>(),
        )
        .unwrap();
        let leaf = leaf_params.signed_by(&leaf_key, &ca).unwrap();
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(
            rustls::pki_types::PrivatePkcs8KeyDer::from(leaf_key.serialize_der()),
        );
        let server = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![leaf.der().clone(), ca.der().clone()], key)
            .unwrap();
        Pki {
            ca_der: ca.der().clone(),
            server: Arc::new(server),
        }
    }

    /// A client configuration that trusts only this CA.
    pub fn client_config(&self) -> rustls::ClientConfig {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca_der.clone()).unwrap();
        rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth()
    }
}
