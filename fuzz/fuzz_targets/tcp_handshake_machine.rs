#![no_main]
//! Fuzzes the handshake's state machines (`tcp::auth`): an acceptor and an initiator fed
//! arbitrary messages in arbitrary order, and an honest pair whose tokens may differ.
//!
//! Input: `flags` byte, token lengths (one byte each, mod 33), the two tokens, then
//! operations: an op byte, a length byte, and that many bytes of message.
//! - Acceptor ops (`op % 4`): 0 hello, 1 proof (with token A), 2 a well-formed hello built
//!   from the bytes, 3 the genuine proof for the exchange so far (made with token B).
//! - Initiator ops (`op / 4 % 4`): 0 challenge, 1 confirm (with token A), 2 a well-formed
//!   challenge of rank 0, 3 the genuine confirm for the exchange so far (made with token B).
//! - `flags & 1`: the acceptor's check refuses every hello.
//!
//! Checked: nothing panics; the acceptor admits only a proof equal to the genuine one made
//! with its token, and answers it with the genuine confirm; the initiator accepts only the
//! genuine confirm made with its token; after the handshake ends (either way) every further
//! message is refused; an honest pair completes exactly when the tokens are equal.
use gradwire_transport::tcp::auth::{
    accept_mac, connect_mac, job_digest, Acceptor, Initiator, NotTaken, Refusal, Rejection,
};
use gradwire_transport::tcp::frame::{
    Challenge, Confirm, Hello, HelloKind, Proof, CHALLENGE_LEN, HELLO_LEN, PROOF_LEN,
};
use libfuzzer_sys::fuzz_target;

fn fixed<const N: usize>(b: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    let n = b.len().min(N);
    out[..n].copy_from_slice(&b[..n]);
    out
}

fn honest(token_a: &[u8], token_b: &[u8]) {
    let hello = Hello {
        kind: HelloKind::Join,
        rank: 2,
        world_size: 3,
        port: 0,
        nonce: [9; 16],
        job: job_digest("fuzz"),
    };
    let mut i = Initiator::new(&hello, 1);
    let mut a = Acceptor::new(1);
    let ch = a
        .on_hello(i.hello(), [3; 16], |_| Ok(()))
        .expect("a good hello");
    let proof = i.on_challenge(&ch, token_a).expect("the right rank");
    match a.on_proof(&proof, token_b, |_| Ok(())) {
        Ok((h, confirm)) => {
            assert_eq!(token_a, token_b, "admitted with another token");
            assert_eq!(h, hello);
            i.on_confirm(&confirm, token_a)
                .expect("the genuine confirm");
        }
        Err(r) => {
            assert_ne!(token_a, token_b, "refused with the same token: {r}");
            assert_eq!(r, Refusal::WrongToken);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    let flags = data[0];
    let (la, lb) = (usize::from(data[1]) % 33, usize::from(data[2]) % 33);
    let rest = &data[3..];
    if rest.len() < la + lb {
        return;
    }
    let (token_a, rest) = rest.split_at(la);
    let (token_b, mut ops) = rest.split_at(lb);
    honest(token_a, token_b);

    let refuse = flags & 1 != 0;
    let check = |_: &Hello| {
        if refuse {
            Err(NotTaken::OtherJob)
        } else {
            Ok(())
        }
    };
    let mut acc = Acceptor::new(0);
    let (mut acc_hello, mut acc_challenge): (Option<[u8; HELLO_LEN]>, Option<[u8; CHALLENGE_LEN]>) =
        (None, None);
    let mut acc_over = false;
    let init_hello = Hello {
        kind: HelloKind::Hello,
        rank: 1,
        world_size: 2,
        port: 7,
        nonce: [1; 16],
        job: job_digest(""),
    };
    let mut init = Initiator::new(&init_hello, 0);
    let mut init_state: (Option<[u8; CHALLENGE_LEN]>, Option<[u8; PROOF_LEN]>) = (None, None);
    let mut init_over = false;

    while ops.len() >= 2 {
        let (op, len) = (ops[0], usize::from(ops[1]));
        let take = len.min(ops.len() - 2);
        let msg = &ops[2..2 + take];
        ops = &ops[2 + take..];

        // The acceptor.
        let a_msg: Vec<u8> = match op % 4 {
            2 => Hello {
                kind: if msg.first().is_some_and(|b| b & 1 == 1) {
                    HelloKind::Join
                } else {
                    HelloKind::Hello
                },
                rank: u32::from_le_bytes(fixed(msg)),
                world_size: 2,
                port: 0,
                nonce: fixed(msg),
                job: fixed(msg),
            }
            .encode()
            .to_vec(),
            3 => match (acc_hello, acc_challenge) {
                (Some(h), Some(c)) => Proof {
                    mac: connect_mac(token_b, &h, &c),
                }
                .encode()
                .to_vec(),
                _ => msg.to_vec(),
            },
            _ => msg.to_vec(),
        };
        if op % 4 == 0 || op % 4 == 2 {
            let r = acc.on_hello(&a_msg, [5; 16], check);
            match r {
                Ok(ch) => {
                    assert!(!acc_over && acc_hello.is_none(), "a second hello taken");
                    assert!(!refuse);
                    assert_eq!(a_msg.len(), HELLO_LEN);
                    assert_eq!(Challenge::decode(&ch).map(|c| c.rank), Ok(0));
                    acc_hello = Some(fixed(&a_msg));
                    acc_challenge = Some(ch);
                    assert!(acc.hello().is_some());
                }
                Err(_) => {
                    acc_over = true;
                    acc_hello = None;
                }
            }
        } else {
            match acc.on_proof(&a_msg, token_a, check) {
                Ok((h, confirm)) => {
                    let (hb, cb) = (
                        acc_hello.expect("a proof before a hello"),
                        acc_challenge.expect("a challenge"),
                    );
                    assert!(!acc_over);
                    let genuine = Proof {
                        mac: connect_mac(token_a, &hb, &cb),
                    }
                    .encode();
                    assert_eq!(a_msg, genuine, "admitted a proof not made with the token");
                    assert_eq!(h.encode(), hb);
                    let want = Confirm {
                        mac: accept_mac(token_a, &hb, &cb, &genuine),
                    }
                    .encode();
                    assert_eq!(confirm, want);
                    acc_over = true;
                }
                Err(r) => {
                    if acc_over || acc_hello.is_none() {
                        assert_eq!(r, Refusal::OutOfOrder);
                    }
                    acc_over = true;
                }
            }
            acc_hello = None;
        }

        // The initiator.
        let i_op = op / 4 % 4;
        let i_msg: Vec<u8> = match i_op {
            2 => Challenge {
                rank: 0,
                nonce: fixed(msg),
            }
            .encode()
            .to_vec(),
            3 => match init_state {
                (Some(c), Some(p)) => Confirm {
                    mac: accept_mac(token_b, init.hello(), &c, &p),
                }
                .encode()
                .to_vec(),
                _ => msg.to_vec(),
            },
            _ => msg.to_vec(),
        };
        if i_op == 0 || i_op == 2 {
            match init.on_challenge(&i_msg, token_a) {
                Ok(proof) => {
                    assert!(!init_over && init_state.0.is_none());
                    let c: [u8; CHALLENGE_LEN] = fixed(&i_msg);
                    assert_eq!(Challenge::decode(&i_msg).map(|c| c.rank), Ok(0));
                    let want = Proof {
                        mac: connect_mac(token_a, init.hello(), &c),
                    }
                    .encode();
                    assert_eq!(proof, want);
                    assert!(init.proved());
                    init_state = (Some(c), Some(proof));
                }
                Err(_) => {
                    init_over = true;
                    init_state = (None, None);
                }
            }
        } else {
            match init.on_confirm(&i_msg, token_a) {
                Ok(()) => {
                    let (c, p) = (
                        init_state.0.expect("a challenge"),
                        init_state.1.expect("a proof"),
                    );
                    assert!(!init_over);
                    let want = Confirm {
                        mac: accept_mac(token_a, init.hello(), &c, &p),
                    }
                    .encode();
                    assert_eq!(i_msg, want, "accepted a confirm not made with the token");
                    init_over = true;
                }
                Err(r) => {
                    if init_over || init_state.0.is_none() {
                        assert_eq!(r, Rejection::OutOfOrder);
                    }
                    init_over = true;
                }
            }
            init_state = (None, None);
        }
    }
});
