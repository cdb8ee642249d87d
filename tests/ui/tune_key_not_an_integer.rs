use dsl_runtime::prelude::*;

#[kernel(tune(BLOCK = [256, 1024], key = [x], grid = (n as usize).div_ceil(BLOCK)))]
fn scale<const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32) {
    let offs = program_id(0) * BLOCK + arange::<BLOCK>();
    store(out + offs, load(x + offs, offs < n) * 2.0, offs < n);
}

fn main() {}
