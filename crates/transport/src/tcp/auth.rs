//! The handshake as two state machines without I/O: which message each side sends in which
//! order, and the proofs they carry. `tcp::handshake` runs them over sockets; the fuzz target
//! `tcp_handshake_machine` runs them over arbitrary bytes.
//!
//! ```text
//! connecting side                                       accepting side
//!   hello {kind, rank, world_size, port, Nc, job}  ─▶  checks kind, world size, rank, job
//!                                                  ◀─  challenge {rank, Ns}
//!   checks the accepting rank
//!   proof {HMAC(token, "connect" | hello | challenge)}  ─▶  checks the proof
//!                                                  ◀─  confirm {HMAC(token, "accept" | hello
//!                                                                 | challenge | proof)}
//!   checks the confirm
//! ```
//! The connecting side proves first. The accepting side sends nothing derived from the token
//! before the connecting side has proven that it knows it ([`Acceptor::on_hello`] does not
//! even take the token), so a stranger who connects (to rank 0, to any rank's listener, to a
//! service) gets nothing to test guesses of the token against. The price is on the other
//! side: a connecting rank sends its proof to whoever answers at the address it dials, so an
//! impostor who holds that address (it bound rank 0's port first, or sits on the path) gets
//! one MAC to test guesses against offline. A long random token makes that useless.
//!
//! Both nonces are fresh random bytes, the two MACs carry different labels and each covers
//! everything sent before it, so no proof can be replayed or reflected. The MAC key is a
//! SHA-256 digest of the token (so no two tokens share a key). Tags are compared in constant
//! time (`hmac`'s `verify_slice`, built on `subtle`).
//!
//! The hello carries the digest of the job's identity ([`job_digest`] of the launcher's job
//! id; with rank 0's random mesh identity mixed in, [`join_digest`], between two ranks other
//! than rank 0). The accepting side refuses a hello of another job before it answers, and
//! the MACs cover the digest, so a rank of an earlier job with the same token and port cannot
//! take a place in this one. A group's mesh (a split) binds its connections to
//! [`split_digest`], derived from the parent mesh's, so a rank of one group cannot join another.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use super::frame::{
    Challenge, Confirm, FrameError, Hello, HelloKind, Proof, CHALLENGE_LEN, CONFIRM_LEN, HELLO_LEN,
    JOB_LEN, MAC_LEN, NONCE_LEN, PROOF_LEN,
};
use super::service::IdentityRefusal;

type HmacSha256 = Hmac<Sha256>;

const CONNECT_LABEL: &[u8] = b"gradwire connect";
const ACCEPT_LABEL: &[u8] = b"gradwire accept";

/// The digest of a job's identity that hellos carry (the identity itself never crosses the
/// wire): the first [`JOB_LEN`] bytes of SHA-256 over a label and the identity. An empty
/// identity (no launcher named the job) has a digest too, the same for every such job.
pub fn job_digest(job: &str) -> [u8; JOB_LEN] {
    let mut h = Sha256::new();
    h.update(b"gradwire job\0");
    h.update(job.as_bytes());
    first_bytes(&h.finalize())
}

/// The digest that binds a connection between two ranks other than rank 0 to one mesh: the
/// job's digest and the mesh identity rank 0 handed out with the address table.
pub fn join_digest(job: &[u8; JOB_LEN], mesh: &[u8; NONCE_LEN]) -> [u8; JOB_LEN] {
    let mut h = Sha256::new();
    h.update(b"gradwire mesh\0");
    h.update(job);
    h.update(mesh);
    first_bytes(&h.finalize())
}

/// The digest that binds a connection of a group's mesh (made by a split,
/// [`crate::split`]): the parent mesh's identity, which split of it this is (`seq`), the
/// group's color and its members (parent ranks in group order). A rank of another group,
/// another split or another job therefore presents another digest and is refused.
pub fn split_digest(
    parent: &[u8; JOB_LEN],
    seq: u32,
    color: u32,
    members: &[usize],
) -> [u8; JOB_LEN] {
    let mut h = Sha256::new();
    h.update(b"gradwire split\0");
    h.update(parent);
    h.update(seq.to_le_bytes());
    h.update(color.to_le_bytes());
    for m in members {
        h.update((*m as u64).to_le_bytes());
    }
    first_bytes(&h.finalize())
}

fn first_bytes(d: &[u8]) -> [u8; JOB_LEN] {
    let mut out = [0u8; JOB_LEN];
    out.copy_from_slice(&d[..JOB_LEN]);
    out
}

/// The MAC key: SHA-256 of the token. HMAC pads a short key with zero bytes, so the token
/// itself as the key would make `"abc"` and `"abc\0"` the same key; its digest tells every
/// two tokens apart.
fn keyed(token: &[u8], label: &[u8], parts: &[&[u8]]) -> HmacSha256 {
    let mut h = Sha256::new();
    h.update(b"gradwire token\0");
    h.update(token);
    let key = h.finalize();
    // HMAC takes keys of any length, so this cannot fail.
    let mut m = <HmacSha256 as Mac>::new_from_slice(&key).expect("HMAC takes keys of any length");
    m.update(label);
    for p in parts {
        m.update(p);
    }
    m
}

fn mac(token: &[u8], label: &[u8], parts: &[&[u8]]) -> [u8; MAC_LEN] {
    keyed(token, label, parts).finalize().into_bytes().into()
}

/// Checks a MAC in constant time.
fn verify(token: &[u8], label: &[u8], parts: &[&[u8]], tag: &[u8]) -> bool {
    keyed(token, label, parts).verify_slice(tag).is_ok()
}

/// The connecting side's MAC: over the hello and the challenge.
pub fn connect_mac(
    token: &[u8],
    hello: &[u8; HELLO_LEN],
    challenge: &[u8; CHALLENGE_LEN],
) -> [u8; MAC_LEN] {
    mac(token, CONNECT_LABEL, &[hello, challenge])
}

/// The accepting side's MAC: over the hello, the challenge and the connecting side's proof.
pub fn accept_mac(
    token: &[u8],
    hello: &[u8; HELLO_LEN],
    challenge: &[u8; CHALLENGE_LEN],
    proof: &[u8; PROOF_LEN],
) -> [u8; MAC_LEN] {
    mac(token, ACCEPT_LABEL, &[hello, challenge, proof])
}

/// Why the accepting side refuses a connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The hello does not decode.
    #[error("malformed hello ({0:?})")]
    MalformedHello(FrameError),
    /// The hello decodes but is not one this side takes (another job, world size or kind,
    /// a rank that may not connect here or is connected already).
    #[error("{0}")]
    NotWanted(NotTaken),
    /// The proof does not decode.
    #[error("malformed proof ({0:?})")]
    MalformedProof(FrameError),
    /// The proof was not made with our token.
    #[error("wrong token (its proof does not match ours)")]
    WrongToken,
    /// A message after the handshake ended, or out of turn.
    #[error("handshake message out of order")]
    OutOfOrder,
}

/// Why the accepting side's check does not take a hello that decodes: what the checks
/// passed to [`Acceptor::on_hello`] and [`Acceptor::on_proof`] return.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NotTaken {
    /// Another kind of hello than this side expects.
    #[error("unexpected handshake kind {0:?}")]
    Kind(HelloKind),
    /// A rank of another job (its job digest differs).
    #[error("a rank of another job (its job identity differs)")]
    OtherJob,
    /// A rank of another mesh (its job or mesh digest differs).
    #[error("a rank of another mesh (its job or mesh identity differs)")]
    OtherMesh,
    /// A rank of a world of another size.
    #[error("world size {got} differs from ours ({ours})")]
    WorldSize {
        /// The world size the hello announces.
        got: u32,
        /// Ours.
        ours: usize,
    },
    /// A rank that may not connect to this one (not above it, or outside the world).
    #[error("rank {rank} may not connect to rank {ours}")]
    Rank {
        /// The rank the hello announces.
        rank: u32,
        /// Ours.
        ours: usize,
    },
    /// A rank that is connected already.
    #[error("rank {0} is already connected")]
    Connected(u32),
    /// Not a service client's hello (at a service's gate).
    #[error("not a service hello")]
    NotService,
    /// A service client whose identity the service does not take.
    #[error(transparent)]
    Identity(#[from] IdentityRefusal),
}

/// Why the connecting side rejects the other end.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    /// The challenge does not decode.
    #[error("malformed challenge ({0:?})")]
    MalformedChallenge(FrameError),
    /// The other end answered as another rank (or service) than the one we dialled.
    #[error("answered as rank {0}")]
    WrongRank(u32),
    /// The confirm does not decode.
    #[error("malformed confirm ({0:?})")]
    MalformedConfirm(FrameError),
    /// The confirm was not made with our token.
    #[error("it does not prove it knows the token")]
    WrongToken,
    /// A message after the handshake ended, or out of turn.
    #[error("handshake message out of order")]
    OutOfOrder,
}

/// Where an [`Acceptor`] stands.
#[derive(Debug, Clone)]
enum AcceptState {
    /// Waiting for the hello.
    Hello,
    /// The hello passed and the challenge went out: waiting for the proof.
    Proof {
        hello: [u8; HELLO_LEN],
        challenge: [u8; CHALLENGE_LEN],
    },
    /// Admitted, or refused: no further message is taken.
    Over,
}

/// The accepting side of one connection.
#[derive(Debug, Clone)]
pub struct Acceptor {
    rank: u32,
    state: AcceptState,
}

impl Acceptor {
    /// A fresh connection to rank (or service) `rank`.
    pub fn new(rank: u32) -> Acceptor {
        Acceptor {
            rank,
            state: AcceptState::Hello,
        }
    }

    /// Takes the hello (`bytes`, exactly [`HELLO_LEN`] of them): when it decodes and passes
    /// `check`, returns the challenge to send (our rank and `nonce`, which must be fresh
    /// random bytes). Nothing here depends on the token.
    pub fn on_hello(
        &mut self,
        bytes: &[u8],
        nonce: [u8; NONCE_LEN],
        check: impl FnOnce(&Hello) -> Result<(), NotTaken>,
    ) -> Result<[u8; CHALLENGE_LEN], Refusal> {
        let AcceptState::Hello = self.state else {
            self.state = AcceptState::Over;
            return Err(Refusal::OutOfOrder);
        };
        self.state = AcceptState::Over;
        let parsed = Hello::decode(bytes).map_err(Refusal::MalformedHello)?;
        check(&parsed).map_err(Refusal::NotWanted)?;
        let mut hello = [0u8; HELLO_LEN];
        hello.copy_from_slice(bytes);
        let challenge = Challenge {
            rank: self.rank,
            nonce,
        }
        .encode();
        self.state = AcceptState::Proof { hello, challenge };
        Ok(challenge)
    }

    /// Takes the proof (`bytes`, exactly [`PROOF_LEN`] of them): when it was made with
    /// `token` and the hello still passes `check` (run again: another connection may have
    /// taken the same place meanwhile), returns the hello and the confirm to send.
    pub fn on_proof(
        &mut self,
        bytes: &[u8],
        token: &[u8],
        check: impl FnOnce(&Hello) -> Result<(), NotTaken>,
    ) -> Result<(Hello, [u8; CONFIRM_LEN]), Refusal> {
        let AcceptState::Proof { hello, challenge } =
            std::mem::replace(&mut self.state, AcceptState::Over)
        else {
            return Err(Refusal::OutOfOrder);
        };
        let proof = Proof::decode(bytes).map_err(Refusal::MalformedProof)?;
        if !verify(token, CONNECT_LABEL, &[&hello, &challenge], &proof.mac) {
            return Err(Refusal::WrongToken);
        }
        // The hello decoded in `on_hello`, from these very bytes.
        let parsed = Hello::decode(&hello).map_err(Refusal::MalformedHello)?;
        check(&parsed).map_err(Refusal::NotWanted)?;
        let confirm = Confirm {
            mac: accept_mac(token, &hello, &challenge, &proof.encode()),
        };
        Ok((parsed, confirm.encode()))
    }

    /// The hello this connection sent, once it passed [`Acceptor::on_hello`] (it is not yet
    /// proven to come from a holder of the token).
    pub fn hello(&self) -> Option<Hello> {
        match &self.state {
            AcceptState::Proof { hello, .. } => Hello::decode(hello).ok(),
            _ => None,
        }
    }
}

/// Where an [`Initiator`] stands.
#[derive(Debug, Clone)]
enum InitState {
    /// The hello went out: waiting for the challenge.
    Challenge,
    /// The proof went out: waiting for the confirm.
    Confirm {
        challenge: [u8; CHALLENGE_LEN],
        proof: [u8; PROOF_LEN],
    },
    /// Authenticated, or rejected: no further message is taken.
    Over,
}

/// The connecting side of one connection.
#[derive(Debug, Clone)]
pub struct Initiator {
    hello: [u8; HELLO_LEN],
    expect_rank: u32,
    state: InitState,
}

impl Initiator {
    /// Starts a handshake with rank (or service) `expect_rank`: send [`Initiator::hello`]
    /// first.
    pub fn new(hello: &Hello, expect_rank: u32) -> Initiator {
        Initiator {
            hello: hello.encode(),
            expect_rank,
            state: InitState::Challenge,
        }
    }

    /// The hello to send.
    pub fn hello(&self) -> &[u8; HELLO_LEN] {
        &self.hello
    }

    /// Takes the challenge (`bytes`, exactly [`CHALLENGE_LEN`] of them): when it comes from
    /// the rank we dialled, returns our proof to send.
    pub fn on_challenge(
        &mut self,
        bytes: &[u8],
        token: &[u8],
    ) -> Result<[u8; PROOF_LEN], Rejection> {
        let InitState::Challenge = self.state else {
            self.state = InitState::Over;
            return Err(Rejection::OutOfOrder);
        };
        self.state = InitState::Over;
        let ch = Challenge::decode(bytes).map_err(Rejection::MalformedChallenge)?;
        if ch.rank != self.expect_rank {
            return Err(Rejection::WrongRank(ch.rank));
        }
        let challenge = ch.encode();
        let proof = Proof {
            mac: connect_mac(token, &self.hello, &challenge),
        }
        .encode();
        self.state = InitState::Confirm { challenge, proof };
        Ok(proof)
    }

    /// Takes the confirm (`bytes`, exactly [`CONFIRM_LEN`] of them): `Ok` when the other end
    /// proved it knows `token`, and the handshake is over.
    pub fn on_confirm(&mut self, bytes: &[u8], token: &[u8]) -> Result<(), Rejection> {
        let InitState::Confirm { challenge, proof } =
            std::mem::replace(&mut self.state, InitState::Over)
        else {
            return Err(Rejection::OutOfOrder);
        };
        let confirm = Confirm::decode(bytes).map_err(Rejection::MalformedConfirm)?;
        if !verify(
            token,
            ACCEPT_LABEL,
            &[&self.hello, &challenge, &proof],
            &confirm.mac,
        ) {
            return Err(Rejection::WrongToken);
        }
        Ok(())
    }

    /// Whether the proof went out (a close after it means the other end refused the proof).
    pub fn proved(&self) -> bool {
        matches!(self.state, InitState::Confirm { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::super::frame::HelloKind;
    use super::*;

    fn hello(job: &str) -> Hello {
        Hello {
            kind: HelloKind::Hello,
            rank: 1,
            world_size: 2,
            port: 9,
            nonce: [4; NONCE_LEN],
            job: job_digest(job),
        }
    }

    /// Runs a whole exchange: (what the acceptor made of it, what the initiator made of it).
    fn exchange(
        client_token: &[u8],
        server_token: &[u8],
    ) -> (Result<Hello, Refusal>, Result<(), Rejection>) {
        let mut a = Acceptor::new(0);
        let mut i = Initiator::new(&hello("j"), 0);
        let ch = a.on_hello(i.hello(), [5; NONCE_LEN], |_| Ok(())).unwrap();
        let proof = i.on_challenge(&ch, client_token).unwrap();
        match a.on_proof(&proof, server_token, |_| Ok(())) {
            Ok((h, confirm)) => (Ok(h), i.on_confirm(&confirm, client_token)),
            Err(e) => (Err(e), Err(Rejection::OutOfOrder)),
        }
    }

    #[test]
    fn same_token_both_ways_and_nothing_else() {
        let (a, i) = exchange(b"t", b"t");
        assert_eq!(a.unwrap(), hello("j"));
        assert_eq!(i, Ok(()));
        assert_eq!(exchange(b"t", b"u").0, Err(Refusal::WrongToken));
        assert_eq!(exchange(b"", b"t").0, Err(Refusal::WrongToken));
        // Tokens that differ only by trailing zero bytes are different tokens.
        assert_eq!(exchange(b"t", b"t\0").0, Err(Refusal::WrongToken));
        assert_eq!(exchange(b"", b"\0").0, Err(Refusal::WrongToken));
    }

    /// The challenge is the same whatever the token: the acceptor reveals nothing derived
    /// from it before the proof.
    #[test]
    fn the_challenge_does_not_depend_on_the_token() {
        let h = hello("j").encode();
        let mut a = Acceptor::new(3);
        let mut b = Acceptor::new(3);
        let ca = a.on_hello(&h, [1; NONCE_LEN], |_| Ok(())).unwrap();
        let cb = b.on_hello(&h, [1; NONCE_LEN], |_| Ok(())).unwrap();
        assert_eq!(ca, cb);
        assert_eq!(
            ca,
            Challenge {
                rank: 3,
                nonce: [1; NONCE_LEN]
            }
            .encode()
        );
    }

    #[test]
    fn refusals_and_rejections_are_typed() {
        let mut a = Acceptor::new(0);
        assert!(matches!(
            a.on_hello(&[0; HELLO_LEN], [0; NONCE_LEN], |_| Ok(())),
            Err(Refusal::MalformedHello(_))
        ));
        // Once refused, nothing more is taken.
        assert_eq!(
            a.on_proof(&[0; PROOF_LEN], b"t", |_| Ok(())).unwrap_err(),
            Refusal::OutOfOrder
        );
        let mut a = Acceptor::new(0);
        let e = a
            .on_hello(&hello("old").encode(), [0; NONCE_LEN], |_| {
                Err(NotTaken::OtherJob)
            })
            .unwrap_err();
        assert_eq!(e, Refusal::NotWanted(NotTaken::OtherJob));
        // A proof before any hello.
        let mut a = Acceptor::new(0);
        assert_eq!(
            a.on_proof(&[0; PROOF_LEN], b"t", |_| Ok(())).unwrap_err(),
            Refusal::OutOfOrder
        );
        // A replayed proof of another exchange (another nonce) is a wrong token.
        let mut a = Acceptor::new(0);
        let mut i = Initiator::new(&hello("j"), 0);
        let ch = a.on_hello(i.hello(), [1; NONCE_LEN], |_| Ok(())).unwrap();
        let proof = i.on_challenge(&ch, b"t").unwrap();
        let mut a2 = Acceptor::new(0);
        a2.on_hello(i.hello(), [2; NONCE_LEN], |_| Ok(())).unwrap();
        assert_eq!(
            a2.on_proof(&proof, b"t", |_| Ok(())).unwrap_err(),
            Refusal::WrongToken
        );
        // The re-check after the proof still refuses.
        assert!(matches!(
            a.on_proof(&proof, b"t", |_| Err(NotTaken::Connected(2))),
            Err(Refusal::NotWanted(_))
        ));
        // The initiator: another rank, a malformed confirm, a proof reflected as a confirm.
        let mut i = Initiator::new(&hello("j"), 0);
        let other = Challenge {
            rank: 5,
            nonce: [0; NONCE_LEN],
        }
        .encode();
        assert_eq!(
            i.on_challenge(&other, b"t").unwrap_err(),
            Rejection::WrongRank(5)
        );
        let mut i = Initiator::new(&hello("j"), 0);
        let ch = Challenge {
            rank: 0,
            nonce: [0; NONCE_LEN],
        }
        .encode();
        let proof = i.on_challenge(&ch, b"t").unwrap();
        assert!(i.proved());
        let reflected = Confirm {
            mac: Proof::decode(&proof).unwrap().mac,
        }
        .encode();
        assert_eq!(
            i.on_confirm(&reflected, b"t").unwrap_err(),
            Rejection::WrongToken
        );
        assert_eq!(
            i.on_confirm(&reflected, b"t").unwrap_err(),
            Rejection::OutOfOrder
        );
    }

    #[test]
    fn digests_tell_jobs_and_meshes_apart() {
        assert_ne!(job_digest("a"), job_digest("b"));
        assert_eq!(job_digest("a"), job_digest("a"));
        let j = job_digest("a");
        assert_ne!(
            join_digest(&j, &[1; NONCE_LEN]),
            join_digest(&j, &[2; NONCE_LEN])
        );
        assert_ne!(join_digest(&j, &[1; NONCE_LEN]), j);
    }
}
