//! Lowering of reductions and scans over a [`LinearLayout`].
//!
//! Every basis of the operand's layout moves along one dimension (blocked and tensor-core
//! layouts do), so the elements along the reduced axis are spread over some register
//! bits, some lane bits and some warp bits. A reduction combines
//!
//! 1. within a thread: registers that differ only in axis register bits, pairwise in
//!    register order (a tree: neighbours, then neighbouring pairs, ...);
//! 2. across a warp: one butterfly shuffle (`shfl.sync.bfly`) per axis lane bit, after
//!    which every lane of the group holds the same value (`a + b` and `b + a` round the
//!    same way);
//! 3. across warps: every thread writes its partials to shared memory, a barrier, and
//!    every thread reads the partials of the warps that differ in axis warp bits and
//!    combines them in warp order (so every copy is bit-identical).
//!
//! The result is in the *slice* layout ([`LinearLayout::remove_dim`]): threads that took
//! part in one group all hold its result. Padding elements along the axis are replaced by
//! the identity first. `argmax`/`argmin` carry `(value, index)` pairs.
//!
//! A scan processes the axis bits from the lowest coordinate bit up, keeping per element
//! its prefix `S` and the total `T` of its aligned block of `2^k` elements; at bit `k` the
//! partner (the element whose coordinate differs in that bit: another register, a lane
//! through a shuffle, or a warp through shared memory) contributes its `T`, the upper
//! element adds it to `S`, and both add it to `T` in lower-then-upper order.

use super::arith::{binary, cmp, to_f32};
use super::{Cx, LResult, lower_error, Regs};
use crate::ir::reduce::identity;
use crate::ir::{BinOp, CmpOp, ReduceOp, Type, Value};
use crate::layout::{InDim, LinearLayout};
use crate::DType;
use inkwell::values::{BasicValueEnum, IntValue};
use inkwell::IntPredicate;

/// One input bit of the layout that moves along the axis.
#[derive(Clone, Copy, Debug)]
struct AxisBit {
    dim: InDim,
    bit: usize,
    /// The coordinate along the axis it contributes.
    coord: u32,
}

fn axis_bits(l: &LinearLayout, axis: usize) -> LResult<Vec<AxisBit>> {
    let mut out = vec![];
    for dim in [InDim::Register, InDim::Lane, InDim::Warp] {
        for (bit, b) in l.bases(dim).iter().enumerate() {
            if b.iter().all(|&x| x == 0) {
                continue;
            }
            match LinearLayout::basis_dim(b) {
                Some(d) if d == axis => out.push(AxisBit { dim, bit, coord: b[d] }),
                Some(_) => {}
                None => return Err(lower_error(format!("cannot reduce over layout {l}: a basis moves along two dimensions"))),
            }
        }
    }
    Ok(out)
}

/// `x` shuffled from the lane `lane ^ mask`.
fn shfl_xor<'ctx>(cx: &Cx<'_, 'ctx>, x: BasicValueEnum<'ctx>, mask: u32) -> LResult<BasicValueEnum<'ctx>> {
    let i32t = cx.ctx.i32_type();
    let f = cx.intrinsic("llvm.nvvm.shfl.sync.bfly.i32", i32t.into(), &[i32t.into(), i32t.into(), i32t.into(), i32t.into()]);
    let shfl = |w: IntValue<'ctx>| -> LResult<IntValue<'ctx>> {
        Ok(cx
            .call(f, &[i32t.const_all_ones().into(), w.into(), i32t.const_int(mask as u64, false).into(), i32t.const_int(0x1f, false).into()])?
            .into_int_value())
    };
    let t = x.get_type();
    let bits = match t {
        inkwell::types::BasicTypeEnum::IntType(i) => i.get_bit_width(),
        inkwell::types::BasicTypeEnum::FloatType(_) => {
            if t == cx.ctx.f32_type().into() { 32 } else { 16 }
        }
        _ => return Err(lower_error("cannot shuffle this type")),
    };
    let it = cx.ctx.custom_width_int_type(std::num::NonZero::new(bits).expect("nonzero width")).map_err(|e| lower_error(e.to_string()))?;
    let xi = cx.b.build_bit_cast(x, it, "")?.into_int_value();
    let r = if bits == 64 {
        let i64t = cx.ctx.i64_type();
        let lo = cx.b.build_int_truncate(xi, i32t, "")?;
        let hi = cx.b.build_int_truncate(cx.b.build_right_shift(xi, i64t.const_int(32, false), false, "")?, i32t, "")?;
        let (lo, hi) = (shfl(lo)?, shfl(hi)?);
        let lo = cx.b.build_int_z_extend(lo, i64t, "")?;
        let hi = cx.b.build_left_shift(cx.b.build_int_z_extend(hi, i64t, "")?, i64t.const_int(32, false), "")?;
        cx.b.build_or(lo, hi, "")?
    } else if bits == 32 {
        shfl(xi)?
    } else {
        let w = shfl(cx.b.build_int_z_extend(xi, i32t, "")?)?;
        cx.b.build_int_truncate(w, it, "")?
    };
    Ok(cx.b.build_bit_cast(r, t, "")?)
}

/// An element plus (for `argmax`/`argmin`) its index along the axis.
#[derive(Clone, Copy)]
struct Item<'ctx> {
    v: BasicValueEnum<'ctx>,
    i: Option<IntValue<'ctx>>,
}

fn combine<'ctx>(cx: &Cx<'_, 'ctx>, op: ReduceOp, d: DType, a: Item<'ctx>, b: Item<'ctx>) -> LResult<Item<'ctx>> {
    let (Some(ia), Some(ib)) = (a.i, b.i) else {
        return Ok(Item { v: binary(cx, op.combiner(), d, &[a.v], &[b.v])?[0], i: None });
    };
    // `a` wins: better value, or equal value and smaller index; NaN loses.
    let rel = if op == ReduceOp::ArgMax { CmpOp::Gt } else { CmpOp::Lt };
    let better = cmp(cx, rel, d, &[a.v], &[b.v])?[0].into_int_value();
    let equal = cmp(cx, CmpOp::Eq, d, &[a.v], &[b.v])?[0].into_int_value();
    let first = cx.b.build_int_compare(IntPredicate::SLT, ia, ib, "")?;
    let mut wins = cx.b.build_or(better, cx.b.build_and(equal, first, "")?, "")?;
    if d.is_float() {
        let (fa, fb) = (to_f32(cx, a.v, d)?, to_f32(cx, b.v, d)?);
        let a_nan = cx.b.build_float_compare(inkwell::FloatPredicate::UNO, fa, fa, "")?;
        let b_nan = cx.b.build_float_compare(inkwell::FloatPredicate::UNO, fb, fb, "")?;
        let both = cx.b.build_and(a_nan, b_nan, "")?;
        let t = cx.ctx.bool_type();
        let only_b = cx.b.build_and(b_nan, cx.b.build_not(a_nan, "")?, "")?;
        wins = cx.b.build_select(a_nan, t.const_zero(), wins, "")?.into_int_value();
        wins = cx.b.build_select(only_b, t.const_int(1, false), wins, "")?.into_int_value();
        wins = cx.b.build_select(both, first, wins, "")?.into_int_value();
    }
    Ok(Item { v: cx.b.build_select(wins, a.v, b.v, "")?, i: Some(cx.b.build_select(wins, ia, ib, "")?.into_int_value()) })
}

/// The items of one output register combined pairwise, neighbours first (a tree of depth
/// `log2 n` rather than a chain of `n - 1` dependent operations: attention's row max and
/// sum over a 64 x 128 tile wait on 6 levels instead of 31).
fn tree<'ctx>(cx: &Cx<'_, 'ctx>, op: ReduceOp, d: DType, mut items: Vec<Item<'ctx>>) -> LResult<Item<'ctx>> {
    while items.len() > 1 {
        let mut next = Vec::with_capacity(items.len().div_ceil(2));
        for pair in items.chunks(2) {
            next.push(match pair {
                [a, b] => combine(cx, op, d, *a, *b)?,
                [a] => *a,
                _ => unreachable!(),
            });
        }
        items = next;
    }
    items.pop().ok_or_else(|| lower_error("internal: an output register of a reduction has no inputs"))
}

/// The register index of `r` with only the bits in `keep` (packed).
fn compress(r: usize, keep: &[usize]) -> usize {
    keep.iter().enumerate().fold(0, |acc, (j, &b)| acc | ((r >> b) & 1) << j)
}

pub fn reduce<'ctx>(cx: &mut Cx<'_, 'ctx>, op: ReduceOp, x: Value, axis: usize) -> LResult<(Regs<'ctx>, Option<LinearLayout>)> {
    let (regs, l) = cx.get_any(x);
    let l = l.ok_or_else(|| lower_error("reduce of a scalar"))?;
    let t = cx.f.ty(x).clone();
    let d = t.dtype;
    let bits = axis_bits(&l, axis)?;
    let n_axis = t.shape[axis];
    let i32t = cx.ctx.i32_type();
    // Items with padding replaced by the identity.
    let mut items = Vec::with_capacity(regs.len());
    let id = super::arith::constant(cx, identity(op, d), d);
    for (r, &v) in regs.iter().enumerate() {
        let c = cx.coords(&l, r as u32)?;
        let mut item = Item { v, i: op.is_arg().then_some(c[axis]) };
        if n_axis != l.shape[axis] {
            let ok = cx.b.build_int_compare(IntPredicate::ULT, c[axis], i32t.const_int(n_axis as u64, false), "")?;
            item.v = cx.b.build_select(ok, item.v, id, "")?;
            if let Some(i) = item.i {
                item.i = Some(cx.b.build_select(ok, i, i32t.const_int(i32::MAX as u64, false), "")?.into_int_value());
            }
        }
        items.push(item);
    }
    // 1. Registers.
    let reg_axis: Vec<usize> = bits.iter().filter(|b| b.dim == InDim::Register).map(|b| b.bit).collect();
    let keep: Vec<usize> = (0..l.bases(InDim::Register).len()).filter(|b| !reg_axis.contains(b)).collect();
    let mut groups: Vec<Vec<Item>> = vec![vec![]; 1 << keep.len()];
    for (r, &it) in items.iter().enumerate() {
        groups[compress(r, &keep)].push(it);
    }
    let mut acc: Vec<Item> = groups.into_iter().map(|g| tree(cx, op, d, g)).collect::<LResult<_>>()?;
    // 2. Lanes.
    for b in bits.iter().filter(|b| b.dim == InDim::Lane) {
        for a in acc.iter_mut() {
            let other = Item { v: shfl_xor(cx, a.v, 1 << b.bit)?, i: a.i.map(|i| shfl_xor(cx, i.into(), 1 << b.bit)).transpose()?.map(|v| v.into_int_value()) };
            *a = combine(cx, op, d, *a, other)?;
        }
    }
    // 3. Warps, through shared memory.
    let warp_bits: Vec<usize> = bits.iter().filter(|b| b.dim == InDim::Warp).map(|b| b.bit).collect();
    if !warp_bits.is_empty() {
        acc = across_warps(cx, op, d, &acc, &warp_bits)?;
    }
    let (out_layout, _) = l.remove_dim(axis);
    let regs = acc.iter().map(|a| a.i.map(|i| i.into()).unwrap_or(a.v)).collect();
    let lay = if out_layout.rank() == 0 { None } else { Some(out_layout) };
    Ok((regs, lay))
}

/// The shared-memory element index of register `r` (of `n` per thread) of this lane in
/// warp `warp`: `(warp * 32 + lane) * n + r`.
fn thread_slot<'ctx>(cx: &Cx<'_, 'ctx>, warp: IntValue<'ctx>, n: u64, r: usize) -> LResult<IntValue<'ctx>> {
    let i32t = cx.ctx.i32_type();
    let t = cx.b.build_int_add(cx.b.build_int_mul(warp, i32t.const_int(32, false), "")?, cx.lane, "")?;
    Ok(cx.b.build_int_add(cx.b.build_int_mul(t, i32t.const_int(n, false), "")?, i32t.const_int(r as u64, false), "")?)
}

fn across_warps<'ctx>(cx: &mut Cx<'_, 'ctx>, op: ReduceOp, d: DType, acc: &[Item<'ctx>], warp_bits: &[usize]) -> LResult<Vec<Item<'ctx>>> {
    let i32t = cx.ctx.i32_type();
    let nw = cx.plan.num_warps as u64;
    let nout = acc.len() as u64;
    let vt = super::llvm_type(cx.ctx, &Type::scalar(d));
    let vsize = d.size() as u64;
    let vbytes = (nw * 32 * nout * vsize).div_ceil(4) * 4;
    let total = vbytes + if op.is_arg() { nw * 32 * nout * 4 } else { 0 };
    let slot = |cx: &Cx<'_, 'ctx>, warp, r| thread_slot(cx, warp, nout, r);
    let at = cx.scratch(total)?;
    for (r, a) in acc.iter().enumerate() {
        let s = slot(cx, cx.warp, r)?;
        let p = cx.smem_ptr(at, cx.b.build_int_mul(s, i32t.const_int(vsize, false), "")?)?;
        cx.b.build_store(p, a.v)?;
        if let Some(i) = a.i {
            let off = cx.b.build_int_add(cx.b.build_int_mul(s, i32t.const_int(4, false), "")?, i32t.const_int(vbytes, false), "")?;
            let p = cx.smem_ptr(at, off)?;
            cx.b.build_store(p, i)?;
        }
    }
    cx.scratch_written(at, total)?;
    let mask: u64 = warp_bits.iter().fold(0, |m, &b| m | 1 << b);
    let base = cx.b.build_and(cx.warp, i32t.const_int(!mask & 0xffff_ffff, false), "")?;
    let mut out = vec![];
    for r in 0..acc.len() {
        let mut res: Option<Item> = None;
        for k in 0..1u64 << warp_bits.len() {
            let w = warp_bits.iter().enumerate().fold(0u64, |m, (j, &b)| m | ((k >> j) & 1) << b);
            let warp = cx.b.build_or(base, i32t.const_int(w, false), "")?;
            let s = slot(cx, warp, r)?;
            let p = cx.smem_ptr(at, cx.b.build_int_mul(s, i32t.const_int(vsize, false), "")?)?;
            let v = cx.b.build_load(vt, p, "")?;
            let i = if op.is_arg() {
                let off = cx.b.build_int_add(cx.b.build_int_mul(s, i32t.const_int(4, false), "")?, i32t.const_int(vbytes, false), "")?;
                let p = cx.smem_ptr(at, off)?;
                Some(cx.b.build_load(i32t, p, "")?.into_int_value())
            } else {
                None
            };
            let it = Item { v, i };
            res = Some(match res {
                None => it,
                Some(a) => combine(cx, op, d, a, it)?,
            });
        }
        out.push(res.expect("at least one warp"));
    }
    Ok(out)
}

pub fn scan<'ctx>(cx: &mut Cx<'_, 'ctx>, x: Value, axis: usize) -> LResult<(Regs<'ctx>, LinearLayout)> {
    let (regs, l) = cx.get_any(x);
    let l = l.ok_or_else(|| lower_error("scan of a scalar"))?;
    let d = cx.f.ty(x).dtype;
    let mut bits = axis_bits(&l, axis)?;
    bits.sort_by_key(|b| b.coord);
    let want: Vec<u32> = (0..l.shape[axis].trailing_zeros()).map(|k| 1 << k).collect();
    if bits.iter().map(|b| b.coord).collect::<Vec<_>>() != want {
        return Err(lower_error(format!("cannot scan over layout {l}: the axis is not covered bit by bit")));
    }
    let i32t = cx.ctx.i32_type();
    let add = |cx: &Cx<'_, 'ctx>, a: BasicValueEnum<'ctx>, b: BasicValueEnum<'ctx>| -> LResult<BasicValueEnum<'ctx>> { Ok(binary(cx, BinOp::Add, d, &[a], &[b])?[0]) };
    let mut s = regs.clone();
    let mut t = regs;
    let n = s.len();
    for b in bits {
        // The partner's block total, and whether this element is the upper one.
        let (partner, upper): (Vec<BasicValueEnum>, Vec<Option<IntValue>>) = match b.dim {
            InDim::Register => ((0..n).map(|r| t[r ^ (1 << b.bit)]).collect(), (0..n).map(|_| None).collect()),
            InDim::Lane => {
                let p = t.iter().map(|&v| shfl_xor(cx, v, 1 << b.bit)).collect::<LResult<Vec<_>>>()?;
                let bit = cx.b.build_and(cx.b.build_right_shift(cx.lane, i32t.const_int(b.bit as u64, false), false, "")?, i32t.const_int(1, false), "")?;
                let up = cx.b.build_int_compare(IntPredicate::NE, bit, i32t.const_zero(), "")?;
                (p, vec![Some(up); n])
            }
            InDim::Warp => {
                let p = warp_exchange(cx, &t, d, b.bit)?;
                let bit = cx.b.build_and(cx.b.build_right_shift(cx.warp, i32t.const_int(b.bit as u64, false), false, "")?, i32t.const_int(1, false), "")?;
                let up = cx.b.build_int_compare(IntPredicate::NE, bit, i32t.const_zero(), "")?;
                (p, vec![Some(up); n])
            }
            // axis_bits reads only register, lane and warp bases.
            InDim::Offset | InDim::Coord(_) => return Err(lower_error(format!("cannot scan over layout {l}: not a register layout"))),
        };
        for r in 0..n {
            let lower_upper = add(cx, partner[r], t[r])?; // partner lower, me upper
            let upper_lower = add(cx, t[r], partner[r])?; // me lower, partner upper
            match upper[r] {
                None if r >> b.bit & 1 == 1 => {
                    s[r] = add(cx, partner[r], s[r])?;
                    t[r] = lower_upper;
                }
                None => t[r] = upper_lower,
                Some(up) => {
                    let s_up = add(cx, partner[r], s[r])?;
                    s[r] = cx.b.build_select(up, s_up, s[r], "")?;
                    t[r] = cx.b.build_select(up, lower_upper, upper_lower, "")?;
                }
            }
        }
    }
    Ok((s, l))
}

/// Each thread's `vals` as held by the thread in warp `warp ^ (1 << bit)`, same lane.
fn warp_exchange<'ctx>(cx: &mut Cx<'_, 'ctx>, vals: &[BasicValueEnum<'ctx>], d: DType, bit: usize) -> LResult<Vec<BasicValueEnum<'ctx>>> {
    let i32t = cx.ctx.i32_type();
    let n = vals.len() as u64;
    let size = d.size() as u64;
    let total = cx.plan.num_warps as u64 * 32 * n * size;
    let vt = super::llvm_type(cx.ctx, &Type::scalar(d));
    let slot = |cx: &Cx<'_, 'ctx>, warp, r| -> LResult<IntValue<'ctx>> { Ok(cx.b.build_int_mul(thread_slot(cx, warp, n, r)?, i32t.const_int(size, false), "")?) };
    let base = cx.scratch(total)?;
    for (r, &v) in vals.iter().enumerate() {
        let s = slot(cx, cx.warp, r)?;
        let p = cx.smem_ptr(base, s)?;
        cx.b.build_store(p, v)?;
    }
    cx.scratch_written(base, total)?;
    let partner = cx.b.build_xor(cx.warp, i32t.const_int(1 << bit, false), "")?;
    let mut out = vec![];
    for r in 0..vals.len() {
        let s = slot(cx, partner, r)?;
        let p = cx.smem_ptr(base, s)?;
        out.push(cx.b.build_load(vt, p, "")?);
    }
    Ok(out)
}
