//! A router (just the proxy, in-process) for the proxy tests and the proxy benchmark, serving on
//! loopback and configured like the launcher configures it.
#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::sync::Arc;

use agent_sandbox_router::proxy::Proxy;
use agent_sandbox_router::Opening;
use agent_sandbox_shared::{HostName, RouterConfig};
use agent_sandbox_testkit::dns::TestDns;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// A router (just the proxy) serving on loopback, stopped on drop.
#[derive(Debug)]
pub struct TestRouter {
    /// The TLS (SNI) listener.
    pub https: SocketAddr,
    /// The HTTP (Host) listener.
    pub http: SocketAddr,
    /// One listener per host:port entry: (host, port, where it listens).
    pub forwards: Vec<(String, u16, SocketAddr)>,
    /// Stops every listener (on drop, or by a test of shutdown).
    pub stop: CancellationToken,
    /// The listeners' tasks, to await after `stop`.
    pub tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// Router settings for a test.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Exact names on the allowlist.
    pub hosts: Vec<String>,
    /// Names allowed with every subdomain.
    pub subdomains: Vec<String>,
    /// host:port entries.
    pub forwards: Vec<(String, u16)>,
    /// How long a client may take to send its ClientHello or request head.
    pub peek_timeout_secs: u64,
    /// How long resolving and dialling an upstream may take.
    pub connect_timeout_secs: u64,
    /// Connections served at once.
    pub max_connections: usize,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            hosts: Vec::new(),
            subdomains: Vec::new(),
            forwards: Vec::new(),
            peek_timeout_secs: 10,
            connect_timeout_secs: 3,
            max_connections: 4096,
        }
    }
}

/// A listener on a free loopback port, bound the way the router binds its own (backlog, inherited
/// socket options, and the deferred accept for HTTP and TLS). tokio's `TcpListener::bind` gave a queue
/// of 128 here: the 400 connections of `hundreds_of_concurrent_connections_and_no_leaks` overflowed it
/// into SYN cookies, and an accepted connection whose client was already in TIME_WAIT (most likely
/// rebuilt from a late cookie) stayed open and failed the leak check.
fn listener(opening: Opening) -> TcpListener {
    let std =
        agent_sandbox_router::tcp_listener(SocketAddr::from(([127, 0, 0, 1], 0)), opening).unwrap();
    TcpListener::from_std(std).unwrap()
}

impl TestRouter {
    /// Validates the settings as a router configuration and serves it with `dns` as the resolver.
    pub async fn start(settings: Settings, dns: &TestDns) -> TestRouter {
        let mut toml = format!(
            "hosts = {:?}\nsubdomains = {:?}\nresolvers = [\"{}\"]\npeek_timeout_secs = {}\nconnect_timeout_secs = {}\nmax_connections = {}\nmax_connections_per_client = {}\n",
            settings.hosts,
            settings.subdomains,
            dns.addr,
            settings.peek_timeout_secs,
            settings.connect_timeout_secs,
            settings.max_connections,
            // Every test client is 127.0.0.1: the per-client cap is tested with the real binary.
            settings.max_connections
        );
        toml.push_str("[listen]\nhttp = \"127.0.0.1:0\"\nhttps = \"127.0.0.1:0\"\n");
        for (host, port) in &settings.forwards {
            toml.push_str(&format!(
                "[[forwards]]\nhost = \"{host}\"\nport = {port}\nlisten = \"127.0.0.1:0\"\n"
            ));
        }
        toml.push_str("[answers]\ndefault = \"127.0.0.2\"\n");
        let config = RouterConfig::from_toml(&toml)
            .unwrap_or_else(|e| panic!("{e}\n{toml}"))
            .validate()
            .unwrap();
        let proxy = Arc::new(Proxy::new(&config).unwrap());
        let stop = CancellationToken::new();
        let https = listener(Opening::Client);
        let http = listener(Opening::Client);
        let mut router = TestRouter {
            https: https.local_addr().unwrap(),
            http: http.local_addr().unwrap(),
            forwards: Vec::new(),
            stop: stop.clone(),
            tasks: Vec::new(),
        };
        router.tasks.push(tokio::spawn(
            Arc::clone(&proxy).serve_https(https, stop.clone()),
        ));
        router.tasks.push(tokio::spawn(
            Arc::clone(&proxy).serve_http(http, stop.clone()),
        ));
        for (host, port) in &settings.forwards {
            let l = listener(Opening::Any);
            router
                .forwards
                .push((host.clone(), *port, l.local_addr().unwrap()));
            router
                .tasks
                .push(tokio::spawn(Arc::clone(&proxy).serve_forward(
                    l,
                    HostName::parse(host).unwrap(),
                    *port,
                    stop.clone(),
                )));
        }
        router
    }

    /// Where the host:port entry `host`:`port` listens.
    pub fn forward(&self, host: &str, port: u16) -> SocketAddr {
        self.forwards
            .iter()
            .find(|(h, p, _)| h == host && *p == port)
            .unwrap()
            .2
    }
}

impl Drop for TestRouter {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
