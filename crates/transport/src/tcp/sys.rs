//! System calls and socket options: deadlines on connect and accept, `poll(2)`, buffer sizes.

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use super::rendezvous;
use crate::{Error, Result};

pub(super) fn remaining(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1))
}

/// Connects to `addr`, retrying while it refuses (its listener may not be up yet).
pub(super) fn connect_before(
    addr: SocketAddr,
    deadline: Instant,
    peer: usize,
) -> Result<TcpStream> {
    loop {
        match TcpStream::connect_timeout(&addr, remaining(deadline)) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() >= deadline => {
                return Err(Error::Rendezvous {
                    reason: format!("cannot reach rank {peer} at {addr}: {e}"),
                })
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Accepts one connection before the deadline (the listener is polled, never blocks past it).
pub(super) fn accept_before(
    listener: &TcpListener,
    deadline: Instant,
    why_late: impl Fn() -> String,
) -> Result<(TcpStream, SocketAddr)> {
    listener
        .set_nonblocking(true)
        .map_err(|e| rendezvous(format!("listener: {e}")))?;
    loop {
        match listener.accept() {
            Ok((s, a)) => {
                s.set_nonblocking(false)
                    .map_err(|e| rendezvous(format!("accepted socket: {e}")))?;
                return Ok((s, a));
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(rendezvous(why_late()));
                }
                let mut fd = libc::pollfd {
                    fd: listener.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                let ms = remaining(deadline).as_millis().clamp(1, 100) as i32;
                // SAFETY: one valid pollfd that outlives the call.
                unsafe { libc::poll(&mut fd, 1, ms) };
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(rendezvous(format!("accept: {e}"))),
        }
    }
}

pub(super) fn set_buffers(s: &TcpStream, size: usize) {
    let v = size.min(i32::MAX as usize) as libc::c_int;
    for opt in [libc::SO_SNDBUF, libc::SO_RCVBUF] {
        // SAFETY: a valid socket fd, a pointer to a live c_int and its exact size.
        unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&v as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    }
}
