use dsl_runtime::prelude::*;

#[kernel]
fn copy<T: Float, const BLOCK: usize>(x: Ptr<T>, out: Ptr<T>, n: i32) {
    let offs = program_id(0) * BLOCK + arange::<BLOCK>();
    store(out + offs, load(x + offs, offs < n), offs < n);
}

fn main() {
    let rt = Runtime::interpreter();
    let (x, mut out) = (vec![1i32; 4], vec![0i32; 4]);
    copy::<i32, 64>::launch(&rt, LaunchConfig::grid(1), &x, &mut out, 4).unwrap();
}
