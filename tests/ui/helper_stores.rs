use dsl_runtime::prelude::*;

#[kernel_fn]
fn write_twice(p: Ptr<f32>, v: f32, m: bool) {
    store(p, v + v, m);
}

fn main() {}
