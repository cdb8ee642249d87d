//! The compile pipeline, stage by stage. Each stage produces an artifact named for what
//! it is (Triton's naming):
//!
//! | stage | produces | where |
//! |---|---|---|
//! | build | `ir`: block IR, specialized | [`build_ir`] ([`ir::Builder`](crate::ir::Builder) driven by the `#[kernel]` expansion) |
//! | optimize | `opt.ir`: guarded, simplified IR | [`passes::optimize`] |
//! | plan | layouts, vector widths | [`passes::plan`] |
//! | lower | `ll`: LLVM IR | [`lower::lower`](crate::lower::lower) |
//! | emit | `ptx` | [`emit::emit_ptx`](crate::emit::emit_ptx) |
//! | load | module (cubin cached) | [`driver`](crate::driver) |
//!
//! [`Compiler`] runs the stages behind the disk cache and the dump switch:
//! `RUTILE_DUMP=relu_mul_add` (a comma list of kernel names, or `all`) recompiles the
//! named kernels, bypassing the cache, and writes every artifact to `RUTILE_DUMP_DIR`
//! (default `./rutile-dump`).

use crate::cache::DiskCache;
use crate::emit::{emit_ptx, llvm_version, Target};
use crate::error::{Error, KernelSite, Result};
use crate::ir::{printer::print, Builder, Function, Loc, ParamSpec};
use crate::launch::{describe_spec, Kernel, Safety};
use crate::passes::{self, PassOptions};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Where a kernel error happened.
pub fn site(kernel: &dyn Kernel, specs: &[ParamSpec], loc: Option<Loc>) -> KernelSite {
    let meta = kernel.meta();
    let at = match loc {
        Some(l) if l.line > 0 => format!("{}:{}:{}", meta.file, l.line, l.col),
        _ => format!("{}:{}", meta.file, meta.line),
    };
    KernelSite { kernel: meta.name.into(), spec: describe_spec(kernel, specs), at: Some(at) }
}

/// Stage 1: run the kernel's builder with this specialization.
pub fn build_ir(kernel: &dyn Kernel, specs: &[ParamSpec]) -> Result<Function> {
    let meta = kernel.meta();
    let mut b = Builder::specialized(meta.name, meta.params, specs);
    for (k, v) in kernel.constants() {
        b.constant_value(k, v);
    }
    let fail = |e: crate::BuildError| Error::Build { site: site(kernel, specs, Some(e.loc)), message: e.message };
    kernel.build(&mut b).map_err(fail)?;
    b.finish().map_err(fail)
}

/// Everything besides the IR that changes the generated code.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CodegenOptions {
    pub num_warps: u32,
    pub safety: Safety,
    /// Properties of the buffer lengths (guarded launches only).
    pub len_specs: Vec<ParamSpec>,
    pub target: Target,
    /// Keep device asserts and prints.
    pub debug: bool,
}

impl CodegenOptions {
    fn pass_options(&self) -> PassOptions {
        PassOptions { bounds_guard: (self.safety == Safety::Guarded).then(|| self.len_specs.clone()), debug: self.debug }
    }
}

/// The disk-cache key of a kernel: a hash of the compiler's and LLVM's versions, the
/// specialized IR (without source locations, so moving a kernel in its file does not
/// recompile it) and the codegen options.
pub fn cache_key(f: &Function, opts: &CodegenOptions) -> String {
    let mut h = blake3::Hasher::new();
    h.update(b"rutile-ptx\0");
    h.update(env!("CARGO_PKG_VERSION").as_bytes());
    h.update(llvm_version().as_bytes());
    h.update(print(f, false).as_bytes());
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
    /// Dynamic shared memory per program, in bytes.
    pub shared_bytes: u64,
}

/// Stages 2-5 on a built function.
pub fn compile_function(mut f: Function, opts: &CodegenOptions, site: &KernelSite) -> Result<Artifacts> {
    let key = cache_key(&f, opts);
    let ir = f.to_string();
    let fail = |stage: &'static str, message: String| Error::Compile { site: site.clone(), stage, message };
    passes::optimize(&mut f, &opts.pass_options()).map_err(|e| fail("optimize", e.to_string()))?;
    let opt_ir = f.to_string();
    let plan = passes::plan(&f, opts.num_warps as usize);
    let ctx = inkwell::context::Context::create();
    let lowered = crate::lower::lower(&ctx, &f, &plan).map_err(|e| fail("lower", format!("{}\n{opt_ir}", e.0)))?;
    let module = &lowered.module;
    module
        .verify()
        .map_err(|e| fail("lower", format!("LLVM rejected the module: {e}\n{opt_ir}\n{}", module.print_to_string())))?;
    let (llir, ptx) = emit_ptx(module, &opts.target).map_err(|e| fail("emit", e))?;
    // The launcher reads the dynamic shared-memory size from this first line.
    let ptx = format!("{SHARED_BYTES_TAG}{}\n{ptx}", lowered.shared_bytes);
    Ok(Artifacts { key, ir, opt_ir, llir, ptx, shared_bytes: lowered.shared_bytes })
}

/// The first line of every PTX text we emit: `// rutile.shared_bytes N`.
pub const SHARED_BYTES_TAG: &str = "// rutile.shared_bytes ";

/// The dynamic shared memory a PTX text from [`compile_function`] needs (0 when absent).
pub fn shared_bytes(ptx: &str) -> u64 {
    ptx.lines().next().and_then(|l| l.strip_prefix(SHARED_BYTES_TAG)).and_then(|n| n.trim().parse().ok()).unwrap_or(0)
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
        Compiler { disk, compiled: AtomicUsize::new(0), disk_hits: AtomicUsize::new(0) }
    }

    pub fn stats(&self) -> CompileStats {
        CompileStats { compiled: self.compiled.load(Ordering::Relaxed), disk_hits: self.disk_hits.load(Ordering::Relaxed) }
    }

    /// PTX for `kernel` with this specialization and options: from the disk cache, or
    /// compiled (and cached). Returns `(key, ptx)`.
    pub fn ptx(&self, kernel: &dyn Kernel, specs: &[ParamSpec], opts: &CodegenOptions) -> Result<(String, String)> {
        let f = build_ir(kernel, specs)?;
        let key = cache_key(&f, opts);
        let name = kernel.meta().name;
        let what = format!("kernel `{name}`");
        let dump = dump_dir_for(name);
        if dump.is_none() {
            if let Some(bytes) = self.disk.load(&key, "ptx", &what) {
                if let Ok(ptx) = String::from_utf8(bytes) {
                    self.disk_hits.fetch_add(1, Ordering::Relaxed);
                    return Ok((key, ptx));
                }
                tracing::warn!("cache entry for {what} is not UTF-8; recompiling");
            }
        }
        let site = site(kernel, specs, None);
        let art = compile_function(f, opts, &site)?;
        self.compiled.fetch_add(1, Ordering::Relaxed);
        if let Some(dir) = dump {
            write_dump(&dir, name, &art);
        }
        self.disk.store(&key, "ptx", art.ptx.as_bytes(), &what);
        Ok((key, art.ptx))
    }
}

fn write_dump(dir: &std::path::Path, name: &str, art: &Artifacts) {
    let res = std::fs::create_dir_all(dir).and_then(|_| {
        for (ext, text) in [("ir", &art.ir), ("opt.ir", &art.opt_ir), ("ll", &art.llir), ("ptx", &art.ptx)] {
            std::fs::write(dir.join(format!("{name}-{}.{ext}", &art.key[..12])), text)?;
        }
        Ok(())
    });
    match res {
        Ok(()) => eprintln!("rutile: dumped `{name}` ({}) to {}", &art.key[..12], dir.display()),
        Err(e) => tracing::warn!("cannot dump `{name}` to {}: {e}", dir.display()),
    }
}
