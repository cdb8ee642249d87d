//! The bounds guard: makes a launch memory-safe whatever the kernel's masks say.
//!
//! For every pointer parameter `p` it adds a hidden parameter `p.len` (the buffer's
//! element count, passed by the launcher), and for every `load`, `store` and atomic
//! (inside loops and branches too) through a pointer derived from `p` it ANDs the mask
//! with `ptr_offset(ptr) <u p.len` (unsigned, so negative offsets are out of bounds).
//! Lanes that fail the guard behave as masked-off lanes: loads give `other`, stores do
//! nothing. Because the guard is ordinary IR, the [axis analysis](super::axis_info) sees
//! it: with the length divisible by 16 (a specialization) the guard is constant over
//! aligned runs of 16 and vector accesses survive.
//!
//! Checked launches (debug builds: `RUTILE_DEBUG=1` or `LaunchConfig::debug`) also put a
//! [`BoundsCheck`](crate::ir::Op::BoundsCheck) before each access: the first lane of the
//! launch whose own mask is true but that is out of bounds is recorded on the device, and
//! the launcher returns it as the same error the interpreter gives (which runs the
//! unguarded IR and checks every access itself). Without the check a guarded launch masks
//! such lanes silently.

use crate::error::BuildError;
use crate::ir::{Access, BinOp, Block, CmpOp, ConstVal, Function, Inst, Loc, Op, Param, ParamKind, ParamSpec, Type, Value};
use std::collections::HashMap;
use crate::DType;

pub fn run(f: &mut Function, len_specs: &[ParamSpec], checked: bool) -> Result<(), BuildError> {
    // Hidden length parameters, one per pointer parameter, in parameter order.
    let ptr_params: Vec<u32> =
        (0..f.params.len() as u32).filter(|&i| matches!(f.params[i as usize].kind, ParamKind::Ptr { .. })).collect();
    if len_specs.len() != ptr_params.len() {
        return Err(BuildError::new(Loc::default(), format!("{} length specs for {} pointers", len_specs.len(), ptr_params.len())));
    }
    let mut len_value = HashMap::new();
    let mut prologue = vec![];
    for (&p, spec) in ptr_params.iter().zip(len_specs) {
        let name = format!("{}.len", f.params[p as usize].name);
        f.params.push(Param { name, kind: ParamKind::Len { of: p }, spec: *spec });
        let idx = f.params.len() as u32 - 1;
        let v = f.push(Op::Param(idx), Type::scalar(DType::I64), Loc::default());
        prologue.push(v);
        len_value.insert(p, v);
    }
    let old = std::mem::take(&mut f.body);
    let mut body = guard_block(f, old, &len_value, checked)?;
    prologue.append(&mut body.insts);
    f.body.insts = prologue;
    Ok(())
}

fn guard_block(f: &mut Function, old: Block, len_value: &HashMap<u32, Value>, checked: bool) -> Result<Block, BuildError> {
    let mut body = Vec::with_capacity(old.insts.len());
    for v in old.insts {
        // Nested regions first.
        let regions: Vec<Block> = f.inst(v).op.regions().iter().map(|r| r.body.clone()).collect();
        if !regions.is_empty() {
            let mut new = vec![];
            for b in regions {
                new.push(guard_block(f, b, len_value, checked)?);
            }
            for (r, b) in f.values[v.index()].op.regions_mut().into_iter().zip(new) {
                r.body = b;
            }
        }
        let (ptr, mask, access) = match f.inst(v).op {
            Op::Load { ptr, mask, .. } => (ptr, mask, Access::Load),
            Op::Store { ptr, mask, .. } => (ptr, mask, Access::Store),
            Op::Atomic { ptr, mask, .. } => (ptr, mask, Access::Atomic),
            _ => {
                body.push(v);
                continue;
            }
        };
        let loc = f.inst(v).loc;
        let shape = f.ty(ptr).shape.clone();
        let root = f.pointer_root(ptr).ok_or_else(|| BuildError::new(loc, "pointer does not derive from a parameter"))?;
        let mut emit = |f: &mut Function, op: Op, ty: Type| {
            let x = f.push(op, ty, loc);
            body.push(x);
            x
        };
        let offset = emit(f, Op::PtrOffset(ptr), Type::block(DType::I64, shape.clone()));
        let mut len = len_value[&root];
        if !shape.is_empty() {
            len = emit(f, Op::Splat(len), Type::block(DType::I64, shape.clone()));
        }
        if checked {
            emit(f, Op::BoundsCheck { access, param: root, offset, len, mask }, Type::unit());
        }
        let in_bounds = emit(f, Op::Cmp(CmpOp::ULt, offset, len), Type::block(DType::Bool, shape.clone()));
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
            Op::Store { mask, .. } | Op::Atomic { mask, .. } => *mask = Some(new_mask),
            _ => unreachable!(),
        }
        body.push(v);
    }
    Ok(Block { insts: body })
}
