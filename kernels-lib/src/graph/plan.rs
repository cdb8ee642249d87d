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
use dsl_runtime::{Buffer, DType, IrKernel, LaunchArgs, LaunchConfig, Runtime};

/// How to compile a graph.
#[derive(Clone, Debug)]
pub struct Options {
    /// Fuse ([`Fusion::On`], the default) or run one kernel per node.
    pub fusion: Fusion,
    /// Elements per program, at most (a power of two); small groups take the next power
    /// of two of their size, at least 32.
    pub block: usize,
    pub num_warps: u32,
}

impl Default for Options {
    fn default() -> Options {
        Options { fusion: Fusion::On, block: 1024, num_warps: 4 }
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
    /// A reduction over rows longer than one program holds.
    #[error("a reduction over rows of {row} elements (shape {shape:?}): rows of at most {max} elements are supported yet")]
    RowTooLong { row: usize, shape: Vec<usize>, max: usize },
}

/// A buffer a plan reads.
#[derive(Clone, Copy)]
pub enum TensorRef<'a> {
    F32(&'a Buffer<f32>),
    F16(&'a Buffer<f16>),
    BF16(&'a Buffer<bf16>),
    /// Masks, one byte (0 or 1) an element: how intermediates of comparisons are stored.
    U8(&'a Buffer<u8>),
}

/// A buffer a plan writes.
pub enum TensorMut<'a> {
    F32(&'a mut Buffer<f32>),
    F16(&'a mut Buffer<f16>),
    BF16(&'a mut Buffer<bf16>),
    /// Masks, one byte (0 or 1) an element.
    U8(&'a mut Buffer<u8>),
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

/// (element type, length, on the host)
fn describe<T: dsl_runtime::Element>(b: &Buffer<T>) -> (DType, usize, bool) {
    (T::DTYPE, b.len(), matches!(b, Buffer::Host(_)))
}

impl TensorRef<'_> {
    fn describe(&self) -> (DType, usize, bool) {
        match self {
            TensorRef::F32(b) => describe(*b),
            TensorRef::F16(b) => describe(*b),
            TensorRef::BF16(b) => describe(*b),
            TensorRef::U8(b) => describe(*b),
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
        }
    }
    fn reborrow(&mut self) -> TensorMut<'_> {
        match self {
            TensorMut::F32(b) => TensorMut::F32(b),
            TensorMut::F16(b) => TensorMut::F16(b),
            TensorMut::BF16(b) => TensorMut::BF16(b),
            TensorMut::U8(b) => TensorMut::U8(b),
        }
    }
}

/// An intermediate buffer the plan owns.
enum Owned {
    F32(Buffer<f32>),
    F16(Buffer<f16>),
    BF16(Buffer<bf16>),
    U8(Buffer<u8>),
}

impl Owned {
    fn new(rt: &Runtime, dtype: DType, len: usize) -> Result<Owned, PlanError> {
        Ok(match dtype {
            DType::F16 => Owned::F16(rt.zeros(len)?),
            DType::BF16 => Owned::BF16(rt.zeros(len)?),
            DType::Bool | DType::U8 => Owned::U8(rt.zeros(len)?),
            _ => Owned::F32(rt.zeros(len)?),
        })
    }
    fn as_ref(&self) -> TensorRef<'_> {
        match self {
            Owned::F32(b) => TensorRef::F32(b),
            Owned::F16(b) => TensorRef::F16(b),
            Owned::BF16(b) => TensorRef::BF16(b),
            Owned::U8(b) => TensorRef::U8(b),
        }
    }
    fn as_mut(&mut self) -> TensorMut<'_> {
        match self {
            Owned::F32(b) => TensorMut::F32(b),
            Owned::F16(b) => TensorMut::F16(b),
            Owned::BF16(b) => TensorMut::BF16(b),
            Owned::U8(b) => TensorMut::U8(b),
        }
    }
}

/// One group's kernel and its launch.
struct Step {
    kernel: IrKernel,
    numel: usize,
    programs: usize,
    warps: u32,
}

/// A compiled graph: one kernel per fusion group. See the [module docs](self).
pub struct Plan {
    partition: Partition,
    steps: Vec<Step>,
    /// Per input and output: name, element type, shape.
    inputs: Vec<(String, DType, Vec<usize>)>,
    outputs: Vec<(String, DType, Vec<usize>)>,
    intermediates: Vec<Owned>,
    on_gpu: bool,
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
        for (i, g) in partition.groups.iter().enumerate() {
            let numel = g.numel();
            let (block, rows, programs, warps) = match g.row {
                // A row a program: the whole row in one block, a warp per 256 elements.
                Some(r) if r > codegen::MAX_ROW => return Err(PlanError::RowTooLong { row: r, shape: g.shape.clone(), max: codegen::MAX_ROW }),
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
            let kernel = codegen::kernel(&format!("graph_k{i}"), &nodes, g, block, rows)?;
            steps.push(Step { kernel, numel, programs, warps });
        }
        // At least one element each: no zero-byte device allocations (a group of no
        // elements is never launched).
        let intermediates = partition.intermediates.iter().map(|id| Owned::new(rt, nodes[id.index()].dtype, nodes[id.index()].numel().max(1))).collect::<Result<_, _>>()?;
        let sig = |(name, id): (String, super::NodeId)| {
            let n = &nodes[id.index()];
            (name, n.dtype, n.shape.clone())
        };
        Ok(Plan {
            inputs: graph.inputs().into_iter().map(sig).collect(),
            outputs: graph.outputs().into_iter().map(sig).collect(),
            partition,
            steps,
            intermediates,
            on_gpu: rt.is_gpu(),
        })
    }

    /// The number of kernels a run launches (at most; groups of no elements are skipped).
    pub fn kernel_count(&self) -> usize {
        self.steps.len()
    }

    /// The fusion pass's decisions: what each kernel loads, computes and stores.
    pub fn partition(&self) -> &Partition {
        &self.partition
    }

    /// The kernels, in launch order.
    pub fn kernels(&self) -> impl Iterator<Item = &IrKernel> {
        self.steps.iter().map(|s| &s.kernel)
    }

    /// The block IR of kernel `i` (unspecialized), as the printer writes it.
    pub fn ir(&self, i: usize) -> Result<String, PlanError> {
        let k = &self.steps.get(i).ok_or(PlanError::NoKernel { index: i, count: self.steps.len() })?.kernel;
        let f = build_ir(k, &vec![ParamSpec::default(); k.meta().params.len()])?;
        Ok(printer::print(&f, false))
    }

    /// Run the plan on `rt` (the runtime it was compiled for): read `inputs` (in the order
    /// of [`Graph::input`]), write `outputs` (in the order of [`Graph::output`]). Launches
    /// are asynchronous on a GPU, as kernel launches are.
    pub fn run(&mut self, rt: &Runtime, inputs: &[TensorRef<'_>], outputs: &mut [TensorMut<'_>]) -> Result<(), PlanError> {
        if rt.is_gpu() != self.on_gpu {
            let at = |gpu| if gpu { "a CUDA device" } else { "the interpreter" };
            return Err(PlanError::Placement(format!("the plan was compiled for {}, run on {}", at(self.on_gpu), at(rt.is_gpu()))));
        }
        check("input", &self.inputs, inputs.iter().map(|t| t.describe()), self.on_gpu)?;
        check("output", &self.outputs, outputs.iter().map(|t| t.describe()), self.on_gpu)?;
        for (step, group) in self.steps.iter().zip(&self.partition.groups) {
            if step.numel == 0 {
                continue;
            }
            // Written buffers first (each `&mut` taken once), then the ones read.
            let mut outs: Vec<Option<&mut TensorMut<'_>>> = outputs.iter_mut().map(Some).collect();
            let mut inter: Vec<Option<&mut Owned>> = self.intermediates.iter_mut().map(Some).collect();
            let mut written = vec![];
            for (_, d) in &group.stores {
                let t = match *d {
                    Dest::Output(k) => outs[k].take().map(|t| t.reborrow()),
                    Dest::Intermediate(k) => inter[k].take().map(|b| b.as_mut()),
                };
                written.push(t.ok_or_else(|| PlanError::Placement("a buffer is written twice by one kernel".into()))?);
            }
            let mut args = LaunchArgs::new(rt);
            for (_, s) in &group.loads {
                let r = match *s {
                    Source::Input(k) => inputs[k],
                    Source::Intermediate(k) => inter[k].as_deref().map(Owned::as_ref).ok_or_else(|| PlanError::Placement("a kernel reads a buffer it writes".into()))?,
                };
                args = match r {
                    TensorRef::F32(b) => args.input(b),
                    TensorRef::F16(b) => args.input(b),
                    TensorRef::BF16(b) => args.input(b),
                    TensorRef::U8(b) => args.input(b),
                };
            }
            for w in written {
                args = match w {
                    TensorMut::F32(b) => args.output(b),
                    TensorMut::F16(b) => args.output(b),
                    TensorMut::BF16(b) => args.output(b),
                    TensorMut::U8(b) => args.output(b),
                };
            }
            let cfg = LaunchConfig::grid(step.programs as u32).warps(step.warps);
            args.scalar(step.numel as i32).launch(&step.kernel, cfg)?;
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
