//! Fusion buffer planning: which ready tensors travel together as one collective.

use super::Kind;

/// Splits `ready` (ids in execution order, with their kind and raw bytes) into groups: per
/// kind in order of first appearance, consecutive tensors while the group stays within
/// `fusion_bytes` (a bigger tensor travels alone; 0 = no fusion). A selection unit's tensors
/// form one group whatever `fusion_bytes` says (the unit selects over all of them).
pub(crate) fn plan_groups(ready: &[(usize, Kind, usize)], fusion_bytes: usize) -> Vec<Vec<usize>> {
    let mut kinds: Vec<Kind> = Vec::new();
    for &(_, k, _) in ready {
        if !kinds.contains(&k) {
            kinds.push(k);
        }
    }
    let mut groups = Vec::new();
    for k in kinds {
        let mut cur: Vec<usize> = Vec::new();
        let mut bytes = 0usize;
        for &(id, kind, b) in ready.iter().filter(|r| r.1 == k) {
            let fits =
                kind.fusable() && !cur.is_empty() && (kind.unit() || bytes + b <= fusion_bytes);
            if !fits && !cur.is_empty() {
                groups.push(std::mem::take(&mut cur));
                bytes = 0;
            }
            cur.push(id);
            bytes += b;
        }
        if !cur.is_empty() {
            groups.push(cur);
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_by_kind_within_threshold() {
        let r = [
            (0, Kind::Dense, 40),
            (1, Kind::Gather, 40),
            (2, Kind::Dense, 40),
            (3, Kind::Dense, 100),
            (4, Kind::Dense, 10),
            (5, Kind::Quantized, 4),
            (6, Kind::Quantized, 4),
        ];
        assert_eq!(
            plan_groups(&r, 80),
            vec![vec![0, 2], vec![3], vec![4], vec![1], vec![5], vec![6]]
        );
        assert_eq!(plan_groups(&r, 0).len(), 7);
        assert_eq!(
            plan_groups(&r, 1000),
            vec![vec![0, 2, 3, 4], vec![1], vec![5], vec![6]]
        );
    }
}
