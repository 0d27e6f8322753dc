//! The elastic coordinator over loopback: members in threads of this process, short
//! timeouts; and the wire format's round trips and total decoding.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use gradwire_run::elastic::{
    decode_reply, decode_request, encode_reply, encode_request, read_frame, Coordinator,
    CoordinatorConfig, ElasticError, Member, MembershipEvent, MessageError, Outcome, Reply,
    Request, World, ENV_ELASTIC, ENV_TOKEN, MAX_MESSAGE,
};
use proptest::prelude::*;

const TOKEN: &str = "elastic-test-token";
/// The most any single wait in these tests may take (they finish well before).
const WAIT: Duration = Duration::from_secs(8);

fn config(min: usize, max: usize, initial: usize) -> CoordinatorConfig {
    let mut c = CoordinatorConfig::new(min, max, initial, TOKEN, "job");
    c.timeout = Duration::from_secs(1);
    c.start_timeout = Duration::from_secs(5);
    c
}

fn connect(addr: SocketAddr) -> Member {
    Member::connect(addr, TOKEN, WAIT).expect("connect")
}

/// A member in a thread asking for its next world.
fn ask(
    mut m: Member,
    commits: Vec<u64>,
    reached: u64,
) -> JoinHandle<(Member, Result<World, ElasticError>)> {
    std::thread::spawn(move || {
        let w = m.next_world(&commits, reached, WAIT);
        (m, w)
    })
}

/// A new member in a thread: connects, then asks for its first world.
fn newcomer(addr: SocketAddr) -> JoinHandle<(Member, Result<World, ElasticError>)> {
    std::thread::spawn(move || {
        let mut m = connect(addr);
        let w = m.next_world(&[], 0, WAIT);
        (m, w)
    })
}

/// `n` new members' worlds, sorted by rank.
fn start_members(addr: SocketAddr, n: usize) -> Vec<(Member, World)> {
    let hs: Vec<_> = (0..n).map(|_| newcomer(addr)).collect();
    let mut ms: Vec<(Member, World)> = hs
        .into_iter()
        .map(|h| {
            let (m, w) = h.join().expect("member thread");
            (m, w.expect("first world"))
        })
        .collect();
    ms.sort_by_key(|(_, w)| w.rank);
    ms
}

/// Each member's next world (in threads, so they ask at once), in the order given.
fn next_worlds(asks: Vec<(Member, Vec<u64>, u64)>) -> Vec<(Member, Result<World, ElasticError>)> {
    let hs: Vec<_> = asks.into_iter().map(|(m, c, r)| ask(m, c, r)).collect();
    hs.into_iter()
        .map(|h| h.join().expect("member thread"))
        .collect()
}

fn finish_all(c: &Coordinator, ms: &mut [Member]) {
    for m in ms.iter_mut() {
        m.done().expect("done");
    }
    assert_eq!(c.wait(WAIT), Some(Outcome::Finished));
}

#[test]
fn three_members_form_generation_zero_and_finish() {
    let c = Coordinator::start(config(2, 4, 3)).unwrap();
    let ms = start_members(c.addr(), 3);
    let ranks: Vec<u32> = ms.iter().map(|(_, w)| w.rank).collect();
    assert_eq!(ranks, [0, 1, 2]);
    for (_, w) in &ms {
        assert_eq!(w.generation, 0);
        assert_eq!(w.world_size, 3);
        assert_eq!(w.master, ms[0].1.master);
        assert!(w.master.parse::<SocketAddr>().unwrap().ip().is_loopback());
        assert_eq!(w.job, "job/g0");
        assert_eq!(w.restore_step, None);
        assert_eq!(w.survivors, 0);
    }
    assert_eq!(c.generation(), Some(0));
    assert_eq!(c.world_size(), 3);
    let mut ms: Vec<Member> = ms.into_iter().map(|(m, _)| m).collect();
    ms[0].resumed(0, 1234.5).unwrap();
    assert!(!ms[0].pending().unwrap());
    let events = ms[1].events().unwrap();
    assert_eq!(events, c.events());
    assert_eq!(events.len(), 1);
    let e = &events[0];
    assert_eq!((e.generation, e.kind.as_str()), (0, "start"));
    assert_eq!(
        (e.world_size_before, e.world_size_after, e.joined),
        (0, 3, 3)
    );
    assert_eq!((e.restore_step, e.reached_step, e.steps_lost), (None, 0, 0));
    assert!(e.lost_ranks.is_empty());
    assert_eq!(e.resumed_unix_s, Some(1234.5));
    assert_eq!(c.outcome(), None);
    finish_all(&c, &mut ms);
    // Closing after Done breaks nothing.
    drop(ms);
    assert_eq!(c.outcome(), Some(Outcome::Finished));
    assert_eq!(c.events().len(), 1);
}

#[test]
fn a_dropped_member_breaks_the_generation_and_the_survivors_restore_their_common_commit() {
    let c = Coordinator::start(config(1, 4, 3)).unwrap();
    let mut ms = start_members(c.addr(), 3);
    let (dropped, _) = ms.remove(1);
    drop(dropped);
    let mut it = ms.into_iter().map(|(m, _)| m);
    let (m0, m2) = (it.next().unwrap(), it.next().unwrap());
    let got = next_worlds(vec![(m0, vec![10, 20], 25), (m2, vec![20, 30], 27)]);
    let worlds: Vec<World> = got.into_iter().map(|(_, w)| w.unwrap()).collect();
    // Old rank 0 keeps rank 0, old rank 2 becomes rank 1.
    assert_eq!(worlds[0].rank, 0);
    assert_eq!(worlds[1].rank, 1);
    for w in &worlds {
        assert_eq!(w.generation, 1);
        assert_eq!(w.world_size, 2);
        assert_eq!(w.restore_step, Some(20));
        assert_eq!(w.survivors, 2);
        assert_eq!(w.job, "job/g1");
        assert_eq!(w.master, worlds[0].master);
    }
    let events = c.events();
    assert_eq!(events.len(), 2);
    let e = &events[1];
    assert_eq!((e.generation, e.kind.as_str()), (1, "lost"));
    assert_eq!(e.lost_ranks, [1]);
    assert_eq!(
        (e.world_size_before, e.world_size_after, e.joined),
        (3, 2, 0)
    );
    assert_eq!(
        (e.restore_step, e.reached_step, e.steps_lost),
        (Some(20), 27, 7)
    );
    assert!(e.detected_unix_s <= e.formed_unix_s);
    assert_eq!(c.generation(), Some(1));
    assert_eq!(c.world_size(), 2);
}

/// Polls rank 0's `pending` until it says `want` (a joiner's `Next` arrives on its own
/// connection, so rank 0 may ask before it is there).
fn pending_becomes(m: &mut Member, want: bool) {
    let end = Instant::now() + WAIT;
    while m.pending().unwrap() != want {
        assert!(Instant::now() < end, "pending never became {want}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_joiner_waits_until_the_ranks_admit_it_as_the_last_rank() {
    let mut cfg = config(1, 4, 3);
    cfg.timeout = Duration::from_secs(2);
    let c = Coordinator::start(cfg).unwrap();
    let ms = start_members(c.addr(), 3);
    let mut ms: Vec<Member> = ms.into_iter().map(|(m, _)| m).collect();
    assert!(!ms[0].pending().unwrap());
    let joiner = newcomer(c.addr());
    pending_becomes(&mut ms[0], true);
    // The joiner breaks nothing while it waits.
    assert_eq!(c.generation(), Some(0));
    let got = next_worlds(ms.into_iter().map(|m| (m, vec![5], 5)).collect());
    let (j, jw) = joiner.join().unwrap();
    let jw = jw.unwrap();
    assert_eq!((jw.generation, jw.rank, jw.world_size), (1, 3, 4));
    assert_eq!((jw.survivors, jw.restore_step), (3, Some(5)));
    let mut ms = Vec::new();
    for (r, (m, w)) in got.into_iter().enumerate() {
        let w = w.unwrap();
        assert_eq!((w.generation, w.rank, w.world_size), (1, r as u32, 4));
        assert_eq!(w.master, jw.master);
        ms.push(m);
    }
    ms.push(j);
    let e = &c.events()[1];
    assert_eq!(e.kind, "joined");
    assert!(e.lost_ranks.is_empty());
    assert_eq!(
        (e.world_size_before, e.world_size_after, e.joined),
        (3, 4, 1)
    );
    assert_eq!(e.steps_lost, 0);
    // The world is at max: another joiner waits, but nothing is pending.
    let late = newcomer(c.addr());
    for _ in 0..5 {
        assert!(!ms[0].pending().unwrap());
        std::thread::sleep(Duration::from_millis(20));
    }
    finish_all(&c, &mut ms);
    let (_, late) = late.join().unwrap();
    match late {
        Err(ElasticError::Aborted(why)) => assert_eq!(why, "the run finished"),
        other => panic!("the late joiner got {other:?}"),
    }
}

/// An authenticated connection speaking frames by hand.
fn raw_member(addr: SocketAddr) -> TcpStream {
    use gradwire_run::elastic::{COORDINATOR_ID, ROLE_MEMBER};
    use gradwire_transport::tcp::service::{self, Identity};
    let mut s = TcpStream::connect(addr).unwrap();
    let me = Identity {
        id: 99,
        role: ROLE_MEMBER,
    };
    service::connect(
        &mut s,
        TOKEN.as_bytes(),
        me,
        COORDINATOR_ID,
        Instant::now() + WAIT,
    )
    .unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    s
}

#[test]
fn garbage_from_a_member_is_a_loss_and_a_joiner_takes_its_place() {
    let c = Coordinator::start(config(1, 3, 2)).unwrap();
    let good = newcomer(c.addr());
    let mut raw = raw_member(c.addr());
    raw.write_all(&encode_request(&Request::Next {
        commits: vec![],
        reached: 0,
    }))
    .unwrap();
    let raw_world = match decode_reply(&read_frame(&mut raw).unwrap()).unwrap() {
        Reply::World(w) => w,
        other => panic!("{other:?}"),
    };
    let (good, good_world) = good.join().unwrap();
    assert_eq!(good_world.unwrap().world_size, 2);
    let joiner = newcomer(c.addr());
    let mut good = good;
    pending_becomes(&mut good, true);
    // A frame whose body is not a message.
    raw.write_all(&[3, 0, 0, 0, b'{', b'{', b'{']).unwrap();
    let (_, w) = ask(good, vec![7], 9).join().unwrap();
    let w = w.unwrap();
    let (_, jw) = joiner.join().unwrap();
    let jw = jw.unwrap();
    assert_eq!(
        (w.generation, w.rank, w.world_size, w.survivors),
        (1, 0, 2, 1)
    );
    assert_eq!((jw.generation, jw.rank, jw.restore_step), (1, 1, Some(7)));
    let e = &c.events()[1];
    assert_eq!(e.kind, "lost+joined");
    assert_eq!(e.lost_ranks, [raw_world.rank]);
    assert_eq!((e.joined, e.reached_step, e.steps_lost), (1, 9, 2));
    // The garbage closed its connection.
    let mut buf = [0u8; 8];
    assert!(!matches!(raw.read(&mut buf), Ok(n) if n > 0));
}

#[test]
fn a_loss_below_min_with_no_joiner_aborts_the_survivors() {
    let c = Coordinator::start(config(3, 3, 3)).unwrap();
    let mut ms = start_members(c.addr(), 3);
    let (dropped, _) = ms.pop().unwrap();
    drop(dropped);
    let got = next_worlds(ms.into_iter().map(|(m, _)| (m, vec![1], 1)).collect());
    for (_, w) in got {
        assert!(matches!(w, Err(ElasticError::Aborted(_))), "{w:?}");
    }
    assert!(matches!(c.wait(WAIT), Some(Outcome::Aborted(_))));
    assert_eq!(c.events().len(), 1);
}

#[test]
fn survivors_without_a_common_commit_are_aborted() {
    let c = Coordinator::start(config(1, 2, 2)).unwrap();
    let ms = start_members(c.addr(), 2);
    let mut it = ms.into_iter().map(|(m, _)| m);
    let (a, b) = (it.next().unwrap(), it.next().unwrap());
    let got = next_worlds(vec![(a, vec![1, 2], 2), (b, vec![3], 3)]);
    for (_, w) in got {
        assert!(matches!(w, Err(ElasticError::Aborted(_))), "{w:?}");
    }
    assert!(matches!(c.wait(WAIT), Some(Outcome::Aborted(_))));
}

#[test]
fn a_stalled_member_is_evicted_after_the_timeout() {
    let c = Coordinator::start(config(1, 3, 3)).unwrap();
    let mut ms = start_members(c.addr(), 3);
    let (mut stalled, _) = ms.remove(1);
    let got = next_worlds(ms.into_iter().map(|(m, _)| (m, vec![4], 4)).collect());
    let worlds: Vec<World> = got.into_iter().map(|(_, w)| w.unwrap()).collect();
    assert_eq!(worlds.len(), 2);
    for (r, w) in worlds.iter().enumerate() {
        assert_eq!((w.generation, w.rank, w.world_size), (1, r as u32, 2));
    }
    let e = &c.events()[1];
    assert_eq!(
        (e.kind.as_str(), e.lost_ranks.as_slice()),
        ("lost", &[1][..])
    );
    // Its connection was shut down.
    assert!(stalled.next_world(&[4], 4, WAIT).is_err());
}

#[test]
fn a_wrong_token_gets_no_reply_and_the_job_goes_on() {
    let c = Coordinator::start(config(1, 2, 1)).unwrap();
    match Member::connect(c.addr(), "a guess", WAIT) {
        Err(ElasticError::Auth(_)) => {}
        other => panic!("a wrong token connected: {other:?}"),
    }
    // A request without a handshake gets no reply byte.
    let mut raw = TcpStream::connect(c.addr()).unwrap();
    raw.write_all(&encode_request(&Request::Events)).unwrap();
    raw.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut buf = [0u8; 64];
    let got = raw.read(&mut buf);
    assert!(!matches!(got, Ok(n) if n > 0), "{got:?}: {:?}", &buf[..4]);
    let mut ms = start_members(c.addr(), 1);
    assert_eq!(ms[0].1.world_size, 1);
    let mut ms: Vec<Member> = ms.drain(..).map(|(m, _)| m).collect();
    finish_all(&c, &mut ms);
    assert_eq!(c.events().len(), 1);
}

#[test]
fn generation_zero_forms_with_those_waiting_at_the_start_timeout_if_at_least_min() {
    let mut cfg = config(2, 4, 3);
    cfg.start_timeout = Duration::from_secs(1);
    let c = Coordinator::start(cfg.clone()).unwrap();
    let ms = start_members(c.addr(), 2);
    assert_eq!(ms[1].1.world_size, 2);
    assert_eq!(c.events()[0].kind, "start");

    cfg.min = 3;
    let c = Coordinator::start(cfg).unwrap();
    let (_, w) = newcomer(c.addr()).join().unwrap();
    assert!(matches!(w, Err(ElasticError::Aborted(_))), "{w:?}");
    assert!(matches!(c.outcome(), Some(Outcome::Aborted(_))));
}

#[test]
fn the_config_is_checked_and_dropping_a_coordinator_closes_its_members() {
    for (min, max, initial) in [(0, 2, 1), (2, 4, 1), (1, 2, 3)] {
        let r = Coordinator::start(CoordinatorConfig::new(min, max, initial, TOKEN, "j"));
        assert!(matches!(r, Err(ElasticError::Sizes { .. })));
    }
    let c = Coordinator::start(config(1, 2, 1)).unwrap();
    let mut ms = start_members(c.addr(), 1);
    drop(c);
    assert!(ms[0].0.pending().is_err());
}

#[test]
fn from_env_reads_the_address_and_the_token() {
    // The only test that touches these variables.
    std::env::remove_var(ENV_ELASTIC);
    assert!(Member::from_env(WAIT).unwrap().is_none());
    std::env::set_var(ENV_ELASTIC, "not an address");
    assert!(matches!(
        Member::from_env(WAIT),
        Err(ElasticError::Address { .. })
    ));
    let c = Coordinator::start(config(1, 1, 1)).unwrap();
    std::env::set_var(ENV_ELASTIC, c.addr().to_string());
    std::env::set_var(ENV_TOKEN, TOKEN);
    let mut m = Member::from_env(WAIT).unwrap().expect("a member");
    assert_eq!(m.next_world(&[], 0, WAIT).unwrap().world_size, 1);
    std::env::remove_var(ENV_ELASTIC);
    std::env::remove_var(ENV_TOKEN);
}

// ---- the wire format ----

fn finite() -> impl Strategy<Value = f64> {
    any::<f64>().prop_filter("finite", |x| x.is_finite())
}

fn request() -> impl Strategy<Value = Request> {
    prop_oneof![
        (proptest::collection::vec(any::<u64>(), 0..16), any::<u64>())
            .prop_map(|(commits, reached)| Request::Next { commits, reached }),
        Just(Request::Pending),
        (any::<u64>(), finite())
            .prop_map(|(generation, unix_s)| Request::Resumed { generation, unix_s }),
        Just(Request::Done),
        Just(Request::Events),
    ]
}

fn event() -> impl Strategy<Value = MembershipEvent> {
    (
        any::<u64>(),
        "[a-z+]{0,12}",
        (any::<u32>(), any::<u32>(), any::<u32>()),
        proptest::collection::vec(any::<u32>(), 0..4),
        (
            proptest::option::of(any::<u64>()),
            any::<u64>(),
            any::<u64>(),
        ),
        (finite(), finite(), proptest::option::of(finite())),
    )
        .prop_map(
            |(
                generation,
                kind,
                (before, after, joined),
                lost_ranks,
                (restore, reached, lost),
                t,
            )| {
                MembershipEvent {
                    generation,
                    kind,
                    world_size_before: before,
                    world_size_after: after,
                    lost_ranks,
                    joined,
                    restore_step: restore,
                    reached_step: reached,
                    steps_lost: lost,
                    detected_unix_s: t.0,
                    formed_unix_s: t.1,
                    resumed_unix_s: t.2,
                }
            },
        )
}

fn reply() -> impl Strategy<Value = Reply> {
    prop_oneof![
        (
            any::<u64>(),
            any::<u32>(),
            any::<u32>(),
            ".{0,24}",
            ".{0,24}",
            proptest::option::of(any::<u64>()),
            any::<u32>()
        )
            .prop_map(
                |(generation, rank, world_size, master, job, restore_step, survivors)| {
                    Reply::World(World {
                        generation,
                        rank,
                        world_size,
                        master,
                        job,
                        restore_step,
                        survivors,
                    })
                }
            ),
        any::<bool>().prop_map(Reply::Pending),
        proptest::collection::vec(event(), 0..3).prop_map(Reply::Events),
        Just(Reply::Ack),
        ".{0,40}".prop_map(Reply::Abort),
    ]
}

proptest! {
    #[test]
    fn requests_round_trip_through_their_frames(r in request()) {
        let f = encode_request(&r);
        let body = read_frame(&mut &f[..]).unwrap();
        prop_assert_eq!(body.len() + 4, f.len());
        prop_assert_eq!(decode_request(&body).unwrap(), r);
    }

    #[test]
    fn replies_round_trip_through_their_frames(r in reply()) {
        let f = encode_reply(&r);
        let body = read_frame(&mut &f[..]).unwrap();
        prop_assert_eq!(decode_reply(&body).unwrap(), r);
    }

    #[test]
    fn decoding_any_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        // What decodes, encodes and decodes back to the same message.
        if let Ok(r) = decode_request(&bytes) {
            let f = encode_request(&r);
            prop_assert_eq!(decode_request(&read_frame(&mut &f[..]).unwrap()).unwrap(), r);
        }
        if let Ok(r) = decode_reply(&bytes) {
            let f = encode_reply(&r);
            prop_assert_eq!(decode_reply(&read_frame(&mut &f[..]).unwrap()).unwrap(), r);
        }
        let _ = read_frame(&mut &bytes[..]);
    }
}

#[test]
fn a_frame_over_max_message_is_refused_from_its_length() {
    // Only the prefix is there: a reader that tried to read the body would see it truncated.
    let over = (MAX_MESSAGE as u32 + 1).to_le_bytes();
    assert!(matches!(
        read_frame(&mut &over[..]),
        Err(MessageError::TooLarge { .. })
    ));
    assert!(matches!(
        read_frame(&mut &u32::MAX.to_le_bytes()[..]),
        Err(MessageError::TooLarge { .. })
    ));
    // Exactly MAX_MESSAGE is allowed (and here truncated).
    assert!(matches!(
        read_frame(&mut &(MAX_MESSAGE as u32).to_le_bytes()[..]),
        Err(MessageError::Truncated)
    ));
    assert!(matches!(
        decode_request(&vec![b' '; MAX_MESSAGE + 1]),
        Err(MessageError::TooLarge { .. })
    ));
    assert!(matches!(
        decode_request(b"{\"Next\":{\"commits\":[1]}}"),
        Err(MessageError::Malformed(_))
    ));
}
