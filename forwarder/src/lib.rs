//! The forwarder: a small TCP relay from the sandbox pod's loopback addresses to the session router.
//!
//! Inside the sandbox every allowlisted name resolves to a loopback address (127.0.0.2, 127.0.0.3, …; see
//! [`agent_sandbox_shared::plan`]). The sandbox's netns has no route out, so something inside it has to
//! carry those connections to the router on the session network: that is this crate. It knows nothing about
//! names, TLS or HTTP; it relays bytes from `LISTEN` to `TARGET`, nothing else, and the router decides.
//!
//! The binary (`main.rs`) only parses arguments ([`cli`]), sets up logging ([`log`]), the runtime and the
//! signals, and calls [`Forwarder::bind`] then [`Forwarder::run_with_reloads`]; the tests call the same
//! functions in-process. A reload (the launcher's `allow`/`deny` on a running session, delivered as
//! SIGHUP with a new relays file) is a new relay list: listeners for new addresses are bound first (all
//! or none), removed ones stop accepting while their open connections go on, and a changed target
//! applies to new connections.
//!
//! It runs from a `FROM scratch` image, statically linked: it must never resolve a name (no
//! `ToSocketAddrs` on strings, no `lookup_host`), because there is no libc resolver there. Every address it
//! handles is an already parsed [`SocketAddr`].

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use agent_sandbox_shared::logs::LISTENING_ON;
use agent_sandbox_shared::net::{AcceptFailure, Accepted, Acceptor};
use anyhow::Context as _;
use tokio::io::copy_bidirectional_with_sizes;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::task::JoinSet;

pub use agent_sandbox_shared::plan::Relay;

pub mod cli;
pub mod log;

use log::Level;

/// Tunables. The binary uses [`Options::default`]; tests shorten the timeouts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// How long to wait for the target to accept a connection. The target is the router on the same
    /// host, so a connection that takes longer than this is not coming; the client is closed instead of
    /// being left hanging.
    pub connect_timeout: Duration,
    /// The most connections relayed at once, over all listeners. Beyond it the forwarder stops accepting
    /// and lets the kernel's backlog hold new connections, so memory and file descriptors stay bounded
    /// whatever the sandbox does (the accept step is the router's too: [`agent_sandbox_shared::net`]).
    pub max_connections: usize,
    /// Bytes buffered per direction per connection. Two of these are the bulk of a connection's memory;
    /// 16 KiB keeps a connection at a few tens of KB while a bulk transfer still moves a whole TCP
    /// send-buffer's worth of data per pair of system calls.
    pub buffer_size: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            connect_timeout: Duration::from_secs(10),
            max_connections: 4096,
            buffer_size: 16 * 1024,
        }
    }
}

/// A listener that has been bound and the relay it serves.
#[derive(Debug)]
struct Bound {
    /// The bound socket, already listening: the kernel queues connections from here on.
    listener: TcpListener,
    /// The relay, with `listen` being the address actually bound (differs from the request only for
    /// port 0, which tests use).
    relay: Relay,
}

/// Every listener of a forwarder, bound and ready to [`run`](Forwarder::run).
///
/// Binding is separate from running so that every bind failure is reported before any connection is
/// accepted, and so that tests can bind port 0 and learn the address before traffic starts.
#[derive(Debug)]
pub struct Forwarder {
    /// One per relay, in the order given.
    bound: Vec<Bound>,
    /// The tunables, shared by all listeners.
    options: Options,
}

impl Forwarder {
    /// Binds every relay's listen address, then logs one `listening on ADDR` line per listener.
    ///
    /// Any failure is fatal and names the address: a forwarder that silently lacks one of its relays would
    /// turn an allowlisted name into a mysterious "connection refused" inside the sandbox.
    /// An empty list is allowed: a session whose allowlist is empty today may get entries by a reload.
    pub async fn bind(relays: &[Relay], options: Options) -> anyhow::Result<Forwarder> {
        anyhow::ensure!(
            options.buffer_size > 0 && options.max_connections > 0,
            "buffer size and connection limit must be positive"
        );
        let bound = bind_all(relays).await?;
        Ok(Forwarder { bound, options })
    }

    /// The relays as bound: `listen` is the real address (useful when port 0 was asked for).
    pub fn relays(&self) -> Vec<Relay> {
        self.bound.iter().map(|b| b.relay).collect()
    }

    /// Relays connections until `shutdown` completes, then drops every listener and every connection.
    ///
    /// Connections are not drained on shutdown: the forwarder is stopped together with its pod, and the
    /// relayed protocols (TLS, HTTP) notice a dropped connection on their own.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
        // A channel whose sender is gone: no reload ever comes.
        let (_, reloads) = mpsc::channel(1);
        self.run_with_reloads(reloads, shutdown).await
    }

    /// [`run`](Forwarder::run), and each relay list received on `reloads` replaces the current one
    /// (see the crate doc). A reload whose new addresses cannot all be bound is logged and changes
    /// nothing. `reloads` closing only stops reloads.
    pub async fn run_with_reloads(
        self,
        mut reloads: mpsc::Receiver<Vec<Relay>>,
        shutdown: impl Future<Output = ()>,
    ) -> anyhow::Result<()> {
        let permits = Arc::new(Semaphore::new(self.options.max_connections));
        // Dropping this set aborts the accept loops, and with them (their own sets) every connection.
        let mut loops = JoinSet::new();
        // Each serving listener's target; sending `None` retires it.
        let mut serving = Serving::new();
        let options = self.options;
        let start = |loops: &mut JoinSet<LoopEnd>, serving: &mut Serving, b: Bound| {
            let (tx, rx) = watch::channel(Some(b.relay.target));
            serving.insert(b.relay.listen, tx);
            loops.spawn(accept_loop(
                b.listener,
                b.relay.listen,
                rx,
                options,
                Arc::clone(&permits),
            ));
        };
        for b in self.bound {
            start(&mut loops, &mut serving, b);
        }
        tokio::pin!(shutdown);
        let mut reloads_open = true;
        loop {
            tokio::select! {
                () = &mut shutdown => return Ok(()),
                // Accept loops return only when retired; one that ended otherwise has panicked or lost
                // its listener, and a forwarder missing a listener must not carry on as if it were whole.
                Some(ended) = loops.join_next() => match ended {
                    Ok(LoopEnd::Retired) => {}
                    Ok(LoopEnd::Failed) => anyhow::bail!("a listener stopped"),
                    Err(err) => return Err(anyhow::Error::new(err).context("a listener failed")),
                },
                next = reloads.recv(), if reloads_open => {
                    let Some(relays) = next else {
                        reloads_open = false;
                        continue;
                    };
                    let current: BTreeMap<SocketAddr, SocketAddr> = serving
                        .iter()
                        .filter_map(|(l, t)| t.borrow().map(|t| (*l, t)))
                        .collect();
                    let wanted: BTreeMap<SocketAddr, SocketAddr> =
                        relays.iter().map(|r| (r.listen, r.target)).collect();
                    let new: Vec<Relay> = relays
                        .iter()
                        .filter(|r| !current.contains_key(&r.listen))
                        .copied()
                        .collect();
                    let bound = match bind_all(&new).await {
                        Ok(bound) => bound,
                        Err(err) => {
                            log!(Level::Error, "reload refused, relays unchanged: {err:#}");
                            continue;
                        }
                    };
                    let mut closed = 0;
                    serving.retain(|listen, target| match wanted.get(listen) {
                        Some(t) => {
                            target.send_if_modified(|old| {
                                let changed = *old != Some(*t);
                                *old = Some(*t);
                                changed
                            });
                            true
                        }
                        None => {
                            let _ = target.send(None);
                            log!(Level::Info, "closed {listen}: no longer relayed (open connections go on)");
                            closed += 1;
                            false
                        }
                    });
                    let opened = bound.len();
                    for b in bound {
                        start(&mut loops, &mut serving, b);
                    }
                    log!(Level::Info, "reloaded: {} relays, {opened} opened, {closed} closed", wanted.len());
                }
            }
        }
    }
}

/// Binds every relay's listen address, then logs one `listening on ADDR` line per listener. The first
/// failure drops the ones already bound and names its address.
async fn bind_all(relays: &[Relay]) -> anyhow::Result<Vec<Bound>> {
    let mut bound = Vec::with_capacity(relays.len());
    for relay in relays {
        let listener = TcpListener::bind(relay.listen)
            .await
            .with_context(|| format!("cannot listen on {}", relay.listen))?;
        let listen = listener
            .local_addr()
            .with_context(|| format!("cannot read the address bound for {}", relay.listen))?;
        bound.push(Bound {
            listener,
            relay: Relay {
                listen,
                target: relay.target,
            },
        });
    }
    for b in &bound {
        log!(
            Level::Info,
            "{LISTENING_ON}{} to={}",
            b.relay.listen,
            b.relay.target
        );
    }
    Ok(bound)
}

/// Each serving listener's address and its target; sending `None` retires it.
type Serving = BTreeMap<SocketAddr, watch::Sender<Option<SocketAddr>>>;

/// How an accept loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LoopEnd {
    /// A reload removed its relay, and its last connection has ended.
    Retired,
    /// The listener could not be watched or stopped accepting.
    Failed,
}

/// Accepts connections on one listener until retired (`target` becomes `None`), spawning a relay task
/// for each; once retired, waits for its open connections to end.
async fn accept_loop(
    listener: TcpListener,
    listen: SocketAddr,
    mut target: watch::Receiver<Option<SocketAddr>>,
    options: Options,
    permits: Arc<Semaphore>,
) -> LoopEnd {
    let mut acceptor = match Acceptor::new(listener, permits) {
        Ok(a) => a,
        Err(err) => {
            log!(Level::Error, "listen={listen}: cannot watch: {err}");
            return LoopEnd::Failed;
        }
    };
    // Owned here so that aborting this loop also aborts its connections.
    let mut connections = JoinSet::new();
    let report = |failure: AcceptFailure<'_>| match failure {
        // The client gave up between SYN and accept: nothing to do about it.
        AcceptFailure::PerConnection(err) => {
            log!(Level::Debug, "listen={listen}: accept: {err}");
        }
        AcceptFailure::BackingOff { error, first, .. } => {
            if first {
                log!(
                    Level::Warn,
                    "listen={listen}: accept failed, backing off: {error}"
                );
            }
        }
    };
    loop {
        let accepted = tokio::select! {
            accepted = acceptor.accept(&report) => accepted,
            // A dropped sender (the forwarder stopping) ends the loop like a retirement.
            changed = target.changed() => {
                if changed.is_err() || target.borrow().is_none() {
                    break;
                }
                continue;
            }
        };
        // The semaphore is never closed and the listener stays registered: `None` would mean no more
        // connections can be relayed, and the caller treats that as a failure.
        let Some(Accepted {
            stream,
            peer,
            permit,
        }) = accepted
        else {
            return LoopEnd::Failed;
        };
        let Some(to) = *target.borrow() else { break };
        let relay = Relay { listen, target: to };
        connections.spawn(async move {
            relay_connection(stream, peer, relay, options).await;
            drop(permit);
        });
        // Reap finished connections so the set does not grow with every connection ever relayed.
        while connections.try_join_next().is_some() {}
    }
    // Retired: the listener closes now (new connections are refused), open ones go on to their end.
    drop(acceptor);
    while connections.join_next().await.is_some() {}
    LoopEnd::Retired
}

/// Relays one accepted connection to `target` until both directions are done.
///
/// Half-close is kept: when one side shuts down its write half, the write half toward the other side is
/// shut down and the other direction keeps flowing (many protocols send a request, half-close, then read
/// the answer). When the target cannot be reached, or either side fails mid-stream, both sockets are
/// closed with a reset rather than a FIN, so that the other end sees an error and never mistakes a cut
/// stream for a complete one.
async fn relay_connection(mut client: TcpStream, peer: SocketAddr, relay: Relay, options: Options) {
    let connect = tokio::time::timeout(options.connect_timeout, TcpStream::connect(relay.target));
    let mut upstream = match connect.await {
        Ok(Ok(upstream)) => upstream,
        Ok(Err(err)) => {
            log!(
                Level::Warn,
                "peer={peer} {relay}: cannot connect to the target: {err}"
            );
            abort(&client);
            return;
        }
        Err(_) => {
            let timeout = options.connect_timeout;
            log!(
                Level::Warn,
                "peer={peer} {relay}: no connection to the target within {timeout:?}"
            );
            abort(&client);
            return;
        }
    };
    // Whatever arrives is forwarded at once; waiting for more (Nagle) only adds latency to the small
    // request/response exchanges that dominate (TLS handshakes, HTTP heads).
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let sizes = options.buffer_size;
    match copy_bidirectional_with_sizes(&mut client, &mut upstream, sizes, sizes).await {
        Ok((sent, received)) => {
            log!(
                Level::Debug,
                "peer={peer} {relay}: done, sent={sent} received={received}"
            );
        }
        Err(err) => {
            log!(
                Level::Debug,
                "peer={peer} {relay}: ended with an error: {err}"
            );
            abort(&client);
            abort(&upstream);
        }
    }
}

/// Makes the coming close of `stream` a reset (RST) instead of an orderly FIN.
fn abort(stream: &TcpStream) {
    // Failing to set it leaves an ordinary close, which is still a close.
    let _ = stream.set_zero_linger();
}
