//! The accept loop's one step, shared by the router and the forwarder (cargo feature `net`).
//!
//! How it fits: each listener of either binary owns an [`Acceptor`] and calls [`Acceptor::accept`] in its
//! loop; what to do with a connection (and with shutdown) stays with the caller. The design, in order:
//!
//! 1. Wait until the listening socket has a connection queued.
//! 2. Take a connection permit from the cap shared by every listener. While none is free nothing more is
//!    accepted, so the excess waits in the kernel's backlog (bounded memory and descriptors), and a quiet
//!    listener holds no permit (taking one before step 1 would park a permit in every idle listener and
//!    starve the busy one when the cap is small).
//! 3. Accept. Errors that concern only that connection (the client gave up between SYN and accept) are
//!    skipped; errors that mean the process or the system is out of descriptors or memory (EMFILE,
//!    ENFILE, ENOBUFS, ENOMEM) give the permit back and pause, the pause doubling up to
//!    [`MAX_ACCEPT_BACKOFF`], since retrying at once would spin on the same error.
//!
//! The cap per client belongs after `accept`, where the peer is known: the router's accept loop takes the
//! client's slot there, and for a client at its cap closes the connection at once and drops the permit.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The first pause after a resource-exhaustion error from `accept`.
pub const FIRST_ACCEPT_BACKOFF: Duration = Duration::from_millis(10);
/// The longest pause between two accept attempts while the process is out of a resource.
pub const MAX_ACCEPT_BACKOFF: Duration = Duration::from_secs(1);

/// An accepted connection and the permit it holds until it is dropped.
#[derive(Debug)]
pub struct Accepted {
    /// The client's stream, registered with the current runtime.
    pub stream: TcpStream,
    /// The client's address.
    pub peer: SocketAddr,
    /// This connection's share of the cap: drop it when the connection ends.
    pub permit: OwnedSemaphorePermit,
}

/// An accept error the caller may want to log.
#[derive(Debug)]
pub enum AcceptFailure<'a> {
    /// The connection went away before it was accepted; the loop goes on at once.
    PerConnection(&'a io::Error),
    /// Out of descriptors or memory (or an error of the listener itself): the loop pauses for `pause`.
    BackingOff {
        /// The error.
        error: &'a io::Error,
        /// How long the loop now pauses.
        pause: Duration,
        /// Whether this is the first failure since the last success (log it louder).
        first: bool,
    },
}

/// One listener's side of the accept loop.
#[derive(Debug)]
pub struct Acceptor {
    /// The listening socket, watched for readiness apart from accepting (see the module doc, step 2).
    listener: AsyncFd<std::net::TcpListener>,
    /// The connection cap shared with the other listeners.
    permits: Arc<Semaphore>,
    /// The pause after the next resource error; reset by every success.
    backoff: Duration,
}

impl Acceptor {
    /// Takes over `listener` (it must belong to the current runtime) under the shared cap `permits`.
    pub fn new(listener: TcpListener, permits: Arc<Semaphore>) -> io::Result<Acceptor> {
        // into_std leaves the socket non-blocking, which AsyncFd needs.
        let listener = listener.into_std()?;
        // SAFETY: the AsyncFd owns the std listener, which owns its descriptor and returns that same
        // descriptor from every as_raw_fd() until it is dropped with the AsyncFd.
        let listener = unsafe { AsyncFd::register_with_interest(listener, Interest::READABLE) }?;
        Ok(Acceptor {
            listener,
            permits,
            backoff: FIRST_ACCEPT_BACKOFF,
        })
    }

    /// The listening address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.get_ref().local_addr()
    }

    /// The next connection, under a permit. `report` hears every accept error. `None` only when the
    /// semaphore is closed or the listener can no longer be polled: no connection can be accepted again.
    ///
    /// Cancel-safe: dropping the future drops any permit it held and accepts nothing.
    pub async fn accept(&mut self, mut report: impl FnMut(AcceptFailure<'_>)) -> Option<Accepted> {
        loop {
            let mut ready = self.listener.readable().await.ok()?;
            let permit = Arc::clone(&self.permits).acquire_owned().await.ok()?;
            let error = match ready.try_io(|l| accept_nonblocking(l.get_ref())) {
                // Another accept took it (or a spurious wake-up): wait again, permit given back.
                Err(_would_block) => continue,
                Ok(Ok((stream, peer))) => match TcpStream::from_std(stream) {
                    Ok(stream) => {
                        self.backoff = FIRST_ACCEPT_BACKOFF;
                        return Some(Accepted {
                            stream,
                            peer,
                            permit,
                        });
                    }
                    Err(e) => e,
                },
                Ok(Err(e)) => e,
            };
            drop(ready);
            drop(permit);
            if is_per_connection(&error) {
                report(AcceptFailure::PerConnection(&error));
                continue;
            }
            let pause = self.backoff;
            report(AcceptFailure::BackingOff {
                error: &error,
                pause,
                first: pause == FIRST_ACCEPT_BACKOFF,
            });
            tokio::time::sleep(pause).await;
            self.backoff = (pause * 2).min(MAX_ACCEPT_BACKOFF);
        }
    }
}

/// `accept4(2)` with `SOCK_NONBLOCK | SOCK_CLOEXEC`: the stream comes out ready for the runtime, where
/// std's `accept` followed by `set_nonblocking` costs a second system call per connection.
fn accept_nonblocking(
    listener: &std::net::TcpListener,
) -> io::Result<(std::net::TcpStream, SocketAddr)> {
    let (socket, peer) = socket2::SockRef::from(listener).accept4(libc::SOCK_NONBLOCK)?;
    let peer = peer
        .as_socket()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "accepted a non-IP peer"))?;
    Ok((socket.into(), peer))
}

/// Accept errors that concern only the connection being accepted, not the listener or the process.
#[must_use]
pub fn is_per_connection(err: &io::Error) -> bool {
    matches!(
        err.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// At the cap, a queued connection is not accepted until a permit comes back; a quiet listener holds
    /// no permit meanwhile.
    #[tokio::test]
    async fn permits_gate_accepts_and_idle_listeners_hold_none() {
        let permits = Arc::new(Semaphore::new(1));
        let quiet = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut quiet = Acceptor::new(quiet, Arc::clone(&permits)).unwrap();
        let busy = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut busy = Acceptor::new(busy, Arc::clone(&permits)).unwrap();
        let idle = tokio::spawn(async move { quiet.accept(|_| {}).await.map(|a| a.peer) });

        let addr = busy.local_addr().unwrap();
        let _c1 = TcpStream::connect(addr).await.unwrap();
        let first = tokio::time::timeout(Duration::from_secs(5), busy.accept(|_| {}))
            .await
            .expect("the idle listener must not hold the only permit")
            .unwrap();
        let _c2 = TcpStream::connect(addr).await.unwrap();
        assert!(
            tokio::time::timeout(Duration::from_millis(200), busy.accept(|_| {}))
                .await
                .is_err(),
            "accepted past the cap"
        );
        drop(first);
        let second = tokio::time::timeout(Duration::from_secs(5), busy.accept(|_| {}))
            .await
            .expect("accepted once the permit is back")
            .unwrap();
        assert_eq!(second.stream.local_addr().unwrap(), addr);
        assert!(!idle.is_finished());
        idle.abort();
    }

    #[test]
    fn per_connection_errors() {
        assert!(is_per_connection(&io::ErrorKind::ConnectionAborted.into()));
        assert!(!is_per_connection(&io::Error::from_raw_os_error(24))); // EMFILE
    }
}
