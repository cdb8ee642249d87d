use dsl_runtime::prelude::*;

#[kernel]
fn scale<T: Float, const BLOCK: usize>(x: Ptr<T>, out: Ptr<T>, alpha: T, n: i32) {
    let offs = arange::<BLOCK>();
    store(out + offs, alpha * load(x + offs, offs < n), offs < n);
}

fn main() {}
