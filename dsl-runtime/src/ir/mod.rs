//! The block IR: the specification.
//!
//! A kernel is a [`Function`]: parameters, an arena of instructions ([`Inst`]) and a
//! [`Block`] listing them in program order. Every instruction defines one SSA value
//! ([`Value`]) of a [`Type`]: an element type ([`DType`]), whether it is a pointer to that
//! element type, and a block shape (`[]` is a scalar, `[1024]` a 1-D block). Instructions
//! that only have effects (`store`) define a value of the unit type, which nothing uses.
//!
//! The semantics are those of one *program* (Triton's word; one CUDA thread block)
//! operating on whole blocks: `a + b` on two `[1024]` blocks adds 1024 pairs of elements.
//! How elements are spread over threads is not part of the IR; layouts are chosen by
//! `passes::layout` and only exist during lowering.
//!
//! Op families, one file each:
//! - [`arith`]: constants, `program_id`, `arange`, splat, binary and unary arithmetic,
//!   comparisons, `select`, casts, math functions.
//! - [`shape`]: `expand_dims`, `broadcast`, `permute`, `reshape`, `full`; and
//!   `convert_layout`, which only the compiler inserts.
//! - [`dot`]: the block matrix product `dot(a, b, acc)`.
//! - [`reduce`]: reductions along an axis (`sum`, `max`, `min`, `argmax`, `argmin`) and
//!   scans (`cumsum`).
//! - [`memory`]: pointer arithmetic, masked `load` and `store`, atomics; shared-memory
//!   buffers (`local_alloc`, `local_store`, `local_load`), which the compiler and the
//!   fuser create (the kernel language has no shared memory, like Triton's).
//! - [`control`]: `for` loops and `if` branches with [`Region`]s, `return`.
//! - [`debug`]: device-side `assert` and `print` (kept only in debug builds).
//!
//! Rules that the [verifier](verify) enforces:
//! - operands are defined before use (the block is in program order);
//! - binary operands, `select` operands and `load`/`store` operands have equal shapes
//!   (the [`Builder`] inserts splats, so the IR never broadcasts implicitly);
//! - arithmetic operands have equal element types (the builder inserts casts);
//! - masks are `bool`; loads and stores go through pointers, and a store's value has the
//!   pointee type;
//! - regions see the values defined before them; their arguments and yields match the
//!   loop's carried values (or the branch's results) in type; a pointer carried by a
//!   loop keeps deriving from one parameter.
//!
//! Shapes are *logical*: a block may have any dimensions (`[48]`, `[3, 1000]`). The
//! lowering pads each dimension to the next power of two and masks the padding (loads,
//! stores and atomics skip it, reductions ignore it); the interpreter works on the logical
//! shape directly. The only operation that needs power-of-two dimensions is `reshape`.
//!
//! Every instruction carries the source location ([`Loc`]) of the kernel code it came
//! from, so that errors from any later stage name a line of the user's kernel.
//!
//! ```
//! use dsl_runtime::ir::{Builder, Operand, BinOp, Loc, ParamKind};
//! use dsl_runtime::DType;
//! let mut b = Builder::new("double", &[("x", ParamKind::Ptr { elem: DType::F32, writable: true })]);
//! let loc = Loc::new(1, 1);
//! let offs = b.arange(0, 128, loc).unwrap();
//! let x = b.param(0);
//! let ptrs = b.add_ptr(x, offs, loc).unwrap();
//! let v = b.load(ptrs, None, None, loc).unwrap();
//! let v2 = b.binary(BinOp::Mul, v, Operand::Float(2.0), loc).unwrap();
//! b.store(ptrs, v2, None, loc).unwrap();
//! let f = b.finish().unwrap();
//! assert!(f.to_string().contains("load"));
//! ```

pub mod arith;
pub mod builder;
pub mod control;
pub mod debug;
pub mod derivative;
pub mod dot;
pub mod memory;
pub mod printer;
pub mod reduce;
pub mod shape;
pub mod verify;

pub use arith::{BinOp, CmpOp, ConstVal, UnaryOp};
pub use builder::{Builder, Operand};
pub use dot::DotPrecision;
pub use memory::AtomicOp;
pub use reduce::{ReduceOp, ScanOp};

use crate::DType;
use std::fmt;

/// A problem found while building or verifying a kernel's IR, at a source location.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuildError {
    pub loc: Loc,
    pub message: String,
}

impl BuildError {
    pub fn new(loc: Loc, message: impl Into<String>) -> BuildError {
        BuildError { loc, message: message.into() }
    }
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}:{}: {}", self.loc.line, self.loc.col, self.message)
    }
}

impl std::error::Error for BuildError {}

/// The largest block the builder accepts and the verifier allows (elements after padding
/// to powers of two).
pub const MAX_BLOCK_ELEMENTS: usize = 1 << 20;

/// An SSA value: the index of the instruction that defines it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub struct Value(pub u32);

impl Value {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// A position in the kernel's Rust source (1-based line, 1-based column), and the file
/// when it is not the kernel's own (code inlined from a `#[kernel_fn]` in another file).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct Loc {
    pub line: u32,
    pub col: u32,
    pub file: Option<&'static str>,
}

impl Loc {
    pub const fn new(line: u32, col: u32) -> Loc {
        Loc { line, col, file: None }
    }
    /// A position in `file` (what the macros emit: `file!()`, `line!()`, `column!()`).
    pub const fn in_file(file: &'static str, line: u32, col: u32) -> Loc {
        Loc { line, col, file: Some(file) }
    }
}

/// The type of an SSA value.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct Type {
    /// The element type, or the pointee type when `ptr` is set.
    pub dtype: DType,
    pub ptr: bool,
    /// Block shape; empty for scalars.
    pub shape: Vec<usize>,
    /// Set only for the unit type of effect-only instructions.
    pub unit: bool,
    /// A shared-memory buffer holding a block of `dtype` and `shape` (from `local_alloc`):
    /// the value is the buffer, read and written only by `local_load` and `local_store`.
    pub shared: bool,
}

impl Type {
    pub fn scalar(dtype: DType) -> Type {
        Type { dtype, ptr: false, shape: vec![], unit: false, shared: false }
    }
    pub fn block(dtype: DType, shape: Vec<usize>) -> Type {
        Type { dtype, ptr: false, shape, unit: false, shared: false }
    }
    pub fn pointer(pointee: DType, shape: Vec<usize>) -> Type {
        Type { dtype: pointee, ptr: true, shape, unit: false, shared: false }
    }
    pub fn unit() -> Type {
        Type { dtype: DType::Bool, ptr: false, shape: vec![], unit: true, shared: false }
    }
    /// A shared-memory buffer for a block of `dtype` and `shape` ([`memory`]).
    pub fn shared(dtype: DType, shape: Vec<usize>) -> Type {
        Type { dtype, ptr: false, shape, unit: false, shared: true }
    }
    /// Bytes of a shared-memory buffer of this type: its block padded to powers of two
    /// (as the lowering computes it), row-major.
    pub fn shared_bytes(&self) -> u64 {
        (self.padded_shape().iter().product::<usize>() * self.dtype.size()) as u64
    }
    pub fn is_scalar(&self) -> bool {
        self.shape.is_empty()
    }
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    /// The shape the lowering works on: every dimension rounded up to a power of two.
    pub fn padded_shape(&self) -> Vec<usize> {
        self.shape.iter().map(|d| d.next_power_of_two()).collect()
    }
    /// Same element type and pointer-ness, other shape.
    pub fn with_shape(&self, shape: Vec<usize>) -> Type {
        Type { shape, ..self.clone() }
    }
}

/// What a kernel parameter is.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum ParamKind {
    /// A pointer to device memory holding `elem`s. `writable` when the kernel stores
    /// through it (the typed launcher then asks for a mutable buffer).
    Ptr { elem: DType, writable: bool },
    /// A scalar passed by value (`i32`, `i64`, `f32`).
    Scalar(DType),
    /// The element count of pointer parameter `of`, added by the bounds guard
    /// (`passes::guard`); never written by users.
    Len { of: u32 },
    /// `size` opaque bytes passed by value, `align`-aligned (a TMA tensor map: 128 bytes,
    /// aligned to 64), as the launch's [`Arg::Bytes`](crate::launch::Arg::Bytes). Its value
    /// in the IR is a unit: only operations that take the parameter itself read it.
    Bytes { size: u32, align: u32 },
}

impl ParamKind {
    /// The size and alignment of the kernel parameter this is, in bytes: how the launch
    /// passes it (8-byte pointers and lengths, 4- or 8-byte scalars, bytes by value).
    pub fn slot(&self) -> (u32, u32) {
        match *self {
            ParamKind::Ptr { .. } | ParamKind::Len { .. } => (8, 8),
            ParamKind::Scalar(d) => (d.size() as u32, d.size() as u32),
            ParamKind::Bytes { size, align } => (size, align),
        }
    }
}

/// What the launcher knows about an argument's value, Triton-style. It selects the
/// specialization and lets the axis analysis prove alignment and contiguity.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct ParamSpec {
    /// Integer arguments: the value is 1 (the parameter is then replaced by a constant).
    pub eq_one: bool,
    /// Integer arguments: divisible by 16. Pointers: 16-byte aligned.
    pub div16: bool,
}

#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct Param {
    pub name: String,
    pub kind: ParamKind,
    pub spec: ParamSpec,
}

impl Param {
    /// The IR type of the value this parameter defines.
    pub fn ty(&self) -> Type {
        match self.kind {
            ParamKind::Ptr { elem, .. } => Type::pointer(elem, vec![]),
            ParamKind::Scalar(d) => Type::scalar(d),
            ParamKind::Len { .. } => Type::scalar(DType::I64),
            ParamKind::Bytes { .. } => Type::unit(),
        }
    }
}

/// An integer the host knows at launch: a scalar parameter's value or a constant (the
/// extents and strides of a TMA tensor map).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, serde::Serialize, serde::Deserialize)]
pub enum HostInt {
    Param(u32),
    Const(i64),
}

/// The global tensor an [`Op::TmaCopy`] reads, as the launch encodes its tensor map:
/// pointer parameter `ptr` holding `elem`s, seen as a 2-D tensor of `dims` elements
/// (contiguous dimension first) whose rows are `stride` elements apart, repeated along up
/// to three batch dimensions `batch` elements apart (the kernel's scalar offsets of the
/// pointer, `y * s_y`: a batch, a head); the copied tile's dimension `inner` is the
/// contiguous one.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct TmaTile {
    pub ptr: u32,
    pub elem: DType,
    pub dims: [HostInt; 2],
    pub stride: HostInt,
    pub batch: [Option<HostInt>; 3],
    pub inner: usize,
}

impl TmaTile {
    /// The batch strides, in order.
    pub fn batch_strides(&self) -> impl Iterator<Item = HostInt> + '_ {
        self.batch.iter().map_while(|b| *b)
    }
}

/// One instruction.
#[derive(Clone, PartialEq, Debug)]
pub enum Op {
    /// The value of parameter `i` (uniform over the program).
    Param(u32),
    Const(ConstVal),
    /// `program_id(axis)`, `axis` in 0..3.
    ProgramId(u8),
    /// `num_programs(axis)`.
    NumPrograms(u8),
    /// `start, start+1, ..., end-1` as a 1-D `i32` block.
    Arange { start: i64, end: i64 },
    /// A scalar repeated over the result's shape.
    Splat(Value),
    Binary(BinOp, Value, Value),
    Cmp(CmpOp, Value, Value),
    Unary(UnaryOp, Value),
    /// `select(cond, a, b)`: `a` where `cond` is true, else `b`.
    Select(Value, Value, Value),
    /// `fma(a, b, c)`: `a * b + c` on floats, rounded once (in f32, as float arithmetic is).
    Fma(Value, Value, Value),
    /// Conversion to the instruction's result type.
    Cast(Value),
    /// Insert a dimension of size 1 at `axis` ([`shape`]).
    ExpandDims(Value, u8),
    /// Repeat along the dimensions where the operand has size 1 and the result more.
    Broadcast(Value),
    /// Permute dimensions: result dimension `i` is operand dimension `perm[i]`.
    Permute(Value, Vec<u8>),
    /// Same elements in row-major order, another shape.
    Reshape(Value),
    /// The same block in another layout (the result's, in the plan): inserted by
    /// `passes::convert` after layouts are assigned, never built
    /// by kernels ([`shape`]).
    ConvertLayout(Value),
    /// Reduce along `axis`, which disappears from the shape ([`reduce`]).
    Reduce { op: ReduceOp, x: Value, axis: u8 },
    /// Inclusive scan along `axis` ([`reduce`]).
    Scan { op: ScanOp, x: Value, axis: u8 },
    /// `acc + a @ b` on 2-D blocks ([`dot`]).
    Dot { a: Value, b: Value, acc: Value, precision: DotPrecision },
    /// `ptr + offsets`, in elements of the pointee type.
    AddPtr(Value, Value),
    /// The offset (in elements, `i64`) of a pointer from the parameter it derives from.
    PtrOffset(Value),
    /// Masked-off lanes give `other` (or an unspecified value when `other` is absent).
    Load { ptr: Value, mask: Option<Value>, other: Option<Value> },
    /// Masked-off lanes store nothing.
    Store { ptr: Value, value: Value, mask: Option<Value> },
    /// Read-modify-write; gives the old values ([`memory`]). `cmp` only for `Cas`;
    /// `relaxed`: no ordering of other accesses (else acquire-release).
    Atomic { op: AtomicOp, ptr: Value, value: Value, cmp: Option<Value>, mask: Option<Value>, relaxed: bool },
    /// A shared-memory buffer for the result type's block, holding `init` if given
    /// ([`memory`]); its offset comes from the allocator.
    LocalAlloc(Option<Value>),
    /// Write a whole block into a shared-memory buffer.
    LocalStore { buf: Value, value: Value },
    /// Read a shared-memory buffer's block (in whatever layout its users want).
    LocalLoad(Value),
    /// Stage `slot` (an integer scalar) of a buffer of stages `[S, ..]`: a view of one
    /// stage's block, buffer type `[..]` (made by the pipeliner, [`memory`]).
    LocalSlot { buf: Value, slot: Value },
    /// A 2-D buffer (or stage) seen with its dimensions swapped: a view of type
    /// `[d1, d0]` over the same bytes (Triton's `memdesc_trans`), so a block and its
    /// transpose share one buffer and `trans(x)` costs no data movement ([`memory`]).
    LocalTrans(Value),
    /// Start copying the block at `ptr` into the buffer view `dst` without waiting
    /// (`cp.async`); masked-off elements become zero. Complete once an [`Op::AsyncWait`]
    /// leaves its group behind (made by the pipeliner, [`memory`]).
    AsyncCopy { dst: Value, ptr: Value, mask: Option<Value> },
    /// Close the group of the async copies issued since the last commit.
    AsyncCommit,
    /// Wait until at most `n` committed groups of this thread are pending, then a barrier,
    /// so that the other groups' copies are visible to every thread.
    AsyncWait(u32),
    /// Copy the 2-D tile `tile` describes, at element coordinates `coords` (along its
    /// contiguous dimension first, then the other, then one per batch dimension of the
    /// tensor; `i32`), into the stage `dst` by the
    /// tensor memory accelerator (sm_90 TMA, `cp.async.bulk.tensor`), with the tensor
    /// map the launch passes in the by-value parameter `map`; elements outside the
    /// tensor (the edges) become zero. One thread of the program issues it when `on` (a
    /// `bool` scalar) holds, and it completes a phase of mbarrier `slot` of `bars`, which
    /// also expects its bytes; without `on` that thread only arrives at the barrier.
    /// Made by the pipeliner ([`memory`]).
    TmaCopy { dst: Value, map: Value, coords: Vec<Value>, bars: Value, slot: Value, on: Value, tile: TmaTile },
    /// Copy the block of buffer `src` (2-D, laid out as a TMA box's strips: made by
    /// `passes::tma::stores`) to the tile `tile` describes at element coordinates `coords`
    /// (as [`Op::TmaCopy`]'s) by the tensor memory accelerator (`cp.async.bulk.tensor`,
    /// shared to global), with the tensor map in the by-value parameter `map`; elements
    /// outside the tensor are not written. Every thread's writes of `src` are fenced to
    /// the async proxy and a barrier passed first; one thread issues the copies and waits
    /// until they have read `src` ([`memory`]). With `add`, the tile is added to what the
    /// tensor holds instead (`cp.reduce.async.bulk.tensor .add`, each element's addition
    /// atomic, unordered: a relaxed `atomic_add` whose result is unused).
    TmaStore { src: Value, map: Value, coords: Vec<Value>, tile: TmaTile, add: bool },
    /// Initialize every mbarrier of the `i64` buffer `bars` to expect `count` arrivals a
    /// phase (one thread), then a barrier.
    MbarInit { bars: Value, count: u32 },
    /// Wait until mbarrier `slot` of `bars` has completed the phase of parity `phase` (an
    /// integer scalar, 0 or 1), then (`sync`) a barrier.
    MbarWait { bars: Value, slot: Value, phase: Value, sync: bool },
    /// Each warp arrives once at mbarrier `slot` of `bars` where `on` (a `bool` scalar)
    /// holds, after the `wgmma`s that read the stage it guards are complete: a consumer
    /// of a warp-specialized loop gives its stage back to the producer ([`Op::WarpSpecialize`]).
    MbarArrive { bars: Value, slot: Value, on: Value },
    /// Warp specialization (sm_90a; made by the pipeliner): the program's `num_warps`
    /// warps run `consumer`, and a warpgroup more, the producer, runs `producer` (in one
    /// thread: TMA copies into a ring of stages, each after the consumers gave it back),
    /// with its registers lowered (`setmaxnreg`) so that the consumers may use more. Values
    /// defined before it are seen by both; neither region yields. The consumers'
    /// barriers count only them.
    WarpSpecialize { producer: Region, consumer: Region },
    /// The two consumer warpgroups of a warp specialization take turns at what lies
    /// between `turn_begin` (`begin`) and `turn_end`, one after the other (FlashAttention-3's
    /// ping-pong: one warpgroup's products issued while the other computes its softmax).
    /// Made by the pipeliner.
    Turn { begin: bool },
    /// A counted loop over `start..end` by `step` carrying `init` ([`control`]).
    For { start: Value, end: Value, step: Value, init: Vec<Value>, body: Region },
    /// A branch on a scalar `bool` ([`control`]).
    If { cond: Value, then: Region, els: Region },
    /// Result `i` of the `For`/`If` instruction `of`.
    Result(Value, u32),
    /// Argument `i` of the region(s) of instruction `of` (a loop's counter and carried values).
    Arg(Value, u32),
    /// End the program.
    Return,
    /// Stop with `msg` where `cond` is false (debug builds only; [`debug`]).
    Assert { cond: Value, msg: String },
    /// Print `prefix` and the values (debug builds only).
    Print { prefix: String, args: Vec<Value> },
    /// Record the first lane of the launch whose `mask` is true but whose `offset` into
    /// parameter `param` is not below `len` (checked launches only, inserted by the
    /// guard; [`debug`]).
    BoundsCheck { access: Access, param: u32, offset: Value, len: Value, mask: Option<Value> },
}

/// What a checked memory access does, for its report.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Access {
    Load = 0,
    Store = 1,
    Atomic = 2,
}

impl Access {
    pub fn name(self) -> &'static str {
        match self {
            Access::Load => "load",
            Access::Store => "store",
            Access::Atomic => "atomic",
        }
    }
    pub fn from_code(c: u64) -> Access {
        match c {
            0 => Access::Load,
            1 => Access::Store,
            _ => Access::Atomic,
        }
    }
}

impl Op {
    /// The SSA operands read by the instruction itself, in order (not the yields of its
    /// regions; see [`Op::regions`]).
    pub fn operands(&self) -> Vec<Value> {
        match self {
            Op::Param(_) | Op::Const(_) | Op::ProgramId(_) | Op::NumPrograms(_) | Op::Arange { .. } | Op::Arg(..) | Op::Return | Op::LocalAlloc(None) | Op::AsyncCommit | Op::AsyncWait(_) => vec![],
            Op::LocalSlot { buf, slot } => vec![*buf, *slot],
            Op::AsyncCopy { dst, ptr, mask } => [Some(*dst), Some(*ptr), *mask].into_iter().flatten().collect(),
            Op::TmaCopy { dst, map, coords, bars, slot, on, .. } => [*dst, *map].into_iter().chain(coords.iter().copied()).chain([*bars, *slot, *on]).collect(),
            Op::TmaStore { src, map, coords, .. } => [*src, *map].into_iter().chain(coords.iter().copied()).collect(),
            Op::MbarInit { bars, .. } => vec![*bars],
            Op::MbarWait { bars, slot, phase, .. } => vec![*bars, *slot, *phase],
            Op::MbarArrive { bars, slot, on } => vec![*bars, *slot, *on],
            Op::WarpSpecialize { .. } | Op::Turn { .. } => vec![],
            Op::LocalAlloc(Some(v)) | Op::LocalLoad(v) | Op::LocalTrans(v) => vec![*v],
            Op::LocalStore { buf, value } => vec![*buf, *value],
            Op::Splat(v) | Op::Unary(_, v) | Op::Cast(v) | Op::ExpandDims(v, _) | Op::Broadcast(v) | Op::Permute(v, _) | Op::Reshape(v) | Op::ConvertLayout(v) => vec![*v],
            Op::Reduce { x, .. } | Op::Scan { x, .. } | Op::PtrOffset(x) | Op::Result(x, _) => vec![*x],
            Op::Binary(_, a, b) | Op::Cmp(_, a, b) | Op::AddPtr(a, b) => vec![*a, *b],
            Op::Select(c, a, b) | Op::Fma(c, a, b) | Op::Dot { a: c, b: a, acc: b, .. } => vec![*c, *a, *b],
            Op::Load { ptr, mask, other } => [Some(*ptr), *mask, *other].into_iter().flatten().collect(),
            Op::Store { ptr, value, mask } => [Some(*ptr), Some(*value), *mask].into_iter().flatten().collect(),
            Op::Atomic { ptr, value, cmp, mask, .. } => [Some(*ptr), Some(*value), *cmp, *mask].into_iter().flatten().collect(),
            Op::For { start, end, step, init, .. } => [*start, *end, *step].into_iter().chain(init.iter().copied()).collect(),
            Op::If { cond, .. } => vec![*cond],
            Op::Assert { cond, .. } => vec![*cond],
            Op::Print { args, .. } => args.clone(),
            Op::BoundsCheck { offset, len, mask, .. } => [Some(*offset), Some(*len), *mask].into_iter().flatten().collect(),
        }
    }

    /// The nested regions (loop body; then and else branches).
    pub fn regions(&self) -> Vec<&Region> {
        match self {
            Op::For { body, .. } => vec![body],
            Op::If { then, els, .. } => vec![then, els],
            Op::WarpSpecialize { producer, consumer } => vec![producer, consumer],
            _ => vec![],
        }
    }

    pub fn regions_mut(&mut self) -> Vec<&mut Region> {
        match self {
            Op::For { body, .. } => vec![body],
            Op::If { then, els, .. } => vec![then, els],
            Op::WarpSpecialize { producer, consumer } => vec![producer, consumer],
            _ => vec![],
        }
    }

    /// Rewrite every operand (including region yields, not region contents) through `f`.
    pub fn map_operands(&mut self, mut f: impl FnMut(Value) -> Value) {
        let opt = |o: &mut Option<Value>, f: &mut dyn FnMut(Value) -> Value| {
            if let Some(x) = o {
                *x = f(*x);
            }
        };
        match self {
            Op::Param(_) | Op::Const(_) | Op::ProgramId(_) | Op::NumPrograms(_) | Op::Arange { .. } | Op::Arg(..) | Op::Return | Op::AsyncCommit | Op::AsyncWait(_) => {}
            Op::LocalAlloc(init) => opt(init, &mut f),
            Op::LocalLoad(v) | Op::LocalTrans(v) => *v = f(*v),
            Op::LocalStore { buf, value } => {
                *buf = f(*buf);
                *value = f(*value);
            }
            Op::Splat(v) | Op::Unary(_, v) | Op::Cast(v) | Op::ExpandDims(v, _) | Op::Broadcast(v) | Op::Permute(v, _) | Op::Reshape(v) | Op::ConvertLayout(v) => *v = f(*v),
            Op::Reduce { x, .. } | Op::Scan { x, .. } | Op::PtrOffset(x) | Op::Result(x, _) => *x = f(*x),
            Op::Binary(_, a, b) | Op::Cmp(_, a, b) | Op::AddPtr(a, b) => {
                *a = f(*a);
                *b = f(*b);
            }
            Op::Select(c, a, b) | Op::Fma(c, a, b) | Op::Dot { a: c, b: a, acc: b, .. } => {
                *c = f(*c);
                *a = f(*a);
                *b = f(*b);
            }
            Op::Load { ptr, mask, other } => {
                *ptr = f(*ptr);
                opt(mask, &mut f);
                opt(other, &mut f);
            }
            Op::LocalSlot { buf, slot } => {
                *buf = f(*buf);
                *slot = f(*slot);
            }
            Op::AsyncCopy { dst, ptr, mask } => {
                *dst = f(*dst);
                *ptr = f(*ptr);
                opt(mask, &mut f);
            }
            Op::TmaCopy { dst, map, coords, bars, slot, on, .. } => {
                for x in [dst, map, bars, slot, on] {
                    *x = f(*x);
                }
                coords.iter_mut().for_each(|x| *x = f(*x));
            }
            Op::TmaStore { src, map, coords, .. } => {
                *src = f(*src);
                *map = f(*map);
                coords.iter_mut().for_each(|x| *x = f(*x));
            }
            Op::MbarInit { bars, .. } => *bars = f(*bars),
            Op::MbarWait { bars, slot, phase, .. } => {
                *bars = f(*bars);
                *slot = f(*slot);
                *phase = f(*phase);
            }
            Op::MbarArrive { bars, slot, on } => {
                *bars = f(*bars);
                *slot = f(*slot);
                *on = f(*on);
            }
            Op::WarpSpecialize { .. } | Op::Turn { .. } => {}
            Op::Store { ptr, value, mask } => {
                *ptr = f(*ptr);
                *value = f(*value);
                opt(mask, &mut f);
            }
            Op::Atomic { ptr, value, cmp, mask, .. } => {
                *ptr = f(*ptr);
                *value = f(*value);
                opt(cmp, &mut f);
                opt(mask, &mut f);
            }
            Op::For { start, end, step, init, body } => {
                *start = f(*start);
                *end = f(*end);
                *step = f(*step);
                init.iter_mut().for_each(|x| *x = f(*x));
                body.yields.iter_mut().for_each(|x| *x = f(*x));
            }
            Op::If { cond, then, els } => {
                *cond = f(*cond);
                then.yields.iter_mut().for_each(|x| *x = f(*x));
                els.yields.iter_mut().for_each(|x| *x = f(*x));
            }
            Op::Assert { cond, .. } => *cond = f(*cond),
            Op::Print { args, .. } => args.iter_mut().for_each(|x| *x = f(*x)),
            Op::BoundsCheck { offset, len, mask, .. } => {
                *offset = f(*offset);
                *len = f(*len);
                opt(mask, &mut f);
            }
        }
    }

    /// Instructions with effects are never removed or merged (control flow counts: a
    /// region may store or return). Shared-memory instructions count: two allocations are
    /// two buffers, and a `local_load` reads memory a `local_store` may have changed.
    pub fn has_effects(&self) -> bool {
        matches!(
            self,
            Op::Store { .. }
                | Op::LocalAlloc(_)
                | Op::LocalStore { .. }
                | Op::LocalLoad(_)
                | Op::AsyncCopy { .. }
                | Op::AsyncCommit
                | Op::AsyncWait(_)
                | Op::TmaCopy { .. }
                | Op::TmaStore { .. }
                | Op::MbarInit { .. }
                | Op::MbarWait { .. }
                | Op::MbarArrive { .. }
                | Op::WarpSpecialize { .. }
                | Op::Turn { .. }
                | Op::Atomic { .. }
                | Op::For { .. }
                | Op::If { .. }
                | Op::Return
                | Op::Assert { .. }
                | Op::Print { .. }
                | Op::BoundsCheck { .. }
        )
    }
}

/// The body of a loop or a branch: its arguments (a loop's counter, then its carried
/// values), its instructions, and the values it yields (a loop's next carried values, a
/// branch's results).
#[derive(Clone, PartialEq, Debug, Default)]
pub struct Region {
    pub args: Vec<Value>,
    pub body: Block,
    pub yields: Vec<Value>,
}

/// An instruction: what it computes, its result type, and where it came from.
#[derive(Clone, PartialEq, Debug)]
pub struct Inst {
    pub op: Op,
    pub ty: Type,
    pub loc: Loc,
}

/// A sequence of instructions in program order. Loops and branches own nested blocks
/// through their [`Region`]s.
#[derive(Clone, PartialEq, Debug, Default)]
pub struct Block {
    pub insts: Vec<Value>,
}

/// A kernel in block IR.
#[derive(Clone, PartialEq, Debug)]
pub struct Function {
    pub name: String,
    pub params: Vec<Param>,
    /// Compile-time constants the kernel was specialized with (for printing and keys).
    pub constants: Vec<(String, String)>,
    /// The arena: `values[v.index()]` defines `v`.
    pub values: Vec<Inst>,
    pub body: Block,
}

impl Function {
    pub fn inst(&self, v: Value) -> &Inst {
        &self.values[v.index()]
    }
    pub fn ty(&self, v: Value) -> &Type {
        &self.values[v.index()].ty
    }
    /// Append an instruction to the arena (not to the body) and return its value.
    pub fn push(&mut self, op: Op, ty: Type, loc: Loc) -> Value {
        self.values.push(Inst { op, ty, loc });
        Value(self.values.len() as u32 - 1)
    }
    /// The instructions of the block (the body or a region's) that holds `v`.
    pub fn enclosing_block(&self, v: Value) -> Vec<Value> {
        fn find(f: &Function, b: &Block, v: Value) -> Option<Vec<Value>> {
            if b.insts.contains(&v) {
                return Some(b.insts.clone());
            }
            b.insts.iter().flat_map(|&w| f.inst(w).op.regions()).find_map(|r| find(f, &r.body, v))
        }
        find(self, &self.body, v).unwrap_or_default()
    }

    /// Apply `g` to the instruction list of every block: the body, then each region of
    /// each instruction it holds after `g` ran on it, recursively.
    pub(crate) fn edit_blocks(&mut self, g: &mut dyn FnMut(&mut Vec<Value>)) {
        fn go(f: &mut Function, insts: &mut Vec<Value>, g: &mut dyn FnMut(&mut Vec<Value>)) {
            g(insts);
            for &v in &insts.clone() {
                for i in 0..f.inst(v).op.regions().len() {
                    let mut inner = std::mem::take(&mut f.values[v.index()].op.regions_mut()[i].body.insts);
                    go(f, &mut inner, g);
                    f.values[v.index()].op.regions_mut()[i].body.insts = inner;
                }
            }
        }
        let mut body = std::mem::take(&mut self.body.insts);
        go(self, &mut body, g);
        self.body.insts = body;
    }

    /// Every instruction of the body and of nested regions, in program order (an
    /// instruction before the contents of its regions).
    pub fn walk(&self) -> Vec<Value> {
        self.walk_from(&self.body.insts)
    }

    /// [`walk`](Self::walk) of the instructions `insts` (a block's) and their regions.
    pub fn walk_from(&self, insts: &[Value]) -> Vec<Value> {
        fn go(f: &Function, insts: &[Value], out: &mut Vec<Value>) {
            for &v in insts {
                out.push(v);
                for r in f.inst(v).op.regions() {
                    go(f, &r.body.insts, out);
                }
            }
        }
        let mut out = Vec::with_capacity(self.values.len());
        go(self, insts, &mut out);
        out
    }

    /// The users of each value among the instructions `insts` and their regions: the
    /// instructions that take it as an operand, and the loop or branch whose region yields
    /// it.
    pub fn users_in(&self, insts: &[Value]) -> std::collections::HashMap<Value, Vec<Value>> {
        let mut users: std::collections::HashMap<Value, Vec<Value>> = Default::default();
        for w in self.walk_from(insts) {
            let op = &self.inst(w).op;
            for o in op.operands().into_iter().chain(op.regions().into_iter().flat_map(|r| r.yields.iter().copied())) {
                users.entry(o).or_default().push(w);
            }
        }
        users
    }

    /// Whether any instruction of the function takes `v` as an operand or yields it.
    pub fn has_users(&self, v: Value) -> bool {
        self.walk_from(&self.body.insts).into_iter().any(|w| {
            let op = &self.inst(w).op;
            op.operands().contains(&v) || op.regions().iter().any(|r| r.yields.contains(&v))
        })
    }

    /// The `Result` instructions of the loop or branch `owner`, by index (`None` where
    /// the result was removed as unused).
    pub fn results_of(&self, owner: Value) -> Vec<Option<Value>> {
        let n = match &self.inst(owner).op {
            Op::For { init, .. } => init.len(),
            Op::If { then, .. } => then.yields.len(),
            _ => 0,
        };
        let mut out = vec![None; n];
        // Results are created together, right after their owner's regions close: stop
        // after the first run of them.
        let mut found = 0;
        for (k, inst) in self.values.iter().enumerate().skip(owner.index() + 1) {
            match inst.op {
                Op::Result(o, i) if o == owner && (i as usize) < n => {
                    out[i as usize] = Some(Value(k as u32));
                    found += 1;
                }
                _ if found > 0 => break,
                _ => {}
            }
        }
        out
    }

    /// The initial value (or first branch's value) a carried value or result stands for.
    fn carried_init(&self, v: Value) -> Option<Value> {
        match self.inst(v).op {
            // Loop arguments: 0 is the counter, then the carried values.
            Op::Arg(owner, i) if i > 0 => match &self.inst(owner).op {
                Op::For { init, .. } => init.get(i as usize - 1).copied(),
                _ => None,
            },
            Op::Result(owner, i) => match &self.inst(owner).op {
                Op::For { init, .. } => init.get(i as usize).copied(),
                Op::If { then, .. } => then.yields.get(i as usize).copied(),
                _ => None,
            },
            _ => None,
        }
    }

    /// Whether `v` is a zero constant, or a block of one (`+0.0` for floats): a masked
    /// load's `other` that needs no fill, a `zeros` accumulator.
    pub fn is_zero(&self, mut v: Value) -> bool {
        loop {
            match self.inst(v).op {
                Op::Const(ConstVal::Int(0)) => return true,
                Op::Const(ConstVal::Float(x)) => return x == 0.0 && x.is_sign_positive(),
                Op::Splat(x) | Op::Broadcast(x) => v = x,
                _ => return false,
            }
        }
    }

    /// The buffer (`local_alloc`) a shared-memory view reads and writes: through
    /// `local_slot` and `local_trans`; a buffer is its own.
    pub fn buffer_root(&self, mut v: Value) -> Value {
        while let Op::LocalSlot { buf: b, .. } | Op::LocalTrans(b) = self.inst(v).op {
            v = b;
        }
        v
    }

    /// The pointer parameter a pointer value derives from: through `add_ptr`, shape
    /// operations, and loop-carried values (whose root is that of their initial value;
    /// the verifier checks that updates and branches keep it).
    pub fn pointer_root(&self, mut v: Value) -> Option<u32> {
        for _ in 0..self.values.len() + 1 {
            v = match self.inst(v).op {
                Op::AddPtr(p, _) => p,
                Op::Splat(_) | Op::ExpandDims(..) | Op::Broadcast(_) | Op::Permute(..) | Op::Reshape(_) | Op::ConvertLayout(_) => self.inst(v).op.operands()[0],
                Op::Param(i) => return Some(i),
                Op::Arg(..) | Op::Result(..) => self.carried_init(v)?,
                _ => return None,
            };
        }
        None
    }
}
