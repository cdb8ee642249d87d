//! Tensor-core operands through shared memory: every operand of a `dot` the tensor cores
//! take (16-bit, or f32 at "tf32" precision) that is not already read from a shared-memory
//! buffer is written to one (`local_alloc`) and
//! read back (`local_load`) right before the `dot` (Triton stages `tt.dot` operands the
//! same way, as `ttg.local_alloc` + `ttg.local_load` of a dot-operand encoding).
//!
//! What this buys: the operand's producer (a global `load`, typically) keeps the layout
//! it is fast in, 16-byte vectors along the contiguous dimension, instead of loading
//! element by element into the fragments; the buffer gets a swizzled shared layout
//! ([`layout::operand_swizzle`](super::layout::operand_swizzle)) that the vectorized
//! writes and the `ldmatrix` reads both meet without bank conflicts
//! ([`lower::memory`](crate::lower::memory)). The barriers the buffer needs (write before
//! read, read before the next iteration's write) come from the hazard analysis like those
//! of any buffer.
//!
//! `trans(x)` of a 2-D block is not written transposed: it reads `x`'s buffer through a
//! `local_trans` view (Triton's `memdesc_trans`), so the writes stay 16-byte vectors,
//! `ldmatrix` (`.trans` where needed) does the transpose, and a block feeding several dots,
//! directly or transposed (attention's backward reads its query and output-gradient tiles
//! both ways), is written to one buffer.
//!
//! An operand defined outside the loop that multiplies it (attention's queries in its
//! key loop) is staged once, before the outermost loop it does not depend on. Its
//! fragments are read once too, before the loop, and stay in registers while they and the
//! loop's carried blocks fit half of a thread's registers ([`FRAGMENT_BUDGET`]); beyond
//! that they are read next to the dot, one K step at a time. A 16-bit `a` computed from
//! another `dot`'s accumulator (attention's probabilities) is not staged: it converts to
//! fragments in registers.
//!
//! This runs in [`plan`](super::plan), so only the GPU lowering sees it; the interpreter
//! runs the kernel as written.

use crate::ir::{Function, Op, Type, Value};
use std::collections::{HashMap, HashSet};

pub fn run(f: &mut Function, num_warps: usize) {
    let body = std::mem::take(&mut f.body.insts);
    let (body, hoisted) = block(f, body, &[], &mut Staged::default(), num_warps);
    debug_assert!(hoisted.is_empty(), "the body defines every operand");
    f.body.insts = body;
    drop_dead_transposes(f);
}

/// Remove the `trans` operands now read through `local_trans` views (the pipeliner
/// moves a load only when the buffer is its one user).
fn drop_dead_transposes(f: &mut Function) {
    loop {
        let users = f.users_in(&f.body.insts);
        let dead: HashSet<Value> = f.walk().into_iter().filter(|v| matches!(f.inst(*v).op, Op::Permute(..)) && !users.contains_key(v)).collect();
        if dead.is_empty() {
            return;
        }
        super::simplify::retain(f, &|v| !dead.contains(&v));
    }
}

/// On sm_90a: a `dot` that can run as `wgmma` with an operand read before its loop (a
/// loop-invariant operand whose fragments [`run`] keeps in registers for `mma.sync`) gets
/// that read back next to it, where `wgmma` wants it: the tensor cores read the buffer
/// itself, every iteration, through a descriptor, and the registers stay free (FA3 keeps
/// the query tile in shared memory the same way). A read is moved only when the `dot` is
/// its one user and the `dot` then takes `wgmma` ([`wgmma_shape`]); otherwise it stays.
///
/// [`wgmma_shape`]: super::layout::wgmma_shape
pub fn sink_for_wgmma(f: &mut Function, num_warps: usize) {
    let users = f.users_in(&f.body.insts);
    for v in f.walk() {
        let Op::Dot { a, b, .. } = f.inst(v).op else { continue };
        let block = f.enclosing_block(v);
        let far: Vec<Value> = [a, b]
            .into_iter()
            .filter(|&x| matches!(f.inst(x).op, Op::LocalLoad(_)) && !block.contains(&x) && users.get(&x).map(|u| u.as_slice()) == Some(&[v]))
            .collect();
        if far.is_empty() {
            continue;
        }
        let moved: HashSet<Value> = far.iter().copied().collect();
        let before = f.clone();
        f.edit_blocks(&mut |insts| {
            insts.retain(|w| !moved.contains(w));
            if let Some(pos) = insts.iter().position(|&w| w == v) {
                insts.splice(pos..pos, far.iter().copied());
            }
        });
        if super::layout::wgmma_shape(f, v, num_warps).is_none() {
            *f = before;
        }
    }
    sink_shared_reads(f, num_warps);
}

/// [`sink_for_wgmma`] for a read before the loop that several `dot`s in it share (the
/// key tile that two products of attention's atomic backward read): each `dot` gets a
/// read of its own next to it, where all of them then take `wgmma` (one that did not
/// would still read the buffer, and so keep the others off it too); else nothing moves.
fn sink_shared_reads(f: &mut Function, num_warps: usize) {
    let mut users = f.users_in(&f.body.insts);
    for u in users.values_mut() {
        u.dedup();
    }
    let insts = f.walk();
    let dots: Vec<Value> = insts.iter().copied().filter(|&v| matches!(f.inst(v).op, Op::Dot { .. })).collect();
    // Only a buffer allocated with its block and written by nothing else: a read of it
    // next to the dot reads what the read before the loop did.
    let written_once = |view: Value| {
        let root = f.buffer_root(view);
        matches!(f.inst(root).op, Op::LocalAlloc(Some(_)))
            && !insts.iter().any(|&w| match f.inst(w).op {
                Op::LocalStore { buf, .. } => f.buffer_root(buf) == root,
                Op::AsyncCopy { dst, .. } | Op::TmaCopy { dst, .. } => f.buffer_root(dst) == root,
                _ => false,
            })
    };
    let shared: Vec<Value> = insts
        .iter()
        .copied()
        .filter(|&x| matches!(f.inst(x).op, Op::LocalLoad(view) if written_once(view)))
        .filter(|x| users.get(x).is_some_and(|u| u.len() > 1 && u.iter().all(|w| dots.contains(w) && !f.enclosing_block(*w).contains(x))))
        .collect();
    if shared.is_empty() {
        return;
    }
    let before = f.clone();
    let mut sunk = vec![];
    for x in shared {
        for &v in &users[&x] {
            let (op, ty, loc) = (f.inst(x).op.clone(), f.ty(x).clone(), f.inst(x).loc);
            let copy = f.push(op, ty, loc);
            f.values[v.index()].op.map_operands(|o| if o == x { copy } else { o });
            f.edit_blocks(&mut |insts| {
                if let Some(pos) = insts.iter().position(|&w| w == v) {
                    insts.insert(pos, copy);
                }
            });
            sunk.push(v);
        }
        f.edit_blocks(&mut |insts| insts.retain(|&w| w != x));
    }
    let on = super::layout::wgmma_dots(f, num_warps);
    if !sunk.iter().all(|v| on.contains_key(v)) {
        *f = before;
    }
}

/// Whether `dot` instruction `v` runs on tensor cores: 16-bit operands, or f32 ones at
/// "tf32" precision (the other precisions have no GPU lowering yet).
pub(crate) fn stageable(f: &Function, v: Value) -> bool {
    matches!(f.inst(v).op, Op::Dot { a, precision, .. } if f.ty(a).dtype.size() == 2 || (f.ty(a).dtype == crate::DType::F32 && precision == crate::ir::DotPrecision::Tf32))
}

/// What a block staged for the regions it holds (before them), visible to all of them:
/// the buffer of each block, and the reads of each (block, transposed) operand.
#[derive(Default)]
struct Staged {
    bufs: HashMap<Value, Value>,
    reads: HashMap<(Value, bool), Value>,
    read_bytes: usize,
}

/// The block an operand reads, and whether it reads it transposed: `trans(x)` of a 2-D
/// `x` is `x`'s buffer seen through a `local_trans` view, so `x` and `trans(x)` share one
/// buffer and the transpose moves no data (Triton's `memdesc_trans`).
fn source(f: &Function, x: Value) -> (Value, bool) {
    match &f.inst(x).op {
        Op::Permute(y, p) if p.as_slice() == [1, 0] && f.ty(*y).shape.len() == 2 => (*y, true),
        _ => (x, false),
    }
}

/// Bytes of registers per thread that the registers kept across a loop may take (128
/// registers, half of what a thread can have).
const FRAGMENT_BUDGET: usize = 512;

/// Bytes per thread of block `v` (0 for a scalar or a loop counter).
fn per_thread(f: &Function, v: Value, num_warps: usize) -> usize {
    let t = f.ty(v);
    if t.is_scalar() {
        return 0;
    }
    t.shape.iter().product::<usize>() * t.dtype.size() / (32 * num_warps)
}

/// Stage the dots of a block (whose region arguments are `args`). An operand defined in
/// the block is staged right before its dot; one defined outside it (loop-invariant, as
/// attention's queries are in its key loop) is staged once, before the loop or branch
/// that holds the block: the instructions to put there are returned, and `done` (the
/// enclosing block's) holds the operands already staged there. One block feeding several
/// dots, directly or transposed, is written to one buffer.
fn block(f: &mut Function, insts: Vec<Value>, args: &[Value], done: &mut Staged, num_warps: usize) -> (Vec<Value>, Vec<Value>) {
    let here: HashSet<Value> = insts.iter().chain(args).copied().collect();
    let mut out = Vec::with_capacity(insts.len());
    let mut hoisted = vec![];
    // Operands the regions of this block stage here (so visible to all of them).
    let mut staged_here = Staged::default();
    // Buffers of this block's own values, staged for its dots.
    let mut bufs_here: HashMap<Value, Value> = HashMap::new();
    // Fragments read once before the loop stay in registers for all of it: worth it while
    // they and the loop's carried blocks (its accumulators) take at most half the
    // registers; beyond that an operand is read from its (hoisted) buffer next to its
    // dot, one K step at a time (attention's backward at head dim 128 keeps two
    // 64-register accumulators).
    let carried: usize = args.iter().skip(1).map(|&a| per_thread(f, a, num_warps)).sum();
    let budget = FRAGMENT_BUDGET.saturating_sub(carried);
    for u in insts {
        for i in 0..f.inst(u).op.regions().len() {
            let region = &mut f.values[u.index()].op.regions_mut()[i];
            let (inner, inner_args) = (std::mem::take(&mut region.body.insts), region.args.clone());
            let (inner, up) = block(f, inner, &inner_args, &mut staged_here, num_warps);
            f.values[u.index()].op.regions_mut()[i].body.insts = inner;
            // Staged for the region: here, before the loop or branch; a buffer of a value
            // from further out (and its transposed views) further up still, so that it
            // is written once (attention's backward: the key tile, loaded before the loop
            // over query heads, read in the loop over query tiles inside it). Reads stay
            // here: fragments kept in registers across the outer loop too would take them
            // from everything else.
            for w in up {
                let further = match f.inst(w).op {
                    Op::LocalAlloc(Some(src)) => !here.contains(&src),
                    Op::LocalTrans(b) => hoisted.contains(&b),
                    _ => false,
                };
                if further {
                    hoisted.push(w);
                } else {
                    out.push(w);
                }
            }
        }
        if stageable(f, u) {
            let Op::Dot { a, b, .. } = f.inst(u).op else { unreachable!() };
            let loc = f.inst(u).loc;
            // Both writes before both reads: the buffers are live together (no byte
            // shared, so no barrier between them) and one barrier serves both reads.
            let (mut allocs, mut reads) = (vec![], vec![]);
            let mut staged = |f: &mut Function, x: Value| -> Value {
                if matches!(f.inst(x).op, Op::LocalLoad(_)) {
                    return x;
                }
                let (src, trans) = source(f, x);
                if let Some(&y) = done.reads.get(&(src, trans)) {
                    return y;
                }
                let local = here.contains(&src);
                let (at, list) = if local { (&mut bufs_here, &mut allocs) } else { (&mut done.bufs, &mut hoisted) };
                let buf = match at.get(&src) {
                    Some(&buf) => buf,
                    None => {
                        let t = f.ty(src).clone();
                        let buf = f.push(Op::LocalAlloc(Some(src)), Type::shared(t.dtype, t.shape), loc);
                        at.insert(src, buf);
                        list.push(buf);
                        buf
                    }
                };
                let view = if trans {
                    let t = f.ty(x).clone();
                    let view = f.push(Op::LocalTrans(buf), Type::shared(t.dtype, t.shape), loc);
                    list.push(view);
                    view
                } else {
                    buf
                };
                let t = f.ty(x).clone();
                let bytes = per_thread(f, x, num_warps);
                let y = f.push(Op::LocalLoad(view), Type::block(t.dtype, t.shape), loc);
                if local || done.read_bytes + bytes > budget {
                    reads.push(y);
                } else {
                    done.read_bytes += bytes;
                    hoisted.push(y);
                    done.reads.insert((src, trans), y);
                }
                y
            };
            // A chained `a` (attention's probabilities, computed from the previous dot's
            // accumulator) stays in registers when M has a 16-row tile per warp: then the
            // warps go along M and the accumulator's fragments are its fragments
            // (`layout::dot_layouts`).
            let in_registers = crate::passes::layout::from_dot_result(f, a) && f.ty(a).dtype.size() == 2 && crate::passes::layout::warps_fit_along_m(f.ty(a).padded_shape()[0], num_warps);
            let sa = if in_registers { a } else { staged(f, a) };
            let sb = if b == a { sa } else { staged(f, b) }; // x @ x: one buffer
            out.extend(allocs.into_iter().chain(reads));
            if let Op::Dot { a, b, .. } = &mut f.values[u.index()].op {
                (*a, *b) = (sa, sb);
            }
        }
        out.push(u);
    }
    // What this block hoisted for an inner region but defines itself stays here.
    (out, hoisted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Builder, DotPrecision, Loc, ParamKind};
    use crate::DType;

    #[test]
    fn tensor_core_dot_operands_go_through_a_buffer_and_others_do_not() {
        let l = Loc::new(1, 1);
        for (d, precision, staged) in [(DType::BF16, DotPrecision::Ieee, true), (DType::F16, DotPrecision::Ieee, true), (DType::F32, DotPrecision::Tf32, true), (DType::F32, DotPrecision::Ieee, false)] {
            let mut b = Builder::new("k", &[("x", ParamKind::Ptr { elem: d, writable: false }), ("y", ParamKind::Ptr { elem: DType::F32, writable: true })]);
            let r = b.arange(0, 16, l).unwrap();
            let rc = b.expand_dims(r, 1, l).unwrap();
            let rr = b.expand_dims(r, 0, l).unwrap();
            let rc = b.binary(crate::ir::BinOp::Mul, rc, crate::ir::Operand::Int(16), l).unwrap();
            let off = b.binary(crate::ir::BinOp::Add, rc, rr, l).unwrap();
            let p = b.add_ptr(b.param(0), off, l).unwrap();
            let x = b.load(p, None, None, l).unwrap();
            let acc = b.full(&[16, 16], crate::ir::Operand::Float(0.0), DType::F32, l).unwrap();
            let c = b.dot(x, x, Some(acc), precision, l).unwrap();
            let q = b.add_ptr(b.param(1), off, l).unwrap();
            b.store(q, c, None, l).unwrap();
            let mut f = b.finish().unwrap();
            run(&mut f, 4);
            crate::ir::verify::verify(&f).unwrap();
            let dot = f.walk().into_iter().find(|&v| matches!(f.inst(v).op, Op::Dot { .. })).unwrap();
            let Op::Dot { a, b: bb, .. } = f.inst(dot).op else { unreachable!() };
            for o in [a, bb] {
                assert_eq!(matches!(f.inst(o).op, Op::LocalLoad(_)), staged, "{d}: {}", f);
            }
            // Running it again changes nothing: staged operands stay staged once.
            let before = f.clone();
            run(&mut f, 4);
            assert_eq!(f, before);
        }
    }

    #[test]
    fn a_loop_invariant_operand_is_staged_once_before_the_loop() {
        // acc += q @ x_k: q is loaded before the loop (attention's queries), x_k in it.
        let l = Loc::new(1, 1);
        let params = [("x", ParamKind::Ptr { elem: DType::BF16, writable: false }), ("y", ParamKind::Ptr { elem: DType::F32, writable: true }), ("n", ParamKind::Scalar(DType::I32))];
        let mut b = Builder::new("k", &params);
        let r = b.arange(0, 16, l).unwrap();
        let rows = b.expand_dims(r, 1, l).unwrap();
        let rows = b.binary(crate::ir::BinOp::Mul, rows, crate::ir::Operand::Int(16), l).unwrap();
        let cols = b.expand_dims(r, 0, l).unwrap();
        let off = b.binary(crate::ir::BinOp::Add, rows, cols, l).unwrap();
        let p = b.add_ptr(b.param(0), off, l).unwrap();
        let q = b.load(p, None, None, l).unwrap();
        let acc0 = b.full(&[16, 16], crate::ir::Operand::Float(0.0), DType::F32, l).unwrap();
        let (kk, args) = b.begin_for(crate::ir::Operand::Int(0), b.param(2), crate::ir::Operand::Int(1), &[crate::ir::Operand::V(acc0)], l).unwrap();
        let crate::ir::Operand::V(acc) = args[0] else { unreachable!() };
        let pk = b.add_ptr(p, kk, l).unwrap();
        let x = b.load(pk, None, None, l).unwrap();
        let d = b.dot(q, x, Some(acc), DotPrecision::Ieee, l).unwrap();
        let out = b.end_for(&[crate::ir::Operand::V(d)], &["acc"], l).unwrap();
        let crate::ir::Operand::V(res) = out[0] else { unreachable!() };
        let py = b.add_ptr(b.param(1), off, l).unwrap();
        b.store(py, res, None, l).unwrap();
        let mut f = b.finish().unwrap();
        run(&mut f, 4);
        crate::ir::verify::verify(&f).unwrap();
        let top_allocs: Vec<Value> = f.body.insts.iter().copied().filter(|&v| matches!(f.inst(v).op, Op::LocalAlloc(Some(o)) if o == q)).collect();
        assert_eq!(top_allocs.len(), 1, "q staged once, before the loop: {f}");
        let lp = f.body.insts.iter().copied().find(|&v| matches!(f.inst(v).op, Op::For { .. })).unwrap();
        let Op::For { body, .. } = &f.inst(lp).op else { unreachable!() };
        let inner: Vec<Value> = body.body.insts.iter().copied().filter(|&v| matches!(f.inst(v).op, Op::LocalAlloc(_))).collect();
        assert_eq!(inner.len(), 1, "only x_k staged in the loop: {f}");
        assert!(matches!(f.inst(inner[0]).op, Op::LocalAlloc(Some(o)) if o == x));
    }

    /// `acc += q @ w` in a loop over m inside a loop over h, `q` and `w` loaded before
    /// both: their buffers are written once, before the outer loop. Their fragments are
    /// read before the inner loop when they fit beside the accumulator, and in it, next to
    /// the dot, when the accumulator takes the registers (attention's backward at head dim
    /// 128).
    #[test]
    fn loop_invariant_operands_are_written_once_and_read_where_registers_allow() {
        use crate::ir::{BinOp, Operand};
        let l = Loc::new(1, 1);
        for (m, read_in_inner_loop) in [(16, false), (128, true)] {
            let params = [("x", ParamKind::Ptr { elem: DType::BF16, writable: false }), ("y", ParamKind::Ptr { elem: DType::F32, writable: true }), ("n", ParamKind::Scalar(DType::I32))];
            let mut b = Builder::new("k", &params);
            let tile = |b: &mut Builder, rows: i64, cols: i64| {
                let (r, c) = (b.arange(0, rows, l).unwrap(), b.arange(0, cols, l).unwrap());
                let r = b.expand_dims(r, 1, l).unwrap();
                let r = b.binary(BinOp::Mul, r, Operand::Int(cols), l).unwrap();
                let c = b.expand_dims(c, 0, l).unwrap();
                let off = b.binary(BinOp::Add, r, c, l).unwrap();
                let p = b.add_ptr(b.param(0), off, l).unwrap();
                (b.load(p, None, None, l).unwrap(), off)
            };
            let (q, _) = tile(&mut b, m, 64);
            let (w, _) = tile(&mut b, 64, 128);
            let acc0 = b.full(&[m, 128], Operand::Float(0.0), DType::F32, l).unwrap();
            let (_, outer) = b.begin_for(Operand::Int(0), Operand::Int(2), Operand::Int(1), &[Operand::V(acc0)], l).unwrap();
            let (_, inner) = b.begin_for(Operand::Int(0), b.param(2), Operand::Int(1), &[outer[0]], l).unwrap();
            let Operand::V(acc) = inner[0] else { unreachable!() };
            let d = b.dot(q, w, Some(acc), DotPrecision::Ieee, l).unwrap();
            let got = b.end_for(&[Operand::V(d)], &["acc"], l).unwrap();
            let res = b.end_for(&got, &["acc"], l).unwrap();
            let Operand::V(res) = res[0] else { unreachable!() };
            let (r, c) = (b.arange(0, m, l).unwrap(), b.arange(0, 128, l).unwrap());
            let r = b.expand_dims(r, 1, l).unwrap();
            let r = b.binary(BinOp::Mul, r, Operand::Int(128), l).unwrap();
            let c = b.expand_dims(c, 0, l).unwrap();
            let off = b.binary(BinOp::Add, r, c, l).unwrap();
            let py = b.add_ptr(b.param(1), off, l).unwrap();
            b.store(py, res, None, l).unwrap();
            let mut f = b.finish().unwrap();
            run(&mut f, 4);
            crate::ir::verify::verify(&f).unwrap();
            let text = f.to_string();
            let top: Vec<Value> = f.body.insts.iter().copied().filter(|&v| matches!(f.inst(v).op, Op::LocalAlloc(_))).collect();
            assert_eq!(top.len(), 2, "m = {m}: both buffers before the outer loop\n{text}");
            let outer_loop = f.body.insts.iter().copied().find(|&v| matches!(f.inst(v).op, Op::For { .. })).unwrap();
            let Op::For { body, .. } = &f.inst(outer_loop).op else { unreachable!() };
            let inner_loop = body.body.insts.iter().copied().find(|&v| matches!(f.inst(v).op, Op::For { .. })).unwrap();
            let Op::For { body: inner_body, .. } = &f.inst(inner_loop).op else { unreachable!() };
            let reads_in = |insts: &[Value]| insts.iter().filter(|&&v| matches!(f.inst(v).op, Op::LocalLoad(_))).count();
            let (before_inner, in_inner) = (reads_in(&body.body.insts), reads_in(&inner_body.body.insts));
            assert_eq!((before_inner, in_inner), if read_in_inner_loop { (0, 2) } else { (2, 0) }, "m = {m}\n{text}");
        }
    }
}
