//! Kernels written once for several element types (`T: Float`): the library's `softmax`
//! and `relu_mul_add`, each run for f32, f16 and bf16 on the interpreter on fresh random
//! inputs against float64 references, every element within a bound derived from the
//! element type's rounding; and each instantiation a kernel of its own (identity, IR,
//! compile-cache key, tuning results).
//!
//! # The bounds
//!
//! Rounding to nearest in a format with `p` significand bits has unit roundoff `u = 2^-p`
//! (`examples::workloads`, which derives the f32 parts used here). For a value `v` of
//! magnitude at least the format's smallest normal `N`, `|fl(v) - v| <= u |v|`; below it
//! the spacing of the subnormals is `2 u N`, so `|fl(v) - v| <= u N`. Both together:
//!
//! ```text
//! |fl(v) - v| <= u max(|v|, N)
//! ```
//!
//! so every check below is relative to `scale = max(terms, N)`, where `terms` is the size
//! of the terms the element adds up. `N` matters for f16 (`2^-14`): a softmax of 1000
//! columns has outputs near `1e-6`, which f16 stores as subnormals with an absolute error
//! up to `2^-25` (a relative error of several percent); bf16 and f32 have `N = 2^-126`.
//! An error `e_1` relative to `scale` followed by a rounding `u` of a value no larger than
//! `(1 + e_1) scale` is within `(1 + e_1)(1 + u) - 1` (`chain`) of it.

use crate::common::*;
use dsl_runtime::compile::{build_ir, cache_key, ir_identity, kernel_fingerprint, CodegenOptions};
use dsl_runtime::emit::Target;
use dsl_runtime::ir::{printer::print, ParamSpec};
use dsl_runtime::launch::{describe_spec, Safety};
use dsl_runtime::prelude::*;
use dsl_runtime::KernelId;
use examples::workloads::{chain, softmax_bound, softmax_rows, REFERENCE, U_BF16, U_F16, U_F32};
use kernels_lib::{relu_mul_add, rows_grid, softmax, softmax_tuned};
use std::collections::HashSet;

/// A storage type of the tests: how storing a value computed in f32 rounds it.
trait Storage: Float + std::fmt::Debug {
    /// The unit roundoff of a store of an f32 value (0 for f32: nothing rounds).
    const STORE_U: f64;
    /// The unit roundoff of arithmetic in this type (f16 and bf16 round every operation
    /// to themselves; f32 to f32).
    const U: f64;
    /// The smallest normal magnitude.
    const MIN_NORMAL: f64;
}
impl Storage for f32 {
    const STORE_U: f64 = 0.0;
    const U: f64 = U_F32;
    const MIN_NORMAL: f64 = 1.1754943508222875e-38; // 2^-126
}
impl Storage for f16 {
    const STORE_U: f64 = U_F16;
    const U: f64 = U_F16;
    const MIN_NORMAL: f64 = 6.103515625e-5; // 2^-14
}
impl Storage for bf16 {
    const STORE_U: f64 = U_BF16;
    const U: f64 = U_BF16;
    const MIN_NORMAL: f64 = 1.1754943508222875e-38; // 2^-126
}

fn rounded<T: Storage>(x: &[f32]) -> Vec<T> {
    x.iter().map(|&v| T::from_f64(v as f64)).collect()
}

fn f64s<T: Storage>(x: &[T]) -> Vec<f64> {
    x.iter().map(|v| v.to_f64()).collect()
}

/// Softmax in `T` (f32 math, stored in `T`): one block per row, two rows per program
/// looping over the row in chunks of 64, and the tuned launch.
///
/// Bound: the f32 math is within `m = softmax_bound(cols, false)` of the reference,
/// relative to the output (its derivation is in `examples::workloads`; it reads the same
/// inputs, already rounded to `T`, and includes the reference's own error); the store
/// rounds once to `T`: `chain([m, STORE_U])` relative to `max(|ref|, N)`.
fn softmax_in<T: Storage>(s: u64) {
    let rt = Runtime::interpreter();
    for (rows, cols) in [(3, 1000), (5, 48), (4, 300)] {
        let x: Vec<T> = rounded(&random_f32(rows * cols, s));
        let reference = softmax_rows(&f64s(&x), cols);
        let scale: Vec<f64> = reference.iter().map(|r| r.abs().max(T::MIN_NORMAL)).collect();
        let bound = chain(&[softmax_bound(cols, false), T::STORE_U]);
        let (nr, nc) = (rows as i32, cols as i32);
        let what = |how: &str| format!("softmax<{}> {how} {rows}x{cols} seed {s}", T::DTYPE);
        let nan = T::from_f64(f64::NAN);

        let mut out = vec![nan; rows * cols];
        softmax::<T, 1, 1000>::launch(&rt, rows_grid(rows, 4), &x, &mut out, nr, nc, nc).unwrap();
        assert_close(&what("one block"), &f64s(&out), &reference, Some(&scale), bound);

        let mut out = vec![nan; rows * cols];
        softmax::<T, 2, 64>::launch(&rt, rows_grid(rows.div_ceil(2), 4), &x, &mut out, nr, nc, nc).unwrap();
        assert_close(&what("looping"), &f64s(&out), &reference, Some(&scale), bound);

        let dx = rt.upload(&x).unwrap();
        let mut dout = rt.upload(&vec![nan; rows * cols]).unwrap();
        softmax_tuned(&rt, &dx, &mut dout, nr, nc, nc).unwrap();
        assert_close(&what("tuned"), &f64s(&dout.to_vec().unwrap()), &reference, Some(&scale), bound);
    }
}

/// `max(a, 0) b + c` computed in `T`, rounded to `T` after every operation.
///
/// Bound: `max` is exact; the product of two values of `T` is exact in f64 and rounds to
/// `T` (`U`); the sum of two values of `T` rounds in f32 (`U_F32`; exact for f32, where
/// the sum rounds to f32 only) and then to `T` (`U`): `chain([U, U_F32, U])`, relative to
/// `max(|max(a, 0) b| + |c|, N)`, plus the reference's own error.
fn relu_mul_add_in<T: Storage>(s: u64) {
    let rt = Runtime::interpreter();
    for n in [1, 1025, 5000] {
        let (a, b, c): (Vec<T>, Vec<T>, Vec<T>) = (rounded(&random_f32(n, s)), rounded(&random_f32(n, s + 1)), rounded(&random_f32(n, s + 2)));
        let (af, bf, cf) = (f64s(&a), f64s(&b), f64s(&c));
        let reference: Vec<f64> = (0..n).map(|i| af[i].max(0.0) * bf[i] + cf[i]).collect();
        let scale: Vec<f64> = (0..n).map(|i| ((af[i].max(0.0) * bf[i]).abs() + cf[i].abs()).max(T::MIN_NORMAL)).collect();
        let mut out = vec![T::from_f64(f64::NAN); n];
        relu_mul_add::<T, 1024>::launch(&rt, kernels_lib::grid_for(n, 1024), &a, &b, &c, &mut out, n as i32).unwrap();
        let what = format!("relu_mul_add<{}> n={n} seed {s}", T::DTYPE);
        assert_close(&what, &f64s(&out), &reference, Some(&scale), chain(&[T::U, U_F32, T::U]) + REFERENCE);
    }
}

#[test]
fn softmax_written_once_runs_for_f32_f16_and_bf16() {
    let s = seed();
    softmax_in::<f32>(s);
    softmax_in::<f16>(s);
    softmax_in::<bf16>(s);
}

#[test]
fn relu_mul_add_written_once_runs_for_f32_f16_and_bf16() {
    let s = seed();
    relu_mul_add_in::<f32>(s);
    relu_mul_add_in::<f16>(s);
    relu_mul_add_in::<bf16>(s);
}

#[test]
fn each_element_type_is_a_kernel_of_its_own() {
    let kernels: [(&str, Box<dyn Kernel>); 3] =
        [("f32", Box::new(softmax::<f32, 2, 256>::new())), ("f16", Box::new(softmax::<f16, 2, 256>::new())), ("bf16", Box::new(softmax::<bf16, 2, 256>::new()))];
    let unspec = [ParamSpec::default(); 5];
    let nice = [ParamSpec { eq_one: false, div16: true }; 5];
    let opts = CodegenOptions { num_warps: 4, num_stages: 1, safety: Safety::Guarded, len_specs: vec![nice[0]; 2], target: Target::SM90, debug: false, wgmma: true, tma: true, tma_store: false, warp_specialize: false, min_programs_per_sm: 1, prefetch: true };
    let mut ids = HashSet::new();
    let (mut identities, mut fingerprints, mut keys) = (HashSet::new(), HashSet::new(), HashSet::new());
    for (t, k) in &kernels {
        // One kernel per element type, the same one every time it is named.
        assert!(ids.insert(k.id()), "softmax<{t}> shares its KernelId");
        assert!(matches!(k.id(), KernelId::Kernel { .. }));
        let f = build_ir(k.as_ref(), &unspec).unwrap();
        // The IR is the element type's: its pointers, and its constants.
        let text = print(&f, false);
        assert!(text.contains(&format!("%x: ptr<{t}>")) && text.contains(&format!("[T = {t}, ROWS = 2, BLOCK = 256]")), "{text}");
        assert!(identities.insert(ir_identity(&f)), "softmax<{t}> has another's IR identity");
        assert!(fingerprints.insert(kernel_fingerprint(k.as_ref(), &unspec).unwrap()), "softmax<{t}> has another's fingerprint");
        let key = cache_key(&build_ir(k.as_ref(), &nice).unwrap(), &opts);
        assert_eq!(key, cache_key(&build_ir(k.as_ref(), &nice).unwrap(), &opts), "softmax<{t}>: one key per compile");
        assert!(keys.insert(key), "softmax<{t}> shares a compile-cache key");
        // Errors name the instantiation.
        assert!(describe_spec(k.as_ref(), &unspec).starts_with(&format!("T={t}, ROWS=2, BLOCK=256")), "{}", describe_spec(k.as_ref(), &unspec));
    }
    assert_eq!(softmax::<bf16, 2, 256>::new().id(), kernels[2].1.id());
    assert_ne!(softmax::<bf16, 2, 256>::new().id(), softmax::<bf16, 1, 256>::new().id());
}

#[test]
fn each_element_type_tunes_apart() {
    let dir = std::env::temp_dir().join(format!("rutile-generic-tune-{}", crate::common::unique()));
    let _ = std::fs::remove_dir_all(&dir);
    run_in_processes("generic::child_tunes_softmax_for_three_types", 1, &[("RUTILE_TUNE_DIR", dir.as_os_str())]);
    let store = autotune::Store::new(Some(dir.clone()));
    let mut seen = HashSet::new();
    for t in ["f32", "f16", "bf16"] {
        // A tuner, and a results file, per element type; entries keyed by each one's IR.
        let entries = store.load(&format!("softmax[T={t}]"));
        assert!(!entries.is_empty(), "no tuning results for softmax<{t}> in {}", dir.display());
        let hashes: HashSet<String> = entries.iter().map(|e| e.ir_hash.clone()).collect();
        assert!(hashes.is_disjoint(&seen), "softmax<{t}> has results of another element type's kernels");
        seen.extend(hashes);
    }
    assert!(store.load("softmax").is_empty(), "results under the kernel's bare name");
    let _ = std::fs::remove_dir_all(dir);
}

/// Child half of `each_element_type_tunes_apart`: one shape, three element types.
#[test]
#[ignore = "run by each_element_type_tunes_apart"]
fn child_tunes_softmax_for_three_types() {
    if std::env::var_os("RUTILE_TUNE_DIR").is_none() {
        return;
    }
    fn tune<T: Storage>(rt: &Runtime) {
        let (rows, cols) = (4, 100);
        let x = rt.upload(&rounded::<T>(&random_f32(rows * cols, 1))).unwrap();
        let mut out = rt.zeros::<T>(rows * cols).unwrap();
        softmax_tuned(rt, &x, &mut out, rows as i32, cols as i32, cols as i32).unwrap();
    }
    let rt = Runtime::interpreter();
    tune::<f32>(&rt);
    tune::<f16>(&rt);
    tune::<bf16>(&rt);
}

/// Compile-time constants are values of one IR builder (the hidden `__softmax_consts`, what
/// `softmax_tuned` makes from a configuration): `softmax::<f32, 2, 256>` is it with `[2,
/// 256]`, the same kernel (identity, constants, IR), and other values are other kernels.
#[test]
fn constants_are_values_of_one_builder() {
    use kernels_lib::__softmax_consts;
    let unspec = [ParamSpec::default(); 5];
    let fixed = softmax::<f32, 2, 256>::new();
    let valued = __softmax_consts::<f32>::new([2, 256]);
    assert_eq!(fixed.id(), valued.id());
    assert_eq!(fixed.constants(), valued.constants());
    assert_eq!(valued.constants(), [("T", "f32".to_string()), ("ROWS", "2".to_string()), ("BLOCK", "256".to_string())]);
    let ir = |k: &dyn Kernel| print(&build_ir(k, &unspec).unwrap(), false);
    assert_eq!(ir(&fixed), ir(&valued));
    let other = __softmax_consts::<f32>::new([4, 256]);
    assert_ne!(other.id(), valued.id());
    assert_ne!(__softmax_consts::<f16>::new([2, 256]).id(), valued.id(), "element types are part of the identity");
    assert_eq!(ir(&softmax::<f32, 4, 256>::new()), ir(&other));
    assert!(ir(&other).contains("ROWS = 4"), "{}", ir(&other));
}
