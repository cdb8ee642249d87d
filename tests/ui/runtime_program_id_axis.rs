use dsl_runtime::prelude::*;

#[kernel]
fn k<const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>, axis: i32) {
    let offs = program_id(axis) * BLOCK + arange::<BLOCK>();
    store(out + offs, load(x + offs));
}

fn main() {}
