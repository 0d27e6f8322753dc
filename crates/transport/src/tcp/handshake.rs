//! The handshake a connecting rank sends before any frame, and its checks.

use std::io::Read;
use std::net::TcpStream;
use std::time::Duration;

use super::frame::{Hello, HelloKind, HELLO_FIXED_LEN};
use super::TcpConfig;

/// Reads and checks a handshake; a stranger gets at most a short deadline.
pub(super) fn read_hello(
    stream: &mut TcpStream,
    cfg: &TcpConfig,
    want: HelloKind,
) -> std::result::Result<Hello, String> {
    let limit = cfg.timeout.min(Duration::from_secs(5));
    stream
        .set_read_timeout(Some(limit))
        .map_err(|e| e.to_string())?;
    let mut fixed = [0u8; HELLO_FIXED_LEN];
    stream
        .read_exact(&mut fixed)
        .map_err(|e| format!("handshake unreadable ({e})"))?;
    let (mut hello, token_len) =
        Hello::decode_fixed(&fixed).map_err(|e| format!("malformed handshake ({e:?})"))?;
    let mut token = vec![0u8; token_len];
    stream
        .read_exact(&mut token)
        .map_err(|e| format!("handshake token unreadable ({e})"))?;
    if !constant_time_eq(&token, cfg.token.as_bytes()) {
        return Err("wrong token".into());
    }
    hello.token = token;
    if hello.kind != want {
        return Err(format!("unexpected handshake kind {:?}", hello.kind));
    }
    if hello.world_size as usize != cfg.world_size {
        return Err(format!(
            "world size {} differs from ours ({})",
            hello.world_size, cfg.world_size
        ));
    }
    if hello.rank == 0 || hello.rank as usize >= cfg.world_size {
        return Err(format!("rank {} out of range", hello.rank));
    }
    Ok(hello)
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
