//! Dot op family: `dot(a, b, acc)`, the block matrix product (Triton's `tl.dot`).
//!
//! - `a` is `[M, K]`, `b` is `[K, N]`, `acc` (optional, zeros when absent) is `[M, N]`;
//!   the result is `acc + a @ b`, `[M, N]`, in the accumulator's type. `M`, `N` and `K` are
//!   powers of two of at least 16 (the smallest tensor-core tiles; other blocks are a
//!   build error).
//! - Input types: `bf16 x bf16` and `f16 x f16` accumulate in `f32`; `f32 x f32` in `f32`
//!   at a declared [`DotPrecision`]: `tf32` (the default, as in Triton: each input
//!   truncated to tf32, 10 mantissa bits, before an exact product: the tensor cores ignore
//!   the low 13 bits of an f32 register, and Triton feeds them unconverted), `tf32x3`
//!   (three tf32 products that recover about f32 accuracy) or `ieee` (f32 products).
//! - Every product is exact and the sum is accumulated in f32 in an unspecified order
//!   (the interpreter adds `k = 0, 1, ...` after `acc`; tensor cores add in groups), so
//!   results may differ in the last bits of f32.
//!
//! The interpreter is the specification. On the GPU, bf16 and f16 inputs lower to
//! `mma.sync` m16n8k16 and f32 at `tf32` to `mma.sync` m16n8k8 (the lowering's `dot`
//! family file); `tf32x3` and `ieee` are not lowered yet, a clear error naming the line.

use super::builder::{err, R};
use super::{Builder, Loc, Op, Operand, Type, Value};
use crate::DType;

/// How `f32` inputs of a `dot` are multiplied.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub enum DotPrecision {
    /// Inputs truncated to tf32 (the low 13 mantissa bits dropped, toward zero: what the
    /// tensor cores do with an f32 register, and what Triton's `tf32` computes). Relative
    /// error below 2^-10 per input; `cvt.rna.tf32` rounding would halve it at two
    /// instructions per operand register, which made the f32 matmul issue-bound.
    #[default]
    Tf32,
    /// Three tf32 products (`a_hi b_hi + a_hi b_lo + a_lo b_hi`): about f32 accuracy.
    Tf32x3,
    /// f32 products.
    Ieee,
}

impl DotPrecision {
    pub fn name(self) -> &'static str {
        match self {
            DotPrecision::Tf32 => "tf32",
            DotPrecision::Tf32x3 => "tf32x3",
            DotPrecision::Ieee => "ieee",
        }
    }
}

/// `x` truncated to tf32: 10 explicit mantissa bits, the others dropped (toward zero).
/// Infinities and NaNs stay what they are.
pub fn truncate_tf32(x: f32) -> f32 {
    if !x.is_finite() {
        return x;
    }
    f32::from_bits(x.to_bits() & !((1 << 13) - 1))
}

/// One product of a `dot` in f32 arithmetic as the precision defines it (exact in f64).
pub fn product(p: DotPrecision, d: DType, a: f64, b: f64) -> f64 {
    match (d, p) {
        (DType::F32, DotPrecision::Tf32) => truncate_tf32(a as f32) as f64 * truncate_tf32(b as f32) as f64,
        (DType::F32, DotPrecision::Tf32x3) => {
            let (ah, bh) = (truncate_tf32(a as f32), truncate_tf32(b as f32));
            let (al, bl) = (truncate_tf32(a as f32 - ah), truncate_tf32(b as f32 - bh));
            ah as f64 * bh as f64 + (ah as f64 * bl as f64 + al as f64 * bh as f64)
        }
        _ => a * b,
    }
}

impl Builder {
    /// `dot(a, b, acc, "precision")` as kernels write it: operands, an optional
    /// accumulator, and an optional precision name (`"tf32"`, `"tf32x3"`, `"ieee"`).
    pub fn dot_call(&mut self, a: impl Into<Operand>, b: impl Into<Operand>, acc: Option<Operand>, precision: Option<&str>, loc: Loc) -> R<Value> {
        let precision = match precision {
            None | Some("tf32") => DotPrecision::Tf32,
            Some("tf32x3") => DotPrecision::Tf32x3,
            Some("ieee") => DotPrecision::Ieee,
            Some(p) => return err(loc, format!("`dot` precision {p:?}: write \"tf32\", \"tf32x3\" or \"ieee\"")),
        };
        let (a, b) = (self.value(a.into(), loc)?, self.value(b.into(), loc)?);
        let acc = acc.map(|c| self.value(c, loc)).transpose()?;
        self.dot(a, b, acc, precision, loc)
    }

    /// `dot(a, b, acc)`: `acc + a @ b` (module doc); `acc` zeros when `None`.
    pub fn dot(&mut self, a: Value, b: Value, acc: Option<Value>, precision: DotPrecision, loc: Loc) -> R<Value> {
        let (ta, tb) = (self.ty(a).clone(), self.ty(b).clone());
        for (t, what) in [(&ta, "first"), (&tb, "second")] {
            if t.ptr || t.shared || t.shape.len() != 2 {
                return err(loc, format!("`dot` multiplies 2-D blocks; its {what} operand is {t}"));
            }
        }
        let (m, k, k2, n) = (ta.shape[0], ta.shape[1], tb.shape[0], tb.shape[1]);
        if k != k2 {
            return err(loc, format!("`dot` of [{m}, {k}] and [{k2}, {n}]: the inner dimensions differ ({k} and {k2})"));
        }
        if ![m, n, k].iter().all(|d| d.is_power_of_two()) {
            return err(loc, format!("`dot` of [{m}, {k}] and [{k}, {n}]: M, N and K must be powers of two (mask the edges of a larger block instead)"));
        }
        if m < 16 || n < 16 || k < 16 {
            return err(loc, format!("`dot` of [{m}, {k}] and [{k}, {n}]: M, N and K must be at least 16 (the smallest tensor-core tiles)"));
        }
        let out = match (ta.dtype, tb.dtype) {
            (DType::BF16, DType::BF16) | (DType::F16, DType::F16) | (DType::F32, DType::F32) => DType::F32,
            (x, y) => return err(loc, format!("`dot` of {x} and {y}: the inputs must both be bf16, both f16 or both f32")),
        };
        let shape = vec![m, n];
        let acc = match acc {
            Some(c) => {
                let tc = self.ty(c).clone();
                if tc.ptr || tc.shared || tc.dtype != out || tc.shape != shape {
                    return err(loc, format!("the accumulator of `dot` must be a {out} block of shape [{m}, {n}], found {tc}"));
                }
                c
            }
            None => {
                let z = self.constant(super::ConstVal::Float(0.0), out, loc)?;
                self.broadcast_value(z, &shape, loc)?
            }
        };
        Ok(self.emit(Op::Dot { a, b, acc, precision }, Type::block(out, shape), loc))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tf32_keeps_ten_mantissa_bits_truncating() {
        assert_eq!(truncate_tf32(1.0), 1.0);
        let ulp = 2f32.powi(-10);
        assert_eq!(truncate_tf32(1.0 + ulp / 4.0), 1.0);
        assert_eq!(truncate_tf32(1.0 + 3.0 * ulp / 4.0), 1.0, "toward zero, not to nearest");
        assert_eq!(truncate_tf32(-(1.0 + 3.0 * ulp / 4.0)), -1.0);
        assert_eq!(truncate_tf32(1.0 + ulp + ulp / 2.0), 1.0 + ulp);
        assert_eq!(truncate_tf32(f32::INFINITY), f32::INFINITY);
        assert!(truncate_tf32(f32::NAN).is_nan());
        // tf32x3 recovers about f32 accuracy where tf32 alone does not.
        // Both inputs lose their low bits to tf32 (less than a tf32 ulp each); the low
        // parts are nearly exact in tf32, and only their product (~1e-7) is dropped.
        let (a, b) = (1.0 + 3.0 * 2f64.powi(-13), 1.0 - 5.0 * 2f64.powi(-14));
        let exact = a * b;
        assert!((product(DotPrecision::Tf32, DType::F32, a, b) - exact).abs() > 1e-5);
        assert!((product(DotPrecision::Tf32x3, DType::F32, a, b) - exact).abs() < 2e-7);
        assert_eq!(product(DotPrecision::Ieee, DType::F32, a, b), exact);
    }
}
