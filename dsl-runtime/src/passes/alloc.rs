//! Shared-memory allocation: a byte offset for every `local_alloc`, from the buffers'
//! lifetimes (Triton's `Allocation` analysis).
//!
//! Instructions are numbered in program order (an instruction before the contents of its
//! regions). A buffer is live from its `local_alloc` to its last use; a use inside a loop
//! that the allocation is outside of keeps the buffer live to the end of that loop (the
//! next iteration uses it again). Buffers are placed largest first, each at the lowest
//! 128-byte-aligned offset whose bytes no buffer with an overlapping lifetime occupies, so
//! buffers whose lifetimes overlap get disjoint ranges and others may share bytes.
//!
//! What the allocation does not decide: scratch for layout conversions and reductions goes
//! above the buffers live at its instruction ([`Allocation::top_at`]; bytes of dead buffers
//! are free again, so an epilogue's conversion reuses a loop's operand ring), placed during
//! lowering ([`lower::smem`](crate::lower::smem)), which also inserts the barriers that the
//! reuse of bytes needs.

use crate::ir::{Block, Function, Op, Value};
use std::collections::HashMap;

/// Offsets are multiples of this (room for the 128-byte swizzles of tensor-core operands).
pub const ALIGN: u64 = 128;

/// Where each shared-memory buffer lives.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Allocation {
    /// The byte offset of each `local_alloc`.
    pub offsets: HashMap<Value, u64>,
    /// Bytes the buffers need together.
    pub bytes: u64,
    /// The program-order position of every instruction, and each buffer's live span
    /// (first, last position) with the byte its range ends at: what [`top_at`](Self::top_at) reads.
    at: HashMap<Value, u32>,
    spans: Vec<(u32, u32, u64)>,
    /// The bytes of each buffer ([`bytes`]), and the rings of stages among them.
    sizes: HashMap<Value, u64>,
    rings: std::collections::HashSet<Value>,
}

impl Allocation {
    /// Where the scratch of instruction `v` (its layout conversions, reductions) may start:
    /// above the buffers live at `v`, at 0 where none is (a dead buffer's bytes are free
    /// again; the lowering's hazard analysis puts a barrier before reusing bytes that are
    /// still being read).
    pub fn top_at(&self, v: Value) -> u64 {
        let Some(&p) = self.at.get(&v) else { return self.bytes };
        self.spans.iter().filter(|&&(a, b, _)| a <= p && p <= b).map(|s| s.2).max().unwrap_or(0)
    }

    /// The byte range of buffer `v`.
    pub fn range(&self, f: &Function, v: Value) -> std::ops::Range<u64> {
        let at = self.offsets[&v];
        at..at + self.sizes.get(&v).copied().unwrap_or_else(|| f.ty(v).shared_bytes())
    }

    /// Whether buffer `v` is a ring of stages read and written only through `local_slot`
    /// views (the pipeliner's).
    pub fn is_ring(&self, v: Value) -> bool {
        self.rings.contains(&v)
    }
}

/// Whether buffer `v` is used, and only by `local_slot` views.
fn is_ring(f: &Function, v: Value) -> bool {
    let users: Vec<Value> = f.walk().into_iter().filter(|&u| f.inst(u).op.operands().contains(&v)).collect();
    !users.is_empty() && users.iter().all(|&u| matches!(f.inst(u).op, Op::LocalSlot { buf, .. } if buf == v))
}

/// The bytes buffer `v` takes: its block over the padded shape (row-major addressing writes
/// the padding too), except that a ring of stages that is only read and written through
/// `local_slot` views (the pipeliner's) takes exactly its stages: a view addresses its
/// stage by index, so 3 stages take 3, not the 4 of the padded shape.
fn bytes(f: &Function, v: Value, ring: bool) -> u64 {
    let t = f.ty(v);
    if ring && t.shape.len() >= 2 {
        let stage: usize = t.padded_shape()[1..].iter().product();
        (t.shape[0] * stage * t.dtype.size()) as u64
    } else {
        t.shared_bytes()
    }
}

/// Program-order positions: where each instruction is, where its regions end, and the
/// loops around it (innermost last).
struct Positions {
    at: HashMap<Value, u32>,
    end: HashMap<Value, u32>,
    loops: HashMap<Value, Vec<Value>>,
}

fn number(f: &Function, b: &Block, next: &mut u32, around: &mut Vec<Value>, p: &mut Positions) {
    for &v in &b.insts {
        p.at.insert(v, *next);
        p.loops.insert(v, around.clone());
        *next += 1;
        let is_loop = matches!(f.inst(v).op, Op::For { .. });
        if is_loop {
            around.push(v);
        }
        for r in f.inst(v).op.regions() {
            number(f, &r.body, next, around, p);
        }
        if is_loop {
            around.pop();
        }
        p.end.insert(v, *next - 1);
    }
}

/// The live interval `[first, last]` of every buffer, in program-order positions, and the
/// position of every instruction.
fn lifetimes_at(f: &Function) -> (HashMap<Value, (u32, u32)>, HashMap<Value, u32>) {
    let mut p = Positions { at: HashMap::new(), end: HashMap::new(), loops: HashMap::new() };
    number(f, &f.body, &mut 0, &mut vec![], &mut p);
    let mut live: HashMap<Value, (u32, u32)> = HashMap::new();
    for v in f.walk() {
        if matches!(f.inst(v).op, Op::LocalAlloc(_)) {
            live.insert(v, (p.at[&v], p.at[&v]));
        }
    }
    for u in f.walk() {
        for o in f.inst(u).op.operands() {
            // A use of a view (a stage, a transpose) is a use of its buffer.
            let o = f.buffer_root(o);
            let Some(&(first, last)) = live.get(&o) else { continue };
            // The outermost loop around the use that is not around the allocation.
            let outside = p.loops[&u].iter().find(|l| !p.loops[&o].contains(l));
            let until = outside.map_or(p.at[&u], |l| p.end[l]);
            live.insert(o, (first, last.max(until)));
        }
    }
    (live, p.at)
}

/// Offsets of the buffers `wgmma` reads are multiples of this: a whole swizzle atom.
pub const ATOM_ALIGN: u64 = 1024;

#[cfg(test)]
pub fn allocate(f: &Function) -> Allocation {
    allocate_aligned(f, &Default::default())
}

/// [`allocate`], with the buffers of `atoms` at multiples of [`ATOM_ALIGN`].
pub fn allocate_aligned(f: &Function, atoms: &std::collections::HashSet<Value>) -> Allocation {
    let (live, positions) = lifetimes_at(f);
    let rings: std::collections::HashSet<Value> = live.keys().copied().filter(|&v| is_ring(f, v)).collect();
    let sizes: HashMap<Value, u64> = live.keys().map(|&v| (v, bytes(f, v, rings.contains(&v)))).collect();
    let mut order: Vec<Value> = live.keys().copied().collect();
    // Largest first (fewer holes), then program order, so the result is deterministic.
    order.sort_by_key(|&v| (std::cmp::Reverse(sizes[&v]), live[&v].0));
    let mut placed: Vec<(Value, u64, u64)> = vec![]; // buffer, start, end (bytes)
    let mut out = Allocation::default();
    for v in order {
        let size = sizes[&v];
        let (a0, a1) = live[&v];
        let mut busy: Vec<(u64, u64)> = placed
            .iter()
            .filter(|(w, _, _)| {
                let (b0, b1) = live[w];
                a0 <= b1 && b0 <= a1
            })
            .map(|&(_, s, e)| (s, e))
            .collect();
        busy.sort_unstable();
        let align = if atoms.contains(&v) { ATOM_ALIGN } else { ALIGN };
        let mut at = 0;
        for (s, e) in busy {
            if at + size <= s {
                break;
            }
            at = at.max(e.div_ceil(align) * align);
        }
        placed.push((v, at, at + size));
        out.offsets.insert(v, at);
        out.bytes = out.bytes.max(at + size);
        out.spans.push((a0, a1, at + size));
    }
    out.at = positions;
    out.sizes = sizes;
    out.rings = rings;
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Builder, Loc, Operand, ParamKind};
    use crate::DType;

    fn kernel() -> Builder {
        Builder::new("k", &[("x", ParamKind::Ptr { elem: DType::F32, writable: true }), ("n", ParamKind::Scalar(DType::I32))])
    }

    #[test]
    fn overlapping_lifetimes_get_disjoint_ranges_and_others_share() {
        let l = Loc::new(1, 1);
        let mut b = kernel();
        let offs = b.arange(0, 256, l).unwrap();
        let v = b.cast(offs, DType::F32, l).unwrap();
        let a = b.local_alloc(DType::F32, &[256], Some(v), l).unwrap(); // 1 KiB
        let c = b.local_alloc(DType::F32, &[64], None, l).unwrap(); // 256 B, live with `a`
        assert!(b.local_store(c, v, l).is_err(), "a block of another shape is refused");
        let w = b.arange(0, 64, l).unwrap();
        let w = b.cast(w, DType::F32, l).unwrap();
        b.local_store(c, w, l).unwrap();
        let ra = b.local_load(a, l).unwrap(); // last use of `a`
        let rc = b.local_load(c, l).unwrap(); // last use of `c`
        // Allocated after both died: may reuse their bytes.
        let d = b.local_alloc(DType::F32, &[256], Some(ra), l).unwrap();
        let rd = b.local_load(d, l).unwrap();
        let p = b.add_ptr(b.param(0), offs, l).unwrap();
        b.store(p, rd, None, l).unwrap();
        let w = b.arange(0, 64, l).unwrap();
        let p = b.add_ptr(b.param(0), w, l).unwrap();
        b.store(p, rc, None, l).unwrap();
        let f = b.finish().unwrap();
        let al = allocate(&f);
        let (load_a, load_d) = (ra, rd);
        let (ra, rc, rd) = (al.range(&f, a), al.range(&f, c), al.range(&f, d));
        assert!(ra.end <= rc.start || rc.end <= ra.start, "{ra:?} {rc:?}");
        assert_eq!(rd, ra, "a dead buffer's bytes are reused");
        assert_eq!(al.bytes, 1024 + 256);
        // Scratch may start above the buffers live at an instruction, at 0 where none is.
        assert_eq!(al.top_at(load_a), 1024 + 256, "a and c live");
        assert_eq!(al.top_at(load_d), rd.end, "only d live (c was last read before it)");
        let last = *f.body.insts.last().unwrap();
        assert_eq!(al.top_at(last), 0, "nothing live after the last use");
        assert!(al.offsets.values().all(|o| o % ALIGN == 0));
    }

    #[test]
    fn a_buffer_used_in_a_loop_lives_to_its_end() {
        let l = Loc::new(1, 1);
        let mut b = kernel();
        let offs = b.arange(0, 128, l).unwrap();
        let v = b.cast(offs, DType::F32, l).unwrap();
        let outer = b.local_alloc(DType::F32, &[128], Some(v), l).unwrap();
        let (_, acc) = b.begin_for(Operand::Int(0), b.param(1), Operand::Int(1), &[Operand::V(v)], l).unwrap();
        let Operand::V(acc) = acc[0] else { unreachable!() };
        // The body reads `outer` first, then allocates `inner`: in the next iteration
        // `outer` is read again, so `inner` must not take its bytes.
        let x = b.local_load(outer, l).unwrap();
        let inner = b.local_alloc(DType::F32, &[128], Some(acc), l).unwrap();
        let y = b.local_load(inner, l).unwrap();
        let s = b.binary(crate::ir::BinOp::Add, x, y, l).unwrap();
        let out = b.end_for(&[Operand::V(s)], &["acc"], l).unwrap();
        let p = b.add_ptr(b.param(0), offs, l).unwrap();
        b.store(p, out[0], None, l).unwrap();
        let f = b.finish().unwrap();
        let live = lifetimes_at(&f).0;
        assert!(live[&outer].1 >= live[&inner].1, "outer lives to the loop's end: {live:?}");
        let al = allocate(&f);
        let (ro, ri) = (al.range(&f, outer), al.range(&f, inner));
        assert!(ro.end <= ri.start || ri.end <= ro.start, "{ro:?} {ri:?}");
    }
}
