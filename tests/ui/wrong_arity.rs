use dsl_runtime::prelude::*;

#[kernel]
fn k<const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32) {
    let offs = arange::<BLOCK>();
    let v = load(x + offs, offs < n, 0.0, 1.0);
    store(out + offs, v, offs < n);
}

fn main() {}
