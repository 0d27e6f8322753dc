//! `gradwire-ps-server`: runs one parameter-server shard until killed, with the flags of
//! `gradwire ps serve` ([`gradwire_ps::serve::ServeArgs`]); the crate's process tests start
//! it. Prints `listening on ADDR` on its first stdout line.

use clap::Parser;
use gradwire_ps::serve::{serve, ServeArgs};

/// Serve one parameter-server shard until killed.
#[derive(Parser)]
#[command(name = "gradwire-ps-server", version)]
struct Cli {
    #[command(flatten)]
    serve: ServeArgs,
}

fn main() {
    let cli = Cli::parse();
    let Err(e) = serve(&cli.serve, 0);
    eprintln!("gradwire-ps-server: {e}");
    std::process::exit(2);
}
