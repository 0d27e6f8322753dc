//! System calls and socket options: deadlines on connect and accept, `poll(2)`, buffer sizes.

use std::io::{self, Read};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

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

/// Waits for `fds` with `poll(2)` for at most `wait` (at least 1 ms, at most 100 ms so
/// callers recheck their deadlines); an interrupted wait counts as a wake-up.
pub(super) fn poll(fds: &mut [libc::pollfd], wait: Duration) -> io::Result<()> {
    let ms = wait.as_millis().clamp(1, 100) as i32;
    // SAFETY: `fds` is a valid, initialised slice of pollfd structs that outlives the call;
    // poll only writes their `revents` fields.
    let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    Ok(())
}

/// Fills `buf` from a blocking stream before `deadline`, however slowly the bytes come
/// (each read's timeout is what is left of the whole deadline).
pub(super) fn read_exact_before(
    stream: &mut TcpStream,
    buf: &mut [u8],
    deadline: Instant,
) -> io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        if Instant::now() >= deadline {
            return Err(io::ErrorKind::TimedOut.into());
        }
        stream.set_read_timeout(Some(remaining(deadline)))?;
        match stream.read(&mut buf[got..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(k) => got += k,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(e),
        }
    }
    stream.set_read_timeout(None)
}

/// Reads what the socket has (up to the spare capacity of `v`, at most `max` bytes) into
/// `v`'s spare capacity and extends `v` by it: a receive into a growing buffer without first
/// zeroing the bytes it is about to overwrite. `Ok(0)`: the peer closed the connection.
pub(super) fn read_into_spare(s: &TcpStream, v: &mut Vec<u8>, max: usize) -> io::Result<usize> {
    let spare = v.spare_capacity_mut();
    let n = spare.len().min(max);
    // SAFETY: `spare` is `n` or more bytes of `v`'s allocation past its length, valid for
    // writes; recv(2) writes at most `n` bytes there and returns how many it wrote.
    let got = unsafe { libc::recv(s.as_raw_fd(), spare.as_mut_ptr().cast(), n, 0) };
    if got < 0 {
        return Err(io::Error::last_os_error());
    }
    let got = got as usize;
    // SAFETY: recv initialised the first `got` (<= n) spare bytes.
    unsafe { v.set_len(v.len() + got) };
    Ok(got)
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
