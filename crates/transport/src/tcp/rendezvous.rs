//! Rendezvous: rank 0 collects every rank's handshake and listening address, then sends
//! the address table back; ranks > 0 connect to the lower ranks and accept the higher ones.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::time::Instant;

use super::frame::{Hello, HelloKind, MAGIC_TABLE, TABLE_ENTRY_LEN};
use super::handshake::read_hello;
use super::sys::{accept_before, connect_before, remaining};
use super::{check_cfg, rendezvous, Tcp, TcpConfig};
use crate::{Error, Op, Result};

impl Tcp {
    /// Rank 0's side of the rendezvous on an already-bound listener (lets tests bind port 0).
    pub fn connect_rank0(listener: TcpListener, cfg: &TcpConfig) -> Result<Tcp> {
        check_cfg(cfg)?;
        let n = cfg.world_size;
        let mut peers: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();
        let mut addrs: Vec<Option<SocketAddr>> = vec![None; n];
        addrs[0] = Some(
            listener
                .local_addr()
                .map_err(|e| rendezvous(format!("listener address: {e}")))?,
        );
        let deadline = Instant::now() + cfg.timeout;
        let mut missing = n - 1;
        while missing > 0 {
            let (mut stream, from) = accept_before(&listener, deadline, || {
                let absent: Vec<String> = (1..n)
                    .filter(|&r| peers[r].is_none())
                    .map(|r| r.to_string())
                    .collect();
                format!(
                    "rank(s) {} did not join within {:?}",
                    absent.join(", "),
                    cfg.timeout
                )
            })?;
            match read_hello(&mut stream, cfg, HelloKind::Hello) {
                Ok(h) => {
                    let r = h.rank as usize;
                    if peers[r].is_some() {
                        tracing::warn!(%from, rank = r, "refused a second connection claiming rank {r}");
                        continue;
                    }
                    addrs[r] = Some(SocketAddr::new(from.ip(), h.port));
                    peers[r] = Some(stream);
                    missing -= 1;
                }
                Err(why) => tracing::warn!(%from, "refused a connection at rendezvous: {why}"),
            }
        }
        // Everyone is here: send the table of listening addresses.
        let mut table = MAGIC_TABLE.to_le_bytes().to_vec();
        for a in &addrs {
            encode_addr(&mut table, a.expect("all ranks joined"));
        }
        for (r, p) in peers.iter_mut().enumerate() {
            if let Some(s) = p {
                s.write_all(&table).map_err(|e| Error::Io {
                    peer: r,
                    op: Op::Connect,
                    source: e,
                })?;
            }
        }
        Self::finish(cfg, peers)
    }

    pub(super) fn connect_other(cfg: &TcpConfig) -> Result<Tcp> {
        check_cfg(cfg)?;
        let n = cfg.world_size;
        let deadline = Instant::now() + cfg.timeout;
        // Our own listener, on the interface that reaches rank 0, port 0.
        let mut master = connect_before(cfg.master, deadline, 0)?;
        let local_ip = master
            .local_addr()
            .map(|a| a.ip())
            .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
        let listener = TcpListener::bind(SocketAddr::new(local_ip, 0))
            .map_err(|e| rendezvous(format!("cannot listen on {local_ip}: {e}")))?;
        let port = listener
            .local_addr()
            .map_err(|e| rendezvous(format!("listener address: {e}")))?
            .port();
        let hello = Hello {
            kind: HelloKind::Hello,
            rank: cfg.rank as u32,
            world_size: n as u32,
            port,
            token: cfg.token.as_bytes().to_vec(),
        };
        master.write_all(&hello.encode()).map_err(|e| Error::Io {
            peer: 0,
            op: Op::Connect,
            source: e,
        })?;
        // Wait for the table (rank 0 sends it once all ranks are in).
        master.set_read_timeout(Some(remaining(deadline))).ok();
        let mut table = vec![0u8; 4 + n * TABLE_ENTRY_LEN];
        master.read_exact(&mut table).map_err(|e| match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Error::Rendezvous {
                reason: format!(
                    "rank 0 did not complete the rendezvous within {:?} (a rank missing?)",
                    cfg.timeout
                ),
            },
            io::ErrorKind::UnexpectedEof => Error::Rendezvous {
                reason: "rank 0 closed the connection (wrong token or world size?)".into(),
            },
            _ => Error::Io {
                peer: 0,
                op: Op::Connect,
                source: e,
            },
        })?;
        if u32::from_le_bytes([table[0], table[1], table[2], table[3]]) != MAGIC_TABLE {
            return Err(rendezvous("rank 0 sent a malformed address table".into()));
        }
        let addrs: Vec<SocketAddr> = table[4..]
            .chunks_exact(TABLE_ENTRY_LEN)
            .map(decode_addr)
            .collect();
        let mut peers: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();
        peers[0] = Some(master);
        // Connect to lower ranks > 0.
        for (r, addr) in addrs.iter().enumerate().take(cfg.rank).skip(1) {
            let mut s = connect_before(*addr, deadline, r)?;
            let join = Hello {
                kind: HelloKind::Join,
                port: 0,
                ..hello.clone()
            };
            s.write_all(&join.encode()).map_err(|e| Error::Io {
                peer: r,
                op: Op::Connect,
                source: e,
            })?;
            peers[r] = Some(s);
        }
        // Accept higher ranks.
        let mut missing = n - 1 - cfg.rank;
        while missing > 0 {
            let (mut stream, from) = accept_before(&listener, deadline, || {
                let absent: Vec<String> = (cfg.rank + 1..n)
                    .filter(|&r| peers[r].is_none())
                    .map(|r| r.to_string())
                    .collect();
                format!(
                    "rank(s) {} did not connect to rank {} within {:?}",
                    absent.join(", "),
                    cfg.rank,
                    cfg.timeout
                )
            })?;
            match read_hello(&mut stream, cfg, HelloKind::Join) {
                Ok(h) if (h.rank as usize) > cfg.rank && peers[h.rank as usize].is_none() => {
                    peers[h.rank as usize] = Some(stream);
                    missing -= 1;
                }
                Ok(h) => tracing::warn!(%from, "refused an unexpected join from rank {}", h.rank),
                Err(why) => tracing::warn!(%from, "refused a connection: {why}"),
            }
        }
        Self::finish(cfg, peers)
    }
}

pub(super) fn encode_addr(out: &mut Vec<u8>, a: SocketAddr) {
    let (tag, bytes) = match a.ip() {
        IpAddr::V4(v4) => (4u8, v4.to_ipv6_mapped().octets()),
        IpAddr::V6(v6) => (6u8, v6.octets()),
    };
    out.push(tag);
    out.extend_from_slice(&bytes);
    out.extend_from_slice(&a.port().to_le_bytes());
}

pub(super) fn decode_addr(b: &[u8]) -> SocketAddr {
    let mut octets = [0u8; 16];
    octets.copy_from_slice(&b[1..17]);
    let v6 = Ipv6Addr::from(octets);
    let ip = match (b[0], v6.to_ipv4_mapped()) {
        (4, Some(v4)) => IpAddr::V4(v4),
        _ => IpAddr::V6(v6),
    };
    SocketAddr::new(ip, u16::from_le_bytes([b[17], b[18]]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Transport;

    #[test]
    fn strangers_are_refused_and_the_job_goes_on() {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let master = listener.local_addr().unwrap();
        // A wrong token and random bytes arrive first.
        let mut wrong = TcpStream::connect(master).unwrap();
        let bad = Hello {
            kind: HelloKind::Hello,
            rank: 1,
            world_size: 2,
            port: 1,
            token: b"nope".to_vec(),
        };
        wrong.write_all(&bad.encode()).unwrap();
        let mut junk = TcpStream::connect(master).unwrap();
        junk.write_all(&[0xAB; 64]).unwrap();
        let cfg1 = TcpConfig::new(1, 2, master, "right");
        let h = std::thread::spawn(move || Tcp::connect(&cfg1));
        let mut a = Tcp::connect_rank0(listener, &TcpConfig::new(0, 2, master, "right")).unwrap();
        let mut b = h.join().unwrap().unwrap();
        a.send(1, b"hi").unwrap();
        let mut buf = Vec::new();
        b.recv(0, &mut buf).unwrap();
        assert_eq!(buf, b"hi");
    }

    #[test]
    fn addr_table_round_trip() {
        for a in ["127.0.0.1:5", "[::1]:65535", "10.1.2.3:29500"] {
            let a: SocketAddr = a.parse().unwrap();
            let mut v = Vec::new();
            encode_addr(&mut v, a);
            assert_eq!(decode_addr(&v), a);
        }
    }
}
