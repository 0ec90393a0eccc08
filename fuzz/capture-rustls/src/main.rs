//! Sends one ClientHello to 127.0.0.1:PORT with rustls, for the seed corpus (fuzz/corpus/README.md).
//!
//! Usage: capture-rustls PORT SNI ring|aws-lc-rs. `ring` offers the classic groups only; `aws-lc-rs`
//! is rustls' default provider, whose first key share is the post-quantum hybrid X25519MLKEM768.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::sync::Arc;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, port, sni, provider] = args.as_slice() else {
        return Err("usage: capture-rustls PORT SNI ring|aws-lc-rs".into());
    };
    let provider = match provider.as_str() {
        "ring" => rustls::crypto::ring::default_provider(),
        "aws-lc-rs" => rustls::crypto::aws_lc_rs::default_provider(),
        other => return Err(format!("unknown provider {other}").into()),
    };
    // No roots: the handshake never gets as far as a certificate.
    let roots = rustls::RootCertStore::empty();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from(sni.clone())?;
    let mut conn = rustls::ClientConnection::new(Arc::new(config), name)?;
    let mut sock = TcpStream::connect(("127.0.0.1", port.parse::<u16>()?))?;
    let mut hello = Vec::new();
    conn.write_tls(&mut hello)?;
    sock.write_all(&hello)?;
    // Wait for the listener to close: the handshake is never meant to finish.
    let mut sink = [0u8; 64];
    let _ = sock.read(&mut sink);
    Ok(())
}
