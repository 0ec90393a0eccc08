//! Credential injection (issue 20): the sandbox holds placeholders, the router puts the real secret on
//! the wire. Only where a credential is added is TLS terminated; every other SNI is spliced as before.
//!
//! How it fits: at start, [`Injector::load`] reads what `ValidConfig.inject` names (the session CA, the
//! upstream roots, the API key file, the OAuth store) and fails the start on any problem. The TLS driver
//! ([`crate::proxy`]'s `tls_conn`) decides on the SNI as always; a decided name in
//! [`Injector::terminates`] goes to [`terminate`] instead of the splice. The files, in the order a
//! connection meets them:
//!
//! - this file: loading, the leaf signed for the terminated hosts, both TLS configurations;
//! - [`terminate`]: the terminated connection: the client handshake (the ClientHello already read is
//!   replayed into rustls), the HTTP/1.1 request loop, the upstream's verified TLS, the response relay;
//! - [`rewrite`]: the pure head rewrite (the credential header, nothing else that matters);
//! - [`scan`]: the response scan that cuts a connection on which a real secret comes back;
//! - [`oauth_hook`]: every call into the OAuth store.

pub(crate) mod oauth;
pub(crate) mod oauth_hook;
pub(crate) mod rewrite;
mod scan;
pub(crate) mod terminate;

use std::collections::BTreeSet;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use agent_sandbox_shared::inject::ValidInject;
use agent_sandbox_shared::HostName;
use rustls::client::danger::ServerCertVerifier as _;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};

use self::oauth_hook::{OAuthHook, Secret};

/// The largest PEM file (certificate, key, roots) read.
const MAX_PEM: u64 = 1024 * 1024;

/// The largest API key file read: a key is about a hundred bytes.
const MAX_KEY_FILE: u64 = 4096;

/// The ALPN protocol on both legs: HTTP/1.1 only (the request loop speaks nothing else).
const HTTP11: &[u8] = b"http/1.1";

/// Why the `[inject]` section cannot be served; the router does not start.
#[derive(Debug, thiserror::Error)]
pub(crate) enum InjectError {
    /// A file could not be read.
    #[error("inject: cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file's content is not what it must be.
    #[error("inject: {}: {why}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// The leaf could not be made, or does not verify against the CA.
    #[error("inject: cannot sign the certificate for the terminated hosts with the CA {}: {why}", path.display())]
    Leaf {
        /// The CA certificate.
        path: PathBuf,
        /// What failed.
        why: String,
    },
    /// A TLS configuration could not be built.
    #[error("inject: {0}")]
    Tls(String),
    /// The OAuth store could not be opened.
    #[error("inject: {0}")]
    OAuth(String),
}

/// Everything a terminated connection needs, loaded once at start and shared by every worker.
pub(crate) struct Injector {
    /// The hosts whose TLS is terminated.
    terminated: BTreeSet<HostName>,
    /// Hosts whose requests get the API key.
    api_key_hosts: BTreeSet<HostName>,
    /// Hosts where a bearer access-token placeholder becomes the real token.
    oauth_api_hosts: BTreeSet<HostName>,
    /// The OAuth token endpoint's host.
    token_host: Option<HostName>,
    /// The API key placeholder and the real key.
    api_key: Option<(Vec<u8>, Secret)>,
    /// The OAuth store, when `oauth` is configured.
    oauth: Option<Arc<dyn OAuthHook>>,
    /// The client-facing TLS: the leaf for the terminated hosts, ALPN http/1.1.
    server: Arc<rustls::ServerConfig>,
    /// The upstream-facing TLS: verified against the web PKI roots (or `upstream_roots`).
    client: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for Injector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Injector")
            .field("terminated", &self.terminated)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("oauth", &self.oauth.is_some())
            .finish_non_exhaustive()
    }
}

impl Injector {
    /// Reads and checks everything `inject` names: the CA (certificate and PKCS#8 key), a leaf for the
    /// terminated hosts signed by it (and verified against it), the upstream roots, the API key file,
    /// the OAuth store. Any failure names the file.
    pub(crate) fn load(inject: &ValidInject) -> Result<Injector, InjectError> {
        Injector::load_with(inject, None)
    }

    /// [`Injector::load`], with `store` standing in for the OAuth store when given (tests).
    pub(crate) fn load_with(
        inject: &ValidInject,
        store: Option<Arc<dyn OAuthHook>>,
    ) -> Result<Injector, InjectError> {
        let config = &inject.config;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let (chain, key) = sign_leaf(&config.ca_cert, &config.ca_key, &inject.terminated)?;
        let mut server = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(|e| InjectError::Tls(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|e| InjectError::Tls(format!("the leaf certificate: {e}")))?;
        server.alpn_protocols = vec![HTTP11.to_vec()];
        let roots = match &config.upstream_roots {
            Some(path) => read_roots(path)?,
            None => {
                let mut roots = rustls::RootCertStore::empty();
                roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
                roots
            }
        };
        let mut client = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(|e| InjectError::Tls(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        client.alpn_protocols = vec![HTTP11.to_vec()];
        let api_key = match &config.api_key {
            Some(k) => Some((k.placeholder.as_bytes().to_vec(), read_key(&k.key_file)?)),
            None => None,
        };
        if let Some((placeholder, key)) = &api_key {
            if placeholder == key.expose() {
                return Err(InjectError::Invalid {
                    path: config
                        .api_key
                        .as_ref()
                        .map(|k| k.key_file.clone())
                        .unwrap_or_default(),
                    why: "the key equals the placeholder".into(),
                });
            }
        }
        let oauth = match (&config.oauth, store) {
            (Some(_), Some(store)) => Some(store),
            (Some(o), None) => {
                Some(oauth_hook::open(o).map_err(|e| InjectError::OAuth(e.to_string()))?)
            }
            (None, _) => None,
        };
        Ok(Injector {
            terminated: inject.terminated.clone(),
            api_key_hosts: inject.api_key_hosts.clone(),
            oauth_api_hosts: inject.oauth_api_hosts.clone(),
            token_host: inject.token_host.clone(),
            api_key,
            oauth,
            server: Arc::new(server),
            client: Arc::new(client),
        })
    }

    /// Whether connections for `name` are terminated (every other name is spliced).
    pub(crate) fn terminates(&self, name: &HostName) -> bool {
        self.terminated.contains(name)
    }

    /// Every real secret known now (the API key, the OAuth tokens), for the response scan.
    fn secrets(&self) -> Vec<Secret> {
        let mut out: Vec<Secret> = self.api_key.iter().map(|(_, k)| k.clone()).collect();
        if let Some(o) = &self.oauth {
            out.extend(oauth_hook::secrets(o.as_ref()));
        }
        out
    }
}

/// Reads at most `cap` bytes of `path` (more is an error).
fn read_capped(path: &Path, cap: u64) -> Result<Vec<u8>, InjectError> {
    let read = |source| InjectError::Read {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read)?;
    let mut out = Vec::new();
    file.take(cap + 1).read_to_end(&mut out).map_err(read)?;
    if out.len() as u64 > cap {
        return Err(InjectError::Invalid {
            path: path.to_owned(),
            why: format!("larger than {cap} bytes"),
        });
    }
    Ok(out)
}

/// The API key: the file's first line, trimmed, non-empty, visible ASCII only (it goes into a header
/// as is: a CR or LF in it would split the header).
fn read_key(path: &Path) -> Result<Secret, InjectError> {
    let raw = read_capped(path, MAX_KEY_FILE)?;
    let first = raw.split(|b| *b == b'\n').next().unwrap_or_default();
    let key = first.trim_ascii();
    let invalid = |why: &str| InjectError::Invalid {
        path: path.to_owned(),
        why: why.to_owned(),
    };
    if key.is_empty() {
        return Err(invalid("the first line (the API key) is empty"));
    }
    if !key.iter().all(|b| (0x21..=0x7e).contains(b)) {
        return Err(invalid("the API key holds a byte other than visible ASCII"));
    }
    Ok(Secret::new(key.to_vec()))
}

/// Every certificate in a PEM file of roots (at least one).
fn read_roots(path: &Path) -> Result<rustls::RootCertStore, InjectError> {
    let pem = read_capped(path, MAX_PEM)?;
    let invalid = |why: String| InjectError::Invalid {
        path: path.to_owned(),
        why,
    };
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| invalid(format!("not a PEM certificate file ({e})")))?;
        roots
            .add(cert)
            .map_err(|e| invalid(format!("a certificate is not a usable root ({e})")))?;
    }
    if roots.is_empty() {
        return Err(invalid("holds no certificate".into()));
    }
    Ok(roots)
}

/// Signs one leaf for `hosts` with the CA (ECDSA P-256; the CA's validity; server auth only) and checks
/// it verifies against the CA for every host now: a key that does not match the certificate, a CA
/// that has expired or whose name constraints exclude a host fails here, at start, not in every
/// client's handshake. Returns the chain (leaf, CA) and the leaf's key.
fn sign_leaf(
    ca_cert: &Path,
    ca_key: &Path,
    hosts: &BTreeSet<HostName>,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), InjectError> {
    let cert_pem = read_capped(ca_cert, MAX_PEM)?;
    let ca_der = CertificateDer::from_pem_slice(&cert_pem).map_err(|e| InjectError::Invalid {
        path: ca_cert.to_owned(),
        why: format!("not a PEM certificate ({e})"),
    })?;
    let key_pem = read_capped(ca_key, MAX_PEM)?;
    let key_invalid = |why: String| InjectError::Invalid {
        path: ca_key.to_owned(),
        why,
    };
    let key_der = PrivatePkcs8KeyDer::from_pem_slice(&key_pem)
        .map_err(|e| key_invalid(format!("not a PKCS#8 PEM private key ({e})")))?;
    let ca_signing = rcgen::KeyPair::try_from(&key_der)
        .map_err(|e| key_invalid(format!("unusable private key ({e})")))?;
    let leaf_error = |why: String| InjectError::Leaf {
        path: ca_cert.to_owned(),
        why,
    };
    let (_, parsed) =
        x509_parser::parse_x509_certificate(&ca_der).map_err(|e| InjectError::Invalid {
            path: ca_cert.to_owned(),
            why: format!("not an X.509 certificate ({e})"),
        })?;
    let validity = parsed.validity();
    let issuer = rcgen::Issuer::from_ca_cert_der(&ca_der, ca_signing)
        .map_err(|e| leaf_error(e.to_string()))?;
    let names: Vec<String> = hosts.iter().map(|h| h.as_str().to_owned()).collect();
    let mut params =
        rcgen::CertificateParams::new(names.clone()).map_err(|e| leaf_error(e.to_string()))?;
    params.not_before = validity.not_before.to_datetime();
    params.not_after = validity.not_after.to_datetime();
    if let Some(first) = names.first() {
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, first.as_str());
    }
    params.is_ca = rcgen::IsCa::ExplicitNoCa;
    params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let leaf_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .map_err(|e| leaf_error(e.to_string()))?;
    let leaf = params
        .signed_by(&leaf_key, &issuer)
        .map_err(|e| leaf_error(e.to_string()))?;
    let leaf_der = leaf.der().clone();
    // The check a client makes, for every host.
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(ca_der.clone())
        .map_err(|e| leaf_error(format!("the CA is not a usable root ({e})")))?;
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::new(rustls::crypto::ring::default_provider()),
    )
    .build()
    .map_err(|e| leaf_error(e.to_string()))?;
    for name in &names {
        let server_name =
            ServerName::try_from(name.clone()).map_err(|e| leaf_error(e.to_string()))?;
        verifier
            .verify_server_cert(&leaf_der, &[], &server_name, &[], UnixTime::now())
            .map_err(|e| leaf_error(format!("the leaf does not verify for {name}: {e}")))?;
    }
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
    Ok((vec![leaf_der, ca_der.into_owned()], key))
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_sandbox_shared::inject::{ApiKeyInject, InjectConfig, OAuthInject};

    /// A directory of files for one test, removed on drop.
    struct Files(PathBuf);

    impl Files {
        fn new(tag: &str) -> Files {
            let dir = std::env::temp_dir().join(format!("asr-inject-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            Files(dir)
        }

        fn write(&self, name: &str, content: &[u8]) -> PathBuf {
            let p = self.0.join(name);
            std::fs::write(&p, content).unwrap();
            p
        }
    }

    impl Drop for Files {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A CA (PEM certificate, PEM PKCS#8 key), name-constrained to `permitted`.
    fn ca(permitted: &[&str]) -> (String, String) {
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
        p.distinguished_name
            .push(rcgen::DnType::CommonName, "test session CA");
        p.name_constraints = Some(rcgen::NameConstraints {
            permitted_subtrees: permitted
                .iter()
                .map(|n| rcgen::GeneralSubtree::DnsName((*n).to_owned()))
                .collect(),
            excluded_subtrees: Vec::new(),
        });
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = p.self_signed(&key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    /// `[inject]` for api.example.test with the files in `files`, validated.
    fn valid(files: &Files, ca: &(String, String), key: &[u8], oauth: bool) -> ValidInject {
        let config = InjectConfig {
            ca_cert: files.write("ca.pem", ca.0.as_bytes()),
            ca_key: files.write("ca.key", ca.1.as_bytes()),
            upstream_roots: None,
            api_key: Some(ApiKeyInject {
                hosts: vec!["api.example.test".into()],
                placeholder: "sk-ant-api03-placeholder-0000000000".into(),
                key_file: files.write("api-key", key),
            }),
            oauth: oauth.then(|| OAuthInject {
                api_hosts: vec!["api.example.test".into()],
                token_host: "api.example.test".into(),
                token_path: "/v1/oauth/token".into(),
                store_dir: files.0.join("oauth"),
            }),
        };
        let mut problems = Vec::new();
        config.validate(&mut problems).unwrap()
    }

    fn load_error(v: &ValidInject) -> String {
        Injector::load(v).unwrap_err().to_string()
    }

    #[test]
    fn loads_and_terminates_only_the_inject_hosts() {
        let files = Files::new("ok");
        let v = valid(
            &files,
            &ca(&["api.example.test"]),
            b" sk-real \nmore\n",
            false,
        );
        let inj = Injector::load(&v).unwrap();
        assert!(inj.terminates(&HostName::parse("api.example.test").unwrap()));
        assert!(!inj.terminates(&HostName::parse("other.example.test").unwrap()));
        let secrets = inj.secrets();
        assert_eq!(secrets.len(), 1);
        assert_eq!(secrets[0].expose(), b"sk-real");
        assert!(!format!("{inj:?}").contains("sk-real"));
    }

    #[test]
    fn bad_files_stop_the_start_with_the_file_named() {
        let files = Files::new("bad");
        let good = ca(&["api.example.test"]);
        let v = valid(&files, &good, b"\n", false);
        let e = load_error(&v);
        assert!(e.contains("api-key") && e.contains("empty"), "{e}");
        let v = valid(&files, &good, b"sk-a\rb\n", false);
        let e = load_error(&v);
        assert!(e.contains("visible ASCII"), "{e}");
        let v = valid(&files, &good, &vec![b'k'; 5000], false);
        assert!(load_error(&v).contains("larger than"));
        let v = valid(&files, &(good.0.clone(), "not a key".into()), b"k\n", false);
        let e = load_error(&v);
        assert!(e.contains("ca.key") && e.contains("PKCS#8"), "{e}");
        let v = valid(&files, &("garbage".into(), good.1.clone()), b"k\n", false);
        assert!(load_error(&v).contains("ca.pem"));
        // A key that is not the certificate's: the leaf does not verify.
        let other = ca(&["api.example.test"]);
        let v = valid(&files, &(good.0.clone(), other.1), b"k\n", false);
        let e = load_error(&v);
        assert!(e.contains("does not verify"), "{e}");
        // A CA whose name constraint leaves the host out.
        let v = valid(&files, &ca(&["elsewhere.test"]), b"k\n", false);
        let e = load_error(&v);
        assert!(e.contains("does not verify for api.example.test"), "{e}");
        let mut v = valid(&files, &good, b"k\n", false);
        v.config.ca_key = files.0.join("missing");
        let e = load_error(&v);
        assert!(e.contains("missing"), "{e}");
        // A missing OAuth store stops the start, naming it.
        let v = valid(&files, &good, b"k\n", true);
        let e = load_error(&v);
        assert!(e.contains("oauth/oauth.json"), "{e}");
    }

    /// A store stand-in: one access placeholder and its token.
    #[derive(Debug)]
    struct TestStore;

    impl OAuthHook for TestStore {
        fn access_token_for(&self, bearer: &[u8]) -> Option<Secret> {
            (bearer == b"sk-ant-oat01-placeholder-000000000000")
                .then(|| Secret::new(b"sk-ant-oat01-REAL".to_vec()))
        }
        fn is_token_request(&self, method: &str, path: &str) -> bool {
            method == "POST" && path == "/v1/oauth/token"
        }
        fn begin_token_request<'a>(
            &'a self,
            _: Option<&'a str>,
            body: &'a [u8],
        ) -> std::pin::Pin<Box<dyn std::future::Future<Output = oauth_hook::Begun> + Send + 'a>>
        {
            Box::pin(async move { Err(format!("{} bytes", body.len()).into()) })
        }
        fn secrets(&self) -> Vec<Secret> {
            vec![Secret::new(b"sk-ant-oat01-REAL".to_vec())]
        }
    }

    #[test]
    fn bearer_swap_through_the_store_hook() {
        let store: Arc<dyn OAuthHook> = Arc::new(TestStore);
        let head = b"GET /v1/messages HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer sk-ant-oat01-placeholder-000000000000\r\n\r\n";
        let swap = rewrite::Swap {
            api_key: None,
            oauth: true,
            content_length: None,
        };
        let mut bearer = |t: &[u8]| oauth_hook::access_token(store.as_ref(), t);
        let r = rewrite::rewrite_head(head, swap, &mut bearer).unwrap();
        assert_eq!(
            std::str::from_utf8(&r.head).unwrap(),
            "GET /v1/messages HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer sk-ant-oat01-REAL\r\nAccept-Encoding: identity\r\n\r\n"
        );
        assert_eq!(r.credential, agent_sandbox_shared::logs::Credential::OAuth);
        assert!(oauth_hook::is_token_request(
            store.as_ref(),
            "POST",
            "/v1/oauth/token"
        ));
        assert_eq!(oauth_hook::secrets(store.as_ref()).len(), 1);
    }
}
