use dsl_runtime::prelude::*;

#[kernel]
fn k<const BLOCK: usize>(x: Ptr<f64>, out: Ptr<f32>) {
    let offs = arange::<BLOCK>();
    store(out + offs, 1.0);
}

fn main() {}
