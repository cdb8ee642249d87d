//! Explicit layout conversions: after [layout assignment](super::layout), every place
//! where an operation needs an operand in another layout than the one it was produced in
//! gets a `convert_layout` instruction (Triton's `ttg.convert_layout`), so that the
//! program the lowering sees says where data moves between threads and layouts are
//! facts of the program rather than choices the lowering makes on the way.
//!
//! The layout a value is *produced* in is the plan's layout for most operations; a
//! reduction produces the slice of its operand's, a scan and a permute keep (and permute)
//! their operand's, an `expand_dims` inserts a dimension into its operand's wherever the
//! plan's layout allows, and a loop or branch result comes in the layout carried around
//! it. The layout an operation *needs* each operand in follows the lowering's rules (the
//! operation's own layout for elementwise and memory operations; the projection for a
//! `broadcast`; the carried layout for loop and branch values; none for reductions,
//! scans, permutes, reshapes and shared-memory stores, which take whatever they are
//! given). Conversions are placed right before their first user, once per region (as a
//! region's values are visible in nested regions, one made there serves them too); a
//! loop's initial values are converted before the loop, yields at the end of their
//! region.
//!
//! The lowering converts only at `convert_layout` (by recomputing index arithmetic where
//! that is cheap, else through shared memory): an operand it finds in the wrong layout is
//! an internal error, so any disagreement between this pass and the lowering fails loudly.

use super::layout::Plan;
use crate::ir::{Function, Op, Value};
use crate::layout::LinearLayout;
use std::collections::HashMap;

type Scope = HashMap<(Value, LinearLayout), Value>;

/// The most registers a thread may hold of a conversion hoisted out of a loop ([`Cx::hoist`]).
const HOISTED_REGS: usize = 8;

struct Cx<'a> {
    plan: &'a mut Plan,
    /// The layout each block value is produced in.
    produced: HashMap<Value, LinearLayout>,
    /// Per loop or branch: the layout of each carried value (`None`: a scalar).
    carried: HashMap<Value, Vec<Option<LinearLayout>>>,
    scopes: Vec<Scope>,
}

pub fn run(f: &mut Function, plan: &mut Plan) {
    let mut cx = Cx { plan, produced: HashMap::new(), carried: HashMap::new(), scopes: vec![] };
    let body = std::mem::take(&mut f.body.insts);
    f.body.insts = cx.block(f, body, None);
    cx.plan.produced = cx.produced;
}

impl Cx<'_> {
    fn is_block(f: &Function, v: Value) -> bool {
        let t = f.ty(v);
        !t.is_scalar() && !t.unit && !t.shared
    }

    /// `x` in layout `l`: itself, a conversion visible here, or a new one appended to `out`.
    fn convert(&mut self, f: &mut Function, x: Value, l: &LinearLayout, at: Value, out: &mut Vec<Value>) -> Value {
        if !Self::is_block(f, x) || self.produced.get(&x) == Some(l) {
            return x;
        }
        let key = (x, l.clone());
        if let Some(&c) = self.scopes.iter().rev().find_map(|s| s.get(&key)) {
            return c;
        }
        let loc = f.inst(at).loc;
        let c = f.push(Op::ConvertLayout(x), f.ty(x).clone(), loc);
        self.plan.layouts.insert(c, l.clone());
        let info = self.plan.axis[x.index()].clone();
        self.plan.axis.push(info);
        debug_assert_eq!(self.plan.axis.len(), f.values.len());
        self.produced.insert(c, l.clone());
        self.scopes.last_mut().expect("a scope is open").insert(key, c);
        out.push(c);
        c
    }

    /// Before loop `u`: the small conversions its body needs of values defined before it
    /// (at most [`HOISTED_REGS`] registers a thread), made once instead of every iteration
    /// (a conversion through shared memory in a loop would also need a barrier there).
    fn hoist(&mut self, f: &mut Function, u: Value, out: &mut Vec<Value>) {
        let Op::For { body, .. } = &f.inst(u).op else { return };
        let inner = f.walk_from(&body.body.insts);
        // Defined in the loop: its instructions and the arguments of every region in it
        // (a nested loop's counter and carried values are no instructions).
        let args = inner.iter().flat_map(|&w| f.inst(w).op.regions().into_iter().flat_map(|r| r.args.clone()).collect::<Vec<_>>());
        let inside: std::collections::HashSet<Value> = inner.iter().copied().chain(body.args.iter().copied()).chain(args).collect();
        let wants: Vec<(Value, LinearLayout)> = inner.iter().flat_map(|&w| self.needs(f, w).0).filter(|(x, l)| !inside.contains(x) && l.num_regs() <= HOISTED_REGS).collect();
        for (x, l) in wants {
            self.convert(f, x, &l, u, out);
        }
    }

    /// The operands `u` needs in a given layout (the lowering's requests), and the layout
    /// `u` itself is produced in.
    fn needs(&self, f: &Function, u: Value) -> (Vec<(Value, LinearLayout)>, Option<LinearLayout>) {
        let inst = f.inst(u);
        let l = self.plan.layout(f, u);
        let own = |xs: Vec<Value>| xs.into_iter().map(|x| (x, l.clone())).collect::<Vec<_>>();
        let block = Self::is_block(f, u);
        let mine = if block { Some(l.clone()) } else { None };
        match &inst.op {
            Op::Binary(..) | Op::Cmp(..) | Op::Unary(..) | Op::Cast(_) | Op::Select(..) | Op::Fma(..) | Op::AddPtr(..) | Op::PtrOffset(_) => (own(inst.op.operands()), mine),
            Op::Load { .. } | Op::Store { .. } | Op::Atomic { .. } | Op::Assert { .. } | Op::BoundsCheck { .. } => (own(inst.op.operands()), mine),
            Op::AsyncCopy { ptr, mask, .. } => (own([Some(*ptr), *mask].into_iter().flatten().collect()), None),
            Op::ExpandDims(x, a) => match l.expand_source(*a as usize) {
                Some(want) => {
                    let produced = want.insert_dim(*a as usize);
                    (vec![(*x, want)], Some(produced))
                }
                None => (vec![], self.produced.get(x).map(|lx| lx.insert_dim(*a as usize))),
            },
            Op::Broadcast(x) => {
                let (src, dst) = (&f.ty(*x).shape, &inst.ty.shape);
                let dims: Vec<usize> = (0..src.len()).filter(|&k| src[k] == 1 && dst[k] != 1).collect();
                (vec![(*x, l.project(&dims).0)], mine)
            }
            Op::Permute(x, perm) => {
                let perm: Vec<usize> = perm.iter().map(|&p| p as usize).collect();
                (vec![], self.produced.get(x).map(|lx| lx.permute(&perm)))
            }
            Op::Reduce { x, axis, .. } => {
                let out = if block { self.produced.get(x).map(|lx| lx.remove_dim(*axis as usize).0) } else { None };
                (vec![], out)
            }
            Op::Scan { x, .. } => (vec![], self.produced.get(x).cloned()),
            Op::Dot { a, b, acc, .. } => match self.plan.dots.get(&u).map(|p| p.layouts.clone()) {
                Some([la, lb, lc]) => (vec![(*a, la), (*b, lb), (*acc, lc.clone())], Some(lc)),
                None => (vec![], mine),
            },
            Op::Print { args, .. } => {
                let lp = match args.first() {
                    Some(&a) => self.plan.default_for(&f.ty(a).padded_shape()),
                    None => return (vec![], None),
                };
                (args.iter().map(|&a| (a, lp.clone())).collect(), None)
            }
            Op::Result(owner, i) => (vec![], self.carried.get(owner).and_then(|c| c.get(*i as usize).cloned().flatten())),
            Op::LocalAlloc(_) | Op::LocalStore { .. } | Op::For { .. } | Op::If { .. } | Op::WarpSpecialize { .. } | Op::Arg(..) => (vec![], None),
            // Values computed in the plan's layout (arange, splats, loads from shared
            // memory, reshapes, conversions) and scalars.
            _ => (vec![], mine),
        }
    }

    /// Rewrite a block: conversions before their users, regions recursively; `yields`
    /// (a region's values and the layouts they are carried in) are converted at the end.
    fn block(&mut self, f: &mut Function, insts: Vec<Value>, yields: Option<(&mut Vec<Value>, &[Option<LinearLayout>])>) -> Vec<Value> {
        self.scopes.push(Scope::new());
        let mut out = Vec::with_capacity(insts.len());
        for u in insts {
            let (needs, produced) = self.needs(f, u);
            let mut remap: HashMap<Value, Value> = HashMap::new();
            for (x, l) in needs {
                let c = self.convert(f, x, &l, u, &mut out);
                if c != x {
                    remap.insert(x, c);
                }
            }
            if !remap.is_empty() {
                f.values[u.index()].op.map_operands(|o| remap.get(&o).copied().unwrap_or(o));
            }
            if matches!(f.inst(u).op, Op::For { .. }) {
                self.hoist(f, u, &mut out);
            }
            if matches!(f.inst(u).op, Op::For { .. } | Op::If { .. } | Op::WarpSpecialize { .. }) {
                self.control(f, u, &mut out);
            }
            if let Some(p) = produced {
                self.produced.insert(u, p);
            }
            out.push(u);
        }
        if let Some((ys, layouts)) = yields {
            for (y, l) in ys.iter_mut().zip(layouts) {
                if let Some(l) = l {
                    *y = self.convert(f, *y, l, *y, &mut out);
                }
            }
        }
        self.scopes.pop();
        out
    }

    /// A loop's initial values (converted before it, into `out`) and its or a branch's
    /// regions.
    fn control(&mut self, f: &mut Function, u: Value, out: &mut Vec<Value>) {
        let carried = self.plan.carried(f, u);
        self.carried.insert(u, carried.clone());
        if let Op::For { init, body, .. } = &f.inst(u).op {
            let (init, args) = (init.clone(), body.args.clone());
            let mut new_init = vec![];
            for (x, l) in init.iter().zip(&carried) {
                new_init.push(match l {
                    Some(l) => self.convert(f, *x, l, u, out),
                    None => *x,
                });
            }
            for (a, l) in args[1..].iter().zip(&carried) {
                if let Some(l) = l {
                    self.produced.insert(*a, l.clone());
                }
            }
            if let Op::For { init, .. } = &mut f.values[u.index()].op {
                *init = new_init;
            }
        }
        let n = f.inst(u).op.regions().len();
        for k in 0..n {
            let (insts, mut ys) = {
                let r = &mut f.values[u.index()].op.regions_mut()[k];
                (std::mem::take(&mut r.body.insts), r.yields.clone())
            };
            let insts = self.block(f, insts, Some((&mut ys, &carried)));
            let r = &mut f.values[u.index()].op.regions_mut()[k];
            r.body.insts = insts;
            r.yields = ys;
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::ir::{BinOp, Builder, Function, Loc, Op, ParamKind, Value};
    use crate::passes::{axis_info, layout};
    use crate::DType;

    /// `out[j, i] = x[i, j]` over a 32 x 32 tile: the loaded tile must move to the layout
    /// of the transposed store.
    fn transpose() -> Function {
        let l = Loc::new(1, 1);
        let mut b = Builder::new("t", &[("x", ParamKind::Ptr { elem: DType::F32, writable: false }), ("out", ParamKind::Ptr { elem: DType::F32, writable: true })]);
        let i = b.arange(0, 32, l).unwrap();
        let (col, row) = (b.expand_dims(i, 1, l).unwrap(), b.expand_dims(i, 0, l).unwrap());
        let rows = b.binary(BinOp::Mul, col, crate::ir::Operand::Int(32), l).unwrap();
        let offs = b.binary(BinOp::Add, rows, row, l).unwrap();
        let px = b.add_ptr(b.param(0), offs, l).unwrap();
        let tile = b.load(px, None, None, l).unwrap();
        let t = b.trans(tile, l).unwrap();
        let po = b.add_ptr(b.param(1), offs, l).unwrap();
        b.store(po, t, None, l).unwrap();
        b.finish().unwrap()
    }

    /// A loop-invariant conversion of a value defined before a loop is made once before
    /// it; one of a value a loop inside the loop carries stays in that loop (its
    /// argument is no instruction of the outer body, yet defined in it).
    #[test]
    fn conversions_hoist_out_of_loops_but_not_past_their_values() {
        use crate::ir::{Operand, ReduceOp};
        let l = Loc::new(1, 1);
        let mut b = Builder::new("t", &[("x", ParamKind::Ptr { elem: DType::F32, writable: true }), ("n", ParamKind::Scalar(DType::I32))]);
        let r = b.arange(0, 32, l).unwrap();
        let (col, row) = (b.expand_dims(r, 1, l).unwrap(), b.expand_dims(r, 0, l).unwrap());
        let rows = b.binary(BinOp::Mul, col, Operand::Int(32), l).unwrap();
        let offs = b.binary(BinOp::Add, rows, row, l).unwrap();
        let z = b.full(&[32], Operand::Float(0.0), DType::F32, l).unwrap();
        let ids = b.arange(0, 32, l).unwrap();
        let (_, outer) = b.begin_for(Operand::Int(0), Operand::Int(4), Operand::Int(1), &[Operand::V(z)], l).unwrap();
        let (_, inner) = b.begin_for(Operand::Int(0), b.param(1), Operand::Int(1), &[outer[0]], l).unwrap();
        let Operand::V(acc) = inner[0] else { unreachable!() };
        let p = b.add_ptr(b.param(0), offs, l).unwrap();
        let tile = b.load(p, None, None, l).unwrap();
        // `acc` as a row of the tile and `r` as a column: the sum along rows comes out as
        // a column, so the next iteration's `acc` is converted (in the inner loop).
        let a2 = b.expand_dims(acc, 0, l).unwrap();
        let ids2 = b.expand_dims(ids, 1, l).unwrap();
        let r2 = b.cast(ids2, DType::F32, l).unwrap();
        let sum = b.binary(BinOp::Add, tile, a2, l).unwrap();
        let sum = b.binary(BinOp::Add, sum, r2, l).unwrap();
        let next = b.reduce(ReduceOp::Sum, sum, Some(1), l).unwrap();
        let res = b.end_for(&[Operand::V(next)], &["acc"], l).unwrap();
        let res = b.end_for(&res, &["s"], l).unwrap();
        let Operand::V(res) = res[0] else { unreachable!() };
        let p = b.add_ptr(b.param(0), ids, l).unwrap();
        b.store(p, res, None, l).unwrap();
        let mut f = b.finish().unwrap();
        crate::passes::plan(&mut f, 4, 1, false, false, false, false, false);
        crate::ir::verify::verify(&f).unwrap_or_else(|e| panic!("{e}\n{f}"));
        // Nothing the outer loop carries is converted outside it.
        let top: Vec<Value> = f.body.insts.clone();
        for &v in &top {
            if let Op::ConvertLayout(x) = f.inst(v).op {
                assert!(!matches!(f.inst(x).op, Op::Arg(..)), "a loop argument converted outside its loop:\n{f}");
            }
        }
        assert!(f.walk().into_iter().any(|v| matches!(f.inst(v).op, Op::ConvertLayout(x) if x == acc)), "the carried value is converted:\n{f}");
        // `ids` as a column, in the inner loop: converted once, before the outer loop.
        assert!(top.iter().any(|&v| matches!(f.inst(v).op, Op::ConvertLayout(x) if x == ids)), "the invariant conversion is not hoisted:\n{f}");
    }

    #[test]
    fn the_lowering_converts_only_where_the_program_says() {
        let f = transpose();
        let ctx = inkwell::context::Context::create();
        // Layouts assigned, conversions not made explicit: the lowering refuses.
        let plan = layout::assign(&f, &axis_info::analyze(&f), 4, false);
        let err = crate::lower::lower(&ctx, &f, &plan).err().expect("no conversion, no lowering");
        assert!(err.message.contains("no convert_layout was inserted"), "{}", err.message);
        // With the pass: the transposed tile is converted before the store, and it lowers.
        let mut g = f.clone();
        let plan = crate::passes::plan(&mut g, 4, 1, false, false, false, false, false);
        let cvt: Vec<_> = g.walk().into_iter().filter(|&v| matches!(g.inst(v).op, Op::ConvertLayout(_))).collect();
        assert!(!cvt.is_empty(), "{g}");
        let stored = g.walk().into_iter().find_map(|v| match g.inst(v).op {
            Op::Store { value, .. } => Some(value),
            _ => None,
        });
        assert!(cvt.contains(&stored.unwrap()), "the store takes the converted tile:\n{g}");
        crate::ir::verify::verify(&g).unwrap();
        assert!(crate::lower::lower(&ctx, &g, &plan).is_ok());
    }
}
