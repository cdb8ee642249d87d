//! Software pipelining (`num_stages` of a launch): the global loads of a `for` loop
//! that only feed shared memory (the tensor-core operands [`stage`](super::stage) put
//! there) are issued `num_stages - 1` iterations ahead as asynchronous copies
//! (`cp.async`) into a ring of `num_stages` buffers, so that the loads of later
//! iterations are in flight while this one multiplies. Triton's `tritongpu-pipeline`
//! does the same for `tt.load` → `ttg.local_alloc` → `tt.dot`.
//!
//! For a loop `for k in (start..end).step_by(step)` (`step` a positive constant) whose
//! body holds `x = load(ptr(k), mask(k), 0)` and `buf = local_alloc(x)` read only by
//! `local_load`s, with `ptr` and `mask` computed in the body from `k` and values defined
//! before the loop only, and the load movable in vectors of at least 4 bytes
//! (`cp.async`'s smallest):
//!
//! ```text
//! ring = local_alloc [S, ..]                       // S = num_stages
//! for s in 0..S-1:                                 // prologue
//!     async_copy local_slot(ring, s), ptr(start + s*step), mask(..) & (start + s*step < end)
//!     async_commit
//! for k in ...:
//!     async_wait S-2                               // iteration i's copies have landed
//!                                                  // (and a barrier: everyone's have)
//!     i = (k - start) / step
//!     ... local_load local_slot(ring, i % S) ...   // in place of local_load buf
//!     async_copy local_slot(ring, (i + S-1) % S), ptr(k + (S-1)*step), mask(..) & (.. < end)
//!     async_commit                                 // after the stage's last read
//!     ... dot ...
//! async_wait 0                                     // nothing in flight after the loop
//! ```
//!
//! On sm_90a a `dot` that takes `wgmma` ([`layout::wgmma_shape`](super::layout::wgmma_shape))
//! reads its stages where it is, asynchronously: the copies go right after the `dot`, so
//! that they are issued while the tensor cores work (the lowering waits for the `wgmma`
//! only where its result is used, [`lower::wgmma`](crate::lower::wgmma)). When it
//! reads both operands from shared memory, yields its accumulator and the ring fits sm_90's shared memory with one more stage,
//! the ring gets `S + 1` stages: the copy of iteration `i` writes stage `(i - 2) % (S + 1)`,
//! so iteration `i - 1`'s `wgmma`s may still be running (`wait_group 1` ends each
//! body; [`run`] returns these dots, the lowering's `Plan::overlapped`). Iteration
//! `i - 2`'s finished before its warpgroup's `wait_group 1` in iteration `i - 1`, which
//! every warpgroup passed before this iteration's barrier.
//!
//! Why no other barrier is needed: the stage a copy writes in iteration `i`,
//! `(i - 1) % S`, was last read in iteration `i - 1`, before the barrier of iteration
//! `i`'s `async_wait`, which every thread passed before issuing the copy. Copies past
//! the end of the loop are masked off entirely (they only zero their stage) and are
//! waited for after the loop. The masks keep the guard's bounds checks, since the guard
//! runs before this pass.
//!
//! Addresses may also come from pointers the loop carries and advances by a loop-invariant
//! step (`ptrs = ptrs + step`, Triton's tutorial style): the copy for `d` iterations on
//! uses `ptrs + d * step` (the prologue: the initial pointer plus `s * step`).
//!
//! With TMA (sm_90a, `LaunchConfig::tma`): where every pipelined load of the loop is a
//! matrix tile [`tma`](super::tma) recognises, read only by `wgmma`s, the copies are TMA
//! copies issued by one thread, and the stages are tracked by mbarriers instead of
//! `cp.async` groups:
//!
//! ```text
//! bars = local_alloc i64[S]; mbar_init bars, <loads>      // before each run of the loop
//! for s in 0..S-1: tma_copy stage s, .., bar s, on (start + s*step < end)
//! for k in ...:
//!     mbar_wait bars[i % S], phase (i / S) % 2, sync      // then the barrier
//!     ... dot ...
//!     tma_copy stage (i + S-1) % S, .., on (k < end - (S-1)*step)
//! mbar_wait for the last S-1 fills                        // nothing in flight after
//! ```
//!
//! A copy for an iteration past the end (`on` false) only arrives at its barrier, so every
//! fill completes a phase and the parities stay in step; the tensor map parameters are
//! appended to the kernel's ([`Plan::tma`](super::layout::Plan) lists them).
//!
//! Warp specialization (`LaunchConfig::warp_specialize`): the first TMA loop at the top
//! level of a program that returns nowhere, whose copies' coordinates come from the
//! counter and from scalars computed before it out of parameters and program ids, gets a
//! producer (`Op::WarpSpecialize`; the launch adds its warpgroup):
//!
//! ```text
//! <the scalars the producer reads>; ring; full = mbar_init(loads); empty = mbar_init(num_warps)
//! warp_specialize producer {                            // one thread
//!     for k in ...:
//!         mbar_wait empty[i % S], phase (i / S + 1) % 2 // given back (a fresh one passes)
//!         tma_copy stage i % S, .., bar full[i % S]
//! } consumer {                                          // the num_warps warps: the rest
//!     ...
//!     for k in ...:
//!         mbar_wait full[i % S], phase (i / S) % 2      // no barrier
//!         ... dot ...
//!         mbar_arrive empty[i % S]                      // each warp, its reads complete
//!     ...
//! }
//! ```
//!
//! No prologue and no drain: the producer copies exactly the loop's iterations. A `dot`
//! left in flight into the next iteration gives back the previous iteration's stage
//! instead (from the second iteration on), so the ring needs no stage of slack. With two
//! consumer warpgroups and more than one `wgmma` a step, the warpgroups take turns at the
//! products issued before the first one's result is read (`turn_begin`/`turn_end`: one's
//! `q k^T`, or `q k^T` and the previous tile's `p v`, issued while the other's softmax
//! runs).
//!
//! What it does not do yet: other carried values in the addresses, loads with a nonzero
//! `other`, a second pipelined loop nested in the first, and warp specialization of a loop
//! inside another (the producer would have to run the outer loop too). Runs in
//! [`plan`](super::plan), so the interpreter runs the kernel as written.

use super::axis_info::{analyze, max_access_width_along, AxisInfo};
use super::tma::Matched;
use crate::ir::{BinOp, CmpOp, ConstVal, Function, HostInt, Loc, Op, Type, Value};
use crate::DType;
use std::collections::{HashMap, HashSet};

/// Pipeline the loops of `f` `num_stages` deep. `wgmma`: the target takes sm_90a's
/// `wgmma` for the dots that fit it (on `num_warps` warps), so their loops issue their
/// copies after the `dot` (see the module docs).
pub fn run(f: &mut Function, num_stages: u32, num_warps: usize, wgmma: bool, tma: bool, specialize: bool) -> HashSet<Value> {
    if num_stages < 2 {
        return HashSet::new();
    }
    let axis = analyze(f);
    // Decided on the whole function, before its body is taken apart.
    let on_wgmma = if wgmma { super::layout::wgmma_dots(f, num_warps) } else { Default::default() };
    // A `dot` whose `a` is read into registers (a swapped tf32 one) is not overlapped with
    // the next iteration: its reads would write the registers the tensor cores are still
    // reading, and ptxas serializes every `wgmma` of the kernel (C7515).
    let in_registers = on_wgmma.iter().filter(|(_, s)| s.swapped).map(|(&v, _)| v).collect();
    let wgmma_dots = on_wgmma.into_keys().collect();
    // A program that may return early would leave its producer waiting for stages no
    // consumer gives back.
    let returns = f.walk().into_iter().any(|v| matches!(f.inst(v).op, Op::Return));
    let body = std::mem::take(&mut f.body.insts);
    let specialize = wgmma && tma && specialize && !returns && num_warps + super::PRODUCER_WARPS <= 32;
    let mut target = Target { stages: num_stages as i64, wgmma_dots, in_registers, overlapped: HashSet::new(), tma: wgmma && tma, specialize, num_warps, specialized: None };
    f.body.insts = block(f, &axis, body, &mut target, 0);
    if let Some(ws) = target.specialized.take() {
        split(f, ws);
    }
    // The pipelined loads' address computations for the current iteration are dead now.
    super::simplify::dce(f);
    target.overlapped
}

/// The top level of a program whose loop was warp-specialized: the values the producer
/// reads and the loop's buffers and barriers first (everyone computes them), then
/// `warp_specialize` with the producer's loop and, as the consumer, the rest in order.
fn split(f: &mut Function, ws: Specialized) {
    let top = std::mem::take(&mut f.body.insts);
    let (before, consumer): (Vec<Value>, Vec<Value>) = top.into_iter().partition(|v| ws.hoist.contains(v) || ws.setup.contains(v));
    let loc = f.inst(ws.producer).loc;
    let region = |insts: Vec<Value>| crate::ir::Region { args: vec![], body: crate::ir::Block { insts }, yields: vec![] };
    let op = Op::WarpSpecialize { producer: region(vec![ws.producer]), consumer: region(consumer) };
    let v = f.push(op, Type::unit(), loc);
    f.body.insts = before.into_iter().chain([v]).collect();
}

/// A loop [`pipeline`] warp-specialized: what [`split`] needs.
struct Specialized {
    /// The producer's loop (not placed yet).
    producer: Value,
    /// The top-level values it reads (scalars, computed before the split).
    hoist: HashSet<Value>,
    /// The rings, barriers and tensor maps (before the split).
    setup: HashSet<Value>,
}

/// Whether `num_stages` may change `f`'s code: some loop multiplies tensor-core operands
/// (16-bit, or f32 at "tf32", which [`stage`](super::stage) puts in shared memory, from
/// where their loads can be pipelined), or loads at its top level (what
/// [`prefetch`](super::prefetch) may issue an iteration ahead). Decided on the
/// unspecialized kernel, so conservatively.
pub fn may_pipeline(f: &Function) -> bool {
    f.walk().into_iter().any(|v| match &f.inst(v).op {
        Op::For { body, .. } => body.body.insts.iter().any(|&w| super::stage::stageable(f, w) || matches!(f.inst(w).op, Op::Load { .. })),
        _ => false,
    })
}

/// The most shared memory a program may have on sm_90 (227 KiB; the H100 and the H200).
pub const SM90_SHARED_BYTES: usize = 232_448;

/// What the pipelined code is for: the depth and the dots that take `wgmma`; and what it
/// found: the `wgmma` dots whose loops got a stage of slack ([`run`]'s result).
struct Target {
    stages: i64,
    wgmma_dots: HashSet<Value>,
    /// Those of them whose `a` is read into registers next to them.
    in_registers: HashSet<Value>,
    overlapped: HashSet<Value>,
    /// Loads of `wgmma` operands may become TMA copies ([`tma`](super::tma)).
    tma: bool,
    /// A top-level TMA loop may be warp-specialized (one a program).
    specialize: bool,
    num_warps: usize,
    specialized: Option<Specialized>,
}

fn block(f: &mut Function, axis: &[AxisInfo], insts: Vec<Value>, target: &mut Target, depth: usize) -> Vec<Value> {
    let mut out = Vec::with_capacity(insts.len());
    for u in insts {
        for i in 0..f.inst(u).op.regions().len() {
            let inner = std::mem::take(&mut f.values[u.index()].op.regions_mut()[i].body.insts);
            let inner = block(f, axis, inner, target, depth + 1);
            f.values[u.index()].op.regions_mut()[i].body.insts = inner;
        }
        match candidates(f, axis, u) {
            Some(c) if !c.is_empty() => pipeline(f, u, &c, target, &mut out, depth),
            _ => out.push(u),
        }
    }
    out
}

/// One pipelined load: the `local_alloc` of its value, the load, and the instructions of
/// the body that compute its pointers and mask (in body order).
struct Candidate {
    alloc: Value,
    load: Value,
    slice: Vec<Value>,
    /// Carried pointers the addresses use, each advanced by a loop-invariant step every
    /// iteration (`p = p + step`, Triton's tutorial style): (the loop argument, its index
    /// among the carried values, the step).
    carried: Vec<Carried>,
}

/// A carried pointer: the loop argument, its index among the carried values, its step.
pub(super) type Carried = (Value, usize, Value);

fn int_const(f: &Function, v: Value) -> Option<i64> {
    match f.inst(v).op {
        Op::Const(ConstVal::Int(x)) => Some(x),
        _ => None,
    }
}

/// The loads of loop `u` to pipeline (`None` when `u` is no loop of the supported form).
fn candidates(f: &Function, axis: &[AxisInfo], u: Value) -> Option<Vec<Candidate>> {
    let Op::For { step, body, .. } = &f.inst(u).op else { return None };
    if int_const(f, *step)? <= 0 {
        return None;
    }
    let here: HashSet<Value> = body.body.insts.iter().copied().collect();
    // The users of the body's values are in the body (its nested regions included) or are
    // the loop's yields. (Not `f.walk()`: the block being rewritten is out of `f` now.)
    let inside = f.walk_from(&body.body.insts);
    // A body that writes global memory might write what a later iteration loads (the copy
    // issued ahead would read it stale), and a loop holding a pipelined loop would only
    // see its copies drained by the inner `async_wait 0`: neither is pipelined. Stores and
    // relaxed atomics to a buffer that no load of the body reads are safe (an accumulation:
    // attention's atomic backward): a launch passes a buffer it writes in no other
    // parameter (`&mut`). An acquire-release atomic is not: a load after it may rely on
    // its ordering (a flag another program sets before its data), and a copy issued ahead
    // would not.
    let root = |p: Value| f.pointer_root(p);
    let written: Option<HashSet<u32>> = inside.iter().filter_map(|&w| match f.inst(w).op { Op::Store { ptr, .. } | Op::Atomic { ptr, .. } => Some(root(ptr)), _ => None }).collect();
    let read: Option<HashSet<u32>> = inside
        .iter()
        .filter_map(|&w| match &f.inst(w).op {
            Op::Load { ptr, .. } | Op::AsyncCopy { ptr, .. } => Some(root(*ptr)),
            Op::TmaCopy { tile, .. } | Op::TmaStore { tile, .. } => Some(Some(tile.ptr)),
            _ => None,
        })
        .collect();
    let (Some(written), Some(read)) = (written, read) else { return None };
    let ordered = inside.iter().any(|&w| matches!(f.inst(w).op, Op::Atomic { relaxed: false, .. } | Op::AsyncCommit));
    if !written.is_disjoint(&read) || ordered {
        return None;
    }
    let mut users = f.users_in(&body.body.insts);
    for &y in &body.yields {
        users.entry(y).or_default().push(u);
    }
    let mut out = vec![];
    for &a in &body.body.insts {
        let Op::LocalAlloc(Some(x)) = f.inst(a).op else { continue };
        let Op::Load { ptr, mask, other } = f.inst(x).op else { continue };
        let only = |v: Value, ok: &dyn Fn(Value) -> bool| users.get(&v).is_some_and(|us| us.iter().all(|&w| ok(w)));
        // Read directly or through a transposed view (`trans(x)` staged).
        let read = |w: Value| here.contains(&w) && (matches!(f.inst(w).op, Op::LocalLoad(_)) || matches!(f.inst(w).op, Op::LocalTrans(_)) && only(w, &|r| matches!(f.inst(r).op, Op::LocalLoad(_)) && here.contains(&r)));
        if !here.contains(&x) || !other.is_none_or(|o| f.is_zero(o)) || !only(x, &|w| w == a) || !only(a, &read) {
            continue;
        }
        // cp.async moves 4, 8 or 16 bytes: the vector the access will get must be one. And
        // a stage is addressed by its linear layout, over a shape of powers of two.
        let t = f.ty(ptr);
        if t.padded_shape() != t.shape {
            continue;
        }
        // Along its contiguous dimension, whichever it is (the layout pass picks the same).
        let vector = |d: usize| {
            let tiling = t.shape[d] & t.shape[d].wrapping_neg();
            let ideal = (16 / t.dtype.size()).min(axis[ptr.index()].contiguity[d] as usize).min(tiling);
            ideal.min(max_access_width_along(f, axis, ptr, mask, d).min(tiling))
        };
        if t.shape.is_empty() || (0..t.shape.len()).map(vector).max().unwrap_or(1) * t.dtype.size() < 4 {
            continue;
        }
        let Some((slice, carried)) = slice(f, u, [Some(ptr), mask].into_iter().flatten().collect()) else { continue };
        out.push(Candidate { alloc: a, load: x, slice, carried });
    }
    Some(out)
}

/// The body instructions of loop `u` that `roots` depend on, in an order that clones them
/// correctly (loop-invariant ones first, then body order), and the carried pointers among
/// their inputs; `None` when one of them is not a cheap pure operation or depends on a
/// carried value other than a pointer advanced by a loop-invariant step.
pub(super) fn slice(f: &Function, u: Value, roots: Vec<Value>) -> Option<(Vec<Value>, Vec<Carried>)> {
    let Op::For { body, .. } = &f.inst(u).op else { return None };
    let ind = body.args[0];
    let here: HashSet<Value> = body.body.insts.iter().copied().collect();
    let mut seen: HashSet<Value> = HashSet::new();
    let mut carried = vec![];
    let mut stack = roots;
    while let Some(v) = stack.pop() {
        if v == ind || !seen.insert(v) {
            continue;
        }
        match f.inst(v).op {
            Op::Arg(owner, i) if owner == u && i >= 1 => {
                // `p` carried as `p + step` with `step` computed from loop invariants only.
                let Op::AddPtr(p, step) = f.inst(body.yields[i as usize - 1]).op else { return None };
                if p != v || depends_on_loop(f, &here, body, step) {
                    return None;
                }
                carried.push((v, i as usize - 1, step));
                stack.push(step); // `v` stays seen: one entry per carried pointer

            }
            // An enclosing loop's counter or carried value is fixed during this loop.
            _ if !here.contains(&v) && !matches!(f.inst(v).op, Op::Arg(owner, _) if owner == u) => {
                seen.remove(&v); // defined before the loop: used as is
                continue;
            }
            Op::Const(_)
            | Op::Splat(_)
            | Op::Arange { .. }
            | Op::Binary(..)
            | Op::Cmp(..)
            | Op::Unary(..)
            | Op::Select(..)
            | Op::Fma(..)
            | Op::Cast(_)
            | Op::ExpandDims(..)
            | Op::Broadcast(_)
            | Op::AddPtr(..)
            | Op::PtrOffset(_) => stack.extend(f.inst(v).op.operands()),
            _ => return None,
        }
    }
    let (invariant, variant): (Vec<Value>, Vec<Value>) = body.body.insts.iter().copied().filter(|v| seen.contains(v)).partition(|&v| !depends_on_loop(f, &here, body, v));
    Some((invariant.into_iter().chain(variant).collect(), carried))
}

/// Whether body value `v` depends on the loop's counter or carried values.
pub(super) fn depends_on_loop(f: &Function, here: &HashSet<Value>, body: &crate::ir::Region, v: Value) -> bool {
    let mut stack = vec![v];
    let mut seen = HashSet::new();
    while let Some(x) = stack.pop() {
        if body.args.contains(&x) {
            return true;
        }
        if here.contains(&x) && seen.insert(x) {
            stack.extend(f.inst(x).op.operands());
        }
    }
    false
}

fn pipeline(f: &mut Function, u: Value, cands: &[Candidate], target: &mut Target, out: &mut Vec<Value>, depth: usize) {
    let stages = target.stages;
    let setup_from = out.len();
    let Op::For { start, end, step, body, init } = f.inst(u).op.clone() else { unreachable!() };
    // A `wgmma` dot reading the ring and yielding its accumulator (used nowhere else in
    // the body, and carried into the next iteration's `dot` alone: attention rescales its
    // accumulator first, which must wait for it), with `a` from shared memory too (`a` in
    // registers would be read by the tensor cores while the next iteration computes its
    // own: ptxas serializes every `wgmma` of such a loop, its C7515, as measured on
    // attention's dQ kernel), may stay in flight into the next
    // iteration: the ring gets one stage more
    // (`S + 1`, as Triton gives an asynchronous MMA v3 one more buffer), so that the
    // copies, still `S - 1` iterations ahead, go to the stage read two iterations back,
    // which `wait_group 1` and this iteration's barrier have released.
    let allocs: HashSet<Value> = cands.iter().map(|c| c.alloc).collect();
    let reads_ring = |f: &Function, x: Value| matches!(f.inst(x).op, Op::LocalLoad(b) if allocs.contains(&f.buffer_root(b)));
    let users = f.users_in(&body.body.insts);
    let overlapped: Vec<Value> = body
        .body
        .insts
        .iter()
        .copied()
        .filter(|&w| {
            target.wgmma_dots.contains(&w)
                && !target.in_registers.contains(&w)
                && matches!(f.inst(w).op, Op::Dot { a, b, .. } if (reads_ring(f, a) || reads_ring(f, b)) && matches!(f.inst(a).op, Op::LocalLoad(_)))
                && users.get(&w).is_none_or(|u| u.is_empty())
                && body.yields.iter().position(|&y| y == w).is_some_and(|i| users.get(&body.args[i + 1]).is_some_and(|u| u.as_slice() == [w]))
        })
        .collect();
    // Only where the larger ring still fits a program's shared memory on sm_90 (a tile
    // that fits with `S` stages but not `S + 1` keeps `S` and waits at depth 0).
    let stage_bytes: usize = cands.iter().map(|c| f.ty(c.load).shape.iter().product::<usize>() * f.ty(c.load).dtype.size()).sum();
    let fits = (stages as usize + 1) * stage_bytes <= SM90_SHARED_BYTES;
    let slack = i64::from(!overlapped.is_empty() && fits);
    if slack == 1 {
        target.overlapped.extend(overlapped.iter().copied());
    }
    // TMA copies where every candidate is a tile TMA can load ([`tma`](super::tma)) that
    // only `wgmma`s read (the tensor cores and TMA both go through the async proxy:
    // no fence between them). A loop inside another initializes its barriers before each
    // run: the waits after the previous run, and their barrier, left none in use.
    let tma: Option<Vec<Matched>> = if target.tma {
        cands
            .iter()
            .map(|c| {
                let m = super::tma::match_load(f, c.load)?;
                let reads: Vec<Value> = body.body.insts.iter().copied().filter(|&w| matches!(f.inst(w).op, Op::LocalLoad(b) if f.buffer_root(b) == c.alloc)).collect();
                let by_wgmma = |x: Value| users.get(&x).is_some_and(|us| us.iter().all(|w| target.wgmma_dots.contains(w) && matches!(f.inst(*w).op, Op::Dot { a, b, .. } if a == x || b == x)));
                (!reads.is_empty() && reads.iter().all(|&x| by_wgmma(x))).then_some(m)
            })
            .collect()
    } else {
        None
    };
    let tma = tma.as_deref();
    // Warp specialization: the first top-level TMA loop of the program whose copies'
    // coordinates and bounds are scalars computed before it ([`producer_inputs`]).
    let hoist = match tma {
        Some(matched) if target.specialize && depth == 0 && target.specialized.is_none() && cands.iter().all(|c| c.carried.is_empty()) => producer_inputs(f, u, matched, out),
        _ => None,
    };
    let specialized = hoist.is_some();
    // Iterations the copies run ahead, and the stages of the ring. Specialized, the
    // consumers give each stage back when its reads are done (a `dot` left in flight:
    // the previous iteration's stage), so the ring needs no stage of slack.
    let (lead, ring_len) = (stages - 1, if specialized { stages } else { stages + slack });
    if specialized && slack == 0 && !overlapped.is_empty() {
        target.overlapped.extend(overlapped.iter().copied());
    }
    let overlaps = specialized && !overlapped.is_empty();
    let step = int_const(f, step).expect("checked");
    let ind = body.args[0];
    let it = f.ty(ind).clone();
    let loc = f.inst(u).loc;
    let ints = Ints { ty: it.clone(), loc };
    let konst = |f: &mut Function, out: &mut Vec<Value>, x: i64| ints.konst(f, out, x);
    // `end - lead * step`, before the loop: iteration `i + lead` exists when `k < ` this.
    let dist = konst(f, out, lead * step);
    let last_start = f.push(Op::Binary(BinOp::Sub, end, dist), it.clone(), loc);
    out.push(last_start);
    let rings: Vec<Value> = cands
        .iter()
        .map(|c| {
            let t = f.ty(c.load).clone();
            let shape = [vec![ring_len as usize], t.shape.clone()].concat();
            let r = f.push(Op::LocalAlloc(None), Type::shared(t.dtype, shape), loc);
            out.push(r);
            r
        })
        .collect();
    // With TMA: one mbarrier a stage, completed by every candidate's copy into it, and
    // one tensor map a candidate (a parameter the launch fills in).
    let copies = match tma {
        Some(matched) => {
            let bars = f.push(Op::LocalAlloc(None), Type::shared(DType::I64, vec![ring_len as usize]), loc);
            let init = f.push(Op::MbarInit { bars, count: cands.len() as u32 }, Type::unit(), loc);
            out.extend([bars, init]);
            // Specialized: a second barrier a stage, each consumer warp arriving once it
            // has read the stage.
            let empty = specialized.then(|| {
                let empty = f.push(Op::LocalAlloc(None), Type::shared(DType::I64, vec![ring_len as usize]), loc);
                let init = f.push(Op::MbarInit { bars: empty, count: target.num_warps as u32 }, Type::unit(), loc);
                out.extend([empty, init]);
                empty
            });
            let maps = matched.iter().map(|m| super::tma::map_param(f, out, m.tile.ptr, loc)).collect();
            Copies::Tma { matched, maps, bars, empty }
        }
        None => Copies::Async,
    };
    // Prologue: stages 0..lead for the first `lead` iterations (the producer's, specialized).
    for s in (0..lead).filter(|_| !specialized) {
        let k = if s == 0 {
            start
        } else {
            let by = konst(f, out, s * step);
            let k = f.push(Op::Binary(BinOp::Add, start, by), it.clone(), loc);
            out.push(k);
            k
        };
        let slot = konst(f, out, s);
        issue(f, out, cands, &copies, Iteration { ind, k, steps: s, bases: &init, inside: (k, end) }, &rings, slot, loc);
    }
    // The body.
    let old = std::mem::take(&mut f.values[u.index()].op.regions_mut()[0].body.insts);
    let mut new = match copies {
        Copies::Async => vec![f.push(Op::AsyncWait((lead - 1) as u32), Type::unit(), loc)],
        Copies::Tma { .. } => vec![],
    };
    let bin = |f: &mut Function, new: &mut Vec<Value>, op: BinOp, a: Value, b: Value| ints.bin(f, new, op, a, b);
    let (c_start, c_step, c_stages, c_ahead, c_dist) =
        (start, konst(f, &mut new, step), konst(f, &mut new, ring_len), konst(f, &mut new, lead), konst(f, &mut new, lead * step));
    let off = bin(f, &mut new, BinOp::Sub, ind, c_start);
    let i = bin(f, &mut new, BinOp::Div, off, c_step);
    let cur = bin(f, &mut new, BinOp::Rem, i, c_stages);
    if let Copies::Tma { bars, .. } = copies {
        // Iteration `i` reads its stage's fill number `i / S`: the phase of that parity.
        let two = konst(f, &mut new, 2);
        let fill = bin(f, &mut new, BinOp::Div, i, c_stages);
        let phase = bin(f, &mut new, BinOp::Rem, fill, two);
        new.push(f.push(Op::MbarWait { bars, slot: cur, phase, sync: !specialized }, Type::unit(), loc));
    }
    let ahead = bin(f, &mut new, BinOp::Add, i, c_ahead);
    let next = bin(f, &mut new, BinOp::Rem, ahead, c_stages);
    let k_next = bin(f, &mut new, BinOp::Add, ind, c_dist);
    let allocs: HashMap<Value, Value> = cands.iter().zip(&rings).map(|(c, &r)| (c.alloc, r)).collect();
    let loads: HashSet<Value> = cands.iter().map(|c| c.load).collect();
    let last_read = old.iter().rposition(|&w| reads_ring(f, w)).expect("a candidate is read");
    // A `wgmma` reads its operands where the `dot` is and runs while the copies are issued:
    // they go after it (the lowering waits for the `wgmma` where its result is used).
    let wgmma_dot = old.iter().rposition(|&w| {
        target.wgmma_dots.contains(&w) && matches!(f.inst(w).op, Op::Dot { a, b, .. } if reads_ring(f, a) || reads_ring(f, b))
    });
    let last_read = wgmma_dot.map_or(last_read, |d| d.max(last_read));
    let mut views: HashMap<Value, Value> = HashMap::new();
    for (pos, &w) in old.iter().enumerate() {
        if loads.contains(&w) {
            continue;
        }
        if let Some(&ring) = allocs.get(&w) {
            let t = f.ty(w).clone();
            let view = f.push(Op::LocalSlot { buf: ring, slot: cur }, t, loc);
            new.push(view);
            views.insert(w, view);
            continue;
        }
        f.values[w.index()].op.map_operands(|o| views.get(&o).copied().unwrap_or(o));
        new.push(w);
        if pos == last_read && !specialized {
            issue(f, &mut new, cands, &copies, Iteration { ind, k: k_next, steps: lead, bases: &[], inside: (ind, last_start) }, &rings, next, loc);
        }
    }
    if let Copies::Tma { empty: Some(empty), .. } = copies {
        // The stage read here goes back to the producer at the end of the body; with the
        // `dot` in flight into the next iteration, the previous iteration's (from the
        // second on).
        let (slot, on) = if overlaps {
            let back = konst(f, &mut new, ring_len - 1);
            let prev = bin(f, &mut new, BinOp::Add, i, back);
            let slot = bin(f, &mut new, BinOp::Rem, prev, c_stages);
            let zero = konst(f, &mut new, 0);
            let on = f.push(Op::Cmp(CmpOp::Gt, i, zero), Type::scalar(DType::Bool), loc);
            new.push(on);
            (slot, on)
        } else {
            let on = f.push(Op::Const(ConstVal::Bool(true)), Type::scalar(DType::Bool), loc);
            new.push(on);
            (cur, on)
        };
        new.push(f.push(Op::MbarArrive { bars: empty, slot, on }, Type::unit(), loc));
        // Two consumer warpgroups and more than one product a step (attention's `q k^T`
        // and `p v`): they take turns at the products issued before the first is read,
        // so that one's softmax runs while the other's products do (FlashAttention-3's
        // ping-pong).
        let dots: Vec<usize> = new.iter().enumerate().filter(|(_, w)| target.wgmma_dots.contains(w)).map(|(i, _)| i).collect();
        if target.num_warps == 8 && dots.len() >= 2 {
            let first = new[dots[0]];
            let reads_first = |w: Value| f.walk_from(&[w]).into_iter().any(|x| f.inst(x).op.operands().contains(&first) || f.inst(x).op.regions().iter().any(|r| r.yields.contains(&first)));
            let used = new.iter().position(|&w| reads_first(w)).unwrap_or(new.len());
            let last = dots.iter().copied().filter(|&i| i < used).max().unwrap_or(dots[0]);
            let (begin, end) = (f.push(Op::Turn { begin: true }, Type::unit(), loc), f.push(Op::Turn { begin: false }, Type::unit(), loc));
            new.insert(last + 1, end);
            new.insert(dots[0], begin);
        }
    }
    f.values[u.index()].op.regions_mut()[0].body.insts = new;
    if let (Some(hoist), Copies::Tma { matched, maps, bars, empty: Some(empty) }) = (hoist, &copies) {
        let setup = out[setup_from..].iter().copied().collect();
        let producer = producer_loop(f, u, matched, maps, &rings, (*bars, *empty), ring_len, loc);
        target.specialized = Some(Specialized { producer, hoist, setup });
        out.push(u);
        return;
    }
    out.push(u);
    match copies {
        Copies::Async => out.push(f.push(Op::AsyncWait(0), Type::unit(), loc)),
        Copies::Tma { bars, .. } => {
            // Nothing in flight after the loop: the last `lead` copies (for the iterations
            // after the last, masked off or not) complete fills `n .. n + lead` with `n`
            // the number of iterations, `max(end - start, 0)` over the step rounded up.
            let span = f.push(Op::Binary(BinOp::Sub, end, start), it.clone(), loc);
            out.push(span);
            let zero = konst(f, out, 0);
            let d = f.push(Op::Binary(BinOp::Max, span, zero), it.clone(), loc);
            out.push(d);
            let round = konst(f, out, step - 1);
            let up = f.push(Op::Binary(BinOp::Add, d, round), it.clone(), loc);
            out.push(up);
            let c_step = konst(f, out, step);
            let n = f.push(Op::Binary(BinOp::Div, up, c_step), it.clone(), loc);
            out.push(n);
            let (c_stages, two) = (konst(f, out, ring_len), konst(f, out, 2));
            for j in 0..lead {
                let by = konst(f, out, j);
                let fill = f.push(Op::Binary(BinOp::Add, n, by), it.clone(), loc);
                let slot = f.push(Op::Binary(BinOp::Rem, fill, c_stages), it.clone(), loc);
                let round = f.push(Op::Binary(BinOp::Div, fill, c_stages), it.clone(), loc);
                let phase = f.push(Op::Binary(BinOp::Rem, round, two), it.clone(), loc);
                let wait = f.push(Op::MbarWait { bars, slot, phase, sync: j == lead - 1 }, Type::unit(), loc);
                out.extend([fill, slot, round, phase, wait]);
            }
        }
    }
}

/// How a pipelined loop's tiles are copied: `cp.async` in groups, or TMA copies
/// completing the stages' mbarriers `bars`, through tensor maps `maps` (one per candidate).
enum Copies<'a> {
    Async,
    Tma { matched: &'a [Matched], maps: Vec<Value>, bars: Value, empty: Option<Value> },
}

/// The top-level values the producer of loop `u` reads, where `u` may be
/// warp-specialized: the copies' coordinates computed in the body from the counter and
/// values from before the loop, and those values, with the loop's bounds, scalars
/// computed from parameters and program ids only (`out` holds the top level so far);
/// `None` otherwise.
fn producer_inputs(f: &Function, u: Value, matched: &[Matched], out: &[Value]) -> Option<HashSet<Value>> {
    let Op::For { start, end, step, body, .. } = &f.inst(u).op else { return None };
    let ind = body.args[0];
    let (inner, carried) = slice(f, u, coordinate_roots(matched))?;
    if !carried.is_empty() {
        return None;
    }
    let inside: HashSet<Value> = inner.iter().copied().collect();
    let mut todo: Vec<Value> = coordinate_roots(matched).into_iter().chain(inner.iter().flat_map(|&v| f.inst(v).op.operands())).filter(|v| !inside.contains(v) && *v != ind).collect();
    todo.extend([*start, *end, *step]);
    let top: HashSet<Value> = out.iter().copied().collect();
    let mut hoist = HashSet::new();
    while let Some(v) = todo.pop() {
        if !hoist.insert(v) {
            continue;
        }
        let op = &f.inst(v).op;
        let pure = matches!(op, Op::Param(_) | Op::Const(_) | Op::ProgramId(_) | Op::NumPrograms(_) | Op::Binary(..) | Op::Cmp(..) | Op::Unary(..) | Op::Select(..) | Op::Fma(..) | Op::Cast(_) | Op::AddPtr(..) | Op::PtrOffset(_));
        if !top.contains(&v) || !pure || !f.ty(v).is_scalar() {
            return None;
        }
        todo.extend(op.operands());
    }
    Some(hoist)
}

/// The values a TMA copy's coordinates are made of (its tile's bases, its batch indices).
fn coordinate_roots(matched: &[Matched]) -> Vec<Value> {
    matched.iter().flat_map(|m| m.base.iter().flatten().chain(&m.batch).copied()).collect()
}

/// Scalar integer instructions of one type and source location, each appended to a
/// block as it is made: the loop counter's arithmetic of [`pipeline`] and [`producer_loop`].
struct Ints {
    ty: Type,
    loc: Loc,
}

impl Ints {
    fn konst(&self, f: &mut Function, out: &mut Vec<Value>, x: i64) -> Value {
        let c = f.push(Op::Const(ConstVal::Int(x)), self.ty.clone(), self.loc);
        out.push(c);
        c
    }

    fn bin(&self, f: &mut Function, out: &mut Vec<Value>, op: BinOp, a: Value, b: Value) -> Value {
        let v = f.push(Op::Binary(op, a, b), self.ty.clone(), self.loc);
        out.push(v);
        v
    }
}

/// The producer's loop for loop `u`: over the same iterations, each waiting for its stage
/// to be given back (the phase before its fill's: a fresh barrier passes the first round)
/// and copying its tiles into it (`bars`: the stages' full and empty barriers).
#[allow(clippy::too_many_arguments)]
fn producer_loop(f: &mut Function, u: Value, matched: &[Matched], maps: &[Value], rings: &[Value], bars: (Value, Value), ring_len: i64, loc: Loc) -> Value {
    let Op::For { start, end, step, body, .. } = f.inst(u).op.clone() else { unreachable!() };
    let it = f.ty(body.args[0]).clone();
    let p = f.push(Op::For { start, end, step, init: vec![], body: crate::ir::Region::default() }, Type::unit(), loc);
    let ind = f.push(Op::Arg(p, 0), it.clone(), loc);
    let mut new = vec![];
    let ints = Ints { ty: it, loc };
    let konst = |f: &mut Function, new: &mut Vec<Value>, x: i64| ints.konst(f, new, x);
    let bin = |f: &mut Function, new: &mut Vec<Value>, op: BinOp, a: Value, b: Value| ints.bin(f, new, op, a, b);
    let (c_stages, one, two) = (konst(f, &mut new, ring_len), konst(f, &mut new, 1), konst(f, &mut new, 2));
    let off = bin(f, &mut new, BinOp::Sub, ind, start);
    let i = bin(f, &mut new, BinOp::Div, off, step);
    let slot = bin(f, &mut new, BinOp::Rem, i, c_stages);
    let fill = bin(f, &mut new, BinOp::Div, i, c_stages);
    let before = bin(f, &mut new, BinOp::Add, fill, one);
    let phase = bin(f, &mut new, BinOp::Rem, before, two);
    new.push(f.push(Op::MbarWait { bars: bars.1, slot, phase, sync: false }, Type::unit(), loc));
    let (inner, _) = slice(f, u, coordinate_roots(matched)).expect("checked by producer_inputs");
    let map = clone_slice(f, &mut new, &inner, &[], &Iteration { ind: body.args[0], k: ind, steps: 0, bases: &[], inside: (ind, end) }, loc);
    let on = f.push(Op::Const(ConstVal::Bool(true)), Type::scalar(DType::Bool), loc);
    new.push(on);
    for ((m, &map_param), &ring) in matched.iter().zip(maps).zip(rings) {
        let coords = tma_coords(f, &mut new, m, &map, loc);
        let t = Type::shared(f.ty(ring).dtype, f.ty(ring).shape[1..].to_vec());
        let view = f.push(Op::LocalSlot { buf: ring, slot }, t, loc);
        new.push(view);
        new.push(f.push(Op::TmaCopy { dst: view, map: map_param, coords, bars: bars.0, slot, on, tile: m.tile }, Type::unit(), loc));
    }
    let Op::For { body, .. } = &mut f.values[p.index()].op else { unreachable!() };
    *body = crate::ir::Region { args: vec![ind], body: crate::ir::Block { insts: new }, yields: vec![] };
    p
}

/// The copies of every candidate for iteration `at` into stage `slot` of its ring.
#[allow(clippy::too_many_arguments)]
fn issue(f: &mut Function, out: &mut Vec<Value>, cands: &[Candidate], copies: &Copies, at: Iteration, rings: &[Value], slot: Value, loc: Loc) {
    for (i, (c, &ring)) in cands.iter().zip(rings).enumerate() {
        let map = clone_slice(f, out, &c.slice, &c.carried, &at, loc);
        let inside = f.push(Op::Cmp(CmpOp::Lt, at.inside.0, at.inside.1), Type::scalar(DType::Bool), loc);
        out.push(inside);
        let t = f.ty(c.alloc).clone();
        let view = f.push(Op::LocalSlot { buf: ring, slot }, t, loc);
        out.push(view);
        match copies {
            Copies::Async => copy(f, out, c, &map, inside, view, loc),
            Copies::Tma { matched, maps, bars, .. } => {
                let m = &matched[i];
                let coords = tma_coords(f, out, m, &map, loc);
                let cp = f.push(Op::TmaCopy { dst: view, map: maps[i], coords, bars: *bars, slot, on: inside, tile: m.tile }, Type::unit(), loc);
                out.push(cp);
            }
        }
    }
    if matches!(copies, Copies::Async) {
        out.push(f.push(Op::AsyncCommit, Type::unit(), loc));
    }
}

/// The coordinates of a TMA copy of tile `m` (its slice cloned as `map` says): the
/// tile's bases, then along each batch dimension the index, or 0 where the stride is 0 (a
/// matrix shared by the batch: its map has one entry there).
pub(super) fn tma_coords(f: &mut Function, out: &mut Vec<Value>, m: &Matched, map: &HashMap<Value, Value>, loc: Loc) -> Vec<Value> {
    let i32_of = |f: &mut Function, out: &mut Vec<Value>, v: Value| {
        if f.ty(v).dtype == DType::I32 {
            v
        } else {
            let w = f.push(Op::Cast(v), Type::scalar(DType::I32), loc);
            out.push(w);
            w
        }
    };
    let zero = f.push(Op::Const(ConstVal::Int(0)), Type::scalar(DType::I32), loc);
    out.push(zero);
    let mut coords = vec![];
    for b in m.base {
        let v = b.map_or(zero, |b| map.get(&b).copied().unwrap_or(b));
        coords.push(i32_of(f, out, v));
    }
    for (&b, stride) in m.batch.iter().zip(m.tile.batch_strides()) {
        let v = map.get(&b).copied().unwrap_or(b);
        let v = i32_of(f, out, v);
        let v = match stride {
            HostInt::Param(p) => {
                let s = f.push(Op::Param(p), f.params[p as usize].ty(), loc);
                let z = f.push(Op::Const(ConstVal::Int(0)), f.params[p as usize].ty(), loc);
                let shared = f.push(Op::Cmp(CmpOp::Eq, s, z), Type::scalar(DType::Bool), loc);
                let c = f.push(Op::Select(shared, zero, v), Type::scalar(DType::I32), loc);
                out.extend([s, z, shared, c]);
                c
            }
            HostInt::Const(_) => v,
        };
        coords.push(v);
    }
    coords
}

/// Which iteration a copy is for: the counter `ind` replaced by `k`, and each carried
/// pointer `steps` steps from `bases[i]` (the loop's initial values, in the prologue) or
/// from its value in this iteration (`bases` empty, in the loop).
pub(super) struct Iteration<'a> {
    pub ind: Value,
    pub k: Value,
    pub steps: i64,
    pub bases: &'a [Value],
    /// The copy is for an iteration of the loop when `inside.0 < inside.1`: `k < end` in the
    /// prologue; in the loop `ind < end - (S-1) * step`, which does not overflow where
    /// `k = ind + (S-1) * step` would (its copy is then masked off entirely).
    pub inside: (Value, Value),
}

/// Whether `v` uses one of the carried pointers (directly: the slice is cloned in order).
fn depends_on_any(f: &Function, v: Value, carried: &[&Carried]) -> bool {
    f.inst(v).op.operands().iter().any(|o| carried.iter().any(|c| c.0 == *o))
}

/// Candidate `c`'s pointer and mask computations cloned for iteration `at`: the map from
/// the body's values to their clones (the carried pointers' included, whether the slice
/// computes from them or the load reads them as they are).
pub(super) fn clone_slice(f: &mut Function, out: &mut Vec<Value>, slice: &[Value], carried: &[Carried], at: &Iteration, loc: Loc) -> HashMap<Value, Value> {
    let mut map: HashMap<Value, Value> = HashMap::from([(at.ind, at.k)]);
    let mut pending: Vec<&Carried> = carried.iter().collect();
    for &s in slice {
        // Carried pointers, once the invariant steps they advance by are cloned.
        if depends_on_any(f, s, &pending) {
            advance(f, out, &mut map, &pending, at, loc);
            pending.clear();
        }
        let mut op = f.inst(s).op.clone();
        op.map_operands(|o| map.get(&o).copied().unwrap_or(o));
        let v = f.push(op, f.ty(s).clone(), loc);
        out.push(v);
        map.insert(s, v);
    }
    // A carried pointer no instruction of the slice reads: the load's pointer itself.
    advance(f, out, &mut map, &pending, at, loc);
    map
}

/// The carried pointers `pending` at iteration `at`: `steps` iterations from `base` (the
/// loop's initial value, or this iteration's), into `map`.
fn advance(f: &mut Function, out: &mut Vec<Value>, map: &mut HashMap<Value, Value>, pending: &[&Carried], at: &Iteration, loc: Loc) {
    for &&(arg, i, step) in pending {
        let base = at.bases.get(i).copied().unwrap_or(arg);
        let step = map.get(&step).copied().unwrap_or(step);
        let st = f.ty(step).clone();
        let n = f.push(Op::Const(ConstVal::Int(at.steps)), Type::scalar(st.dtype), loc);
        out.push(n);
        let n = if st.is_scalar() {
            n
        } else {
            let b = f.push(Op::Splat(n), st.clone(), loc);
            out.push(b);
            b
        };
        let by = f.push(Op::Binary(BinOp::Mul, step, n), st, loc);
        let p = f.push(Op::AddPtr(base, by), f.ty(arg).clone(), loc);
        out.extend([by, p]);
        map.insert(arg, p);
    }
}

/// An async copy of candidate `c`'s block into the stage view `view`, from its cloned
/// pointers (`map`, [`clone_slice`]), the mask cleared where the iteration is not one of
/// the loop's (`inside` false).
fn copy(f: &mut Function, out: &mut Vec<Value>, c: &Candidate, map: &HashMap<Value, Value>, inside: Value, view: Value, loc: Loc) {
    let Op::Load { ptr, mask, .. } = f.inst(c.load).op else { unreachable!() };
    let shape = f.ty(ptr).shape.clone();
    let get = |x: Value| map.get(&x).copied().unwrap_or(x);
    let all = f.push(Op::Splat(inside), Type::block(DType::Bool, shape), loc);
    out.push(all);
    let m = super::and_mask(f, out, mask.map(get), all, loc);
    let cp = f.push(Op::AsyncCopy { dst: view, ptr: get(ptr), mask: Some(m) }, Type::unit(), loc);
    out.push(cp);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{verify::verify, Builder, DotPrecision, Operand, ParamKind, ParamSpec};

    /// How the loaded tile's address is made each iteration.
    #[derive(Clone, Copy, PartialEq)]
    enum Addr {
        /// From the counter only.
        Counter,
        /// A pointer carried from one iteration to the next, advanced by 16.
        Carried,
        /// A carried pointer advanced by the counter (not a loop-invariant step).
        CarriedByCounter,
        /// From the counter, and the body also stores to the buffer it loads from.
        StoreInLoop,
        /// From the counter, and the body also stores to another buffer (which no load
        /// of the loop reads: an accumulation).
        StoreElsewhere,
        /// As `StoreElsewhere`, by a relaxed atomic add.
        RelaxedElsewhere,
        /// As `StoreElsewhere`, by an acquire-release atomic add.
        OrderedElsewhere,
        /// A block of pointers carried, advanced by 16 and loaded as it is.
        CarriedTile,
    }

    /// `acc += x_k @ x_k` over k, the tile's addresses made as `addr` says.
    fn matmul_like(addr: Addr) -> Function {
        let carried = matches!(addr, Addr::Carried | Addr::CarriedByCounter | Addr::CarriedTile);
        let l = Loc::new(1, 1);
        let params = [("a", ParamKind::Ptr { elem: DType::BF16, writable: addr == Addr::StoreInLoop }), ("c", ParamKind::Ptr { elem: DType::F32, writable: true }), ("k", ParamKind::Scalar(DType::I32))];
        let nice = ParamSpec { div16: true, eq_one: false };
        let mut b = Builder::specialized("t", &params, &[nice, nice, nice]);
        let r = b.arange(0, 16, l).unwrap();
        let rows = b.expand_dims(r, 1, l).unwrap();
        let rows = b.binary(BinOp::Mul, rows, Operand::Int(16), l).unwrap();
        let acc0 = b.full(&[16, 16], Operand::Float(0.0), DType::F32, l).unwrap();
        let p0 = if addr == Addr::CarriedTile {
            let c0 = b.expand_dims(r, 0, l).unwrap();
            let o0 = b.binary(BinOp::Add, rows, c0, l).unwrap();
            b.add_ptr(b.param(0), o0, l).unwrap()
        } else {
            b.add_ptr(b.param(0), Operand::Int(0), l).unwrap()
        };
        let (kk, args) = b.begin_for(Operand::Int(0), b.param(2), Operand::Int(16), &[Operand::V(acc0), Operand::V(p0)], l).unwrap();
        let (Operand::V(acc), Operand::V(p)) = (args[0], args[1]) else { unreachable!() };
        let rk = b.binary(BinOp::Add, kk, r, l).unwrap();
        let cols = b.expand_dims(rk, 0, l).unwrap();
        let offs = b.binary(BinOp::Add, rows, cols, l).unwrap();
        let base = if carried { p } else { b.param(0) };
        let ptrs = if addr == Addr::CarriedTile { p } else { b.add_ptr(base, offs, l).unwrap() };
        let m = b.cmp(CmpOp::Lt, cols, b.param(2), l).unwrap();
        let x = b.load(ptrs, Some(Operand::V(m)), Some(Operand::Float(0.0)), l).unwrap();
        let d = b.dot(x, x, Some(acc), DotPrecision::Ieee, l).unwrap();
        if addr == Addr::StoreInLoop {
            b.store(ptrs, x, None, l).unwrap();
        }
        if addr == Addr::StoreElsewhere {
            let q = b.add_ptr(b.param(1), offs, l).unwrap();
            b.store(q, d, None, l).unwrap();
        }
        if matches!(addr, Addr::RelaxedElsewhere | Addr::OrderedElsewhere) {
            let q = b.add_ptr(b.param(1), offs, l).unwrap();
            b.atomic(crate::ir::AtomicOp::Add, q, d, None, None, (addr == Addr::RelaxedElsewhere).then_some("relaxed"), l).unwrap();
        }
        let p1 = if addr == Addr::CarriedByCounter { b.add_ptr(p, kk, l).unwrap() } else { b.add_ptr(p, Operand::Int(16), l).unwrap() };
        let out = b.end_for(&[Operand::V(d), Operand::V(p1)], &["acc", "p"], l).unwrap();
        let Operand::V(res) = out[0] else { unreachable!() };
        let co = offs_of(&mut b, rows);
        let q = b.add_ptr(b.param(1), co, l).unwrap();
        b.store(q, res, None, l).unwrap();
        let mut f = b.finish().unwrap();
        super::super::stage::run(&mut f, 4);
        f
    }

    fn offs_of(b: &mut Builder, rows: Value) -> Value {
        let l = Loc::new(1, 1);
        let r = b.arange(0, 16, l).unwrap();
        let cols = b.expand_dims(r, 0, l).unwrap();
        b.binary(BinOp::Add, rows, cols, l).unwrap()
    }

    fn ops(f: &Function, insts: &[Value]) -> Vec<String> {
        insts.iter().map(|&v| crate::ir::printer::print_annotated(&Function { body: crate::ir::Block { insts: vec![v] }, ..f.clone() }, false, &|_| None)).collect()
    }

    #[test]
    fn a_loads_tile_is_copied_stages_minus_one_iterations_ahead() {
        let mut f = matmul_like(Addr::Counter);
        run(&mut f, 3, 4, false, false, false);
        verify(&f).unwrap();
        let text = crate::ir::printer::print_annotated(&f, false, &|_| None);
        let lp = f.body.insts.iter().position(|&v| matches!(f.inst(v).op, Op::For { .. })).expect("the loop");
        let before = &f.body.insts[..lp];
        // A ring of 3 stages, and the prologue: two groups of copies into stages 0 and 1.
        let ring = before.iter().copied().find(|&v| matches!(f.inst(v).op, Op::LocalAlloc(None))).expect("a ring buffer");
        assert_eq!(f.ty(ring).shape, vec![3, 16, 16], "{text}");
        let al = super::super::alloc::allocate(&f);
        assert!(al.is_ring(ring));
        assert_eq!(al.range(&f, ring).end - al.range(&f, ring).start, 3 * 16 * 16 * 2, "3 stages take 3, not the padded 4");
        let count = |vs: &[Value], p: &dyn Fn(&Op) -> bool| vs.iter().filter(|&&v| p(&f.inst(v).op)).count();
        assert_eq!(count(before, &|o| matches!(o, Op::AsyncCopy { .. })), 2, "{text}");
        assert_eq!(count(before, &|o| matches!(o, Op::AsyncCommit)), 2, "{text}");
        assert!(matches!(f.inst(f.body.insts[lp + 1]).op, Op::AsyncWait(0)), "nothing in flight after the loop:\n{text}");
        // In the body: wait for this iteration's group first; the copy for iteration i + 2
        // after the last read of a stage; the load itself is gone.
        let Op::For { body, .. } = &f.inst(f.body.insts[lp]).op else { unreachable!() };
        let b = &body.body.insts;
        assert!(matches!(f.inst(b[0]).op, Op::AsyncWait(1)), "{:?}", ops(&f, b));
        assert_eq!(count(b, &|o| matches!(o, Op::Load { .. } | Op::LocalAlloc(_))), 0, "{text}");
        let read = b.iter().position(|&v| matches!(f.inst(v).op, Op::LocalLoad(s) if matches!(f.inst(s).op, Op::LocalSlot { .. }))).expect("a read of a stage");
        let copy = b.iter().position(|&v| matches!(f.inst(v).op, Op::AsyncCopy { .. })).expect("a copy in the loop");
        let dot = b.iter().position(|&v| matches!(f.inst(v).op, Op::Dot { .. })).unwrap();
        assert!(read < copy && copy < dot, "read, then copy ahead, then multiply: {text}");
        // One stage per iteration, in turn: the read slot is (k / 16) % 3.
        assert!(text.contains("rem"), "{text}");
    }

    /// Attention's backward shape: `for h { for m in (start..n).step_by(16) { x = load(..h..m..);
    /// acc = dot(x, trans(x), acc) } }` with `start` known only at run time, the outer
    /// counter in the address, and the tile read directly and transposed.
    #[test]
    fn an_inner_loop_with_a_run_time_start_and_a_transposed_read_is_pipelined() {
        let l = Loc::new(1, 1);
        let params = [("a", ParamKind::Ptr { elem: DType::BF16, writable: false }), ("c", ParamKind::Ptr { elem: DType::F32, writable: true }), ("n", ParamKind::Scalar(DType::I32))];
        let nice = ParamSpec { div16: true, eq_one: false };
        let mut b = Builder::specialized("t", &params, &[nice, nice, nice]);
        let r = b.arange(0, 16, l).unwrap();
        let cols = b.expand_dims(r, 0, l).unwrap();
        let acc0 = b.full(&[16, 16], Operand::Float(0.0), DType::F32, l).unwrap();
        let start = b.binary(BinOp::Div, b.param(2), Operand::Int(2), l).unwrap();
        let (h, outer) = b.begin_for(Operand::Int(0), Operand::Int(2), Operand::Int(1), &[Operand::V(acc0)], l).unwrap();
        let (m, inner) = b.begin_for(Operand::V(start), b.param(2), Operand::Int(16), &[outer[0]], l).unwrap();
        let Operand::V(acc) = inner[0] else { unreachable!() };
        let rm = b.binary(BinOp::Add, m, r, l).unwrap();
        let rows = b.expand_dims(rm, 1, l).unwrap();
        let rows = b.binary(BinOp::Mul, rows, Operand::Int(16), l).unwrap();
        let hh = b.binary(BinOp::Mul, h, Operand::Int(4096), l).unwrap();
        let offs = b.binary(BinOp::Add, rows, cols, l).unwrap();
        let offs = b.binary(BinOp::Add, offs, hh, l).unwrap();
        let ptrs = b.add_ptr(b.param(0), offs, l).unwrap();
        let mask = b.cmp(CmpOp::Lt, rows, b.param(2), l).unwrap();
        let x = b.load(ptrs, Some(Operand::V(mask)), Some(Operand::Float(0.0)), l).unwrap();
        let xt = b.trans(x, l).unwrap();
        let d = b.dot(x, xt, Some(acc), DotPrecision::Ieee, l).unwrap();
        let got = b.end_for(&[Operand::V(d)], &["acc"], l).unwrap();
        let res = b.end_for(&got, &["acc"], l).unwrap();
        let Operand::V(res) = res[0] else { unreachable!() };
        let out_rows = b.expand_dims(r, 1, l).unwrap();
        let out_rows = b.binary(BinOp::Mul, out_rows, Operand::Int(16), l).unwrap();
        let co = offs_of(&mut b, out_rows);
        let q = b.add_ptr(b.param(1), co, l).unwrap();
        b.store(q, res, None, l).unwrap();
        let mut f = b.finish().unwrap();
        super::super::stage::run(&mut f, 4);
        verify(&f).unwrap();
        let count = |f: &Function, p: &dyn Fn(&Op) -> bool| f.walk().into_iter().filter(|&v| p(&f.inst(v).op)).count();
        let text = crate::ir::printer::print_annotated(&f, false, &|_| None);
        assert_eq!(count(&f, &|o| matches!(o, Op::LocalAlloc(_))), 1, "x and trans(x): one buffer\n{text}");
        assert_eq!(count(&f, &|o| matches!(o, Op::LocalTrans(_))), 1, "{text}");
        assert_eq!(count(&f, &|o| matches!(o, Op::Permute(..))), 0, "the transpose reads through the view\n{text}");
        run(&mut f, 3, 4, false, false, false);
        verify(&f).unwrap();
        let text = crate::ir::printer::print_annotated(&f, false, &|_| None);
        assert_eq!(count(&f, &|o| matches!(o, Op::Load { .. })), 0, "the tile is copied ahead\n{text}");
        assert_eq!(count(&f, &|o| matches!(o, Op::AsyncCopy { .. })), 3, "two in the prologue, one in the loop\n{text}");
        let trans_of_stage = f.walk().into_iter().any(|v| matches!(f.inst(v).op, Op::LocalTrans(s) if matches!(f.inst(s).op, Op::LocalSlot { .. })));
        assert!(trans_of_stage, "the transposed read goes to the current stage\n{text}");
    }

    #[test]
    fn loops_it_cannot_pipeline_are_left_alone() {
        // One stage: nothing to overlap.
        let mut f = matmul_like(Addr::Counter);
        let before = f.clone();
        run(&mut f, 1, 4, false, false, false);
        assert_eq!(f, before);
        // A carried pointer whose step changes from one iteration to the next: where it
        // will be S - 1 iterations on is not a multiple of one step. And a body that
        // stores to the buffer it loads from, which a load issued ahead might read stale.
        // And an acquire-release atomic, which later loads may rely on.
        for addr in [Addr::CarriedByCounter, Addr::StoreInLoop, Addr::OrderedElsewhere] {
            let mut f = matmul_like(addr);
            let mut before = f.clone();
            super::super::simplify::dce(&mut before);
            run(&mut f, 3, 4, false, false, false);
            assert_eq!(f, before);
        }
        // A store or relaxed atomic to a buffer no load of the loop reads (attention's atomic
        // backward adds into its `dQ` scratch) does not stop the pipelining.
        for addr in [Addr::StoreElsewhere, Addr::RelaxedElsewhere] {
            let mut f = matmul_like(addr);
            run(&mut f, 3, 4, false, false, false);
            let copies = f.walk().into_iter().filter(|&v| matches!(f.inst(v).op, Op::AsyncCopy { .. })).count();
            assert_eq!(copies, 3, "{}", crate::ir::printer::print_annotated(&f, false, &|_| None));
        }
    }

    /// `acc = dot(x, trans(x), acc)` over `k0 in (0..k).step_by(64)` with `x` the 64 x 64 bf16 tile
    /// of `a` at rows `0..64` and columns `k0..`, masked by `cols < k` (a matrix tile TMA
    /// can load), inside an outer loop of `outer` iterations when given.
    fn tma_like(outer: Option<i64>) -> Function {
        let l = Loc::new(1, 1);
        let params = [
            ("a", ParamKind::Ptr { elem: DType::BF16, writable: false }),
            ("c", ParamKind::Ptr { elem: DType::F32, writable: true }),
            ("k", ParamKind::Scalar(DType::I32)),
            ("s", ParamKind::Scalar(DType::I32)),
        ];
        let nice = ParamSpec { div16: true, eq_one: false };
        let mut b = Builder::specialized("t", &params, &[nice; 4]);
        let r = b.arange(0, 64, l).unwrap();
        let rows = b.expand_dims(r, 1, l).unwrap();
        let rows = b.binary(BinOp::Mul, rows, b.param(3), l).unwrap();
        let acc0 = b.full(&[64, 64], Operand::Float(0.0), DType::F32, l).unwrap();
        let acc0 = match outer {
            Some(n) => {
                let (_, args) = b.begin_for(Operand::Int(0), Operand::Int(n), Operand::Int(1), &[Operand::V(acc0)], l).unwrap();
                let Operand::V(a) = args[0] else { unreachable!() };
                a
            }
            None => acc0,
        };
        let (kk, args) = b.begin_for(Operand::Int(0), b.param(2), Operand::Int(64), &[Operand::V(acc0)], l).unwrap();
        let Operand::V(acc) = args[0] else { unreachable!() };
        let rk = b.binary(BinOp::Add, kk, r, l).unwrap();
        let cols = b.expand_dims(rk, 0, l).unwrap();
        let offs = b.binary(BinOp::Add, rows, cols, l).unwrap();
        let ptrs = b.add_ptr(b.param(0), offs, l).unwrap();
        let m = b.cmp(CmpOp::Lt, cols, b.param(2), l).unwrap();
        let x = b.load(ptrs, Some(Operand::V(m)), Some(Operand::Float(0.0)), l).unwrap();
        let xt = b.trans(x, l).unwrap();
        let d = b.dot(x, xt, Some(acc), DotPrecision::Ieee, l).unwrap();
        let mut res = b.end_for(&[Operand::V(d)], &["acc"], l).unwrap();
        if outer.is_some() {
            res = b.end_for(&res, &["acc"], l).unwrap();
        }
        let Operand::V(res) = res[0] else { unreachable!() };
        let all = b.expand_dims(r, 0, l).unwrap();
        let co = b.binary(BinOp::Add, rows, all, l).unwrap();
        let q = b.add_ptr(b.param(1), co, l).unwrap();
        b.store(q, res, None, l).unwrap();
        let mut f = b.finish().unwrap();
        super::super::stage::run(&mut f, 4);
        super::super::stage::sink_for_wgmma(&mut f, 4);
        f
    }

    /// With TMA: the barriers initialized before the loop (before each run of it, inside an
    /// outer loop), `S - 1` copies ahead of it, a wait for this iteration's stage first in
    /// the body (then the barrier), one copy after the `dot`, and the last `S - 1` fills
    /// waited for after the loop, the last wait with the barrier; no `cp.async` left.
    /// Without TMA (or without `wgmma`, which TMA copies feed) the same loop gets `cp.async`.
    #[test]
    fn matrix_tiles_of_wgmma_loops_are_copied_by_tma() {
        let count = |f: &Function, vs: &[Value], p: &dyn Fn(&Op) -> bool| vs.iter().filter(|&&v| p(&f.inst(v).op)).count();
        for outer in [None, Some(3)] {
            let mut f = tma_like(outer);
            run(&mut f, 3, 4, true, true, false);
            verify(&f).unwrap();
            let text = crate::ir::printer::print_annotated(&f, false, &|_| None);
            let mut block = f.body.insts.clone();
            if outer.is_some() {
                let o = block.iter().copied().find(|&v| matches!(f.inst(v).op, Op::For { .. })).expect("the outer loop");
                let Op::For { body, .. } = &f.inst(o).op else { unreachable!() };
                assert_eq!(count(&f, &f.body.insts, &|o| matches!(o, Op::MbarInit { .. })), 0, "{text}");
                block = body.body.insts.clone();
            }
            let lp = block.iter().position(|&v| matches!(f.inst(v).op, Op::For { .. })).expect("the loop");
            let (before, after) = (&block[..lp], &block[lp + 1..]);
            assert_eq!(count(&f, before, &|o| matches!(o, Op::MbarInit { count: 1, .. })), 1, "{text}");
            assert_eq!(count(&f, before, &|o| matches!(o, Op::TmaCopy { .. })), 2, "{text}");
            let waits: Vec<bool> = after.iter().filter_map(|&v| match f.inst(v).op {
                Op::MbarWait { sync, .. } => Some(sync),
                _ => None,
            }).collect();
            assert_eq!(waits, [false, true], "the last two fills, then the barrier: {text}");
            let Op::For { body, .. } = &f.inst(block[lp]).op else { unreachable!() };
            let b = &body.body.insts;
            let wait = b.iter().position(|&v| matches!(f.inst(v).op, Op::MbarWait { sync: true, .. })).expect("a wait in the loop");
            let dot = b.iter().position(|&v| matches!(f.inst(v).op, Op::Dot { .. })).unwrap();
            let copy = b.iter().position(|&v| matches!(f.inst(v).op, Op::TmaCopy { .. })).expect("a copy in the loop");
            assert!(wait < dot && dot < copy, "wait, multiply, copy ahead: {text}");
            assert_eq!(f.walk().into_iter().filter(|&v| matches!(f.inst(v).op, Op::AsyncCopy { .. } | Op::AsyncWait(_) | Op::Load { .. })).count(), 0, "{text}");
            assert_eq!(f.params.last().map(|p| p.kind), Some(ParamKind::Bytes { size: 128, align: 64 }), "the tensor map's parameter");
        }
        for (wgmma, tma) in [(true, false), (false, true)] {
            let mut f = tma_like(None);
            run(&mut f, 3, 4, wgmma, tma, false);
            let ops: Vec<Op> = f.walk().into_iter().map(|v| f.inst(v).op.clone()).collect();
            assert!(ops.iter().any(|o| matches!(o, Op::AsyncCopy { .. })) && !ops.iter().any(|o| matches!(o, Op::TmaCopy { .. } | Op::MbarWait { .. })), "wgmma {wgmma} tma {tma}");
        }
    }

    /// Warp-specialized: the loop's barriers and ring before `warp_specialize`, whose
    /// producer loops over the same iterations, waiting for each stage to be given back
    /// (the phase before its fill's) and copying into it, and whose consumer holds the rest
    /// of the program: its loop waits for each stage without a barrier and gives it back
    /// after the product, with no copies, prologue or drain. A loop inside another is not
    /// specialized (its producer would have to run the outer loop too).
    #[test]
    fn a_top_level_tma_loop_is_warp_specialized() {
        let ops = |f: &Function, vs: &[Value]| -> Vec<&'static str> {
            vs.iter()
                .filter_map(|&v| match f.inst(v).op {
                    Op::MbarInit { .. } => Some("init"),
                    Op::MbarWait { sync: false, .. } => Some("wait"),
                    Op::MbarWait { sync: true, .. } => Some("wait+sync"),
                    Op::MbarArrive { .. } => Some("arrive"),
                    Op::TmaCopy { .. } => Some("copy"),
                    Op::Dot { .. } => Some("dot"),
                    Op::For { .. } => Some("for"),
                    Op::Store { .. } => Some("store"),
                    Op::WarpSpecialize { .. } => Some("specialize"),
                    _ => None,
                })
                .collect()
        };
        let mut f = tma_like(None);
        run(&mut f, 3, 4, true, true, true);
        verify(&f).unwrap();
        let text = crate::ir::printer::print_annotated(&f, false, &|_| None);
        assert_eq!(ops(&f, &f.body.insts), ["init", "init", "specialize"], "{text}");
        let Op::WarpSpecialize { producer, consumer } = &f.inst(*f.body.insts.last().unwrap()).op else { unreachable!() };
        assert_eq!(ops(&f, &producer.body.insts), ["for"], "{text}");
        let Op::For { body, init, .. } = &f.inst(producer.body.insts[0]).op else { unreachable!() };
        assert!(init.is_empty(), "{text}");
        assert_eq!(ops(&f, &body.body.insts), ["wait", "copy"], "{text}");
        // The producer's wait: parity (i / S + 1) % 2 of the stage's empty barrier.
        let Op::MbarWait { bars, phase, .. } = f.inst(body.body.insts.iter().copied().find(|&v| matches!(f.inst(v).op, Op::MbarWait { .. })).unwrap()).op else { unreachable!() };
        assert!(matches!(f.inst(phase).op, Op::Binary(BinOp::Rem, x, _) if matches!(f.inst(x).op, Op::Binary(BinOp::Add, ..))), "{text}");
        assert_eq!(ops(&f, &consumer.body.insts), ["for", "store"], "{text}");
        let lp = consumer.body.insts.iter().copied().find(|&v| matches!(f.inst(v).op, Op::For { .. })).unwrap();
        let Op::For { body, .. } = &f.inst(lp).op else { unreachable!() };
        assert_eq!(ops(&f, &body.body.insts), ["wait", "dot", "arrive"], "{text}");
        let Op::MbarArrive { bars: given, .. } = f.inst(*body.body.insts.iter().find(|&&v| matches!(f.inst(v).op, Op::MbarArrive { .. })).unwrap()).op else { unreachable!() };
        assert_eq!(given, bars, "the consumers give back the stages the producer waits for: {text}");
        // Each empty barrier counts one arrival per consumer warp.
        assert!(f.body.insts.iter().any(|&v| matches!(f.inst(v).op, Op::MbarInit { bars: b, count: 4 } if b == bars)), "{text}");
        // Nested, or not asked for: the loop of `matrix_tiles_of_wgmma_loops_are_copied_by_tma`.
        for (outer, specialize) in [(Some(3), true), (None, false)] {
            let mut f = tma_like(outer);
            run(&mut f, 3, 4, true, true, specialize);
            assert!(!f.walk().into_iter().any(|v| matches!(f.inst(v).op, Op::WarpSpecialize { .. } | Op::MbarArrive { .. })), "outer {outer:?} specialize {specialize}");
        }
    }

    #[test]
    fn a_carried_pointer_is_advanced_by_its_step_times_the_distance() {
        // Triton's tutorial style: `p += 16` each iteration. The prologue copies from the
        // initial pointer plus 0 and 1 steps, the loop from this iteration's plus 2.
        let mut f = matmul_like(Addr::Carried);
        run(&mut f, 3, 4, false, false, false);
        verify(&f).unwrap();
        let text = crate::ir::printer::print_annotated(&f, false, &|_| None);
        let copies: Vec<Value> = f.walk().into_iter().filter(|&v| matches!(f.inst(v).op, Op::AsyncCopy { .. })).collect();
        assert_eq!(copies.len(), 3, "two in the prologue, one in the loop: {text}");
        // Each copy's pointer: add_ptr(base, step * n) feeding the address, n = 0, 1, 2.
        let multiples: Vec<i64> = f
            .walk()
            .into_iter()
            .filter_map(|v| match f.inst(v).op {
                Op::Binary(BinOp::Mul, s, n) if matches!(f.inst(s).op, Op::Const(ConstVal::Int(16))) => match f.inst(n).op {
                    Op::Const(ConstVal::Int(x)) => Some(x),
                    Op::Splat(c) => match f.inst(c).op {
                        Op::Const(ConstVal::Int(x)) => Some(x),
                        _ => None,
                    },
                    _ => None,
                },
                _ => None,
            })
            .collect();
        assert_eq!(multiples, vec![0, 1, 2], "{text}");
    }

    /// A carried block of pointers that the load reads as it is (no instruction of the
    /// address computation reads it) is advanced too: the prologue's copies read the
    /// initial pointers plus 0 and 1 steps, not the loop's argument before it is defined.
    #[test]
    fn a_carried_pointer_loaded_as_it_is_is_advanced_too() {
        let mut f = matmul_like(Addr::CarriedTile);
        run(&mut f, 3, 4, false, false, false);
        verify(&f).unwrap();
        let text = crate::ir::printer::print_annotated(&f, false, &|_| None);
        let copies: Vec<Value> = f.walk().into_iter().filter(|&v| matches!(f.inst(v).op, Op::AsyncCopy { .. })).collect();
        assert_eq!(copies.len(), 3, "two in the prologue, one in the loop: {text}");
        for c in copies {
            let Op::AsyncCopy { ptr, .. } = f.inst(c).op else { unreachable!() };
            assert!(matches!(f.inst(ptr).op, Op::AddPtr(..)), "a copy reads the carried pointer unadvanced: {text}");
        }
    }
}
