//! Sandblaster's vector operations on the slices a shard holds.

use crate::spec::ChunkId;
use crate::wire::{ErrorCode, Request, Response, VecOp};

use super::*;

impl Shard {
    pub(super) fn slot_vecs(st: &State, slot: u64) -> Vec<(ChunkId, &[f32])> {
        if slot < 1 << 32 {
            st.chunks
                .iter()
                .filter(|(id, _)| id.key.0 == slot)
                .map(|(id, c)| (*id, &c.values[..]))
                .collect()
        } else {
            st.vecs
                .get(&slot)
                .map(|m| m.iter().map(|(id, v)| (*id, &v[..])).collect())
                .unwrap_or_default()
        }
    }

    /// Runs a vector op: checks and computes it, logs it, then writes its results.
    pub(super) fn vec_op(&self, op: VecOp) -> Result<Response, Rejection> {
        let mut st = self.lock();
        match self.plan_vec_op(&st, op, true)? {
            VecPlan::Dot(sum) => Ok(Response::Ok {
                value: sum.to_bits(),
            }),
            VecPlan::Write(c, outs) => {
                self.log_request(&mut st, &Request::VecOp(op))?;
                Self::apply_vec_op(&mut st, c, outs);
                Ok(Response::Ok { value: 0 })
            }
        }
    }

    /// Computes a vector op without writing anything. Everything is checked first: a
    /// result for a table must have the table's length (a table never changes length),
    /// results must be finite, and new scratch vectors must fit the limits (`limits`:
    /// off when replaying what was accepted before).
    pub(super) fn plan_vec_op(
        &self,
        st: &State,
        op: VecOp,
        limits: bool,
    ) -> Result<VecPlan, Rejection> {
        let get = |st: &State, slot: u64, id: ChunkId, n: usize| -> Result<Vec<f32>, Rejection> {
            Self::slot_vecs(st, slot)
                .into_iter()
                .find(|(i, _)| *i == id)
                .map(|(_, v)| v.to_vec())
                .filter(|v| v.len() == n)
                .ok_or_else(|| invalid(format!("slot {slot} has no {id} of {n} elements")))
        };
        let (a, b, c, alpha, is_axpy) = match op {
            VecOp::Dot { a, b } => {
                let mut sum = 0f64;
                for (id, va) in Self::slot_vecs(st, a) {
                    let vb = get(st, b, id, va.len())?;
                    sum += va
                        .iter()
                        .zip(&vb)
                        .map(|(x, y)| *x as f64 * *y as f64)
                        .sum::<f64>();
                }
                return Ok(VecPlan::Dot(sum));
            }
            VecOp::Axpy { a, b, c, alpha } => (a, b, c, alpha, true),
            VecOp::Scale { a, c, alpha } => (a, 0, c, alpha, false),
        };
        let mut outs = Vec::new();
        for (id, va) in Self::slot_vecs(st, a) {
            let out: Vec<f32> = if is_axpy {
                let vb = get(st, b, id, va.len())?;
                va.iter().zip(&vb).map(|(x, y)| x + alpha * y).collect()
            } else {
                va.iter().map(|x| alpha * x).collect()
            };
            if !out.iter().all(|v| v.is_finite()) {
                return Err(invalid(format!("{id}: the result is not finite")));
            }
            outs.push((id, out));
        }
        if c < 1 << 32 {
            for (id, out) in &outs {
                match st.chunks.get(id) {
                    Some(ch) if id.key.0 == c && ch.values.len() == out.len() => {}
                    Some(ch) if id.key.0 == c => {
                        return Err(err(
                            ErrorCode::ShapeMismatch,
                            None,
                            ch.values.len() as u64,
                            format!(
                                "{id} has {} elements; the result has {}",
                                ch.values.len(),
                                out.len()
                            ),
                        ))
                    }
                    _ => return Err(invalid(format!("table {c} has no {id}"))),
                }
            }
        } else if limits {
            let old = st.vecs.get(&c);
            let new = outs
                .iter()
                .filter(|(id, _)| old.is_none_or(|m| !m.contains_key(id)))
                .count();
            let freed: usize = old.map_or(0, |m| {
                outs.iter()
                    .filter_map(|(id, _)| m.get(id).map(Vec::len))
                    .sum()
            });
            let add: usize = outs.iter().map(|(_, o)| o.len()).sum();
            self.check_vectors(st, new)?;
            self.check_elements(st, add, freed)?;
        }
        Ok(VecPlan::Write(c, outs))
    }

    /// Writes checked vector-op results into slot `c`.
    pub(super) fn apply_vec_op(st: &mut State, c: u64, outs: Vec<(ChunkId, Vec<f32>)>) {
        for (id, out) in outs {
            if c < 1 << 32 {
                if let Some(ch) = st.chunks.get_mut(&id) {
                    ch.values = out;
                }
            } else {
                st.vecs.entry(c).or_default().insert(id, out);
            }
        }
    }

    /// Stores a scratch slice (checked by [`Shard::check_set_vec`]), logged first.
    pub(super) fn set_vec(
        &self,
        slot: u64,
        chunk: ChunkId,
        values: Vec<f32>,
    ) -> Result<Response, Rejection> {
        let mut st = self.lock();
        self.check_set_vec(&st, slot, chunk, &values, true)?;
        let req = Request::SetVec {
            slot,
            chunk,
            values,
        };
        self.log_request(&mut st, &req)?;
        if let Request::SetVec { values, .. } = req {
            st.vecs.entry(slot).or_default().insert(chunk, values);
        }
        Ok(Response::Ok { value: 0 })
    }

    /// Whether a scratch slice may be stored: the slot must be a scratch slot, the chunk
    /// must be on this shard, the values must have its length and be finite, and (with
    /// `limits`) the vector must fit.
    pub(super) fn check_set_vec(
        &self,
        st: &State,
        slot: u64,
        chunk: ChunkId,
        values: &[f32],
        limits: bool,
    ) -> Result<(), Rejection> {
        if slot < 1 << 32 {
            return Err(invalid(
                "SetVec slots start at 2^32 (lower slots are tables)",
            ));
        }
        let Some(len) = st.chunks.get(&chunk).map(|c| c.values.len()) else {
            return Err(err(
                ErrorCode::NotInitialized,
                None,
                0,
                format!("{chunk} is not on this shard"),
            ));
        };
        if values.len() != len {
            return Err(err(
                ErrorCode::ShapeMismatch,
                None,
                len as u64,
                format!("{chunk} has {len} elements; SetVec gave {}", values.len()),
            ));
        }
        if !values.iter().all(|v| v.is_finite()) {
            return Err(invalid(format!("{chunk}: non-finite values")));
        }
        if limits {
            let old = st.vecs.get(&slot).and_then(|m| m.get(&chunk)).map(Vec::len);
            self.check_vectors(st, usize::from(old.is_none()))?;
            self.check_elements(st, len, old.unwrap_or(0))?;
        }
        Ok(())
    }
}

/// What a vector op comes to.
pub(super) enum VecPlan {
    /// A dot product's partial sum (nothing written).
    Dot(f64),
    /// Results to write into slot `.0`.
    Write(u64, Vec<(ChunkId, Vec<f32>)>),
}
