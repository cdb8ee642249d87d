use dsl_runtime::prelude::*;

#[kernel]
fn total<const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32) {
    let offs = arange::<BLOCK>();
    let mut acc = 0.0;
    for start in (0..n).step_by(BLOCK as i32) {
        acc = acc + load(x + start + offs, start + offs < n);
    }
    store(out, acc);
}

fn main() {}
