//! Smoke mode of the benchmark suite: every workload on the interpreter, checked against
//! its float64 reference (the GPU run times the same code).

use dsl_runtime::Runtime;

#[test]
fn every_benchmark_workload_is_correct_on_the_interpreter() {
    let rt = Runtime::interpreter();
    for n in [1, 2049, 5000] {
        for mut w in examples::workloads::suite(&rt, n, crate::common::seed()).unwrap() {
            let err = w.check(&rt).unwrap();
            assert!(err <= w.tolerance, "{} {} n={n}: error {err:e}", w.name, w.dtype);
            assert!(w.bytes >= 4 * n && w.elements == n);
        }
    }
}
