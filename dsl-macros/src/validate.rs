//! Phase 2: resolve names and infer types over the kernel AST, reporting every mistake
//! that is visible before specialization, at its span.
//!
//! Types here are coarse: a kind (integer, float, mask, pointer), the element type when
//! it is known from a parameter or a cast, the pointer parameter a pointer derives from,
//! and whether the value is a compile-time constant. What only the specialization knows
//! (block shapes, exact promoted types) is checked again by the runtime's IR builder,
//! whose errors name the same source lines.
//!
//! Element type parameters (`T: Float`) are element types whose name is the parameter's:
//! `T` with `T` gives `T`, `T: Float` with `f32` gives `f32` (whatever `T` is), a sum of a
//! `T: Float` block is `f32`; where the result depends on what `T` is (`T` with `bf16`),
//! it is unknown here and the builder decides per instantiation. A `#[kernel_fn]` body is
//! checked as a kernel's is, against its declared parameter and result types; the calls
//! of helpers are checked by rustc (which helpers exist and their arity) and their results
//! are unknown here.

use crate::builtins::{self, Acc, Arg, Bin, Builtin, Generics, RankRule, Rule};
use crate::parse::{Block, Bound, Errors, Expr, Generic, Kernel, ParamTy, Sp, Stmt};
use std::collections::HashMap;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum K {
    Int,
    Float,
    Bool,
    Ptr,
    Unit,
    /// Unknown after an error: accepted everywhere, so one mistake reports once.
    Any,
}

#[derive(Clone, Debug)]
pub struct Ty {
    pub k: K,
    /// Element type (pointee for pointers) when known.
    pub dtype: Option<String>,
    /// For pointers: the indices of the parameters it may derive from (sorted; one,
    /// unless a compile-time `if` chose between parameters).
    pub roots: Vec<usize>,
    /// A compile-time constant (literals and const generics).
    pub konst: bool,
    /// The block's rank when it is known (0 for scalars).
    pub rank: Option<usize>,
}

impl Ty {
    fn new(k: K) -> Ty {
        Ty { k, dtype: None, roots: vec![], konst: false, rank: None }
    }
    fn ranked(self, rank: Option<usize>) -> Ty {
        Ty { rank, ..self }
    }
    fn any() -> Ty {
        Ty::new(K::Any)
    }
    fn konst(k: K) -> Ty {
        Ty { konst: true, rank: Some(0), ..Ty::new(k) }
    }
    fn typed(k: K, d: &str) -> Ty {
        Ty { dtype: Some(d.to_string()), ..Ty::new(k) }
    }
    fn describe(&self) -> String {
        match (self.k, &self.dtype) {
            (K::Ptr, Some(d)) => format!("a pointer to {d}"),
            (K::Ptr, None) => "a pointer".into(),
            (K::Bool, _) => "a mask (bool)".into(),
            (K::Int, Some(d)) | (K::Float, Some(d)) => format!("{} {d} value", if matches!(d.as_str(), "f32" | "f16" | "i32" | "i64") { "an" } else { "a" }),
            (K::Int, None) => "an integer".into(),
            (K::Float, None) => "a float".into(),
            (K::Unit, _) => "nothing (`store` returns no value)".into(),
            (K::Any, _) => "a value".into(),
        }
    }
}

fn rank_name(r: Option<usize>) -> String {
    match r {
        Some(0) => "a scalar".into(),
        Some(r) => format!("a block of rank {r}"),
        None => "a block".into(),
    }
}

/// Why a helper cannot write memory.
const HELPER_WRITES: &str = "which buffers a kernel writes decides its launch signature (`&mut` arguments), and a kernel's macro does not see into its helpers; return the value and `store` it in the kernel";

fn kind_of(dtype: &str) -> K {
    match dtype {
        "f32" | "f16" | "bf16" => K::Float,
        "bool" => K::Bool,
        _ => K::Int,
    }
}

/// What the expansion needs to know besides the AST.
pub struct Facts {
    /// Per parameter: the kernel stores through it (it is then launched as `&mut`).
    pub writable: Vec<bool>,
    /// `if`s and `for`s that run at run time (by the address of their AST node); the
    /// others are evaluated (unrolled) while the IR is built. For `if`s: whether it gives
    /// a value.
    pub runtime: HashMap<usize, bool>,
    /// Some `store` or atomic writes through a pointer whose parameter is unknown after an
    /// error: which parameters are written (launched as `&mut`) is then unknown too.
    pub unknown_writes: bool,
}

/// The key of an AST node in [`Facts::runtime`].
pub fn node(e: &Expr) -> usize {
    e as *const Expr as usize
}

fn union(a: &[usize], b: &[usize]) -> Vec<usize> {
    let mut u = [a, b].concat();
    u.sort_unstable();
    u.dedup();
    u
}

fn max_rank(a: Option<usize>, b: Option<usize>) -> Option<usize> {
    Some(a?.max(b?))
}

#[derive(Clone)]
enum Binding {
    Local { ty: Ty, mutable: bool },
    Param(usize),
    Const(String),
}

struct Cx<'k> {
    kernel: &'k Kernel,
    /// Element type parameters and their bounds.
    types: HashMap<String, Bound>,
    scopes: Vec<HashMap<String, Binding>>,
    errs: &'k mut Errors,
    writable: Vec<bool>,
    runtime: HashMap<usize, bool>,
    /// The enclosing `if` branches and `for` bodies, innermost last.
    regions: Vec<Region>,
    unknown_writes: bool,
}

/// An `if` branch or a `for` body being checked.
struct Region {
    /// The number of scopes outside it: variables of scopes below this index live on
    /// across it (a loop carries them; an `if` gives them back).
    depth: usize,
    /// A `for` loop (else an `if`).
    is_loop: bool,
    /// Runs at run time (else evaluated, or unrolled, while the IR is built).
    runtime: bool,
}

pub fn check(kernel: &Kernel, errs: &mut Errors) -> Facts {
    let mut top = HashMap::new();
    for c in &kernel.consts {
        top.insert(c.name.to_string(), Binding::Const(c.ty.clone()));
    }
    for (i, p) in kernel.params.iter().enumerate() {
        if top.contains_key(&p.name.to_string()) {
            errs.push(p.name.span(), format!("`{}` is both a compile-time parameter and a parameter", p.name));
        }
        top.insert(p.name.to_string(), Binding::Param(i));
    }
    for t in kernel.types.iter().map(|t| &t.name).chain(&kernel.fns) {
        if top.contains_key(&t.to_string()) {
            errs.push(t.span(), format!("`{t}` is both a type parameter and a parameter"));
        }
    }
    let types = kernel.types.iter().map(|t| (t.name.to_string(), t.bound)).collect();
    let mut cx = Cx { kernel, types, scopes: vec![top], errs, writable: vec![false; kernel.params.len()], runtime: HashMap::new(), regions: vec![], unknown_writes: false };
    let tail = cx.block(&kernel.body);
    match &kernel.helper {
        None => {
            if let (Some(t), Some(e)) = (tail, &kernel.body.tail) {
                if t.k != K::Unit && t.k != K::Any {
                    cx.errs.push(e.span(), "a kernel returns nothing; this value is unused (write results with `store`)");
                }
            }
        }
        Some(h) => cx.helper_result(h, tail),
    }
    Facts { writable: cx.writable, runtime: cx.runtime, unknown_writes: cx.unknown_writes }
}

impl Cx<'_> {
    /// The kind of an element type, a type parameter's included.
    fn kind(&self, dtype: &str) -> K {
        match self.types.get(dtype) {
            Some(Bound::Float) => K::Float,
            Some(Bound::Int) => K::Int,
            None => kind_of(dtype),
        }
    }

    fn typed(&self, dtype: &str) -> Ty {
        Ty::typed(self.kind(dtype), dtype)
    }

    /// The element type of `a op b` for two different element types, when it does not
    /// depend on what a type parameter stands for: `T: Float` with `f32` (the widest float)
    /// gives `f32`, with an integer type `T`; `T: Int` with `i64` gives `i64`, with a float
    /// type that type. `None`: the builder decides per instantiation.
    fn promote_generic(&self, a: &str, b: &str) -> Option<String> {
        let (g, other) = match (self.types.get(a), self.types.get(b)) {
            (Some(&g), None) => ((a, g), b),
            (None, Some(&g)) => ((b, g), a),
            _ => return None,
        };
        match (g.1, kind_of(other), other) {
            (Bound::Float, K::Float, "f32") | (Bound::Int, K::Int, "i64") => Some(other.to_string()),
            (Bound::Float, K::Int, _) => Some(g.0.to_string()),
            (Bound::Int, K::Float, _) => Some(other.to_string()),
            _ => None,
        }
    }

    /// A helper's value (its block's tail) against its declared result.
    fn helper_result(&mut self, h: &crate::parse::Helper, tail: Option<Ty>) {
        let name = &self.kernel.name;
        let value_span = self.kernel.body.tail.as_ref().map(|e| e.span());
        match (&h.ret, tail, value_span) {
            (None, Some(t), Some(span)) if t.k != K::Unit && t.k != K::Any => self.errs.push(
                span,
                format!("`{name}` returns nothing (its signature has no `-> ..`), but its last expression is {}; declare what it returns", t.describe()),
            ),
            (Some(r), None, _) | (Some(r), Some(Ty { k: K::Unit, .. }), _) => self.errs.push(
                h.ret_span,
                format!("`{name}` returns `{}`, but its body does not end with a value (a helper gives its value as its last expression, without `;`)", r.spelling()),
            ),
            (Some(r), Some(t), Some(span)) => {
                let (want_ptr, elem) = match r {
                    ParamTy::Ptr(e) => (true, e),
                    ParamTy::Value(e) | ParamTy::Scalar(e) => (false, e),
                };
                let wrong = match t.k {
                    K::Any => false,
                    K::Ptr => !want_ptr || t.dtype.as_ref().is_some_and(|d| d != elem),
                    _ if want_ptr => true,
                    k => k != self.kind(elem) || t.dtype.as_ref().is_some_and(|d| d != elem),
                };
                if wrong {
                    self.errs.push(span, format!("`{name}` returns `{}`, but this is {}", r.spelling(), t.describe()));
                }
            }
            _ => {}
        }
    }

    /// In a helper: `what` (a `store`, an atomic, `return`) is not allowed there, because `why`.
    fn not_in_helper(&mut self, span: Sp, what: &str, why: &str) -> bool {
        if self.kernel.helper.is_none() {
            return false;
        }
        self.errs.push(span, format!("{what} is not allowed in a `#[kernel_fn]`: {why}"));
        true
    }

    fn lookup(&self, name: &str) -> Option<&Binding> {
        self.scopes.iter().rev().find_map(|s| s.get(name))
    }

    fn ty_of_binding(&self, b: &Binding) -> Ty {
        // A kernel's parameters are scalars; a helper's may be blocks of any rank.
        let rank = if self.kernel.helper.is_some() { None } else { Some(0) };
        match b {
            Binding::Local { ty, .. } => ty.clone(),
            Binding::Param(i) => match &self.kernel.params[*i].ty {
                ParamTy::Ptr(e) => Ty { roots: vec![*i], ..Ty::typed(K::Ptr, e) }.ranked(rank),
                ParamTy::Scalar(s) | ParamTy::Value(s) => self.typed(s).ranked(rank),
            },
            Binding::Const(t) => Ty::konst(if t == "bool" { K::Bool } else { K::Int }),
        }
    }

    /// Returns the type of the block's tail expression (None without one).
    fn block(&mut self, b: &Block) -> Option<Ty> {
        for s in &b.stmts {
            match s {
                Stmt::Let { name, mutable, init } => {
                    let ty = self.expr(init);
                    if ty.k == K::Unit {
                        self.errs.push(init.span(), "`store` returns no value to bind");
                    }
                    self.scopes.last_mut().unwrap().insert(name.to_string(), Binding::Local { ty, mutable: *mutable });
                }
                Stmt::Assign { name, op, value, span } => {
                    let mut vt = self.expr(value);
                    match self.lookup(&name.to_string()).cloned() {
                        Some(Binding::Local { ty, mutable: true }) => {
                            if let Some(op) = op {
                                vt = self.binary(*op, &ty, &vt, *span);
                            }
                            let changes = ty.k != vt.k && ty.k != K::Any && vt.k != K::Any
                                || matches!((&ty.dtype, &vt.dtype), (Some(a), Some(b)) if a != b);
                            let reshapes = matches!((ty.rank, vt.rank), (Some(a), Some(b)) if a != b);
                            let scope = self.scope_of(&name.to_string()).unwrap_or(0);
                            let carried = self.regions.iter().rev().find(|r| r.is_loop && r.runtime).is_some_and(|l| scope < l.depth);
                            if changes || (carried && reshapes) {
                                let (from, to) = if changes { (ty.describe(), vt.describe()) } else { (rank_name(ty.rank), rank_name(vt.rank)) };
                                if carried {
                                    self.errs.push(*span, format!("loop-carried `{name}` changes from {from} to {to} in the loop body; a value carried across iterations keeps its type and shape (convert with `as`, or initialize it with `zeros`/`full`)"));
                                } else {
                                    self.errs.push(*span, format!("assignment changes the type of `{name}` from {from} to {to}"));
                                }
                            }
                            let roots = self.assigned_roots(name, &ty, &vt, scope, *span);
                            // Keep the declared type; a literal assigned later does not make it constant.
                            let ty = Ty { konst: false, roots, ..ty };
                            self.set(name, ty);
                        }
                        Some(Binding::Local { mutable: false, .. }) => {
                            self.errs.push(name.span(), format!("cannot assign twice to `{name}`: declare it with `let mut {name}`"))
                        }
                        Some(Binding::Param(_)) => self.errs.push(
                            name.span(),
                            format!("cannot assign to parameter `{name}`; bind a new name with `let mut`, or write memory with `store`"),
                        ),
                        Some(Binding::Const(_)) => self.errs.push(name.span(), format!("cannot assign to the compile-time constant `{name}`")),
                        None => self.errs.push(name.span(), format!("cannot find `{name}` in this {}", self.kernel.what())),
                    }
                }
                Stmt::Expr(e) => {
                    let t = self.expr(e);
                    let atomic = matches!(e, Expr::Call { func, .. } if builtins::lookup(&func.to_string()).is_some_and(|b| b.rule == Rule::Atomic));
                    if t.k != K::Unit && t.k != K::Any && !atomic && !matches!(e, Expr::If { .. } | Expr::Block(..) | Expr::For { .. }) {
                        self.errs.push(e.span(), "this value is unused; only `store(...)` has an effect");
                    }
                }
            }
        }
        b.tail.as_ref().map(|e| self.expr(e))
    }

    /// One branch of an `if`, in a scope of its own.
    fn branch(&mut self, b: &Block, runtime: bool) -> Option<Ty> {
        self.regions.push(Region { depth: self.scopes.len(), is_loop: false, runtime });
        self.scopes.push(HashMap::new());
        let t = self.block(b);
        self.scopes.pop();
        self.regions.pop();
        t
    }

    /// `a`, or `a` or `b`: the names of pointer parameters.
    fn param_names(&self, roots: &[usize]) -> String {
        roots.iter().map(|&r| format!("`{}`", self.kernel.params[r].name)).collect::<Vec<_>>().join(" or ")
    }

    /// The parameters pointer variable `name` (declared in scope `scope`, of type `old`)
    /// derives from after it is assigned a value of type `new`.
    ///
    /// A runtime loop carries one pointer per variable and a runtime `if` merges the
    /// pointers of its branches: neither can switch parameters, so an assignment that
    /// would is an error here (the IR could only reject it at launch). Straight-line code
    /// rebinds; a compile-time `if` or an unrolled loop may or may not have run the
    /// assignment, so the variable may point into either parameter afterwards.
    fn assigned_roots(&mut self, name: &syn::Ident, old: &Ty, new: &Ty, scope: usize, span: Sp) -> Vec<usize> {
        if old.k != K::Ptr || new.k != K::Ptr || new.roots.is_empty() || old.roots == new.roots {
            return old.roots.clone();
        }
        let crossed = self.regions.iter().filter(|r| scope < r.depth);
        match crossed.clone().rfind(|r| r.runtime) {
            Some(r) => {
                let (from, to) = (self.param_names(&old.roots), self.param_names(&new.roots));
                let msg = if r.is_loop {
                    format!("loop-carried pointer `{name}` points into {from}, but this assignment makes it point into {to}; a pointer carried across iterations keeps its parameter (advance it with `{name} = {name} + offsets`, and use another variable for {to})")
                } else {
                    format!("`{name}` points into {from}, but this assignment in a runtime `if` makes it point into {to}; a pointer assigned in a runtime branch keeps its parameter (use another variable for {to}, and branch around the `load`/`store` that uses it)")
                };
                self.errs.push(span, msg);
                old.roots.clone()
            }
            None if crossed.count() > 0 => union(&old.roots, &new.roots),
            None => new.roots.clone(),
        }
    }

    /// The index of the scope that binds `name`.
    fn scope_of(&self, name: &str) -> Option<usize> {
        self.scopes.iter().rposition(|s| s.contains_key(name))
    }

    fn set(&mut self, name: &syn::Ident, ty: Ty) {
        for s in self.scopes.iter_mut().rev() {
            if let Some(Binding::Local { ty: t, .. }) = s.get_mut(&name.to_string()) {
                *t = ty;
                return;
            }
        }
    }

    /// A Rust expression that must be a compile-time constant (`if` conditions, const
    /// generic arguments): every name in it must be a const generic.
    pub fn check_const(&mut self, e: &syn::Expr, what: &str) {
        match e {
            syn::Expr::Lit(_) => {}
            syn::Expr::Path(p) => match p.path.get_ident() {
                Some(i) => match self.lookup(&i.to_string()) {
                    Some(Binding::Const(_)) => {}
                    Some(_) => self.errs.push(
                        i.span(),
                        format!("`{i}` is a runtime value, but {what} needs a compile-time constant (a literal or a const generic)"),
                    ),
                    None => self.errs.push(i.span(), format!("cannot find `{i}` in this {}", self.kernel.what())),
                },
                None => self.errs.spanned(p, format!("{what} must be built from literals and const generics")),
            },
            syn::Expr::Binary(b) => {
                self.check_const(&b.left, what);
                self.check_const(&b.right, what);
            }
            syn::Expr::Unary(u) => self.check_const(&u.expr, what),
            syn::Expr::Paren(p) => self.check_const(&p.expr, what),
            syn::Expr::Group(g) => self.check_const(&g.expr, what),
            syn::Expr::Block(b) if b.block.stmts.len() == 1 => {
                if let syn::Stmt::Expr(e, None) = &b.block.stmts[0] {
                    self.check_const(e, what)
                }
            }
            syn::Expr::Cast(c) => self.check_const(&c.expr, what),
            syn::Expr::MethodCall(m) => {
                self.check_const(&m.receiver, what);
                for a in &m.args {
                    self.check_const(a, what);
                }
            }
            other => self.errs.spanned(other, format!("{what} must be built from literals and const generics")),
        }
    }

    fn const_generic(&mut self, g: &Generic, what: &str) {
        match g {
            Generic::Const(e) => self.check_const(e, what),
            Generic::Type(name, span) => match self.lookup(name) {
                Some(Binding::Const(_)) => {}
                Some(_) => self.errs.push(*span, format!("`{name}` is a runtime value, but {what} needs a compile-time constant (a literal or a const generic)")),
                None => self.errs.push(*span, format!("cannot find the constant `{name}` in this {}", self.kernel.what())),
            },
        }
    }

    fn binary(&mut self, op: Bin, a: &Ty, b: &Ty, span: Sp) -> Ty {
        let rank = max_rank(a.rank, b.rank);
        let t = self.binary_kind(op, a, b, span);
        if t.k == K::Any { t } else { t.ranked(rank) }
    }

    fn binary_kind(&mut self, op: Bin, a: &Ty, b: &Ty, span: Sp) -> Ty {
        // A pointer plus an offset of unknown type (a helper's result): still that pointer,
        // so that a store through it marks its parameter written (a non-integer offset is
        // the IR builder's error).
        if (a.k == K::Ptr && b.k == K::Any && matches!(op, Bin::Add | Bin::Sub)) || (b.k == K::Ptr && a.k == K::Any && op == Bin::Add) {
            return if a.k == K::Ptr { a.clone() } else { b.clone() };
        }
        if a.k == K::Any || b.k == K::Any {
            return if op.is_cmp() { Ty::new(K::Bool) } else { Ty::any() };
        }
        if a.k == K::Unit || b.k == K::Unit {
            self.errs.push(span, "`store` returns no value to compute with");
            return Ty::any();
        }
        let konst = a.konst && b.konst;
        // Pointer arithmetic.
        if a.k == K::Ptr || b.k == K::Ptr {
            let (p, o) = if a.k == K::Ptr { (a, b) } else { (b, a) };
            let ok_op = op == Bin::Add || (op == Bin::Sub && a.k == K::Ptr);
            if !ok_op || o.k == K::Ptr {
                self.errs.push(span, format!("`{}` is not defined on pointers; only `ptr + offsets` and `ptr - offsets` are", op.symbol()));
                return Ty::any();
            }
            if o.k != K::Int {
                self.errs.push(span, format!("pointer offsets must be integers, found {}", o.describe()));
                return Ty::any();
            }
            return p.clone();
        }
        if op.is_cmp() {
            if (a.k == K::Bool) != (b.k == K::Bool) || (a.k == K::Bool && !matches!(op, Bin::Eq | Bin::Ne)) {
                self.errs.push(span, format!("`{}` compares numbers; found {} and {}", op.symbol(), a.describe(), b.describe()));
            }
            return Ty { konst, ..Ty::new(K::Bool) };
        }
        if op.is_bitwise() {
            for t in [a, b] {
                if t.k == K::Float {
                    self.errs.push(span, format!("`{}` needs integers or masks, found {}", op.symbol(), t.describe()));
                    return Ty::any();
                }
            }
            if (a.k == K::Bool) != (b.k == K::Bool) {
                self.errs.push(span, format!("`{}` combines two masks or two integers, found {} and {}", op.symbol(), a.describe(), b.describe()));
                return Ty::any();
            }
            return Ty { konst, dtype: a.dtype.clone().or(b.dtype.clone()), ..Ty::new(a.k) };
        }
        if a.k == K::Bool || b.k == K::Bool {
            self.errs.push(span, format!("`{}` is not defined on masks (bool); use `select(mask, a, b)` or `&`/`|`", op.symbol()));
            return Ty::any();
        }
        let k = if a.k == K::Float || b.k == K::Float { K::Float } else { K::Int };
        let dtype = match (&a.dtype, &b.dtype) {
            (Some(x), Some(y)) if x == y => Some(x.clone()),
            (Some(x), Some(y)) => self.promote_generic(x, y), // else promotion: the builder decides
            (Some(x), None) if self.kind(x) == k => Some(x.clone()),
            (None, Some(y)) if self.kind(y) == k => Some(y.clone()),
            _ => None,
        };
        Ty { k, dtype, roots: vec![], konst, rank: None }
    }

    fn expr(&mut self, e: &Expr) -> Ty {
        match e {
            Expr::Error(_) => Ty::any(),
            Expr::Int(..) => Ty::konst(K::Int),
            Expr::Float(..) => Ty::konst(K::Float),
            Expr::Bool(..) => Ty::konst(K::Bool),
            Expr::Var(i) => match self.lookup(&i.to_string()).cloned() {
                Some(b) => self.ty_of_binding(&b),
                None => {
                    let hint = if builtins::lookup(&i.to_string()).is_some() { format!(" (`{i}` is a function: call it)") } else { String::new() };
                    let what = self.kernel.what();
                    self.errs.push(i.span(), format!("cannot find `{i}` in this {what}{hint}"));
                    Ty::any()
                }
            },
            Expr::Binary { op, lhs, rhs, span } => {
                let (a, b) = (self.expr(lhs), self.expr(rhs));
                self.binary(*op, &a, &b, *span)
            }
            Expr::Neg(x, span) => {
                let t = self.expr(x);
                if matches!(t.k, K::Bool | K::Ptr | K::Unit) {
                    self.errs.push(*span, format!("`-` is not defined on {}", t.describe()));
                    return Ty::any();
                }
                t
            }
            Expr::Not(x, span) => {
                let t = self.expr(x);
                if matches!(t.k, K::Float | K::Ptr | K::Unit) {
                    self.errs.push(*span, format!("`!` needs a mask or an integer, found {}", t.describe()));
                    return Ty::any();
                }
                t
            }
            Expr::Cast { expr, ty, ty_span, span } => {
                let t = self.expr(expr);
                if !crate::parse::CAST_TYPES.contains(&ty.as_str()) && !self.types.contains_key(ty) {
                    self.errs.push(*ty_span, crate::parse::bad_cast("`as`", Some(ty)));
                    return Ty::any();
                }
                if matches!(t.k, K::Ptr | K::Unit) {
                    self.errs.push(*span, format!("cannot convert {} with `as`", t.describe()));
                    return Ty::any();
                }
                Ty { konst: t.konst, ..self.typed(ty) }.ranked(t.rank)
            }
            Expr::If { cond, cond_dsl, cond_errors, then, els, span } => {
                // A condition made of constants is evaluated while the IR is built.
                let mut trial = Errors::default();
                std::mem::swap(self.errs, &mut trial);
                self.check_const(cond, "an `if` condition");
                std::mem::swap(self.errs, &mut trial);
                let runtime = !trial.0.is_empty();
                if runtime {
                    match cond_dsl {
                        None => cond_errors.iter().for_each(|e| self.errs.add(e.clone())),
                        Some(c) => {
                            let t = self.expr(c);
                            if !matches!(t.k, K::Bool | K::Any) {
                                self.errs.push(c.span(), format!("an `if` condition must be a `bool`, found {}", t.describe()));
                            } else if t.rank.is_some_and(|r| r > 0) {
                                self.errs.push(c.span(), "this `if` condition is a block of masks; a runtime `if` needs one scalar `bool` (to choose per element, use `select(mask, a, b)`)");
                            }
                        }
                    }
                }
                let a = self.branch(then, runtime);
                let b = els.as_ref().map(|b| self.branch(b, runtime));
                let out = match (a, b) {
                    (Some(x), Some(Some(y))) => {
                        if x.k != y.k && x.k != K::Any && y.k != K::Any {
                            self.errs.push(*span, format!("the branches of this `if` give {} and {}", x.describe(), y.describe()));
                            x
                        } else if x.k == K::Ptr && y.k == K::Ptr && x.roots != y.roots {
                            if runtime {
                                self.errs.push(
                                    *span,
                                    format!(
                                        "the branches of this runtime `if` give pointers into {} and {}; a runtime `if` cannot choose between pointer parameters (put the `load`/`store` that uses each pointer inside its branch)",
                                        self.param_names(&x.roots),
                                        self.param_names(&y.roots)
                                    ),
                                );
                                Ty::any()
                            } else {
                                Ty { roots: union(&x.roots, &y.roots), ..x }
                            }
                        } else {
                            x
                        }
                    }
                    (Some(x), _) if x.k != K::Unit && x.k != K::Any => {
                        self.errs.push(*span, "an `if` that gives a value needs an `else` that gives one too");
                        Ty::any()
                    }
                    _ => Ty::new(K::Unit),
                };
                if runtime {
                    self.runtime.insert(node(e), !matches!(out.k, K::Unit));
                }
                out
            }
            Expr::For { var, start, end, step, body, .. } => {
                let mut konst = true;
                for (what, x) in [("start", Some(start)), ("end", Some(end)), ("step", step.as_ref())] {
                    let Some(x) = x else { continue };
                    let t = self.expr(x);
                    konst &= t.konst;
                    if !matches!(t.k, K::Int | K::Any) || t.rank.is_some_and(|r| r > 0) {
                        self.errs.push(x.span(), format!("the {what} of a `for` range must be a scalar integer, found {}", t.describe()));
                    }
                }
                if !konst {
                    self.runtime.insert(node(e), false);
                }
                self.regions.push(Region { depth: self.scopes.len(), is_loop: true, runtime: !konst });
                let mut scope = HashMap::new();
                scope.insert(var.to_string(), Binding::Local { ty: Ty::new(K::Int).ranked(Some(0)), mutable: false });
                self.scopes.push(scope);
                self.block(body);
                self.scopes.pop();
                self.regions.pop();
                Ty::new(K::Unit)
            }
            Expr::Return(span) => {
                self.not_in_helper(*span, "`return`", "a helper gives its value as its last expression");
                Ty::new(K::Unit)
            }
            Expr::Str(_, span) => {
                self.errs.push(*span, "a string is only an argument of `device_assert` and `device_print`");
                Ty::any()
            }
            Expr::Array(_, span) => {
                self.errs.push(*span, "`[..]` is only a shape or a permutation argument (`zeros::<f32>([M, N])`, `reshape(x, [M, N])`)");
                Ty::any()
            }
            Expr::Block(b, _) => {
                self.scopes.push(HashMap::new());
                let t = self.block(b);
                self.scopes.pop();
                t.unwrap_or(Ty::new(K::Unit))
            }
            Expr::Call { func, path, generics, args, method, span } => self.call(func, path.is_some(), generics, args, *method, *span),
        }
    }

    fn arity(&mut self, func: &syn::Ident, args: &[Expr], (min, max): (usize, usize), method: bool, span: Sp, sig: &str) -> bool {
        if args.len() < min || args.len() > max {
            let given = if method { args.len().saturating_sub(1) } else { args.len() };
            let (lo, hi) = if method { (min.saturating_sub(1), max.saturating_sub(1)) } else { (min, max) };
            let expected = if lo == hi { format!("{lo}") } else { format!("{lo} to {hi}") };
            self.errs.push(span, format!("`{func}` takes {expected} argument{} ({sig}), found {given}", if hi == 1 { "" } else { "s" }));
            return false;
        }
        true
    }

    fn no_generics(&mut self, func: &syn::Ident, generics: &[Generic]) {
        if !generics.is_empty() {
            self.errs.push(func.span(), format!("`{func}` takes no generic arguments"));
        }
    }

    fn type_generic(&mut self, func: &syn::Ident, generics: &[Generic], span: Sp) -> Option<String> {
        match generics {
            [Generic::Type(t, s)] => {
                if crate::parse::CAST_TYPES.contains(&t.as_str()) || self.types.contains_key(t) {
                    Some(t.clone())
                } else {
                    self.errs.push(*s, crate::parse::bad_cast(&format!("`{func}`"), Some(t)));
                    None
                }
            }
            _ => {
                self.errs.push(span, format!("`{func}` needs the target type, as in `{func}::<bf16>(..)`"));
                None
            }
        }
    }

    /// Check a mask argument; its type (for the rank of what it selects).
    fn mask_arg(&mut self, func: &str, m: &Expr) -> Ty {
        let t = self.expr(m);
        if !matches!(t.k, K::Bool | K::Any) {
            self.errs.push(m.span(), format!("the mask of `{func}` must be a mask (bool, e.g. `offs < n`), found {}", t.describe()));
        }
        t
    }

    /// The call of a `#[kernel_fn]` (a function that is not a builtin, or a path): rustc
    /// checks that it exists and its arity; here, its arguments, its generic arguments
    /// (compile-time constants), and that a helper does not call itself. Its result is
    /// unknown until the IR is built.
    fn helper_call(&mut self, func: &syn::Ident, path: bool, generics: &[Generic], args: &[Expr], span: Sp) -> Ty {
        let name = func.to_string();
        if !path {
            if let Some(b) = self.lookup(&name) {
                let what = match b {
                    Binding::Const(_) => "a compile-time constant",
                    Binding::Param(_) => "a parameter",
                    Binding::Local { .. } => "a variable",
                };
                self.errs.push(func.span(), format!("`{name}` is {what} here, not a function"));
                return Ty::any();
            }
            if self.kernel.is_fn_param(&name) {
                let msg = format!("`{name}` is a helper type parameter: the `#[kernel_fn]` given for it takes no generic arguments");
                match generics.first() {
                    Some(Generic::Const(e)) => self.errs.spanned(e, msg),
                    Some(Generic::Type(_, s)) => self.errs.push(*s, msg),
                    None => {}
                }
            }
            if self.kernel.helper.is_some() && *func == self.kernel.name {
                self.errs.push(
                    span,
                    format!("`{name}` calls itself: a `#[kernel_fn]` is inlined at each call, so it cannot be recursive (write the repetition as a `for` loop)"),
                );
            }
        }
        for g in generics {
            match g {
                Generic::Const(e) => self.check_const(e, &format!("a generic argument of `{name}`")),
                Generic::Type(t, s) if self.types.contains_key(t) || crate::parse::CAST_TYPES.contains(&t.as_str()) => self.errs.push(
                    *s,
                    format!("`{name}` infers its element types from its arguments: its generic arguments are compile-time constants only"),
                ),
                Generic::Type(..) => self.const_generic(g, &format!("a generic argument of `{name}`")),
            }
        }
        for a in args {
            let t = self.expr(a);
            if t.k == K::Unit {
                self.errs.push(a.span(), format!("this argument of `{name}` is no value"));
            }
        }
        Ty::any()
    }

    /// A builtin call: generics and arity from its row of the table, then its rule.
    /// Any other function is a helper ([`Cx::helper_call`]).
    fn call(&mut self, func: &syn::Ident, path: bool, generics: &[Generic], args: &[Expr], method: bool, span: Sp) -> Ty {
        let name = func.to_string();
        let Some(b) = builtins::lookup(&name).filter(|_| !path) else {
            if !method {
                return self.helper_call(func, path, generics, args, span);
            }
            for a in args {
                self.expr(a);
            }
            self.errs.push(func.span(), builtins::not_a_builtin(&name, method));
            return Ty::any();
        };
        // What the call gives when its arguments cannot be checked.
        let fallback = match b.rule {
            Rule::Index { rank } => Ty::typed(K::Int, "i32").ranked(Some(rank)),
            Rule::Operator(op) if op.is_cmp() => Ty::new(K::Bool),
            r if r.gives_unit() => Ty::new(K::Unit),
            _ => Ty::any(),
        };
        let mut dtype = None;
        let mut length_form = false;
        match b.generics {
            Generics::None => self.no_generics(func, generics),
            Generics::OptionalDtype if !generics.is_empty() => dtype = self.type_generic(func, generics, span),
            // A required type is checked by the rule, after the argument.
            Generics::OptionalDtype | Generics::Dtype => {}
            Generics::Length => match (generics, args.len()) {
                ([g], 0) => {
                    self.const_generic(g, &format!("the length of `{name}`"));
                    length_form = true;
                }
                ([], n) if (b.arity.0..=b.arity.1).contains(&n) => {}
                _ => {
                    let p = b.params;
                    self.errs.push(span, format!("`{name}` is `{name}::<N>()` or `{name}({p})`, with compile-time N, {p}"));
                    return fallback;
                }
            },
        }
        if !length_form && !self.arity(func, args, b.arity, method, span, b.params) {
            return fallback;
        }
        match b.rule {
            Rule::Index { rank } => {
                for (i, a) in args.iter().enumerate() {
                    self.const_arg(b, &name, i, a);
                }
                Ty::typed(K::Int, "i32").ranked(Some(rank))
            }
            Rule::Load => {
                let p = self.expr(&args[0]);
                if let Some(m) = args.get(1) {
                    self.mask_arg(&name, m);
                }
                if !matches!(p.k, K::Ptr | K::Any) {
                    self.errs.push(args[0].span(), format!("`{name}` reads through a pointer (`ptr + offsets`), found {}", p.describe()));
                    return Ty::any();
                }
                if let Some(o) = args.get(2) {
                    let ot = self.expr(o);
                    self.value_for(&p, &ot, o.span(), "`other`");
                }
                match &p.dtype {
                    Some(d) => self.typed(d).ranked(p.rank),
                    None => Ty::any(),
                }
            }
            Rule::Store => {
                let helper = self.not_in_helper(span, &format!("`{name}`"), HELPER_WRITES);
                let p = self.expr(&args[0]);
                let v = self.expr(&args[1]);
                if let Some(m) = args.get(2) {
                    self.mask_arg(&name, m);
                }
                match p.k {
                    _ if helper => {}
                    K::Ptr if !p.roots.is_empty() => p.roots.iter().for_each(|&r| self.writable[r] = true),
                    K::Ptr => {
                        self.unknown_writes = true;
                        self.errs.push(args[0].span(), "cannot tell which pointer parameter this store writes")
                    }
                    K::Any => self.unknown_writes = true,
                    _ => self.errs.push(args[0].span(), format!("`{name}` writes through a pointer (`ptr + offsets`), found {}", p.describe())),
                }
                self.value_for(&p, &v, args[1].span(), "the stored value");
                Ty::new(K::Unit)
            }
            Rule::Select => {
                let m = self.mask_arg(&name, &args[0]);
                let (a, b) = (self.expr(&args[1]), self.expr(&args[2]));
                // Special: a pointer keeps the parameter it points into.
                if (a.k == K::Ptr || b.k == K::Ptr) && a.k != K::Any && b.k != K::Any {
                    let msg = if a.k != b.k {
                        format!("`{name}` chooses between values, not between a pointer and {}", if a.k == K::Ptr { b.describe() } else { a.describe() })
                    } else if a.roots == b.roots {
                        format!("`{name}` between pointers is not supported; select the offsets instead (`p + {name}(mask, offs_a, offs_b)`)")
                    } else {
                        format!(
                            "`{name}` cannot choose between pointers into {} and {}: a pointer keeps the parameter it points into; use each pointer under its own mask (`store(a, v, mask & c)` and `store(b, v, mask & !c)`), or a runtime `if` on a scalar condition",
                            self.param_names(&a.roots),
                            self.param_names(&b.roots)
                        )
                    };
                    self.errs.push(span, msg);
                    return Ty::any();
                }
                // The mask broadcasts with the values: `select(rows < n, x, 0)` is a block.
                let t = self.binary(Bin::Add, &a, &b, span);
                let rank = max_rank(t.rank, m.rank);
                if t.k == K::Any { t } else { Ty { konst: t.konst && m.konst, ..t.ranked(rank) } }
            }
            Rule::Elementwise => {
                let mut t = self.expr(&args[0]);
                for a in &args[1..] {
                    let u = self.expr(a);
                    t = self.binary(Bin::Add, &t, &u, span);
                }
                Ty { konst: false, ..t }
            }
            Rule::Math { int_to_f32 } => {
                let t = self.expr(&args[0]);
                match t.k {
                    K::Bool | K::Ptr | K::Unit => {
                        self.errs.push(args[0].span(), format!("`{name}` needs a number, found {}", t.describe()));
                        Ty::any()
                    }
                    K::Int if int_to_f32 => Ty::typed(K::Float, "f32").ranked(t.rank),
                    _ => Ty { konst: false, ..t },
                }
            }
            Rule::Convert => {
                let t = self.expr(&args[0]);
                match self.type_generic(func, generics, span) {
                    Some(d) if !matches!(t.k, K::Ptr | K::Unit) => self.typed(&d).ranked(t.rank),
                    Some(_) => {
                        self.errs.push(args[0].span(), format!("cannot convert {}", t.describe()));
                        Ty::any()
                    }
                    None => Ty::any(),
                }
            }
            Rule::Operator(op) => {
                let (a, b) = (self.expr(&args[0]), self.expr(&args[1]));
                self.binary(op, &a, &b, span)
            }
            Rule::Fill => {
                let rank = self.shape_arg(&name, &args[0]);
                let vt = args.get(1).map(|v| self.expr(v));
                if let Some(v) = &vt {
                    if !matches!(v.k, K::Int | K::Float | K::Bool | K::Any) || v.rank.is_some_and(|r| r > 0) {
                        self.errs.push(args[1].span(), format!("`{name}` takes a scalar value, found {}", v.describe()));
                    }
                }
                let d = dtype.or_else(|| vt.as_ref().and_then(|v| v.dtype.clone())).unwrap_or_else(|| {
                    match vt.as_ref().map(|v| v.k) {
                        Some(K::Int) => "i32".into(),
                        Some(K::Bool) => "bool".into(),
                        _ => "f32".into(),
                    }
                });
                self.typed(&d).ranked(rank)
            }
            Rule::Shape(rule) => {
                let t = self.expr(&args[0]);
                if matches!(t.k, K::Unit) {
                    self.errs.push(args[0].span(), format!("`{name}` needs a value"));
                    return Ty::any();
                }
                let rank = match rule {
                    RankRule::NewAxis => {
                        let axis = self.const_arg(b, &name, 1, &args[1]);
                        if let (Some(a), Some(r)) = (axis, t.rank) {
                            if a > r as i64 || a < -(r as i64) - 1 {
                                self.errs.push(args[1].span(), format!("`{name}` axis {a} is out of range for a block of rank {r} (0..={r})"));
                            }
                        }
                        t.rank.map(|r| r + 1)
                    }
                    RankRule::Requires { rank, does, gives } => {
                        if t.rank.is_some_and(|r| r != rank) {
                            self.errs.push(args[0].span(), format!("`{name}` {does}; this block has rank {}", t.rank.unwrap_or(0)));
                        }
                        gives.or(t.rank)
                    }
                    RankRule::ToShape => self.shape_arg(&name, &args[1]),
                    RankRule::Permutation => {
                        let r = self.shape_arg(&name, &args[1]);
                        if let (Some(a), Some(b)) = (r, t.rank) {
                            if a != b {
                                self.errs.push(args[1].span(), format!("`{name}` of a block of rank {b} needs {b} dimensions, found {a}"));
                            }
                        }
                        t.rank
                    }
                };
                Ty { konst: false, ..t }.ranked(rank)
            }
            Rule::Reduce { acc, scan } => {
                let t = self.expr(&args[0]);
                if !matches!(t.k, K::Int | K::Float | K::Bool | K::Any) {
                    self.errs.push(args[0].span(), format!("`{name}` needs a block of numbers, found {}", t.describe()));
                    return Ty::any();
                }
                if t.rank == Some(0) {
                    self.errs.push(args[0].span(), format!("`{name}` reduces a block, but this is a scalar"));
                }
                let axis = args.get(1).and_then(|a| self.const_arg(b, &name, 1, a));
                if let (Some(a), Some(r)) = (axis, t.rank) {
                    if r > 0 && (a >= r as i64 || a < -(r as i64)) {
                        self.errs.push(args[1].span(), format!("`{name}` along axis {a}, but the block has rank {r} (axes 0..{r})"));
                    }
                }
                let rank = match (scan, args.len()) {
                    (true, _) => t.rank,
                    (false, 1) => Some(0),
                    (false, _) => t.rank.map(|r| r.saturating_sub(1)),
                };
                let generic = t.dtype.as_ref().and_then(|d| self.types.get(d)).copied();
                let ty = match (acc, t.dtype.as_deref()) {
                    (Acc::Index, _) => Ty::typed(K::Int, "i32"),
                    // f32, f16 and bf16 all sum in f32; u8 sums in i32, i32 and i64 in themselves.
                    (Acc::Sum, _) if generic == Some(Bound::Float) => Ty::typed(K::Float, "f32"),
                    (Acc::Sum, _) if generic == Some(Bound::Int) => Ty::new(K::Int),
                    (Acc::Sum, Some("f16" | "bf16")) => Ty::typed(K::Float, "f32"),
                    (Acc::Sum, Some("u8" | "bool")) => Ty::typed(K::Int, "i32"),
                    _ => Ty { konst: false, roots: vec![], ..t },
                };
                ty.ranked(rank)
            }
            Rule::Dot => {
                let (a, b) = (self.expr(&args[0]), self.expr(&args[1]));
                for (t, arg, which) in [(&a, &args[0], "first"), (&b, &args[1], "second")] {
                    if !matches!(t.k, K::Float | K::Any) {
                        self.errs.push(arg.span(), format!("`dot` multiplies 2-D blocks of floats; its {which} operand is {}", t.describe()));
                    } else if let Some(r) = t.rank.filter(|&r| r != 2) {
                        let what = if r == 0 { "a scalar".to_string() } else { format!("a {r}-D block") };
                        self.errs.push(arg.span(), format!("`dot` multiplies 2-D blocks; its {which} operand is {what}"));
                    }
                }
                if let (Some(x), Some(y)) = (&a.dtype, &b.dtype) {
                    if x != y {
                        self.errs.push(args[1].span(), format!("`dot` of {x} and {y}: the inputs must both be bf16, both f16 or both f32"));
                    }
                }
                if let Some(acc) = args.get(2) {
                    let c = self.expr(acc);
                    if !matches!(c.k, K::Float | K::Any) || c.rank.is_some_and(|r| r != 2) || c.dtype.as_deref().is_some_and(|d| d != "f32") {
                        self.errs.push(acc.span(), format!("the accumulator of `dot` is a 2-D f32 block, found {}", c.describe()));
                    }
                }
                if let Some(p) = args.get(3) {
                    let ok = matches!(p, Expr::Str(s, _) if ["tf32", "tf32x3", "ieee"].contains(&s.as_str()));
                    if !ok {
                        self.errs.push(p.span(), "the precision of `dot` is \"tf32\" (the default), \"tf32x3\" or \"ieee\"".to_string());
                    }
                }
                Ty::typed(K::Float, "f32").ranked(Some(2))
            }
            Rule::Atomic => {
                let helper = self.not_in_helper(span, &format!("`{name}`"), HELPER_WRITES);
                let p = self.expr(&args[0]);
                match p.k {
                    _ if helper => {}
                    K::Ptr if !p.roots.is_empty() => p.roots.iter().for_each(|&r| self.writable[r] = true),
                    K::Ptr => {
                        self.unknown_writes = true;
                        self.errs.push(args[0].span(), format!("cannot tell which pointer parameter `{name}` writes"))
                    }
                    K::Any => self.unknown_writes = true,
                    _ => {
                        self.errs.push(args[0].span(), format!("`{name}` writes through a pointer (`ptr + offsets`), found {}", p.describe()));
                        return Ty::any();
                    }
                }
                if let Some(d) = &p.dtype {
                    if let Some(&bound) = self.types.get(d) {
                        let others: Vec<&str> = bound.members().iter().copied().filter(|m| !matches!(*m, "i32" | "i64" | "f32")).collect();
                        self.errs.push(
                            args[0].span(),
                            format!("`{name}` works on i32, i64 and f32 buffers, and `{d}: {}` may be {}: use a pointer of a concrete type", bound.name(), others.join(" or ")),
                        );
                    } else if !matches!(d.as_str(), "i32" | "i64" | "f32") {
                        self.errs.push(args[0].span(), format!("`{name}` works on i32, i64 and f32 buffers, not {d}"));
                    }
                }
                for (i, a) in args.iter().enumerate().skip(1) {
                    if b.arg(i) == Arg::Mask {
                        self.mask_arg(&name, a);
                    } else if b.arg(i) == Arg::Str {
                        if !matches!(a, Expr::Str(s, _) if ["acq_rel", "relaxed"].contains(&s.as_str())) {
                            self.errs.push(a.span(), format!("the semantics of `{name}` are \"acq_rel\" (the default) or \"relaxed\""));
                        }
                    } else {
                        let vt = self.expr(a);
                        self.value_for(&p, &vt, a.span(), &format!("the value of `{name}`"));
                    }
                }
                match &p.dtype {
                    Some(d) => self.typed(d).ranked(p.rank),
                    None => Ty::any(),
                }
            }
            Rule::Debug => {
                for (i, a) in args.iter().enumerate() {
                    if b.arg(i) == Arg::Str && !matches!(a, Expr::Str(..)) {
                        self.errs.push(a.span(), format!("`{name}` takes a string literal here"));
                    }
                }
                for (i, a) in args.iter().enumerate().filter(|&(i, _)| b.arg(i) != Arg::Str) {
                    let t = self.expr(a);
                    if b.arg(i) == Arg::Cond && !matches!(t.k, K::Bool | K::Any) {
                        self.errs.push(a.span(), format!("`{name}` checks a condition (bool), found {}", t.describe()));
                    }
                    if matches!(t.k, K::Ptr | K::Unit) {
                        self.errs.push(a.span(), format!("`{name}` takes numbers and masks, found {}", t.describe()));
                    }
                }
                Ty::new(K::Unit)
            }
        }
    }

    /// Argument `i` of builtin `b`, which must be compile-time ([`Arg::Const`], named in
    /// the message); its value when it is a literal.
    fn const_arg(&mut self, b: &Builtin, func: &str, i: usize, e: &Expr) -> Option<i64> {
        let what = match b.arg(i) {
            Arg::Const(what) => what,
            _ => "the argument",
        };
        self.const_int(e, &format!("the {what} of `{func}`"))
    }

    /// A shape or permutation `[a, b, ..]` of compile-time integers; returns its length.
    fn shape_arg(&mut self, func: &str, e: &Expr) -> Option<usize> {
        match e {
            Expr::Array(items, _) => {
                for i in items {
                    self.const_expr_arg(i, &format!("a dimension in `{func}`"));
                }
                Some(items.len())
            }
            other => {
                self.errs.push(other.span(), format!("`{func}` takes its shape as `[a, b, ..]` of compile-time constants"));
                None
            }
        }
    }

    /// A compile-time integer argument; its value when it is a literal.
    fn const_int(&mut self, e: &Expr, what: &str) -> Option<i64> {
        self.const_expr_arg(e, what);
        match e {
            Expr::Int(i, _) => Some(*i),
            Expr::Neg(x, _) => match &**x {
                Expr::Int(i, _) => Some(-i),
                _ => None,
            },
            _ => None,
        }
    }

    /// A call argument that must be a compile-time constant.
    fn const_expr_arg(&mut self, e: &Expr, what: &str) {
        let t = self.expr(e);
        if !t.konst && t.k != K::Any {
            self.errs.push(e.span(), format!("{what} must be a compile-time constant (a literal or a const generic), found a runtime value"));
        }
    }

    /// A value stored through (or used as `other` for) pointer `p`.
    fn value_for(&mut self, p: &Ty, v: &Ty, span: Sp, what: &str) {
        let Some(elem) = &p.dtype else { return };
        match v.k {
            K::Any => {}
            K::Unit | K::Ptr => self.errs.push(span, format!("{what} must be a number, found {}", v.describe())),
            K::Bool => self.errs.push(span, format!("{what} is a mask (bool) but the pointer holds {elem}; convert it with `as {elem}`")),
            k => match &v.dtype {
                Some(d) if d != elem => {
                    self.errs.push(span, format!("{what} is {} but the pointer holds {elem}; convert it with `as {elem}`", v.describe()))
                }
                None if !v.konst && k != self.kind(elem) => {
                    self.errs.push(span, format!("{what} is {} but the pointer holds {elem}; convert it with `as {elem}`", v.describe()))
                }
                None if v.konst && k == K::Float && self.kind(elem) == K::Int => {
                    self.errs.push(span, format!("{what} is a float literal but the pointer holds {elem}"))
                }
                _ => {}
            },
        }
    }
}
