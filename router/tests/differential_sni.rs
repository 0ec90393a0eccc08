//! SNI differential: the name the router routes a TLS connection by must be the name a real TLS server
//! reads from the same bytes (rustls' server-side `Acceptor`), or the router must refuse.
//!
//! How it fits: `HelloReader` (router/src/proxy/tls.rs) reassembles the ClientHello and extracts the
//! SNI; the router then validates it as a host name and decides. A gap between what the router reads and
//! what the upstream's TLS stack reads is a bypass (route by one name, get served another), so every
//! generated hello goes to both. Pure and in-process: no sockets.

use std::sync::Arc;

use agent_sandbox_router::proxy::tls::{build, HelloReader};
use agent_sandbox_shared::HostName;
use proptest::prelude::*;
use proptest::strategy::ValueTree;

/// What the router would route by: the reassembled SNI, validated as a host name, or a refusal.
fn router_name(bytes: &[u8], cuts: &[usize]) -> Option<String> {
    let mut reader = HelloReader::new();
    let mut start = 0;
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
    points.sort_unstable();
    points.push(bytes.len());
    for end in points {
        if end < start {
            continue;
        }
        match reader.push(&bytes[start..end]) {
            Ok(None) => start = end,
            Ok(Some(sni)) => {
                let s = std::str::from_utf8(&sni).ok()?;
                return HostName::parse(s).ok().map(|n| n.as_str().to_owned());
            }
            Err(_) => return None,
        }
    }
    None
}

/// What rustls' server reads: `Ok(name)` when it accepts the hello (`None` when it sees no name),
/// `Err` when it rejects the hello.
fn rustls_name(bytes: &[u8], cuts: &[usize]) -> Result<Option<String>, String> {
    let mut acceptor = rustls::server::Acceptor::default();
    let mut start = 0;
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
    points.sort_unstable();
    points.push(bytes.len());
    for end in points {
        if end <= start {
            continue;
        }
        let mut chunk = &bytes[start..end];
        while !chunk.is_empty() {
            acceptor.read_tls(&mut chunk).map_err(|e| e.to_string())?;
        }
        start = end;
        match acceptor.accept() {
            Ok(Some(accepted)) => {
                return Ok(accepted.client_hello().server_name().map(str::to_owned));
            }
            Ok(None) => {}
            Err((e, _)) => return Err(e.to_string()),
        }
    }
    Err("incomplete".to_owned())
}

/// Canonical form for comparison: DNS names are case-insensitive and a trailing dot names the same host.
fn canon(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

/// Checks the differential property for one input, returning a description of a disagreement.
fn check(bytes: &[u8], cuts: &[usize]) -> Result<(), String> {
    let routed = router_name(bytes, cuts);
    // The decision must not depend on how the bytes were split.
    let whole = router_name(bytes, &[]);
    if routed != whole {
        return Err(format!(
            "split changed the decision: {routed:?} vs {whole:?}"
        ));
    }
    let Some(routed) = routed else {
        return Ok(());
    };
    match rustls_name(bytes, &[]) {
        Ok(Some(served)) if canon(&served) == canon(&routed) => Ok(()),
        other => Err(format!(
            "router routes by {routed:?}, rustls reads {other:?} from {}",
            hex(bytes)
        )),
    }
}

/// Lower-case hex of `bytes`, for reproducing a failure.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Names of every kind a hostile client could send.
fn name_strategy() -> impl Strategy<Value = Vec<u8>> {
    let label = "[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?";
    prop_oneof![
        // Valid names, sometimes upper case, sometimes with a trailing dot.
        (
            proptest::collection::vec(label, 1..5),
            any::<bool>(),
            any::<bool>()
        )
            .prop_map(|(labels, upper, dot)| {
                let mut s = labels.join(".") + ".test";
                if upper {
                    s = s.to_ascii_uppercase();
                }
                if dot {
                    s.push('.');
                }
                s.into_bytes()
            }),
        // Names with one odd byte somewhere.
        (
            proptest::collection::vec(label, 1..4),
            prop::sample::select(vec![
                b'\0', b'\r', b'\n', b'%', b'/', b'@', b'*', b'_', b' ', b':', b'\\', 0xc3, 0xff,
                b'.'
            ]),
            any::<prop::sample::Index>()
        )
            .prop_map(|(labels, odd, at)| {
                let mut s = (labels.join(".") + ".test").into_bytes();
                let i = at.index(s.len() + 1);
                s.insert(i, odd);
                s
            }),
        // IP literals and other near-names.
        prop::sample::select(vec![
            b"127.0.0.1".to_vec(),
            b"198.18.0.1".to_vec(),
            b"::1".to_vec(),
            b"[::1]".to_vec(),
            b"0x7f.1".to_vec(),
            b"xn--bcher-kva.test".to_vec(),
            b"xn--.test".to_vec(),
            b"-a.test".to_vec(),
            b"a-.test".to_vec(),
            b"a..test".to_vec(),
            b".".to_vec(),
            b"localhost".to_vec(),
            b"a.test:443".to_vec(),
        ]),
        // Long names and labels.
        (1usize..80, 1usize..6).prop_map(|(len, n)| {
            let label = "a".repeat(len);
            vec![label; n].join(".").into_bytes()
        }),
        // Anything at all.
        proptest::collection::vec(any::<u8>(), 0..40),
    ]
}

/// How the server_name extension is laid out.
#[derive(Clone, Debug)]
enum SniShape {
    /// None at all.
    Absent,
    /// One host_name entry.
    One(Vec<u8>),
    /// Two host_name entries in one list.
    TwoEntries(Vec<u8>, Vec<u8>),
    /// Two server_name extensions.
    TwoExtensions(Vec<u8>, Vec<u8>),
    /// A non-host_name entry type (1) before or after the name.
    OtherType(Vec<u8>, bool),
    /// The list length field off by `delta`.
    BadListLength(Vec<u8>, i8),
}

fn sni_shape() -> impl Strategy<Value = SniShape> {
    prop_oneof![
        1 => Just(SniShape::Absent),
        8 => name_strategy().prop_map(SniShape::One),
        1 => (name_strategy(), name_strategy()).prop_map(|(a, b)| SniShape::TwoEntries(a, b)),
        1 => (name_strategy(), name_strategy()).prop_map(|(a, b)| SniShape::TwoExtensions(a, b)),
        1 => (name_strategy(), any::<bool>()).prop_map(|(a, b)| SniShape::OtherType(a, b)),
        1 => (name_strategy(), -3i8..=3).prop_map(|(a, d)| SniShape::BadListLength(a, d)),
    ]
}

fn encode_sni(shape: &SniShape) -> Vec<Vec<u8>> {
    match shape {
        SniShape::Absent => vec![],
        SniShape::One(n) => vec![build::sni_extension(&[n])],
        SniShape::TwoEntries(a, b) => vec![build::sni_extension(&[a, b])],
        SniShape::TwoExtensions(a, b) => {
            vec![build::sni_extension(&[a]), build::sni_extension(&[b])]
        }
        SniShape::OtherType(n, before) => {
            let mut entries = Vec::new();
            let other = [1u8, 0, 3, b'x', b'y', b'z'];
            let mut host = vec![0u8];
            host.extend_from_slice(&(n.len() as u16).to_be_bytes());
            host.extend_from_slice(n);
            if *before {
                entries.extend_from_slice(&other);
                entries.extend_from_slice(&host);
            } else {
                entries.extend_from_slice(&host);
                entries.extend_from_slice(&other);
            }
            let mut data = (entries.len() as u16).to_be_bytes().to_vec();
            data.extend_from_slice(&entries);
            vec![build::extension(0, &data)]
        }
        SniShape::BadListLength(n, delta) => {
            let mut ext = build::sni_extension(&[n]);
            let len = u16::from_be_bytes([ext[4], ext[5]]);
            let bad = len.wrapping_add_signed(i16::from(*delta));
            ext[4..6].copy_from_slice(&bad.to_be_bytes());
            vec![ext]
        }
    }
}

/// The other extensions a real client sends, GREASE included.
fn other_extensions() -> impl Strategy<Value = Vec<Vec<u8>>> {
    let grease = (0u16..16).prop_map(|i| {
        let g = 0x0a0a + i * 0x1010;
        build::extension(g, &[])
    });
    let supported_versions = Just(build::extension(43, &[0x04, 0x03, 0x04, 0x03, 0x03]));
    let groups = Just(build::extension(10, &[0x00, 0x04, 0x11, 0xec, 0x00, 0x1d]));
    let sig_algs = Just(build::extension(13, &[0x00, 0x04, 0x04, 0x03, 0x08, 0x04]));
    // A post-quantum hybrid key share (X25519MLKEM768: 1216 bytes) plus X25519 (32 bytes).
    let key_share = any::<u8>().prop_map(|b| {
        let mut shares = Vec::new();
        shares.extend_from_slice(&0x11ecu16.to_be_bytes());
        shares.extend_from_slice(&1216u16.to_be_bytes());
        shares.extend(std::iter::repeat(b).take(1216));
        shares.extend_from_slice(&0x001du16.to_be_bytes());
        shares.extend_from_slice(&32u16.to_be_bytes());
        shares.extend(std::iter::repeat(b ^ 0x55).take(32));
        let mut data = (shares.len() as u16).to_be_bytes().to_vec();
        data.extend_from_slice(&shares);
        build::extension(51, &data)
    });
    let padding = (0usize..600).prop_map(|n| build::extension(21, &vec![0; n]));
    let psk_modes = Just(build::extension(45, &[0x01, 0x01]));
    let alpn = Just(build::extension(
        16,
        &[
            0x00, 0x0c, 0x02, b'h', b'2', 0x08, b'h', b't', b't', b'p', b'/', b'1', b'.', b'1',
        ],
    ));
    let unknown = (
        0x3000u16..0x3100,
        proptest::collection::vec(any::<u8>(), 0..30),
    )
        .prop_map(|(t, d)| build::extension(t, &d));
    let one = prop_oneof![
        grease,
        supported_versions,
        groups,
        sig_algs,
        key_share,
        padding,
        psk_modes,
        alpn,
        unknown
    ];
    proptest::collection::vec(one, 0..8).prop_map(|mut v| {
        // rustls refuses a hello without signature_algorithms before it looks at the name; every real
        // client sends it, so the generated hellos do too (somewhere among the others).
        let at = v.len() / 2;
        v.insert(
            at,
            build::extension(13, &[0x00, 0x04, 0x04, 0x03, 0x08, 0x04]),
        );
        // Real clients never repeat an extension type; rustls rejects duplicates and so would any
        // server, which would only hide the differences this test looks for.
        let mut seen = std::collections::HashSet::new();
        v.retain(|e| seen.insert([e[0], e[1]]));
        v
    })
}

/// A generated hello: the extensions in some order, record fragmentation and TCP read boundaries.
fn hello() -> impl Strategy<Value = (Vec<u8>, Vec<usize>)> {
    (
        sni_shape(),
        other_extensions(),
        any::<prop::sample::Index>(),
        prop_oneof![Just(16 * 1024), 1usize..2000],
        proptest::collection::vec(any::<usize>(), 0..6),
    )
        .prop_map(|(sni, mut others, at, fragment, cuts)| {
            for (i, e) in encode_sni(&sni).into_iter().enumerate() {
                let pos = (at.index(others.len() + 1) + i).min(others.len());
                others.insert(pos, e);
            }
            let ext: Vec<u8> = others.concat();
            let hs = build::client_hello(Some(&ext));
            (build::records(&hs, fragment), cuts)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, failure_persistence: None, ..ProptestConfig::default() })]

    /// Generated hellos: the router's name is rustls' name, or the router refused.
    #[test]
    fn router_routes_by_the_name_rustls_reads((bytes, cuts) in hello()) {
        if let Err(e) = check(&bytes, &cuts) {
            prop_assert!(false, "{}", e);
        }
    }

    /// Random bytes after a valid record header: the router never routes where rustls would not.
    #[test]
    fn garbage_after_a_header_is_never_routed(
        body in proptest::collection::vec(any::<u8>(), 0..300),
        cuts in proptest::collection::vec(any::<usize>(), 0..4),
    ) {
        let mut bytes = vec![0x16, 0x03, 0x01];
        bytes.extend_from_slice(&(body.len() as u16).to_be_bytes());
        bytes.extend_from_slice(&body);
        if let Err(e) = check(&bytes, &cuts) {
            prop_assert!(false, "{}", e);
        }
    }
}

/// Real hellos from rustls' own client, with random valid names: the router must route every one, by
/// the name the client asked for, whatever the TCP read boundaries.
#[test]
fn real_rustls_client_hellos_route_by_their_name() {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = Arc::new(
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth(),
    );
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let names = proptest::collection::vec("[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?", 1..6);
    let mut checked = 0;
    for _ in 0..300 {
        let labels = names.new_tree(&mut runner).unwrap().current();
        let name = labels.join(".") + ".test";
        let server_name = rustls::pki_types::ServerName::try_from(name.clone()).unwrap();
        let mut conn = rustls::ClientConnection::new(Arc::clone(&config), server_name).unwrap();
        let mut bytes = Vec::new();
        while conn.wants_write() {
            conn.write_tls(&mut bytes).unwrap();
        }
        let cuts: Vec<usize> = (0..4)
            .map(|i| (i * 97 + name.len()) % bytes.len())
            .collect();
        assert_eq!(
            router_name(&bytes, &cuts).as_deref(),
            Some(name.as_str()),
            "{}",
            hex(&bytes)
        );
        check(&bytes, &cuts).unwrap();
        // One byte per read, as some clients (and attackers) send.
        let every: Vec<usize> = (1..bytes.len()).collect();
        assert_eq!(router_name(&bytes, &every).as_deref(), Some(name.as_str()));
        checked += 1;
    }
    assert_eq!(checked, 300);
}

/// The generator is worth its cases: a fair share of generated hellos is routed (so the comparison with
/// rustls happens) and a fair share refused (so the hostile shapes are reached).
#[test]
fn generated_hellos_reach_both_outcomes() {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strategy = hello();
    let (mut routed, mut refused) = (0, 0);
    for _ in 0..1000 {
        let (bytes, cuts) = strategy.new_tree(&mut runner).unwrap().current();
        check(&bytes, &cuts).unwrap();
        match router_name(&bytes, &cuts) {
            Some(_) => routed += 1,
            None => refused += 1,
        }
    }
    assert!(
        routed >= 200 && refused >= 200,
        "routed {routed}, refused {refused}"
    );
}
