//! Lowering of the arithmetic op family, register by register.
//!
//! `f16`/`bf16` operands are extended to `f32`, computed, and rounded back after each
//! operation (the semantics of [`ir::arith`](crate::ir::arith)). Math functions use the
//! NVVM approximation intrinsics listed there.

use super::{llvm_type, Cx, LResult, lower_error};
use crate::ir::{BinOp, CmpOp, ConstVal, Type, UnaryOp};
use crate::DType;
use inkwell::values::{BasicValueEnum, FloatValue};
use inkwell::{FloatPredicate, IntPredicate};

const LOG2E: f64 = std::f64::consts::LOG2_E;
const LN2: f64 = std::f64::consts::LN_2;

pub fn constant<'ctx>(cx: &Cx<'_, 'ctx>, c: ConstVal, d: DType) -> BasicValueEnum<'ctx> {
    let t = llvm_type(cx.ctx, &Type::scalar(d));
    match d {
        DType::Bool => cx.ctx.bool_type().const_int(c.as_bool() as u64, false).into(),
        d if d.is_int() => t.into_int_type().const_int(c.as_i64() as u64, d.is_signed()).into(),
        _ => t.into_float_type().const_float(c.as_f64()).into(),
    }
}

pub(super) fn to_f32<'ctx>(cx: &Cx<'_, 'ctx>, x: BasicValueEnum<'ctx>, d: DType) -> LResult<FloatValue<'ctx>> {
    let x = x.into_float_value();
    Ok(if d == DType::F32 { x } else { cx.b.build_float_ext(x, cx.ctx.f32_type(), "")? })
}

pub(super) fn from_f32<'ctx>(cx: &Cx<'_, 'ctx>, x: FloatValue<'ctx>, d: DType) -> LResult<BasicValueEnum<'ctx>> {
    Ok(if d == DType::F32 {
        x.into()
    } else {
        let t = llvm_type(cx.ctx, &Type::scalar(d)).into_float_type();
        cx.b.build_float_trunc(x, t, "")?.into()
    })
}

fn int_suffix(d: DType) -> &'static str {
    match d {
        DType::Bool => "i1",
        DType::U8 => "i8",
        DType::I32 => "i32",
        _ => "i64",
    }
}

pub fn binary<'ctx>(cx: &Cx<'_, 'ctx>, op: BinOp, d: DType, xs: &[BasicValueEnum<'ctx>], ys: &[BasicValueEnum<'ctx>]) -> LResult<Vec<BasicValueEnum<'ctx>>> {
    let mut out = Vec::with_capacity(xs.len());
    for (&x, &y) in xs.iter().zip(ys) {
        let v: BasicValueEnum = if d.is_float() {
            let (x, y) = (to_f32(cx, x, d)?, to_f32(cx, y, d)?);
            let f32t = cx.ctx.f32_type().into();
            let z = match op {
                BinOp::Add => cx.b.build_float_add(x, y, "")?,
                BinOp::Sub => cx.b.build_float_sub(x, y, "")?,
                BinOp::Mul => cx.b.build_float_mul(x, y, "")?,
                // Triton's choice: `div.full.f32` (at most 2 ulp from the exact quotient),
                // far cheaper than the IEEE-rounded `div.rn.f32`.
                BinOp::Div => {
                    let ft = cx.ctx.f32_type();
                    let fty = ft.fn_type(&[ft.into(), ft.into()], false);
                    let asm = cx.ctx.create_inline_asm(fty, "div.full.f32 $0, $1, $2;".into(), "=f,f,f".into(), false, false, None, false);
                    cx.b.build_indirect_call(fty, asm, &[x.into(), y.into()], "")?.try_as_basic_value().basic().expect("div returns f32").into_float_value()
                }
                BinOp::Rem => cx.b.build_float_rem(x, y, "")?,
                BinOp::Max => cx.call(cx.intrinsic("llvm.maxnum.f32", f32t, &[f32t, f32t]), &[x.into(), y.into()])?.into_float_value(),
                BinOp::Min => cx.call(cx.intrinsic("llvm.minnum.f32", f32t, &[f32t, f32t]), &[x.into(), y.into()])?.into_float_value(),
                _ => return Err(lower_error(format!("`{}` on {d}", op.name()))),
            };
            from_f32(cx, z, d)?
        } else {
            let (x, y) = (x.into_int_value(), y.into_int_value());
            let signed = d.is_signed();
            let t = x.get_type().into();
            let minmax = |name: &str| -> LResult<BasicValueEnum<'ctx>> {
                let pre = if signed { "s" } else { "u" };
                cx.call(cx.intrinsic(&format!("llvm.{pre}{name}.{}", int_suffix(d)), t, &[t, t]), &[x.into(), y.into()])
            };
            match op {
                BinOp::Add => cx.b.build_int_add(x, y, "")?.into(),
                BinOp::Sub => cx.b.build_int_sub(x, y, "")?.into(),
                BinOp::Mul => cx.b.build_int_mul(x, y, "")?.into(),
                BinOp::Div if signed => cx.b.build_int_signed_div(x, y, "")?.into(),
                BinOp::Div => cx.b.build_int_unsigned_div(x, y, "")?.into(),
                BinOp::Rem if signed => cx.b.build_int_signed_rem(x, y, "")?.into(),
                BinOp::Rem => cx.b.build_int_unsigned_rem(x, y, "")?.into(),
                BinOp::And => cx.b.build_and(x, y, "")?.into(),
                BinOp::Or => cx.b.build_or(x, y, "")?.into(),
                BinOp::Xor => cx.b.build_xor(x, y, "")?.into(),
                BinOp::Max if d == DType::Bool => cx.b.build_or(x, y, "")?.into(),
                BinOp::Min if d == DType::Bool => cx.b.build_and(x, y, "")?.into(),
                BinOp::Max => minmax("max")?,
                BinOp::Min => minmax("min")?,
            }
        };
        out.push(v);
    }
    Ok(out)
}

/// `a * b + c` per register, `llvm.fma.f32` (`fma.rn.f32`: one rounding), 16-bit floats
/// through f32 as every float operation.
pub fn fma<'ctx>(cx: &Cx<'_, 'ctx>, d: DType, xs: &[BasicValueEnum<'ctx>], ys: &[BasicValueEnum<'ctx>], zs: &[BasicValueEnum<'ctx>]) -> LResult<Vec<BasicValueEnum<'ctx>>> {
    let f32t = cx.ctx.f32_type().into();
    let f = cx.intrinsic("llvm.fma.f32", f32t, &[f32t, f32t, f32t]);
    let mut out = Vec::with_capacity(xs.len());
    for ((&x, &y), &z) in xs.iter().zip(ys).zip(zs) {
        let (x, y, z) = (to_f32(cx, x, d)?, to_f32(cx, y, d)?, to_f32(cx, z, d)?);
        let r = cx.call(f, &[x.into(), y.into(), z.into()])?.into_float_value();
        out.push(from_f32(cx, r, d)?);
    }
    Ok(out)
}

pub fn cmp<'ctx>(cx: &Cx<'_, 'ctx>, op: CmpOp, d: DType, xs: &[BasicValueEnum<'ctx>], ys: &[BasicValueEnum<'ctx>]) -> LResult<Vec<BasicValueEnum<'ctx>>> {
    let mut out = Vec::with_capacity(xs.len());
    for (&x, &y) in xs.iter().zip(ys) {
        let v = if d.is_float() {
            let p = match op {
                CmpOp::Lt | CmpOp::ULt => FloatPredicate::OLT,
                CmpOp::Le => FloatPredicate::OLE,
                CmpOp::Gt => FloatPredicate::OGT,
                CmpOp::Ge => FloatPredicate::OGE,
                CmpOp::Eq => FloatPredicate::OEQ,
                CmpOp::Ne => FloatPredicate::UNE,
            };
            let (x, y) = (to_f32(cx, x, d)?, to_f32(cx, y, d)?);
            cx.b.build_float_compare(p, x, y, "")?
        } else {
            let s = d.is_signed();
            let p = match op {
                CmpOp::Lt if s => IntPredicate::SLT,
                CmpOp::Le if s => IntPredicate::SLE,
                CmpOp::Gt if s => IntPredicate::SGT,
                CmpOp::Ge if s => IntPredicate::SGE,
                CmpOp::Lt | CmpOp::ULt => IntPredicate::ULT,
                CmpOp::Le => IntPredicate::ULE,
                CmpOp::Gt => IntPredicate::UGT,
                CmpOp::Ge => IntPredicate::UGE,
                CmpOp::Eq => IntPredicate::EQ,
                CmpOp::Ne => IntPredicate::NE,
            };
            cx.b.build_int_compare(p, x.into_int_value(), y.into_int_value(), "")?
        };
        out.push(v.into());
    }
    Ok(out)
}

/// `f32` math through NVVM intrinsics.
fn math<'ctx>(cx: &Cx<'_, 'ctx>, op: UnaryOp, x: FloatValue<'ctx>) -> LResult<FloatValue<'ctx>> {
    let f32t = cx.ctx.f32_type();
    let t = f32t.into();
    let c = |v: f64| f32t.const_float(v);
    let un = |name: &str, x: FloatValue<'ctx>| -> LResult<FloatValue<'ctx>> {
        Ok(cx.call(cx.intrinsic(name, t, &[t]), &[x.into()])?.into_float_value())
    };
    let ex2 = |x| un("llvm.nvvm.ex2.approx.f", x);
    let reduce = |x: FloatValue<'ctx>| -> LResult<FloatValue<'ctx>> {
        // x - round(x / 2pi) * 2pi, with 2pi split in two parts so the product is exact.
        const TWO_PI_HI: f32 = 6.28125;
        const TWO_PI_LO: f64 = std::f64::consts::TAU - 6.28125;
        let k = un("llvm.rint.f32", cx.b.build_float_mul(x, c(1.0 / std::f64::consts::TAU), "")?)?;
        let fma = cx.intrinsic("llvm.fma.f32", t, &[t, t, t]);
        let nk = cx.b.build_float_neg(k, "")?;
        let r = cx.call(fma, &[nk.into(), c(TWO_PI_HI as f64).into(), x.into()])?.into_float_value();
        Ok(cx.call(fma, &[nk.into(), c(TWO_PI_LO).into(), r.into()])?.into_float_value())
    };
    Ok(match op {
        UnaryOp::Neg => cx.b.build_float_neg(x, "")?,
        UnaryOp::Abs => un("llvm.fabs.f32", x)?,
        UnaryOp::Exp => ex2(cx.b.build_float_mul(x, c(LOG2E), "")?)?,
        // Subnormals flushed (`ex2.approx.ftz.f32`, Triton's `tl.exp2`): no range fix-up
        // around `MUFU.EX2`, three instructions fewer per element (attention's softmax).
        UnaryOp::Exp2 => un("llvm.nvvm.ex2.approx.ftz.f", x)?,
        UnaryOp::Log => cx.b.build_float_mul(un("llvm.nvvm.lg2.approx.f", x)?, c(LN2), "")?,
        UnaryOp::Log2 => un("llvm.nvvm.lg2.approx.f", x)?,
        UnaryOp::Sqrt => un("llvm.sqrt.f32", x)?,
        UnaryOp::Rsqrt => un("llvm.nvvm.rsqrt.approx.f", x)?,
        UnaryOp::Sin => un("llvm.nvvm.sin.approx.f", reduce(x)?)?,
        UnaryOp::Cos => un("llvm.nvvm.cos.approx.f", reduce(x)?)?,
        UnaryOp::Tanh => {
            let asm = cx.ctx.create_inline_asm(f32t.fn_type(&[t.into()], false), "tanh.approx.f32 $0, $1;".into(), "=f,f".into(), false, false, None, false);
            cx.b.build_indirect_call(f32t.fn_type(&[t.into()], false), asm, &[x.into()], "")?
                .try_as_basic_value()
                .basic()
                .expect("tanh returns f32")
                .into_float_value()
        }
        UnaryOp::Sigmoid => {
            let e = ex2(cx.b.build_float_mul(x, c(-LOG2E), "")?)?;
            let den = cx.b.build_float_add(c(1.0), e, "")?;
            cx.b.build_float_div(c(1.0), den, "")?
        }
        UnaryOp::Not => return Err(lower_error("`!` on a float")),
    })
}

pub fn unary<'ctx>(cx: &Cx<'_, 'ctx>, op: UnaryOp, d: DType, xs: &[BasicValueEnum<'ctx>]) -> LResult<Vec<BasicValueEnum<'ctx>>> {
    let mut out = vec![];
    for &x in xs {
        out.push(if d.is_float() {
            let y = math(cx, op, to_f32(cx, x, d)?)?;
            from_f32(cx, y, d)?
        } else {
            let x = x.into_int_value();
            match op {
                UnaryOp::Neg => cx.b.build_int_neg(x, "")?.into(),
                UnaryOp::Not => cx.b.build_not(x, "")?.into(),
                UnaryOp::Abs => {
                    let t = x.get_type().into();
                    let f = cx.intrinsic(&format!("llvm.abs.{}", int_suffix(d)), t, &[t, cx.ctx.bool_type().into()]);
                    cx.call(f, &[x.into(), cx.ctx.bool_type().const_zero().into()])?
                }
                _ => return Err(lower_error(format!("`{}` on {d}", op.name()))),
            }
        });
    }
    Ok(out)
}

pub fn cast<'ctx>(cx: &Cx<'_, 'ctx>, from: DType, to: DType, xs: &[BasicValueEnum<'ctx>]) -> LResult<Vec<BasicValueEnum<'ctx>>> {
    let tt = llvm_type(cx.ctx, &Type::scalar(to));
    let f32t = cx.ctx.f32_type();
    let mut out = vec![];
    for &x in xs {
        let v: BasicValueEnum = if to == DType::Bool {
            if from.is_float() {
                cx.b.build_float_compare(FloatPredicate::UNE, x.into_float_value(), x.get_type().into_float_type().const_zero(), "")?.into()
            } else {
                let xi = x.into_int_value();
                cx.b.build_int_compare(IntPredicate::NE, xi, xi.get_type().const_zero(), "")?.into()
            }
        } else if from.is_float() && to.is_float() {
            from_f32(cx, to_f32(cx, x, from)?, to)?
        } else if from.is_float() {
            let y = to_f32(cx, x, from)?;
            let name = format!("llvm.{}.sat.{}.f32", if to.is_signed() { "fptosi" } else { "fptoui" }, int_suffix(to));
            cx.call(cx.intrinsic(&name, tt, &[f32t.into()]), &[y.into()])?
        } else if to.is_float() {
            let xi = x.into_int_value();
            let y = if from.is_signed() {
                cx.b.build_signed_int_to_float(xi, f32t, "")?
            } else {
                cx.b.build_unsigned_int_to_float(xi, f32t, "")?
            };
            from_f32(cx, y, to)?
        } else {
            let xi = x.into_int_value();
            let t = tt.into_int_type();
            let (fw, tw) = (xi.get_type().get_bit_width(), t.get_bit_width());
            if tw < fw {
                cx.b.build_int_truncate(xi, t, "")?.into()
            } else if tw == fw {
                xi.into()
            } else if from.is_signed() {
                cx.b.build_int_s_extend(xi, t, "")?.into()
            } else {
                cx.b.build_int_z_extend(xi, t, "")?.into()
            }
        };
        out.push(v);
    }
    Ok(out)
}
