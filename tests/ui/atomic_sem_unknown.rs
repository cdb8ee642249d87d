use dsl_runtime::prelude::*;

#[kernel]
fn k<const BLOCK: usize>(x: Ptr<f32>, total: Ptr<f32>) {
    let r = arange::<BLOCK>();
    let v = load(x + r);
    atomic_add(total + r, v, r < 10, "release");
}

fn main() {}
