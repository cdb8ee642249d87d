//! The verifier: checks the rules of the [IR specification](super) and reports the first
//! violation at the offending instruction's source location. It runs after the builder
//! and after every pass, so a pass that breaks the IR is caught where it happened.

use super::{Function, Op, ParamKind, Type};
use crate::error::BuildError;
use crate::DType;

pub fn verify(f: &Function) -> Result<(), BuildError> {
    let mut defined = vec![false; f.values.len()];
    for &v in &f.body.insts {
        let inst = f.inst(v);
        let fail = |m: String| Err(BuildError::new(inst.loc, format!("invalid IR at %{}: {m}", v.0)));
        for o in inst.op.operands() {
            if o.index() >= defined.len() || !defined[o.index()] {
                return fail(format!("operand %{} is used before it is defined", o.0));
            }
            if f.ty(o).unit {
                return fail(format!("operand %{} has no value", o.0));
            }
        }
        for &d in &inst.ty.shape {
            if !d.is_power_of_two() {
                return fail(format!("block dimension {d} is not a power of two"));
            }
        }
        let ty = |x| f.ty(x);
        let same_shape = |a: &Type, b: &Type| a.shape == b.shape;
        match inst.op {
            Op::Param(i) => {
                let Some(p) = f.params.get(i as usize) else { return fail(format!("no parameter {i}")) };
                if p.ty() != inst.ty {
                    return fail(format!("parameter {i} has type {}, not {}", p.ty(), inst.ty));
                }
            }
            Op::Const(_) | Op::ProgramId(_) | Op::NumPrograms(_) => {
                if !inst.ty.is_scalar() {
                    return fail("must be a scalar".into());
                }
            }
            Op::Arange { start, end } => {
                if inst.ty != Type::block(DType::I32, vec![(end - start) as usize]) {
                    return fail("arange must be a 1-D i32 block of its length".into());
                }
            }
            Op::Splat(x) => {
                if !ty(x).is_scalar() || ty(x).with_shape(inst.ty.shape.clone()) != inst.ty {
                    return fail("splat takes a scalar of the result's element type".into());
                }
            }
            Op::Binary(_, a, b) => {
                if ty(a) != ty(b) || *ty(a) != inst.ty || inst.ty.ptr {
                    return fail(format!("binary operands {} and {} must match the result {}", ty(a), ty(b), inst.ty));
                }
            }
            Op::Cmp(_, a, b) => {
                if ty(a) != ty(b) || inst.ty != Type::block(DType::Bool, ty(a).shape.clone()) {
                    return fail("comparison operands must match and give a mask of their shape".into());
                }
            }
            Op::Unary(_, a) => {
                if *ty(a) != inst.ty {
                    return fail("unary operand must have the result's type".into());
                }
            }
            Op::Select(c, a, b) => {
                if ty(c).dtype != DType::Bool || !same_shape(ty(c), ty(a)) || ty(a) != ty(b) || *ty(a) != inst.ty {
                    return fail("select needs a mask and two operands of the result's type, all of one shape".into());
                }
            }
            Op::Cast(a) => {
                if ty(a).ptr || inst.ty.ptr || !same_shape(ty(a), &inst.ty) {
                    return fail("cast keeps the shape and takes no pointers".into());
                }
            }
            Op::AddPtr(p, o) => {
                if !ty(p).ptr || !ty(o).dtype.is_int() || ty(o).ptr || !same_shape(ty(p), ty(o)) || *ty(p) != inst.ty {
                    return fail("add_ptr takes pointers and integer offsets of one shape".into());
                }
                if f.pointer_root(p).is_none() {
                    return fail("pointer does not derive from a pointer parameter".into());
                }
            }
            Op::Load { ptr, mask, other } => {
                let pt = ty(ptr);
                if !pt.ptr || inst.ty != Type::block(pt.dtype, pt.shape.clone()) {
                    return fail("load takes pointers and gives their pointee type in their shape".into());
                }
                if mask.is_some_and(|m| *ty(m) != Type::block(DType::Bool, pt.shape.clone())) {
                    return fail("load mask must be a bool block of the pointers' shape".into());
                }
                if other.is_some_and(|o| *ty(o) != inst.ty) {
                    return fail("load `other` must have the loaded type".into());
                }
            }
            Op::Store { ptr, value, mask } => {
                let pt = ty(ptr);
                if !pt.ptr || *ty(value) != Type::block(pt.dtype, pt.shape.clone()) {
                    return fail(format!("store of {} through {}", ty(value), pt));
                }
                if mask.is_some_and(|m| *ty(m) != Type::block(DType::Bool, pt.shape.clone())) {
                    return fail("store mask must be a bool block of the pointers' shape".into());
                }
                match f.pointer_root(ptr).map(|i| f.params[i as usize].kind) {
                    Some(ParamKind::Ptr { writable: true, .. }) => {}
                    _ => return fail("store through a pointer that is not a writable parameter".into()),
                }
            }
        }
        defined[v.index()] = true;
    }
    Ok(())
}
