//! A group's mesh admits only its own members: a rank of another group of the same split, of
//! the same color in a later split, or with another token is refused, and the real member
//! then joins.

use std::net::{Ipv4Addr, SocketAddr};

use super::*;

fn listener() -> (TcpListener, SocketAddr) {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let a = l.local_addr().unwrap();
    (l, a)
}

#[test]
fn a_rank_of_another_group_split_or_token_is_refused() {
    let parent = [7u8; JOB_LEN];
    let ours = split_digest(&parent, 0, 1, &[0, 2]);
    let other_group = split_digest(&parent, 0, 0, &[1, 3]);
    let later_split = split_digest(&parent, 1, 1, &[0, 2]);
    assert!(ours != other_group && ours != later_split);
    let (l0, addr0) = listener();
    let cfg = move |rank: usize, token: &str, timeout: Duration| TcpConfig {
        timeout,
        handshake_timeout: Duration::from_millis(500),
        ..TcpConfig::new(rank, 2, addr0, token)
    };
    let long = Duration::from_secs(20);
    let acceptor = std::thread::spawn(move || {
        let mut peers: Vec<Option<TcpStream>> = vec![None, None];
        let c = cfg(0, "right", long);
        join_mesh(
            &c,
            &l0,
            &[addr0, addr0],
            &ours,
            &mut peers,
            Instant::now() + long,
        )
        .map(|()| peers)
    });
    let short = Duration::from_millis(800);
    for (identity, token, who) in [
        (other_group, "right", "another group"),
        (later_split, "right", "a later split"),
        (ours, "wrong", "another token"),
    ] {
        let (l1, addr1) = listener();
        let mut peers: Vec<Option<TcpStream>> = vec![None, None];
        let err = join_mesh(
            &cfg(1, token, short),
            &l1,
            &[addr0, addr1],
            &identity,
            &mut peers,
            Instant::now() + short,
        )
        .unwrap_err();
        assert!(matches!(err, Error::Rendezvous { .. }), "{who}: {err}");
        assert!(peers[0].is_none(), "{who} was admitted");
    }
    let (l1, addr1) = listener();
    let mut peers1: Vec<Option<TcpStream>> = vec![None, None];
    let c1 = cfg(1, "right", long);
    join_mesh(
        &c1,
        &l1,
        &[addr0, addr1],
        &ours,
        &mut peers1,
        Instant::now() + long,
    )
    .unwrap();
    let peers0 = acceptor.join().unwrap().unwrap();
    let mut a = Tcp::finish(&cfg(0, "right", long), peers0, ours).unwrap();
    let mut b = Tcp::finish(&c1, peers1, ours).unwrap();
    a.send(1, b"genuine").unwrap();
    let mut buf = Vec::new();
    b.recv(0, &mut buf).unwrap();
    assert_eq!(buf, b"genuine");
}
