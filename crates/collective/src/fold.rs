//! The fold that lets power-of-two algorithms run on any world size (pure schedule, as in
//! MPICH's recursive doubling and Rabenseifner).
//!
//! With `p2` the largest power of two `<= P` and `rem = P - p2`: among ranks `0..2*rem`,
//! each even rank (an *extra*) hands its buffer to the odd rank above it (its *proxy*) and
//! sits out; the proxy reduces both. The `p2` remaining ranks (proxies, and ranks
//! `>= 2*rem`) run the power-of-two algorithm under virtual ranks `0..p2`; at the end each
//! proxy sends the result back to its extra.
//!
//! ```text
//! P = 6, p2 = 4, rem = 2        rank:   0   1   2   3   4   5
//!                               role:   x→  p   x→  p   m   m
//!                               vrank:  -   0   -   1   2   3
//! ```

/// This rank's part in the fold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Sits out: sends its buffer to `proxy` first, receives the result from it last.
    Extra {
        /// The rank that reduces on its behalf.
        proxy: usize,
    },
    /// Reduces `extra`'s buffer into its own, then takes part as `vrank`.
    Proxy {
        /// The rank it stands for.
        extra: usize,
        /// Its virtual rank in `0..p2`.
        vrank: usize,
    },
    /// Takes part as `vrank`.
    Member {
        /// Its virtual rank in `0..p2`.
        vrank: usize,
    },
}

/// The fold of a world of `world` ranks onto a power of two.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fold {
    /// Number of ranks.
    pub world: usize,
    /// Largest power of two `<= world`.
    pub p2: usize,
    /// `world - p2`: number of extras (and of proxies).
    pub rem: usize,
}

impl Fold {
    /// The fold of `world` ranks (`world >= 1`).
    pub fn new(world: usize) -> Fold {
        assert!(world >= 1);
        let p2 = 1usize << (usize::BITS - 1 - world.leading_zeros());
        Fold {
            world,
            p2,
            rem: world - p2,
        }
    }

    /// The part `rank` plays.
    pub fn role(&self, rank: usize) -> Role {
        if rank < 2 * self.rem {
            if rank.is_multiple_of(2) {
                Role::Extra { proxy: rank + 1 }
            } else {
                Role::Proxy {
                    extra: rank - 1,
                    vrank: rank / 2,
                }
            }
        } else {
            Role::Member {
                vrank: rank - self.rem,
            }
        }
    }

    /// The real rank of virtual rank `vrank`.
    pub fn real(&self, vrank: usize) -> usize {
        debug_assert!(vrank < self.p2);
        if vrank < self.rem {
            2 * vrank + 1
        } else {
            vrank + self.rem
        }
    }
}

/// The virtual partners of `vrank` in recursive doubling over `p2` ranks, in order
/// (`vrank ^ 1`, `vrank ^ 2`, `vrank ^ 4`, ...).
pub fn doubling_partners(vrank: usize, p2: usize) -> impl Iterator<Item = usize> {
    debug_assert!(p2.is_power_of_two());
    std::iter::successors(Some(1usize), |m| Some(m << 1))
        .take_while(move |&m| m < p2)
        .map(move |m| vrank ^ m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fold_is_a_bijection_onto_vranks() {
        for world in 1..=33 {
            let f = Fold::new(world);
            assert!(f.p2.is_power_of_two() && f.p2 <= world && 2 * f.p2 > world);
            let mut seen = vec![false; f.p2];
            for r in 0..world {
                match f.role(r) {
                    Role::Extra { proxy } => {
                        assert_eq!(
                            f.role(proxy),
                            Role::Proxy {
                                extra: r,
                                vrank: proxy / 2
                            }
                        );
                    }
                    Role::Proxy { vrank, .. } | Role::Member { vrank } => {
                        assert!(!seen[vrank]);
                        seen[vrank] = true;
                        assert_eq!(f.real(vrank), r);
                    }
                }
            }
            assert!(seen.iter().all(|&s| s));
        }
    }

    #[test]
    fn doubling_reaches_everyone() {
        for p2 in [1usize, 2, 4, 8, 16] {
            for v in 0..p2 {
                let mut known = 1u64 << v;
                let mut sets: Vec<u64> = (0..p2).map(|i| 1 << i).collect();
                for (k, partner) in doubling_partners(v, p2).enumerate() {
                    assert_eq!(partner, v ^ (1 << k));
                }
                // simulate the whole group
                for m in
                    std::iter::successors(Some(1usize), |m| Some(m << 1)).take_while(|&m| m < p2)
                {
                    let before = sets.clone();
                    for i in 0..p2 {
                        assert_eq!(before[i] & before[i ^ m], 0);
                        sets[i] |= before[i ^ m];
                    }
                }
                known |= sets[v];
                assert_eq!(known.count_ones() as usize, p2);
            }
        }
    }
}
