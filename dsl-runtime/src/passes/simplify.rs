//! Simplification: common-subexpression elimination and dead-code elimination.
//!
//! Two instructions with the same operation, operands and type compute the same value
//! (the IR has no effects apart from stores, and loads are not merged, because a store
//! between them may change memory). Values that no store depends on are removed.
//! Constant folding happens earlier, in the [builder](crate::ir::Builder). What this pass
//! cannot do: algebraic rewrites (`x * 1`, `x + 0`), which LLVM does later anyway.

use crate::ir::{Function, Op, Value};
use std::collections::HashMap;

pub fn run(f: &mut Function) {
    cse(f);
    dce(f);
}

fn cse(f: &mut Function) {
    let mut seen: HashMap<String, Value> = HashMap::new();
    let mut replace: HashMap<Value, Value> = HashMap::new();
    let body = f.body.insts.clone();
    for v in body {
        let inst = &mut f.values[v.index()];
        inst.op.map_operands(|o| *replace.get(&o).unwrap_or(&o));
        if inst.op.has_effects() || matches!(inst.op, Op::Load { .. }) {
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
            }
        }
    }
    f.body.insts.retain(|v| !replace.contains_key(v));
}

fn dce(f: &mut Function) {
    let mut live = vec![false; f.values.len()];
    for &v in f.body.insts.iter().rev() {
        let inst = &f.values[v.index()];
        if inst.op.has_effects() || matches!(inst.op, Op::Param(_)) {
            live[v.index()] = true;
        }
        if live[v.index()] {
            for o in inst.op.operands() {
                live[o.index()] = true;
            }
        }
    }
    f.body.insts.retain(|v| live[v.index()]);
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
        super::run(&mut f);
        crate::ir::verify::verify(&f).unwrap();
        let text = f.to_string();
        assert_eq!(text.matches("arange").count(), 1, "{text}");
        assert!(!text.contains("mul"), "{text}");
    }
}
