use dsl_runtime::prelude::*;

#[kernel]
fn k<const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32) {
    let offs = arange::<BLOCK>();
    loop {
        store(out + offs, load(x + offs), offs < n);
        return;
    }
}

fn main() {}
