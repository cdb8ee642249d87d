//! Register prefetch (with `num_stages > 1`): a load in a loop that is not staged in shared
//! memory (whose value the loop's elementwise code reads: a score modification's bias
//! tile in attention, the backward's `lse` and `delta` rows) is issued one iteration
//! ahead, its value carried into the next iteration in registers:
//!
//! ```text
//! x0 = load(ptr(start), mask(start) & (start < end) & (0 < step), other)  // before the loop
//! for k in (start..end).step_by(step) carrying x = x0:
//!     ... the uses of x ...
//!     x' = load(ptr(k + step), mask(k + step) & (k < end - step), other)
//!     yield x'
//! ```
//!
//! The next iteration's load goes right after the last use of the current value, so the
//! two are never live together: the loop holds no more registers than when it loaded and
//! waited in the same iteration, and the load's latency passes under the rest of the
//! iteration (the products) instead of stalling the code that reads it. The pipeliner
//! ([`pipeline`](super::pipeline)) does the same for the tensor cores' operands through
//! shared memory; Triton stages these loads through shared memory too, which costs a ring
//! of buffers a load (a 128 x 64 f32 bias tile is 32 KiB a stage) where this costs none.
//!
//! Which loads: at the top level of an innermost loop that writes no global memory (a store
//! or atomic might write what the next iteration reads) and does not return; pointer and
//! mask computed from the counter and loop invariants as the pipeliner's copies are
//! (carried pointers advanced by an invariant step included); `other` from before the
//! loop (or a constant or a splat of such a value); not read by a `local_alloc`; and at
//! most [`PREFETCH_REGISTERS`] 32-bit registers a thread for the loop's prefetched values
//! together, counted from their shapes (a row that the layout later replicates across a
//! warp's lanes holds more than that). Runs in [`plan`](super::plan), so the interpreter
//! runs the kernel as written; the tests here run the rewritten IR on it.

use super::pipeline::{clone_slice, depends_on_loop, slice, Iteration};
use crate::ir::{BinOp, CmpOp, ConstVal, Function, Op, Type, Value};
use crate::DType;
use std::collections::{HashMap, HashSet};

/// The most 32-bit registers a thread that a loop's prefetched values may hold together
/// (a 128 x 64 f32 tile on 4 warps is 64).
pub const PREFETCH_REGISTERS: usize = 64;

/// Prefetch the eligible loads of every innermost loop of `f`, for `num_warps` warps.
pub fn run(f: &mut Function, num_warps: usize) {
    let loops: Vec<Value> = f.walk().into_iter().filter(|&v| matches!(f.inst(v).op, Op::For { .. })).collect();
    let mut changed = false;
    for l in loops {
        let inner = f.walk_from(&f.inst(l).op.regions()[0].body.insts);
        // (A `return` in the body would end the program where the next tile was already read.)
        if inner.iter().any(|&w| matches!(f.inst(w).op, Op::For { .. } | Op::Store { .. } | Op::Atomic { .. } | Op::Return)) {
            continue;
        }
        let mut budget = PREFETCH_REGISTERS;
        for x in eligible(f, l) {
            let t = f.ty(x);
            let regs = (t.shape.iter().product::<usize>() * t.dtype.size()).div_ceil(4).div_ceil(num_warps * 32);
            if regs > budget {
                continue;
            }
            budget -= regs;
            let before = prefetch(f, l, x);
            f.edit_blocks(&mut |insts| {
                if let Some(pos) = insts.iter().position(|&w| w == l) {
                    insts.splice(pos..pos, before.iter().copied());
                }
            });
            changed = true;
        }
    }
    if changed {
        // The current iteration's address computations are dead now.
        super::simplify::dce(f);
    }
}

/// The loads of loop `l`'s body that [`prefetch`] can move, in body order.
fn eligible(f: &Function, l: Value) -> Vec<Value> {
    let Op::For { body, .. } = &f.inst(l).op else { return vec![] };
    let here: HashSet<Value> = body.body.insts.iter().copied().collect();
    // What the loop computes or carries (its counter included).
    let variant: HashSet<Value> = here.iter().chain(&body.args).copied().collect();
    let users = f.users_in(&body.body.insts);
    let staged = |x: Value| users.get(&x).is_some_and(|us| us.iter().any(|&w| matches!(f.inst(w).op, Op::LocalAlloc(_))));
    body.body
        .insts
        .iter()
        .copied()
        .filter(|&x| {
            let Op::Load { ptr, mask, other } = f.inst(x).op else { return false };
            let roots: Vec<Value> = [Some(ptr), mask].into_iter().flatten().collect();
            !staged(x)
                && other.is_none_or(|o| invariant_fill(f, &variant, o))
                && roots.iter().any(|&r| depends_on_loop(f, &here, body, r))
                && slice(f, l, roots).is_some()
        })
        .collect()
}

/// Whether `o` (a load's `other`) is from before the loop, or a constant or a splat of such
/// a value made in the body (`variant`: the body's values and the loop's arguments).
fn invariant_fill(f: &Function, variant: &HashSet<Value>, o: Value) -> bool {
    if !variant.contains(&o) {
        return true;
    }
    match f.inst(o).op {
        Op::Const(_) => true,
        Op::Splat(x) => invariant_fill(f, variant, x),
        _ => false,
    }
}

/// `o` ([`invariant_fill`]) made again (pushed to `out`) where it is one of the body's.
fn fill_before(f: &mut Function, here: &HashSet<Value>, o: Value, out: &mut Vec<Value>) -> Value {
    if !here.contains(&o) {
        return o;
    }
    let mut op = f.inst(o).op.clone();
    if let Op::Splat(x) = op {
        op = Op::Splat(fill_before(f, here, x, out));
    }
    let c = f.push(op, f.ty(o).clone(), f.inst(o).loc);
    out.push(c);
    c
}

/// Carry load `x` of loop `l` from the previous iteration (see the module docs). Returns
/// the instructions to place before the loop (the first iteration's load).
fn prefetch(f: &mut Function, l: Value, x: Value) -> Vec<Value> {
    let Op::For { start, end, step, body, init } = f.inst(l).op.clone() else { unreachable!() };
    let Op::Load { ptr, mask, other } = f.inst(x).op else { unreachable!() };
    let (sl, carried) = slice(f, l, [Some(ptr), mask].into_iter().flatten().collect()).expect("eligible");
    let (ty, loc) = (f.ty(x).clone(), f.inst(x).loc);
    let it = f.ty(body.args[0]).clone();
    let mut before = vec![];
    // A splat of an invariant (or a constant) made in the body: made again before it.
    let here: HashSet<Value> = body.body.insts.iter().copied().collect();
    let other = other.map(|o| fill_before(f, &here, o, &mut before));
    let other = other.unwrap_or_else(|| {
        let z = f.push(Op::Const(ConstVal::zero(ty.dtype)), Type::scalar(ty.dtype), loc);
        before.push(z);
        if ty.is_scalar() {
            return z;
        }
        let b = f.push(Op::Splat(z), Type::block(ty.dtype, ty.shape.clone()), loc);
        before.push(b);
        b
    });
    // `x`'s load for iteration `k` (`steps` from `bases`), masked off where `on` is false.
    let load_at = |f: &mut Function, out: &mut Vec<Value>, at: Iteration, forward: Option<Value>| {
        let on = f.push(Op::Cmp(CmpOp::Lt, at.inside.0, at.inside.1), Type::scalar(DType::Bool), loc);
        out.push(on);
        let on = super::and_mask(f, out, forward, on, loc);
        let map: HashMap<Value, Value> = clone_slice(f, out, &sl, &carried, &at, loc);
        let get = |v: Value| map.get(&v).copied().unwrap_or(v);
        let on = if ty.is_scalar() {
            on
        } else {
            let all = f.push(Op::Splat(on), Type::block(DType::Bool, ty.shape.clone()), loc);
            out.push(all);
            all
        };
        let m = super::and_mask(f, out, mask.map(get), on, loc);
        let v = f.push(Op::Load { ptr: get(ptr), mask: Some(m), other: Some(other) }, ty.clone(), loc);
        out.push(v);
        v
    };
    // The first iteration's, where the loop runs one: `start < end` and a positive step (a
    // step that is not runs no iteration).
    let zero = f.push(Op::Const(ConstVal::Int(0)), it.clone(), loc);
    let forward = f.push(Op::Cmp(CmpOp::Lt, zero, step), Type::scalar(DType::Bool), loc);
    before.extend([zero, forward]);
    let first = load_at(f, &mut before, Iteration { ind: body.args[0], k: start, steps: 0, bases: &init, inside: (start, end) }, Some(forward));
    // The loop's last iteration starts below `end - step` (no overflow where `k + step` would).
    let last = f.push(Op::Binary(BinOp::Sub, end, step), it.clone(), loc);
    before.push(last);
    // The carried value, in place of `x` in the body.
    let arg = f.push(Op::Arg(l, body.args.len() as u32), ty.clone(), loc);
    let mut insts: Vec<Value> = body.body.insts.iter().copied().filter(|&w| w != x).collect();
    for w in f.walk_from(&insts) {
        f.values[w.index()].op.map_operands(|o| if o == x { arg } else { o });
    }
    let mut yields = body.yields.clone();
    for y in &mut yields {
        if *y == x {
            *y = arg;
        }
    }
    // The next iteration's load, after the last instruction that reads the current value.
    let reads = |f: &Function, w: Value| f.walk_from(&[w]).into_iter().any(|v| f.inst(v).op.operands().contains(&arg) || f.inst(v).op.regions().iter().any(|r| r.yields.contains(&arg)));
    let at = insts.iter().rposition(|&w| reads(f, w)).map_or(0, |p| p + 1);
    let mut next = vec![];
    let k = f.push(Op::Binary(BinOp::Add, body.args[0], step), it, loc);
    next.push(k);
    let v = load_at(f, &mut next, Iteration { ind: body.args[0], k, steps: 1, bases: &[], inside: (body.args[0], last) }, None);
    insts.splice(at..at, next);
    yields.push(v);
    let Op::For { init, body, .. } = &mut f.values[l.index()].op else { unreachable!() };
    init.push(first);
    body.args.push(arg);
    body.body.insts = insts;
    body.yields = yields;
    before
}

#[cfg(test)]
mod tests {
    use crate::error::KernelSite;
    use crate::ir::{BinOp, Builder, CmpOp, Function, Loc, Op, Operand, ParamKind};
    use crate::launch::{host, host_mut, LaunchConfig};
    use crate::DType;

    /// How the loop's tile is addressed.
    #[derive(Clone, Copy, PartialEq, Debug)]
    enum Addr {
        /// From the counter, masked by the table's rows (`rows` need not be a multiple of 16).
        Masked,
        /// From the counter, unmasked (the table holds every iteration's rows).
        Unmasked,
        /// A pointer carried from one iteration to the next, advanced a tile each time.
        Carried,
        /// A block of pointers carried and loaded as it is (Triton's tutorial style).
        CarriedTile,
        /// As `Unmasked`, over `(0..16).step_by(rows)`: a step known at run time only.
        RuntimeStep,
        /// As `Masked`, with a store to the output in the loop.
        StoreInLoop,
        /// As `Masked`, the masked-off elements taking the accumulator's value.
        CarriedOther,
    }

    /// `acc = acc * 0.5 + x[i..i+16, 0..16]` over `i in (0..rows).step_by(16)`, then
    /// `y = acc` (16 x 16): the tile's load is the loop's only load.
    fn table_sum(addr: Addr) -> Function {
        let l = Loc::new(1, 1);
        let params = [("x", ParamKind::Ptr { elem: DType::F32, writable: false }), ("y", ParamKind::Ptr { elem: DType::F32, writable: true }), ("rows", ParamKind::Scalar(DType::I32))];
        let mut b = Builder::new("t", &params);
        let r = b.arange(0, 16, l).unwrap();
        let cols = b.expand_dims(r, 0, l).unwrap();
        let rows = b.expand_dims(r, 1, l).unwrap();
        let at = b.binary(BinOp::Mul, rows, Operand::Int(16), l).unwrap();
        let at = b.binary(BinOp::Add, at, cols, l).unwrap();
        let acc0 = b.full(&[16, 16], Operand::Float(0.0), DType::F32, l).unwrap();
        let p0 = if addr == Addr::CarriedTile { b.add_ptr(b.param(0), at, l).unwrap() } else { b.add_ptr(b.param(0), Operand::Int(0), l).unwrap() };
        let (end, step): (Operand, Operand) = if addr == Addr::RuntimeStep { (Operand::Int(16), b.param(2).into()) } else { (b.param(2).into(), Operand::Int(16)) };
        let (i, args) = b.begin_for(Operand::Int(0), end, step, &[Operand::V(acc0), Operand::V(p0)], l).unwrap();
        let (Operand::V(acc), Operand::V(p)) = (args[0], args[1]) else { unreachable!() };
        let ptrs = if addr == Addr::Carried {
            b.add_ptr(p, at, l).unwrap()
        } else if addr == Addr::CarriedTile {
            p
        } else {
            let row = b.binary(BinOp::Mul, i, Operand::Int(16), l).unwrap();
            let offs = b.binary(BinOp::Add, at, row, l).unwrap();
            b.add_ptr(b.param(0), offs, l).unwrap()
        };
        let tile = if matches!(addr, Addr::Unmasked | Addr::RuntimeStep | Addr::CarriedTile) {
            b.load(ptrs, None, None, l).unwrap()
        } else {
            let row = b.binary(BinOp::Add, rows, i, l).unwrap();
            let m = b.cmp(CmpOp::Lt, row, b.param(2), l).unwrap();
            let other = if addr == Addr::CarriedOther { Operand::V(acc) } else { Operand::Float(0.0) };
            b.load(ptrs, Some(Operand::V(m)), Some(other), l).unwrap()
        };
        let half = b.binary(BinOp::Mul, acc, Operand::Float(0.5), l).unwrap();
        let next = b.binary(BinOp::Add, half, tile, l).unwrap();
        if addr == Addr::StoreInLoop {
            let q = b.add_ptr(b.param(1), at, l).unwrap();
            b.store(q, next, None, l).unwrap();
        }
        let p1 = b.add_ptr(p, Operand::Int(256), l).unwrap();
        let out = b.end_for(&[Operand::V(next), Operand::V(p1)], &["acc", "p"], l).unwrap();
        let q = b.add_ptr(b.param(1), at, l).unwrap();
        b.store(q, out[0], None, l).unwrap();
        b.finish().unwrap()
    }

    fn interpret(f: &Function, x: &[f32], rows: i32) -> Vec<f32> {
        let mut y = vec![f32::NAN; 256];
        let site = KernelSite { kernel: "t".into(), spec: String::new(), at: None };
        crate::interp::run(f, &LaunchConfig::grid(1), &[host(x), host_mut(&mut y), crate::launch::Arg::I32(rows)], &site, "t.rs").unwrap();
        y
    }

    fn the_loop(f: &Function) -> crate::ir::Value {
        f.walk().into_iter().find(|&v| matches!(f.inst(v).op, Op::For { .. })).unwrap()
    }

    /// The tile is loaded before the loop for the first iteration and, in the loop, for the
    /// next one after the current one's last use, carried in between; the rewritten kernel
    /// computes what the original does (the interpreter runs both), for a loop running no
    /// iteration (and an empty table: nothing may be read; a step of 0 at run time too), a
    /// ragged last tile, and with carried pointers (computed from, or loaded as they are).
    /// A loop that stores keeps its load, and so does a load whose masked-off elements take
    /// a value the loop carries.
    #[test]
    fn a_loop_carries_its_tile_loaded_an_iteration_ahead() {
        for addr in [Addr::Masked, Addr::Unmasked, Addr::Carried, Addr::CarriedTile, Addr::RuntimeStep] {
            let f = table_sum(addr);
            let mut g = f.clone();
            super::run(&mut g, 4);
            crate::ir::verify::verify(&g).unwrap();
            let l = the_loop(&g);
            let Op::For { init, body, .. } = &g.inst(l).op else { unreachable!() };
            assert_eq!(init.len(), 3, "{addr:?}: the tile is not carried:\n{g}");
            assert!(matches!(g.inst(init[2]).op, Op::Load { .. }), "{addr:?}:\n{g}");
            let carried = body.args[3];
            let insts = &body.body.insts;
            let load = insts.iter().position(|&v| matches!(g.inst(v).op, Op::Load { .. })).expect("the next tile's load");
            let last_use = insts.iter().rposition(|&v| g.inst(v).op.operands().contains(&carried)).expect("a use");
            assert!(load > last_use, "{addr:?}: the next tile is loaded before the current one is used:\n{g}");
            assert_eq!(body.yields[2], insts[load], "{addr:?}:\n{g}");
            for rows in [0, 16, 40, 64] {
                if addr != Addr::Masked && rows % 16 != 0 || addr == Addr::RuntimeStep && rows > 16 {
                    continue;
                }
                // (With a runtime step, `rows` is the step: 0 runs no iteration, 16 one.)
                let n = if addr == Addr::RuntimeStep { rows.min(1) * 16 } else { rows };
                let x: Vec<f32> = (0..n * 16).map(|i| (i as f32 * 0.37).sin()).collect();
                assert_eq!(interpret(&g, &x, rows).iter().map(|v| v.to_bits()).collect::<Vec<_>>(), interpret(&f, &x, rows).iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "{addr:?}, {rows} rows");
            }
        }
        for addr in [Addr::StoreInLoop, Addr::CarriedOther] {
            let mut s = table_sum(addr);
            let before = s.clone();
            super::run(&mut s, 4);
            assert_eq!(s, before, "{addr:?}: rewritten\n{s}");
        }
    }
}
