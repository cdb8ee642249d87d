use dsl_runtime::prelude::*;

#[kernel_fn]
fn positive<T: Float>(x: T) -> T {
    x > 0.0
}

#[kernel_fn]
fn unused_type<T: Float>(x: f32) -> f32 {
    x
}

fn main() {}
