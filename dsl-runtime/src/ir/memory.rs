//! Memory op family: pointer arithmetic, masked loads and stores.
//!
//! - `add_ptr(p, offs)`: `p` is a pointer (scalar or block) to elements of type `T`,
//!   `offs` an integer block; the result points `offs` *elements* further. Every pointer
//!   value derives from exactly one pointer parameter through a chain of `add_ptr`s
//!   ([`Function::pointer_root`](super::Function::pointer_root)); the bounds guard and the
//!   interpreter's bounds checks rely on that.
//! - `load(p, mask, other)`: one element per pointer. Lanes whose mask is false do not
//!   touch memory and give `other` (zero when `other` is absent).
//! - `store(p, value, mask)`: lanes whose mask is false do not touch memory. The value's
//!   element type must equal the pointee type: stores never convert implicitly.
//!
//! Lanes of one program that store to the same address store in an unspecified order;
//! programs run in an unspecified order and may run concurrently.

use super::{Function, Op, Value};

/// The memory instructions of `f`, in program order: `(instruction, pointer operand)`.
pub fn memory_ops(f: &Function) -> Vec<(Value, Value)> {
    f.body
        .insts
        .iter()
        .filter_map(|&v| match f.inst(v).op {
            Op::Load { ptr, .. } | Op::Store { ptr, .. } => Some((v, ptr)),
            _ => None,
        })
        .collect()
}
