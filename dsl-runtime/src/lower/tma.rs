//! TMA copies and mbarriers (sm_90a): the pipelined loops whose tiles the tensor memory
//! accelerator loads ([`passes::pipeline`](crate::passes::pipeline)). Inline assembly
//! throughout: LLVM 19 has no intrinsics for `cp.async.bulk.tensor`, `expect_tx` or
//! `try_wait.parity` (notes `tensor-cores.md` §0, §5).
//!
//! - `mbar_init`: thread 0 initializes each barrier of the buffer
//!   (`mbarrier.init.shared::cta.b64`), `fence.mbarrier_init`, then a barrier.
//! - `tma_copy`: thread 0 announces the tile's bytes (`mbarrier.arrive.expect_tx`) and
//!   issues one `cp.async.bulk.tensor.2d` per strip of the destination's layout
//!   ([`LinearLayout::nvmma_shared`]: a strip is one box of the tensor map, `W` elements
//!   along the contiguous dimension by every row, with the swizzle of its `2W` bytes); the
//!   copies complete the barrier's transaction count. Without `on` it only arrives, so
//!   the phase still completes and the waits stay in step.
//! - `tma_store`: a read of the source buffer, so the threads' writes of it are fenced to
//!   the async proxy (`fence.proxy.async.shared::cta`) and a barrier passed first
//!   ([`Cx::barrier`](super::Cx::barrier)); then thread 0 issues one
//!   `cp.async.bulk.tensor.2d.global.shared::cta.bulk_group` per strip, commits them and
//!   waits until they have read the buffer (`cp.async.bulk.wait_group.read 0`), so that
//!   bytes a later access reuses, after its barrier, are free (and the buffer outlives
//!   its reads when the program exits). The copies' global writes complete by the kernel's
//!   end, ordered before nothing else of the program: `passes::tma::match_store` takes
//!   only stores to a buffer the kernel accesses nowhere else. An `add` store is
//!   `cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group` instead: each
//!   element added to the tensor's atomically (a relaxed `atomic_add`'s semantics).
//! - `mbar_wait`: every thread polls `mbarrier.try_wait.parity` until the phase of the
//!   given parity has completed; then (`sync`) a barrier, as `cp.async.wait_group` is
//!   followed by one: it releases the stage read before to the copy issued after it.
//! - `warp_specialize`: warps `num_warps..num_warps + 4` lower their registers
//!   (`setmaxnreg.dec`) and their first thread runs the producer region; the others raise
//!   theirs (`setmaxnreg.inc`, [`register_split`]) and run the consumer region, whose
//!   barriers are `bar.sync 1, 32 * num_warps` (the producer never meets one). The kernel is
//!   annotated `maxntid` with the producer's threads, and `minctasm` for the programs an
//!   SM is to run.
//! - `mbar_arrive`: once the `wgmma`s reading the stage are complete, lane 0 of each warp
//!   arrives (CUTLASS's consumer release).
//! - `turn_begin` / `turn_end`: `bar.sync 2 + wg, 256` / `bar.arrive 2 + (1 - wg), 256`
//!   for consumer warpgroup `wg` (warpgroup 1 arrives once first, so warpgroup 0 starts).
//!
//! Neither the copies nor the barriers are recorded by the hazard analysis, as
//! `cp.async` copies are not ([`memory::async_copy`](super::memory::async_copy)): the
//! pipeliner orders them.

use super::memory::buffer_at;
use super::{lower_error, Cx, LResult};
use crate::ir::{Op, Value};
use crate::layout::{InDim, LinearLayout};
use inkwell::types::BasicMetadataTypeEnum;
use inkwell::values::{BasicMetadataValueEnum, BasicValueEnum, IntValue};

/// The strips of a tile laid out by [`LinearLayout::nvmma_shared`]: the contiguous
/// dimension and the strip width along it, in elements.
pub fn strips(shared: &LinearLayout) -> Option<(usize, u64)> {
    let bases = shared.bases(InDim::Offset);
    let c = bases.first()?.iter().position(|&x| x != 0)?;
    let unit = |i: usize, b: &[u32]| b.iter().enumerate().all(|(d, &x)| x == if d == c { 1 << i } else { 0 });
    Some((c, 1u64 << bases.iter().enumerate().take_while(|(i, b)| unit(*i, b)).count()))
}

/// Thread 0 of the program, as an `i1`.
fn first_thread<'ctx>(cx: &Cx<'_, 'ctx>) -> LResult<IntValue<'ctx>> {
    let i32t = cx.ctx.i32_type();
    let both = cx.b.build_or(cx.lane, cx.warp, "")?;
    Ok(cx.b.build_int_compare(inkwell::IntPredicate::EQ, both, i32t.const_zero(), "tid0")?)
}

/// An integer scalar operand as `i32`.
fn int32<'ctx>(cx: &Cx<'_, 'ctx>, v: Value) -> LResult<IntValue<'ctx>> {
    let x = cx.vals[v.index()].first().ok_or_else(|| lower_error("internal: a scalar without a value"))?.into_int_value();
    Ok(cx.b.build_int_truncate_or_bit_cast(x, cx.ctx.i32_type(), "")?)
}

/// A `bool` scalar operand (an `i1`).
fn flag<'ctx>(cx: &Cx<'_, 'ctx>, v: Value) -> LResult<IntValue<'ctx>> {
    Ok(cx.vals[v.index()].first().ok_or_else(|| lower_error("internal: a flag without a value"))?.into_int_value())
}

/// The shared address (`i32`) of mbarrier `slot` of buffer `bars`.
fn barrier_at<'ctx>(cx: &Cx<'_, 'ctx>, bars: Value, slot: Value) -> LResult<IntValue<'ctx>> {
    let at = buffer_at(cx, bars)?;
    let i32t = cx.ctx.i32_type();
    let off = cx.b.build_int_mul(int32(cx, slot)?, i32t.const_int(8, false), "")?;
    Ok(cx.b.build_ptr_to_int(at.ptr(cx, off)?, i32t, "")?)
}

/// Inline PTX taking `args`, with side effects and a memory clobber (ordered against every
/// memory access around it).
fn asm<'ctx>(cx: &Cx<'_, 'ctx>, text: String, constraints: String, args: &[BasicValueEnum<'ctx>]) -> LResult<()> {
    let types: Vec<BasicMetadataTypeEnum> = args.iter().map(|a| a.get_type().into()).collect();
    let ty = cx.ctx.void_type().fn_type(&types, false);
    let call = cx.ctx.create_inline_asm(ty, text, format!("{constraints}~{{memory}}"), true, false, None, false);
    let args: Vec<BasicMetadataValueEnum> = args.iter().map(|&v| v.into()).collect();
    cx.b.build_indirect_call(ty, call, &args, "")?;
    Ok(())
}

/// `mbar_init`.
pub fn mbar_init<'ctx>(cx: &mut Cx<'_, 'ctx>, v: Value) -> LResult<()> {
    let Op::MbarInit { bars, count } = cx.f.inst(v).op else { unreachable!() };
    let n = cx.f.ty(bars).shape[0];
    let at = buffer_at(cx, bars)?;
    let i32t = cx.ctx.i32_type();
    let base = cx.b.build_ptr_to_int(at.ptr(cx, i32t.const_zero())?, i32t, "")?;
    let first = first_thread(cx)?;
    let text: String = (0..n).map(|s| format!("@$0 mbarrier.init.shared::cta.b64 [$1+{}], {count};\n\t", 8 * s)).collect();
    asm(cx, format!("{text}fence.mbarrier_init.release.cluster;"), "b,r,".into(), &[first.into(), base.into()])?;
    cx.barrier()
}

/// `mbar_wait`.
pub fn mbar_wait<'ctx>(cx: &mut Cx<'_, 'ctx>, v: Value) -> LResult<()> {
    let Op::MbarWait { bars, slot, phase, sync } = cx.f.inst(v).op else { unreachable!() };
    let bar = barrier_at(cx, bars, slot)?;
    let parity = int32(cx, phase)?;
    let text = "{\n\t.reg .pred done;\n\twait_${:uid}:\n\tmbarrier.try_wait.parity.shared::cta.b64 done, [$0], $1;\n\t@!done bra wait_${:uid};\n\t}";
    asm(cx, text.into(), "r,r,".into(), &[bar.into(), parity.into()])?;
    if sync {
        cx.barrier()?;
    }
    Ok(())
}

/// `mbar_arrive`: once the `wgmma`s reading the stage are complete (all of them; in a
/// loop whose `dot` stays in flight into the next iteration, the previous iteration's:
/// `wait_group 1`, the stage the pass gives back is that iteration's), lane 0 of each warp
/// arrives where `on` holds.
pub fn mbar_arrive<'ctx>(cx: &mut Cx<'_, 'ctx>, v: Value) -> LResult<()> {
    let Op::MbarArrive { bars, slot, on } = cx.f.inst(v).op else { unreachable!() };
    match cx.wgmma_in_flight[..] {
        [d] if cx.plan.overlapped.contains(&d) => cx.asm_statement("wgmma.wait_group.sync.aligned 1;")?,
        _ => super::wgmma::wait(cx)?,
    }
    let bar = barrier_at(cx, bars, slot)?;
    let on = flag(cx, on)?;
    let lane0 = cx.b.build_int_compare(inkwell::IntPredicate::EQ, cx.lane, cx.ctx.i32_type().const_zero(), "")?;
    let go = cx.b.build_and(on, lane0, "")?;
    asm(cx, "{\n\t.reg .b64 state;\n\t@$0 mbarrier.arrive.shared::cta.b64 state, [$1];\n\t}".into(), "b,r,".into(), &[go.into(), bar.into()])
}

/// The registers a thread of a warp-specialized program with `consumer_warps` consumer
/// warps keeps (`setmaxnreg`): the producer's and the consumers', and the programs an SM
/// runs at once, for which the kernel is compiled (`minctasm`): one consumer warpgroup
/// (256 threads in all) two programs an SM, as its unspecialized kernel of 128 threads
/// gets at least; more, one; and at least `at_least` (the launch's
/// [`min_programs_per_sm`](crate::launch::LaunchConfig::min_programs_per_sm)), so that
/// `setmaxnreg.inc` never asks for more than the program has. Each program's registers (65536 over the programs and
/// threads, a multiple of 8) are split as FlashAttention-3 does for two consumer
/// warpgroups: 24 for the producer, the rest (in multiples of 8, at most 240) for the
/// consumers.
pub fn register_split(consumer_warps: u32, at_least: u32) -> (u32, u32, u32) {
    const PRODUCER: u32 = 24;
    let threads = 32 * (consumer_warps + crate::passes::PRODUCER_WARPS as u32);
    let programs = (if consumer_warps <= 4 { 2 } else { 1 }).max(at_least);
    let each = (65536 / (programs * threads) / 8 * 8).min(255 / 8 * 8);
    let consumer = ((each * threads - 128 * PRODUCER) / (32 * consumer_warps) / 8 * 8).min(240);
    (PRODUCER, consumer, programs)
}

/// `warp_specialize`: warps `num_warps..` (the producer warpgroup) lower their registers
/// and their first thread runs the producer region; the others raise theirs and run the
/// consumer region with barriers that count only them.
pub fn warp_specialize<'ctx>(cx: &mut Cx<'_, 'ctx>, v: Value) -> LResult<()> {
    let f = cx.f;
    let Op::WarpSpecialize { producer, consumer } = &f.inst(v).op else { unreachable!() };
    super::wgmma::wait(cx)?;
    let i32t = cx.ctx.i32_type();
    let warps = cx.plan.num_warps as u32;
    let (producer_regs, consumer_regs, _) = register_split(warps, cx.plan.min_programs as u32);
    let is_consumer = cx.b.build_int_compare(inkwell::IntPredicate::ULT, cx.warp, i32t.const_int(warps as u64, false), "consumer")?;
    let (pb, cb, done) = (cx.ctx.append_basic_block(cx.func, "producer"), cx.ctx.append_basic_block(cx.func, "consumer"), cx.ctx.append_basic_block(cx.func, "specialized.end"));
    let one = cx.ctx.append_basic_block(cx.func, "producer.thread");
    cx.b.build_conditional_branch(is_consumer, cb, pb)?;
    // The producer warpgroup: fewer registers, then its first thread.
    cx.b.position_at_end(pb);
    cx.asm_statement(&format!("setmaxnreg.dec.sync.aligned.u32 {producer_regs};"))?;
    let first = cx.b.build_int_compare(inkwell::IntPredicate::EQ, cx.b.build_or(cx.lane, cx.b.build_int_sub(cx.warp, i32t.const_int(warps as u64, false), "")?, "")?, i32t.const_zero(), "")?;
    cx.b.build_conditional_branch(first, one, done)?;
    cx.b.position_at_end(one);
    let hazards = cx.hazards.clone();
    cx.producer = true;
    cx.block(&producer.body)?;
    cx.producer = false;
    cx.hazards = hazards;
    cx.b.build_unconditional_branch(done)?;
    // The consumers.
    cx.b.position_at_end(cb);
    cx.asm_statement(&format!("setmaxnreg.inc.sync.aligned.u32 {consumer_regs};"))?;
    cx.consumers = Some(32 * warps);
    // Taking turns: warpgroup 1 lets warpgroup 0 take the first.
    if f.walk_from(&consumer.body.insts).iter().any(|&w| matches!(f.inst(w).op, Op::Turn { .. })) {
        let second = cx.b.build_int_compare(inkwell::IntPredicate::EQ, cx.b.build_right_shift(cx.warp, i32t.const_int(2, false), false, "")?, i32t.const_int(1, false), "")?;
        asm(cx, format!("@$0 bar.arrive {TURN_BARRIER}, {};", 32 * warps), "b,".into(), &[second.into()])?;
    }
    cx.block(&consumer.body)?;
    cx.consumers = None;
    cx.b.build_unconditional_branch(done)?;
    cx.b.position_at_end(done);
    Ok(())
}

/// The first of the two named barriers through which the consumer warpgroups take turns
/// (barrier 0 is the program's, 1 the consumers').
const TURN_BARRIER: u32 = 2;

/// `turn_begin` (`begin`): this warpgroup is to wait for its turn (its barrier, which the
/// other warpgroup arrives at when it ends its turn) right before its next `wgmma`
/// ([`take_turn`]), so that a barrier its operands need (a conversion, a store to publish)
/// comes before the wait rather than inside the turn, where the other warpgroup, waiting
/// for the turn, would never meet it. `turn_end`: gives the turn to the other.
pub fn turn<'ctx>(cx: &mut Cx<'_, 'ctx>, begin: bool) -> LResult<()> {
    let n = cx.consumers.ok_or_else(|| lower_error("internal: a turn outside a warp specialization's consumers"))?;
    if n != 256 {
        return Err(lower_error("internal: turns are taken by two consumer warpgroups"));
    }
    if begin {
        if cx.turn.is_some() {
            return Err(lower_error("internal: a turn begun within a turn"));
        }
        cx.turn = Some(false);
        return Ok(());
    }
    // A turn with no `wgmma` in it still waits, so that the turns stay in step.
    take_turn(cx)?;
    if cx.turn.take().is_none() {
        return Err(lower_error("internal: a turn ended that was not begun"));
    }
    barrier_op(cx, "bar.arrive", true)
}

/// The wait of a turn begun and not yet waited for (at the first `wgmma` in it).
pub fn take_turn<'ctx>(cx: &mut Cx<'_, 'ctx>) -> LResult<()> {
    if cx.turn == Some(false) {
        barrier_op(cx, "bar.sync", false)?;
        cx.turn = Some(true);
    }
    Ok(())
}

/// `op` on this warpgroup's turn barrier, or (`other`) the other warpgroup's.
fn barrier_op<'ctx>(cx: &mut Cx<'_, 'ctx>, op: &str, other: bool) -> LResult<()> {
    let i32t = cx.ctx.i32_type();
    let wg = cx.b.build_right_shift(cx.warp, i32t.const_int(2, false), false, "")?;
    let whose = if other { cx.b.build_xor(wg, i32t.const_int(1, false), "")? } else { wg };
    let id = cx.b.build_int_add(whose, i32t.const_int(TURN_BARRIER as u64, false), "")?;
    asm(cx, format!("{op} $0, 256;"), "r,".into(), &[id.into()])
}

/// `tma_copy`.
pub fn tma_copy<'ctx>(cx: &mut Cx<'_, 'ctx>, v: Value) -> LResult<()> {
    let Op::TmaCopy { dst, map, coords, bars, slot, on, tile } = cx.f.inst(v).op.clone() else { unreachable!() };
    let bar = barrier_at(cx, bars, slot)?;
    let map = map_address(cx, map)?;
    // The producer of a warp specialization is one thread already.
    let first = if cx.producer { cx.ctx.bool_type().const_all_ones() } else { first_thread(cx)? };
    let on = flag(cx, on)?;
    let go = cx.b.build_and(first, on, "")?;
    let off = cx.b.build_not(on, "")?;
    let skip = cx.b.build_and(first, off, "")?;
    // Operands: the predicates, the barrier, the map, then the strips'.
    let mut args: Vec<BasicValueEnum> = vec![go.into(), skip.into(), bar.into(), map.into()];
    let ops = strip_operands(cx, &mut args, dst, &coords, tile.inner, "TMA copy")?;
    let rank = coords.len();
    let mut text = format!("{{\n\t.reg .b64 state;\n\t@$0 mbarrier.arrive.expect_tx.shared::cta.b64 state, [$2], {};\n\t@$1 mbarrier.arrive.shared::cta.b64 state, [$2];\n\t", ops.bytes);
    for &(d, x) in &ops.strips {
        text += &format!("@$0 cp.async.bulk.tensor.{rank}d.shared::cluster.global.mbarrier::complete_tx::bytes [${d}], [$3, {{${x}{}}}], [$2];\n\t", ops.others);
    }
    text += "}";
    let constraints = format!("b,b,r,l,{}", "r,".repeat(args.len() - 4));
    asm(cx, text, constraints, &args)
}

/// The operands [`strip_operands`] appends for a TMA copy's or store's instructions.
struct StripOperands {
    /// The coordinates after the first, as the instruction names them (`, $5, $6`).
    others: String,
    /// Per strip (one instruction each), the `$` indices of its shared address and its
    /// first coordinate.
    strips: Vec<(usize, usize)>,
    /// The bytes of all strips, and the buffer's byte range.
    bytes: u64,
    range: std::ops::Range<u64>,
}

/// Append to `args` (after the instruction's fixed operands) the operands of a TMA copy's
/// or store's instructions, one a strip of buffer `buf` (laid out by
/// [`LinearLayout::nvmma_shared`], contiguous along `inner`; `what` names the operation
/// in errors) at element coordinates `coords`: the coordinates after the first, then per
/// strip its shared address and first coordinate (the strip's offset along `inner`
/// added).
fn strip_operands<'ctx>(cx: &Cx<'_, 'ctx>, args: &mut Vec<BasicValueEnum<'ctx>>, buf: Value, coords: &[Value], inner: usize, what: &str) -> LResult<StripOperands> {
    let t = cx.f.ty(buf).clone();
    let at = buffer_at(cx, buf)?;
    let shared = at.shared.clone().ok_or_else(|| lower_error(format!("internal: a {what} with a buffer without a shared layout")))?;
    let (c, w) = strips(&shared).ok_or_else(|| lower_error(format!("internal: a {what} with the shared layout {shared}")))?;
    if c != inner {
        return Err(lower_error(format!("internal: a {what} along dimension {inner} with a tile contiguous along {c}")));
    }
    let (nstrips, strip_bytes) = (t.shape[c] as u64 / w, w * t.dtype.size() as u64 * t.shape[1 - c] as u64);
    let i32t = cx.ctx.i32_type();
    let base = cx.b.build_ptr_to_int(at.ptr(cx, i32t.const_zero())?, i32t, "")?;
    let c0 = int32(cx, coords[0])?;
    let first_rest = args.len();
    for &x in &coords[1..] {
        args.push(int32(cx, x)?.into());
    }
    let others = (first_rest..args.len()).map(|i| format!(", ${i}")).collect();
    let mut strips = vec![];
    for j in 0..nstrips {
        let a = cx.b.build_int_add(base, i32t.const_int(j * strip_bytes, false), "")?;
        let x = cx.b.build_int_add(c0, i32t.const_int(j * w, false), "")?;
        strips.push((args.len(), args.len() + 1));
        args.extend([BasicValueEnum::from(a), x.into()]);
    }
    Ok(StripOperands { others, strips, bytes: nstrips * strip_bytes, range: at.range })
}

/// A tensor map operand as the `i64` generic address of its parameter.
fn map_address<'ctx>(cx: &Cx<'_, 'ctx>, map: Value) -> LResult<IntValue<'ctx>> {
    let map = cx.vals[map.index()].first().ok_or_else(|| lower_error("internal: a tensor map without a value"))?.into_pointer_value();
    Ok(cx.b.build_ptr_to_int(map, cx.ctx.i64_type(), "")?)
}

/// `tma_store`.
pub fn tma_store<'ctx>(cx: &mut Cx<'_, 'ctx>, v: Value) -> LResult<()> {
    let Op::TmaStore { src, map, coords, tile, add } = cx.f.inst(v).op.clone() else { unreachable!() };
    let map = map_address(cx, map)?;
    let first = if cx.producer { cx.ctx.bool_type().const_all_ones() } else { first_thread(cx)? };
    // Operands: the predicate, the map, then the strips'.
    let mut args: Vec<BasicValueEnum> = vec![first.into(), map.into()];
    let ops = strip_operands(cx, &mut args, src, &coords, tile.inner, "TMA store")?;
    // The threads' writes of the buffer, fenced and published (a read after them).
    cx.smem_access(ops.range.clone(), super::smem::Access::Read)?;
    let rank = coords.len();
    let (op, how) = if add { ("cp.reduce.async.bulk.tensor", ".add.tile") } else { ("cp.async.bulk.tensor", "") };
    let mut text = String::new();
    for &(s, x) in &ops.strips {
        text += &format!("@$0 {op}.{rank}d.global.shared::cta{how}.bulk_group [$1, {{${x}{}}}], [${s}];\n\t", ops.others);
    }
    text += "@$0 cp.async.bulk.commit_group;\n\t@$0 cp.async.bulk.wait_group.read 0;";
    let constraints = format!("b,l,{}", "r,".repeat(args.len() - 2));
    asm(cx, text, constraints, &args)
}

#[cfg(test)]
mod tests {
    /// The consumers' and the producer's registers fit the programs the kernel is compiled
    /// for, the launch's count included (`setmaxnreg.inc` would wait for more forever).
    #[test]
    fn the_register_split_fits_the_programs_an_sm() {
        for warps in [4, 8] {
            for at_least in 1..=8 {
                let threads = 32 * (warps + crate::passes::PRODUCER_WARPS as u32);
                if at_least * threads > crate::launch::MAX_THREADS_PER_SM {
                    continue;
                }
                let (producer, consumer, programs) = super::register_split(warps, at_least);
                assert!(programs >= at_least);
                assert!(producer % 8 == 0 && consumer % 8 == 0 && (24..=256).contains(&consumer), "{warps} warps, {at_least}: {consumer}");
                assert!(programs * (128 * producer + 32 * warps * consumer) <= 65536, "{warps} warps, {at_least} programs: {producer} + {consumer} registers");
            }
        }
        assert_eq!(super::register_split(8, 1), (24, 240, 1));
    }
}
