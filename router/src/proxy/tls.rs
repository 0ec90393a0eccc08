//! ClientHello reassembly and SNI extraction: pure functions over bytes, no I/O.
//!
//! How it fits: the HTTPS listener feeds every read from a new client into a [`HelloReader`] until it
//! reports the SNI (or a refusal); the bytes it buffered are then written to the upstream unchanged. A
//! ClientHello may arrive over many TCP reads (a post-quantum key share alone is larger than a segment;
//! some clients send a byte at a time) and over several TLS records (legal fragmentation), so the reader
//! concatenates the payloads of handshake records until the whole handshake message is in hand.
//!
//! The record header and the ClientHello's fixed fields are parsed with `tls-parser`; the extensions are
//! walked here, because the crate's extension helpers stop silently at the first extension they cannot
//! parse and would let a malformed extension hide a second `server_name`. Anything that does not parse is
//! refused, never forwarded.

use tls_parser::TlsRecordType;

/// `encrypted_client_hello` (RFC 9849 / draft-ietf-tls-esni).
const EXT_ENCRYPTED_CLIENT_HELLO: u16 = 0xfe0d;
/// The older `encrypted_server_name` (ESNI drafts).
const EXT_ENCRYPTED_SERVER_NAME: u16 = 0xffce;

/// The largest ClientHello handshake message accepted (header included). Hellos of ~20 KB exist
/// (large post-quantum key shares); 64 KiB is the most a handshake message of this size field carries in
/// practice and what TLS libraries accept.
pub const MAX_HELLO_LEN: usize = 64 * 1024;

/// The most raw bytes buffered while reassembling: the hello plus record headers. Generous enough for a
/// hello fragmented into many small records, small enough that a stalled client costs little.
pub const MAX_BUFFERED: usize = 128 * 1024;

/// The largest TLSPlaintext fragment (RFC 8446 §5.1).
const MAX_PLAINTEXT_FRAGMENT: u16 = 1 << 14;

/// TLS extension type of `server_name` (RFC 6066).
const EXT_SERVER_NAME: u16 = 0;

/// `NameType` of a host name in a `ServerNameList`.
const NAME_TYPE_HOST_NAME: u8 = 0;

/// Handshake message type of ClientHello.
const HANDSHAKE_CLIENT_HELLO: u8 = 1;

/// Why a ClientHello was refused before any policy decision.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HelloError {
    /// The bytes are not a TLS handshake record (plain HTTP, SSLv2, an alert, garbage, ...).
    #[error("not a TLS handshake")]
    NotTls,
    /// A handshake message other than ClientHello came first.
    #[error("not a ClientHello")]
    NotClientHello,
    /// The hello (or the records carrying it) exceeds the caps.
    #[error("ClientHello larger than {} bytes", MAX_HELLO_LEN)]
    TooLarge,
    /// A length or field that does not add up.
    #[error("malformed ClientHello: {0}")]
    Malformed(&'static str),
    /// No `server_name` extension, or one without a host_name.
    #[error("no SNI")]
    NoSni,
    /// A host_name of length zero, or an empty server name list.
    #[error("empty SNI")]
    EmptySni,
    /// More than one host_name entry in the server name list.
    #[error("several host_name entries")]
    SeveralHostNames,
    /// More than one `server_name` extension.
    #[error("several server_name extensions")]
    SeveralSniExtensions,
    /// Encrypted Client Hello (or its ESNI draft): the SNI in clear would be a public name and the
    /// real destination hidden inside, so the router cannot decide on the name the client means.
    /// Chromium-based clients send a dummy ("GREASE") ECH extension on every connection, which looks
    /// the same by design; the text says how to turn it off, since that is the usual cause.
    #[error("encrypted ClientHello (ECH/ESNI) hides the real server name (Chromium-based clients send a dummy one on every connection: start them with --disable-features=EncryptedClientHello)")]
    EncryptedHello,
}

impl HelloError {
    /// The fatal alert that tells the client what happened: `unrecognized_name` for problems with the
    /// name it sent, `access_denied` for everything else.
    #[must_use]
    pub fn alert(&self) -> AlertDescription {
        match self {
            HelloError::NoSni
            | HelloError::EmptySni
            | HelloError::SeveralHostNames
            | HelloError::SeveralSniExtensions => AlertDescription::UnrecognizedName,
            HelloError::NotTls
            | HelloError::NotClientHello
            | HelloError::TooLarge
            | HelloError::Malformed(_)
            | HelloError::EncryptedHello => AlertDescription::AccessDenied,
        }
    }
}

/// The alert descriptions the router sends (RFC 8446 §6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum AlertDescription {
    /// `access_denied(49)`: a valid name the router will not connect to.
    AccessDenied = 49,
    /// `internal_error(80)`: the upstream could not be reached.
    InternalError = 80,
    /// `unrecognized_name(112)`: the SNI is missing or unusable.
    UnrecognizedName = 112,
}

/// A fatal alert record, ready to write.
#[must_use]
pub fn alert_record(description: AlertDescription) -> [u8; 7] {
    // content type alert(21), legacy version TLS 1.2, length 2, level fatal(2), description.
    [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, description as u8]
}

/// Reassembles a ClientHello from reads of any size.
#[derive(Debug, Default)]
pub struct HelloReader {
    /// Every byte received so far, forwarded unchanged on acceptance.
    raw: Vec<u8>,
    /// Offset in `raw` of the first record not yet consumed.
    next_record: usize,
    /// The concatenated payloads of the handshake records consumed so far.
    handshake: Vec<u8>,
    /// Where the record that completed the hello ends in `raw` (0 until it is complete).
    hello_end: usize,
}

impl HelloReader {
    /// An empty reader.
    #[must_use]
    pub fn new() -> HelloReader {
        HelloReader::default()
    }

    /// The bytes received so far.
    #[must_use]
    pub fn buffered(&self) -> &[u8] {
        &self.raw
    }

    /// The memory its buffers hold (their capacity), for the [`PeekBudget`](crate::fairness::PeekBudget).
    #[must_use]
    pub fn held(&self) -> usize {
        self.raw.capacity() + self.handshake.capacity()
    }

    /// Takes the buffered bytes.
    #[must_use]
    pub fn into_buffered(self) -> Vec<u8> {
        self.raw
    }

    /// Takes the buffered bytes split where the hello's last record ends: the hello's records, and
    /// what the client sent after them in the same reads (a ChangeCipherSpec, early data, or bytes
    /// meant to be read as another hello). Before the hello is complete, the first part is empty.
    ///
    /// Only the first part may go to the upstream before its answer is known: what follows is checked
    /// from this very offset ([`super::retry::SecondHello`]), so the router and the upstream agree on
    /// where every later record starts.
    #[must_use]
    pub fn into_parts(mut self) -> (Vec<u8>, Vec<u8>) {
        let after = self.raw.split_off(self.hello_end);
        (self.raw, after)
    }

    /// Adds bytes from the client. `Ok(None)`: more are needed; `Ok(Some(sni))`: the complete hello
    /// named `sni` (raw bytes, not yet validated as a host name); `Err`: refuse.
    pub fn push(&mut self, data: &[u8]) -> Result<Option<Vec<u8>>, HelloError> {
        if self.raw.len() + data.len() > MAX_BUFFERED {
            return Err(HelloError::TooLarge);
        }
        self.raw.extend_from_slice(data);
        loop {
            let rest = &self.raw[self.next_record..];
            // Judge a partial header as early as possible, so a plain-HTTP client is refused at once.
            if rest.len() < 5 {
                if let Some(&t) = rest.first() {
                    if TlsRecordType(t) != TlsRecordType::Handshake {
                        return Err(HelloError::NotTls);
                    }
                }
                if rest.len() >= 2 && rest[1] != 3 {
                    return Err(HelloError::NotTls);
                }
                return Ok(None);
            }
            let hdr = match tls_parser::parse_tls_record_header(rest) {
                Ok((_, hdr)) => hdr,
                Err(_) => return Err(HelloError::Malformed("record header")),
            };
            if hdr.record_type != TlsRecordType::Handshake || hdr.version.0 >> 8 != 3 {
                return Err(HelloError::NotTls);
            }
            if hdr.len == 0 {
                // RFC 8446 §5.1: zero-length handshake fragments are not allowed.
                return Err(HelloError::Malformed("empty handshake record"));
            }
            if hdr.len > MAX_PLAINTEXT_FRAGMENT {
                return Err(HelloError::Malformed("record longer than 16384 bytes"));
            }
            let len = usize::from(hdr.len);
            if rest.len() < 5 + len {
                return Ok(None);
            }
            self.next_record += 5 + len;
            let payload = &self.raw[self.next_record - len..self.next_record];
            // The usual case, a whole hello in its first record, is parsed in place without a copy.
            let done = if self.handshake.is_empty() {
                match try_hello(payload)? {
                    Some(sni) => Some(sni),
                    None => {
                        self.handshake.extend_from_slice(payload);
                        None
                    }
                }
            } else {
                self.handshake.extend_from_slice(payload);
                try_hello(&self.handshake)?
            };
            if let Some(sni) = done {
                self.hello_end = self.next_record;
                return Ok(Some(sni));
            }
        }
    }
}

/// Looks at reassembled handshake bytes: the hello's SNI once it is complete, `None` before.
fn try_hello(hs: &[u8]) -> Result<Option<Vec<u8>>, HelloError> {
    if hs.first().is_some_and(|&t| t != HANDSHAKE_CLIENT_HELLO) {
        return Err(HelloError::NotClientHello);
    }
    if hs.len() < 4 {
        return Ok(None);
    }
    let body_len = usize::from(hs[1]) << 16 | usize::from(hs[2]) << 8 | usize::from(hs[3]);
    if 4 + body_len > MAX_HELLO_LEN {
        return Err(HelloError::TooLarge);
    }
    if hs.len() < 4 + body_len {
        return Ok(None);
    }
    // A client has nothing else to send at the handshake layer before the server answers. Bytes after
    // the hello in its last record would be read by the upstream as another handshake message (a
    // second hello the router never decided on), so the hello must end where its record does.
    if hs.len() > 4 + body_len {
        return Err(HelloError::Malformed(
            "handshake bytes after the ClientHello",
        ));
    }
    sni_from_client_hello(&hs[4..4 + body_len]).map(Some)
}

/// Extracts the one host_name from a ClientHello body (the handshake message without its 4-byte header).
pub fn sni_from_client_hello(body: &[u8]) -> Result<Vec<u8>, HelloError> {
    let (rest, hello) = tls_parser::parse_tls_handshake_client_hello(body)
        .map_err(|_| HelloError::Malformed("fixed fields"))?;
    if hello.version.0 >> 8 != 3 {
        return Err(HelloError::Malformed("legacy_version"));
    }
    // tls-parser treats an extensions block whose length does not add up as absent, leaving the bytes
    // unconsumed: anything left over is malformed, not "no extensions".
    if !rest.is_empty() {
        return Err(HelloError::Malformed("bytes after the extensions"));
    }
    let mut exts = hello.ext.ok_or(HelloError::NoSni)?;
    let mut sni = None;
    while !exts.is_empty() {
        let [t0, t1, l0, l1, ..] = *exts else {
            return Err(HelloError::Malformed("truncated extension header"));
        };
        let len = usize::from(u16::from_be_bytes([l0, l1]));
        let data = exts
            .get(4..4 + len)
            .ok_or(HelloError::Malformed("truncated extension"))?;
        let ext = u16::from_be_bytes([t0, t1]);
        // Refused even when it might be GREASE: a fake ECH extension and a real one look alike on the
        // wire, and forwarding a real one would let an allowlisted front carry any inner name.
        if ext == EXT_ENCRYPTED_CLIENT_HELLO || ext == EXT_ENCRYPTED_SERVER_NAME {
            return Err(HelloError::EncryptedHello);
        }
        if ext == EXT_SERVER_NAME {
            if sni.is_some() {
                return Err(HelloError::SeveralSniExtensions);
            }
            sni = Some(host_name_from_server_name_list(data)?);
        }
        exts = &exts[4 + len..];
    }
    sni.ok_or(HelloError::NoSni)
}

/// Parses a `ServerNameList` strictly: every byte accounted for, exactly one host_name.
fn host_name_from_server_name_list(data: &[u8]) -> Result<Vec<u8>, HelloError> {
    let [a, b, ref list @ ..] = *data else {
        return Err(HelloError::EmptySni);
    };
    if usize::from(u16::from_be_bytes([a, b])) != list.len() {
        return Err(HelloError::Malformed("server_name list length"));
    }
    if list.is_empty() {
        return Err(HelloError::EmptySni);
    }
    let mut rest = list;
    let mut found: Option<&[u8]> = None;
    while !rest.is_empty() {
        let [kind, l0, l1, ..] = *rest else {
            return Err(HelloError::Malformed("truncated server_name entry"));
        };
        let len = usize::from(u16::from_be_bytes([l0, l1]));
        let name = rest
            .get(3..3 + len)
            .ok_or(HelloError::Malformed("truncated server_name entry"))?;
        if kind != NAME_TYPE_HOST_NAME {
            // No other name type was ever defined; a server might read one as a name.
            return Err(HelloError::Malformed("unknown server_name type"));
        }
        if found.is_some() {
            return Err(HelloError::SeveralHostNames);
        }
        found = Some(name);
        rest = &rest[3 + len..];
    }
    match found {
        Some([]) => Err(HelloError::EmptySni),
        Some(name) => Ok(name.to_vec()),
        None => Err(HelloError::NoSni),
    }
}

/// Test helpers that build ClientHellos by hand, for the unit tests, the integration tests and the
/// benchmark; not part of the production build (cargo feature `test-support`, which the router's own
/// dev-dependency on itself turns on).
#[cfg(any(test, feature = "test-support"))]
pub mod build {
    /// A server_name extension holding `names` as host_name entries.
    #[must_use]
    pub fn sni_extension(names: &[&[u8]]) -> Vec<u8> {
        let mut list = Vec::new();
        for n in names {
            list.push(0);
            list.extend_from_slice(&(n.len() as u16).to_be_bytes());
            list.extend_from_slice(n);
        }
        let mut data = (list.len() as u16).to_be_bytes().to_vec();
        data.extend_from_slice(&list);
        extension(0, &data)
    }

    /// One extension: type, length, data.
    #[must_use]
    pub fn extension(kind: u16, data: &[u8]) -> Vec<u8> {
        let mut out = kind.to_be_bytes().to_vec();
        out.extend_from_slice(&(data.len() as u16).to_be_bytes());
        out.extend_from_slice(data);
        out
    }

    /// A ClientHello handshake message (with its 4-byte header) carrying `extensions` (already encoded),
    /// or no extensions block at all when `None`.
    #[must_use]
    pub fn client_hello(extensions: Option<&[u8]>) -> Vec<u8> {
        let mut body = vec![0x03, 0x03];
        body.extend_from_slice(&[0x11; 32]); // random
        body.push(32);
        body.extend_from_slice(&[0x22; 32]); // session id
        body.extend_from_slice(&[0x00, 0x04, 0x13, 0x01, 0x13, 0x02]); // two cipher suites
        body.extend_from_slice(&[0x01, 0x00]); // null compression
        if let Some(ext) = extensions {
            body.extend_from_slice(&(ext.len() as u16).to_be_bytes());
            body.extend_from_slice(ext);
        }
        let mut msg = vec![1];
        msg.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
        msg.extend_from_slice(&body);
        msg
    }

    /// Wraps a handshake message into records of at most `fragment` payload bytes.
    #[must_use]
    pub fn records(handshake: &[u8], fragment: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for chunk in handshake.chunks(fragment.max(1)) {
            out.extend_from_slice(&[0x16, 0x03, 0x01]);
            out.extend_from_slice(&(chunk.len() as u16).to_be_bytes());
            out.extend_from_slice(chunk);
        }
        out
    }

    /// A complete single-record ClientHello naming `names` (none: no server_name extension), with
    /// `padding` bytes of an extra extension to make it large.
    #[must_use]
    pub fn hello_record(names: &[&[u8]], padding: usize) -> Vec<u8> {
        let mut ext = Vec::new();
        // A supported_versions extension first, as real clients do.
        ext.extend_from_slice(&extension(43, &[0x02, 0x03, 0x04]));
        if !names.is_empty() {
            ext.extend_from_slice(&sni_extension(names));
        }
        if padding > 0 {
            ext.extend_from_slice(&extension(21, &vec![0; padding]));
        }
        records(&client_hello(Some(&ext)), 16 * 1024)
    }
}

#[cfg(test)]
mod tests {
    use super::build::*;
    use super::*;
    use proptest::prelude::*;

    type Outcome = Result<Option<Vec<u8>>, HelloError>;

    fn run(bytes: &[u8]) -> Outcome {
        HelloReader::new().push(bytes)
    }

    #[test]
    fn table() {
        let ok_name: &[u8] = b"api.example.com";
        let cases: Vec<(&str, Vec<u8>, Outcome)> = vec![
            (
                "plain",
                hello_record(&[ok_name], 0),
                Ok(Some(ok_name.to_vec())),
            ),
            (
                "large",
                hello_record(&[ok_name], 20_000),
                Ok(Some(ok_name.to_vec())),
            ),
            (
                "fragmented",
                records(&client_hello(Some(&sni_extension(&[ok_name]))), 7),
                Ok(Some(ok_name.to_vec())),
            ),
            ("no sni", hello_record(&[], 0), Err(HelloError::NoSni)),
            (
                "no extensions",
                records(&client_hello(None), 1000),
                Err(HelloError::NoSni),
            ),
            (
                "empty sni",
                hello_record(&[b""], 0),
                Err(HelloError::EmptySni),
            ),
            (
                "two host names",
                hello_record(&[ok_name, b"evil.com"], 0),
                Err(HelloError::SeveralHostNames),
            ),
            (
                "two sni extensions",
                records(
                    &client_hello(Some(
                        &[sni_extension(&[ok_name]), sni_extension(&[b"evil.com"])].concat(),
                    )),
                    1000,
                ),
                Err(HelloError::SeveralSniExtensions),
            ),
            (
                "sni hidden after a malformed extension",
                records(
                    &client_hello(Some(
                        &[
                            sni_extension(&[ok_name]),
                            vec![0xff, 0x01, 0x00, 0x10, 0x00],
                            sni_extension(&[b"evil.com"]),
                        ]
                        .concat(),
                    )),
                    1000,
                ),
                Err(HelloError::Malformed("truncated extension header")),
            ),
            (
                "empty server name list",
                records(&client_hello(Some(&extension(0, &[0, 0]))), 1000),
                Err(HelloError::EmptySni),
            ),
            (
                "empty server_name extension",
                records(&client_hello(Some(&extension(0, &[]))), 1000),
                Err(HelloError::EmptySni),
            ),
            (
                "list length mismatch",
                records(
                    &client_hello(Some(&extension(0, &[0, 9, 0, 0, 1, b'a']))),
                    1000,
                ),
                Err(HelloError::Malformed("server_name list length")),
            ),
            (
                "unknown name type",
                records(
                    &client_hello(Some(&extension(0, &[0, 4, 7, 0, 1, b'a']))),
                    1000,
                ),
                Err(HelloError::Malformed("unknown server_name type")),
            ),
            (
                "http",
                b"GET / HTTP/1.1\r\nHost: a\r\n\r\n".to_vec(),
                Err(HelloError::NotTls),
            ),
            (
                "sslv2",
                vec![0x80, 0x2e, 0x01, 0x03, 0x01],
                Err(HelloError::NotTls),
            ),
            (
                "alert record",
                vec![0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x28],
                Err(HelloError::NotTls),
            ),
            (
                "wrong major version",
                vec![0x16, 0x04, 0x01, 0x00, 0x02],
                Err(HelloError::NotTls),
            ),
            (
                "zero-length record",
                vec![0x16, 0x03, 0x01, 0x00, 0x00],
                Err(HelloError::Malformed("empty handshake record")),
            ),
            (
                "oversized record",
                vec![0x16, 0x03, 0x01, 0x40, 0x01],
                Err(HelloError::Malformed("record longer than 16384 bytes")),
            ),
            (
                "server hello",
                records(&[2, 0, 0, 1, 0], 100),
                Err(HelloError::NotClientHello),
            ),
            (
                "huge declared length",
                records(&[1, 0x01, 0x00, 0x00, 0x03], 100),
                Err(HelloError::TooLarge),
            ),
            ("partial header", vec![0x16, 0x03], Ok(None)),
            (
                "partial hello",
                hello_record(&[ok_name], 0)[..60].to_vec(),
                Ok(None),
            ),
        ];
        for (what, bytes, want) in cases {
            assert_eq!(run(&bytes), want, "{what}");
        }
    }

    #[test]
    fn encrypted_hellos_are_refused_before_or_after_the_sni() {
        for ext_type in [0xfe0d_u16, 0xffce] {
            let ech = extension(
                ext_type,
                b"\x00\x00\x01\x00\x01\x2a\x00\x20INNER-SNI=evil.example",
            );
            let sni = sni_extension(&[b"allowed.example"]);
            for exts in [[&ech[..], &sni[..]].concat(), [&sni[..], &ech[..]].concat()] {
                let got = run(&records(&client_hello(Some(&exts)), 16 * 1024));
                assert_eq!(got, Err(HelloError::EncryptedHello), "{ext_type:#x}");
                assert_eq!(
                    HelloError::EncryptedHello.alert(),
                    AlertDescription::AccessDenied
                );
            }
        }
    }

    /// A hello shaped like Chromium's with ECH GREASE (BoringSSL's `SSL_set_enable_ech_grease`, on
    /// whenever Chromium's ECH feature is, with or without an ECH configuration): an outer
    /// `encrypted_client_hello` with HKDF-SHA256/AES-128-GCM, a random config id, a 32-byte `enc` and a
    /// random payload, beside the real SNI and the usual extensions. It is refused like a real one:
    /// they cannot be told apart on the wire.
    #[test]
    fn chromium_ech_grease_is_refused_and_the_reason_says_what_to_do() {
        let mut grease = vec![0x00, 0x00, 0x01, 0x00, 0x01, 0x9c, 0x00, 0x20];
        grease.extend((0..32u8).map(|i| i.wrapping_mul(37)));
        grease.extend_from_slice(&[0x00, 0xd0]);
        grease.extend((0..0xd0u8).map(|i| i.wrapping_mul(11) ^ 0x5a));
        let versions = extension(43, &[0x06, 0x1a, 0x1a, 0x03, 0x04, 0x03, 0x03]);
        let groups = extension(10, &[0x00, 0x06, 0x1a, 0x1a, 0x00, 0x1d, 0x00, 0x17]);
        let sni = sni_extension(&[b"allowed.example"]);
        let ech = extension(0xfe0d, &grease);
        let without = [&sni[..], &versions[..], &groups[..]].concat();
        let with = [&sni[..], &versions[..], &groups[..], &ech[..]].concat();
        assert_eq!(
            run(&records(&client_hello(Some(&without)), 16 * 1024)),
            Ok(Some(b"allowed.example".to_vec()))
        );
        assert_eq!(
            run(&records(&client_hello(Some(&with)), 16 * 1024)),
            Err(HelloError::EncryptedHello)
        );
        let reason = HelloError::EncryptedHello.to_string();
        assert!(
            reason.contains("--disable-features=EncryptedClientHello"),
            "{reason}"
        );
    }

    #[test]
    fn trailing_bytes_after_extensions_are_malformed() {
        let mut msg = client_hello(Some(&sni_extension(&[b"a.com"])));
        // Grow the body by one byte without touching the extensions length.
        msg.push(0);
        let len = msg.len() - 4;
        msg[1..4].copy_from_slice(&(len as u32).to_be_bytes()[1..]);
        assert_eq!(
            run(&records(&msg, 1000)),
            Err(HelloError::Malformed("bytes after the extensions"))
        );
    }

    #[test]
    fn interleaved_non_handshake_record_is_refused() {
        let msg = client_hello(Some(&sni_extension(&[b"a.com"])));
        let mut bytes = records(&msg[..20], 100);
        bytes.extend_from_slice(&[0x14, 0x03, 0x03, 0x00, 0x01, 0x01]); // change_cipher_spec
        bytes.extend_from_slice(&records(&msg[20..], 100));
        assert_eq!(run(&bytes), Err(HelloError::NotTls));
    }

    #[test]
    fn byte_at_a_time() {
        let bytes = hello_record(&[b"x.example.com"], 3000);
        let mut r = HelloReader::new();
        for (i, b) in bytes.iter().enumerate() {
            let got = r.push(std::slice::from_ref(b)).unwrap();
            assert_eq!(got.is_some(), i == bytes.len() - 1, "byte {i}");
        }
        assert_eq!(r.buffered(), &bytes[..]);
    }

    #[test]
    fn bytes_after_the_hello_are_kept_apart() {
        let hello = hello_record(&[b"x.example.com"], 0);
        // A ChangeCipherSpec, early data, and the start of another hello's record.
        let after = [
            &[0x14, 0x03, 0x03, 0x00, 0x01, 0x01][..],
            &[0x17, 0x03, 0x03, 0x00, 0x02, 0xaa, 0xbb],
            &hello_record(&[b"evil.example"], 0)[..9],
        ]
        .concat();
        let bytes = [&hello[..], &after].concat();
        let mut r = HelloReader::new();
        assert_eq!(r.push(&bytes).unwrap(), Some(b"x.example.com".to_vec()));
        assert_eq!(r.into_parts(), (hello.clone(), after.clone()));
        // Fragmented, the split is where the hello's last record ends.
        let fragmented = records(&client_hello(Some(&sni_extension(&[b"x.example.com"]))), 7);
        let (most, last) = fragmented.split_at(fragmented.len() - 1);
        let mut r = HelloReader::new();
        for chunk in most.chunks(50) {
            assert_eq!(r.push(chunk).unwrap(), None);
        }
        let last = [last, &after].concat();
        assert_eq!(r.push(&last).unwrap(), Some(b"x.example.com".to_vec()));
        assert_eq!(r.into_parts(), (fragmented, after));
        // Before the hello is complete, nothing is the hello's.
        let mut r = HelloReader::new();
        assert_eq!(r.push(&hello[..20]).unwrap(), None);
        assert_eq!(r.into_parts(), (Vec::new(), hello[..20].to_vec()));
    }

    /// The upstream would read handshake bytes after the hello in its last record as a second message
    /// (another hello, the router never decided on): refused, however the records are cut.
    #[test]
    fn handshake_bytes_after_the_hello_are_refused() {
        let first = client_hello(Some(&sni_extension(&[b"a.example"])));
        let second = client_hello(Some(&sni_extension(&[b"evil.example"])));
        let both = [&first[..], &second].concat();
        for fragment in [16 * 1024, first.len() + 1, first.len() + 4, 100, 7] {
            assert_eq!(
                run(&records(&both, fragment)),
                Err(HelloError::Malformed(
                    "handshake bytes after the ClientHello"
                )),
                "{fragment}"
            );
        }
        // One byte after it is enough.
        assert_eq!(
            run(&records(&[&first[..], &[1]].concat(), 16 * 1024)),
            Err(HelloError::Malformed(
                "handshake bytes after the ClientHello"
            ))
        );
        // A hello that ends with its record is accepted, with the second in a record of its own
        // left for the caller.
        let apart = [records(&first, 16 * 1024), records(&second, 16 * 1024)].concat();
        assert_eq!(run(&apart), Ok(Some(b"a.example".to_vec())));
    }

    #[test]
    fn buffer_cap() {
        // One-byte records: 6 raw bytes per hello byte exceed the raw cap before the hello ends.
        let bytes = records(&client_hello(Some(&extension(21, &[0; 30_000]))), 1);
        let mut r = HelloReader::new();
        let mut result = Ok(None);
        for chunk in bytes.chunks(4096) {
            result = r.push(chunk);
            if result.is_err() {
                break;
            }
        }
        assert_eq!(result, Err(HelloError::TooLarge));
    }

    #[test]
    fn alerts() {
        assert_eq!(
            alert_record(AlertDescription::UnrecognizedName),
            [0x15, 3, 3, 0, 2, 2, 112]
        );
        assert_eq!(
            HelloError::NoSni.alert(),
            AlertDescription::UnrecognizedName
        );
        assert_eq!(HelloError::NotTls.alert(), AlertDescription::AccessDenied);
    }

    proptest! {
        #[test]
        fn no_panic_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
            let _ = run(&bytes);
        }

        #[test]
        fn no_panic_on_arbitrary_record_payloads(
            payload in proptest::collection::vec(any::<u8>(), 0..4096),
            fragment in 1usize..300,
        ) {
            let mut msg = vec![1];
            msg.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
            msg.extend_from_slice(&payload);
            let _ = run(&records(&msg, fragment));
        }

        #[test]
        fn fragmentation_invariance(
            name in "[a-z]{1,20}(\\.[a-z]{1,20}){0,3}",
            padding in 0usize..3000,
            fragment in 1usize..2000,
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..20),
        ) {
            let msg = client_hello(Some(&[
                extension(43, &[2, 3, 4]),
                sni_extension(&[name.as_bytes()]),
                extension(21, &vec![0; padding]),
            ].concat()));
            let bytes = records(&msg, fragment);
            let whole = run(&bytes);
            prop_assert_eq!(&whole, &Ok(Some(name.as_bytes().to_vec())));
            let mut points: Vec<usize> = cuts.iter().map(|i| i.index(bytes.len())).collect();
            points.push(bytes.len());
            points.sort_unstable();
            let mut r = HelloReader::new();
            let mut last = 0;
            let mut got = Ok(None);
            for p in points {
                if p > last {
                    got = r.push(&bytes[last..p]);
                    if got != Ok(None) {
                        prop_assert_eq!(p, bytes.len());
                    }
                    last = p;
                }
            }
            prop_assert_eq!(got, whole);
        }

        #[test]
        fn mutations_never_panic(
            idx in any::<prop::sample::Index>(),
            byte in any::<u8>(),
        ) {
            let mut bytes = hello_record(&[b"a.example.com"], 100);
            let i = idx.index(bytes.len());
            bytes[i] = byte;
            let _ = run(&bytes);
        }
    }
}
