//! The timeline: spans per tensor per rank, written as Chrome trace JSON
//! (`{"traceEvents":[...]}`, open in `chrome://tracing` or Perfetto), one file per rank, and
//! [`merge_traces`] to put every rank's file into one.
//!
//! Each span is a complete event (`"ph":"X"`) named after its [`Phase`], with `pid` = rank,
//! `tid` = the tensor's row (in order of first appearance on this rank; `"M"` metadata events
//! name the rows and the process) and `args.tensor` = the tensor's name. Times are system time
//! in microseconds since the Unix epoch ([`now_us`]), so ranks on one host line up.
//!
//! Engine phases per tensor: `NEGOTIATE` (this rank submitted it → the round that found it
//! ready on every rank), `QUEUE` (→ its fused group starts), `FUSE` (momentum correction and
//! packing), `ENCODE`, `WIRE` (the collective), `DECODE`, `UNFUSE` (unpacking, handing back).
//! For a fused group the group's `FUSE`/`ENCODE`/`WIRE`/`DECODE`/`UNFUSE` spans are recorded on
//! every tensor of the group. The trainer adds its own with
//! [`Engine::record_span`](crate::Engine::record_span).

use std::collections::HashMap;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::error::{Error, Result};

/// Microseconds since the Unix epoch (the clock every rank on a host shares).
pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// What a span measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Submitted here → found ready on every rank.
    Negotiate,
    /// Agreed → its group's execution starts.
    Queue,
    /// Momentum correction and packing into the fusion buffer.
    Fuse,
    /// Codec encoding.
    Encode,
    /// On the wire (the collective call).
    Wire,
    /// Codec decoding.
    Decode,
    /// Unpacking and handing the result back.
    Unfuse,
    /// The optimizer's update (recorded by the trainer).
    Update,
    /// Forward pass (recorded by the trainer).
    Forward,
    /// Backward pass (recorded by the trainer).
    Backward,
}

impl Phase {
    /// The name in the trace.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Negotiate => "NEGOTIATE",
            Phase::Queue => "QUEUE",
            Phase::Fuse => "FUSE",
            Phase::Encode => "ENCODE",
            Phase::Wire => "WIRE",
            Phase::Decode => "DECODE",
            Phase::Unfuse => "UNFUSE",
            Phase::Update => "UPDATE",
            Phase::Forward => "FORWARD",
            Phase::Backward => "BACKWARD",
        }
    }
}

/// One recorded interval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Span {
    /// The tensor (or, for trainer phases, whatever name the trainer gives).
    pub tensor: String,
    /// The phase.
    pub phase: Phase,
    /// The rank that recorded it.
    pub rank: usize,
    /// Start, µs since the epoch.
    pub start_us: u64,
    /// End, µs since the epoch (`>= start_us`).
    pub end_us: u64,
}

/// Chrome trace JSON of one rank's spans (`pid` = `rank`).
pub fn chrome_trace(rank: usize, spans: &[Span]) -> Value {
    let mut rows: HashMap<&str, usize> = HashMap::new();
    let mut events = vec![json!({
        "name": "process_name", "ph": "M", "pid": rank, "tid": 0,
        "args": {"name": format!("rank {rank}")}
    })];
    for s in spans {
        let next = rows.len();
        let tid = *rows.entry(s.tensor.as_str()).or_insert_with(|| {
            events.push(json!({
                "name": "thread_name", "ph": "M", "pid": rank, "tid": next,
                "args": {"name": s.tensor}
            }));
            next
        });
        events.push(json!({
            "name": s.phase.as_str(), "cat": "gradwire", "ph": "X",
            "ts": s.start_us, "dur": s.end_us.saturating_sub(s.start_us),
            "pid": rank, "tid": tid, "args": {"tensor": s.tensor}
        }));
    }
    json!({ "traceEvents": events })
}

/// Writes [`chrome_trace`] to `path`.
pub fn write_trace(path: &Path, rank: usize, spans: &[Span]) -> Result<()> {
    let err = |reason: String| Error::Timeline {
        path: path.display().to_string(),
        reason,
    };
    let text = serde_json::to_string(&chrome_trace(rank, spans)).map_err(|e| err(e.to_string()))?;
    std::fs::write(path, text).map_err(|e| err(e.to_string()))
}

/// Merges Chrome traces (one per rank) into one: the concatenation of their `traceEvents`.
/// A document without a `traceEvents` array is an error naming its position.
pub fn merge_trace_values(docs: &[Value]) -> Result<Value> {
    let mut events = Vec::new();
    for (i, d) in docs.iter().enumerate() {
        let ev = d
            .get("traceEvents")
            .and_then(Value::as_array)
            .ok_or_else(|| Error::Timeline {
                path: format!("trace #{i}"),
                reason: "no traceEvents array".into(),
            })?;
        events.extend(ev.iter().cloned());
    }
    Ok(json!({ "traceEvents": events }))
}

/// Reads per-rank trace files and writes their merge to `out`.
pub fn merge_traces(inputs: &[&Path], out: &Path) -> Result<()> {
    let mut docs = Vec::new();
    for p in inputs {
        let err = |reason: String| Error::Timeline {
            path: p.display().to_string(),
            reason,
        };
        let text = std::fs::read_to_string(p).map_err(|e| err(e.to_string()))?;
        docs.push(serde_json::from_str(&text).map_err(|e| err(e.to_string()))?);
    }
    let merged = merge_trace_values(&docs)?;
    std::fs::write(out, merged.to_string()).map_err(|e| Error::Timeline {
        path: out.display().to_string(),
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_shape_and_merge() {
        let span = |tensor: &str, phase, rank| Span {
            tensor: tensor.into(),
            phase,
            rank,
            start_us: 10,
            end_us: 25,
        };
        let a = chrome_trace(0, &[span("w", Phase::Wire, 0), span("b", Phase::Encode, 0)]);
        let b = chrome_trace(1, &[span("w", Phase::Wire, 1)]);
        let ev = a["traceEvents"].as_array().unwrap();
        let x: Vec<&Value> = ev.iter().filter(|e| e["ph"] == "X").collect();
        assert_eq!(x.len(), 2);
        assert_eq!(x[0]["name"], "WIRE");
        assert_eq!(x[0]["dur"], 15);
        assert_eq!(x[1]["tid"], 1);
        assert_eq!(x[1]["args"]["tensor"], "b");
        let m = merge_trace_values(&[a, b]).unwrap();
        let pids: Vec<u64> = m["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ph"] == "X")
            .map(|e| e["pid"].as_u64().unwrap())
            .collect();
        assert_eq!(pids, vec![0, 0, 1]);
        assert!(merge_trace_values(&[json!({})]).is_err());
    }
}
