use dsl_runtime::prelude::*;

#[kernel]
fn k<const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32) {
    let offs = program_id(0) * BLOCK + arange::<BLOCK>();
    let i = offs as usize;
    store(out + i, load(x + i, offs < n, 0.0), offs < n);
}

fn main() {}
