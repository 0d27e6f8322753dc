//! Sandblaster's vector operations on the slices a shard holds.

use crate::spec::ChunkId;
use crate::wire::{Response, VecOp};

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

    pub(super) fn vec_op(&self, op: VecOp) -> Result<Response, Rejection> {
        let mut st = self.lock();
        let get = |st: &State, slot: u64, id: ChunkId, n: usize| -> Result<Vec<f32>, Rejection> {
            Self::slot_vecs(st, slot)
                .into_iter()
                .find(|(i, _)| *i == id)
                .map(|(_, v)| v.to_vec())
                .filter(|v| v.len() == n)
                .ok_or_else(|| invalid(format!("slot {slot} has no {id} of {n} elements")))
        };
        match op {
            VecOp::Dot { a, b } => {
                let mut sum = 0f64;
                for (id, va) in Self::slot_vecs(&st, a) {
                    let vb = get(&st, b, id, va.len())?;
                    sum += va
                        .iter()
                        .zip(&vb)
                        .map(|(x, y)| *x as f64 * *y as f64)
                        .sum::<f64>();
                }
                Ok(Response::Ok {
                    value: sum.to_bits(),
                })
            }
            VecOp::Axpy { .. } | VecOp::Scale { .. } => {
                let (a, b, c, alpha, is_axpy) = match op {
                    VecOp::Axpy { a, b, c, alpha } => (a, b, c, alpha, true),
                    VecOp::Scale { a, c, alpha } => (a, 0, c, alpha, false),
                    VecOp::Dot { .. } => unreachable!("matched above"),
                };
                let srcs: Vec<(ChunkId, Vec<f32>)> = Self::slot_vecs(&st, a)
                    .into_iter()
                    .map(|(id, v)| (id, v.to_vec()))
                    .collect();
                let mut outs = Vec::with_capacity(srcs.len());
                for (id, va) in srcs {
                    let out: Vec<f32> = if is_axpy {
                        let vb = get(&st, b, id, va.len())?;
                        va.iter().zip(&vb).map(|(x, y)| x + alpha * y).collect()
                    } else {
                        va.iter().map(|x| alpha * x).collect()
                    };
                    outs.push((id, out));
                }
                for (id, out) in outs {
                    if c < 1 << 32 {
                        match st.chunks.get_mut(&id) {
                            Some(ch) if id.key.0 == c => ch.values = out,
                            _ => return Err(invalid(format!("table {c} has no {id}"))),
                        }
                    } else {
                        st.vecs.entry(c).or_default().insert(id, out);
                    }
                }
                Ok(Response::Ok { value: 0 })
            }
        }
    }

    pub(super) fn set_vec(
        &self,
        slot: u64,
        chunk: ChunkId,
        values: Vec<f32>,
    ) -> Result<Response, Rejection> {
        if slot < 1 << 32 {
            return Err(invalid(
                "SetVec slots start at 2^32 (lower slots are tables)",
            ));
        }
        let mut st = self.lock();
        st.vecs.entry(slot).or_default().insert(chunk, values);
        Ok(Response::Ok { value: 0 })
    }
}
