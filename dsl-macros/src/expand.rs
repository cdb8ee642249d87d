//! Phase 3: generate the kernel's struct, its `dsl_runtime::Kernel` implementation (an IR
//! builder run once per specialization) and its typed launch functions.
//!
//! Kernel variables become Rust variables of type `dsl_runtime::ir::Operand`; every
//! operation becomes one builder call bound to a temporary, carrying the source location
//! of the DSL expression it came from (`line!()`/`column!()` spanned at that expression).
//! Compile-time `if`s stay Rust `if`s, evaluated while the IR is built.

use crate::parse::{self, Bin, Block, Errors, Expr, Generic, Kernel, ParamTy, Stmt};
use crate::validate::{self, Facts, CMP_METHODS, UNARY_MATH};
use proc_macro2::{Literal, Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use std::collections::HashSet;

pub fn kernel(attr: TokenStream, item: TokenStream) -> TokenStream {
    let mut errs = Errors::default();
    if !attr.is_empty() {
        errs.push(Span::call_site(), "`#[kernel]` takes no arguments");
    }
    let item: syn::ItemFn = match syn::parse2(item) {
        Ok(f) => f,
        Err(e) => return e.to_compile_error(),
    };
    let parsed = parse::kernel(&item, &mut errs);
    let Some(k) = parsed else {
        // The signature is unusable: emit the errors and a placeholder struct so that uses
        // of the kernel's name do not add errors of their own.
        let (vis, name) = (&item.vis, &item.sig.ident);
        let err = errs.combine().map(|e| e.to_compile_error());
        return quote! { #err #[allow(non_camel_case_types)] #vis struct #name; };
    };
    let facts = validate::check(&k, &mut errs);
    let errors = errs.combine().map(|e| e.to_compile_error());
    let body = if errors.is_none() { Gen::new(&k).body(&k.body) } else { quote! {} };
    let items = wrapper(&k, &facts, body);
    quote! { #errors #items }
}

fn dtype_tokens(d: &str) -> TokenStream {
    match d {
        "f32" => quote!(::dsl_runtime::DType::F32),
        "f16" => quote!(::dsl_runtime::DType::F16),
        "bf16" => quote!(::dsl_runtime::DType::BF16),
        "i32" => quote!(::dsl_runtime::DType::I32),
        "i64" => quote!(::dsl_runtime::DType::I64),
        "u8" => quote!(::dsl_runtime::DType::U8),
        _ => quote!(::dsl_runtime::DType::Bool),
    }
}

fn rust_type(d: &str) -> TokenStream {
    match d {
        "f16" => quote!(::dsl_runtime::half::f16),
        "bf16" => quote!(::dsl_runtime::half::bf16),
        other => {
            let i = format_ident!("{}", other);
            quote!(#i)
        }
    }
}

fn wrapper(k: &Kernel, facts: &Facts, body: TokenStream) -> TokenStream {
    let Kernel { vis, attrs, name, consts, params, .. } = k;
    let name_str = name.to_string();
    let meta = format_ident!("__RUTILE_KERNEL_META_{}", name);
    let cnames: Vec<_> = consts.iter().map(|c| &c.name).collect();
    let ctypes: Vec<_> = consts.iter().map(|c| format_ident!("{}", c.ty)).collect();
    let generics_decl = quote!(<#(const #cnames: #ctypes),*>);
    let generics_use = quote!(<#(#cnames),*>);
    let line = name.span().start().line as u32;
    let pnames: Vec<_> = params.iter().map(|p| &p.name).collect();
    let pkinds = params.iter().zip(&facts.writable).map(|(p, &w)| match &p.ty {
        ParamTy::Ptr(e) => {
            let d = dtype_tokens(e);
            quote!(::dsl_runtime::ir::ParamKind::Ptr { elem: #d, writable: #w })
        }
        ParamTy::Scalar(s) => {
            let d = dtype_tokens(s);
            quote!(::dsl_runtime::ir::ParamKind::Scalar(#d))
        }
    });
    let pstrs: Vec<String> = pnames.iter().map(|p| p.to_string()).collect();
    let arg_types: Vec<TokenStream> = params
        .iter()
        .zip(&facts.writable)
        .map(|(p, &w)| match &p.ty {
            ParamTy::Ptr(e) => {
                let t = rust_type(e);
                if w { quote!(impl ::dsl_runtime::launch::OutPtr<#t>) } else { quote!(impl ::dsl_runtime::launch::InPtr<#t>) }
            }
            ParamTy::Scalar(s) => rust_type(s),
        })
        .collect();
    let binds: Vec<TokenStream> = params
        .iter()
        .zip(&facts.writable)
        .map(|(p, &w)| {
            let n = &p.name;
            match &p.ty {
                ParamTy::Ptr(e) => {
                    let t = rust_type(e);
                    if w {
                        quote!(::dsl_runtime::launch::OutPtr::<#t>::bind(&mut #n, __stream, &mut __bind))
                    } else {
                        quote!(::dsl_runtime::launch::InPtr::<#t>::bind(&#n, __stream, &mut __bind))
                    }
                }
                ParamTy::Scalar(_) => quote!(::dsl_runtime::launch::ScalarArg::arg(#n)),
            }
        })
        .collect();
    let muts: Vec<TokenStream> = params
        .iter()
        .zip(&facts.writable)
        .map(|(p, &w)| if w && matches!(p.ty, ParamTy::Ptr(_)) { quote!(mut) } else { quote!() })
        .collect();
    let param_bindings = pnames.iter().enumerate().map(|(i, n)| quote!(let #n = ::dsl_runtime::ir::Operand::V(__b.param(#i));));
    let doc_sig = params
        .iter()
        .zip(&facts.writable)
        .map(|(p, &w)| match &p.ty {
            ParamTy::Ptr(e) => format!("`{}`: {} buffer of `{e}`", p.name, if w { "written" } else { "read" }),
            ParamTy::Scalar(s) => format!("`{}`: `{s}`", p.name),
        })
        .collect::<Vec<_>>()
        .join(", ");
    let launch_doc = format!("Launch `{name_str}` with bounds-guarded accesses. Arguments: {doc_sig}.");
    quote! {
        #(#attrs)*
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy, Debug, Default)]
        #vis struct #name #generics_decl;

        #[allow(non_upper_case_globals)]
        #[doc(hidden)]
        static #meta: ::dsl_runtime::launch::KernelMeta = ::dsl_runtime::launch::KernelMeta {
            name: #name_str,
            file: file!(),
            line: #line,
            params: &[#((#pstrs, #pkinds)),*],
        };

        #[allow(clippy::too_many_arguments)]
        impl #generics_decl #name #generics_use {
            #[doc = #launch_doc]
            ///
            /// Every access outside the buffers passed here is suppressed (loads give
            /// `other`, stores do nothing), so this is safe whatever the masks say.
            pub fn launch<L: ::dsl_runtime::Launcher + ?Sized>(
                launcher: &L,
                cfg: ::dsl_runtime::LaunchConfig,
                #(#pnames: #arg_types),*
            ) -> ::dsl_runtime::Result<()> {
                Self::__launch(launcher, cfg, ::dsl_runtime::launch::Safety::Guarded, #(#pnames),*)
            }

            /// Launch without bounds guards: accesses are limited only by the kernel's masks.
            ///
            /// # Safety
            ///
            /// Every lane whose mask is true must address an element inside the buffer its
            /// pointer derives from. The CPU interpreter checks this and reports violations.
            pub unsafe fn launch_unchecked<L: ::dsl_runtime::Launcher + ?Sized>(
                launcher: &L,
                cfg: ::dsl_runtime::LaunchConfig,
                #(#pnames: #arg_types),*
            ) -> ::dsl_runtime::Result<()> {
                Self::__launch(launcher, cfg, ::dsl_runtime::launch::Safety::Unchecked, #(#pnames),*)
            }

            fn __launch<L: ::dsl_runtime::Launcher + ?Sized>(
                launcher: &L,
                cfg: ::dsl_runtime::LaunchConfig,
                safety: ::dsl_runtime::launch::Safety,
                #(#muts #pnames: #arg_types),*
            ) -> ::dsl_runtime::Result<()> {
                let __stream = launcher.cuda_stream();
                let mut __bind = ::dsl_runtime::launch::Bindings::default();
                let __args = [#(#binds),*];
                let __result = launcher.launch_args(&Self, &cfg, &__args, safety);
                drop(__bind);
                __result
            }
        }

        impl #generics_decl ::dsl_runtime::Kernel for #name #generics_use {
            fn meta(&self) -> &'static ::dsl_runtime::launch::KernelMeta {
                &#meta
            }
            fn type_key(&self) -> ::std::any::TypeId {
                ::dsl_runtime::launch::type_key_of::<Self>()
            }
            fn constants(&self) -> ::std::vec::Vec<(&'static str, ::std::string::String)> {
                ::std::vec![#((stringify!(#cnames), #cnames.to_string())),*]
            }
            #[allow(unused_variables, unused_mut, unused_parens, non_snake_case, clippy::all)]
            fn build(&self, __b: &mut ::dsl_runtime::ir::Builder) -> ::std::result::Result<(), ::dsl_runtime::BuildError> {
                #(#param_bindings)*
                #body
                Ok(())
            }
        }
    }
}

struct Gen {
    consts: HashSet<String>,
    next: usize,
}

fn loc(span: Span) -> TokenStream {
    quote_spanned!(span=> ::dsl_runtime::ir::Loc::new(line!(), column!()))
}

fn op_bin(op: Bin) -> TokenStream {
    match op {
        Bin::Add => quote!(::dsl_runtime::ir::BinOp::Add),
        Bin::Sub => quote!(::dsl_runtime::ir::BinOp::Sub),
        Bin::Mul => quote!(::dsl_runtime::ir::BinOp::Mul),
        Bin::Div => quote!(::dsl_runtime::ir::BinOp::Div),
        Bin::Rem => quote!(::dsl_runtime::ir::BinOp::Rem),
        Bin::And => quote!(::dsl_runtime::ir::BinOp::And),
        Bin::Or => quote!(::dsl_runtime::ir::BinOp::Or),
        Bin::Xor => quote!(::dsl_runtime::ir::BinOp::Xor),
        Bin::Lt => quote!(::dsl_runtime::ir::CmpOp::Lt),
        Bin::Le => quote!(::dsl_runtime::ir::CmpOp::Le),
        Bin::Gt => quote!(::dsl_runtime::ir::CmpOp::Gt),
        Bin::Ge => quote!(::dsl_runtime::ir::CmpOp::Ge),
        Bin::Eq => quote!(::dsl_runtime::ir::CmpOp::Eq),
        Bin::Ne => quote!(::dsl_runtime::ir::CmpOp::Ne),
    }
}

const UNIT: fn() -> TokenStream = || quote!(::dsl_runtime::ir::Operand::Bool(false));

impl Gen {
    fn new(k: &Kernel) -> Gen {
        Gen { consts: k.consts.iter().map(|c| c.name.to_string()).collect(), next: 0 }
    }

    fn tmp(&mut self) -> syn::Ident {
        self.next += 1;
        format_ident!("__t{}", self.next)
    }

    fn body(&mut self, b: &Block) -> TokenStream {
        let mut out = vec![];
        self.block_into(b, &mut out);
        quote!(#(#out)*)
    }

    /// Emit a block's statements into `out`; return its tail value (an `Operand`).
    fn block_into(&mut self, b: &Block, out: &mut Vec<TokenStream>) -> TokenStream {
        for s in &b.stmts {
            match s {
                Stmt::Let { name, mutable, init } => {
                    let v = self.expr(init, out);
                    let m = if *mutable { quote!(mut) } else { quote!() };
                    out.push(quote!(let #m #name: ::dsl_runtime::ir::Operand = #v;));
                }
                Stmt::Assign { name, op, value, span } => {
                    let v = self.expr(value, out);
                    let v = match op {
                        Some(op) => self.binary(*op, quote!(#name), v, *span, out),
                        None => v,
                    };
                    out.push(quote!(#name = #v;));
                }
                Stmt::Expr(e) => {
                    self.expr(e, out);
                }
            }
        }
        match &b.tail {
            Some(e) => self.expr(e, out),
            None => UNIT(),
        }
    }

    fn binary(&mut self, op: Bin, l: TokenStream, r: TokenStream, span: Span, out: &mut Vec<TokenStream>) -> TokenStream {
        let t = self.tmp();
        let (o, lc) = (op_bin(op), loc(span));
        let f = if op.is_cmp() { quote!(cmp) } else { quote!(binary) };
        out.push(quote!(let #t = __b.#f(#o, #l, #r, #lc)?;));
        quote!(::dsl_runtime::ir::Operand::V(#t))
    }

    fn call(&mut self, f: TokenStream, args: Vec<TokenStream>, span: Span, out: &mut Vec<TokenStream>) -> TokenStream {
        let t = self.tmp();
        let lc = loc(span);
        out.push(quote!(let #t = __b.#f(#(#args,)* #lc)?;));
        quote!(::dsl_runtime::ir::Operand::V(#t))
    }

    /// A compile-time expression as Rust `i64`.
    fn const_i64(&self, e: &Expr) -> TokenStream {
        match e {
            Expr::Int(i, _) => {
                let l = Literal::i64_suffixed(*i);
                quote!(#l)
            }
            Expr::Var(i) => quote!((#i as i64)),
            Expr::Neg(x, _) => {
                let x = self.const_i64(x);
                quote!((-#x))
            }
            Expr::Binary { op, lhs, rhs, .. } if !op.is_cmp() => {
                let (l, r) = (self.const_i64(lhs), self.const_i64(rhs));
                let o: TokenStream = op.symbol().parse().unwrap();
                quote!((#l #o #r))
            }
            Expr::Cast { expr, .. } => self.const_i64(expr),
            other => {
                let msg = "expected a compile-time integer expression (literals, const generics, + - * / %)";
                quote_spanned!(other.span()=> compile_error!(#msg))
            }
        }
    }

    fn generic_i64(g: &Generic) -> TokenStream {
        match g {
            Generic::Type(n, span) => {
                let i = syn::Ident::new(n, *span);
                quote!((#i as i64))
            }
            Generic::Const(e) => quote!(((#e) as i64)),
        }
    }

    fn expr(&mut self, e: &Expr, out: &mut Vec<TokenStream>) -> TokenStream {
        match e {
            Expr::Int(i, _) => {
                let l = Literal::i64_suffixed(*i);
                quote!(::dsl_runtime::ir::Operand::Int(#l))
            }
            Expr::Float(x, _) => {
                let l = Literal::f64_suffixed(*x);
                quote!(::dsl_runtime::ir::Operand::Float(#l))
            }
            Expr::Bool(b, _) => quote!(::dsl_runtime::ir::Operand::Bool(#b)),
            Expr::Var(i) if self.consts.contains(&i.to_string()) => {
                // A `bool` constant stays a bool; integers widen to i64.
                quote!(::dsl_runtime::ir::Operand::from_const(#i))
            }
            Expr::Var(i) => quote!(#i),
            Expr::Binary { op, lhs, rhs, span } => {
                let (l, r) = (self.expr(lhs, out), self.expr(rhs, out));
                self.binary(*op, l, r, *span, out)
            }
            Expr::Neg(x, span) => {
                let x = self.expr(x, out);
                self.call(quote!(unary), vec![quote!(::dsl_runtime::ir::UnaryOp::Neg), x], *span, out)
            }
            Expr::Not(x, span) => {
                let x = self.expr(x, out);
                self.call(quote!(unary), vec![quote!(::dsl_runtime::ir::UnaryOp::Not), x], *span, out)
            }
            Expr::Cast { expr, ty, span } => {
                let x = self.expr(expr, out);
                self.call(quote!(cast), vec![x, dtype_tokens(ty)], *span, out)
            }
            Expr::If { cond, then, els, .. } => {
                let t = self.tmp();
                let mut a = vec![];
                let va = self.block_into(then, &mut a);
                let mut b = vec![];
                let vb = match els {
                    Some(e) => self.block_into(e, &mut b),
                    None => UNIT(),
                };
                out.push(quote!(let #t: ::dsl_runtime::ir::Operand = if #cond { #(#a)* #va } else { #(#b)* #vb };));
                quote!(#t)
            }
            Expr::Block(b, _) => {
                let t = self.tmp();
                let mut a = vec![];
                let v = self.block_into(b, &mut a);
                out.push(quote!(let #t: ::dsl_runtime::ir::Operand = { #(#a)* #v };));
                quote!(#t)
            }
            Expr::Call { func, generics, args, span, .. } => self.builtin(func, generics, args, *span, out),
            Expr::Error(_) => UNIT(), // unreachable: errors stop the expansion of the body
        }
    }

    fn builtin(&mut self, func: &syn::Ident, generics: &[Generic], args: &[Expr], span: Span, out: &mut Vec<TokenStream>) -> TokenStream {
        let name = func.to_string();
        let none = quote!(::core::option::Option::None);
        match name.as_str() {
            "program_id" | "num_programs" => {
                let axis = self.const_i64(&args[0]);
                let f = format_ident!("{}", name);
                self.call(quote!(#f), vec![axis], span, out)
            }
            "arange" => {
                let (s, e) = match generics {
                    [g] => (quote!(0i64), Self::generic_i64(g)),
                    _ => (self.const_i64(&args[0]), self.const_i64(&args[1])),
                };
                self.call(quote!(arange), vec![s, e], span, out)
            }
            "load" => {
                let vals: Vec<TokenStream> = args.iter().map(|a| self.expr(a, out)).collect();
                let mask = vals.get(1).map(|m| quote!(::core::option::Option::Some(#m))).unwrap_or(none.clone());
                let other = vals.get(2).map(|o| quote!(::core::option::Option::Some(#o))).unwrap_or(none);
                self.call(quote!(load), vec![vals[0].clone(), mask, other], span, out)
            }
            "store" => {
                let vals: Vec<TokenStream> = args.iter().map(|a| self.expr(a, out)).collect();
                let mask = vals.get(2).map(|m| quote!(::core::option::Option::Some(#m))).unwrap_or(none);
                let (p, v, lc) = (&vals[0], &vals[1], loc(span));
                out.push(quote!(__b.store(#p, #v, #mask, #lc)?;));
                UNIT()
            }
            "select" => {
                let vals: Vec<TokenStream> = args.iter().map(|a| self.expr(a, out)).collect();
                self.call(quote!(select), vals, span, out)
            }
            "maximum" | "minimum" => {
                let vals: Vec<TokenStream> = args.iter().map(|a| self.expr(a, out)).collect();
                let op = if name == "maximum" { quote!(::dsl_runtime::ir::BinOp::Max) } else { quote!(::dsl_runtime::ir::BinOp::Min) };
                self.call(quote!(binary), vec![op, vals[0].clone(), vals[1].clone()], span, out)
            }
            n if UNARY_MATH.contains(&n) => {
                let x = self.expr(&args[0], out);
                let variant = format_ident!("{}", unary_variant(n));
                self.call(quote!(unary), vec![quote!(::dsl_runtime::ir::UnaryOp::#variant), x], span, out)
            }
            "cast" | "to" => {
                let x = self.expr(&args[0], out);
                let d = match generics {
                    [Generic::Type(t, _)] => dtype_tokens(t),
                    _ => dtype_tokens("f32"),
                };
                self.call(quote!(cast), vec![x, d], span, out)
            }
            n if CMP_METHODS.contains(&n) => {
                let (a, b) = (self.expr(&args[0], out), self.expr(&args[1], out));
                let op = Bin::from_cmp_method(n).expect("a comparison method");
                self.binary(op, a, b, span, out)
            }
            _ => UNIT(), // unreachable: validation rejected it
        }
    }
}

fn unary_variant(n: &str) -> String {
    let mut s = n.to_string();
    s[..1].make_ascii_uppercase();
    s
}
