use dsl_runtime::prelude::*;

#[kernel]
fn k<const B: usize>(x: Ptr<f32>, y: Ptr<bf16>, out: Ptr<f32>) {
    let offs = arange::<B>();
    let row = load(x + offs);
    let tile = load(x + offs.col() * B + offs.row());
    let half = load(y + offs.col() * B + offs.row());
    // A 1-D block is not a matrix.
    let a = dot(row, tile);
    // Both inputs must have one type.
    let b = dot(tile, half);
    // The precision is one of three names.
    let c = dot(tile, tile, zeros::<f32>([B, B]), "fp64");
    store(out + offs.col() * B + offs.row(), a + b + c);
}

fn main() {}
