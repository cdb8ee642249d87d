//! Code generation: one fusion [`Group`] to one [`IrKernel`], through the IR builder.
//!
//! The kernel runs over the group's iteration space flattened to 1-D, `block` elements per
//! program, the tail masked:
//!
//! ```text
//! kernel @graph_k0(%x0: ptr<f32>, %x1: ptr<f32>, %y0: ptr<f32> mut, %n: i32)
//!   offs = program_id(0) * BLOCK + arange(0, BLOCK);  mask = offs < n
//!   loads: each source once, at its index map
//!   nodes: each once, in topological order
//!   stores: each stored value once, at offs
//! ```
//!
//! **Index maps.** A value of shape `s` read in an iteration space of shape `S` (`s`
//! broadcasts to `S`, aligned on the right) is at offset `sum_j coord_j(offs) * stride_j`,
//! where `coord_j = (offs / inner_j) % S_j` and `stride_j` is `s`'s row-major stride, 0
//! along broadcast dimensions. Runs of dimensions that are not broadcast merge into one
//! term, dimensions of size 1 vanish, the outermost `%` and divisions by 1 are left out:
//! a contiguous read is `offs` itself; `[1000]` in `[3, 1000]` is `offs % 1000`; a
//! one-element value is a scalar load. Coordinates and offsets are computed once per
//! kernel and shared by every load that needs them. Nothing is materialised.
//!
//! **Rows.** A group over `Rows(shape)` (it holds reductions along the last axis, of
//! length `R`) runs `ROWS` rows per program, each row in one block of `BLOCK >= R` lanes
//! (short rows share a program, so that its threads have work):
//!
//! ```text
//!   row = program_id(0) * ROWS + arange(0, ROWS)[:, None];  row0 = row * R
//!   offs = row0 + arange(0, BLOCK)[None, :];  mask = (arange < R) & (row0 < n)
//!   a node whose last axis is R: a [ROWS, BLOCK] block, loaded at its index map of offs
//!   a node whose last axis is 1 (a reduction's result, a per-row input): [ROWS, 1],
//!     loaded at its index map of row0
//!   reduce(x): where(mask, x, identity) reduced along axis 1 (in f32 for 16-bit x)
//!   stores: blocks at offs, per-row values at the row's index (masked)
//! ```
//!
//! so softmax loads its row once, keeps it in registers through both reductions, and
//! stores it once.
//!
//! The kernel's identity is the hash of its IR ([`IrKernel`]): two graphs that generate
//! the same code share a compiled kernel. Contiguous groups do not depend on the element
//! count (`n` is a parameter), so one kernel serves every length.

use super::fuse::Group;
use super::{Node, NodeId, Op, Reduction};
use dsl_runtime::ir::{BinOp, Builder, CmpOp, ConstVal, Loc, Operand, ParamKind, ReduceOp, Value};
use dsl_runtime::{BuildError, DType, IrKernel};
use std::collections::HashMap;
use std::sync::Arc;

/// What the kernel body needs, owned (the body is a `'static` closure).
struct Spec {
    shape: Vec<usize>,
    /// Rows groups: the row length (the last axis of `shape`), and rows per program.
    row: Option<usize>,
    rows_per_program: usize,
    block: usize,
    /// Every node the group loads or computes.
    nodes: HashMap<NodeId, Node>,
    loads: Vec<NodeId>,
    computed: Vec<NodeId>,
    stores: Vec<NodeId>,
}

/// The longest row a rows group holds in one program (its block, in registers).
pub const MAX_ROW: usize = 16384;

/// The kernel of `group` (`graph_nodes`: the graph's nodes by id), `block` elements per
/// program (a power of two; for a rows group, at least its row length, and
/// `rows_per_program` rows of it), named `name`.
/// Parameters: one read-only pointer per load (`x0`, `x1`, ...), one writable pointer per
/// store (`y0`, ...), then `n: i32`, the number of elements of the iteration space.
pub fn kernel(name: &str, graph_nodes: &[Node], group: &Group, block: usize, rows_per_program: usize) -> dsl_runtime::Result<IrKernel> {
    let node = |id: NodeId| graph_nodes[id.index()].clone();
    let mut params: Vec<(String, ParamKind)> = vec![];
    for (i, (id, _)) in group.loads.iter().enumerate() {
        params.push((format!("x{i}"), ParamKind::Ptr { elem: storage(node(*id).dtype), writable: false }));
    }
    for (i, (id, _)) in group.stores.iter().enumerate() {
        params.push((format!("y{i}"), ParamKind::Ptr { elem: storage(node(*id).dtype), writable: true }));
    }
    params.push(("n".into(), ParamKind::Scalar(DType::I32)));
    let all = group.loads.iter().map(|l| l.0).chain(group.nodes.iter().copied()).chain(group.stores.iter().map(|s| s.0));
    let spec = Arc::new(Spec {
        shape: group.shape.clone(),
        row: group.row,
        rows_per_program,
        block,
        nodes: all.map(|id| (id, node(id))).collect(),
        loads: group.loads.iter().map(|l| l.0).collect(),
        computed: group.nodes.clone(),
        stores: group.stores.iter().map(|s| s.0).collect(),
    });
    IrKernel::new(name, params, move |b| emit(&spec, b))
}

/// The element type a value of type `d` is stored as: masks as `u8` (0 or 1).
pub fn storage(d: DType) -> DType {
    if d == DType::Bool {
        DType::U8
    } else {
        d
    }
}

fn emit(spec: &Spec, b: &mut Builder) -> Result<(), BuildError> {
    if let Some(r) = spec.row {
        return emit_rows(spec, r, b);
    }
    let l = Loc::default();
    let n_param = b.param(spec.loads.len() + spec.stores.len());
    b.constant_value("BLOCK", spec.block);
    let pid = b.program_id(0, l)?;
    let start = b.binary(BinOp::Mul, pid, Operand::Int(spec.block as i64), l)?;
    let lanes = b.arange(0, spec.block as i64, l)?;
    let offs = b.binary(BinOp::Add, start, lanes, l)?;
    let mask = Operand::V(b.cmp(CmpOp::Lt, offs, n_param, l)?);
    let mut maps = IndexMaps { shape: &spec.shape, offs, coords: HashMap::new(), offsets: HashMap::new() };

    let mut vals: HashMap<NodeId, Value> = HashMap::new();
    for (i, id) in spec.loads.iter().enumerate() {
        let node = &spec.nodes[id];
        let v = match maps.offset(b, &node.shape)? {
            None => b.load(b.param(i), None, None, l)?,
            Some(off) => {
                let p = b.add_ptr(b.param(i), off, l)?;
                b.load(p, Some(mask), None, l)?
            }
        };
        // A mask comes back from its bytes.
        let v = if node.dtype == DType::Bool { b.cmp(CmpOp::Ne, v, Operand::Int(0), l)? } else { v };
        vals.insert(*id, v);
    }
    compute(spec, b, &mut vals, |_, id, _, _| Err(BuildError::new(l, format!("graph codegen: reduction {id} in a flat group"))))?;
    for (i, id) in spec.stores.iter().enumerate() {
        let v = vals.get(id).copied().ok_or_else(|| BuildError::new(l, format!("graph codegen: stored {id} is not computed")))?;
        let v = if spec.nodes[id].dtype == DType::Bool { b.cast(v, DType::U8, l)? } else { v };
        let p = b.add_ptr(b.param(spec.loads.len() + i), offs, l)?;
        b.store(p, v, Some(mask), l)?;
    }
    Ok(())
}

/// A rows group's kernel (see the [module docs](self)): `ROWS` rows of `r` a program.
fn emit_rows(spec: &Spec, r: usize, b: &mut Builder) -> Result<(), BuildError> {
    let l = Loc::default();
    let rows = spec.rows_per_program;
    b.constant_value("BLOCK", spec.block);
    b.constant_value("ROWS", rows);
    let n_param = b.param(spec.loads.len() + spec.stores.len());
    let pid = b.program_id(0, l)?;
    let first = b.binary(BinOp::Mul, pid, Operand::Int(rows as i64), l)?;
    let rr = b.arange(0, rows as i64, l)?;
    let row = b.binary(BinOp::Add, first, rr, l)?;
    let row = b.expand_dims(row, 1, l)?;
    let row0 = b.binary(BinOp::Mul, row, Operand::Int(r as i64), l)?; // [ROWS, 1]
    let row_ok = b.cmp(CmpOp::Lt, row0, n_param, l)?;
    let lanes = b.arange(0, spec.block as i64, l)?;
    let lanes = b.expand_dims(lanes, 0, l)?; // [1, BLOCK]
    let offs = b.binary(BinOp::Add, row0, lanes, l)?;
    let col_ok = b.cmp(CmpOp::Lt, lanes, Operand::Int(r as i64), l)?;
    let mask = b.binary(BinOp::And, col_ok, row_ok, l)?;
    let (mask, row_mask) = (Operand::V(mask), Operand::V(row_ok));
    let mut blocks = IndexMaps { shape: &spec.shape, offs, coords: HashMap::new(), offsets: HashMap::new() };
    let mut per_row = IndexMaps { shape: &spec.shape, offs: row0, coords: HashMap::new(), offsets: HashMap::new() };
    // A node is a block (one element a lane) when its last axis, aligned with the
    // space's, is the row; else one value per row ([ROWS, 1]).
    let is_block = |node: &Node| r > 1 && node.shape.last() == Some(&r) && node.shape.len() <= spec.shape.len();
    let mut vals: HashMap<NodeId, Value> = HashMap::new();
    for (i, id) in spec.loads.iter().enumerate() {
        let node = &spec.nodes[id];
        let v = if is_block(node) {
            let off = blocks.offset(b, &node.shape)?.ok_or_else(|| BuildError::new(l, format!("graph codegen: block load {id} without offsets")))?;
            let p = b.add_ptr(b.param(i), off, l)?;
            b.load(p, Some(mask), None, l)?
        } else {
            match per_row.offset(b, &node.shape)? {
                None => b.load(b.param(i), None, None, l)?, // one element: a scalar
                Some(off) => {
                    let p = b.add_ptr(b.param(i), off, l)?;
                    b.load(p, Some(row_mask), None, l)?
                }
            }
        };
        let v = if node.dtype == DType::Bool { b.cmp(CmpOp::Ne, v, Operand::Int(0), l)? } else { v };
        vals.insert(*id, v);
    }
    compute(spec, b, &mut vals, |b, _, node, (red, x)| {
        if b.ty(x).shape.last().is_none_or(|&c| c <= 1) {
            return Ok(x); // rows of one element (or a value that is one already)
        }
        // In f32 (the accumulator of 16-bit sums), padding lanes neutral.
        let x = if node.dtype == DType::F32 { x } else { b.cast(x, DType::F32, l)? };
        let (op, identity) = match red {
            Reduction::Sum | Reduction::Mean => (ReduceOp::Sum, 0.0),
            Reduction::Max => (ReduceOp::Max, f64::NEG_INFINITY),
            Reduction::Min => (ReduceOp::Min, f64::INFINITY),
        };
        let x = b.select(mask, x, Operand::Float(identity), l)?;
        let s = b.reduce(op, x, Some(1), l)?;
        let mut s = b.expand_dims(s, 1, l)?;
        if red == Reduction::Mean {
            s = b.binary(BinOp::Div, s, Operand::Float(r as f64), l)?;
        }
        if node.dtype == DType::F32 {
            Ok(s)
        } else {
            b.cast(s, node.dtype, l)
        }
    })?;
    for (i, id) in spec.stores.iter().enumerate() {
        let node = &spec.nodes[id];
        let v = vals.get(id).copied().ok_or_else(|| BuildError::new(l, format!("graph codegen: stored {id} is not computed")))?;
        let v = if node.dtype == DType::Bool { b.cast(v, DType::U8, l)? } else { v };
        let param = b.param(spec.loads.len() + i);
        let (off, m) = if is_block(node) {
            (blocks.offset(b, &node.shape)?.ok_or_else(|| BuildError::new(l, format!("graph codegen: block store {id} without offsets")))?, mask)
        } else {
            // One value a row, at the row's index (the stored shape is the space's with
            // a last axis of 1; a one-element output has offset 0, row 0 alone valid).
            let off = match per_row.offset(b, &node.shape)? {
                Some(off) => off,
                None => b.binary(BinOp::Mul, row, Operand::Int(0), l)?,
            };
            (off, row_mask)
        };
        let p = b.add_ptr(param, off, l)?;
        let shape = b.ty(p).shape.clone();
        let v = b.broadcast_value(v, &shape, l)?;
        b.store(p, v, Some(m), l)?;
    }
    Ok(())
}

/// Compute the group's nodes, in order, into `vals` (which holds its loads): each
/// elementwise node through the builder, each reduction (operation and operand) through
/// `reduce`, the space's own; every result checked to have its node's element type.
fn compute(
    spec: &Spec,
    b: &mut Builder,
    vals: &mut HashMap<NodeId, Value>,
    mut reduce: impl FnMut(&mut Builder, NodeId, &Node, (Reduction, Value)) -> Result<Value, BuildError>,
) -> Result<(), BuildError> {
    let l = Loc::default();
    for id in &spec.computed {
        let node = &spec.nodes[id];
        let v = |x: &NodeId| -> Result<Value, BuildError> { vals.get(x).copied().ok_or_else(|| BuildError::new(l, format!("graph codegen: {x} is used before it is computed"))) };
        let out = match node.op {
            Op::Input(_) => return Err(BuildError::new(l, format!("graph codegen: input {id} is computed, not loaded"))),
            Op::Const(bits) => b.constant(ConstVal::Float(f64::from_bits(bits)), node.dtype, l)?,
            Op::Relu(x) => b.binary(BinOp::Max, v(&x)?, Operand::Float(0.0), l)?,
            Op::Unary(op, x) => b.unary(op, v(&x)?, l)?,
            Op::Binary(op, x, y) => b.binary(op, v(&x)?, v(&y)?, l)?,
            Op::Cmp(op, x, y) => b.cmp(op, v(&x)?, v(&y)?, l)?,
            Op::Where(c, x, y) => b.select(v(&c)?, v(&x)?, v(&y)?, l)?,
            Op::Cast(x) => b.cast(v(&x)?, node.dtype, l)?,
            Op::Reduce(red, x) => {
                let x = v(&x)?;
                reduce(b, *id, node, (red, x))?
            }
        };
        if b.ty(out).dtype != node.dtype {
            return Err(BuildError::new(l, format!("graph codegen: {id} = {node} came out as {}", b.ty(out).dtype)));
        }
        vals.insert(*id, out);
    }
    Ok(())
}

/// Index maps from the flat index of the iteration space to the offsets of broadcast
/// values (see the [module docs](self)), each coordinate and each offset built once.
struct IndexMaps<'s> {
    shape: &'s [usize],
    offs: Value,
    /// `(offs / inner) % extent` by `(inner, extent)`.
    coords: HashMap<(usize, usize), Value>,
    /// Offsets by the shape read (`None`: a scalar).
    offsets: HashMap<Vec<usize>, Option<Value>>,
}

impl IndexMaps<'_> {
    /// The offsets of a value of shape `s` (broadcast into the iteration space) at each
    /// lane, or `None` when it has one element (a scalar load).
    fn offset(&mut self, b: &mut Builder, s: &[usize]) -> Result<Option<Value>, BuildError> {
        if let Some(v) = self.offsets.get(s) {
            return Ok(*v);
        }
        let l = Loc::default();
        let terms = terms(self.shape, s);
        let v = if s.iter().product::<usize>() == 1 {
            None
        } else {
            let mut total: Option<Value> = None;
            for t in terms {
                let coord = match self.coords.get(&(t.inner, t.extent)) {
                    Some(&c) => c,
                    None => {
                        let mut c = self.offs;
                        if t.inner > 1 {
                            c = b.binary(BinOp::Div, c, Operand::Int(t.inner as i64), l)?;
                        }
                        if !t.outermost {
                            c = b.binary(BinOp::Rem, c, Operand::Int(t.extent as i64), l)?;
                        }
                        self.coords.insert((t.inner, t.extent), c);
                        c
                    }
                };
                let term = if t.stride == 1 { coord } else { b.binary(BinOp::Mul, coord, Operand::Int(t.stride as i64), l)? };
                total = Some(match total {
                    None => term,
                    Some(acc) => b.binary(BinOp::Add, acc, term, l)?,
                });
            }
            total
        };
        self.offsets.insert(s.to_vec(), v);
        Ok(v)
    }
}

/// One term of an index map: `((offs / inner) % extent) * stride`, the `%` left out for
/// the outermost term.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Term {
    pub inner: usize,
    pub extent: usize,
    pub stride: usize,
    pub outermost: bool,
}

/// The terms of the index map of a value of shape `s` read in an iteration space of shape
/// `space` (`s` broadcasts to `space`): one per run of dimensions that `s` does not
/// broadcast, dimensions of size 1 dropped.
pub fn terms(space: &[usize], s: &[usize]) -> Vec<Term> {
    let r = space.len();
    let dim = |j: usize| if j + s.len() >= r { s[j + s.len() - r] } else { 1 };
    // Row-major strides of the space and of `s` (aligned on the right).
    let mut inner = vec![1usize; r];
    let mut stride = vec![1usize; r];
    for j in (0..r.saturating_sub(1)).rev() {
        inner[j] = inner[j + 1] * space[j + 1];
        stride[j] = stride[j + 1] * dim(j + 1);
    }
    let mut out: Vec<Term> = vec![];
    let mut prev_kept = false;
    let first_real = (0..r).find(|&j| space[j] > 1);
    for j in 0..r {
        if space[j] == 1 {
            continue; // no coordinate: neither breaks nor extends a run
        }
        let kept = dim(j) > 1;
        if kept {
            match out.last_mut() {
                // Extend the run: this dimension is inner to the previous one.
                Some(t) if prev_kept => {
                    t.extent *= space[j];
                    t.inner = inner[j];
                    t.stride = stride[j];
                }
                _ => out.push(Term { inner: inner[j], extent: space[j], stride: stride[j], outermost: Some(j) == first_real }),
            }
        }
        prev_kept = kept;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_maps_merge_runs_and_drop_broadcast_dimensions() {
        let t = |inner, extent, stride, outermost| Term { inner, extent, stride, outermost };
        // Contiguous: one term, the flat index itself.
        assert_eq!(terms(&[3, 1000], &[3, 1000]), [t(1, 3000, 1, true)]);
        assert_eq!(terms(&[3, 1000], &[1, 3, 1000][1..]), [t(1, 3000, 1, true)]);
        // A row vector broadcast over rows: offs % 1000.
        assert_eq!(terms(&[3, 1000], &[1000]), [t(1, 1000, 1, false)]);
        // A column: offs / 1000.
        assert_eq!(terms(&[3, 1000], &[3, 1]), [t(1000, 3, 1, true)]);
        // [7, 1, 5] in [7, 4, 5]: (offs / 20) * 5 + offs % 5.
        assert_eq!(terms(&[7, 4, 5], &[7, 1, 5]), [t(20, 7, 5, true), t(1, 5, 1, false)]);
        // [1, 4, 1] in [7, 4, 5]: (offs / 5) % 4.
        assert_eq!(terms(&[7, 4, 5], &[1, 4, 1]), [t(5, 4, 1, false)]);
        // Size-1 dimensions of the space do not break a run.
        assert_eq!(terms(&[2, 1, 3], &[2, 1, 3]), [t(1, 6, 1, true)]);
        // A scalar: no terms.
        assert!(terms(&[7, 4, 5], &[]).is_empty());
    }

    /// Evaluate the terms on the host and compare with the broadcast definition.
    #[test]
    fn index_maps_address_the_broadcast_element() {
        let cases: &[(&[usize], &[usize])] = &[(&[7, 4, 5], &[7, 1, 5]), (&[7, 4, 5], &[1, 4, 1]), (&[2, 3, 4, 5], &[3, 1, 5]), (&[6, 1, 4], &[1, 1, 4]), (&[5, 3], &[5, 1])];
        for &(space, s) in cases {
            let ts = terms(space, s);
            let n: usize = space.iter().product();
            for flat in 0..n {
                // Coordinates in the space, then in `s`.
                let mut rem = flat;
                let mut coord = vec![0; space.len()];
                for j in (0..space.len()).rev() {
                    coord[j] = rem % space[j];
                    rem /= space[j];
                }
                let off = s.len();
                let mut want = 0;
                for (k, &d) in s.iter().enumerate() {
                    let c = if d == 1 { 0 } else { coord[space.len() - off + k] };
                    want = want * d + c;
                }
                let got: usize = ts.iter().map(|t| if t.outermost { flat / t.inner } else { (flat / t.inner) % t.extent } * t.stride).sum();
                assert_eq!(got, want, "{space:?} <- {s:?} at {flat}");
            }
        }
    }
}
