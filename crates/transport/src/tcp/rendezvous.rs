//! Rendezvous: rank 0 admits every rank (handshake, see [`super::auth`]) and notes its
//! listening address, then sends a random mesh identity and the address table back; the
//! other ranks connect to the lower ranks and accept the higher ones, with the same mutual
//! handshake on every connection, bound to the job's identity and (between ranks other than
//! rank 0) the mesh's. A connecting rank tries again, with a growing pause, whatever made its
//! handshake fail (an impostor at the address, rank 0 out of room for it or not up yet),
//! until its deadline.

use std::io::{self, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use super::auth::{job_digest, join_digest, NotTaken};
use super::frame::{
    decode_mesh, decode_table, encode_mesh, encode_table, table_len, Hello, HelloKind, JOB_LEN,
    MESH_LEN, NONCE_LEN,
};
use super::handshake::{self, ConnectFailure, Gate};
use super::sys::{connect_before, read_exact_before};
use super::{check_cfg, rendezvous, Tcp, TcpConfig};
use crate::{Error, Op, Result};

/// First pause before trying again after a failed handshake; doubles up to a second.
const RETRY_PAUSE: Duration = Duration::from_millis(50);

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
        let job = job_digest(&cfg.job);
        let mut gate = Gate::new(&listener, cfg.token.as_bytes(), 0, cfg.handshake_limit())
            .map_err(|e| rendezvous(format!("listener: {e}")))?;
        let mut missing = n - 1;
        while missing > 0 {
            let admitted = gate
                .next(deadline, |h| {
                    check_hello(h, cfg, HelloKind::Hello, &job, &peers)
                })
                .map_err(|e| rendezvous(format!("accept: {e}")))?;
            let Some(a) = admitted else {
                return Err(rendezvous(format!(
                    "rank(s) {} did not join within {:?}",
                    absent(&peers, 1),
                    cfg.timeout
                )));
            };
            let r = a.hello.rank as usize;
            addrs[r] = Some(SocketAddr::new(a.from.ip(), a.hello.port));
            peers[r] = Some(a.stream);
            missing -= 1;
        }
        drop(gate);
        // Everyone is here: send the mesh identity and the table of listening addresses.
        let addrs: Vec<SocketAddr> = addrs
            .into_iter()
            .map(|a| a.expect("all ranks joined"))
            .collect();
        let mesh: [u8; NONCE_LEN] = rand::random();
        let mut reply = encode_mesh(&mesh).to_vec();
        reply.extend_from_slice(&encode_table(&addrs));
        for (r, p) in peers.iter_mut().enumerate() {
            if let Some(s) = p {
                s.write_all(&reply).map_err(|e| Error::Io {
                    peer: r,
                    op: Op::Connect,
                    source: e,
                })?;
            }
        }
        Self::finish(cfg, peers, join_digest(&job, &mesh))
    }

    pub(super) fn connect_other(cfg: &TcpConfig) -> Result<Tcp> {
        check_cfg(cfg)?;
        let n = cfg.world_size;
        let deadline = Instant::now() + cfg.timeout;
        // Our own listener, on the interface that reaches rank 0, port 0.
        let first = connect_before(cfg.master, deadline, 0)?;
        let local_ip = first
            .local_addr()
            .map(|a| a.ip())
            .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
        let listener = TcpListener::bind(SocketAddr::new(local_ip, 0))
            .map_err(|e| rendezvous(format!("cannot listen on {local_ip}: {e}")))?;
        let port = listener
            .local_addr()
            .map_err(|e| rendezvous(format!("listener address: {e}")))?
            .port();
        let job = job_digest(&cfg.job);
        let hello = Hello {
            kind: HelloKind::Hello,
            rank: cfg.rank as u32,
            world_size: n as u32,
            port,
            nonce: [0; 16],
            job,
        };
        let mut master = connect_authenticated(cfg, cfg.master, 0, &hello, deadline, Some(first))?;
        // Wait for the mesh identity and the table (rank 0 sends them once all ranks are in).
        let mut reply = vec![0u8; MESH_LEN + table_len(n)];
        read_exact_before(&mut master, &mut reply, deadline).map_err(|e| match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Error::Rendezvous {
                reason: format!(
                    "rank 0 did not complete the rendezvous within {:?} (a rank missing?)",
                    cfg.timeout
                ),
            },
            io::ErrorKind::UnexpectedEof => Error::Rendezvous {
                reason: "rank 0 closed the connection during the rendezvous".into(),
            },
            _ => Error::Io {
                peer: 0,
                op: Op::Connect,
                source: e,
            },
        })?;
        let mesh = decode_mesh(&reply[..MESH_LEN])
            .map_err(|e| rendezvous(format!("rank 0 sent a malformed mesh identity ({e:?})")))?;
        let addrs = decode_table(&reply[MESH_LEN..], n)
            .map_err(|e| rendezvous(format!("rank 0 sent a malformed address table ({e:?})")))?;
        let joined = join_digest(&job, &mesh);
        let mut peers: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();
        peers[0] = Some(master);
        join_mesh(cfg, &listener, &addrs, &joined, &mut peers, deadline)?;
        Self::finish(cfg, peers, joined)
    }
}

/// The mesh among ranks that know each other's listening addresses (`addrs`): connects to
/// every lower rank that `peers` lacks, then accepts every higher rank on `listener`, each
/// connection running the handshake bound to `identity` (a join hello).
pub(super) fn join_mesh(
    cfg: &TcpConfig,
    listener: &TcpListener,
    addrs: &[SocketAddr],
    identity: &[u8; JOB_LEN],
    peers: &mut [Option<TcpStream>],
    deadline: Instant,
) -> Result<()> {
    let n = cfg.world_size;
    let join = Hello {
        kind: HelloKind::Join,
        rank: cfg.rank as u32,
        world_size: n as u32,
        port: 0,
        nonce: [0; 16],
        job: *identity,
    };
    // Connect to lower ranks.
    for (r, addr) in addrs.iter().enumerate().take(cfg.rank) {
        if peers[r].is_none() {
            peers[r] = Some(connect_authenticated(cfg, *addr, r, &join, deadline, None)?);
        }
    }
    // Accept higher ranks.
    let mut gate = Gate::new(
        listener,
        cfg.token.as_bytes(),
        cfg.rank as u32,
        cfg.handshake_limit(),
    )
    .map_err(|e| rendezvous(format!("listener: {e}")))?;
    let mut missing = n - 1 - cfg.rank;
    while missing > 0 {
        let admitted = gate
            .next(deadline, |h| {
                check_hello(h, cfg, HelloKind::Join, identity, peers)
            })
            .map_err(|e| rendezvous(format!("accept: {e}")))?;
        let Some(a) = admitted else {
            return Err(rendezvous(format!(
                "rank(s) {} did not connect to rank {} within {:?}",
                absent(peers, cfg.rank + 1),
                cfg.rank,
                cfg.timeout
            )));
        };
        peers[a.hello.rank as usize] = Some(a.stream);
        missing -= 1;
    }
    Ok(())
}

/// Ranks from `from` on that have no connection yet, as "2, 5".
fn absent(peers: &[Option<TcpStream>], from: usize) -> String {
    (from..peers.len())
        .filter(|&r| peers[r].is_none())
        .map(|r| r.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether an accepting rank takes this hello: the right kind, our job (and mesh), our
/// world size, a rank that may connect to us (`> our rank`, `> 0`) and has not yet.
fn check_hello(
    h: &Hello,
    cfg: &TcpConfig,
    want: HelloKind,
    job: &[u8; JOB_LEN],
    peers: &[Option<TcpStream>],
) -> std::result::Result<(), NotTaken> {
    if h.kind != want {
        return Err(NotTaken::Kind(h.kind));
    }
    if h.job != *job {
        return Err(match want {
            HelloKind::Hello => NotTaken::OtherJob,
            HelloKind::Join => NotTaken::OtherMesh,
        });
    }
    if h.world_size as usize != cfg.world_size {
        return Err(NotTaken::WorldSize {
            got: h.world_size,
            ours: cfg.world_size,
        });
    }
    let r = h.rank as usize;
    if r <= cfg.rank || r >= cfg.world_size {
        return Err(NotTaken::Rank {
            rank: h.rank,
            ours: cfg.rank,
        });
    }
    if peers[r].is_some() {
        return Err(NotTaken::Connected(h.rank));
    }
    Ok(())
}

/// Connects to rank `peer` at `addr` and runs the handshake (a fresh nonce each try). A
/// handshake that fails (an answer that does not prove the token, a connection closed
/// before the proof: the real rank may not be up yet, or had no room for us) is tried again
/// on a new connection, after a pause that grows up to a second, until the deadline. The
/// first failure is logged at warning level, the ones after it at debug level. `first`: an
/// already open connection to try first.
fn connect_authenticated(
    cfg: &TcpConfig,
    addr: SocketAddr,
    peer: usize,
    hello: &Hello,
    deadline: Instant,
    mut first: Option<TcpStream>,
) -> Result<TcpStream> {
    let mut pause = RETRY_PAUSE;
    let mut tries = 0u32;
    loop {
        let mut s = match first.take() {
            Some(s) => s,
            None => connect_before(addr, deadline, peer)?,
        };
        let hello = Hello {
            nonce: rand::random(),
            ..hello.clone()
        };
        let try_until = deadline.min(Instant::now() + cfg.handshake_limit());
        let why = match handshake::connect(
            &mut s,
            cfg.token.as_bytes(),
            &hello,
            peer as u32,
            try_until,
        ) {
            Ok(()) => return Ok(s),
            Err(ConnectFailure::Impostor(why)) => why,
            Err(ConnectFailure::Closed) => "it closed the connection before answering our hello \
                 (another job or world size there, or no room for us yet)"
                .into(),
            Err(ConnectFailure::Io(e)) => format!("handshake i/o failed ({e})"),
        };
        drop(s);
        tries += 1;
        if tries == 1 {
            tracing::warn!(%addr, rank = cfg.rank, "handshake with rank {peer} failed, trying again: {why}");
        } else {
            tracing::debug!(%addr, rank = cfg.rank, tries, "handshake with rank {peer} failed: {why}");
        }
        if Instant::now() + pause >= deadline {
            return Err(rendezvous(format!(
                "no genuine rank {peer} at {addr} within {:?} ({tries} tries): {why} (a \
                 different GRADWIRE_TOKEN, job or world size there, or an impostor)",
                cfg.timeout
            )));
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_secs(1));
    }
}

#[cfg(test)]
mod tests;
