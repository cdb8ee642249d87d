use dsl_runtime::prelude::*;

#[kernel_fn]
fn power(x: f32, n: i32) -> f32 {
    x * power(x, n - 1)
}

fn main() {}
