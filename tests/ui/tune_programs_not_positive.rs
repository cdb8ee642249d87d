use dsl_runtime::prelude::*;

#[kernel(tune(BLOCK = [256, 1024], programs = [1, 0], key = [n], grid = (n as usize).div_ceil(BLOCK)))]
fn copy<const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32) {
    let offs = program_id(0) * BLOCK + arange::<BLOCK>();
    store(out + offs, load(x + offs, offs < n), offs < n);
}

fn main() {}
