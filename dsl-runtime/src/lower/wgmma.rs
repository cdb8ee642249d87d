//! Lowering of a `dot` to sm_90a `wgmma.mma_async` (the dot family's Hopper path, chosen
//! by [`dot_plan`](crate::passes::layout::dot_plan)): both operands stay in their
//! shared-memory buffers and the tensor cores read them through 64-bit descriptors; the
//! f32 accumulator is in registers, in the layout of
//! [`LinearLayout::wgmma_accumulator`]. Per `dot`:
//!
//! ```text
//! wgmma.fence.sync.aligned;                        // the accumulator registers are ready
//! wgmma.mma_async.sync.aligned.m64nNk16.f32.bf16.bf16 {d..}, descA, descB, p, 1, 1, tA, tB;
//!                                                  // p = 0 (D = A B) at the first K step
//!                                                  // of a `zeros` accumulator
//! ...                                              // per K step of 16, per 64 x N tile
//! wgmma.commit_group.sync.aligned;
//! ...                                              // address arithmetic, cp.async copies
//! wgmma.wait_group.sync.aligned 0;                 // every accumulator register tied through
//! ```
//!
//! The wait comes before the first instruction that reads the accumulator, writes shared
//! memory, needs scratch memory or a barrier, or opens a region other than a branch of
//! such instructions ([`may_pass`]), and at the latest at the end of the block: the
//! pipeliner puts a loop's copies for later iterations right after its `dot`
//! ([`passes::pipeline`](crate::passes::pipeline)), so they are issued while the tensor
//! cores work. Several `dot`s may be in flight, each its own commit group: an instruction
//! waits for the youngest one it may not pass and those before it (`wgmma.wait_group N`,
//! `N` the younger ones: [`wait_through`]), so a second product issued behind the first
//! keeps running while the first one's result is used (FlashAttention-3's order). Waiting
//! for all of them by the end of the block keeps the barrier discipline of the buffers
//! (the hazard analysis, the pipeliner's one barrier per iteration) that of `mma.sync`:
//! when the block ends, its operands are read.
//!
//! Except in a loop the pipeliner gave a stage of slack (a ring of `num_stages + 1`
//! stages, its copies writing the stage read two iterations back): there the body ends
//! with `wgmma.wait_group 1`, so one iteration's `wgmma`s run while the next waits for
//! its copies, passes its barrier and issues its own; the loop's results are waited for
//! where they are read ([`end_of_block`], [`loop_results`]). Shared memory stored by
//! threads (`st.shared`) and read by `wgmma` (the async proxy) needs `fence.proxy.async`
//! between the stores and the barrier that publishes them: a kernel with a `wgmma` emits it
//! before a barrier that follows such stores ([`Cx::proxy_fence`]); the `cp.async` copies
//! of the pipelined loop are published by their wait and barrier alone, as in Triton.
//!
//! A descriptor (PTX ISA "Matrix Descriptor Format"; CUTLASS `GmmaDescriptor`; notes
//! `tensor-cores.md` §4), addresses and offsets in 16-byte units: bits 0-13 the start
//! address, 16-29 the leading byte offset, 32-45 the stride byte offset, 62-63 the
//! swizzle (1: 128 bytes, 2: 64, 3: 32). The buffers are laid out by [`LinearLayout::nvmma_shared`]: strips of `W`
//! elements (`2W` bytes, the swizzle width) along the contiguous dimension, each holding
//! its rows one after the other. Read off that layout:
//!
//! - K-major (K contiguous): an instruction reads 8-row groups of one strip; the stride
//!   byte offset is 8 rows (`16W` bytes), the leading one unused (1). A K step inside the
//!   strip moves the start address by its bytes (the hardware swizzles the sum).
//! - MN-major (M or N contiguous, the transpose immediate 1): groups of 8 K-rows, the
//!   stride byte offset again 8 rows; the leading byte offset is the distance between
//!   strips along M or N (a strip's bytes).
//!
//! Each tile's start is the offset of its first element in the layout (a row that is a
//! multiple of 8, where the swizzle is the identity), plus, at run time, the offset of
//! this warpgroup's part of the tile.

use super::{lower_error, memory, smem, Cx, LResult, Regs};
use crate::ir::{Op, Value};
use crate::layout::{InDim, LinearLayout};
use crate::DType;
use inkwell::types::BasicMetadataTypeEnum;
use inkwell::values::{BasicMetadataValueEnum, BasicValueEnum, IntValue};
use std::collections::BTreeMap;

/// How the tensor cores find one operand: what [`Desc::at`] needs.
struct Desc<'ctx> {
    /// The descriptor of the operand's first byte for this warpgroup: its shared address
    /// `>> 4` in bits 0-13, `fields` above. Shared addresses are below 2^18 (228 KiB), so
    /// the start field of any byte of the buffer is this plus its offset `>> 4`, with no
    /// carry out of the field: one 64-bit add of a constant per instruction.
    base: IntValue<'ctx>,
    /// Coordinates of the operand → element offset in its buffer.
    offset: LinearLayout,
    /// The transpose immediate: 1 where M (for `a`) or N (for `b`) is contiguous.
    mn_major: bool,
}

/// The descriptor layout of an operand whose buffer layout is `shared` (`Offset` → the
/// operand's coordinates), with K its dimension `k_dim`: (descriptor bits 16-63, MN-major).
pub(crate) fn descriptor_fields(shared: &LinearLayout, k_dim: usize) -> Option<(u64, bool)> {
    let (c, w) = super::tma::strips(shared)?;
    let rows = shared.shape[1 - c] as u64;
    let (swizzle_bytes, strip_bytes) = (2 * w, 2 * w * rows);
    let mode = match swizzle_bytes {
        128 => 1,
        64 => 2,
        32 => 3,
        _ => return None,
    };
    let mn_major = c != k_dim;
    let leading = if mn_major { strip_bytes >> 4 } else { 1 };
    let stride = (8 * swizzle_bytes) >> 4;
    if leading >= 1 << 14 || stride >= 1 << 14 {
        return None;
    }
    Some(((mode << 62) | (stride << 32) | (leading << 16), mn_major))
}

impl<'ctx> Desc<'ctx> {
    /// Operand `x` (`local_load` of a buffer, left to this `dot`) with K its dimension
    /// `k_dim`; `warp_coords` are the operand coordinates each warp bit adds (warpgroups).
    fn new(cx: &mut Cx<'_, 'ctx>, x: Value, k_dim: usize, warp_coords: &[Vec<u32>]) -> LResult<Desc<'ctx>> {
        let Op::LocalLoad(buf) = cx.f.inst(x).op else { return Err(lower_error("internal: a wgmma operand that is not read from shared memory")) };
        if !cx.deferred.contains(&x) {
            return Err(lower_error("internal: a wgmma operand's buffer may change between its local_load and the dot"));
        }
        let at = memory::buffer_at(cx, buf)?;
        // The tensor cores read the buffer here.
        cx.smem_access(at.range.clone(), smem::Access::Read)?;
        let shared = at.shared.clone().ok_or_else(|| lower_error("internal: a wgmma operand in a buffer without a shared layout"))?;
        let (fields, mn_major) = descriptor_fields(&shared, k_dim).ok_or_else(|| lower_error(format!("internal: no wgmma descriptor for the shared layout {shared}")))?;
        let offset = shared.invert().ok_or_else(|| lower_error("internal: a shared layout that is not invertible"))?;
        let i32t = cx.ctx.i32_type();
        let p = at.ptr(cx, i32t.const_zero())?;
        let mut base = cx.b.build_ptr_to_int(p, i32t, "")?;
        // This warpgroup's part: warp bits 2 and up (bits 0-1 are the warps of one group).
        for (j, coords) in warp_coords.iter().enumerate().skip(2) {
            let bytes = 2 * elem_offset(&offset, coords) as u64;
            if bytes == 0 {
                continue;
            }
            let bit = cx.b.build_and(cx.b.build_right_shift(cx.warp, i32t.const_int(j as u64, false), false, "")?, i32t.const_int(1, false), "")?;
            base = cx.b.build_int_add(base, cx.b.build_int_mul(bit, i32t.const_int(bytes, false), "")?, "")?;
        }
        let i64t = cx.ctx.i64_type();
        let start = cx.b.build_int_z_extend(cx.b.build_right_shift(base, i32t.const_int(4, false), false, "")?, i64t, "")?;
        let base = cx.b.build_or(start, i64t.const_int(fields, false), "desc0")?;
        Ok(Desc { base, offset, mn_major })
    }

    /// The descriptor of the instruction tile whose first element is at `coords`.
    fn at(&self, cx: &Cx<'_, 'ctx>, coords: &[u32]) -> LResult<IntValue<'ctx>> {
        let bytes = 2 * elem_offset(&self.offset, coords) as u64;
        if !bytes.is_multiple_of(16) {
            return Err(lower_error(format!("internal: a wgmma tile {bytes} bytes into its buffer (descriptors address 16-byte units)")));
        }
        Ok(cx.b.build_int_add(self.base, cx.ctx.i64_type().const_int(bytes >> 4, false), "desc")?)
    }
}

/// The element offset of coordinates `coords` under `offset` (coordinates → offset).
fn elem_offset(offset: &LinearLayout, coords: &[u32]) -> u32 {
    let at: Vec<(InDim, u32)> = coords.iter().enumerate().map(|(d, &c)| (InDim::Coord(d), c)).collect();
    offset.apply_in(&at)[0]
}

/// Per 64 x `n` instruction tile of the accumulator layout `lc` (keyed by its first row
/// and column at warp 0), the register of each `d_i`: at lane 0, `d_i` is row
/// `8 * ((i >> 1) & 1)`, column `8 * (i >> 2) + (i & 1)` of the tile.
fn tiles(lc: &LinearLayout, n: u32) -> LResult<BTreeMap<(u32, u32), Vec<usize>>> {
    let slot = |row: u32, col: u32| (row.is_multiple_of(8) && row <= 8 && col % 8 <= 1).then_some((col % 8 + 2 * (row / 8) + 4 * (col / 8)) as usize);
    super::dot::tiles(lc, 64, n, slot, n as usize / 2)
}

/// Where `a` comes from: its buffer (a descriptor), or its `mma.sync`-style fragments in
/// registers (the register form: four 32-bit registers per 64 x 16 tile, each two
/// elements, the first in the low half), per tile keyed by its first row and K at warp 0.
enum OperandA<'ctx> {
    Shared(Desc<'ctx>),
    Registers(BTreeMap<(u32, u32), Vec<BasicValueEnum<'ctx>>>),
}

/// `a` in registers in layout `la` ([`LinearLayout::mma_v2_operand`] with all warps along
/// M): per 64 x 16 tile, its 32-bit words `a0..a3` (PTX ISA, wgmma "Register Fragments",
/// matrix A: per warp, `mma.m16n8k16`'s A fragment of its 16 rows; CuTe `ALayout_64x16`).
fn register_words<'ctx>(cx: &mut Cx<'_, 'ctx>, a: Value, la: &LinearLayout) -> LResult<BTreeMap<(u32, u32), Vec<BasicValueEnum<'ctx>>>> {
    let ra = cx.get(a, la)?;
    // a0..a7 = (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1), (g, 2t+8), ..: at warp 0, rows
    // 0..16 of each 64-row tile.
    let slot = |r: u32, c: u32| (r < 16).then_some((c & 1) as usize + 2 * (r >> 3) as usize + 4 * (c >> 3) as usize);
    let tiles = super::dot::tiles(la, 64, 16, slot, 8)?;
    let d = cx.f.ty(a).dtype;
    let mut out = BTreeMap::new();
    for (key, regs) in tiles {
        let words = regs.chunks(2).map(|w| super::dot::word(cx, d, &[ra[w[0]], ra[w[1]]])).collect::<LResult<Vec<_>>>()?;
        out.insert(key, words);
    }
    Ok(out)
}

/// `dot` `v` as `wgmma` m64nNk16, `N = n`, accumulating in layout `lc`; `a` from its buffer,
/// or from registers in layout `la`.
pub fn dot<'ctx>(cx: &mut Cx<'_, 'ctx>, v: Value, n: usize, la: &LinearLayout, lc: &LinearLayout) -> LResult<Regs<'ctx>> {
    let f = cx.f;
    let Op::Dot { a, b, acc, .. } = f.inst(v).op else { unreachable!() };
    let ty = match f.ty(a).dtype {
        DType::BF16 => "bf16",
        DType::F16 => "f16",
        d => return Err(lower_error(format!("internal: wgmma of {d} inputs"))),
    };
    let k = f.ty(a).shape[1] as u32;
    // A `zeros` accumulator is never read: each tile's first K step runs with the scale-d
    // flag 0 (`D = A B`), so no instruction writes the registers before the `wgmma`s (ptxas
    // serializes `wgmma`s when other instructions define their accumulators while one is
    // in flight, C7515), as Triton does for a zero-initialized `tt.dot`.
    let zero_acc = f.is_zero(acc);
    let mut rc = if zero_acc { vec![cx.ctx.f32_type().get_undef().into(); lc.num_regs()] } else { cx.get(acc, lc)? };
    let warps = lc.bases(InDim::Warp).to_vec();
    // What each warp bit adds to the coordinates of `a` ([M, K]) and `b` ([K, N]).
    let (wa, wb): (Vec<Vec<u32>>, Vec<Vec<u32>>) = warps.iter().map(|w| (vec![w[0], 0], vec![0, w[1]])).unzip();
    let da = match f.inst(a).op {
        Op::LocalLoad(_) => OperandA::Shared(Desc::new(cx, a, 1, &wa)?),
        _ => OperandA::Registers(register_words(cx, a, la)?),
    };
    let db = Desc::new(cx, b, 0, &wb)?;
    let tiles = tiles(lc, n as u32)?;
    let (i32t, i64t, f32t) = (cx.ctx.i32_type(), cx.ctx.i64_type(), cx.ctx.f32_type());
    let half = n / 2;
    let ret = cx.ctx.struct_type(&vec![f32t.into(); half], false);
    let outs = (0..half).map(|i| format!("${i}")).collect::<Vec<_>>().join(", ");
    let tb = u8::from(db.mn_major);
    // Operands after the outputs: `a` (a descriptor, or four words), `b`'s descriptor, the
    // scale-d flag, then the accumulators tied to the outputs.
    let (a_types, a_text, a_constraints): (Vec<BasicMetadataTypeEnum>, String, Vec<String>) = match &da {
        OperandA::Shared(_) => (vec![i64t.into()], format!("${half}"), vec!["l".into()]),
        OperandA::Registers(_) => (vec![i32t.into(); 4], format!("{{${half}, ${}, ${}, ${}}}", half + 1, half + 2, half + 3), vec!["r".into(); 4]),
    };
    let (desc_b, flag) = (half + a_types.len(), half + a_types.len() + 1);
    // The register form has no transpose immediate for `a`.
    let immediates = match &da {
        OperandA::Shared(d) => format!("1, 1, {}, {tb}", u8::from(d.mn_major)),
        OperandA::Registers(_) => format!("1, 1, {tb}"),
    };
    let params: Vec<BasicMetadataTypeEnum> = [a_types, vec![i64t.into(), i32t.into()], vec![f32t.into(); half]].concat();
    let fty = ret.fn_type(&params, false);
    let text = format!("{{\n.reg .pred p;\nsetp.ne.b32 p, ${flag}, 0;\nwgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ty}.{ty} {{{outs}}}, {a_text}, ${desc_b}, p, {immediates};\n}}");
    let constraints = [vec!["=f".to_string(); half], a_constraints, vec!["l".into(), "r".into()], (0..half).map(|i| i.to_string()).collect()].concat().join(",");
    let mma = cx.ctx.create_inline_asm(fty, text, constraints, true, false, None, false);
    // A turn begun waits here, after whatever barrier the operands needed.
    super::tma::take_turn(cx)?;
    cx.asm_statement("wgmma.fence.sync.aligned;")?;
    for k0 in (0..k).step_by(16) {
        for (&(m0, n0), regs) in &tiles {
            let mut args: Vec<BasicMetadataValueEnum> = match &da {
                OperandA::Shared(d) => vec![d.at(cx, &[m0, k0])?.into()],
                OperandA::Registers(words) => {
                    let w = words.get(&(m0, k0)).ok_or_else(|| lower_error(format!("internal: no a fragment for rows {m0}, k {k0}")))?;
                    w.iter().map(|&x| x.into()).collect()
                }
            };
            args.push(db.at(cx, &[k0, n0])?.into());
            args.push(i32t.const_int(u64::from(!(zero_acc && k0 == 0)), false).into());
            args.extend(regs.iter().map(|&r| BasicMetadataValueEnum::from(rc[r])));
            let out = cx.b.build_indirect_call(fty, mma, &args, "wgmma")?.try_as_basic_value().basic().expect("wgmma returns its accumulators").into_struct_value();
            for (i, &r) in regs.iter().enumerate() {
                rc[r] = cx.b.build_extract_value(out, i as u32, "")?;
            }
        }
    }
    cx.asm_statement("wgmma.commit_group.sync.aligned;")?;
    // In flight: [`wait`] before anything reads them.
    cx.wgmma_in_flight.push(v);
    Ok(rc)
}

/// The end of a block: wait for the `wgmma`s issued in it (`outer`: how many were in
/// flight when it began; a branch that every instruction of lets them pass leaves them
/// in flight), except that a loop body whose `dot` the pipeliner gave a stage of slack
/// ([`Plan::overlapped`](crate::passes::layout::Plan)) only waits for the previous
/// iteration's (`wgmma.wait_group 1`): the accumulator goes into the next iteration's
/// `wgmma`s in flight, and the loop's results wait where they are read ([`loop_results`]).
pub fn end_of_block<'ctx>(cx: &mut Cx<'_, 'ctx>, outer: usize) -> LResult<()> {
    if cx.wgmma_in_flight.len() <= outer {
        return Ok(());
    }
    if let [v] = cx.wgmma_in_flight[..] {
        if cx.plan.overlapped.contains(&v) {
            cx.wgmma_in_flight.clear();
            return cx.asm_statement("wgmma.wait_group.sync.aligned 1;");
        }
    }
    wait(cx)
}

/// After loop `v`: the results that carry an overlapped `dot`'s accumulator out of it
/// are in flight until [`wait`].
pub fn loop_results(cx: &mut Cx<'_, '_>, v: Value) {
    let f = cx.f;
    let Op::For { body, .. } = &f.inst(v).op else { return };
    let results = f.results_of(v);
    for (i, y) in body.yields.iter().enumerate() {
        if let (true, Some(Some(r))) = (cx.plan.overlapped.contains(y), results.get(i)) {
            cx.wgmma_in_flight.push(*r);
        }
    }
}

/// Whether instruction `w` may be lowered while the `wgmma` of `dot` is in flight: it
/// does not read the accumulator (nor does anything in its regions) and writes no shared
/// memory a `wgmma` may read and holds no barrier: arithmetic in registers; the
/// pipeliner's copies (which go to other stages) and their commit; a consumer's
/// `mbar_arrive`, which waits for what it must itself
/// ([`tma::mbar_arrive`](super::tma::mbar_arrive)); the turns of the warpgroups, which only
/// order them; another `wgmma` (issued behind it: FlashAttention-3's `p v` issued while
/// the next `q k^T` runs); a buffer read; a reduction within warps and a layout change
/// within threads (no scratch memory); a branch made only of these.
pub fn may_pass(cx: &Cx<'_, '_>, w: Value, dot: Value) -> bool {
    let f = cx.f;
    let op = &f.inst(w).op;
    if op.operands().contains(&dot) {
        return false;
    }
    match op {
        Op::AsyncCopy { .. } | Op::AsyncCommit | Op::TmaCopy { .. } | Op::MbarArrive { .. } | Op::Turn { .. } | Op::LocalSlot { .. } | Op::LocalTrans(_) | Op::LocalLoad(_) => true,
        Op::Const(_) | Op::Arange { .. } | Op::Splat(_) | Op::Broadcast(_) | Op::ExpandDims(..) | Op::AddPtr(..) | Op::PtrOffset(_) | Op::Result(..) => true,
        Op::Binary(..) | Op::Cmp(..) | Op::Unary(..) | Op::Cast(_) | Op::Select(..) | Op::Fma(..) => true,
        Op::Dot { .. } => cx.plan.dots.get(&w).is_some_and(|p| p.wgmma.is_some()),
        Op::Reduce { x, axis, .. } => cx.lay[x.index()].as_ref().is_some_and(|l| {
            l.bases(InDim::Warp).iter().all(|b| b.get(*axis as usize).is_none_or(|&c| c == 0))
        }),
        Op::ConvertLayout(x) => match (&cx.lay[x.index()], cx.plan.layouts.get(&w)) {
            (Some(from), Some(to)) => from.register_permutation(to).is_some(),
            (None, _) => true,
            _ => false,
        },
        Op::If { then, els, .. } => [then, els].iter().all(|r| !r.yields.contains(&dot) && r.body.insts.iter().all(|&x| !matches!(f.inst(x).op, Op::Dot { .. }) && may_pass(cx, x, dot))),
        _ => false,
    }
}

/// Wait for the `wgmma`s in flight, if any (`wgmma.wait_group 0`).
pub fn wait<'ctx>(cx: &mut Cx<'_, 'ctx>) -> LResult<()> {
    match cx.wgmma_in_flight.len() {
        0 => Ok(()),
        n => wait_through(cx, n - 1),
    }
}

/// Wait for the `i`-th oldest `wgmma` in flight and those before it, leaving the younger
/// ones running (`wgmma.wait_group` their number: the groups complete in order). The
/// accumulator registers of the ones waited for pass through the wait, so that nothing
/// reads one before the tensor cores have written it.
pub fn wait_through<'ctx>(cx: &mut Cx<'_, 'ctx>, i: usize) -> LResult<()> {
    let values: Vec<Value> = cx.wgmma_in_flight.drain(..=i).collect();
    let text = format!("wgmma.wait_group.sync.aligned {};", cx.wgmma_in_flight.len());
    let rc: Vec<BasicValueEnum<'ctx>> = values.iter().flat_map(|v| cx.vals[v.index()].clone()).collect();
    if rc.is_empty() {
        return cx.asm_statement(&text);
    }
    let f32t = cx.ctx.f32_type();
    let all = rc.len();
    let ret = cx.ctx.struct_type(&vec![f32t.into(); all], false);
    let fty = ret.fn_type(&vec![f32t.into(); all], false);
    let constraints = [vec!["=f".to_string(); all], (0..all).map(|i| i.to_string()).collect()].concat().join(",");
    let wait = cx.ctx.create_inline_asm(fty, text, constraints, true, false, None, false);
    let args: Vec<BasicMetadataValueEnum> = rc.iter().map(|&x| x.into()).collect();
    let out = cx.b.build_indirect_call(fty, wait, &args, "")?.try_as_basic_value().basic().expect("the wait returns the accumulators").into_struct_value();
    let mut waited = (0..all).map(|i| Ok::<BasicValueEnum, _>(cx.b.build_extract_value(out, i as u32, "")?)).collect::<LResult<Vec<_>>>()?.into_iter();
    for v in values {
        let n = cx.vals[v.index()].len();
        cx.vals[v.index()] = waited.by_ref().take(n).collect();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The address the tensor cores read element (`mn`, `k`) of an instruction's operand
    /// from, given its descriptor (start byte `start`, `fields`) and whether it is
    /// MN-major: the canonical layouts of CUTLASS's `make_gmma_desc` (in 16-byte units,
    /// K-major `((8, m), 2) : ((W, SBO), 1)`, MN-major `((W, m), (8, k)) : ((1, LBO),
    /// (W, SBO))`, `W` the swizzle width in 16-byte chunks) followed by the swizzle on the
    /// absolute address (`Swizzle<log2 W, 4, 3>`: bits 4.. XOR bits 7..).
    fn hardware_address(start: u64, fields: u64, mn_major: bool, mn: u64, k: u64) -> u64 {
        let w = match fields >> 62 {
            1 => 8,
            2 => 4,
            3 => 2,
            _ => unreachable!(),
        };
        let (lbo, sbo) = (((fields >> 16) & 0x3fff) << 4, ((fields >> 32) & 0x3fff) << 4);
        let (e, chunk) = (8, 16); // 16-bit elements per chunk, bytes per chunk
        let linear = if mn_major {
            let (c, g) = (mn / e, mn / (e * w));
            start + (mn % e) * 2 + (c % w) * chunk + g * lbo + (k % 8) * w * chunk + (k / 8) * sbo
        } else {
            start + (k % e) * 2 + (k / e) * chunk + (mn % 8) * w * chunk + (mn / 8) * sbo
        };
        let bits = w.trailing_zeros() as u64;
        linear ^ (((linear >> 7) & ((1 << bits) - 1)) << 4)
    }

    /// For every operand buffer the layout pass can make (row- or column-major `a` and
    /// `b`, 128/64/32-byte swizzles, several strips), every element of every instruction
    /// tile and K step is where the descriptor says it is: the descriptor read off our
    /// layout addresses exactly the layout's offsets.
    #[test]
    fn descriptors_address_every_element_where_the_layout_puts_it() {
        // (operand shape [rows, cols] as the dot sees it, K dim, contiguous dim, strip
        // width, instruction extent along MN)
        let cases = [
            ([128, 64], 1, 1, 64, 64), // a, K-major, 128B
            ([64, 32], 1, 1, 32, 64),  // a, K-major, 64B
            ([64, 16], 1, 1, 16, 64),  // a, K-major, 32B
            ([64, 128], 0, 1, 64, 128), // b [K, N] row-major: MN-major, two strips
            ([32, 64], 0, 1, 32, 32),  // b, strips of 32 for N = 32 instructions
            ([64, 128], 0, 0, 64, 128), // b = trans(k): K-major
            ([128, 64], 1, 0, 64, 64), // a = trans(x): MN-major
        ];
        for (shape, k_dim, c, w, instr_mn) in cases {
            let shared = LinearLayout::nvmma_shared(&shape, 16, 2 * w, c == 0);
            let (fields, mn_major) = descriptor_fields(&shared, k_dim).expect("a descriptor");
            assert_eq!(mn_major, c != k_dim);
            let offset = shared.invert().unwrap();
            let mn_dim = 1 - k_dim;
            let base = 4096u64; // a 1024-byte aligned buffer
            for mn0 in (0..shape[mn_dim] as u32).step_by(instr_mn) {
                for k0 in (0..shape[k_dim] as u32).step_by(16) {
                    let mut origin = [0u32; 2];
                    (origin[mn_dim], origin[k_dim]) = (mn0, k0);
                    let start = base + 2 * elem_offset(&offset, &origin) as u64;
                    for mn in 0..instr_mn.min(shape[mn_dim]) as u32 {
                        for k in 0..16u32 {
                            let mut at = [0u32; 2];
                            (at[mn_dim], at[k_dim]) = (mn0 + mn, k0 + k);
                            let want = base + 2 * elem_offset(&offset, &at) as u64;
                            let got = hardware_address(start, fields, mn_major, mn as u64, k as u64);
                            assert_eq!(got, want, "{shape:?} k_dim {k_dim} c {c}: element ({mn}, {k}) of tile ({mn0}, {k0})");
                        }
                    }
                }
            }
        }
    }

    /// The accumulator tiles cover every register once, with the instruction's d order.
    #[test]
    fn accumulator_tiles_follow_the_d_fragment() {
        for (shape, warps, n) in [([64, 64], [4, 1], 64), ([128, 128], [4, 1], 128), ([128, 256], [8, 1], 256), ([64, 128], [4, 2], 64)] {
            let lc = LinearLayout::wgmma_accumulator(&shape, &warps, n);
            let t = tiles(&lc, n as u32).unwrap();
            let mut seen: Vec<usize> = t.values().flatten().copied().collect();
            seen.sort();
            assert_eq!(seen, (0..lc.num_regs()).collect::<Vec<_>>());
            for lane in 0..32u32 {
                let (g, tt) = (lane / 4, lane % 4);
                for (&(m0, n0), regs) in &t {
                    for (i, &r) in regs.iter().enumerate() {
                        let i = i as u32;
                        assert_eq!(lc.apply(r as u32, lane, 0), vec![m0 + g + 8 * ((i >> 1) & 1), n0 + 8 * (i >> 2) + 2 * tt + (i & 1)], "{shape:?} d{i} lane {lane}");
                    }
                }
            }
        }
    }
}
