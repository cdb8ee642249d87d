use dsl_runtime::prelude::*;

// Computed in f32, stored into a `T` buffer: for T = bf16 the value would need rounding,
// and stores never convert silently, whatever T is.
#[kernel]
fn k<T: Float, const BLOCK: usize>(x: Ptr<T>, out: Ptr<T>, n: i32) {
    let offs = arange::<BLOCK>();
    let v = load(x + offs, offs < n).to::<f32>();
    store(out + offs, v * 2.0, offs < n);
}

fn main() {}
