use dsl_runtime::prelude::*;

#[kernel]
fn k<const BLOCK: usize>(x: Ptr<f32>, even: Ptr<f32>, odd: Ptr<f32>, n: i32) {
    let offs = arange::<BLOCK>();
    let dst = select(program_id(0) % 2 == 0, even, odd);
    store(dst + offs, load(x + offs, offs < n, 0.0), offs < n);
}

fn main() {
    // The launch passes `&mut` for the buffers the kernel was meant to write: the
    // mistake above is reported once, not again here.
    let rt = Runtime::interpreter();
    let x = vec![1.0f32; 64];
    let (mut even, mut odd) = (vec![0.0f32; 64], vec![0.0f32; 64]);
    k::<64>::launch(&rt, LaunchConfig::grid(2), &x, &mut even, &mut odd, 64).unwrap();
}
