//! Lowering of the shape op family, and of layout conversions.
//!
//! `expand_dims` and `permute` move nothing: the result keeps the operand's registers in
//! a relabelled layout. `broadcast` asks for its operand in the projection of its own
//! layout ([`LinearLayout::project`]) and copies registers. A conversion between two
//! layouts (and `reshape`) goes through shared memory: every thread writes its elements
//! at their row-major position, a barrier, and every thread reads the elements of the new
//! layout. A conversion writes and reads in vectors where the layouts hold consecutive
//! elements in consecutive registers, and pads each row by what costs the fewest
//! shared-memory wavefronts (bank conflicts), counted from the two layouts at compile
//! time ([`convert_plan`]). Where the scratch goes, and whether an earlier use of it needs a barrier before
//! the writes, is [`Cx::scratch`]'s choice ([`super::smem`]).

use super::{llvm_type, Cx, LResult, Regs};
use crate::ir::{Type, Value};
use crate::layout::{InDim, LinearLayout};
use crate::DType;
use inkwell::values::{BasicValue, BasicValueEnum, IntValue, PointerValue};
use inkwell::AddressSpace;

/// How an element of type `t` is kept in shared memory: bytes per element.
fn smem_size(t: &Type) -> u64 {
    if t.ptr { 8 } else { t.dtype.size() as u64 }
}

fn to_smem<'ctx>(cx: &Cx<'_, 'ctx>, x: BasicValueEnum<'ctx>, t: &Type) -> LResult<BasicValueEnum<'ctx>> {
    Ok(if t.ptr {
        cx.b.build_ptr_to_int(x.into_pointer_value(), cx.ctx.i64_type(), "")?.into()
    } else if t.dtype == DType::Bool {
        cx.b.build_int_z_extend(x.into_int_value(), cx.ctx.i8_type(), "")?.into()
    } else {
        x
    })
}

fn from_smem<'ctx>(cx: &Cx<'_, 'ctx>, x: BasicValueEnum<'ctx>, t: &Type) -> LResult<BasicValueEnum<'ctx>> {
    Ok(if t.ptr {
        cx.b.build_int_to_ptr(x.into_int_value(), cx.ctx.ptr_type(AddressSpace::from(1)), "")?.into()
    } else if t.dtype == DType::Bool {
        cx.b.build_int_truncate(x.into_int_value(), cx.ctx.bool_type(), "")?.into()
    } else {
        x
    })
}

fn smem_llvm_type<'ctx>(cx: &Cx<'_, 'ctx>, t: &Type) -> inkwell::types::BasicTypeEnum<'ctx> {
    if t.ptr {
        cx.ctx.i64_type().into()
    } else if t.dtype == DType::Bool {
        cx.ctx.i8_type().into()
    } else {
        llvm_type(cx.ctx, t)
    }
}

/// Row-major element index of `coords` in `shape`, with every row (last dimension)
/// `pad` elements longer.
pub(super) fn row_major<'ctx>(cx: &Cx<'_, 'ctx>, coords: &[IntValue<'ctx>], shape: &[usize], pad: usize) -> LResult<IntValue<'ctx>> {
    let i32t = cx.ctx.i32_type();
    let r = shape.len();
    let mut idx = i32t.const_zero();
    let mut stride = 1u64;
    for d in (0..r).rev() {
        let term = cx.b.build_int_mul(coords[d], i32t.const_int(stride, false), "")?;
        idx = cx.b.build_int_add(idx, term, "")?;
        stride *= if d == r - 1 { (shape[d] + pad) as u64 } else { shape[d] as u64 };
    }
    Ok(idx)
}

/// The element count of [`row_major`]'s array.
fn row_major_len(shape: &[usize], pad: usize) -> u64 {
    match shape.split_last() {
        None => 1, // a scalar
        Some((last, rest)) => (last + pad) as u64 * rest.iter().product::<usize>() as u64,
    }
}

/// The shared-memory element index of a coordinate.
pub(super) type IndexFn<'a, 'ctx> = &'a dyn Fn(&Cx<'_, 'ctx>, &[IntValue<'ctx>]) -> LResult<IntValue<'ctx>>;

/// The shared-memory address of register `r` of layout `l` (of `size`-byte elements):
/// byte offset `base` plus its element index (`index` of its coordinates) times `size`.
fn element_ptr<'ctx>(cx: &Cx<'_, 'ctx>, l: &LinearLayout, r: u32, index: IndexFn<'_, 'ctx>, base: u64, size: u64) -> LResult<PointerValue<'ctx>> {
    let idx = index(cx, &cx.coords(l, r)?)?;
    cx.smem_ptr(base, cx.b.build_int_mul(idx, cx.ctx.i32_type().const_int(size, false), "")?)
}

/// Write `regs` (layout `l`) to shared memory, each element at its [`element_ptr`], in
/// runs of `vec` consecutive registers, one store each (aligned to the run's size: the
/// caller keeps each run's start a multiple of `vec`). When `writer` is given, only
/// threads where it holds write.
#[allow(clippy::too_many_arguments)]
pub(super) fn write<'ctx>(
    cx: &mut Cx<'_, 'ctx>,
    regs: &[BasicValueEnum<'ctx>],
    t: &Type,
    l: &LinearLayout,
    index: IndexFn<'_, 'ctx>,
    base: u64,
    writer: Option<IntValue<'ctx>>,
    vec: usize,
) -> LResult<()> {
    let size = smem_size(t);
    let (i32t, et) = (cx.ctx.i32_type(), smem_llvm_type(cx, t));
    only_where(cx, writer, |cx| {
        for r0 in (0..regs.len()).step_by(vec) {
            let p = element_ptr(cx, l, r0 as u32, index, base, size)?;
            let x: BasicValueEnum = if vec == 1 {
                to_smem(cx, regs[r0], t)?
            } else {
                let mut x = super::memory::vec_of(et, vec as u32).get_undef();
                for j in 0..vec {
                    x = cx.b.build_insert_element(x, to_smem(cx, regs[r0 + j], t)?, i32t.const_int(j as u64, false), "")?;
                }
                x.into()
            };
            cx.b.build_store(p, x)?.set_alignment((vec as u64 * size) as u32).map_err(|e| super::lower_error(e.to_string()))?;
        }
        Ok(())
    })
}

/// Emit `body` so that it runs only in threads where `pred` holds (everywhere when `None`):
/// shared-memory writes of replicated layouts, where one thread of each group writes.
pub(super) fn only_where<'ctx>(cx: &mut Cx<'_, 'ctx>, pred: Option<IntValue<'ctx>>, body: impl FnOnce(&mut Cx<'_, 'ctx>) -> LResult<()>) -> LResult<()> {
    let Some(p) = pred else { return body(cx) };
    let yes = cx.ctx.append_basic_block(cx.func, "smem.write");
    let cont = cx.ctx.append_basic_block(cx.func, "smem.written");
    cx.b.build_conditional_branch(p, yes, cont)?;
    cx.b.position_at_end(yes);
    body(cx)?;
    cx.b.build_unconditional_branch(cont)?;
    cx.b.position_at_end(cont);
    Ok(())
}

/// The registers of layout `l` read from shared memory, addressed as [`write`] addresses,
/// in runs of `vec` consecutive registers, one load each.
pub(super) fn read<'ctx>(cx: &mut Cx<'_, 'ctx>, t: &Type, l: &LinearLayout, index: IndexFn<'_, 'ctx>, base: u64, vec: usize) -> LResult<Regs<'ctx>> {
    let size = smem_size(t);
    let (i32t, et) = (cx.ctx.i32_type(), smem_llvm_type(cx, t));
    let ty = if vec == 1 { et } else { super::memory::vec_of(et, vec as u32).into() };
    let mut out = Vec::with_capacity(l.num_regs());
    for r0 in (0..l.num_regs()).step_by(vec) {
        let p = element_ptr(cx, l, r0 as u32, index, base, size)?;
        let x = cx.b.build_load(ty, p, "")?;
        x.as_instruction_value().expect("a load").set_alignment((vec as u64 * size) as u32).map_err(|e| super::lower_error(e.to_string()))?;
        if vec == 1 {
            out.push(from_smem(cx, x, t)?);
            continue;
        }
        for j in 0..vec {
            let y = cx.b.build_extract_element(x.into_vector_value(), i32t.const_int(j as u64, false), "")?;
            out.push(from_smem(cx, y, t)?);
        }
    }
    Ok(out)
}

/// Write `regs` (layout `from`, by `index_from`) to shared memory and read them back in
/// layout `to` (by `index_to`), through a scratch array of `len` elements, in runs of
/// `vecs` (written, read) registers. When `writer` is given, only threads where it holds
/// write.
#[allow(clippy::too_many_arguments)]
fn roundtrip<'ctx>(
    cx: &mut Cx<'_, 'ctx>,
    regs: &[BasicValueEnum<'ctx>],
    t: &Type,
    from: &LinearLayout,
    to: &LinearLayout,
    index_from: IndexFn<'_, 'ctx>,
    index_to: IndexFn<'_, 'ctx>,
    len: u64,
    writer: Option<IntValue<'ctx>>,
    (write_vec, read_vec): (usize, usize),
) -> LResult<Regs<'ctx>> {
    let bytes = len * smem_size(t);
    let base = cx.scratch(bytes)?;
    write(cx, regs, t, from, index_from, base, writer, write_vec)?;
    cx.scratch_written(base, bytes)?;
    read(cx, t, to, index_to, base, read_vec)
}

/// Convert `v` from layout `from` to layout `to` (same padded shape): each thread writes
/// its elements at their row-major position in a scratch array and reads back those of
/// `to`, in vectors of the registers that are consecutive along the last dimension in
/// each layout (up to 16 bytes), with every row padded by what makes the writes and the
/// reads cheapest in shared-memory wavefronts ([`convert_plan`]).
pub fn convert<'ctx>(cx: &mut Cx<'_, 'ctx>, v: Value, from: &LinearLayout, to: &LinearLayout) -> LResult<Regs<'ctx>> {
    let t = cx.f.ty(v).clone();
    let shape = from.shape.clone();
    let plan = convert_plan(from, to, smem_size(&t));
    let regs = cx.vals[v.index()].clone();
    let index = |cx: &Cx<'_, 'ctx>, c: &[IntValue<'ctx>]| row_major(cx, c, &shape, plan.pad);
    roundtrip(cx, &regs, &t, from, to, &index, &index, row_major_len(&shape, plan.pad), None, (plan.write_vec, plan.read_vec))
}

/// How [`convert`] moves a value through shared memory: elements per write and per read
/// (registers consecutive along the last dimension, at most 16 bytes), and the padding
/// of each row, in elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvertPlan {
    pub write_vec: usize,
    pub read_vec: usize,
    pub pad: usize,
}

/// [`convert`]'s plan for `size`-byte elements: of the vector lengths (each side's longest
/// run, or single elements) and the row paddings that keep them aligned (0 to 16 words;
/// none for one dimension), the one with the fewest shared-memory wavefronts for one
/// warp's writes and reads ([`wavefronts`]), then the fewest instructions, then the least
/// padding.
pub fn convert_plan(from: &LinearLayout, to: &LinearLayout, size: u64) -> ConvertPlan {
    let last = from.rank().saturating_sub(1);
    // A run starts where a thread's coordinate along the last dimension is a multiple of
    // its length (every lane and warp basis is), so that its vector access is aligned.
    let vec = |l: &LinearLayout| {
        if l.rank() == 0 {
            return 1;
        }
        let mut v = l.contiguous_regs(last).min((16 / size.max(1)) as usize).max(1);
        while v > 1 && [InDim::Lane, InDim::Warp].iter().any(|&d| l.bases(d).iter().any(|b| !(b[last] as usize).is_multiple_of(v))) {
            v /= 2;
        }
        v
    };
    let (wv, rv) = (vec(from), vec(to));
    // Vectors on both sides, on one side or none: a column-like side (a transpose) is
    // cheapest with a one-word padding that wider vectors on the other side would not
    // keep aligned.
    let mut best: Option<(usize, usize, ConvertPlan)> = None;
    for (write_vec, read_vec) in [(wv, rv), (wv, 1), (1, rv), (1, 1)] {
        let align = write_vec.max(read_vec);
        let pads: Vec<usize> = if from.rank() < 2 {
            vec![0]
        } else {
            [0u64, 1, 2, 4, 8, 16].iter().map(|w| (w * 4).div_ceil(size) as usize).map(|p| p.div_ceil(align) * align).collect()
        };
        // The fewest wavefronts, then the fewest instructions, then the least padding.
        let instructions = from.num_regs() / write_vec + to.num_regs() / read_vec;
        for pad in pads {
            let cost = wavefronts(from, write_vec, size, pad) + wavefronts(to, read_vec, size, pad);
            if best.as_ref().is_none_or(|&(c, i, b)| (cost, instructions, pad) < (c, i, b.pad)) {
                best = Some((cost, instructions, ConvertPlan { write_vec, read_vec, pad }));
            }
        }
    }
    best.expect("at least one candidate").2
}

/// Shared-memory wavefronts of warp 0 accessing every register of layout `l` in runs of
/// `vec` elements of `size` bytes at their row-major positions (rows `pad` elements
/// longer). An access of up to 4 bytes a lane is one request of 32 lanes, of 8 bytes two
/// of 16, of 16 bytes four of 8; a request takes as many wavefronts as the most distinct
/// 32-bit words that fall in one of the 32 banks.
pub fn wavefronts(l: &LinearLayout, vec: usize, size: u64, pad: usize) -> usize {
    let shape = &l.shape;
    let index = |c: &[u32]| -> u64 {
        let (mut idx, mut stride) = (0u64, 1u64);
        for d in (0..c.len()).rev() {
            idx += c[d] as u64 * stride;
            stride *= if d + 1 == c.len() { (shape[d] + pad) as u64 } else { shape[d] as u64 };
        }
        idx
    };
    let bytes = vec as u64 * size;
    let lanes_per_request = if bytes <= 4 { 32 } else { (128 / bytes) as u32 };
    let mut total = 0;
    for r in (0..l.num_regs() as u32).step_by(vec) {
        for first in (0..32).step_by(lanes_per_request as usize) {
            let mut banks: Vec<std::collections::HashSet<u64>> = vec![Default::default(); 32];
            for lane in first..first + lanes_per_request {
                let at = index(&l.apply(r, lane, 0)) * size;
                for word in at / 4..=(at + bytes - 1) / 4 {
                    banks[(word % 32) as usize].insert(word);
                }
            }
            total += banks.iter().map(|b| b.len()).max().unwrap_or(0).max(1);
        }
    }
    total
}

/// Replicated copies of a value computed only by the owning threads (atomics): the owners
/// publish through shared memory, everyone reads.
pub fn share_from_owner<'ctx>(cx: &mut Cx<'_, 'ctx>, regs: &[BasicValueEnum<'ctx>], l: &LinearLayout, d: DType) -> LResult<Regs<'ctx>> {
    let t = Type::scalar(d);
    let shape = l.shape.clone();
    let owner = cx.owner_predicate(l)?;
    // A scalar (rank 0) is element 0 of a one-element array.
    let index = |cx: &Cx<'_, 'ctx>, c: &[IntValue<'ctx>]| row_major(cx, c, &shape, 0);
    roundtrip(cx, regs, &t, l, l, &index, &index, row_major_len(&shape, 0), owner, (1, 1))
}

/// `broadcast(x)` computed in layout `l`.
pub fn broadcast<'ctx>(cx: &mut Cx<'_, 'ctx>, v: Value, x: Value, l: &LinearLayout) -> LResult<Regs<'ctx>> {
    let (src, dst) = (cx.f.ty(x).shape.clone(), cx.f.ty(v).shape.clone());
    let dims: Vec<usize> = (0..src.len()).filter(|&k| src[k] == 1 && dst[k] != 1).collect();
    let (p, map) = l.project(&dims);
    let xs = cx.get(x, &p)?;
    Ok((0..l.num_regs())
        .map(|r| {
            let s = map.iter().enumerate().fold(0, |acc, (i, m)| match m {
                Some(j) if r >> i & 1 == 1 => acc | 1 << j,
                _ => acc,
            });
            xs[s]
        })
        .collect())
}

/// `reshape(x)` computed in layout `l`: through shared memory by row-major position.
pub fn reshape<'ctx>(cx: &mut Cx<'_, 'ctx>, x: Value, l: &LinearLayout) -> LResult<Regs<'ctx>> {
    let (regs, lx) = cx.get_any(x);
    let lx = lx.expect("reshape of a block");
    let t = cx.f.ty(x).clone();
    let (sx, sv) = (lx.shape.clone(), l.shape.clone());
    let ix = |cx: &Cx<'_, 'ctx>, c: &[IntValue<'ctx>]| row_major(cx, c, &sx, 0);
    let iv = |cx: &Cx<'_, 'ctx>, c: &[IntValue<'ctx>]| row_major(cx, c, &sv, 0);
    let len = row_major_len(&sx, 0).max(row_major_len(&sv, 0));
    roundtrip(cx, &regs, &t, &lx, l, &ix, &iv, len, None, (1, 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The attention epilogue's conversion: the `wgmma` accumulator (64 x 64 on one
    /// warpgroup) to the store's blocked layout. In bf16, pairs are written (4 bytes) and
    /// rows read 16 bytes a lane, each request in one wavefront, as few as the bytes
    /// allow; in f32, 8-byte pairs and 16-byte rows likewise. The padding of one word a
    /// row that the conversion had before costs more.
    #[test]
    fn accumulator_to_store_layout_moves_vectors_without_bank_conflicts() {
        let acc = LinearLayout::wgmma_accumulator(&[64, 64], &[4, 1], 64);
        for (size, write_vec, read_vec) in [(2u64, 2, 8), (4, 2, 4)] {
            let store = LinearLayout::default_for(&[64, 64], (16 / size) as usize, 4);
            let plan = convert_plan(&acc, &store, size);
            assert_eq!((plan.write_vec, plan.read_vec), (write_vec, read_vec), "{size}-byte elements");
            // The fewest a warp can take: 128 bytes a wavefront, each element of warp 0's
            // 16 rows (written) and of its share of the rows (read) moved once.
            let ideal = |l: &LinearLayout| l.num_regs() * 32 * size as usize / 128;
            let cost = wavefronts(&acc, plan.write_vec, size, plan.pad) + wavefronts(&store, plan.read_vec, size, plan.pad);
            assert_eq!(cost, ideal(&acc) + ideal(&store), "{size}-byte elements: {plan:?}");
            let one_word = (4 / size) as usize;
            let before = wavefronts(&acc, 1, size, one_word) + wavefronts(&store, 1, size, one_word);
            assert!(before > cost, "{size}-byte elements: {before} wavefronts element by element");
        }
    }

    /// A transpose (the store's layout to its permutation, columns across the lanes): the
    /// plan costs no more than the one-word padding element by element that conversions
    /// used before, which wider vectors on the row side could not keep aligned.
    #[test]
    fn a_transpose_is_no_worse_than_one_word_of_padding() {
        let rows = LinearLayout::default_for(&[64, 64], 8, 4);
        let cols = rows.permute(&[1, 0]);
        for size in [2u64, 4] {
            let plan = convert_plan(&rows, &cols, size);
            let cost = wavefronts(&rows, plan.write_vec, size, plan.pad) + wavefronts(&cols, plan.read_vec, size, plan.pad);
            let one_word = (4 / size) as usize;
            let before = wavefronts(&rows, 1, size, one_word) + wavefronts(&cols, 1, size, one_word);
            assert!(cost <= before, "{size}-byte elements: {plan:?} costs {cost} wavefronts, element by element with one word {before}");
        }
    }

    /// Without a second dimension nothing is padded; one register per thread moves alone.
    #[test]
    fn one_dimension_is_not_padded() {
        let l = LinearLayout::default_for(&[128], 1, 4);
        let plan = convert_plan(&l, &LinearLayout::default_for(&[128], 4, 1), 4);
        assert_eq!(plan, ConvertPlan { write_vec: 1, read_vec: 4, pad: 0 });
    }
}
