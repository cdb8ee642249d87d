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
