//! The network's sizes derived from the input shape ([`Geom`]) and where each parameter
//! tensor starts in the flat buffer ([`Offsets`]).

use super::{C1, C2, F1, F2, KK};

/// Sizes derived from the input shape.
#[derive(Debug, Clone, Copy)]
pub(super) struct Geom {
    pub(super) c0: usize,
    pub(super) h0: usize,
    pub(super) w0: usize,
    /// conv2's output (conv1 keeps `h0 x w0`, the first pool halves it).
    pub(super) h2: usize,
    pub(super) w2: usize,
    /// The first pool's output.
    pub(super) hp1: usize,
    pub(super) wp1: usize,
    /// The second pool's output.
    pub(super) hp2: usize,
    pub(super) wp2: usize,
    pub(super) classes: usize,
}

impl Geom {
    pub(super) fn fc_in(&self) -> usize {
        C2 * self.hp2 * self.wp2
    }

    /// Element counts of the ten parameter tensors, in burn's visitor order.
    pub(super) fn layout(&self) -> [usize; 10] {
        [
            C1 * self.c0 * KK,
            C1,
            C2 * C1 * KK,
            C2,
            self.fc_in() * F1,
            F1,
            F1 * F2,
            F2,
            F2 * self.classes,
            self.classes,
        ]
    }
}

/// Where each parameter tensor starts in the flat buffer.
#[derive(Debug, Clone, Copy)]
pub(super) struct Offsets {
    pub(super) w1: usize,
    pub(super) b1: usize,
    pub(super) w2: usize,
    pub(super) b2: usize,
    pub(super) wf1: usize,
    pub(super) bf1: usize,
    pub(super) wf2: usize,
    pub(super) bf2: usize,
    pub(super) wf3: usize,
    pub(super) bf3: usize,
    pub(super) end: usize,
}

impl Offsets {
    pub(super) fn new(layout: &[usize; 10]) -> Offsets {
        let mut o = [0usize; 11];
        for (i, &len) in layout.iter().enumerate() {
            o[i + 1] = o[i] + len;
        }
        Offsets {
            w1: o[0],
            b1: o[1],
            w2: o[2],
            b2: o[3],
            wf1: o[4],
            bf1: o[5],
            wf2: o[6],
            bf2: o[7],
            wf3: o[8],
            bf3: o[9],
            end: o[10],
        }
    }
}
