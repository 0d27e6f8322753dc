//! `gradwire ps serve`, end to end: a parameter-server shard process serving a worker of
//! `gradwire-ps`. The shard is owned by a guard that kills it on drop.

mod common;

use std::process::Stdio;
use std::sync::mpsc;
use std::time::Duration;

use common::{gradwire, output_within, Procs};

/// `gradwire ps serve` prints its address and serves a worker: two integer pushes to a
/// `sum` table in async mode are pulled back exactly; a bad flag combination is refused.
#[test]
fn ps_serve_serves_pushes_and_pulls() {
    use gradwire_ps::{ClientConfig, Consistency, Key, KvStore, TableSpec, WorkerId};
    use std::io::{BufRead, BufReader};

    let mut child = gradwire()
        .args(["ps", "serve", "--workers", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let _guard = Procs(vec![child]);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(out).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("ps serve printed its address");
    let addr: std::net::SocketAddr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("first line {line:?}"))
        .parse()
        .unwrap();
    let mut kv = KvStore::connect(ClientConfig::new(WorkerId(0), vec![addr])).unwrap();
    let spec = TableSpec::new(Consistency::Async, "sum".parse().unwrap());
    kv.init(Key(7), spec, &[0.0; 5]).unwrap();
    kv.push(Key(7), &[1.0, 2.0, 3.0, 4.0, 5.0]).unwrap();
    kv.push(Key(7), &[10.0, 20.0, 30.0, 40.0, 50.0]).unwrap();
    let mut got = [0.0f32; 5];
    kv.pull(Key(7), &mut got).unwrap();
    assert_eq!(got, [11.0, 22.0, 33.0, 44.0, 55.0]);
    kv.leave().unwrap();

    let out = output_within(
        {
            let mut c = gradwire();
            c.args(["ps", "serve", "--wal"]);
            c
        },
        Duration::from_secs(20),
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--dir"));
}
