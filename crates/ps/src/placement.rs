//! Where chunks live: tables are sliced into chunks of at most `chunk_elems` elements (whole
//! rows), and each chunk is placed on a shard by consistent hashing with virtual nodes and
//! bounded loads (Mirrokni, Thorup & Zadimoghaddam 2018): walk the ring clockwise from the
//! chunk's hash and take the first shard whose load in elements stays within
//! `imbalance × average` after adding the chunk. Small keys therefore spread like plain
//! consistent hashing (no "everything on server 0", ps-lite#119), big chunks are balanced
//! by size (BytePS's greedy-by-bytes, mxnet#8290), and the plan is a pure function of the
//! sequence of tables planned, so every worker computes the same one.

/// One chunk's place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkPlace {
    /// The chunk's index within its table.
    pub index: u32,
    /// First element (in the table's flat layout).
    pub start: usize,
    /// Element count.
    pub len: usize,
    /// The shard that holds it.
    pub shard: usize,
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A consistent-hashing ring with `vnodes` virtual nodes per shard, plus running loads.
#[derive(Debug, Clone)]
pub struct Placement {
    points: Vec<(u64, usize)>,
    loads: Vec<u64>,
    chunk_elems: usize,
    imbalance: f64,
}

impl Placement {
    /// A ring over `shards` shards (at least 1), `vnodes` points each, chunks of at most
    /// `chunk_elems` elements, loads bounded by `imbalance` (≥ 1) × the average.
    pub fn new(shards: usize, vnodes: u32, chunk_elems: usize, imbalance: f64) -> Self {
        let shards = shards.max(1);
        let mut points: Vec<(u64, usize)> = (0..shards)
            .flat_map(|s| {
                (0..vnodes.max(1)).map(move |v| (mix(((s as u64) << 32) | v as u64 ^ 0x5053), s))
            })
            .collect();
        points.sort_unstable();
        Placement {
            points,
            loads: vec![0; shards],
            chunk_elems: chunk_elems.max(1),
            imbalance: imbalance.max(1.0),
        }
    }

    /// Number of shards.
    pub fn shards(&self) -> usize {
        self.loads.len()
    }

    /// Elements placed on each shard so far.
    pub fn loads(&self) -> &[u64] {
        &self.loads
    }

    /// Plans the chunks of table `key` of `len` elements in rows of `row_len`.
    pub fn plan(&mut self, key: u64, len: usize, row_len: usize) -> Vec<ChunkPlace> {
        let row_len = row_len.max(1);
        let per = (self.chunk_elems / row_len).max(1) * row_len;
        let mut out = Vec::new();
        let mut start = 0;
        let mut index = 0u32;
        loop {
            let n = per.min(len - start);
            let shard = self.place(mix(key ^ mix(index as u64 + 1)), n as u64);
            out.push(ChunkPlace {
                index,
                start,
                len: n,
                shard,
            });
            start += n;
            index += 1;
            if start >= len {
                break;
            }
        }
        out
    }

    fn place(&mut self, h: u64, size: u64) -> usize {
        let total: u64 = self.loads.iter().sum::<u64>() + size;
        let cap = (self.imbalance * total as f64 / self.shards() as f64).ceil() as u64;
        let first = self.points.partition_point(|p| p.0 < h);
        let n = self.points.len();
        let mut chosen = None;
        for i in 0..n {
            let s = self.points[(first + i) % n].1;
            if self.loads[s] + size <= cap.max(size) {
                chosen = Some(s);
                break;
            }
        }
        let s = chosen.unwrap_or_else(|| {
            (0..self.shards())
                .min_by_key(|&s| self.loads[s])
                .expect("at least one shard")
        });
        self.loads[s] += size;
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_the_table_in_whole_rows() {
        let mut p = Placement::new(3, 16, 10, 1.25);
        let c = p.plan(7, 35, 4);
        assert_eq!(
            c.iter().map(|c| c.len).collect::<Vec<_>>(),
            vec![8, 8, 8, 8, 3]
        );
        assert!(c.windows(2).all(|w| w[0].start + w[0].len == w[1].start));
        let c = p.plan(8, 0, 1);
        assert_eq!(c.len(), 1, "an empty table still has one (empty) chunk");
    }

    #[test]
    fn same_sequence_same_plan_and_loads_stay_balanced() {
        let tables: Vec<(u64, usize)> = (0..200)
            .map(|k| (k, 1 + (k as usize * 37) % 5000))
            .collect();
        let run = || {
            let mut p = Placement::new(4, 64, 1 << 12, 1.1);
            let plans: Vec<_> = tables.iter().map(|&(k, n)| p.plan(k, n, 1)).collect();
            (plans, p.loads().to_vec())
        };
        let (a, loads) = run();
        assert_eq!(a, run().0);
        let avg = loads.iter().sum::<u64>() as f64 / 4.0;
        let max = *loads.iter().max().unwrap() as f64;
        assert!(max <= 1.1 * avg + 5000.0, "{loads:?}");
        // Small keys do not all land on shard 0.
        let mut p = Placement::new(4, 64, 1 << 20, 1.25);
        let shards: std::collections::BTreeSet<usize> =
            (0..16).map(|k| p.plan(k, 1, 1)[0].shard).collect();
        assert!(shards.len() >= 3, "{shards:?}");
    }
}
