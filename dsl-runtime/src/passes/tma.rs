//! Which pipelined loads the tensor memory accelerator can make (sm_90a TMA): a load of a
//! 2-D tile of 16-bit or f32 elements from a pointer parameter, written as a kernel writes a
//! matrix tile,
//!
//! ```text
//! load(p + ((r0 + arange(R)).col() * s + (c0 + arange(C)).row()),
//!      (rows < M) & (cols < N), 0)          // each bound on its own index, any order
//! ```
//!
//! (or the transposed form, the contiguous dimension first), where `p` is 16-byte aligned
//! and `s`, `M` and `N` are scalar parameters or constants, `s` a multiple of 16 bytes
//! (the specialization's `div16`): exactly the elements of an `M x N` matrix with rows
//! `s` elements apart, zero outside it, which is what a TMA copy of the tensor map
//! `{dims: [N, M], stride: s}` at coordinates `(c0, r0)` gives. An index that is
//! `arange(0, C)` itself needs no bound (its extent is `C`). Scalar offsets of the pointer
//! (`p + y * sy + z * sz`, the batch and head of a `[B, H, T, D]` tensor) are batch
//! dimensions of the map, up to three, with strides known to the host and multiples of
//! 16 bytes; where a stride is 0 at launch (a matrix shared along that dimension) the
//! copy's coordinate there is 0. The bounds guard's compare with the buffer's length is
//! implied where the launch checks that the map lies in the buffer (`(M - 1) * s + N <=
//! len`, batch extents as many as fit), which it does before encoding it. The pipeliner
//! ([`pipeline`](super::pipeline)) turns such loads into [`Op::TmaCopy`]s; a store of the
//! same form (or a relaxed `f32` add, whose old values are unused) becomes an
//! [`Op::TmaStore`] ([`stores`]), where the launch asks for it.

use crate::ir::{AtomicOp, BinOp, CmpOp, ConstVal, Function, HostInt, Loc, Op, Param, ParamKind, ParamSpec, TmaTile, Type, Value};
use crate::DType;

/// A load TMA can make: its tensor, the scalar each coordinate starts at (`None`: 0),
/// contiguous dimension first, and the index along each batch dimension.
#[derive(Clone, Debug, PartialEq)]
pub struct Matched {
    pub tile: TmaTile,
    pub base: [Option<Value>; 2],
    pub batch: Vec<Value>,
}

/// `base + arange` along `axis` (`None` while 1-D), times `stride` (`None`: 1).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Index {
    axis: Option<usize>,
    base: Option<Value>,
    stride: Option<HostInt>,
}

/// The scalar a block repeats (`splat`, possibly broadcast).
fn splat_of(f: &Function, v: Value) -> Option<Value> {
    match f.inst(v).op {
        Op::Splat(s) if f.ty(s).is_scalar() => Some(s),
        Op::Broadcast(x) => splat_of(f, x),
        _ => None,
    }
}

/// A scalar the host knows at launch.
fn host(f: &Function, s: Value) -> Option<HostInt> {
    match f.inst(s).op {
        Op::Const(ConstVal::Int(c)) => Some(HostInt::Const(c)),
        Op::Param(i) if matches!(f.params[i as usize].kind, ParamKind::Scalar(d) if d.is_int()) => Some(HostInt::Param(i)),
        _ => None,
    }
}

fn index(f: &Function, v: Value) -> Option<Index> {
    let rank = f.ty(v).shape.len();
    match f.inst(v).op {
        Op::Arange { start: 0, .. } => Some(Index { axis: None, base: None, stride: None }),
        Op::Binary(BinOp::Add, a, b) if rank == 1 => {
            let (s, x) = match (splat_of(f, a), splat_of(f, b)) {
                (Some(s), None) => (s, b),
                (None, Some(s)) => (s, a),
                _ => return None,
            };
            let ix = index(f, x)?;
            (ix.base.is_none() && ix.stride.is_none()).then_some(Index { base: Some(s), ..ix })
        }
        Op::Binary(BinOp::Mul, a, b) => {
            let (s, x) = match (splat_of(f, a), splat_of(f, b)) {
                (Some(s), None) => (s, b),
                (None, Some(s)) => (s, a),
                _ => return None,
            };
            let ix = index(f, x)?;
            let stride = match host(f, s)? {
                HostInt::Const(1) => None,
                h => Some(h),
            };
            ix.stride.is_none().then_some(Index { stride, ..ix })
        }
        Op::ExpandDims(x, d) if rank == 2 && f.ty(x).shape.len() == 1 => {
            let ix = index(f, x)?;
            Some(Index { axis: Some(1 - d as usize), ..ix })
        }
        Op::Broadcast(x) if rank == 2 => index(f, x).filter(|ix| ix.axis.is_some()),
        _ => None,
    }
}

/// The terms of a sum (through broadcasts).
fn terms(f: &Function, v: Value, out: &mut Vec<Value>) {
    match f.inst(v).op {
        Op::Binary(BinOp::Add, a, b) if f.ty(v).shape.len() == 2 => {
            terms(f, a, out);
            terms(f, b, out);
        }
        Op::Broadcast(x) if matches!(f.inst(x).op, Op::Binary(BinOp::Add, ..)) && f.ty(x).shape.len() == 2 => terms(f, x, out),
        _ => out.push(v),
    }
}

/// The conjuncts of a mask (through broadcasts).
fn conjuncts(f: &Function, v: Value, out: &mut Vec<Value>) {
    match f.inst(v).op {
        Op::Binary(BinOp::And, a, b) => {
            conjuncts(f, a, out);
            conjuncts(f, b, out);
        }
        Op::Broadcast(x) => conjuncts(f, x, out),
        _ => out.push(v),
    }
}

/// Whether `v` is computed from the length parameter of pointer parameter `ptr` (the
/// bounds guard's `min(len, 2^31)`), through pure scalar operations.
fn from_length(f: &Function, v: Value, ptr: u32, depth: usize) -> bool {
    match f.inst(v).op {
        Op::Param(i) => matches!(f.params[i as usize].kind, ParamKind::Len { of } if of == ptr),
        Op::Splat(x) | Op::Cast(x) | Op::Broadcast(x) if depth > 0 => from_length(f, x, ptr, depth - 1),
        Op::Binary(BinOp::Min, a, b) if depth > 0 => {
            [a, b].iter().any(|&x| from_length(f, x, ptr, depth - 1)) && [a, b].iter().all(|&x| from_length(f, x, ptr, depth - 1) || matches!(f.inst(x).op, Op::Const(_)))
        }
        _ => false,
    }
}

/// The TMA form of `load`, if it has one (see the module docs).
pub fn match_load(f: &Function, load: Value) -> Option<Matched> {
    let Op::Load { ptr, mask, other } = f.inst(load).op else { return None };
    if !other.is_none_or(|o| f.is_zero(o)) {
        return None;
    }
    match_tile(f, ptr, mask)
}

/// The TMA form of `store`, if it has one: a store of a whole block to the tile a load
/// of the same form reads (see the module docs), or a relaxed `f32` `atomic_add` of one
/// whose old values are unused (a TMA reduction), at least 32 bytes along its contiguous
/// dimension (the narrowest swizzle) and 8 rows along the other (a swizzle atom), to a
/// pointer parameter the kernel accesses nowhere else. Elements outside the tensor are not
/// written, as the mask says. (The copies' global writes are ordered before nothing else
/// of the program, only before the kernel's end: a later load or store of the same
/// buffer could see or race with them.)
pub fn match_store(f: &Function, store: Value) -> Option<Matched> {
    let (ptr, mask) = match f.inst(store).op {
        Op::Store { ptr, mask, .. } => (ptr, mask),
        // A relaxed `f32` add whose old values nobody reads: a TMA reduction.
        Op::Atomic { op: AtomicOp::Add, ptr, mask, cmp: None, relaxed: true, .. } if f.ty(ptr).dtype == DType::F32 && !f.has_users(store) => (ptr, mask),
        _ => return None,
    };
    let m = match_tile(f, ptr, mask)?;
    let t = f.ty(ptr);
    let alone = f.walk().into_iter().all(|v| {
        v == store
            || match f.inst(v).op {
                Op::Load { ptr: p, .. } | Op::Store { ptr: p, .. } | Op::Atomic { ptr: p, .. } | Op::AsyncCopy { ptr: p, .. } => f.pointer_root(p).is_some_and(|r| r != m.tile.ptr),
                Op::TmaCopy { tile, .. } | Op::TmaStore { tile, .. } => tile.ptr != m.tile.ptr,
                _ => true,
            }
    });
    (alone && t.shape[m.tile.inner] * t.dtype.size() >= 32 && t.shape[1 - m.tile.inner] >= 8).then_some(m)
}

/// A 2-D access through `ptr` under `mask` that is exactly a tile of a matrix (the module
/// docs' form).
fn match_tile(f: &Function, ptr: Value, mask: Option<Value>) -> Option<Matched> {
    let t = f.ty(ptr);
    let size = t.dtype.size() as i64;
    if t.shape.len() != 2 || t.padded_shape() != t.shape || !matches!(t.dtype, DType::BF16 | DType::F16 | DType::F32) {
        return None;
    }
    // The block offsets, however the pointer was advanced (`p + (x + y)` or `p + x + y`).
    let mut ts = vec![];
    let mut p = ptr;
    loop {
        match f.inst(p).op {
            Op::AddPtr(q, o) if !f.ty(p).is_scalar() => {
                terms(f, o, &mut ts);
                p = q;
            }
            Op::Broadcast(q) => p = q,
            Op::Splat(q) => {
                p = q;
                break;
            }
            _ => return None,
        }
    }
    // Scalar offsets of the pointer (`a + y * say + z * saz`): batch dimensions.
    let mut batch: Vec<(Value, HostInt)> = vec![];
    while let Op::AddPtr(q, o) = f.inst(p).op {
        let mut ts = vec![];
        scalar_terms(f, o, &mut ts);
        for t in ts {
            batch.push(batch_term(f, t)?);
        }
        p = q;
    }
    // Scalars added to the block offset (`q + (b * sb + h * sh + rows * s + cols)`) too.
    let mut block = vec![];
    for t in ts {
        match splat_of(f, t) {
            Some(s) => {
                let mut ss = vec![];
                scalar_terms(f, s, &mut ss);
                for x in ss {
                    batch.push(batch_term(f, x)?);
                }
            }
            None => block.push(t),
        }
    }
    if batch.len() > 3 {
        return None;
    }
    let Op::Param(pi) = f.inst(p).op else { return None };
    let param = &f.params[pi as usize];
    if !matches!(param.kind, ParamKind::Ptr { .. }) || !param.spec.div16 {
        return None;
    }
    let ixs: Vec<Index> = block.iter().map(|&x| index(f, x)).collect::<Option<_>>()?;
    let [i0, i1] = ixs[..] else { return None };
    let (inner, outer) = match (i0.stride, i1.stride) {
        (None, Some(_)) => (i0, i1),
        (Some(_), None) => (i1, i0),
        _ => return None,
    };
    let (Some(ia), Some(oa)) = (inner.axis, outer.axis) else { return None };
    if ia == oa || t.shape[oa] > 256 {
        return None;
    }
    let stride = outer.stride.expect("matched");
    let aligned = |stride: HostInt| match stride {
        HostInt::Const(c) => c > 0 && (c * size) % 16 == 0,
        HostInt::Param(i) => f.params[i as usize].spec.div16,
    };
    if !aligned(stride) || !batch.iter().all(|&(_, s)| aligned(s)) {
        return None;
    }
    // One bound per index, on the same index; the guard's compare of this offset.
    let mut bounds: [Option<HostInt>; 2] = [None, None];
    let mut cs = vec![];
    conjuncts(f, mask?, &mut cs);
    for c in cs {
        match f.inst(c).op {
            Op::Cmp(CmpOp::Lt, x, b) => {
                let ix = index(f, x)?;
                let at = [inner, outer].iter().position(|w| w.axis == ix.axis && w.base == ix.base && ix.stride.is_none())?;
                let bound = host(f, splat_of(f, b)?)?;
                if bounds[at].replace(bound).is_some_and(|old| old != bound) {
                    return None;
                }
            }
            // The guard's compare of an offset from `p` with its buffer's length (the
            // offset summed in `i64` where the pointer has several): every element of
            // the map lies in the buffer (checked at launch), every other is masked off.
            Op::Cmp(CmpOp::ULt, _, len) if from_length(f, len, pi, 4) => {}
            _ => return None,
        }
    }
    // An index without a bound that is `arange(0, d)` itself stays inside `d`.
    for (b, ix) in bounds.iter_mut().zip([inner, outer]) {
        if b.is_none() && ix.base.is_none() {
            *b = Some(HostInt::Const(t.shape[ix.axis.expect("matched")] as i64));
        }
    }
    let [Some(n), Some(m)] = bounds else { return None };
    let mut strides = [None; 3];
    for (s, &(_, b)) in strides.iter_mut().zip(&batch) {
        *s = Some(b);
    }
    Some(Matched {
        tile: TmaTile { ptr: pi, elem: t.dtype, dims: [n, m], stride, batch: strides, inner: ia },
        base: [inner.base, outer.base],
        batch: batch.iter().map(|&(i, _)| i).collect(),
    })
}

/// The terms of a scalar sum.
fn scalar_terms(f: &Function, v: Value, out: &mut Vec<Value>) {
    match f.inst(v).op {
        Op::Binary(BinOp::Add, a, b) if f.ty(v).is_scalar() => {
            scalar_terms(f, a, out);
            scalar_terms(f, b, out);
        }
        _ => out.push(v),
    }
}

/// A scalar offset term `index * stride` with a stride the host knows (a parameter
/// specialized as a multiple of 16, or a constant): the index and the stride.
fn batch_term(f: &Function, t: Value) -> Option<(Value, HostInt)> {
    let Op::Binary(BinOp::Mul, a, b) = f.inst(t).op else { return None };
    let nice = |h: Option<HostInt>| match h {
        Some(HostInt::Param(i)) => f.params[i as usize].spec.div16,
        Some(HostInt::Const(c)) => c != 0,
        None => false,
    };
    let (hb, ha) = (host(f, b), host(f, a));
    if nice(hb) {
        Some((a, hb.expect("nice")))
    } else if nice(ha) {
        Some((b, ha.expect("nice")))
    } else {
        None
    }
}

/// A new by-value parameter for the tensor map of pointer parameter `ptr` (filled in by
/// the launch from [`maps`]), and its value, pushed to `out`.
pub(super) fn map_param(f: &mut Function, out: &mut Vec<Value>, ptr: u32, loc: Loc) -> Value {
    let name = format!("{}.tma{}", f.params[ptr as usize].name, f.params.len());
    f.params.push(Param { name, kind: ParamKind::Bytes { size: 128, align: 64 }, spec: ParamSpec::default() });
    let p = f.push(Op::Param(f.params.len() as u32 - 1), Type::unit(), loc);
    out.push(p);
    p
}

/// Stores of whole tiles by the tensor memory accelerator (sm_90a; the launch's
/// [`tma_store`](crate::launch::LaunchConfig::tma_store)): each store [`match_store`]
/// takes becomes a `local_store` of its block into a buffer of its own, laid out in the
/// strips of TMA boxes ([`layout::operand_swizzle`](super::layout::operand_swizzle)), and
/// a [`Op::TmaStore`] of that buffer through a new tensor-map parameter. The anchors'
/// epilogue (CUTLASS's and cuBLAS's Hopper kernels, Triton's with descriptors): the
/// threads write shared memory in the accumulator's own layout and one thread moves the
/// tile out, where the plain store converts the layout through shared memory and every
/// thread writes global memory. A relaxed `f32` add of a whole tile becomes a TMA
/// reduction the same way (`add`: FlashAttention-3's `dQ` accumulation, where each
/// thread's vector `red`s would go).
pub fn stores(f: &mut Function) {
    let matched: Vec<(Value, Matched)> = f.walk().into_iter().filter_map(|v| Some((v, match_store(f, v)?))).collect();
    let mut replaced: std::collections::HashMap<Value, Vec<Value>> = Default::default();
    for (store, m) in matched {
        let (value, add) = match f.inst(store).op {
            Op::Store { value, .. } => (value, false),
            Op::Atomic { value, .. } => (value, true),
            _ => unreachable!("matched a store or an add"),
        };
        let (loc, t) = (f.inst(store).loc, f.ty(value).clone());
        let mut out = vec![];
        let src = f.push(Op::LocalAlloc(None), Type::shared(t.dtype, t.shape.clone()), loc);
        out.push(src);
        out.push(f.push(Op::LocalStore { buf: src, value }, Type::unit(), loc));
        let map = map_param(f, &mut out, m.tile.ptr, loc);
        let coords = super::pipeline::tma_coords(f, &mut out, &m, &Default::default(), loc);
        out.push(f.push(Op::TmaStore { src, map, coords, tile: m.tile, add }, Type::unit(), loc));
        replaced.insert(store, out);
    }
    if !replaced.is_empty() {
        f.edit_blocks(&mut |insts| *insts = insts.iter().flat_map(|v| replaced.get(v).cloned().unwrap_or_else(|| vec![*v])).collect());
    }
}

/// What the launch needs to encode one tensor map (`cuTensorMapEncodeTiled`) and check it
/// against the buffer: recorded in the compiled kernel's metadata.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TensorMap {
    /// The kernel parameter the map is passed in (128 bytes by value).
    pub param: u32,
    /// The pointer parameter whose buffer it describes.
    pub ptr: u32,
    /// The element type (`bf16`, `f16` or `f32`), and its size in bytes.
    pub elem: String,
    pub elem_bytes: u32,
    /// Extents, contiguous dimension first, and the row stride in elements.
    pub dims: [HostInt; 2],
    pub stride: HostInt,
    /// The strides of the batch dimensions, in elements (their extents are the most that
    /// fit the buffer: the launch computes them).
    pub batch: Vec<HostInt>,
    /// The box one copy moves (contiguous dimension first) and its swizzle in bytes (32,
    /// 64 or 128: the box's contiguous bytes).
    pub boxed: [u32; 2],
    pub swizzle: u32,
    /// A TMA store's map (a load's otherwise): an empty matrix's map then points where
    /// nothing reads.
    pub store: bool,
}

/// The tensor maps of `f`'s TMA copies and stores, one per map parameter in parameter
/// order, with the boxes their buffers' layouts give (a strip of the layout is a box).
pub fn maps(f: &Function, plan: &super::layout::Plan) -> Vec<TensorMap> {
    let mut out: Vec<TensorMap> = vec![];
    for v in f.walk() {
        let (dst, map, tile, store) = match f.inst(v).op {
            Op::TmaCopy { dst, map, tile, .. } => (dst, map, tile, false),
            Op::TmaStore { src, map, tile, .. } => (src, map, tile, true),
            _ => continue,
        };
        let Op::Param(param) = f.inst(map).op else { continue };
        if out.iter().any(|m| m.param == param) {
            continue;
        }
        let t = f.ty(dst);
        let Some((c, w)) = plan.shared.get(&f.buffer_root(dst)).and_then(crate::lower::tma::strips) else { continue };
        let size = t.dtype.size() as u32;
        let elem = match tile.elem {
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            _ => "f16",
        };
        out.push(TensorMap {
            param,
            ptr: tile.ptr,
            elem: elem.into(),
            elem_bytes: size,
            dims: tile.dims,
            stride: tile.stride,
            batch: tile.batch_strides().collect(),
            boxed: [w as u32, t.shape[1 - c] as u32],
            swizzle: w as u32 * size,
            store,
        });
    }
    out.sort_by_key(|m| m.param);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Builder, Operand};

    /// How the test's tile load departs from the form TMA takes.
    #[derive(Clone, Copy, PartialEq, Debug)]
    enum Form {
        /// `a + (r.col() * s + c.row())`, masked `(r.col() < m) & (c.row() < k)`.
        RowMajor,
        /// The same tile of a column-major matrix: `a + (r.col() + c.row() * s)`.
        ColumnMajor,
        /// Only the column bound.
        OneBound,
        /// The row bound on another index than the address's.
        OtherIndex,
        /// A row stride not known to be a multiple of 16 elements.
        OddStride,
        /// A pointer not known to be 16-byte aligned.
        Unaligned,
        /// A nonzero `other`.
        Other,
        /// `a + y * sy + (r.col() * s + c.row())` with `y = program_id(2)`, the column
        /// index `arange` itself and unbounded (a head dimension).
        Batched,
        /// A batch offset whose stride is not known to be a multiple of 16 elements.
        OddBatch,
        /// The row-major tile, its mask also comparing the offset unsigned with `m` (not
        /// the buffer's length, as the bounds guard's compare is).
        Unsigned,
    }

    /// A function loading a 64 x 32 tile of `a` at row `r0 = program_id(0)` and column
    /// `c0 = program_id(1)`, as `form` says; returns it and the load.
    fn tile(form: Form) -> (Function, Value) {
        let l = Loc::new(1, 1);
        let params = [
            ("a", ParamKind::Ptr { elem: DType::BF16, writable: false }),
            ("m", ParamKind::Scalar(DType::I32)),
            ("k", ParamKind::Scalar(DType::I32)),
            ("s", ParamKind::Scalar(DType::I32)),
            ("sy", ParamKind::Scalar(DType::I32)),
        ];
        let (al, d16, no) = (ParamSpec { div16: true, eq_one: false }, ParamSpec { div16: true, eq_one: false }, ParamSpec::default());
        let specs = [if form == Form::Unaligned { no } else { al }, no, no, if form == Form::OddStride { no } else { d16 }, if form == Form::OddBatch { no } else { d16 }];
        let mut b = Builder::specialized("t", &params, &specs);
        let r0 = b.program_id(0, l).unwrap();
        let c0 = b.program_id(1, l).unwrap();
        let (ar, ac) = (b.arange(0, 64, l).unwrap(), b.arange(0, 32, l).unwrap());
        let r = b.binary(BinOp::Add, r0, ar, l).unwrap();
        let batched = matches!(form, Form::Batched | Form::OddBatch);
        let c = if batched { ac } else { b.binary(BinOp::Add, c0, ac, l).unwrap() };
        let (rc, cr) = (b.expand_dims(r, 1, l).unwrap(), b.expand_dims(c, 0, l).unwrap());
        let off = if form == Form::ColumnMajor {
            let cs = b.binary(BinOp::Mul, cr, b.param(3), l).unwrap();
            b.binary(BinOp::Add, rc, cs, l).unwrap()
        } else {
            let rs = b.binary(BinOp::Mul, rc, b.param(3), l).unwrap();
            b.binary(BinOp::Add, rs, cr, l).unwrap()
        };
        let base = if batched {
            let y = b.program_id(2, l).unwrap();
            let o = b.binary(BinOp::Mul, y, b.param(4), l).unwrap();
            b.add_ptr(b.param(0), o, l).unwrap()
        } else {
            b.param(0)
        };
        let p = b.add_ptr(base, off, l).unwrap();
        let rows = if form == Form::OtherIndex { b.expand_dims(ar, 1, l).unwrap() } else { rc };
        let mr = b.cmp(CmpOp::Lt, rows, b.param(1), l).unwrap();
        let mc = b.cmp(CmpOp::Lt, cr, b.param(2), l).unwrap();
        let mask = match form {
            Form::Unsigned => {
                let both = b.binary(BinOp::And, mr, mc, l).unwrap();
                let u = b.cmp(CmpOp::ULt, off, b.param(1), l).unwrap();
                b.binary(BinOp::And, both, u, l).unwrap()
            }
            Form::OneBound => mc,
            Form::Batched | Form::OddBatch => mr,
            _ => b.binary(BinOp::And, mr, mc, l).unwrap(),
        };
        let other = if form == Form::Other { 1.0 } else { 0.0 };
        let x = b.load(p, Some(Operand::V(mask)), Some(Operand::Float(other)), l).unwrap();
        (b.finish().unwrap(), x)
    }

    /// The `rows x 64` tile of pointer parameter 0 at row `program_id(0)`, rows
    /// `param(3)` apart, masked by `param(1)` rows and `param(2)` columns: its pointers,
    /// offsets and mask.
    fn tile_access(b: &mut Builder, rows: usize, l: Loc) -> (Value, Value, Value) {
        let r0 = b.program_id(0, l).unwrap();
        let (ar, ac) = (b.arange(0, rows as i64, l).unwrap(), b.arange(0, 64, l).unwrap());
        let r = b.binary(BinOp::Add, r0, ar, l).unwrap();
        let (rc, cr) = (b.expand_dims(r, 1, l).unwrap(), b.expand_dims(ac, 0, l).unwrap());
        let rs = b.binary(BinOp::Mul, rc, b.param(3), l).unwrap();
        let off = b.binary(BinOp::Add, rs, cr, l).unwrap();
        let p = b.add_ptr(b.param(0), off, l).unwrap();
        let mr = b.cmp(CmpOp::Lt, rc, b.param(1), l).unwrap();
        let mc = b.cmp(CmpOp::Lt, cr, b.param(2), l).unwrap();
        (p, off, b.binary(BinOp::And, mr, mc, l).unwrap())
    }

    /// A function storing an `rows x 64` bf16 tile of ones to `c` at row `program_id(0)`
    /// (masked by `m` and `n`), after loading the same tile of `c` first where `reread`.
    fn stored(rows: usize, reread: bool) -> (Function, Value) {
        let l = Loc::new(1, 1);
        let params = [("c", ParamKind::Ptr { elem: DType::BF16, writable: true }), ("m", ParamKind::Scalar(DType::I32)), ("n", ParamKind::Scalar(DType::I32)), ("s", ParamKind::Scalar(DType::I32))];
        let (al, no) = (ParamSpec { div16: true, eq_one: false }, ParamSpec::default());
        let mut b = Builder::specialized("t", &params, &[al, no, no, al]);
        let (p, _, mask) = tile_access(&mut b, rows, l);
        let x = if reread { Operand::V(b.load(p, Some(Operand::V(mask)), Some(Operand::Float(0.0)), l).unwrap()) } else { Operand::Float(1.0) };
        let st = b.store(p, x, Some(Operand::V(mask)), l).unwrap();
        (b.finish().unwrap(), st)
    }

    /// `stored`'s tile, as `atomic_add(p, 1.0, mask, sem)` into an `f32` matrix; `read`:
    /// the old values are stored elsewhere.
    fn added(sem: &str, read: bool) -> (Function, Value) {
        let l = Loc::new(1, 1);
        let params = [("c", ParamKind::Ptr { elem: DType::F32, writable: true }), ("m", ParamKind::Scalar(DType::I32)), ("n", ParamKind::Scalar(DType::I32)), ("s", ParamKind::Scalar(DType::I32)), ("o", ParamKind::Ptr { elem: DType::F32, writable: true })];
        let (al, no) = (ParamSpec { div16: true, eq_one: false }, ParamSpec::default());
        let mut b = Builder::specialized("t", &params, &[al, no, no, al, al]);
        let (p, off, mask) = tile_access(&mut b, 16, l);
        let old = b.atomic(AtomicOp::Add, p, Operand::Float(1.0), None, Some(Operand::V(mask)), Some(sem), l).unwrap();
        if read {
            let q = b.add_ptr(b.param(4), off, l).unwrap();
            b.store(q, old, Some(Operand::V(mask)), l).unwrap();
        }
        (b.finish().unwrap(), old)
    }

    /// A whole tile of 8 rows or more is stored by TMA, with the tensor its masks give; one
    /// of fewer rows (less than a swizzle atom), or to a buffer the kernel also reads (the
    /// copies' writes are ordered before nothing in the program), is not.
    #[test]
    fn stores_of_whole_tiles_are_recognised() {
        let (f, st) = stored(16, false);
        let m = match_store(&f, st).expect("a 16 x 64 tile");
        assert_eq!(m.tile, TmaTile { ptr: 0, elem: DType::BF16, dims: [HostInt::Param(2), HostInt::Param(1)], stride: HostInt::Param(3), batch: [None; 3], inner: 1 });
        assert_eq!(match_store(&stored(4, false).0, stored(4, false).1), None, "4 rows");
        let (f, st) = stored(16, true);
        assert_eq!(match_store(&f, st), None, "a buffer also read");
        // The transform: the store becomes a local store and a TMA store with a map.
        let (mut f, _) = stored(16, false);
        let params = f.params.len();
        stores(&mut f);
        crate::ir::verify::verify(&f).unwrap();
        let ops: Vec<&Op> = f.walk().into_iter().map(|v| &f.inst(v).op).collect();
        assert!(!ops.iter().any(|o| matches!(o, Op::Store { .. })) && ops.iter().any(|o| matches!(o, Op::LocalStore { .. })) && ops.iter().any(|o| matches!(o, Op::TmaStore { .. })));
        assert_eq!(f.params.len(), params + 1, "the tensor map's parameter");
    }

    /// A relaxed `f32` add of a whole tile whose old values nobody reads is a TMA reduction
    /// (`tma_store` with `add`); an ordered add, or one whose old values are read, is not.
    #[test]
    fn relaxed_adds_of_whole_tiles_are_tma_reductions() {
        let (f, add) = added("relaxed", false);
        let m = match_store(&f, add).expect("a 16 x 64 f32 tile");
        assert_eq!((m.tile.elem, m.tile.dims, m.tile.stride), (DType::F32, [HostInt::Param(2), HostInt::Param(1)], HostInt::Param(3)));
        let (f, add) = added("acq_rel", false);
        assert_eq!(match_store(&f, add), None, "an ordered add");
        let (f, add) = added("relaxed", true);
        assert_eq!(match_store(&f, add), None, "old values read");
        let (mut f, _) = added("relaxed", false);
        stores(&mut f);
        crate::ir::verify::verify(&f).unwrap();
        let ops: Vec<&Op> = f.walk().into_iter().map(|v| &f.inst(v).op).collect();
        assert!(!ops.iter().any(|o| matches!(o, Op::Atomic { .. })) && ops.iter().any(|o| matches!(o, Op::TmaStore { add: true, .. })), "{ops:?}");
        // Plain stores stay stores.
        let (mut f, _) = stored(16, false);
        stores(&mut f);
        assert!(f.walk().into_iter().any(|v| matches!(f.inst(v).op, Op::TmaStore { add: false, .. })));
    }

    #[test]
    fn matrix_tiles_are_recognised_with_their_tensor() {
        let (f, x) = tile(Form::RowMajor);
        let m = match_load(&f, x).expect("a row-major tile");
        assert_eq!(m.tile, TmaTile { ptr: 0, elem: DType::BF16, dims: [HostInt::Param(2), HostInt::Param(1)], stride: HostInt::Param(3), batch: [None; 3], inner: 1 });
        let ids = |m: &Matched| m.base.map(|b| b.map(|v| f.inst(v).op.clone()));
        assert_eq!(ids(&m), [Some(Op::ProgramId(1)), Some(Op::ProgramId(0))], "coordinates: the column, then the row");
        // Column-major: the rows are contiguous, the columns `s` apart.
        let (f, x) = tile(Form::ColumnMajor);
        let m = match_load(&f, x).expect("a column-major tile");
        assert_eq!((m.tile.inner, m.tile.dims, m.tile.stride), (0, [HostInt::Param(1), HostInt::Param(2)], HostInt::Param(3)));
        assert_eq!(m.base.map(|b| b.map(|v| f.inst(v).op.clone())), [Some(Op::ProgramId(0)), Some(Op::ProgramId(1))]);
        // A batch offset is a third dimension; an unbounded `arange(0, 32)` spans 32.
        let (f, x) = tile(Form::Batched);
        let m = match_load(&f, x).expect("a batched tile");
        assert_eq!((m.tile.dims, m.tile.batch), ([HostInt::Const(32), HostInt::Param(1)], [Some(HostInt::Param(4)), None, None]));
        assert_eq!(m.base[0], None);
        assert_eq!(m.batch.iter().map(|&v| f.inst(v).op.clone()).collect::<Vec<_>>(), [Op::ProgramId(2)]);
        // Guarded (the bounds guard's compare with the buffer's length ANDed in): the same.
        let (mut f, _) = tile(Form::RowMajor);
        crate::passes::guard::run(&mut f, &[ParamSpec { div16: true, eq_one: false }], false).unwrap();
        let x = f.walk().into_iter().find(|&v| matches!(f.inst(v).op, Op::Load { .. })).unwrap();
        assert!(matches!(f.inst(x).op, Op::Load { mask: Some(m), .. } if matches!(f.inst(m).op, Op::Binary(BinOp::And, ..))));
        assert_eq!(match_load(&f, x).map(|m| m.tile.dims), Some([HostInt::Param(2), HostInt::Param(1)]), "guarded");
        for form in [Form::OneBound, Form::OtherIndex, Form::OddStride, Form::Unaligned, Form::Other, Form::OddBatch, Form::Unsigned] {
            let (f, x) = tile(form);
            assert_eq!(match_load(&f, x), None, "{form:?}");
        }
    }
}
