//! Autotuning of the library kernels declared with `#[kernel(tune(..))]`
//! (`relu_mul_add_tuned`, `sum_f32_tuned`, `axpy_tuned`, `gelu_tanh_tuned`,
//! `softmax_tuned`, `rmsnorm_bf16_tuned`, `matmul_tuned`): the pruning
//! they share, and what the benchmarks compare them with.
//!
//! ```
//! use dsl_runtime::prelude::*;
//! let rt = Runtime::interpreter();
//! let n = 5000;
//! let x = rt.upload(&vec![0.5f32; n]).unwrap();
//! let mut total = rt.zeros::<f32>(1).unwrap();
//! let cfg = kernels_lib::sum_f32_tuned(&rt, &x, &mut total, n as i32).unwrap();
//! assert_eq!(total.to_vec().unwrap(), vec![2500.0]);
//! assert!(cfg.get("BLOCK") >= 32 * cfg.num_warps as i64);
//! ```

use crate::{grid_for, relu_mul_add, sum_f32};
use autotune::{dispatch, Config, Key};
use dsl_runtime::{Buffer, Runtime};

/// The default (untuned) configuration, for comparisons.
pub fn default_config() -> Config {
    Config::new(&[("BLOCK", 1024)], 4, 1)
}

/// Fewer elements than threads would only replicate work.
pub fn enough_work(c: &Config, _: &Key) -> bool {
    c.get("BLOCK") >= 32 * c.num_warps as i64
}

/// Row kernels (`softmax`, `rmsnorm_bf16`): `BLOCK` is the row length's next power of
/// two, clamped to the candidate range (a longer row loops over `BLOCK`-wide chunks), and
/// each thread holds between 1 and 32 elements of the `ROWS x BLOCK` tile (fewer would
/// replicate work, more would spill registers).
pub fn row_block(c: &Config, k: &Key) -> bool {
    let cols = k.value("n_cols").unwrap_or(1).clamp(64, 8192);
    let per_thread = c.get("ROWS") * c.get("BLOCK") / (32 * c.num_warps as i64);
    c.get("BLOCK") == cols && (1..=32).contains(&per_thread)
}

/// The relative L2 difference allowed between the outputs of two matmul candidates (the
/// tuner's check that a configuration computes what the first did), by output type: f32
/// sums in another order (tf32 products included) differ by 1e-6 and less, hence 1e-4; a
/// 16-bit output rounds each of them, and a sum within that of a rounding boundary lands
/// on either side (an ulp, 2^-8 of a bf16): at K = 4096 an estimated one element in a
/// thousand, a relative L2 near 1.5e-4 (5e-5 for f16), so 16-bit outputs allow 1e-3 (with
/// 1e-4 a correct candidate could fail the check and drop out of the sweep; the
/// interpreter, whose sums do not depend on the tile, cannot show it). A wrong tile of a
/// 4096² output is 4e-2.
pub fn matmul_tolerance(out: dsl_runtime::DType) -> f64 {
    if out.size() == 2 {
        1e-3
    } else {
        1e-4
    }
}

/// `matmul`: tiles no larger than the problem needs (one tile edge past each dimension
/// at most, so small problems do not pay for 128-wide tiles), and at most 128 f32
/// accumulators per thread, with K rows of at most 128 bytes for f32 (tf32) operands
/// (more spill registers: `tests/all/dot.rs` assembles every kept configuration for
/// sm_90a). On sm_90a a tf32 product takes `wgmma` with `bᵀ` in registers (one K row of
/// 32 of its fragments a thread); on `mma.sync` (sm_80) f32 tiles past 64 accumulators a
/// thread spill and measure slower, and the tuner drops them there. The 16-bit operands'
/// `mma.sync` fragments are read (`ldmatrix`) one K step at a time next to the `mma`s
/// that use them, so only one step's fragments are live.
/// The ring of `stages` operand tiles (of `elem`-byte elements, the key's entry; 2 where
/// absent) must fit the 160 KiB of shared memory a program gets on sm_80 (227 KiB on
/// sm_90).
pub fn matmul_tile(c: &Config, k: &Key) -> bool {
    let dim = |name: &str| k.value(name).unwrap_or(1).max(1);
    let fits = |tile: i64, d: i64| tile as u64 <= (d.max(64) as u64).next_power_of_two();
    let threads = 32 * c.num_warps as i64;
    let (bm, bn, bk) = (c.get("BM"), c.get("BN"), c.get("BK"));
    let elem = k.value("elem").unwrap_or(2);
    let ring = c.num_stages.max(1) as i64 * (bm + bn) * bk * elem;
    let acc = bm * bn / threads;
    // Warp specialization (a producer warpgroup issuing the TMA copies, sm_90a) on the
    // widest tile of 16-bit operands only, pipelined: 2-3% faster than unspecialized at
    // 4096³ bf16 with 4 stages (BENCHMARKS.md, "Layout conversions without bank conflicts").
    let specialized_ok = !c.warp_specialize || (bm == 128 && bn == 256 && c.num_warps == 8 && c.num_stages >= 3 && elem == 2);
    fits(bm, dim("m")) && fits(bn, dim("n")) && fits(bk, dim("k")) && acc <= 128 && bk * elem <= 128 && ring <= 160 * 1024 && specialized_ok
}

/// What the flash-attention kernels' `prune`s share: the tile (`BM` x `BN`) no wider than
/// the sequence needs (`t`, at least 64), `warps_ok(bm, bn, warps)` (the warps the kernel
/// is written for), and `tiles(bm, bn, stages)` rows of the head dimension (`d`, of 2-byte
/// elements: f32 candidates that do not fit fail at launch and are skipped by the tuner)
/// within 200 KiB of shared memory (sm_90 gives a program 227 KiB).
fn attention_candidate(c: &Config, k: &Key, warps_ok: impl Fn(i64, i64, i64) -> bool, tiles: impl Fn(i64, i64, i64) -> i64) -> bool {
    let (bm, bn, d) = (c.get("BM"), c.get("BN"), k.value("d").unwrap_or(64));
    let t = k.value("t").unwrap_or(1).max(64);
    let (warps, stages) = (c.num_warps as i64, c.num_stages.max(1) as i64);
    warps_ok(bm, bn, warps) && bm <= t && bn <= t && tiles(bm, bn, stages) * d * 2 <= 200 * 1024
}

/// `prune` for the flash-attention forward's `tune(..)`: a warp per 16 query rows, or 4
/// warps for 128 rows; the query tile and `stages` key and value tiles
/// (shared with the other attention `prune`s). Warp-specialized with two consumer
/// warpgroups (8 warps), which take turns at their products, or with one on 64-row tiles:
/// since the consumers stopped spilling (build 6ff9831, BENCHMARKS.md, "The JIT linker
/// ignores setmaxnreg") 64 x 64 on 4 warps is level with or faster than unspecialized
/// (0.591 against 0.626 ms on the long causal layer); and 128 rows on one warpgroup where
/// its scores and accumulator fit the consumers' registers (64 keys at head dim 64: ptxas
/// spills 128 keys there, and 64 at head dim 128; not measured yet). Three programs an SM
/// only for the one consumer warpgroup of a 64 x 64 tile at head dim 64, warp-specialized
/// (its consumers keep 136 registers without spilling; 7% faster than two programs an SM
/// causal at the seed shape: BENCHMARKS.md, "Three programs an SM for the causal forward").
pub fn attention_tile(c: &Config, k: &Key) -> bool {
    let d = k.value("d").unwrap_or(64);
    let ws_ok = c.num_warps == 8 || c.get("BM") == 64 || c.get("BN") + d <= 128;
    let programs_ok = c.programs_per_sm == 1 || (c.programs_per_sm == 3 && c.warp_specialize && (c.get("BM"), c.get("BN"), c.num_warps, d) == (64, 64, 4, 64));
    attention_candidate(c, k, |bm, _, w| w == bm / 16 || (w, bm) == (4, 128), |bm, bn, st| bm + 2 * st * bn) && (!c.warp_specialize || ws_ok) && programs_ok
}

/// `prune` for the flash-attention backward's `dK`/`dV` kernel: a warp per 16 keys of
/// the tile; the query and output-gradient rings (2 tiles a stage) and the key and value
/// tiles (shared with the other attention `prune`s).
pub fn attention_dkdv_tile(c: &Config, k: &Key) -> bool {
    attention_candidate(c, k, |_, bn, w| w == bn / 16, |bm, bn, st| 2 * st * bm + 2 * bn)
}

/// `prune` for the flash-attention backward's `dQ` kernel: a warp per 16 queries of the
/// tile; the key and value rings and the query and output-gradient tiles
/// (shared with the other attention `prune`s). Warp specialization is offered on every
/// kept tile (one consumer warpgroup at 64 queries, two at 128).
pub fn attention_dq_tile(c: &Config, k: &Key) -> bool {
    attention_candidate(c, k, |bm, _, w| w == bm / 16, |bm, bn, st| 2 * bm + 2 * st * bn)
}

/// Every configuration of `matmul`'s `tune(..)` attribute (before pruning), for tests
/// and benchmarks that walk the space.
pub fn matmul_space() -> Vec<Config> {
    let mut out = vec![];
    for bm in [64, 128] {
        for bn in [64, 128, 256] {
            for bk in [32, 64] {
                for warps in [4, 8] {
                    for stages in [1, 3, 4] {
                        for warp_specialize in [false, true] {
                            out.push(Config { warp_specialize, ..Config::new(&[("BM", bm), ("BN", bn), ("BK", bk), ("GROUP_M", 8)], warps, stages) });
                        }
                    }
                }
            }
        }
    }
    out
}

/// Launch `relu_mul_add` or `sum_f32` with one given configuration (for comparisons
/// against the tuned launch).
pub fn with_config(rt: &Runtime, cfg: &Config, kernel: &str, x: &Buffer<f32>, b: &Buffer<f32>, c: &Buffer<f32>, out: &mut Buffer<f32>) -> Option<dsl_runtime::Result<()>> {
    let n = x.len();
    dispatch!(cfg.get("BLOCK"), [256, 512, 1024, 2048, 4096], |B| {
        let g = grid_for(n, B).warps(cfg.num_warps).stages(cfg.num_stages);
        if kernel == "sum_f32" {
            sum_f32::<B>::launch(rt, g, x, out, n as i32)
        } else {
            relu_mul_add::<f32, B>::launch(rt, g, x, b, c, out, n as i32)
        }
    })
}
