//! Element types of block tensors and of the buffers that kernels read and write.
//!
//! [`DType`] is the IR's scalar type; [`Element`] ties a Rust type (`f32`, [`half::bf16`],
//! ...) to it, so that typed launch arguments are checked by the Rust compiler and host
//! buffers can be read and written by the interpreter.

use std::fmt;

/// A scalar element type. Pointers are not a `DType`: an IR [`Type`](crate::ir::Type) is
/// "a block of `DType`" or "a block of pointers to `DType`".
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub enum DType {
    /// Predicates: comparison results and masks. Never stored through a pointer.
    Bool,
    U8,
    I32,
    I64,
    F16,
    BF16,
    F32,
}

impl DType {
    /// All element types, in promotion order inside each family.
    pub const ALL: [DType; 7] =
        [DType::Bool, DType::U8, DType::I32, DType::I64, DType::F16, DType::BF16, DType::F32];

    /// Size in bytes in memory (`Bool` is one byte, though it never reaches memory).
    pub fn size(self) -> usize {
        match self {
            DType::Bool | DType::U8 => 1,
            DType::F16 | DType::BF16 => 2,
            DType::I32 | DType::F32 => 4,
            DType::I64 => 8,
        }
    }
    pub fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32)
    }
    pub fn is_int(self) -> bool {
        matches!(self, DType::U8 | DType::I32 | DType::I64)
    }
    pub fn is_signed(self) -> bool {
        matches!(self, DType::I32 | DType::I64)
    }
    /// The DSL spelling (`f32`, `bf16`, `bool`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::U8 => "u8",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
        }
    }
    pub fn from_name(s: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == s)
    }

    /// The result type of a binary arithmetic operation on two typed operands.
    ///
    /// Integers widen to the wider integer (`u8` with a signed type gives the signed
    /// type); any float with an integer gives the float; two different 16-bit floats give
    /// `f32`; a 16-bit float with `f32` gives `f32`. `Bool` does not take part.
    pub fn promote(a: DType, b: DType) -> Option<DType> {
        use DType::*;
        if a == b {
            return Some(a);
        }
        match (a, b) {
            (Bool, _) | (_, Bool) => None,
            (x, y) if x.is_int() && y.is_int() => Some(if x.size() >= y.size() { x } else { y }),
            (x, y) if x.is_float() && y.is_int() => Some(x),
            (x, y) if x.is_int() && y.is_float() => Some(y),
            _ => Some(F32), // two different floats
        }
    }

    /// Round `x` to the nearest value representable in this type (floats), or wrap it
    /// to the type's range (integers). This is the interpreter's model of a register.
    pub fn round(self, x: f64) -> f64 {
        match self {
            DType::F32 => x as f32 as f64,
            DType::F16 => half::f16::from_f32(x as f32).to_f64(),
            DType::BF16 => half::bf16::from_f32(x as f32).to_f64(),
            _ => x,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust type that can be the element of a kernel's pointer parameter.
///
/// Implemented for `u8`, `i32`, `i64`, [`half::f16`], [`half::bf16`] and `f32`; sealed,
/// because the interpreter and the launch code rely on the exact layout of each.
pub trait Element: Copy + Send + Sync + 'static + sealed::Sealed + cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits {
    const DTYPE: DType;
    /// Exact conversion to `f64` (integers up to 2^53, which every test uses).
    fn to_f64(self) -> f64;
    /// Conversion from an already-rounded `f64` (see [`DType::round`]).
    fn from_f64(x: f64) -> Self;
    /// Integers are read as `i64` by the interpreter, exactly.
    fn to_i64(self) -> i64;
    fn from_i64(x: i64) -> Self;
}

macro_rules! element {
    ($t:ty, $d:ident, $to:expr, $from:expr, $toi:expr, $fromi:expr) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            fn to_f64(self) -> f64 {
                ($to)(self)
            }
            fn from_f64(x: f64) -> Self {
                ($from)(x)
            }
            fn to_i64(self) -> i64 {
                ($toi)(self)
            }
            fn from_i64(x: i64) -> Self {
                ($fromi)(x)
            }
        }
    };
}
element!(u8, U8, |v: u8| v as f64, |x: f64| x as u8, |v: u8| v as i64, |x: i64| x as u8);
element!(i32, I32, |v: i32| v as f64, |x: f64| x as i32, |v: i32| v as i64, |x: i64| x as i32);
element!(i64, I64, |v: i64| v as f64, |x: f64| x as i64, |v: i64| v, |x: i64| x);
element!(f32, F32, |v: f32| v as f64, |x: f64| x as f32, |v: f32| v as i64, |x: i64| x as f32);
element!(half::f16, F16, |v: half::f16| v.to_f64(), half::f16::from_f64, |v: half::f16| v.to_f64() as i64, |x: i64| half::f16::from_f64(x as f64));
element!(half::bf16, BF16, |v: half::bf16| v.to_f64(), half::bf16::from_f64, |v: half::bf16| v.to_f64() as i64, |x: i64| half::bf16::from_f64(x as f64));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn promotion_follows_the_documented_rules() {
        use DType::*;
        assert_eq!(DType::promote(I32, I64), Some(I64));
        assert_eq!(DType::promote(U8, I32), Some(I32));
        assert_eq!(DType::promote(I32, BF16), Some(BF16));
        assert_eq!(DType::promote(F16, BF16), Some(F32));
        assert_eq!(DType::promote(BF16, F32), Some(F32));
        assert_eq!(DType::promote(Bool, I32), None);
    }

    #[test]
    fn rounding_matches_half() {
        let x = 1.0 + 1.0 / 512.0; // not representable in bf16 (7 mantissa bits)
        assert_eq!(DType::BF16.round(x), 1.0);
        assert_eq!(DType::F16.round(x), x);
        assert_eq!(DType::from_name("bf16"), Some(DType::BF16));
    }
}
