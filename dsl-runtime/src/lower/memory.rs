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
//! the threads holding copies of an element (replicated layouts) only one writes.

use super::{llvm_type, Cx, LResult, LowerError};
use crate::ir::{Op, Type, Value};
use inkwell::types::{BasicMetadataTypeEnum, BasicType, BasicTypeEnum, IntType, VectorType};
use inkwell::values::{BasicMetadataValueEnum, BasicValueEnum, IntValue, PointerValue};

pub fn add_ptr<'ctx>(cx: &Cx<'_, 'ctx>, v: Value, p: Value, o: Value) -> LResult<Vec<BasicValueEnum<'ctx>>> {
    let elem = llvm_type(cx.ctx, &Type::scalar(cx.f.ty(v).dtype));
    let od = cx.f.ty(o).dtype;
    let i64t = cx.ctx.i64_type();
    let mut out = vec![];
    for r in 0..cx.num_regs(v) {
        let base = cx.vals[p.index()][r].into_pointer_value();
        let off = cx.vals[o.index()][r].into_int_value();
        let off = if od.is_signed() { cx.b.build_int_s_extend_or_bit_cast(off, i64t, "")? } else { cx.b.build_int_z_extend_or_bit_cast(off, i64t, "")? };
        // Not `inbounds`: masked-off lanes may point anywhere.
        let q = unsafe { cx.b.build_gep(elem, base, &[off], "")? };
        out.push(q.into());
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

fn and_pred<'ctx>(cx: &Cx<'_, 'ctx>, a: Option<IntValue<'ctx>>, b: Option<IntValue<'ctx>>) -> LResult<Option<IntValue<'ctx>>> {
    Ok(match (a, b) {
        (Some(x), Some(y)) => Some(cx.b.build_and(x, y, "")?),
        (x, None) => x,
        (None, y) => y,
    })
}

pub fn load<'ctx>(cx: &Cx<'_, 'ctx>, v: Value) -> LResult<Vec<BasicValueEnum<'ctx>>> {
    let Op::Load { ptr, mask, other } = cx.f.inst(v).op else { unreachable!() };
    let d = cx.f.ty(v).dtype;
    let et = llvm_type(cx.ctx, &Type::scalar(d));
    let w = cx.plan.access_width[&v];
    let n = cx.num_regs(v);
    let Access { words, bits, reg_bits: rb, constraint: c, ty: ptx_ty, vec: vsuf } = Access::new(w, d.size());
    let rt: BasicTypeEnum = int_ty(cx, rb).into();
    let ret: BasicTypeEnum = if words == 1 { rt } else { cx.ctx.struct_type(&vec![rt; words], false).into() };
    let mut out = Vec::with_capacity(n);
    for g in (0..n).step_by(w) {
        let addr: PointerValue = cx.vals[ptr.index()][g].into_pointer_value();
        let pred = mask.map(|m| cx.vals[m.index()][g].into_int_value());
        let mut args: Vec<BasicMetadataValueEnum> = vec![];
        let mut cons: Vec<String> = (0..words).map(|_| format!("={c}")).collect();
        let mut text = String::new();
        if let Some(p) = pred {
            let others = other.map(|o| cx.vals[o.index()][g..g + w].to_vec()).ok_or_else(|| LowerError("masked load without `other`".into()))?;
            let ow = pack(cx, &others, words, bits)?;
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

pub fn store<'ctx>(cx: &Cx<'_, 'ctx>, v: Value) -> LResult<()> {
    let Op::Store { ptr, value, mask } = cx.f.inst(v).op else { unreachable!() };
    let d = cx.f.ty(value).dtype;
    let w = cx.plan.access_width[&v];
    let n = cx.num_regs(ptr);
    let Access { words, bits, constraint: c, ty: ptx_ty, vec: vsuf, .. } = Access::new(w, d.size());
    let owner = cx.owner_predicate(&cx.layout_of(ptr))?;
    for g in (0..n).step_by(w) {
        let addr = cx.vals[ptr.index()][g].into_pointer_value();
        let pred = and_pred(cx, mask.map(|m| cx.vals[m.index()][g].into_int_value()), owner)?;
        let ws = pack(cx, &cx.vals[value.index()][g..g + w], words, bits)?;
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
