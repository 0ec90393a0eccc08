//! The per-session CA: the router signs a leaf with it for each terminated host, and the sandbox trusts
//! it. It is made fresh for every session, so a key that leaks (it never reaches the sandbox) is worth
//! little, and it can vouch for nothing but the terminated hosts:
//!
//! - ECDSA P-256 (small, fast to make: a session start does not notice it);
//! - `basicConstraints` CA with `pathLenConstraint` 0: it signs leaves only, never another CA;
//! - `keyUsage` keyCertSign and cRLSign only (a CA certificate is never a server certificate);
//! - critical `nameConstraints`: the permitted DNS subtrees are exactly the terminated hosts, and every
//!   IPv4 and IPv6 address is excluded, so a leaf for any other name or for an address fails
//!   verification in every client that checks constraints;
//! - valid from one hour before now (clock skew between the host and a container is not an error) for
//!   [`VALIDITY`]: a session that runs longer than that must be restarted, and a copy of the
//!   certificate kept somewhere is useless a week later.

use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, CidrSubnet, DistinguishedName, DnType, GeneralSubtree,
    IsCa, KeyPair, KeyUsagePurpose, NameConstraints, SerialNumber, PKCS_ECDSA_P256_SHA256,
};
use time::OffsetDateTime;

/// How long a session CA stays valid after it is made: seven days. Sessions last hours; a week leaves
/// room for one left running over a weekend.
pub const VALIDITY: Duration = Duration::from_secs(7 * 24 * 3600);

/// How far before "now" the CA's validity starts, so that a clock a little behind the host's does not
/// reject it.
pub const BACKDATE: Duration = Duration::from_secs(3600);

/// The CA could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    /// No host to constrain the CA to: a CA for nothing is never made.
    #[error("a session CA needs at least one host to be constrained to")]
    NoHosts,
    /// The random serial number could not be read.
    #[error("cannot read /dev/urandom for the CA's serial number")]
    Random(#[source] std::io::Error),
    /// rcgen refused (key generation or signing).
    #[error("cannot make the session CA")]
    Rcgen(#[source] rcgen::Error),
    /// The validity period does not fit the certificate's date range.
    #[error("the clock is outside the range a certificate can express")]
    Clock,
}

/// A session CA: certificate and private key, PEM.
pub struct SessionCa {
    /// The certificate (PEM): given to the router and to the sandbox.
    pub cert_pem: String,
    /// The PKCS#8 private key (PEM): given to the router only.
    pub key_pem: String,
}

impl std::fmt::Debug for SessionCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key never goes into a log line or an error message by way of `{:?}`.
        f.debug_struct("SessionCa")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// The common name of session `id`'s CA.
#[must_use]
pub fn common_name(session: &str) -> String {
    format!("agent-sandbox session {session}")
}

/// Makes the CA of session `session`, constrained to `hosts`, valid from [`BACKDATE`] before `now` to
/// [`VALIDITY`] after it.
pub fn generate(
    session: &str,
    hosts: &[String],
    now: OffsetDateTime,
) -> Result<SessionCa, CaError> {
    let params = params(session, hosts, now)?;
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(CaError::Rcgen)?;
    let cert = params.self_signed(&key).map_err(CaError::Rcgen)?;
    Ok(SessionCa {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// The CA certificate's contents (everything but the key).
fn params(
    session: &str,
    hosts: &[String],
    now: OffsetDateTime,
) -> Result<CertificateParams, CaError> {
    if hosts.is_empty() {
        return Err(CaError::NoHosts);
    }
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name(session));
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params.name_constraints = Some(NameConstraints {
        permitted_subtrees: hosts
            .iter()
            .map(|h| GeneralSubtree::DnsName(h.clone()))
            .collect(),
        excluded_subtrees: vec![
            GeneralSubtree::IpAddress(CidrSubnet::V4([0; 4], [0; 4])),
            GeneralSubtree::IpAddress(CidrSubnet::V6([0; 16], [0; 16])),
        ],
    });
    params.not_before = now
        .checked_sub(time::Duration::try_from(BACKDATE).map_err(|_| CaError::Clock)?)
        .ok_or(CaError::Clock)?;
    params.not_after = now
        .checked_add(time::Duration::try_from(VALIDITY).map_err(|_| CaError::Clock)?)
        .ok_or(CaError::Clock)?;
    let mut serial = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut serial))
        .map_err(CaError::Random)?;
    // A positive INTEGER of at most 20 octets (RFC 5280 4.1.2.2).
    serial[0] &= 0x7f;
    serial[0] |= 0x01;
    params.serial_number = Some(SerialNumber::from_slice(&serial));
    Ok(params)
}

#[cfg(test)]
mod tests {
    use super::*;
    use x509_parser::extensions::{GeneralName, ParsedExtension};
    use x509_parser::prelude::*;

    fn der(pem_text: &str) -> Vec<u8> {
        let (_, pem) = x509_parser::pem::parse_x509_pem(pem_text.as_bytes()).unwrap();
        assert_eq!(pem.label, "CERTIFICATE");
        pem.contents
    }

    #[test]
    fn the_ca_is_constrained_short_lived_and_signs_leaves_only() {
        let now = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
        let hosts = vec![
            "api.anthropic.com".to_owned(),
            "platform.claude.com".to_owned(),
        ];
        let ca = generate("0123456789ab", &hosts, now).unwrap();
        assert!(ca.key_pem.starts_with("-----BEGIN PRIVATE KEY-----"));
        assert!(!format!("{ca:?}").contains("PRIVATE KEY"));
        let der = der(&ca.cert_pem);
        let (rest, cert) = X509Certificate::from_der(&der).unwrap();
        assert!(rest.is_empty());

        assert_eq!(
            cert.subject()
                .iter_common_name()
                .next()
                .unwrap()
                .as_str()
                .unwrap(),
            "agent-sandbox session 0123456789ab"
        );
        assert_eq!(cert.subject(), cert.issuer());
        // ECDSA P-256, self-signed (the signature verifies with its own key).
        assert_eq!(
            cert.public_key().algorithm.algorithm,
            x509_parser::oid_registry::OID_KEY_TYPE_EC_PUBLIC_KEY
        );
        cert.verify_signature(None).unwrap();

        // Validity: one hour back, seven days on.
        assert_eq!(cert.validity().not_before.timestamp(), 1_800_000_000 - 3600);
        assert_eq!(
            cert.validity().not_after.timestamp(),
            1_800_000_000 + 7 * 24 * 3600
        );

        // A CA that may sign leaves only.
        let bc = cert.basic_constraints().unwrap().unwrap();
        assert!(bc.critical);
        assert!(bc.value.ca);
        assert_eq!(bc.value.path_len_constraint, Some(0));
        let ku = cert.key_usage().unwrap().unwrap();
        assert!(ku.critical);
        assert!(ku.value.key_cert_sign() && ku.value.crl_sign());
        assert!(!ku.value.digital_signature() && !ku.value.key_encipherment());

        // Critical name constraints: exactly the hosts permitted, every address excluded.
        let nc = cert
            .extensions()
            .iter()
            .find(|e| matches!(e.parsed_extension(), ParsedExtension::NameConstraints(_)))
            .expect("a nameConstraints extension");
        assert!(nc.critical, "nameConstraints must be critical");
        let ParsedExtension::NameConstraints(nc) = nc.parsed_extension() else {
            unreachable!()
        };
        let permitted: Vec<String> = nc
            .permitted_subtrees
            .as_ref()
            .unwrap()
            .iter()
            .map(|s| match &s.base {
                GeneralName::DNSName(n) => (*n).to_owned(),
                other => panic!("unexpected permitted subtree {other:?}"),
            })
            .collect();
        assert_eq!(permitted, hosts);
        let excluded: Vec<usize> = nc
            .excluded_subtrees
            .as_ref()
            .unwrap()
            .iter()
            .map(|s| match &s.base {
                GeneralName::IPAddress(b) => {
                    assert!(b.iter().all(|x| *x == 0), "all addresses: {b:?}");
                    b.len()
                }
                other => panic!("unexpected excluded subtree {other:?}"),
            })
            .collect();
        assert_eq!(excluded, [8, 32]);

        // Each session's CA is its own: a new key and serial every time.
        let other = generate("0123456789ab", &hosts, now).unwrap();
        assert_ne!(other.key_pem, ca.key_pem);
        let other_der = self::der(&other.cert_pem);
        let (_, other_cert) = X509Certificate::from_der(&other_der).unwrap();
        assert_ne!(other_cert.raw_serial(), cert.raw_serial());
    }

    #[test]
    fn no_hosts_no_ca() {
        assert!(matches!(
            generate("x", &[], OffsetDateTime::now_utc()),
            Err(CaError::NoHosts)
        ));
    }

    #[test]
    fn leaves_verify_for_the_hosts_only() {
        use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
        let now = OffsetDateTime::now_utc();
        let hosts = vec!["api.anthropic.com".to_owned()];
        let ca_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
        let ca_params = params("s", &hosts, now).unwrap();
        let ca_der = ca_params.self_signed(&ca_key).unwrap().der().to_vec();
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let leaf = |names: Vec<String>| {
            let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
            let mut p = CertificateParams::new(names).unwrap();
            p.not_before = now - ::time::Duration::minutes(5);
            p.not_after = now + ::time::Duration::hours(1);
            p.signed_by(&key, &issuer).unwrap().der().to_vec()
        };
        let ca = CertificateDer::from(ca_der.as_slice());
        let anchors = [webpki::anchor_from_trusted_cert(&ca).unwrap().to_owned()];
        let at = UnixTime::since_unix_epoch(Duration::from_secs(
            u64::try_from(now.unix_timestamp()).unwrap(),
        ));
        let verify = |der: &[u8], name: &str| {
            let der = CertificateDer::from(der);
            let ee = webpki::EndEntityCert::try_from(&der)?;
            ee.verify_for_usage(
                webpki::ALL_VERIFICATION_ALGS,
                &anchors,
                &[],
                at,
                webpki::KeyUsage::server_auth(),
                None,
                None,
            )?;
            ee.verify_is_valid_for_subject_name(&ServerName::try_from(name.to_owned()).unwrap())
        };
        // A leaf for the terminated host verifies; one for any other name (even one the leaf claims)
        // or for an address breaks the name constraints.
        verify(&leaf(vec!["api.anthropic.com".into()]), "api.anthropic.com").unwrap();
        let other = verify(&leaf(vec!["example.com".into()]), "example.com").unwrap_err();
        assert!(
            matches!(other, webpki::Error::NameConstraintViolation),
            "{other:?}"
        );
        let mixed = leaf(vec!["api.anthropic.com".into(), "example.com".into()]);
        assert!(verify(&mixed, "api.anthropic.com").is_err());
        let address = verify(&leaf(vec!["10.0.0.1".into()]), "10.0.0.1").unwrap_err();
        assert!(
            matches!(address, webpki::Error::NameConstraintViolation),
            "{address:?}"
        );
    }
}
