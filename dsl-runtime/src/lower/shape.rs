//! Lowering of the shape op family, and of layout conversions.
//!
//! `expand_dims` and `permute` move nothing: the result keeps the operand's registers in
//! a relabelled layout. `broadcast` asks for its operand in the projection of its own
//! layout ([`LinearLayout::project`]) and copies registers. A conversion between two
//! layouts (and `reshape`) goes through shared memory: every thread writes its elements
//! at their row-major position (rows padded by one 32-bit word so that column accesses
//! fall in different banks), a barrier, and every thread reads the elements of the new
//! layout. Where the scratch goes, and whether an earlier use of it needs a barrier before
//! the writes, is [`Cx::scratch`]'s choice ([`super::smem`]).

use super::{llvm_type, Cx, LResult, Regs};
use crate::ir::{Type, Value};
use crate::layout::LinearLayout;
use crate::DType;
use inkwell::values::{BasicValueEnum, IntValue};
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

/// Write `regs` (layout `l`) to shared memory: each element at byte offset `base` plus its
/// element index (`index` of its coordinates) times its size. When `writer` is given, only
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
) -> LResult<()> {
    let size = smem_size(t);
    let i32t = cx.ctx.i32_type();
    only_where(cx, writer, |cx| {
        for (r, &x) in regs.iter().enumerate() {
            let c = cx.coords(l, r as u32)?;
            let idx = index(cx, &c)?;
            let bytes = cx.b.build_int_mul(idx, i32t.const_int(size, false), "")?;
            let p = cx.smem_ptr(base, bytes)?;
            let y = to_smem(cx, x, t)?;
            cx.b.build_store(p, y)?;
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

/// The registers of layout `l` read from shared memory, addressed as [`write`] addresses.
pub(super) fn read<'ctx>(cx: &mut Cx<'_, 'ctx>, t: &Type, l: &LinearLayout, index: IndexFn<'_, 'ctx>, base: u64) -> LResult<Regs<'ctx>> {
    let size = smem_size(t);
    let st = smem_llvm_type(cx, t);
    let i32t = cx.ctx.i32_type();
    let mut out = Vec::with_capacity(l.num_regs());
    for r in 0..l.num_regs() as u32 {
        let c = cx.coords(l, r)?;
        let idx = index(cx, &c)?;
        let bytes = cx.b.build_int_mul(idx, i32t.const_int(size, false), "")?;
        let p = cx.smem_ptr(base, bytes)?;
        let y = cx.b.build_load(st, p, "")?;
        out.push(from_smem(cx, y, t)?);
    }
    Ok(out)
}

/// Write `regs` (layout `from`, by `index_from`) to shared memory and read them back in
/// layout `to` (by `index_to`), through a scratch array of `len` elements. When `writer`
/// is given, only threads where it holds write.
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
) -> LResult<Regs<'ctx>> {
    let bytes = len * smem_size(t);
    let base = cx.scratch(bytes)?;
    write(cx, regs, t, from, index_from, base, writer)?;
    cx.scratch_written(base, bytes)?;
    read(cx, t, to, index_to, base)
}

/// Convert `v` from layout `from` to layout `to` (same padded shape).
pub fn convert<'ctx>(cx: &mut Cx<'_, 'ctx>, v: Value, from: &LinearLayout, to: &LinearLayout) -> LResult<Regs<'ctx>> {
    let t = cx.f.ty(v).clone();
    let shape = from.shape.clone();
    // Pad rows by one 32-bit word (2-D and up) so that reading a column hits 32 banks.
    let pad = if shape.len() >= 2 { (4 / smem_size(&t).min(4)) as usize } else { 0 };
    let regs = cx.vals[v.index()].clone();
    let index = |cx: &Cx<'_, 'ctx>, c: &[IntValue<'ctx>]| row_major(cx, c, &shape, pad);
    roundtrip(cx, &regs, &t, from, to, &index, &index, row_major_len(&shape, pad), None)
}

/// Replicated copies of a value computed only by the owning threads (atomics): the owners
/// publish through shared memory, everyone reads.
pub fn share_from_owner<'ctx>(cx: &mut Cx<'_, 'ctx>, regs: &[BasicValueEnum<'ctx>], l: &LinearLayout, d: DType) -> LResult<Regs<'ctx>> {
    let t = Type::scalar(d);
    let shape = l.shape.clone();
    let owner = cx.owner_predicate(l)?;
    // A scalar (rank 0) is element 0 of a one-element array.
    let index = |cx: &Cx<'_, 'ctx>, c: &[IntValue<'ctx>]| row_major(cx, c, &shape, 0);
    roundtrip(cx, regs, &t, l, l, &index, &index, row_major_len(&shape, 0), owner)
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
    roundtrip(cx, &regs, &t, &lx, l, &ix, &iv, len, None)
}
