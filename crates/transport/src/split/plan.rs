//! Who is in which group after a split, from every rank's color and key: the members of a
//! color sorted by key, ties by rank (`MPI_Comm_split`'s rule). Pure.

/// This rank's group after a split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    /// The group's color.
    pub color: u32,
    /// This rank's rank in the group.
    pub rank: usize,
    /// The parent's rank of each group rank.
    pub members: Vec<usize>,
}

impl Plan {
    /// `e`, raised in this group before its transport exists (while it forms), naming the
    /// group and the global ranks.
    pub fn name_error(&self, e: crate::Error) -> crate::Error {
        super::group::name_error(&super::group::default_label(self.color), &self.members, e)
    }

    /// The group of parent rank `me`, given each parent rank's `(color, key)`.
    pub fn new(choices: &[(u32, u32)], me: usize) -> Plan {
        let color = choices[me].0;
        let mut members: Vec<usize> = (0..choices.len())
            .filter(|&r| choices[r].0 == color)
            .collect();
        members.sort_by_key(|&r| (choices[r].1, r));
        let rank = members
            .iter()
            .position(|&r| r == me)
            .expect("a rank is in its own group");
        Plan {
            color,
            rank,
            members,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_by_color_ordered_by_key_then_rank() {
        // Ranks 0..6: colors 1,0,1,0,1,0; keys reverse some orders and tie others.
        let choices = [(1, 5), (0, 0), (1, 5), (0, 9), (1, 0), (0, 1)];
        let p = Plan::new(&choices, 2);
        assert_eq!(p.members, vec![4, 0, 2]);
        assert_eq!((p.color, p.rank), (1, 2));
        let p = Plan::new(&choices, 3);
        assert_eq!(p.members, vec![1, 5, 3]);
        assert_eq!((p.color, p.rank), (0, 2));
        let single = Plan::new(&[(7, 0)], 0);
        assert_eq!((single.rank, single.members), (0, vec![0]));
    }
}
