//! The submissions a rank has handed to negotiation and not yet executed: by cache id once
//! the tensor is cached (every registered tensor from the start, so the steady state looks
//! nothing up by name), by name before that.

use std::collections::HashMap;

use crate::worker::Submission;

/// Pending submissions, at most one per tensor.
#[derive(Default)]
pub(crate) struct Pending {
    /// `by_id[id]`: the pending submission of cached tensor `id`.
    by_id: Vec<Option<Submission>>,
    /// Submissions of tensors not cached yet, by name.
    new: HashMap<String, Submission>,
    /// How many `by_id` entries are `Some`.
    cached: usize,
}

impl Pending {
    /// No submission pending.
    pub fn is_empty(&self) -> bool {
        self.cached == 0 && self.new.is_empty()
    }

    /// Whether cached tensor `id` has a pending submission.
    pub fn has_id(&self, id: usize) -> bool {
        matches!(self.by_id.get(id), Some(Some(_)))
    }

    /// Whether the uncached tensor `name` has a pending submission.
    pub fn has_new(&self, name: &str) -> bool {
        self.new.contains_key(name)
    }

    /// Adds the submission of cached tensor `id` (none may be pending for it).
    pub fn insert_id(&mut self, id: usize, sub: Submission) {
        if self.by_id.len() <= id {
            self.by_id.resize_with(id + 1, || None);
        }
        debug_assert!(
            self.by_id[id].is_none(),
            "one pending submission per tensor"
        );
        self.cached += usize::from(self.by_id[id].is_none());
        self.by_id[id] = Some(sub);
    }

    /// Adds the submission of an uncached tensor, under its name.
    pub fn insert_new(&mut self, sub: Submission) {
        self.new.insert(sub.desc.name.clone(), sub);
    }

    /// Takes the pending submission of cached tensor `id`.
    pub fn take_id(&mut self, id: usize) -> Option<Submission> {
        let s = self.by_id.get_mut(id)?.take();
        self.cached -= usize::from(s.is_some());
        s
    }

    /// Takes the pending submission of the uncached tensor `name`.
    pub fn take_new(&mut self, name: &str) -> Option<Submission> {
        self.new.remove(name)
    }

    /// The cached ids with a pending submission, ascending.
    pub fn ids(&self) -> impl Iterator<Item = usize> + '_ {
        self.by_id
            .iter()
            .enumerate()
            .filter_map(|(id, s)| s.as_ref().map(|_| id))
    }

    /// The names of the pending submissions: cached ones in id order, then the others by
    /// name.
    pub fn names(&self) -> Vec<String> {
        let mut new: Vec<String> = self.new.keys().cloned().collect();
        new.sort_unstable();
        self.by_id
            .iter()
            .flatten()
            .map(|s| s.desc.name.clone())
            .chain(new)
            .collect()
    }

    /// The data of cached tensor `id`'s pending submission.
    pub fn data(&self, id: usize) -> Option<&[f32]> {
        Some(&self.by_id.get(id)?.as_ref()?.data)
    }

    /// The data of the pending submissions of the cached ids `ids` (ascending), mutable at
    /// once, in `ids` order, in `out` (given empty: a kept allocation); `None` when one is
    /// not pending.
    pub fn data_mut<'a>(
        &'a mut self,
        ids: &[usize],
        mut out: Vec<&'a mut [f32]>,
    ) -> Option<Vec<&'a mut [f32]>> {
        debug_assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids ascending");
        out.clear();
        let mut want = ids.iter().peekable();
        for (id, s) in self.by_id.iter_mut().enumerate() {
            if want.peek() == Some(&&id) {
                want.next();
                out.push(&mut s.as_mut()?.data[..]);
            }
        }
        (out.len() == ids.len()).then_some(out)
    }

    /// Every pending submission with its cache id (`None`: uncached), emptying the table.
    pub fn drain(&mut self) -> Vec<(Option<usize>, Submission)> {
        self.cached = 0;
        let mut out: Vec<(Option<usize>, Submission)> = std::mem::take(&mut self.by_id)
            .into_iter()
            .enumerate()
            .filter_map(|(id, s)| Some((Some(id), s?)))
            .collect();
        out.extend(self.new.drain().map(|(_, s)| (None, s)));
        out
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::handle::Handle;
    use crate::wire::{Descriptor, OpKind};

    fn sub(name: &str, x: f32) -> Submission {
        let (_h, slot) = Handle::new(name.into());
        Submission {
            desc: Arc::new(Descriptor {
                name: name.into(),
                op: OpKind::AllReduce,
                dtype: 0,
                root: 0,
                shape: vec![1],
                policy: String::new(),
            }),
            id: None,
            data: vec![x],
            encoded: None,
            slot,
            ready_us: 0,
            progress: Default::default(),
        }
    }

    /// Counts, lookups, mutable views and draining agree with a plain list kept beside it.
    #[test]
    fn behaves_like_a_list_of_pending_submissions() {
        let mut p = Pending::default();
        assert!(p.is_empty());
        p.insert_id(3, sub("c", 3.0));
        p.insert_id(0, sub("a", 0.0));
        p.insert_new(sub("new", 9.0));
        assert!(!p.is_empty());
        assert!(p.has_id(0) && p.has_id(3) && !p.has_id(1) && !p.has_id(7));
        assert!(p.has_new("new") && !p.has_new("a"));
        assert_eq!(p.ids().collect::<Vec<_>>(), vec![0, 3]);
        assert_eq!(p.data(3), Some(&[3.0][..]));
        assert_eq!(p.data(1), None);
        assert!(
            p.data_mut(&[1, 3], Vec::new()).is_none(),
            "1 is not pending"
        );
        assert!(
            p.data_mut(&[3, 9], Vec::new()).is_none(),
            "9 is beyond every id"
        );
        for (i, d) in p
            .data_mut(&[0, 3], Vec::new())
            .expect("both pending")
            .into_iter()
            .enumerate()
        {
            d[0] += 10.0 * (i + 1) as f32;
        }
        assert_eq!(
            (p.data(0), p.data(3)),
            (Some(&[10.0][..]), Some(&[23.0][..]))
        );
        assert_eq!(p.take_id(3).map(|s| s.data), Some(vec![23.0]));
        assert!(p.take_id(3).is_none());
        assert_eq!(p.take_new("new").map(|s| s.data), Some(vec![9.0]));
        assert!(!p.is_empty(), "id 0 is still pending");
        p.insert_new(sub("late", 5.0));
        let mut left: Vec<(Option<usize>, String)> = p
            .drain()
            .into_iter()
            .map(|(id, s)| (id, s.desc.name.clone()))
            .collect();
        left.sort();
        assert_eq!(left, vec![(None, "late".into()), (Some(0), "a".into())]);
        assert!(p.is_empty());
        assert_eq!(p.ids().count(), 0);
    }
}
