//! Kernels built at run time: [`IrKernel`], and [`LaunchArgs`], a safe way to launch any
//! kernel on arguments gathered at run time.
//!
//! A `#[kernel]` function is compiled into Rust code that drives the IR
//! [`Builder`]; an `IrKernel` is the same thing without the macro: a name, a parameter
//! list and a closure that emits the body through the same `Builder` calls. Everything
//! after that is shared: [`compile::build_ir`](crate::compile::build_ir) runs the closure once per specialization,
//! the passes, lowering, disk cache, driver and interpreter treat both kinds alike (a graph
//! fuser builds its fused kernels this way).
//!
//! Identity: a `#[kernel]` is identified by its Rust type; an `IrKernel` by a hash of the
//! IR it builds for unspecialized arguments ([`KernelId::Ir`], computed once, when it is
//! made). So two `IrKernel`s that build the same IR share the driver's loaded function and
//! the disk cache's entry, in this process and in the next one, and a different body is a
//! different kernel, whatever its name.
//!
//! ```
//! use dsl_runtime::built::{IrKernel, LaunchArgs};
//! use dsl_runtime::ir::{BinOp, CmpOp, Loc, Operand, ParamKind};
//! use dsl_runtime::{DType, LaunchConfig, Runtime};
//!
//! const BLOCK: i64 = 256;
//! let ptr = |writable| ParamKind::Ptr { elem: DType::F32, writable };
//! // out = x * 2 over n elements, one block of BLOCK per program.
//! let double = IrKernel::new("double", [("x", ptr(false)), ("out", ptr(true)), ("n", ParamKind::Scalar(DType::I32))], |b| {
//!     let l = Loc::default();
//!     let pid = b.program_id(0, l)?;
//!     let start = b.binary(BinOp::Mul, pid, Operand::Int(BLOCK), l)?;
//!     let lanes = b.arange(0, BLOCK, l)?;
//!     let offs = b.binary(BinOp::Add, start, lanes, l)?;
//!     let mask = b.cmp(CmpOp::Lt, offs, b.param(2), l)?;
//!     let px = b.add_ptr(b.param(0), offs, l)?;
//!     let x = b.load(px, Some(mask.into()), Some(Operand::Float(0.0)), l)?;
//!     let y = b.binary(BinOp::Mul, x, Operand::Float(2.0), l)?;
//!     let po = b.add_ptr(b.param(1), offs, l)?;
//!     b.store(po, y, Some(mask.into()), l)?;
//!     Ok(())
//! })
//! .unwrap();
//!
//! let rt = Runtime::interpreter();
//! let x = rt.upload(&[1.0f32, -2.0, 3.0]).unwrap();
//! let mut out = rt.zeros::<f32>(3).unwrap();
//! LaunchArgs::new(&rt).input(&x).output(&mut out).scalar(3i32).launch(&double, LaunchConfig::grid(1)).unwrap();
//! assert_eq!(out.to_vec().unwrap(), [2.0, -4.0, 6.0]);
//! ```

use crate::compile::{build_ir, ir_identity};
use crate::error::{BuildError, Error, KernelSite, Result};
use crate::ir::builder::HookFn;
use crate::ir::{Builder, ParamKind, ParamSpec};
use crate::launch::{host, host_mut, Arg, Bindings, Kernel, KernelId, KernelMeta, LaunchConfig, Launcher, Safety, ScalarArg, MAX_PARAMS};
use crate::runtime::{bind_device, bind_device_mut, Buffer};
use crate::{DType, Element};
use cudarc::driver::{CudaSlice, CudaStream};
use std::sync::Arc;

/// The body of an [`IrKernel`]: emits the kernel's instructions into a builder whose
/// parameters are already defined ([`Builder::param`]).
pub type Body = dyn Fn(&mut Builder) -> Result<(), BuildError> + Send + Sync;

/// A kernel built at run time from IR. See the [module docs](self) for an example.
///
/// Cloning is cheap (the body is shared). The body must be a pure function of the builder
/// it is given (its parameters and their specialization): the kernel's identity is the hash
/// of one build, and every other specialization is built from the same closure.
#[derive(Clone)]
pub struct IrKernel {
    meta: KernelMeta,
    body: Arc<Body>,
    id: KernelId,
    /// The constants of the `#[kernel]` it was made from ([`IrKernel::hooked`]).
    constants: Vec<(&'static str, String)>,
}

impl std::fmt::Debug for IrKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IrKernel").field("name", &self.meta.name).field("params", &self.meta.params).field("id", &self.id).finish_non_exhaustive()
    }
}

fn is_identifier(s: &str) -> bool {
    let mut c = s.chars();
    c.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_') && c.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl IrKernel {
    /// A kernel named `name` (its PTX symbol: an identifier) with `params` in order, whose
    /// body `body` emits. Builds the IR once, for unspecialized arguments, to check it and
    /// to compute the kernel's [`KernelId`]; a body that fails to build is an
    /// [`Error::Build`] here rather than at the first launch. The caller's file and line
    /// are the kernel's source in error messages.
    ///
    /// Parameters are pointers (`ParamKind::Ptr`, of any element type but `bool`; mark the
    /// ones the body stores through `writable`), `i32`, `i64` or `f32` scalars, and bytes
    /// passed by value (`ParamKind::Bytes`, a TMA tensor map: up to [`MAX_BYTES_PARAM`]);
    /// at most [`MAX_PARAMS`].
    #[track_caller]
    pub fn new<S, F>(name: impl Into<String>, params: impl IntoIterator<Item = (S, ParamKind)>, body: F) -> Result<IrKernel>
    where
        S: Into<String>,
        F: Fn(&mut Builder) -> Result<(), BuildError> + Send + Sync + 'static,
    {
        let caller = std::panic::Location::caller();
        let params: Vec<(String, ParamKind)> = params.into_iter().map(|(n, k)| (n.into(), k)).collect();
        let meta = KernelMeta::owned(name.into(), caller.file().to_string(), caller.line(), params);
        check_signature(&meta)?;
        IrKernel { meta, body: Arc::new(body), id: KernelId::Ir(0), constants: vec![] }.identified()
    }

    /// Kernel `inner` (a `#[kernel]` generic over a helper, given
    /// [`Hook`](crate::dsl::Hook) for it) with `hook` as what its `Hook` calls emit: a
    /// kernel of `inner`'s name, source, parameters and constants, identified as any
    /// `IrKernel` by the IR it builds, so by the code the hook emits (two hooks that emit
    /// the same code share one compiled kernel). Launch it with `inner`'s typed arguments
    /// through `launch_as` (see [`Hook`](crate::dsl::Hook) for an example) or with
    /// [`LaunchArgs`]. A hook that fails to build is an [`Error::Build`] here. The hook
    /// must be pure (the same code for the same arguments): every specialization is built
    /// from it, and the identity is that of the first build.
    pub fn hooked<K: Kernel + Send + Sync + 'static>(inner: K, hook: Arc<HookFn>) -> Result<IrKernel> {
        let meta = inner.meta().clone();
        let constants = inner.constants();
        let body = move |b: &mut Builder| {
            let outer = b.set_hook(Some(hook.clone()));
            let built = inner.build(b);
            b.set_hook(outer);
            built
        };
        IrKernel { meta, body: Arc::new(body), id: KernelId::Ir(0), constants }.identified()
    }

    /// With its identity: the hash of the IR it builds for unspecialized arguments (which
    /// checks that it builds).
    fn identified(mut self) -> Result<IrKernel> {
        let f = build_ir(&self, &vec![ParamSpec::default(); self.meta.params.len()])?;
        self.id = KernelId::Ir(ir_identity(&f));
        Ok(self)
    }
}

/// The largest by-value parameter ([`ParamKind::Bytes`]): a TMA tensor map is 128 bytes
/// (CUDA's limit on all parameters together is 4 KiB, 32 KiB from CUDA 12.1 on Volta+).
pub const MAX_BYTES_PARAM: u32 = 256;

/// What [`IrKernel::new`] accepts as a name and parameters.
fn check_signature(meta: &KernelMeta) -> Result<()> {
    let fail = |message: String| {
        Err(Error::Build { site: KernelSite { kernel: meta.name.to_string(), spec: String::new(), at: Some(format!("{}:{}", meta.file, meta.line)) }, message })
    };
    if !is_identifier(&meta.name) {
        return fail(format!("`{}` is not a kernel name: write an identifier (letters, digits, `_`)", meta.name.escape_debug()));
    }
    if meta.params.len() > MAX_PARAMS {
        return fail(format!("{} parameters: kernels take at most {MAX_PARAMS}", meta.params.len()));
    }
    for (i, (name, kind)) in meta.params.iter().enumerate() {
        if !is_identifier(name) {
            return fail(format!("parameter {i} is named `{}`: write an identifier", name.escape_debug()));
        }
        if meta.params[..i].iter().any(|(n, _)| n == name) {
            return fail(format!("two parameters are named `{name}`"));
        }
        match kind {
            ParamKind::Ptr { elem: DType::Bool, .. } => return fail(format!("parameter `{name}`: there are no buffers of bool")),
            ParamKind::Ptr { .. } | ParamKind::Scalar(DType::I32 | DType::I64 | DType::F32) => {}
            ParamKind::Scalar(d) => return fail(format!("parameter `{name}`: scalars are i32, i64 or f32, not {d}")),
            ParamKind::Len { .. } => return fail(format!("parameter `{name}`: `Len` parameters are added by the bounds guard, not written by kernels")),
            ParamKind::Bytes { size, align } => {
                if *size == 0 || *size > MAX_BYTES_PARAM || !align.is_power_of_two() || *align > 128 || size % align != 0 {
                    return fail(format!(
                        "parameter `{name}`: {size} bytes aligned to {align}; by-value parameters take 1 to {MAX_BYTES_PARAM} bytes, a power-of-two alignment up to 128 that divides the size"
                    ));
                }
            }
        }
    }
    Ok(())
}

impl Kernel for IrKernel {
    fn meta(&self) -> &KernelMeta {
        &self.meta
    }
    fn id(&self) -> KernelId {
        self.id
    }
    /// None: a built kernel's constants are already values in its IR (a body may record
    /// them for the printer with [`Builder::constant_value`]); a [hooked](IrKernel::hooked)
    /// one has those of the kernel it was made from.
    fn constants(&self) -> Vec<(&'static str, String)> {
        self.constants.clone()
    }
    fn build(&self, b: &mut Builder) -> Result<(), BuildError> {
        (self.body)(b)
    }
}

/// The arguments of one launch, gathered at run time and bound for one launcher: a safe
/// launch of any [`Kernel`] (a built one, or a `#[kernel]` chosen at run time).
///
/// Each method borrows its buffer until the launch (outputs mutably, so no argument aliases
/// one the kernel writes) and binds it to the launcher's stream; [`launch`](LaunchArgs::launch)
/// launches with bounds guards on that same launcher. Arguments are checked against the
/// kernel's parameters at the launch: their number, element types, and that a parameter
/// the kernel writes gets an output. It allocates one small vector per launch; the typed
/// launch functions of `#[kernel]` allocate nothing.
pub struct LaunchArgs<'a, L: Launcher + ?Sized> {
    launcher: &'a L,
    stream: Option<&'a CudaStream>,
    bindings: Bindings<'a>,
    args: Vec<Arg<'a>>,
}

impl<'a, L: Launcher + ?Sized> LaunchArgs<'a, L> {
    /// No arguments yet, for a launch on `launcher`.
    pub fn new(launcher: &'a L) -> Self {
        LaunchArgs { launcher, stream: launcher.cuda_stream(), bindings: Bindings::default(), args: Vec::with_capacity(8) }
    }
    /// A buffer the kernel reads.
    pub fn input<T: Element>(mut self, b: &'a Buffer<T>) -> Self {
        let a = match b {
            Buffer::Host(v) => host(v),
            Buffer::Device(s) => bind_device(s, self.stream, &mut self.bindings),
        };
        self.args.push(a);
        self
    }
    /// A buffer the kernel may write.
    pub fn output<T: Element>(mut self, b: &'a mut Buffer<T>) -> Self {
        let a = match b {
            Buffer::Host(v) => host_mut(v),
            Buffer::Device(s) => bind_device_mut(s, self.stream, &mut self.bindings),
        };
        self.args.push(a);
        self
    }
    /// A host slice the kernel reads (the interpreter; an empty one, on the GPU too: a null
    /// pointer of length 0, for a parameter the kernel does not read).
    pub fn host_input<T: Element>(mut self, s: &'a [T]) -> Self {
        self.args.push(host(s));
        self
    }
    /// A host slice the kernel may write (the interpreter).
    pub fn host_output<T: Element>(mut self, s: &'a mut [T]) -> Self {
        self.args.push(host_mut(s));
        self
    }
    /// A cudarc device buffer the kernel reads.
    pub fn device_input<T: Element>(mut self, s: &'a CudaSlice<T>) -> Self {
        let a = bind_device(s, self.stream, &mut self.bindings);
        self.args.push(a);
        self
    }
    /// A cudarc device buffer the kernel may write.
    pub fn device_output<T: Element>(mut self, s: &'a mut CudaSlice<T>) -> Self {
        let a = bind_device_mut(s, self.stream, &mut self.bindings);
        self.args.push(a);
        self
    }
    /// An `i32`, `i64` or `f32` passed by value.
    pub fn scalar(mut self, x: impl ScalarArg) -> Self {
        self.args.push(x.arg());
        self
    }
    /// Bytes passed by value, for a [`ParamKind::Bytes`] parameter of their length (a TMA
    /// tensor map).
    pub fn bytes(mut self, b: &'a [u8]) -> Self {
        self.args.push(Arg::Bytes(b));
        self
    }
    /// The arguments bound so far, as the launcher will see them.
    pub fn args(&self) -> &[Arg<'a>] {
        &self.args
    }

    /// Launch `kernel` with bounds-guarded accesses: every access outside the buffers given
    /// here is suppressed, so this is safe whatever the kernel's masks say.
    pub fn launch(self, kernel: &dyn Kernel, cfg: LaunchConfig) -> Result<()> {
        // SAFETY: a guarded launch needs nothing of its caller.
        unsafe { self.launch_with(kernel, cfg, Safety::Guarded) }
    }

    /// Launch without bounds guards: accesses are limited only by the kernel's masks.
    ///
    /// # Safety
    ///
    /// Every lane whose mask is true must address an element inside the buffer its pointer
    /// derives from. The CPU interpreter checks this and reports violations.
    pub unsafe fn launch_unchecked(self, kernel: &dyn Kernel, cfg: LaunchConfig) -> Result<()> {
        // SAFETY: this function's caller upholds the contract above.
        unsafe { self.launch_with(kernel, cfg, Safety::Unchecked) }
    }

    /// # Safety
    ///
    /// `safety` is `Guarded`, or the contract of `launch_unchecked` holds.
    unsafe fn launch_with(self, kernel: &dyn Kernel, cfg: LaunchConfig, safety: Safety) -> Result<()> {
        let LaunchArgs { launcher, args, bindings, .. } = self;
        // SAFETY: `args` were made only by the methods above, from buffers borrowed for `'a`
        // (outliving this call; writable ones `&mut`, so nothing else aliases them) and
        // bound to `launcher`'s own stream, the launcher they are launched on here: each
        // describes its memory as `Arg` says. `safety` is `Guarded`, or our caller
        // promised `launch_unchecked`'s contract.
        let result = unsafe { launcher.launch_args(kernel, &cfg, &args, safety) };
        // cudarc's stream-synchronization records last until the launch is enqueued.
        drop(bindings);
        result
    }
}
