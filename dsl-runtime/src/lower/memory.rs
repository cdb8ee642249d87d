//! Lowering of the memory op family.
//!
//! A load or store of a block is split into vector accesses of `w` elements
//! ([`Plan::access_width`](crate::passes::layout::Plan)): register `r` of each group
//! `[k*w, k*w + w)` holds consecutive elements, the group's first pointer is aligned to
//! `w * size` and its first mask bit stands for the group (the axis analysis proved both).
//! Each access is one predicated PTX instruction in inline assembly, as Triton emits them:
//!
//! ```text
//! mov.b32 $0, $6; ...                    // masked-off lanes keep `other`
//! @$4 ld.global.v4.b32 { $0, $1, $2, $3 }, [ $5 + 0 ];
//! @$0 st.global.v4.b32 [ $1 + 0 ], { $2, $3, $4, $5 };
//! ```
//!
//! Elements are packed into 32-bit words (16-bit for 2-byte accesses, and 1-byte
//! accesses go through a 16-bit register). Stores are additionally predicated so that of
//! the threads holding copies of an element (replicated layouts) only one writes, and
//! every access skips the padding of dimensions that are not powers of two. Atomics are
//! one element per instruction (`atom.acq_rel.gpu.global.*`, `atom.relaxed` when relaxed),
//! but for a relaxed `add` whose result is unread: `red.relaxed.gpu.global.add`, `f32` in
//! vectors where the plan's access width allows.
//!
//! Shared-memory buffers (`local_alloc`, `local_store`, `local_load`) are addressed through
//! their shared layout where the plan gives one (the swizzle of tensor-core operands):
//! the register layout composed with it gives each register's offset, runs of consecutive
//! offsets become vector accesses, and fragments of `mma.sync` operands are read with
//! `ldmatrix` (where [`LinearLayout::ldmatrix_x4`] says it can), by the `dot` itself one K
//! step at a time when it is the only reader ([`defer`], [`Operand`]). A stage of a
//! pipelined ring (`local_slot`) adds its offset at run time. `async_copy` is `cp.async`
//! (16, 8 or 4 bytes, zero-filling masked vectors), `async_commit`/`async_wait` its group
//! commit and wait, the wait followed by a barrier.

use super::{llvm_type, shape, smem, Cx, LResult, lower_error, Regs};
use crate::ir::{AtomicOp, Op, Type, Value};
use crate::layout::{InDim, LinearLayout};
use crate::DType;
use inkwell::types::{BasicMetadataTypeEnum, BasicType, BasicTypeEnum, IntType, VectorType};
use inkwell::values::{BasicMetadataValueEnum, BasicValue, BasicValueEnum, IntValue, PointerValue};

pub fn add_ptr<'ctx>(cx: &Cx<'_, 'ctx>, pointee: DType, od: DType, xp: &[BasicValueEnum<'ctx>], xo: &[BasicValueEnum<'ctx>]) -> LResult<Regs<'ctx>> {
    let elem = llvm_type(cx.ctx, &Type::scalar(pointee));
    let i64t = cx.ctx.i64_type();
    let mut out = vec![];
    for (&p, &o) in xp.iter().zip(xo) {
        let base = p.into_pointer_value();
        let off = o.into_int_value();
        let off = if od.is_signed() { cx.b.build_int_s_extend_or_bit_cast(off, i64t, "")? } else { cx.b.build_int_z_extend_or_bit_cast(off, i64t, "")? };
        // Not `inbounds`: masked-off lanes may point anywhere.
        // SAFETY: this builds an instruction; no memory is touched while compiling. Without
        // `inbounds` the result is a well-defined address wherever it points; whether it is
        // dereferenced is decided by the access's mask and the bounds guard.
        let q = unsafe { cx.b.build_gep(elem, base, &[off], "")? };
        out.push(q.into());
    }
    Ok(out)
}

/// `(ptr - base) / size_of(pointee)` as `i64`.
pub fn ptr_offset<'ctx>(cx: &Cx<'_, 'ctx>, pointee: DType, base: PointerValue<'ctx>, xp: &[BasicValueEnum<'ctx>]) -> LResult<Regs<'ctx>> {
    let i64t = cx.ctx.i64_type();
    let b = cx.b.build_ptr_to_int(base, i64t, "")?;
    let shift = i64t.const_int(pointee.size().trailing_zeros() as u64, false);
    xp.iter()
        .map(|&p| {
            let x = cx.b.build_ptr_to_int(p.into_pointer_value(), i64t, "")?;
            let d = cx.b.build_int_sub(x, b, "")?;
            Ok(cx.b.build_right_shift(d, shift, true, "")?.into())
        })
        .collect()
}

/// The predicate of each vector group's access: its mask, the padding, and (for writes)
/// ownership among replicated threads.
fn group_preds<'ctx>(cx: &mut Cx<'_, 'ctx>, ptr: Value, mask: Option<Value>, l: &LinearLayout, w: usize, write: bool) -> LResult<Vec<Option<IntValue<'ctx>>>> {
    let n = l.num_regs();
    let shape = cx.f.ty(ptr).shape.clone();
    let masks = match mask {
        Some(m) => Some(cx.get(m, l)?),
        None => None,
    };
    let owner = if write { cx.owner_predicate(l)? } else { None };
    let mut out = vec![];
    for g in (0..n).step_by(w) {
        let m = masks.as_ref().map(|m| m[g].into_int_value());
        let valid = cx.valid(l, &shape, g as u32)?;
        let p = cx.and_pred(m, valid)?;
        out.push(cx.and_pred(p, owner)?);
    }
    Ok(out)
}

/// How one vector access of `w` elements of `size` bytes is spelled in PTX: `words`
/// words of `bits` bits, held in registers of `reg_bits` (8-bit words use 16-bit
/// registers), with constraint letter `constraint`, PTX type `ty` and vector suffix `vec`.
struct Access {
    words: usize,
    bits: u32,
    reg_bits: u32,
    constraint: &'static str,
    ty: &'static str,
    vec: String,
}

impl Access {
    fn new(w: usize, size: usize) -> Access {
        let bytes = w * size;
        let (words, bits) = if bytes >= 4 { (bytes / 4, 32) } else { (1, (bytes * 8) as u32) };
        let reg_bits = bits.max(16);
        Access {
            words,
            bits,
            reg_bits,
            constraint: if reg_bits == 16 { "h" } else { "r" },
            ty: match bits {
                8 => "u8",
                16 => "b16",
                _ => "b32",
            },
            vec: if words > 1 { format!(".v{words}") } else { String::new() },
        }
    }
}

fn int_ty<'ctx>(cx: &Cx<'_, 'ctx>, bits: u32) -> IntType<'ctx> {
    match bits {
        8 => cx.ctx.i8_type(),
        16 => cx.ctx.i16_type(),
        32 => cx.ctx.i32_type(),
        _ => cx.ctx.i64_type(),
    }
}

pub(super) fn vec_of(t: BasicTypeEnum<'_>, n: u32) -> VectorType<'_> {
    match t {
        BasicTypeEnum::IntType(i) => i.vec_type(n),
        BasicTypeEnum::FloatType(f) => f.vec_type(n),
        other => unreachable!("no vectors of {other:?} are loaded"),
    }
}

fn vec_syntax(n: usize, first: usize) -> String {
    let regs: Vec<String> = (first..first + n).map(|i| format!("${i}")).collect();
    if n == 1 {
        regs[0].clone()
    } else {
        format!("{{ {} }}", regs.join(", "))
    }
}

/// Split `w` element values into `words` integer words.
fn pack<'ctx>(cx: &Cx<'_, 'ctx>, elems: &[BasicValueEnum<'ctx>], words: usize, bits: u32) -> LResult<Vec<IntValue<'ctx>>> {
    let et = elems[0].get_type();
    let vt = vec_of(et, elems.len() as u32);
    let mut vecv = vt.get_undef();
    let i32t = cx.ctx.i32_type();
    for (i, &e) in elems.iter().enumerate() {
        vecv = cx.b.build_insert_element(vecv, e, i32t.const_int(i as u64, false), "")?;
    }
    let wt = int_ty(cx, bits);
    let rt = int_ty(cx, bits.max(16));
    let mut out = vec![];
    if words == 1 {
        let x = cx.b.build_bit_cast(vecv, wt, "")?.into_int_value();
        out.push(if bits < 16 { cx.b.build_int_z_extend(x, rt, "")? } else { x });
    } else {
        let wv = cx.b.build_bit_cast(vecv, wt.vec_type(words as u32), "")?.into_vector_value();
        for i in 0..words {
            out.push(cx.b.build_extract_element(wv, i32t.const_int(i as u64, false), "")?.into_int_value());
        }
    }
    Ok(out)
}

/// Reassemble `w` elements of type `et` from words.
fn unpack<'ctx>(cx: &Cx<'_, 'ctx>, words: &[IntValue<'ctx>], bits: u32, et: BasicTypeEnum<'ctx>, w: usize) -> LResult<Vec<BasicValueEnum<'ctx>>> {
    let i32t = cx.ctx.i32_type();
    let wt = int_ty(cx, bits);
    let whole: BasicValueEnum = if words.len() == 1 {
        let x = words[0];
        if bits < 16 { cx.b.build_int_truncate(x, wt, "")?.into() } else { x.into() }
    } else {
        let mut v = wt.vec_type(words.len() as u32).get_undef();
        for (i, &x) in words.iter().enumerate() {
            v = cx.b.build_insert_element(v, x, i32t.const_int(i as u64, false), "")?;
        }
        v.into()
    };
    if w == 1 {
        return Ok(vec![cx.b.build_bit_cast(whole, et, "")?]);
    }
    let ev = cx.b.build_bit_cast(whole, vec_of(et, w as u32), "")?.into_vector_value();
    (0..w).map(|i| Ok(cx.b.build_extract_element(ev, i32t.const_int(i as u64, false), "")?)).collect()
}

fn asm_call<'ctx>(
    cx: &Cx<'_, 'ctx>,
    ret: Option<BasicTypeEnum<'ctx>>,
    text: String,
    constraints: String,
    args: &[BasicMetadataValueEnum<'ctx>],
    side_effects: bool,
) -> LResult<Option<BasicValueEnum<'ctx>>> {
    let arg_types: Vec<BasicMetadataTypeEnum> = args
        .iter()
        .map(|a| match a {
            BasicMetadataValueEnum::IntValue(x) => x.get_type().into(),
            BasicMetadataValueEnum::PointerValue(x) => x.get_type().into(),
            _ => unreachable!("asm operands are integers and pointers"),
        })
        .collect();
    let fn_type = match ret {
        Some(t) => t.fn_type(&arg_types, false),
        None => cx.ctx.void_type().fn_type(&arg_types, false),
    };
    let asm = cx.ctx.create_inline_asm(fn_type, text, constraints, side_effects, false, None, false);
    Ok(cx.b.build_indirect_call(fn_type, asm, args, "")?.try_as_basic_value().basic())
}

pub fn load<'ctx>(cx: &mut Cx<'_, 'ctx>, v: Value, l: &LinearLayout) -> LResult<Regs<'ctx>> {
    let Op::Load { ptr, mask, other } = cx.f.inst(v).op else { unreachable!() };
    let d = cx.f.ty(v).dtype;
    let et = llvm_type(cx.ctx, &Type::scalar(d));
    let w = cx.plan.access_width[&v];
    let n = l.num_regs();
    let ptrs = cx.get(ptr, l)?;
    let others = match other {
        Some(o) => Some(cx.get(o, l)?),
        None => None,
    };
    let preds = group_preds(cx, ptr, mask, l, w, false)?;
    let Access { words, bits, reg_bits: rb, constraint: c, ty: ptx_ty, vec: vsuf } = Access::new(w, d.size());
    let rt: BasicTypeEnum = int_ty(cx, rb).into();
    let ret: BasicTypeEnum = if words == 1 { rt } else { cx.ctx.struct_type(&vec![rt; words], false).into() };
    let mut out = Vec::with_capacity(n);
    for (k, g) in (0..n).step_by(w).enumerate() {
        let addr: PointerValue = ptrs[g].into_pointer_value();
        let pred = preds[k];
        let mut args: Vec<BasicMetadataValueEnum> = vec![];
        let mut cons: Vec<String> = (0..words).map(|_| format!("={c}")).collect();
        let mut text = String::new();
        if let Some(p) = pred {
            let fallback: Vec<BasicValueEnum> = match &others {
                Some(o) => o[g..g + w].to_vec(),
                None => vec![et.const_zero(); w],
            };
            let ow = pack(cx, &fallback, words, bits)?;
            // Operands: outputs 0..words, predicate, address, others.
            let (pi, ai) = (words, words + 1);
            for i in 0..words {
                text += &format!("mov.b{rb} ${i}, ${};\n\t", ai + 1 + i);
            }
            text += &format!("@${pi} ld.global{vsuf}.{ptx_ty} {}, [ ${ai} + 0 ];", vec_syntax(words, 0));
            args.push(p.into());
            cons.push("b".into());
            args.push(addr.into());
            cons.push("l".into());
            for x in ow {
                args.push(x.into());
                cons.push(c.into());
            }
        } else {
            text += &format!("ld.global{vsuf}.{ptx_ty} {}, [ ${words} + 0 ];", vec_syntax(words, 0));
            args.push(addr.into());
            cons.push("l".into());
        }
        let r = asm_call(cx, Some(ret), text, cons.join(","), &args, true)?.expect("load returns a value");
        let ws: Vec<IntValue> = if words == 1 {
            vec![r.into_int_value()]
        } else {
            (0..words).map(|i| Ok(cx.b.build_extract_value(r.into_struct_value(), i as u32, "")?.into_int_value())).collect::<LResult<_>>()?
        };
        out.extend(unpack(cx, &ws, bits, et, w)?);
    }
    Ok(out)
}

pub fn store<'ctx>(cx: &mut Cx<'_, 'ctx>, v: Value, l: &LinearLayout) -> LResult<()> {
    let Op::Store { ptr, value, mask } = cx.f.inst(v).op else { unreachable!() };
    let d = cx.f.ty(value).dtype;
    let w = cx.plan.access_width[&v];
    let n = l.num_regs();
    let ptrs = cx.get(ptr, l)?;
    let vals = cx.get(value, l)?;
    let preds = group_preds(cx, ptr, mask, l, w, true)?;
    let Access { words, bits, constraint: c, ty: ptx_ty, vec: vsuf, .. } = Access::new(w, d.size());
    for (k, g) in (0..n).step_by(w).enumerate() {
        let addr = ptrs[g].into_pointer_value();
        let pred = preds[k];
        let ws = pack(cx, &vals[g..g + w], words, bits)?;
        let mut args: Vec<BasicMetadataValueEnum> = vec![];
        let mut cons: Vec<String> = vec![];
        let first = if let Some(p) = pred {
            args.push(p.into());
            cons.push("b".into());
            1
        } else {
            0
        };
        args.push(addr.into());
        cons.push("l".into());
        for x in ws {
            args.push(x.into());
            cons.push(c.into());
        }
        let guard = if pred.is_some() { "@$0 " } else { "" };
        let text = format!("{guard}st.global{vsuf}.{ptx_ty} [ ${first} + 0 ], {};", vec_syntax(words, first + 1));
        asm_call(cx, None, text, cons.join(","), &args, true)?;
    }
    Ok(())
}

/// Atomics, one element per instruction (`atom.acq_rel.gpu.global`, or `atom.relaxed`).
/// Float `max`/`min` use the integer orderings of IEEE bit patterns (signed for
/// non-negative values, unsigned reversed for negative ones), as Triton does. Replicated
/// threads do not repeat the operation: the owner's result is shared through shared
/// memory. A relaxed `add` whose result nobody reads is a reduction
/// (`red.relaxed.gpu.global`: no value back, the SM does not wait for it).
pub fn atomic<'ctx>(cx: &mut Cx<'_, 'ctx>, v: Value, l: &LinearLayout) -> LResult<Regs<'ctx>> {
    let Op::Atomic { op, ptr, value, cmp, mask, relaxed } = cx.f.inst(v).op else { unreachable!() };
    if relaxed && matches!(op, AtomicOp::Add) && !cx.f.has_users(v) {
        return reduction(cx, v, l);
    }
    let d = cx.f.ty(v).dtype;
    let n = l.num_regs();
    let ptrs = cx.get(ptr, l)?;
    let vals = cx.get(value, l)?;
    let cmps = match cmp {
        Some(c) => Some(cx.get(c, l)?),
        None => None,
    };
    let preds = group_preds(cx, ptr, mask, l, 1, true)?;
    let bits = (d.size() * 8) as u32;
    let it = int_ty(cx, bits);
    let (cons_letter, b) = if bits == 64 { ("l", "b64") } else { ("r", "b32") };
    let et = llvm_type(cx.ctx, &Type::scalar(d));
    let mut out = Vec::with_capacity(n);
    for r in 0..n {
        let addr = ptrs[r].into_pointer_value();
        let x = cx.b.build_bit_cast(vals[r], it, "")?.into_int_value();
        let pred = preds[r].unwrap_or(cx.ctx.bool_type().const_int(1, false));
        let sem = if relaxed { "atom.relaxed.gpu.global" } else { "atom.acq_rel.gpu.global" };
        let float = d.is_float();
        let one = |cx: &Cx<'_, 'ctx>, opname: &str, x: IntValue<'ctx>, pred: IntValue<'ctx>| -> LResult<IntValue<'ctx>> {
            let text = format!("mov.{b} $0, 0;\n\t@$1 {sem}.{opname} $0, [ $2 + 0 ], $3;");
            let cons = format!("={cons_letter},b,l,{cons_letter}");
            Ok(asm_call(cx, Some(it.into()), text, cons, &[pred.into(), addr.into(), x.into()], true)?.expect("atom returns").into_int_value())
        };
        let s = if bits == 64 { "s64" } else { "s32" };
        let u = if bits == 64 { "u64" } else { "u32" };
        let old = match op {
            AtomicOp::Add if float => one(cx, "add.f32", x, pred)?,
            AtomicOp::Add => one(cx, &format!("add.{u}"), x, pred)?,
            AtomicOp::Xchg => one(cx, &format!("exch.{b}"), x, pred)?,
            AtomicOp::Max | AtomicOp::Min if !float => one(cx, &format!("{}.{s}", if op == AtomicOp::Max { "max" } else { "min" }), x, pred)?,
            AtomicOp::Max | AtomicOp::Min => {
                // Non-negative floats order like signed integers; negative ones like
                // unsigned integers, reversed.
                let neg = cx.b.build_int_compare(inkwell::IntPredicate::SLT, x, it.const_zero(), "")?;
                let pos = cx.b.build_not(neg, "")?;
                let (p_pos, p_neg) = (cx.b.build_and(pred, pos, "")?, cx.b.build_and(pred, neg, "")?);
                let (a, c) = if op == AtomicOp::Max { ("max", "min") } else { ("min", "max") };
                let r1 = one(cx, &format!("{a}.{s}"), x, p_pos)?;
                let r2 = one(cx, &format!("{c}.{u}"), x, p_neg)?;
                cx.b.build_select(neg, r2, r1, "")?.into_int_value()
            }
            AtomicOp::Cas => {
                let c = cx.b.build_bit_cast(cmps.as_ref().expect("cas has cmp")[r], it, "")?.into_int_value();
                let text = format!("mov.{b} $0, 0;\n\t@$1 {sem}.cas.{b} $0, [ $2 + 0 ], $3, $4;");
                let cons = format!("={cons_letter},b,l,{cons_letter},{cons_letter}");
                asm_call(cx, Some(it.into()), text, cons, &[pred.into(), addr.into(), c.into(), x.into()], true)?.expect("atom returns").into_int_value()
            }
        };
        out.push(cx.b.build_bit_cast(old, et, "")?);
    }
    // Replicated threads did not run the atomic: take the owner's result.
    if l.replicated_bits(crate::layout::InDim::Lane) != 0 || l.replicated_bits(crate::layout::InDim::Warp) != 0 {
        out = super::shape::share_from_owner(cx, &out, l, d)?;
    }
    Ok(out)
}

/// [`atomic`]'s relaxed `add` with its result unread: `red.relaxed.gpu.global.add`, no
/// result (the values it gives are zeros nobody reads); `f32` in vectors of the access
/// width the plan gives (2 or 4 elements contiguous in memory and in registers, where the
/// launch has `wgmma`, so on sm_90a: `red...add.v4.f32`), other types one element per
/// instruction.
fn reduction<'ctx>(cx: &mut Cx<'_, 'ctx>, v: Value, l: &LinearLayout) -> LResult<Regs<'ctx>> {
    let Op::Atomic { ptr, value, mask, .. } = cx.f.inst(v).op else { unreachable!() };
    let d = cx.f.ty(v).dtype;
    let ptrs = cx.get(ptr, l)?;
    let vals = cx.get(value, l)?;
    let w = cx.plan.access_width.get(&v).copied().unwrap_or(1);
    let preds = group_preds(cx, ptr, mask, l, w, true)?;
    // Operands as integers of the element's width (`.b32` registers for `.f32`, as PTX allows).
    let (ty, cons) = match d {
        DType::F32 => ("f32", "r"),
        DType::I64 => ("u64", "l"),
        _ => ("u32", "r"),
    };
    let it = int_ty(cx, (d.size() * 8) as u32);
    let vsuf = if w > 1 { format!(".v{w}") } else { String::new() };
    let constraints = std::iter::once("b,l").chain(std::iter::repeat_n(cons, w)).collect::<Vec<_>>().join(",");
    for (k, g) in (0..l.num_regs()).step_by(w).enumerate() {
        let pred = preds[k].unwrap_or(cx.ctx.bool_type().const_int(1, false));
        let mut args: Vec<BasicMetadataValueEnum> = vec![pred.into(), ptrs[g].into()];
        for x in &vals[g..g + w] {
            args.push(cx.b.build_bit_cast(*x, it, "")?.into());
        }
        let text = format!("@$0 red.relaxed.gpu.global.add{vsuf}.{ty} [ $1 + 0 ], {};", vec_syntax(w, 2));
        asm_call(cx, None, text, constraints.clone(), &args, true)?;
    }
    let zero = llvm_type(cx.ctx, &Type::scalar(d)).const_zero();
    Ok(vec![zero; l.num_regs()])
}

/// Where a buffer or a stage view of one lives: its root buffer's byte range (what the
/// hazard analysis tracks), the view's byte offset within it (at run time: the stage is a
/// value), and the shared layout its elements are stored in (`None`: row-major over the
/// padded shape).
pub struct BufAt<'ctx> {
    pub range: std::ops::Range<u64>,
    dynamic: Option<IntValue<'ctx>>,
    pub shared: Option<LinearLayout>,
}

impl<'ctx> BufAt<'ctx> {
    /// The pointer `bytes` past the start of the view.
    pub fn ptr(&self, cx: &Cx<'_, 'ctx>, bytes: IntValue<'ctx>) -> LResult<PointerValue<'ctx>> {
        let bytes = match self.dynamic {
            Some(d) => cx.b.build_int_add(bytes, d, "")?,
            None => bytes,
        };
        cx.smem_ptr(self.range.start, bytes)
    }
}

/// Where buffer (or view) `buf` is, and how its elements are laid out.
pub fn buffer_at<'ctx>(cx: &Cx<'_, 'ctx>, buf: Value) -> LResult<BufAt<'ctx>> {
    let f = cx.f;
    match f.inst(buf).op {
        Op::LocalSlot { buf: root, slot } => {
            let t = f.ty(buf);
            let stage_bytes = t.shape.iter().product::<usize>() as u64 * t.dtype.size() as u64;
            let i32t = cx.ctx.i32_type();
            let s = cx.vals[slot.index()].first().ok_or_else(|| lower_error("internal: a stage index without a value"))?.into_int_value();
            let s = cx.b.build_int_truncate_or_bit_cast(s, i32t, "")?;
            let dynamic = cx.b.build_int_mul(s, i32t.const_int(stage_bytes, false), "")?;
            // A stage of a ring buffer: its swizzle if it feeds tensor cores, else row-major.
            let shared = cx.plan.shared.get(&root).cloned().unwrap_or_else(|| {
                let order: Vec<usize> = (0..t.shape.len()).rev().collect();
                LinearLayout::swizzled_shared(&t.shape, &order, 1, 1, 1)
            });
            Ok(BufAt { range: cx.plan.smem.range(f, root), dynamic: Some(dynamic), shared: Some(shared) })
        }
        // The same bytes seen transposed: the inner view's address map with its two
        // coordinates swapped.
        Op::LocalTrans(inner) => {
            let at = buffer_at(cx, inner)?;
            let shared = at.shared.clone().unwrap_or_else(|| {
                let t = f.ty(inner);
                LinearLayout::swizzled_shared(&t.padded_shape(), &[1, 0], 1, 1, 1)
            });
            Ok(BufAt { shared: Some(shared.permute(&[1, 0])), ..at })
        }
        _ => Ok(BufAt { range: cx.plan.smem.range(f, buf), dynamic: None, shared: cx.plan.shared.get(&buf).cloned() }),
    }
}

/// Write `value` (in the layout it was computed in) into shared-memory buffer `buf`:
/// through the buffer's shared layout where the plan gives it one (a swizzle,
/// [`Plan::shared`](crate::passes::layout::Plan)), row-major over the padded shape
/// otherwise; threads holding copies of an element write once.
pub fn local_store<'ctx>(cx: &mut Cx<'_, 'ctx>, buf: Value, value: Value) -> LResult<()> {
    let (regs, l) = cx.get_any(value);
    let l = l.ok_or_else(|| lower_error("local_store of a scalar"))?;
    let t = cx.f.ty(value).clone();
    let at = buffer_at(cx, buf)?;
    cx.smem_access(at.range.clone(), smem::Access::Write)?;
    let owner = cx.owner_predicate(&l)?;
    if let Some(shared) = at.shared.clone() {
        return store_through(cx, &regs, &t, &l, &shared, &at, owner);
    }
    let padded = t.padded_shape();
    let index = |cx: &Cx<'_, 'ctx>, c: &[IntValue<'ctx>]| shape::row_major(cx, c, &padded, 0);
    shape::write(cx, &regs, &t, &l, &index, at.range.start, owner, 1)
}

/// The block buffer `buf` holds, read in layout `l`: with `ldmatrix` where `l` is a
/// tensor-core operand fragment of a swizzled buffer, else element by element (any layout
/// costs the same) or in vectors where the buffer's layout keeps registers together.
pub fn local_load<'ctx>(cx: &mut Cx<'_, 'ctx>, buf: Value, l: &LinearLayout) -> LResult<Regs<'ctx>> {
    let bt = cx.f.ty(buf).clone();
    let t = crate::ir::Type::block(bt.dtype, bt.shape.clone());
    let at = buffer_at(cx, buf)?;
    cx.smem_access(at.range.clone(), smem::Access::Read)?;
    if let Some(shared) = at.shared.clone() {
        if let Some(plan) = ldsm_plan(&t, l, &shared)? {
            let mut regs = Vec::with_capacity(l.num_regs());
            for r0 in (0..l.num_regs()).step_by(plan.group) {
                regs.extend(ldsm_group(cx, &t, &plan, &at, r0)?);
            }
            return Ok(regs);
        }
        return load_through(cx, &t, &element_offsets(l, &shared)?, &at);
    }
    let padded = t.padded_shape();
    let index = |cx: &Cx<'_, 'ctx>, c: &[IntValue<'ctx>]| shape::row_major(cx, c, &padded, 0);
    shape::read(cx, &t, l, &index, at.range.start, 1)
}

/// `async_copy`: one `cp.async` per vector of the access (16, 8 or 4 bytes: the plan's
/// vector width, capped by the run of consecutive elements in the destination's layout),
/// with a source size of 0 where the vector's mask is off, which zero-fills it. Threads
/// holding copies of an element (replicated layouts) all copy it, the same bytes, rather
/// than zero-filling it with a source size of 0. Not recorded by the hazard analysis:
/// the pipeliner that makes these orders them ([`passes::pipeline`](crate::passes::pipeline)):
/// a copy in the loop goes to a stage that every thread finished reading before the
/// barrier of the `async_wait` before it, the prologue's copies are covered by the write
/// the ring's `local_alloc` records, and the `async_wait` before a stage is read makes its
/// copies visible.
pub fn async_copy<'ctx>(cx: &mut Cx<'_, 'ctx>, v: Value, l: &LinearLayout) -> LResult<()> {
    let Op::AsyncCopy { dst, ptr, mask } = cx.f.inst(v).op else { unreachable!() };
    let t = cx.f.ty(ptr).clone();
    let size = t.dtype.size() as u64;
    let at = buffer_at(cx, dst)?;
    let shared = at.shared.clone().ok_or_else(|| lower_error("internal: async_copy into a buffer that is not a stage"))?;
    let map = element_offsets(l, &shared)?;
    let w = cx.plan.access_width.get(&v).copied().unwrap_or(1).min(run_length(&map, 16 / size as usize));
    let bytes = w as u64 * size;
    if bytes < 4 {
        return Err(lower_error(format!("internal: async_copy of {bytes}-byte vectors (cp.async moves 4, 8 or 16)")));
    }
    let ptrs = cx.get(ptr, l)?;
    let masks = mask.map(|m| cx.get(m, l)).transpose()?;
    let i32t = cx.ctx.i32_type();
    let name = format!("llvm.nvvm.cp.async.{}.shared.global.{bytes}.s", if bytes == 16 { "cg" } else { "ca" });
    // A masked copy takes its mask as `cp.async`'s ignore-src predicate: the conditions it
    // is made of stay predicates (one compare or predicate op each, shared between copies
    // where they are the same) instead of becoming a chain of selects of the source size.
    let i64t = cx.ctx.i64_type();
    let text = format!("cp.async.{}.shared.global [$0], [$1], {bytes}, $2;", if bytes == 16 { "cg" } else { "ca" });
    let masked_ty = cx.ctx.void_type().fn_type(&[i32t.into(), i64t.into(), cx.ctx.bool_type().into()], false);
    let masked = cx.ctx.create_inline_asm(masked_ty, text, "r,l,b,~{memory}".into(), true, false, None, false);
    for r0 in (0..ptrs.len()).step_by(w) {
        let d = element_ptr(cx, &map, r0 as u32, size, &at)?;
        match &masks {
            Some(m) => {
                let ignore = cx.b.build_not(m[r0].into_int_value(), "")?;
                let (d, s) = (cx.b.build_ptr_to_int(d, i32t, "")?, cx.b.build_ptr_to_int(ptrs[r0].into_pointer_value(), i64t, "")?);
                cx.b.build_indirect_call(masked_ty, masked, &[d.into(), s.into(), ignore.into()], "")?;
            }
            None => cx.call_void(&name, &[d.into(), ptrs[r0], i32t.const_int(bytes, false).into()])?,
        }
    }
    Ok(())
}

/// Where each register of layout `l` lives in a buffer laid out by `shared` (`Offset` →
/// coordinates): the map (register, lane, warp) → element offset.
fn element_offsets(l: &LinearLayout, shared: &LinearLayout) -> LResult<LinearLayout> {
    l.invert_and_compose(shared).ok_or_else(|| lower_error(format!("internal: layout {l} does not fit the shared layout {shared}")))
}

/// The widest run of registers (at most `max` elements, a power of two) that `map` puts at
/// consecutive offsets, each run starting at a multiple of its length.
fn run_length(map: &LinearLayout, max: usize) -> usize {
    let regs = map.bases(InDim::Register);
    let mut v = 1usize;
    while v < max && (v.trailing_zeros() as usize) < regs.len() && regs[v.trailing_zeros() as usize][0] == v as u32 {
        v *= 2;
    }
    let aligned = |v: usize| {
        let others = regs.iter().skip(v.trailing_zeros() as usize).chain(map.bases(InDim::Lane)).chain(map.bases(InDim::Warp));
        others.clone().all(|b| b[0] % v as u32 == 0)
    };
    while v > 1 && !aligned(v) {
        v /= 2;
    }
    v
}

/// The pointer to element offset `map(r, lane, warp)` of the buffer `at`.
fn element_ptr<'ctx>(cx: &Cx<'_, 'ctx>, map: &LinearLayout, r: u32, size: u64, at: &BufAt<'ctx>) -> LResult<PointerValue<'ctx>> {
    let o = cx.coords(map, r)?[0];
    let bytes = cx.b.build_int_mul(o, cx.ctx.i32_type().const_int(size, false), "")?;
    at.ptr(cx, bytes)
}

/// [`local_store`] into a buffer with a shared layout: runs of registers that land at
/// consecutive offsets go out as one vector store (16 bytes at most).
fn store_through<'ctx>(
    cx: &mut Cx<'_, 'ctx>,
    regs: &[BasicValueEnum<'ctx>],
    t: &Type,
    l: &LinearLayout,
    shared: &LinearLayout,
    at: &BufAt<'ctx>,
    owner: Option<IntValue<'ctx>>,
) -> LResult<()> {
    let map = element_offsets(l, shared)?;
    let size = t.dtype.size() as u64;
    let v = run_length(&map, 16 / size as usize);
    let et = llvm_type(cx.ctx, t);
    shape::only_where(cx, owner, |cx| {
        for r0 in (0..regs.len()).step_by(v) {
            let p = element_ptr(cx, &map, r0 as u32, size, at)?;
            let x: BasicValueEnum = if v == 1 {
                regs[r0]
            } else {
                let mut x = vec_of(et, v as u32).get_undef();
                for j in 0..v {
                    x = cx.b.build_insert_element(x, regs[r0 + j], cx.ctx.i32_type().const_int(j as u64, false), "")?;
                }
                x.into()
            };
            cx.b.build_store(p, x)?.set_alignment((v as u64 * size) as u32).map_err(|e| lower_error(e.to_string()))?;
        }
        Ok(())
    })
}

/// [`local_load`] from a buffer with a shared layout, in vectors where `map` allows.
fn load_through<'ctx>(cx: &mut Cx<'_, 'ctx>, t: &Type, map: &LinearLayout, at: &BufAt<'ctx>) -> LResult<Regs<'ctx>> {
    let v = run_length(map, 16 / t.dtype.size());
    let mut out = Vec::with_capacity(map.num_regs());
    for r0 in (0..map.num_regs()).step_by(v) {
        out.extend(load_run(cx, t, map, at, r0, v)?);
    }
    Ok(out)
}

/// Registers `r0..r0 + v` of `map` (at consecutive offsets, `v` from [`run_length`]), by
/// one load.
fn load_run<'ctx>(cx: &Cx<'_, 'ctx>, t: &Type, map: &LinearLayout, at: &BufAt<'ctx>, r0: usize, v: usize) -> LResult<Vec<BasicValueEnum<'ctx>>> {
    let size = t.dtype.size() as u64;
    let et = llvm_type(cx.ctx, t);
    let p = element_ptr(cx, map, r0 as u32, size, at)?;
    if v == 1 {
        let x = cx.b.build_load(et, p, "")?;
        x.as_instruction_value().expect("a load").set_alignment(size as u32).map_err(|e| lower_error(e.to_string()))?;
        return Ok(vec![x]);
    }
    let x = cx.b.build_load(vec_of(et, v as u32), p, "")?;
    x.as_instruction_value().expect("a load").set_alignment((v as u64 * size) as u32).map_err(|e| lower_error(e.to_string()))?;
    (0..v).map(|j| Ok(cx.b.build_extract_element(x.into_vector_value(), cx.ctx.i32_type().const_int(j as u64, false), "")?)).collect()
}

/// How a fragment layout is read from a swizzled buffer with `ldmatrix.x4`: one
/// instruction per group of 8 registers of 16-bit elements (register bit 0 the half of a
/// 32-bit register, bits 1-2 the matrix) or 4 of 32-bit ones (tf32: bits 0-1 the matrix),
/// lane `i` addressing row `i % 8` of matrix `i / 8`. [`LinearLayout::ldmatrix_x4`]
/// derives which lane addresses which row of warp 0's first group (and whether `.trans`
/// is needed); the warps and the other groups add offsets that must keep rows 16-byte
/// aligned.
struct Ldsm {
    trans: bool,
    /// Registers per instruction: 8 or 4.
    group: usize,
    /// (lane, warp) → the element offset of the row the lane addresses, first group.
    rows: LinearLayout,
    /// (register, lane, warp) → element offset: the fragment composed with the buffer's layout.
    map: LinearLayout,
}

fn ldsm_plan(t: &Type, l: &LinearLayout, shared: &LinearLayout) -> LResult<Option<Ldsm>> {
    let size = t.dtype.size();
    if !matches!(size, 2 | 4) {
        return Ok(None);
    }
    let bits = 8 * size as u32;
    let Some((trans, lanes)) = [false, true].into_iter().find_map(|tr| LinearLayout::ldmatrix_x4(l, shared, tr, bits).map(|a| (tr, a))) else { return Ok(None) };
    let map = element_offsets(l, shared)?;
    let (regs, warps) = (map.bases(InDim::Register), map.bases(InDim::Warp));
    let (group, per_row) = (16 / size, 16 / size as u32);
    if !regs.iter().skip(group.trailing_zeros() as usize).chain(warps).all(|b| b[0] % per_row == 0) {
        return Ok(None);
    }
    let rows = LinearLayout::new(vec![(InDim::Lane, lanes.bases(InDim::Lane).to_vec()), (InDim::Warp, warps.to_vec())], &map.out_dims());
    Ok(Some(Ldsm { trans, group, rows, map }))
}

/// The registers `r0..r0 + plan.group` (`r0` a multiple of it) of a fragment, by one
/// `ldmatrix.x4`.
fn ldsm_group<'ctx>(cx: &Cx<'_, 'ctx>, t: &Type, plan: &Ldsm, at: &BufAt<'ctx>, r0: usize) -> LResult<Vec<BasicValueEnum<'ctx>>> {
    let i32t = cx.ctx.i32_type();
    // LLVM's intrinsic, not inline assembly: it is known to read only the shared memory it
    // is given, so LLVM keeps it after the stores and barriers it depends on.
    let name = format!("llvm.nvvm.ldmatrix.sync.aligned.m8n8.x4{}.b16.p3", if plan.trans { ".trans" } else { "" });
    let ret = cx.ctx.struct_type(&[i32t.into(); 4], false);
    let intrinsic = cx.intrinsic(&name, ret.into(), &[cx.ctx.ptr_type(inkwell::AddressSpace::from(3)).into()]);
    let thread = cx.thread_coord(&plan.rows, 0)?;
    let thread_bits = plan.rows.bases(InDim::Lane).iter().chain(plan.rows.bases(InDim::Warp)).fold(0, |m, b| m | b[0]);
    let k = plan.map.apply(r0 as u32, 0, 0)[0];
    let kv = i32t.const_int(k as u64, false);
    // The group's offset XORs in; where its bits miss the thread's, that is an add, which
    // folds into the instruction's immediate.
    let o = if k & thread_bits == 0 { cx.b.build_int_add(thread, kv, "")? } else { cx.b.build_xor(thread, kv, "")? };
    let bytes = cx.b.build_int_mul(o, i32t.const_int(t.dtype.size() as u64, false), "")?;
    let words = cx.call(intrinsic, &[at.ptr(cx, bytes)?.into()])?.into_struct_value();
    let et = llvm_type(cx.ctx, t);
    let mut out = Vec::with_capacity(plan.group);
    for j in 0..4 {
        let w = cx.b.build_extract_value(words, j, "")?;
        if plan.group == 4 {
            out.push(cx.b.build_bit_cast(w, et, "")?);
            continue;
        }
        let two = cx.b.build_bit_cast(w, vec_of(et, 2), "")?.into_vector_value();
        for h in 0..2 {
            out.push(cx.b.build_extract_element(two, i32t.const_int(h, false), "")?);
        }
    }
    Ok(out)
}

/// A tensor-core operand: its registers, or, for a `local_load` from a swizzled buffer
/// whose only user is the `dot` (see [`defer`]), the registers loaded on first use (by
/// `ldmatrix` groups where it applies, else by runs of consecutive elements), so that
/// each K step's fragments are loaded next to the `mma`s that use them and few are live
/// at once.
pub struct Operand<'ctx> {
    regs: Vec<Option<BasicValueEnum<'ctx>>>,
    lazy: Option<(Type, Read, BufAt<'ctx>)>,
}

/// How a deferred operand is read: `ldmatrix` groups, or runs of `run` registers at
/// consecutive offsets of `map` (register → element offset).
enum Read {
    Ldsm(Ldsm),
    Plain { map: LinearLayout, run: usize },
}

impl Read {
    fn new(t: &Type, l: &LinearLayout, shared: &LinearLayout) -> LResult<Read> {
        if let Some(plan) = ldsm_plan(t, l, shared)? {
            return Ok(Read::Ldsm(plan));
        }
        let map = element_offsets(l, shared)?;
        let run = run_length(&map, 16 / t.dtype.size());
        Ok(Read::Plain { map, run })
    }
}

impl<'ctx> Operand<'ctx> {
    /// The operand `x` of a `dot` in layout `l`.
    pub fn new(cx: &mut Cx<'_, 'ctx>, x: Value, l: &LinearLayout) -> LResult<Operand<'ctx>> {
        if cx.deferred.contains(&x) {
            let Op::LocalLoad(buf) = cx.f.inst(x).op else { unreachable!("only local_loads are deferred") };
            let t = Type::block(cx.f.ty(x).dtype, cx.f.ty(x).shape.clone());
            let at = buffer_at(cx, buf)?;
            // The reads happen here: a barrier since the `local_load` may have cleared the
            // read recorded there.
            cx.smem_access(at.range.clone(), smem::Access::Read)?;
            let shared = at.shared.clone().expect("deferred loads read swizzled buffers");
            let read = Read::new(&t, l, &shared)?;
            return Ok(Operand { regs: vec![None; l.num_regs()], lazy: Some((t, read, at)) });
        }
        Ok(Operand { regs: cx.get(x, l)?.into_iter().map(Some).collect(), lazy: None })
    }

    /// Register `r`.
    pub fn get(&mut self, cx: &Cx<'_, 'ctx>, r: usize) -> LResult<BasicValueEnum<'ctx>> {
        if self.regs[r].is_none() {
            let (t, read, at) = self.lazy.as_ref().expect("eager operands have every register");
            let (r0, xs) = match read {
                Read::Ldsm(plan) => (r / plan.group * plan.group, ldsm_group(cx, t, plan, at, r / plan.group * plan.group)?),
                Read::Plain { map, run } => (r / run * run, load_run(cx, t, map, at, r / run * run, *run)?),
            };
            for (j, x) in xs.into_iter().enumerate() {
                self.regs[r0 + j] = Some(x);
            }
        }
        Ok(self.regs[r].expect("loaded"))
    }
}

/// Whether `local_load` `v` (of `buf`) may be left to the `dot` that uses it
/// ([`Operand`]): it reads a swizzled buffer, the `dot` is its only user, later in the same
/// block, and nothing between them can write the buffer's bytes: no `local_store` or
/// initialised `local_alloc`, no scratch placed where the buffer is already dead (async
/// copies go to other stages: see [`async_copy`]).
/// Records the read for the hazard analysis here, where it is in program order.
pub fn defer<'ctx>(cx: &mut Cx<'_, 'ctx>, v: Value, buf: Value, block: &[Value]) -> LResult<bool> {
    let f = cx.f;
    let Some(pos) = block.iter().position(|&w| w == v) else { return Ok(false) };
    let users = f.users_in(&f.body.insts);
    let Some(&[user]) = users.get(&v).map(|u| u.as_slice()) else { return Ok(false) };
    let Some(upos) = block.iter().position(|&w| w == user) else { return Ok(false) };
    if !matches!(f.inst(user).op, Op::Dot { a, b, .. } if a == v || b == v) {
        return Ok(false);
    }
    let at = buffer_at(cx, buf)?;
    // Nothing in between may write the buffer's bytes: no buffer writes, and no scratch
    // (conversions, reductions) where the buffer is already dead and its bytes free.
    let unsafe_between = block[pos + 1..upos].iter().any(|&w| match f.inst(w).op {
        Op::LocalStore { .. } | Op::LocalAlloc(Some(_)) | Op::For { .. } | Op::If { .. } | Op::WarpSpecialize { .. } => true,
        Op::ConvertLayout(_) | Op::Reduce { .. } | Op::Scan { .. } | Op::Reshape(_) | Op::Atomic { .. } | Op::Print { .. } => cx.plan.smem.top_at(w) < at.range.end,
        _ => false,
    });
    if unsafe_between {
        return Ok(false);
    }
    if at.shared.is_none() {
        return Ok(false);
    }
    cx.smem_access(at.range.clone(), smem::Access::Read)?;
    cx.deferred.insert(v);
    Ok(true)
}
