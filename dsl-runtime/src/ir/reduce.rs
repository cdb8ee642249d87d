//! Reduction op family: `reduce` along an axis and the inclusive `scan`.
//!
//! - `sum`, `max`, `min` along `axis` remove that dimension (`[M, N].sum(1)` is `[M]`;
//!   a 1-D block reduces to a scalar). Without an axis the whole block reduces to a
//!   scalar. `sum` of `f16`/`bf16` accumulates and returns `f32`; `sum` of `u8` or `bool`
//!   returns `i32`; integer sums wrap. `max`/`min` ignore NaN like `maximum`/`minimum`.
//! - `argmax`, `argmin` give the `i32` index along `axis` of the first largest (smallest)
//!   element; NaN elements are ignored unless every element is NaN (then 0).
//! - `cumsum(x, axis)`: element `i` is the sum of elements `0..=i` along `axis`, in the
//!   same type rules as `sum`.
//!
//! The order in which a float sum adds its elements is unspecified (the GPU adds within
//! a thread, then across lanes and warps as a tree); results may differ from a sequential
//! sum in the last bits. [`combine`] and [`identity`] are shared by the interpreter.

use super::arith::{eval_binary, BinOp, ConstVal};
use super::builder::{err, R};
use super::shape::resolve_axis;
use super::{Builder, Loc, Op, Operand, Type, Value};
use crate::DType;

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum ReduceOp {
    Sum,
    Max,
    Min,
    ArgMax,
    ArgMin,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum ScanOp {
    Sum,
}

impl ReduceOp {
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::ArgMax => "argmax",
            ReduceOp::ArgMin => "argmin",
        }
    }
    pub fn is_arg(self) -> bool {
        matches!(self, ReduceOp::ArgMax | ReduceOp::ArgMin)
    }
    /// The element type the reduction works in and returns (the index type aside).
    pub fn accumulator(self, d: DType) -> DType {
        match (self, d) {
            (ReduceOp::Sum, DType::F16 | DType::BF16) => DType::F32,
            (ReduceOp::Sum, DType::U8 | DType::Bool) => DType::I32,
            _ => d,
        }
    }
    /// The binary operation that combines two values (for `arg*`, the value comparison).
    pub fn combiner(self) -> BinOp {
        match self {
            ReduceOp::Sum => BinOp::Add,
            ReduceOp::Max | ReduceOp::ArgMax => BinOp::Max,
            ReduceOp::Min | ReduceOp::ArgMin => BinOp::Min,
        }
    }
}

impl ScanOp {
    pub fn name(self) -> &'static str {
        "cumsum"
    }
}

/// The neutral element of `op` on `d` (what padding contributes).
pub fn identity(op: ReduceOp, d: DType) -> ConstVal {
    match (op.combiner(), d) {
        (BinOp::Add, DType::Bool) => ConstVal::Bool(false),
        (BinOp::Add, d) if d.is_int() => ConstVal::Int(0),
        (BinOp::Add, _) => ConstVal::Float(0.0),
        (BinOp::Max, DType::Bool) => ConstVal::Bool(false),
        (BinOp::Min, DType::Bool) => ConstVal::Bool(true),
        (BinOp::Max, DType::U8) => ConstVal::Int(0),
        (BinOp::Min, DType::U8) => ConstVal::Int(255),
        (BinOp::Max, DType::I32) => ConstVal::Int(i32::MIN as i64),
        (BinOp::Min, DType::I32) => ConstVal::Int(i32::MAX as i64),
        (BinOp::Max, DType::I64) => ConstVal::Int(i64::MIN),
        (BinOp::Min, DType::I64) => ConstVal::Int(i64::MAX),
        (BinOp::Max, _) => ConstVal::Float(f64::NEG_INFINITY),
        _ => ConstVal::Float(f64::INFINITY),
    }
}

/// Combine two values of type `d` (rounded to `d`, as the GPU does).
pub fn combine(op: ReduceOp, d: DType, a: ConstVal, b: ConstVal) -> ConstVal {
    eval_binary(op.combiner(), d, a, b).expect("reduction combiners are defined on their types")
}

/// For `argmax`/`argmin`: does `(a, ia)` win over `(b, ib)`? The better value wins, NaN
/// loses to anything, ties go to the smaller index.
pub fn arg_better(op: ReduceOp, a: ConstVal, ia: i64, b: ConstVal, ib: i64) -> bool {
    let (x, y) = (a.as_f64(), b.as_f64());
    if x.is_nan() || y.is_nan() {
        return if x.is_nan() && y.is_nan() { ia < ib } else { y.is_nan() };
    }
    // Integers compare exactly through i64 when both are integers.
    let ord = match (a, b) {
        (ConstVal::Int(p), ConstVal::Int(q)) => p.cmp(&q),
        _ => x.partial_cmp(&y).expect("not NaN"),
    };
    match ord {
        std::cmp::Ordering::Equal => ia < ib,
        std::cmp::Ordering::Greater => op == ReduceOp::ArgMax,
        std::cmp::Ordering::Less => op == ReduceOp::ArgMin,
    }
}

impl Builder {
    /// `x.sum(axis)`, `x.max(axis)`, ...; `axis: None` reduces the whole block to a scalar.
    pub fn reduce(&mut self, op: ReduceOp, x: impl Into<Operand>, axis: Option<i64>, loc: Loc) -> R<Value> {
        let v = self.value(x.into(), loc)?;
        let ty = self.ty(v).clone();
        if ty.ptr || ty.unit {
            return err(loc, format!("`{}` needs a block of numbers", op.name()));
        }
        if ty.is_scalar() {
            return err(loc, format!("`{}` reduces a block, found a scalar", op.name()));
        }
        let rank = ty.shape.len();
        let Some(axis) = axis else {
            if op.is_arg() && rank > 1 {
                return err(loc, format!("`{}` of a block of rank {rank} needs an axis", op.name()));
            }
            let mut r = v;
            for a in (0..rank).rev() {
                r = self.reduce(op, r, Some(a as i64), loc)?;
            }
            return Ok(r);
        };
        let a = resolve_axis(axis, rank, &format!("`{}`", op.name()), loc)?;
        let acc = op.accumulator(ty.dtype);
        let x = if acc != ty.dtype { self.cast(v, acc, loc)? } else { v };
        let mut shape = ty.shape.clone();
        shape.remove(a);
        let out = if op.is_arg() { DType::I32 } else { acc };
        Ok(self.emit(Op::Reduce { op, x, axis: a as u8 }, Type::block(out, shape), loc))
    }

    /// `x.cumsum(axis)`.
    pub fn scan(&mut self, op: ScanOp, x: impl Into<Operand>, axis: i64, loc: Loc) -> R<Value> {
        let v = self.value(x.into(), loc)?;
        let ty = self.ty(v).clone();
        if ty.ptr || ty.unit || ty.is_scalar() {
            return err(loc, format!("`{}` needs a block of numbers", op.name()));
        }
        let a = resolve_axis(axis, ty.shape.len(), &format!("`{}`", op.name()), loc)?;
        let acc = ReduceOp::Sum.accumulator(ty.dtype);
        let x = if acc != ty.dtype { self.cast(v, acc, loc)? } else { v };
        Ok(self.emit(Op::Scan { op, x, axis: a as u8 }, Type::block(acc, ty.shape), loc))
    }
}
