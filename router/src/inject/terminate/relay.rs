//! The upstream-to-client half of a terminated exchange: the response head (after interim ones),
//! its body framed by its own headers, every byte through the secret scan; and the token endpoint's
//! response, read whole and rewritten by the store.

use std::sync::Arc;

use agent_sandbox_shared::logs;
use agent_sandbox_shared::HostName;
use tokio::io::{AsyncWriteExt as _, ReadHalf};
use tracing::warn;

use super::response::{
    bad_gateway, dechunk, parse_response, with_length, Body, Dechunker, ResponseFrame,
};
use super::{read_into, ClientWriter, End, UpstreamTls, MAX_TOKEN_BODY, READ};
use crate::fairness::{PeekBudgetSpent, PeekCharge};
use crate::inject::oauth_hook::{self, TokenFinish};
use crate::inject::scan::Scanner;
use crate::inject::Injector;
use crate::proxy::conn_log::ConnLog;
use crate::proxy::http::{BodyFramer, BodyLength};

/// The upstream-to-client half of an exchange.
pub(super) struct Relay<'r, 'p> {
    /// Reading the upstream.
    pub(super) up_r: &'r mut ReadHalf<UpstreamTls>,
    /// Upstream bytes read and not yet sent on.
    pub(super) rbuf: &'r mut Vec<u8>,
    /// Writing to the client.
    pub(super) client_w: &'r mut ClientWriter,
    /// The secret scan.
    pub(super) scanner: &'r mut Scanner,
    /// The connection's log.
    pub(super) log: &'r ConnLog,
    /// The SNI.
    pub(super) name: &'r HostName,
    /// For the secrets.
    pub(super) inject: &'r Arc<Injector>,
    /// What `rbuf` holds past one read's room (a large response head), charged to the router-wide
    /// budget for large heads, as the client's heads are.
    pub(super) peek: &'r mut PeekCharge<'p>,
}

impl Relay<'_, '_> {
    /// Reads a response head (after any interim ones) into `rbuf`.
    pub(super) async fn head(&mut self) -> Result<ResponseFrame, End> {
        loop {
            if let Some(frame) = parse_response(self.rbuf).map_err(|e| self.bad_upstream(&e))? {
                return Ok(frame);
            }
            if read_into(self.up_r, self.rbuf).await.map_err(|_| End)? == 0 {
                self.bad_upstream("the upstream closed before a complete response head");
                return Err(End);
            }
            if self
                .peek
                .hold(self.rbuf.capacity().saturating_sub(READ))
                .is_err()
            {
                // Nothing of this response has been sent (an interim answer may have been): the
                // client gets a 502 and the connection ends, the buffer let go first.
                *self.rbuf = Vec::new();
                self.bad_upstream(&format!("response head: {PeekBudgetSpent}"));
                self.write(&bad_gateway(
                    "the router's memory for large heads is in use; try again shortly",
                ))
                .await?;
                let _ = self.client_w.shutdown().await;
                return Err(End);
            }
        }
    }

    /// Takes a response head of `len` bytes out of `rbuf`, and gives back what a large head made it
    /// hold.
    pub(super) fn take_head(&mut self, len: usize) -> Vec<u8> {
        let head: Vec<u8> = self.rbuf.drain(..len).collect();
        if self.rbuf.capacity() > READ && self.rbuf.len() <= READ {
            self.rbuf.shrink_to(READ);
        }
        // `rbuf` grows only in `head`, which charges it, so this gives back and cannot fail.
        let _ = self.peek.hold(self.rbuf.capacity().saturating_sub(READ));
        head
    }

    /// The length of the next piece of a framed response body in `rbuf`, reading from the upstream when
    /// `rbuf` is empty; the upstream closing mid-body or breaking the framing ends the connection.
    pub(super) async fn body_part(&mut self, framer: &mut BodyFramer) -> Result<usize, End> {
        if self.rbuf.is_empty() && read_into(self.up_r, self.rbuf).await.map_err(|_| End)? == 0 {
            return Err(self.bad_upstream("the upstream closed mid-body"));
        }
        framer
            .advance(self.rbuf)
            .map_err(|e| self.bad_upstream(&e.to_string()))
    }

    /// Logs an upstream that broke HTTP framing.
    pub(super) fn bad_upstream(&self, why: &str) -> End {
        self.log.upstream_failed(self.name.as_str(), &why);
        End
    }

    /// Passes `data` through the scan: the bytes safe to send now, or the end of the connection (a
    /// real secret: logged, never its value).
    pub(super) fn scan(&mut self, data: &[u8]) -> Result<Vec<u8>, End> {
        self.scanner.push(data).map_err(|_| {
            warn!(
                { logs::CLIENT } = %self.log.client,
                { logs::NAME } = %self.name.as_str(),
                "{}",
                logs::SECRET_IN_RESPONSE
            );
            self.log.upstream_error("a real secret in the response");
            End
        })
    }

    /// Writes bytes to the client.
    pub(super) async fn write(&mut self, data: &[u8]) -> Result<(), End> {
        if !data.is_empty() {
            self.client_w.write_all(data).await.map_err(|_| End)?;
            self.log.down(data.len() as u64);
        }
        Ok(())
    }

    /// Sends `data` to the client through the scan.
    pub(super) async fn send(&mut self, data: &[u8]) -> Result<(), End> {
        let safe = self.scan(data)?;
        self.write(&safe).await
    }

    /// Sends body content to the client through the scan, as a chunk of its own.
    pub(super) async fn send_chunk(&mut self, content: &[u8]) -> Result<(), End> {
        let safe = self.scan(content)?;
        self.write_chunk(&safe).await
    }

    /// Writes one chunk (nothing for no bytes: an empty chunk would end the body).
    pub(super) async fn write_chunk(&mut self, data: &[u8]) -> Result<(), End> {
        if data.is_empty() {
            return Ok(());
        }
        let framed = [format!("{:x}\r\n", data.len()).as_bytes(), data, b"\r\n"].concat();
        self.write(&framed).await
    }

    /// Ends a response: releases what the scan held and flushes.
    pub(super) async fn end(&mut self) -> Result<(), End> {
        let rest = self.scanner.flush();
        self.write(&rest).await?;
        self.client_w.flush().await.map_err(|_| End)
    }

    /// Ends a chunked response: what the scan held as a last chunk, then the last-chunk marker (the
    /// upstream's trailers, if any, are not passed on).
    pub(super) async fn end_chunked(&mut self) -> Result<(), End> {
        let rest = self.scanner.flush();
        self.write_chunk(&rest).await?;
        self.write(b"0\r\n\r\n").await?;
        self.client_w.flush().await.map_err(|_| End)
    }

    /// Relays one response (interim ones first). `true`: the connection may go on.
    pub(super) async fn response(&mut self, is_head: bool) -> Result<bool, End> {
        self.scanner.set_secrets(self.inject.secrets());
        loop {
            let frame = self.head().await?;
            let head = self.take_head(frame.len);
            if frame.code == 101 {
                return Err(self.bad_upstream("the upstream switched protocols unasked"));
            }
            if frame.encoded {
                return self.refuse_encoded().await;
            }
            self.send(&head).await?;
            if (100..200).contains(&frame.code) {
                self.client_w.flush().await.map_err(|_| End)?;
                continue;
            }
            let body = if is_head || frame.code == 204 || frame.code == 304 {
                Body::Framed(BodyLength::None)
            } else {
                frame.body
            };
            match body {
                Body::Framed(length) => {
                    // A chunked body is scanned as the client reads it, without the chunk framing
                    // (a secret split across two chunks is contiguous to the client), and sent
                    // re-chunked.
                    let chunked = length == BodyLength::Chunked;
                    let mut framer = BodyFramer::new(length);
                    let mut dechunker = Dechunker::default();
                    while !framer.is_done() {
                        let n = self.body_part(&mut framer).await?;
                        let part: Vec<u8> = self.rbuf.drain(..n).collect();
                        if chunked {
                            let content = dechunker.push(&part);
                            self.send_chunk(&content).await?;
                        } else {
                            self.send(&part).await?;
                        }
                        // Streamed answers reach the client as they come.
                        self.client_w.flush().await.map_err(|_| End)?;
                    }
                    if chunked {
                        self.end_chunked().await?;
                    } else {
                        self.end().await?;
                    }
                    return Ok(!frame.close);
                }
                Body::UntilClose => {
                    loop {
                        let part = std::mem::take(self.rbuf);
                        if !part.is_empty() {
                            self.send(&part).await?;
                            self.client_w.flush().await.map_err(|_| End)?;
                        }
                        // What a large head made `rbuf` hold is let go once it is sent.
                        drop(part);
                        let _ = self.peek.hold(0);
                        if read_into(self.up_r, self.rbuf).await.unwrap_or(0) == 0 {
                            break;
                        }
                    }
                    self.end().await?;
                    return Ok(false);
                }
            }
        }
    }

    /// Refuses a response in a content or transfer coding (other than chunked): the router asked for
    /// identity and sent no TE, and an encoded body could carry a secret that neither the scan nor the
    /// token store's checks can read. The client gets a 502 and none of the response.
    pub(super) async fn refuse_encoded<T>(&mut self) -> Result<T, End> {
        self.bad_upstream("the upstream sent a content-encoded response the scan cannot read");
        self.write(&bad_gateway("the upstream's response was content-encoded"))
            .await?;
        let _ = self.client_w.shutdown().await;
        Err(End)
    }

    /// Reads a token endpoint's whole response, hands its body to the store, and sends the rewritten
    /// response with its new length.
    pub(super) async fn token_response(
        &mut self,
        exchange: Box<dyn TokenFinish>,
    ) -> Result<bool, End> {
        let frame = loop {
            let frame = self.head().await?;
            if frame.code == 101 {
                return Err(self.bad_upstream("the upstream switched protocols unasked"));
            }
            if (100..200).contains(&frame.code) {
                // Interim answers carry nothing of the store's; dropped (the body was sent whole).
                self.take_head(frame.len);
                continue;
            }
            break frame;
        };
        if frame.encoded {
            return self.refuse_encoded().await;
        }
        let head = self.take_head(frame.len);
        let mut raw = Vec::new();
        match frame.body {
            Body::Framed(length) => {
                let mut framer = BodyFramer::new(length);
                while !framer.is_done() {
                    let n = self.body_part(&mut framer).await?;
                    raw.extend(self.rbuf.drain(..n));
                    if raw.len() > 2 * MAX_TOKEN_BODY {
                        return Err(self.bad_upstream("token response body too large"));
                    }
                }
            }
            Body::UntilClose => loop {
                raw.append(self.rbuf);
                if raw.len() > 2 * MAX_TOKEN_BODY {
                    return Err(self.bad_upstream("token response body too large"));
                }
                if read_into(self.up_r, self.rbuf).await.unwrap_or(0) == 0 {
                    break;
                }
            },
        }
        let body = match frame.body {
            Body::Framed(BodyLength::Chunked) => dechunk(&raw)
                .ok_or_else(|| self.bad_upstream("malformed chunked token response"))?,
            _ => raw,
        };
        if body.len() > MAX_TOKEN_BODY {
            return Err(self.bad_upstream("token response body too large"));
        }
        let new_body = match oauth_hook::finish(exchange, frame.code, &body) {
            Ok(b) => b,
            Err(e) => {
                // Nothing of this response has been sent: the client gets a 502, not the tokens.
                self.bad_upstream(&format!("token response: {e}"));
                self.write(&bad_gateway("the token response could not be rewritten"))
                    .await?;
                let _ = self.client_w.shutdown().await;
                return Err(End);
            }
        };
        let head = with_length(&head, new_body.len());
        self.scanner.set_secrets(self.inject.secrets());
        self.send(&head).await?;
        self.send(&new_body).await?;
        self.end().await?;
        Ok(!frame.close && !matches!(frame.body, Body::UntilClose))
    }
}
