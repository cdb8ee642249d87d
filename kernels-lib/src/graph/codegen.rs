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
//! **Views.** Nodes are evaluated on demand, from the stores back, each once per place
//! it is wanted at: the space's own elements (everything above), or, under a
//! view, the coordinates the view reads (a permutation, an expansion's zeros, a slice's
//! `start + step * i`, `repeat_interleave`'s `i / r`) or the flat index a reshape reads.
//! Elementwise nodes commute with views, so `(x * 2).transpose(0, 1)` loads `x` at the
//! transposed coordinates and multiplies there; a load at coordinates addresses its
//! buffer at `sum c_k * stride_k`, at a flat index at the index itself (a reshape of a
//! contiguous input stays a contiguous, vectorized read).
//!
//! The kernel's identity is the hash of its IR ([`IrKernel`]): two graphs that generate
//! the same code share a compiled kernel. Contiguous groups do not depend on the element
//! count (`n` is a parameter), so one kernel serves every length.

use super::fuse::Group;
use super::{Node, NodeId, Op, Reduction, View};
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
    /// A matrix product's operands, and which are computed in the kernel (its prologue).
    operands: [NodeId; 2],
    prologue: [bool; 2],
    loads: Vec<NodeId>,
    stores: Vec<NodeId>,
}

/// The longest row a rows group holds in one program (its block, in registers); longer
/// rows loop ([`Options::max_row`](super::plan::Options::max_row)).
pub const MAX_ROW: usize = 16384;

/// The kernel of `group` (`graph_nodes`: the graph's nodes by id), `block` elements per
/// program (a power of two; for a rows group, at least its row length, and
/// `rows_per_program` rows of it), named `name`.
/// Parameters: one read-only pointer per load (`x0`, `x1`, ...), one writable pointer per
/// store (`y0`, ...), then `n: i32`, the number of elements of the iteration space.
pub fn kernel(name: &str, graph_nodes: &[Node], group: &Group, block: usize, rows_per_program: usize) -> dsl_runtime::Result<IrKernel> {
    let mut params = buffer_params(graph_nodes, group);
    params.push(("n".into(), ParamKind::Scalar(DType::I32)));
    let spec = Arc::new(Spec {
        shape: group.shape.clone(),
        row: group.row,
        rows_per_program,
        block,
        nodes: group_nodes(graph_nodes, group),
        operands: [NodeId(0); 2],
        prologue: [false; 2],
        loads: group.loads.iter().map(|l| l.0).collect(),
        stores: group.stores.iter().map(|s| s.0).collect(),
    });
    IrKernel::new(name, params, move |b| emit(&spec, b))
}

/// The integer parameters of a matrix product's kernel after its buffers, as the library's
/// `matmul_batched` takes them: sizes, the operands' and the result's element strides,
/// and the batch strides along grid axes 1 and 2.
pub const MATMUL_INTS: [&str; 19] = ["m", "n", "k", "sam", "sak", "sbk", "sbn", "scm", "scn", "say", "saz", "sby", "sbz", "scy", "scz", "nw", "saw", "sbw", "scw"];

/// The kernel of matrix product `id`'s group with a fused epilogue or prologue: the
/// library matmul's main loop (a `bm x bn` tile of the product a program, `bk` of K an
/// iteration, Triton's grouped program order with groups of `group_m` tile
/// rows, batches along grid axes 1 and 2), the product rounded to its element type, then
/// the group's pointwise nodes evaluated on the tile in registers and its values stored
/// (the product itself only if the group stores it):
///
/// ```text
/// kernel @graph_k1(%x0: ptr a, %x1: ptr b, %x2.. other loads, %y0.. stores, m, n, k, strides..)
///   acc = sum over k of dot(a[rm, k..k+bk], b[k..k+bk, rn])       (masked edges, zeros)
///   offs = batch * m * n + rm[:, None] * n + rn[None, :]          (the product's flat index)
///   p = acc as the product's type; epilogue nodes at offs (index maps as a flat group's);
///   stores at offs, masked by rm < m & rn < n
/// ```
///
/// A computed operand (`group.prologue`) is evaluated instead at each tile's coordinates
/// (through the views under it, its batch coordinates from the grid's), then zeroed
/// outside the operand, so that a K tail adds nothing whatever the prologue makes of the
/// masked loads' zeros.
///
/// Parameters: a load per group load (first the buffers of the operands read through
/// strides, in operand order), a writable pointer per store, then [`MATMUL_INTS`]. The
/// result's strides are row-major (every stored value is), so the flat index is the
/// row-major one.
///
/// Grid axis 2 holds one batch dimension, or two with `batch3` (`nw` of the last a
/// second's: `z = program_id(2) / nw`, `w` the remainder, at strides `s?z` and `s?w`; the
/// library's `matmul_batched` takes two, so the plan launches this kernel for a product
/// whose batch dimensions merge into three).
pub fn matmul_kernel(name: &str, graph_nodes: &[Node], group: &Group, id: NodeId, (bm, bn, bk, group_m): (usize, usize, usize, usize), batch3: bool) -> dsl_runtime::Result<IrKernel> {
    let mut params = buffer_params(graph_nodes, group);
    params.extend(MATMUL_INTS.iter().map(|n| (n.to_string(), ParamKind::Scalar(DType::I32))));
    // (Not a product: a build error, from the kernel body.)
    let (a, bo) = match graph_nodes[id.index()].op {
        Op::Matmul(a, b) => (a, b),
        _ => (id, id),
    };
    let spec = Arc::new(Spec {
        shape: group.shape.clone(),
        row: None,
        rows_per_program: 1,
        block: bm * bn,
        nodes: group_nodes(graph_nodes, group),
        operands: [a, bo],
        prologue: group.prologue,
        loads: group.loads.iter().map(|l| l.0).collect(),
        stores: group.stores.iter().map(|s| s.0).collect(),
    });
    IrKernel::new(name, params, move |b| emit_matmul(&spec, id, (bm, bn, bk, group_m), batch3, b))
}

fn emit_matmul(spec: &Spec, id: NodeId, (bm, bn, bk, group_m): (usize, usize, usize, usize), batch3: bool, b: &mut Builder) -> Result<(), BuildError> {
    use BinOp::{Add, Div, Min, Mul, Rem, Sub};
    let l = Loc::default();
    if !matches!(spec.nodes[&id].op, Op::Matmul(..)) {
        return Err(BuildError::new(l, format!("graph codegen: {id} is not a matrix product")));
    }
    for (name, v) in [("BM", bm), ("BN", bn), ("BK", bk), ("GROUP_M", group_m)] {
        b.constant_value(name, v);
    }
    let first_int = spec.loads.len() + spec.stores.len();
    let int = |b: &Builder, name: &str| b.param(first_int + MATMUL_INTS.iter().position(|n| *n == name).expect("a matmul parameter"));
    let (m, n, k) = (int(b, "m"), int(b, "n"), int(b, "k"));
    // The batch: grid axis 1 (`y`) and 2 (`z`, or `z` and `w` with `batch3`: `nw` of `w` a
    // `z`), each operand at its batch strides.
    let (y, z) = (b.program_id(1, l)?, b.program_id(2, l)?);
    let (zo, w) = if batch3 {
        let zo = b.binary(Div, z, int(b, "nw"), l)?;
        let zw = b.binary(Mul, zo, int(b, "nw"), l)?;
        (zo, Some(b.binary(Sub, z, zw, l)?))
    } else {
        (z, None)
    };
    let operand = |b: &mut Builder, i: usize, sy: &str, sz: &str, sw: &str| -> Result<Value, BuildError> {
        let oy = b.binary(Mul, y, int(b, sy), l)?;
        let oz = b.binary(Mul, zo, int(b, sz), l)?;
        let mut o = b.binary(Add, oy, oz, l)?;
        if let Some(w) = w {
            let ow = b.binary(Mul, w, int(b, sw), l)?;
            o = b.binary(Add, o, ow, l)?;
        }
        b.add_ptr(b.param(i), o, l)
    };
    // Operands read through strides: the group's first loads, in order.
    let (ia, ib) = (0, usize::from(!spec.prologue[0]));
    let pa = if spec.prologue[0] { None } else { Some(operand(b, ia, "say", "saz", "saw")?) };
    let pb = if spec.prologue[1] { None } else { Some(operand(b, ib, "sby", "sbz", "sbw")?) };
    // A computed operand's batch coordinates: the product's, from its flat batch index.
    let r = spec.shape.len();
    let batch_coords = if spec.prologue.contains(&true) && r > 2 {
        let nz = b.num_programs(2, l)?;
        let flat = b.binary(Mul, y, nz, l)?;
        let flat = b.binary(Add, flat, z, l)?;
        unflatten_ir(b, flat, &spec.shape[..r - 2])?
    } else {
        vec![None; r.saturating_sub(2)]
    };
    // Triton's grouped order (the library's `tile_row`/`tile_col`).
    let pid = b.program_id(0, l)?;
    let m1 = b.binary(Add, m, Operand::Int(bm as i64 - 1), l)?;
    let tiles_m = b.binary(Div, m1, Operand::Int(bm as i64), l)?;
    let n1 = b.binary(Add, n, Operand::Int(bn as i64 - 1), l)?;
    let tiles_n = b.binary(Div, n1, Operand::Int(bn as i64), l)?;
    let per_group = b.binary(Mul, tiles_n, Operand::Int(group_m as i64), l)?;
    let g = b.binary(Div, pid, per_group, l)?;
    let first_m = b.binary(Mul, g, Operand::Int(group_m as i64), l)?;
    let left = b.binary(Sub, tiles_m, first_m, l)?;
    let group_rows = b.binary(Min, left, Operand::Int(group_m as i64), l)?;
    let in_group = b.binary(Rem, pid, per_group, l)?;
    let tm = b.binary(Rem, in_group, group_rows, l)?;
    let tm = b.binary(Add, first_m, tm, l)?;
    let row0 = b.binary(Mul, tm, Operand::Int(bm as i64), l)?;
    let tn = b.binary(Div, in_group, group_rows, l)?;
    let col0 = b.binary(Mul, tn, Operand::Int(bn as i64), l)?;
    let rm = b.arange(0, bm as i64, l)?;
    let rm = b.binary(Add, row0, rm, l)?;
    let rn = b.arange(0, bn as i64, l)?;
    let rn = b.binary(Add, col0, rn, l)?;
    let (rm_c, rn_r) = (b.expand_dims(rm, 1, l)?, b.expand_dims(rn, 0, l)?); // [bm, 1], [1, bn]
    // The main loop (the library's `matmul_acc`).
    let rk = b.arange(0, bk as i64, l)?;
    let zero = b.full(&[bm as i64, bn as i64], Operand::Float(0.0), DType::F32, l)?;
    let (k0, accs) = b.begin_for(Operand::Int(0), Operand::V(k), Operand::Int(bk as i64), &[Operand::V(zero)], l)?;
    let ka = b.binary(Add, k0, rk, l)?;
    let tile = |b: &mut Builder, p: Value, rows: Value, cols: Value, (s0, s1): (&str, &str), (n0, n1): (Value, Value)| -> Result<Value, BuildError> {
        let (r, c) = (b.expand_dims(rows, 1, l)?, b.expand_dims(cols, 0, l)?);
        let (or, oc) = (b.binary(Mul, r, int(b, s0), l)?, b.binary(Mul, c, int(b, s1), l)?);
        let off = b.binary(Add, or, oc, l)?;
        let (mr, mc) = (b.cmp(CmpOp::Lt, r, n0, l)?, b.cmp(CmpOp::Lt, c, n1, l)?);
        let mask = b.binary(BinOp::And, mr, mc, l)?;
        let p = b.add_ptr(p, off, l)?;
        b.load(p, Some(Operand::V(mask)), Some(Operand::Float(0.0)), l)
    };
    // A computed operand (a prologue): its nodes evaluated at the tile's coordinates, from
    // the buffers under it, then zeros outside the operand (the K tail must add nothing,
    // whatever the prologue makes of the masked loads' zeros).
    let computed = |b: &mut Builder, x: NodeId, rows: Value, cols: Value, (n0, n1): (Value, Value)| -> Result<Value, BuildError> {
        let (rc, cc) = (b.expand_dims(rows, 1, l)?, b.expand_dims(cols, 0, l)?);
        let (mr, mc) = (b.cmp(CmpOp::Lt, rc, n0, l)?, b.cmp(CmpOp::Lt, cc, n1, l)?);
        let mask = b.binary(BinOp::And, mr, mc, l)?;
        let shape = &spec.nodes[&x].shape;
        let rx = shape.len();
        let mut coords: Vec<Option<Value>> = (0..rx - 2).map(|j| if shape[j] == 1 { None } else { batch_coords[r - rx + j] }).collect();
        coords.extend([Some(rc), Some(cc)]);
        // (Every node is wanted at coordinates: the index maps over the space are not used.)
        let mut e = Eval::new(b, spec, IndexMaps::new(&spec.shape, rc), None, Operand::V(mask), (None, None), &[], &HashMap::new())?;
        let v = e.eval(b, x, At::Coords(coords))?;
        let full = b.ty(mask).shape.clone();
        let v = b.broadcast_value(v, &full, l)?;
        b.select(Operand::V(mask), v, Operand::Float(0.0), l)
    };
    let ta = match pa {
        Some(pa) => tile(b, pa, rm, ka, ("sam", "sak"), (m, k))?,
        None => computed(b, spec.operands[0], rm, ka, (m, k))?,
    };
    let tb = match pb {
        Some(pb) => tile(b, pb, ka, rn, ("sbk", "sbn"), (k, n))?,
        None => computed(b, spec.operands[1], ka, rn, (k, n))?,
    };
    let Operand::V(acc) = accs[0] else { unreachable!("the accumulator is a value") };
    let acc = b.dot(ta, tb, Some(acc), dsl_runtime::ir::DotPrecision::default(), l)?;
    let Operand::V(acc) = b.end_for(&[Operand::V(acc)], &["acc"], l)?[0] else { unreachable!("a loop result is a value") };
    let d = spec.nodes[&id].dtype;
    let product = if d == DType::F32 { acc } else { b.cast(acc, d, l)? };
    // The epilogue over the tile, at the product's flat indices.
    let nz = b.num_programs(2, l)?;
    let batch = b.binary(Mul, y, nz, l)?;
    let batch = b.binary(Add, batch, z, l)?;
    let mn = b.binary(Mul, m, n, l)?;
    let base = b.binary(Mul, batch, mn, l)?;
    let row = b.binary(Mul, rm_c, n, l)?;
    let within = b.binary(Add, row, rn_r, l)?; // [bm, bn]
    let offs = b.binary(Add, within, base, l)?;
    let (mr, mc) = (b.cmp(CmpOp::Lt, rm_c, m, l)?, b.cmp(CmpOp::Lt, rn_r, n, l)?);
    let mask = b.binary(BinOp::And, mr, mc, l)?;
    // The coordinates the index maps would divide out of `offs`, known here.
    let r = spec.shape.len();
    let (sm, sn) = (spec.shape[r - 2], spec.shape[r - 1]);
    // A row vector (a bias) is read once per column and a column once per row, under
    // their own masks.
    let mut maps = IndexMaps::new(&spec.shape, offs);
    let full = [bm, bn];
    for (key, v) in [((1, sn), rn_r), ((sn, sm), rm_c), ((1, sm * sn), within)] {
        maps.coords.insert(key, v);
    }
    let known = HashMap::from([(id, product)]);
    let mut e = Eval::new(b, spec, maps, None, Operand::V(mask), (Some(Operand::V(mr)), Some(Operand::V(mc))), &spec.stores, &known)?;
    for (i, sid) in spec.stores.iter().enumerate() {
        let v = e.eval(b, *sid, At::Space)?;
        let v = if spec.nodes[sid].dtype == DType::Bool { b.cast(v, DType::U8, l)? } else { v };
        let p = b.add_ptr(b.param(spec.loads.len() + i), offs, l)?;
        let v = b.broadcast_value(v, &full, l)?;
        b.store(p, v, Some(Operand::V(mask)), l)?;
    }
    Ok(())
}

/// A group kernel's buffer parameters: one read-only pointer per load (`x0`, `x1`, ...),
/// then one writable pointer per store (`y0`, ...).
fn buffer_params(graph_nodes: &[Node], group: &Group) -> Vec<(String, ParamKind)> {
    let elem = |id: &NodeId| storage(graph_nodes[id.index()].dtype);
    let loads = group.loads.iter().enumerate().map(|(i, (id, _))| (format!("x{i}"), ParamKind::Ptr { elem: elem(id), writable: false }));
    let stores = group.stores.iter().enumerate().map(|(i, (id, _))| (format!("y{i}"), ParamKind::Ptr { elem: elem(id), writable: true }));
    loads.chain(stores).collect()
}

/// Every node a group loads, computes or stores, by id.
fn group_nodes(graph_nodes: &[Node], group: &Group) -> HashMap<NodeId, Node> {
    let all = group.loads.iter().map(|l| l.0).chain(group.nodes.iter().copied()).chain(group.stores.iter().map(|s| s.0));
    all.map(|id| (id, graph_nodes[id.index()].clone())).collect()
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
    let mut e = Eval::new(b, spec, IndexMaps::new(&spec.shape, offs), None, mask, (None, None), &spec.stores, &HashMap::new())?;
    for (i, id) in spec.stores.iter().enumerate() {
        let v = e.eval(b, *id, At::Space)?;
        let v = if spec.nodes[id].dtype == DType::Bool { b.cast(v, DType::U8, l)? } else { v };
        let p = b.add_ptr(b.param(spec.loads.len() + i), offs, l)?;
        let v = b.broadcast_value(v, &[spec.block], l)?;
        b.store(p, v, Some(mask), l)?;
    }
    Ok(())
}

/// A rows group's kernel (see the [module docs](self)): `ROWS` rows of `r` a program.
fn emit_rows(spec: &Spec, r: usize, b: &mut Builder) -> Result<(), BuildError> {
    if spec.block < r {
        return emit_long_rows(spec, r, b);
    }
    let f = RowFrame::new(spec, r, spec.rows_per_program, b)?;
    b.constant_value("ROWS", spec.rows_per_program);
    let (offs, mask) = f.chunk(b, None)?.0;
    let mut e = f.eval(b, spec, offs, mask, &spec.stores, &HashMap::new())?;
    for (i, &id) in spec.stores.iter().enumerate() {
        e.store(b, &f, i, id, mask)?;
    }
    Ok(())
}

/// What a rows kernel computes first: each program's rows (`[ROWS, 1]`), their first
/// elements' flat indices and whether they exist, and the lanes of a block (`[1, BLOCK]`).
struct RowFrame {
    r: usize,
    row: Value,
    row0: Value,
    row_ok: Value,
    lanes: Value,
}

impl RowFrame {
    fn new(spec: &Spec, r: usize, rows: usize, b: &mut Builder) -> Result<RowFrame, BuildError> {
        let l = Loc::default();
        b.constant_value("BLOCK", spec.block);
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
        Ok(RowFrame { r, row, row0, row_ok, lanes })
    }

    /// The block at column `c0` (`None`: 0) of each row: `((flat indices, lanes inside a
    /// row that exists), columns)`.
    fn chunk(&self, b: &mut Builder, c0: Option<Operand>) -> Result<((Value, Value), Value), BuildError> {
        let l = Loc::default();
        let cols = match c0 {
            Some(c0) => b.binary(BinOp::Add, self.lanes, c0, l)?,
            None => self.lanes,
        };
        let offs = b.binary(BinOp::Add, self.row0, cols, l)?;
        let col_ok = b.cmp(CmpOp::Lt, cols, Operand::Int(self.r as i64), l)?;
        let mask = b.binary(BinOp::And, col_ok, self.row_ok, l)?;
        Ok(((offs, mask), cols))
    }

    /// The evaluator of `targets` over the block at flat indices `offs`.
    #[allow(clippy::too_many_arguments)]
    fn eval<'s>(&self, b: &mut Builder, spec: &'s Spec, offs: Value, mask: Value, targets: &[NodeId], known: &HashMap<NodeId, Value>) -> Result<Eval<'s>, BuildError> {
        let per_row = IndexMaps::new(&spec.shape, self.row0);
        Eval::new(b, spec, IndexMaps::new(&spec.shape, offs), Some((self.r, per_row)), Operand::V(mask), (Some(Operand::V(self.row_ok)), None), targets, known)
    }
}

/// Rows longer than the block, one a program, in `BLOCK`-element chunks: a loop over the
/// row per level of reductions (a reduction whose operand needs another's result comes a
/// pass after it; softmax: the max, then the sum of the exponentials), each accumulating
/// its chunks lane by lane in f32 and reducing the lanes after the loop (an index
/// reduction keeps each lane's best value and column, then takes the first column holding
/// the best of the lanes); then a last loop
/// computes and stores the row's elements with every reduction known, and the values of
/// one per row are stored after it. Each pass loads what it reads again (as the library's
/// long-row softmax does).
fn emit_long_rows(spec: &Spec, r: usize, b: &mut Builder) -> Result<(), BuildError> {
    let l = Loc::default();
    let block = spec.block;
    let f = RowFrame::new(spec, r, 1, b)?;
    // The reductions by level: 1 + the deepest level among the reductions their operand
    // depends on (in node order, which is a topological order).
    // (Computed here: a reduction loaded from memory is another group's.)
    let mut reds: Vec<NodeId> = spec.nodes.iter().filter(|(id, n)| matches!(n.op, Op::Reduce(..)) && !spec.loads.contains(id)).map(|(&id, _)| id).collect();
    reds.sort();
    let mut level: HashMap<NodeId, usize> = HashMap::new();
    for &id in &reds {
        let Op::Reduce(_, x) = spec.nodes[&id].op else { unreachable!("filtered") };
        let (mut deepest, mut stack, mut seen) = (0, vec![x], std::collections::HashSet::new());
        while let Some(n) = stack.pop() {
            if !seen.insert(n) || !spec.nodes.contains_key(&n) || spec.loads.contains(&n) {
                continue;
            }
            if let Some(&lv) = level.get(&n) {
                deepest = deepest.max(lv);
                continue;
            }
            stack.extend(spec.nodes[&n].op.operands());
        }
        level.insert(id, deepest + 1);
    }
    let mut known: HashMap<NodeId, Value> = HashMap::new();
    for lv in 1..=level.values().copied().max().unwrap_or(0) {
        let these: Vec<NodeId> = reds.iter().copied().filter(|id| level[id] == lv).collect();
        // Per reduction: its lanes' accumulator (sum, max or min so far); for an index
        // reduction, each lane's best value (NaN: none yet) and its column.
        let mut inits = vec![];
        let mut ops = vec![];
        for &id in &these {
            let Op::Reduce(red, x) = spec.nodes[&id].op else { unreachable!("a reduction") };
            let (op, identity) = lane_reduction(red);
            inits.push(Operand::V(b.full(&[1, block as i64], Operand::Float(identity), DType::F32, l)?));
            if red.is_arg() {
                inits.push(Operand::V(b.full(&[1, block as i64], Operand::Int(0), DType::I32, l)?));
            }
            ops.push((red, op, identity, x));
        }
        let (c0, accs) = b.begin_for(Operand::Int(0), Operand::Int(r as i64), Operand::Int(block as i64), &inits, l)?;
        let ((offs, mask), cols) = f.chunk(b, Some(c0))?;
        let targets: Vec<NodeId> = ops.iter().map(|o| o.3).collect();
        let mut e = f.eval(b, spec, offs, mask, &targets, &known)?;
        let mut next = vec![];
        let mut acc = accs.iter();
        for &(red, op, identity, x) in &ops {
            let v = e.eval(b, x, At::Space)?;
            let v = b.broadcast_value(v, &[1, block], l)?;
            let v = if b.ty(v).dtype == DType::F32 { v } else { b.cast(v, DType::F32, l)? };
            let v = b.select(Operand::V(mask), v, Operand::Float(identity), l)?;
            let a = *acc.next().expect("an accumulator per reduction");
            if red.is_arg() {
                // A lane's new element wins when it is better, or the lane has only NaNs
                // so far and it is a number; a tie keeps the earlier column.
                let i = *acc.next().expect("an index per index reduction");
                let cmp = if red == Reduction::ArgMax { CmpOp::Gt } else { CmpOp::Lt };
                let strictly = b.cmp(cmp, v, a, l)?;
                let (a_nan, v_num) = (b.cmp(CmpOp::Ne, a, a, l)?, b.cmp(CmpOp::Eq, v, v, l)?);
                let first_number = b.binary(BinOp::And, a_nan, v_num, l)?;
                let better = b.binary(BinOp::Or, strictly, first_number, l)?;
                next.push(Operand::V(b.select(Operand::V(better), v, a, l)?));
                next.push(Operand::V(b.select(Operand::V(better), cols, i, l)?));
            } else {
                let combine = match op {
                    ReduceOp::Max => BinOp::Max,
                    ReduceOp::Min => BinOp::Min,
                    _ => BinOp::Add,
                };
                next.push(Operand::V(b.binary(combine, a, v, l)?));
            }
        }
        let names: Vec<String> = (0..next.len()).map(|j| format!("acc{lv}_{j}")).collect();
        let name_refs: Vec<&str> = names.iter().map(|s| s.as_str()).collect();
        let mut done = b.end_for(&next, &name_refs, l)?.into_iter();
        for (&id, &(red, op, _, _)) in these.iter().zip(&ops) {
            let a = done.next().expect("an accumulator per reduction");
            let d = spec.nodes[&id].dtype;
            let s = if red.is_arg() {
                // The best value over the lanes (NaN only if every element is), then the
                // first column holding it; 0 for a row of NaNs.
                let i = done.next().expect("an index per index reduction");
                let best = b.reduce(if red == Reduction::ArgMax { ReduceOp::Max } else { ReduceOp::Min }, a, Some(1), l)?;
                let best = b.expand_dims(best, 1, l)?;
                let at = b.cmp(CmpOp::Eq, a, best, l)?;
                let far = Operand::Int(i32::MAX as i64);
                let cand = b.select(Operand::V(at), i, far, l)?;
                let first = b.reduce(ReduceOp::Min, cand, Some(1), l)?;
                let first = b.expand_dims(first, 1, l)?;
                let none = b.cmp(CmpOp::Eq, first, far, l)?;
                b.select(Operand::V(none), Operand::Int(0), first, l)?
            } else {
                let mut s = b.reduce(op, a, Some(1), l)?;
                s = b.expand_dims(s, 1, l)?;
                if red == Reduction::Mean {
                    s = b.binary(BinOp::Div, s, Operand::Float(r as f64), l)?;
                }
                if d == DType::F32 { s } else { b.cast(s, d, l)? }
            };
            known.insert(id, s);
        }
    }
    // The row's elements, chunk by chunk, then the values of one per row.
    type Stores = Vec<(usize, NodeId)>; // (store index, node)
    let (blocks_out, rows_out): (Stores, Stores) = spec.stores.iter().copied().enumerate().partition(|(_, id)| row_block(spec, r, &spec.nodes[id]));
    for (stores, looped) in [(blocks_out, true), (rows_out, false)] {
        if stores.is_empty() {
            continue;
        }
        let c0 = if looped { Some(b.begin_for(Operand::Int(0), Operand::Int(r as i64), Operand::Int(block as i64), &[], l)?.0) } else { None };
        let ((offs, mask), _) = f.chunk(b, c0)?;
        let targets: Vec<NodeId> = stores.iter().map(|s| s.1).collect();
        let mut e = f.eval(b, spec, offs, mask, &targets, &known)?;
        for &(i, id) in &stores {
            e.store(b, &f, i, id, mask)?;
        }
        if looped {
            b.end_for(&[], &[], l)?;
        }
    }
    Ok(())
}

/// How a reduction combines a row's lanes, and the value a padding lane holds (one that
/// never wins; for the index reductions NaN, which loses to any number and, among NaNs, to
/// the smaller index, so a row of NaNs gives 0).
fn lane_reduction(red: Reduction) -> (ReduceOp, f64) {
    match red {
        Reduction::Sum | Reduction::Mean => (ReduceOp::Sum, 0.0),
        Reduction::Max => (ReduceOp::Max, f64::NEG_INFINITY),
        Reduction::Min => (ReduceOp::Min, f64::INFINITY),
        Reduction::ArgMax => (ReduceOp::ArgMax, f64::NAN),
        Reduction::ArgMin => (ReduceOp::ArgMin, f64::NAN),
    }
}

/// In a rows group of rows of `r`, whether `node` is a block (one element a lane: its last
/// axis, aligned with the space's, is the row) rather than one value per row.
fn row_block(spec: &Spec, r: usize, node: &Node) -> bool {
    r > 1 && node.shape.last() == Some(&r) && node.shape.len() <= spec.shape.len()
}

/// Where a node's value is wanted.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
enum At {
    /// At the iteration space's own elements: the node broadcast into the space, aligned
    /// on the right (what every node outside a view is evaluated at).
    Space,
    /// At these row-major flat indices of the node's own shape (under a reshape).
    Linear(Value),
    /// At these coordinates of the node's shape (`None`: coordinate 0), under a view.
    Coords(Vec<Option<Value>>),
}

/// Demand-driven evaluation of a group's nodes (each node once per place it is wanted
/// at): from the stores back to the loads. Outside views every node is wanted at the
/// space's elements, and loads use the broadcast index maps; under a view (reshape,
/// permute, expand, slice, repeat_interleave) the operand is wanted at coordinates
/// computed from the view's, and a load there addresses its buffer at them. Elementwise
/// nodes commute with views, so a view of a computed value costs no memory either.
struct Eval<'s> {
    spec: &'s Spec,
    /// Flat groups: the space's maps; rows groups: those of the lanes of each row.
    blocks: IndexMaps<'s>,
    /// Rows groups: the row length and the maps at each row's first element.
    per_row: Option<(usize, IndexMaps<'s>)>,
    mask: Operand,
    row_mask: Option<Operand>,
    /// A matrix product's epilogue: the mask of its tile's columns (`[1, BN]`), for values
    /// read once per column.
    col_mask: Option<Operand>,
    params: HashMap<NodeId, usize>,
    memo: HashMap<(NodeId, At), Value>,
    /// `(flat index, shape)` to coordinates.
    unflattened: HashMap<(Value, Vec<usize>), Vec<Option<Value>>>,
}

impl<'s> Eval<'s> {
    /// The evaluator of the values `targets` (the stores, or a long row's reductions),
    /// the nodes in `known` given (a long row's reductions from earlier passes: their
    /// operands are not loaded), with the loads read at the space's elements issued first,
    /// in parameter order (so that their latency overlaps what comes before their use: a
    /// norm's weight is in flight during the row's reduction).
    #[allow(clippy::too_many_arguments)]
    fn new(
        b: &mut Builder,
        spec: &'s Spec,
        blocks: IndexMaps<'s>,
        per_row: Option<(usize, IndexMaps<'s>)>,
        mask: Operand,
        (row_mask, col_mask): (Option<Operand>, Option<Operand>),
        targets: &[NodeId],
        known: &HashMap<NodeId, Value>,
    ) -> Result<Eval<'s>, BuildError> {
        let params = spec.loads.iter().enumerate().map(|(i, id)| (*id, i)).collect();
        let memo = known.iter().map(|(&id, &v)| ((id, At::Space), v)).collect();
        let mut e = Eval { spec, blocks, per_row, mask, row_mask, col_mask, params, memo, unflattened: HashMap::new() };
        // The nodes wanted at the space: from the targets, through every operand but those
        // of views and concatenations (read at other elements).
        let (mut at_space, mut stack) = (std::collections::HashSet::new(), targets.to_vec());
        while let Some(id) = stack.pop() {
            if !at_space.insert(id) || e.params.contains_key(&id) || known.contains_key(&id) {
                continue;
            }
            if !matches!(spec.nodes[&id].op, Op::View(..) | Op::Concat(..)) {
                stack.extend(spec.nodes[&id].op.operands());
            }
        }
        for id in spec.loads.iter().filter(|id| at_space.contains(id)) {
            e.eval(b, *id, At::Space)?;
        }
        Ok(e)
    }

    /// In a rows group, whether `node` is a block (one element a lane: its last axis,
    /// aligned with the space's, is the row) rather than one value per row.
    fn is_block(&self, node: &Node) -> bool {
        match self.per_row {
            Some((r, _)) => row_block(self.spec, r, node),
            None => true,
        }
    }

    /// Store output `i` (node `id`) of a rows kernel: a block at its lanes where `mask`
    /// holds, or one value a row at the row's index (the stored shape is the space's with a
    /// last axis of 1; a one-element output has offset 0, row 0 alone valid).
    fn store(&mut self, b: &mut Builder, f: &RowFrame, i: usize, id: NodeId, mask: Value) -> Result<(), BuildError> {
        let l = Loc::default();
        let node = &self.spec.nodes[&id];
        let v = self.eval(b, id, At::Space)?;
        let v = if node.dtype == DType::Bool { b.cast(v, DType::U8, l)? } else { v };
        let (off, m) = if self.is_block(node) {
            (self.blocks.offset(b, &node.shape)?.ok_or_else(|| BuildError::new(l, format!("graph codegen: block store {id} without offsets")))?, mask)
        } else {
            let per_row = &mut self.per_row.as_mut().expect("a rows group").1;
            let off = match per_row.offset(b, &node.shape)? {
                Some(off) => off,
                None => b.binary(BinOp::Mul, f.row, Operand::Int(0), l)?,
            };
            (off, f.row_ok)
        };
        let p = b.add_ptr(b.param(self.spec.loads.len() + i), off, l)?;
        let shape = b.ty(p).shape.clone();
        let v = b.broadcast_value(v, &shape, l)?;
        b.store(p, v, Some(Operand::V(m)), l)?;
        Ok(())
    }

    fn eval(&mut self, b: &mut Builder, id: NodeId, at: At) -> Result<Value, BuildError> {
        if let Some(&v) = self.memo.get(&(id, at.clone())) {
            return Ok(v);
        }
        let l = Loc::default();
        let node = self.spec.nodes.get(&id).cloned().ok_or_else(|| BuildError::new(l, format!("graph codegen: {id} is not part of the group")))?;
        let out = if self.params.contains_key(&id) {
            self.load(b, id, &node, &at)?
        } else {
            match node.op {
                Op::Input(_) => return Err(BuildError::new(l, format!("graph codegen: input {id} is computed, not loaded"))),
                Op::Const(bits) => b.constant(ConstVal::Float(f64::from_bits(bits)), node.dtype, l)?,
                Op::Tril(k) => {
                    // Column <= row + k, from the element's coordinates (0 on an axis of 1).
                    let c = self.coords(b, &node, &at)?;
                    let mut index = |v: Option<Value>| match v {
                        Some(v) => Ok(v),
                        None => b.constant(ConstVal::Int(0), DType::I32, l),
                    };
                    let (row, col) = (index(c[0])?, index(c[1])?);
                    let limit = b.binary(BinOp::Add, row, Operand::Int(k), l)?;
                    b.cmp(CmpOp::Le, col, Operand::V(limit), l)?
                }
                Op::Relu(x) => {
                    let x = self.operand(b, &node, x, &at)?;
                    b.binary(BinOp::Max, x, Operand::Float(0.0), l)?
                }
                Op::Unary(op, x) => {
                    let x = self.operand(b, &node, x, &at)?;
                    b.unary(op, x, l)?
                }
                Op::Binary(op, x, y) => {
                    let (x, y) = (self.operand(b, &node, x, &at)?, self.operand(b, &node, y, &at)?);
                    b.binary(op, x, y, l)?
                }
                Op::Cmp(op, x, y) => {
                    let (x, y) = (self.operand(b, &node, x, &at)?, self.operand(b, &node, y, &at)?);
                    b.cmp(op, x, y, l)?
                }
                Op::Where(c, x, y) => {
                    let (c, x, y) = (self.operand(b, &node, c, &at)?, self.operand(b, &node, x, &at)?, self.operand(b, &node, y, &at)?);
                    b.select(c, x, y, l)?
                }
                Op::Cast(x) => {
                    let x = self.operand(b, &node, x, &at)?;
                    b.cast(x, node.dtype, l)?
                }
                Op::Reduce(red, x) => {
                    if at != At::Space {
                        return Err(BuildError::new(l, format!("graph codegen: reduction {id} read through a view")));
                    }
                    let x = self.eval(b, x, At::Space)?;
                    self.reduce(b, id, &node, red, x)?
                }
                Op::Matmul(..) => return Err(BuildError::new(l, format!("graph codegen: matrix product {id} in a generated kernel (the fusion pass gives it a library kernel)"))),
                Op::AttentionGrad(..) => return Err(BuildError::new(l, format!("graph codegen: attention gradient {id} in a generated kernel (the fusion pass gives it the library's flash-attention backward)"))),
                Op::Concat(x, y, axis) => {
                    // Both operands at coordinates clamped into them (every address valid),
                    // the one the element comes from selected.
                    let a = axis as usize;
                    let c = self.coords(b, &node, &at)?;
                    let len = self.spec.nodes[&x].shape[a] as i64;
                    match c[a] {
                        None => self.eval(b, x, At::Coords(c))?,
                        Some(i) => {
                            let (mut cx, mut cy) = (c.clone(), c.clone());
                            cx[a] = Some(b.binary(BinOp::Min, i, Operand::Int(len - 1), l)?);
                            let j = b.binary(BinOp::Sub, i, Operand::Int(len), l)?;
                            cy[a] = Some(b.binary(BinOp::Max, j, Operand::Int(0), l)?);
                            let first = b.cmp(CmpOp::Lt, i, Operand::Int(len), l)?;
                            let (vx, vy) = (self.eval(b, x, At::Coords(cx))?, self.eval(b, y, At::Coords(cy))?);
                            b.select(first, vx, vy, l)?
                        }
                    }
                }
                Op::View(v, x) => {
                    let from = self.spec.nodes[&x].shape.clone();
                    if v == View::Reshape {
                        let flat = self.linear(b, &node, &at)?;
                        self.eval(b, x, At::Linear(flat))?
                    } else {
                        let c = self.coords(b, &node, &at)?;
                        let src = view_coords(b, v, &from, &node.shape, &c)?;
                        self.eval(b, x, At::Coords(src))?
                    }
                }
            }
        };
        if b.ty(out).dtype != node.dtype {
            return Err(BuildError::new(l, format!("graph codegen: {id} = {node} came out as {}", b.ty(out).dtype)));
        }
        self.memo.insert((id, at), out);
        Ok(out)
    }

    /// Operand `x` of `node` where `node` is wanted at `at` (broadcasting aligned right).
    fn operand(&mut self, b: &mut Builder, node: &Node, x: NodeId, at: &At) -> Result<Value, BuildError> {
        let at = match at {
            At::Space => At::Space,
            _ => {
                let c = self.coords(b, node, at)?;
                let xs = &self.spec.nodes[&x].shape;
                let off = node.shape.len() - xs.len();
                At::Coords(xs.iter().enumerate().map(|(k, &d)| if d == 1 { None } else { c[k + off] }).collect())
            }
        };
        self.eval(b, x, at)
    }

    /// The maps a node at the space's elements is addressed by.
    fn maps(&mut self, node: &Node) -> &mut IndexMaps<'s> {
        if self.is_block(node) {
            &mut self.blocks
        } else {
            &mut self.per_row.as_mut().expect("a rows group").1
        }
    }

    /// The coordinates of `node`'s elements wanted at `at`.
    fn coords(&mut self, b: &mut Builder, node: &Node, at: &At) -> Result<Vec<Option<Value>>, BuildError> {
        match at {
            At::Coords(c) => Ok(c.clone()),
            At::Linear(f) => {
                let key = (*f, node.shape.clone());
                if let Some(c) = self.unflattened.get(&key) {
                    return Ok(c.clone());
                }
                let c = unflatten_ir(b, *f, &node.shape)?;
                self.unflattened.insert(key, c.clone());
                Ok(c)
            }
            At::Space => self.maps(node).coords(b, &node.shape),
        }
    }

    /// The row-major flat index in `node`'s shape of its elements wanted at `at`.
    fn linear(&mut self, b: &mut Builder, node: &Node, at: &At) -> Result<Value, BuildError> {
        match at {
            At::Linear(f) => Ok(*f),
            // The node fills the space: its flat index is the space's.
            At::Space if node.shape == self.spec.shape => Ok(self.maps(node).offs),
            _ => {
                let c = self.coords(b, node, at)?;
                flatten_ir(b, &c, &node.shape)
            }
        }
    }

    /// Load `id` (a graph input or an intermediate) wanted at `at`.
    fn load(&mut self, b: &mut Builder, id: NodeId, node: &Node, at: &At) -> Result<Value, BuildError> {
        let l = Loc::default();
        let param = b.param(self.params[&id]);
        let off = match at {
            At::Space => self.maps(node).offset(b, &node.shape)?,
            At::Linear(f) => Some(*f),
            At::Coords(c) => {
                if c.iter().all(Option::is_none) {
                    None
                } else {
                    Some(flatten_ir(b, c, &node.shape)?)
                }
            }
        };
        let v = match off {
            None => b.load(param, None, None, l)?, // one element: a scalar
            Some(off) => {
                // The mask of the lanes the offsets stand for: every lane, or (rows groups)
                // one per row.
                let shape = b.ty(off).shape.clone();
                let (mask, off) = match (self.row_mask, shape.last()) {
                    (Some(rm), Some(&last)) if last == 1 && self.spec.block > 1 => (rm, off),
                    // A matrix product's row vector (a bias): its columns' mask.
                    _ if self.col_mask.is_some_and(|m| matches!(m, Operand::V(m) if b.ty(m).shape == shape)) => (self.col_mask.expect("checked"), off),
                    _ => {
                        let Operand::V(m) = self.mask else { unreachable!("a mask value") };
                        let full = b.ty(m).shape.clone();
                        (self.mask, b.broadcast_value(off, &full, l)?)
                    }
                };
                let p = b.add_ptr(param, off, l)?;
                b.load(p, Some(mask), None, l)?
            }
        };
        // A mask comes back from its bytes.
        if node.dtype == DType::Bool {
            b.cmp(CmpOp::Ne, v, Operand::Int(0), l)
        } else {
            Ok(v)
        }
    }

    /// A reduction along the row (rows groups): in f32 (the accumulator of 16-bit sums),
    /// padding lanes neutral.
    fn reduce(&mut self, b: &mut Builder, id: NodeId, node: &Node, red: Reduction, x: Value) -> Result<Value, BuildError> {
        let l = Loc::default();
        let Some((r, _)) = self.per_row else {
            return Err(BuildError::new(l, format!("graph codegen: reduction {id} in a flat group")));
        };
        if r <= 1 {
            // Rows of one element: the element, or its index 0.
            if red.is_arg() {
                let shape: Vec<i64> = b.ty(x).shape.iter().map(|&d| d as i64).collect();
                return b.full(&shape, Operand::Int(0), DType::I32, l);
            }
            return Ok(x);
        }
        // A value the same along the row (an expansion, a broadcast) comes as one per row
        // or one in all: spread over the row's lanes, so each counts `r` times.
        let Operand::V(m) = self.mask else { unreachable!("a mask value") };
        let lanes = b.ty(m).shape.clone();
        let x = b.broadcast_value(x, &lanes, l)?;
        let x = if b.ty(x).dtype == DType::F32 { x } else { b.cast(x, DType::F32, l)? };
        let (op, identity) = lane_reduction(red);
        let x = b.select(self.mask, x, Operand::Float(identity), l)?;
        let s = b.reduce(op, x, Some(1), l)?;
        let mut s = b.expand_dims(s, 1, l)?;
        if red.is_arg() {
            return Ok(s); // an i32 index along the row
        }
        if red == Reduction::Mean {
            s = b.binary(BinOp::Div, s, Operand::Float(r as f64), l)?;
        }
        if node.dtype == DType::F32 {
            Ok(s)
        } else {
            b.cast(s, node.dtype, l)
        }
    }
}

/// The operand coordinates a view reads for the view's coordinates `c` (IR values;
/// `None` is 0): [`View::source`] on blocks of indices.
fn view_coords(b: &mut Builder, v: View, from: &[usize], to: &[usize], c: &[Option<Value>]) -> Result<Vec<Option<Value>>, BuildError> {
    let l = Loc::default();
    Ok(match v {
        View::Reshape => unreachable!("reshapes go through flat indices"),
        View::Permute(p) => {
            let mut out = vec![None; from.len()];
            for (i, &k) in p.perm().iter().enumerate() {
                out[k as usize] = c[i];
            }
            out
        }
        View::Expand => {
            let off = to.len() - from.len();
            from.iter().enumerate().map(|(k, &d)| if d == 1 { None } else { c[k + off] }).collect()
        }
        View::Slice { axis, start, step } => {
            let mut out = c.to_vec();
            let a = axis as usize;
            let scaled = match (c[a], step) {
                (None, _) => None,
                (Some(x), 1) => Some(x),
                (Some(x), s) => Some(b.binary(BinOp::Mul, x, Operand::Int(s as i64), l)?),
            };
            out[a] = match (scaled, start) {
                (x, 0) => x,
                (None, s) => Some(b.constant(ConstVal::Int(s as i64), DType::I32, l)?),
                (Some(x), s) => Some(b.binary(BinOp::Add, x, Operand::Int(s as i64), l)?),
            };
            out
        }
        View::RepeatInterleave { axis, repeats } => {
            let mut out = c.to_vec();
            let a = axis as usize;
            out[a] = match c[a] {
                Some(x) => Some(b.binary(BinOp::Div, x, Operand::Int(repeats as i64), l)?),
                None => None,
            };
            out
        }
    })
}

/// `sum_k c_k * stride_k` over `shape`'s row-major strides (`None` coordinates are 0).
fn flatten_ir(b: &mut Builder, c: &[Option<Value>], shape: &[usize]) -> Result<Value, BuildError> {
    let l = Loc::default();
    let mut stride = 1usize;
    let mut total: Option<Value> = None;
    for k in (0..shape.len()).rev() {
        if let Some(x) = c[k] {
            let term = if stride == 1 { x } else { b.binary(BinOp::Mul, x, Operand::Int(stride as i64), l)? };
            total = Some(match total {
                None => term,
                Some(t) => b.binary(BinOp::Add, term, t, l)?,
            });
        }
        stride *= shape[k];
    }
    match total {
        Some(t) => Ok(t),
        None => b.constant(ConstVal::Int(0), DType::I32, l),
    }
}

/// The coordinates in `shape` of flat indices `f` (`None` for dimensions of size 1; the
/// outermost coordinate without the `%`).
fn unflatten_ir(b: &mut Builder, f: Value, shape: &[usize]) -> Result<Vec<Option<Value>>, BuildError> {
    let first_real = (0..shape.len()).find(|&k| shape[k] > 1);
    let mut out = vec![None; shape.len()];
    let mut inner = 1usize;
    for k in (0..shape.len()).rev() {
        if shape[k] > 1 {
            out[k] = Some(coordinate(b, f, inner, shape[k], Some(k) == first_real)?);
        }
        inner *= shape[k];
    }
    Ok(out)
}

/// `(x / inner) % extent`, the division left out when `inner` is 1 and the `%` when the
/// coordinate is the outermost.
fn coordinate(b: &mut Builder, x: Value, inner: usize, extent: usize, outermost: bool) -> Result<Value, BuildError> {
    let l = Loc::default();
    let mut c = x;
    if inner > 1 {
        c = b.binary(BinOp::Div, c, Operand::Int(inner as i64), l)?;
    }
    if !outermost {
        c = b.binary(BinOp::Rem, c, Operand::Int(extent as i64), l)?;
    }
    Ok(c)
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

impl<'s> IndexMaps<'s> {
    fn new(shape: &'s [usize], offs: Value) -> IndexMaps<'s> {
        IndexMaps { shape, offs, coords: HashMap::new(), offsets: HashMap::new() }
    }

    /// The coordinates, in a value of shape `s` broadcast into the space, of each lane's
    /// element (`None` along the dimensions `s` broadcasts).
    fn coords(&mut self, b: &mut Builder, s: &[usize]) -> Result<Vec<Option<Value>>, BuildError> {
        let r = self.shape.len();
        let first_real = (0..r).find(|&j| self.shape[j] > 1);
        let mut out = vec![None; s.len()];
        let mut inner = 1usize;
        for j in (0..r).rev() {
            let k = j as isize - (r - s.len()) as isize;
            if k >= 0 && s[k as usize] > 1 {
                out[k as usize] = Some(self.coord(b, inner, self.shape[j], Some(j) == first_real)?);
            }
            inner *= self.shape[j];
        }
        Ok(out)
    }

    /// `(offs / inner) % extent` (the `%` left out when `outermost`), built once.
    fn coord(&mut self, b: &mut Builder, inner: usize, extent: usize, outermost: bool) -> Result<Value, BuildError> {
        if let Some(&c) = self.coords.get(&(inner, extent)) {
            return Ok(c);
        }
        let c = coordinate(b, self.offs, inner, extent, outermost)?;
        self.coords.insert((inner, extent), c);
        Ok(c)
    }

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
                let coord = self.coord(b, t.inner, t.extent, t.outermost)?;
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
