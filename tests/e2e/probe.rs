//! A static network probe for the end-to-end tests, built with `rustc -C target-feature=+crt-static`
//! and run in nested containers made from a scratch image inside the sandbox. It never calls
//! getaddrinfo (a scratch image has no name-service modules): names are resolved with a raw DNS query
//! to the first `nameserver` of /etc/resolv.conf.
//!
//!   probe dns NAME            prints the A records, or NXDOMAIN / NODATA / an error
//!   probe get NAME PORT       resolves NAME, sends `GET /` with `Host: NAME`, prints the response
//!
//! Exit status: 0 on success, 1 on a network failure, 2 on bad usage.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(3);

fn nameserver() -> Result<Ipv4Addr, String> {
    let conf = std::fs::read_to_string("/etc/resolv.conf").map_err(|e| e.to_string())?;
    conf.lines()
        .filter_map(|l| l.strip_prefix("nameserver"))
        .find_map(|s| s.trim().parse().ok())
        .ok_or_else(|| "no IPv4 nameserver in /etc/resolv.conf".to_owned())
}

fn resolve(name: &str) -> Result<Vec<Ipv4Addr>, String> {
    let server = nameserver()?;
    let mut q = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in name.trim_end_matches('.').split('.') {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    let sock = UdpSocket::bind("0.0.0.0:0").map_err(|e| e.to_string())?;
    sock.set_read_timeout(Some(TIMEOUT)).map_err(|e| e.to_string())?;
    sock.send_to(&q, SocketAddr::from((server, 53)))
        .map_err(|e| format!("send to {server}: {e}"))?;
    let mut buf = [0u8; 1500];
    let n = sock.recv(&mut buf).map_err(|e| format!("no answer from {server}: {e}"))?;
    let r = &buf[..n];
    if r.len() < 12 || r[0..2] != [0x12, 0x34] {
        return Err("bad reply".into());
    }
    match r[3] & 0x0f {
        0 => {}
        3 => return Err("NXDOMAIN".into()),
        rc => return Err(format!("rcode {rc}")),
    }
    let answers = u16::from_be_bytes([r[6], r[7]]);
    let mut i = q.len();
    let mut out = Vec::new();
    for _ in 0..answers {
        // Skip the owner name (a pointer or labels).
        while i < r.len() {
            let l = r[i] as usize;
            if l == 0 {
                i += 1;
                break;
            }
            if l & 0xc0 == 0xc0 {
                i += 2;
                break;
            }
            i += 1 + l;
        }
        if i + 10 > r.len() {
            break;
        }
        let rtype = u16::from_be_bytes([r[i], r[i + 1]]);
        let len = u16::from_be_bytes([r[i + 8], r[i + 9]]) as usize;
        i += 10;
        if rtype == 1 && len == 4 && i + 4 <= r.len() {
            out.push(Ipv4Addr::new(r[i], r[i + 1], r[i + 2], r[i + 3]));
        }
        i += len;
    }
    if out.is_empty() {
        return Err("NODATA".into());
    }
    Ok(out)
}

fn get(name: &str, port: u16) -> Result<String, String> {
    let ip = resolve(name)?[0];
    let mut s = TcpStream::connect_timeout(&SocketAddr::from((ip, port)), TIMEOUT)
        .map_err(|e| format!("connect {ip}:{port}: {e}"))?;
    s.set_read_timeout(Some(TIMEOUT)).map_err(|e| e.to_string())?;
    write!(s, "GET / HTTP/1.0\r\nHost: {name}\r\nConnection: close\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut body = String::new();
    s.read_to_string(&mut body).map_err(|e| format!("read: {e}"))?;
    if body.is_empty() {
        return Err("empty response".into());
    }
    Ok(body)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["dns", name] => resolve(name).map(|ips| {
            ips.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(" ")
        }),
        ["get", name, port] => match port.parse() {
            Ok(p) => get(name, p),
            Err(_) => Err(format!("bad port {port}")),
        },
        _ => {
            eprintln!("usage: probe dns NAME | probe get NAME PORT");
            std::process::exit(2);
        }
    };
    match result {
        Ok(text) => println!("{text}"),
        Err(e) => {
            println!("FAILED: {e}");
            std::process::exit(1);
        }
    }
}
