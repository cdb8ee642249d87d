//! Memory op family: pointer arithmetic, masked loads and stores, atomics.
//!
//! - `add_ptr(p, offs)`: `p` is a pointer (scalar or block) to elements of type `T`,
//!   `offs` an integer block; the result points `offs` *elements* further. Every pointer
//!   value derives from exactly one pointer parameter ([`Function::pointer_root`]): through
//!   `add_ptr`s, shape operations and loop-carried values. The bounds guard and the
//!   interpreter's bounds checks rely on that.
//! - `ptr_offset(p)`: how many elements `p` is past its parameter (`i64`; the guard's
//!   input, not reachable from the DSL).
//! - `load(p, mask, other)`: one element per pointer. Lanes whose mask is false do not
//!   touch memory and give `other` (zero when `other` is absent).
//! - `store(p, value, mask)`: lanes whose mask is false do not touch memory. The value's
//!   element type must equal the pointee type: stores never convert implicitly.
//! - `atomic_add/max/min/xchg(p, value, mask)` and `atomic_cas(p, cmp, value)`: for every
//!   masked-in element, one indivisible read-modify-write of global memory, giving the
//!   value that was there before. They have *acquire-release* semantics at *GPU* scope
//!   (Triton's default `sem="acq_rel"`, `scope="gpu"`): writes made before the atomic by
//!   this thread are visible to a thread that observes its result, and vice versa. Two
//!   elements of one block that address the same location are applied one after the
//!   other, in an unspecified order. Types: `add` on `i32`, `i64`, `f32`; `max`/`min` on
//!   `i32`, `i64`, `f32` (floats order like `maximum`, `-0.0 < 0.0`); `xchg` and `cas` on
//!   `i32`, `i64`, `f32` (`cas` compares bit patterns). Masked-off lanes give `0`.
//!   `atomic_add/max/min/xchg(p, value, mask, "relaxed")` (Triton's `sem="relaxed"`) are
//!   indivisible but order nothing else: for sums that are read after the kernel (a
//!   gradient accumulated by many programs), where a GPU lowers the update without
//!   fences, and without reading back when the result is unused (`red`).
//!
//! Lanes of one program that store to the same address store in an unspecified order;
//! programs run in an unspecified order and may run concurrently.
//!
//! Shared memory (per program, not reachable from the kernel language; made by compiler
//! passes such as software pipelining and by kernels built at run time):
//! - `local_alloc(init?)`: a buffer for one block of the given element type and shape,
//!   holding `init` when given, else unspecified values (the interpreter fills it with
//!   NaN or `i64::MIN` so that a read before a write shows). A buffer is live from its
//!   allocation to its last use (to the end of a loop that uses it, when allocated before
//!   the loop); the allocator gives buffers whose lifetimes overlap
//!   disjoint byte ranges. Buffers are not loop-carried, yielded or selected.
//! - `local_store(buf, value)`: overwrite the whole buffer with `value` (same element type
//!   and shape).
//! - `local_load(buf)`: the block the buffer holds.
//! - `local_trans(buf)`: a 2-D buffer seen transposed (`[d1, d0]`, the same bytes): a
//!   `local_load` through it gives the transpose of the block. Made by the operand
//!   staging pass so that `x` and `trans(x)` feeding tensor cores share one buffer.
//!
//! Every thread of the program sees a `local_store` in the next `local_load`: the lowering
//! inserts the barriers that need (`lower::smem`).

use super::builder::{err, R};
use super::{Builder, Function, Loc, Op, Operand, ParamKind, Type, Value};
use crate::DType;

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum AtomicOp {
    Add,
    Max,
    Min,
    Xchg,
    Cas,
}

impl AtomicOp {
    pub fn name(self) -> &'static str {
        match self {
            AtomicOp::Add => "atomic_add",
            AtomicOp::Max => "atomic_max",
            AtomicOp::Min => "atomic_min",
            AtomicOp::Xchg => "atomic_xchg",
            AtomicOp::Cas => "atomic_cas",
        }
    }
}

/// The memory instructions of `f` (nested regions included), in program order:
/// `(instruction, pointer operand)`.
pub fn memory_ops(f: &Function) -> Vec<(Value, Value)> {
    f.walk()
        .into_iter()
        .filter_map(|v| match f.inst(v).op {
            Op::Load { ptr, .. } | Op::Store { ptr, .. } | Op::Atomic { ptr, .. } | Op::AsyncCopy { ptr, .. } => Some((v, ptr)),
            _ => None,
        })
        .collect()
}

impl Builder {
    /// `local_alloc`: a shared-memory buffer for a block of `dtype` and `shape`, holding
    /// `init` (a block of that type and shape) when given.
    pub fn local_alloc(&mut self, dtype: DType, shape: &[usize], init: Option<Value>, loc: Loc) -> R<Value> {
        if shape.is_empty() || shape.contains(&0) {
            return err(loc, format!("a shared-memory buffer holds a block, not shape {shape:?}"));
        }
        if let Some(i) = init {
            let t = self.ty(i);
            if t.ptr || t.shared || t.dtype != dtype || t.shape != shape {
                return err(loc, format!("`local_alloc` of a {dtype} block of shape {shape:?} initialised with {t:?}"));
            }
        }
        Ok(self.emit(Op::LocalAlloc(init), Type::shared(dtype, shape.to_vec()), loc))
    }

    /// `local_store(buf, value)`: `value` must have the buffer's element type and shape.
    pub fn local_store(&mut self, buf: Value, value: Value, loc: Loc) -> R<Value> {
        let (bt, vt) = (self.ty(buf).clone(), self.ty(value).clone());
        if !bt.shared {
            return err(loc, "`local_store` needs a shared-memory buffer");
        }
        if vt.ptr || vt.shared || vt.dtype != bt.dtype || vt.shape != bt.shape {
            return err(loc, format!("`local_store` of a {} block of shape {:?} into a buffer of {} {:?}", vt.dtype, vt.shape, bt.dtype, bt.shape));
        }
        Ok(self.emit(Op::LocalStore { buf, value }, Type::unit(), loc))
    }

    /// `local_load(buf)`: the block the buffer holds.
    pub fn local_load(&mut self, buf: Value, loc: Loc) -> R<Value> {
        let bt = self.ty(buf).clone();
        if !bt.shared {
            return err(loc, "`local_load` needs a shared-memory buffer");
        }
        Ok(self.emit(Op::LocalLoad(buf), Type::block(bt.dtype, bt.shape), loc))
    }

    /// Check that `p` derives from a parameter the kernel may write.
    pub(super) fn writable_root(&self, p: Value, what: &str, loc: Loc) -> R<()> {
        match self.f.pointer_root(p).map(|i| self.f.params[i as usize].kind) {
            Some(ParamKind::Ptr { writable: true, .. }) => Ok(()),
            Some(_) => err(loc, format!("{what} through a pointer parameter that the kernel declared read-only")),
            None => err(loc, format!("cannot tell which pointer parameter this {what} writes")),
        }
    }

    /// `atomic_*(p, value, mask, sem)`; `cmp` for `atomic_cas`; `sem` `"acq_rel"` (the
    /// default) or `"relaxed"`.
    #[allow(clippy::too_many_arguments)]
    pub fn atomic(&mut self, op: AtomicOp, p: impl Into<Operand>, value: impl Into<Operand>, cmp: Option<Operand>, mask: Option<Operand>, sem: Option<&str>, loc: Loc) -> R<Value> {
        let relaxed = match sem {
            None | Some("acq_rel") => false,
            Some("relaxed") => true,
            Some(s) => return err(loc, format!("`{}` semantics {s:?}: write \"acq_rel\" (the default) or \"relaxed\"", op.name())),
        };
        let Operand::V(p) = p.into() else { return err(loc, format!("`{}` needs a pointer, found a literal", op.name())) };
        let pt = self.ty(p).clone();
        if !pt.ptr {
            return err(loc, format!("`{}` needs a pointer, found {}", op.name(), pt.dtype));
        }
        let elem = pt.dtype;
        let ok = match op {
            AtomicOp::Add | AtomicOp::Max | AtomicOp::Min | AtomicOp::Xchg | AtomicOp::Cas => matches!(elem, DType::I32 | DType::I64 | DType::F32),
        };
        if !ok {
            return err(loc, format!("`{}` is defined on i32, i64 and f32 buffers, not {elem}", op.name()));
        }
        self.writable_root(p, &format!("`{}`", op.name()), loc)?;
        let v = self.materialize(value.into(), elem, loc)?;
        if self.ty(v).ptr || self.ty(v).dtype != elem {
            return err(loc, format!("`{}` of a {} value through a pointer to {elem}; convert it with `as {elem}`", op.name(), self.ty(v).dtype));
        }
        let c = match cmp {
            Some(c) => {
                let c = self.materialize(c, elem, loc)?;
                if self.ty(c).ptr || self.ty(c).dtype != elem {
                    return err(loc, format!("the compared value of `atomic_cas` is {} but the pointer holds {elem}", self.ty(c).dtype));
                }
                Some(c)
            }
            None => None,
        };
        let m = match mask {
            Some(m) => {
                let m = self.materialize(m, DType::Bool, loc)?;
                if self.ty(m).dtype != DType::Bool || self.ty(m).ptr {
                    return err(loc, format!("the mask of `{}` must be bool", op.name()));
                }
                Some(m)
            }
            None => None,
        };
        // A scalar pointer broadcasts (every element updates the same location, in turn).
        let vals: Vec<Value> = [Some(p), Some(v), c, m].into_iter().flatten().collect();
        let shape = self.common_shape(&vals, loc)?;
        if shape != pt.shape && !pt.is_scalar() {
            return err(loc, format!("shape mismatch: `{}` of a block of shape {:?} through pointers of shape {:?}", op.name(), shape, pt.shape));
        }
        let p = self.broadcast_value(p, &shape, loc)?;
        let v = self.broadcast_value(v, &shape, loc)?;
        let c = c.map(|c| self.broadcast_value(c, &shape, loc)).transpose()?;
        let m = m.map(|m| self.broadcast_value(m, &shape, loc)).transpose()?;
        Ok(self.emit(Op::Atomic { op, ptr: p, value: v, cmp: c, mask: m, relaxed }, Type::block(elem, shape), loc))
    }
}

#[cfg(test)]
mod tests {
    use crate::ir::{BinOp, Builder, Loc, Operand, ParamKind};
    use crate::DType;

    #[test]
    fn buffers_are_only_stored_to_and_loaded_from() {
        let l = Loc::new(3, 1);
        let build = |misuse: bool| {
            let mut b = Builder::new("k", &[("x", ParamKind::Ptr { elem: DType::F32, writable: true })]);
            let offs = b.arange(0, 64, l).unwrap();
            let v = b.cast(offs, DType::F32, l).unwrap();
            let buf = b.local_alloc(DType::F32, &[64], Some(v), l).unwrap();
            let got = if misuse { b.binary(BinOp::Add, buf, Operand::Float(1.0), l) } else { b.local_load(buf, l) };
            let p = b.add_ptr(b.param(0), offs, l).unwrap();
            got.and_then(|g| b.store(p, g, None, l)).and_then(|_| b.finish())
        };
        let f = build(false).unwrap();
        assert!(f.to_string().contains("local_alloc") && f.to_string().contains("smem<f32[64]>"), "{f}");
        let e = build(true).unwrap_err();
        assert!(e.message.contains("shared-memory buffer"), "{}", e.message);
    }
}
