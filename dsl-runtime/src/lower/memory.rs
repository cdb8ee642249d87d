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
//! one element per instruction (`atom.acq_rel.gpu.global.*`).

use super::{llvm_type, shape, smem, Cx, LResult, lower_error, Regs};
use crate::ir::{AtomicOp, Op, Type, Value};
use crate::layout::LinearLayout;
use crate::DType;
use inkwell::types::{BasicMetadataTypeEnum, BasicType, BasicTypeEnum, IntType, VectorType};
use inkwell::values::{BasicMetadataValueEnum, BasicValueEnum, IntValue, PointerValue};

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

fn vec_of(t: BasicTypeEnum<'_>, n: u32) -> VectorType<'_> {
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

/// Atomics, one element per instruction (`atom.acq_rel.gpu.global`). Float `max`/`min`
/// use the integer orderings of IEEE bit patterns (signed for non-negative values,
/// unsigned reversed for negative ones), as Triton does. Replicated threads do not
/// repeat the operation: the owner's result is shared through shared memory.
pub fn atomic<'ctx>(cx: &mut Cx<'_, 'ctx>, v: Value, l: &LinearLayout) -> LResult<Regs<'ctx>> {
    let Op::Atomic { op, ptr, value, cmp, mask } = cx.f.inst(v).op else { unreachable!() };
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
        let sem = "atom.acq_rel.gpu.global";
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

/// Write `value` (in the layout it was computed in) into shared-memory buffer `buf`,
/// row-major over the padded shape; threads holding copies of an element write once.
pub fn local_store<'ctx>(cx: &mut Cx<'_, 'ctx>, buf: Value, value: Value) -> LResult<()> {
    let (regs, l) = cx.get_any(value);
    let l = l.ok_or_else(|| lower_error("local_store of a scalar"))?;
    let t = cx.f.ty(value).clone();
    let at = cx.plan.smem.range(cx.f, buf);
    cx.smem_access(at.clone(), smem::Access::Write)?;
    let padded = t.padded_shape();
    let owner = cx.owner_predicate(&l)?;
    let index = |cx: &Cx<'_, 'ctx>, c: &[IntValue<'ctx>]| shape::row_major(cx, c, &padded, 0);
    shape::write(cx, &regs, &t, &l, &index, at.start, owner)
}

/// The block buffer `buf` holds, read in layout `l` (any layout costs the same).
pub fn local_load<'ctx>(cx: &mut Cx<'_, 'ctx>, buf: Value, l: &LinearLayout) -> LResult<Regs<'ctx>> {
    let bt = cx.f.ty(buf).clone();
    let t = crate::ir::Type::block(bt.dtype, bt.shape.clone());
    let at = cx.plan.smem.range(cx.f, buf);
    cx.smem_access(at.clone(), smem::Access::Read)?;
    let padded = t.padded_shape();
    let index = |cx: &Cx<'_, 'ctx>, c: &[IntValue<'ctx>]| shape::row_major(cx, c, &padded, 0);
    shape::read(cx, &t, l, &index, at.start)
}
