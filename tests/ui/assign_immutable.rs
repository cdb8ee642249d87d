use dsl_runtime::prelude::*;

#[kernel]
fn k<const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32) {
    let offs = arange::<BLOCK>();
    let v = load(x + offs, offs < n, 0.0);
    v = v * 2.0;
    n = 3;
    store(out + offs, v, offs < n);
}

fn main() {}
