use dsl_runtime::prelude::*;

#[kernel]
fn k<const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32) {
    let offs = arange::<BLOCK>();
    let v = load(x * 2 + offs, offs < n, 0.0);
    store(out + offs * 0.5, v, offs < n);
}

fn main() {}
