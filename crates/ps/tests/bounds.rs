//! Bounds: a pull whose reply would pass the frame limit, a header announcing 64 MiB, many
//! idle connections, running out of file descriptors, and the limits on what a shard
//! holds each get a typed refusal (or cost nothing), and the shard keeps serving.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{authed, client, KillOnDrop};
use gradwire_ps::wire::{
    read_frame, Encoding, ErrorCode, Push, Request, Response, VecOp, DEFAULT_MAX_BODY, HEADER_LEN,
};
use gradwire_ps::{
    ChunkId, Consistency, Key, Limits, PushMode, Role, Server, ServerConfig, Shard, ShardConfig,
    TableSpec, UpdaterSpec, WorkerId,
};

const BIN: &str = env!("CARGO_BIN_EXE_gradwire-ps-server");

fn chunk(key: u64) -> ChunkId {
    ChunkId {
        key: Key(key),
        index: 0,
    }
}

fn ask(s: &mut TcpStream, req: &Request) -> Response {
    let mut f = Vec::new();
    req.encode(21, &mut f);
    s.write_all(&f).unwrap();
    let mut body = Vec::new();
    let h = read_frame(s, DEFAULT_MAX_BODY, &mut body).unwrap();
    Response::decode(&h, &body).unwrap()
}

fn error(r: Response) -> gradwire_ps::RemoteError {
    match r {
        Response::Error(e) => e,
        other => panic!("expected an error, got {other:?}"),
    }
}

fn start(tweak: impl Fn(&mut ServerConfig)) -> Server {
    let mut cfg = ServerConfig::loopback(ShardConfig {
        num_workers: 2,
        ..ShardConfig::default()
    });
    tweak(&mut cfg);
    Server::start(cfg).unwrap()
}

/// The shard still serves: a fresh worker pushes and reads its push back.
fn still_serves(addr: SocketAddr, key: u64) {
    let mut kv = client(0, vec![addr]);
    let spec = TableSpec::new(Consistency::Async, UpdaterSpec::Sum);
    kv.init(Key(key), spec, &[0.0; 8]).unwrap();
    kv.push_with(Key(key), &[1.0; 8], PushMode::Add).unwrap();
    let mut out = [0.0f32; 8];
    kv.pull(Key(key), &mut out).unwrap();
    assert_eq!(out, [1.0; 8]);
}

#[test]
fn a_pull_repeating_a_row_past_the_frame_limit_is_refused_before_it_is_built() {
    let srv = start(|c| c.shard.max_body = 1 << 20);
    let addr = srv.local_addr();
    let mut coord = authed(addr, 0, Role::Coordinator);
    let init = Request::Init {
        chunk: chunk(1),
        spec: TableSpec::new(Consistency::Async, UpdaterSpec::Sum).with_row_len(1024),
        values: vec![0.5; 4 * 1024],
    };
    assert_eq!(ask(&mut coord, &init), Response::Ok { value: 1 });
    // 100,000 copies of row 0 (a 400 KB request): a 400 MB reply if it were built.
    let pull = |rows: Vec<u32>| Request::Pull {
        worker: WorkerId(0),
        chunk: chunk(1),
        clock: 0,
        rows: Some(rows),
    };
    let e = error(ask(&mut coord, &pull(vec![0; 100_000])));
    assert_eq!(e.code, ErrorCode::LimitExceeded, "{e:?}");
    assert_eq!(e.value, 1 << 20, "the limit is named");
    // The same connection, and others, are served on.
    match ask(&mut coord, &pull(vec![3, 0, 3])) {
        Response::Values { values, .. } => assert_eq!(values.len(), 3 * 1024),
        other => panic!("{other:?}"),
    }
    assert_eq!(srv.shard().stats().limited, 1);
    still_serves(addr, 2);
}

#[test]
fn a_header_announcing_64_mib_gets_a_typed_error_and_commits_no_memory() {
    let srv = start(|c| c.frame_timeout = Duration::from_millis(500));
    let addr = srv.local_addr();
    let mut s = authed(addr, 1, Role::Worker);
    let mut f = Vec::new();
    Request::Stats.encode(77, &mut f);
    f[8..12].copy_from_slice(&(64u32 << 20).to_le_bytes());
    s.write_all(&f[..HEADER_LEN]).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let t0 = Instant::now();
    let mut body = Vec::new();
    let h = read_frame(&mut s, DEFAULT_MAX_BODY, &mut body).expect("a typed error reply");
    let e = error(Response::decode(&h, &body).unwrap());
    assert_eq!(e.code, ErrorCode::Truncated, "{e:?}");
    assert!(t0.elapsed() < Duration::from_secs(3));
    let mut rest = [0u8; 8];
    assert!(matches!(s.read(&mut rest), Ok(0) | Err(_)), "then closed");
    assert_eq!(srv.shard().stats().rejected_frames, 1);
    still_serves(addr, 1);
}

/// Raises the soft limit on open files to the hard one; returns the soft limit now.
fn raise_fd_limit() -> u64 {
    // SAFETY: getrlimit/setrlimit on this process with a valid, initialized struct.
    unsafe {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return 1024;
        }
        r.rlim_cur = r.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        r.rlim_cur
    }
}

/// This process's resident memory in bytes.
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    // SAFETY: sysconf has no preconditions.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64
}

#[test]
fn two_thousand_idle_connections_and_stalled_64_mib_headers_do_not_stop_a_worker() {
    // Each idle connection costs this process two descriptors (both ends); the count is
    // the 2,000 unless the hard limit is lower.
    let limit = raise_fd_limit();
    let idle = 2000.min((limit.saturating_sub(200) / 2) as usize);
    eprintln!("{idle} idle connections (open-file limit {limit})");
    let srv = start(|c| c.frame_timeout = Duration::from_secs(20));
    let addr = srv.local_addr();
    let before = rss();
    let strangers: Vec<TcpStream> = (0..idle)
        .filter_map(|_| TcpStream::connect(addr).ok())
        .collect();
    assert!(
        strangers.len() * 10 >= idle * 9,
        "{} connected",
        strangers.len()
    );
    // Workers with the token that announce 64 MiB frames and stop (40 x 64 MiB = 2.5 GiB
    // if a shard committed memory for headers).
    let mut f = Vec::new();
    Request::Stats.encode(1, &mut f);
    f[8..12].copy_from_slice(&(64u32 << 20).to_le_bytes());
    let stalled: Vec<TcpStream> = (0..40)
        .map(|i| {
            let mut s = authed(addr, i % 2, Role::Worker);
            s.write_all(&f[..HEADER_LEN]).unwrap();
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    // A worker trains on.
    let t0 = Instant::now();
    let mut kv = client(0, vec![addr]);
    let spec = TableSpec::new(Consistency::Async, UpdaterSpec::Sum);
    kv.init(Key(1), spec, &[0.0; 1000]).unwrap();
    let mut out = vec![0.0f32; 1000];
    for _ in 0..50 {
        kv.push_pull_with(Key(1), &[1.0; 1000], PushMode::Add, &mut out)
            .unwrap();
    }
    assert_eq!(out, vec![50.0; 1000]);
    assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", t0.elapsed());
    let grown = rss().saturating_sub(before);
    assert!(grown < 512 << 20, "resident memory grew by {grown} bytes");
    drop((strangers, stalled));
}

/// Starts the shard binary under `sh` with at most `fds` open files; returns the guard,
/// its pid and address.
fn shard_with_fd_limit(fds: u32) -> (KillOnDrop, u32, SocketAddr) {
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -n {fds} && exec \"$0\" --listen 127.0.0.1:0 --workers 1"
        ))
        .arg(BIN)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let guard = KillOnDrop(Some(child));
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
    (guard, pid, addr)
}

/// CPU time (user + system) of process `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command's closing parenthesis: state is field 3, utime 14, stime 15.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

#[test]
fn out_of_file_descriptors_the_accept_loop_backs_off_and_serves_again() {
    let (_guard, pid, addr) = shard_with_fd_limit(24);
    // More connections than the shard has descriptors: accept(2) fails with EMFILE.
    let strangers: Vec<TcpStream> = (0..60)
        .filter_map(|_| TcpStream::connect(addr).ok())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let t0 = cpu_ticks(pid);
    std::thread::sleep(Duration::from_secs(2));
    let used = cpu_ticks(pid) - t0;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    assert!(
        used * 4 < hz,
        "the shard used {used} ticks of CPU in 2 s ({hz}/s) while out of descriptors"
    );
    drop(strangers);
    still_serves(addr, 1);
}

#[test]
fn limits_on_chunks_elements_and_vectors_are_typed_refusals_and_tables_keep_their_length() {
    let shard = Shard::open(ShardConfig {
        num_workers: 1,
        limits: Limits {
            max_chunks: 2,
            max_elements: 100,
            max_vectors: 2,
            ..Limits::default()
        },
        ..ShardConfig::default()
    })
    .unwrap();
    let spec = TableSpec::new(Consistency::Async, UpdaterSpec::Sum);
    let init = |key: u64, n: usize| Request::Init {
        chunk: chunk(key),
        spec: spec.clone(),
        values: vec![1.0; n],
    };
    let limited = |r: Response, limit: u64| {
        let e = error(r);
        assert_eq!(
            (e.code, e.value),
            (ErrorCode::LimitExceeded, limit),
            "{e:?}"
        );
    };
    limited(shard.handle(init(1, 101)), 100);
    assert_eq!(shard.handle(init(1, 2)), Response::Ok { value: 1 });
    assert_eq!(shard.handle(init(2, 60)), Response::Ok { value: 1 });
    limited(shard.handle(init(3, 1)), 2);
    // A scratch vector must have its chunk's length: no table can be given another length
    // through one (an assign push into it would then not fit).
    let set = |slot: u64, key: u64, n: usize| Request::SetVec {
        slot,
        chunk: chunk(key),
        values: vec![2.0; n],
    };
    let e = error(shard.handle(set(1 << 33, 1, 3)));
    assert_eq!(e.code, ErrorCode::ShapeMismatch);
    assert_eq!(shard.handle(set(1 << 33, 1, 2)), Response::Ok { value: 0 });
    // 62 + 2 + 60 > 100: a scratch copy of table 2 does not fit.
    limited(shard.handle(set(1 << 33, 2, 60)), 100);
    assert_eq!(shard.handle(set(1 << 34, 1, 2)), Response::Ok { value: 0 });
    limited(shard.handle(set(1 << 35, 1, 2)), 2);
    let scale = Request::VecOp(VecOp::Scale {
        a: 1 << 33,
        c: 1,
        alpha: 2.0,
    });
    assert_eq!(shard.handle(scale), Response::Ok { value: 0 });
    let assign = Request::Push(Push {
        worker: WorkerId(0),
        incarnation: 1,
        seq: 0,
        chunk: chunk(1),
        clock: 0,
        mode: PushMode::Assign,
        encoding: Encoding::Dense,
        payload: [5f32, 6.0].iter().flat_map(|x| x.to_le_bytes()).collect(),
    });
    assert!(matches!(shard.handle(assign), Response::Ok { .. }));
    let pull = Request::Pull {
        worker: WorkerId(0),
        chunk: chunk(1),
        clock: 0,
        rows: None,
    };
    assert!(matches!(shard.handle(pull), Response::Values { values, .. } if values == [5.0, 6.0]));
    assert_eq!(shard.stats().limited, 4);
}
