use dsl_runtime::prelude::*;

#[kernel_fn]
fn square(x: f32) -> f32 {
    x * x
}

// Calls inside a helper are checked by rustc as a kernel's are: each mistake once.
#[kernel_fn]
fn norm(x: f32, y: f32) -> f32 {
    sqrt(square(x, y) + softplus(y))
}

fn main() {}
