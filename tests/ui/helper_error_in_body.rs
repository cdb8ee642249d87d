use dsl_runtime::prelude::*;

/// The mistake is in the helper: the error points here, not at the kernel that calls it.
#[kernel_fn]
fn clamp_low(x: f32, lo: f32) -> f32 {
    select(x, x, lo)
}

#[kernel]
fn k<const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32) {
    let offs = arange::<BLOCK>();
    store(out + offs, clamp_low(load(x + offs, offs < n), 0.0), offs < n);
}

fn main() {}
