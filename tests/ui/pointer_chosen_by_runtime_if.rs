use dsl_runtime::prelude::*;

#[kernel]
fn k<const BLOCK: usize>(x: Ptr<f32>, y: Ptr<f32>, out: Ptr<f32>, n: i32, c: i32) {
    let offs = arange::<BLOCK>();
    let p = if c > 0 { x + offs } else { y + offs };
    store(out + offs, load(p, offs < n, 0.0), offs < n);
}

fn main() {}
