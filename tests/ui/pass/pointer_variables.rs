//! Compiles and runs on the interpreter: pointer variables that are rebound, chosen at
//! compile time, or carried around a loop stepped by a `usize` constant.
use dsl_runtime::prelude::*;

/// Straight-line code may point a variable into another parameter: the store below
/// writes `out` (launched as `&mut`), not `x`.
#[kernel]
fn rebind<const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32) {
    let offs = arange::<BLOCK>();
    let mut p = x + offs;
    let v = load(p, offs < n, 0.0);
    p = out + offs;
    store(p, v * 2.0, offs < n);
}

/// A compile-time `if` may choose the parameter.
#[kernel]
fn pick<const FROM_Y: bool, const BLOCK: usize>(x: Ptr<f32>, y: Ptr<f32>, out: Ptr<f32>, n: i32) {
    let offs = arange::<BLOCK>();
    let mut p = x;
    if FROM_Y {
        p = y;
    }
    store(out + offs, load(p + offs, offs < n, 0.0), offs < n);
}

/// `step_by` takes the `usize` constant on an `i32` range; the carried pointer keeps its
/// parameter.
#[kernel]
fn strided_sum<const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32) {
    let offs = arange::<BLOCK>();
    let mut p = x + offs;
    let mut acc = zeros::<f32>([BLOCK]);
    for i in (0..n).step_by(BLOCK) {
        acc = acc + load(p, i + offs < n, 0.0);
        p = p + BLOCK;
    }
    store(out, acc.sum());
}

fn main() {
    let rt = Runtime::interpreter();
    let n = 100usize;
    let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let y: Vec<f32> = (0..n).map(|i| -(i as f32)).collect();

    let mut out = vec![f32::NAN; n];
    rebind::<128>::launch(&rt, LaunchConfig::grid(1), &x, &mut out, n as i32).unwrap();
    assert_eq!(out[7], 14.0);

    pick::<true, 128>::launch(&rt, LaunchConfig::grid(1), &x, &y, &mut out, n as i32).unwrap();
    assert_eq!(out[7], -7.0);
    pick::<false, 128>::launch(&rt, LaunchConfig::grid(1), &x, &y, &mut out, n as i32).unwrap();
    assert_eq!(out[7], 7.0);

    let mut sum = vec![f32::NAN];
    strided_sum::<32>::launch(&rt, LaunchConfig::grid(1), &x, &mut sum, n as i32).unwrap();
    assert_eq!(sum[0], (0..n).sum::<usize>() as f32);
}
