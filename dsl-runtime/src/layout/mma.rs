//! Tensor-core fragment layouts: which lane holds which element of an `mma.sync` or
//! `wgmma` operand or accumulator, in which register, and the per-lane addresses of the
//! `ldmatrix` that loads an operand from shared memory.
//!
//! Registers count *elements*: a 32-bit register of 16-bit operands holds element
//! registers `2j` (low half) and `2j + 1` (high half), so the PTX ISA's `a0..a7` of an
//! m16n8k16 A fragment are element registers 0..7.
//!
//! Sources: the PTX ISA's "Matrix Fragments for mma.m16n8k16" (§9.7.14.5.8 in the
//! edition our notes cite; the m16n8k8 and m16n8k32 figures sit beside it), the wgmma
//! "Register Fragments" (matrix D) of "Asynchronous Warpgroup Level Matrix Multiply-
//! Accumulate Instructions", and "Warp-level matrix load instruction: ldmatrix" (section
//! numbers move between ISA editions, so the titles are the reference); our notes
//! `shared/notes/tensor-cores.md` §1, §2, §4; Triton's `nvidiaMmaTile` and
//! `nvidiaDotToLinearLayout` (lib/Dialect/TritonGPU/IR/LinearLayoutConversions.cpp), whose
//! conventions (register and warp orders) these follow.

use super::{Basis, Build, InDim, LinearLayout};

impl LinearLayout {
    /// The C/D fragment (f32 accumulator) of `mma.sync.aligned.m16n8k16` (also m16n8k8) for
    /// a `[M, N]` tile: element register `c_r` of lane `4g + t` holds row `g + 8 * (r >> 1)`,
    /// column `2t + (r & 1)` (PTX ISA §9.7.14.5.8; notes §1). As bases: register bit 0 steps
    /// the column by 1, lane bits 0-1 by 2 and 4, lane bits 2-4 step the row by 1, 2, 4,
    /// register bit 1 the row by 8.
    ///
    /// The warps of `warps_per_cta` (`[along M, along N]`) tile the CTA with 16 x 8 warp
    /// tiles, warp bits stepping N first (Triton's mma v2 warp order); beyond that the tile
    /// repeats in registers, along N first, then M. Warps past the shape replicate (zero
    /// bases). `M >= 16`, `N >= 8`, all powers of two (checked in debug builds).
    pub fn mma_v2_accumulator(shape: &[usize], warps_per_cta: &[usize]) -> LinearLayout {
        debug_assert!(shape.len() == 2 && shape[0] >= 16 && shape[1] >= 8 && warps_per_cta.len() == 2);
        let mut b = Build::new(shape, &[InDim::Register, InDim::Lane, InDim::Warp]);
        b.grow(InDim::Register, 1, 2); // c0/c1: columns 2t, 2t+1
        b.grow(InDim::Lane, 1, 4); // t = lane % 4
        b.grow(InDim::Lane, 0, 8); // g = lane / 4
        b.grow(InDim::Register, 0, 2); // c2/c3: row g + 8
        b.grow(InDim::Warp, 1, warps_per_cta[1]);
        b.grow(InDim::Warp, 0, warps_per_cta[0]);
        b.repeat_in_registers(&[1, 0]);
        b.finish()
    }

    /// The A (`op_idx` 0, shape `[M, K]`) or B (`op_idx` 1, shape `[K, N]`) fragment of
    /// `mma.sync` for `elem_bits`-bit inputs, with `warps_per_cta` the accumulator's (see
    /// [`mma_v2_accumulator`](Self::mma_v2_accumulator)).
    ///
    /// A 32-bit register holds `kw = 32 / elem_bits` elements consecutive along K, and the
    /// instruction's K is `8 * kw` (PTX ISA §9.7.14.5.8; notes §1):
    /// - 16-bit (f16/bf16), m16n8k16: A `a0..a7` of lane `4g + t` are `(g, 2t)`, `(g, 2t+1)`,
    ///   `(g+8, 2t)`, `(g+8, 2t+1)`, `(g, 2t+8)`, `(g, 2t+9)`, `(g+8, 2t+8)`, `(g+8, 2t+9)`;
    ///   B `b0..b3` are `(k, n)` = `(2t, g)`, `(2t+1, g)`, `(2t+8, g)`, `(2t+9, g)`.
    /// - tf32 (`elem_bits` 32), m16n8k8: one element per register, so the lanes alone step
    ///   K by 1 and 2 and register bit 1 (A) / 0 (B) adds 4: A `a0..a3` = `(g, t)`,
    ///   `(g+8, t)`, `(g, t+4)`, `(g+8, t+4)`; B `b0, b1` = `(t, g)`, `(t+4, g)`.
    /// - 8-bit, m16n8k32: four elements per register; A `a0..a15` = `(g + 8*((i>>2)&1),
    ///   4t + (i&3) + 16*(i>>3))`, B `b0..b7` = `(4t + (i&3) + 16*(i>>2), g)`.
    ///
    /// Warps: the warp that computes accumulator tile (i, j) needs row block i of A and
    /// column block j of B, so A is broadcast over the warp bits along N (zero bases) and B
    /// over those along M. Beyond one tile, A's registers repeat along K first (Triton's
    /// order for dot operands), then M; B's along N first, then K, so that each group of 8
    /// registers is one 16 x 16 tile (one `ldmatrix.x4`) for either operand.
    pub fn mma_v2_operand(op_idx: usize, shape: &[usize], warps_per_cta: &[usize], elem_bits: u32) -> LinearLayout {
        debug_assert!(op_idx < 2 && shape.len() == 2 && warps_per_cta.len() == 2 && matches!(elem_bits, 8 | 16 | 32));
        let kw = (32 / elem_bits) as usize;
        let mut b = Build::new(shape, &[InDim::Register, InDim::Lane, InDim::Warp]);
        if op_idx == 0 {
            debug_assert!(shape[0] >= 16 && shape[1] >= 8 * kw);
            b.grow(InDim::Register, 1, kw); // the elements of one 32-bit register
            b.grow(InDim::Lane, 1, 4); // t
            b.grow(InDim::Lane, 0, 8); // g
            b.grow(InDim::Register, 0, 2); // row g + 8
            b.grow(InDim::Register, 1, 2); // the second half of K
            b.broadcast(InDim::Warp, warps_per_cta[1]);
            b.grow(InDim::Warp, 0, warps_per_cta[0]);
            b.repeat_in_registers(&[1, 0]);
        } else {
            debug_assert!(shape[0] >= 8 * kw && shape[1] >= 8);
            b.grow(InDim::Register, 0, kw);
            b.grow(InDim::Lane, 0, 4); // t
            b.grow(InDim::Lane, 1, 8); // g
            b.grow(InDim::Register, 0, 2); // the second half of K
            b.grow(InDim::Warp, 1, warps_per_cta[1]);
            b.broadcast(InDim::Warp, warps_per_cta[0]);
            // N before K: then 8 registers hold one 16 x 16 tile (k16 x n16), which one
            // `ldmatrix.x4.trans` loads, and a K step's fragments are 8-register groups.
            b.repeat_in_registers(&[1, 0]);
        }
        b.finish()
    }

    /// The D fragment (f32 accumulator) of sm_90a `wgmma.mma_async.m64nNk16` with
    /// `N = instr_n`, for a `[M, N]` tile: warp `w` of a warpgroup (4 consecutive warps)
    /// owns rows `16w..16w+16`, and within them has the mma v2 pattern repeated every 8
    /// columns: `d_i` of lane `4g + t` is row `16w + g + 8 * ((i >> 1) & 1)`, column
    /// `8 * (i >> 2) + 2t + (i & 1)` (PTX ISA, wgmma "Register Fragments", matrix D;
    /// CuTe `CLayout_64xN`; notes §4).
    ///
    /// `warps_per_cta` is `[along M, along N]`, with warp bits stepping M first (Triton's
    /// warp order on Hopper), so that the 4 warps of a warpgroup stack along M: the M count
    /// is a multiple of 4. Further warpgroups tile M, then N in steps of `instr_n`; beyond
    /// that the tile repeats in registers, N first. `instr_n` is a power of two in 8..=256,
    /// `M >= 64`, `N >= instr_n` (checked in debug builds).
    pub fn wgmma_accumulator(shape: &[usize], warps_per_cta: &[usize], instr_n: usize) -> LinearLayout {
        debug_assert!(shape.len() == 2 && warps_per_cta.len() == 2 && warps_per_cta[0] >= 4); // a power of two, so a multiple of 4
        debug_assert!(instr_n.is_power_of_two() && (8..=256).contains(&instr_n) && shape[0] >= 64 && shape[1] >= instr_n);
        let mut b = Build::new(shape, &[InDim::Register, InDim::Lane, InDim::Warp]);
        b.grow(InDim::Register, 1, 2);
        b.grow(InDim::Lane, 1, 4);
        b.grow(InDim::Lane, 0, 8);
        b.grow(InDim::Register, 0, 2);
        b.grow(InDim::Register, 1, instr_n / 8); // d[4j..4j+4]: columns 8j..8j+8
        b.grow(InDim::Warp, 0, warps_per_cta[0]);
        b.grow(InDim::Warp, 1, warps_per_cta[1]);
        b.repeat_in_registers(&[1, 0]);
        b.finish()
    }

    /// The shared-memory offsets an `ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16`
    /// needs to load `fragment` (warp 0's first 16 x 16 tile of a 16-bit
    /// [`mma_v2_operand`](Self::mma_v2_operand); element register bit 0 is the half of a
    /// 32-bit register, bits 1-2 the matrix / destination register) from `shared` (an
    /// `Offset` → coordinates layout over the same dimensions, possibly larger): a layout
    /// `Lane` → `Offset`, the element offset of the row each lane addresses.
    ///
    /// It is derived, not tabulated. The facts of `ldmatrix` (PTX ISA "Warp-level matrix
    /// load instruction: ldmatrix"; notes §2) are linear maps: lane `8i + j` gives the
    /// address of row `j` of matrix `i` (16 contiguous bytes, 16-byte aligned); that
    /// matrix lands in register `i`, and without `.trans` thread `4g + t` receives row `g`,
    /// columns `2t, 2t + 1`, so row `j` starts at fragment element (register `2i`, lane
    /// `4j`); with `.trans` it receives rows `2t, 2t + 1` of column `g` as stored, so stored
    /// row `j` starts at (register `2i + (j & 1)`, lane `j >> 1`). Composing that map with
    /// `fragment` gives the coordinates each lane addresses, and
    /// [`invert_and_compose`](Self::invert_and_compose) with `shared` their offsets.
    ///
    /// With `bits = 32` (a tf32 operand: one element a register, bits 0-1 the matrix) a
    /// stored row is 4 elements, thread `4g + t` receives element `t` of row `g`, so row
    /// `j` of matrix `i` starts at (register `i`, lane `4j`); there is no `.trans` form
    /// (it would move 16-bit halves).
    ///
    /// `None` when `ldmatrix` cannot do it: a row's 16 bytes are not consecutive offsets
    /// starting at a multiple of 16 bytes, e.g. a K-contiguous operand read with `.trans`,
    /// or when the inputs do not have those shapes.
    ///
    /// For the tile at `(r0, c0)` (multiples of 16) rather than at the origin, XOR the
    /// offset of `(r0, c0)` into each lane's offset: the maps are linear over GF(2) and the
    /// origin's coordinate bits are disjoint from the tile's. It must be an XOR, not an
    /// addition, since a swizzle folds row bits into the chunk bits of the origin's offset.
    pub fn ldmatrix_x4(fragment: &LinearLayout, shared: &LinearLayout, trans: bool, bits: u32) -> Option<LinearLayout> {
        let is_shared = shared.in_dims().len() == 1 && !shared.bases(InDim::Offset).is_empty();
        let group_bits = if bits == 32 { 2 } else { 3 };
        if fragment.bases(InDim::Register).len() < group_bits || fragment.bases(InDim::Lane).len() != 5 || !is_shared || (bits == 32 && trans) {
            return None;
        }
        // A map into the fragment's inputs, one basis per bit: `at(d, i)` is bit i of input d.
        let hw = fragment.in_dims();
        let at = |dim: InDim, bit: u32| -> Basis { hw.iter().map(|&(d, _)| if d == dim { 1 << bit } else { 0 }).collect() };
        let (reg, lane) = (InDim::Register, InDim::Lane);
        // Address lane bits → fragment input of the first element of the row that lane
        // addresses; element bits within a stored row → fragment input.
        let (addr, row) = match (bits, trans) {
            (32, _) => (vec![at(lane, 2), at(lane, 3), at(lane, 4), at(reg, 0), at(reg, 1)], vec![at(lane, 0), at(lane, 1)]),
            (_, true) => (vec![at(reg, 0), at(lane, 0), at(lane, 1), at(reg, 1), at(reg, 2)], vec![at(lane, 2), at(lane, 3), at(lane, 4)]),
            (_, false) => (vec![at(lane, 2), at(lane, 3), at(lane, 4), at(reg, 1), at(reg, 2)], vec![at(reg, 0), at(lane, 0), at(lane, 1)]),
        };
        let row_in = if bits == 32 { lane } else { reg };
        let addr = LinearLayout::new(vec![(lane, addr)], &hw).compose(fragment)?.invert_and_compose(shared)?;
        let row = LinearLayout::new(vec![(row_in, row)], &hw).compose(fragment)?.invert_and_compose(shared)?;
        // Each row: 16 contiguous bytes (offsets +1, +2, +4 of 16-bit elements, +1, +2 of
        // 32-bit ones), starting 16-byte aligned.
        let per_row = 128 / bits;
        let steps = row.bases(row_in);
        let contiguous = steps.len() as u32 == per_row.trailing_zeros() && steps.iter().enumerate().all(|(i, b)| b[0] == 1 << i);
        let aligned = addr.bases(lane).iter().all(|b| b[0] % per_row == 0);
        (contiguous && aligned).then_some(addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every (lane, element register) of warp 0 against `want(lane, reg)`.
    fn check_fragment(l: &LinearLayout, regs: u32, want: impl Fn(u32, u32) -> [u32; 2]) {
        for lane in 0..32 {
            for r in 0..regs {
                assert_eq!(l.apply(r, lane, 0), want(lane, r), "lane {lane} reg {r}: {l}");
            }
        }
    }

    #[test]
    fn mma_v2_accumulator_matches_the_ptx_table() {
        let l = LinearLayout::mma_v2_accumulator(&[16, 8], &[1, 1]);
        // (lane, reg) → (row, col), read off the m16n8k16 D figure of PTX ISA §9.7.14.5.8.
        for (lane, reg, row, col) in [
            (0, 0, 0, 0),
            (0, 1, 0, 1),
            (0, 2, 8, 0),
            (0, 3, 8, 1),
            (1, 0, 0, 2),
            (3, 1, 0, 7),
            (4, 0, 1, 0),
            (5, 2, 9, 2),
            (13, 3, 11, 3),
            (22, 1, 5, 5),
            (30, 2, 15, 4),
            (31, 3, 15, 7),
        ] {
            assert_eq!(l.apply(reg, lane, 0), vec![row, col], "lane {lane} reg {reg}");
        }
        // The table's rule: row = groupID (+8 for c2, c3), col = 2 * threadID_in_group + (reg & 1).
        check_fragment(&l, 4, |lane, r| [lane / 4 + 8 * (r >> 1), 2 * (lane % 4) + (r & 1)]);
        assert_eq!(l.num_regs(), 4);
        assert!(l.is_bijective());
    }

    /// Attention's chained dots: with every warp along M, the first product's accumulator
    /// holds, thread by thread, the elements the second product's 16-bit `a` fragments
    /// need (c0 c1 of two adjacent n-tiles are a0..a3 / a4..a7), so the conversion renames
    /// registers; with warps along N too it does not (a warp's columns differ).
    #[test]
    fn a_chained_accumulator_is_the_next_a_operand_in_registers() {
        let acc = LinearLayout::mma_v2_accumulator(&[64, 64], &[4, 1]);
        let a = LinearLayout::mma_v2_operand(0, &[64, 64], &[4, 1], 16);
        let map = acc.register_permutation(&a).expect("same threads, same elements");
        for (r, &from) in map.iter().enumerate() {
            for lane in 0..32 {
                for warp in 0..4 {
                    assert_eq!(acc.apply(from as u32, lane, warp), a.apply(r as u32, lane, warp));
                }
            }
        }
        let acc22 = LinearLayout::mma_v2_accumulator(&[64, 64], &[2, 2]);
        assert!(acc22.register_permutation(&LinearLayout::mma_v2_operand(0, &[64, 64], &[2, 2], 16)).is_none());
    }

    #[test]
    fn mma_v2_accumulator_tiles_warps_then_registers() {
        // 64 x 64 with 2 x 2 warps: warp bit 0 steps N by 8, bit 1 M by 16; then registers
        // repeat N by 16, 32 and M by 32.
        let l = LinearLayout::mma_v2_accumulator(&[64, 64], &[2, 2]);
        assert!(l.is_bijective());
        assert_eq!(l.num_regs(), 32);
        for w in 0..4 {
            for lane in 0..32 {
                for r in 0..32 {
                    let (g, t) = (lane / 4, lane % 4);
                    let row = 16 * (w >> 1) + 32 * (r >> 4) + g + 8 * (r >> 1 & 1);
                    let col = 8 * (w & 1) + 16 * (r >> 2 & 3) + 2 * t + (r & 1);
                    assert_eq!(l.apply(r, lane, w), vec![row, col]);
                }
            }
        }
        // Too many warps for the tile replicate.
        let l = LinearLayout::mma_v2_accumulator(&[16, 16], &[2, 2]);
        assert_eq!(l.replicated_bits(InDim::Warp), 0b10);
        assert!(l.is_surjective());
    }

    #[test]
    fn mma_v2_operand_a_matches_the_ptx_table() {
        let l = LinearLayout::mma_v2_operand(0, &[16, 16], &[1, 1], 16);
        // (lane, reg) → (row, col) for a0..a7, PTX ISA §9.7.14.5.8 (m16n8k16 A, .f16/.bf16).
        for (lane, reg, row, col) in
            [(0, 0, 0, 0), (1, 0, 0, 2), (9, 1, 2, 3), (14, 2, 11, 4), (27, 3, 14, 7), (0, 4, 0, 8), (31, 5, 7, 15), (18, 6, 12, 12), (5, 7, 9, 11)]
        {
            assert_eq!(l.apply(reg, lane, 0), vec![row, col], "lane {lane} a{reg}");
        }
        check_fragment(&l, 8, |lane, r| [lane / 4 + 8 * (r >> 1 & 1), 2 * (lane % 4) + (r & 1) + 8 * (r >> 2)]);
        assert!(l.is_bijective());
    }

    #[test]
    fn mma_v2_operands_of_other_widths_match_the_ptx_tables() {
        let g = |lane: u32| lane / 4;
        let t = |lane: u32| lane % 4;
        // B, 16-bit: b0..b3 = (2t, g), (2t+1, g), (2t+8, g), (2t+9, g).
        let b16 = LinearLayout::mma_v2_operand(1, &[16, 8], &[1, 1], 16);
        check_fragment(&b16, 4, |l, r| [2 * t(l) + (r & 1) + 8 * (r >> 1), g(l)]);
        // tf32, m16n8k8: A a0..a3 = (g, t), (g+8, t), (g, t+4), (g+8, t+4); B b0, b1 = (t, g), (t+4, g).
        let a32 = LinearLayout::mma_v2_operand(0, &[16, 8], &[1, 1], 32);
        check_fragment(&a32, 4, |l, r| [g(l) + 8 * (r & 1), t(l) + 4 * (r >> 1)]);
        assert_eq!(a32.apply(2, 6, 0), vec![1, 6]);
        let b32 = LinearLayout::mma_v2_operand(1, &[8, 8], &[1, 1], 32);
        check_fragment(&b32, 2, |l, r| [t(l) + 4 * r, g(l)]);
        // 8-bit, m16n8k32: A a0..a15, B b0..b7.
        let a8 = LinearLayout::mma_v2_operand(0, &[16, 32], &[1, 1], 8);
        check_fragment(&a8, 16, |l, i| [g(l) + 8 * (i >> 2 & 1), 4 * t(l) + (i & 3) + 16 * (i >> 3)]);
        let b8 = LinearLayout::mma_v2_operand(1, &[32, 8], &[1, 1], 8);
        check_fragment(&b8, 8, |l, i| [4 * t(l) + (i & 3) + 16 * (i >> 2), g(l)]);
        for l in [b16, a32, b32, a8, b8] {
            assert!(l.is_bijective(), "{l}");
        }
    }

    #[test]
    fn mma_v2_operands_follow_their_accumulator_warps() {
        // Warp w computes the accumulator rows and columns it holds, so it must hold those
        // rows of A (all of K) and those columns of B; A repeats over the N-warps, B over
        // the M-warps.
        let (m, n, k) = (64usize, 128usize, 32usize);
        let acc = LinearLayout::mma_v2_accumulator(&[m, n], &[2, 2]);
        let a = LinearLayout::mma_v2_operand(0, &[m, k], &[2, 2], 16);
        let b = LinearLayout::mma_v2_operand(1, &[k, n], &[2, 2], 16);
        assert_eq!(a.replicated_bits(InDim::Warp), 0b01);
        assert_eq!(b.replicated_bits(InDim::Warp), 0b10);
        let held = |l: &LinearLayout, w: u32, d: usize| {
            let mut s: Vec<u32> = (0..32).flat_map(|lane| (0..l.num_regs() as u32).map(move |r| (lane, r))).map(|(lane, r)| l.apply(r, lane, w)[d]).collect();
            s.sort();
            s.dedup();
            s
        };
        for w in 0..4 {
            assert_eq!(held(&acc, w, 0), held(&a, w, 0), "rows of warp {w}");
            assert_eq!(held(&acc, w, 1), held(&b, w, 1), "columns of warp {w}");
            assert_eq!(held(&a, w, 1).len(), k);
            assert_eq!(held(&b, w, 0).len(), k);
        }
        // A's registers repeat along K first; B's along N first (register 4 is the warp's
        // next 8 columns, 16 on since the 2 N-warps interleave by 8), then K (register 8
        // where a warp has 16 columns).
        assert_eq!(a.apply(8, 0, 0), vec![0, 16]);
        assert_eq!(b.apply(4, 0, 0), vec![0, 16]);
        let b16 = LinearLayout::mma_v2_operand(1, &[k, 32], &[2, 2], 16);
        assert_eq!(b16.apply(8, 0, 0), vec![16, 0]);
    }

    #[test]
    fn wgmma_accumulator_matches_the_ptx_layout() {
        for (shape, warps, n) in [([64, 64], [4, 1], 64), ([128, 256], [8, 1], 256), ([64, 8], [4, 1], 8)] {
            let l = LinearLayout::wgmma_accumulator(&shape, &warps, n);
            assert!(l.is_bijective(), "{l}");
            assert_eq!(l.num_regs(), n / 2);
            for w in 0..warps[0] as u32 {
                for lane in 0..32 {
                    for i in 0..n as u32 / 2 {
                        let (g, t) = (lane / 4, lane % 4);
                        let want = vec![16 * w + g + 8 * (i >> 1 & 1), 8 * (i >> 2) + 2 * t + (i & 1)];
                        assert_eq!(l.apply(i, lane, w), want, "{shape:?} warp {w} lane {lane} d{i}");
                    }
                }
            }
        }
        // Two warpgroups side by side along N, then register repeats down M.
        let l = LinearLayout::wgmma_accumulator(&[128, 256], &[4, 2], 128);
        assert!(l.is_bijective());
        assert_eq!(l.apply(0, 0, 4), vec![0, 128]);
        assert_eq!(l.apply(64, 0, 0), vec![64, 0]);
    }

    /// What `ldmatrix.x4` delivers when lane `q` supplies `addr[q]` (PTX ISA, `ldmatrix`):
    /// lanes `8i..8i+8` address the 8 rows of matrix `i`, each 8 consecutive 16-bit elements;
    /// thread `4g + t` receives, in 32-bit register `i` (element registers `2i`, `2i + 1`),
    /// elements (row `g`, columns `2t`, `2t + 1`) of matrix `i`, or with `.trans` (rows `2t`,
    /// `2t + 1`, column `g`). Returns the coordinates of every (lane, element register).
    fn ldmatrix_delivers(addr: &LinearLayout, shared: &LinearLayout, trans: bool) -> Vec<Vec<Vec<u32>>> {
        let row_addr = |q: u32| addr.apply_in(&[(InDim::Lane, q)])[0];
        (0..32)
            .map(|lane| {
                (0..8)
                    .map(|r| {
                        let (g, t, i, e) = (lane / 4, lane % 4, r / 2, r % 2);
                        let (row, col) = if trans { (2 * t + e, g) } else { (g, 2 * t + e) };
                        shared.apply_in(&[(InDim::Offset, row_addr(8 * i + row) + col)])
                    })
                    .collect()
            })
            .collect()
    }

    fn fragment_of(l: &LinearLayout) -> Vec<Vec<Vec<u32>>> {
        (0..32).map(|lane| (0..8).map(|r| l.apply(r, lane, 0)).collect()).collect()
    }

    /// The coordinates each lane addresses.
    fn addressed(addr: &LinearLayout, shared: &LinearLayout) -> Vec<Vec<u32>> {
        (0..32).map(|q| shared.apply_in(&[(InDim::Offset, addr.apply_in(&[(InDim::Lane, q)])[0])])).collect()
    }

    #[test]
    fn ldmatrix_addresses_match_the_notes_and_load_the_fragment() {
        let a = LinearLayout::mma_v2_operand(0, &[16, 16], &[1, 1], 16); // (m, k)
        let b = LinearLayout::mma_v2_operand(1, &[16, 16], &[1, 1], 16); // (k, n): two n-tiles
        // 64 x 64 bf16 buffers with the 128B swizzle, stored row-major as named.
        let smem = LinearLayout::nvmma_shared(&[64, 64], 16, 128, false);
        let transposed = smem.permute(&[1, 0]); // a [x][y] buffer seen as (y, x)
        // The four rows of the notes' §2 table: (fragment, storage, .trans, coordinates
        // (in the fragment's order) of the row lane l addresses).
        type Case<'a> = (&'a LinearLayout, &'a LinearLayout, bool, fn(u32) -> [u32; 2]);
        let cases: [Case; 4] = [
            (&a, &smem, false, |l| [l % 16, 8 * (l / 16)]),                      // A[m][k], x4: &A[l%16][8(l/16)]
            (&a, &transposed, true, |l| [8 * (l / 8 % 2), l % 8 + 8 * (l / 16)]), // A[k][m], x4.trans
            (&b, &smem, true, |l| [l % 16, 8 * (l / 16)]),                       // B[k][n], x4.trans
            (&b, &transposed, false, |l| [8 * (l / 8 % 2), l % 8 + 8 * (l / 16)]), // B[n][k], x4
        ];
        for (i, (frag, shared, trans, want)) in cases.into_iter().enumerate() {
            let addr = LinearLayout::ldmatrix_x4(frag, shared, trans, 16).unwrap_or_else(|| panic!("case {i}"));
            assert_eq!(addr.out_dims(), vec![(InDim::Offset, 4096)]);
            assert_eq!(addressed(&addr, shared), (0..32).map(|l| want(l).to_vec()).collect::<Vec<_>>(), "case {i}");
            assert_eq!(ldmatrix_delivers(&addr, shared, trans), fragment_of(frag), "case {i}");
        }
        // Case 0 against the notes' byte formula: off(r, k) = r*128 + (((k>>3) ^ (r&7)) << 4) + (k&7)*2.
        let addr = LinearLayout::ldmatrix_x4(&a, &smem, false, 16).unwrap();
        for l in 0..32 {
            let (r, k) = (l % 16, 8 * (l / 16));
            assert_eq!(2 * addr.apply_in(&[(InDim::Lane, l)])[0], r * 128 + (((k >> 3) ^ (r & 7)) << 4) + (k & 7) * 2);
        }
    }

    #[test]
    fn ldmatrix_tiles_elsewhere_xor_the_origin() {
        let a = LinearLayout::mma_v2_operand(0, &[16, 16], &[1, 1], 16);
        let smem = LinearLayout::swizzled_shared(&[64, 64], &[1, 0], 8, 1, 8);
        let inv = smem.invert().unwrap();
        let addr = LinearLayout::ldmatrix_x4(&a, &smem, false, 16).unwrap();
        for (r0, k0) in [(16, 16), (48, 32), (32, 48)] {
            let base = inv.apply_in(&[(InDim::Coord(0), r0), (InDim::Coord(1), k0)])[0];
            let mut added_differs = false;
            for l in 0..32 {
                let want = inv.apply_in(&[(InDim::Coord(0), r0 + l % 16), (InDim::Coord(1), k0 + 8 * (l / 16))])[0];
                let lane = addr.apply_in(&[(InDim::Lane, l)])[0];
                assert_eq!(base ^ lane, want);
                added_differs |= base + lane != want;
            }
            assert!(added_differs, "at ({r0}, {k0}) addition happens to work too");
        }
    }

    #[test]
    fn ldmatrix_phases_are_bank_conflict_free_only_when_swizzled() {
        // A bf16 A tile in a buffer of 128-byte rows (K = 64): one ldmatrix phase reads the 8
        // rows of one matrix, 16 bytes each. Shared memory has 32 banks of 4 bytes, i.e. 8
        // groups of 16 bytes: the phase is conflict-free iff its rows hit 8 distinct groups.
        let a = LinearLayout::mma_v2_operand(0, &[16, 16], &[1, 1], 16);
        let groups = |shared: &LinearLayout| -> Vec<usize> {
            let addr = LinearLayout::ldmatrix_x4(&a, shared, false, 16).unwrap();
            (0..4)
                .map(|phase| {
                    let mut g: Vec<u32> = (0..8).map(|j| addr.apply_in(&[(InDim::Lane, 8 * phase + j)])[0] * 2 / 16 % 8).collect();
                    g.sort();
                    g.dedup();
                    g.len()
                })
                .collect()
        };
        let swizzled = LinearLayout::swizzled_shared(&[64, 64], &[1, 0], 8, 1, 8);
        let nvmma = LinearLayout::nvmma_shared(&[64, 64], 16, 128, false);
        let plain = LinearLayout::swizzled_shared(&[64, 64], &[1, 0], 8, 1, 1);
        assert_eq!(groups(&swizzled), vec![8; 4]);
        assert_eq!(groups(&nvmma), vec![8; 4]);
        // Unswizzled, every row starts at the same bank: 8-way conflicts.
        assert_eq!(groups(&plain), vec![1; 4]);
        // 64-byte rows need the 64B swizzle (two rows share a 128-byte line).
        let a32 = LinearLayout::nvmma_shared(&[64, 32], 16, 64, false);
        assert_eq!(groups(&a32), vec![8; 4]);
    }

    #[test]
    fn ldmatrix_refuses_what_it_cannot_load() {
        let a = LinearLayout::mma_v2_operand(0, &[16, 16], &[1, 1], 16);
        let k_major = LinearLayout::swizzled_shared(&[64, 64], &[1, 0], 8, 1, 8);
        let m_major = LinearLayout::swizzled_shared(&[64, 64], &[0, 1], 8, 1, 8);
        // A K-contiguous tile needs the plain form, an M-contiguous one `.trans`.
        assert!(LinearLayout::ldmatrix_x4(&a, &k_major, true, 16).is_none());
        assert!(LinearLayout::ldmatrix_x4(&a, &m_major, false, 16).is_none());
        assert!(LinearLayout::ldmatrix_x4(&a, &m_major, true, 16).is_some());
        // A swizzle in 8-byte chunks moves rows off 16-byte boundaries.
        let fine = LinearLayout::swizzled_shared(&[64, 64], &[1, 0], 4, 1, 8);
        assert!(LinearLayout::ldmatrix_x4(&a, &fine, false, 16).is_none());
        // Not a shared layout.
        assert!(LinearLayout::ldmatrix_x4(&a, &a, false, 16).is_none());
    }

    /// tf32 `a` operands (32-bit elements, K contiguous) load with plain `ldmatrix.x4`:
    /// thread `4g + t` receives word `t` of row `g` of matrix `i` into register `i`, which
    /// is the m16n8k8 fragment (a0..a3 = (g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4)),
    /// and the phases are conflict-free in the 16-byte-chunk swizzle of the operand buffers.
    /// Never `.trans` (it would move 16-bit halves), so never a [K, N] `b`.
    #[test]
    fn ldmatrix_loads_tf32_a_fragments() {
        let a = LinearLayout::mma_v2_operand(0, &[16, 8], &[1, 1], 32);
        let b = LinearLayout::mma_v2_operand(1, &[8, 16], &[1, 1], 32);
        for cols in [32, 64] {
            let smem = LinearLayout::swizzled_shared(&[64, cols], &[1, 0], 4, 1, 8);
            let addr = LinearLayout::ldmatrix_x4(&a, &smem, false, 32).expect("tf32 a loads with ldmatrix");
            for lane in 0..32 {
                for r in 0..4 {
                    // What ldmatrix delivers: word t of the row lane 8r + g addressed.
                    let (g, t) = (lane / 4, lane % 4);
                    let row = addr.apply_in(&[(InDim::Lane, 8 * r + g)])[0];
                    assert_eq!(smem.apply_in(&[(InDim::Offset, row + t)]), a.apply(r, lane, 0), "lane {lane} reg {r}, {cols} columns");
                }
            }
            // Each phase (matrix) reads 8 rows of 16 bytes in 8 distinct 16-byte bank groups.
            for phase in 0..4 {
                let mut g: Vec<u32> = (0..8).map(|j| addr.apply_in(&[(InDim::Lane, 8 * phase + j)])[0] * 4 / 16 % 8).collect();
                g.sort();
                g.dedup();
                assert_eq!(g.len(), 8, "phase {phase}, {cols} columns");
            }
            assert!(LinearLayout::ldmatrix_x4(&a, &smem, true, 32).is_none());
        }
        let n_major = LinearLayout::swizzled_shared(&[8, 64], &[1, 0], 8, 1, 4);
        assert!(LinearLayout::ldmatrix_x4(&b, &n_major, false, 32).is_none());
    }
}
