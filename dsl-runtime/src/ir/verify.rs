//! The verifier: checks the rules of the [IR specification](super) and reports the first
//! violation at the offending instruction's source location. It runs after the builder
//! and after every pass, so a pass that breaks the IR is caught where it happened.

use super::{Block, Function, Op, ParamKind, Region, Type, Value};
use super::BuildError;
use crate::DType;

pub fn verify(f: &Function) -> Result<(), BuildError> {
    let mut defined = vec![false; f.values.len()];
    block(f, &f.body, &mut defined)
}

/// Verify `b`; values it defines are visible only until it ends.
fn block(f: &Function, b: &Block, defined: &mut [bool]) -> Result<(), BuildError> {
    let mut here = vec![];
    for &v in &b.insts {
        inst(f, v, defined)?;
        defined[v.index()] = true;
        here.push(v);
    }
    for v in here {
        defined[v.index()] = false;
    }
    Ok(())
}

fn region(f: &Function, owner: Value, r: &Region, want: &[Type], defined: &mut [bool]) -> Result<(), BuildError> {
    let loc = f.inst(owner).loc;
    let fail = |m: String| Err(BuildError::new(loc, format!("invalid IR at %{}: {m}", owner.0)));
    for &a in &r.args {
        defined[a.index()] = true;
    }
    let mut here = vec![];
    for &v in &r.body.insts {
        inst(f, v, defined)?;
        defined[v.index()] = true;
        here.push(v);
    }
    if r.yields.len() != want.len() {
        return fail(format!("region yields {} values, expected {}", r.yields.len(), want.len()));
    }
    for (&y, t) in r.yields.iter().zip(want) {
        if !defined[y.index()] {
            return fail(format!("yield %{} is not defined in or before the region", y.0));
        }
        if f.ty(y) != t {
            return fail(format!("yield %{} has type {}, expected {t}", y.0, f.ty(y)));
        }
    }
    for v in here.into_iter().chain(r.args.iter().copied()) {
        defined[v.index()] = false;
    }
    Ok(())
}

fn inst(f: &Function, v: Value, defined: &mut [bool]) -> Result<(), BuildError> {
    let inst = f.inst(v);
    let fail = |m: String| Err(BuildError::new(inst.loc, format!("invalid IR at %{}: {m}", v.0)));
    for o in inst.op.operands() {
        if o.index() >= defined.len() || !defined[o.index()] {
            return fail(format!("operand %{} is used before it is defined", o.0));
        }
        // (A by-value parameter's value is a unit: only a TMA copy takes it, as its map.)
        if f.ty(o).unit && !matches!(inst.op, Op::Result(..)) && !matches!(inst.op, Op::TmaCopy { map, .. } | Op::TmaStore { map, .. } if map == o) {
            return fail(format!("operand %{} has no value", o.0));
        }
    }
    // A shared-memory buffer is only ever the buffer of a `local_store` or `local_load`: not
    // carried by a loop, yielded, selected or computed with.
    for o in inst.op.operands() {
        let as_buffer = matches!(inst.op, Op::LocalLoad(b) | Op::LocalStore { buf: b, .. } | Op::LocalSlot { buf: b, .. } | Op::LocalTrans(b) | Op::AsyncCopy { dst: b, .. } | Op::MbarInit { bars: b, .. } | Op::MbarWait { bars: b, .. } | Op::MbarArrive { bars: b, .. } if b == o)
            || matches!(inst.op, Op::TmaCopy { dst, bars, .. } if o == dst || o == bars)
            || matches!(inst.op, Op::TmaStore { src, .. } if o == src);
        if f.ty(o).shared && !as_buffer {
            return fail(format!("shared-memory buffer %{} used as a value (only local_store, local_load, local_slot, local_trans, async_copy, tma_copy, tma_store and the mbarrier operations take buffers)", o.0));
        }
    }
    for r in inst.op.regions() {
        if let Some(&y) = r.yields.iter().find(|&&y| f.ty(y).shared) {
            return fail(format!("shared-memory buffer %{} yielded from a region", y.0));
        }
    }
    let ty = |x| f.ty(x);
    let same_shape = |a: &Type, b: &Type| a.shape == b.shape;
    let mask_ok = |m: Option<Value>, shape: &[usize]| m.is_none_or(|m| *ty(m) == Type::block(DType::Bool, shape.to_vec()));
    match &inst.op {
        Op::Param(i) => {
            let Some(p) = f.params.get(*i as usize) else { return fail(format!("no parameter {i}")) };
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
            if !ty(*x).is_scalar() || ty(*x).with_shape(inst.ty.shape.clone()) != inst.ty {
                return fail("splat takes a scalar of the result's element type".into());
            }
        }
        Op::Binary(_, a, b) => {
            if ty(*a) != ty(*b) || *ty(*a) != inst.ty || inst.ty.ptr {
                return fail(format!("binary operands {} and {} must match the result {}", ty(*a), ty(*b), inst.ty));
            }
        }
        Op::Cmp(_, a, b) => {
            if ty(*a) != ty(*b) || inst.ty != Type::block(DType::Bool, ty(*a).shape.clone()) {
                return fail("comparison operands must match and give a mask of their shape".into());
            }
        }
        Op::Unary(_, a) => {
            if *ty(*a) != inst.ty {
                return fail("unary operand must have the result's type".into());
            }
        }
        Op::Select(c, a, b) => {
            if ty(*c).dtype != DType::Bool || !same_shape(ty(*c), ty(*a)) || ty(*a) != ty(*b) || *ty(*a) != inst.ty {
                return fail("select needs a mask and two operands of the result's type, all of one shape".into());
            }
        }
        Op::Fma(a, b, c) => {
            if ty(*a) != ty(*b) || ty(*a) != ty(*c) || *ty(*a) != inst.ty || !inst.ty.dtype.is_float() || inst.ty.ptr {
                return fail("fma needs three float operands of the result's type".into());
            }
        }
        Op::Cast(a) => {
            if ty(*a).ptr || inst.ty.ptr || !same_shape(ty(*a), &inst.ty) {
                return fail("cast keeps the shape and takes no pointers".into());
            }
        }
        Op::ExpandDims(a, axis) => {
            let mut s = ty(*a).shape.clone();
            if (*axis as usize) > s.len() || s.is_empty() {
                return fail("expand_dims axis out of range".into());
            }
            s.insert(*axis as usize, 1);
            if ty(*a).with_shape(s) != inst.ty {
                return fail("expand_dims inserts one dimension of size 1".into());
            }
        }
        Op::Broadcast(a) => {
            let (s, r) = (&ty(*a).shape, &inst.ty.shape);
            if s.len() != r.len() || s.iter().zip(r).any(|(&x, &y)| x != y && x != 1) || ty(*a).with_shape(r.clone()) != inst.ty {
                return fail(format!("broadcast from {} to {} (same rank, dimensions equal or 1)", ty(*a), inst.ty));
            }
        }
        Op::Permute(a, perm) => {
            let s = &ty(*a).shape;
            let mut sorted: Vec<usize> = perm.iter().map(|&p| p as usize).collect();
            sorted.sort();
            if sorted != (0..s.len()).collect::<Vec<_>>() || ty(*a).with_shape(perm.iter().map(|&p| s[p as usize]).collect()) != inst.ty {
                return fail("permute needs a permutation of the operand's dimensions".into());
            }
        }
        Op::Reshape(a) => {
            if ty(*a).numel() != inst.ty.numel() || ty(*a).with_shape(inst.ty.shape.clone()) != inst.ty {
                return fail("reshape keeps the element count and type".into());
            }
            if ty(*a).shape.iter().chain(&inst.ty.shape).any(|d| !d.is_power_of_two()) {
                return fail("reshape needs power-of-two dimensions".into());
            }
        }
        Op::Reduce { op, x, axis } => {
            let mut s = ty(*x).shape.clone();
            if *axis as usize >= s.len() || ty(*x).ptr {
                return fail("reduce axis out of range".into());
            }
            s.remove(*axis as usize);
            let d = if op.is_arg() { DType::I32 } else { ty(*x).dtype };
            if inst.ty != Type::block(d, s) {
                return fail(format!("reduce of {} along {axis} gives {}", ty(*x), inst.ty));
            }
        }
        Op::Scan { x, axis, .. } => {
            if *axis as usize >= ty(*x).shape.len() || *ty(*x) != inst.ty || inst.ty.ptr {
                return fail("scan keeps the type and needs an existing axis".into());
            }
        }
        Op::AddPtr(p, o) => {
            if !ty(*p).ptr || !ty(*o).dtype.is_int() || ty(*o).ptr || !same_shape(ty(*p), ty(*o)) || *ty(*p) != inst.ty {
                return fail("add_ptr takes pointers and integer offsets of one shape".into());
            }
            if f.pointer_root(*p).is_none() {
                return fail("pointer does not derive from a pointer parameter".into());
            }
        }
        Op::PtrOffset(p) => {
            if !ty(*p).ptr || inst.ty != Type::block(DType::I64, ty(*p).shape.clone()) || f.pointer_root(*p).is_none() {
                return fail("ptr_offset takes a pointer derived from a parameter and gives i64 offsets".into());
            }
        }
        Op::Dot { a, b, acc, .. } => {
            let (ta, tb, tc) = (ty(*a), ty(*b), ty(*acc));
            let ok = ta.shape.len() == 2
                && tb.shape.len() == 2
                && ta.shape[1] == tb.shape[0]
                && ta.dtype == tb.dtype
                && *tc == Type::block(DType::F32, vec![ta.shape[0], tb.shape[1]])
                && inst.ty == *tc;
            if !ok {
                return fail(format!("dot of {ta} and {tb} with {tc} gives {}", inst.ty));
            }
        }
        Op::ConvertLayout(x) => {
            if *ty(*x) != inst.ty {
                return fail(format!("convert_layout of {} gives {}", ty(*x), inst.ty));
            }
        }
        Op::LocalAlloc(init) => {
            if !inst.ty.shared || inst.ty.shape.is_empty() {
                return fail("local_alloc gives a shared-memory buffer for a block".into());
            }
            if init.is_some_and(|i| *ty(i) != Type::block(inst.ty.dtype, inst.ty.shape.clone())) {
                return fail(format!("local_alloc of {} initialised with {}", inst.ty, ty(init.unwrap())));
            }
        }
        Op::LocalStore { buf, value } => {
            let bt = ty(*buf);
            if !bt.shared || *ty(*value) != Type::block(bt.dtype, bt.shape.clone()) || !inst.ty.unit {
                return fail(format!("local_store of {} into {}", ty(*value), bt));
            }
        }
        Op::LocalLoad(buf) => {
            let bt = ty(*buf);
            if !bt.shared || inst.ty != Type::block(bt.dtype, bt.shape.clone()) {
                return fail(format!("local_load of {} gives {}", bt, inst.ty));
            }
        }
        Op::LocalSlot { buf, slot } => {
            let (bt, st) = (ty(*buf), ty(*slot));
            if !bt.shared || bt.shape.len() < 2 || !st.is_scalar() || !st.dtype.is_int() || !inst.ty.shared || inst.ty.dtype != bt.dtype || inst.ty.shape != bt.shape[1..] {
                return fail(format!("local_slot %{} of {} gives {}", slot.0, bt, inst.ty));
            }
        }
        Op::LocalTrans(buf) => {
            let bt = ty(*buf);
            if !bt.shared || bt.shape.len() != 2 || !inst.ty.shared || inst.ty.dtype != bt.dtype || inst.ty.shape != [bt.shape[1], bt.shape[0]] {
                return fail(format!("local_trans of {} gives {}", bt, inst.ty));
            }
        }
        Op::AsyncCopy { dst, ptr, mask } => {
            let (dt, pt) = (ty(*dst), ty(*ptr));
            if !dt.shared || !pt.ptr || pt.dtype != dt.dtype || pt.shape != dt.shape || !inst.ty.unit {
                return fail(format!("async_copy of {} into {}", pt, dt));
            }
            if !mask_ok(*mask, &pt.shape) {
                return fail("async_copy mask must be a bool block of the pointers' shape".into());
            }
        }
        Op::TmaCopy { dst, map, coords, bars, slot, on, tile } => {
            let (dt, bt) = (ty(*dst), ty(*bars));
            let scalar_int = |v: Value| ty(v).is_scalar() && ty(v).dtype.is_int() && !ty(v).ptr;
            if !dt.shared || dt.shape.len() != 2 || tile.inner > 1 || dt.dtype != tile.elem || !inst.ty.unit {
                return fail(format!("tma_copy into {dt}"));
            }
            if !matches!(f.inst(*map).op, Op::Param(i) if matches!(f.params[i as usize].kind, ParamKind::Bytes { size: 128, align: 64 })) {
                return fail("tma_copy's map must be a 128-byte parameter aligned to 64".into());
            }
            if !matches!(f.params.get(tile.ptr as usize).map(|p| p.kind), Some(ParamKind::Ptr { elem, .. }) if elem == tile.elem) {
                return fail(format!("tma_copy reads parameter {}, not a pointer to {}", tile.ptr, tile.elem));
            }
            if coords.len() != 2 + tile.batch_strides().count() || !coords.iter().all(|&c| scalar_int(c)) || !scalar_int(*slot) || *ty(*on) != Type::scalar(DType::Bool) || !bt.shared || bt.dtype != DType::I64 || bt.shape.len() != 1 {
                return fail("tma_copy takes integer coordinates and slot, a bool `on` and an i64 buffer of barriers".into());
            }
        }
        Op::TmaStore { src, map, coords, tile, add } => {
            let st = ty(*src);
            if !st.shared || st.shape.len() != 2 || tile.inner > 1 || st.dtype != tile.elem || !inst.ty.unit {
                return fail(format!("tma_store from {st}"));
            }
            if *add && tile.elem != DType::F32 {
                return fail(format!("tma_reduce_add of {}: only f32 tiles are added", tile.elem));
            }
            if !matches!(f.inst(*map).op, Op::Param(i) if matches!(f.params[i as usize].kind, ParamKind::Bytes { size: 128, align: 64 })) {
                return fail("tma_store's map must be a 128-byte parameter aligned to 64".into());
            }
            if !matches!(f.params.get(tile.ptr as usize).map(|p| p.kind), Some(ParamKind::Ptr { elem, writable: true }) if elem == tile.elem) {
                return fail(format!("tma_store writes parameter {}, not a writable pointer to {}", tile.ptr, tile.elem));
            }
            if coords.len() != 2 + tile.batch_strides().count() || !coords.iter().all(|&c| ty(c).is_scalar() && ty(c).dtype.is_int() && !ty(c).ptr) {
                return fail("tma_store takes integer coordinates".into());
            }
        }
        Op::MbarArrive { on, .. } if *ty(*on) != Type::scalar(DType::Bool) => return fail("mbar_arrive's `on` is a scalar bool".into()),
        Op::MbarInit { bars, .. } | Op::MbarWait { bars, .. } | Op::MbarArrive { bars, .. } => {
            let bt = ty(*bars);
            if !bt.shared || bt.dtype != DType::I64 || bt.shape.len() != 1 || !inst.ty.unit {
                return fail("mbarriers live in an i64 shared buffer; their operations give no value".into());
            }
        }
        Op::AsyncCommit | Op::AsyncWait(_) => {
            if !inst.ty.unit {
                return fail("async_commit and async_wait give no value".into());
            }
        }
        Op::Load { ptr, mask, other } => {
            let pt = ty(*ptr);
            if !pt.ptr || inst.ty != Type::block(pt.dtype, pt.shape.clone()) {
                return fail("load takes pointers and gives their pointee type in their shape".into());
            }
            if !mask_ok(*mask, &pt.shape) {
                return fail("load mask must be a bool block of the pointers' shape".into());
            }
            if other.is_some_and(|o| *ty(o) != inst.ty) {
                return fail("load `other` must have the loaded type".into());
            }
        }
        Op::Store { ptr, value, mask } | Op::Atomic { ptr, value, mask, .. } => {
            let pt = ty(*ptr);
            if !pt.ptr || *ty(*value) != Type::block(pt.dtype, pt.shape.clone()) {
                return fail(format!("store of {} through {}", ty(*value), pt));
            }
            if !mask_ok(*mask, &pt.shape) {
                return fail("mask must be a bool block of the pointers' shape".into());
            }
            if let Op::Atomic { cmp: Some(c), .. } = &inst.op {
                if ty(*c) != ty(*value) {
                    return fail("atomic_cas compares values of the stored type".into());
                }
            }
            match f.pointer_root(*ptr).map(|i| f.params[i as usize].kind) {
                Some(ParamKind::Ptr { writable: true, .. }) => {}
                _ => return fail("write through a pointer that is not a writable parameter".into()),
            }
        }
        Op::For { start, end, step, init, body } => {
            let d = ty(*start).dtype;
            for b in [start, end, step] {
                if !ty(*b).is_scalar() || ty(*b).dtype != d || !d.is_int() {
                    return fail("loop bounds are scalar integers of one type".into());
                }
            }
            if body.args.len() != init.len() + 1 || *ty(body.args[0]) != Type::scalar(d) {
                return fail("a loop region takes the counter and one argument per carried value".into());
            }
            let want: Vec<Type> = init.iter().map(|&x| ty(x).clone()).collect();
            for (i, (&a, t)) in body.args[1..].iter().zip(&want).enumerate() {
                if ty(a) != t || f.inst(a).op != Op::Arg(v, i as u32 + 1) {
                    return fail(format!("loop argument {} does not match its initial value", i + 1));
                }
                if t.ptr && body.yields.get(i).and_then(|&y| f.pointer_root(y)) != f.pointer_root(init[i]) {
                    return fail("a loop-carried pointer must keep deriving from the same parameter".into());
                }
            }
            region(f, v, body, &want, defined)?;
        }
        Op::If { cond, then, els } => {
            if *ty(*cond) != Type::scalar(DType::Bool) {
                return fail("an if condition is a scalar bool".into());
            }
            if !then.args.is_empty() || !els.args.is_empty() {
                return fail("branches take no arguments".into());
            }
            let want: Vec<Type> = then.yields.iter().map(|&y| ty(y).clone()).collect();
            region(f, v, then, &want, defined)?;
            region(f, v, els, &want, defined)?;
            for (a, b) in then.yields.iter().zip(&els.yields) {
                if ty(*a).ptr && f.pointer_root(*a) != f.pointer_root(*b) {
                    return fail("both branches must give pointers into the same parameter".into());
                }
            }
        }
        Op::Turn { .. } if !inst.ty.unit => return fail("turn_begin and turn_end give no value".into()),
        Op::Turn { .. } => {}
        Op::WarpSpecialize { producer, consumer } => {
            if !producer.args.is_empty() || !consumer.args.is_empty() || !inst.ty.unit {
                return fail("warp_specialize's regions take no arguments and it gives no value".into());
            }
            region(f, v, producer, &[], defined)?;
            region(f, v, consumer, &[], defined)?;
        }
        Op::Result(of, i) => {
            let want = match &f.inst(*of).op {
                Op::For { init, .. } => init.get(*i as usize).map(|&x| ty(x).clone()),
                Op::If { then, .. } => then.yields.get(*i as usize).map(|&x| ty(x).clone()),
                _ => None,
            };
            if want.as_ref() != Some(&inst.ty) {
                return fail(format!("result {i} of %{} does not match", of.0));
            }
        }
        Op::Arg(..) => return fail("a region argument placed as an instruction".into()),
        Op::Return => {}
        Op::Assert { cond, .. } => {
            if ty(*cond).dtype != DType::Bool {
                return fail("assert takes a mask".into());
            }
        }
        Op::BoundsCheck { param, offset, len, mask, .. } => {
            if !matches!(f.params.get(*param as usize).map(|p| &p.kind), Some(ParamKind::Ptr { .. })) {
                return fail("bounds_check names a pointer parameter".into());
            }
            if ty(*offset).dtype != DType::I64 || ty(*len).dtype != DType::I64 || ty(*len).shape != ty(*offset).shape {
                return fail("bounds_check compares i64 offsets with i64 lengths of one shape".into());
            }
            if mask.is_some_and(|m| ty(m).dtype != DType::Bool || ty(m).shape != ty(*offset).shape) {
                return fail("bounds_check's mask is a mask of the offsets' shape".into());
            }
        }
        Op::Print { args, .. } => {
            if args.windows(2).any(|w| ty(w[0]).shape != ty(w[1]).shape) {
                return fail("print takes values of one shape".into());
            }
        }
    }
    for d in inst.ty.padded_shape() {
        if d > super::MAX_BLOCK_ELEMENTS {
            return fail("block too large".into());
        }
    }
    Ok(())
}
