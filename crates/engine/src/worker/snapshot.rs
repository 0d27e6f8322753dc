//! The worker's side of [`crate::Engine::save_state`] and [`crate::Engine::load_state`]:
//! the registered tensors' states to an [`EngineState`], and back.
//!
//! Loading rebuilds every registered tensor's state from its policy, exactly as
//! [`Worker::new`] builds it for a fresh engine, loads the saved bytes into the new states,
//! and only when every tensor has accepted its part replaces the running states with them:
//! a refused state changes nothing, and loading into an engine that has already run steps
//! gives what a fresh engine given the same state gives.

use gradwire_codec::{Codec, DecodeError, Progress};

use super::Worker;
use crate::error::{Error, Result};
use crate::fusion::TensorState;
use crate::state::{EngineState, SavedTensor};

/// The state bytes of one tensor: its strategy's all-reduce's, else its codec's; none for a
/// dense tensor (and a selection unit's tensors but the first, which holds the codec).
fn save_tensor(st: &TensorState) -> Vec<u8> {
    if let Some(q) = &st.quantized {
        q.save_state()
    } else if let Some(s) = &st.stripe {
        s.save_state()
    } else if let Some(p) = &st.powersgd {
        p.save_state()
    } else if let Some(c) = &st.codec {
        c.save_state()
    } else {
        Vec::new()
    }
}

/// Loads what [`save_tensor`] saved into a state built by the same policy.
fn load_tensor(st: &mut TensorState, state: &[u8]) -> std::result::Result<(), DecodeError> {
    if let Some(q) = &mut st.quantized {
        q.load_state(state)
    } else if let Some(s) = &mut st.stripe {
        s.load_state(state)
    } else if let Some(p) = &mut st.powersgd {
        p.load_state(state)
    } else if let Some(c) = &mut st.codec {
        c.load_state(state)
    } else if state.is_empty() {
        Ok(())
    } else {
        Err(DecodeError::InvalidField {
            field: "state",
            reason: "state given for a tensor that keeps none (dense, or not a selection \
                     unit's first tensor)",
        })
    }
}

/// A mismatch of tensor `tensor` (or of the engine's own fields, `None`).
fn mismatch(
    tensor: Option<&str>,
    field: &'static str,
    saved: impl ToString,
    here: impl ToString,
) -> Error {
    Error::StateMismatch {
        tensor: tensor.map(str::to_string),
        field,
        saved: saved.to_string(),
        here: here.to_string(),
    }
}

/// Where a saved state is loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LoadMode {
    /// On the rank and world size that saved it (a resumed run): every part must load.
    Exact,
    /// On another rank or world size (elastic training after the world changed): tensors
    /// whose state does not fit start afresh.
    Elsewhere,
}

impl Worker {
    /// The names of the submissions this worker holds pending (handed to negotiation, not
    /// yet run).
    pub(crate) fn pending_names(&self) -> Vec<String> {
        self.pending.names()
    }

    /// The registered tensors' states and `progress`, between steps.
    pub(crate) fn save_state(&self, progress: Progress) -> EngineState {
        let tensors = self
            .policies
            .iter()
            .enumerate()
            .map(|(id, p)| {
                let st = &self.states[id];
                SavedTensor {
                    name: p.tensor.name.clone(),
                    policy: self.entries[id].desc.policy.clone(),
                    shape: self.entries[id].desc.shape.clone(),
                    velocity: st.velocity.clone(),
                    state: save_tensor(st),
                }
            })
            .collect();
        EngineState {
            rank: self.rank,
            world_size: self.world,
            seed: self.cfg.seed,
            step: progress.step,
            epoch: progress.epoch,
            tensors,
        }
    }

    /// Checks that `s` was saved by an engine like this one (rank, world size, seed, and
    /// every registered tensor's name, policy, shape and velocity, in order), rebuilds the
    /// registered tensors' states, loads `s` into them, and only then replaces the running
    /// ones: on any error nothing has changed.
    ///
    /// With [`LoadMode::Elsewhere`] the rank and world size are not compared, and a tensor
    /// whose state its new all-reduce refuses (the quantized ring's and the stripes'
    /// per-chunk states are sized by the world) keeps the fresh state instead: the names of
    /// those tensors are returned (none in [`LoadMode::Exact`], where a refusal fails).
    pub(crate) fn load_state(&mut self, s: &EngineState, mode: LoadMode) -> Result<Vec<String>> {
        if mode == LoadMode::Exact && s.rank != self.rank {
            return Err(mismatch(None, "rank", s.rank, self.rank));
        }
        if mode == LoadMode::Exact && s.world_size != self.world {
            return Err(mismatch(None, "world size", s.world_size, self.world));
        }
        if s.seed != self.cfg.seed {
            return Err(mismatch(None, "seed", s.seed, self.cfg.seed));
        }
        let n = self.policies.len();
        for i in 0..n.max(s.tensors.len()) {
            let (saved, here) = (s.tensors.get(i), self.policies.get(i));
            let (saved, p) = match (saved, here) {
                (Some(a), Some(p)) => (a, p),
                (Some(a), None) => {
                    return Err(mismatch(
                        Some(&a.name),
                        "tensor",
                        format!("registered tensor #{i}"),
                        "not registered",
                    ))
                }
                (None, Some(p)) => {
                    return Err(mismatch(
                        Some(&p.tensor.name),
                        "tensor",
                        "not in the state",
                        format!("registered tensor #{i}"),
                    ))
                }
                (None, None) => unreachable!("i is below one of the lengths"),
            };
            let name = &p.tensor.name;
            if saved.name != *name {
                return Err(mismatch(
                    Some(name),
                    "tensor",
                    format!("'{}' at #{i}", saved.name),
                    format!("'{name}' at #{i}"),
                ));
            }
            let desc = &self.entries[i].desc;
            if saved.policy != desc.policy {
                return Err(mismatch(Some(name), "policy", &saved.policy, &desc.policy));
            }
            if saved.shape != desc.shape {
                return Err(mismatch(
                    Some(name),
                    "shape",
                    format!("{:?}", saved.shape),
                    format!("{:?}", desc.shape),
                ));
            }
            let len = self.entries[i].len;
            let velocity_len = |v: &Option<Vec<f32>>| match v {
                Some(v) => format!("{} elements", v.len()),
                None => "none".to_string(),
            };
            let expected = self.cfg.momentum.map(|_| len);
            if saved.velocity.as_ref().map(Vec::len) != expected {
                return Err(mismatch(
                    Some(name),
                    "velocity",
                    velocity_len(&saved.velocity),
                    match expected {
                        Some(l) => format!("{l} elements"),
                        None => "none".to_string(),
                    },
                ));
            }
        }
        let mut fresh = Vec::with_capacity(n);
        let mut reset = Vec::new();
        for (i, p) in self.policies.iter().enumerate() {
            let build = |w: &Worker| match w.units.iter().position(|u| u.contains(&i)) {
                Some(u) => w.build_unit_state(u, i, &w.policies),
                None => w.build_state(i, p),
            };
            let mut st = build(self);
            let saved = &s.tensors[i];
            match load_tensor(&mut st, &saved.state) {
                Ok(()) => {}
                Err(_) if mode == LoadMode::Elsewhere => {
                    // A refused load may have changed part of the state: start it afresh.
                    st = build(self);
                    reset.push(p.tensor.name.clone());
                }
                Err(source) => {
                    return Err(Error::StateRefused {
                        tensor: p.tensor.name.clone(),
                        source,
                    })
                }
            }
            st.velocity.clone_from(&saved.velocity);
            fresh.push(st);
        }
        for (slot, st) in self.states.iter_mut().zip(fresh) {
            *slot = st;
        }
        Ok(reset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dense tensor's state: nothing to save, and only nothing loads.
    #[test]
    fn a_stateless_tensor_takes_only_an_empty_state() {
        let mut st = TensorState {
            kind: crate::fusion::Kind::Dense,
            codec: None,
            quantized: None,
            stripe: None,
            powersgd: None,
            velocity: None,
        };
        assert!(save_tensor(&st).is_empty());
        assert!(load_tensor(&mut st, &[]).is_ok());
        assert!(load_tensor(&mut st, b"GWS\x00").is_err());
    }
}
