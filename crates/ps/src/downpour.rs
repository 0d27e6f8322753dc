//! DistBelief's Downpour SGD loop on the worker (paper, supplementary algorithm): fetch the
//! parameters every `n_fetch` steps, apply each gradient locally (`w -= local_lr · g`) and
//! accrue it, push the accrued gradient every `n_push` steps. Use it with an `async` (or
//! SSP) table whose server-side updater applies the pushed gradient (SGD or Adagrad).

use crate::spec::Key;
use crate::{KvStore, Result};

/// The Downpour loop for one table.
#[derive(Debug, Clone)]
pub struct Downpour {
    key: Key,
    n_fetch: u64,
    n_push: u64,
    local_lr: f32,
    step: u64,
    accrued: Vec<f32>,
}

impl Downpour {
    /// A loop over table `key` of `len` elements; `n_fetch`, `n_push` ≥ 1 (0 is taken as 1).
    pub fn new(key: Key, len: usize, n_fetch: u64, n_push: u64, local_lr: f32) -> Self {
        Downpour {
            key,
            n_fetch: n_fetch.max(1),
            n_push: n_push.max(1),
            local_lr,
            step: 0,
            accrued: vec![0.0; len],
        }
    }

    /// Steps taken.
    pub fn steps(&self) -> u64 {
        self.step
    }

    /// One step: fetch `params` if due, compute the gradient with `grad(params, out)`,
    /// apply it locally, and push the accrued gradient if due.
    pub fn step<F>(&mut self, kv: &mut KvStore, params: &mut [f32], grad: F) -> Result<()>
    where
        F: FnOnce(&[f32], &mut Vec<f32>),
    {
        if self.step.is_multiple_of(self.n_fetch) {
            kv.pull(self.key, params)?;
        }
        let mut g = Vec::with_capacity(params.len());
        grad(params, &mut g);
        for ((p, a), g) in params.iter_mut().zip(self.accrued.iter_mut()).zip(&g) {
            *p -= self.local_lr * g;
            *a += g;
        }
        self.step += 1;
        if self.step.is_multiple_of(self.n_push) {
            kv.push(self.key, &self.accrued)?;
            self.accrued.iter_mut().for_each(|a| *a = 0.0);
        }
        Ok(())
    }

    /// Pushes whatever gradient is still accrued.
    pub fn flush(&mut self, kv: &mut KvStore) -> Result<()> {
        if self.accrued.iter().any(|a| *a != 0.0) {
            kv.push(self.key, &self.accrued)?;
            self.accrued.iter_mut().for_each(|a| *a = 0.0);
        }
        Ok(())
    }
}
