//! The bounds guard: makes a launch memory-safe whatever the kernel's masks say.
//!
//! For every pointer parameter `p` it adds a hidden parameter `p.len` (the buffer's
//! element count, passed by the launcher), and for every `load`/`store` through a pointer
//! derived from `p` by `p + o1 + o2 + ...` it ANDs the mask with
//! `(o1 + o2 + ...) as i64 <u p.len` (unsigned, so negative offsets are out of bounds).
//! Lanes that fail the guard behave as masked-off lanes: loads give `other`, stores do
//! nothing. Because the guard is ordinary IR, the [axis analysis](super::axis_info) sees
//! it: with the length divisible by 16 (a specialization) the guard is constant over
//! aligned runs of 16 and vector accesses survive.
//!
//! What it cannot do: report that a lane was out of bounds. The interpreter, which runs
//! the unguarded IR, reports such accesses as errors.

use crate::error::BuildError;
use crate::ir::{BinOp, CmpOp, ConstVal, Function, Inst, Loc, Op, Param, ParamKind, ParamSpec, Type, Value};
use crate::DType;

pub fn run(f: &mut Function, len_specs: &[ParamSpec]) -> Result<(), BuildError> {
    // Hidden length parameters, one per pointer parameter, in parameter order.
    let ptr_params: Vec<u32> =
        (0..f.params.len() as u32).filter(|&i| matches!(f.params[i as usize].kind, ParamKind::Ptr { .. })).collect();
    if len_specs.len() != ptr_params.len() {
        return Err(BuildError::new(Loc::default(), format!("{} length specs for {} pointers", len_specs.len(), ptr_params.len())));
    }
    let mut len_value = std::collections::HashMap::new();
    let mut prologue = vec![];
    for (&p, spec) in ptr_params.iter().zip(len_specs) {
        let name = format!("{}.len", f.params[p as usize].name);
        f.params.push(Param { name, kind: ParamKind::Len { of: p }, spec: *spec });
        let idx = f.params.len() as u32 - 1;
        let v = f.push(Op::Param(idx), Type::scalar(DType::I64), Loc::default());
        prologue.push(v);
        len_value.insert(p, v);
    }
    let old = std::mem::take(&mut f.body.insts);
    let mut body = prologue;
    for v in old {
        let (ptr, mask) = match f.inst(v).op {
            Op::Load { ptr, mask, .. } | Op::Store { ptr, mask, .. } => (ptr, mask),
            _ => {
                body.push(v);
                continue;
            }
        };
        let loc = f.inst(v).loc;
        let shape = f.ty(ptr).shape.clone();
        let (root, offsets) = f.pointer_offsets(ptr).ok_or_else(|| BuildError::new(loc, "pointer does not derive from a parameter"))?;
        let mut emit = |f: &mut Function, op: Op, ty: Type| {
            let x = f.push(op, ty, loc);
            body.push(x);
            x
        };
        // Sum of offsets in i64, at the access's shape.
        let mut total: Option<Value> = None;
        for o in offsets {
            let ot = f.ty(o).clone();
            let mut x = if ot.dtype == DType::I64 { o } else { emit(f, Op::Cast(o), Type::block(DType::I64, ot.shape.clone())) };
            if ot.shape != shape {
                x = emit(f, Op::Splat(x), Type::block(DType::I64, shape.clone()));
            }
            total = Some(match total {
                None => x,
                Some(t) => emit(f, Op::Binary(BinOp::Add, t, x), Type::block(DType::I64, shape.clone())),
            });
        }
        let total = match total {
            Some(t) => t,
            None => {
                let z = emit(f, Op::Const(ConstVal::Int(0)), Type::scalar(DType::I64));
                if shape.is_empty() { z } else { emit(f, Op::Splat(z), Type::block(DType::I64, shape.clone())) }
            }
        };
        let mut len = len_value[&root];
        if !shape.is_empty() {
            len = emit(f, Op::Splat(len), Type::block(DType::I64, shape.clone()));
        }
        let in_bounds = emit(f, Op::Cmp(CmpOp::ULt, total, len), Type::block(DType::Bool, shape.clone()));
        let new_mask = match mask {
            None => in_bounds,
            Some(m) => emit(f, Op::Binary(BinOp::And, m, in_bounds), Type::block(DType::Bool, shape.clone())),
        };
        let elem = f.ty(ptr).dtype;
        let needs_other = matches!(f.inst(v).op, Op::Load { other: None, .. });
        let zero_other = if needs_other {
            let c = if elem.is_float() { ConstVal::Float(0.0) } else { ConstVal::Int(0) };
            let z = emit(f, Op::Const(c), Type::scalar(elem));
            Some(if shape.is_empty() { z } else { emit(f, Op::Splat(z), Type::block(elem, shape.clone())) })
        } else {
            None
        };
        let Inst { op, .. } = &mut f.values[v.index()];
        match op {
            Op::Load { mask, other, .. } => {
                *mask = Some(new_mask);
                if other.is_none() {
                    *other = zero_other;
                }
            }
            Op::Store { mask, .. } => *mask = Some(new_mask),
            _ => unreachable!(),
        }
        body.push(v);
    }
    f.body.insts = body;
    Ok(())
}
