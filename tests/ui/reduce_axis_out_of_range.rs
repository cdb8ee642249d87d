use dsl_runtime::prelude::*;

#[kernel]
fn row_sums<const M: usize, const N: usize>(x: Ptr<f32>, out: Ptr<f32>) {
    let rows = arange::<M>();
    let cols = arange::<N>();
    let tile = load(x + rows.col() * N + cols.row());
    store(out + rows, tile.sum(2));
}

fn main() {}
