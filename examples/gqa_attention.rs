//! The attention block of the mission's seed, forward: `x[B, T, d]` → `q = x Wq` (H
//! heads), `k = x Wk`, `v = x Wv` (KV heads), grouped-query flash attention, `y = o Wo`,
//! with the library's `matmul` and `attention` in bf16 (f32 accumulation); the block is
//! `examples::gqa`.
//!
//! Runs on CUDA device 0 when there is one (the seed's shape: B=4, T=1024, d=512, H=8,
//! KV=4, head dim 64; checked on sampled rows, then timed), on the CPU interpreter
//! otherwise (a small shape, every row checked), and says which. The check: an f64
//! reference with the kernels' rounding points (q, k, v, the probabilities and o rounded
//! to bf16), every element within 4 * 2^-8 of the size of the terms it adds up.
//!
//! Not yet (issue 14): the backward pass, f32, tuned tiles.
//!
//! ```text
//! cargo run --release -p examples --example gqa_attention
//! ```

fn main() {
    let rt = examples::runtime();
    let shape = if rt.is_gpu() { examples::gqa::SEED } else { examples::gqa::SMALL };
    if let Err(e) = examples::gqa::run(&rt, shape) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
