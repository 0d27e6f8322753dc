//! One shard's connection ([`Conn`]): connecting, the token handshake, registering, and a
//! single attempt at a request (its reply matched by request id).

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use super::ClientConfig;
use crate::auth::Peer;
use crate::wire::{read_frame, ReadError, Request, Response};

/// Why one attempt at a request failed (the client retries until its deadline, then reports
/// the last of these in [`Error::Timeout`]).
#[derive(Debug, thiserror::Error)]
pub(super) enum AttemptError {
    /// The TCP connection could not be made.
    #[error("connect: {0}")]
    Connect(std::io::Error),
    /// The token handshake failed.
    #[error("handshake: {0}")]
    Handshake(gradwire_transport::tcp::service::ServiceAuthError),
    /// The shard refused this worker's registration.
    #[error("hello refused: {0}")]
    HelloRefused(String),
    /// The socket's timeouts could not be set.
    #[error("socket: {0}")]
    Socket(std::io::Error),
    /// The request could not be written.
    #[error("send: {0}")]
    Send(std::io::Error),
    /// The shard closed the connection.
    #[error("connection closed by the shard")]
    Closed,
    /// The reply did not arrive or could not be read.
    #[error("reply: {0}")]
    Reply(ReadError),
}

/// One shard's connection and its counters.
pub(super) struct Conn {
    pub(super) shard: usize,
    pub(super) addr: SocketAddr,
    pub(super) stream: Option<TcpStream>,
    pub(super) next_rid: u64,
    pub(super) next_seq: u64,
    pub(super) body: Vec<u8>,
    pub(super) hello: Vec<u8>,
    /// Frame bytes written to the shard (every attempt, hellos included).
    pub(super) sent: u64,
    /// Frame bytes read from the shard (headers included).
    pub(super) received: u64,
}

impl Conn {
    pub(super) fn new(shard: usize, addr: SocketAddr, cfg: &ClientConfig) -> Self {
        let mut hello = Vec::new();
        Request::Hello {
            worker: cfg.worker,
            incarnation: cfg.incarnation,
        }
        .encode(0, &mut hello);
        Conn {
            shard,
            addr,
            stream: None,
            next_rid: 1,
            next_seq: 0,
            body: Vec::new(),
            hello,
            sent: 0,
            received: 0,
        }
    }

    /// One attempt: send `frame` (its rid patched) and read the matching reply.
    pub(super) fn attempt(
        &mut self,
        frame: &mut [u8],
        cfg: &ClientConfig,
        timeout: Duration,
    ) -> std::result::Result<Response, AttemptError> {
        if self.stream.is_none() {
            let mut s = TcpStream::connect_timeout(&self.addr, cfg.connect_timeout)
                .map_err(AttemptError::Connect)?;
            let _ = s.set_nodelay(true);
            let peer = Peer {
                worker: cfg.worker,
                role: cfg.role,
            };
            let limit = timeout.min(crate::server::DEFAULT_HANDSHAKE_TIMEOUT);
            crate::auth::connect(&mut s, &cfg.token, peer, Instant::now() + limit)
                .map_err(AttemptError::Handshake)?;
            self.stream = Some(s);
            // Register on every new connection (a restarted shard learns us again).
            let mut hello = std::mem::take(&mut self.hello);
            let r = self.exchange(&mut hello, timeout, cfg);
            self.hello = hello;
            match r? {
                Response::Error(e) if !e.code.is_protocol() => return Ok(Response::Error(e)),
                Response::Error(e) => return Err(AttemptError::HelloRefused(e.message)),
                _ => {}
            }
        }
        self.exchange(frame, timeout, cfg)
    }

    fn exchange(
        &mut self,
        frame: &mut [u8],
        timeout: Duration,
        cfg: &ClientConfig,
    ) -> std::result::Result<Response, AttemptError> {
        let rid = self.next_rid;
        self.next_rid += 1;
        frame[16..24].copy_from_slice(&rid.to_le_bytes());
        let stream = self.stream.as_mut().expect("connected");
        stream
            .set_write_timeout(Some(timeout))
            .map_err(AttemptError::Socket)?;
        stream
            .set_read_timeout(Some(timeout))
            .map_err(AttemptError::Socket)?;
        stream.write_all(frame).map_err(AttemptError::Send)?;
        self.sent += frame.len() as u64;
        loop {
            let h = match read_frame(stream, cfg.max_body, &mut self.body) {
                Ok(h) => h,
                Err(ReadError::Closed) => return Err(AttemptError::Closed),
                Err(e) => return Err(AttemptError::Reply(e)),
            };
            self.received += (crate::wire::HEADER_LEN + self.body.len()) as u64;
            if h.rid != rid && h.rid != 0 {
                continue; // a late reply to an earlier attempt
            }
            if h.rid == 0 {
                // Request id 0: the shard's word on the connection itself (busy, or our
                // frame could not be read), never a reply to an earlier attempt.
                match Response::decode(&h, &self.body) {
                    Ok(r @ Response::Error(_)) => return Ok(r),
                    _ => continue,
                }
            }
            return Response::decode(&h, &self.body)
                .map_err(|e| AttemptError::Reply(ReadError::Wire(e)));
        }
    }
}
