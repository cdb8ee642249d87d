use dsl_runtime::prelude::*;

#[kernel]
fn k(out: Ptr<i32>, n: i32) {
    if n > 4 {
        return n;
    }
    store(out, n);
}

fn main() {}
