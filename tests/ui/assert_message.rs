use dsl_runtime::prelude::*;

#[kernel]
fn k<const BLOCK: usize>(x: Ptr<f32>) {
    let v = load(x + arange::<BLOCK>());
    device_assert(v > 0.0, 42);
}

fn main() {}
