//! Loading and launching on a CUDA device, through the driver API (cudarc).
//!
//! [`CudaRuntime`] owns a context and a stream, a [`Compiler`] (disk cache of PTX) and an
//! in-memory map from [`LaunchKey`] (kernel identity, specialization, `num_warps`,
//! `num_stages`, safety, debug) to a loaded function. A miss compiles to PTX (or reads it from disk),
//! links it to a cubin with the driver's JIT linker and caches that cubin on disk too,
//! keyed by the PTX key, compute capability and driver version, so a new process with a
//! warm disk cache loads machine code without compiling anything. A warp-specialized
//! kernel (`setmaxnreg`, which the linker's compile ignores) is loaded from its PTX as a
//! whole program instead, and the driver's own JIT cache keeps its machine code.
//!
//! A `CudaRuntime` is shared between threads (`&self` launches). The in-memory map is not
//! locked while a kernel loads, so threads loading different kernels compile in parallel
//! and launches of loaded kernels are not held up by a compile; threads launching one
//! kernel with one launch key wait for a single load. A load that fails is not remembered:
//! the next launch tries again.
//!
//! Launches can also be recorded into a CUDA graph ([`CudaRuntime::capture`]) and replayed
//! with one driver call ([`CapturedGraph::replay`]): what a plan of several kernels does
//! to pay the host's launch cost once per run instead of once per kernel.
//!
//! The CUDA driver library is loaded at run time: on a machine without it,
//! [`CudaRuntime::new`] returns [`Error::NoCuda`] instead of panicking.

use crate::compile::{LoadError, dump_dir_for, CodegenOptions, Compiler};
use crate::emit::Target;
use crate::error::{driver, Error, Result};
use crate::launch::{Arg, Kernel, KernelId, LaunchConfig, Launcher, Safety, SpecKey, MAX_PARAMS};
use crate::cache::DiskCache;
use crate::diag::{warn, Warning};
use crate::ir::{Access, HostInt, Loc, ParamSpec};
use crate::lower::debug::{OOB_RECORD, OOB_WORDS};
use crate::once_map::OnceMap;
use crate::passes::tma::TensorMap;
use cudarc::driver::{result, sys, CudaContext, CudaStream};
use std::ffi::{c_void, CString};
use std::sync::Arc;

/// Check that a CUDA driver and a device are there, without panicking.
pub fn probe(ordinal: usize) -> Result<()> {
    // SAFETY: this `dlopen`s libcuda by name (and closes it again), which runs the library's
    // initializers: those of NVIDIA's driver library, made to be loaded into any process
    // (every CUDA program does). No symbol of it is called here.
    if !unsafe { sys::is_culib_present() } {
        return Err(Error::NoCuda("the CUDA driver library (libcuda.so.1) was not found; no NVIDIA driver is installed".into()));
    }
    result::init().map_err(|e| Error::NoCuda(format!("cuInit failed: {e}")))?;
    let n = result::device::get_count().map_err(|e| Error::NoCuda(format!("cannot count devices: {e}")))?;
    if ordinal >= n.max(0) as usize {
        return Err(Error::NoCuda(format!("device {ordinal} was requested but {n} CUDA device(s) are present")));
    }
    Ok(())
}

/// The key of a runtime's loaded functions: launches with equal keys run one loaded
/// function. `Copy`, built and hashed on every launch without allocating. Public so that
/// tools and tests can see which launches share a function.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct LaunchKey {
    /// Which kernel ([`Kernel::id`]).
    pub kernel: KernelId,
    /// What the arguments say about specialization.
    pub spec: SpecKey,
    pub num_warps: u32,
    pub num_stages: u32,
    pub safety: Safety,
    pub debug: bool,
    pub wgmma: bool,
    pub tma: bool,
    pub warp_specialize: bool,
    pub min_programs_per_sm: u32,
    pub prefetch: bool,
}

impl LaunchKey {
    /// The key of launching `kernel` with arguments of specialization `spec`.
    pub fn new(kernel: &dyn Kernel, spec: SpecKey, cfg: &LaunchConfig, safety: Safety) -> LaunchKey {
        LaunchKey { kernel: kernel.id(), spec, num_warps: cfg.num_warps, num_stages: cfg.num_stages, safety, debug: cfg.debug, wgmma: cfg.wgmma, tma: cfg.tma, warp_specialize: cfg.warp_specialize, min_programs_per_sm: cfg.min_programs_per_sm, prefetch: cfg.prefetch }
    }
}

/// A loaded kernel function; unloads its module when dropped.
pub struct LoadedKernel {
    module: sys::CUmodule,
    func: sys::CUfunction,
    ctx: Arc<CudaContext>,
    /// The PTX cache key (shown in logs and dumps).
    pub key: String,
    /// Dynamic shared memory per program, in bytes.
    pub shared_bytes: u32,
    /// Local memory per thread, in bytes (`CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES`): spills,
    /// or a debug build's print buffers.
    pub local_bytes: u32,
    /// The kernel's name.
    pub name: String,
    /// Threads per program: the launch's warps and a warp-specialized kernel's producer.
    threads: u32,
    /// Checked launches: the device address of the out-of-bounds record...
    oob: Option<u64>,
    /// ...held by one checked launch at a time, from the launch to the read-back.
    checked: std::sync::Mutex<()>,
    /// The tensor maps each launch encodes from its arguments (TMA copies), passed after
    /// the buffer lengths...
    maps: Vec<TensorMap>,
    /// ...and the last encoding of each, with the arguments it was made from ([`map_inputs`]).
    memo: std::sync::Mutex<[Option<Encoded>; MAX_MAPS]>,
}

/// A tensor map and the arguments it was encoded from ([`map_inputs`]).
type Encoded = ([i64; 8], sys::CUtensorMap);

// SAFETY: `module` and `func` are driver handles (pointers the driver owns), not pointers
// into Rust memory. The driver API is thread-safe: a handle may be used from any thread on
// which its context is current, and every use here (launch, unload) binds `ctx` first.
// Nothing mutates a `LoadedKernel` after `CudaRuntime::load` returns it but through its
// mutexes (`checked`, `memo`: plain data), so shared references on several threads only
// read or lock.
unsafe impl Send for LoadedKernel {}
// SAFETY: see `Send` above: `&LoadedKernel` gives reads of plain values and handles, and
// locked access to plain data.
unsafe impl Sync for LoadedKernel {}

impl Drop for LoadedKernel {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: `module` was loaded into `ctx` (current now, and kept alive by the
            // `Arc`) and is unloaded only here, once; `func` dies with it and is not used
            // after, since the last owner is going away. Launches of it that are still
            // running were waited for: a `LoadedKernel` is dropped by `load` before any
            // launch, or with the last of its `CudaRuntime` and the `CapturedGraph`s
            // recorded from it, whose `Drop`s synchronize the stream.
            unsafe {
                let _ = sys::cuModuleUnload(self.module);
            }
        }
    }
}

// Kernel parameters are passed as the first bytes of 8-byte slots (see `launch_args`).
const _: () = assert!(cfg!(target_endian = "little"), "kernel parameter slots assume a little-endian host");

/// Launches recorded by [`CudaRuntime::capture`], replayed on the runtime's stream. It
/// keeps the recorded kernels' modules loaded (and the stream alive) for as long as it
/// lives, even past its runtime.
pub struct CapturedGraph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    stream: Arc<CudaStream>,
    _modules: Arc<OnceMap<LaunchKey, Arc<LoadedKernel>>>,
}

// SAFETY: the graph handles are driver objects, used (launched, destroyed) only through
// `&mut self` or `&self` calls that bind the context first; the driver API is thread-safe
// for a graph exec launched from one thread at a time, which `&self` of a `!Sync` value
// guarantees. Moving it to another thread moves that one user.
unsafe impl Send for CapturedGraph {}

impl CapturedGraph {
    /// Launch every recorded kernel, in the recorded order, on the runtime's stream, with
    /// one driver call (asynchronous, as a kernel launch is).
    ///
    /// # Safety
    ///
    /// The recorded launches read and write the buffers they were given at the capture, at
    /// the same addresses and with the same lengths: every one of them must still be alive
    /// (not freed, not reallocated smaller) when the replay runs, and nothing else may use
    /// them in a way the launches would race with. `Plan::run_graph` (kernels-lib) checks
    /// this for its plans: it replays only on the buffers it is given.
    pub unsafe fn replay(&self) -> Result<()> {
        self.stream.context().bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        // SAFETY: `exec` is an instantiated graph of this context, alive until `drop`; its
        // kernels' modules are kept loaded by `_modules`; the buffers are the caller's
        // contract above.
        unsafe { result::graph::launch(self.exec, self.stream.cu_stream()) }.map_err(driver("cuGraphLaunch"))
    }
}

impl Drop for CapturedGraph {
    fn drop(&mut self) {
        if self.stream.context().bind_to_thread().is_ok() {
            // Replays still queued finish before the graph and (with the last owner) its
            // modules go.
            let _ = self.stream.synchronize();
            // SAFETY: both handles were made by `capture` and are destroyed only here.
            unsafe {
                let _ = result::graph::exec_destroy(self.exec);
                let _ = result::graph::destroy(self.graph);
            }
        }
    }
}

impl std::fmt::Debug for CapturedGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CapturedGraph")
    }
}

thread_local! {
    /// While this thread records [`CudaRuntime::capture`]: the recording runtime and the
    /// side stream its launches from this thread go to instead of its own.
    static CAPTURING: std::cell::Cell<Option<(usize, usize)>> = const { std::cell::Cell::new(None) };
}

/// Kernels on one CUDA device and stream.
pub struct CudaRuntime {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    target: Target,
    driver_version: i32,
    /// Streaming multiprocessors of the device.
    sm_count: u32,
    compiler: Compiler,
    /// Shared with the CUDA graphs recorded from this runtime, whose launches need the
    /// modules loaded for as long as they can be replayed.
    loaded: Arc<OnceMap<LaunchKey, Arc<LoadedKernel>>>,
    /// Unique in the process (see [`CudaRuntime::id`]).
    id: u64,
    /// 32 bytes: the first 16 zeros, where the tensor map of an empty matrix points; the
    /// next 16 what a TMA store's map of an empty matrix points at, which nothing reads
    /// (its program may still store a tile at coordinates (0, 0), inside the map's one
    /// element).
    zeros: std::sync::OnceLock<cudarc::driver::CudaSlice<u8>>,
}

impl CudaRuntime {
    /// Device `ordinal`, its default stream, and the disk cache from the environment.
    pub fn new(ordinal: usize) -> Result<CudaRuntime> {
        probe(ordinal)?;
        let ctx = CudaContext::new(ordinal).map_err(driver("cuDevicePrimaryCtxRetain"))?;
        let stream = ctx.default_stream();
        CudaRuntime::with_stream(stream)
    }

    /// Launch on an existing cudarc stream (for programs that already use cudarc).
    pub fn with_stream(stream: Arc<CudaStream>) -> Result<CudaRuntime> {
        let ctx = stream.context().clone();
        let (ma, mi) = ctx.compute_capability().map_err(driver("cuDeviceGetAttribute"))?;
        if ma < 8 {
            return Err(Error::NoCuda(format!("compute capability {ma}.{mi} is below 8.0, the oldest this compiler supports")));
        }
        let mut driver_version = 0;
        // SAFETY: the driver writes one `int` to a valid, exclusive `&mut i32`.
        unsafe { sys::cuDriverGetVersion(&mut driver_version) }.result().map_err(driver("cuDriverGetVersion"))?;
        let sm_count = ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT).map_err(driver("cuDeviceGetAttribute"))? as u32;
        Ok(CudaRuntime {
            ctx,
            stream,
            target: Target { cc: (ma as u32, mi as u32) },
            driver_version,
            sm_count,
            compiler: Compiler::new(DiskCache::from_env()),
            loaded: Arc::new(OnceMap::new()),
            id: {
                static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
                NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            },
            zeros: std::sync::OnceLock::new(),
        })
    }

    /// This runtime's number, unique among the runtimes of the process (never reused):
    /// what a recorded graph is tied to.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Replace the disk cache (tests and tools point it at a directory of their own).
    pub fn set_disk_cache(&mut self, disk: DiskCache) {
        self.compiler = Compiler::new(disk);
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
    /// The device's streaming multiprocessors.
    pub fn sm_count(&self) -> u32 {
        self.sm_count
    }
    pub fn target(&self) -> &Target {
        &self.target
    }
    pub fn driver_version(&self) -> i32 {
        self.driver_version
    }
    pub fn compiler(&self) -> &Compiler {
        &self.compiler
    }
    /// Number of distinct kernels loaded in this runtime (the in-memory cache).
    pub fn loaded_kernels(&self) -> usize {
        self.loaded.len()
    }

    /// The loaded kernels named `name`: each one's local memory a thread, in bytes (what
    /// the driver's compile spilled; 0 for none).
    pub fn local_bytes(&self, name: &str) -> Vec<u32> {
        self.loaded.values().iter().filter(|k| k.name == name).map(|k| k.local_bytes).collect()
    }

    pub fn describe(&self) -> String {
        let name = self.ctx.name().unwrap_or_else(|_| "unknown device".into());
        let (ma, mi) = self.target.cc;
        format!("CUDA device {}: {name} (sm_{ma}{mi}, driver {})", self.ctx.ordinal(), self.driver_version)
    }

    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().map_err(driver("cuStreamSynchronize"))
    }

    /// Record the launches that `record` makes on this runtime, from this thread, into a
    /// CUDA graph instead of running them: nothing runs until [`CapturedGraph::replay`],
    /// which runs them on this runtime's stream. They are recorded on a side stream of
    /// their own, so launches of other threads on this runtime run as usual and are not
    /// recorded; only kernel launches are (a buffer copy or allocation inside `record`
    /// runs at once, on its stream). The graph holds the launches' arguments as they were
    /// (buffer addresses and lengths, scalars). Launch the kernels once before capturing
    /// them: a kernel that is not loaded yet is loaded during the capture, which the driver
    /// may refuse; a checked launch (`LaunchConfig::debug`) cannot be recorded.
    ///
    /// Fails with the first error of `record` or of the driver.
    ///
    /// ```no_run
    /// # fn main() -> dsl_runtime::Result<()> {
    /// use dsl_runtime::prelude::*;
    /// use dsl_runtime::{driver::CudaRuntime, LaunchConfig, Runtime};
    ///
    /// #[kernel]
    /// fn twice(x: Ptr<f32>, out: Ptr<f32>, n: i32) {
    ///     let offs = program_id(0) * 128 + arange::<128>();
    ///     store(out + offs, load(x + offs, offs < n, 0.0) * 2.0, offs < n);
    /// }
    ///
    /// let rt = Runtime::Cuda(CudaRuntime::new(0)?);
    /// let (x, mut y) = (rt.upload(&[1.0f32; 1000])?, rt.zeros::<f32>(1000)?);
    /// let cfg = LaunchConfig::grid(8);
    /// twice::launch(&rt, cfg, &x, &mut y, 1000)?; // loads the kernel
    /// let Runtime::Cuda(cuda) = &rt else { unreachable!() };
    /// let graph = cuda.capture(|| twice::launch(&rt, cfg, &x, &mut y, 1000))?;
    /// // SAFETY: `x` and `y`, the buffers the recorded launch uses, are alive.
    /// unsafe { graph.replay()? }; // the recorded launch, one driver call however many
    /// assert_eq!(y.to_vec()?, vec![2.0f32; 1000]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn capture(&self, record: impl FnOnce() -> Result<()>) -> Result<CapturedGraph> {
        self.ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        if CAPTURING.get().is_some() {
            return Err(Error::Capture("this thread is recording a capture already".into()));
        }
        /// The side stream, destroyed when the capture is over whatever happened.
        struct Side(sys::CUstream);
        impl Drop for Side {
            fn drop(&mut self) {
                // SAFETY: created below and destroyed only here; nothing ran on it (a
                // capturing stream records, it does not run).
                unsafe {
                    let _ = result::stream::destroy(self.0);
                }
            }
        }
        /// Ends this thread's recording, on return or unwinding.
        struct Recording;
        impl Drop for Recording {
            fn drop(&mut self) {
                CAPTURING.set(None);
            }
        }
        let side = Side(result::stream::create(result::stream::StreamKind::NonBlocking).map_err(driver("cuStreamCreate"))?);
        // SAFETY: `side.0` is a stream of this context (current), not capturing yet.
        unsafe { result::stream::begin_capture(side.0, sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) }.map_err(driver("cuStreamBeginCapture"))?;
        let recorded = {
            let _recording = Recording;
            CAPTURING.set(Some((self as *const CudaRuntime as usize, side.0 as usize)));
            record()
        };
        // End the capture whatever `record` did.
        // SAFETY: `side.0` is capturing (begun above) on this thread.
        let graph = unsafe { result::stream::end_capture(side.0) };
        if let Err(e) = recorded {
            if let Ok(g) = graph {
                if !g.is_null() {
                    // SAFETY: made by the capture, owned here, not used after.
                    unsafe {
                        let _ = result::graph::destroy(g);
                    }
                }
            }
            return Err(e);
        }
        let graph = graph.map_err(driver("cuStreamEndCapture"))?;
        if graph.is_null() {
            return Err(Error::Capture("the capture recorded nothing".into()));
        }
        // SAFETY: `graph` was just made by the capture and is owned here.
        let exec = match unsafe { result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) } {
            Ok(exec) => exec,
            Err(e) => {
                // SAFETY: as above; not used after.
                unsafe {
                    let _ = result::graph::destroy(graph);
                }
                return Err(driver("cuGraphInstantiate")(e));
            }
        };
        Ok(CapturedGraph { graph, exec, stream: self.stream.clone(), _modules: self.loaded.clone() })
    }

    /// The stream this launch goes to: the side stream of a capture this thread records on
    /// this runtime, else the runtime's own.
    fn launch_stream(&self) -> (sys::CUstream, bool) {
        match CAPTURING.get() {
            Some((rt, side)) if rt == self as *const CudaRuntime as usize => (side as sys::CUstream, true),
            _ => (self.stream.cu_stream(), false),
        }
    }

    fn load(&self, kernel: &dyn Kernel, specs: &[ParamSpec], opts: &CodegenOptions) -> Result<LoadedKernel> {
        let name: &str = &kernel.meta().name;
        self.ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        let ext = cubin_ext(self.target.cc, self.driver_version);
        let what = format!("kernel `{name}` (cubin)");
        let dump = dump_dir_for(name).is_some();
        // PTX (cached or compiled) → cubin (cached or JIT-linked) → module. PTX the driver
        // refuses is evicted and compiled again by `load_with`; a cubin that does not load
        // is linked again from the PTX and replaced.
        let loaded = self.compiler.load_with(kernel, specs, opts, |key, ptx| {
            if whole_program(ptx) {
                return load_ptx(ptx);
            }
            let cached = if dump { None } else { self.compiler.disk.load(key, &ext, &what) };
            if let Some(bin) = cached {
                match load_image(&bin) {
                    Ok(m) => return Ok(m),
                    Err(LoadError::Refused(e)) => {
                        warn(Warning::CacheRefused, format!("the cached cubin of kernel `{name}` did not load ({e}); linking it again"));
                        self.compiler.disk.evict(key, &ext);
                    }
                    Err(other) => return Err(other),
                }
            }
            let bin = jit_link(ptx)?;
            let m = load_image(&bin)?;
            self.compiler.disk.store(key, &ext, &bin, &what);
            Ok(m)
        })?;
        let (key, ptx, meta, module) = (loaded.key, loaded.ptx, loaded.meta, loaded.value);
        // Owned from here on: an error below unloads the module.
        let mut k = LoadedKernel { module, func: std::ptr::null_mut(), ctx: self.ctx.clone(), key, shared_bytes: 0, local_bytes: 0, name: name.to_string(), threads: 0, oob: None, checked: std::sync::Mutex::new(()), maps: vec![], memo: std::sync::Mutex::new([None; MAX_MAPS]) };
        let site = crate::compile::site(kernel, specs, None);
        let fail = |message: String| Error::Compile { site: site.clone(), stage: "load", message };
        let cname = CString::new(name).expect("kernel names are identifiers");
        // SAFETY: `k.module` is a module just loaded into this context (current on this
        // thread); `cname` is a NUL-terminated string alive for the call; the driver writes
        // one handle to `&mut k.func`.
        unsafe { sys::cuModuleGetFunction(&mut k.func, k.module, cname.as_ptr()) }
            .result()
            .map_err(|e| fail(format!("cuModuleGetFunction: {e}")))?;
        // The launch passes one 8-byte slot per parameter (4-byte values in its first
        // bytes), or a by-value parameter's own bytes: the compiled signature must be exactly
        // that, or the kernel would read garbage.
        let nptr = kernel.meta().pointer_params();
        let lens = if opts.safety == Safety::Guarded { nptr } else { 0 };
        let expected: Vec<(u32, u32)> = kernel.meta().params.iter().map(|(_, k)| k.slot()).chain(std::iter::repeat_n((8, 8), lens)).chain(std::iter::repeat_n((128, 64), meta.tensor_maps.len())).collect();
        let maps_in_place = meta.tensor_maps.iter().enumerate().all(|(i, m)| m.param as usize == expected.len() - meta.tensor_maps.len() + i && (m.ptr as usize) < kernel.meta().params.len() && m.batch.len() <= 3);
        if meta.tensor_maps.len() > MAX_MAPS || !maps_in_place {
            return Err(fail(format!("the compiled kernel's {} tensor maps are not the last of its parameters (at most {MAX_MAPS}, each of rank 5 at most)", meta.tensor_maps.len())));
        }
        k.maps = meta.tensor_maps.clone();
        if meta.name != name || meta.params.iter().map(|p| (p.bytes, p.align)).ne(expected.iter().copied()) {
            return Err(fail(format!(
                "the compiled kernel's signature ({} parameters: {:?}) does not match this launch ({} parameters: {:?}, as (bytes, alignment))",
                meta.params.len(),
                meta.params.iter().map(|p| format!("{} {}B", p.name, p.bytes)).collect::<Vec<_>>(),
                expected.len(),
                expected
            )));
        }
        let shared = meta.shared_bytes;
        if shared > 48 * 1024 {
            // Above 48 KB a kernel must opt in, up to the device's limit.
            let dev = self.ctx.cu_device();
            let mut max = 0;
            // SAFETY: `dev` is this context's device; the driver writes one `int` to `&mut max`.
            unsafe { sys::cuDeviceGetAttribute(&mut max, sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev) }
                .result()
                .map_err(driver("cuDeviceGetAttribute"))?;
            if shared > max as u64 {
                return Err(Error::Launch {
                    kernel: name.into(),
                    message: format!(
                        "this specialization needs {} KB of shared memory per program (layout conversions and reductions), but the device allows {} KB; use smaller blocks",
                        shared.div_ceil(1024),
                        max / 1024
                    ),
                });
            }
            // SAFETY: `k.func` is a valid function of a loaded module; `shared` is at most the
            // device's opt-in limit (checked above), so it fits the `int` the attribute takes.
            unsafe { sys::cuFuncSetAttribute(k.func, sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shared as i32) }
                .result()
                .map_err(driver("cuFuncSetAttribute"))?;
            tracing::info!("kernel `{name}` uses {} KB of dynamic shared memory (opted in above 48 KB)", shared.div_ceil(1024));
        }
        k.shared_bytes = shared as u32;
        let mut local = 0i32;
        // SAFETY: `k.func` is a valid function of a loaded module; the driver writes one
        // `int` to `&mut local`.
        unsafe { sys::cuFuncGetAttribute(&mut local, sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, k.func) }
            .result()
            .map_err(driver("cuFuncGetAttribute"))?;
        k.local_bytes = local.max(0) as u32;
        if local > 0 && !opts.debug {
            tracing::info!("kernel `{name}` uses {local} bytes of local memory a thread (register spills)");
        }
        // A warp-specialized kernel runs its producer warpgroup besides the launch's warps.
        k.threads = 32 * (opts.num_warps + meta.producer_warps);
        if meta.producer_warps > 4 || k.threads > 1024 {
            return Err(fail(format!("the compiled kernel runs {} producer warps besides {}: at most 4, and 1024 threads in all", meta.producer_warps, opts.num_warps)));
        }
        if opts.debug && opts.safety == Safety::Guarded && ptx.contains(OOB_RECORD) {
            // Present whenever the kernel accesses memory; a checked launch without its
            // record would check nothing, so a missing or mis-sized one is an error.
            let (mut addr, mut size) = (0, 0);
            let rec = CString::new(OOB_RECORD).expect("an identifier");
            // SAFETY: `k.module` is loaded in the current context; `rec` is NUL-terminated and
            // alive for the call; the driver writes a device address and a size to the two
            // `&mut` out-parameters (or fails, when the module has no such global).
            unsafe { sys::cuModuleGetGlobal_v2(&mut addr, &mut size, k.module, rec.as_ptr()) }
                .result()
                .map_err(|e| fail(format!("the out-of-bounds record of a checked launch: {e}")))?;
            if size != 8 * OOB_WORDS {
                return Err(fail(format!("the out-of-bounds record has {size} bytes, not {}", 8 * OOB_WORDS)));
            }
            k.oob = Some(addr);
        }
        Ok(k)
    }
}

/// The cache extension of machine code: it depends on the device's compute capability and
/// the driver that linked it, besides everything in the PTX key.
pub fn cubin_ext(cc: (u32, u32), driver_version: i32) -> String {
    format!("sm{}{}-drv{driver_version}.cubin", cc.0, cc.1)
}

/// Load a cubin made by [`jit_link`] into the current context.
fn load_image(image: &[u8]) -> std::result::Result<sys::CUmodule, LoadError> {
    let mut module = std::ptr::null_mut();
    // SAFETY: `image` is alive and unchanged during the call, and the driver copies what it
    // keeps. The driver takes no length: it reads the image's size from its ELF headers, so
    // the bytes must be a whole cubin. They are: either `jit_link`'s output, or a disk-cache
    // entry holding such output whose BLAKE3 checksum was verified on read (a torn or damaged
    // file is a miss). The cache directory is trusted as the user's own files, as the PTX in
    // it is. The driver writes one handle to `&mut module`; the caller's context is current.
    unsafe { sys::cuModuleLoadData(&mut module, image.as_ptr() as *const c_void) }.result().map_err(|e| load_error("cuModuleLoadData", e, String::new()))?;
    Ok(module)
}

/// A driver error of a load or link call: [`LoadError::Refused`] when the driver refused
/// the program itself, [`LoadError::Other`] otherwise (out of memory, a broken context...).
fn load_error(call: &'static str, e: cudarc::driver::DriverError, log: String) -> LoadError {
    use sys::cudaError_enum::*;
    match e.0 {
        CUDA_ERROR_INVALID_PTX | CUDA_ERROR_UNSUPPORTED_PTX_VERSION | CUDA_ERROR_INVALID_IMAGE | CUDA_ERROR_NO_BINARY_FOR_GPU | CUDA_ERROR_INVALID_SOURCE => {
            LoadError::Refused(if log.is_empty() { format!("{call}: {e}") } else { format!("{call}: {e}: {log}") })
        }
        _ => LoadError::Other(Error::Driver { call, source: e }),
    }
}

/// Whether `ptx` must be compiled as a whole program rather than through the JIT linker:
/// a warp-specialized kernel's `setmaxnreg`, which the linker's compile ignores ("'setmaxnreg'
/// ignored to maintain compatibility across compilation units", driver 580): its consumers
/// would keep the entry's registers (168 at 384 threads) and spill in their loop, as
/// measured on the attention forward (BENCHMARKS.md, "The JIT linker ignores setmaxnreg").
fn whole_program(ptx: &str) -> bool {
    ptx.contains("setmaxnreg")
}

/// PTX → module by the driver's compiler as a whole program (`cuModuleLoadDataEx`), with
/// its error log on failure. No cubin comes back to cache: the driver keeps the machine
/// code in its own JIT cache (`CUDA_CACHE_PATH`), so a later process loads it without
/// compiling.
fn load_ptx(ptx: &str) -> std::result::Result<sys::CUmodule, LoadError> {
    let mut log = vec![0u8; 16384];
    let mut opts = [sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER, sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES];
    let mut vals = [log.as_mut_ptr() as *mut c_void, log.len() as *mut c_void];
    let src = CString::new(ptx).map_err(|_| LoadError::Refused("PTX contains a NUL byte".to_string()))?;
    let mut module = std::ptr::null_mut();
    // SAFETY: the two option arrays hold `2` entries, as passed; the log buffer they name is
    // `log`, valid for `log.len()` bytes and alive (and not otherwise accessed) during the
    // call, the only one that writes it (the size is an integer cast to a pointer, the form
    // the driver wants for integer options). `src` is NUL-terminated and alive; the driver
    // only reads it and copies what it keeps. The driver writes one handle to `&mut module`;
    // the caller's context is current.
    let r = unsafe { sys::cuModuleLoadDataEx(&mut module, src.as_ptr() as *const c_void, 2, opts.as_mut_ptr(), vals.as_mut_ptr()) };
    r.result().map_err(|e| load_error("cuModuleLoadDataEx", e, String::from_utf8_lossy(&log).trim_end_matches('\0').trim().to_string()))?;
    Ok(module)
}

/// PTX → cubin through the driver's JIT linker, with its error log on failure.
fn jit_link(ptx: &str) -> std::result::Result<Vec<u8>, LoadError> {
    let mut log = vec![0u8; 16384];
    let mut opts = [sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER, sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES];
    let mut vals = [log.as_mut_ptr() as *mut c_void, log.len() as *mut c_void];
    let src = CString::new(ptx).map_err(|_| LoadError::Refused("PTX contains a NUL byte".to_string()))?;
    let log_text = |log: &[u8]| String::from_utf8_lossy(log).trim_end_matches('\0').trim().to_string();
    // SAFETY: the two option arrays hold `2` entries, as passed, and the driver reads them
    // during `cuLinkCreate` (the size is an integer cast to a pointer, the form the driver
    // wants for integer options). The log buffer they name is `log`, valid for `log.len()`
    // bytes and alive (and not otherwise accessed) until after `cuLinkDestroy`, the last
    // call that may write it. `src` is NUL-terminated, alive, and its length includes the
    // NUL as `cuLinkAddData` asks; the driver only reads it (the `*mut` is the C
    // signature). The image `cuLinkComplete` returns belongs to the link state: it is
    // copied out (after a null check) before `cuLinkDestroy` frees it, and the state is
    // destroyed exactly once, on every path after a successful `cuLinkCreate`.
    unsafe {
        let mut state = std::ptr::null_mut();
        sys::cuLinkCreate_v2(2, opts.as_mut_ptr(), vals.as_mut_ptr(), &mut state).result().map_err(|e| load_error("cuLinkCreate", e, String::new()))?;
        let r = (|| {
            sys::cuLinkAddData_v2(
                state,
                sys::CUjitInputType::CU_JIT_INPUT_PTX,
                src.as_ptr() as *mut c_void,
                src.as_bytes_with_nul().len(),
                c"kernel.ptx".as_ptr(),
                0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
            .result()
            .map_err(|e| load_error("cuLinkAddData", e, log_text(&log)))?;
            let mut cubin = std::ptr::null_mut();
            let mut size = 0usize;
            sys::cuLinkComplete(state, &mut cubin, &mut size).result().map_err(|e| load_error("cuLinkComplete", e, log_text(&log)))?;
            if cubin.is_null() || size == 0 {
                return Err(LoadError::Refused("cuLinkComplete returned no image".to_string()));
            }
            Ok(std::slice::from_raw_parts(cubin as *const u8, size).to_vec())
        })();
        sys::cuLinkDestroy(state);
        r
    }
}

impl CudaRuntime {
    /// A buffer of another context (or device) would fault on the device, poisoning this
    /// context: refuse it. A `CudaSlice` says its context for free; for views the driver
    /// is asked (one `cuPointerGetAttribute`).
    fn check_context(&self, kernel: &str, param: &str, addr: u64, ctx: usize) -> Result<()> {
        let ours = self.ctx.cu_ctx() as usize;
        let theirs = if ctx != 0 {
            Ok(ctx)
        } else {
            let mut c: sys::CUcontext = std::ptr::null_mut();
            // SAFETY: for `CU_POINTER_ATTRIBUTE_CONTEXT` the driver writes one `CUcontext` to
            // `data`, which points to `c`, a `CUcontext`. `addr` is only looked up: the driver
            // answers an error for an address it did not allocate, and nothing is accessed.
            unsafe { sys::cuPointerGetAttribute(&mut c as *mut _ as *mut c_void, sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_CONTEXT, addr) }
                .result()
                .map(|()| c as usize)
        };
        let ordinal = || {
            // Memory from a stream-ordered pool (cuMemAllocAsync) has no context: compare
            // devices instead.
            let mut dev: i32 = -1;
            // SAFETY: for `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL` the driver writes one `int`
            // to `data`, which points to `dev`, an `i32`; `addr` is only looked up, as above.
            unsafe { sys::cuPointerGetAttribute(&mut dev as *mut _ as *mut c_void, sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, addr) }
                .result()
                .map(|()| dev)
        };
        match theirs {
            Ok(c) if c == ours => Ok(()),
            Ok(0) if ordinal().is_ok_and(|d| d == self.ctx.ordinal() as i32) => Ok(()),
            Ok(_) => Err(Error::Launch {
                kernel: kernel.into(),
                message: format!("argument `{param}` is memory of another CUDA context or device than this runtime's ({})", self.describe()),
            }),
            Err(e) => Err(Error::Launch { kernel: kernel.into(), message: format!("argument `{param}` is not CUDA device memory ({e})") }),
        }
    }

    /// After a checked launch: wait for it, and turn a claimed out-of-bounds record into
    /// the error the interpreter gives for the same access (then clear the record).
    fn check_oob(&self, kernel: &dyn Kernel, spec: SpecKey, addr: u64) -> Result<()> {
        // On the heap, so that it can outlive this call if the copy cannot be waited for.
        let mut rec = Box::new([0u64; OOB_WORDS]);
        let st = self.stream.cu_stream();
        // SAFETY: `addr` is the device address of the module global `rutile_oob`, checked to
        // be `8 * OOB_WORDS` bytes when the kernel was loaded, and the module stays loaded
        // while `k` (held by our caller) lives. The destination is `rec`, exactly that many
        // writable bytes, not accessed until the copy is known to be complete: after the
        // stream synchronizes below, or never (it is leaked when synchronization fails).
        // `st` is this runtime's stream, in the current context.
        unsafe {
            sys::cuMemcpyDtoHAsync_v2(rec.as_mut_ptr() as *mut c_void, addr, std::mem::size_of_val(&*rec), st).result().map_err(driver("cuMemcpyDtoHAsync"))?;
        }
        if let Err(e) = self.synchronize() {
            // The copy may still be pending: its destination must stay valid.
            Box::leak(rec);
            return Err(e);
        }
        if rec[0] == 0 {
            return Ok(());
        }
        // SAFETY: the same `8 * OOB_WORDS` bytes of device memory as above, cleared in stream
        // order; no host memory is involved.
        unsafe { sys::cuMemsetD8Async(addr, 0, std::mem::size_of_val(&*rec), st) }.result().map_err(driver("cuMemsetD8Async"))?;
        let meta = kernel.meta();
        let (param, access) = ((rec[1] & 0xffff_ffff) as usize, Access::from_code(rec[1] >> 32));
        let loc = Loc::new((rec[2] & 0xffff_ffff) as u32, (rec[2] >> 32) as u32);
        let name = meta.params.get(param).map(|p| &*p.0).unwrap_or("?");
        let (specs, _) = spec.unpack(meta);
        Err(Error::Interpret {
            site: crate::compile::site(kernel, &specs, Some(loc)),
            message: format!(
                "program ({}, {}, {}): {}, found by a checked launch",
                rec[3],
                rec[4],
                rec[5],
                crate::error::out_of_bounds(access.name(), name, rec[6] as i64, rec[7])
            ),
        })
    }
}

/// Most tensor maps a kernel takes (one per TMA-loaded tile of its pipelined loop).
pub const MAX_MAPS: usize = 8;

/// An integer the host knows: an `i32`/`i64` argument or a constant.
fn host_int(h: HostInt, args: &[Arg<'_>]) -> Option<i64> {
    match h {
        HostInt::Const(c) => Some(c),
        HostInt::Param(i) => match args.get(i as usize)? {
            Arg::I32(x) => Some(*x as i64),
            Arg::I64(x) => Some(*x),
            _ => None,
        },
    }
}

/// Everything of a launch's arguments that tensor map `m` depends on: the buffer's address
/// and length (0 and 0 for an empty host slice), the extents, the row stride and the batch
/// strides (0 where the map has fewer): what [`CudaRuntime::encode_map`] encodes, and the
/// key of the kernel's memo of its last encoding.
fn map_inputs(kernel: &str, m: &TensorMap, meta: &crate::launch::KernelMeta, args: &[Arg<'_>]) -> Result<[i64; 8]> {
    let name = &meta.params[m.ptr as usize].0;
    let fail = |message: String| Error::Launch { kernel: kernel.into(), message };
    let (addr, len) = match args.get(m.ptr as usize) {
        Some(Arg::Device { addr, len, .. }) => (*addr as i64, *len as i64),
        Some(Arg::Host { len: 0, .. }) => (0, 0),
        _ => return Err(fail(format!("argument `{name}` is not a device buffer"))),
    };
    let value = |h: HostInt| host_int(h, args).ok_or_else(|| fail(format!("a tensor map of `{name}` needs an integer argument that is not one")));
    let mut key = [addr, len, value(m.dims[0])?, value(m.dims[1])?, value(m.stride)?, 0, 0, 0];
    for (k, &b) in key[5..].iter_mut().zip(&m.batch) {
        *k = value(b)?;
    }
    Ok(key)
}

impl CudaRuntime {
    /// Tensor map `m` of buffer argument `name` from its [`map_inputs`]
    /// (`cuTensorMapEncodeTiled`): the matrix of `dims` elements with rows `stride` apart
    /// at the buffer's address, after checking that it lies inside the buffer (the launch
    /// is refused otherwise: the copies would read past the buffer where the kernel's masks
    /// say the matrix is). A matrix with no elements reads as zeros (a map over a zeroed
    /// scratch buffer), and a store to one writes to a scratch buffer nothing reads.
    fn encode_map(&self, kernel: &str, m: &TensorMap, name: &str, inputs: [i64; 8]) -> Result<sys::CUtensorMap> {
        let fail = |message: String| Error::Launch { kernel: kernel.into(), message };
        let [addr, len, cols, rows, stride, ..] = inputs;
        let (addr, batch) = (addr as u64, &inputs[5..5 + m.batch.len()]);
        let size = m.elem_bytes as i64;
        let rank = 2 + batch.len();
        let mut dims = [1u64; 5];
        let mut strides = [0u64; 4];
        let mut base = addr;
        if cols <= 0 || rows <= 0 {
            // Nothing inside the matrix: every copy reads zeros (a map of one element of a
            // zeroed scratch buffer; the copies' coordinates are past it), and a store
            // writes where nothing reads.
            let zeros = match self.zeros.get() {
                Some(z) => z,
                None => {
                    let z = self.stream.alloc_zeros::<u8>(32).map_err(driver("cuMemAlloc"))?;
                    let _ = self.zeros.set(z);
                    self.zeros.get().expect("set")
                }
            };
            base = cudarc::driver::DevicePtr::device_ptr(zeros, &self.stream).0 + if m.store { 16 } else { 0 };
            for (i, s) in strides.iter_mut().enumerate().take(rank - 1) {
                *s = 16 << i;
            }
        } else {
            let extent = (rows - 1).checked_mul(stride).and_then(|x| x.checked_add(cols));
            let bad_stride = |s: i64| s < 0 || (s * size) % 16 != 0;
            if stride <= 0 || bad_stride(stride) || batch.iter().any(|&s| bad_stride(s)) || extent.is_none_or(|e| e > len) || addr % 16 != 0 {
                let (access, off) = if m.store { ("written", "LaunchConfig::tma_store(false) to write") } else { ("read", "LaunchConfig::tma(false) to read") };
                return Err(fail(format!(
                    "argument `{name}` ({len} elements) is {access} by TMA as a {rows} x {cols} matrix with rows {stride} elements apart{}, which does not lie inside it (launch with {off} it element by element under the kernel's masks)",
                    if batch.is_empty() { String::new() } else { format!(", repeated {batch:?} elements apart") }
                )));
            }
            (dims[0], dims[1], strides[0]) = (cols as u64, rows as u64, (stride * size) as u64);
            // Batch extents: as many as fit the buffer, the widest stride first (the true
            // extents for any tensor that fills its buffer, [B, H, T, D] or [B, T, H, D]).
            // A stride of 0 (a matrix shared along that dimension) has one entry, which
            // the kernel's coordinate 0 reads.
            let mut rest = len - extent.expect("checked");
            let mut order: Vec<usize> = (0..batch.len()).collect();
            order.sort_by_key(|&j| std::cmp::Reverse(batch[j]));
            for j in order {
                let s = batch[j];
                let e = if s == 0 { 1 } else { 1 + rest / s };
                rest -= (e - 1) * s;
                dims[2 + j] = e.min(1 << 31) as u64;
                strides[1 + j] = if s == 0 { strides[0] } else { (s * size) as u64 };
            }
        }
        let dtype = match m.elem.as_str() {
            "bf16" => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
            "f32" => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
            _ => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        };
        let swizzle = match m.swizzle {
            128 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            64 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_64B,
            32 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_32B,
            s => return Err(fail(format!("a tensor map with a {s}-byte swizzle"))),
        };
        let boxed = [m.boxed[0], m.boxed[1], 1, 1, 1];
        let unit = [1u32; 5];
        // SAFETY: a plain C struct of integers, for which all-zero bytes are a valid value.
        let mut map: sys::CUtensorMap = unsafe { std::mem::zeroed() };
        // SAFETY: the driver writes one map to `&mut map` and reads `rank` dims, box extents
        // and element strides and `rank - 1` strides from arrays at least that long, alive
        // for the call; the address is not dereferenced here (the map only records it).
        unsafe {
            sys::cuTensorMapEncodeTiled(
                &mut map,
                dtype,
                rank as u32,
                base as *mut c_void,
                dims.as_ptr(),
                strides.as_ptr(),
                boxed.as_ptr(),
                unit.as_ptr(),
                sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                swizzle,
                sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
        }
        .result()
        .map_err(|e| fail(format!("cuTensorMapEncodeTiled for `{name}` (dims {:?}, strides {:?} bytes, box {:?}): {e}", &dims[..rank], &strides[..rank - 1], &boxed[..rank])))?;
        Ok(map)
    }
}

impl Drop for CudaRuntime {
    /// Wait for the kernels launched on this runtime's stream before their modules are
    /// unloaded (the loaded kernels are dropped right after this).
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            let _ = self.stream.synchronize();
        }
    }
}

impl Launcher for CudaRuntime {
    fn cuda_stream(&self) -> Option<&CudaStream> {
        Some(&self.stream)
    }

    /// The hot path of every launch: no allocation, one uncontended lock and one hash
    /// lookup before `cuLaunchKernel`.
    unsafe fn launch_args(&self, kernel: &dyn Kernel, cfg: &LaunchConfig, args: &[Arg<'_>], safety: Safety) -> Result<()> {
        let meta = kernel.meta();
        cfg.validate(&meta.name)?;
        let spec = SpecKey::of(meta, args)?;
        // Kernel parameters by value: the arguments, then (guarded) the buffer lengths.
        let mut slots = [0u64; 2 * MAX_PARAMS];
        let mut nslots = args.len();
        for (i, ((name, _), a)) in meta.params.iter().zip(args).enumerate() {
            slots[i] = match *a {
                Arg::Device { addr, len, ctx, .. } => {
                    if len > 0 {
                        self.check_context(&meta.name, name, addr, ctx)?;
                    }
                    if safety == Safety::Guarded {
                        slots[nslots] = len as u64;
                        nslots += 1;
                    }
                    addr
                }
                // An empty host slice has nothing to read or write: on the GPU too it is a
                // null pointer of length 0, a placeholder for a pointer the kernel does not
                // access (guarded, every access through it is suppressed).
                Arg::Host { len: 0, .. } => {
                    if safety == Safety::Guarded {
                        slots[nslots] = 0;
                        nslots += 1;
                    }
                    0
                }
                Arg::Host { .. } => {
                    return Err(Error::Launch {
                        kernel: meta.name.to_string(),
                        message: format!("argument `{name}` is host memory; upload it (Runtime::upload) before a CUDA launch"),
                    })
                }
                Arg::I32(x) => x as u32 as u64,
                Arg::I64(x) => x as u64,
                Arg::F32(x) => x.to_bits() as u64,
                Arg::Bytes(_) => 0, // passed from the argument's own bytes (below)
            };
        }
        if cfg.is_empty() {
            return Ok(());
        }
        let key = LaunchKey::new(kernel, spec, cfg, safety);
        // Loaded kernels cost one lock and one lookup; a kernel that is not loaded yet is
        // loaded (compiled) outside the lock, once however many threads launch it.
        let k = self.loaded.get_or_try_insert_with(&key, || {
            let (specs, lens) = spec.unpack(meta);
            let opts = CodegenOptions::for_launch(cfg, safety, lens, self.target.clone());
            self.load(kernel, &specs, &opts).map(Arc::new)
        })?;
        let mut params = [std::ptr::null_mut::<c_void>(); 2 * MAX_PARAMS + MAX_MAPS];
        for (i, (p, s)) in params.iter_mut().zip(slots.iter_mut()).take(nslots).enumerate() {
            *p = match args.get(i) {
                Some(Arg::Bytes(b)) => b.as_ptr() as *mut c_void,
                _ => s as *mut u64 as *mut c_void,
            };
        }
        // Tensor maps: encoded from this launch's arguments, passed after the lengths.
        // SAFETY: a plain C struct of integers, for which all-zero bytes are a valid value.
        let mut maps: [sys::CUtensorMap; MAX_MAPS] = unsafe { std::mem::zeroed() };
        if !k.maps.is_empty() {
            // The last arguments each map was encoded from, and the map: a launch on the same
            // buffers and sizes (every call of a loop, a tuner's repeats) reuses it.
            let mut memo = k.memo.lock().map_err(|_| Error::Launch { kernel: meta.name.to_string(), message: "a launch panicked while encoding a tensor map".into() })?;
            for (i, m) in k.maps.iter().enumerate() {
                let key = map_inputs(&meta.name, m, meta, args)?;
                maps[i] = match &memo[i] {
                    Some((last, map)) if *last == key => *map,
                    _ => {
                        let map = self.encode_map(&meta.name, m, &meta.params[m.ptr as usize].0, key)?;
                        memo[i] = Some((key, map));
                        map
                    }
                };
            }
        }
        for (p, m) in params[nslots..].iter_mut().zip(maps.iter_mut()).take(k.maps.len()) {
            *p = m as *mut sys::CUtensorMap as *mut c_void;
        }
        let nslots = nslots + k.maps.len();
        self.ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        let (stream, recording) = self.launch_stream();
        if recording && k.oob.is_some() {
            return Err(Error::Capture(format!("kernel `{}`: a checked launch reads its record back after the kernel, which a CUDA graph cannot record", meta.name)));
        }
        let [gx, gy, gz] = cfg.grid;
        // A checked launch owns its kernel's record from the launch to the read-back, so
        // that two threads' checked launches of one kernel never read each other's report.
        let _record = match k.oob {
            Some(_) => Some(k.checked.lock().map_err(|_| Error::Launch { kernel: meta.name.to_string(), message: "a checked launch panicked".into() })?),
            None => None,
        };
        // SAFETY: what `cuLaunchKernel` requires, in order:
        // - `k.func` is a function of a module loaded into `self.ctx`, which is current on
        //   this thread, and the module stays loaded while `k` lives (until after this call;
        //   queued launches are waited for before it is unloaded, see `LoadedKernel::drop`).
        //   `stream` is this runtime's, or the side stream of a capture this thread is
        //   recording (`launch_stream`): the launch is recorded, not run, and the graph keeps
        //   the module loaded (`CapturedGraph`).
        // - `params[..nslots]` holds one pointer per kernel parameter, in the kernel's order:
        //   the arguments, then (guarded, as `safety` is part of the key that found `k`) one
        //   `i64` length per pointer parameter. Each points to a live `u64` in `slots`, which
        //   the driver copies before returning. Pointers and `i64`s are 8 bytes; `i32` and
        //   `f32` parameters read the first 4 bytes of their slot, which hold the value on
        //   this little-endian host (asserted at compile time below). A by-value parameter
        //   points to its argument's bytes, as many as the parameter has (`SpecKey::of`
        //   checked the length; `load` checked the compiled signature), borrowed by `args`
        //   for this call.
        // - grid and block are within CUDA's limits (`cfg.validate`), and `k.shared_bytes`
        //   is what the module needs, opted in above 48 KB when it was loaded.
        // - the device memory the kernel may touch: each pointer argument is an `Arg::Device`
        //   made by the `InPtr`/`OutPtr` bindings from a live cudarc buffer of this context
        //   (`check_context`), borrowed by the caller until this call returns and kept alive
        //   past the kernel's end by cudarc's stream ordering (the `Bindings` events, or one
        //   stream); writable ones are borrowed `&mut`, so no other argument aliases them. A
        //   guarded launch masks off every access outside `[addr, addr + len)`; an unchecked
        //   one relies on the caller of `launch_unchecked`, whose contract says the masks do.
        //   (`launch_args` itself is safe and trusts its `args` and `safety`: see `Arg`.)
        // - with clusters, `cuLaunchKernelEx` takes the same function, parameters, grid, block,
        //   shared memory and stream, and one attribute that lives on this frame for the call;
        //   `cfg.validate` checked that the cluster divides the grid and is at most 8.
        if cfg.clustered() {
            // SAFETY: a plain C struct (an id, padding, a union of plain values), for which
            // all-zero bytes are a valid value; the fields used are set below.
            let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
            attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
            attr.value.clusterDim = sys::CUlaunchAttributeValue_union__bindgen_ty_1 { x: cfg.cluster[0], y: cfg.cluster[1], z: cfg.cluster[2] };
            let config = sys::CUlaunchConfig {
                gridDimX: gx,
                gridDimY: gy,
                gridDimZ: gz,
                blockDimX: k.threads,
                blockDimY: 1,
                blockDimZ: 1,
                sharedMemBytes: k.shared_bytes,
                hStream: stream,
                attrs: &mut attr,
                numAttrs: 1,
            };
            unsafe { sys::cuLaunchKernelEx(&config, k.func, params.as_mut_ptr(), std::ptr::null_mut()) }.result().map_err(driver("cuLaunchKernelEx"))?;
        } else {
            unsafe { result::launch_kernel(k.func, (gx, gy, gz), (k.threads, 1, 1), k.shared_bytes, stream, &mut params[..nslots]) }
                .map_err(driver("cuLaunchKernel"))?;
        }
        match k.oob {
            Some(addr) => self.check_oob(kernel, spec, addr),
            None => Ok(()),
        }
    }
}
