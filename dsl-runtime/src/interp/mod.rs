//! The CPU interpreter: runs the block IR on host buffers, program by program.
//!
//! It executes exactly the IR the GPU path compiles (built with the same specialization,
//! through the same `crate::passes::optimize` pipeline) except the bounds
//! guard: instead, every masked-in access is checked against its buffer, and one that
//! falls outside is an [`Error::Interpret`] naming the kernel, the source line, the
//! parameter, the index and the length. Scalar semantics come from
//! [`ir::arith`](crate::ir::arith), shared with constant folding.
//!
//! Select it with [`Runtime::interpreter`](crate::Runtime::interpreter), or for
//! [`Runtime::from_env`](crate::Runtime::from_env) with `RUTILE_INTERPRET=1`.

use crate::compile;
use crate::error::{Error, KernelSite, Result};
use crate::ir::arith::{eval_binary, eval_cast, eval_cmp, eval_unary, ConstVal};
use crate::ir::{reduce, AtomicOp, Function, Op, ParamKind, ReduceOp, Region, Value};
use crate::emit::Target;
use crate::ir::ParamSpec;
use crate::launch::{specialize, Arg, Kernel, LaunchConfig, Launcher, Safety};
use crate::passes::{optimize, PassOptions};
use crate::{DType, Element};
use cudarc::driver::CudaStream;

/// The interpreter as a [`Launcher`]. It takes host slices (`&[T]`, `&mut [T]`, `&Vec<T>`,
/// `&mut Vec<T>`) and host [`Buffer`](crate::Buffer)s.
#[derive(Clone, Copy, Debug, Default)]
pub struct Interpreter;

impl Launcher for Interpreter {
    fn cuda_stream(&self) -> Option<&CudaStream> {
        None
    }

    unsafe fn launch_args(&self, kernel: &dyn Kernel, cfg: &LaunchConfig, args: &[Arg<'_>], safety: Safety) -> Result<()> {
        let meta = kernel.meta();
        cfg.validate(&meta.name)?;
        let (specs, lens) = specialize(meta, args)?;
        for ((name, _), a) in meta.params.iter().zip(args) {
            if let Arg::Device { .. } = a {
                return Err(Error::Launch {
                    kernel: meta.name.to_string(),
                    message: format!("argument `{name}` is a CUDA buffer, but the interpreter runs on host memory; pass a host slice or a Buffer from an interpreter Runtime"),
                });
            }
        }
        if let Some(dir) = compile::dump_dir_for(&meta.name) {
            // The dump is a side product: a kernel whose GPU compile fails still runs here.
            if let Err(e) = dump_stages(kernel, &specs, lens, cfg, safety, &dir) {
                crate::diag::warn(crate::diag::Warning::Dump, format!("cannot dump `{}`: {e}", meta.name));
            }
        }
        let mut f = compile::build_ir(kernel, &specs)?;
        let site = compile::site(kernel, &specs, None);
        optimize(&mut f, &PassOptions { bounds_guard: None, debug: cfg.debug })
            .map_err(|e| Error::Build { site: compile::site(kernel, &specs, Some(e.loc)), message: e.message })?;
        if cfg.is_empty() {
            return Ok(());
        }
        run(&f, cfg, args, &site, &meta.file)
    }
}

/// `RUTILE_DUMP` on the interpreter: compile what a CUDA launch with these arguments would
/// compile, for `RUTILE_DUMP_TARGET` (`sm_90` by default, or e.g. `sm_80`), and write its
/// stages, so PTX can be read on a machine without a GPU.
fn dump_stages(kernel: &dyn Kernel, specs: &[ParamSpec], lens: Vec<ParamSpec>, cfg: &LaunchConfig, safety: Safety, dir: &std::path::Path) -> Result<()> {
    let target = match std::env::var("RUTILE_DUMP_TARGET") {
        Ok(t) => Target::parse(&t).ok_or_else(|| Error::Launch {
            kernel: kernel.meta().name.to_string(),
            message: format!("RUTILE_DUMP_TARGET={t} is not a target (write sm_80, sm_90, ...)"),
        })?,
        Err(_) => Target::SM90,
    };
    let opts = compile::CodegenOptions::for_launch(cfg, safety, lens, target);
    let art = compile::Compiler::new(crate::cache::DiskCache::new(None)).artifacts(kernel, specs, &opts)?;
    compile::write_dump(dir, &kernel.meta().name, &art);
    Ok(())
}

/// A host buffer seen through its raw parts.
struct HostBuf {
    ptr: *mut u8,
    len: usize,
    elem: DType,
    writable: bool,
}

impl HostBuf {
    /// Read element `i`.
    ///
    /// # Safety
    ///
    /// `i < self.len`, and the buffer is what its `Arg::Host` promised: `len` elements of
    /// `elem` at `ptr`, borrowed for the whole launch.
    unsafe fn read(&self, i: usize) -> ConstVal {
        unsafe fn rd<T: Element>(p: *mut u8, i: usize) -> T {
            (p as *const T).add(i).read_unaligned()
        }
        let p = self.ptr;
        match self.elem {
            DType::U8 => ConstVal::Int(rd::<u8>(p, i) as i64),
            DType::I32 => ConstVal::Int(rd::<i32>(p, i) as i64),
            DType::I64 => ConstVal::Int(rd::<i64>(p, i)),
            DType::F32 => ConstVal::Float(rd::<f32>(p, i) as f64),
            DType::F16 => ConstVal::Float(rd::<half::f16>(p, i).to_f64()),
            DType::BF16 => ConstVal::Float(rd::<half::bf16>(p, i).to_f64()),
            DType::Bool => unreachable!("no bool buffers"),
        }
    }
    /// Write element `i`.
    ///
    /// # Safety
    ///
    /// As for [`read`](HostBuf::read), and `self.writable`: the buffer was borrowed
    /// exclusively (`&mut`) for the launch, so nothing else reads or writes it meanwhile.
    unsafe fn write(&self, i: usize, v: ConstVal) {
        unsafe fn wr<T: Element>(p: *mut u8, i: usize, v: T) {
            (p as *mut T).add(i).write_unaligned(v)
        }
        let p = self.ptr;
        match self.elem {
            DType::U8 => wr(p, i, v.as_i64() as u8),
            DType::I32 => wr(p, i, v.as_i64() as i32),
            DType::I64 => wr(p, i, v.as_i64()),
            DType::F32 => wr(p, i, v.as_f64() as f32),
            DType::F16 => wr(p, i, half::f16::from_f64(v.as_f64())),
            DType::BF16 => wr(p, i, half::bf16::from_f64(v.as_f64())),
            DType::Bool => unreachable!("no bool buffers"),
        }
    }
}

/// Run every program of the grid, in order.
pub fn run(f: &Function, cfg: &LaunchConfig, args: &[Arg<'_>], site: &KernelSite, file: &str) -> Result<()> {
    let bufs: Vec<Option<HostBuf>> = args
        .iter()
        .map(|a| match *a {
            Arg::Host { ptr, len, elem, writable, .. } => Some(HostBuf { ptr, len, elem, writable }),
            _ => None,
        })
        .collect();
    let mut env: Vec<Vec<ConstVal>> = vec![Vec::new(); f.values.len()];
    let [gx, gy, gz] = cfg.grid;
    for z in 0..gz {
        for y in 0..gy {
            for x in 0..gx {
                let mut p = Program { f, pid: [x, y, z], grid: cfg.grid, args, bufs: &bufs, env: &mut env };
                p.block(&f.body).map_err(|(v, message)| {
                    let loc = f.inst(v).loc;
                    let mut site = site.clone();
                    site.at = Some(format!("{}:{}:{}", loc.file.unwrap_or(file), loc.line, loc.col));
                    Error::Interpret { site, message: format!("program ({x}, {y}, {z}): {message}") }
                })?;
            }
        }
    }
    Ok(())
}

type Fail = (Value, String);

/// How a block ended.
#[derive(PartialEq)]
enum Flow {
    Next,
    Return,
}

struct Program<'a, 'b> {
    f: &'a Function,
    pid: [u32; 3],
    grid: [u32; 3],
    args: &'a [Arg<'b>],
    bufs: &'a [Option<HostBuf>],
    env: &'a mut [Vec<ConstVal>],
}

/// Row-major strides of `shape`.
fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

/// The multi-index of flat index `i` in `shape`.
fn unflatten(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        idx[d] = i % shape[d];
        i /= shape[d];
    }
    idx
}

impl Program<'_, '_> {
    fn block(&mut self, b: &crate::ir::Block) -> std::result::Result<Flow, Fail> {
        for &v in &b.insts {
            if self.inst(v)? == Flow::Return {
                return Ok(Flow::Return);
            }
        }
        Ok(Flow::Next)
    }

    fn region(&mut self, r: &Region) -> std::result::Result<(Flow, Vec<Vec<ConstVal>>), Fail> {
        let flow = self.block(&r.body)?;
        Ok((flow, r.yields.iter().map(|y| self.env[y.index()].clone()).collect()))
    }

    fn scalar(&self, v: Value) -> ConstVal {
        self.env[v.index()][0]
    }

    #[allow(clippy::needless_range_loop)] // lanes index several parallel vectors
    fn inst(&mut self, v: Value) -> std::result::Result<Flow, Fail> {
        let f = self.f;
        let inst = f.inst(v);
        let ty = &inst.ty;
        let fail = |m: String| (v, m);
        let n = ty.numel();
        // A shared-memory buffer's value is the block it holds; a store replaces it.
        if let Op::LocalStore { buf, value } = &inst.op {
            self.env[buf.index()] = self.env[value.index()].clone();
            return Ok(Flow::Next);
        }
        let env = &*self.env;
        let out: Vec<ConstVal> = match &inst.op {
            // Unspecified contents, made to show if read: NaN, or i64::MIN for integers.
            Op::LocalAlloc(None) => vec![if ty.dtype.is_float() { ConstVal::Float(f64::NAN) } else { ConstVal::Int(i64::MIN) }; n],
            Op::LocalAlloc(Some(x)) | Op::LocalLoad(x) => env[x.index()].clone(),
            Op::LocalStore { .. } => unreachable!("handled above"),
            // Made only by the GPU pipeliner (`passes::pipeline`), which the interpreter
            // does not run: it executes the kernel as written.
            Op::LocalSlot { .. } | Op::LocalTrans(_) | Op::AsyncCopy { .. } | Op::AsyncCommit | Op::AsyncWait(_) | Op::TmaCopy { .. } | Op::TmaStore { .. } | Op::MbarInit { .. } | Op::MbarWait { .. } | Op::MbarArrive { .. } | Op::WarpSpecialize { .. } | Op::Turn { .. } => {
                return Err(fail("internal: an operand staging view or a pipelined loop's async copy reached the interpreter, which runs kernels as written".into()))
            }
            Op::Param(i) => vec![match self.args[*i as usize] {
                Arg::I32(x) => ConstVal::Int(x as i64),
                Arg::I64(x) => ConstVal::Int(x),
                Arg::F32(x) => ConstVal::Float(x as f64),
                Arg::Host { .. } | Arg::Device { .. } => ConstVal::Int(0), // pointers: offset 0 from their root
                Arg::Bytes(_) => ConstVal::Int(0), // a unit: read by the operations that take the parameter
            }],
            Op::Const(c) => vec![*c],
            Op::ProgramId(a) => vec![ConstVal::Int(self.pid[*a as usize] as i64)],
            Op::NumPrograms(a) => vec![ConstVal::Int(self.grid[*a as usize] as i64)],
            Op::Arange { start, end } => (*start..*end).map(ConstVal::Int).collect(),
            Op::Splat(x) => vec![env[x.index()][0]; n],
            Op::Binary(op, a, b) => {
                let d = f.ty(*a).dtype;
                let (xa, xb) = (&env[a.index()], &env[b.index()]);
                let mut r = Vec::with_capacity(n);
                for i in 0..n {
                    r.push(eval_binary(*op, d, xa[i], xb[i]).map_err(fail)?);
                }
                r
            }
            Op::Cmp(op, a, b) => {
                let d = f.ty(*a).dtype;
                let (xa, xb) = (&env[a.index()], &env[b.index()]);
                (0..n).map(|i| ConstVal::Bool(eval_cmp(*op, d, xa[i], xb[i]))).collect()
            }
            Op::Unary(op, a) => {
                let d = f.ty(*a).dtype;
                let mut r = Vec::with_capacity(n);
                for &x in &env[a.index()] {
                    r.push(eval_unary(*op, d, x).map_err(fail)?);
                }
                r
            }
            Op::Select(c, a, b) => {
                let (xc, xa, xb) = (&env[c.index()], &env[a.index()], &env[b.index()]);
                (0..n).map(|i| if xc[i].as_bool() { xa[i] } else { xb[i] }).collect()
            }
            Op::Fma(a, b, c) => {
                // In f32 with one rounding, then to the type, as the GPU's `fma.rn.f32`.
                let (xa, xb, xc) = (&env[a.index()], &env[b.index()], &env[c.index()]);
                (0..n).map(|i| eval_cast(DType::F32, ty.dtype, ConstVal::Float((xa[i].as_f64() as f32).mul_add(xb[i].as_f64() as f32, xc[i].as_f64() as f32) as f64))).collect()
            }
            Op::Cast(a) => {
                let from = f.ty(*a).dtype;
                env[a.index()].iter().map(|&x| eval_cast(from, ty.dtype, x)).collect()
            }
            Op::ExpandDims(a, _) | Op::Reshape(a) | Op::ConvertLayout(a) => env[a.index()].clone(),
            Op::Dot { a, b, acc, precision } => {
                // Exact products, summed in f32 in order after the accumulator.
                let (m, k, n) = (f.ty(*a).shape[0], f.ty(*a).shape[1], f.ty(*b).shape[1]);
                let d = f.ty(*a).dtype;
                let (xa, xb, xc) = (&env[a.index()], &env[b.index()], &env[acc.index()]);
                let mut r = Vec::with_capacity(m * n);
                for i in 0..m {
                    for j in 0..n {
                        let mut s = xc[i * n + j].as_f64() as f32;
                        for t in 0..k {
                            s = (s as f64 + crate::ir::dot::product(*precision, d, xa[i * k + t].as_f64(), xb[t * n + j].as_f64())) as f32;
                        }
                        r.push(ConstVal::Float(s as f64));
                    }
                }
                r
            }
            Op::Broadcast(a) => {
                let (src, xs) = (&f.ty(*a).shape, &env[a.index()]);
                let st = strides(src);
                (0..n)
                    .map(|i| {
                        let idx = unflatten(i, &ty.shape);
                        let j: usize = idx.iter().zip(src).zip(&st).map(|((&k, &s), &t)| if s == 1 { 0 } else { k * t }).sum();
                        xs[j]
                    })
                    .collect()
            }
            Op::Permute(a, perm) => {
                let (src, xs) = (&f.ty(*a).shape, &env[a.index()]);
                let st = strides(src);
                (0..n)
                    .map(|i| {
                        let idx = unflatten(i, &ty.shape);
                        let j: usize = perm.iter().zip(&idx).map(|(&p, &k)| k * st[p as usize]).sum();
                        xs[j]
                    })
                    .collect()
            }
            Op::Reduce { op, x, axis } => {
                let (src, xs) = (&f.ty(*x).shape, &env[x.index()]);
                let d = f.ty(*x).dtype;
                let (ax, len) = (*axis as usize, src[*axis as usize]);
                let st = strides(src)[ax];
                let outer_shape: Vec<usize> = src.iter().enumerate().filter(|&(k, _)| k != ax).map(|(_, &s)| s).collect();
                (0..n.max(1))
                    .map(|i| {
                        // Flat index of element 0 along the axis.
                        let mut idx = unflatten(i, &outer_shape);
                        idx.insert(ax, 0);
                        let base: usize = idx.iter().zip(strides(src)).map(|(&k, t)| k * t).sum();
                        if op.is_arg() {
                            let mut best = (xs[base], 0i64);
                            for k in 1..len {
                                let c = xs[base + k * st];
                                if reduce::arg_better(*op, c, k as i64, best.0, best.1) {
                                    best = (c, k as i64);
                                }
                            }
                            ConstVal::Int(best.1)
                        } else {
                            (0..len).fold(reduce::identity(*op, d), |acc, k| reduce::combine(*op, d, acc, xs[base + k * st]))
                        }
                    })
                    .collect()
            }
            Op::Scan { x, axis, .. } => {
                let (src, xs) = (&f.ty(*x).shape, &env[x.index()]);
                let d = f.ty(*x).dtype;
                let ax = *axis as usize;
                let st = strides(src)[ax];
                let mut r = xs.clone();
                for i in 0..n {
                    if unflatten(i, src)[ax] > 0 {
                        r[i] = reduce::combine(ReduceOp::Sum, d, r[i - st], xs[i]);
                    }
                }
                r
            }
            Op::AddPtr(p, o) => {
                let (xp, xo) = (&env[p.index()], &env[o.index()]);
                (0..n.max(1)).map(|i| ConstVal::Int(xp[i].as_i64().wrapping_add(xo[i].as_i64()))).collect()
            }
            Op::PtrOffset(p) => env[p.index()].clone(),
            Op::Load { ptr, mask, other } => {
                let (root, buf) = buffer(f, self.bufs, *ptr).map_err(fail)?;
                let mut r = Vec::with_capacity(n);
                for i in 0..n.max(1) {
                    let on = mask.is_none_or(|m| env[m.index()][i].as_bool());
                    if !on {
                        r.push(other.map_or(ConstVal::of(ty.dtype, 0.0), |o| env[o.index()][i]));
                        continue;
                    }
                    let off = env[ptr.index()][i].as_i64();
                    let idx = check(f, root, buf, off, "load").map_err(fail)?;
                    // SAFETY: `check` gave `idx < buf.len`; `buf` comes from an `Arg::Host`
                    // of this launch, which the bindings make from a live borrow of `len`
                    // elements of `elem` (`SpecKey::of` checked `elem` against the parameter).
                    r.push(unsafe { buf.read(idx) });
                }
                r
            }
            Op::Store { ptr, value, mask } => {
                let (root, buf) = buffer(f, self.bufs, *ptr).map_err(fail)?;
                if !buf.writable {
                    return Err(fail(format!("store through `{}`, which was passed read-only", f.params[root as usize].name)));
                }
                for i in 0..f.ty(*ptr).numel() {
                    if !mask.is_none_or(|m| env[m.index()][i].as_bool()) {
                        continue;
                    }
                    let off = env[ptr.index()][i].as_i64();
                    let idx = check(f, root, buf, off, "store").map_err(fail)?;
                    // SAFETY: in bounds by `check`; `buf.writable` was checked above, so the
                    // bindings made it from a `&mut` borrow (pointer from `as_mut_ptr`).
                    unsafe { buf.write(idx, env[value.index()][i]) };
                }
                vec![]
            }
            Op::Atomic { op, ptr, value, cmp, mask, .. } => {
                let (root, buf) = buffer(f, self.bufs, *ptr).map_err(fail)?;
                if !buf.writable {
                    return Err(fail(format!("`{}` through `{}`, which was passed read-only", op.name(), f.params[root as usize].name)));
                }
                let d = ty.dtype;
                let mut r = Vec::with_capacity(n);
                for i in 0..n.max(1) {
                    if !mask.is_none_or(|m| env[m.index()][i].as_bool()) {
                        r.push(ConstVal::of(d, 0.0));
                        continue;
                    }
                    let off = env[ptr.index()][i].as_i64();
                    let idx = check(f, root, buf, off, op.name()).map_err(fail)?;
                    // SAFETY: in bounds by `check`, from a live borrow (see `Op::Load`).
                    let old = unsafe { buf.read(idx) };
                    let x = env[value.index()][i];
                    let new = match op {
                        AtomicOp::Add => eval_binary(crate::ir::BinOp::Add, d, old, x).map_err(fail)?,
                        AtomicOp::Max => eval_binary(crate::ir::BinOp::Max, d, old, x).map_err(fail)?,
                        AtomicOp::Min => eval_binary(crate::ir::BinOp::Min, d, old, x).map_err(fail)?,
                        AtomicOp::Xchg => x,
                        AtomicOp::Cas => {
                            let c = env[cmp.expect("cas has cmp").index()][i];
                            let same = match (old, c) {
                                (ConstVal::Float(a), ConstVal::Float(b)) => (a as f32).to_bits() == (b as f32).to_bits(),
                                (a, b) => a.as_i64() == b.as_i64(),
                            };
                            if same { x } else { old }
                        }
                    };
                    // SAFETY: in bounds by `check`; writable, checked above (see `Op::Store`).
                    unsafe { buf.write(idx, new) };
                    r.push(old);
                }
                r
            }
            Op::For { start, end, step, init, body } => {
                let (s, e, st) = (self.scalar(*start).as_i64(), self.scalar(*end).as_i64(), self.scalar(*step).as_i64());
                let mut carried: Vec<Vec<ConstVal>> = init.iter().map(|x| self.env[x.index()].clone()).collect();
                let mut i = s;
                let d = f.ty(body.args[0]).dtype;
                while st > 0 && i < e {
                    self.env[body.args[0].index()] = vec![ConstVal::Int(i)];
                    for (a, c) in body.args[1..].iter().zip(carried) {
                        self.env[a.index()] = c;
                    }
                    let (flow, ys) = self.region(body)?;
                    if flow == Flow::Return {
                        return Ok(Flow::Return);
                    }
                    carried = ys;
                    i = crate::ir::arith::wrap(d, i.wrapping_add(st));
                    if i < s {
                        break; // the counter wrapped around
                    }
                }
                self.set_results(v, carried);
                return Ok(Flow::Next);
            }
            Op::If { cond, then, els } => {
                let r = if self.scalar(*cond).as_bool() { then } else { els };
                let (flow, ys) = self.region(r)?;
                if flow == Flow::Return {
                    return Ok(Flow::Return);
                }
                self.set_results(v, ys);
                return Ok(Flow::Next);
            }
            Op::Result(..) => return Ok(Flow::Next), // set by the owner
            Op::Arg(..) => vec![],
            Op::Return => return Ok(Flow::Return),
            // Inserted by the guard of checked GPU launches only; the interpreter checks
            // every access itself.
            Op::BoundsCheck { .. } => vec![],
            Op::Assert { cond, msg } => {
                if let Some(i) = env[cond.index()].iter().position(|c| !c.as_bool()) {
                    let at = if f.ty(*cond).is_scalar() { String::new() } else { format!(" at element {:?}", unflatten(i, &f.ty(*cond).shape)) };
                    return Err(fail(format!("device assertion failed{at}: {msg}")));
                }
                vec![]
            }
            Op::Print { prefix, args } => {
                let vals: Vec<String> = args.iter().map(|a| format!("{:?}", env[a.index()].iter().map(|c| c.to_string()).collect::<Vec<_>>())).collect();
                println!("program ({}, {}, {}) {prefix}{}", self.pid[0], self.pid[1], self.pid[2], vals.join(" "));
                vec![]
            }
        };
        self.env[v.index()] = out;
        Ok(Flow::Next)
    }

    /// Give the `Result` instructions of `owner` their values.
    fn set_results(&mut self, owner: Value, vals: Vec<Vec<ConstVal>>) {
        for (r, x) in self.f.results_of(owner).into_iter().zip(vals) {
            if let Some(r) = r {
                self.env[r.index()] = x;
            }
        }
    }
}
fn buffer<'b>(f: &Function, bufs: &'b [Option<HostBuf>], ptr: Value) -> std::result::Result<(u32, &'b HostBuf), String> {
    let root = f.pointer_root(ptr).ok_or("pointer does not derive from a parameter")?;
    match (&f.params[root as usize].kind, &bufs[root as usize]) {
        (ParamKind::Ptr { .. }, Some(b)) => Ok((root, b)),
        _ => Err(format!("parameter `{}` is not a host buffer", f.params[root as usize].name)),
    }
}

fn check(f: &Function, root: u32, buf: &HostBuf, off: i64, what: &str) -> std::result::Result<usize, String> {
    if off < 0 || off as u64 >= buf.len as u64 {
        return Err(crate::error::out_of_bounds(what, &f.params[root as usize].name, off, buf.len as u64));
    }
    Ok(off as usize)
}
