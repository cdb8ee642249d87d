//! `#[kernel_fn]` helpers on the interpreter: a kernel made of helpers (generic, with a
//! compile-time parameter, reading through a pointer, returning a mask, calling another by
//! path) against a float64 reference; errors inside a helper name the helper's lines, and
//! errors at a call (an argument of the wrong type) the call's.

use crate::common::*;
use dsl_runtime::compile::build_ir;
use dsl_runtime::ir::ParamSpec;
use dsl_runtime::prelude::*;
use dsl_runtime::Error;
use examples::workloads::{chain, gamma, REFERENCE, U_BF16, U_F32};

/// `c[0] + c[1] x + .. + c[K-1] x^(K-1)` by Horner's rule, in f32, the coefficients read
/// through a pointer; the loop over `K` is unrolled.
#[kernel_fn]
fn horner<const K: usize>(c: Ptr<f32>, x: f32) -> f32 {
    let mut acc = x * 0.0 + load(c + (K as i32 - 1));
    for k in 1..K {
        acc = acc * x + load(c + (K as i32 - 1 - k));
    }
    acc
}

/// `x` clamped to `[-limit, limit]`, in its own element type.
#[kernel_fn]
fn clamp_abs<T: Float>(x: T, limit: T) -> T {
    minimum(maximum(x, -limit), limit)
}

/// The lanes of the `N` elements from `start` that are below `n`.
#[kernel_fn]
fn in_bounds<const N: usize>(start: i32, n: i32) -> bool {
    start + arange::<N>() < n
}

mod act {
    use dsl_runtime::prelude::*;

    /// `max(x, 0)` in the element type of `x`.
    #[kernel_fn]
    pub fn relu<T: Float>(x: T) -> T {
        maximum(x, 0.0)
    }
}

/// `max(x, 0)^2`: a helper calling another, by path.
#[kernel_fn]
fn relu_squared(x: f32) -> f32 {
    let r = act::relu(x);
    r * r
}

/// `out = horner(c, clamp_abs(x, limit)) + relu(x)^2`, f32 math, stored in `T`.
#[kernel]
fn poly<T: Float, const BLOCK: usize>(x: Ptr<T>, c: Ptr<f32>, out: Ptr<T>, limit: f32, n: i32) {
    let start = program_id(0) * BLOCK;
    let offs = start + arange::<BLOCK>();
    let m = in_bounds::<BLOCK>(start, n);
    let v = load(x + offs, m, 0.0);
    let y = horner::<4>(c, clamp_abs(v, limit as T) as f32) + relu_squared(v as f32);
    store(out + offs, y as T, m);
}

/// Bound: `clamp_abs` is exact (a minimum and a maximum of values of `T`, `limit` being
/// representable); Horner's rule on `K` coefficients in f32 is within `gamma_{2(K-1)}` of
/// the exact value relative to `sum |c_k| |x|^k` (Higham, Accuracy and Stability of
/// Numerical Algorithms, eq. 5.3); `relu^2` rounds once; the sum rounds once (relative to
/// the sum of the terms' magnitudes); the store rounds to `T` (`store_u`; the outputs here
/// are far from bf16's subnormals).
fn check_poly<T: Float>(store_u: f64, s: u64) {
    let rt = Runtime::interpreter();
    let n = 3000;
    let limit = 2.5; // representable in every element type
    let x: Vec<T> = random_f32(n, s).into_iter().map(|v| T::from_f64(v as f64)).collect();
    let c = random_f32(4, s + 1);
    let mut out = vec![T::from_f64(f64::NAN); n];
    poly::<T, 256>::launch(&rt, kernels_lib::grid_for(n, 256), &x, &c, &mut out, limit as f32, n as i32).unwrap();
    let (mut reference, mut scale) = (vec![], vec![]);
    for v in x.iter().map(|v| v.to_f64()) {
        let t = v.clamp(-limit, limit);
        let terms: Vec<f64> = (0..4).map(|k| c[k] as f64 * t.powi(k as i32)).collect();
        let r = v.max(0.0).powi(2);
        reference.push(terms.iter().sum::<f64>() + r);
        scale.push(terms.iter().map(|t| t.abs()).sum::<f64>() + r);
    }
    let bound = chain(&[gamma(6.0, U_F32), U_F32, U_F32, store_u]) + REFERENCE;
    let got: Vec<f64> = out.iter().map(|v| v.to_f64()).collect();
    assert_close(&format!("poly<{}> seed {s}", T::DTYPE), &got, &reference, Some(&scale), bound);
}

#[test]
fn a_kernel_made_of_helpers_matches_the_cpu() {
    let s = seed();
    check_poly::<f32>(0.0, s);
    check_poly::<bf16>(U_BF16, s);
}

/// Reads the element after the one `p` points to: out of bounds for the last lane.
#[kernel_fn]
fn next_element(p: Ptr<f32>, m: bool) -> f32 {
    load(p + 1, m, 0.0) // the out-of-bounds load
}

#[kernel]
fn shift_left<const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32) {
    let offs = arange::<BLOCK>();
    let m = offs < n;
    store(out + offs, next_element(x + offs, m), m);
}

/// The 1-based line of this file that contains `needle` (the first one).
fn line_of(needle: &str) -> usize {
    include_str!("helpers.rs").lines().position(|l| l.contains(needle)).expect("the needle is in this file") + 1
}

#[test]
fn an_out_of_bounds_access_in_a_helper_names_the_helpers_line() {
    let rt = Runtime::interpreter();
    let n = 10;
    let x = random_f32(n, seed());
    let mut out = vec![0.0f32; n];
    // SAFETY: the interpreter checks every access and reports the bad one; nothing is
    // read or written out of bounds.
    let err = unsafe { shift_left::<16>::launch_unchecked(&rt, LaunchConfig::grid(1), &x, &mut out, n as i32) }.unwrap_err();
    let Error::Interpret { site, message } = &err else { panic!("{err}") };
    let line = line_of(concat!("// the out-of-bounds", " load"));
    let at = site.at.as_deref().unwrap_or_default();
    assert!(at.ends_with(&format!("helpers.rs:{line}:5")), "the error is at {at}, not at the helper's load on line {line}: {err}");
    assert!(message.contains("`x[10]`"), "{err}");
}

/// A kernel whose bad access happens inside a helper of another crate (kernels-lib's
/// `exp_minus`, which loads): reads one element past `x`.
#[kernel]
fn exp_past_the_end(x: Ptr<f32>, out: Ptr<f32>, n: i32) {
    let offs = arange::<16>();
    store(out + offs, kernels_lib::exp_minus(x + offs, offs < n + 1, 0.0), offs < n);
}

#[test]
fn an_error_inside_a_helper_of_another_file_names_that_file() {
    let rt = Runtime::interpreter();
    let n = 10;
    let x = random_f32(n, seed());
    let mut out = vec![0.0f32; n];
    let err = exp_past_the_end::launch(&rt, LaunchConfig::grid(1), &x, &mut out, n as i32).unwrap_err();
    let Error::Interpret { site, .. } = &err else { panic!("{err}") };
    let src = include_str!("../../kernels-lib/src/lib.rs");
    let line = src.lines().position(|l| l.contains("exp(load(p, mask, 0.0)")).expect("exp_minus's load") + 1;
    let at = site.at.as_deref().unwrap_or_default();
    assert!(at.starts_with(&format!("kernels-lib/src/lib.rs:{line}:")), "the error is at {at}, not at exp_minus's load (kernels-lib/src/lib.rs:{line}): {err}");
}

/// `a + b`: the shapes must broadcast.
#[kernel_fn]
fn add(a: f32, b: f32) -> f32 {
    a + b // shapes meet here
}

#[kernel]
fn adds_mismatched_blocks<const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>) {
    let a = load(x + arange::<BLOCK>());
    let b = load(x + arange::<3>());
    store(out + arange::<BLOCK>(), add(a, b)); // the call
}

#[kernel]
fn passes_a_bf16_block<const BLOCK: usize>(x: Ptr<bf16>, out: Ptr<f32>) {
    let offs = arange::<BLOCK>();
    let v = load(x + offs);
    store(out + offs, add(v, 1.0)); // the bf16 call
}

#[test]
fn build_errors_name_the_helpers_line_or_the_call() {
    let specs = [ParamSpec::default(); 2];
    // In the helper's body: its line, and which helper was inlined from where.
    let err = build_ir(&adds_mismatched_blocks::<8>, &specs).unwrap_err();
    let Error::Build { site, message } = &err else { panic!("{err}") };
    let (body, call) = (line_of(concat!("// shapes meet", " here")), line_of(concat!("// the", " call")));
    assert!(site.at.as_deref().unwrap_or_default().contains(&format!("helpers.rs:{body}:")), "{err}");
    assert!(message.contains("in `#[kernel_fn] add` at tests/all/helpers.rs:") && message.contains(&format!("inlined at line {call}:")), "{err}");
    // An argument of the wrong element type: at the call.
    let err = build_ir(&passes_a_bf16_block::<8>, &specs).unwrap_err();
    let Error::Build { site, message } = &err else { panic!("{err}") };
    let call = line_of(concat!("// the bf16", " call"));
    assert!(site.at.as_deref().unwrap_or_default().contains(&format!("helpers.rs:{call}:")), "{err}");
    assert!(message.contains("`add` takes an f32 as `a`, found a [8] block of bf16 (convert it with `as f32`)"), "{err}");
}
