//! Arithmetic op family: constants, binary and unary operations, comparisons, casts.
//!
//! The scalar semantics of every operation live here ([`eval_binary`], [`eval_cmp`],
//! [`eval_unary`], [`eval_cast`]) and are shared by constant folding and the CPU
//! interpreter, so both agree with each other by construction. The GPU lowering
//! implements the same rules:
//!
//! - integers wrap at their width; `/` and `%` truncate toward zero (C and Triton, not
//!   Python); dividing by zero is an error in the interpreter and unspecified on the GPU;
//! - `f16` and `bf16` arithmetic is done in `f32` and rounded back after every operation;
//! - float division is within 2 ulp of the exact quotient on the GPU (`div.full.f32`, as
//!   Triton does), exact in the interpreter;
//! - `maximum`/`minimum` ignore a NaN operand (IEEE `maxNum`, PTX `max.f32`);
//! - float comparisons are ordered except `!=`, which is true when either side is NaN;
//! - float-to-integer casts truncate and saturate, NaN gives 0 (Rust's `as`, PTX `cvt.rzi.sat`);
//! - math functions are computed in `f32`. On the GPU they use the hardware approximations
//!   (`ex2.approx`, `lg2.approx`, `rsqrt.approx`, `sin/cos.approx` after range reduction,
//!   `tanh.approx`), as CUDA's fast-math mode does: relative error around 2^-21, except
//!   `tanh.approx` (about 2^-11) and `sqrt`, which is correctly rounded. `exp2` flushes
//!   subnormal inputs and results to zero on the GPU (`ex2.approx.ftz`, as Triton's
//!   `tl.exp2`; results below 2^-126 read 0 there, the interpreter keeps them), which
//!   saves the three instructions a subnormal-safe `ex2` costs; `exp` and `sigmoid` keep
//!   them (as `tl.exp` does).

use crate::DType;
use std::fmt;

/// A scalar constant, and the interpreter's model of one element.
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum ConstVal {
    Int(i64),
    Float(f64),
    Bool(bool),
}

impl ConstVal {
    /// The zero of `dtype` (`false` for `bool`).
    pub fn zero(dtype: DType) -> ConstVal {
        match dtype {
            d if d.is_float() => ConstVal::Float(0.0),
            DType::Bool => ConstVal::Bool(false),
            _ => ConstVal::Int(0),
        }
    }
    pub fn as_i64(self) -> i64 {
        match self {
            ConstVal::Int(i) => i,
            ConstVal::Float(f) => f as i64,
            ConstVal::Bool(b) => b as i64,
        }
    }
    pub fn as_f64(self) -> f64 {
        match self {
            ConstVal::Int(i) => i as f64,
            ConstVal::Float(f) => f,
            ConstVal::Bool(b) => b as i64 as f64,
        }
    }
    pub fn as_bool(self) -> bool {
        match self {
            ConstVal::Int(i) => i != 0,
            ConstVal::Float(f) => f != 0.0,
            ConstVal::Bool(b) => b,
        }
    }
    /// The canonical form of a value of type `d`.
    pub fn of(d: DType, x: f64) -> ConstVal {
        match d {
            DType::Bool => ConstVal::Bool(x != 0.0),
            d if d.is_int() => ConstVal::Int(wrap(d, x as i64)),
            d => ConstVal::Float(d.round(x)),
        }
    }
}

impl fmt::Display for ConstVal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConstVal::Int(i) => write!(f, "{i}"),
            ConstVal::Float(x) => write!(f, "{x:?}"),
            ConstVal::Bool(b) => write!(f, "{b}"),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
    /// Bitwise on integers, logical on `bool`.
    And,
    Or,
    Xor,
    Max,
    Min,
}

impl BinOp {
    pub fn name(self) -> &'static str {
        match self {
            BinOp::Add => "add",
            BinOp::Sub => "sub",
            BinOp::Mul => "mul",
            BinOp::Div => "div",
            BinOp::Rem => "rem",
            BinOp::And => "and",
            BinOp::Or => "or",
            BinOp::Xor => "xor",
            BinOp::Max => "max",
            BinOp::Min => "min",
        }
    }
    /// Bitwise/logical operations take integers or `bool`; the rest numbers.
    pub fn is_bitwise(self) -> bool {
        matches!(self, BinOp::And | BinOp::Or | BinOp::Xor)
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum CmpOp {
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
    Ne,
    /// Unsigned less-than on integers: `0 <= a < b` for a non-negative `b`. Used by the
    /// bounds guard; not reachable from the DSL.
    ULt,
}

impl CmpOp {
    pub fn name(self) -> &'static str {
        match self {
            CmpOp::Lt => "lt",
            CmpOp::Le => "le",
            CmpOp::Gt => "gt",
            CmpOp::Ge => "ge",
            CmpOp::Eq => "eq",
            CmpOp::Ne => "ne",
            CmpOp::ULt => "ult",
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum UnaryOp {
    Neg,
    /// Logical not on `bool`, bitwise not on integers.
    Not,
    Abs,
    Exp,
    Exp2,
    Log,
    Log2,
    Sqrt,
    Rsqrt,
    Sin,
    Cos,
    Tanh,
    Sigmoid,
}

impl UnaryOp {
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Not => "not",
            UnaryOp::Abs => "abs",
            UnaryOp::Exp => "exp",
            UnaryOp::Exp2 => "exp2",
            UnaryOp::Log => "log",
            UnaryOp::Log2 => "log2",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Rsqrt => "rsqrt",
            UnaryOp::Sin => "sin",
            UnaryOp::Cos => "cos",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Sigmoid => "sigmoid",
        }
    }
    /// Transcendental functions: defined on floats only (the builder converts integer
    /// operands to `f32`).
    pub fn is_float_only(self) -> bool {
        !matches!(self, UnaryOp::Neg | UnaryOp::Not | UnaryOp::Abs)
    }
}

/// Wrap an integer to the width of `d`.
pub fn wrap(d: DType, x: i64) -> i64 {
    match d {
        DType::U8 => x as u8 as i64,
        DType::I32 => x as i32 as i64,
        _ => x,
    }
}

/// `a op b` for operands of type `d`. Errors are messages for the caller to place.
pub fn eval_binary(op: BinOp, d: DType, a: ConstVal, b: ConstVal) -> Result<ConstVal, String> {
    use BinOp::*;
    Ok(match d {
        DType::Bool => {
            let (x, y) = (a.as_bool(), b.as_bool());
            ConstVal::Bool(match op {
                And => x & y,
                Or => x | y,
                Xor => x ^ y,
                Max => x | y,
                Min => x & y,
                _ => return Err(format!("`{}` is not defined on bool", op.name())),
            })
        }
        d if d.is_int() => {
            let (x, y) = (a.as_i64(), b.as_i64());
            let unsigned = !d.is_signed();
            let r = match op {
                Add => x.wrapping_add(y),
                Sub => x.wrapping_sub(y),
                Mul => x.wrapping_mul(y),
                Div | Rem if y == 0 => return Err("integer division by zero".into()),
                Div if unsigned => ((x as u64) / (y as u64)) as i64,
                Rem if unsigned => ((x as u64) % (y as u64)) as i64,
                Div if d == DType::I32 => (x as i32).wrapping_div(y as i32) as i64,
                Rem if d == DType::I32 => (x as i32).wrapping_rem(y as i32) as i64,
                Div => x.wrapping_div(y),
                Rem => x.wrapping_rem(y),
                And => x & y,
                Or => x | y,
                Xor => x ^ y,
                Max => x.max(y),
                Min => x.min(y),
            };
            ConstVal::Int(wrap(d, r))
        }
        d => {
            let (x, y) = (a.as_f64() as f32, b.as_f64() as f32);
            let r = match op {
                Add => x + y,
                Sub => x - y,
                Mul => x * y,
                Div => x / y,
                Rem => x % y,
                Max => x.max(y),
                Min => x.min(y),
                And | Or | Xor => return Err(format!("`{}` is not defined on {d}", op.name())),
            };
            ConstVal::Float(d.round(r as f64))
        }
    })
}

/// `a op b` for operands of type `d`.
pub fn eval_cmp(op: CmpOp, d: DType, a: ConstVal, b: ConstVal) -> bool {
    use CmpOp::*;
    if d.is_float() {
        let (x, y) = (a.as_f64(), b.as_f64());
        return match op {
            Lt | ULt => x < y,
            Le => x <= y,
            Gt => x > y,
            Ge => x >= y,
            Eq => x == y,
            Ne => x != y,
        };
    }
    let (x, y) = (a.as_i64(), b.as_i64());
    match op {
        Lt => x < y,
        Le => x <= y,
        Gt => x > y,
        Ge => x >= y,
        Eq => x == y,
        Ne => x != y,
        ULt => (x as u64) < (y as u64),
    }
}

/// `op a` for an operand of type `d`.
pub fn eval_unary(op: UnaryOp, d: DType, a: ConstVal) -> Result<ConstVal, String> {
    use UnaryOp::*;
    if d == DType::Bool {
        return match op {
            Not => Ok(ConstVal::Bool(!a.as_bool())),
            _ => Err(format!("`{}` is not defined on bool", op.name())),
        };
    }
    if d.is_int() {
        let x = a.as_i64();
        return Ok(ConstVal::Int(wrap(
            d,
            match op {
                Neg => x.wrapping_neg(),
                Not => !x,
                Abs => x.wrapping_abs(),
                _ => return Err(format!("`{}` needs a float operand, found {d}", op.name())),
            },
        )));
    }
    let x = a.as_f64() as f32;
    let r = match op {
        Neg => -x,
        Abs => x.abs(),
        Exp => x.exp(),
        Exp2 => x.exp2(),
        Log => x.ln(),
        Log2 => x.log2(),
        Sqrt => x.sqrt(),
        Rsqrt => 1.0 / x.sqrt(),
        Sin => x.sin(),
        Cos => x.cos(),
        Tanh => x.tanh(),
        Sigmoid => 1.0 / (1.0 + (-x).exp()),
        Not => return Err(format!("`!` is not defined on {d}")),
    };
    Ok(ConstVal::Float(d.round(r as f64)))
}

/// Convert `a` of type `from` to type `to`.
pub fn eval_cast(from: DType, to: DType, a: ConstVal) -> ConstVal {
    if to == DType::Bool {
        return ConstVal::Bool(a.as_bool());
    }
    if from.is_float() && to.is_int() {
        let x = a.as_f64() as f32;
        return ConstVal::Int(match to {
            DType::U8 => x as u8 as i64,
            DType::I32 => x as i32 as i64,
            _ => x as i64,
        });
    }
    if to.is_int() {
        // From an integer or bool: sign- or zero-extend per the source, then wrap.
        return ConstVal::Int(wrap(to, a.as_i64()));
    }
    // To a float: integers go through f32 (as the GPU does), floats round.
    let x = if from.is_float() { a.as_f64() } else { a.as_i64() as f32 as f64 };
    ConstVal::Float(to.round(x))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_division_truncates_and_wraps() {
        let d = eval_binary(BinOp::Div, DType::I32, ConstVal::Int(-7), ConstVal::Int(2)).unwrap();
        assert_eq!(d, ConstVal::Int(-3));
        let r = eval_binary(BinOp::Rem, DType::I32, ConstVal::Int(-7), ConstVal::Int(2)).unwrap();
        assert_eq!(r, ConstVal::Int(-1));
        let w = eval_binary(BinOp::Add, DType::I32, ConstVal::Int(i32::MAX as i64), ConstVal::Int(1)).unwrap();
        assert_eq!(w, ConstVal::Int(i32::MIN as i64));
        assert!(eval_binary(BinOp::Div, DType::I64, ConstVal::Int(1), ConstVal::Int(0)).is_err());
    }

    #[test]
    fn bf16_arithmetic_rounds_after_each_op() {
        let a = ConstVal::Float(1.0);
        let b = ConstVal::Float(1.0 / 256.0);
        // 1 + 2^-8 needs 8 mantissa bits; bf16 has 7, so it rounds to even (1.0).
        assert_eq!(eval_binary(BinOp::Add, DType::BF16, a, b).unwrap(), ConstVal::Float(1.0));
        assert_eq!(eval_binary(BinOp::Add, DType::F32, a, b).unwrap(), ConstVal::Float(1.00390625));
    }

    #[test]
    fn casts_saturate_like_rust_and_ptx() {
        assert_eq!(eval_cast(DType::F32, DType::I32, ConstVal::Float(1e20)), ConstVal::Int(i32::MAX as i64));
        assert_eq!(eval_cast(DType::F32, DType::I32, ConstVal::Float(f64::NAN)), ConstVal::Int(0));
        assert_eq!(eval_cast(DType::F32, DType::U8, ConstVal::Float(-3.0)), ConstVal::Int(0));
        assert_eq!(eval_cast(DType::I64, DType::I32, ConstVal::Int(1 << 32 | 5)), ConstVal::Int(5));
        assert_eq!(eval_cast(DType::I32, DType::Bool, ConstVal::Int(2)), ConstVal::Bool(true));
    }

    #[test]
    fn maximum_ignores_nan_and_ne_is_unordered() {
        let m = eval_binary(BinOp::Max, DType::F32, ConstVal::Float(f64::NAN), ConstVal::Float(2.0)).unwrap();
        assert_eq!(m, ConstVal::Float(2.0));
        assert!(eval_cmp(CmpOp::Ne, DType::F32, ConstVal::Float(f64::NAN), ConstVal::Float(1.0)));
        assert!(!eval_cmp(CmpOp::Lt, DType::F32, ConstVal::Float(f64::NAN), ConstVal::Float(1.0)));
        assert!(eval_cmp(CmpOp::ULt, DType::I64, ConstVal::Int(3), ConstVal::Int(4)));
        assert!(!eval_cmp(CmpOp::ULt, DType::I64, ConstVal::Int(-1), ConstVal::Int(4)));
    }
}
