//! Runnable examples live beside this crate: see `relu_mul_add.rs`.
