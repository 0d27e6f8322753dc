//! The TCP mesh between a job's ranks (`gradwire check` as rank processes): a rank killed
//! mid-job is named by every survivor within the deadline, and a stranger with a wrong token
//! or random bytes is refused while the job completes. Every child is owned by a
//! [`common::Procs`] guard that kills it on drop.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{free_port, gradwire, rank_env, Procs};

#[test]
fn killed_rank_is_named_by_every_survivor_within_the_deadline() {
    let n = 4;
    let port = free_port();
    let mut procs = Procs(Vec::new());
    let mut ready = Vec::new();
    for r in 0..n {
        let mut cmd = gradwire();
        cmd.args(["check", "--elements", "50000", "--iters", "1000000000"]);
        rank_env(&mut cmd, r, n, port, "kill-test");
        cmd.env("GRADWIRE_TIMEOUT", "5")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                if line.is_err() || tx.send(()).is_err() {
                    break;
                }
            }
        });
        ready.push(rx);
        procs.0.push(child);
    }
    // Wait until every rank is inside the all-reduce loop, then kill rank 2.
    for rx in &ready {
        rx.recv_timeout(Duration::from_secs(30))
            .expect("rank started its loop");
    }
    procs.0[2].kill().unwrap();
    let killed_at = Instant::now();
    for r in [0, 1, 3] {
        let child = &mut procs.0[r];
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            assert!(
                killed_at.elapsed() < Duration::from_secs(15),
                "rank {r} still running 15 s after the kill"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(!status.success(), "rank {r} should fail");
        let mut err = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        assert!(
            err.contains("rank 2"),
            "rank {r}'s error should name rank 2: {err}"
        );
    }
}

#[test]
fn wrong_token_and_garbage_are_refused_while_the_job_completes() {
    let n = 2;
    let port = free_port();
    let mut procs = Procs(Vec::new());
    let mut cmd0 = gradwire();
    cmd0.args(["check", "--elements", "1000", "--iters", "2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    rank_env(&mut cmd0, 0, n, port, "the-right-token");
    procs.0.push(cmd0.spawn().unwrap());
    // Once rank 0 listens: a stranger with a wrong token, and one sending random bytes.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut wrong = loop {
        match TcpStream::connect((Ipv4Addr::LOCALHOST, port)) {
            Ok(s) => break s,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("rank 0 never listened: {e}"),
        }
    };
    // A well-formed hello (magic GWH1, kind 1, rank 1, world 2, port 1) with a wrong token.
    let mut hello = Vec::new();
    hello.extend_from_slice(&0x3148_5747u32.to_le_bytes());
    hello.push(1);
    hello.extend_from_slice(&1u32.to_le_bytes());
    hello.extend_from_slice(&2u32.to_le_bytes());
    hello.extend_from_slice(&1u16.to_le_bytes());
    hello.extend_from_slice(&5u16.to_le_bytes());
    hello.extend_from_slice(b"wrong");
    wrong.write_all(&hello).unwrap();
    let mut junk = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).unwrap();
    let garbage: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    junk.write_all(&garbage).unwrap();
    // Now the real rank 1.
    let mut cmd1 = gradwire();
    cmd1.args(["check", "--elements", "1000", "--iters", "2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    rank_env(&mut cmd1, 1, n, port, "the-right-token");
    procs.0.push(cmd1.spawn().unwrap());
    for (r, child) in procs.0.iter_mut().enumerate() {
        let start = Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            assert!(start.elapsed() < Duration::from_secs(30), "rank {r} hung");
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut out = String::new();
        child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        let mut err = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        assert!(status.success(), "rank {r} failed: {out}\n{err}");
        assert!(
            out.contains("iteration 1: all-reduce of 1000 elements ok"),
            "{out}"
        );
        if r == 0 {
            assert!(
                err.contains("refused"),
                "rank 0 should log the refused connections: {err}"
            );
        }
    }
}
