//! Lowering of loops, branches and `return`.
//!
//! A `for` becomes a header block with one phi per register of the counter and of every
//! carried value (each carried value in the layout the plan gave it), a body, and a
//! latch that adds the step. An `if` becomes two blocks joined by phis. `return` branches
//! to the kernel's exit block. All conditions are uniform over the program, so barriers
//! inside loops and branches (layout conversions, reductions) are reached by every thread.
//! The shared-memory hazards ([`super::smem`]) follow the control flow: branches join,
//! and a loop whose body's first accesses conflict with what the body leaves pending gets
//! a barrier at its latch.

use super::{smem, Cx, LResult, lower_error, Regs};
use crate::ir::{Op, Value};
use crate::layout::LinearLayout;
use inkwell::values::{BasicValueEnum, PhiValue};

fn get_in<'ctx>(cx: &mut Cx<'_, 'ctx>, v: Value, l: &Option<LinearLayout>) -> LResult<Regs<'ctx>> {
    match l {
        Some(l) => cx.get(v, l),
        None => Ok(cx.vals[v.index()].clone()),
    }
}

fn define_results<'ctx>(cx: &mut Cx<'_, 'ctx>, results: &[Option<Value>], vals: Vec<(Regs<'ctx>, Option<LinearLayout>)>) {
    for (&r, (regs, l)) in results.iter().zip(vals) {
        if let Some(r) = r {
            cx.define(r, regs, l);
        }
    }
}

pub fn for_loop<'ctx>(cx: &mut Cx<'_, 'ctx>, v: Value) -> LResult<()> {
    let f = cx.f;
    let Op::For { start, end, step, init, body } = &f.inst(v).op else { unreachable!() };
    let (s, e, st) = (cx.vals[start.index()][0].into_int_value(), cx.vals[end.index()][0].into_int_value(), cx.vals[step.index()][0].into_int_value());
    let results = f.results_of(v);
    let layouts = cx.plan.carried(f, v);
    let mut inits = vec![];
    for (i, &x) in init.iter().enumerate() {
        inits.push(get_in(cx, x, &layouts[i])?);
    }
    // Stores made before the loop are fenced here, once, rather than at the body's first
    // barrier, every iteration (attention's query tile, stored before its key loop). Where
    // they went to a buffer a `wgmma` reads, the barrier that publishes them is here too:
    // a body with no barrier of its own before the `wgmma` (a warp-specialized consumer's)
    // would otherwise wait at one every iteration.
    if cx.async_read.iter().any(|r| cx.hazards.conflicts(r, super::smem::Access::Read)) {
        cx.barrier()?;
    }
    cx.proxy_fence()?;
    // A step that is not positive runs no iteration (the IR's rule, the interpreter's).
    let forward = cx.b.build_int_compare(inkwell::IntPredicate::SGT, st, st.get_type().const_zero(), "")?;
    let pre = cx.b.get_insert_block().ok_or_else(|| lower_error("no insert block"))?;
    let header = cx.ctx.append_basic_block(cx.func, "for.header");
    let bodyb = cx.ctx.append_basic_block(cx.func, "for.body");
    let exitb = cx.ctx.append_basic_block(cx.func, "for.exit");
    cx.b.build_unconditional_branch(header)?;
    cx.b.position_at_end(header);
    let iv = cx.b.build_phi(s.get_type(), "i")?;
    iv.add_incoming(&[(&s, pre)]);
    let mut phis: Vec<Vec<PhiValue>> = vec![];
    for regs in &inits {
        let mut ps = vec![];
        for &r in regs {
            let p = cx.b.build_phi(r.get_type(), "")?;
            p.add_incoming(&[(&r, pre)]);
            ps.push(p);
        }
        phis.push(ps);
    }
    let ivv = iv.as_basic_value().into_int_value();
    let below = cx.b.build_int_compare(inkwell::IntPredicate::SLT, ivv, e, "")?;
    let go = cx.b.build_and(below, forward, "")?;
    cx.b.build_conditional_branch(go, bodyb, exitb)?;
    cx.b.position_at_end(bodyb);
    cx.define(body.args[0], vec![ivv.into()], None);
    for (i, ps) in phis.iter().enumerate() {
        let regs: Regs = ps.iter().map(|p| p.as_basic_value()).collect();
        cx.define(body.args[i + 1], regs, layouts[i].clone());
    }
    let before = cx.hazards.clone();
    cx.heads.push(smem::Head::new(cx.depth));
    cx.block(&body.body)?;
    let mut yields = vec![];
    for (i, &y) in body.yields.iter().enumerate() {
        // An accumulator still being written by the tensor cores goes round as it is.
        if cx.plan.overlapped.contains(&y) && cx.lay[y.index()] != layouts[i] {
            return Err(lower_error(format!("internal: the accumulator %{} in flight would change layout at the end of the loop", y.0)));
        }
        yields.push(get_in(cx, y, &layouts[i])?);
    }
    // The next iteration starts where this one ends. The body was lowered from `before`;
    // where its head conflicts with what it leaves, a barrier at the latch clears that.
    let head = cx.heads.pop().expect("pushed above");
    if head.conflicts_with(&cx.hazards) {
        cx.barrier()?;
    }
    // Stores the body left unfenced are fenced before the next iteration's barriers,
    // which were lowered without knowing of them.
    cx.proxy_fence()?;
    // After the loop: what the last iteration left, or (no iteration) what was before.
    let mut after = before;
    after.join(&cx.hazards);
    cx.hazards = after;
    let next = cx.b.build_int_add(ivv, st, "")?;
    let latch = cx.b.get_insert_block().ok_or_else(|| lower_error("no insert block"))?;
    cx.b.build_unconditional_branch(header)?;
    iv.add_incoming(&[(&next, latch)]);
    for (ps, ys) in phis.iter().zip(&yields) {
        for (p, y) in ps.iter().zip(ys) {
            p.add_incoming(&[(y as &dyn inkwell::values::BasicValue, latch)]);
        }
    }
    cx.b.position_at_end(exitb);
    let vals = phis.iter().zip(layouts).map(|(ps, l)| (ps.iter().map(|p| p.as_basic_value()).collect(), l)).collect();
    define_results(cx, &results, vals);
    super::wgmma::loop_results(cx, v);
    Ok(())
}

pub fn branch<'ctx>(cx: &mut Cx<'_, 'ctx>, v: Value) -> LResult<()> {
    let f = cx.f;
    let Op::If { cond, then, els } = &f.inst(v).op else { unreachable!() };
    let c = cx.vals[cond.index()][0].into_int_value();
    let results = f.results_of(v);
    let layouts = cx.plan.carried(f, v);
    let tb = cx.ctx.append_basic_block(cx.func, "if.then");
    let eb = cx.ctx.append_basic_block(cx.func, "if.else");
    let merge = cx.ctx.append_basic_block(cx.func, "if.end");
    cx.b.build_conditional_branch(c, tb, eb)?;
    let mut arms = vec![];
    let before = cx.hazards.clone();
    let mut after = smem::Hazards::default();
    let unfenced = cx.unfenced_writes;
    let mut unfenced_after = false;
    for (bb, r) in [(tb, then), (eb, els)] {
        cx.b.position_at_end(bb);
        cx.hazards = before.clone();
        cx.unfenced_writes = unfenced;
        cx.block(&r.body)?;
        unfenced_after |= cx.unfenced_writes;
        let mut ys = vec![];
        for (i, &y) in r.yields.iter().enumerate() {
            ys.push(get_in(cx, y, &layouts[i])?);
        }
        let end = cx.b.get_insert_block().ok_or_else(|| lower_error("no insert block"))?;
        cx.b.build_unconditional_branch(merge)?;
        arms.push((ys, end));
        after.join(&cx.hazards);
    }
    cx.hazards = after;
    cx.unfenced_writes = unfenced_after;
    cx.b.position_at_end(merge);
    let mut vals = vec![];
    for (i, l) in layouts.into_iter().enumerate() {
        let mut regs = vec![];
        for k in 0..arms[0].0[i].len() {
            let a: BasicValueEnum = arms[0].0[i][k];
            let b: BasicValueEnum = arms[1].0[i][k];
            let p = cx.b.build_phi(a.get_type(), "")?;
            p.add_incoming(&[(&a, arms[0].1), (&b, arms[1].1)]);
            regs.push(p.as_basic_value());
        }
        vals.push((regs, l));
    }
    define_results(cx, &results, vals);
    Ok(())
}

pub fn ret(cx: &mut Cx<'_, '_>) -> LResult<()> {
    cx.b.build_unconditional_branch(cx.exit)?;
    let dead = cx.ctx.append_basic_block(cx.func, "after.return");
    cx.b.position_at_end(dead);
    Ok(())
}
