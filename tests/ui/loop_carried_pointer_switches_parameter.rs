use dsl_runtime::prelude::*;

#[kernel]
fn k<const BLOCK: usize>(x: Ptr<f32>, y: Ptr<f32>, out: Ptr<f32>, n: i32) {
    let offs = arange::<BLOCK>();
    let mut p = x + offs;
    let mut acc = zeros::<f32>([BLOCK]);
    for i in (0..n).step_by(BLOCK) {
        acc = acc + load(p, i + offs < n, 0.0);
        p = y + offs + i + BLOCK;
    }
    store(out + offs, acc);
}

fn main() {}
