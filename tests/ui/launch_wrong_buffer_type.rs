use dsl_runtime::prelude::*;

#[kernel]
fn scale<const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32) {
    let offs = program_id(0) * BLOCK + arange::<BLOCK>();
    store(out + offs, load(x + offs, offs < n, 0.0) * 2.0, offs < n);
}

fn main() {
    let rt = Runtime::interpreter();
    let x = vec![bf16::ZERO; 16];
    let mut out = vec![0.0f32; 16];
    scale::<16>::launch(&rt, LaunchConfig::grid(1), &x, &mut out, 16).unwrap();
}
