use dsl_runtime::prelude::*;

#[kernel_fn]
fn lanes<const N: usize>(x: f32) -> f32 {
    x
}

#[kernel_fn]
fn twice(x: f32) -> f32 {
    x + x
}

// A helper type parameter is not an element type.
#[kernel]
fn as_elem<F: KernelFn, const BLOCK: usize>(x: Ptr<F>, n: i32) {}

// It is called without constants.
#[kernel]
fn with_consts<F: KernelFn, const BLOCK: usize>(out: Ptr<f32>, n: i32) {
    let offs = arange::<BLOCK>();
    store(out + offs, F::<BLOCK>(load(out + offs)), offs < n);
}

// Only kernels take helpers as types.
#[kernel_fn]
fn apply<F: KernelFn>(x: f32) -> f32 {
    F(x)
}

#[kernel]
fn ok<F: KernelFn, const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32) {
    let offs = arange::<BLOCK>();
    store(out + offs, F(load(x + offs, offs < n)), offs < n);
}

fn main() {
    // A helper with constants cannot be a type parameter.
    let _ = ok::<lanes, 64>::new();
    let _ = ok::<twice, 64>::new();
}
