//! Code motion: scalars that do not change in a loop out of it ([`licm`]), and loads ahead
//! of the tensor-core products they do not wait for ([`loads_before_dots`]). Both keep what
//! the kernel computes; the interpreter runs their output too.
//!
//! - [`licm`]: a scalar (one value per program) computed in a loop from values defined
//!   outside it is computed once, before the loop. That includes a load from memory the loop
//!   does not write (no store, atomic or debug op in it): its mask gains "the loop runs"
//!   (`start < end && 0 < step`), so that a loop that runs no iteration still reads nothing
//!   (Triton's `LoopInvariantCodeMotion` hoists loads the same way). LLVM hoists arithmetic
//!   by itself, but no load across the loop's `wgmma`s, copies and barriers (inline
//!   assembly that may write memory): a score modification's parameters (`ScoreBias`'s
//!   header) were loaded, and waited for, at every key tile. Integer divisions stay (the
//!   interpreter fails on a division by zero that a loop running no iteration never does),
//!   and so do blocks, which would hold registers across the whole loop. What leaves a loop
//!   lives across it, and LLVM then keeps what it computes from it there too: the
//!   flash-attention `dQ` kernel with a bias from data went from 119 to 133-142 registers,
//!   past two programs an SM, until its launch asked for two
//!   ([`LaunchConfig::min_programs_per_sm`](crate::launch::LaunchConfig::min_programs_per_sm);
//!   BENCHMARKS.md, "Loop-invariant loads out of the key loop").
//! - [`loads_before_dots`]: in a block, a load that no `dot` of the block feeds and that is
//!   no `dot`'s operand (the staging and pipelining passes place those) is issued before
//!   the block's first `dot`, when no store, atomic or debug op lies between: its latency
//!   passes under the tensor cores' work instead of after it. What moves: a score
//!   modification's bias tile in attention's key loop, the backward's `lse` and `delta`
//!   rows. Its cost is the registers the loaded block holds while the product runs.

use crate::ir::{BinOp, CmpOp, ConstVal, Function, Op, Type, Value};
use crate::DType;
use std::collections::HashSet;

pub fn run(f: &mut Function) {
    licm(f);
    loads_before_dots(f);
}

/// Hoist loop-invariant scalars (loads of memory the loop does not write included) out of
/// every `for` loop, inner loops first (what leaves an inner loop may then leave the outer).
pub fn licm(f: &mut Function) {
    let loops: Vec<Value> = f.walk().into_iter().filter(|&v| matches!(f.inst(v).op, Op::For { .. })).collect();
    for &l in loops.iter().rev() {
        let hoisted = invariants(f, l);
        if !hoisted.is_empty() {
            let moved: HashSet<Value> = hoisted.iter().copied().collect();
            f.edit_blocks(&mut |insts| {
                insts.retain(|w| !moved.contains(w));
                if let Some(pos) = insts.iter().position(|&w| w == l) {
                    insts.splice(pos..pos, hoisted.iter().copied());
                }
            });
        }
    }
}

/// What leaves loop `l`, in order (new instructions for the loads' masks included), with
/// the loads' masks rewritten.
fn invariants(f: &mut Function, l: Value) -> Vec<Value> {
    let Op::For { start, end, step, body, .. } = &f.inst(l).op else { return vec![] };
    let (start, end, step, insts) = (*start, *end, *step, body.body.insts.clone());
    let loc = f.inst(l).loc;
    let all = f.walk_from(&insts);
    let writes = effects_among(f, &all);
    let mut inside: HashSet<Value> = all.iter().copied().collect();
    for w in std::iter::once(l).chain(all.iter().copied()) {
        inside.extend(f.inst(w).op.regions().iter().flat_map(|r| r.args.iter().copied()));
    }
    let mut out = vec![];
    let mut runs = None;
    for v in insts {
        let inst = f.inst(v);
        let pure = !inst.op.has_effects() && !matches!(inst.op, Op::Load { .. } | Op::Result(..) | Op::Arg(..));
        let division = matches!(inst.op, Op::Binary(BinOp::Div | BinOp::Rem, ..)) && !inst.ty.dtype.is_float();
        let load = matches!(inst.op, Op::Load { .. }) && !writes;
        if !inst.ty.shape.is_empty() || inst.ty.unit || division || !(pure || load) {
            continue;
        }
        if inst.op.operands().iter().any(|o| inside.contains(o)) {
            continue;
        }
        if let Op::Load { ptr, mask, other } = inst.op {
            let runs = *runs.get_or_insert_with(|| {
                let bool_ty = Type::scalar(DType::Bool);
                let before_end = f.push(Op::Cmp(CmpOp::Lt, start, end), bool_ty.clone(), loc);
                let zero = f.push(Op::Const(ConstVal::Int(0)), f.ty(step).clone(), loc);
                let forward = f.push(Op::Cmp(CmpOp::Lt, zero, step), bool_ty.clone(), loc);
                let runs = f.push(Op::Binary(BinOp::And, before_end, forward), bool_ty, loc);
                out.extend([before_end, zero, forward, runs]);
                runs
            });
            let mask = super::and_mask(f, &mut out, mask, runs, loc);
            let other = other.unwrap_or_else(|| {
                let ty = f.ty(v).clone();
                let z = f.push(Op::Const(ConstVal::zero(ty.dtype)), ty, loc);
                out.push(z);
                z
            });
            f.values[v.index()].op = Op::Load { ptr, mask: Some(mask), other: Some(other) };
        }
        inside.remove(&v);
        out.push(v);
    }
    out
}

/// Whether any of `insts` (a walk, nested instructions included) has an effect of its own:
/// a store, an atomic, a debug op, a barrier..., not merely a loop or branch holding one.
fn effects_among(f: &Function, insts: &[Value]) -> bool {
    insts.iter().any(|&w| f.inst(w).op.has_effects() && !matches!(f.inst(w).op, Op::For { .. } | Op::If { .. }))
}

/// In every block, issue each load that no `dot` of the block feeds, and that is no `dot`'s
/// operand, before the block's first `dot` (with what computes its address and mask), unless
/// an instruction with effects lies between.
pub fn loads_before_dots(f: &mut Function) {
    let operands = dot_operands(f);
    let mut body = std::mem::take(&mut f.body.insts);
    reorder(f, &mut body, &operands);
    f.body.insts = body;
}

/// The values `dot`s take as operands, through transposes and casts: the loads the
/// staging pass writes to shared memory.
fn dot_operands(f: &Function) -> HashSet<Value> {
    let mut out = HashSet::new();
    for v in f.walk() {
        if let Op::Dot { a, b, .. } = f.inst(v).op {
            for mut x in [a, b] {
                out.insert(x);
                while let Op::Permute(y, _) | Op::Cast(y) | Op::ConvertLayout(y) = f.inst(x).op {
                    x = y;
                    out.insert(x);
                }
            }
        }
    }
    out
}

fn reorder(f: &mut Function, insts: &mut Vec<Value>, operands: &HashSet<Value>) {
    while let Some((to, moved)) = next_move(f, insts, operands) {
        let set: HashSet<Value> = moved.iter().copied().collect();
        let mut rest: Vec<Value> = insts.iter().copied().filter(|v| !set.contains(v)).collect();
        rest.splice(to..to, moved);
        *insts = rest;
    }
    for &v in insts.iter() {
        for i in 0..f.inst(v).op.regions().len() {
            let mut inner = std::mem::take(&mut f.values[v.index()].op.regions_mut()[i].body.insts);
            reorder(f, &mut inner, operands);
            f.values[v.index()].op.regions_mut()[i].body.insts = inner;
        }
    }
}

/// The first load of the block that can move before a `dot`: the position of that `dot`
/// and the instructions that move (the load and what it needs from between), in order.
fn next_move(f: &Function, insts: &[Value], operands: &HashSet<Value>) -> Option<(usize, Vec<Value>)> {
    // The first `dot` since the last instruction with effects, and the values computed
    // from a `dot` (inside a loop or branch too).
    let mut first_dot: Option<usize> = None;
    let mut from_dot: HashSet<Value> = HashSet::new();
    for (i, &v) in insts.iter().enumerate() {
        let inst = f.inst(v);
        let nested = f.walk_from(&[v]);
        if effects_among(f, &nested) {
            first_dot = None;
        }
        let uses_dot = nested.iter().any(|&w| {
            let op = &f.inst(w).op;
            op.operands().into_iter().chain(op.regions().into_iter().flat_map(|r| r.yields.iter().copied())).any(|o| from_dot.contains(&o))
        });
        if matches!(inst.op, Op::Dot { .. }) || uses_dot {
            from_dot.insert(v);
            if let Op::Result(owner, _) = inst.op {
                from_dot.insert(owner);
            }
        }
        if matches!(inst.op, Op::Dot { .. }) {
            first_dot = first_dot.or(Some(i));
            continue;
        }
        let Some(to) = first_dot else { continue };
        if !matches!(inst.op, Op::Load { .. }) || from_dot.contains(&v) || operands.contains(&v) {
            continue;
        }
        // The load and the instructions between the `dot` and it that it needs.
        let between: HashSet<Value> = insts[to..i].iter().copied().collect();
        let mut need = HashSet::from([v]);
        let mut stack = vec![v];
        let mut movable = true;
        while let Some(w) = stack.pop() {
            for o in f.inst(w).op.operands() {
                if between.contains(&o) && need.insert(o) {
                    movable &= !matches!(f.inst(o).op, Op::Result(..)) && f.inst(o).op.regions().is_empty();
                    stack.push(o);
                }
            }
        }
        if movable {
            return Some((to, insts[to..=i].iter().copied().filter(|w| need.contains(w)).collect()));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use crate::ir::{BinOp, Builder, ConstVal, Loc, Operand, ParamKind};
    use crate::DType;

    /// `for i in 0..n { y[i] = x[0] * 2 + i }`: the load of `x[0]` and its product leave the
    /// loop, the load masked by "the loop runs".
    #[test]
    fn invariant_scalar_loads_leave_loops_that_write_nothing_they_read() {
        let build = |store_in_loop: bool| {
            let l = Loc::new(1, 1);
            let params = [("x", ParamKind::Ptr { elem: DType::F32, writable: false }), ("y", ParamKind::Ptr { elem: DType::F32, writable: true }), ("n", ParamKind::Scalar(DType::I32))];
            let mut b = Builder::new("t", &params);
            let z = b.constant(ConstVal::Float(0.0), DType::F32, l).unwrap();
            let (i, acc) = b.begin_for(Operand::Int(0), b.param(2), Operand::Int(1), &[Operand::V(z)], l).unwrap();
            let x0 = b.load(b.param(0), None, None, l).unwrap();
            let two = b.binary(BinOp::Mul, x0, Operand::Float(2.0), l).unwrap();
            let fi = b.cast(i, DType::F32, l).unwrap();
            let s = b.binary(BinOp::Add, two, fi, l).unwrap();
            let s = b.binary(BinOp::Add, acc[0], s, l).unwrap();
            if store_in_loop {
                let p = b.add_ptr(b.param(1), i, l).unwrap();
                b.store(p, s, None, l).unwrap();
            }
            let out = b.end_for(&[Operand::V(s)], &["acc"], l).unwrap();
            b.store(b.param(1), out[0], None, l).unwrap();
            b.finish().unwrap()
        };
        let loop_body = |f: &crate::ir::Function| {
            let l = f.walk().into_iter().find(|&v| matches!(f.inst(v).op, crate::ir::Op::For { .. })).unwrap();
            f.walk_from(&f.inst(l).op.regions()[0].body.insts)
        };
        let mut f = build(false);
        super::licm(&mut f);
        crate::ir::verify::verify(&f).unwrap();
        let inside = loop_body(&f);
        assert!(!inside.iter().any(|&v| matches!(f.inst(v).op, crate::ir::Op::Load { .. })), "{f}");
        assert!(!inside.iter().any(|&v| matches!(f.inst(v).op, crate::ir::Op::Binary(BinOp::Mul, ..))), "{f}");
        let load = f.body.insts.iter().copied().find(|&v| matches!(f.inst(v).op, crate::ir::Op::Load { .. })).unwrap();
        let crate::ir::Op::Load { mask: Some(m), .. } = f.inst(load).op else { panic!("unmasked: {f}") };
        assert!(matches!(f.inst(m).op, crate::ir::Op::Binary(BinOp::And, ..)), "{f}");
        // A loop that stores keeps its loads.
        let mut g = build(true);
        super::licm(&mut g);
        crate::ir::verify::verify(&g).unwrap();
        assert!(loop_body(&g).iter().any(|&v| matches!(g.inst(v).op, crate::ir::Op::Load { .. })), "{g}");
    }

    /// A loop of `acc = dot(dot(a, a^T) + bias + late, v, acc)`, `late` loaded under a mask
    /// computed from the first product: the bias's load moves before the first `dot`,
    /// `late`'s and the second product's operand `v` stay after it, and a store between the `dot` and the bias keeps the bias where it is.
    #[test]
    fn loads_move_before_the_dots_they_do_not_wait_for() {
        let build = |store_between: bool| {
            let l = Loc::new(1, 1);
            let params = [
                ("x", ParamKind::Ptr { elem: DType::F16, writable: false }),
                ("bias", ParamKind::Ptr { elem: DType::F32, writable: false }),
                ("y", ParamKind::Ptr { elem: DType::F32, writable: true }),
                ("n", ParamKind::Scalar(DType::I32)),
            ];
            let mut b = Builder::new("t", &params);
            let r = b.arange(0, 16, l).unwrap();
            let rows = b.expand_dims(r, 1, l).unwrap();
            let rows = b.binary(BinOp::Mul, rows, Operand::Int(16), l).unwrap();
            let cols = b.expand_dims(r, 0, l).unwrap();
            let offs = b.binary(BinOp::Add, rows, cols, l).unwrap();
            let z = b.full(&[16, 16], Operand::Float(0.0), DType::F32, l).unwrap();
            let (_, acc) = b.begin_for(Operand::Int(0), b.param(3), Operand::Int(1), &[Operand::V(z)], l).unwrap();
            let pa = b.add_ptr(b.param(0), offs, l).unwrap();
            let a = b.load(pa, None, None, l).unwrap();
            let at = b.trans(a, l).unwrap();
            let s = b.dot_call(a, at, None, None, l).unwrap();
            if store_between {
                let py = b.add_ptr(b.param(2), offs, l).unwrap();
                b.store(py, s, None, l).unwrap();
            }
            let pb = b.add_ptr(b.param(1), offs, l).unwrap();
            let bias = b.load(pb, None, None, l).unwrap();
            let m = b.cmp(crate::ir::CmpOp::Gt, s, Operand::Float(0.0), l).unwrap();
            let late = b.load(pb, Some(Operand::V(m)), Some(Operand::Float(0.0)), l).unwrap();
            let t = b.binary(BinOp::Add, s, bias, l).unwrap();
            let t = b.binary(BinOp::Add, t, late, l).unwrap();
            let v = b.load(pa, None, None, l).unwrap();
            let p16 = b.cast(t, DType::F16, l).unwrap();
            let t = b.dot_call(p16, v, Some(acc[0]), None, l).unwrap();
            let out = b.end_for(&[Operand::V(t)], &["acc"], l).unwrap();
            let py = b.add_ptr(b.param(2), offs, l).unwrap();
            b.store(py, out[0], None, l).unwrap();
            (b.finish().unwrap(), v, bias, late)
        };
        let order = |f: &crate::ir::Function| -> Vec<crate::ir::Value> {
            let l = f.walk().into_iter().find(|&v| matches!(f.inst(v).op, crate::ir::Op::For { .. })).unwrap();
            f.inst(l).op.regions()[0].body.insts.clone()
        };
        let (mut f, v, bias, late) = build(false);
        super::loads_before_dots(&mut f);
        crate::ir::verify::verify(&f).unwrap();
        let body = order(&f);
        let at = |v| body.iter().position(|&w| w == v).unwrap();
        let dot = body.iter().copied().find(|&v| matches!(f.inst(v).op, crate::ir::Op::Dot { .. })).unwrap();
        assert!(at(bias) < at(dot), "{f}");
        assert!(at(late) > at(dot), "{f}");
        assert!(at(v) > at(late), "{f}");
        let (mut g, ..) = build(true);
        let before = order(&g);
        super::loads_before_dots(&mut g);
        assert_eq!(order(&g), before, "{g}");
    }
}
