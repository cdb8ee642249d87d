//! Kernels built at run time from IR ([`IrKernel`]): they run on the interpreter, compile
//! to PTX that ptxas accepts, and are identified by their IR (one identity and one cache
//! entry per body, in this process and the next), apart from `#[kernel]`s.

use crate::codegen::{assemble, ptx_for};
use crate::common::*;
use dsl_runtime::built::{IrKernel, LaunchArgs};
use dsl_runtime::cache::DiskCache;
use dsl_runtime::compile::{build_ir, kernel_fingerprint, CodegenOptions, Compiler};
use dsl_runtime::driver::LaunchKey;
use dsl_runtime::emit::Target;
use dsl_runtime::ir::{printer::print, BinOp, CmpOp, Loc, Operand, ParamKind, ParamSpec};
use dsl_runtime::launch::{Kernel, KernelId, Safety, SpecKey};
use dsl_runtime::prelude::*;
use kernels_lib::{grid_for, relu_mul_add};

const BLOCK: usize = 256;

/// How the built kernel combines `relu(a) * b` with `c`.
#[derive(Clone, Copy)]
enum Tail {
    Add,
    Sub,
}

/// `out = max(a, 0) * b (+|-) c` over `n` elements, built with the IR builder in the order
/// `#[kernel] relu_mul_add::<f32, BLOCK>` emits it. With `constant`, the element type and
/// the block size are recorded as the constants `T` and `BLOCK`, as the macro records its
/// generic parameters.
fn relu_mul(name: &str, tail: Tail, constant: bool) -> IrKernel {
    let ptr = |writable| ParamKind::Ptr { elem: DType::F32, writable };
    let params = [("a", ptr(false)), ("b", ptr(false)), ("c", ptr(false)), ("out", ptr(true)), ("n", ParamKind::Scalar(DType::I32))];
    IrKernel::new(name, params, move |bld| {
        let l = Loc::default();
        if constant {
            bld.constant_value("T", DType::F32);
            bld.constant_value("BLOCK", BLOCK);
        }
        let (a, b, c, out, n) = (bld.param(0), bld.param(1), bld.param(2), bld.param(3), bld.param(4));
        let pid = bld.program_id(0, l)?;
        let start = bld.binary(BinOp::Mul, pid, Operand::Int(BLOCK as i64), l)?;
        let lanes = bld.arange(0, BLOCK as i64, l)?;
        let offs = bld.binary(BinOp::Add, start, lanes, l)?;
        let mask = Some(Operand::V(bld.cmp(CmpOp::Lt, offs, n, l)?));
        let zero = Some(Operand::Float(0.0));
        let pa = bld.add_ptr(a, offs, l)?;
        let x = bld.load(pa, mask, zero, l)?;
        let po = bld.add_ptr(out, offs, l)?;
        let relu = bld.binary(BinOp::Max, x, Operand::Float(0.0), l)?;
        let pb = bld.add_ptr(b, offs, l)?;
        let y = bld.load(pb, mask, zero, l)?;
        let prod = bld.binary(BinOp::Mul, relu, y, l)?;
        let pc = bld.add_ptr(c, offs, l)?;
        let z = bld.load(pc, mask, zero, l)?;
        let op = match tail {
            Tail::Add => BinOp::Add,
            Tail::Sub => BinOp::Sub,
        };
        let r = bld.binary(op, prod, z, l)?;
        bld.store(po, r, mask, l)?;
        Ok(())
    })
    .unwrap()
}

fn launch(rt: &Runtime, k: &dyn Kernel, a: &Buffer<f32>, b: &Buffer<f32>, c: &Buffer<f32>, out: &mut Buffer<f32>, n: usize) {
    LaunchArgs::new(rt).input(a).input(b).input(c).output(out).scalar(n as i32).launch(k, grid_for(n, BLOCK)).unwrap();
}

const NICE: ParamSpec = ParamSpec { div16: true, eq_one: false };

fn opts() -> CodegenOptions {
    CodegenOptions::for_launch(&LaunchConfig::grid(1).debug(false), Safety::Guarded, vec![NICE; 4], Target::SM90)
}

fn tmp(what: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("rutile-built-{what}-{}", crate::common::unique()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn built_relu_mul_add_matches_the_cpu_on_the_interpreter() {
    let k = relu_mul("relu_mul_add_built", Tail::Add, false);
    let rt = Runtime::interpreter();
    for &n in &[0, 1, BLOCK - 1, BLOCK + 1, 5000] {
        let s = seed();
        let (a, b, c) = (random_f32(n, s), random_f32(n, s + 1), random_f32(n, s + 2));
        let (da, db, dc) = (rt.upload(&a).unwrap(), rt.upload(&b).unwrap(), rt.upload(&c).unwrap());
        let mut out = rt.upload(&vec![f32::NAN; n]).unwrap();
        launch(&rt, &k, &da, &db, &dc, &mut out, n);
        let got = out.to_vec().unwrap();
        for i in 0..n {
            assert_eq!(got[i], a[i].max(0.0) * b[i] + c[i], "n={n} i={i} seed={s}");
        }
    }
    // Host slices too, with a poisoned tail the kernel must not write.
    let n = 300;
    let (a, b, c) = (random_f32(n, 1), random_f32(n, 2), random_f32(n, 3));
    let mut out = vec![f32::NAN; n + 5];
    LaunchArgs::new(&rt).host_input(&a).host_input(&b).host_input(&c).host_output(&mut out[..n]).scalar(n as i32).launch(&k, grid_for(n, BLOCK)).unwrap();
    assert!((0..n).all(|i| out[i] == a[i].max(0.0) * b[i] + c[i]) && out[n..].iter().all(|x| x.is_nan()));
}

#[test]
fn built_arguments_are_checked_against_the_parameters() {
    let k = relu_mul("relu_mul_add_built", Tail::Add, false);
    let rt = Runtime::interpreter();
    let x = rt.upload(&[1.0f32; 4]).unwrap();
    let mut y = rt.zeros::<f32>(4).unwrap();
    // `out` is written: a read-only buffer there is refused.
    let e = LaunchArgs::new(&rt).input(&x).input(&x).input(&x).input(&y).scalar(4i32).launch(&k, LaunchConfig::grid(1)).unwrap_err().to_string();
    assert!(e.contains("argument `out` must be a mutable buffer of f32"), "{e}");
    let e = LaunchArgs::new(&rt).input(&x).input(&x).output(&mut y).scalar(4i32).launch(&k, LaunchConfig::grid(1)).unwrap_err().to_string();
    assert!(e.contains("expected 5 arguments, got 4"), "{e}");
    // Names and parameters are checked when the kernel is made, with the caller's line.
    let e = IrKernel::new("not a name", [("x", ParamKind::Scalar(DType::I32))], |_| Ok(())).unwrap_err().to_string();
    assert!(e.contains("is not a kernel name") && e.contains("built.rs:"), "{e}");
    let e = IrKernel::new("k", [("x", ParamKind::Scalar(DType::F16))], |_| Ok(())).unwrap_err().to_string();
    assert!(e.contains("scalars are i32, i64 or f32"), "{e}");
    // A body that does not build fails at once, naming the kernel.
    let e = IrKernel::new("bad", [("x", ParamKind::Scalar(DType::I32))], |b| b.load(b.param(0), None, None, Loc::new(7, 9)).map(|_| ())).unwrap_err().to_string();
    assert!(e.contains("kernel `bad`") && e.contains(":7:9"), "{e}");
}

#[test]
fn built_kernel_ptx_assembles_for_sm_90a() {
    let k = relu_mul("relu_mul_add_built", Tail::Add, false);
    let ptx = ptx_for(&k, Target::SM90, Safety::Guarded, 4);
    assert!(ptx.contains(".entry relu_mul_add_built"), "{ptx}");
    // Aligned: 128-bit accesses, one per buffer and thread.
    assert_eq!(ptx.matches("ld.global.v4.b32").count(), 3, "{ptx}");
    assert_eq!(ptx.matches("st.global.v4.b32").count(), 1, "{ptx}");
    let report = assemble(&ptx, "sm_90a", "relu_mul_add_built");
    assert!(report.contains("0 bytes spill stores"), "{report}");
}

#[test]
fn identical_built_kernels_share_one_identity_and_one_cache_entry() {
    // Two kernels made apart (two closures), with one body.
    let (k1, k2) = (relu_mul("rma", Tail::Add, false), relu_mul("rma", Tail::Add, false));
    let other = relu_mul("rma", Tail::Sub, false);
    assert!(matches!(k1.id(), KernelId::Ir(_)));
    assert_eq!(k1.id(), k2.id());
    assert_ne!(k1.id(), other.id(), "a different body under the same name is another kernel");
    assert_ne!(k1.id(), relu_mul("rma2", Tail::Add, false).id(), "the name is part of the IR");

    // The driver's key of a launch: equal for the twins, apart for the other body.
    let rt = Runtime::interpreter();
    let (x, mut y) = (rt.zeros::<f32>(16).unwrap(), rt.zeros::<f32>(16).unwrap());
    let args = LaunchArgs::new(&rt).input(&x).input(&x).input(&x).output(&mut y).scalar(16i32);
    let cfg = LaunchConfig::grid(1);
    let key = |k: &dyn Kernel| LaunchKey::new(k, SpecKey::of(k.meta(), args.args()).unwrap(), &cfg, Safety::Guarded);
    assert_eq!(key(&k1), key(&k2));
    assert_ne!(key(&k1), key(&other));

    // One disk entry for the twins: compiled once, then found, by another compiler too.
    let dir = tmp("share");
    let c = Compiler::new(DiskCache::new(Some(dir.clone())));
    let (key1, ptx1) = c.ptx(&k1, &[NICE; 5], &opts()).unwrap();
    let (key2, ptx2) = c.ptx(&k2, &[NICE; 5], &opts()).unwrap();
    assert_eq!((&key1, &ptx1), (&key2, &ptx2));
    assert_eq!((c.stats().compiled, c.stats().disk_hits), (1, 1));
    let (key3, _) = c.ptx(&other, &[NICE; 5], &opts()).unwrap();
    assert_ne!(key3, key1);
    assert_eq!((c.stats().compiled, c.stats().disk_hits), (2, 1));
    let fresh = Compiler::new(DiskCache::new(Some(dir.clone())));
    assert_eq!(fresh.ptx(&relu_mul("rma", Tail::Add, false), &[NICE; 5], &opts()).unwrap().1, ptx1);
    assert_eq!((fresh.stats().compiled, fresh.stats().disk_hits), (0, 1));
    let _ = std::fs::remove_dir_all(dir);
}

/// The child half of [`a_built_kernels_identity_is_the_same_in_another_process`].
#[test]
#[ignore = "run by a_built_kernels_identity_is_the_same_in_another_process"]
fn child_writes_a_built_kernels_identity() {
    let Some(path) = std::env::var_os("RUTILE_TEST_ID_FILE") else { return };
    std::fs::write(path, format!("{:?}", relu_mul("rma", Tail::Add, false).id())).unwrap();
}

#[test]
fn a_built_kernels_identity_is_the_same_in_another_process() {
    let dir = tmp("process");
    let file = dir.join("id");
    run_in_processes("built::child_writes_a_built_kernels_identity", 1, &[("RUTILE_TEST_ID_FILE", file.as_os_str())]);
    assert_eq!(std::fs::read_to_string(&file).unwrap(), format!("{:?}", relu_mul("rma", Tail::Add, false).id()));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_built_kernel_and_a_macro_kernel_with_one_body_do_not_collide() {
    // The built twin of `#[kernel] relu_mul_add::<f32, 256>::new()`: the same name, parameters,
    // constant and instructions, so the same IR (without source locations).
    let twin = relu_mul("relu_mul_add", Tail::Add, true);
    let mac = relu_mul_add::<f32, BLOCK>::new();
    let unspec = [ParamSpec::default(); 5];
    assert_eq!(print(&build_ir(&twin, &unspec).unwrap(), false), print(&build_ir(&mac, &unspec).unwrap(), false));
    // The same code, so one fingerprint (the autotuner's) and one PTX entry on disk...
    assert_eq!(kernel_fingerprint(&twin, &unspec).unwrap(), kernel_fingerprint(&mac, &unspec).unwrap());
    assert_eq!(autotune::tuner::ir_hash(&twin).unwrap(), kernel_fingerprint(&mac, &unspec).unwrap());
    let dir = tmp("twin");
    let c = Compiler::new(DiskCache::new(Some(dir.clone())));
    let (key_mac, _) = c.ptx(&mac, &[NICE; 5], &opts()).unwrap();
    let (key_twin, _) = c.ptx(&twin, &[NICE; 5], &opts()).unwrap();
    assert_eq!((key_mac, c.stats().compiled, c.stats().disk_hits), (key_twin, 1, 1));
    let _ = std::fs::remove_dir_all(dir);
    // ...but two kernels to the driver: a type and an IR hash never compare equal.
    assert!(matches!(mac.id(), KernelId::Kernel { .. }) && matches!(twin.id(), KernelId::Ir(_)));
    let rt = Runtime::interpreter();
    let (x, mut y) = (rt.zeros::<f32>(16).unwrap(), rt.zeros::<f32>(16).unwrap());
    let args = LaunchArgs::new(&rt).input(&x).input(&x).input(&x).output(&mut y).scalar(16i32);
    let cfg = LaunchConfig::grid(1);
    let key = |k: &dyn Kernel| LaunchKey::new(k, SpecKey::of(k.meta(), args.args()).unwrap(), &cfg, Safety::Guarded);
    assert_ne!(key(&mac), key(&twin));
    drop(args);

    // A built kernel under the macro kernel's name with another body: launched one after
    // the other on the same buffers, each runs its own body.
    let impostor = relu_mul("relu_mul_add", Tail::Sub, true);
    assert_ne!(impostor.id(), twin.id());
    let n = 1000;
    let (a, b, c) = (random_f32(n, 7), random_f32(n, 8), random_f32(n, 9));
    let (da, db, dc) = (rt.upload(&a).unwrap(), rt.upload(&b).unwrap(), rt.upload(&c).unwrap());
    let mut out = rt.zeros::<f32>(n).unwrap();
    for round in 0..2 {
        relu_mul_add::<f32, BLOCK>::launch(&rt, grid_for(n, BLOCK), &da, &db, &dc, &mut out, n as i32).unwrap();
        assert!(out.to_vec().unwrap().iter().enumerate().all(|(i, &o)| o == a[i].max(0.0) * b[i] + c[i]), "round {round}");
        launch(&rt, &impostor, &da, &db, &dc, &mut out, n);
        assert!(out.to_vec().unwrap().iter().enumerate().all(|(i, &o)| o == a[i].max(0.0) * b[i] - c[i]), "round {round}");
    }
}

/// Shared-memory buffers, as passes and the fuser build them: `a` starts as the loaded
/// block; each of `rounds` iterations reads `a`, writes `a + 1` back and the value read
/// into `b`; then `hi = a` and `lo = b` (`x + rounds` and `x + rounds - 1`, in f32 steps).
/// The two buffers are live together (disjoint bytes); every read after a write and every
/// write after a read of the same bytes needs a barrier, and nothing else does.
pub(crate) fn buffers() -> IrKernel {
    let ptr = |writable| ParamKind::Ptr { elem: DType::F32, writable };
    let params = [("x", ptr(false)), ("hi", ptr(true)), ("lo", ptr(true)), ("rounds", ParamKind::Scalar(DType::I32))];
    IrKernel::new("buffers", params, |bld| {
        let l = Loc::default();
        let offs = bld.arange(0, 256, l)?;
        let px = bld.add_ptr(bld.param(0), offs, l)?;
        let x = bld.load(px, None, None, l)?;
        let a = bld.local_alloc(DType::F32, &[256], Some(x), l)?;
        let b = bld.local_alloc(DType::F32, &[256], None, l)?;
        bld.begin_for(Operand::Int(0), bld.param(3), Operand::Int(1), &[], l)?;
        let y = bld.local_load(a, l)?;
        let y1 = bld.binary(BinOp::Add, y, Operand::Float(1.0), l)?;
        bld.local_store(a, y1, l)?;
        bld.local_store(b, y, l)?;
        bld.end_for(&[], &[], l)?;
        let (hi, lo) = (bld.local_load(a, l)?, bld.local_load(b, l)?);
        let ph = bld.add_ptr(bld.param(1), offs, l)?;
        bld.store(ph, hi, None, l)?;
        let pl = bld.add_ptr(bld.param(2), offs, l)?;
        bld.store(pl, lo, None, l)?;
        Ok(())
    })
    .unwrap()
}

/// Launch [`buffers`] on 256 elements of `x` and return `(hi, lo)`.
pub(crate) fn run_buffers(rt: &Runtime, x: &[f32], rounds: i32, warps: u32) -> (Vec<f32>, Vec<f32>) {
    let dx = rt.upload(x).unwrap();
    let (mut hi, mut lo) = (rt.upload(&[f32::NAN; 256]).unwrap(), rt.upload(&[f32::NAN; 256]).unwrap());
    LaunchArgs::new(rt).input(&dx).output(&mut hi).output(&mut lo).scalar(rounds).launch(&buffers(), LaunchConfig::grid(1).warps(warps)).unwrap();
    (hi.to_vec().unwrap(), lo.to_vec().unwrap())
}

#[test]
fn shared_memory_buffers_on_the_interpreter_and_their_barriers() {
    let x = random_f32(256, seed());
    let (hi, lo) = run_buffers(&Runtime::interpreter(), &x, 3, 4);
    for i in 0..256 {
        let (a1, a2, a3) = (x[i] + 1.0, x[i] + 1.0 + 1.0, x[i] + 1.0 + 1.0 + 1.0);
        assert_eq!((hi[i], lo[i]), (a3, a2), "element {i} (after one round: {a1})");
    }
    // Two live buffers, disjoint: 2 KiB of shared memory.
    let k = buffers();
    let art = crate::codegen::artifacts_for(&k, Target::SM90, Safety::Guarded, 4);
    assert_eq!(art.meta.shared_bytes, 2048);
    // Barriers: in the loop, before reading `a` (the last write of it) and before writing
    // `a` (this iteration's read), none before writing `b`; none at the latch (the body
    // starts with a barrier, so what it leaves is never seen); after the loop one before
    // reading `a`, none more for `b`.
    let ptx = ptx_for(&k, Target::SM90, Safety::Guarded, 4);
    assert_eq!(ptx.matches("bar.sync").count(), 3, "{ptx}");
    assemble(&ptx, "sm_90a", "buffers");
}

/// `out[0] = v`, after a 128-byte parameter passed by value (64-aligned, as a TMA tensor
/// map is): whether `v` arrives shows that the parameters after it are where the kernel
/// reads them.
pub(crate) fn after_bytes() -> IrKernel {
    let params = [("desc", ParamKind::Bytes { size: 128, align: 64 }), ("out", ParamKind::Ptr { elem: DType::I32, writable: true }), ("v", ParamKind::Scalar(DType::I32))];
    IrKernel::new("after_bytes", params, |bld| {
        let l = Loc::default();
        let (out, v) = (bld.param(1), bld.param(2));
        bld.store(out, v, None, l)?;
        Ok(())
    })
    .unwrap()
}

/// A parameter of bytes passed by value (issue 11: a TMA descriptor) compiles to a
/// `.param .align 64 .b8 [128]` that ptxas takes, is recorded as 128 bytes aligned to 64 in
/// the compiled signature, runs on the interpreter, and an argument of another length or
/// kind is an error naming the parameter. Sizes the driver cannot pass are refused when the
/// kernel is built.
#[test]
fn bytes_parameters_pass_by_value() {
    let k = after_bytes();
    let art = crate::codegen::artifacts_for(&k, Target::SM90, Safety::Guarded, 1);
    assert!(art.ptx.contains(".param .align 64 .b8 after_bytes_param_0[128]"), "{}", art.ptx);
    assemble(&art.ptx, "sm_90a", "after_bytes");
    let slots: Vec<(u32, u32)> = art.meta.params.iter().map(|p| (p.bytes, p.align)).collect();
    assert_eq!(slots, [(128, 64), (8, 8), (4, 4), (8, 8)], "desc, out, v, out.len");
    let rt = Runtime::interpreter();
    let desc: Vec<u8> = (0..128).collect();
    let mut out = rt.upload(&[0i32]).unwrap();
    LaunchArgs::new(&rt).bytes(&desc).output(&mut out).scalar(41i32).launch(&k, LaunchConfig::grid(1)).unwrap();
    assert_eq!(out.to_vec().unwrap(), [41]);
    let e = LaunchArgs::new(&rt).bytes(&desc[..64]).output(&mut out).scalar(1i32).launch(&k, LaunchConfig::grid(1)).unwrap_err().to_string();
    assert!(e.contains("argument `desc` must be 128 bytes by value, got 64 bytes"), "{e}");
    let e = LaunchArgs::new(&rt).scalar(1i32).output(&mut out).scalar(1i32).launch(&k, LaunchConfig::grid(1)).unwrap_err().to_string();
    assert!(e.contains("argument `desc` must be 128 bytes by value, got an i32"), "{e}");
    for (size, align) in [(0, 8), (100, 64), (128, 3), (512, 64)] {
        let e = IrKernel::new("k", [("d", ParamKind::Bytes { size, align })], |_| Ok(())).unwrap_err().to_string();
        assert!(e.contains("by-value parameters take 1 to 256 bytes"), "{size} {align}: {e}");
    }
}

/// Clusters must tile the grid and hold at most 8 programs (checked before any launcher
/// runs); the interpreter runs a clustered launch as any other.
#[test]
fn clusters_are_checked_and_run_on_the_interpreter() {
    let cfg = LaunchConfig::grid3(4, 2, 1);
    assert!(cfg.cluster(2, 2, 1).validate("k").is_ok() && cfg.cluster(4, 2, 1).validate("k").is_ok());
    for (c, what) in [([3, 1, 1], "not a whole number"), ([0, 1, 1], "each at least 1"), ([4, 2, 2], "at most 8")] {
        let e = cfg.cluster(c[0], c[1], c[2]).validate("k").unwrap_err().to_string();
        assert!(e.contains(what), "{c:?}: {e}");
    }
    let k = relu_mul("relu_mul_add_built", Tail::Add, false);
    let rt = Runtime::interpreter();
    let n = 4 * BLOCK;
    let a = random_f32(n, seed());
    let x = rt.upload(&a).unwrap();
    let mut out = rt.zeros::<f32>(n).unwrap();
    LaunchArgs::new(&rt).input(&x).input(&x).input(&x).output(&mut out).scalar(n as i32).launch(&k, grid_for(n, BLOCK).cluster(2, 1, 1)).unwrap();
    assert!(out.to_vec().unwrap().iter().zip(&a).all(|(o, x)| *o == x.max(0.0) * x + x));
    let e = LaunchArgs::new(&rt).input(&x).input(&x).input(&x).output(&mut out).scalar(n as i32).launch(&k, grid_for(n, BLOCK).cluster(3, 1, 1)).unwrap_err().to_string();
    assert!(e.contains("not a whole number of (3, 1, 1) clusters"), "{e}");
}
