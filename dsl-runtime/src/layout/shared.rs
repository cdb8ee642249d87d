//! Shared-memory layouts: `Offset` (the element offset within a buffer) → tensor
//! coordinates. Their [`invert`](LinearLayout::invert) is the address map, coordinates →
//! offset; [`invert_and_compose`](LinearLayout::invert_and_compose) of a register layout
//! with one of these is where each register is stored or loaded.
//!
//! Both families XOR-swizzle 16-byte chunks so that the rows an `ldmatrix` phase (or a
//! warp's column of stores) touches fall in different banks. Sources: Triton's
//! `SwizzledSharedEncoding` and `NVMMASharedEncoding` (lib/Dialect/TritonGPU/IR/
//! LinearLayoutConversions.cpp), CUTLASS/CuTe `Swizzle<B, M, S>`, and our notes
//! (`shared/notes/tensor-cores.md` §2, §4).

use super::{log2, InDim, LinearLayout};

impl LinearLayout {
    /// Triton's `SwizzledSharedEncoding` of a tensor of `shape`: dimensions are stored
    /// `order[0]` fastest ("columns"), then `order[1]` ("rows"), then the others, and the
    /// columns of row `r` are permuted by the XOR swizzle
    /// `stored_col = col ^ (vec * ((r / per_phase) % max_phase))`: the chunk of `vec`
    /// elements holding `col` moves to chunk `chunk ^ ((r / per_phase) % max_phase)`, and the
    /// pattern repeats every `per_phase * max_phase` rows. (The XOR is reduced modulo the
    /// row length when `vec * max_phase` exceeds it, as Triton does.) `per_phase = 1`,
    /// `max_phase = 1` is the plain row-major buffer.
    ///
    /// The layout maps `Offset` to coordinates: `apply_in(&[(Offset, o)])` is the element
    /// stored at offset `o`; its inverse gives an element's offset. All sizes are powers of
    /// two (checked in debug builds).
    pub fn swizzled_shared(shape: &[usize], order: &[usize], vec: usize, per_phase: usize, max_phase: usize) -> LinearLayout {
        debug_assert!(order.len() == shape.len() && [vec, per_phase, max_phase].iter().all(|x| x.is_power_of_two()));
        let rank = shape.len();
        let unit = |d: usize, x: usize| {
            let mut b = vec![0u32; rank];
            b[d] = x as u32;
            b
        };
        let mut offset = vec![];
        if let Some(&col) = order.first() {
            offset.extend((0..log2(shape[col])).map(|i| unit(col, 1 << i)));
        }
        if let [col, row, ..] = *order {
            // Row bit i moves the row by 2^i and, through the swizzle, the column by the
            // chunk it XORs in: linear because every factor is a power of two.
            for i in 0..log2(shape[row]) {
                let r = 1usize << i;
                let mut b = unit(row, r);
                b[col] = ((vec * ((r / per_phase) % max_phase)) % shape[col]) as u32;
                offset.push(b);
            }
        }
        for &d in order.iter().skip(2) {
            offset.extend((0..log2(shape[d])).map(|i| unit(d, 1 << i)));
        }
        LinearLayout::tensor(shape.to_vec(), vec![(InDim::Offset, offset)])
    }

    /// The shared layout `wgmma` descriptors and TMA read and write (Triton's
    /// `NVMMASharedEncoding`) for a 2-D tile of `elem_bits`-bit elements, with a
    /// `swizzle_bytes` = 32, 64 or 128 swizzle (descriptor layout types 3, 2, 1; TMA
    /// `SWIZZLE_32B/64B/128B`). The contiguous dimension is the last (`transposed = false`:
    /// K-major for A `[M, K]`) or the first (`transposed = true`: MN-major).
    ///
    /// The tile is cut along the contiguous dimension into strips `swizzle_bytes` wide; a
    /// strip stores its rows one after the other, and the strips follow each other (notes
    /// §4: "rows of the swizzle width stored consecutively", "beyond K = 64, use another
    /// `[rows][64]` atom"). Within a strip, 16-byte chunk `c` of row `r` is stored at chunk
    /// `c ^ ((r / per_phase) % max_phase)` with `max_phase = swizzle_bytes / 16` and
    /// `per_phase = 128 / swizzle_bytes`: on byte addresses, CUTLASS `Swizzle<3, 4, 3>` for
    /// 128B (address bits 4-6 ^= bits 7-9), `Swizzle<2, 4, 3>` for 64B, `Swizzle<1, 4, 3>` for
    /// 32B, given a strip aligned to 1024 bytes (notes §2, §4; PTX ISA "Matrix Descriptor
    /// Format" / "Shared Memory Matrix Layout" of the asynchronous warpgroup-level matrix
    /// instructions). So one strip is [`swizzled_shared`](Self::swizzled_shared) with
    /// `vec` = 16 bytes of elements.
    ///
    /// The tile is at least one 8-row atom: the contiguous dimension is at least
    /// `swizzle_bytes` long and the other at least 8 (checked in debug builds).
    pub fn nvmma_shared(shape: &[usize], elem_bits: u32, swizzle_bytes: usize, transposed: bool) -> LinearLayout {
        debug_assert!(shape.len() == 2 && matches!(swizzle_bytes, 32 | 64 | 128) && matches!(elem_bits, 8 | 16 | 32));
        let (col, row) = if transposed { (0, 1) } else { (1, 0) };
        let strip_cols = swizzle_bytes * 8 / elem_bits as usize;
        debug_assert!(shape[col] >= strip_cols && shape[row] >= 8, "an nvmma tile holds at least one 8 x {swizzle_bytes}-byte atom");
        let strip = LinearLayout::swizzled_shared(&[shape[row], strip_cols], &[1, 0], 128 / elem_bits as usize, 128 / swizzle_bytes, swizzle_bytes / 16);
        let mut offset: Vec<Vec<u32>> = strip
            .bases(InDim::Offset)
            .iter()
            .map(|b| {
                let mut o = vec![0u32; 2];
                (o[row], o[col]) = (b[0], b[1]);
                o
            })
            .collect();
        for i in log2(strip_cols)..log2(shape[col]) {
            let mut o = vec![0u32; 2];
            o[col] = 1 << i;
            offset.push(o);
        }
        LinearLayout::tensor(shape.to_vec(), vec![(InDim::Offset, offset)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offset_of(l: &LinearLayout, inv: &LinearLayout, coords: &[u32]) -> u32 {
        let at: Vec<(InDim, u32)> = coords.iter().enumerate().map(|(d, &c)| (InDim::Coord(d), c)).collect();
        let o = inv.apply_in(&at)[0];
        assert_eq!(l.apply_in(&[(InDim::Offset, o)]), coords, "{l}");
        o
    }

    #[test]
    fn swizzled_shared_is_the_xor_swizzle_and_bijective() {
        for (shape, vec, per_phase, max_phase) in [
            ([64, 64], 8, 1, 8),  // bf16, 128-byte rows (notes §2)
            ([64, 32], 8, 2, 4),  // bf16, 64-byte rows
            ([32, 128], 4, 1, 8), // f32
            ([16, 16], 8, 1, 8),  // vec * max_phase > row: the XOR wraps within the row
            ([8, 64], 1, 1, 1),   // unswizzled
        ] {
            let l = LinearLayout::swizzled_shared(&shape, &[1, 0], vec, per_phase, max_phase);
            assert!(l.is_bijective(), "{l}");
            let inv = l.invert().unwrap();
            let cols = shape[1] as u32;
            for r in 0..shape[0] as u32 {
                for c in 0..cols {
                    let phase = (r / per_phase as u32) % max_phase as u32;
                    let want = r * cols + ((c ^ (phase * vec as u32)) % cols);
                    assert_eq!(offset_of(&l, &inv, &[r, c]), want, "{shape:?} vec={vec} per_phase={per_phase} max_phase={max_phase} ({r}, {c})");
                }
            }
        }
        // Column-major order swizzles the other way round; a third dimension stacks whole tiles.
        let l = LinearLayout::swizzled_shared(&[32, 16, 2], &[0, 1, 2], 8, 1, 8);
        assert!(l.is_bijective());
        let inv = l.invert().unwrap();
        assert_eq!(offset_of(&l, &inv, &[1, 3, 0]), 3 * 32 + (1 ^ 24));
        assert_eq!(offset_of(&l, &inv, &[1, 3, 1]), 512 + 3 * 32 + (1 ^ 24));
    }

    /// CuTe's `Swizzle<B, M, S>` on an address: XOR bits [M+S, M+S+B) into bits [M, M+B).
    fn cute_swizzle(b: u32, m: u32, s: u32, addr: u32) -> u32 {
        let mask = ((1 << b) - 1) << (m + s);
        addr ^ ((addr & mask) >> s)
    }

    #[test]
    fn nvmma_128b_matches_cutlass_swizzle_343_on_a_bf16_atom() {
        let l = LinearLayout::nvmma_shared(&[8, 64], 16, 128, false);
        let inv = l.invert().unwrap();
        for o in 0..512u32 {
            // Byte address → logical (unswizzled) byte address → (row, col).
            let logical = cute_swizzle(3, 4, 3, 2 * o);
            let (r, c) = (logical / 128, logical % 128 / 2);
            assert_eq!(l.apply_in(&[(InDim::Offset, o)]), vec![r, c], "offset {o}");
            assert_eq!(2 * offset_of(&l, &inv, &[r, c]), cute_swizzle(3, 4, 3, r * 128 + 2 * c));
        }
        // The swizzle matters: row 1's first chunk is not at bytes 128..144.
        assert_eq!(2 * offset_of(&l, &inv, &[1, 0]), 128 + 16);
    }

    #[test]
    fn nvmma_smaller_swizzles_match_cutlass() {
        // (swizzle bytes, CuTe B, element bits): Swizzle<2,4,3> for 64B, Swizzle<1,4,3> for 32B.
        for (bytes, b, bits) in [(64u32, 2, 16u32), (32, 1, 16), (128, 3, 32), (64, 2, 8)] {
            let cols = bytes * 8 / bits;
            let l = LinearLayout::nvmma_shared(&[16, cols as usize], bits, bytes as usize, false);
            let inv = l.invert().unwrap();
            let eb = bits / 8;
            for r in 0..16 {
                for c in 0..cols {
                    let want = cute_swizzle(b, 4, 3, r * bytes + c * eb);
                    assert_eq!(offset_of(&l, &inv, &[r, c]) * eb, want, "{bytes}B {bits}-bit ({r}, {c})");
                }
            }
        }
    }

    #[test]
    fn nvmma_tiles_stack_strips_and_stay_bijective() {
        // A 64 x 128 bf16 tile with the 128B swizzle: two [64][64] strips, each the
        // swizzle of its own 1024-byte-aligned atoms, the second after the first.
        let l = LinearLayout::nvmma_shared(&[64, 128], 16, 128, false);
        let inv = l.invert().unwrap();
        for r in 0..64 {
            for c in 0..128 {
                let strip = c / 64;
                let want = strip * 64 * 128 + cute_swizzle(3, 4, 3, r * 128 + (c % 64) * 2);
                assert_eq!(2 * offset_of(&l, &inv, &[r, c]), want);
            }
        }
        // It is the notes' claim: Triton's swizzled layout with vec 8, per_phase 1, max_phase 8.
        let l = LinearLayout::nvmma_shared(&[128, 64], 16, 128, false);
        assert_eq!(l, LinearLayout::swizzled_shared(&[128, 64], &[1, 0], 8, 1, 8));
        for bits in [8, 16, 32] {
            for bytes in [32, 64, 128] {
                for transposed in [false, true] {
                    let l = LinearLayout::nvmma_shared(&[128, 256], bits, bytes, transposed);
                    assert!(l.is_bijective(), "{bits}-bit {bytes}B transposed={transposed}: {l}");
                    // MN-major is K-major of the transpose.
                    let t = LinearLayout::nvmma_shared(&[256, 128], bits, bytes, !transposed).permute(&[1, 0]);
                    assert_eq!(l, t);
                }
            }
        }
    }
}
