//! Debug op family: device-side `assert` and `print`.
//!
//! - `device_assert(cond, "message")`: every element of `cond` must be true; where one is
//!   not, the program stops with the message and the kernel's source line. On the GPU
//!   this is CUDA's `__assertfail` (the launch's next synchronization reports
//!   `CUDA_ERROR_ASSERT` and the driver prints the message); the interpreter returns an
//!   error naming the line and the element.
//! - `device_print("prefix", x, ..)`: prints the prefix and the values, one line per
//!   element and thread on the GPU (CUDA's `printf`), one line per program in the
//!   interpreter.
//!
//! Both exist only in debug builds (`RUTILE_DEBUG=1` or [`LaunchConfig::debug`]); in
//! other builds the simplify pass removes them, so they cost
//! nothing. The flag is part of the cache key.
//!
//! [`LaunchConfig::debug`]: crate::LaunchConfig::debug

use super::builder::{err, R};
use super::{Builder, Loc, Op, Operand, Type};
use crate::DType;

impl Builder {
    /// `device_assert(cond, msg)`.
    pub fn assert(&mut self, cond: impl Into<Operand>, msg: &str, loc: Loc) -> R<()> {
        let c = self.materialize(cond.into(), DType::Bool, loc)?;
        if self.ty(c).dtype != DType::Bool || self.ty(c).ptr {
            return err(loc, format!("`device_assert` needs a mask (bool), found {}", self.ty(c).dtype));
        }
        self.emit(Op::Assert { cond: c, msg: msg.to_string() }, Type::unit(), loc);
        Ok(())
    }

    /// `device_print(prefix, values..)`.
    pub fn print(&mut self, prefix: &str, args: &[Operand], loc: Loc) -> R<()> {
        let mut vals = vec![];
        for &a in args {
            let v = self.value(a, loc)?;
            if self.ty(v).ptr || self.ty(v).unit {
                return err(loc, "`device_print` prints numbers and masks, not pointers");
            }
            vals.push(v);
        }
        let shape = self.common_shape(&vals, loc)?;
        let mut out = vec![];
        for v in vals {
            out.push(self.broadcast_value(v, &shape, loc)?);
        }
        self.emit(Op::Print { prefix: prefix.to_string(), args: out }, Type::unit(), loc);
        Ok(())
    }
}
