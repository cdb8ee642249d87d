use dsl_runtime::prelude::*;

#[kernel]
fn sum_rows<const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32) {
    let offs = arange::<BLOCK>();
    for i in 0..4 {
        store(out + offs, load(x + offs), offs < n);
    }
}

fn main() {}
