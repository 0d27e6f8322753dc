#![no_main]
//! Fuzzes the spec strings a PS `Init` carries (updater, push codec, consistency, dead-worker
//! policy): parsing any bytes never panics, and what parses prints as a spec that parses
//! back to the same printed form.
use std::fmt::Display;
use std::str::FromStr;

use gradwire_ps::{Consistency, DeadPolicy, PushCodec, UpdaterSpec};
use libfuzzer_sys::fuzz_target;

fn round_trips<T: FromStr + Display>(s: &str) {
    if let Ok(v) = s.parse::<T>() {
        let shown = v.to_string();
        let again = shown
            .parse::<T>()
            .unwrap_or_else(|_| panic!("{s:?} printed as {shown:?}, which does not parse"));
        assert_eq!(again.to_string(), shown, "from {s:?}");
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    round_trips::<UpdaterSpec>(s);
    round_trips::<PushCodec>(s);
    round_trips::<Consistency>(s);
    let _ = s.parse::<DeadPolicy>();
});
