//! Tensor-core operands through shared memory: every 16-bit operand of a `dot` that is
//! not already read from a shared-memory buffer is written to one (`local_alloc`) and
//! read back (`local_load`) right before the `dot` (Triton stages `tt.dot` operands the
//! same way, as `ttg.local_alloc` + `ttg.local_load` of a dot-operand encoding).
//!
//! What this buys: the operand's producer (a global `load`, typically) keeps the layout
//! it is fast in, 16-byte vectors along the contiguous dimension, instead of loading
//! element by element into the fragments; the buffer gets a swizzled shared layout
//! ([`layout::operand_swizzle`](super::layout::operand_swizzle)) that the vectorized
//! writes and the `ldmatrix` reads both meet without bank conflicts
//! ([`lower::memory`](crate::lower::memory)). The barriers the buffer needs (write before
//! read, read before the next iteration's write) come from the hazard analysis like those
//! of any buffer.
//!
//! This runs in [`plan`](super::plan), so only the GPU lowering sees it; the interpreter
//! runs the kernel as written.

use crate::ir::{Function, Op, Type, Value};

pub fn run(f: &mut Function) {
    let body = std::mem::take(&mut f.body.insts);
    f.body.insts = block(f, body);
}

/// Whether `dot` instruction `v` multiplies 16-bit operands (the ones tensor cores take
/// through `ldmatrix`).
fn stageable(f: &Function, v: Value) -> bool {
    matches!(f.inst(v).op, Op::Dot { a, .. } if f.ty(a).dtype.size() == 2)
}

fn block(f: &mut Function, insts: Vec<Value>) -> Vec<Value> {
    let mut out = Vec::with_capacity(insts.len());
    for u in insts {
        for i in 0..f.inst(u).op.regions().len() {
            let inner = std::mem::take(&mut f.values[u.index()].op.regions_mut()[i].body.insts);
            let inner = block(f, inner);
            f.values[u.index()].op.regions_mut()[i].body.insts = inner;
        }
        if stageable(f, u) {
            let Op::Dot { a, b, .. } = f.inst(u).op else { unreachable!() };
            let loc = f.inst(u).loc;
            // Both writes before both reads: the buffers are live together (no byte
            // shared, so no barrier between them) and one barrier serves both reads.
            let (mut allocs, mut reads) = (vec![], vec![]);
            let mut staged = |f: &mut Function, x: Value| -> Value {
                if matches!(f.inst(x).op, Op::LocalLoad(_)) {
                    return x;
                }
                let t = f.ty(x).clone();
                let buf = f.push(Op::LocalAlloc(Some(x)), Type::shared(t.dtype, t.shape.clone()), loc);
                let y = f.push(Op::LocalLoad(buf), Type::block(t.dtype, t.shape), loc);
                allocs.push(buf);
                reads.push(y);
                y
            };
            let sa = staged(f, a);
            let sb = if b == a { sa } else { staged(f, b) }; // x @ x: one buffer
            out.extend(allocs.into_iter().chain(reads));
            if let Op::Dot { a, b, .. } = &mut f.values[u.index()].op {
                (*a, *b) = (sa, sb);
            }
        }
        out.push(u);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Builder, DotPrecision, Loc, ParamKind};
    use crate::DType;

    #[test]
    fn sixteen_bit_dot_operands_go_through_a_buffer_and_f32_ones_do_not() {
        let l = Loc::new(1, 1);
        for (d, staged) in [(DType::BF16, true), (DType::F16, true), (DType::F32, false)] {
            let mut b = Builder::new("k", &[("x", ParamKind::Ptr { elem: d, writable: false }), ("y", ParamKind::Ptr { elem: DType::F32, writable: true })]);
            let r = b.arange(0, 16, l).unwrap();
            let rc = b.expand_dims(r, 1, l).unwrap();
            let rr = b.expand_dims(r, 0, l).unwrap();
            let rc = b.binary(crate::ir::BinOp::Mul, rc, crate::ir::Operand::Int(16), l).unwrap();
            let off = b.binary(crate::ir::BinOp::Add, rc, rr, l).unwrap();
            let p = b.add_ptr(b.param(0), off, l).unwrap();
            let x = b.load(p, None, None, l).unwrap();
            let acc = b.full(&[16, 16], crate::ir::Operand::Float(0.0), DType::F32, l).unwrap();
            let c = b.dot(x, x, Some(acc), DotPrecision::Ieee, l).unwrap();
            let q = b.add_ptr(b.param(1), off, l).unwrap();
            b.store(q, c, None, l).unwrap();
            let mut f = b.finish().unwrap();
            run(&mut f);
            crate::ir::verify::verify(&f).unwrap();
            let dot = f.walk().into_iter().find(|&v| matches!(f.inst(v).op, Op::Dot { .. })).unwrap();
            let Op::Dot { a, b: bb, .. } = f.inst(dot).op else { unreachable!() };
            for o in [a, bb] {
                assert_eq!(matches!(f.inst(o).op, Op::LocalLoad(_)), staged, "{d}: {}", f);
            }
            // Running it again changes nothing: staged operands stay staged once.
            let before = f.clone();
            run(&mut f);
            assert_eq!(f, before);
        }
    }
}
