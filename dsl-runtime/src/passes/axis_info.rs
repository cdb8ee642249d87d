//! Axis analysis (Triton's `AxisInfo`): for every value and every block dimension,
//!
//! - *contiguity* `c`: the values come in runs of `c` consecutive integers (or pointers
//!   one element apart);
//! - *divisibility* `d`: the first value of each run is a multiple of `d` (for pointers,
//!   in bytes: its alignment);
//! - *constancy* `k`: the values come in runs of `k` equal values (masks included).
//!
//! All three are powers of two. From them the [layout pass](super::layout) derives how
//! many elements one vector instruction can load or store: at most the contiguity, the
//! alignment over the element size, and the mask's constancy. Facts about arguments come
//! from the specialization (`div16`, `align16`); `program_id` and loaded data are unknown.
//!
//! Control flow: a loop counter is as divisible as both its start and its step, so
//! `c0 + arange` in `for c0 in (0..n).step_by(BLOCK)` keeps vector accesses; a value
//! carried around a loop gets what holds for its initial value and every yield (a
//! fixpoint over the body), so a pointer advanced by `p = p + BLOCK` does too; a branch's
//! result gets what holds for both yields.
//!
//! What it cannot do: reason about `/`, `%`, shifts or data-dependent values (it assumes
//! the worst), or prove contiguity through multiplication by anything but 1.

use crate::ir::{BinOp, CmpOp, ConstVal, Function, Op, ParamKind, Value};


/// Facts about one value, one entry per dimension (one entry for scalars).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AxisInfo {
    pub contiguity: Vec<u64>,
    pub divisibility: Vec<u64>,
    pub constancy: Vec<u64>,
}

/// Divisibility assumed for zero: "divisible by everything" within reason.
const HUGE: u64 = 1 << 30;

fn pow2_divisor(x: i64) -> u64 {
    if x == 0 {
        HUGE
    } else {
        (1u64 << x.unsigned_abs().trailing_zeros()).min(HUGE)
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    // Both are powers of two: the gcd is the smaller.
    a.min(b)
}

/// The largest power of two dividing `n` (a run length that tiles a dimension of `n`).
fn pow2_part(n: u64) -> u64 {
    n & n.wrapping_neg()
}

impl AxisInfo {
    fn uniform(shape: &[usize], div: u64) -> AxisInfo {
        let n = shape.len().max(1);
        AxisInfo {
            contiguity: vec![1; n],
            divisibility: vec![div; n],
            constancy: if shape.is_empty() { vec![1] } else { shape.iter().map(|&s| pow2_part(s as u64)).collect() },
        }
    }
    fn unknown(rank: usize) -> AxisInfo {
        let n = rank.max(1);
        AxisInfo { contiguity: vec![1; n], divisibility: vec![1; n], constancy: vec![1; n] }
    }
    fn zip(a: &AxisInfo, b: &AxisInfo, f: impl Fn(usize) -> (u64, u64, u64)) -> AxisInfo {
        let n = a.contiguity.len();
        let mut r = AxisInfo::unknown(n);
        for d in 0..n.min(b.contiguity.len()) {
            let (c, dv, k) = f(d);
            r.contiguity[d] = c;
            r.divisibility[d] = dv;
            r.constancy[d] = k;
        }
        r
    }
}

/// Compute facts for every value of `f` (indexed by value).
pub fn analyze(f: &Function) -> Vec<AxisInfo> {
    let mut info: Vec<AxisInfo> = f.values.iter().map(|i| AxisInfo::unknown(i.ty.shape.len())).collect();
    block(f, &f.body, &mut info);
    info
}

/// What holds for a value that is either `a` or `b`: the weaker fact per dimension
/// (all facts are powers of two over aligned runs, so the smaller one holds for both).
fn meet(a: &AxisInfo, b: &AxisInfo) -> AxisInfo {
    let min = |x: &[u64], y: &[u64]| x.iter().zip(y).map(|(p, q)| *p.min(q)).collect();
    AxisInfo { contiguity: min(&a.contiguity, &b.contiguity), divisibility: min(&a.divisibility, &b.divisibility), constancy: min(&a.constancy, &b.constancy) }
}

fn block(f: &Function, b: &crate::ir::Block, info: &mut Vec<AxisInfo>) {
    for &v in &b.insts {
        info[v.index()] = visit(f, v, info);
        match &f.inst(v).op {
            Op::For { start, step, init, body, .. } => {
                // The counter takes the values `start + i * step`: it is divisible by what
                // divides both.
                let div = gcd(info[start.index()].divisibility[0], info[step.index()].divisibility[0]);
                info[body.args[0].index()] = AxisInfo::uniform(&[], div);
                // A carried value is its initial value or a yield: start from the initial
                // facts and weaken them by the yields' until nothing changes (facts only
                // shrink, so this ends).
                for (a, i) in body.args[1..].iter().zip(init) {
                    info[a.index()] = info[i.index()].clone();
                }
                loop {
                    block(f, &body.body, info);
                    let mut changed = false;
                    for (a, y) in body.args[1..].iter().zip(&body.yields) {
                        let m = meet(&info[a.index()], &info[y.index()]);
                        if m != info[a.index()] {
                            info[a.index()] = m;
                            changed = true;
                        }
                    }
                    if !changed {
                        break;
                    }
                }
            }
            Op::If { then: a, els: b, .. } | Op::WarpSpecialize { producer: a, consumer: b } => {
                block(f, &a.body, info);
                block(f, &b.body, info);
            }
            _ => {}
        }
    }
}

fn visit(f: &Function, v: Value, info: &[AxisInfo]) -> AxisInfo {
    let inst = f.inst(v);
    let shape = &inst.ty.shape;
    let rank = shape.len();
    let get = |x: Value| &info[x.index()];
    match inst.op {
        Op::Param(i) => {
            let p = &f.params[i as usize];
            let div = match p.kind {
                ParamKind::Ptr { elem, .. } => if p.spec.div16 { 16 } else { elem.size() as u64 },
                ParamKind::Scalar(d) if d.is_int() => if p.spec.div16 { 16 } else { 1 },
                ParamKind::Len { .. } => if p.spec.div16 { 16 } else { 1 },
                ParamKind::Bytes { .. } => 1,
                ParamKind::Scalar(_) => 1,
            };
            AxisInfo::uniform(shape, div)
        }
        Op::Const(ConstVal::Int(c)) => AxisInfo::uniform(shape, pow2_divisor(c)),
        Op::Const(_) | Op::ProgramId(_) | Op::NumPrograms(_) => AxisInfo::uniform(shape, 1),
        Op::Arange { start, end } => AxisInfo {
            contiguity: vec![pow2_part((end - start) as u64)],
            divisibility: vec![pow2_divisor(start)],
            constancy: vec![1],
        },
        Op::Splat(x) => AxisInfo::uniform(shape, get(x).divisibility[0]),
        Op::ConvertLayout(x) => get(x).clone(),
        Op::AddPtr(p, o) => {
            let (a, b) = (get(p), get(o));
            let esize = inst.ty.dtype.size() as u64;
            AxisInfo::zip(a, b, |d| {
                let c = gcd(a.contiguity[d], b.constancy[d]).max(gcd(a.constancy[d], b.contiguity[d]));
                (c, gcd(a.divisibility[d], (b.divisibility[d] * esize).min(HUGE)), gcd(a.constancy[d], b.constancy[d]))
            })
        }
        Op::Binary(op, x, y) if inst.ty.dtype.is_int() => {
            let (a, b) = (get(x), get(y));
            AxisInfo::zip(a, b, |d| {
                let k = gcd(a.constancy[d], b.constancy[d]);
                match op {
                    BinOp::Add => (
                        gcd(a.contiguity[d], b.constancy[d]).max(gcd(a.constancy[d], b.contiguity[d])),
                        gcd(a.divisibility[d], b.divisibility[d]),
                        k,
                    ),
                    BinOp::Sub => (gcd(a.contiguity[d], b.constancy[d]), gcd(a.divisibility[d], b.divisibility[d]), k),
                    BinOp::Mul => {
                        // A constant 1, or a block of them (`x * 1` where a stride was
                        // specialized to 1 and splat to the block's shape).
                        let one = |mut z: Value| loop {
                            match f.inst(z).op {
                                Op::Const(ConstVal::Int(1)) => break true,
                                Op::Splat(x) | Op::Broadcast(x) | Op::ExpandDims(x, _) => z = x,
                                _ => break false,
                            }
                        };
                        let c = if one(y) { a.contiguity[d] } else if one(x) { b.contiguity[d] } else { 1 };
                        (c, (a.divisibility[d] * b.divisibility[d]).min(HUGE), k)
                    }
                    // One operand or the other: what divides both (the guard's
                    // `min(len, 2^31)`).
                    BinOp::Min | BinOp::Max => (1, gcd(a.divisibility[d], b.divisibility[d]), k),
                    _ => (1, 1, k),
                }
            })
        }
        Op::Binary(_, x, y) => {
            let (a, b) = (get(x), get(y));
            AxisInfo::zip(a, b, |d| (1, 1, gcd(a.constancy[d], b.constancy[d])))
        }
        Op::Cmp(op, x, y) => {
            let (a, b) = (get(x), get(y));
            AxisInfo::zip(a, b, |d| {
                let mut k = gcd(a.constancy[d], b.constancy[d]);
                // `offs < n` is constant over aligned runs of `offs` when `n` is constant
                // over the run and a multiple of its length: the boundary cannot fall
                // inside a run. (`n` may differ between rows: a per-row limit.)
                if matches!(op, CmpOp::Lt | CmpOp::ULt | CmpOp::Ge) {
                    k = k.max(gcd(gcd(a.contiguity[d], b.constancy[d]), gcd(a.divisibility[d], b.divisibility[d])));
                }
                (1, 1, k)
            })
        }
        Op::Cast(x) if inst.ty.dtype.is_int() && f.ty(x).dtype.is_int() && f.ty(x).dtype.size() <= inst.ty.dtype.size() => {
            get(x).clone()
        }
        // Narrowing keeps the powers of two that divide the value (up to the new width)
        // and where it is constant.
        Op::Cast(x) if inst.ty.dtype.is_int() && f.ty(x).dtype.is_int() => {
            let (a, bits) = (get(x), 8 * inst.ty.dtype.size() as u32);
            let mut r = AxisInfo::unknown(rank);
            r.constancy = a.constancy.clone();
            r.divisibility = a.divisibility.iter().map(|&d| d.min(1u64 << bits.min(62))).collect();
            r
        }
        Op::Cast(x) | Op::Unary(_, x) => {
            let a = get(x);
            let mut r = AxisInfo::unknown(rank);
            r.constancy = a.constancy.clone();
            r
        }
        // Floats: only runs where all three are constant.
        Op::Fma(x, y, z) => {
            let (a, b, c) = (get(x), get(y), get(z));
            let mut r = AxisInfo::unknown(rank);
            r.constancy = (0..rank).map(|d| gcd(a.constancy[d], gcd(b.constancy[d], c.constancy[d]))).collect();
            r
        }
        // Over a run where the condition is constant, the result is one operand or the
        // other: what holds for both.
        Op::Select(c, x, y) => {
            let (a, b, cc) = (get(x), get(y), get(c));
            AxisInfo::zip(a, b, |d| {
                let k = gcd(cc.constancy[d], gcd(a.constancy[d], b.constancy[d]));
                (gcd(cc.constancy[d], gcd(a.contiguity[d], b.contiguity[d])), gcd(a.divisibility[d], b.divisibility[d]), k)
            })
        }
        Op::ExpandDims(x, axis) => {
            let a = get(x);
            let mut r = a.clone();
            // Along the new dimension of size 1 each element is its own run.
            let div = if a.contiguity.iter().all(|&c| c == 1) { a.divisibility.iter().copied().min().unwrap_or(1) } else { 1 };
            r.contiguity.insert(axis as usize, 1);
            r.divisibility.insert(axis as usize, div);
            r.constancy.insert(axis as usize, 1);
            r
        }
        Op::Broadcast(x) => {
            let a = get(x);
            let src = &f.ty(x).shape;
            let mut r = a.clone();
            for d in 0..rank {
                if src[d] == 1 && shape[d] != 1 {
                    r.contiguity[d] = 1;
                    r.constancy[d] = pow2_part(shape[d] as u64);
                }
            }
            r
        }
        Op::Permute(x, ref perm) => {
            let a = get(x);
            AxisInfo {
                contiguity: perm.iter().map(|&p| a.contiguity[p as usize]).collect(),
                divisibility: perm.iter().map(|&p| a.divisibility[p as usize]).collect(),
                constancy: perm.iter().map(|&p| a.constancy[p as usize]).collect(),
            }
        }
        Op::PtrOffset(p) => {
            let mut r = get(p).clone();
            let esize = f.ty(p).dtype.size() as u64;
            r.divisibility.iter_mut().for_each(|d| *d = (*d / esize).max(1));
            r
        }
        Op::Reshape(_) | Op::Reduce { .. } | Op::Scan { .. } | Op::Load { .. } | Op::Store { .. } | Op::Atomic { .. } | Op::LocalAlloc(_) | Op::LocalStore { .. } | Op::LocalLoad(_) | Op::LocalSlot { .. } | Op::LocalTrans(_) | Op::AsyncCopy { .. } | Op::AsyncCommit | Op::AsyncWait(_) | Op::TmaCopy { .. } | Op::TmaStore { .. } | Op::MbarInit { .. } | Op::MbarWait { .. } | Op::MbarArrive { .. } | Op::WarpSpecialize { .. } | Op::Turn { .. } | Op::Dot { .. } => AxisInfo::unknown(rank),
        // After a loop: what held for the carried value (initial or yielded); after a
        // branch: what holds for both yields.
        Op::Result(of, i) => match &f.inst(of).op {
            Op::For { body, .. } => get(body.args[i as usize + 1]).clone(),
            Op::If { then, els, .. } => meet(get(then.yields[i as usize]), get(els.yields[i as usize])),
            _ => AxisInfo::unknown(rank),
        },
        Op::For { .. } | Op::If { .. } | Op::Arg(..) | Op::Return | Op::Assert { .. } | Op::Print { .. } | Op::BoundsCheck { .. } => AxisInfo::unknown(rank),
    }
}

/// The widest access (in elements, a power of two) of one load or store through `ptr`
/// with `mask`, along dimension `d` (of a block access), before the layout is considered.
pub fn max_access_width_along(f: &Function, info: &[AxisInfo], ptr: Value, mask: Option<Value>, d: usize) -> usize {
    let t = f.ty(ptr);
    let esize = t.dtype.size() as u64;
    let p = &info[ptr.index()];
    let mut w = p.contiguity[d].min((p.divisibility[d] / esize).max(1)).min(16 / esize);
    if let Some(m) = mask {
        w = w.min(info[m.index()].constancy[d]);
    }
    w.max(1) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Along the last dimension.
    fn max_access_width(f: &Function, info: &[AxisInfo], ptr: Value, mask: Option<Value>) -> usize {
        max_access_width_along(f, info, ptr, mask, f.ty(ptr).shape.len() - 1)
    }
    use crate::ir::{Builder, Loc, Operand, ParamKind, ParamSpec};
    use crate::DType;

    /// `offs = pid * 1024 + arange(1024); load(x + offs, offs < n)` with and without the
    /// divisibility facts.
    fn widths(x_aligned: bool, n_div16: bool, dtype: DType) -> usize {
        let params = [("x", ParamKind::Ptr { elem: dtype, writable: false }), ("n", ParamKind::Scalar(DType::I32))];
        let specs = [ParamSpec { eq_one: false, div16: x_aligned }, ParamSpec { eq_one: false, div16: n_div16 }];
        let mut b = Builder::specialized("t", &params, &specs);
        let l = Loc::new(1, 1);
        let pid = b.program_id(0, l).unwrap();
        let base = b.binary(BinOp::Mul, pid, Operand::Int(1024), l).unwrap();
        let ar = b.arange(0, 1024, l).unwrap();
        let offs = b.binary(BinOp::Add, base, ar, l).unwrap();
        let m = b.cmp(CmpOp::Lt, offs, b.param(1), l).unwrap();
        let p = b.add_ptr(b.param(0), offs, l).unwrap();
        b.load(p, Some(Operand::V(m)), None, l).unwrap();
        let f = b.finish().unwrap();
        let info = analyze(&f);
        max_access_width(&f, &info, p, Some(m))
    }

    /// `for c0 in (start..n).step_by(step) { load(x + c0 + arange(1024), c0 + arange < n) }`:
    /// the access width inside the loop.
    fn loop_width(start: i64, step: i64) -> usize {
        let params = [("x", ParamKind::Ptr { elem: DType::F32, writable: false }), ("n", ParamKind::Scalar(DType::I32))];
        let nice = ParamSpec { eq_one: false, div16: true };
        let mut b = Builder::specialized("t", &params, &[nice, nice]);
        let l = Loc::new(1, 1);
        let (c0, _) = b.begin_for(Operand::Int(start), b.param(1), Operand::Int(step), &[], l).unwrap();
        let ar = b.arange(0, 1024, l).unwrap();
        let offs = b.binary(BinOp::Add, c0, ar, l).unwrap();
        let m = b.cmp(CmpOp::Lt, offs, b.param(1), l).unwrap();
        let p = b.add_ptr(b.param(0), offs, l).unwrap();
        b.load(p, Some(Operand::V(m)), None, l).unwrap();
        b.end_for(&[], &[], l).unwrap();
        let f = b.finish().unwrap();
        let info = analyze(&f);
        max_access_width(&f, &info, p, Some(m))
    }

    #[test]
    fn loop_counters_keep_the_divisibility_of_start_and_step() {
        assert_eq!(loop_width(0, 1024), 4);
        assert_eq!(loop_width(0, 300), 4); // 300 = 4 * 75
        assert_eq!(loop_width(2, 1024), 2);
        assert_eq!(loop_width(0, 7), 1);
    }

    /// `p = x + arange(1024); for .. { load(p); p = p + advance }`: the access width
    /// through the carried pointer, and through the pointer after the loop.
    fn carried_width(advance: i64) -> (usize, usize) {
        let params = [("x", ParamKind::Ptr { elem: DType::F32, writable: false }), ("n", ParamKind::Scalar(DType::I32))];
        let nice = ParamSpec { eq_one: false, div16: true };
        let mut b = Builder::specialized("t", &params, &[nice, nice]);
        let l = Loc::new(1, 1);
        let ar = b.arange(0, 1024, l).unwrap();
        let p0 = b.add_ptr(b.param(0), ar, l).unwrap();
        let (_, carried) = b.begin_for(Operand::Int(0), b.param(1), Operand::Int(1024), &[Operand::V(p0)], l).unwrap();
        let Operand::V(p) = carried[0] else { unreachable!() };
        b.load(p, None, None, l).unwrap();
        let next = b.add_ptr(p, Operand::Int(advance), l).unwrap();
        let out = b.end_for(&[Operand::V(next)], &["p"], l).unwrap();
        let Operand::V(after) = out[0] else { unreachable!() };
        b.load(after, None, None, l).unwrap();
        let f = b.finish().unwrap();
        let info = analyze(&f);
        (max_access_width(&f, &info, p, None), max_access_width(&f, &info, after, None))
    }

    #[test]
    fn carried_pointers_keep_what_every_iteration_keeps() {
        assert_eq!(carried_width(1024), (4, 4));
        assert_eq!(carried_width(2), (2, 2)); // 8-byte steps
        assert_eq!(carried_width(1), (1, 1));
    }

    #[test]
    fn specialization_enables_vector_access() {
        assert_eq!(widths(true, true, DType::F32), 4);
        assert_eq!(widths(true, true, DType::BF16), 8);
        assert_eq!(widths(false, true, DType::F32), 1);
        assert_eq!(widths(true, false, DType::F32), 1);
    }
}
