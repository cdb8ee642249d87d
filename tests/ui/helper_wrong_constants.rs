use dsl_runtime::prelude::*;

#[kernel_fn]
fn shifted<const S: i32>(x: i32) -> i32 {
    x + S
}

// A helper's constants are values each call passes: too many, or none, is an error at
// the call.
#[kernel]
fn k<const BLOCK: usize>(x: Ptr<i32>, out: Ptr<i32>, n: i32) {
    let offs = arange::<BLOCK>();
    let v = load(x + offs, offs < n);
    store(out + offs, shifted::<1, 2>(v), offs < n);
    store(out + offs, shifted(v), offs < n);
    store(out + offs, shifted::<3>(v), offs < n);
}

fn main() {}
