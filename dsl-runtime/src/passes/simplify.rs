//! Simplification: common-subexpression elimination, dead-code elimination, and (in
//! builds without the debug flag) removal of `device_assert` and `device_print`.
//!
//! Two instructions with the same operation, operands and type compute the same value
//! (the IR has no effects apart from stores, atomics, control flow and debug output, and
//! loads are not merged, because a store between them may change memory). A value
//! computed before a loop or branch is reused inside it, not the other way round. Values
//! that nothing with an effect depends on are removed. Constant folding happens earlier,
//! in the [builder](crate::ir::Builder). What this pass cannot do: algebraic rewrites
//! (`x * 1`, `x + 0`), which LLVM does later anyway, or hoisting loop-invariant code.

use crate::ir::{Block, Function, Op, Value};
use std::collections::HashMap;

pub fn run(f: &mut Function, debug: bool) {
    if !debug {
        strip_debug(f);
    }
    let mut body = std::mem::take(&mut f.body);
    cse(f, &mut body, &HashMap::new(), &mut HashMap::new());
    f.body = body;
    dce(f);
}

fn strip_debug(f: &mut Function) {
    let is_debug = |f: &Function, v: &Value| matches!(f.inst(*v).op, Op::Assert { .. } | Op::Print { .. });
    for v in f.walk() {
        let mut regions: Vec<Block> = f.inst(v).op.regions().iter().map(|r| r.body.clone()).collect();
        for b in &mut regions {
            b.insts.retain(|x| !is_debug(f, x));
        }
        for (r, b) in f.values[v.index()].op.regions_mut().into_iter().zip(regions) {
            r.body = b;
        }
    }
    let body: Vec<Value> = f.body.insts.iter().copied().filter(|x| !is_debug(f, x)).collect();
    f.body.insts = body;
}

fn cse(f: &mut Function, block: &mut Block, outer: &HashMap<String, Value>, replace: &mut HashMap<Value, Value>) {
    let mut seen = outer.clone();
    let mut keep = Vec::with_capacity(block.insts.len());
    for &v in &block.insts {
        let inst = &mut f.values[v.index()];
        inst.op.map_operands(|o| *replace.get(&o).unwrap_or(&o));
        if !inst.op.regions().is_empty() {
            let mut regions: Vec<Block> = inst.op.regions().iter().map(|r| r.body.clone()).collect();
            for b in &mut regions {
                cse(f, b, &seen, replace);
            }
            let inst = &mut f.values[v.index()];
            for (r, b) in inst.op.regions_mut().into_iter().zip(regions) {
                r.body = b;
                r.yields.iter_mut().for_each(|y| *y = *replace.get(y).unwrap_or(y));
            }
            keep.push(v);
            continue;
        }
        if inst.op.has_effects() || matches!(inst.op, Op::Load { .. } | Op::Result(..) | Op::Arg(..)) {
            keep.push(v);
            continue;
        }
        // Float constants compare by bits through their Debug form: 0.0 and -0.0 differ.
        let key = format!("{:?}|{:?}", inst.op, inst.ty);
        match seen.get(&key) {
            Some(&prev) => {
                replace.insert(v, prev);
            }
            None => {
                seen.insert(key, v);
                keep.push(v);
            }
        }
    }
    block.insts = keep;
}

pub(crate) fn dce(f: &mut Function) {
    let all = f.walk();
    let mut live = vec![false; f.values.len()];
    loop {
        let mut changed = false;
        for &v in &all {
            let inst = &f.values[v.index()];
            if !live[v.index()] && (inst.op.has_effects() || matches!(inst.op, Op::Param(_))) {
                live[v.index()] = true;
                changed = true;
            }
            if !live[v.index()] {
                continue;
            }
            let yields = inst.op.regions().into_iter().flat_map(|r| r.yields.iter().copied());
            for o in inst.op.operands().into_iter().chain(yields) {
                if !live[o.index()] {
                    live[o.index()] = true;
                    changed = true;
                }
            }
        }
        if !changed {
            break;
        }
    }
    retain(f, &|v| live[v.index()]);
}

/// Keep only the instructions `keep` accepts, in every block.
pub(crate) fn retain(f: &mut Function, keep: &dyn Fn(Value) -> bool) {
    f.edit_blocks(&mut |insts| insts.retain(|&v| keep(v)));
}

#[cfg(test)]
mod tests {
    use crate::ir::{BinOp, Builder, Loc, Operand, ParamKind};
    use crate::DType;

    #[test]
    fn duplicate_and_dead_values_go() {
        let mut b = Builder::new("t", &[("y", ParamKind::Ptr { elem: DType::I32, writable: true })]);
        let l = Loc::new(1, 1);
        let a1 = b.arange(0, 64, l).unwrap();
        let a2 = b.arange(0, 64, l).unwrap();
        let _dead = b.binary(BinOp::Mul, a1, Operand::Int(3), l).unwrap();
        let s = b.binary(BinOp::Add, a1, a2, l).unwrap();
        let p = b.add_ptr(b.param(0), a2, l).unwrap();
        b.store(p, s, None, l).unwrap();
        let mut f = b.finish().unwrap();
        super::run(&mut f, false);
        crate::ir::verify::verify(&f).unwrap();
        let text = f.to_string();
        assert_eq!(text.matches("arange").count(), 1, "{text}");
        assert!(!text.contains("mul"), "{text}");
    }

    #[test]
    fn values_before_a_loop_are_reused_inside_and_debug_ops_go() {
        let mut b = Builder::new("t", &[("y", ParamKind::Ptr { elem: DType::I32, writable: true }), ("n", ParamKind::Scalar(DType::I32))]);
        let l = Loc::new(1, 1);
        let a1 = b.arange(0, 64, l).unwrap();
        let z = b.full(&[64], Operand::Int(0), DType::I32, l).unwrap();
        let (i, acc) = b.begin_for(Operand::Int(0), b.param(1), Operand::Int(1), &[Operand::V(z)], l).unwrap();
        let a2 = b.arange(0, 64, l).unwrap();
        let m = b.cmp(crate::ir::CmpOp::Lt, a2, i, l).unwrap();
        b.assert(m, "in range", l).unwrap();
        let s = b.binary(BinOp::Add, acc[0], a2, l).unwrap();
        let out = b.end_for(&[Operand::V(s)], &["acc"], l).unwrap();
        let p = b.add_ptr(b.param(0), a1, l).unwrap();
        b.store(p, out[0], None, l).unwrap();
        let mut f = b.finish().unwrap();
        let mut g = f.clone();
        super::run(&mut f, false);
        crate::ir::verify::verify(&f).unwrap();
        let text = f.to_string();
        assert_eq!(text.matches("arange").count(), 1, "{text}");
        assert!(!text.contains("assert"), "{text}");
        super::run(&mut g, true);
        assert!(g.to_string().contains("assert"));
    }
}
