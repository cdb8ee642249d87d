//! Lowering of `device_assert` (CUDA's `__assertfail`) and `device_print` (`vprintf`).
//! Only padding-free elements are checked and printed, and each element once (by the
//! owning thread of a replicated layout).

use super::{Cx, LResult};
use crate::ir::{Op, Value};
use crate::layout::LinearLayout;
use crate::DType;
use inkwell::types::BasicTypeEnum;
use inkwell::values::BasicValueEnum;
use inkwell::AddressSpace;
use inkwell::AtomicOrdering;

pub fn assert<'ctx>(cx: &mut Cx<'_, 'ctx>, v: Value, l: &LinearLayout) -> LResult<()> {
    let Op::Assert { cond, msg } = &cx.f.inst(v).op else { unreachable!() };
    let loc = cx.f.inst(v).loc;
    let conds = cx.get(*cond, l)?;
    let shape = cx.f.ty(*cond).shape.clone();
    let text = format!("{} (kernel `{}`, line {}:{})", msg, cx.f.name, loc.line, loc.col);
    let m = cx.b.build_global_string_ptr(&text, "assert.msg")?.as_pointer_value();
    let file = cx.b.build_global_string_ptr(&cx.f.name, "assert.file")?.as_pointer_value();
    let func = cx.b.build_global_string_ptr(&cx.f.name, "assert.func")?.as_pointer_value();
    for (r, &c) in conds.iter().enumerate() {
        let bad = cx.b.build_not(c.into_int_value(), "")?;
        let valid = if shape.is_empty() { None } else { cx.valid(l, &shape, r as u32)? };
        let bad = cx.and_pred(Some(bad), valid)?.expect("some");
        let fail = cx.ctx.append_basic_block(cx.func, "assert.fail");
        let ok = cx.ctx.append_basic_block(cx.func, "assert.ok");
        cx.b.build_conditional_branch(bad, fail, ok)?;
        cx.b.position_at_end(fail);
        let i32t = cx.ctx.i32_type();
        cx.call_void(
            "__assertfail",
            &[m.into(), file.into(), i32t.const_int(loc.line as u64, false).into(), func.into(), cx.ctx.i64_type().const_int(1, false).into()],
        )?;
        cx.b.build_unconditional_branch(ok)?;
        cx.b.position_at_end(ok);
    }
    Ok(())
}

pub fn print<'ctx>(cx: &mut Cx<'_, 'ctx>, v: Value) -> LResult<()> {
    let Op::Print { prefix, args } = &cx.f.inst(v).op else { unreachable!() };
    let shape = args.first().map(|&a| cx.f.ty(a).shape.clone()).unwrap_or_default();
    let l = cx.plan.default_for(&shape.iter().map(|d| d.next_power_of_two()).collect::<Vec<_>>());
    let mut vals = vec![];
    for &a in args {
        vals.push((cx.get(a, &l)?, cx.f.ty(a).dtype));
    }
    let mut fmt = "pid (%d, %d, %d)".to_string();
    if !shape.is_empty() {
        fmt += &format!(" idx ({})", vec!["%d"; shape.len()].join(", "));
    }
    fmt += &format!(" {prefix}");
    for (_, d) in &vals {
        fmt += match d {
            DType::F32 | DType::F16 | DType::BF16 => " %f",
            DType::I64 => " %lld",
            _ => " %d",
        };
    }
    fmt += "\n";
    let fmt_ptr = cx.b.build_global_string_ptr(&fmt, "print.fmt")?.as_pointer_value();
    let owner = cx.owner_predicate(&l)?;
    let i32t = cx.ctx.i32_type();
    let pids: Vec<BasicValueEnum> = ["x", "y", "z"]
        .iter()
        .map(|a| super::call_sreg(cx.ctx, &cx.module, &cx.b, &format!("ctaid.{a}")).map(|x| x.into()))
        .collect::<LResult<_>>()?;
    for r in 0..l.num_regs() {
        let mut items: Vec<BasicValueEnum> = pids.clone();
        if !shape.is_empty() {
            items.extend(cx.coords(&l, r as u32)?.into_iter().map(BasicValueEnum::from));
        }
        for (regs, d) in &vals {
            let x = regs[r];
            items.push(match d {
                DType::F32 | DType::F16 | DType::BF16 => cx.b.build_float_ext(super::arith::to_f32(cx, x, *d)?, cx.ctx.f64_type(), "")?.into(),
                DType::I64 | DType::I32 => x,
                _ => cx.b.build_int_z_extend(x.into_int_value(), i32t, "")?.into(),
            });
        }
        let valid = if shape.is_empty() { None } else { cx.valid(&l, &shape, r as u32)? };
        let pred = cx.and_pred(owner, valid)?;
        let cont = if let Some(p) = pred {
            let yes = cx.ctx.append_basic_block(cx.func, "print");
            let cont = cx.ctx.append_basic_block(cx.func, "printed");
            cx.b.build_conditional_branch(p, yes, cont)?;
            cx.b.position_at_end(yes);
            Some(cont)
        } else {
            None
        };
        let types: Vec<BasicTypeEnum> = items.iter().map(|x| x.get_type()).collect();
        let st = cx.ctx.struct_type(&types, false);
        let buf = cx.b.build_alloca(st, "print.args")?;
        for (k, &x) in items.iter().enumerate() {
            let p = cx.b.build_struct_gep(st, buf, k as u32, "")?;
            cx.b.build_store(p, x)?;
        }
        let gen = cx.ctx.ptr_type(AddressSpace::default());
        let vprintf = cx.intrinsic("vprintf", i32t.into(), &[gen.into(), gen.into()]);
        cx.call(vprintf, &[fmt_ptr.into(), buf.into()])?;
        if let Some(c) = cont {
            cx.b.build_unconditional_branch(c)?;
            cx.b.position_at_end(c);
        }
    }
    Ok(())
}

/// The device record of a checked launch: a module global of [`OOB_WORDS`] `u64`s, zero
/// until the first out-of-bounds lane claims it (compare-and-swap on word 0) and fills in
/// the rest: `[claimed, param | access << 32, line | col << 32, pid.x, pid.y, pid.z,
/// offset, length]`. The launcher reads it after a checked launch and zeroes it again.
pub const OOB_RECORD: &str = "rutile_oob";
pub const OOB_WORDS: usize = 8;

fn oob_record<'ctx>(cx: &Cx<'_, 'ctx>) -> inkwell::values::GlobalValue<'ctx> {
    if let Some(g) = cx.module.get_global(OOB_RECORD) {
        return g;
    }
    let ty = cx.ctx.i64_type().array_type(OOB_WORDS as u32);
    let g = cx.module.add_global(ty, Some(AddressSpace::from(1)), OOB_RECORD);
    g.set_initializer(&ty.const_zero());
    g.set_linkage(inkwell::module::Linkage::External);
    g.set_alignment(8);
    g
}

/// `bounds_check`: per element, `mask & !(offset <u len)` claims the record once per
/// launch. Only reached in checked (debug) builds, so the branches cost nothing elsewhere.
pub fn bounds_check<'ctx>(cx: &mut Cx<'_, 'ctx>, v: Value, l: &LinearLayout) -> LResult<()> {
    let Op::BoundsCheck { access, param, offset, len, mask } = cx.f.inst(v).op.clone() else { unreachable!() };
    let loc = cx.f.inst(v).loc;
    let shape = cx.f.ty(offset).shape.clone();
    let offs = cx.get(offset, l)?;
    let lens = cx.get(len, l)?;
    let masks = match mask {
        Some(m) => Some(cx.get(m, l)?),
        None => None,
    };
    let i64t = cx.ctx.i64_type();
    let rec_ty = i64t.array_type(OOB_WORDS as u32);
    let rec = oob_record(cx).as_pointer_value();
    // SAFETY: this builds an instruction; no memory is touched while compiling. `inbounds`
    // asks that the address stay inside the record (else it is poison): indices are the
    // constants 0 and `i`, and `i` is 0 to 7 below, inside `[OOB_WORDS x i64]` (8 words).
    let word = |cx: &Cx<'_, 'ctx>, i: u64| unsafe { cx.b.build_in_bounds_gep(rec_ty, rec, &[i64t.const_zero(), i64t.const_int(i, false)], "oob.word") };
    for r in 0..offs.len() {
        let inb = cx.b.build_int_compare(inkwell::IntPredicate::ULT, offs[r].into_int_value(), lens[r].into_int_value(), "")?;
        let bad = cx.b.build_not(inb, "oob")?;
        let bad = cx.and_pred(Some(bad), masks.as_ref().map(|m| m[r].into_int_value()))?;
        let valid = if shape.is_empty() { None } else { cx.valid(l, &shape, r as u32)? };
        let bad = cx.and_pred(bad, valid)?.expect("some");
        let claim = cx.ctx.append_basic_block(cx.func, "oob.claim");
        let fill = cx.ctx.append_basic_block(cx.func, "oob.fill");
        let ok = cx.ctx.append_basic_block(cx.func, "oob.ok");
        cx.b.build_conditional_branch(bad, claim, ok)?;
        cx.b.position_at_end(claim);
        let flag = word(cx, 0)?;
        let one = i64t.const_int(1, false);
        let res = cx.b.build_cmpxchg(flag, i64t.const_zero(), one, AtomicOrdering::Monotonic, AtomicOrdering::Monotonic)?;
        let won = cx.b.build_extract_value(res, 1, "oob.won")?.into_int_value();
        cx.b.build_conditional_branch(won, fill, ok)?;
        cx.b.position_at_end(fill);
        let pid = |cx: &Cx<'_, 'ctx>, a: &str| -> LResult<_> {
            let x = super::call_sreg(cx.ctx, &cx.module, &cx.b, &format!("ctaid.{a}"))?;
            Ok(cx.b.build_int_z_extend(x, i64t, "")?)
        };
        let fields = [
            i64t.const_int(param as u64 | (access as u64) << 32, false),
            i64t.const_int(loc.line as u64 | (loc.col as u64) << 32, false),
            pid(cx, "x")?,
            pid(cx, "y")?,
            pid(cx, "z")?,
            offs[r].into_int_value(),
            lens[r].into_int_value(),
        ];
        for (i, x) in fields.into_iter().enumerate() {
            let p = word(cx, i as u64 + 1)?;
            cx.b.build_store(p, x)?;
        }
        cx.b.build_unconditional_branch(ok)?;
        cx.b.position_at_end(ok);
    }
    Ok(())
}
