use dsl_runtime::prelude::*;

#[kernel]
fn k<const BLOCK: usize>(x: Ptr<f32>, y: Ptr<f32>, out: Ptr<f32>, n: i32, c: i32) {
    let offs = arange::<BLOCK>();
    let mut p = x;
    if c > 0 {
        p = y;
    }
    store(out + offs, load(p + offs, offs < n, 0.0), offs < n);
}

fn main() {}
