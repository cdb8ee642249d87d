//! Library kernels behind the autotuner: declared once here, launched like untuned
//! kernels. Each keeps one [`Autotuner`] for the process; results persist on disk (see
//! [`autotune::store`]).
//!
//! ```
//! use dsl_runtime::prelude::*;
//! let rt = Runtime::interpreter();
//! let n = 5000;
//! let x = rt.upload(&vec![0.5f32; n]).unwrap();
//! let mut total = rt.zeros::<f32>(1).unwrap();
//! let cfg = kernels_lib::tuned::sum_f32(&rt, &x, &mut total).unwrap();
//! assert_eq!(total.to_vec().unwrap(), vec![2500.0]);
//! assert!(cfg.get("BLOCK") >= 32 * cfg.num_warps as i64);
//! ```

use crate::{grid_for, relu_mul_add as rma_kernel, sum_f32 as sum_kernel};
use autotune::{dispatch, Autotuner, Bucket, Config, Key, Space, TuneError};
use dsl_runtime::{Buffer, Kernel, Runtime};
use std::sync::OnceLock;

/// Candidate blocks of the elementwise and reduction kernels.
pub const BLOCKS: [i64; 5] = [256, 512, 1024, 2048, 4096];

/// The default (untuned) configuration, for comparisons.
pub fn default_config() -> Config {
    Config::new(&[("BLOCK", 1024)], 4, 1)
}

fn space() -> Space {
    Space::product().values("BLOCK", &BLOCKS).warps(&[2, 4, 8])
}

/// Fewer elements than threads would only replicate work.
pub fn enough_work(c: &Config, _: &Key) -> bool {
    c.get("BLOCK") >= 32 * c.num_warps as i64
}

fn key(n: usize) -> Key {
    Key::new().with("n", n as i64, Bucket::NextPow2)
}

/// `out = max(a, 0) * b + c`, with the best block and warps for `n` (the next power of two).
pub fn relu_mul_add(rt: &Runtime, a: &Buffer<f32>, b: &Buffer<f32>, c: &Buffer<f32>, out: &mut Buffer<f32>) -> Result<Config, TuneError> {
    static T: OnceLock<Autotuner> = OnceLock::new();
    let t = T.get_or_init(|| Autotuner::new("relu_mul_add", space()).prune(enough_work));
    let n = out.len();
    t.launch(
        rt,
        &key(n),
        &mut (out,),
        &|cfg| dispatch!(cfg.get("BLOCK"), [256, 512, 1024, 2048, 4096], |B| Box::new(rma_kernel::<B>) as Box<dyn Kernel>),
        &mut |cfg, (out,)| {
            dispatch!(cfg.get("BLOCK"), [256, 512, 1024, 2048, 4096], |B| {
                rma_kernel::<B>::launch(rt, grid_for(n, B).warps(cfg.num_warps), a, b, c, &mut **out, n as i32)
            })
        },
    )
}

/// `total[0] += sum(x)` (zero `total` first), with the best block and warps for the length.
/// `total` accumulates, so the tuner restores it before every timed run.
pub fn sum_f32(rt: &Runtime, x: &Buffer<f32>, total: &mut Buffer<f32>) -> Result<Config, TuneError> {
    static T: OnceLock<Autotuner> = OnceLock::new();
    // Partial sums land in a different order per candidate: compare at 1e-4.
    let t = T.get_or_init(|| Autotuner::new("sum_f32", space()).prune(enough_work).reset_outputs().tolerance(1e-4));
    let n = x.len();
    t.launch(
        rt,
        &key(n),
        &mut (total,),
        &|cfg| dispatch!(cfg.get("BLOCK"), [256, 512, 1024, 2048, 4096], |B| Box::new(sum_kernel::<B>) as Box<dyn Kernel>),
        &mut |cfg, (total,)| {
            dispatch!(cfg.get("BLOCK"), [256, 512, 1024, 2048, 4096], |B| sum_kernel::<B>::launch(rt, grid_for(n, B).warps(cfg.num_warps), x, &mut **total, n as i32))
        },
    )
}

/// Launch `relu_mul_add` or `sum_f32` with one given configuration (for comparisons
/// against the tuned launch).
pub fn with_config(rt: &Runtime, cfg: &Config, kernel: &str, x: &Buffer<f32>, b: &Buffer<f32>, c: &Buffer<f32>, out: &mut Buffer<f32>) -> Option<dsl_runtime::Result<()>> {
    let n = x.len();
    dispatch!(cfg.get("BLOCK"), [256, 512, 1024, 2048, 4096], |B| {
        let g = grid_for(n, B).warps(cfg.num_warps);
        if kernel == "sum_f32" {
            sum_kernel::<B>::launch(rt, g, x, out, n as i32)
        } else {
            rma_kernel::<B>::launch(rt, g, x, b, c, out, n as i32)
        }
    })
}
