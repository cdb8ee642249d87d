//! The compiled [`Plan`]: the fusion pass's groups, a kernel each, the intermediate buffers
//! they share (allocated once, when the plan is made), and [`Plan::run`].
//!
//! Buffers of any graph element type are passed as [`TensorRef`] (read) and [`TensorMut`]
//! (written), made with `From` from `&Buffer<f32>`, `&Buffer<f16>`, `&Buffer<bf16>` and
//! their `&mut` forms. Masks that cross kernels (with fusion off) are stored as bytes. `run` checks their number, element types, lengths and placement
//! (host buffers for the interpreter, device buffers for CUDA) before launching anything.

use super::codegen;
use super::fuse::{self, Dest, Fusion, Partition, Source};
use super::{Graph, GraphError, Node};
use dsl_runtime::compile::build_ir;
use dsl_runtime::half::{bf16, f16};
use dsl_runtime::ir::{printer, ParamSpec};
use dsl_runtime::launch::Kernel;
use dsl_runtime::driver::CapturedGraph;
use dsl_runtime::{Buffer, DType, LaunchArgs, LaunchConfig, Runtime};

/// How to compile a graph.
#[derive(Clone, Debug)]
pub struct Options {
    /// Fuse ([`Fusion::On`], the default) or run one kernel per node.
    pub fusion: Fusion,
    /// Elements per program, at most (a power of two); small groups take the next power
    /// of two of their size, at least 32.
    pub block: usize,
    pub num_warps: u32,
    /// The longest row a rows group holds in one program's registers; longer rows loop
    /// over chunks of a quarter of it (default [`codegen::MAX_ROW`]; smaller values test
    /// the loops on small shapes).
    pub max_row: usize,
    /// Autotune each generated kernel at its first run (default off): elementwise groups
    /// over the block size and warps, groups of rows that fit in registers over the rows
    /// per program and warps (see [`tune_space`]), each a session of the
    /// [`autotune`] tuner (timed on the GPU, candidates checked against each other, the
    /// winner remembered on disk); `block` and `num_warps` above are then the first
    /// candidate, the one the interpreter keeps.
    pub tune: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options { fusion: Fusion::On, block: 1024, num_warps: 4, max_row: codegen::MAX_ROW, tune: false }
    }
}

impl Options {
    /// The default options with fusion off: one kernel per node.
    pub fn unfused() -> Options {
        Options { fusion: Fusion::Off, ..Options::default() }
    }
}

/// Errors of compiling and running a graph.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The graph is not valid.
    #[error(transparent)]
    Graph(#[from] GraphError),
    /// A kernel could not be built, compiled or launched.
    #[error(transparent)]
    Kernel(#[from] dsl_runtime::Error),
    /// The wrong number of inputs or outputs.
    #[error("the graph has {expected} {what}s, got {got} buffers")]
    Count { what: &'static str, expected: usize, got: usize },
    /// A symbolic dimension not bound, bound twice, or not declared
    /// ([`Symbolic`](super::Symbolic)).
    #[error("symbolic dimensions: {0}")]
    Dim(String),
    /// Autotuning a generated kernel failed (every candidate failed, or the tuner's
    /// state was poisoned by a panic).
    #[error("autotuning: {0}")]
    Tune(String),
    /// A buffer of the wrong element type.
    #[error("{what} `{name}` is {expected} of shape {shape:?}, got a buffer of {got}")]
    DType { what: &'static str, name: String, expected: DType, got: DType, shape: Vec<usize> },
    /// A buffer of the wrong length.
    #[error("{what} `{name}` has shape {shape:?} ({expected} elements), got a buffer of {got} elements")]
    Len { what: &'static str, name: String, expected: usize, got: usize, shape: Vec<usize> },
    /// A buffer of the other runtime (host memory for CUDA, device memory for the
    /// interpreter), or a plan compiled for the other runtime.
    #[error("{0}")]
    Placement(String),
    /// A kernel index past the plan's kernels.
    #[error("kernel {index} asked of a plan of {count} kernels")]
    NoKernel { index: usize, count: usize },
    /// A graph this slice cannot compile yet (the message says what and why).
    #[error("{0}")]
    Unsupported(String),
}

/// A buffer a plan reads.
#[derive(Clone, Copy)]
pub enum TensorRef<'a> {
    F32(&'a Buffer<f32>),
    F16(&'a Buffer<f16>),
    BF16(&'a Buffer<bf16>),
    /// Masks, one byte (0 or 1) an element: how intermediates of comparisons are stored.
    U8(&'a Buffer<u8>),
    /// Indices (`argmax`, `argmin`).
    I32(&'a Buffer<i32>),
}

/// A buffer a plan writes.
pub enum TensorMut<'a> {
    F32(&'a mut Buffer<f32>),
    F16(&'a mut Buffer<f16>),
    BF16(&'a mut Buffer<bf16>),
    /// Masks, one byte (0 or 1) an element.
    U8(&'a mut Buffer<u8>),
    /// Indices (`argmax`, `argmin`).
    I32(&'a mut Buffer<i32>),
}

macro_rules! tensor_from {
    ($t:ty, $v:ident) => {
        impl<'a> From<&'a Buffer<$t>> for TensorRef<'a> {
            fn from(b: &'a Buffer<$t>) -> Self {
                TensorRef::$v(b)
            }
        }
        impl<'a> From<&'a mut Buffer<$t>> for TensorMut<'a> {
            fn from(b: &'a mut Buffer<$t>) -> Self {
                TensorMut::$v(b)
            }
        }
    };
}
tensor_from!(f32, F32);
tensor_from!(f16, F16);
tensor_from!(bf16, BF16);
tensor_from!(u8, U8);
tensor_from!(i32, I32);

/// (element type, length, on the host)
fn describe<T: dsl_runtime::Element>(b: &Buffer<T>) -> (DType, usize, bool) {
    (T::DTYPE, b.len(), matches!(b, Buffer::Host(_)))
}

/// Where the buffer's elements are: what a captured launch holds of it.
fn address<T: dsl_runtime::Element>(b: &Buffer<T>) -> u64 {
    use dsl_runtime::cudarc::driver::DevicePtr;
    match b {
        Buffer::Device(s) => s.device_ptr(s.stream()).0,
        Buffer::Host(v) => v.as_ptr() as u64,
    }
}

impl TensorRef<'_> {
    fn describe(&self) -> (DType, usize, bool) {
        match self {
            TensorRef::F32(b) => describe(*b),
            TensorRef::F16(b) => describe(*b),
            TensorRef::BF16(b) => describe(*b),
            TensorRef::U8(b) => describe(*b),
            TensorRef::I32(b) => describe(*b),
        }
    }
    fn address(&self) -> u64 {
        match self {
            TensorRef::F32(b) => address(*b),
            TensorRef::F16(b) => address(*b),
            TensorRef::BF16(b) => address(*b),
            TensorRef::U8(b) => address(*b),
            TensorRef::I32(b) => address(*b),
        }
    }
}

impl TensorMut<'_> {
    fn describe(&self) -> (DType, usize, bool) {
        match self {
            TensorMut::F32(b) => describe(&**b),
            TensorMut::F16(b) => describe(&**b),
            TensorMut::BF16(b) => describe(&**b),
            TensorMut::U8(b) => describe(&**b),
            TensorMut::I32(b) => describe(&**b),
        }
    }
    fn address(&self) -> u64 {
        match self {
            TensorMut::F32(b) => address(&**b),
            TensorMut::F16(b) => address(&**b),
            TensorMut::BF16(b) => address(&**b),
            TensorMut::U8(b) => address(&**b),
            TensorMut::I32(b) => address(&**b),
        }
    }
    fn reborrow(&mut self) -> TensorMut<'_> {
        match self {
            TensorMut::F32(b) => TensorMut::F32(b),
            TensorMut::F16(b) => TensorMut::F16(b),
            TensorMut::BF16(b) => TensorMut::BF16(b),
            TensorMut::U8(b) => TensorMut::U8(b),
            TensorMut::I32(b) => TensorMut::I32(b),
        }
    }
}

/// An intermediate buffer the plan owns.
enum Owned {
    F32(Buffer<f32>),
    F16(Buffer<f16>),
    BF16(Buffer<bf16>),
    U8(Buffer<u8>),
    I32(Buffer<i32>),
}

impl Owned {
    fn bytes(&self) -> usize {
        match self {
            Owned::F32(b) => 4 * b.len(),
            Owned::F16(b) => 2 * b.len(),
            Owned::BF16(b) => 2 * b.len(),
            Owned::U8(b) => b.len(),
            Owned::I32(b) => 4 * b.len(),
        }
    }
    fn new(rt: &Runtime, dtype: DType, len: usize) -> Result<Owned, PlanError> {
        Ok(match dtype {
            DType::F16 => Owned::F16(rt.zeros(len)?),
            DType::BF16 => Owned::BF16(rt.zeros(len)?),
            DType::Bool | DType::U8 => Owned::U8(rt.zeros(len)?),
            DType::I32 => Owned::I32(rt.zeros(len)?),
            _ => Owned::F32(rt.zeros(len)?),
        })
    }
    fn as_ref(&self) -> TensorRef<'_> {
        match self {
            Owned::F32(b) => TensorRef::F32(b),
            Owned::F16(b) => TensorRef::F16(b),
            Owned::BF16(b) => TensorRef::BF16(b),
            Owned::U8(b) => TensorRef::U8(b),
            Owned::I32(b) => TensorRef::I32(b),
        }
    }
    fn as_mut(&mut self) -> TensorMut<'_> {
        match self {
            Owned::F32(b) => TensorMut::F32(b),
            Owned::F16(b) => TensorMut::F16(b),
            Owned::BF16(b) => TensorMut::BF16(b),
            Owned::U8(b) => TensorMut::U8(b),
            Owned::I32(b) => TensorMut::I32(b),
        }
    }
}

/// One group's kernel and its launch.
struct Step {
    kernel: Box<dyn Kernel>,
    numel: usize,
    launch: Launch,
    /// With [`Options::tune`], a generated kernel's tuner and its candidates.
    tuned: Option<Tuned>,
}

/// A generated kernel's autotuning: the tuner (its sessions remembered per plan, its
/// results on disk) and the kernel and launch of each candidate configuration.
struct Tuned {
    tuner: autotune::Autotuner,
    candidates: Vec<(autotune::Config, dsl_runtime::IrKernel, Launch)>,
    /// What the tuner's results are keyed by.
    key: autotune::Key,
}

/// The configurations a generated kernel is tuned over, the untuned one first: for an
/// elementwise group of `numel` elements, `BLOCK` elements a program (256 to 4096, at most
/// the next power of two of `numel`) with 2, 4 or 8 warps, 1 to 16 elements a thread; for
/// a group of rows of `row` elements (held in registers, `row` at most
/// [`Options::max_row`]), `ROWS` rows a program (1 to 16, at most the next power of two of
/// the row count) with 1 to 8 warps, 1 to 32 elements a thread. Longer rows, which loop,
/// are not tuned.
pub fn tune_space(numel: usize, row: Option<usize>, first: (usize, usize, u32)) -> Vec<autotune::Config> {
    let (block0, rows0, warps0) = first;
    let cfg = |block: usize, rows: usize, warps: u32| autotune::Config::new(&[("BLOCK", block as i64), ("ROWS", rows as i64)], warps, 1);
    let mut out = vec![cfg(block0, rows0, warps0)];
    let mut push = |c: autotune::Config| {
        if !out.contains(&c) {
            out.push(c);
        }
    };
    match row {
        None => {
            let top = numel.next_power_of_two().max(32);
            for block in [256, 512, 1024, 2048, 4096].into_iter().filter(|&b| b <= top) {
                for warps in [2u32, 4, 8] {
                    if (1..=16).contains(&(block / (32 * warps as usize))) {
                        push(cfg(block, 1, warps));
                    }
                }
            }
        }
        Some(r) => {
            let (block, nrows) = (r.next_power_of_two().max(32), numel / r.max(1));
            for rows in [1usize, 2, 4, 8, 16].into_iter().filter(|&k| k <= nrows.max(1).next_power_of_two()) {
                for warps in [1u32, 2, 4, 8] {
                    if (1..=32).contains(&(rows * block / (32 * warps as usize))) {
                        push(cfg(block, rows, warps));
                    }
                }
            }
        }
    }
    out
}

/// The written buffers of a tuned launch, as the tuner saves and restores them.
struct Written<'a, 'b>(&'a mut [TensorMut<'b>]);

impl autotune::Outputs for Written<'_, '_> {
    fn snapshot(&self) -> dsl_runtime::Result<Vec<autotune::outputs::Saved>> {
        use autotune::OutBuf;
        self.0
            .iter()
            .map(|t| match t {
                TensorMut::F32(b) => b.save(),
                TensorMut::F16(b) => b.save(),
                TensorMut::BF16(b) => b.save(),
                TensorMut::U8(b) => b.save(),
                TensorMut::I32(b) => b.save(),
            })
            .collect()
    }
    fn restore(&mut self, saved: &[autotune::outputs::Saved]) -> dsl_runtime::Result<()> {
        use autotune::OutBuf;
        for (t, s) in self.0.iter_mut().zip(saved) {
            match t {
                TensorMut::F32(b) => b.load(s)?,
                TensorMut::F16(b) => b.load(s)?,
                TensorMut::BF16(b) => b.load(s)?,
                TensorMut::U8(b) => b.load(s)?,
                TensorMut::I32(b) => b.load(s)?,
            }
        }
        Ok(())
    }
}

/// A launch's buffer arguments: `reads`, then `written`, in the kernel's parameter order.
fn bind<'a>(rt: &'a Runtime, reads: &[TensorRef<'a>], written: &'a mut [TensorMut<'_>]) -> LaunchArgs<'a, Runtime> {
    let mut args = LaunchArgs::new(rt);
    for r in reads {
        args = match *r {
            TensorRef::F32(b) => args.input(b),
            TensorRef::F16(b) => args.input(b),
            TensorRef::BF16(b) => args.input(b),
            TensorRef::U8(b) => args.input(b),
            TensorRef::I32(b) => args.input(b),
        };
    }
    for w in written.iter_mut() {
        args = match w {
            TensorMut::F32(b) => args.output(&mut **b),
            TensorMut::F16(b) => args.output(&mut **b),
            TensorMut::BF16(b) => args.output(&mut **b),
            TensorMut::U8(b) => args.output(&mut **b),
            TensorMut::I32(b) => args.output(&mut **b),
        };
    }
    args
}

/// Launch generated kernel `kernel` on `reads` and `written` and the element count,
/// `programs` programs of `warps` warps.
fn launch_generated(rt: &Runtime, kernel: &dyn Kernel, reads: &[TensorRef<'_>], written: &mut [TensorMut<'_>], numel: usize, (programs, warps): (usize, u32)) -> dsl_runtime::Result<()> {
    bind(rt, reads, written).scalar(numel as i32).launch(kernel, LaunchConfig::grid(programs as u32).warps(warps))
}

/// Launch a generated kernel or a matrix product's (`launch` says which) on `reads` and
/// `written` and its scalars.
fn launch_simple(rt: &Runtime, kernel: &dyn Kernel, launch: &Launch, reads: &[TensorRef<'_>], written: &mut [TensorMut<'_>], numel: usize) -> dsl_runtime::Result<()> {
    match launch {
        Launch::Generated { programs, warps } => launch_generated(rt, kernel, reads, written, numel, (*programs, *warps)),
        Launch::Matmul { grid, warps, stages, args } => {
            let cfg = LaunchConfig::grid3(grid[0], grid[1], grid[2]).warps(*warps).stages(*stages);
            // The library's `matmul_batched` takes the first 15 (two batch dimensions), a
            // generated kernel all ([`codegen::MATMUL_INTS`]).
            let ints = kernel.meta().params.len() - reads.len() - written.len();
            args[..ints].iter().fold(bind(rt, reads, written), |a, &x| a.scalar(x)).launch(kernel, cfg)
        }
        Launch::Attention { .. } | Launch::AttentionGrad { .. } => unreachable!("attention launches with its scratch buffers"),
    }
}

/// How a step launches.
enum Launch {
    /// A generated kernel: `programs` programs of `warps` warps, then the element count.
    Generated { programs: usize, warps: u32 },
    /// The library's batched matmul: its grid, warps and stages, and its integer arguments
    /// after the three buffers (sizes, strides, batch strides).
    Matmul { grid: [u32; 3], warps: u32, stages: u32, args: [i32; 19] },
    /// Flash attention: its grid, `(t, h, kv)`, the scale, the 12 strides of q, k, v and
    /// o, and the index of the plan's scratch buffer for its log-sum-exp.
    /// `args`: the scratch buffer of the score modification's arguments (a window's width,
    /// or what `pack` writes first for a mask or bias from data, the group's last load).
    Attention { grid: [u32; 3], warps: u32, stages: u32, warp_specialize: bool, programs: u32, sizes: [i32; 3], scale: f32, causal: bool, strides: [i32; 12], lse: usize, args: Option<usize>, pack: Option<Pack> },
    /// The flash-attention backward of row-major q, k, v and the output's gradient: the
    /// forward recomputed (output and log-sum-exp into scratch buffers), then the library's
    /// backward (`attention_backward`: dQ, which stores the row sums into `delta`, then
    /// dK/dV). `stored`: which gradient (0 `dq`, 1 `dk`, 2 `dv`) each of the
    /// group's stores is; `spare`: scratch buffers for the ones not stored.
    AttentionGrad { shape: crate::flash_attention::Shape, scale: f32, stored: Vec<u8>, o: Option<usize>, lse: usize, delta: usize, spare: [Option<usize>; 3], args: Option<(ScoreMod, usize)>, pack: Option<Pack> },
}

/// A mask or bias from data ([`ScoreData`](super::attention::ScoreData)) packed into the
/// `ScoreBias` arguments of an attention's kernels before they run
/// (`flash_attention::score_bias_pack`, or `score_mask_pack` for a boolean mask): the
/// packing kernel of the read tensor's element type, its grid (rows, key blocks), and its
/// integer arguments after the two buffers (`t`, the extents `nh`, `nq` and `nk`, the read
/// strides, the written ones) and how a value becomes a bias
/// ([`DataOp::pack_args`](super::attention::DataOp::pack_args)). Only the extents the
/// tensor has are written (a key padding mask is `B T` values, read by every query).
struct Pack {
    kernel: Box<dyn Kernel>,
    grid: [u32; 2],
    ints: [i32; 12],
    how: (i32, f32, f32, i32),
    /// The arguments' length: the header and the values written.
    len: usize,
    /// The header's window ([`BIAS_HEADER`](crate::flash_attention::BIAS_HEADER)): the
    /// attention's sliding window when it has one too, read by the hook that combines them
    /// (`flash_attention::data_window`); `inf` otherwise.
    window: f32,
}

/// Keys a packing program covers.
const PACK_BLOCK: usize = 256;

impl Pack {
    /// The packing of `d` for scores `[B, H, T, T]` of rank `rank` (`[B, T, T]` at rank 3;
    /// `[B, KV, G, T, T]` at rank 5, the query heads grouped, `H = KV G`).
    fn new(nodes: &[Node], d: &super::attention::ScoreData, (b, h, t, rank): (usize, usize, usize, usize), window: Option<u32>) -> Result<Pack, PlanError> {
        use crate::flash_attention::{f32_exact, score_bias_pack, score_mask_pack};
        let unsupported = |why: String| PlanError::Unsupported(format!("the mask or bias from data {}: {why}", d.read.0));
        let (x, root) = d.read;
        let (shape, st) = (&nodes[x.index()].shape, strides_through(nodes, x, root));
        // Strides over the scores' axes (broadcast: right-aligned, 0 where of extent 1 or
        // missing).
        let along = |axis: usize| -> isize {
            match (axis + shape.len()).checked_sub(rank) {
                Some(j) if shape[j] != 1 => st[j],
                _ => 0,
            }
        };
        // The extents written (1 where broadcast) and their strides (exact in f32, the
        // kernels read them so).
        let sh = match rank {
            4 => along(1),
            // (The matcher takes only data shared by the heads when they are grouped.)
            5 if along(1) != 0 || along(2) != 0 => return Err(unsupported("it differs between heads grouped as [B, KV, G, T, T]".into())),
            _ => 0,
        };
        let [sb, sq, sk] = [0, rank - 2, rank - 1].map(along);
        let extent = |s: isize, n: usize| if s == 0 { 1 } else { n };
        let (nb, nh, nq, nk) = (extent(sb, b), extent(sh, h), extent(sq, t), extent(sk, t));
        let (ok, oq) = (usize::from(nk > 1), if nq > 1 { nk } else { 0 });
        let oh = if nh > 1 { f32_exact(nq * nk) } else { 0 };
        let ob = if nb > 1 { f32_exact(nh * oh.max(nq * nk)) } else { 0 };
        let len = crate::flash_attention::BIAS_HEADER + (nb - 1) * ob + (nh - 1) * oh + (nq - 1) * oq + (nk - 1) * ok + 1;
        if len > i32::MAX as usize || nodes[root.index()].numel() > i32::MAX as usize || t > 1 << 24 {
            return Err(unsupported("too large for 32-bit offsets".into()));
        }
        let mut ints = [t, nh, nq, nk, 0, 0, 0, 0, ob, oh, oq, ok].map(|v| v as i32);
        for (i, s) in [sb, sh, sq, sk].into_iter().enumerate() {
            ints[4 + i] = i32::try_from(s).map_err(|_| unsupported("a stride exceeds 32 bits".into()))?;
        }
        let kernel: Box<dyn Kernel> = match nodes[root.index()].dtype {
            DType::F32 => Box::new(score_bias_pack::<f32, PACK_BLOCK>::new()),
            DType::F16 => Box::new(score_bias_pack::<f16, PACK_BLOCK>::new()),
            DType::BF16 => Box::new(score_bias_pack::<bf16, PACK_BLOCK>::new()),
            DType::Bool | DType::U8 => Box::new(score_mask_pack::<PACK_BLOCK>::new()),
            other => return Err(unsupported(format!("read from {other}"))),
        };
        Ok(Pack { kernel, grid: [(nb * nh * nq) as u32, nk.div_ceil(PACK_BLOCK) as u32], ints, how: d.how.pack_args(), len, window: window.map_or(f32::INFINITY, |w| w as f32) })
    }

    /// Whether the packed values are one row for every query (`nq` = 1).
    fn keys_only(&self) -> bool {
        self.ints[2] == 1
    }

    /// Write `args` from `x` (the tensor read).
    fn run(&self, rt: &Runtime, x: TensorRef<'_>, args: &mut Buffer<f32>) -> dsl_runtime::Result<()> {
        let (op, c, factor, keep) = self.how;
        let a = self.ints.iter().fold(bind(rt, &[x], &mut []).output(args), |a, &v| a.scalar(v));
        a.scalar(op).scalar(c).scalar(factor).scalar(keep).scalar(self.window).launch(&*self.kernel, LaunchConfig::grid3(self.grid[0], self.grid[1], 1).warps(4))
    }
}

/// The flash-attention backward of one attention's gradient nodes (see
/// [`Launch::AttentionGrad`]): `[B, H, T, D]` operands (rank 4), scratch buffers for the
/// recomputed output, its log-sum-exp, the backward's row sums and the gradients nothing
/// stores. Its kernel (for listings) is the `dq` kernel of its element type and head
/// dimension.
fn attention_grad_step(nodes: &[Node], g: &super::fuse::Group, a: &super::AttentionGrad, saved: Option<usize>, scratch: &mut Vec<Owned>, rt: &Runtime) -> Result<Step, PlanError> {
    use crate::flash_attention::{all_keys, attention_bwd_dq as dq, data_window_keys_from, key_bias, no_score_mod, score_bias, sliding_window, unit_score_grad, window_keys_from, Layout, Shape};
    use dsl_runtime::dsl::{Derivative, Hook};
    let (q, k) = (&nodes[a.q.index()], &nodes[a.k.index()]);
    let (sq, sk) = (&q.shape, &k.shape);
    if sq.len() != 4 || sk.len() != 4 {
        return Err(PlanError::Unsupported(format!("attention gradient of {:?} and {:?} operands: [B, H, T, D] only", sq, sk)));
    }
    // The projections' layout when the group stores the gradients' transposes (the fusion
    // pass then reads the operands through theirs: `fuse::bthd_view`).
    let bthd = g.stores.iter().any(|(id, _)| matches!(nodes[id.index()].op, super::Op::View(..)));
    let layout = if bthd { Layout::Bthd } else { Layout::Bhtd };
    let shape = Shape { batch: sq[0], seq: sq[2], heads: sq[1], kv_heads: sk[1], head_dim: sq[3], causal: a.causal, layout };
    let rows = sq[0] * sq[1] * sq[2];
    let mut alloc = |d: DType, n: usize| -> Result<usize, PlanError> {
        scratch.push(Owned::new(rt, d, n.max(1))?);
        Ok(scratch.len() - 1)
    };
    // The forward's output and log-sum-exp: recomputed into scratch, or the forward step's
    // (`saved`: its log-sum-exp; its output is the group's fifth load).
    let (o, lse) = match saved {
        Some(lse) => (None, lse),
        None => (Some(alloc(q.dtype, q.numel())?), alloc(DType::F32, rows)?),
    };
    let delta = alloc(DType::F32, rows)?;
    let stored: Vec<u8> = g
        .stores
        .iter()
        .map(|(id, _)| {
            // A gradient, or its transpose (the [B, T, H, D] layout).
            let g = match nodes[id.index()].op {
                super::Op::View(super::View::Permute(_), g) if bthd => g,
                _ => *id,
            };
            match nodes[g.index()].op {
                super::Op::AttentionGrad(x) => Ok(x.which),
                _ => Err(PlanError::Placement(format!("{id} stored by an attention gradient's group"))),
            }
        })
        .collect::<Result<_, _>>()?;
    // One buffer per gradient: the fusion pass copies a value stored twice
    // (`fuse::one_store_per_gradient`); a gradient stored both as itself and as its
    // transpose is refused.
    if (0..3u8).any(|w| stored.iter().filter(|&&x| x == w).count() > 1) {
        return Err(PlanError::Unsupported(format!("attention gradient of {}: a gradient stored in two layouts (as itself and as its transpose)", a.q)));
    }
    let mut spare = [None; 3];
    for (w, slot) in spare.iter_mut().enumerate() {
        if !stored.contains(&(w as u8)) {
            *slot = Some(alloc(q.dtype, if w == 0 { q.numel() } else { k.numel() })?);
        }
    }
    let rank = nodes[a.dout.index()].shape.len();
    let pack = a.data.map(|d| Pack::new(nodes, &d, (shape.batch, shape.heads, shape.seq, rank), a.window)).transpose()?;
    // (For listings: the `dq` kernel, with the scores' modification.)
    let (modifier, scale) = ScoreMod::of(nodes, (a.softcap(), a.window, a.score_ops, a.scale()), pack.as_ref())?;
    macro_rules! at_dim {
        ($t:ty, $d:literal) => {
            match &modifier {
                None => Box::new(dq::<$t, no_score_mod, unit_score_grad, all_keys, false, 64, 32, $d>::new()) as Box<dyn Kernel>,
                Some(ScoreMod::Window(_)) => Box::new(dq::<$t, sliding_window, unit_score_grad, window_keys_from, true, 64, 32, $d>::new()),
                Some(ScoreMod::Data) => Box::new(dq::<$t, score_bias, unit_score_grad, all_keys, true, 64, 32, $d>::new()),
                Some(ScoreMod::KeyData) => Box::new(dq::<$t, key_bias, unit_score_grad, all_keys, true, 64, 32, $d>::new()),
                Some(ScoreMod::Hooked { hook: h, then: Some(Then::Window(_)) }) => Box::new(h.kernel(dq::<$t, Hook<6>, Derivative<Hook<6>>, window_keys_from, true, 64, 32, $d>::new())?.as_ref().clone()),
                Some(ScoreMod::Hooked { hook: h, then: Some(Then::WindowData { .. }) }) => Box::new(h.kernel(dq::<$t, Hook<6>, Derivative<Hook<6>>, data_window_keys_from, true, 64, 32, $d>::new())?.as_ref().clone()),
                Some(ScoreMod::Hooked { hook: h, .. }) => Box::new(h.kernel(dq::<$t, Hook<6>, Derivative<Hook<6>>, all_keys, true, 64, 32, $d>::new())?.as_ref().clone()),
            }
        };
    }
    macro_rules! kernel {
        ($t:ty) => {
            match sq[3] {
                16 => at_dim!($t, 16),
                32 => at_dim!($t, 32),
                64 => at_dim!($t, 64),
                _ => at_dim!($t, 128),
            }
        };
    }
    let kernel = match q.dtype {
        DType::F16 => kernel!(f16),
        DType::BF16 => kernel!(bf16),
        _ => kernel!(f32),
    };
    // (The library's launches check the length of a dense layout shared by the heads,
    // which a packing per head exceeds.)
    let dense = crate::flash_attention::BIAS_HEADER + shape.batch * crate::flash_attention::f32_exact(shape.seq * shape.seq);
    let len = dense.max(pack.as_ref().map_or(0, |p| p.len));
    let args = modifier.map(|m| m.buffer(rt, scratch, len).map(|i| (m, i))).transpose()?;
    Ok(Step { kernel, numel: q.numel(), launch: Launch::AttentionGrad { shape, scale, stored, o, lse, delta, spare, args, pack }, tuned: None })
}

/// The score modification of a recognised attention's kernels, with the one value of its
/// `args` buffer: the sliding window's width; or a mask or bias from data (`ScoreBias`, its
/// `args` written by a [`Pack`] before each run); or operations on the scores in a hook.
#[derive(Clone, Debug)]
enum ScoreMod {
    Window(u32),
    Data,
    /// Data that does not change along the queries (a key padding mask): `KeyBias`, which
    /// reads a row of the packed values a key tile instead of a tile.
    KeyData,
    /// A soft-cap or other operations on the scores ([`ScoreOps`](super::attention::ScoreOps)),
    /// compiled into the kernels' score hook, then the window or the data if any (inlined
    /// there, reading `args` as `SlidingWindow`, `ScoreBias` or `KeyBias` do; the window's
    /// tiles skipped); their leading multiplications by positive constants moved into the
    /// kernels' scale ([`ScoreMod::of`]). Also a sliding window and data together, with or
    /// without operations: no library modification takes both.
    Hooked { hook: std::sync::Arc<crate::flash_attention::ScoreHook>, then: Option<Then> },
}

/// The modification a hook applies after the operations on the scores.
#[derive(Clone, Copy, Debug)]
enum Then {
    Window(u32),
    Data,
    KeyData,
    /// A sliding window over data (`Data` or `KeyData` as `keys`): `data_window` (the width
    /// in the data's header, written by the [`Pack`]), then `score_bias` or `key_bias`; the
    /// window's tiles skipped (`data_window_keys_from`).
    WindowData { keys: bool },
}

impl Then {
    /// Its score as hook code: the library's `#[kernel_fn]`s inlined.
    fn code(self) -> std::sync::Arc<dsl_runtime::ir::builder::HookFn> {
        use crate::flash_attention::{data_window, key_bias, score_bias, sliding_window};
        use dsl_runtime::dsl::inlining::inline;
        std::sync::Arc::new(move |b, x, at| match self {
            Then::Window(_) => inline(sliding_window(x[0], x[1], x[2], x[3], x[4], x[5]), b, at),
            Then::Data => inline(score_bias(x[0], x[1], x[2], x[3], x[4], x[5]), b, at),
            Then::KeyData => inline(key_bias(x[0], x[1], x[2], x[3], x[4], x[5]), b, at),
            Then::WindowData { keys } => {
                let y = inline(data_window(x[0], x[1], x[2], x[3], x[4], x[5]), b, at)?;
                if keys {
                    inline(key_bias(y, x[1], x[2], x[3], x[4], x[5]), b, at)
                } else {
                    inline(score_bias(y, x[1], x[2], x[3], x[4], x[5]), b, at)
                }
            }
        })
    }
}

impl ScoreMod {
    /// The modification of attention `a` (its soft-cap, window, data (`pack`: its packing)
    /// or other operations on its scores, read from `nodes`), and the kernels' scale: the
    /// library's own modification for a window or data alone, a hook for a soft-cap or
    /// operations on the scores (alone or before a window or data), their leading factors in
    /// the scale. A soft-cap is a hook too, `tanh(s) * cap` on scores the kernels' scale
    /// divides by the cap: at the seed shape on the H100 level with the library's `SoftCap`
    /// forward and 4% faster forward + backward (BENCHMARKS.md, "Operations on the scores
    /// compiled into the attention kernels' hook"). `Err` for a scale that is not a normal,
    /// finite f32 (the kernels' type).
    fn of(nodes: &[Node], (softcap, window, ops, scale): (Option<f64>, Option<u32>, Option<super::attention::ScoreOps>, f64), pack: Option<&Pack>) -> Result<(Option<ScoreMod>, f32), PlanError> {
        let then = match (window, pack.map(Pack::keys_only)) {
            (Some(w), None) => Some(Then::Window(w)),
            (None, Some(false)) => Some(Then::Data),
            (None, Some(true)) => Some(Then::KeyData),
            (Some(_), Some(keys)) => Some(Then::WindowData { keys }),
            (None, None) => None,
        };
        let steps = ops.map(|o| o.steps(nodes)).or(softcap.map(super::attention::ScoreSteps::soft_cap));
        let (modifier, scale) = match (steps, then) {
            (None, Some(Then::Window(w))) => (Some(ScoreMod::Window(w)), scale as f32),
            (None, Some(Then::Data)) => (Some(ScoreMod::Data), scale as f32),
            (None, Some(Then::KeyData)) => (Some(ScoreMod::KeyData), scale as f32),
            (None, None) => (None, scale as f32),
            // Operations on the scores, or a window over data: a hook (a negative scale's
            // sign in it, the kernels' scale positive).
            (steps, then) => {
                let steps = steps.unwrap_or_default();
                let (steps, scale) = if scale < 0.0 { (steps.negated(), -scale) } else { (steps, scale) };
                let (scale, steps) = steps.split_scale(scale);
                (Some(ScoreMod::Hooked { hook: std::sync::Arc::new(steps.hook(then.map(Then::code))), then }), scale)
            }
        };
        if !scale.is_normal() {
            return Err(PlanError::Unsupported(format!("an attention's scale {scale} in f32: the kernels take a positive, normal, finite one")));
        }
        Ok((modifier, scale))
    }

    /// A scratch buffer for its arguments (`data_len` of them for a mask or bias from data):
    /// its index.
    fn buffer(&self, rt: &Runtime, scratch: &mut Vec<Owned>, data_len: usize) -> Result<usize, PlanError> {
        let v = match *self {
            ScoreMod::Window(w) | ScoreMod::Hooked { then: Some(Then::Window(w)), .. } => w as f32,
            ScoreMod::Hooked { then: None, .. } => 0.0,
            ScoreMod::Data | ScoreMod::KeyData | ScoreMod::Hooked { then: Some(Then::Data | Then::KeyData | Then::WindowData { .. }), .. } => {
                scratch.push(Owned::new(rt, DType::F32, data_len)?);
                return Ok(scratch.len() - 1);
            }
        };
        let mut b = rt.zeros::<f32>(1)?;
        b.copy_from(&[v])?;
        scratch.push(Owned::F32(b));
        Ok(scratch.len() - 1)
    }
}

/// Run an attention gradient step: the forward into `o` and `lse`, then the backward
/// into `grads` (`dq`, `dk`, `dv`), all of one element type; with the `SlidingWindow`,
/// `ScoreBias` or `KeyBias` score modification or a hook when `modifier` says which, its
/// arguments in the buffer.
fn attention_grad_run(rt: &Runtime, (s, scale, modifier): (&crate::flash_attention::Shape, f32, Option<(&ScoreMod, &Buffer<f32>)>), reads: [TensorRef<'_>; 4], grads: [TensorMut<'_>; 3], forward: Forward<'_>, lse: &mut Buffer<f32>, delta: &mut Buffer<f32>) -> Result<(), PlanError> {
    use crate::flash_attention::{attention_backward, attention_backward_hooked, attention_backward_scored, attention_forward, attention_forward_hooked, attention_forward_scored, data_window_keys_from, data_window_queries_to, window_keys_from, window_queries_to, Grads, Hooked, KeyBias, Options, ScoreBias, SlidingWindow};
    // The forward into `o` (recomputed), then the backward.
    macro_rules! fwd {
        ($q:ident, $k:ident, $v:ident, $o:ident) => {
            match modifier {
                Some((ScoreMod::Window(_), w)) => attention_forward_scored::<_, SlidingWindow>(rt, s, $q, $k, $v, $o, lse, scale, w, Options::default())?,
                Some((ScoreMod::Data, b)) => attention_forward_scored::<_, ScoreBias>(rt, s, $q, $k, $v, $o, lse, scale, b, Options::default())?,
                Some((ScoreMod::KeyData, b)) => attention_forward_scored::<_, KeyBias>(rt, s, $q, $k, $v, $o, lse, scale, b, Options::default())?,
                Some((ScoreMod::Hooked { hook: h, then: Some(Then::Window(_)), .. }, b)) => attention_forward_hooked::<_, Hooked<window_keys_from, window_queries_to>>(rt, s, $q, $k, $v, $o, lse, scale, b, h, Options::default())?,
                Some((ScoreMod::Hooked { hook: h, then: Some(Then::WindowData { .. }), .. }, b)) => attention_forward_hooked::<_, Hooked<data_window_keys_from, data_window_queries_to>>(rt, s, $q, $k, $v, $o, lse, scale, b, h, Options::default())?,
                Some((ScoreMod::Hooked { hook: h, .. }, b)) => attention_forward_hooked::<_, Hooked>(rt, s, $q, $k, $v, $o, lse, scale, b, h, Options::default())?,
                None => attention_forward(rt, s, $q, $k, $v, $o, lse, scale)?,
            }
        };
    }
    macro_rules! go {
        ($q:ident, $k:ident, $v:ident, $dout:ident, $dq:ident, $dk:ident, $dv:ident, $o:expr) => {{
            let g = Grads { q: $q, k: $k, v: $v, o: $o, lse: &*lse, dout: $dout, dq: $dq, dk: $dk, dv: $dv };
            match modifier {
                Some((ScoreMod::Window(_), w)) => Ok(attention_backward_scored::<_, SlidingWindow>(rt, s, g, delta, scale, w, Options::default())?),
                Some((ScoreMod::Data, b)) => Ok(attention_backward_scored::<_, ScoreBias>(rt, s, g, delta, scale, b, Options::default())?),
                Some((ScoreMod::KeyData, b)) => Ok(attention_backward_scored::<_, KeyBias>(rt, s, g, delta, scale, b, Options::default())?),
                Some((ScoreMod::Hooked { hook: h, then: Some(Then::Window(_)), .. }, b)) => Ok(attention_backward_hooked::<_, Hooked<window_keys_from, window_queries_to>>(rt, s, g, delta, scale, b, h, Options::default())?),
                Some((ScoreMod::Hooked { hook: h, then: Some(Then::WindowData { .. }), .. }, b)) => Ok(attention_backward_hooked::<_, Hooked<data_window_keys_from, data_window_queries_to>>(rt, s, g, delta, scale, b, h, Options::default())?),
                Some((ScoreMod::Hooked { hook: h, .. }, b)) => Ok(attention_backward_hooked::<_, Hooked>(rt, s, g, delta, scale, b, h, Options::default())?),
                None => Ok(attention_backward(rt, s, g, delta, scale)?),
            }
        }};
    }
    use {Forward::Recompute as R, Forward::Saved as S};
    match (reads, grads, forward) {
        ([TensorRef::F32(q), TensorRef::F32(k), TensorRef::F32(v), TensorRef::F32(dout)], [TensorMut::F32(dq), TensorMut::F32(dk), TensorMut::F32(dv)], R(TensorMut::F32(o))) => {
            fwd!(q, k, v, o);
            go!(q, k, v, dout, dq, dk, dv, &*o)
        }
        ([TensorRef::F16(q), TensorRef::F16(k), TensorRef::F16(v), TensorRef::F16(dout)], [TensorMut::F16(dq), TensorMut::F16(dk), TensorMut::F16(dv)], R(TensorMut::F16(o))) => {
            fwd!(q, k, v, o);
            go!(q, k, v, dout, dq, dk, dv, &*o)
        }
        ([TensorRef::BF16(q), TensorRef::BF16(k), TensorRef::BF16(v), TensorRef::BF16(dout)], [TensorMut::BF16(dq), TensorMut::BF16(dk), TensorMut::BF16(dv)], R(TensorMut::BF16(o))) => {
            fwd!(q, k, v, o);
            go!(q, k, v, dout, dq, dk, dv, &*o)
        }
        ([TensorRef::F32(q), TensorRef::F32(k), TensorRef::F32(v), TensorRef::F32(dout)], [TensorMut::F32(dq), TensorMut::F32(dk), TensorMut::F32(dv)], S(TensorRef::F32(o))) => go!(q, k, v, dout, dq, dk, dv, o),
        ([TensorRef::F16(q), TensorRef::F16(k), TensorRef::F16(v), TensorRef::F16(dout)], [TensorMut::F16(dq), TensorMut::F16(dk), TensorMut::F16(dv)], S(TensorRef::F16(o))) => go!(q, k, v, dout, dq, dk, dv, o),
        ([TensorRef::BF16(q), TensorRef::BF16(k), TensorRef::BF16(v), TensorRef::BF16(dout)], [TensorMut::BF16(dq), TensorMut::BF16(dk), TensorMut::BF16(dv)], S(TensorRef::BF16(o))) => go!(q, k, v, dout, dq, dk, dv, o),
        _ => Err(PlanError::Placement("an attention gradient's buffers are not of one float type".into())),
    }
}

/// Where an attention gradient's forward output comes from: recomputed into a scratch
/// buffer, or the forward step's (saved).
enum Forward<'a> {
    Recompute(TensorMut<'a>),
    Saved(TensorRef<'a>),
}

/// The forward attention kernel of a plan's tile
/// ([`Options::forward_plan`](crate::flash_attention::Options::forward_plan)), element
/// type, head dimension and score modification: exactly the plan's query and key tiles, or
/// `None` where none is built (head dims 16, 32, 64 and 128).
fn attention_kernel(dtype: DType, plan: &crate::flash_attention::ForwardPlan, d: usize, modifier: Option<&ScoreMod>) -> Result<Option<Box<dyn Kernel>>, PlanError> {
    use crate::flash_attention::{all_keys, attention as fa, data_window_keys_from, key_bias, no_score_mod, score_bias, sliding_window, window_keys_from};
    use dsl_runtime::dsl::Hook;
    macro_rules! at_dim {
        ($t:ty, $bm:literal, $bn:literal, $d:literal) => {
            match modifier {
                None => Box::new(fa::<$t, no_score_mod, all_keys, false, $bm, $bn, $d>::new()) as Box<dyn Kernel>,
                Some(ScoreMod::Window(_)) => Box::new(fa::<$t, sliding_window, window_keys_from, true, $bm, $bn, $d>::new()),
                Some(ScoreMod::Data) => Box::new(fa::<$t, score_bias, all_keys, true, $bm, $bn, $d>::new()),
                Some(ScoreMod::KeyData) => Box::new(fa::<$t, key_bias, all_keys, true, $bm, $bn, $d>::new()),
                Some(ScoreMod::Hooked { hook: h, then: Some(Then::Window(_)) }) => Box::new(h.kernel(fa::<$t, Hook<6>, window_keys_from, true, $bm, $bn, $d>::new())?.as_ref().clone()),
                Some(ScoreMod::Hooked { hook: h, then: Some(Then::WindowData { .. }) }) => Box::new(h.kernel(fa::<$t, Hook<6>, data_window_keys_from, true, $bm, $bn, $d>::new())?.as_ref().clone()),
                Some(ScoreMod::Hooked { hook: h, .. }) => Box::new(h.kernel(fa::<$t, Hook<6>, all_keys, true, $bm, $bn, $d>::new())?.as_ref().clone()),
            }
        };
    }
    macro_rules! kernel {
        ($t:ty, $bm:literal, $bn:literal) => {
            match d {
                16 => at_dim!($t, $bm, $bn, 16),
                32 => at_dim!($t, $bm, $bn, 32),
                64 => at_dim!($t, $bm, $bn, 64),
                128 => at_dim!($t, $bm, $bn, 128),
                _ => return Ok(None),
            }
        };
    }
    // 128-key tiles only where the plan takes a warp-specialized tile with them (16-bit
    // inputs on Hopper: 128 x 128 at head dim 128, 64 x 128 at 64 without a mask).
    let kernel = match (dtype, plan.block_m, plan.block_n) {
        (DType::F16, 128, 128) => kernel!(f16, 128, 128),
        (DType::BF16, 128, 128) => kernel!(bf16, 128, 128),
        (DType::F16, 64, 128) => kernel!(f16, 64, 128),
        (DType::BF16, 64, 128) => kernel!(bf16, 64, 128),
        (DType::F16, 128, 64) => kernel!(f16, 128, 64),
        (DType::BF16, 128, 64) => kernel!(bf16, 128, 64),
        (DType::F16, 64, 64) => kernel!(f16, 64, 64),
        (DType::BF16, 64, 64) => kernel!(bf16, 64, 64),
        (DType::F32, 128, 64) => kernel!(f32, 128, 64),
        (DType::F32, 64, 64) => kernel!(f32, 64, 64),
        _ => return Ok(None),
    };
    Ok(Some(kernel))
}

/// A recognised attention's launch (see [`attention`](super::attention)): the kernel of its
/// element type and head dimension, q, k and v read through the strides of their views,
/// the output `[B, H, T, D]` row-major, a log-sum-exp scratch of `B H T`; the tiles, warps,
/// stages and warp specialization `attention_forward` takes on the runtime's device
/// (`flash_attention::Options::forward_plan`).
fn attention_step(nodes: &[Node], g: &super::fuse::Group, a: &super::attention::Attention, (lse, args, pack, modifier, scale): (usize, Option<usize>, Option<Pack>, Option<ScoreMod>, f32), rt: &Runtime) -> Result<Step, PlanError> {
    let out = &nodes[a.out.index()];
    let unsupported = |why: String| PlanError::Unsupported(format!("attention {} ({out}): {why}", a.out));
    if g.stores.len() != 1 {
        return Err(unsupported("stored to more than one buffer".into()));
    }
    // [B, H, T, D] strides of a [B, H, T, D] or [B, T, D] operand (one head).
    let bhtd = |(x, root): (super::NodeId, super::NodeId)| -> [isize; 3] {
        let st = strides_through(nodes, x, root);
        if st.len() == 4 { [st[0], st[1], st[2]] } else { [st[0], 0, st[1]] }
    };
    let s = &out.shape;
    let (b, h, t, d) = match s[..] {
        [b, kv, g, t, d] => (b, kv * g, t, d),
        [b, h, t, d] => (b, h, t, d),
        _ => (s[0], 1, s[1], s[2]),
    };
    // Stored as itself ([B, H, T, D] row-major; grouped query heads possibly reshaped to
    // it) or as its `.transpose(1, 2)` ([B, T, H, D]).
    let stored = g.stores[0].0;
    let o = if stored == a.out || matches!(nodes[stored.index()].op, super::Op::View(super::View::Reshape, x) if x == a.out) {
        [(h * t * d) as isize, (t * d) as isize, d as isize]
    } else {
        [(t * h * d) as isize, d as isize, (h * d) as isize]
    };
    let all = [bhtd(a.q), bhtd(a.k), bhtd(a.v), o];
    let mut strides = [0i32; 12];
    for (i, x) in all.iter().flatten().enumerate() {
        strides[i] = i32::try_from(*x).map_err(|_| unsupported(format!("stride {x} exceeds 32 bits")))?;
    }
    if b * h > 65535 || [b * h * t * d, b * h * t].iter().any(|&n| n > i32::MAX as usize) {
        return Err(unsupported("too large for 32-bit offsets or the grid".into()));
    }
    // The kernel without a score modification, or with the sliding window (its argument in
    // `args`; a window skips the key tiles before it), a bias from data (packed into `args`)
    // or a hook, planned as `attention_forward_scored` plans it.
    let shape = crate::flash_attention::Shape { batch: b, seq: t, heads: h, kv_heads: h / a.group, head_dim: d, causal: a.causal, layout: crate::flash_attention::Layout::Bhtd };
    let plan = crate::flash_attention::Options::default().forward_plan(rt, out.dtype, &shape, modifier.is_some());
    let (bm, warps) = (plan.block_m, plan.warps);
    let Some(kernel) = attention_kernel(out.dtype, &plan, d, modifier.as_ref())? else {
        return Err(unsupported(format!("no {} attention kernel built for the plan's {} x {} tile at head dim {d}", out.dtype, plan.block_m, plan.block_n)));
    };
    let launch = Launch::Attention {
        grid: [t.div_ceil(bm) as u32, (b * h) as u32, 1],
        warps,
        stages: if rt.is_gpu() { plan.stages } else { 1 },
        warp_specialize: plan.warp_specialize,
        programs: plan.programs,
        sizes: [t as i32, h as i32, (h / a.group) as i32],
        scale,
        causal: a.causal,
        strides,
        lse,
        args,
        pack,
    };
    Ok(Step { kernel, numel: out.numel(), launch, tuned: None })
}

/// A matrix product's launch: the library kernel of its element type (a generated one,
/// [`codegen::matmul_kernel`], when the group has an epilogue) and its grid and
/// arguments, from the strides its operands are read with (see [`matmul_args`]).
fn matmul_step(name: &str, nodes: &[Node], g: &super::fuse::Group, id: super::NodeId, on_gpu: bool, tune: bool) -> Result<Step, PlanError> {
    let node = &nodes[id.index()];
    let super::Op::Matmul(a, b) = node.op else { unreachable!("a matmul group holds its product") };
    // Operands read through strides from the group's first loads; a computed one (a
    // prologue) as if stored row-major.
    let mut direct = g.loads.iter().map(|l| l.0);
    let mut root = |x: super::NodeId, computed: bool| if computed { Some(x) } else { direct.next() };
    let (ra, rb) = (root(a, g.prologue[0]), root(b, g.prologue[1]));
    let (Some(ra), Some(rb)) = (ra, rb) else { return Err(PlanError::Placement(format!("matrix product {id}: an operand's buffer is not loaded"))) };
    let (batch, args) = matmul_args(nodes, id, [(a, ra), (b, rb)])?;
    let (m, n, k) = (args[0] as usize, args[1] as usize, args[2] as usize);
    let launch = |t: MatmulTile| Launch::Matmul { grid: [(m.div_ceil(t.bm) * n.div_ceil(t.bn)) as u32, batch[0], batch[1]], warps: t.warps, stages: t.stages, args };
    // Three batch dimensions that do not merge: only a generated kernel takes them.
    let batch3 = args[15] > 1;
    let generated = batch3 || g.nodes.len() > 1 || g.stores.len() > 1 || g.prologue.contains(&true);
    // `a` K-contiguous (its K stride, `sak`, 1): what tf32 `wgmma` needs.
    let a_k_major = args[4] == 1;
    let t = if generated { fused_matmul_tile(m, n, k, node.dtype.size(), a_k_major, on_gpu, g.prologue.contains(&true)) } else { matmul_tile(m, n, k, node.dtype.size(), a_k_major, on_gpu) };
    // One kernel per element type; the tile is its constants' values.
    let consts = [t.bm as i64, t.bn as i64, t.bk as i64, 8];
    // With a prologue or an epilogue (or several stores), a kernel of the group's own: the
    // same main loop, tuned with `tune` over the library matmul's space.
    if generated {
        let kernel = |t: MatmulTile| codegen::matmul_kernel(name, nodes, g, id, (t.bm, t.bn, t.bk, 8), batch3);
        let tuned = if tune {
            let key = autotune::Key::new().with("m", m as i64, autotune::Bucket::Exact).with("n", n as i64, autotune::Bucket::Exact).with("k", k as i64, autotune::Bucket::Exact).with("elem", node.dtype.size() as i64, autotune::Bucket::Exact);
            let candidates = matmul_tune_space(t)
                .into_iter()
                .filter(|c| crate::tuned::matmul_tile(c, &key))
                .map(|c| {
                    let t = MatmulTile { bm: c.get("BM") as usize, bn: c.get("BN") as usize, bk: c.get("BK") as usize, warps: c.num_warps, stages: c.num_stages };
                    Ok((c, kernel(t)?, launch(t)))
                })
                .collect::<Result<Vec<_>, PlanError>>()?;
            let tuner = autotune::Autotuner::new(name, autotune::Space::list(candidates.iter().map(|c| c.0.clone()).collect())).tolerance(1e-2);
            Some(Tuned { tuner, candidates, key })
        } else {
            None
        };
        return Ok(Step { kernel: Box::new(kernel(t)?), numel: node.numel(), launch: launch(t), tuned });
    }
    let kernel: Box<dyn Kernel> = match node.dtype {
        DType::F16 => Box::new(crate::__matmul_batched_consts::<f16, f16>::new(consts)),
        DType::BF16 => Box::new(crate::__matmul_batched_consts::<bf16, bf16>::new(consts)),
        _ => Box::new(crate::__matmul_batched_consts::<f32, f32>::new(consts)),
    };
    Ok(Step { kernel, numel: node.numel(), launch: launch(t), tuned: None })
}

/// The tiles a product with an epilogue is tuned over ([`Options::tune`]), `first` first:
/// the library matmul's space (`BM` 64 or 128, `BN` 64 to 256, `BK` 32 or 64, 4 or 8
/// warps, 1, 3 or 4 stages), which `tuned::matmul_tile` prunes by the shape and by shared
/// memory and registers.
pub fn matmul_tune_space(first: MatmulTile) -> Vec<autotune::Config> {
    let cfg = |t: MatmulTile| autotune::Config::new(&[("BM", t.bm as i64), ("BN", t.bn as i64), ("BK", t.bk as i64)], t.warps, t.stages);
    let mut out = vec![cfg(first)];
    for bm in [64, 128] {
        for bn in [64, 128, 256] {
            for bk in [32, 64] {
                for warps in [4, 8] {
                    for stages in [1, 3, 4] {
                        let c = cfg(MatmulTile { bm, bn, bk, warps, stages });
                        if !out.contains(&c) {
                            out.push(c);
                        }
                    }
                }
            }
        }
    }
    out
}

/// The tile, warps and stages of a graph's matrix product.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct MatmulTile {
    pub bm: usize,
    pub bn: usize,
    pub bk: usize,
    pub warps: u32,
    pub stages: u32,
}

/// The tile of an `m x n x k` product of `elem`-byte elements: on a GPU, what `matmul_tuned`
/// picked for such shapes on the H200 (BENCHMARKS.md, matmul sections): 16-bit operands take
/// 128 x 256 x 64 tiles on 8 warps, 3 stages, where that still makes about 100 programs
/// (2048^2 and up), 64 x 128 x 64 on 4 warps, 4 stages where those do (1024^2), 64 x 64 x 64
/// otherwise (small or thin products); f32 (tf32, on sm_90a `wgmma` with `bᵀ` in
/// registers) 128 x 128 x 32 on 4 warps, 3 stages (two programs an SM: 0.92 of cuBLAS at
/// 4096³ on the H100, BENCHMARKS.md "tf32 on wgmma"), 128 x 64 x 32 or 64 x 64 x 32 where
/// those make too few programs; where `a` is not K-contiguous (`a_k_major` false: a
/// transposed view, a backward's `xᵀ dy`), which tf32 `wgmma` cannot read, those two on
/// `mma.sync`, where more accumulators a thread spill. On the interpreter 64 x 64 x 32,
/// whose programs run fastest there. Not tuned per shape: a plan's products are launched,
/// not timed.
pub fn matmul_tile(m: usize, n: usize, k: usize, elem: usize, a_k_major: bool, on_gpu: bool) -> MatmulTile {
    let programs = |bm: usize, bn: usize| m.div_ceil(bm) * n.div_ceil(bn);
    let tile = |bm, bn, bk, warps, stages| MatmulTile { bm, bn, bk, warps, stages };
    if !on_gpu {
        return tile(64, 64, 32, 4, 1);
    }
    if elem == 4 {
        return if programs(128, 128) >= 100 && a_k_major {
            tile(128, 128, 32, 4, 3)
        } else if programs(128, 64) >= 100 {
            tile(128, 64, 32, 4, 3)
        } else {
            tile(64, 64, 32, 4, 3)
        };
    }
    let bk = if k >= 64 { 64 } else { 32 };
    if programs(128, 256) >= 100 {
        tile(128, 256, bk, 8, 3)
    } else if programs(64, 128) >= 100 {
        tile(64, 128, bk, 4, 4)
    } else {
        tile(64, 64, bk, 4, 4)
    }
}

/// The tile of an `m x n x k` product of `elem`-byte elements in a kernel of its own
/// ([`codegen::matmul_kernel`]: with an epilogue, or a `prologue`): on a GPU, 16-bit
/// operands take 64 x 128 tiles (64 x 64 where `n` is at most 64; several programs an SM,
/// so that one's epilogue may overlap others' main loops): `BK` 32 on 4 warps, 4 stages, with an
/// epilogue alone; `BK` 64 on 8 warps, 3 stages, with a prologue (its operand computed in
/// registers). What the tuner picked on the H100 for `silu(x w + b) + r` at 8192 x 4096 x
/// 1024 and 4096 x 512 x 512 (BENCHMARKS.md, "Matrix products in graphs"). Otherwise
/// [`matmul_tile`]'s (f32, the interpreter).
pub fn fused_matmul_tile(m: usize, n: usize, k: usize, elem: usize, a_k_major: bool, on_gpu: bool, prologue: bool) -> MatmulTile {
    if !on_gpu || elem != 2 {
        return matmul_tile(m, n, k, elem, a_k_major, on_gpu);
    }
    let bn = if n <= 64 { 64 } else { 128 };
    let bk = if k <= 32 { 32 } else if prologue { 64 } else { 32 };
    if prologue {
        MatmulTile { bm: 64, bn, bk, warps: 8, stages: 3 }
    } else {
        MatmulTile { bm: 64, bn, bk, warps: 4, stages: 4 }
    }
}

/// The batch grid axes (1 and 2) and integer arguments of `matmul_batched` for product `id`, its operands
/// `(node, root)` read from the root's buffer (row-major) through the permutations and
/// expansions between them: each operand's strides are the root's, permuted, 0 where
/// expanded. The batch dimensions (broadcast against each other, 0 strides where an
/// operand has size 1 or lacks the dimension) are merged where every operand's strides
/// allow, and must come to at most three (grid axis 1, and axis 2 holding the last two:
/// `nw` of the third a second's, which only a generated kernel takes,
/// [`codegen::matmul_kernel`]; `nw` is 1 for two).
fn matmul_args(nodes: &[Node], id: super::NodeId, ops: [(super::NodeId, super::NodeId); 2]) -> Result<([u32; 2], [i32; 19]), PlanError> {
    let unsupported = |why: String| PlanError::Unsupported(format!("matrix product {id} ({}): {why}", nodes[id.index()]));
    let out = &nodes[id.index()].shape;
    let r = out.len();
    let (m, n) = (out[r - 2], out[r - 1]);
    let k = nodes[ops[0].0.index()].shape.last().copied().unwrap_or(1);
    // Strides of each operand, aligned with the output's dimensions (batch dims right-
    // aligned; the last two are the matrix's).
    let mut strides: Vec<Vec<isize>> = vec![];
    for (x, root) in ops {
        let st = strides_through(nodes, x, root);
        let xs = &nodes[x.index()].shape;
        let mut full = vec![0isize; r];
        let off = r - xs.len();
        for (j, (&d, &s)) in xs.iter().zip(&st).enumerate() {
            full[j + off] = if d == 1 && j + 2 < xs.len() { 0 } else { s };
        }
        strides.push(full);
    }
    strides.push(row_major(out)); // c
    // Batch dimensions of size > 1, merged where every operand's strides nest.
    let mut dims: Vec<(usize, [isize; 3])> = vec![];
    for j in 0..r - 2 {
        if out[j] == 1 {
            continue;
        }
        let s = [strides[0][j], strides[1][j], strides[2][j]];
        match dims.last_mut() {
            Some((size, prev)) if (0..3).all(|o| prev[o] == s[o] * out[j] as isize) => {
                *size *= out[j];
                *prev = s;
            }
            _ => dims.push((out[j], s)),
        }
    }
    if dims.len() > 3 {
        return Err(unsupported(format!("{} batch dimensions that do not merge; at most 3", dims.len())));
    }
    while dims.len() < 3 {
        dims.push((1, [0; 3]));
    }
    let i = |x: isize| i32::try_from(x).map_err(|_| unsupported(format!("stride {x} exceeds 32 bits")));
    let (sa, sb, scm) = (&strides[0], &strides[1], &strides[2]);
    let args = [
        i(m as isize)?, i(n as isize)?, i(k as isize)?,
        i(sa[r - 2])?, i(sa[r - 1])?, i(sb[r - 2])?, i(sb[r - 1])?, i(scm[r - 2])?, i(scm[r - 1])?,
        i(dims[0].1[0])?, i(dims[1].1[0])?, i(dims[0].1[1])?, i(dims[1].1[1])?, i(dims[0].1[2])?, i(dims[1].1[2])?,
        i(dims[2].0 as isize)?, i(dims[2].1[0])?, i(dims[2].1[1])?, i(dims[2].1[2])?,
    ];
    if dims[0].0 > 65535 || dims[1].0 * dims[2].0 > 65535 {
        return Err(unsupported("a batch dimension of more than 65535 products".into()));
    }
    Ok(([dims[0].0 as u32, (dims[1].0 * dims[2].0) as u32], args))
}

/// The element strides of a row-major buffer of `shape`.
fn row_major(shape: &[usize]) -> Vec<isize> {
    let mut st = vec![0isize; shape.len()];
    let mut acc = 1isize;
    for j in (0..shape.len()).rev() {
        st[j] = acc;
        acc *= shape[j] as isize;
    }
    st
}

/// The element strides with which `x` reads `root`'s buffer (row-major over `root`'s
/// shape), through the permutations and expansions from `root` to `x`.
pub(super) fn strides_through(nodes: &[Node], x: super::NodeId, root: super::NodeId) -> Vec<isize> {
    if x == root {
        return row_major(&nodes[x.index()].shape);
    }
    let node = &nodes[x.index()];
    let super::Op::View(v, y) = node.op else { unreachable!("strided_root walks views only") };
    if v == super::View::Reshape {
        // Right above the stored (row-major) value: this shape's row-major strides.
        return row_major(&node.shape);
    }
    let below = strides_through(nodes, y, root);
    let from = &nodes[y.index()].shape;
    match v {
        super::View::Permute(p) => p.perm().iter().map(|&k| below[k as usize]).collect(),
        super::View::Expand => {
            let off = node.shape.len() - from.len();
            (0..node.shape.len()).map(|j| if j < off || from[j - off] == 1 { 0 } else { below[j - off] }).collect()
        }
        _ => unreachable!("strided_root walks permutations and expansions only"),
    }
}

/// The buffers of a partition's intermediates, allocated once per plan and shared by
/// liveness: an intermediate is live from the group that stores it to the last group that
/// loads it (groups run in order, on one stream), and takes the buffer of an earlier one of
/// its element type and length whose last reader ran before its producer (exact lengths:
/// library kernels such as attention's check them), else a new buffer. Returns each
/// buffer's element type and length (at least 1: no zero-byte device allocations) and each
/// intermediate's buffer.
pub(crate) fn share_buffers(partition: &Partition, nodes: &[Node]) -> (Vec<(DType, usize)>, Vec<usize>) {
    let n = partition.intermediates.len();
    let (mut first, mut last) = (vec![usize::MAX; n], vec![0usize; n]);
    for (gi, g) in partition.groups.iter().enumerate() {
        for (_, d) in &g.stores {
            if let Dest::Intermediate(k) = *d {
                first[k] = first[k].min(gi);
                last[k] = last[k].max(gi);
            }
        }
        for (_, s) in &g.loads {
            if let Source::Intermediate(k) = *s {
                last[k] = last[k].max(gi);
            }
        }
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&k| first[k]);
    // Per buffer: element type (as stored), length, the last group that uses it.
    let mut buffers: Vec<(DType, usize, usize)> = vec![];
    let mut buffer_of = vec![0; n];
    for k in order {
        let node = &nodes[partition.intermediates[k].index()];
        let (dtype, len) = (codegen::storage(node.dtype), node.numel().max(1));
        let free = buffers.iter().position(|&(d, l, busy)| d == dtype && l == len && first[k] != usize::MAX && busy < first[k]);
        let b = free.unwrap_or_else(|| {
            buffers.push((dtype, len, 0));
            buffers.len() - 1
        });
        buffers[b].2 = last[k].max(if first[k] == usize::MAX { 0 } else { first[k] });
        buffer_of[k] = b;
    }
    (buffers.into_iter().map(|(d, l, _)| (d, l)).collect(), buffer_of)
}

/// A compiled graph: one kernel per fusion group. See the [module docs](self).
pub struct Plan {
    partition: Partition,
    steps: Vec<Step>,
    /// Per input and output: name, element type, shape.
    inputs: Vec<(String, DType, Vec<usize>)>,
    outputs: Vec<(String, DType, Vec<usize>)>,
    /// The buffers of the intermediates, shared by liveness ([`share_buffers`]), and which
    /// one each intermediate of the partition uses.
    buffers: Vec<Owned>,
    buffer_of: Vec<usize>,
    /// Buffers kernels need beside the graph's values (attention's log-sum-exp).
    scratch: Vec<Owned>,
    on_gpu: bool,
    /// The last run recorded as a CUDA graph by [`Plan::run_graph`], with the runtime
    /// that recorded it and the addresses of the inputs and outputs it was recorded on.
    captured: Option<(u64, Vec<u64>, CapturedGraph)>,
}

impl Plan {
    pub(super) fn new(graph: &Graph, rt: &Runtime, options: &Options) -> Result<Plan, PlanError> {
        if let Some(e) = graph.first_error() {
            return Err(e.into());
        }
        let partition = fuse::partition(graph, options.fusion)?;
        let nodes: Vec<Node> = graph.nodes();
        let max_block = options.block.next_power_of_two().max(32);
        let mut steps = vec![];
        let mut scratch = vec![];
        // Each attention's log-sum-exp scratch, by its output node (a backward may read it).
        let mut lse_of: std::collections::HashMap<super::NodeId, usize> = std::collections::HashMap::new();
        for (i, g) in partition.groups.iter().enumerate() {
            if let Some(a) = &g.attention_grad {
                // With a fifth load (before the tensor of a mask or bias from data), the
                // forward's output (its transpose): its log-sum-exp too.
                let saved = match g.loads.get(4).filter(|_| g.loads.len() > 4 + usize::from(a.data.is_some())).map(|l| nodes[l.0.index()].op) {
                    None => None,
                    Some(super::Op::View(_, out)) => Some(*lse_of.get(&out).ok_or_else(|| PlanError::Placement(format!("attention gradient of {}: its forward is not computed before it", a.q)))?),
                    Some(_) => return Err(PlanError::Placement(format!("attention gradient of {}: a fifth load that is not the forward's output", a.q))),
                };
                steps.push(attention_grad_step(&nodes, g, a, saved, &mut scratch, rt)?);
                continue;
            }
            if let Some(a) = &g.attention {
                let s = &nodes[a.out.index()].shape;
                scratch.push(Owned::new(rt, DType::F32, s[..s.len() - 1].iter().product::<usize>().max(1))?);
                let lse = scratch.len() - 1;
                lse_of.insert(a.out, lse);
                let (b, h, t) = (s[0], s[1..s.len() - 2].iter().product(), s[s.len() - 2]);
                // A mask or bias from data: packed into a buffer of the extents it has.
                let pack = a.data.map(|d| Pack::new(&nodes, &d, (b, h, t, s.len()), a.window)).transpose()?;
                let (modifier, scale) = ScoreMod::of(&nodes, (a.softcap(), a.window, a.score_ops, a.scale()), pack.as_ref())?;
                let args = modifier.as_ref().map(|m| m.buffer(rt, &mut scratch, pack.as_ref().map_or(0, |p| p.len))).transpose()?;
                steps.push(attention_step(&nodes, g, a, (lse, args, pack, modifier, scale), rt)?);
                continue;
            }
            if let Some(id) = g.matmul {
                steps.push(matmul_step(&format!("graph_k{i}"), &nodes, g, id, rt.is_gpu(), options.tune)?);
                continue;
            }
            let numel = g.numel();
            let (block, rows, programs, warps) = match g.row {
                // Longer rows: one a program, looping over chunks of a quarter of the longest
                // row held, a warp per 512 elements of a chunk.
                Some(r) if r > options.max_row => {
                    let block = (options.max_row / 4).next_power_of_two().max(32);
                    let nrows = numel / r;
                    (block, 1, nrows, (block / 512).clamp(1, 8) as u32)
                }
                // Rows of up to 1024 lanes share a program (8 rows at most), so short rows
                // keep its threads busy; a warp per 512 elements, 8 at most.
                Some(r) => {
                    let block = r.next_power_of_two().max(32);
                    let nrows = numel / r.max(1);
                    let rows = (1024 / block).clamp(1, 8).min(nrows.max(1).next_power_of_two());
                    (block, rows, nrows.div_ceil(rows), (rows * block / 512).clamp(1, 8) as u32)
                }
                None => {
                    let block = numel.next_power_of_two().clamp(32, max_block);
                    (block, 1, numel.div_ceil(block), options.num_warps)
                }
            };
            let name = format!("graph_k{i}");
            let kernel = codegen::kernel(&name, &nodes, g, block, rows)?;
            let tuned = match g.row {
                Some(r) if r > options.max_row => None,
                _ if !options.tune => None,
                row => {
                    let nrows = row.map_or(1, |r| numel / r.max(1));
                    let candidates = tune_space(numel, row, (block, rows, warps))
                        .into_iter()
                        .map(|c| {
                            let (b, k) = (c.get("BLOCK") as usize, c.get("ROWS") as usize);
                            let programs = if row.is_some() { nrows.div_ceil(k) } else { numel.div_ceil(b) };
                            let launch = Launch::Generated { programs, warps: c.num_warps };
                            Ok((c.clone(), codegen::kernel(&name, &nodes, g, b, k)?, launch))
                        })
                        .collect::<Result<Vec<_>, PlanError>>()?;
                    let tuner = autotune::Autotuner::new(&name, autotune::Space::list(candidates.iter().map(|c| c.0.clone()).collect()));
                    Some(Tuned { tuner, candidates, key: autotune::Key::new().with("numel", numel as i64, autotune::Bucket::Exact) })
                }
            };
            steps.push(Step { kernel: Box::new(kernel), numel, launch: Launch::Generated { programs, warps }, tuned });
        }
        // At least one element each: no zero-byte device allocations (a group of no
        // elements is never launched).
        let (sizes, buffer_of) = share_buffers(&partition, &nodes);
        let buffers = sizes.into_iter().map(|(dtype, len)| Owned::new(rt, dtype, len)).collect::<Result<_, _>>()?;
        let sig = |(name, id): (String, super::NodeId)| {
            let n = &nodes[id.index()];
            (name, n.dtype, n.shape.clone())
        };
        Ok(Plan {
            inputs: graph.inputs().into_iter().map(sig).collect(),
            outputs: graph.outputs().into_iter().map(sig).collect(),
            partition,
            steps,
            buffers,
            buffer_of,
            scratch,
            on_gpu: rt.is_gpu(),
            captured: None,
        })
    }

    /// The device (or host) memory the plan holds for intermediates: the number of
    /// buffers and their bytes (intermediates share buffers by liveness).
    pub fn intermediate_memory(&self) -> (usize, usize) {
        (self.buffers.len(), self.buffers.iter().map(Owned::bytes).sum())
    }

    /// All the memory the plan holds, in bytes: its intermediates and the scratch buffers
    /// of library kernels (attention's log-sum-exp; a gradient's recomputed output, row
    /// sums and unstored gradients). Allocated once, when the plan is made.
    pub fn memory(&self) -> usize {
        self.buffers.iter().chain(&self.scratch).map(Owned::bytes).sum()
    }

    /// The number of kernels a run launches (at most; groups of no elements are skipped).
    pub fn kernel_count(&self) -> usize {
        self.steps.len()
    }

    /// The fusion pass's decisions: what each kernel loads, computes and stores.
    pub fn partition(&self) -> &Partition {
        &self.partition
    }

    /// The kernels, in launch order (generated ones, and the library's matmul for
    /// matrix products).
    pub fn kernels(&self) -> impl Iterator<Item = &dyn Kernel> {
        self.steps.iter().map(|s| &*s.kernel)
    }

    /// With [`Options::tune`]: the tuning sessions of the plan's kernels so far (kernel
    /// index, the session: every candidate's outcome and the winner), in launch order.
    pub fn tune_sessions(&self) -> Vec<(usize, autotune::tuner::Session)> {
        self.steps.iter().enumerate().flat_map(|(i, s)| s.tuned.iter().flat_map(move |t| t.tuner.sessions().into_iter().map(move |x| (i, x)))).collect()
    }

    /// The block IR of kernel `i` (unspecialized), as the printer writes it.
    pub fn ir(&self, i: usize) -> Result<String, PlanError> {
        let k = &*self.steps.get(i).ok_or(PlanError::NoKernel { index: i, count: self.steps.len() })?.kernel;
        let f = build_ir(k, &vec![ParamSpec::default(); k.meta().params.len()])?;
        Ok(printer::print(&f, false))
    }

    /// Run the plan on `rt` (the runtime it was compiled for): read `inputs` (in the order
    /// of [`Graph::input`]), write `outputs` (in the order of [`Graph::output`]). Launches
    /// are asynchronous on a GPU, as kernel launches are.
    pub fn run(&mut self, rt: &Runtime, inputs: &[TensorRef<'_>], outputs: &mut [TensorMut<'_>]) -> Result<(), PlanError> {
        self.check(rt, inputs, outputs)?;
        self.launch(rt, inputs, outputs)
    }

    /// [`run`](Self::run) through a CUDA graph: the plan's launches replayed with one
    /// driver call, so a run costs the host about one launch however many kernels the plan
    /// has. The first call, and any call on other buffers than the call before it, runs
    /// the plan as `run` does and records its launches on these buffers into a graph
    /// (nothing runs twice); the calls after it with the same buffers replay the graph.
    /// The buffers are checked as `run` checks them on every call. On the interpreter it
    /// is `run`.
    ///
    /// The graph holds the buffers' addresses: a replay reads the inputs' contents as they
    /// are at the replay (as a launch does), so write new inputs into the same buffers
    /// between runs, as with `torch.compile(mode="reduce-overhead")`.
    pub fn run_graph(&mut self, rt: &Runtime, inputs: &[TensorRef<'_>], outputs: &mut [TensorMut<'_>]) -> Result<(), PlanError> {
        self.check(rt, inputs, outputs)?;
        let Runtime::Cuda(cuda) = rt else { return self.launch(rt, inputs, outputs) };
        let buffers: Vec<u64> = inputs.iter().map(TensorRef::address).chain(outputs.iter().map(TensorMut::address)).collect();
        if let Some((by, at, graph)) = &self.captured {
            if *by == cuda.id() && *at == buffers {
                // SAFETY: the graph's launches use the plan's own buffers (intermediates,
                // scratch: alive with the plan, never reallocated) and the inputs and
                // outputs at these addresses, which are the buffers given to this call,
                // checked above to have the element types and lengths recorded (`check`),
                // borrowed (outputs exclusively) until it returns, as a launch's are.
                return Ok(unsafe { graph.replay() }?);
            }
        }
        // Run (which loads every kernel; a capture may not load modules), then record.
        self.captured = None;
        self.launch(rt, inputs, outputs)?;
        let mut recorded = Ok(());
        let graph = cuda.capture(|| {
            recorded = self.launch(rt, inputs, outputs);
            Ok(())
        })?;
        recorded?;
        self.captured = Some((cuda.id(), buffers, graph));
        Ok(())
    }

    /// Check that the buffers fit the graph's inputs and outputs and the runtime.
    fn check(&self, rt: &Runtime, inputs: &[TensorRef<'_>], outputs: &[TensorMut<'_>]) -> Result<(), PlanError> {
        if rt.is_gpu() != self.on_gpu {
            let at = |gpu| if gpu { "a CUDA device" } else { "the interpreter" };
            return Err(PlanError::Placement(format!("the plan was compiled for {}, run on {}", at(self.on_gpu), at(rt.is_gpu()))));
        }
        check("input", &self.inputs, inputs.iter().map(|t| t.describe()), self.on_gpu)?;
        check("output", &self.outputs, outputs.iter().map(|t| t.describe()), self.on_gpu)
    }

    /// Launch the plan's kernels on checked buffers.
    fn launch(&mut self, rt: &Runtime, inputs: &[TensorRef<'_>], outputs: &mut [TensorMut<'_>]) -> Result<(), PlanError> {
        let mut scratch: Vec<Option<&mut Owned>> = self.scratch.iter_mut().map(Some).collect();
        for (step, group) in self.steps.iter().zip(&self.partition.groups) {
            if step.numel == 0 {
                continue;
            }
            // Written buffers first (each `&mut` taken once), then the ones read.
            let mut outs: Vec<Option<&mut TensorMut<'_>>> = outputs.iter_mut().map(Some).collect();
            let mut inter: Vec<Option<&mut Owned>> = self.buffers.iter_mut().map(Some).collect();
            let buffer_of = &self.buffer_of;
            let mut written = vec![];
            for (_, d) in &group.stores {
                let t = match *d {
                    Dest::Output(k) => outs[k].take().map(|t| t.reborrow()),
                    Dest::Intermediate(k) => inter[buffer_of[k]].take().map(|b| b.as_mut()),
                };
                written.push(t.ok_or_else(|| PlanError::Placement("a buffer is written twice by one kernel".into()))?);
            }
            // The buffers read, in load order.
            let reads = group
                .loads
                .iter()
                .map(|(_, s)| match *s {
                    Source::Input(k) => Ok(inputs[k]),
                    Source::Intermediate(k) => inter[buffer_of[k]].as_deref().map(Owned::as_ref).ok_or_else(|| PlanError::Placement("a kernel reads a buffer it writes".into())),
                })
                .collect::<Result<Vec<TensorRef<'_>>, _>>()?;
            // The tensor a mask or bias from data is read from: an attention's last load.
            let mut reads = reads;
            let data = match &step.launch {
                Launch::Attention { pack: Some(_), .. } | Launch::AttentionGrad { pack: Some(_), .. } => reads.pop(),
                _ => None,
            };
            if let Launch::AttentionGrad { shape, scale, stored, o, lse, delta, spare, args, pack } = &step.launch {
                // q, k, v, dout, and the forward's output when it is reused.
                let mut it = reads.into_iter();
                let four: Vec<TensorRef<'_>> = it.by_ref().take(4).collect();
                let saved_o = it.next();
                let reads: [TensorRef<'_>; 4] = four.try_into().map_err(|_| PlanError::Placement("an attention gradient reads four buffers".into()))?;
                let mut written: Vec<Option<TensorMut<'_>>> = written.into_iter().map(Some).collect();
                let mut spares: Vec<Option<&mut Owned>> = std::mem::take(&mut scratch);
                let mut take = |i: usize| spares[i].take().ok_or_else(|| PlanError::Placement("a scratch buffer used twice".into()));
                let mut grads = vec![];
                for w in 0..3u8 {
                    grads.push(match (stored.iter().position(|&x| x == w), spare[w as usize]) {
                        (Some(p), _) => written[p].take().ok_or_else(|| PlanError::Placement("a gradient stored twice".into()))?,
                        (None, Some(i)) => take(i)?.as_mut(),
                        (None, None) => return Err(PlanError::Placement("an attention gradient with no buffer".into())),
                    });
                }
                let grads: [TensorMut<'_>; 3] = grads.try_into().map_err(|_| PlanError::Placement("three gradients".into()))?;
                let forward = match (o, saved_o) {
                    (Some(i), _) => Forward::Recompute(take(*i)?.as_mut()),
                    (None, Some(o)) => Forward::Saved(o),
                    (None, None) => return Err(PlanError::Placement("an attention gradient without its forward's output".into())),
                };
                let (Owned::F32(l), Owned::F32(d)) = (take(*lse)?, take(*delta)?) else { unreachable!("the row buffers are f32") };
                let modifier = match args.as_ref().map(|(m, i)| take(*i).map(|b| (m, b))).transpose()? {
                    Some((m, Owned::F32(c))) => {
                        if let (Some(p), Some(x)) = (pack, data) {
                            p.run(rt, x, c)?;
                        }
                        Some((m, &*c))
                    }
                    Some(_) => unreachable!("a score modification's scratch is f32"),
                    None => None,
                };
                attention_grad_run(rt, (shape, *scale, modifier), reads, grads, forward, l, d)?;
                scratch = spares;
                continue;
            }
            if let Some(t) = &step.tuned {
                let find = |cfg: &autotune::Config| t.candidates.iter().find(|c| c.0 == *cfg);
                t.tuner
                    .launch(
                        rt,
                        &t.key,
                        &mut Written(&mut written),
                        &|cfg| find(cfg).map(|c| Box::new(c.1.clone()) as Box<dyn Kernel>),
                        &mut |cfg, w| find(cfg).map(|(_, k, l)| launch_simple(rt, k, l, &reads, w.0, step.numel)),
                    )
                    .map_err(|e| PlanError::Tune(e.to_string()))?;
                continue;
            }
            if let Launch::Generated { .. } | Launch::Matmul { .. } = step.launch {
                launch_simple(rt, &*step.kernel, &step.launch, &reads, &mut written, step.numel)?;
                continue;
            }
            let args = bind(rt, &reads, &mut written);
            match &step.launch {
                Launch::Generated { .. } | Launch::Matmul { .. } => unreachable!("launched above"),
                Launch::Attention { grid, warps, stages, warp_specialize, programs, sizes, scale, causal, strides, lse, args: mod_args, pack } => {
                    // (The log-sum-exp goes back to the scratch list after the launch: a
                    // backward of the same attention may read it.)
                    let Some(entry) = scratch[*lse].take() else { unreachable!("attention's scratch, used once before") };
                    let Owned::F32(l) = &mut *entry else { unreachable!("attention's scratch is f32") };
                    let cfg = LaunchConfig::grid3(grid[0], grid[1], grid[2]).warps(*warps).stages(*stages).warp_specialize(*warp_specialize).min_programs_per_sm(*programs);
                    let args = args.output(&mut *l);
                    let args = match mod_args.map(|i| scratch[i].take()) {
                        Some(Some(Owned::F32(c))) => {
                            if let (Some(p), Some(x)) = (pack, data) {
                                p.run(rt, x, c)?;
                            }
                            args.input(&*c)
                        }
                        Some(_) => unreachable!("a score modification's scratch is f32, used once"),
                        None => args.host_input::<f32>(&[]),
                    };
                    let args = args.scalar(sizes[0]).scalar(sizes[1]).scalar(sizes[2]).scalar(*scale).scalar(i32::from(*causal));
                    strides.iter().fold(args, |a, &x| a.scalar(x)).launch(&*step.kernel, cfg)?;
                    scratch[*lse] = Some(entry);
                }
                Launch::AttentionGrad { .. } => unreachable!("run above"),
            }
        }
        Ok(())
    }
}

/// Check buffers against the graph's inputs or outputs.
fn check(what: &'static str, want: &[(String, DType, Vec<usize>)], got: impl ExactSizeIterator<Item = (DType, usize, bool)>, on_gpu: bool) -> Result<(), PlanError> {
    if got.len() != want.len() {
        return Err(PlanError::Count { what, expected: want.len(), got: got.len() });
    }
    for ((name, dtype, shape), (d, len, host)) in want.iter().zip(got) {
        let numel = shape.iter().product();
        if d != *dtype {
            return Err(PlanError::DType { what, name: name.clone(), expected: *dtype, got: d, shape: shape.clone() });
        }
        if len != numel {
            return Err(PlanError::Len { what, name: name.clone(), expected: numel, got: len, shape: shape.clone() });
        }
        if host == on_gpu {
            let (is, runs) = if host { ("host memory", "a CUDA device") } else { ("device memory", "the interpreter") };
            return Err(PlanError::Placement(format!("{what} `{name}` is in {is}, but the plan runs on {runs}")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flash_attention::{ForwardPlan, Gpu, Layout, Options, Shape};
    use dsl_runtime::emit::Target;

    /// The fuser's attention runs the tile the library's forward plan gives (it once ran a
    /// 64 x 64 kernel for the 64 x 128 plan): for every plan the planner makes on Hopper, an
    /// sm_80 GPU and the interpreter, over element types, head dims, masks, score
    /// modifications and shapes both sparse and busy in 128-row tiles, the kernel's query
    /// tile, key tile and head dim are the plan's; a tile or head dim with no kernel is `None`.
    #[test]
    fn attention_kernels_are_the_plans_tiles() {
        let (sm90, sm80) = (Target::SM90, Target::SM80);
        let gpus = [Gpu { target: Some(&sm90), sms: Some(132) }, Gpu { target: Some(&sm80), sms: Some(108) }, Gpu { target: None, sms: None }];
        let mut tiles = std::collections::BTreeSet::new();
        for gpu in gpus {
            for dtype in [DType::BF16, DType::F16, DType::F32] {
                for d in [16, 32, 64, 128] {
                    for (batch, seq) in [(1, 256), (4, 1024), (64, 4096)] {
                        for causal in [false, true] {
                            for modifier in [None, Some(ScoreMod::Data)] {
                                let s = Shape { batch, seq, heads: 8, kv_heads: 4, head_dim: d, causal, layout: Layout::Bhtd };
                                let plan = Options::default().plan_on(gpu, dtype, &s, modifier.is_some());
                                let k = attention_kernel(dtype, &plan, d, modifier.as_ref()).unwrap().unwrap_or_else(|| panic!("{dtype} d {d}: no kernel for {plan:?}"));
                                let c: std::collections::HashMap<_, _> = k.constants().into_iter().collect();
                                let want = [("BM", plan.block_m), ("BN", plan.block_n), ("D", d)].map(|(n, v)| (n, v.to_string()));
                                assert!(want.iter().all(|(n, v)| c.get(n) == Some(v)), "{dtype} d {d} {s:?}: kernel {c:?} for {plan:?}");
                                tiles.insert((plan.block_m, plan.block_n));
                            }
                        }
                    }
                }
            }
        }
        // (The sweep reaches the 128-key tiles the fuser once ran as 64 x 64.)
        assert!(tiles.contains(&(64, 128)) && tiles.contains(&(128, 128)) && tiles.contains(&(64, 64)), "{tiles:?}");
        let plan = ForwardPlan { block_m: 32, block_n: 64, warps: 2, stages: 1, warp_specialize: false, programs: 1 };
        assert!(attention_kernel(DType::BF16, &plan, 64, None).unwrap().is_none(), "a 32-row tile has no kernel");
        let plan = ForwardPlan { block_m: 64, ..plan };
        assert!(attention_kernel(DType::BF16, &plan, 64, None).unwrap().is_some());
        assert!(attention_kernel(DType::BF16, &plan, 80, None).unwrap().is_none(), "head dim 80 has no kernel");
    }
}
