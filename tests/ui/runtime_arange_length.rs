use dsl_runtime::prelude::*;

#[kernel]
fn k(x: Ptr<f32>, out: Ptr<f32>, n: i32) {
    let offs = arange::<n>();
    store(out + offs, load(x + offs), offs < n);
}

fn main() {}
