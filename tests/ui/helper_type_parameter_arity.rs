use dsl_runtime::prelude::*;

#[kernel_fn]
fn add(x: f32, y: f32) -> f32 {
    x + y
}

#[kernel]
fn map<F: KernelFn, const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32) {
    let offs = arange::<BLOCK>();
    store(out + offs, F(load(x + offs, offs < n)), offs < n);
}

fn main() {
    // `add` takes two arguments; `map` calls its `F` with one.
    let rt = Runtime::interpreter();
    let mut out = vec![0.0f32; 4];
    map::<add, 64>::launch(&rt, LaunchConfig::grid(1), &vec![1.0f32; 4], &mut out, 4).unwrap();
}
