//! The launch interface shared by every way of running a kernel.
//!
//! `#[kernel]` turns a kernel into a unit struct implementing [`Kernel`] (its metadata,
//! identity and an IR builder) with a typed `launch` function; a kernel built at run time
//! is an [`IrKernel`](crate::built::IrKernel), launched through
//! [`LaunchArgs`](crate::built::LaunchArgs). Either converts its arguments
//! into [`Arg`]s and hands them to a [`Launcher`]: the CUDA runtime
//! ([`CudaRuntime`](crate::driver::CudaRuntime)), the CPU [`Interpreter`](crate::interp::Interpreter),
//! or [`Runtime`](crate::Runtime), which is either. A later autotuner is one more
//! `Launcher`, so the same test runs on all of them.
//!
//! # Safety model
//!
//! `launch` is safe: the kernel is compiled with a bounds guard
//! (`passes::guard`) that turns every access outside the buffers
//! passed to this launch into a masked-off lane, so safe Rust cannot make a kernel touch
//! memory it was not given. Buffers written by the kernel must be passed as `&mut`, so they
//! cannot alias any other argument. `launch_unchecked` is `unsafe` and skips the guard: the
//! caller promises that every lane the kernel's masks enable is inside its buffer.
//! The interpreter checks every masked-in access and reports out-of-bounds ones as errors,
//! whichever function launched it. On the GPU, a guarded launch masks such lanes silently
//! unless it is *checked* (a debug build: `RUTILE_DEBUG=1` or [`LaunchConfig::debug`]):
//! then the first out-of-bounds lane is recorded on the device and the launch returns the
//! same [`Error::Interpret`] the interpreter gives. A checked launch waits for the kernel
//! to finish (to read the record), so it costs a synchronization per launch.

use crate::error::{BuildError, Error, Result};
use crate::ir::{Builder, ParamKind, ParamSpec};
use crate::{DType, Element};
use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, SyncOnDrop};
use std::any::TypeId;
use std::borrow::Cow;
use std::marker::PhantomData;

/// What a kernel is without specializing it: its name, where it comes from, and its
/// parameters.
///
/// `#[kernel]` writes one as a `static` of borrowed strings (no allocation, no lazy
/// initialization); a kernel built at run time ([`IrKernel`](crate::built::IrKernel)) owns
/// its strings ([`KernelMeta::owned`]). Readers see `&str` and `&[(name, kind)]` either way.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelMeta {
    pub name: Cow<'static, str>,
    /// Source file and line of the kernel (the `fn` of a `#[kernel]`, the call that built
    /// an `IrKernel`), for error messages.
    pub file: Cow<'static, str>,
    pub line: u32,
    pub params: Cow<'static, [(Cow<'static, str>, ParamKind)]>,
}

impl KernelMeta {
    /// Metadata that owns its strings (a kernel made at run time).
    pub fn owned(name: String, file: String, line: u32, params: Vec<(String, ParamKind)>) -> KernelMeta {
        KernelMeta {
            name: Cow::Owned(name),
            file: Cow::Owned(file),
            line,
            params: Cow::Owned(params.into_iter().map(|(n, k)| (Cow::Owned(n), k)).collect()),
        }
    }

    /// How many parameters are pointers (each adds a length parameter to guarded code).
    pub fn pointer_params(&self) -> usize {
        self.params.iter().filter(|(_, k)| matches!(k, ParamKind::Ptr { .. })).count()
    }
}

/// Which kernel a compiled, loaded function belongs to: the part of the driver's launch key
/// ([`LaunchKey`](crate::driver::LaunchKey)) that says "this kernel", beside the
/// specialization and the launch settings. `Copy` and a few words, so a launch computes
/// and hashes it without allocating.
///
/// Two kernels with one `KernelId` must build the same IR for every specialization: the
/// driver loads one function for both.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelId {
    /// A `#[kernel]` instantiation: the type of the struct that builds it (one per kernel
    /// and element types) and the values of its compile-time constants, as `i64`s padded
    /// with zeros (`kernel::<T, 64>` and the `tune(..)` candidate with the constant 64 are
    /// one kernel). Valid within one process (the disk cache is keyed by IR, not by this).
    Kernel { ty: TypeId, consts: [i64; MAX_CONSTS] },
    /// A kernel built at run time: 128 bits of the BLAKE3 hash of its unspecialized IR,
    /// source locations included ([`compile::ir_identity`](crate::compile::ir_identity)).
    /// The same in every process that builds the same IR.
    Ir(u128),
}

/// A kernel: implemented by the struct that `#[kernel]` generates, and by
/// [`IrKernel`](crate::built::IrKernel) for kernels built at run time.
pub trait Kernel: Sync {
    /// Name, source and parameters. Read on every launch: return a reference to something
    /// stored, do not build it here.
    fn meta(&self) -> &KernelMeta;
    /// Which kernel this is (see [`KernelId`]). Read on every launch: return a stored or
    /// constant value, do not hash IR here.
    fn id(&self) -> KernelId;
    /// The compile-time constants of this instantiation, as `(name, value)`.
    fn constants(&self) -> Vec<(&'static str, String)>;
    /// Emit the kernel body into `b` (parameters are already defined). Given the same
    /// parameters and specialization it must emit the same IR every time.
    fn build(&self, b: &mut Builder) -> Result<(), BuildError>;
}

/// Grid and CTA shape of a launch, and the launch settings that select generated code.
///
/// ```
/// use dsl_runtime::LaunchConfig;
/// let cfg = LaunchConfig::grid(1024).warps(8).stages(3);
/// assert_eq!((cfg.grid, cfg.num_warps, cfg.num_stages), ([1024, 1, 1], 8, 3));
/// assert!(cfg.validate("k").is_ok() && cfg.stages(9).validate("k").is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LaunchConfig {
    /// Programs along x, y, z.
    pub grid: [u32; 3],
    /// Warps per program (32 threads each): a power of two from 1 to 32.
    pub num_warps: u32,
    /// Software-pipelining depth, Triton's `num_stages`: how many iterations of a loop's
    /// loads may be in flight at once, from 1 (no pipelining, the default) to
    /// [`MAX_STAGES`]. Each value is compiled and cached apart;
    /// the pipeliner (`passes::pipeline`) reads it (loops loading tensor-core
    /// operands), other kernels get the same code for every value.
    pub num_stages: u32,
    /// A debug build, compiled and cached apart: keeps `device_assert`/`device_print`,
    /// and checks bounds on the GPU (see the [module docs](self)). Defaults to
    /// `RUTILE_DEBUG=1` in the environment.
    pub debug: bool,
    /// Let tensor-core `dot`s use Hopper's warpgroup `wgmma` where the device (compute
    /// capability 9.0, compiled for `sm_90a`) and the dot's shapes allow it (the default;
    /// `passes::layout::wgmma_shape` says which shapes). `false` keeps every dot on
    /// `mma.sync`, for comparison and tests; the stage dump names each dot's instruction.
    pub wgmma: bool,
    /// Let the pipelined loops of `wgmma` kernels load their operand tiles with the
    /// tensor memory accelerator (TMA) where a tile is a matrix tile the compiler
    /// recognises (the default; `passes::tma` says which loads), instead of `cp.async`.
    /// `false` keeps `cp.async`, for comparison and tests; the stage dump shows
    /// `tma_copy`s. Debug builds always keep `cp.async`.
    pub tma: bool,
    /// Store whole matrix tiles with TMA (sm_90a, where `wgmma` is on): each store of a
    /// tile the compiler recognises (`passes::tma::stores`: the form TMA loads take) goes
    /// through shared memory in the stored block's own layout and out by one thread's
    /// `cp.async.bulk.tensor` copies, instead of every thread storing vectors after a layout
    /// conversion. Off by default: level with the plain store on the matmul (BENCHMARKS.md,
    /// "TMA stores in the matmul epilogue"); it pays where a store overlaps later work;
    /// the stage dump shows `tma_store`. A relaxed `f32` `atomic_add` of such a tile whose
    /// old values are unused becomes a TMA reduction the same way
    /// (`cp.reduce.async.bulk.tensor .add`, `tma_reduce_add` in the dump: the atomic
    /// backward's `dQ`). Debug builds never use it. Only stores of at least
    /// 8 rows to a buffer the kernel reads and writes nowhere else are taken; a buffer
    /// shorter than the matrix the store's masks describe is refused at launch (as for TMA
    /// loads), and the tile's buffer takes shared memory that a kernel without dead bytes
    /// to reuse may not have (the launch's error says so).
    pub tma_store: bool,
    /// Warp specialization of a TMA loop (sm_90a): a producer warpgroup beyond
    /// `num_warps` issues the copies of the program's first top-level TMA-loaded loop
    /// while the `num_warps` warps (the consumers) only wait for its stages, multiply and
    /// give the stages back, with no barrier between them, and the producer's registers
    /// go to the consumers (`setmaxnreg`): FlashAttention-3's and CUTLASS's producer /
    /// consumer split. Off by default (the library turns it on where it measured faster);
    /// the stage dump shows `warp_specialize`. Where the loop does not qualify
    /// (`passes::pipeline` says when) the launch runs as without it.
    pub warp_specialize: bool,
    /// Programs per thread-block cluster along x, y, z (`[1, 1, 1]`: no clusters, the
    /// default). Clusters (sm_90) are co-scheduled on one GPU processing cluster and may
    /// share their shared memory; launched through `cuLaunchKernelEx`. Each must divide the
    /// grid, with at most [`MAX_CLUSTER`] programs in a cluster. The generated code does
    /// not depend on it (no kernel uses distributed shared memory yet), and the
    /// interpreter runs programs one by one whatever it says.
    pub cluster: [u32; 3],
    /// Programs an SM must be able to run at once, for which the kernel is compiled (CUDA's
    /// launch bounds, `__launch_bounds__(threads, min)`; PTX `.minnctapersm`): ptxas keeps
    /// each thread's registers within `65536 / (programs * threads)`, spilling if it must.
    /// 1 (the default) leaves the registers to ptxas. A kernel whose registers sit just
    /// above such a limit runs half the programs an SM (the flash-attention backward's
    /// 8-warp `dQ` tile, `kernels_lib::flash_attention`). Compiled and cached apart; a
    /// warp-specialized kernel takes at least what its register split needs.
    pub min_programs_per_sm: u32,
    /// With `num_stages > 1`, loads in a loop that shared memory does not take (a score
    /// modification's bias tile in attention, a row of statistics) are issued one
    /// iteration ahead and carried into the next in registers (`passes::prefetch`), so
    /// that their latency passes under the rest of the iteration. On by default; it holds
    /// the loaded values' registers across the loop's back edge, which a loop already near
    /// its register limit pays for in spills or scheduling (the flash-attention backward
    /// turns it off but in dK/dV without a score modification: BENCHMARKS.md, "Register
    /// prefetch"). Compiled and cached apart.
    pub prefetch: bool,
}

/// `RUTILE_DEBUG=1`: debug builds by default (read once per process).
pub fn debug_from_env() -> bool {
    static DEBUG: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *DEBUG.get_or_init(|| std::env::var("RUTILE_DEBUG").is_ok_and(|v| v == "1" || v == "true"))
}

impl LaunchConfig {
    /// A 1-D grid of `programs` programs with 4 warps each.
    pub fn grid(programs: u32) -> LaunchConfig {
        LaunchConfig::grid3(programs, 1, 1)
    }
    /// A 3-D grid.
    pub fn grid3(x: u32, y: u32, z: u32) -> LaunchConfig {
        LaunchConfig { grid: [x, y, z], num_warps: 4, num_stages: 1, debug: debug_from_env(), wgmma: true, tma: true, tma_store: false, warp_specialize: false, cluster: [1, 1, 1], min_programs_per_sm: 1, prefetch: true }
    }
    pub fn warps(mut self, num_warps: u32) -> LaunchConfig {
        self.num_warps = num_warps;
        self
    }
    /// Pipelining depth, 1 to [`MAX_STAGES`] (see [`num_stages`](LaunchConfig::num_stages)).
    pub fn stages(mut self, num_stages: u32) -> LaunchConfig {
        self.num_stages = num_stages;
        self
    }
    /// A debug build: `device_assert` and `device_print` are kept.
    pub fn debug(mut self, on: bool) -> LaunchConfig {
        self.debug = on;
        self
    }
    /// Whether tensor-core `dot`s may use `wgmma` (see [`wgmma`](LaunchConfig::wgmma)).
    pub fn wgmma(mut self, on: bool) -> LaunchConfig {
        self.wgmma = on;
        self
    }
    /// Whether pipelined `wgmma` operands may be loaded by TMA (see [`tma`](LaunchConfig::tma)).
    pub fn tma(mut self, on: bool) -> LaunchConfig {
        self.tma = on;
        self
    }
    /// Whether whole tiles may be stored by TMA (see
    /// [`tma_store`](LaunchConfig::tma_store)).
    pub fn tma_store(mut self, on: bool) -> LaunchConfig {
        self.tma_store = on;
        self
    }
    /// Whether a TMA loop may be warp-specialized (see
    /// [`warp_specialize`](LaunchConfig::warp_specialize)).
    pub fn warp_specialize(mut self, on: bool) -> LaunchConfig {
        self.warp_specialize = on;
        self
    }
    /// Programs an SM must fit at once (see [`min_programs_per_sm`](LaunchConfig::min_programs_per_sm)).
    pub fn min_programs_per_sm(mut self, programs: u32) -> LaunchConfig {
        self.min_programs_per_sm = programs;
        self
    }
    /// Whether non-staged loads in pipelined loops are prefetched (see
    /// [`prefetch`](LaunchConfig::prefetch)).
    pub fn prefetch(mut self, on: bool) -> LaunchConfig {
        self.prefetch = on;
        self
    }
    /// Programs per cluster (see [`cluster`](LaunchConfig::cluster)).
    pub fn cluster(mut self, x: u32, y: u32, z: u32) -> LaunchConfig {
        self.cluster = [x, y, z];
        self
    }
    /// Whether this launch asks for clusters of more than one program.
    pub fn clustered(&self) -> bool {
        self.cluster != [1, 1, 1]
    }
    /// Check what every launcher needs: `num_warps`, `num_stages`, and a grid within CUDA's
    /// limits (2^31 - 1 programs along x, 65535 along y and z, the same on every supported GPU).
    pub fn validate(&self, kernel: &str) -> Result<()> {
        let bad = |message: String| Err(Error::Launch { kernel: kernel.into(), message });
        if !self.num_warps.is_power_of_two() || self.num_warps > 32 {
            return bad(format!("num_warps must be a power of two from 1 to 32, got {}", self.num_warps));
        }
        if !(1..=MAX_STAGES).contains(&self.num_stages) {
            return bad(format!("num_stages must be from 1 to {MAX_STAGES}, got {}", self.num_stages));
        }
        if !(1..=MAX_PROGRAMS_PER_SM).contains(&self.min_programs_per_sm) {
            return bad(format!("min_programs_per_sm must be from 1 to {MAX_PROGRAMS_PER_SM}, got {}", self.min_programs_per_sm));
        }
        // A warp-specialized launch may add a producer warpgroup.
        let threads = 32 * (self.num_warps + if self.warp_specialize { crate::passes::PRODUCER_WARPS as u32 } else { 0 });
        if self.min_programs_per_sm * threads > MAX_THREADS_PER_SM {
            return bad(format!(
                "min_programs_per_sm {} of {threads} threads is more than the {MAX_THREADS_PER_SM} threads an SM runs",
                self.min_programs_per_sm
            ));
        }
        let [x, y, z] = self.grid;
        let [cx, cy, cz] = self.cluster;
        if cx == 0 || cy == 0 || cz == 0 || cx as u64 * cy as u64 * cz as u64 > MAX_CLUSTER as u64 {
            return bad(format!("a cluster of ({cx}, {cy}, {cz}) programs: each at least 1, at most {MAX_CLUSTER} in all"));
        }
        if x % cx != 0 || y % cy != 0 || z % cz != 0 {
            return bad(format!("the grid ({x}, {y}, {z}) is not a whole number of ({cx}, {cy}, {cz}) clusters"));
        }
        if x > MAX_GRID[0] || y > MAX_GRID[1] || z > MAX_GRID[2] {
            return bad(format!(
                "grid ({x}, {y}, {z}) is larger than the device allows ({}, {}, {}); give each program more work",
                MAX_GRID[0], MAX_GRID[1], MAX_GRID[2]
            ));
        }
        Ok(())
    }
    /// A grid with no programs along some axis: launching it does nothing (after the
    /// arguments are checked), as in Triton, so `n = 0` needs no special case.
    pub fn is_empty(&self) -> bool {
        self.grid.contains(&0)
    }
}

/// The deepest software pipeline a launch may ask for ([`LaunchConfig::stages`]).
pub const MAX_STAGES: u32 = 8;

/// The most programs an SM runs at once (sm_90; [`LaunchConfig::min_programs_per_sm`]).
pub const MAX_PROGRAMS_PER_SM: u32 = 32;

/// The most threads an SM runs at once (sm_80 to sm_90).
pub const MAX_THREADS_PER_SM: u32 = 2048;

/// The most programs in a cluster ([`LaunchConfig::cluster`]): CUDA's portable cluster size.
pub const MAX_CLUSTER: u32 = 8;

/// The largest grid CUDA launches, along x, y and z.
pub const MAX_GRID: [u32; 3] = [i32::MAX as u32, 65535, 65535];

/// One launch argument, as the launchers see it.
///
/// Launchers trust a `Host` or `Device` argument to describe memory that is borrowed for
/// `'a` (exclusively, when `writable`): `len` elements of `elem` at `ptr`/`addr`, of this
/// launcher's context for device memory when `ctx` is not 0. The [`InPtr`]/[`OutPtr`]
/// bindings make them so. The fields are public, so an `Arg` built by hand can say
/// anything: that is why [`Launcher::launch_args`] is an `unsafe fn`.
#[derive(Debug)]
pub enum Arg<'a> {
    /// A device buffer: address, element count, and the `CUcontext` it belongs to when the
    /// binding knows it for free (a `CudaSlice`; 0 for views: the CUDA launcher asks the
    /// driver).
    Device { addr: u64, len: usize, elem: DType, writable: bool, ctx: usize },
    /// A host buffer (interpreter only).
    Host { ptr: *mut u8, len: usize, elem: DType, writable: bool, _borrow: PhantomData<&'a mut [u8]> },
    I32(i32),
    I64(i64),
    F32(f32),
    /// Bytes passed by value for a [`ParamKind::Bytes`] parameter of the same size (a TMA
    /// tensor map); the launch copies them.
    Bytes(&'a [u8]),
}

impl Arg<'_> {
    fn describe(&self) -> String {
        match self {
            Arg::Device { elem, writable, .. } => format!("a {}device buffer of {elem}", if *writable { "mutable " } else { "" }),
            Arg::Host { elem, writable, .. } => format!("a {}host slice of {elem}", if *writable { "mutable " } else { "" }),
            Arg::I32(_) => "an i32".into(),
            Arg::I64(_) => "an i64".into(),
            Arg::F32(_) => "an f32".into(),
            Arg::Bytes(b) => format!("{} bytes", b.len()),
        }
    }
}

/// Keeps cudarc's stream-synchronization records alive until the launch is enqueued.
#[derive(Default)]
pub struct Bindings<'a> {
    guards: Vec<SyncOnDrop<'a>>,
}

impl<'a> Bindings<'a> {
    /// Keep `g` until after the launch when cudarc synchronizes streams for this
    /// context; otherwise it does nothing on drop and is dropped now (no allocation).
    pub fn keep(&mut self, g: SyncOnDrop<'a>, stream: &CudaStream) {
        if stream.context().is_managing_stream_synchronization() {
            self.guards.push(g);
        }
    }
}

/// A read-only pointer argument holding `T`s: a buffer of the launcher's runtime, or a
/// host slice on the interpreter (an empty slice on any runtime: on the GPU a null pointer
/// of length 0, for a parameter the kernel does not read; a guarded launch suppresses any
/// access through it, while an unchecked one that reads it faults, as any access outside
/// its buffer may).
pub trait InPtr<T: Element> {
    fn bind<'a>(&'a self, stream: Option<&'a CudaStream>, b: &mut Bindings<'a>) -> Arg<'a>;
}

/// A pointer argument the kernel writes: must be borrowed mutably.
pub trait OutPtr<T: Element> {
    fn bind<'a>(&'a mut self, stream: Option<&'a CudaStream>, b: &mut Bindings<'a>) -> Arg<'a>;
}

/// A read-only host buffer, borrowed for `'a`.
pub(crate) fn host<'a, T: Element>(s: &'a [T]) -> Arg<'a> {
    Arg::Host { ptr: s.as_ptr() as *mut u8, len: s.len(), elem: T::DTYPE, writable: false, _borrow: PhantomData }
}

/// A host buffer the kernel may write, borrowed exclusively for `'a`. The pointer comes
/// from `as_mut_ptr` of the unique borrow: one made from a shared borrow (`as_ptr`) may
/// not be written through.
pub(crate) fn host_mut<'a, T: Element>(s: &'a mut [T]) -> Arg<'a> {
    Arg::Host { ptr: s.as_mut_ptr() as *mut u8, len: s.len(), elem: T::DTYPE, writable: true, _borrow: PhantomData }
}

impl<T: Element> InPtr<T> for &[T] {
    fn bind<'a>(&'a self, _: Option<&'a CudaStream>, _: &mut Bindings<'a>) -> Arg<'a> {
        host(self)
    }
}
impl<T: Element> InPtr<T> for &Vec<T> {
    fn bind<'a>(&'a self, _: Option<&'a CudaStream>, _: &mut Bindings<'a>) -> Arg<'a> {
        host(self)
    }
}
impl<T: Element> OutPtr<T> for &mut [T] {
    fn bind<'a>(&'a mut self, _: Option<&'a CudaStream>, _: &mut Bindings<'a>) -> Arg<'a> {
        host_mut(self)
    }
}
impl<T: Element> OutPtr<T> for &mut Vec<T> {
    fn bind<'a>(&'a mut self, _: Option<&'a CudaStream>, _: &mut Bindings<'a>) -> Arg<'a> {
        host_mut(self)
    }
}

/// Device buffers bound without a stream (the interpreter) report themselves as device
/// buffers without touching CUDA; the interpreter rejects them.
macro_rules! device_in {
    ($t:ty, $ctx:expr) => {
        impl<T: Element> InPtr<T> for $t {
            fn bind<'a>(&'a self, stream: Option<&'a CudaStream>, b: &mut Bindings<'a>) -> Arg<'a> {
                let len = cudarc::driver::DeviceSlice::len(*self);
                let ctx = $ctx(*self);
                match stream {
                    Some(s) => {
                        let (addr, g) = (**self).device_ptr(s);
                        b.keep(g, s);
                        Arg::Device { addr, len, elem: T::DTYPE, writable: false, ctx }
                    }
                    None => Arg::Device { addr: 0, len, elem: T::DTYPE, writable: false, ctx },
                }
            }
        }
    };
}
device_in!(&CudaSlice<T>, slice_ctx);
device_in!(&CudaView<'_, T>, unknown_ctx);
device_in!(&CudaViewMut<'_, T>, unknown_ctx);

macro_rules! device_out {
    ($t:ty, $ctx:expr) => {
        impl<T: Element> OutPtr<T> for $t {
            fn bind<'a>(&'a mut self, stream: Option<&'a CudaStream>, b: &mut Bindings<'a>) -> Arg<'a> {
                let len = cudarc::driver::DeviceSlice::len(*self);
                let ctx = $ctx(&**self);
                match stream {
                    Some(s) => {
                        let (addr, g) = (**self).device_ptr_mut(s);
                        b.keep(g, s);
                        Arg::Device { addr, len, elem: T::DTYPE, writable: true, ctx }
                    }
                    None => Arg::Device { addr: 0, len, elem: T::DTYPE, writable: true, ctx },
                }
            }
        }
    };
}
device_out!(&mut CudaSlice<T>, slice_ctx);
device_out!(&mut CudaViewMut<'_, T>, unknown_ctx);

/// The context a `CudaSlice` was allocated in (no driver call).
pub(crate) fn slice_ctx<T>(s: &CudaSlice<T>) -> usize {
    s.context().cu_ctx() as usize
}

fn unknown_ctx<X: ?Sized>(_: &X) -> usize {
    0
}

/// Scalars passed by value.
pub trait ScalarArg {
    fn arg(self) -> Arg<'static>;
}
impl ScalarArg for i32 {
    fn arg(self) -> Arg<'static> {
        Arg::I32(self)
    }
}
impl ScalarArg for i64 {
    fn arg(self) -> Arg<'static> {
        Arg::I64(self)
    }
}
impl ScalarArg for f32 {
    fn arg(self) -> Arg<'static> {
        Arg::F32(self)
    }
}

/// Whether a launch trusts the kernel's masks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Safety {
    /// Every access is guarded by the buffers' lengths (the safe `launch`).
    Guarded,
    /// Accesses are only masked by the kernel's own masks (`unsafe launch_unchecked`).
    Unchecked,
}

/// Something that runs kernels: the CUDA runtime, the interpreter, or [`Runtime`](crate::Runtime).
pub trait Launcher {
    /// The CUDA stream that device arguments are bound to; `None` for host launchers.
    fn cuda_stream(&self) -> Option<&CudaStream>;
    /// Launch `kernel` on `args` (already bound). The typed `launch` and
    /// `launch_unchecked` functions that `#[kernel]` generates call this, and so does
    /// [`LaunchArgs`](crate::built::LaunchArgs) for any kernel (a built one included):
    /// call those instead, they are safe.
    ///
    /// # Safety
    ///
    /// Every `Host`/`Device` argument describes memory as [`Arg`] says (the `InPtr`/`OutPtr`
    /// bindings of live buffers borrowed for the call make it so), and with
    /// [`Safety::Unchecked`] every lane the kernel's masks enable addresses an element
    /// inside its buffer (the contract of `launch_unchecked`).
    unsafe fn launch_args(&self, kernel: &dyn Kernel, cfg: &LaunchConfig, args: &[Arg<'_>], safety: Safety) -> Result<()>;
}

/// What a launch's arguments say about specialization, packed: two bits per parameter
/// (`div16`/aligned, `eq_one`), then one bit per pointer parameter (its length is a
/// multiple of 16). Computed on every launch, so it allocates nothing.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct SpecKey(pub u128);

/// Most parameters a kernel can take (so that a [`SpecKey`] fits in 128 bits).
pub const MAX_PARAMS: usize = 42;

impl SpecKey {
    /// Check `args` against the kernel's parameters and compute the key.
    pub fn of(meta: &KernelMeta, args: &[Arg<'_>]) -> Result<SpecKey> {
        let bad = |message: String| Err(Error::Launch { kernel: meta.name.to_string(), message });
        if args.len() != meta.params.len() {
            return bad(format!("expected {} arguments, got {}", meta.params.len(), args.len()));
        }
        if args.len() > MAX_PARAMS {
            return bad(format!("kernels take at most {MAX_PARAMS} parameters"));
        }
        let mut bits = 0u128;
        let mut len_bit = 2 * args.len();
        for (i, ((name, kind), arg)) in meta.params.iter().zip(args).enumerate() {
            let (div16, eq_one) = match (kind, arg) {
                (ParamKind::Ptr { elem, writable }, Arg::Device { len, elem: e, writable: w, .. })
                | (ParamKind::Ptr { elem, writable }, Arg::Host { len, elem: e, writable: w, .. }) => {
                    if elem != e || (*writable && !w) {
                        let want = format!("a {}buffer of {elem}", if *writable { "mutable " } else { "" });
                        return bad(format!("argument `{name}` must be {want}, got {}", arg.describe()));
                    }
                    let addr = match *arg {
                        Arg::Host { ptr, .. } => ptr as u64,
                        Arg::Device { addr, .. } => addr,
                        _ => 0,
                    };
                    bits |= ((len % 16 == 0) as u128) << len_bit;
                    len_bit += 1;
                    (addr % 16 == 0, false)
                }
                (ParamKind::Scalar(DType::I32), Arg::I32(x)) => (x % 16 == 0, *x == 1),
                (ParamKind::Scalar(DType::I64), Arg::I64(x)) => (x % 16 == 0, *x == 1),
                (ParamKind::Scalar(DType::F32), Arg::F32(_)) => (false, false),
                (ParamKind::Bytes { size, .. }, Arg::Bytes(b)) if b.len() == *size as usize => (false, false),
                (kind, arg) => return bad(format!("argument `{name}` must be {}, got {}", describe_kind(kind), arg.describe())),
            };
            bits |= ((div16 as u128) | (eq_one as u128) << 1) << (2 * i);
        }
        Ok(SpecKey(bits))
    }

    /// One [`ParamSpec`] per parameter and one per pointer parameter's length.
    pub fn unpack(self, meta: &KernelMeta) -> (Vec<ParamSpec>, Vec<ParamSpec>) {
        let n = meta.params.len();
        let bit = |i: usize| self.0 >> i & 1 == 1;
        let specs = (0..n).map(|i| ParamSpec { div16: bit(2 * i), eq_one: bit(2 * i + 1) }).collect();
        let nptr = meta.pointer_params();
        let lens = (0..nptr).map(|j| ParamSpec { div16: bit(2 * n + j), eq_one: false }).collect();
        (specs, lens)
    }
}

/// [`SpecKey::of`] then [`SpecKey::unpack`].
pub fn specialize(meta: &KernelMeta, args: &[Arg<'_>]) -> Result<(Vec<ParamSpec>, Vec<ParamSpec>)> {
    Ok(SpecKey::of(meta, args)?.unpack(meta))
}

fn describe_kind(k: &ParamKind) -> String {
    match k {
        ParamKind::Ptr { elem, .. } => format!("a buffer of {elem}"),
        ParamKind::Scalar(d) => format!("an {d}"),
        ParamKind::Len { .. } => "a length".into(),
        ParamKind::Bytes { size, .. } => format!("{size} bytes by value"),
    }
}

/// Short text of a specialization for error messages and dumps: `BLOCK=1024, n%16==0`.
pub fn describe_spec(kernel: &dyn Kernel, specs: &[ParamSpec]) -> String {
    let mut parts: Vec<String> = kernel.constants().into_iter().map(|(k, v)| format!("{k}={v}")).collect();
    for ((name, kind), s) in kernel.meta().params.iter().zip(specs) {
        match kind {
            ParamKind::Ptr { .. } if s.div16 => parts.push(format!("{name} aligned 16")),
            _ if s.eq_one => parts.push(format!("{name}==1")),
            _ if s.div16 => parts.push(format!("{name}%16==0")),
            _ => {}
        }
    }
    parts.join(", ")
}

/// Most compile-time constants a `#[kernel]` may declare (they are part of its [`KernelId`]).
pub const MAX_CONSTS: usize = 8;

/// The [`KernelId`] of the `#[kernel]` built by `T` with constants `consts` (what the
/// macro's expansion returns; at most [`MAX_CONSTS`], which the macro checks).
#[doc(hidden)]
pub fn kernel_id_of<T: 'static>(consts: &[i64]) -> KernelId {
    let mut padded = [0; MAX_CONSTS];
    padded[..consts.len()].copy_from_slice(consts);
    KernelId::Kernel { ty: TypeId::of::<T>(), consts: padded }
}

#[cfg(test)]
mod tests {
    use super::{LaunchConfig, MAX_STAGES};

    #[test]
    fn num_stages_defaults_to_one_and_is_checked() {
        let cfg = LaunchConfig::grid(4);
        assert_eq!((cfg.num_stages, LaunchConfig::grid3(1, 2, 3).num_stages), (1, 1));
        assert_eq!(cfg.stages(3).num_stages, 3);
        for ok in [1, 2, MAX_STAGES] {
            assert!(cfg.stages(ok).validate("k").is_ok(), "{ok}");
        }
        for bad in [0, MAX_STAGES + 1, u32::MAX] {
            let e = cfg.stages(bad).validate("k").unwrap_err().to_string();
            assert!(e.contains(&format!("num_stages must be from 1 to {MAX_STAGES}, got {bad}")), "{e}");
        }
    }
}
