//! Phase 1: `syn` → the kernel AST. Every construct the DSL does not have is rejected
//! here with an error at its span that says what to write instead.

use proc_macro2::{Punct, Spacing, Span, TokenStream};
use quote::{ToTokens, TokenStreamExt};
use syn::spanned::Spanned;
use syn::Error;

use crate::builtins::Bin;

/// Element types a pointer may point to.
pub const PTR_ELEMS: &[&str] = &["f32", "f16", "bf16", "i32", "i64", "u8"];
/// Scalar parameter types.
pub const SCALARS: &[&str] = &["i32", "i64", "f32"];
/// Types a compile-time parameter may have.
pub const CONST_TYPES: &[&str] = &["usize", "u32", "i32", "i64", "bool"];
/// Types `as` / `cast::<T>` convert to.
pub const CAST_TYPES: &[&str] = &["f32", "f16", "bf16", "i32", "i64", "u8", "bool"];

/// A `#[kernel]`, or a `#[kernel_fn]` helper (`helper` set).
pub struct Kernel {
    pub vis: syn::Visibility,
    pub attrs: Vec<syn::Attribute>,
    pub name: syn::Ident,
    /// Element type parameters (`T: Float`).
    pub types: Vec<TypeParam>,
    pub consts: Vec<ConstParam>,
    /// Helper type parameters (`S: KernelFn`): a `#[kernel_fn]` the kernel calls as `S(..)`.
    pub fns: Vec<syn::Ident>,
    /// The generic parameters in the order they are written (Rust's order for the
    /// generated struct: `softmax::<f32, 1, 4096>`).
    pub order: Vec<GenParam>,
    pub params: Vec<Param>,
    pub body: Block,
    pub helper: Option<Helper>,
}

impl Kernel {
    /// What messages call it: "kernel" or "helper".
    pub fn what(&self) -> &'static str {
        if self.helper.is_some() { "helper" } else { "kernel" }
    }
    pub fn type_param(&self, name: &str) -> Option<&TypeParam> {
        self.types.iter().find(|t| t.name == name)
    }
    /// Whether `name` is a helper type parameter (`S: KernelFn`).
    pub fn is_fn_param(&self, name: &str) -> bool {
        self.fns.iter().any(|f| f == name)
    }
}

/// A `#[kernel_fn]`'s result.
pub struct Helper {
    /// What it returns (`-> T`); `None`: nothing.
    pub ret: Option<ParamTy>,
    /// The return type, or the signature when there is none.
    pub ret_span: Sp,
}

pub struct ConstParam {
    pub name: syn::Ident,
    pub ty: String,
}

/// An element type parameter, `T: Float`.
pub struct TypeParam {
    pub name: syn::Ident,
    pub bound: Bound,
}

/// The bounds an element type parameter can have, with the element types that meet each
/// (the runtime's `dsl::Float` and `dsl::Int`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Bound {
    Float,
    Int,
}

impl Bound {
    pub const ALL: [Bound; 2] = [Bound::Float, Bound::Int];
    pub fn name(self) -> &'static str {
        match self {
            Bound::Float => "Float",
            Bound::Int => "Int",
        }
    }
    /// The element types that meet the bound.
    pub fn members(self) -> &'static [&'static str] {
        match self {
            Bound::Float => &["f32", "f16", "bf16"],
            Bound::Int => &["i32", "i64", "u8"],
        }
    }
    /// "`T: Float` (f32, f16, bf16) or `T: Int` (i32, i64, u8)"
    pub fn choices() -> String {
        Bound::ALL.iter().map(|b| format!("`T: {}` ({})", b.name(), b.members().join(", "))).collect::<Vec<_>>().join(" or ")
    }
}

#[derive(Clone, Copy)]
pub enum GenParam {
    Type(usize),
    Const(usize),
    Fn(usize),
}

pub struct Param {
    pub name: syn::Ident,
    pub ty: ParamTy,
    /// The parameter's type as written (the spans of the generated signature).
    pub ty_span: Sp,
}

/// A parameter's type; the element type may be a type parameter's name (`Ptr<T>`).
#[derive(Clone, PartialEq)]
pub enum ParamTy {
    Ptr(String),
    /// A kernel's scalar parameter.
    Scalar(String),
    /// A helper's value parameter or result: a scalar or a block of any shape.
    Value(String),
}

impl ParamTy {
    /// As written: `Ptr<T>`, `f32`.
    pub fn spelling(&self) -> String {
        match self {
            ParamTy::Ptr(e) => format!("Ptr<{e}>"),
            ParamTy::Scalar(e) | ParamTy::Value(e) => e.clone(),
        }
    }
}

pub struct Block {
    pub stmts: Vec<Stmt>,
    pub tail: Option<Box<Expr>>,
}

pub enum Stmt {
    Let { name: syn::Ident, mutable: bool, init: Expr },
    Assign { name: syn::Ident, op: Option<Bin>, value: Expr, span: Sp },
    Expr(Expr),
}

pub enum Expr {
    Int(i64, Sp),
    Float(f64, Sp),
    Bool(bool, Sp),
    Var(syn::Ident),
    Binary { op: Bin, lhs: Box<Expr>, rhs: Box<Expr>, span: Sp },
    Neg(Box<Expr>, Sp),
    Not(Box<Expr>, Sp),
    /// A call of a builtin or a `#[kernel_fn]`; method calls `x.f(y)` become `f(x, y)`
    /// with `method` set. `path`: the callee was written as a path (`helpers::gelu`), of
    /// which `func` is the last segment: always a helper.
    Call { func: syn::Ident, path: Option<Box<syn::Path>>, generics: Vec<Generic>, args: Vec<Expr>, method: bool, span: Sp },
    /// `x as T`: `ty` is checked in validation (it may be a type parameter).
    Cast { expr: Box<Expr>, ty: String, ty_span: Sp, span: Sp },
    /// `if`: compile-time when the condition uses only constants (kept as Rust), else a
    /// runtime branch on a scalar `bool` (`cond_dsl`, absent when the condition is not
    /// DSL syntax; `cond_errors` says why). Its span is the head, `if cond`.
    If { cond: Box<syn::Expr>, cond_dsl: Option<Box<Expr>>, cond_errors: Vec<Error>, then: Block, els: Option<Block>, span: Sp },
    /// `for var in start..end` or `for var in (start..end).step_by(step)`; its span is
    /// the head, `for var in range`.
    For { var: syn::Ident, start: Box<Expr>, end: Box<Expr>, step: Option<Box<Expr>>, body: Block, span: Sp },
    /// `return;`
    Return(Sp),
    /// A string literal (messages of `device_assert`, prefixes of `device_print`).
    Str(String, Sp),
    /// `[a, b]`: a block shape or a permutation, of compile-time values.
    Array(Vec<Expr>, Sp),
    Block(Block, Sp),
    /// Syntax that was rejected (already reported); typed as anything, so that the
    /// mistake is reported once.
    Error(Sp),
}

pub enum Generic {
    Type(String, Sp),
    Const(Box<syn::Expr>),
}

impl Expr {
    pub fn span(&self) -> Sp {
        match self {
            Expr::Int(_, s) | Expr::Float(_, s) | Expr::Bool(_, s) | Expr::Neg(_, s) | Expr::Not(_, s) | Expr::Block(_, s) | Expr::Error(s) => *s,
            Expr::Return(s) | Expr::Str(_, s) | Expr::Array(_, s) => *s,
            Expr::Var(i) => i.span().into(),
            Expr::Binary { span, .. } | Expr::Call { span, .. } | Expr::Cast { span, .. } | Expr::If { span, .. } | Expr::For { span, .. } => *span,
        }
    }
}

/// Where a piece of syntax is: its first and last token. An error at an `Sp` underlines
/// everything in between, as `syn::Error::new_spanned` does (proc_macro2 cannot join
/// spans on stable Rust, but rustc joins the two ends of the `compile_error!` it emits).
#[derive(Clone, Copy)]
pub struct Sp {
    pub start: Span,
    pub end: Span,
}

impl Sp {
    /// The whole of `t`.
    pub fn of(t: &impl ToTokens) -> Sp {
        let mut tokens = t.to_token_stream().into_iter();
        let start = tokens.next().map_or_else(Span::call_site, |t| t.span());
        let end = tokens.last().map_or(start, |t| t.span());
        Sp { start, end }
    }

    /// From the start of `self` to the end of `end`.
    pub fn to(self, end: impl Into<Sp>) -> Sp {
        Sp { start: self.start, end: end.into().end }
    }
}

impl From<Span> for Sp {
    fn from(s: Span) -> Sp {
        Sp { start: s, end: s }
    }
}

impl ToTokens for Sp {
    fn to_tokens(&self, tokens: &mut TokenStream) {
        for s in [self.start, self.end] {
            let mut p = Punct::new('.', Spacing::Alone);
            p.set_span(s);
            tokens.append(p);
        }
    }
}

/// Errors collected across a whole kernel, reported together.
#[derive(Default)]
pub struct Errors(pub Vec<Error>);

impl Errors {
    /// An error at `span`: a token, or a whole piece of syntax ([`Sp`]).
    pub fn push(&mut self, span: impl Into<Sp>, msg: impl std::fmt::Display) {
        self.0.push(Error::new_spanned(span.into(), msg));
    }
    /// An error underlining all of `syntax`.
    pub fn spanned(&mut self, syntax: &impl ToTokens, msg: impl std::fmt::Display) {
        self.0.push(Error::new_spanned(syntax, msg));
    }
    pub fn add(&mut self, e: Error) {
        self.0.push(e);
    }
    pub fn combine(self) -> Option<Error> {
        self.0.into_iter().reduce(|mut a, b| {
            a.combine(b);
            a
        })
    }
}

fn type_name(ty: &syn::Type) -> Option<String> {
    match ty {
        syn::Type::Path(p) if p.qself.is_none() && p.path.segments.len() == 1 && p.path.segments[0].arguments.is_none() => {
            Some(p.path.segments[0].ident.to_string())
        }
        _ => None,
    }
}

/// The element type in `Ptr<..>` or in a helper's value type: a pointer element type (or
/// `bool`, for `with_bool`) or a type parameter.
fn elem_type(ty: &syn::Type, types: &[TypeParam], with_bool: bool) -> Option<String> {
    let n = type_name(ty)?;
    let known = PTR_ELEMS.contains(&n.as_str()) || (with_bool && n == "bool") || types.iter().any(|t| t.name == n);
    known.then_some(n)
}

/// The `T` of `Ptr<T>`, when `ty` is written so.
fn ptr_arg(ty: &syn::Type) -> Option<Result<&syn::Type, ()>> {
    let syn::Type::Path(p) = ty else { return None };
    let last = p.path.segments.last()?;
    if last.ident != "Ptr" {
        return None;
    }
    Some(match &last.arguments {
        syn::PathArguments::AngleBracketed(a) => match (a.args.len(), a.args.first()) {
            (1, Some(syn::GenericArgument::Type(t))) => Ok(t),
            _ => Err(()),
        },
        _ => Err(()),
    })
}

/// A kernel's (`helper` unset) or a helper's parameter type, or a helper's result type.
fn param_type(ty: &syn::Type, types: &[TypeParam], helper: bool, errs: &mut Errors) -> Option<ParamTy> {
    let generic = |n: &str| types.iter().any(|t| t.name == n);
    let elems = if types.is_empty() { "f32, f16, bf16, i32, i64, u8" } else { "f32, f16, bf16, i32, i64, u8 or a type parameter" };
    match ptr_arg(ty) {
        Some(Ok(t)) => {
            return match elem_type(t, types, false) {
                Some(n) => Some(ParamTy::Ptr(n)),
                None => {
                    let elems = if types.is_empty() { "f32, f16, bf16, i32, i64 or u8" } else { elems };
                    errs.spanned(&t, format!("unsupported pointer element type; `Ptr<T>` takes {elems}"));
                    None
                }
            };
        }
        Some(Err(())) => {
            errs.spanned(&ty, "`Ptr` takes one element type, as in `Ptr<f32>`");
            return None;
        }
        None => {}
    }
    if helper {
        return match elem_type(ty, types, true) {
            Some(n) => Some(ParamTy::Value(n)),
            None => {
                let bad = match ty {
                    syn::Type::Tuple(_) => "a `#[kernel_fn]` takes and returns single values; several results are several helpers".to_string(),
                    _ => format!("unsupported type; a `#[kernel_fn]` takes and returns `Ptr<T>` (a pointer or a block of pointers) and element types for values of any shape: {elems}, bool"),
                };
                errs.spanned(&ty, bad);
                None
            }
        };
    }
    match type_name(ty) {
        Some(n) if SCALARS.contains(&n.as_str()) => Some(ParamTy::Scalar(n)),
        Some(n) if generic(&n) => {
            errs.spanned(
                &ty,
                format!("a scalar parameter cannot have the element type `{n}`, which may be f16 or bf16: scalars are `i32`, `i64` or `f32` (take an `f32` and convert it with `as {n}`)"),
            );
            None
        }
        _ => {
            errs.spanned(&ty, format!("unsupported parameter type; kernels take `Ptr<T>` (T: {elems}) and scalars `i32`, `i64`, `f32`"));
            None
        }
    }
}

/// An element type parameter's bound: `Float` or `Int`, written alone (a path ending in
/// it, such as `dsl::Float`, is accepted).
fn bound(t: &syn::TypeParam, errs: &mut Errors) -> Bound {
    let name = &t.ident;
    let choices = Bound::choices();
    if let Some(d) = &t.default {
        errs.spanned(d, format!("an element type parameter takes no default: `{name}` is given at each use (or inferred from the buffers)"));
    }
    let traits: Vec<&syn::TraitBound> = t
        .bounds
        .iter()
        .filter_map(|b| match b {
            syn::TypeParamBound::Trait(tb) => Some(tb),
            _ => None,
        })
        .collect();
    if t.bounds.is_empty() {
        errs.push(name.span(), format!("type parameter `{name}` needs a bound that says which element types it stands for: {choices}"));
        return Bound::Float;
    }
    if let [tb] = traits.as_slice() {
        if t.bounds.len() == 1 && tb.lifetimes.is_none() && matches!(tb.modifier, syn::TraitBoundModifier::None) {
            if let Some(last) = tb.path.segments.last().filter(|s| s.arguments.is_none()) {
                if let Some(b) = Bound::ALL.into_iter().find(|b| last.ident == b.name()) {
                    return b;
                }
            }
        }
    }
    errs.spanned(&t.bounds, format!("unsupported bound: element type parameters are bounded by one of {choices}; a `#[kernel_fn]` passed as a type by `KernelFn` alone"));
    Bound::Float
}

/// A type parameter bounded by `KernelFn` alone (a path ending in it, such as
/// `dsl::KernelFn`, is accepted): a `#[kernel_fn]` passed as a type.
fn is_kernel_fn_bound(t: &syn::TypeParam) -> bool {
    matches!(t.bounds.iter().collect::<Vec<_>>().as_slice(), [syn::TypeParamBound::Trait(tb)]
        if tb.lifetimes.is_none()
            && matches!(tb.modifier, syn::TraitBoundModifier::None)
            && tb.path.segments.last().is_some_and(|s| s.ident == "KernelFn" && s.arguments.is_none()))
}

/// Parse the signature and body of a kernel, or of a helper (`helper`). Returns it (if the
/// signature was understood) and every error found.
pub fn kernel(item: &syn::ItemFn, helper: bool, errs: &mut Errors) -> Option<Kernel> {
    let sig = &item.sig;
    let what = if helper { "a `#[kernel_fn]`" } else { "a kernel" };
    let mut ok = true;
    if let Some(t) = &sig.asyncness {
        errs.spanned(&t, format!("{what} cannot be `async`"));
    }
    if let Some(t) = &sig.unsafety {
        let why = if helper { "it is inlined into kernels, whose launch is made memory-safe by bounds guards" } else { "its launch is made memory-safe by bounds guards; use `launch_unchecked` to skip them" };
        errs.spanned(&t, format!("{what} cannot be `unsafe`: {why}"));
    }
    if let Some(t) = &sig.constness {
        errs.spanned(&t, format!("{what} cannot be a `const fn`"));
    }
    if let Some(t) = &sig.variadic {
        errs.spanned(&t, format!("{what} takes no variadic arguments"));
        ok = false;
    }
    if let Some(w) = &sig.generics.where_clause {
        errs.spanned(&w, format!("{what} takes no `where` clause: write the bound with the parameter, as in `T: Float`"));
    }
    let (mut types, mut consts, mut fns, mut order) = (vec![], vec![], vec![], vec![]);
    for g in &sig.generics.params {
        match g {
            syn::GenericParam::Const(c) => match type_name(&c.ty) {
                Some(n) if CONST_TYPES.contains(&n.as_str()) => {
                    if let Some(d) = &c.default {
                        errs.spanned(d, "compile-time parameters take no default");
                    }
                    order.push(GenParam::Const(consts.len()));
                    consts.push(ConstParam { name: c.ident.clone(), ty: n });
                }
                _ => {
                    errs.spanned(&c.ty, "compile-time parameters must be `usize`, `u32`, `i32`, `i64` or `bool`");
                    ok = false;
                }
            },
            syn::GenericParam::Type(t) if is_kernel_fn_bound(t) => {
                if helper {
                    errs.spanned(&t.bounds, "a `#[kernel_fn]` takes no helper type parameters: only a `#[kernel]` is generic over a helper (`S: KernelFn`)");
                }
                if let Some(d) = &t.default {
                    errs.spanned(d, format!("a helper type parameter takes no default: `{}` is given at each use", t.ident));
                }
                order.push(GenParam::Fn(fns.len()));
                fns.push(t.ident.clone());
            }
            syn::GenericParam::Type(t) => {
                let bound = bound(t, errs);
                order.push(GenParam::Type(types.len()));
                types.push(TypeParam { name: t.ident.clone(), bound });
            }
            syn::GenericParam::Lifetime(l) => {
                errs.spanned(l, format!("{what} takes no lifetime parameters; it is generic over element types (`T: Float`) and compile-time constants (`const BLOCK: usize`)"));
                ok = false;
            }
        }
    }
    let ret = match &sig.output {
        syn::ReturnType::Type(_, t) if !helper => {
            errs.spanned(&t, "a kernel returns nothing: it writes its results through `Ptr` parameters with `store`");
            None
        }
        syn::ReturnType::Type(_, t) => match param_type(t, &types, true, errs) {
            Some(r) => Some((Some(r), Sp::of(t))),
            None => {
                ok = false;
                None
            }
        },
        syn::ReturnType::Default => Some((None, Sp::of(sig))),
    };
    let mut params = vec![];
    for input in &sig.inputs {
        match input {
            syn::FnArg::Receiver(r) => {
                errs.spanned(&r, format!("{what} is a free function and takes no `self`"));
                ok = false;
            }
            syn::FnArg::Typed(pt) => {
                let name = match &*pt.pat {
                    syn::Pat::Ident(i) if i.by_ref.is_none() && i.subpat.is_none() => i.ident.clone(),
                    other => {
                        errs.spanned(&other, format!("{} parameters must be plain names", if helper { "helper" } else { "kernel" }));
                        ok = false;
                        continue;
                    }
                };
                match param_type(&pt.ty, &types, helper, errs) {
                    Some(ty) => params.push(Param { name, ty, ty_span: Sp::of(&pt.ty) }),
                    None => ok = false,
                }
            }
        }
    }
    if helper {
        // A helper's type parameters are inferred from its arguments.
        for t in &types {
            let used = params.iter().any(|p| matches!(&p.ty, ParamTy::Ptr(e) | ParamTy::Value(e) if t.name == e));
            if !used {
                errs.push(
                    t.name.span(),
                    format!("`{0}` must be the element type of a parameter (`x: {0}` or `p: Ptr<{0}>`): a helper's type parameters are inferred from its arguments at each call", t.name),
                );
            }
        }
    }
    let body = block(&item.block, errs);
    let helper = match ret {
        Some((ret, ret_span)) if helper => Some(Helper { ret, ret_span }),
        _ => None,
    };
    ok.then(|| Kernel { vis: item.vis.clone(), attrs: item.attrs.clone(), name: sig.ident.clone(), types, consts, fns, order, params, body, helper })
}

pub fn block(b: &syn::Block, errs: &mut Errors) -> Block {
    let mut stmts = vec![];
    let mut tail = None;
    let n = b.stmts.len();
    for (i, s) in b.stmts.iter().enumerate() {
        match s {
            syn::Stmt::Local(l) => {
                let (name, mutable) = match &l.pat {
                    syn::Pat::Ident(p) if p.by_ref.is_none() && p.subpat.is_none() => (p.ident.clone(), p.mutability.is_some()),
                    syn::Pat::Type(pt) => match &*pt.pat {
                        syn::Pat::Ident(p) => {
                            errs.spanned(&pt.ty, "`let` takes no type annotation in a kernel: types are inferred (convert with `as`)");
                            (p.ident.clone(), p.mutability.is_some())
                        }
                        other => {
                            errs.spanned(&other, "`let` binds one name in a kernel");
                            continue;
                        }
                    },
                    other => {
                        errs.spanned(&other, "`let` binds one name in a kernel (no tuples or patterns)");
                        continue;
                    }
                };
                let Some(init) = &l.init else {
                    errs.spanned(&l, "`let` needs a value in a kernel");
                    continue;
                };
                if let Some((_, e)) = &init.diverge {
                    errs.spanned(&e, "`let ... else` is not supported in a kernel");
                }
                stmts.push(Stmt::Let { name, mutable, init: expr(&init.expr, errs) });
            }
            syn::Stmt::Expr(e, semi) => {
                if let syn::Expr::Assign(a) = e {
                    stmts.extend(assign(&a.left, None, &a.right, Sp::of(e), errs));
                } else if let syn::Expr::Binary(bin) = e {
                    match operator(&bin.op) {
                        Some((op, true)) => {
                            stmts.extend(assign(&bin.left, Some(op), &bin.right, Sp::of(e), errs));
                        }
                        _ if semi.is_none() && i + 1 == n => tail = Some(Box::new(expr(e, errs))),
                        _ => stmts.push(Stmt::Expr(expr(e, errs))),
                    }
                } else if semi.is_none() && i + 1 == n {
                    tail = Some(Box::new(expr(e, errs)));
                } else {
                    stmts.push(Stmt::Expr(expr(e, errs)));
                }
            }
            syn::Stmt::Item(syn::Item::Fn(f)) => errs.spanned(
                &f.sig,
                "functions cannot be declared inside a kernel; declare the helper outside it with `#[kernel_fn]` and call it by name",
            ),
            syn::Stmt::Item(it) => errs.spanned(&it, "items (fn, struct, use, ...) cannot be declared inside a kernel"),
            syn::Stmt::Macro(m) => errs.spanned(&m.mac, "macros cannot be used inside a kernel"),
        }
    }
    Block { stmts, tail }
}

/// The DSL operator a Rust binary operator is, and whether it is its compound assignment
/// (`+=`). `&&`, `||` and shifts are not DSL operators.
fn operator(op: &syn::BinOp) -> Option<(Bin, bool)> {
    use syn::BinOp as S;
    Some(match op {
        S::Add(_) => (Bin::Add, false),
        S::Sub(_) => (Bin::Sub, false),
        S::Mul(_) => (Bin::Mul, false),
        S::Div(_) => (Bin::Div, false),
        S::Rem(_) => (Bin::Rem, false),
        S::BitAnd(_) => (Bin::And, false),
        S::BitOr(_) => (Bin::Or, false),
        S::BitXor(_) => (Bin::Xor, false),
        S::Lt(_) => (Bin::Lt, false),
        S::Le(_) => (Bin::Le, false),
        S::Gt(_) => (Bin::Gt, false),
        S::Ge(_) => (Bin::Ge, false),
        S::Eq(_) => (Bin::Eq, false),
        S::Ne(_) => (Bin::Ne, false),
        S::AddAssign(_) => (Bin::Add, true),
        S::SubAssign(_) => (Bin::Sub, true),
        S::MulAssign(_) => (Bin::Mul, true),
        S::DivAssign(_) => (Bin::Div, true),
        S::RemAssign(_) => (Bin::Rem, true),
        S::BitAndAssign(_) => (Bin::And, true),
        S::BitOrAssign(_) => (Bin::Or, true),
        S::BitXorAssign(_) => (Bin::Xor, true),
        _ => return None,
    })
}

fn assign(lhs: &syn::Expr, op: Option<Bin>, rhs: &syn::Expr, span: Sp, errs: &mut Errors) -> Option<Stmt> {
    match lhs {
        syn::Expr::Path(p) if p.path.get_ident().is_some() => {
            Some(Stmt::Assign { name: p.path.get_ident().unwrap().clone(), op, value: expr(rhs, errs), span })
        }
        other => {
            errs.spanned(&other, "only variables can be assigned in a kernel; write memory with `store(ptr, value, mask)`");
            None
        }
    }
}

fn lit_int(l: &syn::LitInt, errs: &mut Errors) -> Expr {
    match l.base10_parse::<i64>() {
        Ok(v) => {
            if !matches!(l.suffix(), "" | "i32" | "i64" | "usize" | "u32") {
                errs.spanned(&l, "integer literals in kernels take no suffix other than i32/i64; convert with `as`");
            }
            Expr::Int(v, l.span().into())
        }
        Err(e) => {
            errs.add(e);
            Expr::Int(0, l.span().into())
        }
    }
}

pub fn expr(e: &syn::Expr, errs: &mut Errors) -> Expr {
    let span = Sp::of(e);
    let unsupported = |errs: &mut Errors, what: &str| {
        errs.push(span, what);
        Expr::Error(span)
    };
    match e {
        syn::Expr::Lit(l) => match &l.lit {
            syn::Lit::Int(i) => lit_int(i, errs),
            syn::Lit::Float(f) => match f.base10_parse::<f64>() {
                Ok(v) => Expr::Float(v, span),
                Err(err) => {
                    errs.add(err);
                    Expr::Float(0.0, span)
                }
            },
            syn::Lit::Bool(b) => Expr::Bool(b.value, span),
            syn::Lit::Str(t) => Expr::Str(t.value(), span),
            _ => unsupported(errs, "only integer, float, bool and string literals exist in kernels"),
        },
        syn::Expr::Path(p) if p.path.segments.len() == 2 && matches!(p.path.segments[0].ident.to_string().as_str(), "f32" | "f64") => {
            let v = match p.path.segments[1].ident.to_string().as_str() {
                "INFINITY" => f64::INFINITY,
                "NEG_INFINITY" => f64::NEG_INFINITY,
                "NAN" => f64::NAN,
                "MAX" => f32::MAX as f64,
                "MIN" => f32::MIN as f64,
                _ => return unsupported(errs, "of the float constants, kernels know INFINITY, NEG_INFINITY, NAN, MAX and MIN"),
            };
            Expr::Float(v, span)
        }
        syn::Expr::Path(p) => match p.path.get_ident() {
            Some(i) => Expr::Var(i.clone()),
            None => unsupported(errs, "paths are not supported in kernels; use a local name, a parameter or a const generic"),
        },
        syn::Expr::Paren(p) => expr(&p.expr, errs),
        syn::Expr::Group(g) => expr(&g.expr, errs),
        syn::Expr::Binary(b) => {
            let op = match (operator(&b.op), &b.op) {
                (Some((op, false)), _) => op,
                (_, syn::BinOp::And(_)) => return unsupported(errs, "`&&` short-circuits and is not defined on blocks; combine masks with `&`"),
                (_, syn::BinOp::Or(_)) => return unsupported(errs, "`||` short-circuits and is not defined on blocks; combine masks with `|`"),
                (_, syn::BinOp::Shl(_) | syn::BinOp::Shr(_)) => return unsupported(errs, "shifts are not supported in kernels yet; multiply or divide by a power of two"),
                _ => return unsupported(errs, "compound assignment is only allowed as a statement"),
            };
            Expr::Binary { op, lhs: Box::new(expr(&b.left, errs)), rhs: Box::new(expr(&b.right, errs)), span }
        }
        syn::Expr::Unary(u) => match u.op {
            syn::UnOp::Neg(_) => Expr::Neg(Box::new(expr(&u.expr, errs)), span),
            syn::UnOp::Not(_) => Expr::Not(Box::new(expr(&u.expr, errs)), span),
            _ => unsupported(errs, "dereferencing is not supported in kernels; read memory with `load(ptr, mask, other)`"),
        },
        syn::Expr::Cast(c) => match type_name(&c.ty) {
            // Whether `t` is a type kernels have (or a type parameter) is decided in validation.
            Some(t) => Expr::Cast { expr: Box::new(expr(&c.expr, errs)), ty: t, ty_span: Sp::of(&c.ty), span },
            None => {
                errs.spanned(&c.ty, bad_cast("`as`", None));
                // Checked as written, but typed as anything: the cast's result is unknown.
                expr(&c.expr, errs);
                Expr::Error(span)
            }
        },
        syn::Expr::Call(c) => {
            let (func, path, generics) = match &*c.func {
                // `f(x)`: a builtin or a helper; `helpers::f(x)`: a helper.
                syn::Expr::Path(p) if p.qself.is_none() && p.path.segments.iter().rev().skip(1).all(|s| s.arguments.is_none()) => {
                    let last = p.path.segments.last().expect("a path has a segment");
                    let path = (p.path.segments.len() > 1 || p.path.leading_colon.is_some()).then(|| Box::new(p.path.clone()));
                    (last.ident.clone(), path, generic_args(&last.arguments, errs))
                }
                other => {
                    // `<T as X>::f(x)`, `(f)(x)`, `x.0(y)`: not a function by name.
                    let name = other.to_token_stream().to_string();
                    errs.spanned(other, crate::builtins::not_a_builtin(&name, false));
                    for a in &c.args {
                        expr(a, errs);
                    }
                    return Expr::Error(span);
                }
            };
            let args = c.args.iter().map(|a| expr(a, errs)).collect();
            Expr::Call { func, path, generics, args, method: false, span }
        }
        syn::Expr::MethodCall(m) => {
            let generics = match &m.turbofish {
                Some(t) => t.args.iter().filter_map(|a| generic_arg(a, errs)).collect(),
                None => vec![],
            };
            let mut args = vec![expr(&m.receiver, errs)];
            args.extend(m.args.iter().map(|a| expr(a, errs)));
            Expr::Call { func: m.method.clone(), path: None, generics, args, method: true, span }
        }
        syn::Expr::If(i) => {
            let then = block(&i.then_branch, errs);
            let els = match &i.else_branch {
                None => None,
                Some((_, e)) => match &**e {
                    syn::Expr::Block(b) => Some(block(&b.block, errs)),
                    syn::Expr::If(_) => Some(Block { stmts: vec![], tail: Some(Box::new(expr(e, errs))) }),
                    other => {
                        errs.spanned(&other, "`else` takes a block");
                        None
                    }
                },
            };
            if let syn::Expr::Let(l) = &*i.cond {
                errs.spanned(&l, "`if let` is not supported in kernels");
            }
            // Whether the condition is a constant is decided in validation; keep both forms.
            let mut cond_errs = Errors::default();
            let c = expr(&i.cond, &mut cond_errs);
            let cond_errors = cond_errs.0;
            let cond_dsl = cond_errors.is_empty().then(|| Box::new(c));
            // Errors about the whole `if` underline its head, `if cond`.
            let span = Sp::of(&i.if_token).to(Sp::of(&i.cond));
            Expr::If { cond: i.cond.clone(), cond_dsl, cond_errors, then, els, span }
        }
        syn::Expr::ForLoop(l) => {
            if let Some(lab) = &l.label {
                errs.spanned(&lab, "loop labels are not supported in kernels");
            }
            let var = match &*l.pat {
                syn::Pat::Ident(p) if p.by_ref.is_none() && p.subpat.is_none() => p.ident.clone(),
                syn::Pat::Wild(w) => syn::Ident::new("_", w.span()),
                other => {
                    errs.spanned(&other, "a `for` loop binds one name");
                    return Expr::Error(span);
                }
            };
            let range_err = "a kernel `for` loops over `start..end` or `(start..end).step_by(step)`";
            let (range, step) = match &*l.expr {
                syn::Expr::MethodCall(m) if m.method == "step_by" && m.args.len() == 1 => (&*m.receiver, Some(Box::new(expr(&m.args[0], errs)))),
                other => (other, None),
            };
            let range = match range {
                syn::Expr::Paren(p) => &*p.expr,
                other => other,
            };
            let (start, end) = match range {
                syn::Expr::Range(r) if matches!(r.limits, syn::RangeLimits::HalfOpen(_)) => match (&r.start, &r.end) {
                    (Some(a), Some(b)) => (Box::new(expr(a, errs)), Box::new(expr(b, errs))),
                    _ => {
                        errs.spanned(&r, range_err);
                        return Expr::Error(span);
                    }
                },
                other => {
                    errs.spanned(&other, range_err);
                    return Expr::Error(span);
                }
            };
            let body = block(&l.body, errs);
            // Errors about the whole loop underline its head, `for i in range`.
            let span = Sp::of(&l.for_token).to(Sp::of(&l.expr));
            Expr::For { var, start, end, step, body, span }
        }
        syn::Expr::Return(r) => {
            if let Some(e) = &r.expr {
                errs.spanned(&e, "a kernel returns nothing: write `return;`");
            }
            Expr::Return(span)
        }
        syn::Expr::Array(a) => Expr::Array(a.elems.iter().map(|e| expr(e, errs)).collect(), span),
        syn::Expr::Block(b) if b.label.is_none() => Expr::Block(block(&b.block, errs), span),
        syn::Expr::While(w) => {
            // `while cond`: the loop's head, not its whole body.
            errs.push(Sp::of(&w.while_token).to(Sp::of(&w.cond)), "`while` is not supported in kernels; loop with `for i in (start..end).step_by(step)` (leave early with `if .. { return; }`)");
            Expr::Error(span)
        }
        syn::Expr::Loop(l) => {
            errs.spanned(&l.loop_token, "`loop` is not supported in kernels; loop with `for i in (start..end).step_by(step)` over a bounded range (leave early with `if .. { return; }`)");
            Expr::Error(span)
        }
        syn::Expr::Index(_) => unsupported(errs, "indexing is not supported in kernels; address memory with `ptr + offsets` and `load`/`store`"),
        syn::Expr::Closure(_) => unsupported(errs, "closures are not supported in kernels"),
        syn::Expr::Macro(_) => unsupported(errs, "macros cannot be used inside a kernel"),
        syn::Expr::Match(_) => unsupported(errs, "`match` is not supported in kernels; use `select(cond, a, b)` or a compile-time `if`"),
        syn::Expr::Reference(_) => unsupported(errs, "references are not supported in kernels; pointers are `Ptr<T>` parameters"),
        syn::Expr::Field(_) => unsupported(errs, "field access is not supported in kernels"),
        syn::Expr::Tuple(_) | syn::Expr::Repeat(_) | syn::Expr::Struct(_) => {
            unsupported(errs, "tuples and structs are not supported in kernels; blocks come from `arange`, `zeros` and `load`")
        }
        _ => unsupported(errs, "this syntax is not supported in kernels"),
    }
}

/// The error for a conversion (`as`, `cast::<T>`, `.to::<T>()`) to a type kernels lack.
pub fn bad_cast(what: &str, to: Option<&str>) -> String {
    let targets = "f32, f16, bf16, i32, i64, u8 or bool";
    match to {
        Some(t @ ("usize" | "isize" | "u64" | "u32" | "u16" | "i16" | "i8")) => {
            format!("kernels have no `{t}` values: {what} converts to {targets} (offsets and indices are i32 or i64)")
        }
        Some("f64") => format!("kernels have no `f64` values: {what} converts to {targets}"),
        Some(t) => format!("{what} converts to {targets}, not `{t}`"),
        None => format!("{what} converts to {targets}"),
    }
}

fn generic_args(args: &syn::PathArguments, errs: &mut Errors) -> Vec<Generic> {
    match args {
        syn::PathArguments::None => vec![],
        syn::PathArguments::AngleBracketed(a) => a.args.iter().filter_map(|g| generic_arg(g, errs)).collect(),
        syn::PathArguments::Parenthesized(p) => {
            errs.spanned(&p, "unexpected parenthesized arguments");
            vec![]
        }
    }
}

fn generic_arg(g: &syn::GenericArgument, errs: &mut Errors) -> Option<Generic> {
    match g {
        // `arange::<BLOCK>()` parses BLOCK as a type: a bare name stays ambiguous until
        // validation decides whether it is an element type or a constant.
        syn::GenericArgument::Type(t) => match type_name(t) {
            Some(n) => Some(Generic::Type(n, Sp::of(t))),
            None => {
                errs.spanned(&t, "expected an element type or a compile-time constant");
                None
            }
        },
        syn::GenericArgument::Const(e) => Some(Generic::Const(Box::new(e.clone()))),
        other => {
            errs.spanned(&other, "expected an element type or a compile-time constant");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Bound;
    use std::collections::BTreeSet;

    /// The macro's bounds and the runtime's traits (`dsl_runtime::dsl::Float`, `Int`)
    /// list the same element types: validation types a `T: Float` as a float because the
    /// runtime lets only floats be one.
    #[test]
    fn bounds_mirror_the_runtime() {
        let src = include_str!("../../dsl-runtime/src/dsl.rs");
        for b in Bound::ALL {
            let prefix = format!("impl {} for ", b.name());
            let implemented: BTreeSet<&str> = src
                .lines()
                .filter_map(|l| l.trim().strip_prefix(prefix.as_str()))
                .map(|rest| rest.trim_end_matches(" {}").rsplit("::").next().unwrap_or_default())
                .collect();
            assert_eq!(implemented, b.members().iter().copied().collect(), "`{}` in dsl-runtime/src/dsl.rs", b.name());
            assert!(src.contains(&format!("pub trait {}: Element", b.name())), "no trait `{}` in dsl-runtime/src/dsl.rs", b.name());
        }
    }
}
