//! Passes over the block IR: transforms (which rewrite the [`Function`]) and analyses
//! (which compute facts the lowering reads). The order is written once, in [`optimize`]
//! and [`plan`].
//!
//! | pass | kind | what it does |
//! |---|---|---|
//! | [`guard`] | transform | ANDs every load/store/atomic mask with `offset < len(buffer)` (safe launches) |
//! | [`simplify`] | transform | common-subexpression elimination, dead-code removal, debug ops out of non-debug builds |
//! | [`hoist`] | transform | loop-invariant scalars (loads of memory the loop does not write included) out of loops; loads a `dot` does not feed issued before it |
//! | [`stage`] | transform | tensor-core `dot` operands through shared-memory buffers (`local_alloc` + `local_load`, `trans(x)` through a `local_trans` view of `x`'s buffer), for `ldmatrix` |
//! | [`prefetch`] | transform | with `num_stages > 1`, loads in a loop that no shared memory takes issued one iteration ahead, their values carried in registers |
//! | [`pipeline`] | transform | loads that feed shared memory in a loop issued `num_stages - 1` iterations ahead (`cp.async`, or on sm_90a TMA copies of the tiles [`tma`] recognises, into a ring of buffers; with warp specialization a producer warpgroup issues the TMA copies) |
//! | [`tma`] (`stores`) | transform | on sm_90a when the launch asks ([`LaunchConfig::tma_store`](crate::launch::LaunchConfig::tma_store)), stores of whole matrix tiles through a shared buffer and one thread's TMA copies |
//! | [`axis_info`] | analysis | contiguity, divisibility and constancy of every integer/pointer value |
//! | [`layout`] | analysis | a [`LinearLayout`](crate::layout::LinearLayout) per value, chosen from its uses, and a vector width per memory op |
//! | [`convert`] | transform | a `convert_layout` wherever an operand is needed in another layout than it was produced in |
//! | [`alloc`] | analysis | a shared-memory offset per `local_alloc`, from the buffers' lifetimes |

pub mod alloc;
pub mod axis_info;
pub mod convert;
pub mod guard;
pub mod hoist;
pub mod layout;
pub mod pipeline;
pub mod prefetch;
pub mod simplify;
pub mod stage;
pub mod tma;

use crate::error::BuildError;
use crate::ir::{verify::verify, Function, Op, ParamSpec, Value};

/// Options that change what the passes produce (and so are part of the cache key).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PassOptions {
    /// `Some(specs)`: guard every access by the buffer lengths, whose properties
    /// (`div16`) are given per pointer parameter. `None`: trust the kernel's masks.
    pub bounds_guard: Option<Vec<ParamSpec>>,
    /// Keep `device_assert` and `device_print`, and (with `bounds_guard`) report
    /// out-of-bounds lanes instead of masking them silently (debug builds).
    pub debug: bool,
}

/// The IR-to-IR pipeline. Verifies after every transform.
pub fn optimize(f: &mut Function, opts: &PassOptions) -> Result<(), BuildError> {
    if let Some(len_specs) = &opts.bounds_guard {
        guard::run(f, len_specs, opts.debug)?;
        verify(f)?;
    }
    simplify::run(f, opts.debug);
    verify(f)?;
    hoist::run(f);
    verify(f)?;
    Ok(())
}

/// The analyses the lowering needs, computed on the optimized IR. `wgmma`: the target
/// runs sm_90a's `wgmma` and the launch allows it ([`layout::dot_plan`]).
///
/// `tma`: the pipelined loads of `wgmma` operands may be TMA copies where they have the
/// form [`tma`] recognises (`wgmma` must be on too); [`layout::Plan::tma`] then lists the
/// tensor maps the launch passes.
///
/// `tma_store`: stores of whole matrix tiles are made by TMA ([`tma::stores`]).
///
/// `specialize`: a top-level TMA loop may be warp-specialized (`pipeline`'s docs).
///
/// `prefetch`: with `num_stages > 1`, loads in loops that no shared memory takes are
/// issued an iteration ahead ([`prefetch`]).
#[allow(clippy::too_many_arguments)]
pub fn plan(f: &mut Function, num_warps: usize, num_stages: u32, wgmma: bool, tma: bool, tma_store: bool, specialize: bool, prefetch: bool) -> layout::Plan {
    stage::run(f, num_warps);
    if wgmma {
        stage::sink_for_wgmma(f, num_warps);
    }
    if num_stages > 1 && prefetch {
        prefetch::run(f, num_warps);
    }
    let overlapped = pipeline::run(f, num_stages, num_warps, wgmma, tma, specialize);
    if tma_store {
        tma::stores(f);
    }
    let axis = axis_info::analyze(f);
    let mut plan = layout::assign(f, &axis, num_warps, wgmma);
    plan.overlapped = overlapped;
    convert::run(f, &mut plan);
    // The buffers the async proxy reads (`wgmma` operands, the sources of TMA stores)
    // start at a swizzle atom (1024 bytes): the tensor cores and TMA apply the swizzle to
    // absolute shared-memory addresses.
    let insts = f.walk();
    let tma_stored: Vec<Value> = insts.iter().filter_map(|&v| if let Op::TmaStore { src, .. } = f.inst(v).op { Some(f.buffer_root(src)) } else { None }).collect();
    plan.async_buffers = insts.into_iter().filter(|&b| matches!(f.inst(b).op, Op::LocalAlloc(_)) && (reads_by_wgmma(f, &plan, b) || tma_stored.contains(&b))).collect();
    plan.smem = alloc::allocate_aligned(f, &plan.async_buffers);
    plan.tma = tma::maps(f, &plan);
    plan.producer_warps = if f.body.insts.iter().any(|&v| matches!(f.inst(v).op, Op::WarpSpecialize { .. })) { PRODUCER_WARPS } else { 0 };
    plan
}

/// `mask & on` pushed to `out` (`on` alone where there is no mask), in `on`'s type: a
/// load's or copy's mask restricted to the iterations that run it.
pub(crate) fn and_mask(f: &mut Function, out: &mut Vec<Value>, mask: Option<Value>, on: Value, loc: crate::ir::Loc) -> Value {
    let Some(m) = mask else { return on };
    let both = f.push(Op::Binary(crate::ir::BinOp::And, m, on), f.ty(on).clone(), loc);
    out.push(both);
    both
}

/// The warps of a warp-specialized kernel's producer: one warpgroup, the unit of
/// `setmaxnreg` (one of its threads issues the copies).
pub const PRODUCER_WARPS: usize = 4;

/// Whether a `wgmma` reads buffer `buf` (through a `local_load` of it or of a view).
pub fn reads_by_wgmma(f: &Function, plan: &layout::Plan, buf: Value) -> bool {
    plan.dots.iter().any(|(&d, p)| {
        p.wgmma.is_some() && matches!(f.inst(d).op, Op::Dot { a, b, .. } if [a, b].iter().any(|&x| matches!(f.inst(x).op, Op::LocalLoad(w) if f.buffer_root(w) == buf)))
    })
}
