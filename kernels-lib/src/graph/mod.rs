//! Graphs of tensor operations, compiled into fused kernels.
//!
//! A [`Graph`] is written the way a PyTorch or JAX user writes the math: inputs with an
//! element type and a shape, elementwise operations with NumPy broadcasting, comparisons,
//! `where_`, casts and scalar constants, reductions along any axis (`sum`, `mean`,
//! `amax`, `amin`, and `argmax`/`argmin` giving `i32` indices, which outputs may be;
//! kept with size 1; the kernels reduce along the last, other axes are
//! transposed there by a view) and what is composed of them (`softmax`,
//! `log_softmax`, `rms_norm`, `layer_norm`), views (`reshape`, `permute`/`transpose`,
//! `expand`, `slice`/`slice_step`, `repeat_interleave`) and concatenation (`cat`,
//! `Graph::concat`), all index maps, never copies; matrix products (`matmul`, batched,
//! broadcasting) on the library's batched matmul or, with the pointwise operations that
//! follow them fused, on a generated kernel of its main loop, transposes and broadcasts of stored
//! values read through strides; then outputs. [`Graph::compile`] turns it
//! into a [`Plan`]: one kernel per fusion group, built as block IR through the IR
//! [`Builder`](dsl_runtime::ir::Builder) (an [`IrKernel`](dsl_runtime::IrKernel) each, no
//! macro), which runs on a GPU or on the interpreter.
//!
//! The stages, one file each:
//!
//! - this module: the graph, its nodes and [`Tensor`] handles (operator overloading), and
//!   the checks of shapes and element types ([`GraphError`]); nodes are hash-consed, so
//!   writing `x.relu()` twice gives one node (common subexpressions are computed once);
//! - [`attention`](mod@attention): recognising `softmax(q @ k^T * scale) @ v` (GQA by
//!   `repeat_interleave`, `expand` + `reshape` or the query heads grouped, optionally under
//!   the causal mask [`Graph::tril`] (or a sliding window, the difference of two), under a
//!   mask or bias from data (shared by the heads or one per head), and with soft-capped
//!   scores or other elementwise operations on them, compiled into the kernels' score
//!   hook), which becomes one flash-attention launch;
//! - [`autodiff`]: reverse-mode gradients ([`Graph::grad`]), appended to the graph as
//!   ordinary nodes and fused with it (a recognised attention's as one flash-attention
//!   backward);
//! - [`fuse`]: the fusion pass, which partitions the nodes the outputs need into
//!   [`Group`]s (one kernel each) and says what each group loads and stores;
//! - [`codegen`]: one group to one kernel over the flattened iteration space of its shape,
//!   with broadcast operands read through index maps (never copied), or one program per
//!   row for groups that reduce;
//! - [`plan`]: the compiled [`Plan`] (its intermediates in buffers allocated once and
//!   shared by liveness) and [`Plan::run`], which checks the buffers it is given and
//!   launches the kernels ([`Plan::run_graph`]: recorded once as a CUDA graph,
//!   then replayed with one driver call);
//! - [`reference`](mod@reference): an `f64` evaluation of a graph on the host, for tests;
//! - [`symbolic`]: graphs over named dimensions bound at run time ([`Symbolic`]), a plan
//!   compiled per binding.
//!
//! ```
//! use dsl_runtime::{DType, Runtime};
//! use kernels_lib::graph::{Graph, TensorMut};
//!
//! let g = Graph::new();
//! let x = g.input("x", DType::F32, &[2, 3]);
//! let b = g.input("b", DType::F32, &[3]);
//! let r = (x + b).relu();
//! g.output("y", r + r * 2.0).unwrap();
//!
//! let rt = Runtime::interpreter();
//! let mut plan = g.compile(&rt).unwrap();
//! assert_eq!(plan.kernel_count(), 1); // one fused kernel: loads x and b, stores y
//! let x = rt.upload(&[-1.0f32, 0.5, 2.0, 3.0, -4.0, 1.0]).unwrap();
//! let b = rt.upload(&[1.0f32, 1.0, -1.0]).unwrap();
//! let mut y = rt.zeros::<f32>(6).unwrap();
//! plan.run(&rt, &[(&x).into(), (&b).into()], &mut [TensorMut::from(&mut y)]).unwrap();
//! assert_eq!(y.to_vec().unwrap(), [0.0, 4.5, 3.0, 12.0, 0.0, 0.0]);
//! ```
//!
//! The numerical contract: every node rounds to its element type, fused or not (an `f16`
//! node in a fused kernel is rounded to `f16` as if it had been stored), so a fused plan
//! computes exactly what the unfused one does (see `tests/all/graph.rs`).
//!
//! Reductions sum in f32 (16-bit inputs too) and round to the node's type; they are
//! deterministic (fused and unfused plans reduce the same values the same way) but not
//! bit-equal to a sequential sum.
//!
//! What this slice does not do yet: shapes are static within a plan (symbolic dimensions
//! specialize: one plan per binding, [`Symbolic`]); reductions along an axis other than the last read it strided (no coalescing layout for
//! them); rows longer than 16384 elements loop over chunks, a pass per level of
//! reductions; matrix products fuse their pointwise epilogue
//! (bias, activation, residual, casts: one kernel, the product in registers) but not a
//! prologue (a computed operand is stored first);
//! attention is recognised under no mask, the causal one, a sliding window or one mask or
//! bias from data, shared by the heads or one per head (packed into an f32 scratch per
//! run, the extents the tensor has: `B T` values for a key padding mask; the backward's
//! scratch is at least as long as a dense `[B, T, T]` bias, which the library's launches
//! check; no gradient for the bias; with the query heads grouped as `[B, KV, G, T, D]`,
//! shared by the heads only), with a soft-cap or elementwise operations with constants on
//! the scaled scores, alone or followed by a window, data or both (a window with data is
//! a hook too; all in the kernels' score hook; two biases run as written; a batched product whose batch
//! dimensions do not merge into three is refused); the flash-attention
//! backward of a gradient reads its operands row-major (copies of them first) unless they
//! and its gradients are all the projections' `[B, T, H, D]` layout (the seed's), and
//! recomputes the forward unless it is in that layout too;
//! a cost model in bytes only (a pointwise node needed in several spaces is stored
//! once where that moves fewer bytes, [`fuse`]; a view that reads its operand many times,
//! an `expand` or `repeat_interleave`, recomputes the operand's elementwise chain for each
//! read).
//!
//! Generated kernels are autotuned with [`Options::tune`] (block size or rows a program,
//! and warps; [`tune_space`]), through the same [`autotune`] tuner and results file as the
//! library's `tune(..)` kernels.

pub mod attention;
pub mod autodiff;
pub mod codegen;
pub mod fuse;
pub mod plan;
pub mod reference;
pub mod symbolic;

pub use dsl_runtime::ir::{BinOp, CmpOp, UnaryOp};
pub use fuse::{Fusion, Group};
pub use plan::{tune_space, Options, Plan, PlanError, TensorMut, TensorRef};
pub use symbolic::{Dims, Symbolic};

use dsl_runtime::DType;
use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt;

/// A problem with a graph: operands that do not fit together, or a graph that cannot be
/// compiled. Shapes are written as lists (`[3, 1000]`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GraphError {
    /// Two operands whose shapes do not broadcast.
    #[error("`{op}`: shapes {lhs:?} and {rhs:?} do not broadcast (dimensions must be equal or 1, counted from the right)")]
    Broadcast { op: &'static str, lhs: Vec<usize>, rhs: Vec<usize> },
    /// Two operands whose element types do not combine (a mask with a number).
    #[error("`{op}`: element types {lhs} and {rhs} do not combine (operands of shapes {lhs_shape:?} and {rhs_shape:?}); compare to get a mask, or `cast` the mask")]
    DType { op: &'static str, lhs: DType, rhs: DType, lhs_shape: Vec<usize>, rhs_shape: Vec<usize> },
    /// An operation that needs a float operand was given a mask.
    #[error("`{op}` needs a float tensor, found {found} of shape {shape:?}")]
    NotFloat { op: &'static str, found: DType, shape: Vec<usize> },
    /// The condition of `where_` is not a mask.
    #[error("`where_`: the condition must be a bool tensor (a comparison), found {found} of shape {shape:?}")]
    Condition { found: DType, shape: Vec<usize> },
    /// A cast this slice does not support.
    #[error("`cast` from {from} to {to}: only casts to f32, f16 or bf16 are supported (compare to get a mask)")]
    Cast { from: DType, to: DType },
    /// An input or output of an element type graphs do not take.
    #[error("{what} `{name}` is {dtype}: graph inputs are f32, f16 or bf16, outputs those or i32 (indices)")]
    Storage { what: &'static str, name: String, dtype: DType },
    /// Two inputs, or two outputs, of one name.
    #[error("two {what}s are named `{name}`")]
    DuplicateName { what: &'static str, name: String },
    /// A tensor of another graph was used in this one.
    #[error("`{op}`: an operand belongs to another graph")]
    ForeignTensor { op: &'static str },
    /// A tensor too large for 32-bit element offsets.
    #[error("shape {shape:?} has {numel} elements; this slice indexes with 32-bit offsets (at most 2^31 - 1)")]
    TooLarge { shape: Vec<usize>, numel: u128 },
    /// A graph without outputs.
    #[error("the graph has no outputs: nothing to compute")]
    NoOutputs,
    /// A reduction along an axis the tensor does not have.
    #[error("`{op}` along axis {axis} of shape {shape:?}: the axis is out of range")]
    Axis { op: &'static str, axis: isize, shape: Vec<usize> },
    /// A reduction along an axis of length 0 (PyTorch sums nothing to 0 and refuses a
    /// max of nothing; here every reduction of nothing is refused).
    #[error("`{op}` along axis {axis} of shape {shape:?}: the axis has no elements to reduce")]
    EmptyAxis { op: &'static str, axis: isize, shape: Vec<usize> },
    /// Matrix product operands whose shapes do not fit.
    #[error("`matmul`: shapes {lhs:?} and {rhs:?} do not multiply ({detail})")]
    Matmul { lhs: Vec<usize>, rhs: Vec<usize>, detail: String },
    /// A view whose arguments do not fit the tensor's shape.
    #[error("`{op}` of a tensor of shape {shape:?}: {detail}")]
    View { op: &'static str, shape: Vec<usize>, detail: String },
    /// A gradient [`Graph::grad`] cannot build.
    #[error("gradient through `{op}`: {detail}")]
    NoGradient { op: String, detail: String },
}

/// A node's index in its graph. Nodes are numbered in creation order, which is a
/// topological order (operands exist before their users).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub struct NodeId(pub u32);

impl NodeId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "n{}", self.0)
    }
}

/// What a node computes. Operands are earlier nodes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Op {
    /// Input number `i` (in the order of [`Graph::input`] calls).
    Input(usize),
    /// A scalar constant (the bits of an `f64`), of the element type of the tensor it was
    /// combined with.
    Const(u64),
    /// `[rows, cols]` booleans, true where the column is at most the row plus `k`
    /// (`torch.tril(torch.ones(rows, cols), k).bool()`; [`Graph::tril`]): computed from
    /// the element's indices, never loaded. `k = 0` is the causal mask.
    Tril(i64),
    /// `max(x, 0)`.
    Relu(NodeId),
    Unary(UnaryOp, NodeId),
    Binary(BinOp, NodeId, NodeId),
    /// A mask.
    Cmp(CmpOp, NodeId, NodeId),
    /// `where_(cond, a, b)`.
    Where(NodeId, NodeId, NodeId),
    /// To the node's element type.
    Cast(NodeId),
    /// A reduction along the last axis, kept with size 1 (PyTorch's `keepdim=True`).
    Reduce(Reduction, NodeId),
    /// The operand's elements seen in another shape or order ([`View`]): an index map,
    /// never a copy unless a kernel boundary needs the value in memory.
    View(View, NodeId),
    /// The first operand followed by the second along an axis (`torch.cat`): elements
    /// before the first operand's length along it read the first, the rest the second.
    Concat(NodeId, NodeId, u8),
    /// The matrix product of the last two axes, the others batch dimensions broadcast
    /// against each other (`torch.matmul`), accumulated in f32, rounded to the node's type.
    Matmul(NodeId, NodeId),
    /// One gradient of a recognised attention ([`Graph::grad`]): what the flash-attention
    /// backward computes for `softmax(scale q k^T) v` (`k`, `v` repeated over groups of
    /// query heads) given the result's gradient.
    AttentionGrad(AttentionGrad),
}

/// The operands and parameters of an [`Op::AttentionGrad`]: `q` `[B, H, T, D]`, `k` and
/// `v` `[B, H / group, T, D]`, `dout` of `q`'s shape; `which` gradient (0: `dq`, of `q`'s
/// shape; 1: `dk`; 2: `dv`, of `k`'s, summed over each group of query heads).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct AttentionGrad {
    pub q: NodeId,
    pub k: NodeId,
    pub v: NodeId,
    pub dout: NodeId,
    pub which: u8,
    pub group: u32,
    /// The scale's bits (an `f64`).
    pub scale_bits: u64,
    /// Under the causal mask.
    pub causal: bool,
    /// The soft-cap's bits (an `f64`), when the scaled scores are soft-capped.
    pub softcap_bits: Option<u64>,
    /// Under a sliding window of this many keys (with `causal`).
    pub window: Option<u32>,
    /// Masked or biased by data (the kernels' `ScoreBias`; the bias gets no gradient).
    pub data: Option<attention::ScoreData>,
    /// Other elementwise operations on the scaled scores (the kernels' score hook).
    pub score_ops: Option<attention::ScoreOps>,
}

impl AttentionGrad {
    pub fn scale(&self) -> f64 {
        f64::from_bits(self.scale_bits)
    }
    pub fn softcap(&self) -> Option<f64> {
        self.softcap_bits.map(f64::from_bits)
    }
}

/// How a [`Op::View`] reads its operand: which operand element each element of the
/// view's shape (the node's) is ([`View::source`]).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum View {
    /// The same elements in row-major order, in the node's shape.
    Reshape,
    /// Dimension `i` of the view is dimension `perm[i]` of the operand.
    Permute(Perm),
    /// Dimensions of size 1 (and new leading dimensions) repeated to the node's shape.
    Expand,
    /// Along `axis`, elements `start`, `start + step`, ... (the node's length of them).
    Slice { axis: u8, start: u32, step: u32 },
    /// Along `axis`, each element `repeats` times in a row (`torch.repeat_interleave`).
    RepeatInterleave { axis: u8, repeats: u32 },
}

/// A permutation of at most 8 dimensions.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Perm {
    len: u8,
    p: [u8; 8],
}

impl Perm {
    /// The permutation as a slice: dimension `i` of the view is `perm()[i]`.
    pub fn perm(&self) -> &[u8] {
        &self.p[..self.len as usize]
    }
}

/// The most dimensions a view permutes.
pub const MAX_RANK: usize = 8;

impl View {
    /// The coordinates in the operand (of shape `from`) of the element at coordinates `c`
    /// of the view (of shape `to`): the definition the kernels and the reference share.
    pub fn source(&self, from: &[usize], to: &[usize], c: &[usize]) -> Vec<usize> {
        match *self {
            View::Reshape => {
                unflatten(flatten(c, to), from)
            }
            View::Permute(p) => {
                let mut out = vec![0; from.len()];
                for (i, &k) in p.perm().iter().enumerate() {
                    out[k as usize] = c[i];
                }
                out
            }
            View::Expand => {
                let off = to.len() - from.len();
                from.iter().enumerate().map(|(k, &d)| if d == 1 { 0 } else { c[k + off] }).collect()
            }
            View::Slice { axis, start, step } => {
                let mut out = c.to_vec();
                out[axis as usize] = start as usize + step as usize * c[axis as usize];
                out
            }
            View::RepeatInterleave { axis, repeats } => {
                let mut out = c.to_vec();
                out[axis as usize] = c[axis as usize] / repeats as usize;
                out
            }
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            View::Reshape => "reshape",
            View::Permute(_) => "permute",
            View::Expand => "expand",
            View::Slice { .. } => "slice",
            View::RepeatInterleave { .. } => "repeat_interleave",
        }
    }
}

/// The row-major flat index of coordinates `c` in `shape`.
pub fn flatten(c: &[usize], shape: &[usize]) -> usize {
    c.iter().zip(shape).fold(0, |acc, (&x, &d)| acc * d + x)
}

/// The row-major coordinates of flat index `flat` in `shape`.
pub fn unflatten(mut flat: usize, shape: &[usize]) -> Vec<usize> {
    let mut out = vec![0; shape.len()];
    for k in (0..shape.len()).rev() {
        out[k] = flat % shape[k].max(1);
        flat /= shape[k].max(1);
    }
    out
}

/// What a [`Op::Reduce`] computes along the last axis.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Reduction {
    Sum,
    Mean,
    Max,
    Min,
    /// The `i32` index of the first largest element (the DSL's `argmax`: NaN loses to any
    /// number, so a row's NaNs are skipped unless it has nothing else; PyTorch's NaN wins).
    ArgMax,
    /// The `i32` index of the first smallest element (NaN as for [`Reduction::ArgMax`]).
    ArgMin,
}

impl Reduction {
    pub fn name(self) -> &'static str {
        match self {
            Reduction::Sum => "sum",
            Reduction::Mean => "mean",
            Reduction::Max => "amax",
            Reduction::Min => "amin",
            Reduction::ArgMax => "argmax",
            Reduction::ArgMin => "argmin",
        }
    }
    /// Whether the result is an index (`i32`) rather than a value of the operand's type.
    pub fn is_arg(self) -> bool {
        matches!(self, Reduction::ArgMax | Reduction::ArgMin)
    }
}

impl Op {
    /// The operands, in order.
    pub fn operands(&self) -> Vec<NodeId> {
        match *self {
            Op::Input(_) | Op::Const(_) | Op::Tril(_) => vec![],
            Op::Relu(a) | Op::Unary(_, a) | Op::Cast(a) | Op::Reduce(_, a) | Op::View(_, a) => vec![a],
            Op::Binary(_, a, b) | Op::Cmp(_, a, b) | Op::Concat(a, b, _) | Op::Matmul(a, b) => vec![a, b],
            Op::Where(c, a, b) => vec![c, a, b],
            Op::AttentionGrad(a) => [a.q, a.k, a.v, a.dout].into_iter().chain(a.data.map(|d| d.read.1)).collect(),
        }
    }
}

/// One node: an operation and the element type and shape of its result.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct Node {
    pub op: Op,
    pub dtype: DType,
    pub shape: Vec<usize>,
}

impl Node {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

impl fmt::Display for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.op {
            Op::Input(i) => write!(f, "input {i}")?,
            Op::Const(bits) => write!(f, "{:?}", f64::from_bits(bits))?,
            Op::Tril(k) => write!(f, "tril({k})")?,
            Op::Relu(a) => write!(f, "relu({a})")?,
            Op::Unary(op, a) => write!(f, "{}({a})", op.name())?,
            Op::Binary(op, a, b) => write!(f, "{}({a}, {b})", op.name())?,
            Op::Cmp(op, a, b) => write!(f, "{}({a}, {b})", op.name())?,
            Op::Where(c, a, b) => write!(f, "where({c}, {a}, {b})")?,
            Op::Cast(a) => write!(f, "cast({a})")?,
            Op::Reduce(r, a) => write!(f, "{}({a}, -1)", r.name())?,
            Op::View(v, a) => match v {
                View::Permute(p) => write!(f, "permute({a}, {:?})", p.perm())?,
                View::Slice { axis, start, step } => write!(f, "slice({a}, axis {axis}, from {start} by {step})")?,
                View::RepeatInterleave { axis, repeats } => write!(f, "repeat_interleave({a}, {repeats}, axis {axis})")?,
                _ => write!(f, "{}({a})", v.name())?,
            },
            Op::Concat(a, b, axis) => write!(f, "cat({a}, {b}, axis {axis})")?,
            Op::Matmul(a, b) => write!(f, "matmul({a}, {b})")?,
            Op::AttentionGrad(a) => {
                write!(f, "attention_grad_{}(q {}, k {}, v {}, dout {}, group {}, scale {}{}", ["q", "k", "v"][a.which as usize], a.q, a.k, a.v, a.dout, a.group, a.scale(), if a.causal { ", causal" } else { "" })?;
                if let Some(w) = a.window {
                    write!(f, ", window {w}")?;
                }
                if let Some(d) = a.data {
                    write!(f, ", {d}")?;
                }
                if let Some(o) = a.score_ops {
                    write!(f, ", score operations {} to {}", o.from(), o.to())?;
                }
                match a.softcap() {
                    Some(c) => write!(f, ", soft-cap {c})")?,
                    None => write!(f, ")")?,
                }
            }
        }
        write!(f, ": {}{:?}", self.dtype, self.shape)
    }
}

/// A graph of tensor operations. Build it through [`Tensor`] handles, name its outputs,
/// then [`compile`](Graph::compile) it. See the [module docs](self).
///
/// Nodes are hash-consed: an operation on the same operands gives the same node, so
/// repeated subexpressions are one node, computed once.
#[derive(Default)]
pub struct Graph {
    state: RefCell<State>,
}

#[derive(Default)]
struct State {
    nodes: Vec<Node>,
    /// Hash-consing: each distinct node once.
    interned: HashMap<Node, NodeId>,
    inputs: Vec<(String, NodeId)>,
    outputs: Vec<(String, NodeId)>,
    /// Problems found while building, in order; an [`Tensor`] that failed refers to one.
    errors: Vec<GraphError>,
}

/// A handle to a tensor of a [`Graph`]: a node, or the error that building it ran into.
///
/// Operations on handles add nodes to the graph. An operation whose operands do not fit
/// gives a handle that carries the error; operations on it carry the first error on, and
/// [`Graph::output`] (or [`Tensor::check`]) returns it. So `a + b * c` reads like the math
/// and still never panics.
#[derive(Clone, Copy)]
pub struct Tensor<'g> {
    graph: &'g Graph,
    id: Result<NodeId, usize>,
}

impl fmt::Debug for Tensor<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.id {
            Ok(id) => write!(f, "Tensor({id}: {})", self.graph.node(id)),
            Err(e) => write!(f, "Tensor(error: {})", self.graph.state.borrow().errors[e]),
        }
    }
}

/// Anything that can be a binary operand: a tensor or a scalar constant.
pub trait IntoOperand<'g> {
    /// The operand as a node of `like`'s graph (a scalar takes `like`'s element type).
    fn node(self, like: Tensor<'g>) -> Tensor<'g>;
    /// Whether it is a scalar (which takes the type of what it meets).
    fn is_scalar(&self) -> bool {
        true
    }
}

impl<'g> IntoOperand<'g> for Tensor<'g> {
    fn node(self, _: Tensor<'g>) -> Tensor<'g> {
        self
    }
    fn is_scalar(&self) -> bool {
        false
    }
}

impl<'g> IntoOperand<'g> for f64 {
    fn node(self, like: Tensor<'g>) -> Tensor<'g> {
        like.scalar(self)
    }
}

impl<'g> IntoOperand<'g> for f32 {
    fn node(self, like: Tensor<'g>) -> Tensor<'g> {
        like.scalar(self as f64)
    }
}

impl<'g> IntoOperand<'g> for i32 {
    fn node(self, like: Tensor<'g>) -> Tensor<'g> {
        like.scalar(self as f64)
    }
}

impl Graph {
    pub fn new() -> Graph {
        Graph::default()
    }

    /// A new input: a buffer of `dtype` (f32, f16 or bf16) holding a row-major tensor of
    /// `shape` (`&[]` for a scalar). Inputs are passed to [`Plan::run`] in this order.
    pub fn input(&self, name: &str, dtype: DType, shape: &[usize]) -> Tensor<'_> {
        if !dtype.is_float() {
            return self.fail(GraphError::Storage { what: "input", name: name.into(), dtype });
        }
        if self.state.borrow().inputs.iter().any(|(n, _)| n == name) {
            return self.fail(GraphError::DuplicateName { what: "input", name: name.into() });
        }
        if let Err(e) = check_size(shape) {
            return self.fail(e);
        }
        let i = self.state.borrow().inputs.len();
        let t = self.add(Node { op: Op::Input(i), dtype, shape: shape.to_vec() });
        if let Ok(id) = t.id {
            self.state.borrow_mut().inputs.push((name.into(), id));
        }
        t
    }

    /// `[rows, cols]` booleans, true where the column is at most the row plus `diagonal`:
    /// `torch.tril(torch.ones(rows, cols), diagonal).bool()`, computed from indices in the
    /// kernels that read it (never stored). `g.tril(t, t, 0)` is the causal mask, which
    /// a recognised attention turns into the flash-attention kernel's causal flag:
    ///
    /// ```
    /// use dsl_runtime::DType;
    /// use kernels_lib::graph::Graph;
    ///
    /// let g = Graph::new();
    /// let s = g.input("scores", DType::F32, &[4, 4]);
    /// let masked = g.tril(4, 4, 0).where_(s, f64::NEG_INFINITY); // s.masked_fill(~tril, -inf)
    /// g.output("p", masked.softmax(-1)).unwrap();
    /// ```
    pub fn tril(&self, rows: usize, cols: usize, diagonal: i64) -> Tensor<'_> {
        if let Err(e) = check_size(&[rows, cols]) {
            return self.fail(e);
        }
        // Beyond these, every element is the same: the diagonal fits i32 index arithmetic.
        let diagonal = diagonal.clamp(-(rows as i64), cols as i64);
        self.add(Node { op: Op::Tril(diagonal), dtype: DType::Bool, shape: vec![rows, cols] })
    }

    /// Name `t` an output: [`Plan::run`] writes it to the output buffer of this position.
    /// Returns the error `t` carries, if building it failed.
    pub fn output(&self, name: &str, t: Tensor<'_>) -> Result<(), GraphError> {
        if !std::ptr::eq(t.graph, self) {
            return Err(GraphError::ForeignTensor { op: "output" });
        }
        let id = t.check()?;
        let node = self.node(id);
        if !node.dtype.is_float() && node.dtype != DType::I32 {
            return Err(GraphError::Storage { what: "output", name: name.into(), dtype: node.dtype });
        }
        let mut s = self.state.borrow_mut();
        if s.outputs.iter().any(|(n, _)| n == name) {
            return Err(GraphError::DuplicateName { what: "output", name: name.into() });
        }
        s.outputs.push((name.into(), id));
        Ok(())
    }

    /// Node `id` (cloned).
    pub fn node(&self, id: NodeId) -> Node {
        self.state.borrow().nodes[id.index()].clone()
    }

    /// Every node, in creation (topological) order.
    pub fn nodes(&self) -> Vec<Node> {
        self.state.borrow().nodes.clone()
    }

    /// The inputs, by name, in order.
    pub fn inputs(&self) -> Vec<(String, NodeId)> {
        self.state.borrow().inputs.clone()
    }

    /// The outputs, by name, in order.
    pub fn outputs(&self) -> Vec<(String, NodeId)> {
        self.state.borrow().outputs.clone()
    }

    /// The first error any operation on this graph ran into, used in an output or not.
    pub fn first_error(&self) -> Option<GraphError> {
        self.state.borrow().errors.first().cloned()
    }

    /// `tensors` one after the other along `axis` (`torch.cat`; see [`Tensor::cat`]). No
    /// tensors is an error (carried by the result, like any other).
    pub fn concat<'g>(&'g self, tensors: &[Tensor<'g>], axis: isize) -> Tensor<'g> {
        match tensors.split_first() {
            Some((first, rest)) => rest.iter().fold(*first, |acc, &t| acc.cat(t, axis)),
            None => self.fail(GraphError::View { op: "concat", shape: vec![], detail: "no tensors to concatenate".into() }),
        }
    }

    /// Compile with fusion on (see [`compile_with`](Graph::compile_with)).
    pub fn compile(&self, rt: &dsl_runtime::Runtime) -> Result<Plan, PlanError> {
        self.compile_with(rt, &Options::default())
    }

    /// Run the fusion pass ([`fuse::partition`]), generate one kernel per group
    /// ([`codegen`]) and allocate the intermediates the groups pass to each other, once,
    /// on `rt`.
    pub fn compile_with(&self, rt: &dsl_runtime::Runtime, options: &Options) -> Result<Plan, PlanError> {
        Plan::new(self, rt, options)
    }

    fn fail(&self, e: GraphError) -> Tensor<'_> {
        let mut s = self.state.borrow_mut();
        s.errors.push(e);
        Tensor { graph: self, id: Err(s.errors.len() - 1) }
    }

    /// Add `node`, or find the equal node already there.
    fn add(&self, node: Node) -> Tensor<'_> {
        let mut s = self.state.borrow_mut();
        if let Some(&id) = s.interned.get(&node) {
            return Tensor { graph: self, id: Ok(id) };
        }
        let id = NodeId(s.nodes.len() as u32);
        s.nodes.push(node.clone());
        s.interned.insert(node, id);
        Tensor { graph: self, id: Ok(id) }
    }
}

/// The number of elements of `dims`, `None` past `u128` (0 if any is 0).
pub(crate) fn checked_numel(dims: impl Iterator<Item = usize> + Clone) -> Option<u128> {
    if dims.clone().any(|d| d == 0) {
        return Some(0);
    }
    dims.map(|d| d as u128).try_fold(1u128, u128::checked_mul)
}

fn check_size(shape: &[usize]) -> Result<(), GraphError> {
    let numel = checked_numel(shape.iter().copied()).unwrap_or(u128::MAX);
    if numel > i32::MAX as u128 {
        return Err(GraphError::TooLarge { shape: shape.to_vec(), numel });
    }
    Ok(())
}

/// The shape NumPy broadcasting gives operands of shapes `a` and `b`, if they broadcast.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let r = a.len().max(b.len());
    let at = |s: &[usize], i: usize| if i + s.len() >= r { s[i + s.len() - r] } else { 1 };
    (0..r)
        .map(|i| match (at(a, i), at(b, i)) {
            (x, y) if x == y => Some(x),
            (1, y) => Some(y),
            (x, 1) => Some(x),
            _ => None,
        })
        .collect()
}

impl<'g> Tensor<'g> {
    /// The node, or the error building it ran into.
    pub fn check(&self) -> Result<NodeId, GraphError> {
        self.id.map_err(|e| self.graph.state.borrow().errors[e].clone())
    }

    /// The element type (an error if building this tensor failed).
    pub fn dtype(&self) -> Result<DType, GraphError> {
        Ok(self.graph.node(self.check()?).dtype)
    }

    /// The shape (an error if building this tensor failed).
    pub fn shape(&self) -> Result<Vec<usize>, GraphError> {
        Ok(self.graph.node(self.check()?).shape)
    }

    /// The graph this tensor belongs to.
    pub fn graph(&self) -> &'g Graph {
        self.graph
    }

    /// Operands as nodes: the first error among them, or a tensor of another graph.
    fn nodes<const N: usize>(&self, op: &'static str, ts: [Tensor<'g>; N]) -> Result<[Node; N], Tensor<'g>> {
        for t in &ts {
            if !std::ptr::eq(t.graph, self.graph) {
                return Err(self.graph.fail(GraphError::ForeignTensor { op }));
            }
            if t.id.is_err() {
                return Err(*t);
            }
        }
        Ok(ts.map(|t| self.graph.node(t.id.unwrap_or(NodeId(0)))))
    }

    fn id_of(t: Tensor<'g>) -> NodeId {
        t.id.unwrap_or(NodeId(0))
    }

    /// A scalar constant of this tensor's element type (`f32` if it is a mask).
    fn scalar(self, x: f64) -> Tensor<'g> {
        let dtype = match self.graph_dtype() {
            Some(d) if d.is_float() => d,
            _ => DType::F32,
        };
        self.graph.add(Node { op: Op::Const(dtype.round(x).to_bits()), dtype, shape: vec![] })
    }

    fn graph_dtype(&self) -> Option<DType> {
        self.id.ok().map(|id| self.graph.node(id).dtype)
    }

    /// `max(x, 0)`.
    pub fn relu(self) -> Tensor<'g> {
        let [x] = match self.nodes("relu", [self]) {
            Ok(n) => n,
            Err(t) => return t,
        };
        if !x.dtype.is_float() {
            return self.graph.fail(GraphError::NotFloat { op: "relu", found: x.dtype, shape: x.shape });
        }
        self.graph.add(Node { op: Op::Relu(Self::id_of(self)), dtype: x.dtype, shape: x.shape })
    }

    /// A unary operation of the IR (`Neg`, `Abs`, `Exp`, `Log`, `Sqrt`, `Tanh`,
    /// `Sigmoid`, ...) on a float tensor; computed in the tensor's element type (math
    /// functions in f32, rounded back).
    pub fn unary(self, op: UnaryOp) -> Tensor<'g> {
        let [x] = match self.nodes(op.name(), [self]) {
            Ok(n) => n,
            Err(t) => return t,
        };
        if !x.dtype.is_float() || op == UnaryOp::Not {
            return self.graph.fail(GraphError::NotFloat { op: op.name(), found: x.dtype, shape: x.shape });
        }
        self.graph.add(Node { op: Op::Unary(op, Self::id_of(self)), dtype: x.dtype, shape: x.shape })
    }

    pub fn exp(self) -> Tensor<'g> {
        self.unary(UnaryOp::Exp)
    }
    pub fn log(self) -> Tensor<'g> {
        self.unary(UnaryOp::Log)
    }
    pub fn abs(self) -> Tensor<'g> {
        self.unary(UnaryOp::Abs)
    }
    pub fn sqrt(self) -> Tensor<'g> {
        self.unary(UnaryOp::Sqrt)
    }
    pub fn rsqrt(self) -> Tensor<'g> {
        self.unary(UnaryOp::Rsqrt)
    }
    pub fn tanh(self) -> Tensor<'g> {
        self.unary(UnaryOp::Tanh)
    }
    pub fn sigmoid(self) -> Tensor<'g> {
        self.unary(UnaryOp::Sigmoid)
    }

    /// A binary operation with NumPy broadcasting; mixed float types promote as the DSL
    /// does (`f16` with `bf16` gives `f32`), a scalar takes the tensor's type.
    pub fn binary(self, op: BinOp, rhs: impl IntoOperand<'g>) -> Tensor<'g> {
        let rhs = rhs.node(self);
        let [a, b] = match self.nodes(op.name(), [self, rhs]) {
            Ok(n) => n,
            Err(t) => return t,
        };
        if matches!(op, BinOp::Rem | BinOp::And | BinOp::Or | BinOp::Xor) {
            return self.graph.fail(GraphError::NotFloat { op: op.name(), found: a.dtype, shape: a.shape });
        }
        let (dtype, shape) = match self.combine(op.name(), &a, &b) {
            Ok(x) => x,
            Err(t) => return t,
        };
        self.graph.add(Node { op: Op::Binary(op, Self::id_of(self), Self::id_of(rhs)), dtype, shape })
    }

    /// The element type and shape of a float operation on `a` and `b`.
    fn combine(&self, op: &'static str, a: &Node, b: &Node) -> Result<(DType, Vec<usize>), Tensor<'g>> {
        let dtype = match DType::promote(a.dtype, b.dtype) {
            Some(d) if d.is_float() => d,
            _ => {
                return Err(self.graph.fail(GraphError::DType { op, lhs: a.dtype, rhs: b.dtype, lhs_shape: a.shape.clone(), rhs_shape: b.shape.clone() }))
            }
        };
        match broadcast_shapes(&a.shape, &b.shape) {
            Some(shape) => Ok((dtype, shape)),
            None => Err(self.graph.fail(GraphError::Broadcast { op, lhs: a.shape.clone(), rhs: b.shape.clone() })),
        }
    }

    /// Elementwise maximum (NaN-ignoring, as the DSL's `maximum`).
    pub fn maximum(self, rhs: impl IntoOperand<'g>) -> Tensor<'g> {
        self.binary(BinOp::Max, rhs)
    }
    /// Elementwise minimum (NaN-ignoring).
    pub fn minimum(self, rhs: impl IntoOperand<'g>) -> Tensor<'g> {
        self.binary(BinOp::Min, rhs)
    }

    /// A comparison of two float tensors (broadcast): a bool tensor (a mask), for
    /// [`where_`](Tensor::where_) or [`cast`](Tensor::cast).
    pub fn cmp(self, op: CmpOp, rhs: impl IntoOperand<'g>) -> Tensor<'g> {
        let rhs = rhs.node(self);
        let [a, b] = match self.nodes(op.name(), [self, rhs]) {
            Ok(n) => n,
            Err(t) => return t,
        };
        if op == CmpOp::ULt {
            return self.graph.fail(GraphError::NotFloat { op: op.name(), found: a.dtype, shape: a.shape });
        }
        let (_, shape) = match self.combine(op.name(), &a, &b) {
            Ok(x) => x,
            Err(t) => return t,
        };
        self.graph.add(Node { op: Op::Cmp(op, Self::id_of(self), Self::id_of(rhs)), dtype: DType::Bool, shape })
    }

    pub fn lt(self, rhs: impl IntoOperand<'g>) -> Tensor<'g> {
        self.cmp(CmpOp::Lt, rhs)
    }
    pub fn le(self, rhs: impl IntoOperand<'g>) -> Tensor<'g> {
        self.cmp(CmpOp::Le, rhs)
    }
    pub fn gt(self, rhs: impl IntoOperand<'g>) -> Tensor<'g> {
        self.cmp(CmpOp::Gt, rhs)
    }
    pub fn ge(self, rhs: impl IntoOperand<'g>) -> Tensor<'g> {
        self.cmp(CmpOp::Ge, rhs)
    }
    pub fn eq_(self, rhs: impl IntoOperand<'g>) -> Tensor<'g> {
        self.cmp(CmpOp::Eq, rhs)
    }
    pub fn ne_(self, rhs: impl IntoOperand<'g>) -> Tensor<'g> {
        self.cmp(CmpOp::Ne, rhs)
    }

    /// `where_(self, a, b)`: `a` where this mask holds, `b` elsewhere; the three broadcast
    /// together, `a` and `b` promote.
    pub fn where_(self, a: impl IntoOperand<'g>, b: impl IntoOperand<'g>) -> Tensor<'g> {
        // A scalar branch takes the type of the other (`f32` if both are scalars), as in
        // PyTorch: `where(mask, -inf, s)` of bf16 scores is bf16.
        let (a, b) = if a.is_scalar() && !b.is_scalar() {
            let b = b.node(self);
            (a.node(b), b)
        } else {
            let a = a.node(self);
            (a, b.node(a))
        };
        let [c, x, y] = match self.nodes("where_", [self, a, b]) {
            Ok(n) => n,
            Err(t) => return t,
        };
        if c.dtype != DType::Bool {
            return self.graph.fail(GraphError::Condition { found: c.dtype, shape: c.shape });
        }
        let (dtype, shape) = match self.combine("where_", &x, &y) {
            Ok(x) => x,
            Err(t) => return t,
        };
        let Some(shape) = broadcast_shapes(&c.shape, &shape) else {
            return self.graph.fail(GraphError::Broadcast { op: "where_", lhs: c.shape, rhs: shape });
        };
        self.graph.add(Node { op: Op::Where(Self::id_of(self), Self::id_of(a), Self::id_of(b)), dtype, shape })
    }

    /// Convert to `to` (f32, f16 or bf16; from a float or a mask, which gives 0 or 1).
    pub fn cast(self, to: DType) -> Tensor<'g> {
        let [x] = match self.nodes("cast", [self]) {
            Ok(n) => n,
            Err(t) => return t,
        };
        if !to.is_float() {
            return self.graph.fail(GraphError::Cast { from: x.dtype, to });
        }
        if x.dtype == to {
            return self;
        }
        self.graph.add(Node { op: Op::Cast(Self::id_of(self)), dtype: to, shape: x.shape })
    }

    /// A reduction along `axis` (negative counts from the end), kept with size 1
    /// (PyTorch's `keepdim=True`). 16-bit tensors are summed in f32 and the result rounded
    /// to their type. The kernels reduce along the last axis: another axis is swapped with
    /// it by a transpose view (read in place, strided), reduced, and swapped back.
    pub fn reduce(self, r: Reduction, axis: isize) -> Tensor<'g> {
        let [x] = match self.nodes(r.name(), [self]) {
            Ok(n) => n,
            Err(t) => return t,
        };
        if !x.dtype.is_float() {
            return self.graph.fail(GraphError::NotFloat { op: r.name(), found: x.dtype, shape: x.shape });
        }
        let rank = x.shape.len() as isize;
        let a = if axis < 0 { axis + rank } else { axis };
        if !(0..rank).contains(&a) {
            return self.graph.fail(GraphError::Axis { op: r.name(), axis, shape: x.shape });
        }
        if x.shape[a as usize] == 0 {
            return self.graph.fail(GraphError::EmptyAxis { op: r.name(), axis, shape: x.shape });
        }
        if a != rank - 1 {
            let last = rank as usize - 1;
            return self.transpose(a, -1).reduce(r, -1).transpose(a, last as isize);
        }
        let mut shape = x.shape.clone();
        *shape.last_mut().expect("rank >= 1") = 1;
        let dtype = if r.is_arg() { DType::I32 } else { x.dtype };
        self.graph.add(Node { op: Op::Reduce(r, Self::id_of(self)), dtype, shape })
    }

    /// Sum along `axis`, kept with size 1 (see [`reduce`](Tensor::reduce)).
    pub fn sum(self, axis: isize) -> Tensor<'g> {
        self.reduce(Reduction::Sum, axis)
    }
    /// Mean along `axis`, kept with size 1.
    pub fn mean(self, axis: isize) -> Tensor<'g> {
        self.reduce(Reduction::Mean, axis)
    }
    /// Maximum along `axis`, kept with size 1 (PyTorch's `amax`).
    pub fn amax(self, axis: isize) -> Tensor<'g> {
        self.reduce(Reduction::Max, axis)
    }
    /// Minimum along `axis`, kept with size 1.
    pub fn amin(self, axis: isize) -> Tensor<'g> {
        self.reduce(Reduction::Min, axis)
    }
    /// The `i32` index along `axis` of the first largest element, kept with size 1 (NaN
    /// loses to any number: see [`Reduction::ArgMax`]).
    pub fn argmax(self, axis: isize) -> Tensor<'g> {
        self.reduce(Reduction::ArgMax, axis)
    }
    /// The `i32` index along `axis` of the first smallest element, kept with size 1.
    pub fn argmin(self, axis: isize) -> Tensor<'g> {
        self.reduce(Reduction::ArgMin, axis)
    }

    /// A view of this tensor's node (the checks done by the caller).
    fn view(self, v: View, x: &Node, shape: Vec<usize>) -> Tensor<'g> {
        if shape == x.shape && !matches!(v, View::Permute(_)) {
            return self; // the identity
        }
        self.graph.add(Node { op: Op::View(v, Self::id_of(self)), dtype: x.dtype, shape })
    }

    fn view_error(&self, op: &'static str, shape: &[usize], detail: String) -> Tensor<'g> {
        self.graph.fail(GraphError::View { op, shape: shape.to_vec(), detail })
    }

    /// An axis counted from the end when negative, checked against `rank`.
    fn axis(&self, op: &'static str, shape: &[usize], axis: isize) -> Result<usize, Tensor<'g>> {
        let r = shape.len() as isize;
        let a = if axis < 0 { axis + r } else { axis };
        if (0..r).contains(&a) {
            Ok(a as usize)
        } else {
            Err(self.view_error(op, shape, format!("axis {axis} is out of range for rank {r}")))
        }
    }

    /// The same elements, in row-major order, in `shape` (PyTorch's `reshape`/`view`; one
    /// dimension may be `usize::MAX`, inferred). A view: no copy.
    pub fn reshape(self, shape: &[usize]) -> Tensor<'g> {
        let [x] = match self.nodes("reshape", [self]) {
            Ok(n) => n,
            Err(t) => return t,
        };
        let mut shape = shape.to_vec();
        if shape.len() > MAX_RANK {
            return self.view_error("reshape", &x.shape, format!("rank {} is more than {MAX_RANK}", shape.len()));
        }
        // Checked: a product of requested dimensions may pass usize (and wrap to x's count).
        let numel = x.numel() as u128;
        let known = checked_numel(shape.iter().copied().filter(|&d| d != usize::MAX));
        if let Some(i) = shape.iter().position(|&d| d == usize::MAX) {
            match known {
                Some(k) if shape.iter().filter(|&&d| d == usize::MAX).count() == 1 && k != 0 && numel.is_multiple_of(k) => shape[i] = (numel / k) as usize,
                _ => return self.view_error("reshape", &x.shape, format!("cannot infer a dimension of {shape:?}")),
            }
        }
        if checked_numel(shape.iter().copied()) != Some(numel) {
            return self.view_error("reshape", &x.shape, format!("{} elements do not fill shape {shape:?}", x.numel()));
        }
        self.view(View::Reshape, &x, shape)
    }

    /// Dimensions reordered: dimension `i` of the result is dimension `perm[i]` of this
    /// tensor (PyTorch's `permute`). A view.
    pub fn permute(self, perm: &[usize]) -> Tensor<'g> {
        let [x] = match self.nodes("permute", [self]) {
            Ok(n) => n,
            Err(t) => return t,
        };
        let r = x.shape.len();
        let mut seen = vec![false; r];
        if perm.len() != r || r > MAX_RANK || perm.iter().any(|&k| k >= r || std::mem::replace(&mut seen[k], true)) {
            return self.view_error("permute", &x.shape, format!("{perm:?} is not a permutation of {r} dimensions"));
        }
        if perm.iter().enumerate().all(|(i, &k)| i == k) {
            return self;
        }
        let mut p = [0u8; 8];
        for (i, &k) in perm.iter().enumerate() {
            p[i] = k as u8;
        }
        let shape = perm.iter().map(|&k| x.shape[k]).collect();
        self.view(View::Permute(Perm { len: r as u8, p }), &x, shape)
    }

    /// Dimensions `a` and `b` swapped (negative counts from the end). A view.
    pub fn transpose(self, a: isize, b: isize) -> Tensor<'g> {
        let shape = match self.nodes("transpose", [self]) {
            Ok([x]) => x.shape,
            Err(t) => return t,
        };
        let (a, b) = match (self.axis("transpose", &shape, a), self.axis("transpose", &shape, b)) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(t), _) | (_, Err(t)) => return t,
        };
        let mut perm: Vec<usize> = (0..shape.len()).collect();
        perm.swap(a, b);
        self.permute(&perm)
    }

    /// Dimensions of size 1 (and new leading ones) repeated to `shape` (PyTorch's
    /// `expand`). A view: the repeated elements are read again, never copied.
    pub fn expand(self, shape: &[usize]) -> Tensor<'g> {
        let [x] = match self.nodes("expand", [self]) {
            Ok(n) => n,
            Err(t) => return t,
        };
        if broadcast_shapes(&x.shape, shape).as_deref() != Some(shape) || shape.len() > MAX_RANK {
            return self.view_error("expand", &x.shape, format!("does not expand to {shape:?} (dimensions must be equal or 1, counted from the right)"));
        }
        if let Err(e) = check_size(shape) {
            return self.graph.fail(e);
        }
        self.view(View::Expand, &x, shape.to_vec())
    }

    /// Elements `start..end` along `axis` (PyTorch's `narrow`/`x[.., start:end]`). A view.
    pub fn slice(self, axis: isize, start: usize, end: usize) -> Tensor<'g> {
        self.slice_step(axis, start, end, 1)
    }

    /// Elements `start, start + step, ...` before `end` along `axis` (`x[.., start:end:step]`).
    pub fn slice_step(self, axis: isize, start: usize, end: usize, step: usize) -> Tensor<'g> {
        let [x] = match self.nodes("slice", [self]) {
            Ok(n) => n,
            Err(t) => return t,
        };
        let a = match self.axis("slice", &x.shape, axis) {
            Ok(a) => a,
            Err(t) => return t,
        };
        if step == 0 || start >= end || end > x.shape[a] {
            return self.view_error("slice", &x.shape, format!("{start}..{end} by {step} is not a non-empty range within axis {a} of length {}", x.shape[a]));
        }
        // A step past the range takes its first element alone, as the range's length does
        // (and fits the view's u32, as the range does).
        let step = step.min(end - start);
        let mut shape = x.shape.clone();
        shape[a] = (end - start).div_ceil(step);
        if start == 0 && step == 1 && end == x.shape[a] {
            return self;
        }
        self.view(View::Slice { axis: a as u8, start: start as u32, step: step as u32 }, &x, shape)
    }

    /// Each element repeated `repeats` times in a row along `axis` (PyTorch's
    /// `repeat_interleave`: how grouped-query attention repeats key/value heads). A view.
    pub fn repeat_interleave(self, repeats: usize, axis: isize) -> Tensor<'g> {
        let [x] = match self.nodes("repeat_interleave", [self]) {
            Ok(n) => n,
            Err(t) => return t,
        };
        let a = match self.axis("repeat_interleave", &x.shape, axis) {
            Ok(a) => a,
            Err(t) => return t,
        };
        if repeats == 0 || repeats > u32::MAX as usize {
            return self.view_error("repeat_interleave", &x.shape, format!("{repeats} repeats"));
        }
        let mut shape = x.shape.clone();
        shape[a] *= repeats;
        if let Err(e) = check_size(&shape) {
            return self.graph.fail(e);
        }
        if repeats == 1 {
            return self;
        }
        self.view(View::RepeatInterleave { axis: a as u8, repeats: repeats as u32 }, &x, shape)
    }

    /// This tensor followed by `other` along `axis` (PyTorch's `torch.cat([self, other],
    /// axis)`): every other dimension equal, element types promoted as arithmetic
    /// promotes them. An index map: each element is read from the operand it comes from.
    pub fn cat(self, other: Tensor<'g>, axis: isize) -> Tensor<'g> {
        let [x, y] = match self.nodes("cat", [self, other]) {
            Ok(n) => n,
            Err(t) => return t,
        };
        let a = match self.axis("cat", &x.shape, axis) {
            Ok(a) => a,
            Err(t) => return t,
        };
        let fits = x.shape.len() == y.shape.len() && (0..x.shape.len()).all(|k| k == a || x.shape[k] == y.shape[k]);
        if !fits {
            return self.view_error("cat", &x.shape, format!("cannot be followed by shape {:?} along axis {a} (the other dimensions must be equal)", y.shape));
        }
        let dtype = match DType::promote(x.dtype, y.dtype) {
            Some(d) if x.dtype.is_float() == y.dtype.is_float() => d,
            _ => return self.graph.fail(GraphError::DType { op: "cat", lhs: x.dtype, rhs: y.dtype, lhs_shape: x.shape, rhs_shape: y.shape }),
        };
        let (lhs, rhs) = (self.cast_to(dtype), other.cast_to(dtype));
        let mut shape = x.shape.clone();
        shape[a] += y.shape[a];
        if let Err(e) = check_size(&shape) {
            return self.graph.fail(e);
        }
        self.graph.add(Node { op: Op::Concat(Self::id_of(lhs), Self::id_of(rhs), a as u8), dtype, shape })
    }

    /// The matrix product `self @ other` (`torch.matmul` for operands of rank 2 or more):
    /// `[.., M, K] @ [.., K, N]` is `[.., M, N]`, the leading (batch) dimensions broadcast
    /// against each other; element types promoted as arithmetic promotes them. Products
    /// run on tensor cores, accumulate in f32 and round to the result's type (f32 operands
    /// at tf32 precision, the library's `dot` default). Transposes and broadcasts of a
    /// graph input or of a stored value are read through strides, not copied.
    pub fn matmul(self, other: Tensor<'g>) -> Tensor<'g> {
        let [x, y] = match self.nodes("matmul", [self, other]) {
            Ok(n) => n,
            Err(t) => return t,
        };
        let bad = |detail: String| GraphError::Matmul { lhs: x.shape.clone(), rhs: y.shape.clone(), detail };
        let (rx, ry) = (x.shape.len(), y.shape.len());
        if rx < 2 || ry < 2 {
            return self.graph.fail(bad("both need two dimensions or more".into()));
        }
        if x.shape[rx - 1] != y.shape[ry - 2] {
            return self.graph.fail(bad(format!("inner dimensions {} and {}", x.shape[rx - 1], y.shape[ry - 2])));
        }
        let Some(mut shape) = broadcast_shapes(&x.shape[..rx - 2], &y.shape[..ry - 2]) else {
            return self.graph.fail(bad("the batch dimensions do not broadcast".into()));
        };
        let dtype = match DType::promote(x.dtype, y.dtype) {
            Some(d) if d.is_float() && x.dtype.is_float() && y.dtype.is_float() => d,
            _ => return self.graph.fail(bad(format!("element types {} and {}: matmul takes floats", x.dtype, y.dtype))),
        };
        shape.extend([x.shape[rx - 2], y.shape[ry - 1]]);
        if let Err(e) = check_size(&shape) {
            return self.graph.fail(e);
        }
        let (lhs, rhs) = (self.cast_to(dtype), other.cast_to(dtype));
        self.graph.add(Node { op: Op::Matmul(Self::id_of(lhs), Self::id_of(rhs)), dtype, shape })
    }

    /// This tensor in `d` (itself when it is already, a mask left alone).
    fn cast_to(self, d: DType) -> Tensor<'g> {
        if self.graph_dtype() == Some(d) || !d.is_float() {
            self
        } else {
            self.cast(d)
        }
    }

    /// The tensor in f32 if it is 16-bit (the compositions below compute there, as PyTorch
    /// does for half types), and the type to round the result back to.
    fn widened(self) -> (Tensor<'g>, Option<DType>) {
        match self.graph_dtype() {
            Some(d @ (DType::F16 | DType::BF16)) => (self.cast(DType::F32), Some(d)),
            _ => (self, None),
        }
    }

    fn narrowed(self, to: Option<DType>) -> Tensor<'g> {
        to.map_or(self, |d| self.cast(d))
    }

    /// Whether `axis` exists and has no elements: the row functions below return rows of
    /// nothing as they are (their reductions of nothing would be `GraphError::EmptyAxis`).
    fn empty_along(self, axis: isize) -> bool {
        let Ok(shape) = self.shape() else { return false };
        let a = if axis < 0 { axis + shape.len() as isize } else { axis };
        (0..shape.len() as isize).contains(&a) && shape[a as usize] == 0
    }

    /// `softmax` along `axis`: `exp(x - max) / sum(exp(x - max))`, in f32 for 16-bit
    /// tensors; one kernel when fused.
    pub fn softmax(self, axis: isize) -> Tensor<'g> {
        if self.empty_along(axis) {
            return self;
        }
        let (x, to) = self.widened();
        let e = (x - x.amax(axis)).exp();
        (e / e.sum(axis)).narrowed(to)
    }

    /// `log_softmax` along `axis`: `(x - max) - log(sum(exp(x - max)))`.
    pub fn log_softmax(self, axis: isize) -> Tensor<'g> {
        if self.empty_along(axis) {
            return self;
        }
        let (x, to) = self.widened();
        let d = x - x.amax(axis);
        (d - d.exp().sum(axis).log()).narrowed(to)
    }

    /// RMSNorm over the last axis: `x / sqrt(mean(x^2) + eps) * weight` (`weight` of the
    /// last axis's length, or `None`).
    pub fn rms_norm(self, weight: Option<Tensor<'g>>, eps: f64) -> Tensor<'g> {
        let (x, to) = self.widened();
        let y = if self.empty_along(-1) { x } else { x * ((x * x).mean(-1) + eps).rsqrt() };
        let y = match weight {
            Some(w) => y * w.widened().0,
            None => y,
        };
        y.narrowed(to)
    }

    /// LayerNorm over the last axis: `(x - mean) / sqrt(var + eps) * weight + bias` (the
    /// biased variance, as PyTorch's `layer_norm`).
    pub fn layer_norm(self, weight: Option<Tensor<'g>>, bias: Option<Tensor<'g>>, eps: f64) -> Tensor<'g> {
        let (x, to) = self.widened();
        let mut y = x;
        if !self.empty_along(-1) {
            let d = x - x.mean(-1);
            y = d * ((d * d).mean(-1) + eps).rsqrt();
        }
        if let Some(w) = weight {
            y = y * w.widened().0;
        }
        if let Some(b) = bias {
            y = y + b.widened().0;
        }
        y.narrowed(to)
    }
}

macro_rules! binary_operator {
    ($trait:ident, $method:ident, $op:expr) => {
        impl<'g, R: IntoOperand<'g>> std::ops::$trait<R> for Tensor<'g> {
            type Output = Tensor<'g>;
            fn $method(self, rhs: R) -> Tensor<'g> {
                self.binary($op, rhs)
            }
        }
        impl<'g> std::ops::$trait<Tensor<'g>> for f64 {
            type Output = Tensor<'g>;
            fn $method(self, rhs: Tensor<'g>) -> Tensor<'g> {
                rhs.scalar(self).binary($op, rhs)
            }
        }
        impl<'g> std::ops::$trait<Tensor<'g>> for f32 {
            type Output = Tensor<'g>;
            fn $method(self, rhs: Tensor<'g>) -> Tensor<'g> {
                rhs.scalar(self as f64).binary($op, rhs)
            }
        }
        impl<'g> std::ops::$trait<Tensor<'g>> for i32 {
            type Output = Tensor<'g>;
            fn $method(self, rhs: Tensor<'g>) -> Tensor<'g> {
                rhs.scalar(self as f64).binary($op, rhs)
            }
        }
    };
}

binary_operator!(Add, add, BinOp::Add);
binary_operator!(Sub, sub, BinOp::Sub);
binary_operator!(Mul, mul, BinOp::Mul);
binary_operator!(Div, div, BinOp::Div);

impl<'g> std::ops::Neg for Tensor<'g> {
    type Output = Tensor<'g>;
    fn neg(self) -> Tensor<'g> {
        self.unary(UnaryOp::Neg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_subexpressions_are_one_node() {
        let g = Graph::new();
        let x = g.input("x", DType::F32, &[4]);
        let (a, b) = (x.relu(), x.relu());
        assert_eq!(a.check(), b.check());
        let y = a + b * 2.0;
        let z = x.relu() + x.relu() * 2.0;
        assert_eq!(y.check(), z.check());
        // A scalar is a constant of the tensor's type, whichever side and spelling.
        assert_eq!((x.relu() + 2 * x.relu()).check(), (x.relu() + 2.0f32 * x.relu()).check());
        // x, relu, 2.0, mul (both sides), add (both sides)
        assert_eq!(g.nodes().len(), 7);
    }

    /// `where_` with a scalar branch keeps the other branch's type, on either side (as
    /// PyTorch: `masked_fill` of bf16 scores is bf16); two scalars are f32.
    #[test]
    fn a_scalar_branch_takes_the_other_branchs_type() {
        let g = Graph::new();
        let s = g.input("s", DType::BF16, &[4]);
        let dtype = |t: Tensor<'_>| g.node(t.check().unwrap()).dtype;
        assert_eq!(dtype(s.gt(0.0).where_(f64::NEG_INFINITY, s)), DType::BF16);
        assert_eq!(dtype(s.gt(0.0).where_(s, f64::NEG_INFINITY)), DType::BF16);
        assert_eq!(dtype(s.gt(0.0).where_(1.0, 0.0)), DType::F32);
    }

    #[test]
    fn shapes_broadcast_as_numpy_does_and_mismatches_name_both_shapes() {
        assert_eq!(broadcast_shapes(&[3, 1000], &[1000]), Some(vec![3, 1000]));
        assert_eq!(broadcast_shapes(&[7, 1, 5], &[1, 4, 1]), Some(vec![7, 4, 5]));
        assert_eq!(broadcast_shapes(&[], &[2, 3]), Some(vec![2, 3]));
        assert_eq!(broadcast_shapes(&[3, 4], &[3]), None);
        let g = Graph::new();
        let (x, y) = (g.input("x", DType::F32, &[3, 4]), g.input("y", DType::F32, &[3]));
        let bad = (x + y).relu() * 2.0;
        let e = g.output("out", bad).unwrap_err();
        assert_eq!(e, GraphError::Broadcast { op: "add", lhs: vec![3, 4], rhs: vec![3] });
        assert!(e.to_string().contains("[3, 4] and [3]"), "{e}");
    }

    #[test]
    fn types_promote_and_masks_do_not_mix_with_numbers() {
        let g = Graph::new();
        let (h, b) = (g.input("h", DType::F16, &[2]), g.input("b", DType::BF16, &[2]));
        assert_eq!((h + b).dtype(), Ok(DType::F32));
        assert_eq!((h * 3.0).dtype(), Ok(DType::F16));
        let m = h.gt(0.0);
        assert_eq!(m.dtype(), Ok(DType::Bool));
        assert!(matches!((m + h).check(), Err(GraphError::DType { .. })));
        assert!(matches!(m.relu().check(), Err(GraphError::NotFloat { .. })));
        assert!(matches!(h.where_(h, b).check(), Err(GraphError::Condition { .. })));
        assert_eq!(m.where_(h, 0.0).dtype(), Ok(DType::F16));
        assert_eq!(m.cast(DType::F32).dtype(), Ok(DType::F32));
        assert!(matches!(h.cast(DType::I32).check(), Err(GraphError::Cast { .. })));
        assert!(matches!(g.output("m", m), Err(GraphError::Storage { .. })));
    }

    #[test]
    fn bad_graphs_are_errors_not_panics() {
        let g = Graph::new();
        let x = g.input("x", DType::F32, &[2]);
        assert!(matches!(g.input("x", DType::F32, &[2]).check(), Err(GraphError::DuplicateName { .. })));
        assert!(matches!(g.input("i", DType::I32, &[2]).check(), Err(GraphError::Storage { .. })));
        assert!(matches!(g.input("big", DType::F32, &[1 << 16, 1 << 16]).check(), Err(GraphError::TooLarge { .. })));
        // Past u128 too (the product overflowed there).
        assert!(matches!(g.input("huge", DType::F32, &[1 << 63, 1 << 63, 1 << 63]).check(), Err(GraphError::TooLarge { numel: u128::MAX, .. })));
        let other = Graph::new();
        let y = other.input("y", DType::F32, &[2]);
        assert_eq!((x + y).check(), Err(GraphError::ForeignTensor { op: "add" }));
        assert_eq!(other.output("x", x), Err(GraphError::ForeignTensor { op: "output" }));
        g.output("a", x).unwrap();
        assert!(matches!(g.output("a", x), Err(GraphError::DuplicateName { .. })));
        // Gradients of or with respect to another graph's tensors.
        let (sx, sy) = (x.exp().sum(-1), (y * y).sum(-1));
        assert_eq!(g.grad(sx, None, &[y]).unwrap_err(), GraphError::ForeignTensor { op: "grad" });
        assert_eq!(g.grad(sy, None, &[x]).unwrap_err(), GraphError::ForeignTensor { op: "grad" });
        assert_eq!(g.grad(sx, Some(sy), &[x]).unwrap_err(), GraphError::ForeignTensor { op: "grad" });
        // A reduction of nothing (its output would not be written), directly or along
        // another axis; reshapes whose dimensions' product passes usize (the first wraps to
        // x's 2 elements).
        let e = g.input("e", DType::F32, &[3, 0]);
        assert!(matches!(e.amax(-1).check(), Err(GraphError::EmptyAxis { axis: -1, .. })));
        assert!(matches!(g.input("e2", DType::F32, &[0, 3]).sum(0).check(), Err(GraphError::EmptyAxis { axis: 0, .. })));
        assert!(e.softmax(0).check().is_ok());
        assert!(matches!(x.reshape(&[2, (1 << 63) + 1]).check(), Err(GraphError::View { .. })));
        assert!(matches!(x.reshape(&[1 << 40, 1 << 40, usize::MAX]).check(), Err(GraphError::View { .. })));
        assert!(matches!(x.reshape(&[1 << 63, 1 << 63, 4, 0]).check(), Err(GraphError::View { .. })));
        assert!(matches!(x.reshape(&[1 << 63, 1 << 63, 1 << 63, 2]).check(), Err(GraphError::View { .. })));
        // Rows of nothing: the row functions return them as they are.
        for y in [e.softmax(-1), e.log_softmax(-1), e.rms_norm(None, 1e-5), e.layer_norm(None, None, 1e-5)] {
            assert_eq!(y.shape(), Ok(vec![3, 0]));
        }
        // A step of 2^32 (0 as the view's u32) is the range's first element.
        let w = x.slice_step(0, 1, 2, 1 << 32);
        assert_eq!((w.shape().unwrap(), g.node(w.check().unwrap()).op), (vec![1], Op::View(View::Slice { axis: 0, start: 1, step: 1 }, x.check().unwrap())));
    }
}
