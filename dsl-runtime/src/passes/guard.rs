//! The bounds guard: makes a launch memory-safe whatever the kernel's masks say.
//!
//! For every pointer parameter `p` it adds a hidden parameter `p.len` (the buffer's
//! element count, passed by the launcher), and for every `load`, `store` and atomic
//! (inside loops and branches too) through a pointer derived from `p` it ANDs the mask
//! with `offset <u p.len` (unsigned, so negative offsets are out of bounds).
//!
//! The offset is the one the kernel added to `p`, read off the pointer's definition
//! ([`offset_of`]: the `add_ptr` offsets along its chain of splats, broadcasts and
//! reshapes), not recomputed from the address: one compare per access where the kernel
//! added a single `i32` offset, which is compared with `min(p.len, 2^31)` as `u32` (exact:
//! a negative offset is 2^31 or more as `u32`). Several offsets are summed in `i64`, as
//! the addresses are; a pointer carried by a loop falls back to `ptr_offset(ptr)`, the
//! distance of its address from `p`'s.
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
        let loc = Loc::default();
        let len = f.push(Op::Param(idx), Type::scalar(DType::I64), loc);
        // `min(len, 2^31)` as `u32`, for `i32` offsets (removed again where none is one).
        let cap = f.push(Op::Const(ConstVal::Int(1 << 31)), Type::scalar(DType::I64), loc);
        let capped = f.push(Op::Binary(BinOp::Min, len, cap), Type::scalar(DType::I64), loc);
        let len32 = f.push(Op::Cast(capped), Type::scalar(DType::I32), loc);
        prologue.extend([len, cap, capped, len32]);
        len_value.insert(p, Lens { len, len32 });
    }
    let old = std::mem::take(&mut f.body);
    let mut body = guard_block(f, old, &len_value, checked)?;
    prologue.append(&mut body.insts);
    f.body.insts = prologue;
    Ok(())
}

fn guard_block(f: &mut Function, old: Block, len_value: &HashMap<u32, Lens>, checked: bool) -> Result<Block, BuildError> {
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
        let emit = |f: &mut Function, body: &mut Vec<Value>, op: Op, ty: Type| {
            let x = f.push(op, ty, loc);
            body.push(x);
            x
        };
        let offset = match offset_of(f, ptr, &mut body) {
            Some(Some(o)) => o,
            Some(None) => emit(f, &mut body, Op::Const(ConstVal::Int(0)), Type::scalar(DType::I64)),
            None => emit(f, &mut body, Op::PtrOffset(ptr), Type::block(DType::I64, shape.clone())),
        };
        let lens = len_value[&root];
        let (mut offset, mut len) = match f.ty(offset).dtype {
            DType::I32 if !checked => (offset, lens.len32),
            DType::I64 => (offset, lens.len),
            _ => (emit(f, &mut body, Op::Cast(offset), Type::block(DType::I64, shape.clone())), lens.len),
        };
        if !shape.is_empty() {
            let d = f.ty(len).dtype;
            len = emit(f, &mut body, Op::Splat(len), Type::block(d, shape.clone()));
        }
        if f.ty(offset).shape != shape {
            // A zero offset of a block pointer is a scalar constant.
            offset = emit(f, &mut body, Op::Splat(offset), Type::block(DType::I64, shape.clone()));
        }
        if checked {
            emit(f, &mut body, Op::BoundsCheck { access, param: root, offset, len, mask }, Type::unit());
        }
        let in_bounds = emit(f, &mut body, Op::Cmp(CmpOp::ULt, offset, len), Type::block(DType::Bool, shape.clone()));
        let new_mask = match mask {
            None => in_bounds,
            Some(m) => emit(f, &mut body, Op::Binary(BinOp::And, m, in_bounds), Type::block(DType::Bool, shape.clone())),
        };
        let elem = f.ty(ptr).dtype;
        let needs_other = matches!(f.inst(v).op, Op::Load { other: None, .. });
        let zero_other = if needs_other {
            let c = if elem.is_float() { ConstVal::Float(0.0) } else { ConstVal::Int(0) };
            let z = emit(f, &mut body, Op::Const(c), Type::scalar(elem));
            Some(if shape.is_empty() { z } else { emit(f, &mut body, Op::Splat(z), Type::block(elem, shape.clone())) })
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

/// A pointer parameter's length, and `min(len, 2^31)` as `i32` (compared unsigned).
#[derive(Clone, Copy)]
struct Lens {
    len: Value,
    len32: Value,
}

/// The element offset of `ptr` from its parameter, as IR appended to `body`: the offsets
/// added along its definition (`add_ptr`s, through splats, broadcasts, dimension changes),
/// reshaped as the pointer was. A single offset keeps its type (so an `i32` offset is
/// compared in 32 bits); several are summed in `i64`, as the addresses are. `Some(None)`:
/// the parameter itself (offset 0). `None`: the chain holds something else (a pointer
/// carried by a loop or chosen by a branch), whose offset only its address tells.
pub fn offset_of(f: &mut Function, ptr: Value, body: &mut Vec<Value>) -> Option<Option<Value>> {
    let inst = f.inst(ptr).clone();
    let emit = |f: &mut Function, body: &mut Vec<Value>, op: Op, ty: Type| {
        let x = f.push(op, ty, inst.loc);
        body.push(x);
        x
    };
    match inst.op {
        Op::Param(_) => Some(None),
        Op::AddPtr(p, o) => Some(Some(match offset_of(f, p, body)? {
            None => o,
            Some(q) => {
                let ty = Type::block(DType::I64, inst.ty.shape.clone());
                let wide = |f: &mut Function, body: &mut Vec<Value>, x: Value| match f.ty(x).dtype {
                    DType::I64 => x,
                    _ => emit(f, body, Op::Cast(x), ty.clone()),
                };
                let (q, o) = (wide(f, body, q), wide(f, body, o));
                emit(f, body, Op::Binary(BinOp::Add, q, o), ty.clone())
            }
        })),
        Op::Splat(x) | Op::ExpandDims(x, _) | Op::Broadcast(x) | Op::Permute(x, _) | Op::Reshape(x) => match offset_of(f, x, body)? {
            None => Some(None),
            Some(o) => {
                let mut op = inst.op.clone();
                op.map_operands(|_| o);
                let d = f.ty(o).dtype;
                Some(Some(emit(f, body, op, Type::block(d, inst.ty.shape.clone()))))
            }
        },
        _ => None,
    }
}
