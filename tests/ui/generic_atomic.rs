use dsl_runtime::prelude::*;

#[kernel]
fn total<T: Float, const BLOCK: usize>(x: Ptr<T>, out: Ptr<T>, n: i32) {
    let offs = arange::<BLOCK>();
    atomic_add(out, load(x + offs, offs < n).sum() as T);
}

fn main() {}
