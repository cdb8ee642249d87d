use dsl_runtime::prelude::*;

#[allow(dead_code)]
fn my_helper(x: f32) -> f32 {
    x * 2.0
}

#[kernel]
fn k<const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32) {
    let offs = arange::<BLOCK>();
    let v = load(x + offs, offs < n, 0.0);
    store(out + offs, my_helper(v), offs < n);
}

fn main() {}
