//! Control op family: counted loops, branches and `return`.
//!
//! - `for i in (start..end).step_by(step) { .. }` with runtime scalar integer bounds is a
//!   `For` instruction owning a [`Region`]: argument 0 is the counter, arguments `1..`
//!   the values carried from one iteration to the next (the kernel's variables assigned
//!   in the body), initialized by `init` and replaced by the region's yields. Its
//!   [`Result`](Op::Result)s are the carried values after the last iteration. The counter
//!   takes the values `start, start + step, ...` below `end`; `step` must be positive
//!   (a non-positive step runs no iteration). Loops over compile-time ranges are
//!   unrolled by the macro and never reach the IR.
//! - `if c { .. } else { .. }` on a runtime scalar `bool` is an `If` with two regions
//!   (without arguments) whose yields are the variables assigned in either branch (and
//!   the value of the `if`, when it has one), in the same types.
//! - `return` ends the program.
//!
//! All control flow is *uniform*: conditions and bounds are scalars, the same in every
//! thread of a program, so barriers inside loops and branches are safe.

use super::builder::{err, fmt_shape, OpenRegion, R};
use super::{Builder, Loc, Op, Operand, Region, Type, Value};
use crate::DType;

fn describe(t: &Type) -> String {
    if t.is_scalar() {
        format!("a scalar {}{}", if t.ptr { "pointer to " } else { "" }, t.dtype)
    } else {
        format!("a {}{} block", if t.ptr { "pointer " } else { "" }, format_args!("{}{}", t.dtype, fmt_shape(&t.shape)))
    }
}

impl Builder {
    fn scalar_int(&mut self, x: Operand, what: &str, loc: Loc) -> R<Value> {
        let v = self.value(x, loc)?;
        let t = self.ty(v);
        if !t.is_scalar() || t.ptr || !t.dtype.is_int() {
            return err(loc, format!("the {what} of a `for` range must be a scalar integer, found {}", describe(t)));
        }
        Ok(v)
    }

    /// Open `for i in (start..end).step_by(step)` carrying `init`. Returns the counter and
    /// the carried values as seen inside the body.
    pub fn begin_for(&mut self, start: impl Into<Operand>, end: impl Into<Operand>, step: impl Into<Operand>, init: &[Operand], loc: Loc) -> R<(Operand, Vec<Operand>)> {
        let (s, e, st) = (self.scalar_int(start.into(), "start", loc)?, self.scalar_int(end.into(), "end", loc)?, self.scalar_int(step.into(), "step", loc)?);
        if let Op::Const(c) = self.f.inst(st).op {
            if c.as_i64() <= 0 {
                return err(loc, format!("the step of a `for` range must be positive, found {}", c.as_i64()));
            }
        }
        // The counter has the widest type of the bounds.
        let d = [s, e, st].iter().map(|&v| self.ty(v).dtype).fold(DType::I32, |a, b| if b.size() > a.size() { b } else { a });
        let mut bounds = vec![];
        for v in [s, e, st] {
            bounds.push(self.cast(v, d, loc)?);
        }
        let mut init_vals = vec![];
        for &o in init {
            let v = self.value(o, loc)?;
            if self.ty(v).unit {
                return err(loc, "a loop cannot carry `store`'s result");
            }
            init_vals.push(v);
        }
        let owner = self.f.push(
            Op::For { start: bounds[0], end: bounds[1], step: bounds[2], init: init_vals.clone(), body: Region::default() },
            Type::unit(),
            loc,
        );
        let mut args = vec![self.f.push(Op::Arg(owner, 0), Type::scalar(d), loc)];
        for (i, &v) in init_vals.iter().enumerate() {
            let t = self.ty(v).clone();
            args.push(self.f.push(Op::Arg(owner, i as u32 + 1), t, loc));
        }
        self.open.push(OpenRegion { owner, block: Default::default(), args: args.clone(), then: None });
        Ok((Operand::V(args[0]), args[1..].iter().map(|&a| Operand::V(a)).collect()))
    }

    /// Materialize `yields` in the innermost open region with the types of `want`,
    /// checking that each keeps its type (`names` and `what` for the error).
    fn region_yields(&mut self, yields: &[Operand], want: &[Type], names: &[&str], what: &str, loc: Loc) -> R<Vec<Value>> {
        let mut ys = vec![];
        for (i, (&y, wt)) in yields.iter().zip(want).enumerate() {
            let v = self.materialize(y, wt.dtype, loc)?;
            let yt = self.ty(v).clone();
            if yt != *wt {
                let name = names.get(i).copied().unwrap_or("a value");
                return err(loc, format!("`{name}` is {} {what} {}; it must keep its type (convert with `as`, or initialize it with `zeros`/`full` of the right shape)", describe(wt), describe(&yt)));
            }
            ys.push(v);
        }
        Ok(ys)
    }

    /// Close the innermost `for` with the carried values' new values (`names` for errors).
    /// Returns the carried values after the loop.
    pub fn end_for(&mut self, yields: &[Operand], names: &[&str], loc: Loc) -> R<Vec<Operand>> {
        let Some(top) = self.open.last() else { return err(loc, "`end_for` without `begin_for`") };
        let want: Vec<Type> = top.args[1..].iter().map(|&a| self.ty(a).clone()).collect();
        let ys = self.region_yields(yields, &want, names, "before the loop but", loc)?;
        let r = self.open.pop().expect("checked above");
        let owner = r.owner;
        let Op::For { body, .. } = &mut self.f.values[owner.index()].op else { return err(loc, "`end_for` closes a branch") };
        *body = Region { args: r.args, body: r.block, yields: ys };
        self.place(owner);
        Ok(self.results(owner, &want, loc))
    }

    fn results(&mut self, owner: Value, types: &[Type], loc: Loc) -> Vec<Operand> {
        types.iter().enumerate().map(|(i, t)| Operand::V(self.emit(Op::Result(owner, i as u32), t.clone(), loc))).collect()
    }

    /// Open `if cond { .. }` on a runtime scalar `bool`.
    pub fn begin_if(&mut self, cond: impl Into<Operand>, loc: Loc) -> R<()> {
        let c = self.value(cond.into(), loc)?;
        let t = self.ty(c);
        if !t.is_scalar() || t.ptr || t.dtype != DType::Bool {
            let hint = if t.is_scalar() { "" } else { "; to choose per element use `select(mask, a, b)`" };
            return err(loc, format!("the condition of a runtime `if` must be a scalar `bool`, found {}{hint}", describe(t)));
        }
        let owner = self.f.push(Op::If { cond: c, then: Region::default(), els: Region::default() }, Type::unit(), loc);
        self.open.push(OpenRegion { owner, block: Default::default(), args: vec![], then: None });
        Ok(())
    }

    /// Close the `then` branch with its yields and open the `else` branch.
    pub fn begin_else(&mut self, yields: &[Operand], loc: Loc) -> R<()> {
        let mut ys = vec![];
        for &y in yields {
            ys.push(self.value(y, loc)?);
        }
        let Some(r) = self.open.last_mut() else { return err(loc, "`begin_else` without `begin_if`") };
        let block = std::mem::take(&mut r.block);
        r.then = Some(Region { args: vec![], body: block, yields: ys });
        Ok(())
    }

    /// Close the `else` branch with its yields (in the `then` branch's types). Returns the
    /// values after the `if`.
    pub fn end_if(&mut self, yields: &[Operand], names: &[&str], loc: Loc) -> R<Vec<Operand>> {
        let Some(then) = self.open.last().and_then(|r| r.then.clone()) else { return err(loc, "`end_if` without `begin_else`") };
        let mut want: Vec<Type> = then.yields.iter().map(|&v| self.ty(v).clone()).collect();
        // A literal in the `then` branch takes the type of the `else` branch's value.
        let mut then = then;
        for (i, &y) in yields.iter().enumerate() {
            if let (Operand::V(e), Op::Const(c)) = (y, &self.f.inst(then.yields[i]).op) {
                let et = self.ty(e).clone();
                if et.is_scalar() && !et.ptr && et != want[i] && self.f.inst(then.yields[i]).ty.is_scalar() {
                    let c = *c;
                    let loc_c = self.f.inst(then.yields[i]).loc;
                    let v = self.f.push(Op::Const(super::arith::eval_cast(want[i].dtype, et.dtype, c)), et.clone(), loc_c);
                    then.body.insts.push(v);
                    then.yields[i] = v;
                    want[i] = et;
                }
            }
        }
        let ys = self.region_yields(yields, &want, names, "after the `then` branch but", loc)?;
        let r = self.open.pop().expect("checked above");
        let owner = r.owner;
        let Op::If { then: t, els, .. } = &mut self.f.values[owner.index()].op else { return err(loc, "`end_if` closes a loop") };
        *t = then;
        *els = Region { args: vec![], body: r.block, yields: ys };
        self.place(owner);
        Ok(self.results(owner, &want, loc))
    }

    /// `return`: end the program.
    pub fn ret(&mut self, loc: Loc) -> R<()> {
        self.emit(Op::Return, Type::unit(), loc);
        Ok(())
    }
}
