use dsl_runtime::prelude::*;

#[kernel]
fn k<T: Copy, const BLOCK: usize>(x: Ptr<T>, out: Ptr<T>) {
    let offs = arange::<BLOCK>();
    store(out + offs, load(x + offs));
}

fn main() {}
