//! The attention block of the mission's seed, forward and backward, in bf16 and in f32
//! (tf32 products): `x[B, T, d]` → `q = x Wq` (H heads), `k = x Wk`, `v = x Wv` (KV
//! heads), grouped-query flash attention, `y = o Wo`, then the gradients of `y.sum()`
//! for `x` and every weight, with the library's `matmul`, `attention_forward` and
//! `attention_backward`; the block is `examples::gqa`.
//!
//! Always checks a small shape (B=1, T=80, d=64, H=4, KV=2, head dim 16), every launch's
//! every element against an f64 reference from that launch's inputs, in both precisions:
//! on CUDA device 0 when there is one, else on the CPU interpreter (it says which). On the
//! GPU it then times the seed's shape (B=4, T=1024, d=512, H=8, KV=4, head dim 64) with the
//! seed's protocol: 10 warm-up steps, 100 timed with CUDA events, mean ± std and p99, and
//! the device memory the block holds.
//!
//! ```text
//! cargo run --release -p examples --example gqa_attention
//! ```

fn main() {
    let rt = examples::runtime();
    if let Err(e) = examples::gqa::run(&rt, examples::gqa::SEED) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
