//! Library kernels on the interpreter against plain CPU computations, on fresh random
//! inputs, at sizes around the block boundary (n = 0, 1, BLOCK-1, BLOCK+1, large).

use crate::common::*;
use dsl_runtime::prelude::*;
use dsl_runtime::Error;
use kernels_lib::*;

const BLOCK: usize = 1024;

#[test]
fn relu_mul_add_f32_matches_cpu() {
    let rt = Runtime::interpreter();
    for &n in SIZES {
        let s = seed();
        let (a, b, c) = (random_f32(n, s), random_f32(n, s + 1), random_f32(n, s + 2));
        // Poison the output past the end too: the kernel must not write there.
        let mut out = vec![f32::NAN; n + 7];
        relu_mul_add::<f32, BLOCK>::launch(&rt, grid_for(n, BLOCK), &a, &b, &c, &mut out[..n], n as i32).unwrap();
        for i in 0..n {
            let want = a[i].max(0.0) * b[i] + c[i];
            assert_eq!(out[i], want, "n={n} i={i} seed={s}");
        }
        assert!(out[n..].iter().all(|x| x.is_nan()));
    }
}

#[test]
fn relu_mul_add_bf16_rounds_each_operation() {
    let rt = Runtime::interpreter();
    for &n in SIZES {
        let s = seed();
        let (a, b, c) = (random_bf16(n, s), random_bf16(n, s + 1), random_bf16(n, s + 2));
        let mut out = vec![bf16::NAN; n];
        relu_mul_add::<bf16, BLOCK>::launch(&rt, grid_for(n, BLOCK), &a, &b, &c, &mut out, n as i32).unwrap();
        for i in 0..n {
            let r = |x: f32| bf16::from_f32(x).to_f32();
            let want = r(r(a[i].to_f32().max(0.0) * b[i].to_f32()) + c[i].to_f32());
            assert_eq!(out[i].to_f32(), want, "n={n} i={i} seed={s}");
        }
    }
}

/// In place, with an `i64` length (offsets computed in 64 bits). Offsets past 2^31 are
/// tested on the GPU (`gpu::offsets_past_2_pow_31_address_the_right_elements`): the
/// interpreter would need 16 GB of host memory and minutes for the same.
#[test]
fn axpy_in_place() {
    let rt = Runtime::interpreter();
    for &n in SIZES {
        let s = seed();
        let x = random_f32(n, s);
        let y0 = random_f32(n, s + 1);
        let mut y = y0.clone();
        axpy::<512>::launch(&rt, grid_for(n, 512), 1.5, &x, &mut y, n as i64).unwrap();
        for i in 0..n {
            assert_eq!(y[i], 1.5 * x[i] + y0[i], "n={n} i={i} seed={s}");
        }
    }
}

#[test]
fn activations_match_cpu() {
    let rt = Runtime::interpreter();
    let n = 5000;
    let s = seed();
    let x = random_f32(n, s);
    let mut out = vec![f32::NAN; n];
    gelu_tanh::<256>::launch(&rt, grid_for(n, 256), &x, &mut out, n as i32).unwrap();
    let (reference, scale) = examples::workloads::gelu_terms(&x);
    let got: Vec<f64> = out.iter().map(|&v| v as f64).collect();
    // The interpreter's tanh is exact in f32: `inner` is off by gamma_7, which moves tanh by
    // at most 0.45 gamma_7; tanh, 1 + t and 0.5 v (1 + t) round once each; relative to the
    // terms' size 0.5 |v| (1 + |t|).
    use examples::workloads::{chain, gamma, silu_bound, REFERENCE, U_F32};
    assert_close(&format!("gelu seed={s}"), &got, &reference, Some(&scale), chain(&[0.45 * gamma(7.0, U_F32), U_F32, U_F32, U_F32]) + REFERENCE);

    let (g, u) = (random_bf16(n, s + 1), random_bf16(n, s + 2));
    let mut o = vec![bf16::NAN; n];
    silu_mul::<256>::launch(&rt, grid_for(n, 256), &g, &u, &mut o, n as i32).unwrap();
    let reference: Vec<f64> = g.iter().zip(&u).map(|(g, u)| { let g = g.to_f64(); g / (1.0 + (-g).exp()) * u.to_f64() }).collect();
    let got: Vec<f64> = o.iter().map(|v| v.to_f64()).collect();
    assert_close(&format!("silu_mul seed={s}"), &got, &reference, None, silu_bound());
}

#[test]
fn conversions_and_integers() {
    let rt = Runtime::interpreter();
    let n = 3001;
    let s = seed();
    let x = random_f32(n, s);
    let mut h = vec![bf16::ZERO; n];
    convert::<f32, bf16, 1024>::launch(&rt, grid_for(n, 1024), &x, &mut h, n as i32).unwrap();
    assert!(x.iter().zip(&h).all(|(a, b)| bf16::from_f32(*a) == *b));
    let mut back = vec![0.0f32; n];
    convert::<bf16, f32, 1024>::launch(&rt, grid_for(n, 1024), &h, &mut back, n as i32).unwrap();
    assert!(h.iter().zip(&back).all(|(a, b)| a.to_f32() == *b));

    let xi: Vec<i32> = x.iter().map(|v| (v * 100.0) as i32).collect();
    let (mut out, mut flags) = (vec![0i32; n], vec![7u8; n]);
    clamp_i32::<128>::launch(&rt, grid_for(n, 128), &xi, &mut out, &mut flags, -150, 200, n as i32).unwrap();
    for i in 0..n {
        let c = xi[i].clamp(-150, 200);
        assert_eq!((out[i], flags[i]), (c, (c != xi[i]) as u8), "i={i}");
    }

    let xs: Vec<f16> = x.iter().map(|&v| f16::from_f32(v)).collect();
    let mut o = vec![f16::ZERO; n];
    scale_shift::<1024>::launch(&rt, grid_for(n, 1024), &xs, &mut o, 0.5, 1.0, n as i32).unwrap();
    assert!(xs.iter().zip(&o).all(|(a, b)| f16::from_f32(a.to_f32() * 0.5 + 1.0) == *b));
}

#[test]
fn masked_off_lanes_return_other() {
    // A kernel whose mask keeps only even offsets; the odd lanes read `other`.
    #[kernel]
    fn evens<const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32) {
        let offs = program_id(0) * BLOCK + arange::<BLOCK>();
        let v = load(x + offs, (offs % 2 == 0) & (offs < n), -7.5);
        store(out + offs, v, offs < n);
    }
    let rt = Runtime::interpreter();
    let n = 300;
    let x = random_f32(n, seed());
    let mut out = vec![0.0f32; n];
    evens::<128>::launch(&rt, grid_for(n, 128), &x, &mut out, n as i32).unwrap();
    for i in 0..n {
        assert_eq!(out[i], if i % 2 == 0 { x[i] } else { -7.5 });
    }
}

#[test]
fn out_of_bounds_access_is_reported_with_the_line() {
    // The mask says n, but the output is shorter: the interpreter must say where.
    let rt = Runtime::interpreter();
    let n = 100;
    let (a, b, c) = (random_f32(n, 1), random_f32(n, 2), random_f32(n, 3));
    let mut out = vec![0.0f32; n - 1];
    let err = relu_mul_add::<f32, 64>::launch(&rt, grid_for(n, 64), &a, &b, &c, &mut out, n as i32).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::Interpret { .. }), "{msg}");
    assert!(msg.contains("relu_mul_add") && msg.contains("out[99]") && msg.contains("length 99"), "{msg}");
    assert!(msg.contains("kernels-lib/src/lib.rs:"), "the error names the kernel's source line: {msg}");
    // The same with a read: a shorter input.
    let short = random_f32(n - 10, 4);
    let mut out = vec![0.0f32; n];
    let err = relu_mul_add::<f32, 64>::launch(&rt, grid_for(n, 64), &short, &b, &c, &mut out, n as i32).unwrap_err();
    assert!(err.to_string().contains("a[90]"), "{err}");
}

#[test]
fn launch_errors_are_errors() {
    let rt = Runtime::interpreter();
    let (a, b, c) = (vec![1.0f32; 4], vec![1.0f32; 4], vec![1.0f32; 4]);
    let mut out = vec![0.0f32; 4];
    let err = relu_mul_add::<f32, 64>::launch(&rt, grid_for(4, 64).warps(3), &a, &b, &c, &mut out, 4).unwrap_err();
    assert!(err.to_string().contains("num_warps"), "{err}");
    // A block that is too large is reported by the builder with the line.
    let err = relu_mul_add::<f32, 2_000_000>::launch(&rt, grid_for(4, 2_000_000), &a, &b, &c, &mut out, 4).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("BLOCK=2000000") && msg.contains("larger than the limit"), "{msg}");
    // The error points at `arange` in the kernel's source.
    let src = include_str!("../../kernels-lib/src/lib.rs");
    let line = src.lines().position(|l| l.contains("fn relu_mul_add<")).unwrap() + 2;
    let col = src.lines().nth(line - 1).unwrap().find("arange").unwrap() + 1;
    assert!(msg.contains(&format!("kernels-lib/src/lib.rs:{line}:{col}")), "{msg}");
}

#[test]
fn blocks_that_are_not_powers_of_two_are_padded() {
    let rt = Runtime::interpreter();
    let n = 100;
    let (a, b, c) = (random_f32(n, 1), random_f32(n, 2), random_f32(n, 3));
    let mut out = vec![f32::NAN; n];
    relu_mul_add::<f32, 48>::launch(&rt, grid_for(n, 48), &a, &b, &c, &mut out, n as i32).unwrap();
    for i in 0..n {
        assert_eq!(out[i], a[i].max(0.0) * b[i] + c[i]);
    }
}

/// Launch arguments the kernel cannot take are `Err`s before anything runs, on every
/// launcher (the CUDA runtime runs the same `LaunchConfig::validate`).
#[test]
fn grids_beyond_the_device_limits_are_errors_and_empty_grids_do_nothing() {
    let rt = Runtime::interpreter();
    let (a, b, c) = (vec![1.0f32; 4], vec![1.0f32; 4], vec![1.0f32; 4]);
    let mut out = vec![-3.0f32; 4];
    for grid in [LaunchConfig::grid(u32::MAX), LaunchConfig::grid3(1, 65536, 1), LaunchConfig::grid3(1, 1, 70000)] {
        let err = relu_mul_add::<f32, 64>::launch(&rt, grid, &a, &b, &c, &mut out, 4).unwrap_err();
        assert!(matches!(err, Error::Launch { .. }) && err.to_string().contains("larger than the device allows"), "{err}");
    }
    // An empty grid launches nothing (Triton's behaviour; n = 0 needs no special case),
    // but is still validated.
    relu_mul_add::<f32, 64>::launch(&rt, LaunchConfig::grid3(0, 1, 1), &a, &b, &c, &mut out, 4).unwrap();
    assert_eq!(out, vec![-3.0; 4]);
    assert!(relu_mul_add::<f32, 64>::launch(&rt, LaunchConfig::grid(0).warps(3), &a, &b, &c, &mut out, 4).is_err());
}

/// An unchecked launch trusts the kernel's masks: a buffer shorter than what they enable is
/// the caller's fault (documented on `launch_unchecked`), and the interpreter still
/// reports it as an error naming the access, where the GPU would read or write out of
/// bounds.
#[test]
fn an_unchecked_launch_on_a_short_buffer_is_reported_by_the_interpreter() {
    let rt = Runtime::interpreter();
    let n = 100;
    let (a, b, c) = (random_f32(n, 1), random_f32(n, 2), random_f32(n - 1, 3));
    let mut out = vec![0.0f32; n];
    let err = unsafe { relu_mul_add::<f32, 64>::launch_unchecked(&rt, grid_for(n, 64), &a, &b, &c, &mut out, n as i32) }.unwrap_err();
    assert!(matches!(err, Error::Interpret { .. }) && err.to_string().contains("c[99]"), "{err}");
}

/// 1,000 failed builds (a block over the size limit: the error comes from the IR builder,
/// before LLVM) and 10,000 launches in one process do not grow its memory: no cache or
/// error path keeps what it built. (The GPU half, whose failures go through LLVM, the JIT
/// linker and a module load, with device memory measured too, is
/// `gpu::many_launches_and_failed_loads_do_not_grow_memory_on_gpu`.)
#[test]
fn many_launches_and_failed_compiles_do_not_grow_memory() {
    // In a process of its own: the other tests of this binary allocate concurrently.
    crate::common::run_in_processes("interp::child_memory_growth", 1, &[("RUTILE_TEST_CHILD", "1".as_ref())]);
}

#[test]
#[ignore = "run by many_launches_and_failed_compiles_do_not_grow_memory"]
fn child_memory_growth() {
    if std::env::var_os("RUTILE_TEST_CHILD").is_none() {
        return;
    }
    use dsl_runtime::cache::DiskCache;
    use dsl_runtime::compile::{CodegenOptions, Compiler};
    use dsl_runtime::emit::Target;
    use dsl_runtime::ir::ParamSpec;
    use dsl_runtime::launch::Safety;
    let rt = Runtime::interpreter();
    let n = 64;
    let (a, b, c) = (random_f32(n, 1), random_f32(n, 2), random_f32(n, 3));
    let mut out = vec![0.0f32; n];
    let c0 = Compiler::new(DiskCache::new(None));
    let opts = CodegenOptions { num_warps: 4, num_stages: 1, safety: Safety::Unchecked, len_specs: vec![], target: Target::SM90, debug: false, wgmma: true, tma: true, tma_store: false, warp_specialize: false, min_programs_per_sm: 1, prefetch: true };
    let round = |launches: usize, fails: usize, out: &mut Vec<f32>| {
        for _ in 0..launches {
            relu_mul_add::<f32, 64>::launch(&rt, grid_for(n, 64), &a, &b, &c, &mut out[..], n as i32).unwrap();
        }
        for _ in 0..fails {
            // Does not build (block over the limit): an error each time.
            assert!(c0.ptx(&relu_mul_add::<f32, 2_000_000>::new(), &[ParamSpec::default(); 5], &opts).is_err());
        }
    };
    round(500, 50, &mut out); // warm up allocators and lazy statics
    let before = rss();
    round(10_000, 1_000, &mut out);
    let grown = rss().saturating_sub(before);
    assert!(grown < 8 << 20, "memory grew by {} KB over 10,000 launches and 1,000 failed compiles", grown >> 10);
}

/// `a * b + c` rounded once (`fma`), and twice when written out.
#[kernel]
pub(crate) fn fma_and_written_out<const BLOCK: usize>(a: Ptr<f32>, b: Ptr<f32>, c: Ptr<f32>, fused: Ptr<f32>, twice: Ptr<f32>, half_fused: Ptr<bf16>, n: i32) {
    let offs = program_id(0) * BLOCK + arange::<BLOCK>();
    let m = offs < n;
    let x = load(a + offs, m);
    let y = load(b + offs, m);
    let z = load(c + offs, m);
    store(fused + offs, fma(x, y, z), m);
    store(twice + offs, x * y + z, m);
    // 16-bit operands: in f32, rounded once to f32, then to the type.
    store(half_fused + offs, fma(x.to::<bf16>(), 2.0, z.to::<bf16>()), m);
}

/// The interpreter's `fma` rounds once: `(1 + 2^-12)^2 - (1 + 2^-11)` is `2^-24` fused and 0
/// written out (the product's `2^-24` is a tie, rounded away); on random inputs it is
/// `f32::mul_add`, and the bf16 form is the f32 one rounded to bf16.
#[test]
fn fma_rounds_once() {
    let rt = Runtime::interpreter();
    let s = seed();
    let n = 1000;
    let (mut a, mut b, mut c) = (random_f32(n, s), random_f32(n, s + 1), random_f32(n, s + 2));
    let e = 1.0 + 2f32.powi(-12);
    (a[0], b[0], c[0]) = (e, e, -(1.0 + 2f32.powi(-11)));
    let (mut fused, mut twice, mut half) = (vec![f32::NAN; n], vec![f32::NAN; n], vec![bf16::NAN; n]);
    fma_and_written_out::<256>::launch(&rt, grid_for(n, 256), &a, &b, &c, &mut fused, &mut twice, &mut half, n as i32).unwrap();
    assert_eq!((fused[0], twice[0]), (2f32.powi(-24), 0.0));
    for i in 0..n {
        assert_eq!(fused[i], a[i].mul_add(b[i], c[i]), "i={i} seed={s}");
        let h = bf16::from_f32(a[i]).to_f32().mul_add(2.0, bf16::from_f32(c[i]).to_f32());
        assert_eq!(half[i], bf16::from_f32(h), "i={i} seed={s}");
    }
}
