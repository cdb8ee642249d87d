use dsl_runtime::prelude::*;

#[kernel]
fn k<const BLOCK: usize>(x: Ptr<f32>, n: i32) -> f32 {
    let offs = arange::<BLOCK>();
    load(x + offs, offs < n, 0.0)
}

fn main() {}
