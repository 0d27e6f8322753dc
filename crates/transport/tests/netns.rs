//! The link emulator against the kernel's own shaping: two ranks over TCP in two network
//! namespaces joined by a veth pair shaped by `tc ... tbf` at 100 Mbit/s, versus two ranks
//! over TCP loopback behind `Throttled` at 100 Mbit/s.
//!
//! Needs root, `ip` and `tc`, so it is ignored by default; run it explicitly:
//!
//! ```text
//! cargo test -p gradwire-transport --test netns -- --ignored --nocapture
//! ```
//!
//! It creates `gwa-<pid>` and `gwb-<pid>` with addresses 10.99.0.1/2 that exist only inside
//! them, and deletes both (and so the veth pair) when it ends, failed or not. Without root or
//! the tools it says loudly why it skipped.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gradwire_transport::link::{LinkConfig, Throttled};
use gradwire_transport::tcp::{self, Tcp};
use gradwire_transport::Transport;

const CHILD_VAR: &str = "GRADWIRE_NETNS_CHILD";
const MSG: usize = 256 << 10;
const COUNT: usize = 24; // 6 MiB: 0.5 s at 100 Mbit/s

/// Rank 0 streams COUNT messages to rank 1 after a tiny start message; rank 1 returns the
/// payload throughput in bits per second (None on rank 0).
fn stream(t: &mut dyn Transport) -> Option<f64> {
    let mut buf = Vec::new();
    if t.rank() == 0 {
        t.send(1, b"go").unwrap();
        let msg = vec![7u8; MSG];
        for _ in 0..COUNT {
            t.send(1, &msg).unwrap();
        }
        t.recv(1, &mut buf).unwrap(); // done
        None
    } else {
        t.recv(0, &mut buf).unwrap();
        let start = Instant::now();
        for _ in 0..COUNT {
            t.recv(0, &mut buf).unwrap();
            assert_eq!(buf.len(), MSG);
        }
        let secs = start.elapsed().as_secs_f64();
        t.send(0, b"done").unwrap();
        Some((MSG * COUNT) as f64 * 8.0 / secs)
    }
}

/// The child role: one rank inside a namespace, from the environment.
#[test]
#[ignore = "child role of kernel_shaping_matches_the_emulator"]
fn netns_child() {
    if std::env::var(CHILD_VAR).is_err() {
        return;
    }
    let (cfg, _) = gradwire_transport::env::tcp_config_from_env()
        .unwrap()
        .expect("rank from the environment");
    let mut t = Tcp::connect(&cfg).unwrap();
    if let Some(bps) = stream(&mut t) {
        println!("CHILD bps={bps}");
    }
}

/// Runs a command; Err with its output when it fails.
fn sh(args: &[&str]) -> Result<(), String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{}: {e}", args.join(" ")))?;
    if !out.status.success() {
        return Err(format!(
            "{}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

/// Two namespaces and children; all removed on drop.
struct Lab {
    ns: [String; 2],
    kids: Vec<Child>,
}

impl Drop for Lab {
    fn drop(&mut self) {
        for c in &mut self.kids {
            let _ = c.kill();
            let _ = c.wait();
        }
        for ns in &self.ns {
            let _ = sh(&["ip", "netns", "del", ns]);
        }
    }
}

fn skip(why: &str) {
    eprintln!("\n!!! kernel_shaping_matches_the_emulator SKIPPED: {why}\n");
}

#[test]
#[ignore = "needs root, ip and tc; run with --ignored"]
fn kernel_shaping_matches_the_emulator() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return skip("not root (network namespaces need CAP_NET_ADMIN)");
    }
    for tool in ["ip", "tc"] {
        if Command::new(tool).arg("-V").output().is_err() {
            return skip(&format!("`{tool}` not found"));
        }
    }
    let pid = std::process::id();
    let mut lab = Lab {
        ns: [format!("gwa-{pid}"), format!("gwb-{pid}")],
        kids: Vec::new(),
    };
    let (va, vb) = (
        format!("gwa{}", pid % 100_000),
        format!("gwb{}", pid % 100_000),
    );
    let [na, nb] = lab.ns.clone();
    let setup = [
        vec!["ip", "netns", "add", &na],
        vec!["ip", "netns", "add", &nb],
        vec![
            "ip", "link", "add", &va, "type", "veth", "peer", "name", &vb,
        ],
        vec!["ip", "link", "set", &va, "netns", &na],
        vec!["ip", "link", "set", &vb, "netns", &nb],
        vec!["ip", "-n", &na, "addr", "add", "10.99.0.1/24", "dev", &va],
        vec!["ip", "-n", &nb, "addr", "add", "10.99.0.2/24", "dev", &vb],
        vec!["ip", "-n", &na, "link", "set", &va, "up"],
        vec!["ip", "-n", &nb, "link", "set", &vb, "up"],
        vec!["ip", "-n", &na, "link", "set", "lo", "up"],
        vec!["ip", "-n", &nb, "link", "set", "lo", "up"],
    ];
    for cmd in &setup {
        if let Err(e) = sh(cmd) {
            return skip(&format!("cannot build the namespaces ({e})"));
        }
    }
    for (ns, dev) in [(&na, &va), (&nb, &vb)] {
        let tbf = [
            "ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate",
            "100mbit", "burst", "32kb", "latency", "50ms",
        ];
        if let Err(e) = sh(&tbf) {
            return skip(&format!("tc tbf not available ({e})"));
        }
    }

    // Kernel: one rank per namespace over TCP through the shaped veth pair.
    let exe = std::env::current_exe().unwrap();
    let token = format!("netns-{:016x}", rand::random::<u64>());
    for (rank, ns) in [(0, &na), (1, &nb)] {
        let child = Command::new("ip")
            .args(["netns", "exec", ns])
            .arg(&exe)
            .args(["netns_child", "--exact", "--ignored", "--nocapture"])
            .env(CHILD_VAR, "1")
            .env("GRADWIRE_RANK", rank.to_string())
            .env("GRADWIRE_WORLD_SIZE", "2")
            .env("GRADWIRE_MASTER_ADDR", "10.99.0.1")
            .env("GRADWIRE_MASTER_PORT", "29517")
            .env("GRADWIRE_TOKEN", &token)
            .env("GRADWIRE_TIMEOUT", "20")
            .stdout(if rank == 1 {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        lab.kids.push(child);
        if rank == 0 {
            std::thread::sleep(Duration::from_millis(200)); // let rank 0 bind the master
        }
    }
    let out = lab.kids[1].stdout.take().unwrap();
    // Read to the end (a closed pipe would fail the child's own test output).
    let lines: Vec<String> = BufReader::new(out).lines().map_while(|l| l.ok()).collect();
    let kernel: f64 = lines
        .iter()
        .find_map(|l| l.strip_prefix("CHILD bps=").and_then(|v| v.parse().ok()))
        .unwrap_or_else(|| panic!("rank 1 reported no throughput: {lines:?}"));
    for c in &mut lab.kids {
        assert!(c.wait().unwrap().success());
    }

    // Emulator: the same stream over TCP loopback behind Throttled at 100 Mbit/s.
    let cfg: LinkConfig = "100mbit".parse().unwrap();
    let world = Throttled::wrap_all(tcp::loopback_world(2).unwrap(), &cfg);
    let got: Vec<Option<f64>> = std::thread::scope(|s| {
        let hs: Vec<_> = world
            .into_iter()
            .map(|mut t| s.spawn(move || stream(&mut t)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let emulated = got[1].unwrap();
    let ratio = kernel / emulated;
    eprintln!(
        "\n100 Mbit/s link, {} MiB stream: kernel tbf over veth {:.2} Mbit/s of payload, \
         emulator {:.2} Mbit/s, kernel/emulator {ratio:.3}\n",
        (MSG * COUNT) >> 20,
        kernel / 1e6,
        emulated / 1e6
    );
    // The kernel also carries TCP/IP and Ethernet headers (about 4.5% at a 1500-byte MTU),
    // which the emulator charges only when `overhead=` says so.
    assert!((0.85..=1.05).contains(&ratio), "kernel/emulator {ratio:.3}");
}
