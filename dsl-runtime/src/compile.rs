//! The compile pipeline, stage by stage. Each stage produces an artifact named for what
//! it is (Triton's naming):
//!
//! | stage | produces | where |
//! |---|---|---|
//! | build | `ir`: block IR, specialized | [`build_ir`] ([`ir::Builder`](crate::ir::Builder) driven by the `#[kernel]` expansion) |
//! | optimize, plan | `opt.ir`: guarded, simplified IR with its `convert_layout`s and every block value's layout (`#L<n>`, defined at the top); vector widths, shared-memory offsets | `passes::optimize`, `passes::plan` |
//! | lower | `ll`: LLVM IR | `lower::lower` |
//! | emit | `ptx` | [`emit::emit_ptx`](crate::emit::emit_ptx) |
//! | load | module (cubin cached) | [`driver`](crate::driver) |
//!
//! [`Compiler`] runs the stages behind the disk cache and the dump switch:
//! `RUTILE_DUMP=relu_mul_add` (a comma list of kernel names, or `all`) recompiles the
//! named kernels, bypassing the cache, and writes every artifact to `RUTILE_DUMP_DIR`
//! (default `./rutile-dump`).

use crate::cache::DiskCache;
use crate::diag::{warn, Warning};
use crate::emit::{emit_ptx, llvm_version, Target};
use crate::error::{Error, KernelSite, Result};
use crate::ir::{printer::print, Builder, Function, Loc, ParamKind, ParamSpec};
use crate::launch::{describe_spec, Kernel, LaunchConfig, Safety};
use crate::passes::{self, PassOptions};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Where a kernel error happened.
pub fn site(kernel: &dyn Kernel, specs: &[ParamSpec], loc: Option<Loc>) -> KernelSite {
    let meta = kernel.meta();
    let at = match loc {
        Some(l) if l.line > 0 => format!("{}:{}:{}", l.file.unwrap_or(&meta.file), l.line, l.col),
        _ => format!("{}:{}", meta.file, meta.line),
    };
    KernelSite { kernel: meta.name.to_string(), spec: describe_spec(kernel, specs), at: Some(at) }
}

/// Stage 1: run the kernel's builder with this specialization.
pub fn build_ir(kernel: &dyn Kernel, specs: &[ParamSpec]) -> Result<Function> {
    let meta = kernel.meta();
    let params: Vec<(&str, ParamKind)> = meta.params.iter().map(|(n, k)| (&**n, *k)).collect();
    let mut b = Builder::specialized(&meta.name, &params, specs);
    for (k, v) in kernel.constants() {
        b.constant_value(k, v);
    }
    let fail = |e: crate::BuildError| Error::Build { site: site(kernel, specs, Some(e.loc)), message: e.message };
    kernel.build(&mut b).map_err(fail)?;
    b.finish().map_err(fail)
}

/// A kernel's fingerprint for this specialization: a hash (32 hex digits) of the IR it
/// builds, without source locations. Editing the kernel's body, its parameters or its
/// compile-time constants changes it; moving it in its file does not. The autotuner keys
/// its stored timings by it. It does not depend on how the kernel was made: a `#[kernel]`
/// and a built kernel that build the same IR have the same fingerprint (their code is the
/// same), though their [`KernelId`](crate::launch::KernelId)s differ.
pub fn kernel_fingerprint(kernel: &dyn Kernel, specs: &[ParamSpec]) -> Result<String> {
    let f = build_ir(kernel, specs)?;
    // Before this function existed the autotuner hashed the same text without a tag;
    // keeping that formula keeps the timings it stored valid.
    Ok(blake3::hash(print(&f, false).as_bytes()).to_hex()[..32].to_string())
}

/// The identity of a kernel built at run time from its unspecialized IR `f`: 128 bits of a
/// BLAKE3 hash of `f`'s text with source locations (debug builds compile line numbers into
/// the code, so two bodies that differ only there are different kernels). Stable across
/// processes and machines for one compiler version.
pub fn ir_identity(f: &Function) -> u128 {
    let mut h = blake3::Hasher::new();
    h.update(b"rutile-kernel-id\0");
    h.update(print(f, true).as_bytes());
    let mut id = [0u8; 16];
    id.copy_from_slice(&h.finalize().as_bytes()[..16]);
    u128::from_le_bytes(id)
}

/// Everything besides the IR that selects the generated code: part of every cache key
/// (hashed through its `Debug` text, so a new field is in the key with no further work).
///
/// This is where later code-generation options go (register limits, CTAs per cluster,
/// FP contraction, ...). Adding one:
/// 1. a field here, documented with what it changes and its default;
/// 2. if launches choose it, a [`LaunchConfig`] field with a builder method and a check in
///    [`LaunchConfig::validate`], copied here by [`for_launch`](CodegenOptions::for_launch),
///    the one place where a launch's settings become codegen options (the driver and the
///    interpreter's `RUTILE_DUMP` both use it, so they compile the same thing);
/// 3. the pass or lowering that reads it. Until one does, say so on the field, as
///    `num_stages` does: the autotuner relies on that to skip candidates that would
///    compile to the same code ([`num_stages_changes_code`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CodegenOptions {
    pub num_warps: u32,
    /// Software-pipelining depth ([`LaunchConfig::num_stages`]); 1 for none. Read by
    /// the pipeliner (`passes::pipeline`) and the register prefetch (`passes::prefetch`).
    pub num_stages: u32,
    pub safety: Safety,
    /// Properties of the buffer lengths (guarded launches only).
    pub len_specs: Vec<ParamSpec>,
    pub target: Target,
    /// Keep device asserts and prints.
    pub debug: bool,
    /// Tensor-core `dot`s may use `wgmma` where the target is sm_90a
    /// ([`LaunchConfig::wgmma`]); read by the layout pass (`passes::layout::dot_plan`).
    pub wgmma: bool,
    /// Pipelined `wgmma` operand tiles may be loaded by TMA ([`LaunchConfig::tma`]); read
    /// by the pipeliner (`passes::pipeline`). Debug builds keep `cp.async`, whose accesses
    /// the bounds check sees one by one.
    pub tma: bool,
    /// Whole tiles may be stored by TMA ([`LaunchConfig::tma_store`]); read by
    /// `passes::tma::stores`. Debug builds keep plain stores, whose accesses the bounds
    /// check sees.
    pub tma_store: bool,
    /// A TMA loop may be warp-specialized ([`LaunchConfig::warp_specialize`]); read by the
    /// pipeliner.
    pub warp_specialize: bool,
    /// Programs an SM must fit at once ([`LaunchConfig::min_programs_per_sm`]); read by
    /// the lowering (`minctasm`).
    pub min_programs_per_sm: u32,
    /// Loads that shared memory does not take are prefetched in pipelined loops
    /// ([`LaunchConfig::prefetch`]); read by `passes::prefetch`.
    pub prefetch: bool,
}

/// Whether [`CodegenOptions::num_stages`] may change the code of `kernel`: only where a
/// loop multiplies tensor-core operands (`dot`), which the pipeliner may pipeline, or
/// loads from memory, which register prefetch may issue an iteration ahead. For other
/// kernels launches that differ only in `num_stages` compile (and are cached) apart but to
/// the same PTX, and the autotuner times only the first of such candidates.
pub fn num_stages_changes_code(kernel: &dyn Kernel) -> Result<bool> {
    let specs = vec![ParamSpec::default(); kernel.meta().params.len()];
    Ok(passes::pipeline::may_pipeline(&build_ir(kernel, &specs)?))
}

impl CodegenOptions {
    /// The options of a launch with `cfg` and `safety` for `target`; `len_specs` are the
    /// properties of the buffer lengths (from [`SpecKey::unpack`](crate::launch::SpecKey::unpack)),
    /// kept for guarded launches only.
    pub fn for_launch(cfg: &LaunchConfig, safety: Safety, len_specs: Vec<ParamSpec>, target: Target) -> CodegenOptions {
        CodegenOptions {
            num_warps: cfg.num_warps,
            num_stages: cfg.num_stages,
            safety,
            len_specs: if safety == Safety::Guarded { len_specs } else { vec![] },
            target,
            debug: cfg.debug,
            wgmma: cfg.wgmma,
            tma: cfg.tma,
            tma_store: cfg.tma_store,
            warp_specialize: cfg.warp_specialize,
            min_programs_per_sm: cfg.min_programs_per_sm,
            prefetch: cfg.prefetch,
        }
    }

    fn pass_options(&self) -> PassOptions {
        PassOptions { bounds_guard: (self.safety == Safety::Guarded).then(|| self.len_specs.clone()), debug: self.debug }
    }
}

/// A hash of this compiler's own sources, computed when it was built (`build.rs`). It is
/// part of every cache key and of every tuning result's identity, so PTX, cubins and
/// timings produced by an older compiler are never used by a newer one.
pub const COMPILER_FINGERPRINT: &str = env!("RUTILE_COMPILER_FINGERPRINT");

/// The disk-cache key of a kernel compiled by this compiler: see [`cache_key_for`].
pub fn cache_key(f: &Function, opts: &CodegenOptions) -> String {
    cache_key_for(COMPILER_FINGERPRINT, f, opts)
}

/// The disk-cache key of a kernel: a hash of the compiler's fingerprint, LLVM's version,
/// the specialized IR (without source locations, so moving a kernel in its file does not
/// recompile it, except in debug builds, whose code names lines) and the codegen options.
pub fn cache_key_for(fingerprint: &str, f: &Function, opts: &CodegenOptions) -> String {
    let mut h = blake3::Hasher::new();
    h.update(b"rutile-ptx\0");
    h.update(fingerprint.as_bytes());
    h.update(b"\0");
    h.update(llvm_version().as_bytes());
    // Debug builds put source lines into the code (`device_assert` messages, the
    // out-of-bounds record of checked launches): there, moving the kernel must recompile it.
    h.update(print(f, opts.debug).as_bytes());
    h.update(format!("{opts:?}").as_bytes());
    h.finalize().to_hex()[..32].to_string()
}

/// Every artifact of one compile.
#[derive(Clone, Debug)]
pub struct Artifacts {
    pub key: String,
    pub ir: String,
    pub opt_ir: String,
    pub llir: String,
    pub ptx: String,
    /// What a launch needs besides the code.
    pub meta: CompiledMeta,
}

pub use crate::passes::tma::TensorMap;

/// The version of [`CompiledMeta`]'s format; a record of another version is a cache miss.
pub const META_VERSION: u32 = 4;

/// What a launch needs to know about a compiled kernel besides its code, stored beside its
/// PTX in the disk cache (`<key>.meta.json`; the cubin shares the key) and checked against
/// the launch that loads it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CompiledMeta {
    pub version: u32,
    /// The kernel's symbol in the module.
    pub name: String,
    /// Dynamic shared memory per program, in bytes.
    pub shared_bytes: u64,
    pub num_warps: u32,
    /// Warps beyond `num_warps` the launch runs: a warp-specialized kernel's producer
    /// warpgroup (4), else 0.
    pub producer_warps: u32,
    pub num_stages: u32,
    /// Compute capability the code was generated for.
    pub target: (u32, u32),
    /// The kernel's parameters in order, as the launch passes them: the arguments, then
    /// (guarded launches) one buffer length per pointer argument, then one tensor map per
    /// entry of `tensor_maps`.
    pub params: Vec<ParamSlot>,
    /// The tensor maps of the kernel's TMA copies, which the launch encodes from the
    /// arguments.
    pub tensor_maps: Vec<TensorMap>,
}

/// One kernel parameter of a compiled kernel: its name, size and alignment in bytes (a
/// by-value parameter larger than 8 bytes, such as a TMA descriptor, is one slot too).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ParamSlot {
    pub name: String,
    pub bytes: u32,
    pub align: u32,
}

impl CompiledMeta {
    fn of(f: &Function, opts: &CodegenOptions, shared_bytes: u64, tensor_maps: Vec<TensorMap>, producer_warps: u32) -> CompiledMeta {
        let params = f
            .params
            .iter()
            .map(|p| {
                let (bytes, align) = p.kind.slot();
                ParamSlot { name: p.name.clone(), bytes, align }
            })
            .collect();
        CompiledMeta {
            version: META_VERSION,
            name: f.name.clone(),
            shared_bytes,
            num_warps: opts.num_warps,
            producer_warps,
            num_stages: opts.num_stages,
            target: opts.target.cc,
            params,
            tensor_maps,
        }
    }
}

/// Stages 2-5 on a built function.
pub fn compile_function(f: Function, opts: &CodegenOptions, site: &KernelSite) -> Result<Artifacts> {
    let key = cache_key(&f, opts);
    compile_keyed(f, key, opts, site)
}

fn compile_keyed(mut f: Function, key: String, opts: &CodegenOptions, site: &KernelSite) -> Result<Artifacts> {
    let ir = f.to_string();
    let fail = |stage: &'static str, message: String| Error::Compile { site: site.clone(), stage, message };
    passes::optimize(&mut f, &opts.pass_options()).map_err(|e| fail("optimize", e.to_string()))?;
    let wgmma = opts.wgmma && opts.target.has_wgmma();
    let mut plan = passes::plan(&mut f, opts.num_warps as usize, opts.num_stages, wgmma, wgmma && opts.tma && !opts.debug, wgmma && opts.tma_store && !opts.debug, opts.warp_specialize, opts.prefetch);
    plan.min_programs = opts.min_programs_per_sm as usize;
    // The optimized IR with its layout conversions and every value's layout (what the
    // lowering sees).
    let opt_ir = plan.print(&f);
    let ctx = inkwell::context::Context::create();
    let lowered = crate::lower::lower(&ctx, &f, &plan).map_err(|e| fail(e.stage, format!("{}\n{opt_ir}", e.message)))?;
    let module = &lowered.module;
    module
        .verify()
        .map_err(|e| fail("lower", format!("LLVM rejected the module: {e}\n{opt_ir}\n{}", module.print_to_string())))?;
    let (llir, ptx) = emit_ptx(module, &opts.target).map_err(|e| fail(e.stage, e.message))?;
    let meta = CompiledMeta::of(&f, opts, lowered.shared_bytes, plan.tma.clone(), plan.producer_warps as u32);
    Ok(Artifacts { key, ir, opt_ir, llir, ptx, meta })
}

/// The disk-cache extension of a [`CompiledMeta`] record.
pub const META_EXT: &str = "meta.json";

/// What [`Compiler::load_with`] gives: the cache key, the PTX, its metadata and what the
/// loader made of it.
#[derive(Debug)]
pub struct Loaded<T> {
    pub key: String,
    pub ptx: String,
    pub meta: CompiledMeta,
    pub value: T,
}

/// Why a loader (the driver) did not take a program.
#[derive(Debug)]
pub enum LoadError {
    /// The program itself was refused (invalid PTX or image, no code for this GPU, an
    /// unsupported PTX version): a cached copy is evicted and compiled again.
    Refused(String),
    /// Anything else (out of memory, a context broken by an earlier fault): the cached
    /// copy is not to blame and stays.
    Other(Error),
}

/// Counters of what a [`Compiler`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompileStats {
    /// Kernels compiled from IR to PTX.
    pub compiled: usize,
    /// PTX read from the disk cache.
    pub disk_hits: usize,
}

/// Runs the pipeline behind the disk cache.
#[derive(Debug)]
pub struct Compiler {
    pub disk: DiskCache,
    fingerprint: String,
    compiled: AtomicUsize,
    disk_hits: AtomicUsize,
}

/// What `RUTILE_DUMP` asks for this kernel: the directory to dump into.
pub fn dump_dir_for(kernel: &str) -> Option<PathBuf> {
    let want = std::env::var("RUTILE_DUMP").ok()?;
    let hit = want.split(',').any(|w| w.trim() == kernel || w.trim() == "all" || w.trim() == "1");
    hit.then(|| std::env::var_os("RUTILE_DUMP_DIR").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("rutile-dump")))
}

impl Compiler {
    pub fn new(disk: DiskCache) -> Compiler {
        Compiler { disk, fingerprint: COMPILER_FINGERPRINT.into(), compiled: AtomicUsize::new(0), disk_hits: AtomicUsize::new(0) }
    }

    /// The same compiler under another fingerprint (tests use it to stand for a changed
    /// compiler: no entry written under the old fingerprint is read under the new one).
    pub fn with_fingerprint(mut self, fingerprint: impl Into<String>) -> Compiler {
        self.fingerprint = fingerprint.into();
        self
    }

    /// The fingerprint in this compiler's cache keys ([`COMPILER_FINGERPRINT`] by default).
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    pub fn stats(&self) -> CompileStats {
        CompileStats { compiled: self.compiled.load(Ordering::Relaxed), disk_hits: self.disk_hits.load(Ordering::Relaxed) }
    }

    /// PTX for `kernel` with this specialization and options: from the disk cache, or
    /// compiled (and cached). Returns `(key, ptx)`.
    pub fn ptx(&self, kernel: &dyn Kernel, specs: &[ParamSpec], opts: &CodegenOptions) -> Result<(String, String)> {
        self.load_with(kernel, specs, opts, |_, _| Ok(())).map(|l| (l.key, l.ptx))
    }

    /// PTX and its [`CompiledMeta`] for `kernel` as [`ptx`](Compiler::ptx) finds them,
    /// handed to `load` (the driver's module load). A checksum only detects damage: if
    /// `load` refuses PTX that came from the disk cache ([`LoadError::Refused`]), the entry
    /// is evicted with a warning and the kernel is compiled once more; a refusal of freshly
    /// compiled PTX is the error returned (stage `load`). Any other failure of `load`
    /// ([`LoadError::Other`]: out of memory, a context broken by an earlier fault) is
    /// returned as it is, and the cache is left alone.
    pub fn load_with<T>(
        &self,
        kernel: &dyn Kernel,
        specs: &[ParamSpec],
        opts: &CodegenOptions,
        load: impl Fn(&str, &str) -> std::result::Result<T, LoadError>,
    ) -> Result<Loaded<T>> {
        let f = build_ir(kernel, specs)?;
        let key = cache_key_for(&self.fingerprint, &f, opts);
        let name: &str = &kernel.meta().name;
        let what = format!("kernel `{name}`");
        let dump = dump_dir_for(name);
        if dump.is_none() {
            if let Some((ptx, meta)) = self.cached(&key, &what) {
                match load(&key, &ptx) {
                    Ok(value) => {
                        self.disk_hits.fetch_add(1, Ordering::Relaxed);
                        return Ok(Loaded { key, ptx, meta, value });
                    }
                    Err(LoadError::Refused(e)) => {
                        warn(Warning::CacheRefused, format!("the cached PTX of {what} was refused ({e}); evicting it and recompiling"));
                        self.disk.evict(&key, "ptx");
                    }
                    Err(LoadError::Other(e)) => return Err(e),
                }
            }
        }
        let site = site(kernel, specs, None);
        let art = compile_keyed(f, key.clone(), opts, &site)?;
        self.compiled.fetch_add(1, Ordering::Relaxed);
        if let Some(dir) = dump {
            write_dump(&dir, name, &art);
        }
        let value = load(&key, &art.ptx).map_err(|e| match e {
            LoadError::Refused(message) => Error::Compile { site, stage: "load", message },
            LoadError::Other(e) => e,
        })?;
        // The record first: PTX on disk implies its record (a crash in between leaves a
        // record without PTX, which is a miss).
        match serde_json::to_vec(&art.meta) {
            Ok(json) => self.disk.store(&key, META_EXT, &json, &what),
            Err(e) => {
                warn(Warning::CacheUnwritable, format!("cannot encode the metadata of {what}: {e}"));
            }
        }
        self.disk.store(&key, "ptx", art.ptx.as_bytes(), &what);
        Ok(Loaded { key, ptx: art.ptx, meta: art.meta, value })
    }

    /// The cached PTX and metadata record under `key`, both whole and of this version, or
    /// `None` (a damaged or out-of-date pair is evicted, with a warning for damage).
    fn cached(&self, key: &str, what: &str) -> Option<(String, CompiledMeta)> {
        let bytes = self.disk.load(key, "ptx", what)?;
        let Ok(ptx) = String::from_utf8(bytes) else {
            warn(Warning::CacheCorrupt, format!("the cache entry for {what} is not UTF-8; evicting it and recompiling"));
            self.disk.evict(key, "ptx");
            return None;
        };
        let meta = self.disk.load(key, META_EXT, what).and_then(|m| serde_json::from_slice::<CompiledMeta>(&m).ok());
        match meta {
            Some(m) if m.version == META_VERSION => Some((ptx, m)),
            _ => {
                // Written by a writer killed between the two files, or damaged: compile again.
                self.disk.evict(key, "ptx");
                None
            }
        }
    }

    /// Every stage of `kernel` for `opts.target`, compiled now (no cache, no GPU needed):
    /// what `RUTILE_DUMP` writes, as values. See [`stages`] for the common case.
    pub fn artifacts(&self, kernel: &dyn Kernel, specs: &[ParamSpec], opts: &CodegenOptions) -> Result<Artifacts> {
        let f = build_ir(kernel, specs)?;
        let key = cache_key_for(&self.fingerprint, &f, opts);
        let art = compile_keyed(f, key, opts, &site(kernel, specs, None))?;
        self.compiled.fetch_add(1, Ordering::Relaxed);
        Ok(art)
    }
}

/// Compile `kernel` for `target` with `num_warps` warps and return every stage (IR,
/// optimized IR, LLVM IR, PTX), without a GPU. The specialization is the common one of a
/// safe launch on buffers from `cudarc`/[`Runtime`](crate::Runtime): every pointer 16-byte
/// aligned, buffer lengths and integer scalars of unknown divisibility.
///
/// ```no_run
/// use dsl_runtime::prelude::*;
/// use dsl_runtime::{compile, emit::Target};
///
/// #[kernel]
/// fn scale<const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32) {
///     let offs = program_id(0) * BLOCK + arange::<BLOCK>();
///     store(out + offs, load(x + offs, offs < n, 0.0) * 2.0, offs < n);
/// }
///
/// let art = compile::stages(&scale::<1024>, Target::SM80, 4).unwrap();
/// assert!(art.ptx.contains(".entry scale"));
/// compile::write_stages(std::path::Path::new("rutile-dump"), "scale", &art).unwrap();
/// ```
pub fn stages(kernel: &dyn Kernel, target: Target, num_warps: u32) -> Result<Artifacts> {
    let meta = kernel.meta();
    let specs: Vec<ParamSpec> = meta.params.iter().map(|(_, k)| ParamSpec { div16: matches!(k, ParamKind::Ptr { .. }), eq_one: false }).collect();
    let nptr = specs.iter().filter(|s| s.div16).count();
    let cfg = LaunchConfig::grid(1).warps(num_warps).debug(false);
    let opts = CodegenOptions::for_launch(&cfg, Safety::Guarded, vec![ParamSpec::default(); nptr], target);
    Compiler::new(DiskCache::new(None)).artifacts(kernel, &specs, &opts)
}

/// [`stages`] with the given specialization of every parameter (`specs`, one per kernel
/// parameter in order) and launch settings (`cfg`'s warps, stages, `wgmma`; not its grid,
/// and a release build): what a launch with arguments of those properties and `cfg`
/// compiles.
pub fn stages_specialized(kernel: &dyn Kernel, specs: &[ParamSpec], target: Target, cfg: &LaunchConfig) -> Result<Artifacts> {
    let meta = kernel.meta();
    if specs.len() != meta.params.len() {
        return Err(crate::Error::Launch { kernel: meta.name.to_string(), message: format!("{} parameter specializations for {} parameters", specs.len(), meta.params.len()) });
    }
    let nptr = kernel.meta().params.iter().filter(|(_, k)| matches!(k, ParamKind::Ptr { .. })).count();
    let cfg = cfg.debug(false);
    let opts = CodegenOptions::for_launch(&cfg, Safety::Guarded, vec![ParamSpec { div16: true, eq_one: false }; nptr], target);
    Compiler::new(DiskCache::new(None)).artifacts(kernel, specs, &opts)
}

/// Write every stage of `art` to `dir` as `<name>-<key>.{ir,opt.ir,ll,ptx}`.
pub fn write_stages(dir: &std::path::Path, name: &str, art: &Artifacts) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let mut paths = vec![];
    let meta = serde_json::to_string_pretty(&art.meta).map_err(std::io::Error::other)?;
    for (ext, text) in [("ir", &art.ir), ("opt.ir", &art.opt_ir), ("ll", &art.llir), ("ptx", &art.ptx), (META_EXT, &meta)] {
        let p = dir.join(format!("{name}-{}.{ext}", &art.key[..12]));
        std::fs::write(&p, text)?;
        paths.push(p);
    }
    Ok(paths)
}

/// `RUTILE_DUMP`: write the stages and say where, on stderr.
pub(crate) fn write_dump(dir: &std::path::Path, name: &str, art: &Artifacts) {
    match write_stages(dir, name, art) {
        Ok(_) => eprintln!("rutile: dumped `{name}` ({}) to {}", &art.key[..12], dir.display()),
        Err(e) => {
            warn(Warning::Dump, format!("cannot dump `{name}` to {}: {e}", dir.display()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{cache_key_for, CodegenOptions};
    use crate::emit::Target;
    use crate::ir::{Builder, Function, Loc, ParamKind, ParamSpec};
    use crate::launch::{LaunchConfig, Safety};
    use crate::DType;

    fn iota() -> Function {
        let mut b = Builder::new("iota", &[("y", ParamKind::Ptr { elem: DType::I32, writable: true })]);
        let l = Loc::new(1, 1);
        let a = b.arange(0, 64, l).unwrap();
        let p = b.add_ptr(b.param(0), a, l).unwrap();
        b.store(p, a, None, l).unwrap();
        b.finish().unwrap()
    }

    #[test]
    fn launch_settings_reach_the_codegen_options_and_the_cache_key() {
        let f = iota();
        let lens = vec![ParamSpec { div16: true, eq_one: false }];
        let opts = |cfg: LaunchConfig, safety| CodegenOptions::for_launch(&cfg, safety, lens.clone(), Target::SM90);
        let key = |cfg: LaunchConfig| cache_key_for("fingerprint", &f, &opts(cfg, Safety::Guarded));
        let base = LaunchConfig::grid(1).debug(false);
        let o = opts(base.warps(8).stages(3).debug(true), Safety::Guarded);
        assert_eq!((o.num_warps, o.num_stages, o.debug, o.len_specs.len()), (8, 3, true, 1));
        assert!(opts(base, Safety::Unchecked).len_specs.is_empty(), "lengths only matter to guarded code");
        assert_eq!(base.num_stages, 1, "no pipelining by default");
        assert_eq!(key(base), key(base.stages(1)));
        assert_ne!(key(base), key(base.stages(2)), "num_stages is part of the cache key");
        assert_ne!(key(base.stages(2)), key(base.stages(3)));
    }
}
