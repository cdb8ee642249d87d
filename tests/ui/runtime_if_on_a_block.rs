use dsl_runtime::prelude::*;

#[kernel]
fn k<const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32) {
    let offs = arange::<BLOCK>();
    if offs < n {
        store(out + offs, load(x + offs));
    }
}

fn main() {}
