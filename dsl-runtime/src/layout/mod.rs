//! Linear layouts: which thread holds which element of a block, in which register, and
//! where in shared memory each element lives.
//!
//! Following Triton 3's linear layouts (Zhou et al., arXiv 2505.23819), a layout is a linear
//! map over GF(2) from the bits of some *input dimensions* to the bits of some *output
//! dimensions*, every dimension of a power-of-two size. It is stored as one *basis* per
//! input bit: the output values that bit contributes. The image of an input is the XOR of
//! the bases of its set bits.
//!
//! # Dimensions
//!
//! [`InDim`] names every dimension:
//! - a *distributed* layout (a block held in registers) maps `Register`, `Lane` and `Warp`
//!   to the tensor coordinates `Coord(0)`, `Coord(1)`, ...: register `r` of lane `l` of
//!   warp `w` holds the element at `apply(r, l, w)`;
//! - a *shared* layout maps `Offset`, the element offset within a shared-memory buffer, to
//!   the coordinates of the element stored there;
//! - an inverse goes the other way: its inputs are `Coord`s and its outputs are hardware
//!   dimensions (see [`invert`](LinearLayout::invert)).
//!
//! For the usual layouts the outputs are the tensor coordinates and
//! [`shape`](LinearLayout::shape) is the tensor's shape.
//!
//! # What the bases say
//!
//! Everything the lowering needs to know is read off the bases:
//! - a zero basis on a lane or warp bit means those threads hold the same elements
//!   (replication: only one of them may store);
//! - register bits whose bases are `1, 2, 4, ...` along the fastest dimension give each
//!   thread a contiguous run that can be accessed with one vector instruction;
//! - lane bits that continue that sequence make a warp's accesses coalesced.
//!
//! # Algebra
//!
//! Coordinates are flattened to bits (dimension 0 in the low bits, each dimension of size
//! `2^k` contributing `k` bits), so a layout is a 0/1 matrix and:
//! - [`apply_in`](LinearLayout::apply_in) evaluates it at any named input;
//! - [`compose`](LinearLayout::compose): `inner.compose(&outer)` runs `inner`, then `outer`
//!   (`outer ∘ inner`; `inner`'s outputs are `outer`'s inputs);
//! - [`invert`](LinearLayout::invert) inverts a bijective layout: coordinates → hardware
//!   index, e.g. coordinates → shared offset for a shared layout;
//! - [`invert_and_compose`](LinearLayout::invert_and_compose): `a.invert_and_compose(&b)`
//!   maps each input of `a` to the input of `b` holding the same element (`b ∘ c = a`).
//!   With `a` a register layout and `b` a shared layout this is where each register is
//!   stored or loaded: the address computation of a conversion through shared memory or of
//!   an `ldmatrix`. When `b` replicates (zero bases, or bases that repeat a combination of
//!   earlier ones), several inputs of `b` hold each element; the result picks the one whose
//!   redundant bits are 0 (the first register, lane 0 of a replicated group, ...).
//!
//! # Families
//!
//! - blocked ([`blocked`](LinearLayout::blocked), [`default_for`](LinearLayout::default_for)):
//!   Triton's default register layouts;
//! - tensor-core fragments: [`mma_v2_accumulator`](LinearLayout::mma_v2_accumulator),
//!   [`mma_v2_operand`](LinearLayout::mma_v2_operand) (`mma.sync` m16n8k16 / m16n8k8) and
//!   [`wgmma_accumulator`](LinearLayout::wgmma_accumulator) (sm_90a `wgmma`), in
//!   `layout/mma.rs`, with [`ldmatrix_x4`](LinearLayout::ldmatrix_x4), the per-lane shared offsets
//!   of an `ldmatrix`, derived by composition;
//! - shared memory: [`swizzled_shared`](LinearLayout::swizzled_shared) (Triton's XOR swizzle)
//!   and [`nvmma_shared`](LinearLayout::nvmma_shared) (the wgmma/TMA 32/64/128-byte swizzles),
//!   in `layout/shared.rs`.
//!
//! ```
//! use dsl_runtime::layout::{InDim, LinearLayout};
//! // 1024 elements, 4 per thread, 4 warps: thread t holds 4t..4t+3, then 512+4t..
//! let l = LinearLayout::blocked(&[1024], &[4], &[32], &[4], &[0]);
//! assert_eq!(l.num_regs(), 8);
//! assert_eq!(l.apply(0, 1, 0), vec![4]);
//! assert_eq!(l.apply(4, 0, 0), vec![512]);
//! assert_eq!(l.contiguous_regs(0), 4);
//!
//! // The accumulator of mma.sync m16n8k16: register 2 of lane 5 (g = 1, t = 1) is (9, 2).
//! let acc = LinearLayout::mma_v2_accumulator(&[16, 8], &[1, 1]);
//! assert_eq!(acc.apply(2, 5, 0), vec![9, 2]);
//! // A 64x64 bf16 buffer in shared memory, 128-byte rows, 16-byte chunks XOR-swizzled.
//! let smem = LinearLayout::swizzled_shared(&[64, 64], &[1, 0], 8, 1, 8);
//! // Where each register of each lane goes when the accumulator tile is stored there:
//! // row 9 starts at 9 * 64; column 2 is in chunk 0, which row 9 moves to chunk 0 ^ 1.
//! let to_smem = acc.invert_and_compose(&smem).unwrap();
//! assert_eq!(to_smem.apply_in(&[(InDim::Register, 2), (InDim::Lane, 5)]), vec![9 * 64 + 8 + 2]);
//! // The same from the coordinates.
//! let addr = smem.invert().unwrap();
//! assert_eq!(addr.apply_in(&[(InDim::Coord(0), 9), (InDim::Coord(1), 2)]), vec![9 * 64 + 8 + 2]);
//! ```

mod mma;
mod shared;

use std::fmt;

/// A dimension of a layout: the hardware indices and shared-memory offsets a layout maps
/// from, and the tensor coordinates it maps to (an inverse swaps the two sides).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum InDim {
    /// The register index within a thread.
    Register,
    /// The lane id within a warp (32 lanes: 5 bits).
    Lane,
    /// The warp id within the CTA.
    Warp,
    /// The element offset within a shared-memory buffer.
    Offset,
    /// The coordinate along tensor dimension `d`: the outputs of distributed and shared
    /// layouts, the inputs of their inverses.
    Coord(usize),
}

impl fmt::Display for InDim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InDim::Register => write!(f, "register"),
            InDim::Lane => write!(f, "lane"),
            InDim::Warp => write!(f, "warp"),
            InDim::Offset => write!(f, "offset"),
            InDim::Coord(d) => write!(f, "dim{d}"),
        }
    }
}

/// One basis vector: a value per output dimension (for the usual layouts, a coordinate per
/// tensor dimension).
pub type Basis = Vec<u32>;

#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct LinearLayout {
    /// The sizes of the output dimensions (each a power of two): the tensor shape, for
    /// layouts whose outputs are tensor coordinates.
    pub shape: Vec<usize>,
    /// The names of the output dimensions, one per entry of `shape`.
    outs: Vec<InDim>,
    /// The input dimensions in order, each with one basis per bit: bit `i` of that input
    /// contributes `bases[i]`. The size of an input dimension is `2^bases.len()`.
    ins: Vec<(InDim, Vec<Basis>)>,
}

fn log2(x: usize) -> u32 {
    debug_assert!(x.is_power_of_two(), "layout sizes are powers of two, got {x}");
    x.trailing_zeros()
}

fn is_zero(b: &[u32]) -> bool {
    b.iter().all(|&x| x == 0)
}

/// A vector of values, one per dimension of `bits[d]` bits, as one bit string (dimension 0
/// in the low bits).
fn flatten(b: &[u32], bits: &[u32]) -> u64 {
    let (mut v, mut shift) = (0u64, 0);
    for (&x, &n) in b.iter().zip(bits) {
        v |= (x as u64) << shift;
        shift += n;
    }
    v
}

fn unflatten(mut v: u64, bits: &[u32]) -> Vec<u32> {
    bits.iter()
        .map(|&n| {
            let x = v & ((1u64 << n) - 1);
            v >>= n;
            x as u32
        })
        .collect()
}

/// Gaussian elimination over GF(2): the span of a list of columns (bit strings) and, for
/// every vector in it, a set of columns that sums to it.
struct Span {
    /// Reduced vectors, each with the columns it sums (a bit mask) and its lowest set bit.
    /// Each pivot has none of the lowest bits of the pivots before it.
    pivots: Vec<(u64, u64, u32)>,
}

impl Span {
    /// Columns are taken in order, so a column that is zero or a sum of earlier ones is never
    /// used: [`solve`](Self::solve) sets its bit to 0.
    fn new(columns: &[u64]) -> Span {
        debug_assert!(columns.len() <= 64, "at most 64 input bits");
        let mut s = Span { pivots: vec![] };
        for (i, &c) in columns.iter().enumerate() {
            let (v, used) = s.reduce(c, 1 << i);
            if v != 0 {
                s.pivots.push((v, used, v.trailing_zeros()));
            }
        }
        s
    }

    fn reduce(&self, mut v: u64, mut used: u64) -> (u64, u64) {
        for &(p, p_used, low) in &self.pivots {
            if v >> low & 1 == 1 {
                v ^= p;
                used ^= p_used;
            }
        }
        (v, used)
    }

    /// The columns that sum to `v`, if `v` is in the span.
    fn solve(&self, v: u64) -> Option<u64> {
        let (rest, used) = self.reduce(v, 0);
        (rest == 0).then_some(used)
    }

    fn rank(&self) -> usize {
        self.pivots.len()
    }
}

/// Builds a layout over a tensor shape bit by bit: every new input bit doubles the extent
/// covered so far along one tensor dimension. A bit past the end of the shape gets a zero
/// basis (those inputs replicate the elements of the others).
struct Build {
    shape: Vec<usize>,
    covered: Vec<usize>,
    ins: Vec<(InDim, Vec<Basis>)>,
}

impl Build {
    fn new(shape: &[usize], dims: &[InDim]) -> Build {
        Build { shape: shape.to_vec(), covered: vec![1; shape.len()], ins: dims.iter().map(|&d| (d, vec![])).collect() }
    }

    fn push(&mut self, dim: InDim, b: Basis) {
        match self.ins.iter_mut().find(|(d, _)| *d == dim) {
            Some((_, bases)) => bases.push(b),
            None => self.ins.push((dim, vec![b])),
        }
    }

    /// `log2(n)` bits of `dim`, each stepping tensor dimension `d` by the extent covered so far.
    fn grow(&mut self, dim: InDim, d: usize, n: usize) {
        for _ in 0..log2(n) {
            let mut b = vec![0u32; self.shape.len()];
            if self.covered[d] < self.shape[d] {
                b[d] = self.covered[d] as u32;
            }
            self.covered[d] *= 2;
            self.push(dim, b);
        }
    }

    /// `log2(n)` bits of `dim` with zero bases (those inputs all hold the same elements).
    fn broadcast(&mut self, dim: InDim, n: usize) {
        for _ in 0..log2(n) {
            self.push(dim, vec![0u32; self.shape.len()]);
        }
    }

    /// Register bits until the shape is covered, along the dimensions of `order` in turn.
    fn repeat_in_registers(&mut self, order: &[usize]) {
        for &d in order {
            while self.covered[d] < self.shape[d] {
                self.grow(InDim::Register, d, 2);
            }
        }
    }

    fn finish(self) -> LinearLayout {
        LinearLayout::tensor(self.shape, self.ins)
    }
}

impl LinearLayout {
    /// A layout from explicit bases: `ins` lists the input dimensions, each with one basis
    /// per bit (a value per output dimension); `outs` lists the output dimensions with their
    /// sizes. Sizes are powers of two and every basis value lies below its dimension's size
    /// (both checked in debug builds only: layouts are built by the compiler).
    pub fn new(ins: Vec<(InDim, Vec<Basis>)>, outs: &[(InDim, usize)]) -> LinearLayout {
        debug_assert!(outs.iter().all(|&(_, s)| s.is_power_of_two()));
        debug_assert!(ins.iter().flat_map(|(_, bs)| bs).all(|b| b.len() == outs.len() && b.iter().zip(outs).all(|(&x, &(_, s))| (x as usize) < s)));
        LinearLayout { shape: outs.iter().map(|&(_, s)| s).collect(), outs: outs.iter().map(|&(d, _)| d).collect(), ins }
    }

    /// A layout whose outputs are the coordinates of a tensor of `shape`.
    fn tensor(shape: Vec<usize>, ins: Vec<(InDim, Vec<Basis>)>) -> LinearLayout {
        let outs: Vec<(InDim, usize)> = shape.iter().enumerate().map(|(d, &s)| (InDim::Coord(d), s)).collect();
        LinearLayout::new(ins, &outs)
    }

    /// The identity on `dims` (each with its size): every input bit maps to the same bit of
    /// the output of the same name.
    pub fn identity(dims: &[(InDim, usize)]) -> LinearLayout {
        let ins = dims
            .iter()
            .enumerate()
            .map(|(i, &(d, size))| {
                let bases = (0..log2(size))
                    .map(|k| {
                        let mut b = vec![0u32; dims.len()];
                        b[i] = 1 << k;
                        b
                    })
                    .collect();
                (d, bases)
            })
            .collect();
        LinearLayout::new(ins, dims)
    }

    /// The layout of a scalar: one register, every thread holds it.
    pub fn scalar(num_warps: usize) -> LinearLayout {
        LinearLayout::tensor(vec![], vec![(InDim::Register, vec![]), (InDim::Lane, vec![vec![]; 5]), (InDim::Warp, vec![vec![]; log2(num_warps) as usize])])
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
        let mut b = Build::new(shape, &[InDim::Register, InDim::Lane, InDim::Warp]);
        for (dim, sizes) in [(InDim::Register, size_per_thread), (InDim::Lane, threads_per_warp), (InDim::Warp, warps_per_cta)] {
            for &d in order {
                b.grow(dim, d, sizes[d]);
            }
        }
        b.repeat_in_registers(order);
        let mut l = b.finish();
        // Registers must not replicate: drop zero register bases (a thread never needs two
        // copies of one element).
        l.bases_mut(InDim::Register).retain(|b| !is_zero(b));
        l
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
        LinearLayout::blocked_along(shape, shape.len() - 1, vec, num_warps)
    }

    /// [`default_for`](LinearLayout::default_for) with dimension `fast` the contiguous one
    /// (`vec` elements per thread along it, lanes filling it first): a column-major tile
    /// (`fast = 0`) loaded in 16-byte vectors.
    pub fn blocked_along(shape: &[usize], fast: usize, vec: usize, num_warps: usize) -> LinearLayout {
        let r = shape.len();
        let order: Vec<usize> = std::iter::once(fast).chain((0..r).rev().filter(|&d| d != fast)).collect();
        let mut spt = vec![1; r];
        spt[fast] = vec.min(shape[fast]).max(1);
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

    /// The input dimensions with their sizes, in order.
    pub fn in_dims(&self) -> Vec<(InDim, usize)> {
        self.ins.iter().map(|(d, b)| (*d, 1usize << b.len())).collect()
    }

    /// The output dimensions with their sizes, in order.
    pub fn out_dims(&self) -> Vec<(InDim, usize)> {
        self.outs.iter().copied().zip(self.shape.iter().copied()).collect()
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

    /// Every basis mapped by `f`, dimension by dimension.
    fn map_bases(&self, f: impl Fn(&Basis) -> Basis) -> Vec<(InDim, Vec<Basis>)> {
        self.ins.iter().map(|(d, bs)| (*d, bs.iter().map(&f).collect())).collect()
    }

    /// Zero the coordinates along `dims` (their size becomes 1): the layout of an operand
    /// that is broadcast along `dims` to this layout. Register bases that become zero are
    /// dropped; returns, per register bit of `self`, its bit in the result (if kept). The
    /// outputs must be tensor coordinates (as for the other shape changes below).
    pub fn project(&self, dims: &[usize]) -> (LinearLayout, Vec<Option<usize>>) {
        let mut shape = self.shape.clone();
        for &d in dims {
            shape[d] = 1;
        }
        let zero = |b: &Basis| -> Basis { b.iter().enumerate().map(|(d, &x)| if dims.contains(&d) { 0 } else { x }).collect() };
        let mut l = LinearLayout::tensor(shape, self.map_bases(zero));
        let mut map = vec![];
        let mut kept = 0;
        for b in l.bases(InDim::Register) {
            map.push((!is_zero(b)).then(|| {
                kept += 1;
                kept - 1
            }));
        }
        l.bases_mut(InDim::Register).retain(|b| !is_zero(b));
        (l, map)
    }

    /// Remove dimension `d` (the layout of a reduction's result along `d`): bases lose that
    /// coordinate; register bases that become zero are dropped (see [`project`](Self::project)).
    pub fn remove_dim(&self, d: usize) -> (LinearLayout, Vec<Option<usize>>) {
        let (p, map) = self.project(&[d]);
        let drop = |b: &Basis| -> Basis { b.iter().enumerate().filter(|&(k, _)| k != d).map(|(_, &x)| x).collect() };
        let mut shape = p.shape.clone();
        shape.remove(d);
        (LinearLayout::tensor(shape, p.map_bases(drop)), map)
    }

    /// The operand layout an `expand_dims` at `d` in this layout reads, when this layout
    /// without dimension `d` keeps every register (so that the operand's registers are the
    /// result's): what the conversion pass asks for, the lowering takes, and `remat` uses.
    pub fn expand_source(&self, d: usize) -> Option<LinearLayout> {
        let (want, map) = self.remove_dim(d);
        map.iter().all(|m| m.is_some()).then_some(want)
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
        LinearLayout::tensor(shape, self.map_bases(ins))
    }

    /// Relabel dimensions: dimension `i` of the result is dimension `perm[i]` of `self`.
    pub fn permute(&self, perm: &[usize]) -> LinearLayout {
        let p = |b: &Basis| -> Basis { perm.iter().map(|&k| b[k]).collect() };
        LinearLayout::tensor(perm.iter().map(|&k| self.shape[k]).collect(), self.map_bases(p))
    }

    /// The bases of input dimension `d` (empty when the layout has no such input).
    pub fn bases(&self, d: InDim) -> &[Basis] {
        self.ins.iter().find(|(n, _)| *n == d).map_or(&[], |(_, b)| b)
    }

    fn bases_mut(&mut self, d: InDim) -> &mut Vec<Basis> {
        let i = match self.ins.iter().position(|(n, _)| *n == d) {
            Some(i) => i,
            None => {
                self.ins.push((d, vec![]));
                self.ins.len() - 1
            }
        };
        &mut self.ins[i].1
    }

    /// Registers per thread.
    pub fn num_regs(&self) -> usize {
        1 << self.bases(InDim::Register).len()
    }

    /// The output at the given input indices: the XOR of the bases of their set bits.
    /// Inputs not listed are 0; an input the layout does not have has size 1, and bits of
    /// an index beyond its dimension's size are ignored.
    pub fn apply_in(&self, at: &[(InDim, u32)]) -> Vec<u32> {
        let mut c = vec![0u32; self.rank()];
        for &(d, idx) in at {
            for (i, b) in self.bases(d).iter().enumerate() {
                if idx.checked_shr(i as u32).unwrap_or(0) & 1 == 1 {
                    for (cd, bd) in c.iter_mut().zip(b) {
                        *cd ^= bd;
                    }
                }
            }
        }
        c
    }

    /// Coordinates of register `reg` of lane `lane` of warp `warp`.
    pub fn apply(&self, reg: u32, lane: u32, warp: u32) -> Vec<u32> {
        self.apply_in(&[(InDim::Register, reg), (InDim::Lane, lane), (InDim::Warp, warp)])
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
        self.bases(d).iter().enumerate().filter(|(_, b)| is_zero(b)).fold(0, |m, (i, _)| m | 1 << i)
    }

    /// How `to`'s registers are `self`'s: `Some(map)`, `to`'s register `r` being `self`'s
    /// register `map[r]`, when both cover the same shape with the same lane and warp bases
    /// (every thread holds the same elements) and each of `to`'s registers is one of
    /// `self`'s (the maps are linear, so what holds at lane 0 of warp 0 holds everywhere).
    /// A conversion between them renames registers and moves no data: a `dot`
    /// accumulator becoming the next `dot`'s `a` fragments, for one.
    pub fn register_permutation(&self, to: &LinearLayout) -> Option<Vec<usize>> {
        if self.shape != to.shape || self.bases(InDim::Lane) != to.bases(InDim::Lane) || self.bases(InDim::Warp) != to.bases(InDim::Warp) {
            return None;
        }
        let mut at: std::collections::HashMap<Vec<u32>, usize> = std::collections::HashMap::new();
        for r in 0..self.num_regs() {
            at.entry(self.apply(r as u32, 0, 0)).or_insert(r);
        }
        (0..to.num_regs()).map(|r| at.get(&to.apply(r as u32, 0, 0)).copied()).collect()
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

    /// Bits of each output dimension.
    fn out_bits(&self) -> Vec<u32> {
        self.shape.iter().map(|&s| log2(s)).collect()
    }

    /// Elimination over all bases, as bit strings of the flattened outputs, in input order.
    fn span(&self) -> Span {
        let bits = self.out_bits();
        let columns: Vec<u64> = self.ins.iter().flat_map(|(_, bs)| bs).map(|b| flatten(b, &bits)).collect();
        Span::new(&columns)
    }

    fn num_in_bits(&self) -> usize {
        self.ins.iter().map(|(_, b)| b.len()).sum()
    }

    /// True when every output is reached (for a register layout: every element of the shape
    /// is held by some thread).
    pub fn is_surjective(&self) -> bool {
        self.span().rank() == self.out_bits().iter().sum::<u32>() as usize
    }

    /// True when no two inputs give the same output (no replication).
    pub fn is_injective(&self) -> bool {
        self.span().rank() == self.num_in_bits()
    }

    /// True when the layout is one-to-one and onto, hence invertible.
    pub fn is_bijective(&self) -> bool {
        self.is_injective() && self.is_surjective()
    }

    /// `outer ∘ self`: run `self`, then `outer` on its outputs. The output dimensions of
    /// `self` must be exactly the input dimensions of `outer` (by name, in any order), each
    /// no larger than `outer`'s input of that name; `None` otherwise. The result has the
    /// inputs of `self` and the outputs of `outer`.
    pub fn compose(&self, outer: &LinearLayout) -> Option<LinearLayout> {
        if self.outs.len() != outer.ins.len() {
            return None;
        }
        for (&d, &size) in self.outs.iter().zip(&self.shape) {
            match outer.ins.iter().find(|(n, _)| *n == d) {
                Some((_, b)) if size <= 1usize << b.len() => {}
                _ => return None,
            }
        }
        let through = |b: &Basis| -> Basis {
            let at: Vec<(InDim, u32)> = self.outs.iter().copied().zip(b.iter().copied()).collect();
            outer.apply_in(&at)
        };
        Some(LinearLayout { shape: outer.shape.clone(), outs: outer.outs.clone(), ins: self.map_bases(through) })
    }

    /// Triton's `invertAndCompose`: `c` with `other ∘ c = self`, i.e. for each input of
    /// `self`, the input of `other` that holds the same output. Both must have the same
    /// output dimensions in the same order (`self`'s may be smaller: a tile within a larger
    /// buffer). `None` when some output of `self` is no output of `other`.
    ///
    /// When `other` is not injective (replication), an output has several preimages; the
    /// one chosen sets to 0 every input bit of `other` whose basis is zero or a combination
    /// of earlier bases (inputs in order, bits low to high): the lowest register, lane 0 of
    /// a replicated group of lanes, warp 0 of a replicated group of warps. Zero bases of
    /// `self` (its replication) map to 0.
    pub fn invert_and_compose(&self, other: &LinearLayout) -> Option<LinearLayout> {
        if self.outs != other.outs || self.shape.iter().zip(&other.shape).any(|(a, b)| a > b) {
            return None;
        }
        let bits = other.out_bits();
        let span = other.span();
        let in_bits: Vec<u32> = other.ins.iter().map(|(_, b)| b.len() as u32).collect();
        let mut ins = vec![];
        for (d, bases) in &self.ins {
            let solved = bases.iter().map(|b| span.solve(flatten(b, &bits)).map(|x| unflatten(x, &in_bits))).collect::<Option<Vec<Basis>>>()?;
            ins.push((*d, solved));
        }
        Some(LinearLayout::new(ins, &other.in_dims()))
    }

    /// The inverse of a bijective layout (`None` otherwise): its inputs are the outputs of
    /// `self` and its outputs the inputs of `self`, so for a register layout it maps
    /// coordinates to (register, lane, warp), and for a shared layout coordinates to the
    /// offset. For a layout that replicates, use
    /// [`invert_and_compose`](Self::invert_and_compose), which picks one owner.
    pub fn invert(&self) -> Option<LinearLayout> {
        if !self.is_bijective() {
            return None;
        }
        LinearLayout::identity(&self.out_dims()).invert_and_compose(self)
    }
}

impl fmt::Display for LinearLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |bs: &[Basis]| bs.iter().map(|b| format!("{b:?}")).collect::<Vec<_>>().join(" ");
        if self.outs.iter().enumerate().all(|(i, &d)| d == InDim::Coord(i)) {
            write!(f, "linear{:?}", self.shape)?;
        } else {
            let outs: Vec<String> = self.out_dims().iter().map(|(d, s)| format!("{d}: {s}")).collect();
            write!(f, "linear[{}]", outs.join(", "))?;
        }
        let ins: Vec<String> = self.ins.iter().map(|(d, bs)| format!("{d}: [{}]", show(bs))).collect();
        write!(f, " {{ {} }}", ins.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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
        assert!(!l.is_injective());
    }

    #[test]
    fn explicit_bases_are_a_layout() {
        // The m16n8 f32 accumulator of mma.sync written out by hand (tensor-cores note §1).
        let l = LinearLayout::new(
            vec![
                (InDim::Register, vec![vec![0, 1], vec![8, 0]]),
                (InDim::Lane, vec![vec![0, 2], vec![0, 4], vec![1, 0], vec![2, 0], vec![4, 0]]),
                (InDim::Warp, vec![]),
            ],
            &[(InDim::Coord(0), 16), (InDim::Coord(1), 8)],
        );
        assert_eq!(l, LinearLayout::mma_v2_accumulator(&[16, 8], &[1, 1]));
        assert!(l.is_bijective());
        assert_eq!(l.contiguous_regs(1), 2);
        assert_eq!(l.to_string(), "linear[16, 8] { register: [[0, 1] [8, 0]], lane: [[0, 2] [0, 4] [1, 0] [2, 0] [4, 0]], warp: [] }");
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

    #[test]
    fn apply_in_names_its_inputs() {
        let l = LinearLayout::blocked(&[32, 64], &[1, 4], &[2, 16], &[4, 1], &[1, 0]);
        for (r, lane, w) in [(0, 0, 0), (3, 17, 2), (7, 31, 3), (5, 6, 1)] {
            let want = l.apply(r, lane, w);
            assert_eq!(l.apply_in(&[(InDim::Warp, w), (InDim::Register, r), (InDim::Lane, lane)]), want);
        }
        // Inputs the layout does not have are size 1.
        assert_eq!(l.apply_in(&[(InDim::Offset, 0), (InDim::Lane, 1)]), vec![0, 4]);
    }

    #[test]
    fn algebra_rejects_mismatched_dimensions() {
        let l = LinearLayout::blocked(&[32, 64], &[1, 4], &[2, 16], &[4, 1], &[1, 0]);
        // Register → coordinates composed with register → coordinates: names do not chain.
        assert!(l.compose(&l).is_none());
        // Outputs must agree: coordinates are not offsets, and a [64, 32] tile does not fit [32, 64].
        assert!(l.invert_and_compose(&LinearLayout::identity(&[(InDim::Offset, 2048)])).is_none());
        assert!(l.permute(&[1, 0]).invert_and_compose(&l).is_none());
        // A replicated layout has no inverse; a layout that misses elements cannot hold them.
        assert!(LinearLayout::blocked_1d(64, 4, 4).invert().is_none());
        let half = LinearLayout::blocked(&[64], &[1], &[32], &[1], &[0]); // register bit 0 steps by 32
        let lanes_only = LinearLayout::new(vec![(InDim::Lane, half.bases(InDim::Lane).to_vec())], &[(InDim::Coord(0), 64)]);
        assert!(half.invert_and_compose(&lanes_only).is_none());
    }

    #[test]
    fn replicated_layouts_invert_to_the_first_owner() {
        // 64 elements on 4 warps: lane bit 4 and both warp bits replicate.
        let l = LinearLayout::blocked_1d(64, 4, 4);
        let c = l.invert_and_compose(&l).unwrap();
        assert_eq!(c.compose(&l).unwrap(), l);
        for lane in 0..32 {
            for w in 0..4 {
                for r in 0..4 {
                    // Each element maps to its owner in warp 0, lanes 0..15.
                    let at = [(InDim::Register, r), (InDim::Lane, lane), (InDim::Warp, w)];
                    assert_eq!(c.apply_in(&at), vec![r, lane & 15, 0]);
                }
            }
        }
        // Where element x lives in a layout that keeps two copies of every element (two
        // register bits with the same basis): always the lower register.
        let dup = LinearLayout::new(vec![(InDim::Register, vec![vec![1], vec![1], vec![2]])], &[(InDim::Coord(0), 4)]);
        let inv = LinearLayout::identity(&[(InDim::Coord(0), 4)]).invert_and_compose(&dup).unwrap();
        assert_eq!((0..4).map(|x| inv.apply_in(&[(InDim::Coord(0), x)])[0]).collect::<Vec<_>>(), vec![0, 1, 4, 5]);
    }

    /// A layout with the given inputs (name, bits) and outputs (name, size) whose bases are
    /// taken from `seed` (reduced modulo the output sizes).
    fn from_seed(ins: &[(InDim, usize)], outs: &[(InDim, usize)], seed: &[u32]) -> LinearLayout {
        let mut s = seed.iter().cycle();
        let ins = ins.iter().map(|&(d, n)| (d, (0..n).map(|_| outs.iter().map(|&(_, size)| s.next().unwrap() % size as u32).collect()).collect())).collect();
        LinearLayout::new(ins, outs)
    }

    /// A bijection from `ins` (name, bits) to `outs` (name, size) of the same total bits: the
    /// identity on the flattened bits, transformed by column additions `(i, j)`: column i ^=
    /// column j (these generate every invertible matrix over GF(2)).
    fn bijection(ins: &[(InDim, usize)], outs: &[(InDim, usize)], ops: &[(usize, usize)]) -> LinearLayout {
        let n: usize = ins.iter().map(|&(_, b)| b).sum();
        let mut cols: Vec<u64> = (0..n).map(|i| 1 << i).collect();
        for &(i, j) in ops {
            let (i, j) = (i % n, j % n);
            if i != j {
                cols[i] ^= cols[j];
            }
        }
        let bits: Vec<u32> = outs.iter().map(|&(_, s)| log2(s)).collect();
        let mut c = cols.into_iter();
        let ins = ins.iter().map(|&(d, b)| (d, (0..b).map(|_| unflatten(c.next().unwrap(), &bits)).collect())).collect();
        LinearLayout::new(ins, outs)
    }

    const HW: [(InDim, usize); 3] = [(InDim::Register, 2), (InDim::Lane, 3), (InDim::Warp, 1)];
    const TILE: [(InDim, usize); 2] = [(InDim::Coord(0), 8), (InDim::Coord(1), 8)];
    const HW_SIZES: [(InDim, usize); 3] = [(InDim::Register, 4), (InDim::Lane, 8), (InDim::Warp, 2)];

    proptest! {
        #[test]
        fn compose_is_associative(seed in prop::collection::vec(any::<u32>(), 40)) {
            // hardware → tile → offset → transposed tile, random linear maps all.
            let a = from_seed(&HW, &TILE, &seed[..12]);
            let b = from_seed(&[(InDim::Coord(0), 3), (InDim::Coord(1), 3)], &[(InDim::Offset, 64)], &seed[12..18]);
            let c = from_seed(&[(InDim::Offset, 6)], &[(InDim::Coord(1), 8), (InDim::Coord(0), 8)], &seed[18..30]);
            let left = a.compose(&b).unwrap().compose(&c).unwrap();
            let right = a.compose(&b.compose(&c).unwrap()).unwrap();
            prop_assert_eq!(&left, &right);
            // And composition is running one after the other.
            for x in 0..64u32 {
                let at = [(InDim::Register, x & 3), (InDim::Lane, x >> 2 & 7), (InDim::Warp, x >> 5)];
                let t = a.apply_in(&at);
                let o = b.apply_in(&[(InDim::Coord(0), t[0]), (InDim::Coord(1), t[1])]);
                prop_assert_eq!(left.apply_in(&at), c.apply_in(&[(InDim::Offset, o[0])]));
            }
        }

        #[test]
        fn invert_of_a_bijection_is_its_two_sided_inverse(ops in prop::collection::vec((0usize..6, 0usize..6), 0..24)) {
            let l = bijection(&HW, &TILE, &ops);
            prop_assert!(l.is_bijective());
            let inv = l.invert().unwrap();
            prop_assert_eq!(l.compose(&inv).unwrap(), LinearLayout::identity(&HW_SIZES));
            prop_assert_eq!(inv.compose(&l).unwrap(), LinearLayout::identity(&TILE));
        }

        #[test]
        fn invert_and_compose_with_itself_is_the_identity(ops in prop::collection::vec((0usize..6, 0usize..6), 0..24)) {
            let l = bijection(&HW, &TILE, &ops);
            prop_assert_eq!(l.invert_and_compose(&l).unwrap(), LinearLayout::identity(&HW_SIZES));
        }

        #[test]
        fn invert_and_compose_finds_the_holder(seed in prop::collection::vec(any::<u32>(), 40)) {
            // b: 9 input bits onto 6 output bits (replicating); a: anything.
            let a = from_seed(&HW, &TILE, &seed[..12]);
            let b = from_seed(&[(InDim::Offset, 9)], &TILE, &seed[12..30]);
            prop_assume!(b.is_surjective());
            let c = a.invert_and_compose(&b).unwrap();
            prop_assert_eq!(c.out_dims(), vec![(InDim::Offset, 512)]);
            prop_assert_eq!(c.compose(&b).unwrap(), a);
        }
    }
}
