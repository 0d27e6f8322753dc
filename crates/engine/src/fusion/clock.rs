//! The timeline phases of one group ([`Clock`]).

use crate::timeline::{now_us, Phase};

/// Records consecutive phases of one group, for the timeline; without one it records
/// nothing and reads no clock (a group's phases are only ever written to the timeline).
#[derive(Debug, Default)]
pub(crate) struct Clock {
    pub spans: Vec<(Phase, u64, u64)>,
    last: u64,
    on: bool,
}

impl Clock {
    /// A clock started now; `on`: the engine keeps a timeline.
    pub(crate) fn start(on: bool) -> Clock {
        Clock {
            spans: Vec::new(),
            last: if on { now_us() } else { 0 },
            on,
        }
    }

    /// Ends the current phase as `phase`.
    pub(crate) fn mark(&mut self, phase: Phase) {
        if self.on {
            let now = now_us();
            self.spans.push((phase, self.last, now));
            self.last = now;
        }
    }

    /// Records a phase timed elsewhere.
    pub(crate) fn span(&mut self, phase: Phase, start_us: u64, end_us: u64) {
        if self.on {
            self.spans.push((phase, start_us, end_us));
        }
    }
}
