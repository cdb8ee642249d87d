use dsl_runtime::prelude::*;

#[kernel]
fn k<const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32) {
    let offs = arange::<BLOCK>();
    let v = (x + offs).laod(offs < n);
    store(out + offs, v, 2.5);
    println!("{}", n);
}

fn main() {}
