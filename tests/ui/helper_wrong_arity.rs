use dsl_runtime::prelude::*;

#[kernel_fn]
fn gelu<T: Float>(x: T) -> T {
    0.5 * x * (1.0 + tanh(0.7978845608 * (x + 0.044715 * x * x * x)))
}

#[kernel]
fn k<const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32) {
    let offs = arange::<BLOCK>();
    let v = load(x + offs, offs < n);
    store(out + offs, gelu(v, 0.5), offs < n);
}

fn main() {}
