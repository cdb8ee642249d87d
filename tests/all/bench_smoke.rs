//! Smoke mode of the benchmark suite: every workload on the interpreter, checked against
//! its float64 reference (the GPU run times the same code), and a check that a corrupted
//! output fails.

use dsl_runtime::Runtime;
use examples::workloads::{check, rel_l2_scaled, suite, suite_bound};

#[test]
fn every_benchmark_workload_is_correct_on_the_interpreter() {
    let rt = Runtime::interpreter();
    let seed = crate::common::seed();
    for n in [1, 2049, 5000] {
        for mut w in suite(&rt, n, seed).unwrap() {
            let c = w.check(&rt).unwrap();
            // Every element within the bound of its arithmetic (and so the L2 measure too).
            assert!(c.passed(), "{} {} n={n} seed={seed}: {c}", w.name, w.dtype);
            assert_eq!(c.n, if w.name == "clamp_i32" { 2 * n } else { n }, "{} checks every element", w.name);
            assert_eq!(w.bound, suite_bound(w.name, w.dtype));
            assert!(w.bytes >= 4 * n && w.elements == n);
        }
    }
}

// The real bf16 relu-mul-add output of 2^20 elements from the interpreter passes; with a
// block of it corrupted, it fails. The corruptions are ones the old check (relative L2
// error below 1e-2, the bf16 rows' convenience value) let through, as the test asserts:
// 256 consecutive elements 8 bf16 ulps off (8-16 u each; the bound is about 2u) move the
// L2 measure by about 16 u sqrt(256 / 2^20) = 2^-10; 32 zeroed elements by about
// sqrt(32 / 2^20) = 2^-7.5 times the RMS ratio of |ref| to the scale (0.84 here).
#[test]
fn a_corrupted_block_of_a_real_output_is_caught() {
    let rt = Runtime::interpreter();
    let seed = crate::common::seed();
    let n = 1 << 20;
    let mut w = suite(&rt, n, seed).unwrap().into_iter().find(|w| w.name == "relu_mul_add" && w.dtype == "bf16").unwrap();
    let o = w.outputs(&rt).unwrap();
    let c = o.check(w.bound);
    assert!(c.passed(), "seed={seed}: {c}");
    let old = |out: &[f64]| rel_l2_scaled(out, &o.reference, &o.scale);
    let ulp = |x: f64| if x == 0.0 { 0.0 } else { (x.abs().log2().floor() - 7.0).exp2() };

    let block = 123_456..123_456 + 256;
    let mut off = o.out.clone();
    for i in block.clone() {
        off[i] += 8.0 * ulp(off[i]);
    }
    assert!(old(&off) <= 1e-2, "seed={seed}: relative L2 {:e}", old(&off));
    let c = check(&off, &o.reference, &o.scale, w.bound);
    assert!(!c.passed() && block.contains(&c.worst), "seed={seed}: not caught: {c}");

    // 32 zeros: the relative L2 stays under 1e-2 (64 of them exceeded it about one run in
    // 50000; 32 would need their squares at about 4.6 times their mean, far rarer).
    let block = 654_321..654_321 + 32;
    let mut zeroed = o.out.clone();
    zeroed[block.clone()].fill(0.0);
    assert!(old(&zeroed) <= 1e-2, "seed={seed}: relative L2 {:e}", old(&zeroed));
    let c = check(&zeroed, &o.reference, &o.scale, w.bound);
    assert!(!c.passed() && block.contains(&c.worst), "seed={seed}: not caught: {c}");
}
