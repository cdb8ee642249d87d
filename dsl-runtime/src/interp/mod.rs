//! The CPU interpreter: runs the block IR on host buffers, program by program.
//!
//! It executes exactly the IR the GPU path compiles (built with the same specialization,
//! through the same [`crate::passes::optimize`] pipeline) except the bounds
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
use crate::ir::{Function, Op, ParamKind, Value};
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

    fn launch_args(&self, kernel: &dyn Kernel, cfg: &LaunchConfig, args: &[Arg<'_>], _safety: Safety) -> Result<()> {
        let meta = kernel.meta();
        cfg.validate(meta.name)?;
        let (specs, _) = specialize(meta, args)?;
        for ((name, _), a) in meta.params.iter().zip(args) {
            if let Arg::Device { .. } = a {
                return Err(Error::Launch {
                    kernel: meta.name.into(),
                    message: format!("argument `{name}` is a CUDA buffer, but the interpreter runs on host memory; pass a host slice or a Buffer from an interpreter Runtime"),
                });
            }
        }
        let mut f = compile::build_ir(kernel, &specs)?;
        let site = compile::site(kernel, &specs, None);
        optimize(&mut f, &PassOptions { bounds_guard: None })
            .map_err(|e| Error::Build { site: compile::site(kernel, &specs, Some(e.loc)), message: e.message })?;
        if cfg.is_empty() {
            return Ok(());
        }
        run(&f, cfg, args, &site, meta.file)
    }
}

/// A host buffer seen through its raw parts.
struct HostBuf {
    ptr: *mut u8,
    len: usize,
    elem: DType,
    writable: bool,
}

impl HostBuf {
    /// Read element `i` (in bounds).
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
    /// Write element `i` (in bounds, writable).
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
                program(f, [x, y, z], cfg.grid, args, &bufs, &mut env).map_err(|(v, message)| {
                    let loc = f.inst(v).loc;
                    let mut site = site.clone();
                    site.at = Some(format!("{file}:{}:{}", loc.line, loc.col));
                    Error::Interpret { site, message: format!("program ({x}, {y}, {z}): {message}") }
                })?;
            }
        }
    }
    Ok(())
}

type Fail = (Value, String);

#[allow(clippy::needless_range_loop)] // lanes index several parallel vectors
fn program(
    f: &Function,
    pid: [u32; 3],
    grid: [u32; 3],
    args: &[Arg<'_>],
    bufs: &[Option<HostBuf>],
    env: &mut [Vec<ConstVal>],
) -> std::result::Result<(), Fail> {
    for &v in &f.body.insts {
        let inst = f.inst(v);
        let ty = &inst.ty;
        let fail = |m: String| (v, m);
        let n = ty.numel();
        let out: Vec<ConstVal> = match inst.op {
            Op::Param(i) => vec![match args[i as usize] {
                Arg::I32(x) => ConstVal::Int(x as i64),
                Arg::I64(x) => ConstVal::Int(x),
                Arg::F32(x) => ConstVal::Float(x as f64),
                Arg::Host { .. } | Arg::Device { .. } => ConstVal::Int(0), // pointers: offset 0 from their root
            }],
            Op::Const(c) => vec![c],
            Op::ProgramId(a) => vec![ConstVal::Int(pid[a as usize] as i64)],
            Op::NumPrograms(a) => vec![ConstVal::Int(grid[a as usize] as i64)],
            Op::Arange { start, end } => (start..end).map(ConstVal::Int).collect(),
            Op::Splat(x) => vec![env[x.index()][0]; n],
            Op::Binary(op, a, b) => {
                let d = f.ty(a).dtype;
                let (xa, xb) = (&env[a.index()], &env[b.index()]);
                let mut r = Vec::with_capacity(n);
                for i in 0..n {
                    r.push(eval_binary(op, d, xa[i], xb[i]).map_err(fail)?);
                }
                r
            }
            Op::Cmp(op, a, b) => {
                let d = f.ty(a).dtype;
                let (xa, xb) = (&env[a.index()], &env[b.index()]);
                (0..n).map(|i| ConstVal::Bool(eval_cmp(op, d, xa[i], xb[i]))).collect()
            }
            Op::Unary(op, a) => {
                let d = f.ty(a).dtype;
                let mut r = Vec::with_capacity(n);
                for &x in &env[a.index()] {
                    r.push(eval_unary(op, d, x).map_err(fail)?);
                }
                r
            }
            Op::Select(c, a, b) => {
                let (xc, xa, xb) = (&env[c.index()], &env[a.index()], &env[b.index()]);
                (0..n).map(|i| if xc[i].as_bool() { xa[i] } else { xb[i] }).collect()
            }
            Op::Cast(a) => {
                let from = f.ty(a).dtype;
                env[a.index()].iter().map(|&x| eval_cast(from, ty.dtype, x)).collect()
            }
            Op::AddPtr(p, o) => {
                let (xp, xo) = (&env[p.index()], &env[o.index()]);
                (0..n).map(|i| ConstVal::Int(xp[i].as_i64().wrapping_add(xo[i].as_i64()))).collect()
            }
            Op::Load { ptr, mask, other } => {
                let (root, buf) = buffer(f, bufs, ptr).map_err(fail)?;
                let mut r = Vec::with_capacity(n);
                for i in 0..n {
                    let on = mask.is_none_or(|m| env[m.index()][i].as_bool());
                    if !on {
                        r.push(other.map_or(ConstVal::of(ty.dtype, 0.0), |o| env[o.index()][i]));
                        continue;
                    }
                    let off = env[ptr.index()][i].as_i64();
                    let idx = check(f, root, buf, off, "load").map_err(fail)?;
                    r.push(unsafe { buf.read(idx) });
                }
                r
            }
            Op::Store { ptr, value, mask } => {
                let (root, buf) = buffer(f, bufs, ptr).map_err(fail)?;
                if !buf.writable {
                    return Err(fail(format!("store through `{}`, which was passed read-only", f.params[root as usize].name)));
                }
                for i in 0..f.ty(ptr).numel() {
                    if !mask.is_none_or(|m| env[m.index()][i].as_bool()) {
                        continue;
                    }
                    let off = env[ptr.index()][i].as_i64();
                    let idx = check(f, root, buf, off, "store").map_err(fail)?;
                    unsafe { buf.write(idx, env[value.index()][i]) };
                }
                vec![]
            }
        };
        env[v.index()] = out;
    }
    Ok(())
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
        return Err(format!(
            "out-of-bounds {what}: `{}[{off}]` with `{}` of length {} (the lane's mask was true)",
            f.params[root as usize].name, f.params[root as usize].name, buf.len
        ));
    }
    Ok(off as usize)
}
