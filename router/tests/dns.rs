//! DNS, end to end: the real router binary, real UDP and TCP sockets, a real DNS encoder/decoder.

mod common;

use std::net::{Ipv4Addr, UdpSocket};
use std::time::Duration;

use agent_sandbox_shared::{Allowlist, Policy, SessionPlan};
use common::{tcp_query, temp_dir, udp_query, write_file, Router};
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;

const ALLOWLIST: &str = "\
api.anthropic.com
.example.com
db.internal.corp:5432
";

fn standalone() -> Router {
    let dir = temp_dir("dns");
    let allowlist = write_file(&dir, "allowed-hosts", ALLOWLIST);
    // Every listener on port 0 of loopback: the test reads the bound ports from the log.
    Router::start(
        &[
            "--allowlist",
            allowlist.to_str().unwrap(),
            "--answer",
            "10.9.8.7",
            "--dns",
            "127.0.0.1:0",
            "--http",
            "127.0.0.1:0",
            "--https",
            "127.0.0.1:0",
            "--forward",
            "db.internal.corp:5432=127.0.0.1:0",
        ],
        5,
    )
    .holding(dir)
}

#[test]
fn allowed_names_get_the_answer_over_udp_and_tcp() {
    let router = standalone();
    let dns = router.addr("dns/udp");
    assert_eq!(router.addr("dns/tcp"), dns);
    for name in [
        "api.anthropic.com.",
        "example.com.",
        "www.example.com.",
        "a.b.c.example.com.",
        "db.internal.corp.",
    ] {
        for answer in [
            udp_query(dns, name, RecordType::A),
            tcp_query(dns, name, RecordType::A),
        ] {
            assert_eq!(answer.code, ResponseCode::NoError, "{name}");
            assert!(answer.authoritative, "{name}: AA");
            assert_eq!(answer.addresses, [Ipv4Addr::new(10, 9, 8, 7)], "{name}");
            assert_eq!(answer.ttls, [10], "{name}");
        }
    }
}

#[test]
fn case_is_ignored_and_the_question_echoed_as_asked() {
    let router = standalone();
    let dns = router.addr("dns/udp");
    let answer = udp_query(dns, "WwW.ExAmPlE.CoM.", RecordType::A);
    assert_eq!(answer.code, ResponseCode::NoError);
    assert_eq!(answer.question, "WwW.ExAmPlE.CoM.");
    assert_eq!(answer.id, 0x4242);
    let answer = tcp_query(dns, "API.ANTHROPIC.COM.", RecordType::A);
    assert_eq!(answer.addresses.len(), 1);
    assert_eq!(answer.question, "API.ANTHROPIC.COM.");
}

#[test]
fn other_types_of_allowed_names_are_nodata() {
    let router = standalone();
    let dns = router.addr("dns/udp");
    for rtype in [
        RecordType::AAAA,
        RecordType::HTTPS,
        RecordType::SVCB,
        RecordType::TXT,
        RecordType::MX,
        RecordType::ANY,
        RecordType::CNAME,
        RecordType::NS,
    ] {
        for answer in [
            udp_query(dns, "api.anthropic.com.", rtype),
            tcp_query(dns, "www.example.com.", rtype),
        ] {
            assert_eq!(answer.code, ResponseCode::NoError, "{rtype}");
            assert_eq!(answer.records, 0, "{rtype}: no records");
        }
    }
}

#[test]
fn unlisted_names_and_lookalikes_are_nxdomain() {
    let router = standalone();
    let dns = router.addr("dns/udp");
    for name in [
        "evil.com.",
        "anthropic.com.",
        "x.api.anthropic.com.",
        "api.anthropic.com.evil.com.",
        "badexample.com.",
        "example.com.evil.com.",
        "example.comx.",
        "internal.corp.",
        "x.db.internal.corp.",
        "exfil-6461746120676f6573206865726520.evil.com.",
        "1.0.0.127.in-addr.arpa.",
    ] {
        for rtype in [
            RecordType::A,
            RecordType::AAAA,
            RecordType::TXT,
            RecordType::PTR,
        ] {
            let answer = udp_query(dns, name, rtype);
            assert_eq!(answer.code, ResponseCode::NXDomain, "{name} {rtype}");
            assert_eq!(answer.records, 0);
        }
        assert_eq!(
            tcp_query(dns, name, RecordType::A).code,
            ResponseCode::NXDomain,
            "{name}"
        );
    }
    // Every refusal is logged with the name, the type and the client.
    router.wait_for_log("refusal log", |log| {
        log.contains("refused")
            && log.contains("name=badexample.com ")
            && log.contains("kind=\"dns\"")
    });
}

#[test]
fn names_with_bytes_outside_the_alphabet_are_nxdomain() {
    let router = standalone();
    let dns = router.addr("dns/udp");
    // Hand-built question: label "www\0" under example.com, which hickory can carry but no policy allows.
    let mut packet = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in [&b"www\0"[..], b"example", b"com"] {
        packet.push(label.len() as u8);
        packet.extend_from_slice(label);
    }
    packet.extend_from_slice(&[0, 0, 1, 0, 1]);
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    sock.send_to(&packet, dns).unwrap();
    let mut buf = [0u8; 512];
    let (n, _) = sock.recv_from(&mut buf).unwrap();
    assert_eq!(common::decode(&buf[..n]).code, ResponseCode::NXDomain);
}

#[test]
fn garbage_never_stalls_the_server() {
    let router = standalone();
    let dns = router.addr("dns/udp");
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut garbage: Vec<Vec<u8>> = vec![
        vec![],
        vec![0],
        vec![0xff; 11],
        vec![0xff; 12],
        vec![0xab; 600],
        // Header claiming 1 question, then a truncated name.
        vec![0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 7, b'e', b'x'],
        // A compression pointer to itself (a loop).
        vec![0, 2, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 12, 0, 1, 0, 1],
        // Zero questions.
        vec![0, 3, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0],
    ];
    // Two questions.
    let mut two = common::query_bytes("api.anthropic.com.", RecordType::A, 4);
    two[5] = 2;
    let q = common::query_bytes("www.example.com.", RecordType::A, 4);
    two.extend_from_slice(&q[12..]);
    garbage.push(two);
    // A response (QR set) must not be answered: no reflection.
    let mut response = common::query_bytes("api.anthropic.com.", RecordType::A, 5);
    response[2] |= 0x80;
    garbage.push(response);

    for g in &garbage {
        sock.send_to(g, dns).unwrap();
        let mut buf = [0u8; 1024];
        if let Ok((n, _)) = sock.recv_from(&mut buf) {
            let answer = common::decode(&buf[..n]);
            assert!(
                matches!(answer.code, ResponseCode::FormErr | ResponseCode::NotImp),
                "garbage {g:?} got {:?}",
                answer.code
            );
            assert_eq!(answer.records, 0);
        }
    }
    // Each kind is logged as a refusal with its reason (once per window and client, not per packet).
    router.wait_for_log("malformed refusals", |log| {
        log.contains("reason=not one standard question ")
            && log.contains("reason=a runt or a response ")
            && log.contains("kind=\"dns\"")
    });
    // And the server still answers.
    assert_eq!(
        udp_query(dns, "api.anthropic.com.", RecordType::A)
            .addresses
            .len(),
        1
    );
    assert_eq!(
        tcp_query(dns, "api.anthropic.com.", RecordType::A)
            .addresses
            .len(),
        1
    );
}

#[test]
fn zero_and_several_questions_are_formerr() {
    let router = standalone();
    let dns = router.addr("dns/udp");
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut two = common::query_bytes("api.anthropic.com.", RecordType::A, 7);
    two[5] = 2;
    let q = common::query_bytes("evil.com.", RecordType::A, 7);
    two.extend_from_slice(&q[12..]);
    for packet in [vec![0, 3, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0], two] {
        sock.send_to(&packet, dns).unwrap();
        let mut buf = [0u8; 1024];
        let (n, _) = sock.recv_from(&mut buf).expect("an answer");
        let answer = common::decode(&buf[..n]);
        assert_eq!(answer.code, ResponseCode::FormErr);
        assert_eq!(answer.records, 0);
    }
}

#[test]
fn a_burst_of_queries_is_all_answered() {
    let router = standalone();
    let dns = router.addr("dns/udp");
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    const TOTAL: u16 = 4000;
    const WINDOW: u16 = 100;
    let mut seen = vec![false; TOTAL as usize];
    let mut sent = 0u16;
    let mut received = 0u16;
    let mut buf = [0u8; 1024];
    // Keep a bounded number in flight so the kernel's socket buffers never drop datagrams.
    while received < TOTAL {
        while sent < TOTAL && sent - received < WINDOW {
            let name = if sent % 2 == 0 {
                "www.example.com."
            } else {
                "nope.invalid."
            };
            sock.send_to(&common::query_bytes(name, RecordType::A, sent), dns)
                .unwrap();
            sent += 1;
        }
        let (n, _) = sock.recv_from(&mut buf).expect("every query is answered");
        let answer = common::decode(&buf[..n]);
        let expect = if answer.id % 2 == 0 {
            ResponseCode::NoError
        } else {
            ResponseCode::NXDomain
        };
        assert_eq!(answer.code, expect);
        assert!(!seen[answer.id as usize], "duplicate answer {}", answer.id);
        seen[answer.id as usize] = true;
        received += 1;
    }
    assert!(seen.iter().all(|s| *s));
}

/// Queries from many senders that arrive together (one batched receive) are each answered to their own
/// sender, over IPv6 too.
#[test]
fn queries_from_many_senders_each_get_their_own_answers() {
    let dir = temp_dir("dns-v6");
    let allowlist = write_file(&dir, "allowed-hosts", ALLOWLIST);
    let router = Router::start(
        &[
            "--allowlist",
            allowlist.to_str().unwrap(),
            "--answer",
            "10.9.8.7",
            "--dns",
            "[::1]:0",
            "--http",
            "127.0.0.1:0",
            "--https",
            "127.0.0.1:0",
            "--forward",
            "db.internal.corp:5432=127.0.0.1:0",
        ],
        5,
    );
    let dns = router.addr("dns/udp");
    let senders: Vec<UdpSocket> = (0..8)
        .map(|_| {
            let s = UdpSocket::bind("[::1]:0").unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            s
        })
        .collect();
    // Eight queries from each sender, all sent before any answer is read.
    for round in 0..8u16 {
        for (i, s) in senders.iter().enumerate() {
            let id = (i as u16) << 8 | round;
            let name = if round % 2 == 0 {
                "api.anthropic.com."
            } else {
                "nope.invalid."
            };
            s.send_to(&common::query_bytes(name, RecordType::A, id), dns)
                .unwrap();
        }
    }
    let mut buf = [0u8; 1024];
    for (i, s) in senders.iter().enumerate() {
        let mut rounds = Vec::new();
        for _ in 0..8 {
            let (n, from) = s.recv_from(&mut buf).expect("every query is answered");
            assert_eq!(from, dns);
            let answer = common::decode(&buf[..n]);
            assert_eq!(answer.id >> 8, i as u16, "an answer reached another sender");
            let round = answer.id & 0xff;
            let expect = if round % 2 == 0 {
                ResponseCode::NoError
            } else {
                ResponseCode::NXDomain
            };
            assert_eq!(answer.code, expect);
            rounds.push(round);
        }
        rounds.sort_unstable();
        assert_eq!(rounds, (0..8).collect::<Vec<_>>());
    }
}

#[test]
fn sandbox_mode_answers_per_host_loopbacks() {
    let list = Allowlist::parse(
        "api.anthropic.com\n.example.com\ndb.example.com:5432\n",
        "t",
    )
    .unwrap();
    let mut plan = SessionPlan::new(&Policy::new(&list), Ipv4Addr::LOCALHOST).unwrap();
    // Port 0 everywhere: this test runs as any user, beside other tests.
    let any = Some("127.0.0.1:0".parse().unwrap());
    plan.router.listen.dns = any;
    plan.router.listen.http = any;
    plan.router.listen.https = any;
    for f in &mut plan.router.forwards {
        f.listen = "127.0.0.1:0".parse().unwrap();
    }
    let dir = temp_dir("cfg");
    let config = write_file(&dir, "router.toml", &plan.router.to_toml());
    let router = Router::start(&["--config", config.to_str().unwrap()], 5);
    let dns = router.addr("dns/udp");
    assert_eq!(
        udp_query(dns, "api.anthropic.com.", RecordType::A).addresses,
        [Ipv4Addr::new(127, 0, 0, 2)]
    );
    assert_eq!(
        udp_query(dns, "x.example.com.", RecordType::A).addresses,
        [Ipv4Addr::new(127, 0, 0, 2)]
    );
    assert_eq!(
        udp_query(dns, "DB.example.com.", RecordType::A).addresses,
        [Ipv4Addr::new(127, 0, 0, 3)]
    );
    assert_eq!(
        udp_query(dns, "evil.com.", RecordType::A).code,
        ResponseCode::NXDomain
    );
}

#[test]
fn sigterm_exits_promptly_and_cleanly() {
    let mut router = standalone();
    // An idle TCP DNS client must not hold the exit back.
    let _idle = std::net::TcpStream::connect(router.addr("dns/tcp")).unwrap();
    let (took, status) = router.terminate();
    assert!(status.success(), "exit status {status:?}");
    assert!(took < Duration::from_secs(1), "took {took:?}");
}

/// A question of another class than IN (CHAOS here) is refused even for an allowed name: only IN
/// questions get the name's answer (reviewer R).
#[test]
fn other_classes_are_refused_even_for_allowed_names() {
    let router = standalone();
    let dns = router.addr("dns/udp");
    let mut q = common::query_bytes("api.anthropic.com.", RecordType::A, 0x4242);
    let n = q.len();
    q[n - 2..].copy_from_slice(&3u16.to_be_bytes()); // QCLASS = CH
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    sock.send_to(&q, dns).unwrap();
    let mut buf = [0u8; 4096];
    let (len, _) = sock.recv_from(&mut buf).expect("an answer");
    let answer = common::decode(&buf[..len]);
    assert_eq!(answer.code, ResponseCode::Refused);
    assert_eq!(answer.records, 0);
}
