//! Shape op family: `expand_dims`, `broadcast`, `permute` (`trans`), `reshape`, `full`.
//!
//! - `expand_dims(x, axis)` inserts a dimension of size 1 (Triton's `x[:, None]` is
//!   `x.col()`, `x[None, :]` is `x.row()`);
//! - `broadcast(x)` repeats `x` along its dimensions of size 1 to the result's shape. The
//!   builder inserts it (NumPy's rules) wherever operands of different shapes meet, so
//!   `offs_m.col() * stride + offs_n.row()` is a 2-D block of offsets;
//! - `permute(x, perm)`: result dimension `i` is operand dimension `perm[i]`; `trans` is
//!   `permute(x, [1, 0])`;
//! - `reshape(x, shape)` keeps the elements in row-major order. Its dimensions must be
//!   powers of two on both sides (padding would move elements);
//! - `full(shape, value)` is a block with every element `value` (a splat of a constant).
//!
//! None of them moves data in the IR's semantics; in the lowering, `expand_dims` and
//! `broadcast` are free (a layout maps several threads or registers to one element),
//! `permute` relabels the layout, and the layout pass decides where a conversion through
//! shared memory is worth it (a transpose loads and stores coalesced on both sides).

use super::builder::{err, fmt_shape, MAX_BLOCK_ELEMENTS, R};
use super::{Builder, ConstVal, Loc, Op, Operand, Type, Value};
use crate::DType;

fn check_shape(shape: &[usize], loc: Loc) -> R<()> {
    if shape.contains(&0) {
        return err(loc, format!("block shape {} has an empty dimension", fmt_shape(shape)));
    }
    let padded: usize = shape.iter().map(|d| d.next_power_of_two()).product();
    if padded > MAX_BLOCK_ELEMENTS {
        return err(loc, format!("block shape {} is larger than the limit of 2^20 elements (after padding each dimension to a power of two)", fmt_shape(shape)));
    }
    if shape.len() > 3 {
        return err(loc, format!("blocks have at most 3 dimensions, {} has {}", fmt_shape(shape), shape.len()));
    }
    Ok(())
}

/// A negative axis counts from the end (`-1` is the last dimension).
pub(super) fn resolve_axis(axis: i64, rank: usize, what: &str, loc: Loc) -> R<usize> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if !(0..r).contains(&a) {
        return err(loc, format!("{what} axis {axis} does not exist in a block of rank {rank}"));
    }
    Ok(a as usize)
}

impl Builder {
    fn block_value(&mut self, x: Operand, what: &str, loc: Loc) -> R<Value> {
        let v = self.value(x, loc)?;
        if self.ty(v).unit {
            return err(loc, format!("`{what}` needs a value"));
        }
        Ok(v)
    }

    /// `expand_dims(x, axis)`: a new dimension of size 1 at `axis` (0..=rank; negative
    /// counts from the end, `-1` appends).
    pub fn expand_dims(&mut self, x: impl Into<Operand>, axis: i64, loc: Loc) -> R<Value> {
        let v = self.block_value(x.into(), "expand_dims", loc)?;
        let ty = self.ty(v).clone();
        let a = resolve_axis(axis, ty.shape.len() + 1, "expand_dims", loc)?;
        let mut shape = ty.shape.clone();
        shape.insert(a, 1);
        check_shape(&shape, loc)?;
        if ty.is_scalar() {
            return Ok(self.emit(Op::Splat(v), ty.with_shape(shape), loc));
        }
        Ok(self.emit(Op::ExpandDims(v, a as u8), ty.with_shape(shape), loc))
    }

    /// `broadcast_to(x, shape)` (NumPy's rules).
    pub fn broadcast_to(&mut self, x: impl Into<Operand>, shape: &[i64], loc: Loc) -> R<Value> {
        let v = self.block_value(x.into(), "broadcast_to", loc)?;
        let shape = dims(shape, loc)?;
        check_shape(&shape, loc)?;
        self.broadcast_value(v, &shape, loc)
    }

    /// `permute(x, perm)`: result dimension `i` is dimension `perm[i]` of `x`.
    pub fn permute(&mut self, x: impl Into<Operand>, perm: &[i64], loc: Loc) -> R<Value> {
        let v = self.block_value(x.into(), "permute", loc)?;
        let ty = self.ty(v).clone();
        let r = ty.shape.len();
        let mut sorted: Vec<i64> = perm.to_vec();
        sorted.sort();
        if perm.len() != r || sorted != (0..r as i64).collect::<Vec<_>>() {
            return err(loc, format!("{perm:?} is not a permutation of the {r} dimensions of a block of shape {}", fmt_shape(&ty.shape)));
        }
        if perm.iter().enumerate().all(|(i, &p)| p == i as i64) {
            return Ok(v);
        }
        let shape = perm.iter().map(|&p| ty.shape[p as usize]).collect();
        Ok(self.emit(Op::Permute(v, perm.iter().map(|&p| p as u8).collect()), ty.with_shape(shape), loc))
    }

    /// `trans(x)`: swap the two dimensions of a 2-D block.
    pub fn trans(&mut self, x: impl Into<Operand>, loc: Loc) -> R<Value> {
        let v = self.block_value(x.into(), "trans", loc)?;
        let r = self.ty(v).shape.len();
        if r != 2 {
            return err(loc, format!("`trans` swaps the dimensions of a 2-D block, found rank {r}; use `permute(x, [..])`"));
        }
        self.permute(v, &[1, 0], loc)
    }

    /// `reshape(x, shape)`: same elements, row-major order.
    pub fn reshape(&mut self, x: impl Into<Operand>, shape: &[i64], loc: Loc) -> R<Value> {
        let v = self.block_value(x.into(), "reshape", loc)?;
        let ty = self.ty(v).clone();
        let shape = dims(shape, loc)?;
        check_shape(&shape, loc)?;
        if shape.iter().product::<usize>() != ty.numel() {
            return err(loc, format!("cannot reshape a block of shape {} ({} elements) to {}", fmt_shape(&ty.shape), ty.numel(), fmt_shape(&shape)));
        }
        if ty.shape.iter().chain(&shape).any(|d| !d.is_power_of_two()) {
            return err(loc, format!("`reshape` from {} to {} needs power-of-two dimensions (padding would move elements)", fmt_shape(&ty.shape), fmt_shape(&shape)));
        }
        if shape == ty.shape {
            return Ok(v);
        }
        if ty.is_scalar() {
            return Ok(self.emit(Op::Splat(v), ty.with_shape(shape), loc));
        }
        Ok(self.emit(Op::Reshape(v), ty.with_shape(shape), loc))
    }

    /// `full(shape, value)` with element type `dtype` (`zeros` is `full(shape, 0)`).
    pub fn full(&mut self, shape: &[i64], value: impl Into<Operand>, dtype: DType, loc: Loc) -> R<Value> {
        let shape = dims(shape, loc)?;
        check_shape(&shape, loc)?;
        let c = match value.into() {
            Operand::V(v) => {
                let v = self.cast(v, dtype, loc)?;
                if !self.ty(v).is_scalar() {
                    return err(loc, "`full` takes a scalar value");
                }
                v
            }
            Operand::Float(x) if dtype.is_int() => self.constant(ConstVal::Int(x as i64), dtype, loc)?,
            c => self.materialize(c, dtype, loc)?,
        };
        if shape.is_empty() {
            return Ok(c);
        }
        Ok(self.emit(Op::Splat(c), Type::block(dtype, shape), loc))
    }
}

fn dims(shape: &[i64], loc: Loc) -> R<Vec<usize>> {
    shape
        .iter()
        .map(|&d| if d > 0 { Ok(d as usize) } else { err(loc, format!("block dimensions must be positive, found {d}")) })
        .collect()
}
