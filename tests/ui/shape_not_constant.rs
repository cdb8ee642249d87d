use dsl_runtime::prelude::*;

#[kernel]
fn k(out: Ptr<f32>, n: i32) {
    let z = zeros::<f32>([n]);
    store(out + arange::<16>(), z);
}

fn main() {}
