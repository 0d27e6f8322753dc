//! Elastic membership: the coordinator that forms the worlds of elastic all-reduce training
//! (TorchElastic's rendezvous, Horovod Elastic's driver), and the member's side of it.
//!
//! A launcher runs a [`Coordinator`]. Each worker process is a [`Member`]: it keeps one TCP
//! connection to the coordinator for the whole run, authenticated by the transport's
//! challenge-response on the job token (`gradwire_transport::tcp::service`, role
//! [`ROLE_MEMBER`], service id [`COORDINATOR_ID`]). Nothing is answered to a connection
//! that has not proven the token, and the coordinator holds at most `2 * max + 8` admitted
//! connections (it closes others).
//!
//! # Protocol
//!
//! Frames of a `u32` little-endian length and a JSON body ([`message`]), member to
//! coordinator a [`Request`], coordinator to member a [`Reply`]; a member has at most one
//! request outstanding (a second one closes its connection), and every reply to it goes
//! over its own connection.
//!
//! - `Next { commits, reached }` asks for the next world and is answered, once the world is
//!   formed, by `World` (rank, world size, the master address where the ranks build their
//!   own mesh, the generation's job id `"{job}/g{generation}"`, the step to restore, how
//!   many ranks are survivors), or by `Abort(reason)`.
//! - `Pending` (rank 0, at a commit) is answered `Pending(true)` iff a joiner waits and
//!   the current world is smaller than `max`; the ranks then agree to send `Next` to admit
//!   it.
//! - `Resumed { generation, unix_s }` records when that generation trained again (`Ack`).
//! - `Done`: the member finished (`Ack`). `Events`: the [`MembershipEvent`]s so far.
//!
//! # Formation rules
//!
//! - **Generation 0** forms once `initial` members have sent `Next`, ranks in arrival
//!   order. If `start_timeout` passes first, it forms with those waiting if they are at
//!   least `min`; else each gets `Abort` and the outcome is [`Outcome::Aborted`]. Its event
//!   is `"start"`.
//! - **A generation breaks** when a member of it (a) closes its connection or sends garbage
//!   before `Done`, or (b) sends `Next` (it failed, or the ranks agreed to admit joiners).
//!   The event's `detected_unix_s` is the time of the first such thing.
//! - **Joiners**: connections outside the current generation that send `Next` wait; they
//!   break nothing.
//! - **After a break** the coordinator waits until every member of the broken generation
//!   has sent `Next` or is gone, or until `timeout` passes; members that have not sent
//!   `Next` by then are evicted (their connection is shut down) and count as lost. The
//!   survivors are the members that sent `Next`. The restore step is the largest step in
//!   every survivor's `commits`; with no common step, or no survivor, everyone waiting gets
//!   `Abort` and the outcome is `Aborted`. Joiners are admitted in arrival order up to
//!   `max - survivors`. If survivors and admitted joiners are fewer than `min`, joiners are
//!   awaited up to `timeout` more, then everyone gets `Abort`. Otherwise generation `g + 1`
//!   forms: ranks `0..survivors` are the survivors in the order of their old ranks, then
//!   the admitted joiners; its event is `"lost"` (lost ranks, no joiner), `"joined"`
//!   (joiners only) or `"lost+joined"`, with the lost ranks as ranks of the broken
//!   generation and `steps_lost = reached_step - restore_step` (`reached_step` the highest
//!   `reached` among the survivors).
//! - **Done**: when every member of the current generation has sent `Done`, the outcome is
//!   [`Outcome::Finished`] and waiting joiners get `Abort("the run finished")`. A member
//!   that closes after `Done` breaks nothing; if a generation broke and every member of it
//!   still connected has sent `Done` (none sent `Next`), the run is finished too.
//!
//! Every master address is a free port the coordinator found by binding `master_host:0`
//! and closing the listener again.

pub mod coordinator;
mod error;
pub mod member;
pub mod message;
mod state;

pub use coordinator::{Coordinator, CoordinatorConfig, Outcome, COORDINATOR_ID, ROLE_MEMBER};
pub use error::ElasticError;
pub use member::{Member, ENV_ELASTIC, ENV_TOKEN};
pub use message::{
    decode_reply, decode_request, encode_reply, encode_request, read_frame, MembershipEvent,
    MessageError, Reply, Request, World, MAX_MESSAGE,
};
