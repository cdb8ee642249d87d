use dsl_runtime::prelude::*;

#[kernel]
fn k<const BLOCK: usize>(x: Ptr<bf16>, total: Ptr<bf16>) {
    let v = load(x + arange::<BLOCK>());
    atomic_add(total, v.sum() as bf16);
}

fn main() {}
