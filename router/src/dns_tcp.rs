//! DNS over TCP: the same strict parser and decision as the UDP fast path, under the same connection caps
//! as every other TCP listener.
//!
//! How it fits: the accept loop hands each connection here once it holds a global connection permit and
//! a per-client slot (a DNS client at its cap is closed at once, like any other). Each message is a 2-byte
//! length and a query, answered by [`crate::dns_udp::respond`], so TCP and UDP cannot disagree. Bounds:
//! the next query must arrive within the idle time (the peek timeout) of the last answer; and however
//! many queries came before, a connection answers at most [`MAX_QUERIES`] and lives at most
//! [`MAX_LIFETIME`], so a client trickling one query just inside the idle time cannot hold a descriptor
//! for ever. A message that is not a query (a response, a runt) ends the connection.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::time::{timeout_at, Instant};
use tracing::debug;

use crate::dns::DnsHandler;
use crate::dns_udp::{respond, MAX_DATAGRAM};

/// The most queries answered on one connection.
pub(crate) const MAX_QUERIES: u32 = 100;

/// The longest a connection is kept, however busy.
pub(crate) const MAX_LIFETIME: Duration = Duration::from_secs(60);

/// Why a DNS-over-TCP connection ended (for the debug log and tests).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum End {
    /// The client closed it between queries.
    Closed,
    /// No complete query within the idle time.
    Idle,
    /// [`MAX_QUERIES`] answered.
    QueryLimit,
    /// [`MAX_LIFETIME`] reached.
    Lifetime,
    /// A message that gets no answer (a response, a runt, length 0).
    Unanswerable,
    /// A message announced longer than any query ([`MAX_DATAGRAM`], the UDP listener's bound).
    TooLong,
    /// A read or write error.
    Error,
}

/// Serves one DNS-over-TCP connection until one of the [`End`]s.
pub(crate) async fn serve_connection(
    mut stream: TcpStream,
    client: SocketAddr,
    handler: &DnsHandler,
    idle: Duration,
) -> End {
    let end_of_life = Instant::now() + MAX_LIFETIME;
    let mut message = Vec::with_capacity(512);
    let mut reply = Vec::with_capacity(512);
    let mut answered = 0u32;
    let end = loop {
        if answered >= MAX_QUERIES {
            break End::QueryLimit;
        }
        let deadline = (Instant::now() + idle).min(end_of_life);
        let read = timeout_at(deadline, read_message(&mut stream, &mut message)).await;
        let len = match read {
            Err(_) if Instant::now() >= end_of_life => break End::Lifetime,
            Err(_) => break End::Idle,
            Ok(Err(ReadEnd::Closed)) => break End::Closed,
            Ok(Err(ReadEnd::Error)) => break End::Error,
            Ok(Err(ReadEnd::TooLong)) => break End::TooLong,
            Ok(Ok(len)) => len,
        };
        if len == 0 || !respond(handler, &message, client, &mut reply) {
            break End::Unanswerable;
        }
        let Ok(reply_len) = u16::try_from(reply.len()) else {
            break End::Error;
        };
        let mut framed = Vec::with_capacity(2 + reply.len());
        framed.extend_from_slice(&reply_len.to_be_bytes());
        framed.extend_from_slice(&reply);
        // A client that does not read its answers is idle too.
        match timeout_at(deadline, stream.write_all(&framed)).await {
            Ok(Ok(())) => answered += 1,
            _ => break End::Error,
        }
    };
    debug!(%client, ?end, answered, "DNS over TCP connection closed");
    end
}

/// How reading a message failed.
enum ReadEnd {
    /// EOF before the length prefix: an orderly close.
    Closed,
    /// EOF inside a message, or an I/O error.
    Error,
    /// The length prefix announces more than [`MAX_DATAGRAM`].
    TooLong,
}

/// Reads one length-prefixed message into `buf`; returns its length. A query is at most
/// [`MAX_DATAGRAM`] bytes, as over UDP (a stub's query is a few hundred): a longer announced length
/// ends the connection, so one costs at most that much buffer. The buffer grows as the bytes arrive,
/// not to the announced length.
async fn read_message<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut Vec<u8>,
) -> Result<usize, ReadEnd> {
    let mut prefix = [0u8; 2];
    match stream.read_exact(&mut prefix[..1]).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(ReadEnd::Closed),
        Err(_) => return Err(ReadEnd::Error),
    }
    stream
        .read_exact(&mut prefix[1..])
        .await
        .map_err(|_| ReadEnd::Error)?;
    let len = usize::from(u16::from_be_bytes(prefix));
    if len > MAX_DATAGRAM {
        return Err(ReadEnd::TooLong);
    }
    buf.clear();
    let read = (&mut *stream)
        .take(len as u64)
        .read_to_end(buf)
        .await
        .map_err(|_| ReadEnd::Error)?;
    if read < len {
        return Err(ReadEnd::Error);
    }
    Ok(len)
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;
    use std::sync::Arc;

    use agent_sandbox_shared::{Allowlist, Policy, RouterConfig};
    use tokio::net::TcpListener;

    use super::*;
    use crate::metrics::Metrics;

    fn handler() -> DnsHandler {
        let list = Allowlist::parse("a.example\n", "test").unwrap();
        let config = RouterConfig::from_policy(&Policy::new(&list), Ipv4Addr::new(10, 0, 0, 1))
            .validate()
            .unwrap();
        DnsHandler::new(
            crate::live::Live::new(config.rules.clone()),
            Arc::new(Metrics::new()),
        )
    }

    /// A query for `a.example. A` with id 7, length-prefixed.
    fn query() -> Vec<u8> {
        let mut q = vec![0, 7, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, b'a', 7];
        q.extend_from_slice(b"example");
        q.extend_from_slice(&[0, 0, 1, 0, 1]);
        let mut framed = u16::try_from(q.len()).unwrap().to_be_bytes().to_vec();
        framed.extend_from_slice(&q);
        framed
    }

    /// A message announced as 4,096 bytes of which 10 have come: the buffer holds what came, not
    /// what was announced (it was resized to the announced length before, up to 64 KiB per connection
    /// that sent two bytes). A longer announcement ends the connection at once.
    #[tokio::test]
    async fn the_buffer_grows_with_the_bytes_not_the_prefix() {
        let (mut client, mut server) = tokio::io::duplex(1024);
        let mut buf = Vec::new();
        for too_long in [[0xff, 0xff], [0x10, 0x01]] {
            client.write_all(&too_long).await.unwrap();
            // Refused from the prefix alone: without the cap the read would wait for the bytes.
            let read = tokio::time::timeout(
                std::time::Duration::from_secs(5),
                read_message(&mut server, &mut buf),
            )
            .await;
            assert!(matches!(read, Ok(Err(ReadEnd::TooLong))), "{too_long:?}");
            assert_eq!(buf.capacity(), 0);
        }
        client.write_all(&[0x10, 0x00]).await.unwrap();
        client.write_all(&[7; 10]).await.unwrap();
        let mut buf = Vec::new();
        {
            let read = std::pin::pin!(read_message(&mut server, &mut buf));
            let waker = std::task::Waker::noop();
            let polled =
                std::future::Future::poll(read, &mut std::task::Context::from_waker(waker));
            assert!(polled.is_pending(), "the rest has not come");
        }
        assert_eq!(buf, [7; 10]);
        assert!(buf.capacity() < 1024, "{}", buf.capacity());
        // Whole, and cut short.
        let mut buf = Vec::new();
        client.write_all(&[0, 3, 1, 2, 3]).await.unwrap();
        assert!(matches!(read_message(&mut server, &mut buf).await, Ok(3)));
        assert_eq!(buf, [1, 2, 3]);
        client.write_all(&[0, 9, 1, 2]).await.unwrap();
        drop(client);
        assert!(matches!(
            read_message(&mut server, &mut buf).await,
            Err(ReadEnd::Error)
        ));
    }

    /// A connected pair: the client's stream, and the server side's end.
    async fn pair() -> (TcpStream, TcpStream, SocketAddr) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, peer) = listener.accept().await.unwrap();
        (client, server, peer)
    }

    async fn read_reply(client: &mut TcpStream) -> Vec<u8> {
        let mut len = [0u8; 2];
        client.read_exact(&mut len).await.unwrap();
        let mut reply = vec![0; usize::from(u16::from_be_bytes(len))];
        client.read_exact(&mut reply).await.unwrap();
        reply
    }

    #[tokio::test]
    async fn answers_several_queries_then_closes_on_eof() {
        let (mut client, server, peer) = pair().await;
        let h = handler();
        let serving = serve_connection(server, peer, &h, Duration::from_secs(5));
        let asking = async {
            for _ in 0..3 {
                client.write_all(&query()).await.unwrap();
                let reply = read_reply(&mut client).await;
                assert_eq!(&reply[..2], &[0, 7]);
                assert_eq!(&reply[reply.len() - 4..], &[10, 0, 0, 1]);
            }
            drop(client);
        };
        let (end, ()) = tokio::join!(serving, asking);
        assert_eq!(end, End::Closed);
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_is_closed() {
        let (_client, server, peer) = pair().await;
        let h = handler();
        assert_eq!(
            serve_connection(server, peer, &h, Duration::from_secs(10)).await,
            End::Idle
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_trickle_of_queries_cannot_hold_the_connection() {
        let (mut client, server, peer) = pair().await;
        let h = handler();
        let idle = Duration::from_secs(10);
        let started = Instant::now();
        let serving = async {
            let end = serve_connection(server, peer, &h, idle).await;
            (end, started.elapsed())
        };
        let trickling = async {
            // One query every 9 s, inside the idle time, for longer than the lifetime.
            for _ in 0..(MAX_LIFETIME.as_secs() / 9 + 2) {
                if client.write_all(&query()).await.is_err() {
                    return;
                }
                let mut len = [0u8; 2];
                if client.read_exact(&mut len).await.is_err() {
                    return;
                }
                let mut reply = vec![0; usize::from(u16::from_be_bytes(len))];
                let _ = client.read_exact(&mut reply).await;
                tokio::time::sleep(Duration::from_secs(9)).await;
            }
        };
        let ((end, took), ()) = tokio::join!(serving, trickling);
        assert_eq!(end, End::Lifetime);
        assert!(took <= MAX_LIFETIME + Duration::from_secs(1), "{took:?}");
    }

    #[tokio::test]
    async fn the_query_limit_ends_a_busy_connection() {
        let (mut client, server, peer) = pair().await;
        let h = handler();
        let serving = serve_connection(server, peer, &h, Duration::from_secs(5));
        let asking = async {
            for _ in 0..MAX_QUERIES {
                client.write_all(&query()).await.unwrap();
                read_reply(&mut client).await;
            }
            // The connection is closed after the last answer.
            let mut rest = Vec::new();
            client.read_to_end(&mut rest).await.unwrap();
            assert!(rest.is_empty());
        };
        let (end, ()) = tokio::join!(serving, asking);
        assert_eq!(end, End::QueryLimit);
    }

    #[tokio::test]
    async fn a_response_or_a_runt_ends_the_connection() {
        for bad in [
            vec![0u8, 3, 1, 2, 3],
            {
                let mut r = query();
                r[4] |= 0x80; // QR set: a response
                r
            },
            vec![0, 0],
        ] {
            let (mut client, server, peer) = pair().await;
            let h = handler();
            client.write_all(&bad).await.unwrap();
            assert_eq!(
                serve_connection(server, peer, &h, Duration::from_secs(5)).await,
                End::Unanswerable
            );
        }
    }
}
