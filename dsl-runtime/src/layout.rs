//! Linear layouts: which thread holds which element of a block, in which register.
//!
//! Following Triton 3's linear layouts (Zhou et al., arXiv 2505.23819), a layout of a
//! block whose dimensions are powers of two is a linear map over GF(2) from the bits of
//! the hardware indices (register, lane, warp) to the bits of the tensor coordinates. It
//! is stored as one *basis* per input bit: the coordinates that bit contributes. The
//! coordinates of the element in register `r` of lane `l` of warp `w` are the XOR of the
//! bases of the set bits of `r`, `l` and `w`.
//!
//! Everything the lowering needs to know is read off the bases:
//! - a zero basis on a lane or warp bit means those threads hold the same elements
//!   (replication: only one of them may store);
//! - register bits whose bases are `1, 2, 4, ...` along the fastest dimension give each
//!   thread a contiguous run that can be accessed with one vector instruction;
//! - lane bits that continue that sequence make a warp's accesses coalesced.
//!
//! Blocked layouts (this slice) are one family. Tensor-core fragments (`mma.sync`
//! m16n8k16: register bit 0 steps the column by 1, lane bits 0-1 by 2 and 4, lane bits
//! 2-4 step the row by 1, 2, 4, further register bits the row by 8 and the column by 8),
//! slices for reductions and swizzled shared-memory layouts are other bases of the same
//! type; conversions between two layouts become questions about two such maps.
//!
//! ```
//! use dsl_runtime::layout::LinearLayout;
//! // 1024 elements, 4 per thread, 4 warps: thread t holds 4t..4t+3, then 512+4t..
//! let l = LinearLayout::blocked(&[1024], &[4], &[32], &[4], &[0]);
//! assert_eq!(l.num_regs(), 8);
//! assert_eq!(l.apply(0, 1, 0), vec![4]);
//! assert_eq!(l.apply(4, 0, 0), vec![512]);
//! assert_eq!(l.contiguous_regs(0), 4);
//! ```

use std::fmt;

/// The hardware index a layout maps from.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum InDim {
    Register,
    Lane,
    Warp,
}

/// One basis vector: a coordinate per tensor dimension.
pub type Basis = Vec<u32>;

#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct LinearLayout {
    /// The tensor shape (each dimension a power of two).
    pub shape: Vec<usize>,
    /// Bases of register, lane and warp bits, in that order; bit `i` of the input index
    /// contributes `bases[dim][i]`.
    pub bases: [Vec<Basis>; 3],
}

fn log2(x: usize) -> u32 {
    debug_assert!(x.is_power_of_two());
    x.trailing_zeros()
}

impl LinearLayout {
    /// The layout of a scalar: one register, every thread holds it.
    pub fn scalar(num_warps: usize) -> LinearLayout {
        LinearLayout {
            shape: vec![],
            bases: [vec![], vec![vec![]; 5], vec![vec![]; log2(num_warps) as usize]],
        }
    }

    /// Triton's blocked layout: each thread holds `size_per_thread[d]` consecutive
    /// elements along each dimension, a warp's 32 lanes tile `threads_per_warp`, the warps
    /// tile `warps_per_cta`, and the pattern repeats in registers until the shape is
    /// covered. `order` lists dimensions fastest first. A level that is larger than the
    /// shape replicates (its extra bits get zero bases). All sizes are powers of two.
    pub fn blocked(
        shape: &[usize],
        size_per_thread: &[usize],
        threads_per_warp: &[usize],
        warps_per_cta: &[usize],
        order: &[usize],
    ) -> LinearLayout {
        let rank = shape.len();
        let mut covered = vec![1usize; rank]; // extent covered so far along each dim
        let level = |sizes: &[usize], covered: &mut Vec<usize>| {
            let mut out = vec![];
            for &d in order {
                for _ in 0..log2(sizes[d]) {
                    let mut b = vec![0u32; rank];
                    if covered[d] < shape[d] {
                        b[d] = covered[d] as u32;
                    }
                    covered[d] *= 2;
                    out.push(b);
                }
            }
            out
        };
        let mut reg = level(size_per_thread, &mut covered);
        let lane = level(threads_per_warp, &mut covered);
        let warp = level(warps_per_cta, &mut covered);
        // Repeat in registers until every element has an owner.
        for &d in order {
            while covered[d] < shape[d] {
                let mut b = vec![0u32; rank];
                b[d] = covered[d] as u32;
                reg.push(b);
                covered[d] *= 2;
            }
        }
        // Registers must not replicate: drop zero register bases (a thread never needs two
        // copies of one element).
        reg.retain(|b| b.iter().any(|&x| x != 0));
        LinearLayout { shape: shape.to_vec(), bases: [reg, lane, warp] }
    }

    /// The default layout of a 1-D block of `n` elements: `vec` contiguous elements per
    /// thread (capped so that small blocks spread over threads before registers).
    pub fn blocked_1d(n: usize, vec: usize, num_warps: usize) -> LinearLayout {
        let vec = vec.min(n).max(1);
        LinearLayout::blocked(&[n], &[vec], &[32], &[num_warps], &[0])
    }

    /// Triton's default blocked layout of a (padded) shape: `vec` contiguous elements per
    /// thread along the last dimension, lanes then warps filling the fastest dimensions
    /// first, repeating in registers beyond one CTA.
    pub fn default_for(shape: &[usize], vec: usize, num_warps: usize) -> LinearLayout {
        if shape.is_empty() {
            return LinearLayout::scalar(num_warps);
        }
        let r = shape.len();
        let order: Vec<usize> = (0..r).rev().collect();
        let mut spt = vec![1; r];
        spt[r - 1] = vec.min(shape[r - 1]).max(1);
        let mut tpw = vec![1; r];
        let mut lanes = 32;
        for &d in &order {
            let t = (shape[d] / spt[d]).clamp(1, lanes);
            tpw[d] = t;
            lanes /= t;
        }
        tpw[order[r - 1]] *= lanes; // leftover lanes replicate along the slowest dimension
        let mut wpc = vec![1; r];
        let mut warps = num_warps;
        for &d in &order {
            let w = (shape[d] / (spt[d] * tpw[d])).clamp(1, warps);
            wpc[d] = w;
            warps /= w;
        }
        wpc[order[r - 1]] *= warps;
        LinearLayout::blocked(shape, &spt, &tpw, &wpc, &order)
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// The dimension a basis moves along, when it moves along exactly one (blocked and
    /// tensor-core layouts have only such bases); `None` for zero or mixed bases.
    pub fn basis_dim(b: &Basis) -> Option<usize> {
        let mut nz = b.iter().enumerate().filter(|(_, &x)| x != 0);
        match (nz.next(), nz.next()) {
            (Some((d, _)), None) => Some(d),
            _ => None,
        }
    }

    /// Zero the coordinates along `dims` (their size becomes 1): the layout of an operand
    /// that is broadcast along `dims` to this layout. Register bases that become zero are
    /// dropped; returns, per register bit of `self`, its bit in the result (if kept).
    pub fn project(&self, dims: &[usize]) -> (LinearLayout, Vec<Option<usize>>) {
        let mut shape = self.shape.clone();
        for &d in dims {
            shape[d] = 1;
        }
        let zero = |b: &Basis| -> Basis { b.iter().enumerate().map(|(d, &x)| if dims.contains(&d) { 0 } else { x }).collect() };
        let mut map = vec![];
        let mut reg = vec![];
        for b in self.bases(InDim::Register) {
            let z = zero(b);
            if z.iter().any(|&x| x != 0) {
                map.push(Some(reg.len()));
                reg.push(z);
            } else {
                map.push(None);
            }
        }
        let lane = self.bases(InDim::Lane).iter().map(zero).collect();
        let warp = self.bases(InDim::Warp).iter().map(zero).collect();
        (LinearLayout { shape, bases: [reg, lane, warp] }, map)
    }

    /// Remove dimension `d` (the layout of a reduction's result along `d`): bases lose that
    /// coordinate; register bases that become zero are dropped (see [`project`](Self::project)).
    pub fn remove_dim(&self, d: usize) -> (LinearLayout, Vec<Option<usize>>) {
        let (p, map) = self.project(&[d]);
        let drop = |b: &Basis| -> Basis { b.iter().enumerate().filter(|&(k, _)| k != d).map(|(_, &x)| x).collect() };
        let mut shape = p.shape.clone();
        shape.remove(d);
        let bases = [p.bases[0].iter().map(drop).collect(), p.bases[1].iter().map(drop).collect(), p.bases[2].iter().map(drop).collect()];
        (LinearLayout { shape, bases }, map)
    }

    /// Insert a dimension of size 1 at `d` (the layout of `expand_dims`).
    pub fn insert_dim(&self, d: usize) -> LinearLayout {
        let ins = |b: &Basis| -> Basis {
            let mut b = b.clone();
            b.insert(d, 0);
            b
        };
        let mut shape = self.shape.clone();
        shape.insert(d, 1);
        LinearLayout { shape, bases: [self.bases[0].iter().map(ins).collect(), self.bases[1].iter().map(ins).collect(), self.bases[2].iter().map(ins).collect()] }
    }

    /// Relabel dimensions: dimension `i` of the result is dimension `perm[i]` of `self`.
    pub fn permute(&self, perm: &[usize]) -> LinearLayout {
        let p = |b: &Basis| -> Basis { perm.iter().map(|&k| b[k]).collect() };
        LinearLayout {
            shape: perm.iter().map(|&k| self.shape[k]).collect(),
            bases: [self.bases[0].iter().map(p).collect(), self.bases[1].iter().map(p).collect(), self.bases[2].iter().map(p).collect()],
        }
    }
    pub fn bases(&self, d: InDim) -> &[Basis] {
        &self.bases[d as usize]
    }
    /// Registers per thread.
    pub fn num_regs(&self) -> usize {
        1 << self.bases(InDim::Register).len()
    }

    /// Coordinates of register `reg` of lane `lane` of warp `warp`.
    pub fn apply(&self, reg: u32, lane: u32, warp: u32) -> Vec<u32> {
        let mut c = vec![0u32; self.rank()];
        for (d, idx) in [(InDim::Register, reg), (InDim::Lane, lane), (InDim::Warp, warp)] {
            for (i, b) in self.bases(d).iter().enumerate() {
                if idx >> i & 1 == 1 {
                    for (cd, bd) in c.iter_mut().zip(b) {
                        *cd ^= bd;
                    }
                }
            }
        }
        c
    }

    /// How many consecutive registers hold consecutive elements along `dim` (the longest
    /// prefix of register bases that is `1, 2, 4, ...` along `dim` and 0 elsewhere).
    pub fn contiguous_regs(&self, dim: usize) -> usize {
        let mut n = 1usize;
        for b in self.bases(InDim::Register) {
            let unit = b.iter().enumerate().all(|(d, &x)| if d == dim { x as usize == n } else { x == 0 });
            if !unit {
                break;
            }
            n *= 2;
        }
        n
    }

    /// Bit mask of the lane (or warp) bits whose bases are zero: threads that differ only
    /// in those bits hold the same elements.
    pub fn replicated_bits(&self, d: InDim) -> u32 {
        self.bases(d).iter().enumerate().filter(|(_, b)| b.iter().all(|&x| x == 0)).fold(0, |m, (i, _)| m | 1 << i)
    }

    /// True when the register bases and the lane/warp bases touch disjoint coordinate
    /// bits, so that XOR-combining a thread's offset with a register's offset is an
    /// addition (true for every blocked layout).
    pub fn thread_and_register_bits_disjoint(&self) -> bool {
        let or_all = |bs: &[Basis]| bs.iter().fold(vec![0u32; self.rank()], |acc, b| acc.iter().zip(b).map(|(a, x)| a | x).collect());
        let r = or_all(self.bases(InDim::Register));
        let mut t = or_all(self.bases(InDim::Lane));
        for (x, w) in t.iter_mut().zip(or_all(self.bases(InDim::Warp))) {
            *x |= w;
        }
        r.iter().zip(&t).all(|(a, b)| a & b == 0)
    }

    /// True when every element of the shape is held by some thread (the map is onto).
    pub fn is_surjective(&self) -> bool {
        // Rank over GF(2) of all bases, as bit vectors of the flattened coordinate, must be
        // the number of coordinate bits.
        let bits: Vec<u32> = self.shape.iter().map(|&s| log2(s)).collect();
        let total: u32 = bits.iter().sum();
        let flat = |b: &Basis| {
            let (mut v, mut shift) = (0u64, 0);
            for (d, &x) in b.iter().enumerate() {
                v |= (x as u64) << shift;
                shift += bits[d];
            }
            v
        };
        let mut rows: Vec<u64> = self.bases.iter().flatten().map(flat).filter(|&v| v != 0).collect();
        let mut rank = 0;
        for bit in 0..total {
            if let Some(p) = rows.iter().position(|&r| r >> bit & 1 == 1) {
                let pivot = rows.swap_remove(p);
                for r in rows.iter_mut() {
                    if *r >> bit & 1 == 1 {
                        *r ^= pivot;
                    }
                }
                rank += 1;
            }
        }
        rank == total
    }
}

impl fmt::Display for LinearLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |bs: &[Basis]| bs.iter().map(|b| format!("{b:?}")).collect::<Vec<_>>().join(" ");
        write!(
            f,
            "linear{:?} {{ register: [{}], lane: [{}], warp: [{}] }}",
            self.shape,
            show(self.bases(InDim::Register)),
            show(self.bases(InDim::Lane)),
            show(self.bases(InDim::Warp))
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every element has exactly one canonical owner (non-replicated thread, some register).
    fn owners(l: &LinearLayout, warps: u32) -> Vec<u32> {
        let n = l.shape.iter().product::<usize>();
        let mut count = vec![0u32; n];
        let (rl, rw) = (l.replicated_bits(InDim::Lane), l.replicated_bits(InDim::Warp));
        for w in 0..warps {
            for lane in 0..32 {
                if lane & rl != 0 || w & rw != 0 {
                    continue;
                }
                for r in 0..l.num_regs() as u32 {
                    count[l.apply(r, lane, w)[0] as usize] += 1;
                }
            }
        }
        count
    }

    #[test]
    fn blocked_1d_covers_each_element_once() {
        for (n, v, w) in [(1024, 4, 4), (4096, 8, 8), (128, 4, 4), (64, 4, 4), (16, 8, 1), (1, 4, 4), (2048, 1, 2)] {
            let l = LinearLayout::blocked_1d(n, v, w);
            assert!(l.is_surjective(), "{l}");
            assert!(l.thread_and_register_bits_disjoint());
            assert!(owners(&l, w as u32).iter().all(|&c| c == 1), "n={n} v={v} w={w}: {l}");
        }
    }

    #[test]
    fn small_blocks_replicate_over_lanes_and_warps() {
        let l = LinearLayout::blocked_1d(64, 4, 4); // 16 lanes suffice
        assert_eq!(l.replicated_bits(InDim::Lane), 0b10000);
        assert_eq!(l.replicated_bits(InDim::Warp), 0b11);
        assert_eq!(l.num_regs(), 4);
    }

    #[test]
    fn mma_accumulator_fragment_is_a_linear_layout() {
        // m16n8 f32 accumulator of mma.sync (tensor-cores note §1): c0=(g,2t) c1=(g,2t+1)
        // c2=(g+8,2t) c3=(g+8,2t+1), g = lane>>2, t = lane&3. Shape [16, 8] as (row, col).
        let l = LinearLayout {
            shape: vec![16, 8],
            bases: [
                vec![vec![0, 1], vec![8, 0]],
                vec![vec![0, 2], vec![0, 4], vec![1, 0], vec![2, 0], vec![4, 0]],
                vec![],
            ],
        };
        assert!(l.is_surjective());
        for lane in 0..32u32 {
            let (g, t) = (lane >> 2, lane & 3);
            assert_eq!(l.apply(0, lane, 0), vec![g, 2 * t]);
            assert_eq!(l.apply(1, lane, 0), vec![g, 2 * t + 1]);
            assert_eq!(l.apply(2, lane, 0), vec![g + 8, 2 * t]);
            assert_eq!(l.apply(3, lane, 0), vec![g + 8, 2 * t + 1]);
        }
        assert_eq!(l.contiguous_regs(1), 2);
    }

    #[test]
    fn default_2d_layouts_put_warps_where_rows_are() {
        // Wide rows: every warp along the row.
        let l = LinearLayout::default_for(&[1, 4096], 4, 4);
        assert_eq!(l.bases(InDim::Warp).iter().map(|b| b[1]).collect::<Vec<_>>(), vec![128, 256]);
        // Small square tiles: lanes along the row, warps down the rows.
        let l = LinearLayout::default_for(&[64, 64], 4, 4);
        assert!(l.is_surjective());
        assert_eq!(l.apply(0, 1, 0), vec![0, 4]);
        assert_eq!(l.apply(0, 16, 0), vec![1, 0]);
        assert_eq!(l.apply(0, 0, 1), vec![2, 0]);
    }

    #[test]
    fn slices_and_projections_keep_register_order() {
        let l = LinearLayout::default_for(&[64, 64], 4, 4);
        let (row, map) = l.remove_dim(1);
        assert_eq!(row.shape, vec![64]);
        // Registers along dim 1 disappear; those along dim 0 stay.
        assert_eq!(map.iter().filter(|m| m.is_some()).count(), row.bases(InDim::Register).len());
        let (col, _) = l.project(&[1]);
        assert_eq!(row.insert_dim(1), col);
        let t = l.permute(&[1, 0]);
        assert_eq!(t.apply(0, 1, 0), vec![4, 0]);
    }

    #[test]
    fn blocked_2d_row_major() {
        let l = LinearLayout::blocked(&[32, 64], &[1, 4], &[2, 16], &[4, 1], &[1, 0]);
        assert!(l.is_surjective());
        assert_eq!(l.apply(1, 0, 0), vec![0, 1]);
        assert_eq!(l.apply(0, 1, 0), vec![0, 4]);
        assert_eq!(l.apply(0, 16, 0), vec![1, 0]);
        assert_eq!(l.apply(0, 0, 1), vec![2, 0]);
    }
}
