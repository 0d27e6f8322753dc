//! `gradwire-ps-server`: runs one parameter-server shard until killed.
//!
//! ```text
//! gradwire-ps-server [--listen ADDR] [--shard-id N] [--workers N] [--dir PATH] [--wal]
//!                    [--no-fsync] [--heartbeat-timeout-ms MS] [--max-wait-ms MS]
//!                    [--checkpoint-every-ms MS] [--insecure]
//! ```
//! Prints `listening on ADDR` on its first stdout line (tests and launchers read it).
//! Connections must prove the token in `GRADWIRE_PS_TOKEN`, else `GRADWIRE_TOKEN`; off
//! loopback the shard refuses to start without one unless given `--insecure`.

use std::io::Write;
use std::time::Duration;

use gradwire_ps::{Server, ServerConfig, ShardConfig};

fn main() {
    if let Err(e) = run() {
        eprintln!("gradwire-ps-server: {e}");
        std::process::exit(2);
    }
}

fn run() -> Result<(), String> {
    let mut shard = ShardConfig::default();
    let mut cfg = ServerConfig::loopback(ShardConfig::default());
    let mut ckpt_every = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        let ms = |v: String| {
            v.parse::<u64>()
                .map(Duration::from_millis)
                .map_err(|e| e.to_string())
        };
        match a.as_str() {
            "--listen" => {
                cfg.listen = val("--listen")?
                    .parse()
                    .map_err(|e| format!("--listen: {e}"))?
            }
            "--shard-id" => {
                shard.shard_id = val("--shard-id")?
                    .parse()
                    .map_err(|e| format!("--shard-id: {e}"))?
            }
            "--workers" => {
                shard.num_workers = val("--workers")?
                    .parse()
                    .map_err(|e| format!("--workers: {e}"))?
            }
            "--dir" => shard.dir = Some(val("--dir")?.into()),
            "--wal" => shard.wal = true,
            "--no-fsync" => shard.wal_sync = false,
            "--heartbeat-timeout-ms" => {
                shard.heartbeat_timeout = ms(val("--heartbeat-timeout-ms")?)?
            }
            "--max-wait-ms" => shard.max_wait = ms(val("--max-wait-ms")?)?,
            "--checkpoint-every-ms" => ckpt_every = Some(ms(val("--checkpoint-every-ms")?)?),
            "--insecure" => cfg.insecure = true,
            "-h" | "--help" => {
                println!("usage: gradwire-ps-server [--listen ADDR] [--shard-id N] [--workers N] [--dir PATH] [--wal] [--no-fsync] [--heartbeat-timeout-ms MS] [--max-wait-ms MS] [--checkpoint-every-ms MS] [--insecure]");
                return Ok(());
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if shard.wal && shard.dir.is_none() {
        return Err("--wal needs --dir".into());
    }
    cfg.shard = shard;
    cfg.checkpoint_every = ckpt_every;
    let server = Server::start(cfg).map_err(|e| e.to_string())?;
    println!("listening on {}", server.local_addr());
    std::io::stdout().flush().map_err(|e| e.to_string())?;
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}
