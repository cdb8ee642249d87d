//! Forward-mode derivatives of elementwise code just built: what
//! [`dsl::Derivative`](crate::dsl::Derivative) uses to differentiate an inlined
//! `#[kernel_fn]` with respect to its first argument (a flash-attention score
//! modification's `Grad` taken from its `Score`).
//!
//! [`Builder::derivative_since`] walks the instructions emitted since an arena index, in
//! order, carrying each one's derivative with respect to a value `x` (absent: zero), and
//! emits the derivative's instructions after them. The rules are the calculus of each
//! elementwise operation on floats: sums, products, quotients, `fma`, the math functions
//! (in terms of their results where that is cheaper: `exp`, `tanh`, `sigmoid`, `sqrt`),
//! `maximum`/`minimum` and `select` (the derivative of the branch taken), float
//! conversions, and the shape operations that move elements (`broadcast`, `expand_dims`,
//! `permute`, `reshape`). Comparisons, loads, constants and integer code have derivative
//! zero. Anything else that depends on `x` (a reduction, a product `dot`, a runtime `if` or
//! loop, a remainder) is an error naming it: give that derivative by hand.

use super::builder::{err, R};
use super::{BinOp, Builder, Loc, Op, Operand, UnaryOp, Value};
use crate::DType;
use std::collections::HashMap;

impl Builder {
    /// The number of values built so far: pass it to [`derivative_since`] to differentiate
    /// what is built after this point.
    ///
    /// [`derivative_since`]: Builder::derivative_since
    pub fn values_built(&self) -> usize {
        self.f.values.len()
    }

    /// `d result / d x` for the instructions emitted since value index `from` (see the
    /// [module docs](self)): an operand of `result`'s shape or a scalar that broadcasts to
    /// it (the literal 0 where `result` does not depend on `x`). `what` names the code in
    /// errors.
    pub fn derivative_since(&mut self, from: usize, x: Value, result: Operand, what: &str, loc: Loc) -> R<Operand> {
        let end = self.f.values.len();
        let mut d: HashMap<Value, Operand> = HashMap::new();
        d.insert(x, Operand::Float(1.0));
        for i in from..end {
            let v = Value(i as u32);
            let op = self.f.inst(v).op.clone();
            let got = |o: &Value| d.get(o).copied();
            let zero = Operand::Float(0.0);
            let dv = match op {
                Op::Binary(bop, a, b) => {
                    let (da, db) = (got(&a), got(&b));
                    if da.is_none() && db.is_none() {
                        continue;
                    }
                    let (da0, db0) = (da.unwrap_or(zero), db.unwrap_or(zero));
                    match bop {
                        BinOp::Add => self.sum(da, db, loc)?,
                        BinOp::Sub => match (da, db) {
                            (Some(p), None) => p,
                            (_, Some(q)) => {
                                let nq = Operand::V(self.unary(UnaryOp::Neg, q, loc)?);
                                self.sum(da, Some(nq), loc)?
                            }
                            (None, None) => unreachable!("checked above"),
                        },
                        // (a b)' = a' b + a b'
                        BinOp::Mul => {
                            let l = da.map(|p| self.binary(BinOp::Mul, p, b, loc)).transpose()?.map(Operand::V);
                            let r = db.map(|q| self.binary(BinOp::Mul, a, q, loc)).transpose()?.map(Operand::V);
                            self.sum(l, r, loc)?
                        }
                        // (a / b)' = (a' - (a / b) b') / b
                        BinOp::Div => {
                            let num = match db {
                                None => da0,
                                Some(q) => {
                                    let vq = self.binary(BinOp::Mul, v, q, loc)?;
                                    Operand::V(self.binary(BinOp::Sub, da0, vq, loc)?)
                                }
                            };
                            Operand::V(self.binary(BinOp::Div, num, b, loc)?)
                        }
                        // The derivative of the operand chosen (the first on ties).
                        BinOp::Max | BinOp::Min => {
                            let cmp = if bop == BinOp::Max { super::CmpOp::Ge } else { super::CmpOp::Le };
                            let c = self.cmp(cmp, a, b, loc)?;
                            Operand::V(self.select(c, da0, db0, loc)?)
                        }
                        other => return err(loc, format!("`{what}` is not differentiable automatically: `{}` of a value that depends on its first argument; give its derivative by hand", other.name())),
                    }
                }
                Op::Unary(uop, a) => {
                    let Some(da) = got(&a) else { continue };
                    let r = Operand::V(v);
                    let a = Operand::V(a);
                    // The factor f'(a), then f'(a) a'.
                    let f = match uop {
                        UnaryOp::Neg => Operand::Float(-1.0),
                        UnaryOp::Abs => {
                            let c = self.cmp(super::CmpOp::Ge, a, Operand::Float(0.0), loc)?;
                            Operand::V(self.select(c, Operand::Float(1.0), Operand::Float(-1.0), loc)?)
                        }
                        UnaryOp::Exp => r,
                        UnaryOp::Exp2 => Operand::V(self.binary(BinOp::Mul, r, Operand::Float(std::f64::consts::LN_2), loc)?),
                        UnaryOp::Log => Operand::V(self.binary(BinOp::Div, Operand::Float(1.0), a, loc)?),
                        UnaryOp::Log2 => {
                            let al = self.binary(BinOp::Mul, a, Operand::Float(std::f64::consts::LN_2), loc)?;
                            Operand::V(self.binary(BinOp::Div, Operand::Float(1.0), al, loc)?)
                        }
                        UnaryOp::Sqrt => Operand::V(self.binary(BinOp::Div, Operand::Float(0.5), r, loc)?),
                        // rsqrt(a)' = -rsqrt(a) / (2 a)
                        UnaryOp::Rsqrt => {
                            let two_a = self.binary(BinOp::Mul, a, Operand::Float(-2.0), loc)?;
                            Operand::V(self.binary(BinOp::Div, r, two_a, loc)?)
                        }
                        UnaryOp::Sin => Operand::V(self.unary(UnaryOp::Cos, a, loc)?),
                        UnaryOp::Cos => {
                            let s = self.unary(UnaryOp::Sin, a, loc)?;
                            Operand::V(self.unary(UnaryOp::Neg, s, loc)?)
                        }
                        // 1 - tanh^2
                        UnaryOp::Tanh => {
                            let r2 = self.binary(BinOp::Mul, r, r, loc)?;
                            Operand::V(self.binary(BinOp::Sub, Operand::Float(1.0), r2, loc)?)
                        }
                        // s (1 - s)
                        UnaryOp::Sigmoid => {
                            let c = self.binary(BinOp::Sub, Operand::Float(1.0), r, loc)?;
                            Operand::V(self.binary(BinOp::Mul, r, c, loc)?)
                        }
                        UnaryOp::Not => continue,
                    };
                    Operand::V(self.binary(BinOp::Mul, f, da, loc)?)
                }
                Op::Select(c, a, b) => {
                    let (da, db) = (got(&a), got(&b));
                    if da.is_none() && db.is_none() {
                        continue;
                    }
                    Operand::V(self.select(c, da.unwrap_or(zero), db.unwrap_or(zero), loc)?)
                }
                // (a b + c)' = a' b + a b' + c'
                Op::Fma(a, b, c) => {
                    let (da, db, dc) = (got(&a), got(&b), got(&c));
                    if da.is_none() && db.is_none() && dc.is_none() {
                        continue;
                    }
                    let l = da.map(|p| self.binary(BinOp::Mul, p, b, loc)).transpose()?.map(Operand::V);
                    let r = db.map(|q| self.binary(BinOp::Mul, a, q, loc)).transpose()?.map(Operand::V);
                    let lr = if l.is_none() && r.is_none() { None } else { Some(self.sum(l, r, loc)?) };
                    self.sum(lr, dc, loc)?
                }
                Op::Cast(a) => {
                    let Some(da) = got(&a) else { continue };
                    let to = self.f.inst(v).ty.dtype;
                    if !to.is_float() || !self.ty(a).dtype.is_float() {
                        continue;
                    }
                    Operand::V(self.cast(da, to, loc)?)
                }
                Op::Broadcast(a) | Op::Splat(a) => {
                    let Some(da) = got(&a) else { continue };
                    let shape = self.f.inst(v).ty.shape.clone();
                    let da = self.materialize(da, DType::F32, loc)?;
                    Operand::V(self.broadcast_value(da, &shape, loc)?)
                }
                Op::ExpandDims(a, axis) => match got(&a) {
                    Some(Operand::V(da)) if !self.ty(da).is_scalar() => Operand::V(self.expand_dims(da, axis as i64, loc)?),
                    Some(lit) => lit,
                    None => continue,
                },
                Op::Permute(a, ref perm) => match got(&a) {
                    Some(Operand::V(da)) if !self.ty(da).is_scalar() => {
                        let p: Vec<i64> = perm.iter().map(|&x| x as i64).collect();
                        Operand::V(self.permute(da, &p, loc)?)
                    }
                    Some(lit) => lit,
                    None => continue,
                },
                Op::Reshape(a) => match got(&a) {
                    Some(Operand::V(da)) if !self.ty(da).is_scalar() => {
                        let s: Vec<i64> = self.f.inst(v).ty.shape.iter().map(|&x| x as i64).collect();
                        Operand::V(self.reshape(da, &s, loc)?)
                    }
                    Some(lit) => lit,
                    None => continue,
                },
                // No derivative: comparisons, loads, constants, indices, pointers.
                Op::Cmp(..) | Op::Load { .. } | Op::Const(_) | Op::Param(_) | Op::Arange { .. } | Op::ProgramId(_) | Op::NumPrograms(_) | Op::AddPtr(..) | Op::PtrOffset(_) => continue,
                other => {
                    if other.operands().iter().any(|o| d.contains_key(o)) {
                        let dbg = format!("{other:?}");
                        let name = dbg.split(['(', ' ', '{']).next().unwrap_or("an operation");
                        return err(loc, format!("`{what}` is not differentiable automatically: a value that depends on its first argument goes through `{name}`; give its derivative by hand"));
                    }
                    continue;
                }
            };
            d.insert(v, dv);
        }
        Ok(match result {
            Operand::V(r) => d.get(&r).copied().unwrap_or(Operand::Float(0.0)),
            _ => Operand::Float(0.0),
        })
    }

    /// `a + b` of two derivatives, either absent (zero).
    fn sum(&mut self, a: Option<Operand>, b: Option<Operand>, loc: Loc) -> R<Operand> {
        Ok(match (a, b) {
            (Some(p), Some(q)) => Operand::V(self.binary(BinOp::Add, p, q, loc)?),
            (Some(p), None) | (None, Some(p)) => p,
            (None, None) => Operand::Float(0.0),
        })
    }
}
