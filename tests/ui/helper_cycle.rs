use dsl_runtime::prelude::*;

// Recursion through another helper: each macro sees one function, so rustc finds the
// cycle (each helper's `DEPTH` would depend on itself).
#[kernel_fn]
fn ping(x: f32) -> f32 {
    pong(x) + 1.0
}

#[kernel_fn]
fn pong(x: f32) -> f32 {
    ping(x) * 2.0
}

fn main() {}
