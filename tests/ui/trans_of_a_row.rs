use dsl_runtime::prelude::*;

#[kernel]
fn k<const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>) {
    let offs = arange::<BLOCK>();
    store(out + offs, trans(load(x + offs)));
}

fn main() {}
