//! Lowering of a `dot` to sm_90a `wgmma.mma_async` (the dot family's Hopper path, chosen
//! by [`dot_plan`](crate::passes::layout::dot_plan)): both operands stay in their
//! shared-memory buffers and the tensor cores read them through 64-bit descriptors; the
//! f32 accumulator is in registers, in the layout of
//! [`LinearLayout::wgmma_accumulator`].
//!
//! tf32 (f32 inputs, m64nNk8): the tensor cores read tf32 operands from shared memory
//! only K-major (no transpose immediates). With `b` N-contiguous (`[K, N]` row-major, a
//! matmul's usual `b`) the product is computed transposed, `cᵀ = bᵀ aᵀ`
//! ([`DotPlan::swapped`](crate::passes::layout::DotPlan)): `bᵀ` is the instruction's
//! `a`, read into registers (`ld.shared`, the register form), `aᵀ` its `b` through a
//! K-major descriptor of `a`'s buffer, and the accumulator is the instruction's read
//! transposed, a relabelling of its registers. Such a loop waits for its `wgmma`s at the
//! end of each iteration (the next iteration's reads would overwrite the registers in
//! flight: ptxas then serializes every `wgmma`, C7515); a second program on the SM
//! overlaps them. Per `dot`:
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
//! elements (`eW` bytes for `e`-byte elements, the swizzle width) along the contiguous
//! dimension, each holding its rows one after the other. Read off that layout:
//!
//! - K-major (K contiguous): an instruction reads 8-row groups of one strip; the stride
//!   byte offset is 8 rows (`8eW` bytes), the leading one unused (1). A K step (32 bytes:
//!   16 16-bit elements, 8 tf32) inside the strip moves the start address by its bytes
//!   (the hardware swizzles the sum).
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
    /// Bytes per element.
    elem: u64,
}

/// The descriptor layout of an operand whose buffer layout is `shared` (`Offset` → the
/// operand's coordinates) of `elem`-byte elements, with K its dimension `k_dim`:
/// (descriptor bits 16-63, MN-major).
pub(crate) fn descriptor_fields(shared: &LinearLayout, k_dim: usize, elem: u64) -> Option<(u64, bool)> {
    let (c, w) = super::tma::strips(shared)?;
    let rows = shared.shape[1 - c] as u64;
    let (swizzle_bytes, strip_bytes) = (elem * w, elem * w * rows);
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
        let elem = cx.f.ty(x).dtype.size() as u64;
        let (fields, mn_major) = descriptor_fields(&shared, k_dim, elem).ok_or_else(|| lower_error(format!("internal: no wgmma descriptor for the shared layout {shared}")))?;
        let offset = shared.invert().ok_or_else(|| lower_error("internal: a shared layout that is not invertible"))?;
        let i32t = cx.ctx.i32_type();
        let p = at.ptr(cx, i32t.const_zero())?;
        let mut base = cx.b.build_ptr_to_int(p, i32t, "")?;
        // This warpgroup's part: warp bits 2 and up (bits 0-1 are the warps of one group).
        for (j, coords) in warp_coords.iter().enumerate().skip(2) {
            let bytes = elem * elem_offset(&offset, coords) as u64;
            if bytes == 0 {
                continue;
            }
            let bit = cx.b.build_and(cx.b.build_right_shift(cx.warp, i32t.const_int(j as u64, false), false, "")?, i32t.const_int(1, false), "")?;
            base = cx.b.build_int_add(base, cx.b.build_int_mul(bit, i32t.const_int(bytes, false), "")?, "")?;
        }
        let i64t = cx.ctx.i64_type();
        let start = cx.b.build_int_z_extend(cx.b.build_right_shift(base, i32t.const_int(4, false), false, "")?, i64t, "")?;
        let base = cx.b.build_or(start, i64t.const_int(fields, false), "desc0")?;
        Ok(Desc { base, offset, mn_major, elem })
    }

    /// The descriptor of the instruction tile whose first element is at `coords`.
    fn at(&self, cx: &Cx<'_, 'ctx>, coords: &[u32]) -> LResult<IntValue<'ctx>> {
        let bytes = self.elem * elem_offset(&self.offset, coords) as u64;
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

/// Where the instruction's `a` comes from: a buffer (a descriptor), or `mma.sync`-style
/// fragments in registers (the register form: per 64 x K-step tile four 32-bit
/// registers, each two 16-bit elements, the first in the low half, or one tf32), per tile
/// keyed by its first row and K at warp 0.
enum OperandA<'ctx> {
    Shared(Desc<'ctx>),
    Registers(BTreeMap<(u32, u32), Vec<BasicValueEnum<'ctx>>>),
}

/// The instruction's `a` in registers: block `x` in layout `lx` (seen transposed where
/// `swap`, a `b` operand as the instruction's `a`), which is
/// [`LinearLayout::mma_v2_operand`] with all warps along M: per 64 x K-step tile, its
/// 32-bit words `a0..a3` (PTX ISA, wgmma "Register Fragments", matrix A: per warp,
/// `mma.m16n8k16`'s A fragment of its 16 rows, or `m16n8k8`'s for tf32; CuTe
/// `ALayout_64x16`). Read here, before the fence, from registers or from its buffer.
fn register_words<'ctx>(cx: &mut Cx<'_, 'ctx>, x: Value, lx: &LinearLayout, swap: bool) -> LResult<BTreeMap<(u32, u32), Vec<BasicValueEnum<'ctx>>>> {
    let d = cx.f.ty(x).dtype;
    let mut regs = super::memory::Operand::new(cx, x, lx)?;
    let la = if swap { lx.permute(&[1, 0]) } else { lx.clone() };
    let tiles = a_tiles(&la, d == DType::F32)?;
    let per_word = 4 / d.size();
    let mut out = BTreeMap::new();
    for (key, rs) in tiles {
        let mut words = vec![];
        for w in rs.chunks(per_word) {
            let xs = w.iter().map(|&r| regs.get(cx, r)).collect::<LResult<Vec<_>>>()?;
            words.push(super::dot::word(cx, d, &xs)?);
        }
        out.insert(key, words);
    }
    Ok(out)
}

/// Per 64 x K-step tile of the instruction's `a` fragments in layout `la` (keyed by its
/// first row and K at warp 0), the register of each element in the order of the words
/// `a0..a3`: tf32 `(g, t), (g+8, t), (g, t+4), (g+8, t+4)`; 16-bit `(g, 2t), (g, 2t+1),
/// (g+8, 2t), (g+8, 2t+1), (g, 2t+8), ..`, two a word. At warp 0, rows 0..16 of each
/// 64-row tile.
fn a_tiles(la: &LinearLayout, tf32: bool) -> LResult<BTreeMap<(u32, u32), Vec<usize>>> {
    if tf32 {
        super::dot::tiles(la, 64, 8, |r, c| (r < 16).then_some((r >> 3) as usize + 2 * (c >> 2) as usize), 4)
    } else {
        super::dot::tiles(la, 64, 16, |r, c| (r < 16).then_some((c & 1) as usize + 2 * (r >> 3) as usize + 4 * (c >> 3) as usize), 8)
    }
}

/// `dot` `v` as `wgmma` m64nNk16 (16-bit inputs) or m64nNk8 (tf32), `N = n`, accumulating
/// in layout `lc`: `a` from its buffer, or from registers in layout `la`.
///
/// `swapped` (tf32 with `b` N-contiguous, which the tensor cores cannot read: tf32
/// operands in shared memory must be K-major) computes `cᵀ = bᵀ aᵀ`: `bᵀ` is the
/// instruction's `a`, from registers (`b` in layout `lb`), and `aᵀ` its `b`, a
/// K-major descriptor of `a`'s buffer; the accumulator `lc` is the instruction's
/// transposed ([`DotPlan::swapped`](crate::passes::layout::DotPlan)).
pub fn dot<'ctx>(cx: &mut Cx<'_, 'ctx>, v: Value, n: usize, [la, lb, lc]: &[LinearLayout; 3], swapped: bool) -> LResult<Regs<'ctx>> {
    let f = cx.f;
    let Op::Dot { a, b, acc, .. } = f.inst(v).op else { unreachable!() };
    let (ty, k_step) = match f.ty(a).dtype {
        DType::BF16 => ("bf16", 16),
        DType::F16 => ("f16", 16),
        DType::F32 => ("tf32", 8),
        d => return Err(lower_error(format!("internal: wgmma of {d} inputs"))),
    };
    let k = f.ty(a).shape[1] as u32;
    // A `zeros` accumulator is never read: each tile's first K step runs with the scale-d
    // flag 0 (`D = A B`), so no instruction writes the registers before the `wgmma`s (ptxas
    // serializes `wgmma`s when other instructions define their accumulators while one is
    // in flight, C7515), as Triton does for a zero-initialized `tt.dot`.
    let zero_acc = f.is_zero(acc);
    let mut rc = if zero_acc { vec![cx.ctx.f32_type().get_undef().into(); lc.num_regs()] } else { cx.get(acc, lc)? };
    // What each warp bit adds to the coordinates of `a` ([M, K]) and `b` ([K, N]).
    let (wa, wb): (Vec<Vec<u32>>, Vec<Vec<u32>>) = lc.bases(InDim::Warp).iter().map(|w| (vec![w[0], 0], vec![0, w[1]])).unzip();
    // The instruction's operands, and its accumulator's layout.
    let (da, db, hw) = if swapped {
        (OperandA::Registers(register_words(cx, b, lb, true)?), Desc::new(cx, a, 1, &wa)?, lc.permute(&[1, 0]))
    } else {
        let da = match f.inst(a).op {
            Op::LocalLoad(_) => OperandA::Shared(Desc::new(cx, a, 1, &wa)?),
            _ => OperandA::Registers(register_words(cx, a, la, false)?),
        };
        (da, Desc::new(cx, b, 0, &wb)?, lc.clone())
    };
    let tiles = tiles(&hw, n as u32)?;
    let (i32t, i64t, f32t) = (cx.ctx.i32_type(), cx.ctx.i64_type(), cx.ctx.f32_type());
    let half = n / 2;
    let ret = cx.ctx.struct_type(&vec![f32t.into(); half], false);
    let outs = (0..half).map(|i| format!("${i}")).collect::<Vec<_>>().join(", ");
    // Operands after the outputs: `a` (a descriptor, or four words), `b`'s descriptor, the
    // scale-d flag, then the accumulators tied to the outputs.
    let (a_types, a_text, a_constraints): (Vec<BasicMetadataTypeEnum>, String, Vec<String>) = match &da {
        OperandA::Shared(_) => (vec![i64t.into()], format!("${half}"), vec!["l".into()]),
        OperandA::Registers(_) => (vec![i32t.into(); 4], format!("{{${half}, ${}, ${}, ${}}}", half + 1, half + 2, half + 3), vec!["r".into(); 4]),
    };
    let (desc_b, flag) = (half + a_types.len(), half + a_types.len() + 1);
    // The transpose immediates: 16-bit inputs only (tf32 operands are K-major, which the
    // plan checked: a disagreement is a compiler bug, not a silent transpose), and none
    // for `a` in registers.
    let tb = u8::from(db.mn_major);
    if k_step == 8 && (db.mn_major || matches!(&da, OperandA::Shared(d) if d.mn_major)) {
        return Err(lower_error("internal: a tf32 wgmma operand in shared memory that is not K-major"));
    }
    let immediates = match &da {
        _ if k_step == 8 => "1, 1".to_string(),
        OperandA::Shared(d) => format!("1, 1, {}, {tb}", u8::from(d.mn_major)),
        OperandA::Registers(_) => format!("1, 1, {tb}"),
    };
    let params: Vec<BasicMetadataTypeEnum> = [a_types, vec![i64t.into(), i32t.into()], vec![f32t.into(); half]].concat();
    let fty = ret.fn_type(&params, false);
    let text = format!("{{\n.reg .pred p;\nsetp.ne.b32 p, ${flag}, 0;\nwgmma.mma_async.sync.aligned.m64n{n}k{k_step}.f32.{ty}.{ty} {{{outs}}}, {a_text}, ${desc_b}, p, {immediates};\n}}");
    let constraints = [vec!["=f".to_string(); half], a_constraints, vec!["l".into(), "r".into()], (0..half).map(|i| i.to_string()).collect()].concat().join(",");
    let mma = cx.ctx.create_inline_asm(fty, text, constraints, true, false, None, false);
    // A turn begun waits here, after whatever barrier the operands needed.
    super::tma::take_turn(cx)?;
    cx.asm_statement("wgmma.fence.sync.aligned;")?;
    for k0 in (0..k).step_by(k_step as usize) {
        for (&(m0, n0), regs) in &tiles {
            let mut args: Vec<BasicMetadataValueEnum> = match &da {
                OperandA::Shared(d) => vec![d.at(cx, &[m0, k0])?.into()],
                OperandA::Registers(words) => {
                    let w = words.get(&(m0, k0)).ok_or_else(|| lower_error(format!("internal: no a fragment for rows {m0}, k {k0}")))?;
                    w.iter().map(|&x| x.into()).collect()
                }
            };
            // The instruction's `b` tile at (k0, n0): `a`'s rows n0.. when swapped.
            let at_b = if swapped { [n0, k0] } else { [k0, n0] };
            args.push(db.at(cx, &at_b)?.into());
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
    /// MN-major, for `eb`-byte elements: the canonical layouts of CUTLASS's `make_gmma_desc` (in 16-byte units,
    /// K-major `((8, m), 2) : ((W, SBO), 1)`, MN-major `((W, m), (8, k)) : ((1, LBO),
    /// (W, SBO))`, `W` the swizzle width in 16-byte chunks) followed by the swizzle on the
    /// absolute address (`Swizzle<log2 W, 4, 3>`: bits 4.. XOR bits 7..).
    fn hardware_address(start: u64, fields: u64, mn_major: bool, eb: u64, mn: u64, k: u64) -> u64 {
        let w = match fields >> 62 {
            1 => 8,
            2 => 4,
            3 => 2,
            _ => unreachable!(),
        };
        let (lbo, sbo) = (((fields >> 16) & 0x3fff) << 4, ((fields >> 32) & 0x3fff) << 4);
        let (e, chunk) = (16 / eb, 16); // elements per chunk, bytes per chunk
        let linear = if mn_major {
            let (c, g) = (mn / e, mn / (e * w));
            start + (mn % e) * eb + (c % w) * chunk + g * lbo + (k % 8) * w * chunk + (k / 8) * sbo
        } else {
            start + (k % e) * eb + (k / e) * chunk + (mn % 8) * w * chunk + (mn / 8) * sbo
        };
        let bits = w.trailing_zeros() as u64;
        linear ^ (((linear >> 7) & ((1 << bits) - 1)) << 4)
    }

    /// For every operand buffer the layout pass can make (row- or column-major `a` and
    /// `b`, 128/64/32-byte swizzles, several strips; 16-bit, and tf32 K-major: `a`, `b`
    /// read transposed, and `aᵀ` as a swapped product's `b`), every element of every instruction
    /// tile and K step is where the descriptor says it is: the descriptor read off our
    /// layout addresses exactly the layout's offsets.
    #[test]
    fn descriptors_address_every_element_where_the_layout_puts_it() {
        // (operand shape [rows, cols] as the dot sees it, K dim, contiguous dim, strip
        // width, instruction extent along MN, bytes per element)
        let cases = [
            ([128, 64], 1, 1, 64, 64, 2), // a, K-major, 128B
            ([64, 32], 1, 1, 32, 64, 2),  // a, K-major, 64B
            ([64, 16], 1, 1, 16, 64, 2),  // a, K-major, 32B
            ([64, 128], 0, 1, 64, 128, 2), // b [K, N] row-major: MN-major, two strips
            ([32, 64], 0, 1, 32, 32, 2),  // b, strips of 32 for N = 32 instructions
            ([64, 128], 0, 0, 64, 128, 2), // b = trans(k): K-major
            ([128, 64], 1, 0, 64, 64, 2), // a = trans(x): MN-major
            ([128, 32], 1, 1, 32, 64, 4), // tf32 a, K-major, 128B
            ([128, 64], 1, 1, 32, 128, 4), // tf32 aᵀ as a swapped product's b (N = 128), two strips
            ([32, 128], 0, 0, 32, 128, 4), // tf32 b = trans(x): K-major
            ([64, 16], 1, 1, 16, 64, 4),  // tf32 a, 64B
        ];
        for (shape, k_dim, c, w, instr_mn, eb) in cases {
            let shared = LinearLayout::nvmma_shared(&shape, 8 * eb as u32, eb as usize * w, c == 0);
            let (fields, mn_major) = descriptor_fields(&shared, k_dim, eb).expect("a descriptor");
            assert_eq!(mn_major, c != k_dim);
            let offset = shared.invert().unwrap();
            let mn_dim = 1 - k_dim;
            let base = 4096u64; // a 1024-byte aligned buffer
            for mn0 in (0..shape[mn_dim] as u32).step_by(instr_mn) {
                let k_step = 32 / eb as u32;
                for k0 in (0..shape[k_dim] as u32).step_by(k_step as usize) {
                    let mut origin = [0u32; 2];
                    (origin[mn_dim], origin[k_dim]) = (mn0, k0);
                    let start = base + eb * elem_offset(&offset, &origin) as u64;
                    for mn in 0..instr_mn.min(shape[mn_dim]) as u32 {
                        for k in 0..k_step {
                            let mut at = [0u32; 2];
                            (at[mn_dim], at[k_dim]) = (mn0 + mn, k0 + k);
                            let want = base + eb * elem_offset(&offset, &at) as u64;
                            let got = hardware_address(start, fields, mn_major, eb, mn as u64, k as u64);
                            assert_eq!(got, want, "{shape:?} k_dim {k_dim} c {c}: element ({mn}, {k}) of tile ({mn0}, {k0})");
                        }
                    }
                }
            }
        }
    }

    /// A swapped tf32 product's register operand (`bᵀ`, from `b`'s fragments read
    /// transposed) and accumulator (`cᵀ`): in every lane of every warp, the words `a0..a3`
    /// of each 64 x 8 tile hold `bᵀ`'s elements where the PTX tables put them, and the
    /// transposed accumulator's `d` registers `c`'s elements (row and column swapped).
    #[test]
    fn swapped_tf32_fragments_are_the_transposed_instructions() {
        for (hw, warps, n) in [([128, 128], [4, 1], 128), ([256, 128], [8, 1], 128), ([128, 64], [4, 1], 64)] {
            let (nn, m) = (hw[0], hw[1]);
            let k = 32;
            // `b`'s layout [K, N] as the plan gives it, and the instruction's view of it.
            let lb = LinearLayout::mma_v2_operand(0, &[nn, k], &warps, 32).permute(&[1, 0]);
            let la = lb.permute(&[1, 0]);
            let t = a_tiles(&la, true).unwrap();
            let mut seen: Vec<usize> = t.values().flatten().copied().collect();
            seen.sort();
            assert_eq!(seen, (0..la.num_regs()).collect::<Vec<_>>(), "every register once");
            for w in 0..warps[0] as u32 {
                for lane in 0..32u32 {
                    let (g, tt) = (lane / 4, lane % 4);
                    for (&(r0, k0), regs) in &t {
                        for (i, &r) in regs.iter().enumerate() {
                            let i = i as u32;
                            // bᵀ's element (row, k): warp w's 16 rows of each tile.
                            let (row, kk) = (r0 + 16 * w + g + 8 * (i & 1), k0 + tt + 4 * (i >> 1));
                            assert_eq!(lb.apply(r as u32, lane, w), vec![kk, row], "{hw:?} warp {w} lane {lane} a{i}");
                        }
                    }
                }
            }
            let lc = LinearLayout::wgmma_accumulator(&[nn, m], &warps, n).permute(&[1, 0]);
            let tc = tiles(&lc.permute(&[1, 0]), n as u32).unwrap();
            for lane in 0..32u32 {
                let (g, tt) = (lane / 4, lane % 4);
                for (&(r0, c0), regs) in &tc {
                    for (i, &r) in regs.iter().enumerate() {
                        let i = i as u32;
                        let (row, col) = (r0 + g + 8 * ((i >> 1) & 1), c0 + 8 * (i >> 2) + 2 * tt + (i & 1));
                        assert_eq!(lc.apply(r as u32, lane, 0), vec![col, row], "{hw:?} d{i} lane {lane}");
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
