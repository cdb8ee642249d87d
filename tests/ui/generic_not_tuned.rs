use dsl_runtime::prelude::*;

#[kernel(tune(T = [f32, bf16], BLOCK = [256, 512], key = [n], grid = (n as usize).div_ceil(BLOCK)))]
fn copy<T: Float, const BLOCK: usize>(x: Ptr<T>, out: Ptr<T>, n: i32) {
    let offs = program_id(0) * BLOCK + arange::<BLOCK>();
    store(out + offs, load(x + offs, offs < n), offs < n);
}

fn main() {}
